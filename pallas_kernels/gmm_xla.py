"""XLA-only grouped-GEMM paths: the CPU-fast chunked loops and the `jax.lax.ragged_dot` fallback.

CPU-fast path ("chunked"): `ragged_dot` on XLA:CPU runs an order of magnitude below a dense matmul, so every
local group is cut into row chunks and each chunk is one dense [c, H] @ [H, F] matmul against that group's
weights, inside `while_loop`s (static shapes; the loops run exactly as many chunks as the data needs, no work for
empty or inactive groups). Two schedules (`GmmTiling.schedule`):

- "ladder" (default): a `fori_loop` over the local groups; for group j (rows [s, e)):
    1. slice (and cast) its weights once;
    2. for each size c of the ladder `chunk, small_chunk, small_chunk/2, …, min_chunk` (`chunk_ladder`): while
       at least c rows remain, one chunk of c rows, written straight into the output (the window lies inside
       the group: no read-modify-write);
    3. the last < min_chunk rows: one masked chunk of min_chunk rows (read-modify-write of that window, shifted
       back to end at M if it would run past it).
  So a group computes fewer than min_chunk rows past its end (not up to `chunk`), which is what matters for the
  small groups of an MoE layer (H = 256, F = 128, E = 64: ~20–300 rows per group). Why two scales: on XLA:CPU a
  dot inside a loop runs on one core unless it is large (measured at H = 256, F = 128 on 2 cores, cache-resident
  rows: ~130 GFLOP/s for 128–512-row dots, ~180 at 1024 rows, vs ~270 for a dense matmul on both cores), so big
  groups go in `chunk`-row dots and the rest in `small_chunk`-row ones (the fastest small size there; 256 rows
  measured slower than 2 x 128).
- "fixed" (the previous path, kept to compare): one `while_loop` over all chunks of `chunk` rows aligned to each
  group's start (`make_chunk_schedule`), each a read-modify-write of its window masked to the group's rows.

`tgmm_chunked` (the weight gradient) walks the same schedules. `gmm` passes it `GmmTiling.tgmm_chunk` as the
largest chunk (its dots contract over the chunk's rows, which favours longer chunks) and the fixed schedule when
the average local group is large (M / E_loc >= `GmmTiling.tgmm_fixed_rows`). With "ladder" each group's [H, F]
float32 sum is a loop carry (full chunks unmasked, the tail chunk masked in both operands) written once per
group; "fixed" adds every chunk's product into the [E_loc, H, F] accumulator.

Fallback ("ragged_dot"): `jax.lax.ragged_dot` with its default lowering. Its own `group_offset` is not
usable in jax 0.10 (the parameter must be hashable), so the local groups are rotated to row 0 with
`jnp.roll`, computed, masked and rotated back. "tokamax" is the same path through tokamax's `ragged_dot_general`
(`tokamax_backend`; `backend="tokamax"`): its Mosaic GPU kernels on sm90 / sm100, XLA's lowering elsewhere.

Dtypes: both operands are cast to `compute_dtype` (default: `gmm_metadata.dot_dtype`, their common dtype, or float32
when they differ) right before each dot, every dot accumulates in float32 (`preferred_element_type=float32`), and
the float32 result is cast once to `out_dtype`. Accumulation order: "chunked" leaves the H (contraction) sum to
XLA's dense dot, one call per row chunk (rows are independent, so chunking changes no sum); `tgmm_chunked` adds
per-chunk float32 partial products in row order within each group. "ragged_dot" leaves both to XLA's `ragged_dot`
lowering.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from pallas_kernels import tokamax_backend
from pallas_kernels.fp8 import BlockScaled
from pallas_kernels.gmm_metadata import (
    chunk_ladder,
    dot_dtype,
    group_offsets,
    local_group_rows,
    make_chunk_schedule,
    walk_ladder,
)

__all__ = ["gmm_chunked", "tgmm_chunked", "gmm_ragged", "tgmm_ragged", "RAGGED_BACKENDS", "SCHEDULES"]

#: Row-chunk schedules of the CPU-fast path (see the module docstring).
SCHEDULES = ("ladder", "fixed")


def _chunk_rows(sched, t, chunk: int, m: int):
    """Fixed schedule: local group j, clamped window start w, and the valid row range [r0, r1) of chunk t."""
    j = jnp.searchsorted(sched.chunk_cum, t, side="right").astype(jnp.int32)
    first_chunk = sched.chunk_cum[j] - -(-(sched.ends[j] - sched.starts[j]) // chunk)
    r0 = sched.starts[j] + (t - first_chunk) * chunk
    r1 = jnp.minimum(r0 + chunk, sched.ends[j])
    w = jnp.minimum(r0, m - chunk)
    return j, w, r0, r1


@functools.partial(
    jax.jit,
    static_argnames=(
        "num_local_groups",
        "chunk",
        "min_chunk",
        "small_chunk",
        "schedule",
        "transpose_rhs",
        "out_dtype",
        "precision",
        "compute_dtype",
    ),
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
    min_chunk: int = 32,
    small_chunk: int | None = None,
    schedule: str = "ladder",
    precision=None,
    compute_dtype=None,
    init: jax.Array | None = None,
) -> jax.Array:
    """CPU-fast grouped GEMM: out [M, F]; rows of local groups get lhs @ rhs[j], all other rows zero — or, with
    ``init [M, F]`` (`out_dtype`), their rows of ``init``: the loops write into it, so the local groups of several
    weight arrays (`gmm`'s parts) fill one output buffer.

    `lhs [M, H]`, `rhs [E_loc, H, F]` (or `[E_loc, F, H]` with `transpose_rhs`), `group_sizes [E]`
    int32, `group_offset` int32 scalar. Operands are cast to `compute_dtype` (default: `dot_dtype`, float32
    for mixed operands) per chunk; float32 accumulation; `out_dtype` output. `schedule`, `chunk`, `small_chunk`,
    `min_chunk`: see the module docstring and `chunk_ladder`.
    """
    cd = dot_dtype(lhs, rhs, compute_dtype)
    m, _ = lhs.shape
    n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
    dims = (((1,), (1,)), ((), ())) if transpose_rhs else (((1,), (0,)), ((), ()))

    def dot(x, w):
        return lax.dot_general(x.astype(cd), w, dims, precision=precision, preferred_element_type=jnp.float32)

    out0 = jnp.zeros((m, n), out_dtype) if init is None else init.astype(out_dtype)
    if schedule == "fixed":
        return _gmm_fixed(lhs, rhs, group_sizes, group_offset, num_local_groups, min(chunk, m), cd, dot, out0)
    starts, ends = local_group_rows(group_sizes, m=m, group_offset=group_offset, num_local_groups=num_local_groups)
    sizes = chunk_ladder(chunk, min_chunk, m, small_chunk)

    def group(j, out):
        w = rhs[j].astype(cd)  # Step 1: this group's weights, once.
        end = ends[j]

        def full(c):  # Step 2: a chunk inside the group (r0 + c <= end <= M): a plain write.
            def step(s):
                r0, out = s
                y = dot(lax.dynamic_slice_in_dim(lhs, r0, c, axis=0), w)
                return r0 + c, lax.dynamic_update_slice_in_dim(out, y.astype(out.dtype), r0, axis=0)

            return step

        def tail(c):  # Step 3: the last rows, masked; the window is shifted back if it would pass M.
            def step(s):
                r0, out = s
                w0 = jnp.minimum(r0, m - c)
                y = dot(lax.dynamic_slice_in_dim(lhs, w0, c, axis=0), w)
                rows = w0 + jnp.arange(c, dtype=jnp.int32)[:, None]
                old = lax.dynamic_slice_in_dim(out, w0, c, axis=0)
                new = jnp.where((rows >= r0) & (rows < end), y.astype(out.dtype), old)
                return r0 + c, lax.dynamic_update_slice_in_dim(out, new, w0, axis=0)

            return step

        return walk_ladder(starts[j], end, sizes, full, tail, out)

    return lax.fori_loop(0, num_local_groups, group, out0)


def _gmm_fixed(lhs, rhs, group_sizes, group_offset, num_local_groups: int, chunk: int, cd, dot, out0):
    """The fixed schedule: one while_loop over every `chunk`-row chunk, each a masked read-modify-write."""
    m = lhs.shape[0]
    sched = make_chunk_schedule(
        group_sizes, m=m, chunk=chunk, group_offset=group_offset, num_local_groups=num_local_groups
    )

    def body(carry):
        t, out = carry
        j, w, r0, r1 = _chunk_rows(sched, t, chunk, m)
        y = dot(lax.dynamic_slice_in_dim(lhs, w, chunk, axis=0), rhs[j].astype(cd))
        rows = w + jnp.arange(chunk, dtype=jnp.int32)[:, None]
        old = lax.dynamic_slice_in_dim(out, w, chunk, axis=0)
        new = jnp.where((rows >= r0) & (rows < r1), y.astype(out.dtype), old)
        return t + 1, lax.dynamic_update_slice_in_dim(out, new, w, axis=0)

    return lax.while_loop(lambda c: c[0] < sched.num_chunks, body, (jnp.int32(0), out0))[1]


@functools.partial(
    jax.jit,
    static_argnames=(
        "num_local_groups",
        "chunk",
        "min_chunk",
        "small_chunk",
        "schedule",
        "out_dtype",
        "precision",
        "compute_dtype",
    ),
)
def tgmm_chunked(
    lhs: jax.Array,
    grad: jax.Array,
    group_sizes: jax.Array,
    group_offset: jax.Array,
    *,
    num_local_groups: int,
    chunk: int,
    out_dtype,
    min_chunk: int = 32,
    small_chunk: int | None = None,
    schedule: str = "ladder",
    precision=None,
    compute_dtype=None,
) -> jax.Array:
    """CPU-fast transposed grouped GEMM: out [E_loc, H, F], out[j] = lhs_j^T @ grad_j (zeros if empty).

    `lhs [M, H]`, `grad [M, F]`, `group_sizes [E]` int32, `group_offset` int32 scalar; dtypes and schedules as
    in `gmm_chunked`.
    """
    cd = dot_dtype(lhs, grad, compute_dtype)
    m, k = lhs.shape
    n = grad.shape[1]

    def dot(x, y):
        return lax.dot_general(
            x.astype(cd),
            y.astype(cd),
            (((0,), (0,)), ((), ())),
            precision=precision,
            preferred_element_type=jnp.float32,
        )

    acc0 = jnp.zeros((num_local_groups, k, n), jnp.float32)
    if schedule == "fixed":
        acc = _tgmm_fixed(lhs, grad, group_sizes, group_offset, num_local_groups, min(chunk, m), dot, acc0)
        return acc.astype(out_dtype)
    starts, ends = local_group_rows(group_sizes, m=m, group_offset=group_offset, num_local_groups=num_local_groups)
    sizes = chunk_ladder(chunk, min_chunk, m, small_chunk)

    def group(j, acc):
        end = ends[j]

        def full(c):  # a chunk inside the group: no masking needed
            def step(s):
                r0, a = s
                x = lax.dynamic_slice_in_dim(lhs, r0, c, axis=0)
                return r0 + c, a + dot(x, lax.dynamic_slice_in_dim(grad, r0, c, axis=0))

            return step

        def tail(c):  # the last rows: rows outside [r0, end) are zeroed in both operands (no NaN leaks in)
            def step(s):
                r0, a = s
                w0 = jnp.minimum(r0, m - c)
                rows = w0 + jnp.arange(c, dtype=jnp.int32)[:, None]
                keep = (rows >= r0) & (rows < end)
                x = jnp.where(keep, lax.dynamic_slice_in_dim(lhs, w0, c, axis=0), 0)
                y = jnp.where(keep, lax.dynamic_slice_in_dim(grad, w0, c, axis=0), 0)
                return r0 + c, a + dot(x, y)

            return step

        a = walk_ladder(starts[j], end, sizes, full, tail, jnp.zeros((k, n), jnp.float32))
        return lax.dynamic_update_index_in_dim(acc, a, j, axis=0)

    return lax.fori_loop(0, num_local_groups, group, acc0).astype(out_dtype)


def _tgmm_fixed(lhs, grad, group_sizes, group_offset, num_local_groups: int, chunk: int, dot, acc0):
    """The fixed schedule of `tgmm_chunked`: every chunk's masked product added into acc[j]."""
    m = lhs.shape[0]
    sched = make_chunk_schedule(
        group_sizes, m=m, chunk=chunk, group_offset=group_offset, num_local_groups=num_local_groups
    )

    def body(carry):
        t, acc = carry
        j, w, r0, r1 = _chunk_rows(sched, t, chunk, m)
        rows = w + jnp.arange(chunk, dtype=jnp.int32)[:, None]
        keep = (rows >= r0) & (rows < r1)
        x = jnp.where(keep, lax.dynamic_slice_in_dim(lhs, w, chunk, axis=0), 0)
        y = jnp.where(keep, lax.dynamic_slice_in_dim(grad, w, chunk, axis=0), 0)
        return t + 1, acc.at[j].add(dot(x, y))

    return lax.while_loop(lambda c: c[0] < sched.num_chunks, body, (jnp.int32(0), acc0))[1]


def _rotate(a: jax.Array, shift: jax.Array, offset: bool) -> jax.Array:
    """``a`` rolled by ``shift`` rows (a traced shift: XLA concatenates ``a`` to itself and slices), or ``a`` itself
    when there is no group offset (``shift`` is then 0)."""
    return jnp.roll(a, shift, axis=0) if offset else a


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


#: Backends of the ragged paths: XLA's `ragged_dot_general` or tokamax's (same signature; `tokamax_backend`).
RAGGED_BACKENDS = ("xla", "tokamax")
_ROWS = lax.RaggedDotDimensionNumbers(
    dot_dimension_numbers=(((1,), (1,)), ((), ())), lhs_ragged_dimensions=[0], rhs_group_dimensions=[0]
)
_CONTRACT_ROWS = lax.RaggedDotDimensionNumbers(
    dot_dimension_numbers=(((0,), (0,)), ((), ())), lhs_ragged_dimensions=[0], rhs_group_dimensions=[]
)


#: Rows of tokamax's Mosaic GPU kernels come in tiles of 64 (an H200 refused M = 1000: "dimension 1 must have size
#: smaller or a multiple of its tiling 64"): its path pads the rows to a multiple of this with zero rows past the
#: local groups, which no group reads.
TOKAMAX_ROW_TILE = 128


def _pad_rows(a: jax.Array, backend: str) -> jax.Array:
    rem = -a.shape[0] % TOKAMAX_ROW_TILE if backend == "tokamax" else 0
    return jnp.pad(a, ((0, rem), (0, 0))) if rem else a


def _ragged_dot_general(backend: str, *, ragged_contraction: bool = False):
    """The backend's `ragged_dot_general`. tokamax's ragged contraction (tgmm, the weight gradient) runs its XLA
    implementation: on an H200, tokamax 0.0.17's Mosaic GPU kernel for it returned wrong sums for some groups
    (relative error 0.11–0.23 on groups of 300–450 rows among others; results/gpu/tokamax_tgmm.txt), while its
    forward kernel was right on every case of the GPU check."""
    if backend == "xla":
        return lax.ragged_dot_general
    if backend == "tokamax":
        dot = tokamax_backend.ragged_dot_general()
        return functools.partial(dot, implementation="xla") if ragged_contraction else dot
    raise ValueError(f"ragged backend must be one of {RAGGED_BACKENDS}, got {backend!r}")


@functools.partial(
    jax.jit,
    static_argnames=(
        "num_local_groups",
        "transpose_rhs",
        "out_dtype",
        "precision",
        "compute_dtype",
        "backend",
        "offset",
    ),
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
    backend: str = "xla",
    offset: bool = True,
) -> jax.Array:
    """`ragged_dot` with group_offset (XLA's or tokamax's, `backend`); shapes and dtypes as in `gmm_chunked`. With
    tokamax ``rhs`` may be a `BlockScaled` FP8 weight: it goes in as a qwix ``QArray`` (`tokamax_backend.qarray`)
    and the dot runs in lhs's dtype. ``offset=False``: the offset is known to be 0, so the rows are not rotated to
    the first local group and back (two copies of the row buffer, each a concatenation and a slice)."""
    fp8 = isinstance(rhs, BlockScaled)  # tokamax only (`gmm.fp8_path`): the kernel reads the e4m3 weights
    cd = lhs.dtype if fp8 else dot_dtype(lhs, rhs, compute_dtype)
    m = lhs.shape[0]
    before, sizes, total = _local_view(group_sizes, group_offset, num_local_groups, m)
    if transpose_rhs:
        rhs = rhs.mT if fp8 else jnp.swapaxes(rhs, 1, 2)
    x = _pad_rows(_rotate(lhs, -before, offset).astype(cd), backend)
    dot = _ragged_dot_general(backend)
    w = tokamax_backend.qarray(rhs, cd) if fp8 else rhs.astype(cd)
    # tokamax's sm90 FP8 kernel writes its output in lhs's dtype only (a float32 tile does not fit its swizzle): ask
    # for that when it is the output dtype anyway (the same one rounding of the float32 sums)
    acc = cd if fp8 and jnp.dtype(out_dtype) == cd else jnp.float32
    y = dot(x, w, sizes, _ROWS, precision=precision, preferred_element_type=acc)[:m]
    y = jnp.where(jnp.arange(m)[:, None] < total, y, 0)
    return _rotate(y, before, offset).astype(out_dtype)


@functools.partial(
    jax.jit, static_argnames=("num_local_groups", "out_dtype", "precision", "compute_dtype", "backend", "offset")
)
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
    backend: str = "xla",
    offset: bool = True,
) -> jax.Array:
    """`ragged_dot_general` over a ragged contraction (XLA's or tokamax's, `backend`): tgmm; shapes and dtypes
    as in `tgmm_chunked`; ``offset`` as in `gmm_ragged`."""
    cd = dot_dtype(lhs, grad, compute_dtype)
    m = lhs.shape[0]
    before, sizes, total = _local_view(group_sizes, group_offset, num_local_groups, m)
    keep = jnp.arange(m)[:, None] < total
    x = _pad_rows(jnp.where(keep, _rotate(lhs, -before, offset), 0).astype(cd), backend)
    y = _pad_rows(jnp.where(keep, _rotate(grad, -before, offset), 0).astype(cd), backend)
    dot = _ragged_dot_general(backend, ragged_contraction=True)
    out = dot(x, y, sizes, _CONTRACT_ROWS, precision=precision, preferred_element_type=jnp.float32)
    return out.astype(out_dtype)
