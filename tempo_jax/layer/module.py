"""`tempo_jax.MoE`: the expert-parallel MoE layer as a flax nnx module.

    moe = MoE(config, placement, mesh=make_ep_mesh(8), rngs=nnx.Rngs(params=0, dispatch=1))
    y = moe(x)                      # x [..., H] with prod(...) divisible by the ep axis size
    moe.set_tables(tables)          # fresh dispatch tables (e.g. from a DispatchController)
    moe.counts.get_value()          # [D, E] per-source expert counts of the last call (summed over EP groups)
    stats = moe.stats.get_value()   # the last call's per-device statistics (`ShardStats`; `tempo_jax.metrics`):
    stats.shard_counts              # [Ng·D, E] the counts per device: EP group b's rank d at row b·D + d
    stats.drops                     # [Ng·D] pairs each source could not send (0 unless a fixed capacity is too small)
    stats.invalid_ids               # [Ng·D] routed ids outside [0, E) (replayed routing under jit); gpu_tokens,
                                    # gpu_activations, rounds, plan_rounds (the in-graph plan's), copies (experts
                                    # copied into each rank's dynamic slots): the rest of them

Trainable weights are `nnx.Param`: the router (replicated) and the physical expert arrays w_gate / w_up /
w_down ``[P, ...]``, sharded over the ``ep`` axis so each rank holds only its S slots (``nnx.Optimizer`` gives
Adam's moments the same sharding and this layer's ``slot_layout`` tag, which `set_placement` and `place_on_mesh`
read; stacked over layers by ``nnx.vmap`` the slot axis is the first after the stacked ones). Placement, tables,
the cumulative counter and the last call's routing statistics are non-trainable `DispatchState` variables, so
``nnx.Optimizer(model, tx, wrt=nnx.Param)`` trains exactly the parameters. Replicas of one expert receive the sum
of their gradients (`tempo_jax.layer.replicas`) and stay identical through training.

``moe.set_placement(new)`` moves the weights (and, given the optimizer, its moments) of exactly the slots whose
expert changes rank, in one in-graph all-to-all, and reports what it moved (`MigrationReport`).

Capacity (rows per source → destination block of the exchange; `MoEConfig.capacity`):

- ``"auto"`` (default): dropless and bounded — rounds of C rows per block (C = ``capacity_factor``, 2 by default,
  × the mean block, rounded up to a multiple of 8: `tempo_jax.layer.config.auto_capacity`, fixed from the shapes
  at trace time), as many as the largest block needs (`tempo_jax.layer.rounds`).
  It is the same under ``nnx.jit``, ``jax.grad``, ``nnx.scan`` over layers and across processes: nothing is
  re-run and no host sync is needed; ``moe.stats.get_value().rounds`` holds the last call's round count.
- ``None``: the dropless worst case T/D·K rows per block in one exchange (memory grows with D·T·K·H per rank).
- an int: fixed; pairs beyond it are dropped, counted in ``moe.stats.get_value().drops`` (and, eagerly,
  ``moe.total_drops``) and warned about once.
"""

from __future__ import annotations

import dataclasses
import gc
import itertools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from pallas_kernels import COUNTER_DTYPE
from solvers import Placement

from . import fp8
from .config import MoEConfig
from .mesh import layer_axes, param_shardings
from .moe import ShardStats, moe_forward
from .params import EXPERT_KEYS, check_params, init_params, to_logical, to_physical
from .replicas import MigrationReport, migrate, plan_migration
from .routing import balance_update
from .tables import PlacementArrays, Tables, check_tables, placement_arrays, uniform

__all__ = [
    "BalanceBias",
    "DispatchState",
    "FrozenExpert",
    "MoE",
    "MoEAuxLoss",
    "MoEAuxState",
    "RankState",
    "ShardState",
    "aux_losses",
    "place_on_mesh",
]

#: Variable metadata naming the slot layout an array follows (expert Params and their optimizer moments), and the
#: rank of one layer's array (a stacked array has more axes in front).
SLOT_LAYOUT, SLOT_RANK = "slot_layout", "slot_rank"
_LAYOUT_IDS = itertools.count()
#: Variable metadata on the expert Params and on ``phy2log``: the placement the arrays were laid out over (`_Layout`).
#: It travels with them through ``nnx.state`` / ``nnx.update``, so weights restored without their placement are
#: refused instead of read under another layout.
PLACED_AS = "placed_as"


