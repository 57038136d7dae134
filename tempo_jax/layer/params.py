"""The MoE layer's parameters in their two layouts, and where they live on the mesh.

- **physical** (what the layer takes; `init_params`, `tempo_jax.hf`, `MoE`): every routed-expert array has one row
  per physical slot, ``[P, ...]`` with P = D·S, slot p holding logical expert ``phy2log[p]``; on a mesh these
  arrays are sharded over the ``ep`` axis, so rank d holds only its S slots ``[d·S, (d+1)·S)`` — and their
  gradients and optimizer moments alike. Replicas of one expert hold identical values (`to_physical` makes them
  so; training keeps them so, `tempo_jax.layer.replicas`).
- **logical** (import / export and the dense `moe_reference`): one row per expert, ``[E, ...]``
  (`init_logical_params`, `to_logical`).

Everything else (router, score bias, shared experts) is the same in both layouts and replicated on ``ep``.

| key | logical | physical | when |
| --- | --- | --- | --- |
| ``router`` | [H, E] float32 (E + Z with ``zero_experts``, their columns last; the biases alike) | same | always |
| ``router_bias`` | [E] float32 | same | ``router.bias`` (gpt-oss) |
| ``score_bias`` | [E] float32 | same | ``router.score_bias`` (DeepSeek-V3 ``e_score_correction_bias``; not trained) |
| ``router_scale`` | [H] float32 | same | ``router.input_scale`` (Gemma 4's router ``scale``; ones at init) |
| ``expert_scale`` | [E] float32 | same | ``router.expert_scale`` (Gemma 4's ``per_expert_scale``; ones at init) |
| ``router_shared`` / ``router_gain`` | [H, S] / [1] float32 | same | ``router.shared_rows`` / ``router.gain`` |
| ``router_in`` / ``router_fc1``, ``router_fc2`` | [H, Rh] / [Rh, Rh] float32 | same | ``router.mlp_width`` Rh (Zaya) |
| ``router_in_bias``, ``router_fc*_bias``, ``router_norm`` | [Rh] float32 | same | same (``router`` is [Rh, E]) |
| ``router_carry`` | [Rh] float32 | same | ``router.carried_state`` (ones at init) |
| ``w_gate``, ``w_up`` / ``w_down`` | [E, H, F] / [E, F, H] | [P, H, F] / [P, F, H] | always (no ``w_gate``: plain) |
| ``b_gate``, ``b_up`` / ``b_down`` | [E, F] / [E, H] | [P, F] / [P, H] | ``expert.bias`` (gpt-oss) |
| ``w_*_scale_inv`` | [E, ⌈in/b1⌉, ⌈out/b0⌉] float32 | [P, ...] | ``expert_dtype="fp8_block"`` (weights: e4m3) |
| ``shared_w_gate``, ``shared_w_up`` / ``shared_w_down`` | [H, Fs] / [Fs, H] | same | ``shared`` (Fs = count·ffn) |
| ``shared_gate`` | [H] | same | ``shared.gated`` (Qwen2-MoE) |
| ``latent_in`` / ``latent_out``, ``latent_norm`` | [H, L] / [L, H], [L] | same | ``latent`` (the experts' H is L) |
| ``expert_out_scale`` | [L] | same | ``expert.out_norm_eps`` (MuSE-Spark; zeros at init: the scale is 1 + it) |
| ``out_bias`` / ``out_norm`` | [H] float32 | same | ``output.bias`` (JetMoE) / ``output.norm`` (A.X-K1; ones at init) |
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from solvers import Placement

from .config import MoEConfig
from .experts import EXPERT_BIASES, EXPERT_WEIGHTS
from .fp8 import SCALE_KEYS, layer_block, quantize, scale_shape
from .mesh import onto_mesh, param_shardings

__all__ = [
    "EXPERT_KEYS",
    "check_params",
    "expert_keys",
    "init_logical_params",
    "init_params",
    "param_dtype",
    "param_shapes",
    "slot_bytes",
    "to_logical",
    "to_physical",
]

#: Every per-expert array name (physical ``[P, ...]`` in the layer): weights, biases, FP8 block scales.
EXPERT_KEYS = EXPERT_WEIGHTS + EXPERT_BIASES + tuple(SCALE_KEYS.values())


def expert_keys(params) -> tuple[str, ...]:
    """The per-expert keys present in ``params`` (weights, and biases where the config has them)."""
    return tuple(k for k in EXPERT_KEYS if k in params)


def param_dtype(name: str, config: MoEConfig):
    """The dtype parameter ``name`` is held in (`init_params`, the import): float32 for the router's, the score bias,
    the block output's, the latent projections', the experts' output scale and FP8 block scales; e4m3 for FP8 expert
    weights; ``config.dtype`` for the rest."""
    if name.endswith("_scale_inv") or name.startswith(("router", "score", "out_", "latent_", "expert_out")):
        return jnp.float32
    if name in EXPERT_WEIGHTS and config.expert_dtype == "fp8_block":
        return jnp.float8_e4m3fn
    return config.dtype


def param_shapes(config: MoEConfig, num_slots: int | None = None) -> dict[str, tuple[int, ...]]:
    """The shape of every parameter ``config`` needs, by key: per-expert arrays lead with ``num_slots`` (P, the
    physical layout) or, when None, with E (the logical layout); see the module's table."""
    H, F, E = config.hidden, config.ffn, config.experts
    n = E if num_slots is None else num_slots
    N = config.routed_choices  # the router's columns: E, and the zero-computation experts after them
    L = config.expert_width  # the experts' width: H, or the latent L
    Rh = config.router.mlp_width
    shapes = {"router": (Rh or H, N), "w_gate": (n, L, F), "w_up": (n, L, F), "w_down": (n, F, L)}
    if config.router.bias:
        shapes["router_bias"] = (N,)
    if config.router.score_bias:
        shapes["score_bias"] = (N,)
    if config.router.input_scale:
        shapes["router_scale"] = (H,)
    if config.router.expert_scale:
        shapes["expert_scale"] = (E,)
    if config.router.shared_rows:
        shapes["router_shared"] = (H, config.router.shared_rows)
    if config.router.gain:
        shapes["router_gain"] = (1,)
    if Rh:  # a router MLP (Zaya)
        shapes.update(router_in=(H, Rh), router_in_bias=(Rh,), router_norm=(Rh,))
        shapes.update(router_fc1=(Rh, Rh), router_fc1_bias=(Rh,), router_fc2=(Rh, Rh), router_fc2_bias=(Rh,))
        if config.router.carried_state:
            shapes["router_carry"] = (Rh,)
    if config.expert.bias:
        shapes.update(b_gate=(n, F), b_up=(n, F), b_down=(n, L))
    if not config.expert.gated:  # plain experts: down(act(up(x)))
        shapes = {k: v for k, v in shapes.items() if k not in ("w_gate", "b_gate")}
    if config.shared is not None:
        Fs = config.shared.width
        shapes.update(shared_w_gate=(H, Fs), shared_w_up=(H, Fs), shared_w_down=(Fs, H))
        if not config.shared.ffn_config.gated:
            del shapes["shared_w_gate"]
        if config.shared.gated:
            shapes["shared_gate"] = (H,)
    shapes.update({k: (H,) for k in config.output.keys})
    if config.latent is not None:
        shapes.update(latent_in=(H, L), latent_out=(L, H))
        if config.latent.norm:
            shapes["latent_norm"] = (L,)
    if config.expert.out_norm_eps is not None:
        shapes["expert_out_scale"] = (L,)
    if config.expert_dtype == "fp8_block":  # last: the other keys' draws keep their indices
        block = layer_block(config.fp8_block)
        shapes.update({SCALE_KEYS[w]: scale_shape(shapes[w], block) for w in EXPERT_WEIGHTS if w in shapes})
    return shapes


