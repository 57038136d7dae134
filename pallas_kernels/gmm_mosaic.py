"""The project's own Pallas Mosaic GPU grouped GEMM (`gmm(implementation="mosaic")`): sm90 ``wgmma`` fed by TMA.

    out = gmm_mosaic(lhs [M, H], rhs [E_loc, H, F], group_sizes [E] int32, group_offset=o)   # [M, F]

Exactly `pallas_kernels.gmm`'s function: rows of local groups [o, o + E_loc) get ``lhs_row @ rhs[g - o]``, every
other row (other ranks' groups, rows past sum(group_sizes)) is zero; empty groups cost no kernel work.

Design (one kernel body, two shape-chosen configurations, `MosaicTiling`):

- **Work list** (a jnp prologue before the kernel, `work_list`): every non-empty local group j (rows [s_j, e_j)) is
  cut into row tiles of tm rows starting at its own first row rounded down to a multiple of 8 (TMA into SMEM tiled
  in 8-row tiles needs 8-aligned rows in GMEM), a_j + t·tm with a_j = 8⌊s_j / 8⌋: a tile *stores* only rows of its
  group, so no two items write one row and the MMA needs no row masks; it still *reads* tm rows, and the rows not
  its group's (at most 7 before, the next group's or padding after) are computed and dropped. A tile that would run
  past the last row slides back to end there (its stored window moves inside it). One entry per tile: (local group,
  first row read, first stored row inside the tile, rows stored). A group of n rows takes ⌈(n + s_j mod 8) / tm⌉
  tiles — no extra visit for straddling a fixed tm grid; empty groups take none. The list has a static length
  (`Plan.max_tiles`, ⌈M / tm⌉ + E_loc + ⌈7 E_loc / tm⌉); the count used is data, read by the kernel.
- **Persistent grid**: one CTA per SM (``grid=(num_sms,)``); CTA c takes work items c, c + num_sms, … of the list
  (item = (row tile, K split, N tile), N fastest, so the CTAs running at once share a row tile of lhs and one
  group's weight columns in L2), up to the data-dependent count (`pl.loop` with a dynamic bound).
- **Pipeline**: `plgpu.emit_pipeline_warp_specialized` over the K steps of one item: a memory warpgroup issues the
  TMA copies of the lhs tile [tm, tk] and the weight tile [tk, tn·W] (W = 2 compute warpgroups) into a
  ``stages``-deep ring of swizzled SMEM buffers, the compute warpgroups each run ``wgmma`` on their [tk, tn] half
  into a float32 register accumulator [tm, tn] (``delay_release=0``: each step waits its wgmma before releasing its
  slot, so items can reuse the pipeline's barriers; an untuned choice). Epilogue: the accumulator is cast once to
  the output dtype, written to SMEM, and stored by TMA to exactly the item's rows with a ladder of power-of-two row
  copies (TMA boxes are static; ⌈log2 tm⌉ + 1 predicated copies cover any count). Rows of no local group are never
  written by the kernel; one select after it (fused by XLA) makes them zero.
- **Prefill vs decode** (static shapes): when the local groups average at most `DECODE_ROWS` rows (M / E_loc <=
  64), the decode configuration runs: 64-row tiles, 64-column warpgroup tiles, a deeper pipeline (up to 6 stages of
  64 K), and the K axis split across CTAs (``k_splits``) until the items fill the SMs — each activated expert's weight
  columns are then streamed by many CTAs at once. Split-K partials go to a float32 [S, M, F] buffer that XLA adds
  (float32) and casts once. Prefill: 128 × (2 × 128) CTA tiles, 64-deep K steps, as many stages as fit SMEM.
- **Dtypes** (`gmm`'s rule): operands cast to the compute dtype (`gmm_metadata.dot_dtype`), wgmma accumulates in
  float32, the result is cast once. bfloat16 and float16 run natively. float32 runs on TF32 wgmma (as XLA and
  Triton do by default on a GPU); wgmma reads TF32 only K-major, so the weight is passed transposed ([E, F, H], an
  XLA copy) for the forward; ``precision=HIGHEST`` runs 3×TF32 (lhs and rhs split into TF32 high and low parts,
  hi·hi + lo·hi + hi·lo, concatenated along K: three times the MMA work, ~float32 accuracy).
- **FP8** (`fp8.BlockScaled` rhs with bfloat16 / float16 lhs): the e4m3 weight tiles are TMA'd into SMEM as e4m3
  (half the weight bytes), and each compute warpgroup dequantizes its tile in registers — e4m3 → float16 (the only
  e4m3 conversion Mosaic GPU emits on sm90 at jax 0.12.1) → float32, times the tile's float32 scale, → the compute
  dtype — into an SMEM buffer that its wgmma reads: the same values as `BlockScaled.dequantize` (float32 product,
  one rounding). The tiles hold one scale each (64-wide tiles inside blocks whose extents are multiples of 64, e.g.
  DeepSeek's 128 × 128; partial edge blocks are fine), read per step from GMEM (untuned: a prefetch through SMEM is
  the obvious next step); other blocks, and float32 lhs, are dequantized before the call (`fp8_in_kernel`).
- **VJP**: `gmm` owns it. d lhs = this kernel with the weight read transposed in place (``transpose_rhs``: weight
  tiles [tn, tk] of rhs[j] viewed as [tk, tn] by wgmma; FP8 weights too). d rhs = `tgmm_mosaic`, which reuses the
  repository's XLA grouped contractions (`gmm_xla.tgmm_ragged` on a GPU — the same path tokamax's implementation
  takes for d rhs — and `gmm_xla.tgmm_chunked` on CPU): a Mosaic GPU tgmm kernel (ragged contraction: per-group K
  ranges, a [H, F] accumulator per group) is the next step, not written yet.

Verification status (no GPU was available when this was written): values and gradients are checked against
`gmm_reference` in Mosaic GPU's *GPU interpret mode* on CPU (`plgpu.InterpretGPUParams`: simulated SMEM, barriers,
TMA and warpgroups, uninitialised memory read as NaN, and its race detector on three configurations;
tests/test_gmm_mosaic.py), and the kernels are lowered for CUDA (an H100 target) from CPU, which runs Mosaic GPU's
Python lowering — layout inference, swizzles, wgmma operand checks, the 227 KiB shared-memory limit — down to the
``mosaic_gpu_v2`` custom call. What interpret mode does not show, and lowering did: TMA into 8-row SMEM tiles needs
8-aligned GMEM rows (hence `ROW_ALIGN`) and 16-wide / 16-deep N-major bf16 weight tiles fail layout inference (hence
64 × 64 minimum tiles). What neither shows: TF32 rounding (interpret mode multiplies float32 exactly), PTX
compilation (the CUDA plugin that compiles the module is not installed on a CPU machine), execution on a GPU, and
every performance claim above (tiles, stages, the split-K rule, the SM count: untuned). "auto" never picks this
implementation (`implementations.GMM`).

Needs jax >= 0.12 with Pallas Mosaic GPU (`available`); imported lazily, so older JAX (the 0.10 environment) imports
this module and refuses the implementation with `MOSAIC_HINT`.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from pallas_kernels.fp8 import BlockScaled
from pallas_kernels.gmm_metadata import default_out_dtype, dot_dtype, local_group_rows

__all__ = [
    "DECODE_ROWS",
    "MOSAIC_HINT",
    "MosaicTiling",
    "available",
    "fp8_in_kernel",
    "gmm_mosaic",
    "plan",
    "tgmm_mosaic",
    "work_list",
]

#: Average rows per local group (M / E_loc) up to which the decode configuration runs.
DECODE_ROWS = 64
#: The SMs of the GPU the kernel is lowered for when no GPU is attached (an H100 SXM / H200).
DEFAULT_SMS = 132
#: CTAs simulated in interpret mode (each is a simulated thread block; few keep the simulation fast).
INTERPRET_SMS = 2
#: Row alignment of every tile's first row (TMA into SMEM tiled in 8-row tiles takes 8-aligned GMEM rows).
ROW_ALIGN = 8
#: SMEM one CTA may fill with its tiles (an H100 / H200 block gets 227 KiB; the rest is left for barriers and
#: alignment; Mosaic GPU refuses a kernel over 227 KiB when it lowers it).
SMEM_BYTES = 220 * 1024
MOSAIC_HINT = (
    'gmm(implementation="mosaic") needs jax >= 0.12 with Pallas Mosaic GPU (jax.experimental.pallas.mosaic_gpu '
    "and its GPU interpret mode), and a CUDA GPU (sm_90), interpret=True, or an abstract mesh of a GPU device to lower "
    "for one"
)

_F32 = jnp.dtype(jnp.float32)


def _plgpu():
    """`jax.experimental.pallas.mosaic_gpu`, imported on first use (absent or incomplete before jax 0.12)."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    return plgpu