class _Layout:
    """The placement an array was laid out over: this layer's ``slot_layout`` and the ``phy2log`` it held.

    Equal (and hashed) by layer alone: a jitted step's graph definition holds the tag, and re-placing a layer must
    not trace its step again (`_HostPlacement`). The placement is compared by `MoE._check_layout`, never by ``==``.
    """

    __slots__ = ("layer", "phy2log")

    def __init__(self, layer: str, phy2log):
        self.layer, self.phy2log = layer, tuple(int(e) for e in np.asarray(phy2log).reshape(-1))

    def __eq__(self, other):
        return isinstance(other, _Layout) and other.layer == self.layer

    def __hash__(self):
        return hash(("placed_as", self.layer))

    def __repr__(self):
        return f"_Layout({self.layer!r}, {len(self.phy2log)} slots)"

    def __getstate__(self):
        return (self.layer, self.phy2log)

    def __setstate__(self, state):
        self.layer, self.phy2log = state


#: Variable metadata: the spec of one layer's array on the mesh (`tempo_jax.layer.mesh.param_spec`), a tuple as long
#: as that array's rank; stacked arrays (``nnx.vmap``) have unsharded axes in front. Optimizer moments inherit it.
LAYER_SPEC = "layer_spec"


class DispatchState(nnx.Variable):
    """Non-trainable state of the MoE layer (placement, tables, counters, routing statistics)."""


class RankState(DispatchState):
    """Per-rank dispatch state ``[D, ...]`` (counters, counts), sharded over the expert-parallel axis."""


class ShardState(DispatchState):
    """Per-device statistics (`tempo_jax.layer.moe.ShardStats`: every array leads with ``[Ng·D]``, one row per
    token shard: EP group b's rank d at b·D + d), sharded over the token axes."""


def _spec_tuple(spec: P, rank: int) -> tuple:
    """``spec`` as a tuple of ``rank`` entries (None-padded): the `LAYER_SPEC` metadata."""
    return (*tuple(spec), *([None] * (rank - len(spec))))


def _spec_sharding(mesh: jax.sharding.Mesh, layer_spec: tuple, value) -> NamedSharding:
    """The sharding of one array ``value`` whose `LAYER_SPEC` is ``layer_spec``: unsharded stacked axes in front."""
    spec = [*([None] * (jnp.ndim(value) - len(layer_spec))), *layer_spec]
    while spec and spec[-1] is None:  # P("ep", None) and P("ep") are one sharding: the short form
        spec.pop()
    return NamedSharding(mesh, P(*spec))


def _home(var: nnx.Variable, mesh: jax.sharding.Mesh, axis: str):
    """Where ``var`` lives: by its `LAYER_SPEC` metadata (the layer's parameters, their optimizer moments and its
    per-rank / per-device state; for a pytree value, a pytree of specs beside it), with unsharded stacked axes in
    front; other `RankState` over ``axis``; everything else replicated. A sharding, or a pytree of them."""
    meta = var.get_metadata()
    if LAYER_SPEC in meta:
        specs, value = meta[LAYER_SPEC], var.get_value()
        return jax.tree.map(lambda s, v: _spec_sharding(mesh, s, v), specs, value, is_leaf=lambda s: type(s) is tuple)
    return NamedSharding(mesh, P(axis) if isinstance(var, RankState) else P())


def _put(value, sharding):
    """``value`` (an array or a pytree) placed by ``sharding`` (one, or a pytree of them): a transfer when concrete,
    a constraint inside a trace (``nnx.vmap``'d construction of stacked layers, ``nnx.jit``)."""
    if isinstance(sharding, NamedSharding):
        sharding = jax.tree.map(lambda _: sharding, value)

    def one(v, sh):
        return jax.lax.with_sharding_constraint(v, sh) if isinstance(v, jax.core.Tracer) else jax.device_put(v, sh)

    return jax.tree.map(one, value, sharding)


def place_on_mesh(module: nnx.Module, mesh: jax.sharding.Mesh, axis: str = "ep") -> None:
    """Put a module's state (or an optimizer's) where the MoE program returns it: the layer's parameters and their
    moments by their `LAYER_SPEC` (expert arrays over ``ep`` and the tensor / fsdp axes, `tempo_jax.layer.mesh`),
    per-rank state over ``ep``, per-device statistics over the token axes, everything else replicated on ``mesh``
    (other `RankState` over ``axis``). Without this, the second call of a jitted step sees differently placed inputs
    and compiles again."""
    state = nnx.state(module)
    placed = jax.tree.map(
        lambda v: v.replace(_put(v.get_value(), _home(v, mesh, axis))),
        state,
        is_leaf=lambda x: isinstance(x, nnx.Variable),
    )
    nnx.update(module, placed)


def _row_bytes(a) -> int:
    """Bytes of one leading-axis row of ``a`` (one slot)."""
    return int(np.prod(a.shape[1:])) * jnp.dtype(a.dtype).itemsize


#: The key under which the layer hands its own placement arrays and installed table to `moe_forward`: both were
#: checked against each other when installed (`set_tables`, `set_placement`), so the program is trusted without
#: naming the placement — one compiled program serves every placement of the same shape.
_INSTALLED = "tempo_jax.MoE: installed"


