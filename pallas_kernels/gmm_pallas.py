"""Pallas grouped-GEMM kernels (Triton-style GPU lowering; the same code runs with `interpret=True` on CPU).

Two kernels, both race-free without atomics because every grid program owns its output tile:

- `gmm_pallas`: grid (M-tiles, F-tiles). Program (i, j) loops over the active groups touching M-tile i
  (the tile's revisits, from `GroupMetadata`) and, per group, over H in `tk` steps; it keeps each visit's
  rows with a row mask and writes the whole (tm, tn) tile once — zeros where no active group owns a row.
- `tgmm_pallas`: grid (E_loc, H-tiles, F-tiles). Program (g, a, b) loops over the M-tiles of group g
  and accumulates lhs_tile^T @ grad_tile with rows outside the group masked to zero on both operands; an
  empty group runs zero iterations, so its gradient block is exactly zero.

Shapes are padded by the caller (`pallas_kernels.gmm`) to tile multiples; block shapes are powers of two as Triton
requires. Dtypes: each loaded tile is cast to `compute_dtype` (default: `gmm_metadata.dot_dtype`, the common dtype
of the two operands or float32 when they differ; Triton's dot needs equal operand types), every tile dot accumulates
in float32, and the float32 accumulator is cast once to `out_dtype`. Accumulation order: `gmm_pallas` sums the H/tk
tile products of a (tm, tn) tile sequentially in H order (each product itself is one `dot` over tk terms);
`tgmm_pallas` sums the M-tile products of a group sequentially in row order. On a GPU, float32 tiles with the
default `precision` go through TF32 tensor cores (Triton's rule); pass `jax.lax.Precision.HIGHEST` for IEEE float32
products.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels import triton_backend
from pallas_kernels.gmm_metadata import GroupMetadata, dot_dtype

__all__ = ["gmm_pallas", "tgmm_pallas"]

_NT = (((1,), (0,)), ((), ()))  # x [m, k] @ w [k, n]
_NN_T = (((1,), (1,)), ((), ()))  # x [m, k] @ w[n, k]^T
_TN = (((0,), (0,)), ((), ()))  # x[m, k]^T @ y [m, n]


def _gmm_kernel(
    offsets_ref,  # [E + 1]
    tile_lo_ref,  # [tiles]
    tile_hi_ref,  # [tiles]
    goff_ref,  # [1]
    lhs_ref,  # block [tm, Hp]
    rhs_ref,  # whole [E_loc, Hp, Fp] (or [E_loc, Fp, Hp] when transpose_rhs)
    out_ref,  # block [tm, tn]
    *,
    tm: int,
    tk: int,
    tn: int,
    k_tiles: int,
    transpose_rhs: bool,
    precision,
    compute_dtype,
):
    i = pl.program_id(0)
    j = pl.program_id(1)
    rows = i * tm + lax.broadcasted_iota(jnp.int32, (tm, tn), 0)
    g_off = goff_ref[0]

    def visit(g, acc):
        start = offsets_ref[g]
        end = offsets_ref[g + 1]

        def k_step(kk, part):
            x = lhs_ref[:, pl.ds(kk * tk, tk)].astype(compute_dtype)  # [tm, tk]
            if transpose_rhs:
                w = rhs_ref[g - g_off, pl.ds(j * tn, tn), pl.ds(kk * tk, tk)].astype(compute_dtype)  # [tn, tk]
                dims = _NN_T
            else:
                w = rhs_ref[g - g_off, pl.ds(kk * tk, tk), pl.ds(j * tn, tn)].astype(compute_dtype)  # [tk, tn]
                dims = _NT
            return part + lax.dot_general(x, w, dims, precision=precision, preferred_element_type=jnp.float32)

        def compute(acc):
            part = lax.fori_loop(0, k_tiles, k_step, jnp.zeros((tm, tn), jnp.float32))
            return acc + jnp.where((rows >= start) & (rows < end), part, 0.0)

        # Empty groups sitting between two non-empty ones inside this tile cost nothing.
        return lax.cond(end > start, compute, lambda a: a, acc)

    acc = lax.fori_loop(tile_lo_ref[i], tile_hi_ref[i], visit, jnp.zeros((tm, tn), jnp.float32))
    out_ref[...] = acc.astype(out_ref.dtype)


def _compiler_params(num_warps: int, num_stages: int, interpret: bool):
    return triton_backend.compiler_params(num_warps, num_stages, interpret)


@functools.partial(
    jax.jit,
    static_argnames=(
        "num_local_groups",
        "tiling",
        "transpose_rhs",
        "out_dtype",
        "interpret",
        "num_warps",
        "num_stages",
        "precision",
        "compute_dtype",
    ),
)
def gmm_pallas(
    lhs: jax.Array,
    rhs: jax.Array,
    meta: GroupMetadata,
    group_offset: jax.Array,
    *,
    num_local_groups: int,
    tiling: tuple[int, int, int],
    transpose_rhs: bool,
    out_dtype,
    interpret: bool,
    num_warps: int = 4,
    num_stages: int = 3,
    precision=None,
    compute_dtype=None,
) -> jax.Array:
    """Grouped GEMM on pre-padded operands: out [Mp, Fp] = per-row lhs [Mp, Hp] @ rhs[group(row)].

    `rhs` is [E_loc, Hp, Fp] (or [E_loc, Fp, Hp] with `transpose_rhs`); Mp, Hp, Fp are multiples of
    tiling = (tm, tk, tn). `meta` comes from `make_group_metadata(..., m=Mp, tm=tm)`; `group_offset` is
    int32 [1]. Rows outside the local groups come back as zeros. Tiles are cast to `compute_dtype` (default:
    `dot_dtype`: float32 for mixed operands) before each float32-accumulating dot.
    """
    tm, tk, tn = tiling
    mp, kp = lhs.shape
    np_ = rhs.shape[1] if transpose_rhs else rhs.shape[2]
    kernel = functools.partial(
        _gmm_kernel,
        tm=tm,
        tk=tk,
        tn=tn,
        k_tiles=kp // tk,
        transpose_rhs=transpose_rhs,
        precision=precision,
        compute_dtype=dot_dtype(lhs, rhs, compute_dtype),
    )
    whole = lambda a: pl.BlockSpec(a.shape, lambda i, j: (0,) * a.ndim)  # noqa: E731
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((mp, np_), out_dtype),
        grid=(mp // tm, np_ // tn),
        in_specs=[
            whole(meta.offsets),
            whole(meta.tile_group_lo),
            whole(meta.tile_group_hi),
            whole(group_offset),
            pl.BlockSpec((tm, kp), lambda i, j: (i, 0)),
            whole(rhs),
        ],
        out_specs=pl.BlockSpec((tm, tn), lambda i, j: (i, j)),
        compiler_params=_compiler_params(num_warps, num_stages, interpret),
        interpret=interpret,
        name="gmm",
    )(meta.offsets, meta.tile_group_lo, meta.tile_group_hi, group_offset, lhs, rhs)


def _tgmm_kernel(
    offsets_ref,  # [E + 1]
    gtile_lo_ref,  # [E_loc]
    gtile_hi_ref,  # [E_loc]
    goff_ref,  # [1]
    lhs_ref,  # whole [Mp, Hp]
    grad_ref,  # whole [Mp, Fp]
    out_ref,  # block [1, tk, tn]
    *,
    tm: int,
    tk: int,
    tn: int,
    precision,
    compute_dtype,
):
    g = pl.program_id(0)
    a = pl.program_id(1)
    b = pl.program_id(2)
    gg = g + goff_ref[0]
    start = offsets_ref[gg]
    end = offsets_ref[gg + 1]

    def m_step(mi, acc):
        x = lhs_ref[pl.ds(mi * tm, tm), pl.ds(a * tk, tk)]  # [tm, tk]
        y = grad_ref[pl.ds(mi * tm, tm), pl.ds(b * tn, tn)]  # [tm, tn]
        rx = mi * tm + lax.broadcasted_iota(jnp.int32, (tm, tk), 0)
        ry = mi * tm + lax.broadcasted_iota(jnp.int32, (tm, tn), 0)
        # Mask both operands: a non-finite value in another group's row must not leak in as 0 * inf.
        x = jnp.where((rx >= start) & (rx < end), x, jnp.zeros_like(x)).astype(compute_dtype)
        y = jnp.where((ry >= start) & (ry < end), y, jnp.zeros_like(y)).astype(compute_dtype)
        return acc + lax.dot_general(x, y, _TN, precision=precision, preferred_element_type=jnp.float32)

    acc = lax.fori_loop(gtile_lo_ref[g], gtile_hi_ref[g], m_step, jnp.zeros((tk, tn), jnp.float32))
    out_ref[0] = acc.astype(out_ref.dtype)


@functools.partial(
    jax.jit,
    static_argnames=(
        "num_local_groups",
        "tiling",
        "out_dtype",
        "interpret",
        "num_warps",
        "num_stages",
        "precision",
        "compute_dtype",
    ),
)
def tgmm_pallas(
    lhs: jax.Array,
    grad: jax.Array,
    meta: GroupMetadata,
    group_offset: jax.Array,
    *,
    num_local_groups: int,
    tiling: tuple[int, int, int],
    out_dtype,
    interpret: bool,
    num_warps: int = 4,
    num_stages: int = 3,
    precision=None,
    compute_dtype=None,
) -> jax.Array:
    """Transposed grouped GEMM on pre-padded operands: out [E_loc, Hp, Fp], out[j] = lhs_j^T @ grad_j.

    `lhs [Mp, Hp]`, `grad [Mp, Fp]` with rows sorted by group; lhs_j / grad_j are the rows of local group j
    (global group group_offset + j). Empty groups give exact zeros. Dtypes as in `gmm_pallas`.
    """
    tm, tk, tn = tiling
    mp, kp = lhs.shape
    np_ = grad.shape[1]
    cd = dot_dtype(lhs, grad, compute_dtype)
    kernel = functools.partial(_tgmm_kernel, tm=tm, tk=tk, tn=tn, precision=precision, compute_dtype=cd)
    whole = lambda x: pl.BlockSpec(x.shape, lambda g, a, b: (0,) * x.ndim)  # noqa: E731
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((num_local_groups, kp, np_), out_dtype),
        grid=(num_local_groups, kp // tk, np_ // tn),
        in_specs=[
            whole(meta.offsets),
            whole(meta.group_tile_lo),
            whole(meta.group_tile_hi),
            whole(group_offset),
            whole(lhs),
            whole(grad),
        ],
        out_specs=pl.BlockSpec((1, tk, tn), lambda g, a, b: (g, a, b)),
        compiler_params=_compiler_params(num_warps, num_stages, interpret),
        interpret=interpret,
        name="tgmm",
    )(meta.offsets, meta.group_tile_lo, meta.group_tile_hi, group_offset, lhs, grad)