def slot_bytes(params) -> int:
    """Bytes of one physical slot: the per-expert arrays of one row (what a re-placement moves per slot)."""
    return sum(
        int(np.prod(jnp.shape(params[k])[1:])) * jnp.dtype(params[k].dtype).itemsize for k in expert_keys(params)
    )


def check_params(params, config: MoEConfig, *, num_slots: int | None, where: str) -> None:
    """Static check of a parameter dict against ``config``: every key `param_shapes` names, each of its shape in
    the layout ``num_slots`` says (P: physical, None: logical), and no key the config would ignore. Reads no
    array. A logical dict given where the physical layout is needed is named as such, with the conversion."""
    if not isinstance(params, dict):
        raise ValueError(
            f"{where}: params must be a dict of arrays (init_params, moe_from_hf), got {type(params).__name__}"
        )
    shapes = param_shapes(config, num_slots)
    missing = [k for k in shapes if k not in params]
    if missing:
        raise ValueError(
            f"{where}: params lack {', '.join(f'{k} {list(shapes[k])}' for k in missing)} that this "
            "config needs; build them with init_params(key, config, placement) or "
            "tempo_jax.hf.moe_from_hf"
        )
    unused = sorted(set(params) - set(shapes))
    if unused:
        raise ValueError(
            f"{where}: params {unused} are not used by this config (router.bias / router.score_bias / "
            "router.input_scale / router.expert_scale / router.shared_rows / router.gain / router.mlp_width / "
            "router.carried_state / expert.bias / shared / "
            "output); refusing to ignore them"
        )
    E = config.experts
    for k, shape in shapes.items():
        got = tuple(jnp.shape(params[k]))
        if got == shape:
            continue
        if num_slots is not None and num_slots != E and k in EXPERT_KEYS and got == (E, *shape[1:]):
            raise ValueError(
                f"{where}: params[{k!r}] has the logical layout [E={E}, ...]; the layer takes the physical layout "
                f"[P={num_slots}, ...] (one row per slot): convert with "
                "tempo_jax.layer.to_physical(params, placement, mesh=mesh), or build with init_params(key, config, "
                "placement, mesh=mesh)"
            )
        raise ValueError(f"{where}: params[{k!r}] has shape {list(got)}, the config needs {list(shape)}")


