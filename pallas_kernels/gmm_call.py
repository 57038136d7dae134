"""What one grouped-GEMM call carries to its backend (`pallas_kernels.gmm_backends`): the tiling (`GmmTiling`), the
call's static settings (`GmmCall`: hashable, the custom VJP's static argument) and the helpers several backends
share (padding, Triton tiles and pipeline stages, the CPU path's chunk schedule)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from pallas_kernels.gmm_xla import SCHEDULES

__all__ = ["SMEM_BYTES", "GmmCall", "GmmTiling", "as_tiling", "chunks", "kernel_tiles", "next_pow2", "pad_to", "stages"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class GmmTiling:
    """Tile sizes. tm/tk/tn: Pallas tiles along M, H (contraction) and F (output) (powers of two, >= 16 for
    Triton; tk and tn shrink to the next power of two of small H, F). num_warps/num_stages: Triton launch knobs.

    CPU-fast path ("chunked", `gmm_xla`): every local group runs as dense matmuls of row chunks, the "ladder"
    `chunk, small_chunk, small_chunk/2, …, min_chunk` (`gmm_metadata.chunk_ladder`): chunk-row dots while a group
    has that many rows left, then small_chunk-row ones, then each smaller size at most once, then one masked
    min_chunk-row dot for the rest.
      chunk: the largest chunk (default 1024): on XLA:CPU only dots this large run on several cores.
      small_chunk: the first size below chunk (default 128): the fastest single-core dot size measured.
      min_chunk: the smallest (default 32): a group computes fewer than min_chunk rows past its end; below ~32
        rows the per-dot cost grows.
      tgmm_chunk: the largest chunk of `tgmm` (the weight gradient; default 256), whose dots contract over the
        chunk's rows ([H, c] @ [c, F]): its ladder is tgmm_chunk, small_chunk, … min_chunk.
      tgmm_fixed_rows: `tgmm` takes fixed chunks of tgmm_chunk rows instead of the ladder when the average
        local group has at least this many rows, M / E_loc >= tgmm_fixed_rows (default 512; static shapes, so
        one choice per compiled call): with large groups the few masked rows cost less than the ladder's
        per-group loops (measured 10–15% faster at E_loc = 10 and on 4096 x 1024 x 1024 / 8 groups).
      schedule: "ladder" (default) or "fixed" (the previous path, kept to compare: every chunk has `chunk` rows,
        `tgmm` too, so each group computes up to chunk − 1 rows past its end; the other CPU knobs are ignored;
        it used chunk=256).
    The defaults were measured on a 2-core CPU (`scripts/bench_gemm.py`; README "Grouped GEMM on CPU").
    """

    tm: int = 128
    tk: int = 64
    tn: int = 128
    num_warps: int = 8
    num_stages: int = 3
    chunk: int = 1024
    small_chunk: int = 128
    min_chunk: int = 32
    tgmm_chunk: int = 256
    tgmm_fixed_rows: int = 512
    schedule: str = "ladder"

    def __post_init__(self):
        for name in ("tm", "tk", "tn"):
            v = getattr(self, name)
            if v < 1 or v & (v - 1):
                raise ValueError(f"GmmTiling.{name} must be a positive power of two, got {v}")
        for name in ("chunk", "small_chunk", "min_chunk", "tgmm_chunk", "tgmm_fixed_rows"):
            if getattr(self, name) < 1:
                raise ValueError(f"GmmTiling.{name} must be positive, got {getattr(self, name)}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"GmmTiling.schedule must be one of {list(SCHEDULES)}, got {self.schedule!r}")


def as_tiling(tiling) -> GmmTiling:
    """``tiling`` as a `GmmTiling` (a ``(tm, tk, tn)`` tuple accepted)."""
    if isinstance(tiling, GmmTiling):
        return tiling
    if isinstance(tiling, tuple | list) and len(tiling) == 3:
        tm, tk, tn = (int(v) for v in tiling)
        return GmmTiling(tm=tm, tk=tk, tn=tn)
    raise ValueError(f"tiling must be a GmmTiling or a (tm, tk, tn) tuple, got {tiling!r}")


@dataclasses.dataclass(frozen=True)
class GmmCall:
    """One call's static settings, threaded through the custom VJP to the backend (hashable)."""

    implementation: str
    tiling: GmmTiling
    interpret: bool
    out_dtype: jnp.dtype
    num_local_groups: int
    precision: object = None
    lhs_block: int | None = None  # `gmm(quantize_lhs=...)`: lhs rows quantized to e4m3 in blocks of this many columns
    offset: bool = True  # group_offset may be nonzero (False: None or a concrete 0 at the entry, as the layer calls)


def next_pow2(x: int) -> int:
    """The smallest power of two >= x (1 for x <= 1)."""
    return 1 << max(0, (x - 1).bit_length())


def pad_to(x: jax.Array, axis: int, multiple: int) -> jax.Array:
    """``x`` zero-padded at the end of ``axis`` to a multiple of ``multiple``."""
    rem = (-x.shape[axis]) % multiple
    if rem == 0:
        return x
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, rem)
    return jnp.pad(x, pad)


def kernel_tiles(t: GmmTiling, m: int, k: int, n: int) -> tuple[int, int, int]:
    """Pallas tiles for this problem: tk, tn shrink to the next power of two of small H, F (>= 16)."""
    return t.tm, max(16, min(t.tk, next_pow2(k))), max(16, min(t.tn, next_pow2(n)))


# Shared memory one Triton program may fill with its pipelined tiles. An H100 / H200 block gets 232,448 bytes (227
# KiB, the limit the H200 reported in results/gpu/check.json); the rest is left to the kernel's own scratch.
SMEM_BYTES = 200 * 1024


def stages(t: GmmTiling, stage_bytes: int) -> int:
    """Triton pipeline stages that fit: `t.num_stages`, fewer (at least 1) when `stage_bytes` (the operand tiles one
    stage loads) times the stages would pass `SMEM_BYTES` — float32 tgmm at the default tiles loads 96 KiB a stage,
    so it runs 2 stages where 3 asked for 288 KiB and failed to launch on an H200."""
    return max(1, min(t.num_stages, SMEM_BYTES // stage_bytes))


def chunks(cfg: GmmCall, tgmm_rows: int | None = None) -> dict:
    """The CPU-fast path's schedule knobs from the tiling; `tgmm_rows` = M for tgmm (None for gmm)."""
    t = cfg.tiling
    if t.schedule == "fixed":
        return dict(chunk=t.chunk, schedule="fixed")
    if tgmm_rows is None:
        return dict(chunk=t.chunk, small_chunk=t.small_chunk, min_chunk=t.min_chunk, schedule="ladder")
    big_groups = tgmm_rows >= t.tgmm_fixed_rows * cfg.num_local_groups
    schedule = "fixed" if big_groups else "ladder"
    return dict(chunk=t.tgmm_chunk, small_chunk=t.small_chunk, min_chunk=t.min_chunk, schedule=schedule)
