"""The fused TEMPO dispatch + count kernel (docs/algorithms.md §9) and its reference.

Every (token, k) pair routed to logical expert e picks one replica column r of e's table row and goes to
physical slot log2phy[e, r]; in the same pass the kernel counts the pair for expert e. The row is
renormalised at use, without dividing: with weights w_r (the table entry, zeroed where log2phy = -1 or the
entry is negative or not finite) and W = sum_r w_r, the pair takes the first column whose running sum
exceeds u * W for its position u in [0, 1). A row with W = 0 — e.g. a torn update caught half written —
falls back to w_r = 1 on every valid replica (uniform). A column without a replica or with zero weight is
never chosen; an expert without any replica gets slot -1 (still counted: the counter measures demand).
Padding rows (valid = False) neither route (slot -1) nor count — otherwise they fabricate a hot expert.

Modes (the position u of each pair):
- "sample": u = the caller's uniforms [T, K] — the paper's probabilistic dispatch.
- "quota": u = (i + 0.5) / n_e for the i-th valid pair of expert e in this call (row-major over [T, K])
  among n_e — deterministic: the i-th token goes to the replica whose quota interval [n_e * C_{r-1},
  n_e * C_r) contains i + 0.5 (C = cumulative normalised row), so the realised count of every replica is
  within one token of its planned share n_e * w_r / W for this source. (Beyond the paper.)

Counters: the cumulative per-expert counter is `COUNTER_DTYPE` = uint32 and wraps modulo 2**32; the runtime
recovers the counts of a window from two snapshots ((now - before) mod 2**32, `tempo_jax.runtime.counters`).

Kernel layout: the [T, K] pairs are flattened and cut into blocks of `block` pairs; one grid program per
block writes its slots, replica columns and a per-block partial count row [E]. Partials are summed (tiny)
and added to the counter outside the kernel: race-free and deterministic, no atomics needed.
"""

from __future__ import annotations

import functools
from typing import Literal, NamedTuple, get_args

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels import triton_backend
from pallas_kernels.dispatch_columns import pick_columns
from pallas_kernels.dispatch_tpu import dispatch_tpu
from pallas_kernels.implementations import DISPATCH, DispatchImpl

__all__ = [
    "COUNTER_DTYPE",
    "DISPATCH_MODES",
    "DispatchMode",
    "DispatchResult",
    "dispatch",
    "dispatch_reference",
    "occurrence_ranks",
]

COUNTER_DTYPE = jnp.uint32
DispatchMode = Literal["sample", "quota"]
DISPATCH_MODES: tuple[str, ...] = get_args(DispatchMode)


class DispatchResult(NamedTuple):
    """Outputs of `dispatch`.

    slots:          [T, K] int32 physical slot per pair; -1 for padding rows and experts without replicas.
    counter:        [E] uint32 cumulative counter + this call's counts (wraps modulo 2**32).
    counts:         [E] int32 valid pairs routed to each logical expert in this call.
    replica_counts: [E, R] int32 valid pairs sent to each replica column of each expert.
    """

    slots: jax.Array
    counter: jax.Array
    counts: jax.Array
    replica_counts: jax.Array


def occurrence_ranks(topk_ids: jax.Array, valid: jax.Array, num_experts: int) -> tuple[jax.Array, jax.Array]:
    """Rank of every valid pair among this call's valid pairs of the same expert, in row-major order.

    topk_ids [T, K] int, valid [T] bool -> (ranks [T, K] int32 (0 for padding), totals [E] int32).
    """
    t, k = topk_ids.shape
    ok = (valid[:, None] & (topk_ids >= 0) & (topk_ids < num_experts)).reshape(-1)
    key = jnp.where(ok, topk_ids.reshape(-1), num_experts).astype(jnp.int32)
    order = jnp.argsort(key, stable=True)
    sorted_key = key[order]
    first = jnp.searchsorted(sorted_key, sorted_key, side="left")
    ranks = jnp.zeros((t * k,), jnp.int32).at[order].set(jnp.arange(t * k, dtype=jnp.int32) - first)
    totals = jnp.zeros((num_experts + 1,), jnp.int32).at[key].add(1)[:num_experts]
    return jnp.where(ok, ranks, 0).reshape(t, k), totals