def _draw(key: jax.Array, config: MoEConfig, experts: jax.Array | None) -> dict:
    """Every parameter of `init_logical_params`, the per-expert arrays only for the rows ``experts [n]`` (each row
    drawn from its own key, ``fold_in(key of the array, e)``: any subset of rows, on any device, draws the same
    values; None: every expert)."""
    shapes = param_shapes(config)
    H, F = config.hidden, config.ffn
    k = jax.random.split(key, 4)
    keys = {"router": k[0], "w_gate": k[1], "w_up": k[2], "w_down": k[3]}
    out = {}
    for i, (name, shape) in enumerate(shapes.items()):
        kk = keys.get(name, jax.random.fold_in(key, 1 + i))
        if name in ("score_bias", "latent_norm", "expert_out_scale"):  # (the last two are used as 1 + w)
            out[name] = jnp.zeros(shape, jnp.float32)
            continue
        if name in ("router_scale", "expert_scale", "out_norm", "router_gain", "router_norm", "router_carry"):
            out[name] = jnp.ones(shape, jnp.float32)
            continue
        L = config.expert_width
        Rh = config.router.mlp_width or H
        scale = {"w_gate": L**-0.5, "w_up": L**-0.5, "w_down": F**-0.5, "router": Rh**-0.5}.get(name)
        if scale is None:
            scale = 0.1 if name.startswith("b_") or name.endswith("_bias") else shape[0] ** -0.5
        dtype = config.dtype if name in EXPERT_WEIGHTS else param_dtype(name, config)  # (FP8: drawn, then quantized)
        if name in SCALE_KEYS.values():  # drawn with their weights
            continue
        if name in EXPERT_KEYS:
            rows = jnp.arange(config.experts) if experts is None else experts
            if config.expert_dtype == "fp8_block" and name in SCALE_KEYS:  # the bf16 draw, quantized row by row
                block = layer_block(config.fp8_block)

                def fp8_row(e, kk=kk, shape=shape, scale=scale, dtype=dtype, block=block):
                    w = (jax.random.normal(jax.random.fold_in(kk, e), shape[1:]) * scale).astype(dtype)
                    return quantize(w, block)

                out[name], out[SCALE_KEYS[name]] = jax.lax.map(fp8_row, rows)
                continue

            # one row at a time (lax.map): the draw's temporaries stay one expert's size, whatever the rows
            def row(e, kk=kk, shape=shape, scale=scale, dtype=dtype):
                return (jax.random.normal(jax.random.fold_in(kk, e), shape[1:]) * scale).astype(dtype)

            out[name] = jax.lax.map(row, rows)
        else:
            out[name] = (jax.random.normal(kk, shape, jnp.float32) * scale).astype(dtype)
    return out