@functools.cache
def available() -> bool:
    """Pallas Mosaic GPU with its GPU interpret mode is importable and jax >= 0.12."""
    if tuple(int(p) for p in jax.__version__.split(".")[:2]) < (0, 12):
        return False
    try:
        plgpu = _plgpu()
    except ImportError:
        return False
    return all(hasattr(plgpu, n) for n in ("InterpretGPUParams", "emit_pipeline_warp_specialized", "wgmma"))


def _lowering_for_gpu() -> bool:
    """Inside ``jax.sharding.use_abstract_mesh`` of a GPU device: lowering for a GPU from any host
    (tests/lowering.py)."""
    device = jax.sharding.get_abstract_mesh().abstract_device
    return device is not None and getattr(device, "platform", None) in ("gpu", "cuda")


def _on_gpu() -> bool:
    """The default backend is a GPU (`implementations.platform`'s rule, not imported: that module imports this one)."""
    return jax.default_backend() in ("gpu", "cuda", "rocm")


def check_available(interpret: bool) -> None:
    """Raise ValueError (`MOSAIC_HINT`) unless this JAX has Mosaic GPU and the kernel can run or lower here:
    ``interpret``, a GPU backend, or an abstract mesh of a GPU device (lowering for a GPU from CPU)."""
    if not available() or not (interpret or _on_gpu() or _lowering_for_gpu()):
        raise ValueError(f"{MOSAIC_HINT} (jax {jax.__version__}, backend {jax.default_backend()!r})")