def _positions(mode, topk_ids, valid, num_experts, uniforms, ranks):
    """Position u [T, K] float32 of every pair (see the module docstring)."""
    if mode == "sample":
        return uniforms.astype(jnp.float32)
    computed, totals = occurrence_ranks(topk_ids, valid, num_experts)
    ranks = computed if ranks is None else ranks
    n = totals[jnp.clip(topk_ids, 0, num_experts - 1)]
    return (ranks.astype(jnp.float32) + 0.5) / jnp.maximum(n, 1).astype(jnp.float32)


def _validate(topk_ids, valid, table, log2phy, counter, mode, uniforms, ranks, implementation):
    if mode not in DISPATCH_MODES:
        raise ValueError(f"dispatch: unknown mode {mode!r}; expected one of {DISPATCH_MODES}")
    DISPATCH.validate(implementation)
    if topk_ids.ndim != 2 or not jnp.issubdtype(topk_ids.dtype, jnp.integer):
        raise ValueError(f"dispatch: topk_ids must be integer [T, K], got {topk_ids.dtype}{topk_ids.shape}")
    t, k = topk_ids.shape
    if valid.shape != (t,) or valid.dtype != jnp.bool_:
        raise ValueError(f"dispatch: valid must be bool [T={t}], got {valid.dtype}{valid.shape}")
    if table.ndim != 2 or not jnp.issubdtype(table.dtype, jnp.floating):
        raise ValueError(f"dispatch: table must be float [E, R], got {table.dtype}{table.shape}")
    if log2phy.shape != table.shape or not jnp.issubdtype(log2phy.dtype, jnp.integer):
        raise ValueError(f"dispatch: log2phy must be integer {table.shape}, got {log2phy.dtype}{log2phy.shape}")
    if counter.shape != (table.shape[0],) or counter.dtype != COUNTER_DTYPE:
        raise ValueError(f"dispatch: counter must be uint32 [E={table.shape[0]}], got {counter.dtype}{counter.shape}")
    if mode == "sample":
        if uniforms is None:
            raise ValueError("dispatch: mode='sample' needs uniforms [T, K] in [0, 1)")
        if uniforms.shape != (t, k) or not jnp.issubdtype(uniforms.dtype, jnp.floating):
            raise ValueError(f"dispatch: uniforms must be float [{t}, {k}], got {uniforms.dtype}{uniforms.shape}")
    elif ranks is not None and (ranks.shape != (t, k) or not jnp.issubdtype(ranks.dtype, jnp.integer)):
        raise ValueError(f"dispatch: ranks must be integer [{t}, {k}], got {ranks.dtype}{ranks.shape}")
    if not isinstance(topk_ids, jax.core.Tracer) and not isinstance(valid, jax.core.Tracer):
        ids = np.asarray(topk_ids)[np.asarray(valid)]
        if ids.size and (ids.min() < 0 or ids.max() >= table.shape[0]):
            raise ValueError(f"dispatch: topk_ids of valid rows must lie in [0, E={table.shape[0]})")


def _dispatch_kernel(ids_ref, ok_ref, u_ref, table_ref, l2p_ref, slot_ref, col_ref, cnt_ref, *, r_cols, e_pad):
    """One block of `block` pairs: choose a replica column per pair and count the block's valid pairs."""
    ok = ok_ref[...] != 0  # [block]
    e = jnp.where(ok, ids_ref[...], 0)
    u = u_ref[...]
    u = jnp.where(u >= 0.0, jnp.minimum(u, 1.0), 0.0)  # NaN or negative -> 0
    # Step 1: each pair's replica columns, gathered from the table and sanitised.
    phys, w, has = [], [], []
    for r in range(r_cols):
        p = l2p_ref[e, r]
        x = table_ref[e, r].astype(jnp.float32)
        h = p >= 0
        phys.append(p), has.append(h), w.append(jnp.where(h & (x > 0.0) & (x < jnp.inf), x, 0.0))
    # Step 2: the column and slot (`dispatch_columns.pick_columns`, shared with the TPU kernel).
    col, slot = pick_columns(w, has, phys, u)
    slot_ref[...] = jnp.where(ok, slot, -1)
    col_ref[...] = jnp.where(ok, col, -1)
    # Step 3: this block's count per logical expert (padding masked).
    hit = (e[:, None] == lax.broadcasted_iota(jnp.int32, (u.shape[0], e_pad), 1)) & ok[:, None]
    cnt_ref[...] = jnp.sum(hit.astype(jnp.int32), axis=0)[None, :]