def init_logical_params(key: jax.Array, config: MoEConfig) -> dict:
    """Random *logical* parameters ``[E, ...]`` of every key `param_shapes` names: weights N(0, 1/fan_in) (the
    router, its biases and the block output's bias / norm in float32, the rest in ``config.dtype``; FP8 experts:
    those values quantized, `fp8`), biases N(0, 0.1²), the score bias zero, scales and norms ones.
    The router and the three expert weights draw from ``split(key, 4)``, the rest from ``fold_in(key, 1 + their
    index)``; each expert's rows of an array from ``fold_in`` of that array's key with the expert id, so a
    physical layout draws exactly these values slot by slot (`init_params`)."""
    return _draw(key, config, None)


def _phy2log(placement, where: str) -> np.ndarray:
    """``phy2log [P]`` of a `Placement` or of the array given, checked: 1-D, integer, ids >= 0."""
    phy2log = np.asarray(placement.phy2log if isinstance(placement, Placement) else placement)
    if phy2log.ndim != 1 or phy2log.size == 0 or not np.issubdtype(phy2log.dtype, np.integer):
        raise ValueError(
            f"{where}: placement must be a solvers.Placement or its phy2log [P] (integer expert ids), got "
            f"{phy2log.dtype}{list(phy2log.shape)}"
        )
    if phy2log.min() < 0:
        raise ValueError(f"{where}: phy2log holds expert ids < 0 (e.g. {int(phy2log.min())}); every slot needs one")
    return phy2log


def _experts_of(params: dict, where: str) -> int | None:
    """The leading size shared by ``params``' per-expert arrays (None: there are none)."""
    sizes = {k: int(jnp.shape(params[k])[0]) for k in expert_keys(params)}
    if len(set(sizes.values())) > 1:
        raise ValueError(f"{where}: the per-expert arrays disagree on their leading size: {sizes}")
    return next(iter(sizes.values()), None)


def _check_layout(phy2log: np.ndarray, placement, E: int, where: str) -> None:
    """``phy2log`` lays E experts over its slots: ids in [0, E), every expert in a slot, and a `Placement` for E."""
    if isinstance(placement, Placement) and placement.num_experts != E:
        raise ValueError(f"{where}: the placement is for {placement.num_experts} experts, the parameters hold {E}")
    if phy2log.max() >= E:
        raise ValueError(f"{where}: phy2log names expert {int(phy2log.max())} but the parameters hold {E} experts")
    missing = sorted(set(range(E)) - set(np.unique(phy2log).tolist()))
    if missing:
        raise ValueError(f"{where}: experts {missing[:10]} have no slot in the placement; they would be lost")


