"""The expert-parallel MoE layer: functional core (`moe_forward`) and its dense reference.

Inside `jax.shard_map` over the ``ep`` mesh axis (tokens data-parallel, physical expert slots
expert-parallel), per rank, the stages of `tempo_jax.stages`:

  route → dispatch (table → physical slot, counts) → pack by destination (rows + slot ids) → exchange →
  expert FFN (sort by local slot, grouped-GEMM SwiGLU) → return → weighted combine.

The per-rank inputs are one pytree (`RankInputs`) whose shard_map specs come from the same structure, and the
result is one type (`MoEOutput`: out, counts, counter, stats).

Replicas hold identical weights, so the output does not depend on the dispatch table, the policy or the mode:
every choice computes the same function as `moe_reference` (up to float reassociation). That is the project's
central invariant.

Glossary: T tokens (global; T/D per rank), H hidden, F expert FFN width, E logical experts, K top-k, D ranks
on the ``ep`` axis, S physical slots per rank, P = D·S physical slots, R replica columns, Gs source groups.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from pallas_kernels import COUNTER_DTYPE, DISPATCH_MODES, GMM, DispatchMode, GmmImpl
from solvers import LaunchSchedule

from . import cascade_exec, stages
from .cascade_exec import WeightFetch
from .exchange import EXCHANGE, ExchangeImpl, return_blocks
from .stages import route
from .tables import PlacementArrays, Tables

__all__ = [
    "MoEConfig",
    "MoEOutput",
    "MoEStats",
    "RankInputs",
    "init_params",
    "make_ep_mesh",
    "materialize",
    "moe_forward",
    "moe_reference",
    "route",
]


@dataclasses.dataclass(frozen=True, kw_only=True)
class MoEConfig:
    """Static configuration of the MoE layer.

    Attributes:
      hidden: H.  ffn: F (per expert).  experts: E.  top_k: K.
      slots_per_device: S physical expert slots per rank (P = D·S must match the placement).
      dtype: activation/weight dtype for the expert FFN (router runs in float32).
      exchange: "auto" (ragged on GPU/TPU, padded on CPU), "padded" or "ragged" (`ExchangeImpl`).
      gmm_impl: `pallas_kernels.gmm` implementation (`GmmImpl`: "auto", "pallas", "chunked", "ragged_dot").
      interpret: run Pallas kernels in interpret mode (CPU tests).
      mode: dispatch mode, "sample" (paper) or "quota" (deterministic).
      renormalize: renormalise the top-k gate weights to sum to 1.
      capacity: rows per (source, destination) block: None = the dropless worst case T/D·K; a positive int =
        that many (pairs beyond it are dropped, counted in ``MoEOutput.stats.drops``); ``"auto"`` = the `MoE`
        module's bucketed capacity with a dropless re-run (see `tempo_jax.module`); `moe_forward` itself needs
        an int or None (``capacity=`` overrides per call).
      axis: name of the expert-parallel mesh axis.
      schedule: ``"sync"`` (one all-to-all) or a `solvers.LaunchSchedule` (CascadeEP: per-source exchange
        rounds, one grouped GEMM per launch group; `tempo_jax.cascade_exec`). The output is the same.
      fetches: OEWF `WeightFetch`es (helper computes its own tokens of the donor's experts with fetched weights).
    """

    hidden: int
    ffn: int
    experts: int
    top_k: int
    slots_per_device: int
    dtype: Any = jnp.float32
    exchange: ExchangeImpl = "auto"
    gmm_impl: GmmImpl = "auto"
    interpret: bool = False
    mode: DispatchMode = "sample"
    renormalize: bool = True
    capacity: int | str | None = None
    axis: str = "ep"
    schedule: str | LaunchSchedule = "sync"
    fetches: tuple[WeightFetch, ...] = ()

    def __post_init__(self):
        for name in ("hidden", "ffn", "experts", "top_k", "slots_per_device"):
            if getattr(self, name) < 1:
                raise ValueError(f"MoEConfig.{name} must be ≥ 1, got {getattr(self, name)}")
        if self.slots_per_device >= 2**16:
            raise ValueError(f"MoEConfig.slots_per_device must be < 65536 (slot ids travel in 16 bits), got "
                             f"{self.slots_per_device}")  # fmt: skip
        if self.top_k > self.experts:
            raise ValueError(f"MoEConfig.top_k={self.top_k} exceeds experts={self.experts}")
        if self.mode not in DISPATCH_MODES:
            raise ValueError(f"MoEConfig.mode must be one of {list(DISPATCH_MODES)}, got {self.mode!r}")
        EXCHANGE.validate(self.exchange)
        GMM.validate(self.gmm_impl)
        if not (self.schedule == "sync" or isinstance(self.schedule, LaunchSchedule)):
            raise ValueError(f"MoEConfig.schedule must be 'sync' or a solvers.LaunchSchedule, got {self.schedule!r}")
        object.__setattr__(self, "fetches", tuple(self.fetches))
        if not all(isinstance(f, WeightFetch) for f in self.fetches):
            raise ValueError("MoEConfig.fetches must be tempo_jax.cascade_exec.WeightFetch values")
        c = self.capacity
        if not (c is None or c == "auto" or (isinstance(c, int | np.integer) and not isinstance(c, bool) and c >= 1)):
            raise ValueError(
                f"MoEConfig.capacity must be None (dropless worst case), a positive int (rows per block) or "
                f"'auto' (bucketed, dropless), got {c!r}"
            )


def make_ep_mesh(num_devices: int | None = None, axis: str = "ep") -> jax.sharding.Mesh:
    """A 1-D mesh over the first ``num_devices`` devices (default all) with an Auto ``ep`` axis."""
    n = num_devices or len(jax.devices())
    return jax.make_mesh((n,), (axis,), axis_types=(jax.sharding.AxisType.Auto,), devices=jax.devices()[:n])


def init_params(key: jax.Array, config: MoEConfig) -> dict:
    """Logical parameters: router [H, E] float32, w_gate/w_up [E, H, F], w_down [E, F, H] (config.dtype)."""
    k = jax.random.split(key, 4)
    H, F, E = config.hidden, config.ffn, config.experts
    scale_in, scale_out = H**-0.5, F**-0.5
    return {
        "router": jax.random.normal(k[0], (H, E), jnp.float32) * scale_in,
        "w_gate": (jax.random.normal(k[1], (E, H, F)) * scale_in).astype(config.dtype),
        "w_up": (jax.random.normal(k[2], (E, H, F)) * scale_in).astype(config.dtype),
        "w_down": (jax.random.normal(k[3], (E, F, H)) * scale_out).astype(config.dtype),
    }


def materialize(params: dict, phy2log: jax.Array) -> dict:
    """Physical expert weights ``[P, ...]`` gathered from logical ``[E, ...]`` (gradients of replicas flow back
    to the logical parameters through the gather)."""
    return {name: jnp.take(params[name], phy2log, axis=0) for name in ("w_gate", "w_up", "w_down")}


def moe_reference(params: dict, x: jax.Array, config: MoEConfig, routing=None) -> jax.Array:
    """Dense single-device MoE: every token through its top-k experts, no dispatch. ``[T, H]`` → ``[T, H]``.

    ``routing``: optional ``(topk_ids [T, K], weights [T, K])`` replacing the router (as in `moe_forward`)."""
    ids, w = route(x, params["router"], config.top_k, config.renormalize) if routing is None else routing
    hp = jax.lax.Precision.HIGHEST
    xs = x.astype(config.dtype)
    g = jnp.einsum("th,ehf->etf", xs, params["w_gate"], precision=hp)
    u = jnp.einsum("th,ehf->etf", xs, params["w_up"], precision=hp)
    y = jnp.einsum("etf,efh->eth", jax.nn.silu(g) * u, params["w_down"], precision=hp)  # [E, T, H]
    picked = y[ids, jnp.arange(x.shape[0])[:, None]]  # [T, K, H]
    return jnp.einsum("tk,tkh->th", w.astype(picked.dtype), picked).astype(x.dtype)


class RankInputs(NamedTuple):
    """What each rank's body receives; `specs` gives the shard_map spec of every field from this structure.

    Rank-sharded over the ``ep`` axis (``[D·n, ...]`` globally, ``[n, ...]`` per rank): x [T, H], w_gate /
    w_up [P, H, F], w_down [P, F, H], counter [D, E], ids / gate [T, K] (replayed routing). Replicated: router
    [H, E], table [Gs, E, R], log2phy [E, R], phy2log [P], key.
    """

    x: jax.Array
    router: jax.Array
    w_gate: jax.Array
    w_up: jax.Array
    w_down: jax.Array
    table: jax.Array
    log2phy: jax.Array
    phy2log: jax.Array
    counter: jax.Array
    key: jax.Array
    ids: jax.Array
    gate: jax.Array

    _REPLICATED = ("router", "table", "log2phy", "phy2log", "key")

    @classmethod
    def specs(cls, axis: str) -> RankInputs:
        return cls(*(P() if f in cls._REPLICATED else P(axis) for f in cls._fields))


class MoEStats(NamedTuple):
    """Per-rank statistics of one forward pass (leading axis D).

    Attributes:
      gpu_tokens: ``[D]`` rows each rank's experts computed (the paper's N_g).
      gpu_activations: ``[D]`` non-empty local slots (G_g).
      slot_tokens: ``[D, S]`` rows each local slot computed.
      drops: ``[D]`` pairs each source rank could not send (blocks over capacity); 0 when dropless.
      max_block: ``[D]`` the largest (source, destination) block each source wanted to send (the capacity a
        dropless run needs).
      replica_counts: ``[D, E, R]`` pairs each source sent to each replica column.
      topk_ids: ``[T, K]`` the routing (for traces).
    """

    gpu_tokens: jax.Array
    gpu_activations: jax.Array
    slot_tokens: jax.Array
    drops: jax.Array
    max_block: jax.Array
    replica_counts: jax.Array
    topk_ids: jax.Array


class MoEOutput(NamedTuple):
    """`moe_forward`'s result: ``out [T, H]``, ``counts [D, E]`` pairs per source rank and logical expert,
    ``counter [D, E]`` uint32 updated cumulative counters, ``stats`` (`MoEStats`)."""

    out: jax.Array
    counts: jax.Array
    counter: jax.Array
    stats: MoEStats


def _local_moe(inp: RankInputs, *, config: MoEConfig, impl: str, groups: int, given_routing: bool,
               capacity: int) -> MoEOutput:  # fmt: skip
    """Per-rank body (inside shard_map): `tempo_jax.stages` composed synchronously, or by the CascadeEP launch
    schedule and OEWF fetches of `tempo_jax.cascade_exec`."""
    axis, K, S = config.axis, config.top_k, config.slots_per_device
    D = jax.lax.axis_size(axis)
    d = jax.lax.axis_index(axis)
    T = inp.x.shape[0]
    # Step 1: route.
    rt = stages.Routing(inp.ids, inp.gate) if given_routing else route(inp.x, inp.router, K, config.renormalize)
    # Step 2: dispatch: logical expert → physical slot, with counts.
    uniforms = jax.random.uniform(jax.random.fold_in(inp.key, d), (T, K)) if config.mode == "sample" else None
    dp = stages.dispatch_pairs(rt, inp.table[(d * groups) // D], inp.log2phy, inp.counter[0], mode=config.mode,
                               uniforms=uniforms, interpret=config.interpret)  # fmt: skip
    dest, local = dp.slot // S, dp.slot % S
    weights = (inp.w_gate, inp.w_up, inp.w_down)
    if config.fetches:  # OEWF: fetched weights become extra local slots; the helper keeps its pairs for them
        ids = rt.ids.reshape(-1)
        fetch = functools.partial(cascade_exec.apply_fetches, axis=axis, slots_per_rank=S)
        dest, local, weights = fetch(config.fetches, ids, dest, local, inp.phy2log, weights)
    slots_total = weights[0].shape[0]
    # Step 3: pack by destination (rows and their slot ids travel together).
    packed = stages.pack(inp.x, dest, local, top_k=K, num_ranks=D, capacity=capacity, dtype=config.dtype)
    mm = dict(gmm_impl=config.gmm_impl, interpret=config.interpret)
    if config.schedule == "sync":
        # Step 4: one exchange; Step 5: expert FFN on every received row; Step 6: return.
        recv = stages.exchange(packed, axis=axis, impl=impl, hidden=config.hidden, slots_per_rank=slots_total)
        rows, slots = recv.rows.reshape(-1, config.hidden), recv.slots.reshape(-1)
        y, group_sizes = stages.expert_ffn(rows, slots, *weights, **mm)
        back = return_blocks(y.reshape(recv.rows.shape), recv.counts, packed.counts, axis=axis, impl=impl)
    else:
        # Steps 4–6 by the launch schedule: rounds per group, one grouped GEMM per group (CascadeEP).
        run = functools.partial(cascade_exec.scheduled_exchange_ffn, axis=axis, hidden=config.hidden, **mm)
        back, group_sizes = run(packed, config.schedule, weights, slots_total=slots_total)
    # Step 7: combine.
    out = stages.combine(stages.unpack_rows(back, packed), rt.gate, inp.x.dtype)
    stats = MoEStats(
        gpu_tokens=jnp.sum(group_sizes)[None],
        gpu_activations=jnp.sum(group_sizes > 0)[None],
        slot_tokens=group_sizes[:S][None],
        drops=jnp.sum(packed.wanted - packed.counts)[None],
        max_block=jnp.max(packed.wanted)[None],
        replica_counts=dp.replica_counts[None],
        topk_ids=rt.ids,
    )
    return MoEOutput(out, dp.counts[None], dp.counter[None], stats)


@functools.lru_cache(maxsize=64)
def _sharded_body(mesh: jax.sharding.Mesh, config: MoEConfig, impl: str, groups: int, given_routing: bool,
                  capacity: int):  # fmt: skip
    """The jitted shard_map program, built once per (mesh, config, exchange, table groups, capacity): eager
    callers (e.g. `MoE.__call__` outside `jit`) compile once instead of running the collective program op by op."""
    axis = config.axis
    body = functools.partial(_local_moe, config=config, impl=impl, groups=groups, given_routing=given_routing,
                             capacity=capacity)  # fmt: skip
    out_specs = MoEOutput(P(axis), P(axis), P(axis), MoEStats(*(P(axis) for _ in MoEStats._fields)))
    return jax.jit(
        jax.shard_map(body, mesh=mesh, in_specs=(RankInputs.specs(axis),), out_specs=out_specs, check_vma=False)
    )


def _concrete(*arrays) -> bool:
    return not any(isinstance(a, jax.core.Tracer) for a in arrays)


def _check_inputs(params, x, mesh, placement_arrays, tables, config, routing, capacity) -> int:
    """Every consistency check `moe_forward` can make before tracing; returns the per-rank capacity C.

    Value checks (ids in range, tables matching the placement) run when the arrays are concrete (an eager call);
    inside a caller's `jit` only shapes can be checked.
    """
    axis = config.axis
    if axis not in mesh.shape:
        raise ValueError(f"axis {axis!r} is not in the mesh (axes: {list(mesh.shape)}); set MoEConfig.axis")
    D = mesh.shape[axis]
    T, H = x.shape
    E, S, K = config.experts, config.slots_per_device, config.top_k
    # Step 1: shapes.
    if T == 0:
        raise ValueError("x has no tokens (T = 0); call the layer with at least D tokens")
    if H != config.hidden or params["router"].shape != (H, E):
        raise ValueError(
            f"x [T, H={H}] / router {params['router'].shape} do not match config (H={config.hidden}, E={E})"
        )
    if T % D:
        raise ValueError(f"T={T} tokens do not split evenly over {D} ranks of axis {axis!r}")
    phy2log = placement_arrays.phy2log
    if phy2log.shape[0] != D * S:
        raise ValueError(f"placement has {phy2log.shape[0]} slots but the mesh needs D·S = {D}·{S} = {D * S}")
    if tables.table.ndim != 3 or tables.table.shape[0] == 0:
        raise ValueError(f"tables.table must be [Gs ≥ 1, E, R], got shape {tables.table.shape}")
    if tables.log2phy.shape[0] != E or tables.table.shape[1:] != tables.log2phy.shape:
        raise ValueError(f"tables {tables.table.shape} / log2phy {tables.log2phy.shape} do not match E={E}")
    if placement_arrays.log2phy.shape != tables.log2phy.shape:
        raise ValueError(
            f"tables were built for another placement: log2phy {tables.log2phy.shape} vs the placement's "
            f"{placement_arrays.log2phy.shape}; build them from this placement (tempo_jax.tables)"
        )
    # Step 2: values, when concrete.
    if _concrete(phy2log, tables.log2phy, placement_arrays.log2phy):
        p2l, l2p = np.asarray(phy2log), np.asarray(tables.log2phy)
        if p2l.min() < 0 or p2l.max() >= E:
            bad = np.flatnonzero((p2l < 0) | (p2l >= E))
            raise ValueError(f"phy2log slots {bad[:10].tolist()} hold expert ids outside [0, {E})")
        if not np.array_equal(l2p, np.asarray(placement_arrays.log2phy)):
            raise ValueError("tables.log2phy differs from the placement's log2phy: tables built for another placement")
        if l2p.min() < -1 or l2p.max() >= D * S:
            raise ValueError(f"log2phy holds slots outside [-1, P = {D * S}): min {l2p.min()}, max {l2p.max()}")
        orphan = np.flatnonzero((l2p < 0).all(axis=1))
        if orphan.size:
            raise ValueError(f"experts {orphan[:10].tolist()} have no replica in log2phy; every expert needs one")
        if not np.array_equal(p2l[l2p[l2p >= 0]], np.nonzero(l2p >= 0)[0]):
            raise ValueError("log2phy and phy2log disagree: a replica column points at a slot of another expert")
    if isinstance(config.schedule, LaunchSchedule) and config.schedule.num_ranks != D:
        raise ValueError(f"MoEConfig.schedule is for {config.schedule.num_ranks} ranks but axis {axis!r} has {D}")
    if config.fetches and _concrete(phy2log):
        cascade_exec.check_fetches(config.fetches, np.asarray(phy2log), D, S)
    if routing is not None and _concrete(routing[0]):
        ids = np.asarray(routing[0])
        if ids.size and (ids.min() < 0 or ids.max() >= E):
            raise ValueError(f"routing ids must lie in [0, {E}), got min {ids.min()}, max {ids.max()}")
    # Step 3: capacity (rows per block): at most the worst case T/D·K.
    worst = (T // D) * K
    if capacity is None:
        capacity = config.capacity
    if capacity is None:
        return worst
    if capacity == "auto":
        raise ValueError("capacity='auto' is the MoE module's policy; pass capacity=<rows> to moe_forward")
    if isinstance(capacity, bool) or not isinstance(capacity, int | np.integer) or capacity < 1:
        raise ValueError(f"capacity must be a positive int (rows per block) or None, got {capacity!r}")
    return int(min(capacity, worst))


def moe_forward(
    params: dict,
    x: jax.Array,
    *,
    mesh: jax.sharding.Mesh,
    placement_arrays: PlacementArrays,
    tables: Tables,
    config: MoEConfig,
    key: jax.Array | None = None,
    counter: jax.Array | None = None,
    routing: tuple[jax.Array, jax.Array] | None = None,
    capacity: int | None = None,
) -> MoEOutput:
    """Expert-parallel MoE forward pass.

    Args:
      params: logical parameters (`init_params`): router [H, E], w_gate/w_up [E, H, F], w_down [E, F, H].
      x: [T, H] tokens; T divisible by D (they are split data-parallel over the ``ep`` axis).
      mesh: a mesh with ``config.axis`` (other axes are left alone: everything is replicated over them).
      placement_arrays: phy2log [P] (P = D·S) and log2phy [E, R].
      tables: `Tables` with table [Gs, E, R] (device d uses group d·Gs // D) and the same log2phy.
      config: `MoEConfig`.
      key: PRNG key for sample-mode dispatch (default key 0).
      counter: [D, E] uint32 cumulative per-rank expert counters (default zeros).
      routing: optional precomputed ``(topk_ids [T, K] int32, weights [T, K] float32)`` replacing the router
        (replaying recorded routing); the router parameter is then unused.
      capacity: rows per (source, destination) block for this call (overrides ``config.capacity``; clamped to
        the dropless worst case T/D·K).

    Returns:
      `MoEOutput` ``(out [T, H], counts [D, E], counter [D, E], stats)``.

    Raises:
      ValueError: before tracing, on inconsistent shapes, tables of another placement, ids out of range,
        experts without a replica, T = 0, an axis missing from the mesh or a bad capacity.
    """
    C = _check_inputs(params, x, mesh, placement_arrays, tables, config, routing, capacity)
    axis = config.axis
    D, T, E = mesh.shape[axis], x.shape[0], config.experts
    impl = EXCHANGE.resolve(config.exchange)
    key = jax.random.key(0) if key is None else key
    if counter is None:
        counter = jax.device_put(jnp.zeros((D, E), COUNTER_DTYPE), NamedSharding(mesh, P(axis)))
    phys = materialize(params, placement_arrays.phy2log)
    body = _sharded_body(mesh, config, impl, tables.num_groups, routing is not None, C)
    if routing is None:
        ids, gate = jnp.zeros((T, config.top_k), jnp.int32), jnp.zeros((T, config.top_k), jnp.float32)
    else:
        ids, gate = jnp.asarray(routing[0], jnp.int32), jnp.asarray(routing[1], jnp.float32)
        if ids.shape != (T, config.top_k) or gate.shape != ids.shape:
            raise ValueError(f"routing must be (ids, weights) of shape [T={T}, K={config.top_k}]")
    inputs = RankInputs(x, params["router"], phys["w_gate"], phys["w_up"], phys["w_down"], tables.table,
                        tables.log2phy, placement_arrays.phy2log, counter, key, ids, gate)  # fmt: skip
    if any(t == jax.sharding.AxisType.Explicit for t in mesh.axis_types):
        specs = RankInputs.specs(axis)
        inputs = RankInputs(*(jax.reshard(a, NamedSharding(mesh, s)) for a, s in zip(inputs, specs, strict=True)))
    return body(inputs)