@functools.partial(jax.jit, static_argnames=("block", "interpret"))
def _dispatch_pallas(ids, ok, u, table, log2phy, *, block: int, interpret: bool):
    """Flattened pairs ids/ok/u [P] -> (slots [P], cols [P], counts [E]) via the Pallas kernel."""
    p = ids.shape[0]
    e, r = table.shape
    e_pad = 1 << max(0, (e - 1).bit_length())
    pad = (-p) % block
    ids, ok, u = (jnp.pad(a, (0, pad)) for a in (ids, ok.astype(jnp.int32), u))
    nb = ids.shape[0] // block
    blk = pl.BlockSpec((block,), lambda b: (b,))
    whole = pl.BlockSpec((e, r), lambda b: (0, 0))
    slots, cols, partial = pl.pallas_call(
        functools.partial(_dispatch_kernel, r_cols=r, e_pad=e_pad),
        out_shape=(
            jax.ShapeDtypeStruct((nb * block,), jnp.int32),
            jax.ShapeDtypeStruct((nb * block,), jnp.int32),
            jax.ShapeDtypeStruct((nb, e_pad), jnp.int32),
        ),
        grid=(nb,),
        in_specs=[blk, blk, blk, whole, whole],
        out_specs=(blk, blk, pl.BlockSpec((1, e_pad), lambda b: (b, 0))),
        # Triton-style lowering on GPU (jax 0.10 defaults to Mosaic GPU without Triton compiler params).
        compiler_params=triton_backend.compiler_params(4, 1, interpret),
        interpret=interpret,
        name="tempo_dispatch",
    )(ids.astype(jnp.int32), ok, u.astype(jnp.float32), table.astype(jnp.float32), log2phy.astype(jnp.int32))
    return slots[:p], cols[:p], jnp.sum(partial, axis=0)[:e]


def _finish(ids, ok, slots, cols, counts, counter, r_cols, shape):
    """Assemble a DispatchResult: per-replica counts (scatter) and the wrapping counter update."""
    e = counter.shape[0]
    rc = jnp.zeros((e, r_cols), jnp.int32)
    rc = rc.at[jnp.where(ok, ids, e), jnp.where(cols >= 0, cols, r_cols)].add(1, mode="drop")
    new_counter = counter + counts.astype(COUNTER_DTYPE)  # modulo 2**32
    return DispatchResult(slots.reshape(shape), new_counter, counts, rc)


def dispatch_reference(
    topk_ids: jax.Array,
    valid: jax.Array,
    table: jax.Array,
    log2phy: jax.Array,
    counter: jax.Array,
    *,
    mode: DispatchMode = "sample",
    uniforms: jax.Array | None = None,
    ranks: jax.Array | None = None,
) -> DispatchResult:
    """Pure-jnp truth for `dispatch` (same arguments and result; vectorised over [T, K, R])."""
    _validate(topk_ids, valid, table, log2phy, counter, mode, uniforms, ranks, "auto")
    e_num, r_cols = table.shape
    u = _positions(mode, topk_ids, valid, e_num, uniforms, ranks)
    u = jnp.where(u >= 0.0, jnp.minimum(u, 1.0), 0.0)
    ok = valid[:, None] & (topk_ids >= 0) & (topk_ids < e_num)  # [T, K]
    e = jnp.where(ok, topk_ids, 0)
    phys = log2phy[e].astype(jnp.int32)  # [T, K, R]
    rows = table[e].astype(jnp.float32)
    has = phys >= 0
    w = jnp.where(has & (rows > 0.0) & (rows < jnp.inf), rows, 0.0)
    total, nrep = jnp.zeros(u.shape, jnp.float32), jnp.zeros(u.shape, jnp.float32)
    for r in range(r_cols):  # sequential sums: the same float operations as the kernel
        total, nrep = total + w[..., r], nrep + has[..., r].astype(jnp.float32)
    torn = total <= 0.0
    w = jnp.where(torn[..., None], has.astype(jnp.float32), w)
    total = jnp.where(torn, nrep, total)
    run = jnp.zeros(u.shape, jnp.float32)
    below = []
    for r in range(r_cols):
        run = run + w[..., r]
        below.append(run <= u * total)
    idx = jnp.sum(jnp.stack(below, -1), axis=-1).astype(jnp.int32)
    positive = w > 0.0
    last = jnp.where(positive.any(-1), r_cols - 1 - jnp.argmax(positive[..., ::-1], axis=-1), -1)
    col = jnp.where(ok, jnp.minimum(idx, last), -1).astype(jnp.int32)
    slot = jnp.where(col >= 0, jnp.take_along_axis(phys, jnp.maximum(col, 0)[..., None], -1)[..., 0], -1)
    counts = jnp.zeros((e_num,), jnp.int32).at[e.reshape(-1)].add(ok.reshape(-1).astype(jnp.int32))
    return _finish(
        e.reshape(-1), ok.reshape(-1), slot.reshape(-1), col.reshape(-1), counts, counter, r_cols, topk_ids.shape
    )