def _take_refusing_grads(idx: np.ndarray):
    """``jnp.take(v, idx, axis=0)`` whose reverse-mode derivative is refused: with replicas, the layer's gradient of
    every replicated slot is already its expert's whole gradient (`tempo_jax.layer.replicas.tie_replicas`), so the
    gather's transpose (a sum over the replicas) would count it once per replica."""

    @jax.custom_vjp
    def take(v):
        return jnp.take(v, idx, axis=0)

    def fwd(v):
        return take(v), None

    def bwd(_, g):
        raise ValueError(
            "to_physical: differentiating through it with replicas would count each expert's gradient once per "
            "replica (the layer already hands every replica its expert's whole gradient). Keep the physical "
            "parameters as the truth (differentiate moe_forward / the MoE module w.r.t. them, export with "
            "to_logical), or differentiate moe_reference on the logical parameters"
        )

    take.defvjp(fwd, bwd)
    return take


def to_physical(
    logical: dict,
    placement,
    *,
    mesh: jax.sharding.Mesh | None = None,
    axis: str | None = None,
    config: MoEConfig | None = None,
) -> dict:
    """Logical ``[E, ...]`` → physical ``[P, ...]`` parameters: slot p gets expert ``phy2log[p]``'s rows (replicas
    identical by construction); the other keys are kept. With ``mesh`` every array is placed where the layer
    keeps it (`tempo_jax.layer.mesh.param_shardings`): the gather runs as one program whose outputs are sharded
    over ``axis`` (default ``"ep"``) — or over every axis of ``config`` (its expert axis, tensor, fsdp) when given —
    so no device holds more than its own share of the result.

    ``placement``: a `solvers.Placement` or its ``phy2log [P]``.

    Raises:
      ValueError: a placement for other experts (ids outside [0, E), an expert without a slot, another E), or —
        under ``jax.grad`` — differentiating through a placement with replicas (see `_take_refusing_grads`: it
        would not give the true derivative).
    """
    phy2log = _phy2log(placement, "to_physical")
    E = _experts_of(logical, "to_physical")
    if E is not None:
        _check_layout(phy2log, placement, E, "to_physical")
        _check_router_width(logical, E, config, "to_physical", "the expert arrays hold")
    idx = phy2log.astype(np.int32)
    keys = expert_keys(logical)
    take = _take_refusing_grads(idx) if np.unique(idx).size < idx.size else lambda v: jnp.take(v, idx, axis=0)

    def gather(params):
        return {k: (take(v) if k in keys else jnp.asarray(v)) for k, v in params.items()}

    if mesh is None:
        return gather(logical)
    if config is not None and axis not in (None, config.axis, config.expert_axes):
        raise ValueError(f"to_physical: axis={axis!r} differs from config.axis={config.axis!r}; give one of them")
    if config is not None:
        axis, D = config.expert_axes, config.ranks_on(mesh)
    else:
        axis = axis or "ep"
        D = math.prod(int(mesh.shape[a]) for a in ((axis,) if isinstance(axis, str) else axis))
    if isinstance(placement, Placement) and placement.num_gpus != D:
        raise ValueError(
            f"to_physical: the placement spans {placement.num_gpus} ranks, the mesh's {axis!r} axis {D}; its slots "
            "would land on other ranks than the placement says"
        )
    if idx.shape[0] % D:
        raise ValueError(f"to_physical: {idx.shape[0]} slots do not split over the {D} ranks of axis {axis!r}")
    logical = {
        k: onto_mesh(v, mesh, axis if k in keys and jnp.shape(v)[0] % D == 0 else None) for k, v in logical.items()
    }
    return jax.jit(gather, out_shardings=param_shardings(logical, mesh, axis if config is None else config))(logical)


