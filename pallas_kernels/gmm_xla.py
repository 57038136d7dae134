"""XLA-only grouped-GEMM paths: the CPU-fast chunked loop and the `jax.lax.ragged_dot` fallback.

CPU-fast path ("chunked"): `ragged_dot` on XLA:CPU runs an order of magnitude below a dense matmul. Here
every local group is cut into row chunks of `chunk` rows aligned to the group's first row
(`make_chunk_schedule`), and a `while_loop` runs one dense [chunk, H] @ [H, F] matmul per chunk against that
group's weights, writing only the chunk's rows (read-modify-write of a `chunk`-row window). The loop runs
exactly as many iterations as there are chunks (no work for empty or inactive groups); the waste is the
tail of each group's last chunk. A window that would run past M is shifted back to end at M and masked.

Fallback ("ragged_dot"): `jax.lax.ragged_dot` with its default lowering. Its own `group_offset` is not
usable in jax 0.10 (the parameter must be hashable), so the local groups are rotated to row 0 with
`jnp.roll`, computed, masked and rotated back.

Dtypes: both operands are cast to `compute_dtype` (default: `gmm_metadata.dot_dtype`, their common dtype, or float32
when they differ) right before each dot, every dot accumulates in float32 (`preferred_element_type=float32`), and
the float32 result is cast once to `out_dtype`. Accumulation order: "chunked" leaves the H (contraction) sum to
XLA's dense dot, one call per row chunk (rows are independent, so chunking changes no sum); `tgmm_chunked` adds
per-chunk float32 partial products in chunk order. "ragged_dot" leaves both to XLA's `ragged_dot` lowering.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from pallas_kernels.gmm_metadata import dot_dtype, group_offsets, make_chunk_schedule

__all__ = ["gmm_chunked", "tgmm_chunked", "gmm_ragged", "tgmm_ragged"]


def _chunk_rows(sched, t, chunk: int, m: int):
    """Local group j, clamped window start w, and the valid row range [r0, r1) of chunk t."""
    j = jnp.searchsorted(sched.chunk_cum, t, side="right").astype(jnp.int32)
    first_chunk = sched.chunk_cum[j] - -(-(sched.ends[j] - sched.starts[j]) // chunk)
    r0 = sched.starts[j] + (t - first_chunk) * chunk
    r1 = jnp.minimum(r0 + chunk, sched.ends[j])
    w = jnp.minimum(r0, m - chunk)
    return j, w, r0, r1


@functools.partial(
    jax.jit, static_argnames=("num_local_groups", "chunk", "transpose_rhs", "out_dtype", "precision", "compute_dtype")
)
def gmm_chunked(
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    group_offset: jax.Array,
    *,
    num_local_groups: int,
    chunk: int,
    transpose_rhs: bool,
    out_dtype,
    precision=None,
    compute_dtype=None,
) -> jax.Array:
    """CPU-fast grouped GEMM: out [M, F]; rows of local groups get lhs @ rhs[j], all other rows zero.

    `lhs [M, H]`, `rhs [E_loc, H, F]` (or `[E_loc, F, H]` with `transpose_rhs`), `group_sizes [E]`
    int32, `group_offset` int32 scalar. Operands are cast to `compute_dtype` (default: `dot_dtype`, float32
    for mixed operands) per chunk; float32 accumulation; `out_dtype` output.
    """
    cd = dot_dtype(lhs, rhs, compute_dtype)
    m, _ = lhs.shape
    n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
    chunk = min(chunk, m)
    sched = make_chunk_schedule(
        group_sizes, m=m, chunk=chunk, group_offset=group_offset, num_local_groups=num_local_groups
    )
    dims = (((1,), (1,)), ((), ())) if transpose_rhs else (((1,), (0,)), ((), ()))

    def body(carry):
        t, out = carry
        j, w, r0, r1 = _chunk_rows(sched, t, chunk, m)
        x = lax.dynamic_slice_in_dim(lhs, w, chunk, axis=0).astype(cd)  # [chunk, H]
        y = lax.dot_general(x, rhs[j].astype(cd), dims, precision=precision, preferred_element_type=jnp.float32)
        rows = w + jnp.arange(chunk, dtype=jnp.int32)[:, None]
        old = lax.dynamic_slice_in_dim(out, w, chunk, axis=0)
        new = jnp.where((rows >= r0) & (rows < r1), y.astype(out.dtype), old)
        return t + 1, lax.dynamic_update_slice_in_dim(out, new, w, axis=0)

    out0 = jnp.zeros((m, n), out_dtype)
    _, out = lax.while_loop(lambda c: c[0] < sched.num_chunks, body, (jnp.int32(0), out0))
    return out


@functools.partial(jax.jit, static_argnames=("num_local_groups", "chunk", "out_dtype", "precision", "compute_dtype"))
def tgmm_chunked(
    lhs: jax.Array,
    grad: jax.Array,
    group_sizes: jax.Array,
    group_offset: jax.Array,
    *,
    num_local_groups: int,
    chunk: int,
    out_dtype,
    precision=None,
    compute_dtype=None,
) -> jax.Array:
    """CPU-fast transposed grouped GEMM: out [E_loc, H, F], out[j] = lhs_j^T @ grad_j (zeros if empty).

    `lhs [M, H]`, `grad [M, F]`, `group_sizes [E]` int32, `group_offset` int32 scalar; dtypes as in
    `gmm_chunked`.
    """
    cd = dot_dtype(lhs, grad, compute_dtype)
    m, k = lhs.shape
    n = grad.shape[1]
    chunk = min(chunk, m)
    sched = make_chunk_schedule(
        group_sizes, m=m, chunk=chunk, group_offset=group_offset, num_local_groups=num_local_groups
    )

    def body(carry):
        t, acc = carry
        j, w, r0, r1 = _chunk_rows(sched, t, chunk, m)
        rows = w + jnp.arange(chunk, dtype=jnp.int32)[:, None]
        keep = (rows >= r0) & (rows < r1)
        x = jnp.where(keep, lax.dynamic_slice_in_dim(lhs, w, chunk, axis=0), 0).astype(cd)
        y = jnp.where(keep, lax.dynamic_slice_in_dim(grad, w, chunk, axis=0), 0).astype(cd)
        part = lax.dot_general(x, y, (((0,), (0,)), ((), ())), precision=precision, preferred_element_type=jnp.float32)
        return t + 1, acc.at[j].add(part)

    acc0 = jnp.zeros((num_local_groups, k, n), jnp.float32)
    _, acc = lax.while_loop(lambda c: c[0] < sched.num_chunks, body, (jnp.int32(0), acc0))
    return acc.astype(out_dtype)


def _local_view(group_sizes: jax.Array, group_offset: jax.Array, num_local_groups: int, m: int):
    """Rows before the local groups, local sizes [E_loc] (clipped to M), and local row count."""
    offsets = group_offsets(group_sizes, m)
    num_groups = group_sizes.shape[0]
    off = jnp.asarray(group_offset, jnp.int32).reshape(())
    j = off + jnp.arange(num_local_groups, dtype=jnp.int32)
    jc = jnp.minimum(j, num_groups - 1)
    sizes = jnp.where(j < num_groups, offsets[jc + 1] - offsets[jc], 0)
    before = offsets[jnp.minimum(off, num_groups)]
    return before, sizes.astype(jnp.int32), jnp.sum(sizes)


@functools.partial(
    jax.jit, static_argnames=("num_local_groups", "transpose_rhs", "out_dtype", "precision", "compute_dtype")
)
def gmm_ragged(
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    group_offset: jax.Array,
    *,
    num_local_groups: int,
    transpose_rhs: bool,
    out_dtype,
    precision=None,
    compute_dtype=None,
) -> jax.Array:
    """`jax.lax.ragged_dot` fallback with group_offset; shapes and dtypes as in `gmm_chunked`."""
    cd = dot_dtype(lhs, rhs, compute_dtype)
    m = lhs.shape[0]
    before, sizes, total = _local_view(group_sizes, group_offset, num_local_groups, m)
    if transpose_rhs:
        rhs = jnp.swapaxes(rhs, 1, 2)
    x = jnp.roll(lhs, -before, axis=0).astype(cd)
    y = lax.ragged_dot(x, rhs.astype(cd), sizes, precision=precision, preferred_element_type=jnp.float32)
    y = jnp.where(jnp.arange(m)[:, None] < total, y, 0)
    return jnp.roll(y, before, axis=0).astype(out_dtype)


@functools.partial(jax.jit, static_argnames=("num_local_groups", "out_dtype", "precision", "compute_dtype"))
def tgmm_ragged(
    lhs: jax.Array,
    grad: jax.Array,
    group_sizes: jax.Array,
    group_offset: jax.Array,
    *,
    num_local_groups: int,
    out_dtype,
    precision=None,
    compute_dtype=None,
) -> jax.Array:
    """`jax.lax.ragged_dot_general` (ragged contraction) fallback of tgmm; shapes and dtypes as in `tgmm_chunked`."""
    cd = dot_dtype(lhs, grad, compute_dtype)
    m = lhs.shape[0]
    before, sizes, total = _local_view(group_sizes, group_offset, num_local_groups, m)
    keep = jnp.arange(m)[:, None] < total
    x = jnp.where(keep, jnp.roll(lhs, -before, axis=0), 0).astype(cd)
    y = jnp.where(keep, jnp.roll(grad, -before, axis=0), 0).astype(cd)
    dims = lax.RaggedDotDimensionNumbers(
        dot_dimension_numbers=(((0,), (0,)), ((), ())), lhs_ragged_dimensions=[0], rhs_group_dimensions=[]
    )
    out = lax.ragged_dot_general(x, y, sizes, dims, precision=precision, preferred_element_type=jnp.float32)
    return out.astype(out_dtype)