class _HostPlacement:
    """The host `solvers.Placement` of a layer, re-derived from its ``phy2log`` array whenever that array object
    changes (`set_placement`, a restored state). A static attribute compared by identity: changing the placement
    changes no graph definition, so jitted steps are not traced again."""

    def __init__(self, placement: Placement):
        self.placement, self.array = placement, None

    def get(self, phy2log, num_gpus: int, num_experts: int, gpus_per_node) -> Placement:
        if isinstance(phy2log, jax.core.Tracer):  # inside a trace (nnx.eval_shape, jit): the placement last set
            return self.placement
        if phy2log is not self.array:
            host = np.asarray(phy2log.addressable_data(0) if isinstance(phy2log, jax.Array) else phy2log)
            if host.ndim != 1:
                raise ValueError(
                    f"MoE.placement: this module is a stack of layers (phy2log {list(host.shape)}, built with "
                    "nnx.vmap); each layer's placement is the one it was built with"
                )
            if self.placement is None or not np.array_equal(host, self.placement.phy2log):
                self.placement = Placement.from_phy2log(host, num_gpus, gpus_per_node, num_experts)
            self.array = phy2log
        return self.placement


class BalanceBias(nnx.Variable):
    """The selection-only score bias of the router (``score_bias [E]``): not trained by gradient; aux-free
    balancing (``config.router.balance_rate``) moves it after every call."""


class FrozenExpert(nnx.Variable):
    """An FP8 expert weight or its block scales (``MoEConfig(expert_dtype="fp8_block")``, `tempo_jax.layer.fp8`):
    served as stored, not trained (an optimizer over ``nnx.Param`` leaves it alone); re-placements move it like a
    parameter."""


class MoEAuxState(nnx.Variable):
    """The last call's training signals (`tempo_jax.layer.moe.MoEAux`)."""


class MoEAuxLoss(nnx.Intermediate):
    """``[2]``: the load-balancing and z losses summed over every call since `aux_losses` last read them (an
    intermediate, like flax's ``sow``; stacked layers hold one row each)."""


def aux_losses(model: nnx.Module, *, reset: bool = True) -> dict:
    """The MoE layers' auxiliary losses of ``model``, summed over every MoE layer (stacked ones included) and every
    call since the last read: ``{"load_balance": scalar, "z": scalar}``. Read them inside the loss function, after
    the forward; ``reset`` (default) zeroes the sums, so the next step starts from 0. Works under ``nnx.jit``,
    ``nnx.grad``, ``nnx.scan`` over layers and ``nnx.remat``. A model without MoE layers gives zeros."""
    total = jnp.zeros((2,), jnp.float32)
    for _, var in nnx.iter_graph(model):
        if isinstance(var, MoEAuxLoss):
            value = var.get_value()
            total = total + value.reshape(-1, 2).sum(axis=0)
            if reset:
                var.set_value(jnp.zeros_like(value))
    return {"load_balance": total[0], "z": total[1]}