def dispatch(
    topk_ids: jax.Array,
    valid: jax.Array,
    table: jax.Array,
    log2phy: jax.Array,
    counter: jax.Array,
    *,
    mode: DispatchMode = "sample",
    uniforms: jax.Array | None = None,
    ranks: jax.Array | None = None,
    block: int = 256,
    interpret: bool = False,
    implementation: DispatchImpl = "auto",
) -> DispatchResult:
    """Fused dispatch + count: pick a physical slot per (token, k) pair and update the expert counters.

    Args:
      topk_ids: [T, K] int logical expert per pair (valid rows must lie in [0, E)).
      valid: [T] bool; False marks padding rows, which neither route nor count.
      table: [E, R] float probabilities ("sample") or quotas ("quota") over e's replica columns; rows need
        not be normalised; a row with no positive weight on a valid replica is treated as uniform.
      log2phy: [E, R] int physical slot of replica column r of expert e, -1 = no replica.
      counter: [E] uint32 cumulative per-expert counter (wraps modulo 2**32).
      mode: "sample" (needs `uniforms` [T, K] in [0, 1)) or "quota" (deterministic; `ranks` [T, K], the
        occurrence rank of each pair among its expert's valid pairs, default `occurrence_ranks`).
      block: pairs per kernel program (a power of two).
      interpret: run the Pallas kernel in interpret mode (CPU tests; "pallas_tpu": Pallas's TPU interpret mode).
      implementation: "auto" (Pallas on GPU or when interpret=True, else the jnp reference), "pallas" (the GPU
        kernel, Triton lowering), "pallas_tpu" (the TPU kernel, `pallas_kernels.dispatch_tpu`; lowers for TPU,
        not yet run on one) or "xla" (the jnp reference).
    Returns:
      DispatchResult(slots [T, K], counter [E], counts [E], replica_counts [E, R]).
    Raises:
      ValueError on bad shapes or dtypes, an unknown mode or implementation, missing uniforms, or
      concrete expert ids outside [0, E).
    """
    _validate(topk_ids, valid, table, log2phy, counter, mode, uniforms, ranks, implementation)
    if block < 1 or block & (block - 1):
        raise ValueError(f"dispatch: block must be a positive power of two, got {block}")
    impl = DISPATCH.resolve(implementation, interpret=interpret)
    if impl == "xla":
        return dispatch_reference(topk_ids, valid, table, log2phy, counter, mode=mode, uniforms=uniforms, ranks=ranks)
    e_num, r_cols = table.shape
    u = _positions(mode, topk_ids, valid, e_num, uniforms, ranks)
    ok = (valid[:, None] & (topk_ids >= 0) & (topk_ids < e_num)).reshape(-1)
    ids = topk_ids.reshape(-1).astype(jnp.int32)
    kernel = dispatch_tpu if impl == "pallas_tpu" else _dispatch_pallas
    slots, cols, counts = kernel(ids, ok, u.reshape(-1), table, log2phy, block=block, interpret=interpret)
    return _finish(jnp.where(ok, ids, 0), ok, slots, cols, counts, counter, r_cols, topk_ids.shape)
