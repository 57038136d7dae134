"""Restoring a checkpoint into a model that holds MoE layers: `restore_target`.

A re-placement (`MoE.set_placement`) may change a layer's replica width R — the widest expert's replica count — and
with it the shapes of its placement state, ``log2phy [E, R]`` and ``table [Gs, E, R]``. orbax restores into the
shapes its target names, so the target built from a freshly constructed model (the width of its first placement)
does not fit a checkpoint written after such a move. `restore_target` takes the shapes from the checkpoint for
exactly those two arrays and from the model for everything else, and names the array when anything else disagrees:

    checkpointer = orbax.checkpoint.StandardCheckpointer()
    target = tempo_jax.restore_target(nnx.state((model, optimizer)), checkpointer.metadata(path))
    nnx.update((model, optimizer), checkpointer.restore(path, target))

After the update each layer serves the saved placement (its ``phy2log`` came back with its weights).
"""

from __future__ import annotations

import jax
from flax import nnx

from .module import DispatchState, RankState, ShardState

__all__ = ["REPLACED_SHAPES", "restore_target"]

#: The layer's arrays whose shape a re-placement may change (the replica width R is their last axis).
REPLACED_SHAPES = ("log2phy", "table")


def _name(key) -> str:
    """A pytree key as the string orbax stores it under."""
    for attr in ("key", "idx", "name"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def _stored_arrays(stored) -> dict[tuple[str, ...], object]:
    """Path → array metadata (``.shape``, ``.dtype``) of orbax's ``checkpointer.metadata(path)`` (a step metadata,
    its tree metadata or the plain tree)."""
    tree = getattr(stored, "item_metadata", stored)
    tree = getattr(tree, "tree", tree)
    leaves = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda m: hasattr(m, "shape") and hasattr(m, "dtype"))
    return {tuple(_name(k) for k in path): meta for path, meta in leaves[0]}


def restore_target(state, stored):
    """The orbax restore target for ``state``: every array as a ``jax.ShapeDtypeStruct`` with the model's dtype and
    sharding, and the checkpoint's shape for each MoE layer's ``log2phy`` / ``table`` (`REPLACED_SHAPES`).

    Args:
      state: ``nnx.state(model)`` or ``nnx.state((model, optimizer))`` of the model to restore into.
      stored: ``checkpointer.metadata(path)`` of the checkpoint (orbax's step metadata; its tree works too).

    Returns:
      ``state`` with each variable's value a ``jax.ShapeDtypeStruct``: the ``target`` of ``checkpointer.restore``.

    Raises:
      ValueError: a variable the checkpoint does not hold, or one whose stored shape differs when a re-placement
        cannot explain it (another model's checkpoint), naming its path and both shapes.
    """
    arrays = _stored_arrays(stored)

    def one(base: tuple, sub: tuple, var, value):
        """The target of one array: ``value`` of variable ``var`` at ``base`` (its path), ``sub`` inside its value."""
        where = "/".join((*base, *sub))
        meta = arrays.get((*base, "value", *sub), arrays.get((*base, *sub)))
        if meta is None:
            raise ValueError(
                f"restore_target: the checkpoint holds no array for {where} (shape {list(value.shape)}): it was "
                "written from another model (or another state: save nnx.state((model, optimizer)) as a whole)"
            )
        shape = tuple(meta.shape)
        if jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key):  # stored as its key data: orbax maps it back
            shape = tuple(value.shape)
        if shape != tuple(value.shape) and isinstance(var, ShardState | RankState):
            what = "token shards (Ng·D)" if isinstance(var, ShardState) else "EP ranks (D)"
            raise ValueError(
                f"restore_target: {where} is stored for {shape[0]} {what}, this model's mesh has {value.shape[0]}: the "
                "checkpoint was written on another mesh, not with another configuration. Build the model on a mesh "
                f"of the saved layout to restore it; to move the weights between layouts, restore there and pass "
                "MoE.logical_params() to the new model's MoE.load_logical"
            )
        if shape != tuple(value.shape) and not (isinstance(var, DispatchState) and base[-1] in REPLACED_SHAPES):
            raise ValueError(
                f"restore_target: {where} is stored as {list(shape)}, the model holds {list(value.shape)}: the "
                "checkpoint was written by a model of another shape; build the model with the saved configuration"
            )
        return jax.ShapeDtypeStruct(shape, value.dtype, sharding=value.sharding)

    def variable(path, var):
        """``var`` with each array of its value (one, or a pytree such as ``moe.stats``) a restore target."""
        base = tuple(_name(k) for k in path)
        return var.replace(
            jax.tree_util.tree_map_with_path(
                lambda sub, v: one(base, tuple(_name(k) for k in sub), var, v), var.get_value()
            )
        )

    return jax.tree_util.tree_map_with_path(variable, state, is_leaf=lambda v: isinstance(v, nnx.Variable))
