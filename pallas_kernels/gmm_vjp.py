"""The grouped GEMM's custom VJP (megablox's ``ops.py``): one forward call on a backend of
`pallas_kernels.gmm_backends` — ``rhs`` one array or a tuple of parts side by side along the groups, FP8 parts
(`BlockScaled`) passed as they are where the backend reads FP8 (`fp8_path`) else dequantized here, FP8 activations
quantized here — and its backward: d lhs through the same backend with rhs read transposed, d rhs through its
`tgmm` (zero for frozen FP8 weights)."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from pallas_kernels import tokamax_backend
from pallas_kernels.fp8 import BlockScaled, fake_quantize_rows
from pallas_kernels.gmm_backends import BACKENDS
from pallas_kernels.gmm_call import GmmCall
from pallas_kernels.gmm_mosaic import fp8_in_kernel as _mosaic_fp8
from pallas_kernels.implementations import GMM, GmmImpl

__all__ = ["FP8_PATHS", "fp8_path", "gmm_vjp", "tgmm_call"]


#: How a grouped GEMM runs a block-scaled FP8 weight (`pallas_kernels.fp8.BlockScaled`): "fp8", the kernel reads the
#: e4m3 values and their scales (half the weight bytes streamed); "dequantize", the weight is dequantized to the
#: compute dtype first and the GEMM runs there.
FP8_PATHS = ("fp8", "dequantize")
#: Implementations that take FP8 weights into their kernel: tokamax (its sm90 kernel scales each e4m3 tile on chip
#: before the bf16 MMA; its XLA path, e.g. on CPU, dequantizes inside the call; 0.0.17's sm100 kernels take int4
#: weights only, which `tokamax_backend.fp8_compiles` finds out on such a GPU).
_FP8_IN_KERNEL = ("tokamax",)


def fp8_path(
    implementation: GmmImpl = "auto",
    *,
    interpret: bool = False,
    dtype=jnp.bfloat16,
    shape: tuple[int, ...] | None = None,
    block: tuple[int, int] | None = None,
) -> str:
    """How `gmm` with ``implementation`` runs a `BlockScaled` weight of ``shape [E, A, B]`` in ``(bA, bB)``
    blocks against ``dtype`` activations: "fp8" (the implementation takes the FP8 weight: tokamax's GPU kernels
    scale its e4m3 tiles on chip, its XLA path — CPU — dequantizes inside the call) or "dequantize" (dequantized to
    ``dtype`` first, then the GEMM). tokamax takes whole blocks only (its scale tiles must divide the weight), and
    only where this machine compiles its FP8 kernel for ``dtype`` (`tokamax_backend.fp8_compiles`); without
    ``shape`` / ``block`` the blocks are not checked. "mosaic" (`gmm_mosaic`) reads e4m3 tiles and dequantizes them
    on chip for bfloat16 / float16 activations and blocks whose extents are multiples of 64, partial edge blocks
    included (`gmm_mosaic.fp8_in_kernel`)."""
    impl = GMM.resolve(implementation, interpret=interpret)
    if impl == "mosaic":
        return "fp8" if _mosaic_fp8((64, 64) if block is None else block, dtype) else "dequantize"
    if impl not in _FP8_IN_KERNEL or not tokamax_backend.fp8_compiles(jnp.dtype(dtype)):
        return "dequantize"
    if shape is not None and block is not None and (shape[-2] % block[0] or shape[-1] % block[1]):
        return "dequantize"
    return "fp8"


def _fp8_operand(rhs, dtype, cfg: GmmCall):
    """``rhs`` (an array, a `BlockScaled` or a tuple of parts) with each `BlockScaled` part the GEMM does not read
    as FP8 (`fp8_path`) dequantized to ``dtype``, the compute dtype of the dot."""
    if isinstance(rhs, tuple):
        return tuple(_fp8_operand(w, dtype, cfg) for w in rhs)
    if not isinstance(rhs, BlockScaled):
        return rhs
    if fp8_path(cfg.implementation, dtype=dtype, shape=rhs.shape, block=rhs.block) == "fp8":
        return rhs
    return rhs.dequantize(dtype)


def _part_offsets(parts: tuple, group_offset: jax.Array) -> list:
    """The first group of each part of ``parts`` (arrays ``[E_p, ...]`` side by side along the groups)."""
    offs = [group_offset]
    for w in parts[:-1]:
        offs.append(offs[-1] + w.shape[0])
    return offs


def _gmm_call(lhs, rhs, group_sizes, group_offset, cfg: GmmCall, transpose_rhs: bool):
    """One forward grouped GEMM on ``cfg.implementation``'s backend; returns [M, F] in cfg.out_dtype. ``rhs`` may be
    a tuple of parts (`gmm`): "chunked" writes every part's groups into one buffer (``init``), the other
    implementations sum one output per part (rows outside a part's groups are zero in its output). FP8 parts
    (`BlockScaled`) reach the kernel as they are where it reads FP8 (`fp8_path`), else dequantized to the dtype of
    ``lhs`` here (inside the VJP: the residuals keep the FP8 weights)."""
    rhs = _fp8_operand(rhs, lhs.dtype, cfg)
    if cfg.lhs_block is not None:  # FP8 activations: the values an e4m3 x e4m3 GEMM multiplies, in lhs's dtype
        lhs, cfg = fake_quantize_rows(lhs, cfg.lhs_block), dataclasses.replace(cfg, lhs_block=None)
    backend = BACKENDS[cfg.implementation]
    if isinstance(rhs, tuple):
        out = None
        for w, off in zip(rhs, _part_offsets(rhs, group_offset), strict=True):
            part = dataclasses.replace(cfg, num_local_groups=w.shape[0])
            if cfg.implementation == "chunked":  # one buffer: each part writes its groups' rows
                out = backend.gmm(lhs, w, group_sizes, off, part, transpose_rhs=transpose_rhs, init=out)
            else:
                y = _gmm_call(lhs, w, group_sizes, off, part, transpose_rhs)
                out = y if out is None else out + y
        return out
    return backend.gmm(lhs, rhs, group_sizes, group_offset, cfg, transpose_rhs=transpose_rhs)


def tgmm_call(lhs, grad, group_sizes, group_offset, cfg: GmmCall, out_dtype):
    """One transposed grouped GEMM on ``cfg.implementation``'s backend; returns [E_loc, H, F] in ``out_dtype``."""
    return BACKENDS[cfg.implementation].tgmm(lhs, grad, group_sizes, group_offset, cfg, out_dtype=out_dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def gmm_vjp(lhs, rhs, group_sizes, group_offset, cfg: GmmCall):
    return _gmm_call(lhs, rhs, group_sizes, group_offset, cfg, transpose_rhs=False)


def _gmm_fwd(lhs, rhs, group_sizes, group_offset, cfg: GmmCall):
    out = _gmm_call(lhs, rhs, group_sizes, group_offset, cfg, transpose_rhs=False)
    return out, (lhs, rhs, group_sizes, group_offset)


def _gmm_bwd(cfg: GmmCall, res, g):
    lhs, rhs, group_sizes, group_offset = res
    # g [M, F] arrives in the output dtype. Each gradient is computed like a forward call (operands cast to their
    # compute dtype, float32 accumulation, as megablox's backward does) and returned in its operand's dtype.
    # d(lhs) [M, H] = g [M, F] @ rhs[group]^T; rows outside the local groups get exact zeros.
    # FP8 activations (``quantize_lhs``): straight through, d lhs as if lhs were not quantized (g is not quantized).
    back = dataclasses.replace(cfg, out_dtype=lhs.dtype, lhs_block=None)
    dlhs = _gmm_call(g, rhs, group_sizes, group_offset, back, transpose_rhs=True)

    # d(rhs) [E_loc, H, F] = lhs_g^T @ g_g per local group (per part); empty groups give exact zeros. FP8 weights
    # (`BlockScaled`) are frozen: their cotangent is zero.
    def drhs(w, off):
        if isinstance(w, BlockScaled):
            return jax.tree.map(jnp.zeros_like, w)
        part = dataclasses.replace(cfg, num_local_groups=w.shape[0])
        return tgmm_call(lhs, g, group_sizes, off, part, out_dtype=w.dtype)

    if isinstance(rhs, tuple):
        return dlhs, tuple(map(drhs, rhs, _part_offsets(rhs, group_offset))), None, None
    return dlhs, drhs(rhs, group_offset), None, None


gmm_vjp.defvjp(_gmm_fwd, _gmm_bwd)