@dataclasses.dataclass(frozen=True, kw_only=True)
class MosaicTiling:
    """Knobs of the Mosaic GPU kernel; None picks the configuration's default (`plan`).

    variant: "auto" (decode when M / E_loc <= `DECODE_ROWS`), "prefill" or "decode".
    tm: rows per tile (a power of two >= 64: wgmma's M is 64). tk: contraction per pipeline step (64, 128 or 256).
    tn: output columns per compute warpgroup (64, 128 or 256); a CTA computes tn · num_compute_wgs columns. Both
    shrink for small H and F (not below 64).
    stages: SMEM pipeline depth (default: as many as fit `SMEM_BYTES`, at most 4 prefill / 6 decode).
    k_splits: CTAs sharing one tile's K range (split-K; default 1 prefill, by the SM count for decode).
    num_sms: persistent CTAs (default: the GPU's SM count; `INTERPRET_SMS` in interpret mode).
    """

    variant: str = "auto"
    tm: int | None = None
    tk: int | None = None
    tn: int | None = None
    num_compute_wgs: int = 2
    stages: int | None = None
    k_splits: int | None = None
    num_sms: int | None = None

    def __post_init__(self):
        if self.variant not in ("auto", "prefill", "decode"):
            raise ValueError(f"MosaicTiling.variant must be 'auto', 'prefill' or 'decode', got {self.variant!r}")
        if self.tm is not None and (self.tm < 64 or self.tm % 64 or self.tm & (self.tm - 1)):
            raise ValueError(f"MosaicTiling.tm must be a power of two >= 64, got {self.tm}")
        for name in ("tk", "tn"):
            v = getattr(self, name)
            if v is not None and (v < 64 or v & (v - 1) or v > 256):
                raise ValueError(f"MosaicTiling.{name} must be 64, 128 or 256, got {v}")
        for name in ("num_compute_wgs", "stages", "k_splits", "num_sms"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise ValueError(f"MosaicTiling.{name} must be positive, got {v}")


@dataclasses.dataclass(frozen=True)
class Plan:
    """A resolved configuration (static). Kernel orientation: K = contraction, N = output columns."""

    variant: str
    tm: int
    tk: int
    tn: int
    wgs: int
    stages: int
    k_splits: int
    num_sms: int
    rows: int  # Mp: rows of the lhs the kernel reads (>= tm)
    k_pad: int  # Kp: contraction after padding (a multiple of tk · k_splits)
    n_pad: int  # Np: output columns after padding (a multiple of tn · wgs)

    @property
    def k_steps(self) -> int:
        """Pipeline steps of one item."""
        return self.k_pad // (self.tk * self.k_splits)

    @property
    def n_tiles(self) -> int:
        return self.n_pad // (self.tn * self.wgs)

    def max_tiles(self, num_local_groups: int) -> int:
        """Static bound on the work list's row tiles: Σ_j ⌈(n_j + 7) / tm⌉ <= ⌈M / tm⌉ + E_loc + ⌈7 E_loc / tm⌉."""
        return -(-self.rows // self.tm) + num_local_groups + -(-(ROW_ALIGN - 1) * num_local_groups // self.tm)


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _next_pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def _num_sms(interpret: bool) -> int:
    """Persistent CTAs: the attached GPU's SM count, an abstract mesh's device (lowering for a GPU from CPU), else
    `DEFAULT_SMS`; `INTERPRET_SMS` in interpret mode."""
    if interpret:
        return INTERPRET_SMS
    device = jax.sharding.get_abstract_mesh().abstract_device
    if device is not None and getattr(device, "num_cores", None):
        return int(device.num_cores)
    try:
        dev = jax.devices()[0]
        if dev.platform == "gpu" and getattr(dev, "core_count", None):
            return int(dev.core_count)
    except RuntimeError:
        pass
    return DEFAULT_SMS


def plan(
    m: int,
    k: int,
    n: int,
    num_local_groups: int,
    *,
    in_bytes: int,
    out_bytes: int,
    tiling: MosaicTiling = MosaicTiling(),
    interpret: bool = False,
    fp8_block: tuple[int, int] | None = None,
) -> Plan:
    """The static configuration for lhs [m, k] @ weights [E_loc, k, n] (kernel orientation) with operands of
    ``in_bytes`` per element and an output of ``out_bytes``; ``fp8_block`` (bK, bN) is the scale block in kernel
    orientation when the weight is FP8 read in the kernel (tk and tn then divide it)."""
    decode = tiling.variant == "decode" or (tiling.variant == "auto" and m <= DECODE_ROWS * num_local_groups)
    wgs = tiling.num_compute_wgs
    tm = tiling.tm or (64 if decode else 128)
    tk = tiling.tk or 64
    tn = tiling.tn or (64 if decode else 128)
    # Small problems: no wider tiles than the (power-of-two rounded) extents need, but at least 64 × 64 (a full
    # 128-byte swizzle row of a 16-bit tile): at jax 0.12.1 Mosaic GPU's layout inference refuses N-major weight tiles
    # 16 wide, or 16 deep under a 64-wide row (lowered for sm_90 from CPU), so small H and F are padded instead.
    tk = max(64, min(tk, _next_pow2(k)))
    tn = max(64, min(tn, _next_pow2(-(-n // wgs))))
    if fp8_block is not None:  # one scale per tile (tk | bK, tn | bN; `fp8_in_kernel` checked 64 | both)
        tk = math.gcd(max(tk, 64), fp8_block[0])
        tn = math.gcd(max(tn, 64), fp8_block[1])
    num_sms = tiling.num_sms or _num_sms(interpret)
    rows = max(_round_up(m, ROW_ALIGN), tm)
    want = tiling.stages or (6 if decode else 4)

    def shape(tn: int) -> tuple[int, int, int, int, int]:
        """(n_pad, k_splits, k_pad, stages, SMEM bytes) for warpgroup tiles tn wide."""
        n_pad = _round_up(n, tn * wgs)
        k_steps_total = -(-k // tk)
        if tiling.k_splits is not None:
            splits = min(tiling.k_splits, k_steps_total)
        elif decode:
            # Items of one K range: about one row tile per non-empty group (at most min(E_loc, m) of them).
            items = max(1, min(num_local_groups, m)) * (n_pad // (tn * wgs))
            splits = max(1, min(num_sms // items, k_steps_total // 2 or 1))
        else:
            splits = 1
        k_pad = _round_up(k, tk * splits)
        out_tile = wgs * tm * tn * (4 if splits > 1 else out_bytes)
        deq = wgs * tk * tn * 2 if fp8_block is not None else 0
        stage = tm * tk * in_bytes + tk * tn * wgs * (1 if fp8_block is not None else in_bytes)
        stages = max(1, min(want, (SMEM_BYTES - out_tile - deq) // stage, k_pad // (tk * splits)))
        return n_pad, splits, k_pad, stages, stages * stage + out_tile + deq

    n_pad, splits, k_pad, stages, smem = shape(tn)
    # Wide float32 tiles leave room for too few stages: narrower warpgroup tiles (not below 64) instead.
    while tiling.tn is None and fp8_block is None and tn > 64 and stages < min(want, 3, k_pad // (tk * splits)):
        tn //= 2
        n_pad, splits, k_pad, stages, smem = shape(tn)
    if smem > SMEM_BYTES:
        raise ValueError(
            f"gmm_mosaic: tiles tm={tm}, tk={tk}, tn={tn} x {wgs} warpgroups need {smem} bytes of shared memory for "
            f"one pipeline stage and the output tile, more than {SMEM_BYTES}: pass smaller MosaicTiling tiles"
        )
    return Plan("decode" if decode else "prefill", tm, tk, tn, wgs, stages, splits, num_sms, rows, k_pad, n_pad)


def work_list(
    group_sizes: jax.Array,
    group_offset: jax.Array,
    *,
    m: int,
    rows: int,
    tm: int,
    num_local_groups: int,
    max_tiles: int,
) -> tuple[jax.Array, jax.Array]:
    """The row tiles of the local groups (jnp; traceable).

    Args:
      group_sizes: [E] int32; group_offset: () int32; m: rows of lhs; rows: rows the kernel reads (>= tm, >= m);
      tm: tile rows; num_local_groups: E_loc; max_tiles: static length of the list, at least the tiles needed
      (`Plan.max_tiles` is such a bound).
    Returns:
      (items [max_tiles, 4] int32, count [1] int32): item t = (local group j, first row read r0, first stored row
      inside the tile lo, rows stored c): the kernel reads rows [r0, r0 + tm) and stores its rows [lo, lo + c) to
      out rows [r0 + lo, r0 + lo + c), all rows of local group j. Only the first ``count`` items are used; the
      rest repeat a harmless zero-row entry.
    """
    starts, ends = local_group_rows(group_sizes, m=m, group_offset=group_offset, num_local_groups=num_local_groups)
    aligned = starts // ROW_ALIGN * ROW_ALIGN  # TMA into 8-row SMEM tiles needs 8-aligned rows in GMEM
    tiles = jnp.where(ends > starts, (ends - aligned + tm - 1) // tm, 0)  # [E_loc]
    cum = jnp.cumsum(tiles).astype(jnp.int32)
    t = jnp.arange(max_tiles, dtype=jnp.int32)
    j = jnp.minimum(jnp.searchsorted(cum, t, side="right").astype(jnp.int32), num_local_groups - 1)
    row = aligned[j] + (t - (cum - tiles)[j]) * tm
    first, stop = jnp.maximum(row, starts[j]), jnp.minimum(row + tm, ends[j])
    valid = t < cum[-1]
    r0 = jnp.where(valid, jnp.minimum(row, rows - tm), 0)
    lo = jnp.where(valid, first - r0, 0)
    count = jnp.where(valid, jnp.maximum(stop - first, 0), 0)
    items = jnp.stack([jnp.where(valid, j, 0), r0, lo, count], axis=1).astype(jnp.int32)
    return items, cum[-1:].astype(jnp.int32)


def _swizzled(plgpu, minor: int, dtype) -> tuple:
    """SMEM transforms for a tile whose minor (contiguous) dimension holds ``minor`` elements of ``dtype``: 8-row
    tiles of one swizzle width, the largest swizzle (<= 128 bytes) that divides the row."""
    bits = minor * jnp.dtype(dtype).itemsize * 8
    swizzle = plgpu.find_swizzle(bits)
    elems = swizzle * 8 // (jnp.dtype(dtype).itemsize * 8)
    return (plgpu.TilingTransform((8, elems)), plgpu.SwizzleTransform(swizzle))


def _kernel(p: Plan, transpose_rhs: bool, fp8_block, cd, *refs):
    """The kernel body (see the module docstring). refs: count [1], items [T, 4], lhs [Mp, Kp], rhs [E_loc, Kp, Np]
    (or [E_loc, Np, Kp] with ``transpose_rhs``), scales [E_loc, ⌈Kp/bK⌉, ⌈Np/bN⌉] (FP8 only), out [Mp, Np] (or
    [S, Mp, Np] float32 with split-K); ``cd`` is the compute dtype the FP8 tiles are dequantized to."""
    from jax import lax
    from jax.experimental import pallas as pl

    plgpu = _plgpu()
    fp8 = fp8_block is not None
    if fp8:
        count_ref, items_ref, lhs_ref, rhs_ref, scale_ref, out_ref = refs
    else:
        count_ref, items_ref, lhs_ref, rhs_ref, out_ref = refs
        scale_ref = None
    tm, tk, tn, wgs = p.tm, p.tk, p.tn, p.wgs
    cta_n = tn * wgs
    k_len = p.k_pad // p.k_splits
    rdt = rhs_ref.dtype
    lhs_spec = plgpu.BlockSpec(
        (tm, tk), lambda k: (0, k), transforms=_swizzled(plgpu, tk, lhs_ref.dtype), memory_space=plgpu.SMEM
    )
    if transpose_rhs:
        rhs_spec = plgpu.BlockSpec(
            (cta_n, tk), lambda k: (0, k), transforms=_swizzled(plgpu, tk, rdt), memory_space=plgpu.SMEM
        )
    else:
        rhs_spec = plgpu.BlockSpec(
            (tk, cta_n), lambda k: (k, 0), transforms=_swizzled(plgpu, tn, rdt), memory_space=plgpu.SMEM
        )

    def pipeline(body, context):
        return plgpu.emit_pipeline_warp_specialized(
            body,
            grid=(p.k_steps,),
            memory_registers=40,
            in_specs=[lhs_spec, rhs_spec],
            wg_axis="wg",
            num_compute_wgs=wgs,
            max_concurrent_steps=p.stages,
            compute_context=context,
        )

    def views(r0, j, s, n_idx):
        lhs_view = lhs_ref.at[pl.ds(r0, tm), pl.ds(s * k_len, k_len)]
        if transpose_rhs:
            rhs_view = rhs_ref.at[j, pl.ds(n_idx * cta_n, cta_n), pl.ds(s * k_len, k_len)]
        else:
            rhs_view = rhs_ref.at[j, pl.ds(s * k_len, k_len), pl.ds(n_idx * cta_n, cta_n)]
        return lhs_view, rhs_view

    ignore = lambda *_, **__: None  # noqa: E731 (the allocations do not depend on the bodies)
    scratch = dict(
        allocs=pipeline(ignore, ignore).get_allocations(*views(0, 0, 0, 0)),
        o_smem=plgpu.SMEM((wgs, tm, tn), out_ref.dtype),
    )
    if fp8:
        deq_shape = (wgs, tn, tk) if transpose_rhs else (wgs, tk, tn)
        scratch["deq"] = plgpu.SMEM(deq_shape, cd, transforms=_swizzled(plgpu, deq_shape[-1], cd))

    @functools.partial(pl.run_scoped, **scratch, collective_axes="wg")
    def _scope(allocs, o_smem, deq=None):
        wg = lax.axis_index("wg")
        sm = lax.axis_index("sm")
        per_tile = p.k_splits * p.n_tiles
        total = count_ref[0] * per_tile

        @pl.loop(sm, total, step=p.num_sms)
        def _item(w):
            n_idx = lax.rem(w, p.n_tiles)
            ms = lax.div(w, p.n_tiles)
            s = lax.rem(ms, p.k_splits)
            t = lax.div(ms, p.k_splits)
            j = items_ref[t, 0]
            r0 = pl.multiple_of(items_ref[t, 1], ROW_ALIGN)
            lo = items_ref[t, 2]
            rows = items_ref[t, 3]
            cols = pl.ds(n_idx * cta_n + wg * tn, tn)

            def body(idxs, lhs_smem, rhs_smem, acc_ref):
                (kstep,) = idxs
                if transpose_rhs:
                    b = rhs_smem.at[pl.ds(wg * tn, tn)]
                else:
                    b = rhs_smem.at[:, pl.ds(wg * tn, tn)]
                if fp8:
                    k0 = s * k_len + kstep * tk
                    scale = scale_ref[j, k0 // fp8_block[0], (n_idx * cta_n + wg * tn) // fp8_block[1]]
                    d = deq.at[wg]
                    # e4m3 -> float16 (exact) -> float32, scaled in float32, rounded once to the compute dtype.
                    q_tile = plgpu.load(b).astype(jnp.float16).astype(jnp.float32)
                    d[...] = (q_tile * scale).astype(cd)
                    plgpu.commit_smem()
                    b = d
                plgpu.wgmma(acc_ref, lhs_smem, b.T if transpose_rhs else b)
                plgpu.wgmma_wait(0)
                return acc_ref

            def context(run):
                @functools.partial(pl.run_scoped, acc_ref=plgpu.ACC((tm, tn), jnp.float32))
                def _acc(acc_ref):
                    run(acc_ref)
                    acc = acc_ref[...]
                    o = o_smem.at[wg]
                    plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # the previous item's store has read o_smem
                    o[...] = acc.astype(o.dtype)
                    plgpu.commit_smem()
                    dst = out_ref.at[s] if p.k_splits > 1 else out_ref
                    # TMA boxes are static: store the item's rows [lo, lo + rows) as power-of-two row blocks.
                    off = lo
                    size = tm
                    while size >= 1:
                        bit = jnp.bitwise_and(rows, size)

                        @pl.when(bit != 0)
                        def _store(off=off, size=size):
                            plgpu.copy_smem_to_gmem(o.at[pl.ds(off, size)], dst.at[pl.ds(r0 + off, size), cols])

                        off = off + bit
                        size //= 2

            lhs_view, rhs_view = views(r0, j, s, n_idx)
            pipeline(body, context)(lhs_view, rhs_view, allocations=allocs)

        plgpu.wait_smem_to_gmem(0)


def _interpret_params(plgpu, interpret):
    """``interpret`` as `plgpu.kernel` takes it: True → default `plgpu.InterpretGPUParams`, an `InterpretGPUParams`
    as given (e.g. ``detect_races=True``), False → None (compile for the GPU)."""
    if isinstance(interpret, plgpu.InterpretGPUParams):
        return interpret
    return plgpu.InterpretGPUParams() if interpret else None


def _pad(x: jax.Array, axis: int, size: int) -> jax.Array:
    if x.shape[axis] == size:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, size - x.shape[axis])
    return jnp.pad(x, widths)


def _ieee_f32(precision) -> bool:
    """Whether ``precision`` asks for IEEE float32 products (HIGHEST, in any of the forms jax accepts)."""
    if isinstance(precision, tuple | list):
        return any(_ieee_f32(q) for q in precision)
    if precision is None:
        return False
    return str(precision).upper().split(".")[-1] in ("HIGHEST", "FLOAT32")


def _split_tf32(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """x (float32) = hi + lo with hi rounded to TF32 (10 mantissa bits) and lo the exact remainder."""
    hi = jax.lax.reduce_precision(x, exponent_bits=8, mantissa_bits=10)
    return hi, x - hi


def fp8_in_kernel(block: tuple[int, int], lhs_dtype) -> bool:
    """Whether `gmm_mosaic` reads a `BlockScaled` weight with scale blocks ``block`` as e4m3 in the kernel (else it
    dequantizes it to the compute dtype before the call): bfloat16 / float16 lhs (wgmma's 16-bit inputs; float32
    would need a K-major scratch the kernel does not write) and both block extents multiples of 64 (so 64-wide
    tiles hold one scale each: DeepSeek's 128 × 128 blocks qualify)."""
    if jnp.dtype(lhs_dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return False
    return len(block) == 2 and block[0] % 64 == 0 and block[1] % 64 == 0


def gmm_mosaic(
    lhs: jax.Array,
    rhs: jax.Array | BlockScaled,
    group_sizes: jax.Array,
    group_offset: jax.Array | int = 0,
    *,
    transpose_rhs: bool = False,
    preferred_element_type=None,
    precision=None,
    tiling: MosaicTiling = MosaicTiling(),
    interpret=False,
) -> jax.Array:
    """Grouped GEMM on the Mosaic GPU kernel: row r of local group g gets lhs[r] @ rhs[g − group_offset].

    Args:
      lhs: [M, H] rows sorted by group (float32 / bfloat16 / float16).
      rhs: [E_loc, H, F] weights of groups [o, o + E_loc), or [E_loc, F, H] with ``transpose_rhs`` (read transposed
        in place: the d lhs of `gmm`); or a `BlockScaled` FP8 weight of that shape (computed in lhs's dtype).
      group_sizes: [E] int32 rows per group (sum <= M; the rest is padding).
      group_offset: () int32, the first local group o (may be traced).
      preferred_element_type: output dtype (default: `gmm_metadata.default_out_dtype` of the operands).
      precision: HIGHEST runs float32 operands as 3×TF32 (else TF32, the GPU default of XLA and Triton).
      tiling: `MosaicTiling` (defaults chosen by shape: `plan`).
      interpret: run in Mosaic GPU's GPU interpret mode (on CPU): True, or a `plgpu.InterpretGPUParams` (e.g. with
        ``detect_races=True``).
    Returns:
      [M, F]: local groups' rows computed, every other row zero; float32 accumulation, one cast to the output dtype.
    """
    plgpu = _plgpu()
    m, k = lhs.shape
    fp8 = isinstance(rhs, BlockScaled)
    e_loc = rhs.shape[0]
    n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
    rhs_dtype = lhs.dtype if fp8 else rhs.dtype
    out_dtype = jnp.dtype(preferred_element_type or default_out_dtype(lhs.dtype, rhs_dtype))
    if fp8 and not fp8_in_kernel(rhs.block, lhs.dtype):
        rhs, fp8 = rhs.dequantize(lhs.dtype), False
    cd = jnp.dtype(lhs.dtype) if fp8 else dot_dtype(lhs, rhs)
    x = lhs.astype(cd)
    w = rhs if fp8 else rhs.astype(cd)
    if cd == _F32:
        # wgmma reads TF32 only K-major: the weight as [E, N, K].
        if not transpose_rhs:
            w, transpose_rhs = jnp.swapaxes(w, 1, 2), True
        if _ieee_f32(precision):  # 3×TF32: hi·hi + lo·hi + hi·lo along one K three times as long
            (xh, xl), (wh, wl) = _split_tf32(x), _split_tf32(w)
            x = jnp.concatenate([xh, xl, xh], axis=1)
            w = jnp.concatenate([wh, wh, wl], axis=2)
            k = 3 * k
    sizes = group_sizes.astype(jnp.int32)
    offset = jnp.asarray(group_offset, jnp.int32).reshape(())
    fp8_block = None
    if fp8:
        fp8_block = (w.block[1], w.block[0]) if transpose_rhs else tuple(w.block)
    p = plan(
        m,
        k,
        n,
        e_loc,
        in_bytes=cd.itemsize,
        out_bytes=out_dtype.itemsize,
        tiling=tiling,
        interpret=interpret,
        fp8_block=fp8_block,
    )
    x = _pad(_pad(x, 0, p.rows), 1, p.k_pad)
    operands = []
    if fp8:
        q, scales = w.q, w.scale_inv
        if transpose_rhs:  # kernel orientation [E, N=H, K=F]: the scale grid as (K blocks, N blocks)
            scales = jnp.swapaxes(scales, 1, 2)
        q = _pad(_pad(q, 1, p.n_pad if transpose_rhs else p.k_pad), 2, p.k_pad if transpose_rhs else p.n_pad)
        kb, nb = -(-p.k_pad // fp8_block[0]), -(-p.n_pad // fp8_block[1])
        scales = _pad(_pad(scales, 1, kb), 2, nb)
        operands = [q, scales]
    else:
        w = _pad(_pad(w, 1, p.n_pad if transpose_rhs else p.k_pad), 2, p.k_pad if transpose_rhs else p.n_pad)
        operands = [w]
    items, count = work_list(
        sizes, offset, m=m, rows=p.rows, tm=p.tm, num_local_groups=e_loc, max_tiles=p.max_tiles(e_loc)
    )
    kernel_out = jnp.float32 if p.k_splits > 1 else out_dtype
    shape = (p.k_splits, p.rows, p.n_pad) if p.k_splits > 1 else (p.rows, p.n_pad)
    call = plgpu.kernel(
        functools.partial(_kernel, p, transpose_rhs, fp8_block, cd),
        out_type=jax.ShapeDtypeStruct(shape, kernel_out),
        grid=(p.num_sms,),
        grid_names=("sm",),
        num_threads=p.wgs + 1,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
        interpret=_interpret_params(plgpu, interpret),
    )
    out = call(count, items, x, *operands)
    if p.k_splits > 1:
        out = jnp.sum(out, axis=0)
    # Rows outside the local groups were never written: zero them (one select, fused by XLA).
    starts, ends = local_group_rows(sizes, m=m, group_offset=offset, num_local_groups=e_loc)
    row = jnp.arange(m)[:, None]
    keep = (row >= starts[0]) & (row < ends[-1])
    return jnp.where(keep, out[:m, :n].astype(out_dtype), jnp.zeros((), out_dtype))


def tgmm_mosaic(
    lhs: jax.Array,
    grad: jax.Array,
    group_sizes: jax.Array,
    group_offset: jax.Array | int = 0,
    *,
    num_local_groups: int,
    out_dtype,
    compute_dtype=None,
    precision=None,
) -> jax.Array:
    """d rhs of `gmm_mosaic`: lhs_g^T @ grad_g per local group → [E_loc, H, F] in ``out_dtype`` (lhs [M, H], grad
    [M, F], group_sizes [E] int32, group_offset () int32); exactly zero for empty groups.

    Not a Mosaic GPU kernel: it reuses the repository's XLA grouped contractions, `gmm_xla.tgmm_ragged` (XLA's
    ``ragged_dot_general`` with a ragged contraction; what `gmm(implementation="tokamax")` also runs for d rhs) on a
    GPU backend, and `gmm_xla.tgmm_chunked` (the CPU-fast chunked loops) elsewhere, so interpret-mode tests on CPU
    stay fast — lowering for a GPU from CPU under an abstract mesh lowers the chunked loops too (jax 0.12.1's
    ``ragged_dot_general`` has no sharding rule under an abstract mesh).
    Both are checked against `tgmm_reference` in tests/test_gmm.py.
    """
    from pallas_kernels.gmm_xla import tgmm_chunked, tgmm_ragged

    offset = jnp.asarray(group_offset, jnp.int32).reshape(())
    common = dict(num_local_groups=num_local_groups, out_dtype=jnp.dtype(out_dtype), precision=precision)
    if compute_dtype is not None:
        common["compute_dtype"] = jnp.dtype(compute_dtype)
    if _on_gpu():
        return tgmm_ragged(lhs, grad, group_sizes.astype(jnp.int32), offset, backend="xla", **common)
    return tgmm_chunked(lhs, grad, group_sizes.astype(jnp.int32), offset, chunk=256, small_chunk=128, **common)