class MoE(nnx.Module):
    """Expert-parallel MoE layer: the router, routed experts and shared experts of ``config`` (every family of
    `tempo_jax.layer.presets`).

    Args:
      config: `MoEConfig` (hidden, ffn, experts, top_k, slots_per_rank, router, expert, shared, …).
      placement: `solvers.Placement` with ``mesh.shape[config.axis] · slots_per_rank`` slots.
      mesh: a mesh with the expert-parallel axis (``config.axis``), and any batch, tensor or FSDP axes the config
        uses (`tempo_jax.make_mesh`; docs/meshes.md): the batch axes are resolved here, once (default: every other
        axis of size > 1 but the tensor axis).
      rngs: ``nnx.Rngs`` with a ``params`` stream (weights) and optionally ``dispatch`` (sampling).
      tables: initial dispatch tables (default: EPLB-even over the placement's replicas); checked like
        `set_tables`.
      record: keep the last call's ``topk_ids [T, K]`` in ``self.topk_ids`` (routing traces).
      params: physical parameters over ``placement``'s slots to start from (`init_params`, `tempo_jax.hf`; a
        logical dict converts with `tempo_jax.layer.to_physical`) instead of random ones; checked against
        ``config`` (`tempo_jax.layer.params.check_params`) and placed on ``mesh`` (expert arrays sharded). Your
        arrays stay yours: the first `set_placement` moves copies of them (later ones move the layer's own in place).

    Trainable: every parameter but ``score_bias`` (`nnx.Param`); ``self.score_bias`` is a `BalanceBias`, FP8 expert
    weights and their scales are `FrozenExpert`.
    ``self.placement`` is the `solvers.Placement` the weights are laid out over (`set_placement` changes it).
    After a call ``self.aux_loss`` / ``self.z_loss`` hold its load-balancing and z losses and ``self.expert_load``
    the pairs per expert.
    """

    def __init__(
        self,
        config: MoEConfig,
        placement: Placement,
        *,
        mesh: jax.sharding.Mesh,
        rngs: nnx.Rngs,
        tables: Tables | None = None,
        record: bool = False,
        params: dict | None = None,
        deterministic: bool = False,
        rng_collection: str = "dispatch",
    ):
        axes = layer_axes(config, mesh, where="MoE")
        D = axes.num_ranks
        if placement.num_gpus != D:
            raise ValueError(
                f"MoE: the placement spans {placement.num_gpus} ranks, the mesh's {config.axis!r} axis {D}; its "
                f"slots would land on other ranks than it says. Build it for {D} ranks (e.g. "
                f"Placement.spread({config.experts}, {D}, {config.slots_per_rank}))"
            )
        if placement.num_slots != D * config.slots_per_rank:
            raise ValueError(
                f"placement has {placement.num_slots} slots; the mesh needs {D} ranks × "
                f"{config.slots_per_rank} slots per rank"
            )
        if placement.num_experts != config.experts:
            raise ValueError(f"placement has {placement.num_experts} experts, config.experts={config.experts}")
        # the caller's arrays are never consumed: the first re-placement copies them (`set_placement`)
        self._caller_arrays = params is not None
        if params is None:
            params = init_params(rngs.params(), config, placement, mesh=mesh)
        check_params(params, config, num_slots=placement.num_slots, where="MoE")
        want = jnp.dtype(config.dtype)
        frozen = fp8.stored_dtypes(config.expert_dtype)
        odd = sorted(
            k
            for k, v in params.items()
            if not k.startswith(("router", "score", "expert_scale")) and jnp.result_type(v) != frozen.get(k, want)
        )
        if odd:
            got, need = jnp.result_type(params[odd[0]]), frozen.get(odd[0], want)
            if odd[0] in frozen:
                raise ValueError(
                    f"MoE: params {odd} are {got}; the config's expert_dtype {config.expert_dtype!r} stores them as "
                    f"{need}: quantize the experts with tempo_jax.layer.fp8.quantize_params(params, fp8_block)"
                )
            raise ValueError(
                f"MoE: params {odd} are {got}, the config's dtype is {want}: the layer "
                f"would train them in another precision than it computes; cast them (e.g. "
                f"jax.tree.map(lambda a: a.astype({want.name}), ...)) or set MoEConfig.dtype"
            )
        self.param_names = tuple(params)  # static: the keys of this config's parameters
        homes = param_shardings(params, mesh, config)
        placed_as = _Layout(f"moe-{next(_LAYOUT_IDS)}", placement.phy2log)
        # static: tags this layer's slot arrays and their optimizer moments (a counter: ids of dead layers recur)
        self.slot_layout = placed_as.layer
        for name, value in params.items():
            value = _put(jnp.asarray(value), homes[name])
            tags = {LAYER_SPEC: _spec_tuple(homes[name].spec, value.ndim)}
            if name in EXPERT_KEYS:
                tags.update({SLOT_LAYOUT: self.slot_layout, SLOT_RANK: value.ndim, PLACED_AS: placed_as})
                setattr(self, name, (FrozenExpert if name in frozen else nnx.Param)(value, **tags))
            else:
                setattr(self, name, (BalanceBias if name == "score_bias" else nnx.Param)(value, **tags))
        self.config = config
        # static: the config the layer runs, its batch axes resolved once (the per-device state's shapes follow them)
        self._layer_config = dataclasses.replace(config, batch_axes=axes.batch)
        self.mesh = mesh
        self.record = record
        self.deterministic = deterministic
        # this layer's own fork of the dispatch stream (as flax's Dropout does): stacked with the layer under
        # nnx.split_rngs + nnx.vmap, and no reference to the caller's Rngs
        self.rngs = rngs[rng_collection].fork() if rng_collection in rngs else nnx.data(None)
        self._host = _HostPlacement(placement)  # static, by identity (see the class)
        self._gpus_per_node = placement.gpus_per_node
        pa = placement_arrays(placement)
        self.phy2log = DispatchState(pa.phy2log, **{PLACED_AS: placed_as})
        self.log2phy = DispatchState(pa.log2phy)
        if tables is not None and config.dispatch == "ingraph":
            raise ValueError(
                "MoE: this layer computes each call's tables in the step (MoEConfig(dispatch='ingraph')); pass no "
                "tables (they would never be read)"
            )
        self.table = DispatchState(self._installable(uniform(placement) if tables is None else tables, "MoE"))
        rank, shard = {LAYER_SPEC: (axes.ep, None)}, axes.tokens if axes.batch else axes.ep
        n = axes.shards
        self.counter = RankState(jnp.zeros((D, config.experts), COUNTER_DTYPE), **rank)
        self.counts = RankState(jnp.zeros((D, config.experts), jnp.int32), **rank)
        self.stats = ShardState(ShardStats.before_any_call(n, config.experts), **{LAYER_SPEC: ShardStats.specs(shard)})
        self.total_drops = 0  # fixed capacity, eager calls only (a traced call cannot read its drops on the host)
        self._warned_drops = False
        # the last call's routing, when recording (an empty array would not checkpoint: orbax refuses 0-size arrays)
        self.topk_ids = DispatchState(jnp.full((1, config.top_k), -1, jnp.int32)) if record else nnx.data(None)
        self.aux_loss = MoEAuxState(jnp.zeros((), jnp.float32))
        self.z_loss = MoEAuxState(jnp.zeros((), jnp.float32))
        self.losses = MoEAuxLoss(jnp.zeros((2,), jnp.float32))
        self.expert_load = MoEAuxState(jnp.zeros((config.experts,), jnp.float32))
        place_on_mesh(self, mesh, config.expert_axes)

    @property
    def placement(self) -> Placement:
        """The `solvers.Placement` the expert arrays are laid out over (host data; `set_placement` changes it)."""
        D = self.config.ranks_on(self.mesh)
        return self._host.get(self.phy2log.get_value(), D, self.config.experts, self._gpus_per_node)

    def params(self) -> dict:
        """The physical parameters as a dict (what `moe_forward` takes): expert arrays ``[P, ...]``."""
        return {name: getattr(self, name).get_value() for name in self.param_names}

    def logical_params(self) -> dict:
        """The logical parameters ``[E, ...]`` (export, `moe_reference`): each expert from its first replica."""
        self._check_layout()
        return to_logical(self.params(), self.placement)

    def load_logical(self, logical: dict) -> None:
        """Set every parameter from a *logical* dict ``[E, ...]`` (an export, another layout's `logical_params`):
        the experts laid out over this layer's placement, each rank receiving only its slots."""
        check_params(logical, self.config, num_slots=None, where="MoE.load_logical")
        physical = to_physical(logical, self.placement, mesh=self.mesh, config=self.config)
        for name in self.param_names:
            getattr(self, name).set_value(physical[name])
        self._tag_layout(self.placement.phy2log)

    def _expert_variables(self) -> list:
        return [getattr(self, k) for k in self.param_names if k in EXPERT_KEYS]

    def _tag_layout(self, phy2log) -> None:
        """Mark the expert arrays and ``phy2log`` as laid out over ``phy2log`` (this layer's tag: equal to the
        last, so no jitted step traces again)."""
        tag = _Layout(self.slot_layout, phy2log)
        for v in [*self._expert_variables(), self.phy2log]:
            v.set_metadata(PLACED_AS, tag)

    def _check_layout(self) -> None:
        """Refuse expert weights laid out over another placement than the layer's (restored without it).

        Eagerly, a ``phy2log`` whose value changed without its tag (an orbax restore of the whole state: weights
        and placement together) first re-tags what agreed with its old tag."""
        ptag = self.phy2log.get_metadata(PLACED_AS, None)
        if ptag is None:
            return
        wtags = {k: getattr(self, k).get_metadata(PLACED_AS, None) for k in self.param_names if k in EXPERT_KEYS}
        value = self.phy2log.get_value()
        if not isinstance(value, jax.core.Tracer) and jnp.ndim(value) == 1:
            now = self.placement.phy2log
            if tuple(int(e) for e in now) != ptag.phy2log:
                tag = _Layout(self.slot_layout, now)
                for k, t in wtags.items():
                    if t is not None and t.phy2log == ptag.phy2log:
                        getattr(self, k).set_metadata(PLACED_AS, tag)
                        wtags[k] = tag
                self.phy2log.set_metadata(PLACED_AS, tag)
                ptag = tag
        odd = sorted(k for k, t in wtags.items() if t is not None and t.phy2log != ptag.phy2log)
        if odd:
            raise ValueError(
                f"MoE: the expert weights {odd} were laid out over another placement than this layer's (restored "
                "without it, e.g. nnx.state(moe, nnx.Param) of a layer re-placed since): read under this layout, "
                "each slot would compute another expert. Restore the placement with them (nnx.update with the "
                "whole nnx.state(moe): phy2log, log2phy and table come along), or load them as logical weights "
                "(moe.load_logical(other.logical_params()))"
            )

    def set_placement(self, placement: Placement, *, tables: Tables | None = None, optimizer=None) -> MigrationReport:
        """Re-place the experts (EPLB rebalancing while serving or training): move the rows of exactly the slots
        whose expert is not already on their rank, in one in-graph all-to-all per array (`plan_migration`,
        `migrate`); install ``tables`` (default: EPLB-even over the new placement). The layer computes the same
        function before and after.

        Args:
          placement: the new `solvers.Placement` (same D, S and E).
          tables: tables over the new placement (checked like `set_tables`).
          optimizer: an ``nnx.Optimizer`` over a model containing this layer: the moments of these expert arrays
            move with them (found by this layer's ``slot_layout`` metadata); a stateless one (plain SGD) has none.
            Without it, a live ``nnx.Optimizer`` holding moments of this layer is refused (its moments would stay in
            the old slot layout and pull the replicas of an expert apart); a plain optax state is beyond the layer's
            sight: move it with `plan_migration` + `migrate`.

        Returns:
          `MigrationReport`: slots moved / copied locally / kept, bytes moved (rows sent × bytes per slot of every
          moved array), the all-to-all's padded bytes, and the step's time.

        Raises:
          ValueError: a placement of another shape, tables of another placement, tables for a layer that
            dispatches in the step (``dispatch="ingraph"``), or no ``optimizer`` while one holds this layer's moments.
        """
        if isinstance(self.counter.get_value(), jax.core.Tracer):
            raise ValueError("MoE.set_placement is a host operation: call it outside jit (it compiles its own move)")
        self._check_layout()  # never move weights that are read under another layout
        if tables is not None and self.config.dispatch == "ingraph":
            raise ValueError(
                "MoE.set_placement: this layer computes each call's tables in the step "
                "(MoEConfig(dispatch='ingraph')); pass no tables (they would never be read)"
            )
        plan = plan_migration(self.placement, placement)
        pa = placement_arrays(placement)
        new_tables = uniform(placement) if tables is None else tables
        check_tables(new_tables, pa, where="MoE.set_placement")
        variables = [getattr(self, k) for k in self.param_names if k in EXPERT_KEYS]
        if any(v.get_value().ndim > v.get_metadata()[SLOT_RANK] for v in variables):
            raise ValueError(
                "MoE.set_placement: this layer is a stack of layers (nnx.vmap / nnx.scan) sharing one "
                "placement; re-place layers built one by one (each its own MoE)"
            )
        if optimizer is not None:
            variables += self._optimizer_slots(optimizer)
        elif self._live_optimizers():
            raise ValueError(
                "MoE.set_placement: an nnx.Optimizer holds moments of this layer's expert arrays, laid out over its "
                "slots; pass it (moe.set_placement(new, optimizer=optimizer)) so they move with the weights. Left "
                "behind, they would pull the replicas of one expert apart and the layer off the dense model"
            )
        per_slot = sum(_row_bytes(v.get_value()) for v in variables)
        moved, seconds, compile_s = migrate(
            [v.get_value() for v in variables],
            plan,
            mesh=self.mesh,
            axis=self.config.expert_axes,
            donate=not self._caller_arrays,  # params=... given: the caller's arrays stay alive
        )
        self._caller_arrays = False
        for v, a in zip(variables, moved, strict=True):
            v.set_value(a)
        home = NamedSharding(self.mesh, P())
        self._host.placement = placement
        self.phy2log.set_value(jax.device_put(pa.phy2log, home))
        self._tag_layout(placement.phy2log)
        self.log2phy.set_value(jax.device_put(pa.log2phy, home))
        self.table.set_value(jax.device_put(jnp.asarray(new_tables.table, jnp.float32), home))
        D = placement.num_gpus
        return MigrationReport(
            moved_slots=plan.moved,
            local_slots=plan.local,
            kept_slots=plan.kept,
            slot_bytes=per_slot,
            bytes_moved=plan.transfers * per_slot,
            wire_bytes=D * D * plan.block * per_slot,
            seconds=seconds,
            compile_seconds=compile_s,
        )

    def _optimizer_slots(self, optimizer) -> list:
        """The optimizer's variables laid out over this layer's slots (Adam's moments of the expert arrays)."""
        found = [
            v
            for _, v in nnx.iter_graph(optimizer)
            if isinstance(v, nnx.Variable) and v.get_metadata().get(SLOT_LAYOUT) == self.slot_layout
        ]
        if not found and any(
            isinstance(v, nnx.Variable) and getattr(v.get_value(), "ndim", 0) > 0 for _, v in nnx.iter_graph(optimizer)
        ):
            raise ValueError(
                "MoE.set_placement: the optimizer holds per-parameter state, but none of this layer's expert "
                "arrays; pass the nnx.Optimizer built over the model that contains this layer"
            )
        return found  # a stateless optimizer (plain SGD) has nothing to move

    def _live_optimizers(self) -> list:
        """The live ``nnx.Optimizer`` objects holding moments of this layer's slot arrays (found among the
        interpreter's objects; garbage collected first when any is found, so a dropped optimizer does not count)."""

        def holding():
            # The instances of nnx.Optimizer and its subclasses are the referrers of their classes (an instance
            # refers to its type). gc.get_referrers returns only those, so no object another thread is building
            # (a tuple being resized) is held by a list of every object (gc.get_objects would be unsafe).
            types, todo = set(), [nnx.Optimizer]
            while todo:
                cls = todo.pop()
                if cls not in types:
                    types.add(cls)
                    todo.extend(cls.__subclasses__())
            return [
                o
                for o in gc.get_referrers(*types)
                if type(o) in types
                and any(
                    isinstance(v, nnx.Variable) and v.get_metadata().get(SLOT_LAYOUT) == self.slot_layout
                    for _, v in nnx.iter_graph(o)
                )
            ]

        if not holding():
            return []
        gc.collect()
        return holding()

    def _placement_arrays(self, key: str | None = _INSTALLED) -> PlacementArrays:
        return PlacementArrays(self.phy2log.get_value(), self.log2phy.get_value(), key)

    def _installable(self, tables: Tables, where: str) -> jax.Array:
        """``tables.table`` as float32 ``[Gs, E, R]`` once `check_tables` accepts it (the one check of a table)."""
        check_tables(tables, self._placement_arrays(self.placement.key), where=where)
        # replicated on the mesh, where the module keeps its state: a jitted step sees one sharding, one program
        return jax.device_put(jnp.asarray(tables.table, jnp.float32), NamedSharding(self.mesh, P()))

    def set_tables(self, tables: Tables) -> None:
        """Install fresh dispatch tables: ``table [Gs, E, R]`` over the placement's replica columns.

        Tables from the builders of `tempo_jax.layer.tables` (and `DispatchController.latest`) are trusted: checked
        by placement key, never read. Hand-made tables are checked once here, by value.

        Raises:
          ValueError: tables of another placement, a table of the wrong shape, (hand-made tables) weights that
            are negative, NaN or infinite, or a layer that dispatches in the step (``dispatch="ingraph"``).
        """
        if self.config.dispatch == "ingraph":
            raise ValueError(
                "MoE.set_tables: this layer computes each call's tables in the step "
                "(MoEConfig(dispatch='ingraph')); installed tables would never be read"
            )
        self.table.set_value(self._installable(tables, "MoE.set_tables"))

    def set_view(self, deterministic: bool | None = None):
        """``nnx.view(model, deterministic=...)`` (and ``model.eval()`` / ``model.train()``, which set the same
        attribute): see ``deterministic`` in `__call__`."""
        if deterministic is not None:
            self.deterministic = deterministic

    def __call__(
        self,
        x: jax.Array,
        *,
        router_x: jax.Array | None = None,
        mask: jax.Array | None = None,
        deterministic: bool | None = None,
        expert_set: jax.Array | None = None,
        router_state: jax.Array | None = None,
    ) -> jax.Array | tuple[jax.Array, jax.Array]:
        """``x [..., H]`` → ``[..., H]``: any number of tokens (flattened, padded to a multiple of D inside, split
        over the ep axis). With a router MLP (``RouterConfig.mlp_width`` Rh: Zaya) → ``(y [..., H], router_state
        [..., Rh])``, the state the next layer's router reads (as transformers' block returns it).

        Args:
          x: ``[..., H]`` activations.
          router_x: optional ``[..., H]`` (x's shape) the router reads instead of x (Gemma 4 routes the residual
            stream while its experts read a normed copy; `tempo_jax.layer.routing`).
          mask: optional bool ``[...]`` (x's leading shape): False marks padding tokens of a variable-length
            batch, left out of routing statistics, counts, counters, drops, losses and balancing; their output rows
            hold only the shared experts' contribution (zeros without shared experts).
          expert_set: optional int ``[...]`` (x's leading shape): each token's expert set with
            ``RouterConfig.expert_sets`` > 1 (ERNIE-4.5-VL's text 0 / vision 1; None: set 0).
          router_state: optional ``[..., Rh]`` (x's leading shape): the previous layer's router state
            (``RouterConfig.carried_state``; None at a model's first MoE layer).
          deterministic: evaluation (default: ``self.deterministic``, set by ``model.eval()`` / ``nnx.view``): no
            load-balancing / z-loss work and no aux-free bias update. What keeps counting in eval: the dispatch
            counter, counts and per-rank loads (``counter``, ``counts``, ``gpu_tokens``, …) that a serving runtime
            reads, and ``expert_load``.

        Raises:
          ValueError: a mask of another shape or dtype; a call inside a plain ``jax.grad`` / ``jax.checkpoint`` /
            ``jax.vmap`` of the module (it updates its counters and RNG stream: use ``nnx.grad`` / ``nnx.remat``
            / ``nnx.vmap``, or `tempo_jax.moe_forward` functionally).
        """
        if not getattr(self.counter, "_can_update", True):
            raise ValueError(
                "MoE: called inside a JAX transform that cannot see the module's state (a plain jax.grad, "
                "jax.checkpoint / jax.remat or jax.vmap over a model holding it): the layer updates its dispatch "
                "counters and RNG stream every call. Use the flax transforms (nnx.grad, nnx.value_and_grad, "
                "nnx.remat, nnx.vmap, nnx.jit), or call tempo_jax.moe_forward functionally"
            )
        deterministic = self.deterministic if deterministic is None else bool(deterministic)
        if jnp.ndim(x) < 1 or jnp.shape(x)[-1] != self.config.hidden:
            raise ValueError(
                f"MoE: x must be [..., H={self.config.hidden}] (activations with the hidden size last), got shape "
                f"{list(jnp.shape(x))}"
            )
        lead, H = x.shape[:-1], x.shape[-1]
        if mask is not None and (jnp.shape(mask) != lead or jnp.result_type(mask) != jnp.bool_):
            raise ValueError(
                f"MoE: mask must be bool with x's leading shape {list(lead)} (True: a real token), got "
                f"{jnp.result_type(mask)}{list(jnp.shape(mask))}"
            )
        if router_x is not None and jnp.shape(router_x) != jnp.shape(x):
            raise ValueError(
                f"MoE: router_x (the router's own input) must have x's shape {list(x.shape)}, got "
                f"{list(jnp.shape(router_x))}"
            )
        Rh = self.config.router.mlp_width
        if router_state is not None and jnp.shape(router_state) != (*lead, Rh):
            raise ValueError(
                f"MoE: router_state (the previous layer's router state) must be [..., Rh={Rh}] with x's leading shape "
                f"{list(lead)}, got {list(jnp.shape(router_state))}"
            )
        self._check_layout()
        key = self.rngs() if self.rngs is not None else jax.random.key(0)
        tokens = x.reshape(-1, H)

        def run(capacity):
            return moe_forward(
                self.params(),
                tokens,
                mesh=self.mesh,
                placement_arrays=self._placement_arrays(),
                tables=None
                if self.config.dispatch == "ingraph"
                else Tables._trusted(self.table.get_value(), self.log2phy.get_value(), _INSTALLED),
                config=self._layer_config,
                key=key,
                counter=self.counter.get_value(),
                capacity=capacity,
                mask=None if mask is None else jnp.reshape(mask, (-1,)),
                aux_losses=not deterministic,
                router_x=None if router_x is None else router_x.reshape(-1, H),
                expert_set=None if expert_set is None else jnp.reshape(expert_set, (-1,)),
                router_state=None if router_state is None else jnp.reshape(router_state, (-1, Rh)),
            )

        res = run(None)
        if isinstance(self.config.capacity, int | np.integer) and not isinstance(tokens, jax.core.Tracer):
            self._count_drops(res)  # a fixed capacity drops what does not fit: counted (and warned) eagerly
        self.stats.set_value(ShardStats.of(res.stats))
        self.counter.set_value(res.counter)
        self.counts.set_value(res.counts)
        self.expert_load.set_value(res.aux.expert_load)
        if not deterministic:
            self.aux_loss.set_value(res.aux.load_balance_loss)
            self.z_loss.set_value(res.aux.z_loss)
            # summed over calls until read (tempo_jax.aux_losses): repeated and scanned calls all count
            self.losses.set_value(self.losses.get_value() + jnp.stack([res.aux.load_balance_loss, res.aux.z_loss]))
            rate = self.config.router.balance_rate
            if rate:  # aux-free balancing: under-loaded experts become likelier (outside the gradient)
                self.score_bias.set_value(balance_update(self.score_bias.get_value(), res.aux.expert_load, rate))
        if self.record:
            self.topk_ids.set_value(res.stats.topk_ids)
        if Rh:
            return res.out.reshape(*lead, H), res.router_state.reshape(*lead, Rh)
        return res.out.reshape(*lead, H)

    # ------------------------------------------------------------------ capacity
    def _count_drops(self, res) -> None:
        dropped = int(res.stats.drops.sum())
        self.total_drops += dropped
        if dropped and not self._warned_drops:
            self._warned_drops = True
            warnings.warn(
                f"MoE: {dropped} token–expert pairs were dropped this call (capacity={self.config.capacity} rows "
                f"per block; the largest block wanted {int(res.stats.max_block.max())}). Their outputs are zero. "
                "Use capacity='auto' (the default: dropless rounds) or None (dropless worst case); "
                "moe.stats.get_value().drops and moe.total_drops count them.",
                stacklevel=3,
            )