def _check_router_width(params: dict, E: int, config, where: str, holds: str) -> None:
    """The router scores ``config.routed_choices`` columns when the config is known, else at least the E experts
    (zero-computation experts add columns after them, `MoEConfig.zero_experts`)."""
    if "router" not in params:
        return
    n = jnp.shape(params["router"])[-1]
    want = None if config is None else config.routed_choices
    if (want is not None and n != want) or n < E:
        raise ValueError(
            f"{where}: the router scores {n} experts, {holds} {E}"
            + (f" (+ {config.zero_experts} zero-computation)" if config is not None and config.zero_experts else "")
            + "; give the placement and config the parameters were made for"
        )


def to_logical(physical: dict, placement) -> dict:
    """Physical ``[P, ...]`` → logical ``[E, ...]`` (for export): each expert's rows from its first replica
    (replicas are identical); the other keys are kept. ``placement``: a `solvers.Placement` or ``phy2log [P]``."""
    phy2log = _phy2log(placement, "to_logical")
    E = placement.num_experts if isinstance(placement, Placement) else int(phy2log.max()) + 1
    held = _experts_of(physical, "to_logical")  # (not `P`: that name is PartitionSpec in this module)
    if held is not None and held != phy2log.shape[0]:
        raise ValueError(
            f"to_logical: the parameters hold {held} slots but the placement lays out {phy2log.shape[0]}; give the "
            "placement the parameters were laid out over"
        )
    _check_layout(phy2log, placement, E, "to_logical")
    _check_router_width(physical, E, None, "to_logical", "the placement lays out")
    experts, first = np.unique(phy2log, return_index=True)  # the first slot of each expert
    keys = expert_keys(physical)
    index = jnp.asarray(first, jnp.int32)

    def take(v):
        sharding = getattr(v, "sharding", None)
        if isinstance(sharding, NamedSharding) and jax.sharding.AxisType.Explicit in sharding.mesh.axis_types:
            return v.at[index].get(out_sharding=NamedSharding(sharding.mesh, P()))  # Explicit axes: say where
        return jnp.take(v, index, axis=0)

    return {k: (take(v) if k in keys else v) for k, v in physical.items()}


def init_params(key: jax.Array, config: MoEConfig, placement, *, mesh: jax.sharding.Mesh | None = None) -> dict:
    """Random *physical* parameters for the layer: `init_logical_params`'s values laid out over ``placement``'s
    slots (slot p: expert ``phy2log[p]``'s rows), drawn slot by slot — with ``mesh``, inside one program whose
    expert outputs are sharded over ``config.axis``, so every device draws only its own S slots and no device ever
    holds every expert.

    ``placement``: a `solvers.Placement` (or ``phy2log [P]``) with P = D·S slots.
    """
    phy2log = _phy2log(placement, "init_params")
    _check_layout(phy2log, placement, config.experts, "init_params")
    phy2log = jnp.asarray(phy2log, jnp.int32)
    if mesh is None:
        return _draw(key, config, phy2log)
    axis = config.expert_axes
    shapes = jax.eval_shape(lambda k: init_logical_params(k, config), key)
    homes = param_shardings(shapes, mesh, config)
    keys = expert_keys(shapes)

    def local(k, slots):  # one rank: its own S slots' rows only (tensor / fsdp shares are cut from them after)
        drawn = _draw(k, config, slots)
        return {n: drawn[n] for n in keys}

    specs = {n: P(axis) for n in keys}
    experts = jax.shard_map(local, mesh=mesh, in_specs=(P(), P(axis)), out_specs=specs, check_vma=False)
    rest = {n: homes[n] for n in shapes if n not in keys}

    def build(k, slots):
        shared = _draw(k, config, jnp.zeros((0,), jnp.int32))  # the router and shared experts (no expert rows)
        return {**{n: shared[n] for n in rest}, **experts(k, slots)}

    slots = jax.device_put(phy2log, NamedSharding(mesh, P(axis)))
    return jax.jit(build, out_shardings={**rest, **{n: homes[n] for n in keys}})(key, slots)
