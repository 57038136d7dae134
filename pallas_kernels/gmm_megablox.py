"""The TPU grouped GEMM: megablox's Pallas TPU kernels (`jax.experimental.pallas.ops.tpu.megablox`) behind `gmm`'s
semantics (`gmm(implementation="megablox")`).

megablox computes what `gmm` defines — rows sorted by group, only the groups [o, o + E_loc) of ``group_offset``
computed, every other row zero — with bf16 or float32 operands accumulated in float32. This file adapts the rest:
float16 operands are computed in float32 (megablox takes bf16 and float32 only; float32 holds them exactly), rows
and widths are padded to its tiles (the padding belongs to no group), the weight gradient's lhs is passed
transposed as `megablox.tgmm` expects, and ``interpret=True`` runs the kernels in Pallas's TPU interpret mode
(`pltpu.InterpretParams`: TPU semantics simulated on CPU). `gmm` owns the VJP (d lhs = this gmm with rhs
transposed in place, d rhs = this tgmm), as for every implementation.

Tiles: megablox's own default, 128 × 128 × 128 (rows × contraction × output; rows shrink to 16 for fewer rows).
No TPU has timed them here; MaxText passes larger tiles on its TPUs, a setting to measure on one.
"""

from __future__ import annotations

import importlib

import jax
import jax.numpy as jnp
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.gmm_metadata import group_offsets

# The kernels' module (the package's own `gmm` name is the custom-VJP function, which hides the module).
megablox = importlib.import_module("jax.experimental.pallas.ops.tpu.megablox.gmm")

__all__ = ["TILE", "gmm_megablox", "tgmm_megablox"]

#: megablox's default tile along each dimension (rows, contraction, output).
TILE = 128
_ROWS_MIN = 16  # a bf16 sublane tile


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _pad(x: jax.Array, axis: int, size: int) -> jax.Array:
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, size - x.shape[axis])
    return jnp.pad(x, widths)


def _compute_dtype(dtype) -> jnp.dtype:
    """megablox computes in bfloat16 or float32; a float16 operand pair goes to float32 (exact)."""
    dtype = jnp.dtype(dtype)
    return dtype if dtype in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float32)) else jnp.dtype(jnp.float32)


def _interpret(interpret: bool):
    return pltpu.InterpretParams() if interpret else False


def _row_tile(m: int) -> int:
    return min(TILE, _round_up(max(m, 1), _ROWS_MIN))


def _call_options(tm: int, group_offset: jax.Array, interpret: bool) -> dict:
    """The keyword arguments megablox's gmm and tgmm share: float32 accumulation, the tiles, the first local group
    (a ``()`` int32 array) and the interpret mode."""
    return dict(
        preferred_element_type=jnp.float32,
        tiling=(tm, TILE, TILE),
        group_offset=jnp.asarray(group_offset, jnp.int32).reshape(()),
        interpret=_interpret(interpret),
    )


def gmm_megablox(
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    group_offset: jax.Array,
    *,
    transpose_rhs: bool,
    out_dtype,
    compute_dtype,
    interpret: bool,
) -> jax.Array:
    """lhs [M, H] @ rhs[g − o] per local group g → [M, F] in ``out_dtype`` (rhs [E_loc, H, F], or [E_loc, F, H] with
    ``transpose_rhs``); group_sizes [E] int32, group_offset () int32; operands cast to ``compute_dtype``."""
    m, k = lhs.shape
    n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
    dtype = _compute_dtype(compute_dtype)
    tm = _row_tile(m)
    mp, kp, np_ = _round_up(m, tm), _round_up(k, TILE), _round_up(n, TILE)
    x = _pad(_pad(lhs.astype(dtype), 0, mp), 1, kp)
    w = rhs.astype(dtype)
    w = _pad(_pad(w, 1, np_), 2, kp) if transpose_rhs else _pad(_pad(w, 1, kp), 2, np_)
    sizes = group_sizes.astype(jnp.int32)
    out = megablox.gmm(x, w, sizes, transpose_rhs=transpose_rhs, **_call_options(tm, group_offset, interpret))
    # megablox leaves rows past the last group unwritten when the local groups run to the end of group_sizes.
    offsets = group_offsets(sizes, m)  # [E + 1]
    o = jnp.asarray(group_offset, jnp.int32).reshape(())
    start, stop = offsets[o], offsets[jnp.minimum(o + rhs.shape[0], sizes.shape[0])]
    row = jnp.arange(m)[:, None]
    return jnp.where((row >= start) & (row < stop), out[:m, :n], 0.0).astype(out_dtype)


def tgmm_megablox(
    lhs: jax.Array,
    grad: jax.Array,
    group_sizes: jax.Array,
    group_offset: jax.Array,
    *,
    num_local_groups: int,
    out_dtype,
    compute_dtype,
    interpret: bool,
) -> jax.Array:
    """lhs_g^T @ grad_g per local group → [E_loc, H, F] in ``out_dtype`` (lhs [M, H], grad [M, F]); empty groups
    give zeros."""
    m, k = lhs.shape
    n = grad.shape[1]
    dtype = _compute_dtype(compute_dtype)
    tm = _row_tile(m)
    mp, kp, np_ = _round_up(m, tm), _round_up(k, TILE), _round_up(n, TILE)
    x = _pad(_pad(lhs.astype(dtype), 0, mp), 1, kp)
    g = _pad(_pad(grad.astype(dtype), 0, mp), 1, np_)
    out = megablox.tgmm(
        x.T,
        g,
        group_sizes.astype(jnp.int32),
        num_actual_groups=num_local_groups,
        **_call_options(tm, group_offset, interpret),
    )
    return out[:, :k, :n].astype(out_dtype)
