"""HF MoE blocks and checkpoints into the layer's physical parameters, sharded where the layer keeps them.

    block = moe_from_hf(config, state, mesh=mesh)              # one MoE block's tensors → HFBlock
    layers = load_moe_layers("path/to/checkpoint", mesh=mesh)  # {layer: HFBlock}, each rank reading its slots
    moe = tempo_jax.MoE(block.config, block.placement, mesh=mesh, rngs=rngs, params=block.params)

The placement is yours (``placement=``) or, by default, `solvers.Placement.spread` over D = the mesh's ``ep`` size
(1 without a mesh) and S = ``slots_per_rank`` (default ⌈E / D⌉): slot p holds expert p mod E. With a mesh, every
per-expert array is built by `jax.make_array_from_callback` over its ``ep`` sharding: each process reads only the
experts of the slots its devices hold, one expert at a time, so a checkpoint larger than a process's share is
never materialised whole; the router and shared experts are read once per process and replicated.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from solvers import Placement
from solvers.checks import read_json

from ..config import MoEConfig
from ..fp8 import stored_dtypes
from ..mesh import param_shardings
from ..params import param_shapes
from .families import family, moe_config_from_hf, moe_layer_ids
from .quant import SafetensorsFile
from .tensors import FileSource, MemorySource, TensorSource, block_readers

__all__ = ["HFBlock", "load_moe_layers", "moe_from_hf", "resolve_placement"]


class HFBlock(NamedTuple):
    """One imported MoE block: its `MoEConfig`, the physical ``params`` over ``placement``'s slots (sharded over
    ``ep`` when a mesh was given) and the `solvers.Placement`."""

    config: MoEConfig
    params: dict
    placement: Placement


def resolve_placement(
    num_experts: int, *, placement: Placement | None, mesh, slots_per_rank: int | None, axis: str = "ep", where: str
) -> Placement:
    """The placement an import lays its experts over: ``placement`` when given (checked against E, the mesh and
    ``slots_per_rank``), else `Placement.spread` over D = ``mesh.shape[axis]`` (1 without a mesh) and S =
    ``slots_per_rank`` or ⌈E / D⌉."""
    D = 1 if mesh is None else mesh.shape[axis]
    if placement is not None:
        if not isinstance(placement, Placement):
            raise ValueError(f"{where}: placement must be a solvers.Placement, got {type(placement).__name__}")
        if placement.num_experts != num_experts:
            raise ValueError(
                f"{where}: the placement has {placement.num_experts} experts, the checkpoint {num_experts}"
            )
        if mesh is not None and placement.num_gpus != D:
            raise ValueError(f"{where}: the placement spans {placement.num_gpus} ranks, the mesh's {axis!r} axis {D}")
        if slots_per_rank is not None and slots_per_rank != placement.slots_per_rank:
            raise ValueError(
                f"{where}: slots_per_rank={slots_per_rank} but the placement has "
                f"{placement.slots_per_rank} per rank; give one of them"
            )
        return placement
    S = math.ceil(num_experts / D) if slots_per_rank is None else slots_per_rank
    if isinstance(S, bool) or not isinstance(S, int | np.integer) or D * S < num_experts:
        raise ValueError(
            f"{where}: slots_per_rank={slots_per_rank!r} gives {D}·{S} slots for {num_experts} experts; it must be "
            f"an integer with D·S ≥ E (default ⌈E / D⌉ = {math.ceil(num_experts / D)})"
        )
    return Placement.spread(num_experts, D, int(S))


#: small parameters kept in float32 whatever the experts' dtype (the router's, the norms', the scales')
_FLOAT32 = ("score_bias", "expert_scale", "expert_out_scale")


def _assemble(readers, cfg: MoEConfig, placement: Placement, mesh, dtype) -> dict:
    """The physical parameters from the block's readers: per-expert arrays ``[P, ...]`` (with ``mesh``: built by
    `jax.make_array_from_callback`, each device reading its own slots' rows and keeping its tensor / fsdp share;
    `tempo_jax.layer.mesh.param_shardings`), the rest whole (shared experts split over a tensor axis)."""
    shapes = param_shapes(cfg, placement.num_slots)
    homes = None if mesh is None else param_shardings(shapes, mesh, cfg)
    phy2log = np.asarray(placement.phy2log)
    out = {}
    for name, (per_expert, read) in readers.items():
        kind = jnp.float32 if name.startswith(("router", "out_", "latent_")) or name in _FLOAT32 else dtype
        kind = stored_dtypes(cfg.expert_dtype).get(name, kind)
        shape = shapes[name]
        if not per_expert:
            value = np.asarray(read(), dtype=kind).reshape(shape)
            out[name] = jnp.asarray(value) if mesh is None else jax.device_put(value, homes[name])
            continue
        if mesh is None:
            experts, inverse = np.unique(phy2log, return_inverse=True)
            out[name] = jnp.asarray(np.asarray(read(experts), dtype=kind)[inverse].reshape(shape))
            continue

        def rows(index, read=read, kind=kind, shape=shape):
            slots = np.arange(shape[0])[index[0]]
            experts, inverse = np.unique(phy2log[slots], return_inverse=True)
            value = np.asarray(read(experts), dtype=kind)[inverse].reshape((slots.shape[0], *shape[1:]))
            return value[(slice(None), *index[1:])]

        out[name] = jax.make_array_from_callback(shape, homes[name], rows)
    return out


def fp8_block(config: Mapping) -> tuple[int, int]:
    """The FP8 scale block of a checkpoint (``quantization_config.weight_block_size``; 128 × 128 by default)."""
    q = config.get("quantization_config") or {}
    b = q.get("weight_block_size", [128, 128]) if isinstance(q, Mapping) else [128, 128]
    if not (isinstance(b, list | tuple) and len(b) == 2 and all(isinstance(v, int) and v >= 1 for v in b)):
        raise ValueError(f"quantization_config.weight_block_size must be two positive integers, got {b!r}")
    return int(b[0]), int(b[1])


def _block(
    config: Mapping,
    src: TensorSource,
    *,
    placement,
    mesh,
    slots_per_rank,
    dtype,
    where: str,
    overrides: dict,
    layer: int | None = None,
) -> HFBlock:
    mt, fam, _ = family(config)
    kw = dict(dtype=dtype, layer=layer, **overrides)
    if kw.get("expert_dtype") == "fp8_block" and "fp8_block" not in kw:  # FP8 experts: the checkpoint's blocks
        kw["fp8_block"] = fp8_block(config)
    probe = moe_config_from_hf(config, slots_per_rank=1, **kw)  # E, before the placement
    placement = resolve_placement(
        probe.experts, placement=placement, mesh=mesh, slots_per_rank=slots_per_rank, axis=probe.axis, where=where
    )
    cfg = moe_config_from_hf(config, slots_per_rank=placement.slots_per_rank, **kw)
    src.block = fp8_block(config)
    readers = block_readers(cfg, fam.names, src, mt)
    return HFBlock(cfg, _assemble(readers, cfg, placement, mesh, dtype), placement)


def moe_from_hf(
    config: Mapping,
    state: Mapping,
    *,
    placement: Placement | None = None,
    mesh=None,
    slots_per_rank: int | None = None,
    dtype=jnp.float32,
    **overrides,
) -> HFBlock:
    """One HF MoE block → `HFBlock` ``(config, params, placement)`` for `moe_forward` / `tempo_jax.MoE`.

    Args:
      config: the model's config.json as a dict.
      state: the block's tensors (numpy or anything ``np.asarray`` reads), keys relative to the block.
      placement: the `solvers.Placement` to lay the experts over (default: see the module).
      mesh: the layer's mesh: the parameters are placed on it (per-expert arrays sharded over ``ep``).
      slots_per_rank: S when no placement is given (default ⌈E / D⌉).
      dtype: the experts' dtype in the layer (the router stays float32).
      **overrides: other `MoEConfig` fields (dispatch_mode, capacity, …), and ``sequence_length`` — the tokens per
        sequence of the batches the layer will see — for a family whose routing counts per sequence (Switch
        Transformers' expert capacity; `tempo_jax.layer.hf.families.moe_config_from_hf`).

    Raises:
      ValueError: unknown model_type, missing / misshapen / unexpected tensors, quantized tensors without their
        scales, a config the layer cannot express, or a placement that does not fit.
    """
    if not isinstance(state, Mapping):
        raise ValueError(f"moe_from_hf: state must be a mapping of tensor names to arrays, got {type(state).__name__}")
    _, fam, _ = family(config)
    return _block(
        config,
        MemorySource({k: v for k, v in state.items() if fam.owns(k)}),
        placement=placement,
        mesh=mesh,
        slots_per_rank=slots_per_rank,
        dtype=dtype,
        where="moe_from_hf",
        overrides=overrides,
    )


# ----------------------------------------------------------------------------------------------- checkpoints
def _weight_map(folder: Path) -> dict[str, Path]:
    """tensor name → shard file, from ``model.safetensors.index.json`` or the headers of ``*.safetensors`` (a tensor
    in two shards without an index is refused: which copy is meant is unknown)."""
    index = folder / "model.safetensors.index.json"
    if index.exists():
        data = read_json(index, "safetensors index")
        wm = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(wm, dict):
            raise ValueError(f"{index}: expected a JSON object with a 'weight_map' of tensor name → shard file")
        bad = [(k, v) for k, v in wm.items() if not isinstance(v, str) or not v or "/" in v or v.startswith(".")]
        if bad:
            raise ValueError(
                f"{index}: weight_map values must be shard file names in the folder, got {bad[0][0]!r}: {bad[0][1]!r}"
            )
        files = {name: folder / f for name, f in wm.items()}
        missing = sorted({str(p) for p in files.values() if not p.exists()})
        if missing:
            raise ValueError(f"{index}: shard files {missing[:3]} do not exist")
        return files
    shards = sorted(folder.glob("*.safetensors"))
    if not shards:
        raise ValueError(f"{folder}: no *.safetensors files (and no model.safetensors.index.json)")
    out: dict[str, Path] = {}
    for shard in shards:
        for name in SafetensorsFile(shard).names():
            if name in out:
                raise ValueError(
                    f"{folder}: tensor {name!r} is in both {out[name].name} and {shard.name} and no "
                    "model.safetensors.index.json says which to read; remove one or write the "
                    "index"
                )
            out[name] = shard
    return out


def load_moe_layers(
    path,
    *,
    placement: Placement | Mapping[int, Placement] | None = None,
    mesh=None,
    slots_per_rank: int | None = None,
    dtype=jnp.float32,
    layers=None,
    **overrides,
) -> dict[int, HFBlock]:
    """Every MoE layer of a local checkpoint folder (``config.json`` + ``*.safetensors``, sharded with
    ``model.safetensors.index.json`` or not) as ``{layer: HFBlock}``, reading only the MoE blocks' tensors — with a
    mesh only the experts of this process's slots (see the module).

    Args:
      path: the folder.
      placement: one `solvers.Placement` for every layer, or ``{layer: Placement}`` (default: see the module).
      mesh, slots_per_rank, dtype, overrides: as `moe_from_hf`.
      layers: a subset of `moe_layer_ids` (default all).

    Raises:
      ValueError: no config.json, a layer that is not MoE, a block without tensors, or what `moe_from_hf` raises.
    """
    folder = Path(path)
    if not folder.is_dir():
        raise ValueError(f"load_moe_layers: {folder} is not a folder (a local checkpoint: config.json + *.safetensors)")
    config = read_json(folder / "config.json", "config.json")
    _, fam, cfg_keys = family(config)
    ids = moe_layer_ids(config)
    if layers is not None:
        if isinstance(layers, int | str) or not all(isinstance(i, int) and not isinstance(i, bool) for i in layers):
            raise ValueError(f"load_moe_layers: layers must be a list of integer layer ids, got {layers!r}")
        bad = sorted(set(layers) - set(ids))
        if bad:
            raise ValueError(f"load_moe_layers: layers {bad} are not MoE layers of this model (MoE layers: {ids})")
        ids = list(layers)
    if isinstance(placement, Mapping):
        missing = sorted(set(ids) - set(placement))
        if missing:
            raise ValueError(f"load_moe_layers: the placement mapping has no entry for MoE layers {missing}")
        extra = sorted(set(placement) - set(ids), key=str)
        if extra:
            raise ValueError(
                f"load_moe_layers: the placement mapping names layers {extra} that are not loaded (the MoE layers "
                f"loaded: {ids}); a placement meant for another layer would be silently unused"
            )
    files = _weight_map(folder)
    opened: dict = {}  # shard → its header, read once for every layer
    out = {}
    for layer in ids:
        here = fam.prefixes_at(cfg_keys, layer)
        prefix = next((p for p in here if any(k.startswith(p) for k in files)), None)
        if prefix is None:
            wanted = " or ".join(p + "*" for p in here)
            raise ValueError(f"load_moe_layers: {folder} holds no tensors of MoE layer {layer} ({wanted})")
        block = {k[len(prefix) :]: (files[k], k) for k in files if k.startswith(prefix) and fam.owns(k[len(prefix) :])}
        for outside, inside in fam.siblings:  # parts of the MoE unit beside the block (Granite's shared MLP)
            p = outside.format(layer)
            block.update({inside + k[len(p) :]: (files[k], k) for k in files if k.startswith(p)})
        src = FileSource(block, opened=opened)
        where = f"load_moe_layers: layer {layer}"
        try:
            out[layer] = _block(
                config,
                src,
                placement=placement.get(layer) if isinstance(placement, Mapping) else placement,
                mesh=mesh,
                slots_per_rank=slots_per_rank,
                dtype=dtype,
                where=where,
                overrides=overrides,
                layer=layer,
            )
        except ValueError as err:
            msg = str(err)
            raise ValueError(msg if msg.startswith(where) else f"{where}: {err}") from None
    return out
