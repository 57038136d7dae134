"""The expert-parallel MoE layer: functional core (`moe_forward`) and its dense reference.

Inside `jax.shard_map` over the ``ep`` mesh axis (tokens data-parallel, physical expert slots
expert-parallel), per rank:

  router → top-k gating → dispatch kernel (table → physical slot) → sort by destination rank → exchange →
  sort by local slot → grouped-GEMM SwiGLU FFN → reverse exchange → weighted combine.

Replicas hold identical weights, so the output does not depend on the dispatch table, the policy or the mode:
every choice computes the same function as `moe_reference` (up to float reassociation). That is the project's
central invariant.

Glossary: T tokens (global; T/D per rank), H hidden, F expert FFN width, E logical experts, K top-k, D ranks
on the ``ep`` axis, S physical slots per rank, P = D·S physical slots, R replica columns, Gs source groups.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from pallas_kernels import COUNTER_DTYPE, DISPATCH_MODES, GMM, DispatchMode, GmmImpl, dispatch, gmm

from .exchange import EXCHANGE, ExchangeImpl, exchange, exchange_back
from .tables import PlacementArrays, Tables

__all__ = ["MoEConfig", "init_params", "materialize", "route", "moe_forward", "moe_reference", "make_ep_mesh"]


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
      capacity: rows per (source, destination) block; None = dropless worst case T/D·K.
      axis: name of the expert-parallel mesh axis.
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
    capacity: int | None = None
    axis: str = "ep"

    def __post_init__(self):
        for name in ("hidden", "ffn", "experts", "top_k", "slots_per_device"):
            if getattr(self, name) < 1:
                raise ValueError(f"MoEConfig.{name} must be ≥ 1, got {getattr(self, name)}")
        if self.top_k > self.experts:
            raise ValueError(f"MoEConfig.top_k={self.top_k} exceeds experts={self.experts}")
        if self.mode not in DISPATCH_MODES:
            raise ValueError(f"MoEConfig.mode must be one of {list(DISPATCH_MODES)}, got {self.mode!r}")
        EXCHANGE.validate(self.exchange)
        GMM.validate(self.gmm_impl)


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


def route(x: jax.Array, router: jax.Array, top_k: int, renormalize: bool = True) -> tuple[jax.Array, jax.Array]:
    """Softmax top-k gating. ``x [T, H]`` → ``(ids [T, K] int32, weights [T, K] float32)``."""
    logits = jnp.dot(x.astype(jnp.float32), router, precision=jax.lax.Precision.HIGHEST)
    probs = jax.nn.softmax(logits, axis=-1)
    weights, ids = jax.lax.top_k(probs, top_k)
    if renormalize:
        weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    return ids.astype(jnp.int32), weights


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


def _local_moe(
    x, router, wg, wu, wd, table, log2phy, counter, key, ids_in, gate_in, *, config, impl, groups, given_routing
):
    """Per-rank body (inside shard_map). x [T_loc, H]; wg/wu [S, H, F]; wd [S, F, H]; table [Gs, E, R]."""
    axis, K, S = config.axis, config.top_k, config.slots_per_device
    D = jax.lax.axis_size(axis)
    d = jax.lax.axis_index(axis)
    T = x.shape[0]
    # Step 1: route.
    if given_routing:
        ids, gate = ids_in, gate_in
    else:
        ids, gate = route(x, router, K, config.renormalize)
    # Step 2: dispatch kernel: logical expert → physical slot, with counts.
    tbl = table[(d * groups) // D]
    valid = jnp.ones((T,), bool)
    uniforms = jax.random.uniform(jax.random.fold_in(key, d), (T, K)) if config.mode == "sample" else None
    res = dispatch(ids, valid, tbl, log2phy, counter[0], mode=config.mode, uniforms=uniforms,
                   interpret=config.interpret)  # fmt: skip
    slot = res.slots.reshape(-1)  # [T·K]
    # Step 3: sort pairs by destination rank.
    dest = slot // S
    order = jnp.argsort(dest, stable=True)
    dest_sorted = dest[order]
    counts = jnp.bincount(dest, length=D)
    capacity = config.capacity or T * K
    rows = x.astype(config.dtype)[order // K]
    # Step 4: exchange (rows and their local slot ids).
    recv, recv_counts = exchange(rows, dest_sorted, counts, axis=axis, capacity=capacity, impl=impl)
    lslot, _ = exchange((slot[order] % S)[:, None], dest_sorted, counts, axis=axis, capacity=capacity, impl=impl)
    # Step 5: sort received rows by local slot (invalid rows last, outside every group).
    in_block = jnp.arange(capacity)[None, :] < recv_counts[:, None]  # [D, C]
    local = jnp.where(in_block, lslot[..., 0], S).reshape(-1)
    order2 = jnp.argsort(local, stable=True)
    xr = recv.reshape(-1, recv.shape[-1])[order2]
    group_sizes = jnp.bincount(local, length=S + 1)[:S].astype(jnp.int32)
    # Step 6: SwiGLU expert FFN as three grouped GEMMs over the local slots.
    mm = dict(implementation=config.gmm_impl, interpret=config.interpret)
    h = jax.nn.silu(gmm(xr, wg, group_sizes, **mm)) * gmm(xr, wu, group_sizes, **mm)
    y = gmm(h, wd, group_sizes, **mm)
    # Step 7: undo the local sort, send results back, undo the destination sort.
    y_recv = jnp.zeros_like(y).at[order2].set(y).reshape(recv.shape)
    back = exchange_back(y_recv, recv_counts, dest_sorted, counts, axis=axis, capacity=capacity, impl=impl)
    y_pairs = jnp.zeros_like(back).at[order].set(back).reshape(T, K, -1)
    # Step 8: weighted combine.
    out = jnp.einsum("tk,tkh->th", gate.astype(y_pairs.dtype), y_pairs).astype(x.dtype)
    aux = {
        "gpu_tokens": jnp.sum(group_sizes)[None],
        "gpu_activations": jnp.sum(group_sizes > 0)[None],
        "drops": jnp.sum(jnp.maximum(counts - capacity, 0))[None],
        "slot_tokens": group_sizes[None],
        "replica_counts": res.replica_counts[None],
        "topk_ids": ids,
    }
    return out, res.counts[None], res.counter[None], aux


def _in_specs(axis: str) -> tuple:
    # x, router, w_gate, w_up, w_down, table, log2phy, counter, key, routing ids, routing weights
    return (P(axis), P(), P(axis), P(axis), P(axis), P(), P(), P(axis), P(), P(axis), P(axis))


@functools.lru_cache(maxsize=64)
def _sharded_body(mesh: jax.sharding.Mesh, config: MoEConfig, impl: str, groups: int, given_routing: bool):
    """The jitted shard_map program, built once per (mesh, config, exchange, table groups): eager callers
    (e.g. `MoE.__call__` outside `jit`) compile once instead of running the collective program op by op."""
    axis = config.axis
    return jax.jit(
        jax.shard_map(
            functools.partial(_local_moe, config=config, impl=impl, groups=groups, given_routing=given_routing),
            mesh=mesh,
            in_specs=_in_specs(axis),
            out_specs=(P(axis), P(axis), P(axis), P(axis)),
            check_vma=False,
        )
    )


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
) -> tuple[jax.Array, jax.Array, dict]:
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

    Returns:
      ``(out [T, H], counts [D, E] per source rank, aux)``; aux holds ``counter [D, E]`` (updated),
      ``gpu_tokens [D]``, ``gpu_activations [D]`` (non-empty slots), ``drops [D]`` (zero when dropless),
      ``slot_tokens [D, S]`` (rows each slot computed) and ``replica_counts [D, E, R]`` (pairs each source
      sent to each replica column) and ``topk_ids [T, K]`` (the routing, for traces).
    """
    axis = config.axis
    D = mesh.shape[axis]
    T, H = x.shape
    E, S = config.experts, config.slots_per_device
    # Step 0: validate shapes (clear errors before tracing the collective program).
    if H != config.hidden or params["router"].shape != (H, E):
        raise ValueError(
            f"x [T, H={H}] / router {params['router'].shape} do not match config (H={config.hidden}, E={E})"
        )
    if T % D:
        raise ValueError(f"T={T} tokens do not split evenly over {D} ranks of axis {axis!r}")
    phy2log = placement_arrays.phy2log
    if phy2log.shape[0] != D * S:
        raise ValueError(f"placement has {phy2log.shape[0]} slots but the mesh needs D·S = {D}·{S} = {D * S}")
    if tables.log2phy.shape[0] != E or tables.table.shape[1:] != tables.log2phy.shape:
        raise ValueError(f"tables {tables.table.shape} / log2phy {tables.log2phy.shape} do not match E={E}")
    impl = EXCHANGE.resolve(config.exchange)
    key = jax.random.key(0) if key is None else key
    if counter is None:
        counter = jax.device_put(jnp.zeros((D, E), COUNTER_DTYPE), NamedSharding(mesh, P(axis)))
    phys = materialize(params, phy2log)

    body = _sharded_body(mesh, config, impl, tables.num_groups, routing is not None)
    if routing is None:
        ids_in, gate_in = jnp.zeros((T, config.top_k), jnp.int32), jnp.zeros((T, config.top_k), jnp.float32)
    else:
        ids_in, gate_in = jnp.asarray(routing[0], jnp.int32), jnp.asarray(routing[1], jnp.float32)
        if ids_in.shape != (T, config.top_k) or gate_in.shape != ids_in.shape:
            raise ValueError(f"routing must be (ids, weights) of shape [T={T}, K={config.top_k}]")
    args = [x, params["router"], phys["w_gate"], phys["w_up"], phys["w_down"], tables.table, tables.log2phy,
            counter, key, ids_in, gate_in]  # fmt: skip
    if any(t == jax.sharding.AxisType.Explicit for t in mesh.axis_types):
        args = [jax.reshard(a, NamedSharding(mesh, s)) for a, s in zip(args, _in_specs(axis), strict=True)]
    out, counts, new_counter, aux = body(*args)
    aux = {**aux, "counter": new_counter}
    return out, counts, aux
