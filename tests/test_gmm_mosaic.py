"""The project's Mosaic GPU grouped GEMM (`pallas_kernels.gmm_mosaic`, `gmm(implementation="mosaic")`) in Mosaic GPU's
GPU interpret mode on CPU (`plgpu.InterpretGPUParams`: simulated SMEM, barriers, TMA and warpgroups; uninitialised
memory reads as NaN, so unwritten output rows would show) against `gmm_reference` / `tgmm_reference`, and lowered for
an sm_90 GPU from this CPU host.

Every feature runs here at small size: the prefill and decode configurations, split-K, group offsets with E_loc < E,
empty groups, rows past sum(group_sizes), bfloat16 / float16 / float32 / mixed operands, FP8 block-scaled weights
(read as e4m3 and dequantized on chip, or dequantized first), d lhs through the same kernel with the weight read
transposed and d rhs, and a race check of the simulated kernel. Skipped as a whole where the installed jax has no
Mosaic GPU interpret mode (jax < 0.12: the .venv environment), where the implementation is refused instead.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import gmm_mosaic as gm

if not gm.available():
    pytest.skip(
        f"jax {jax.__version__} has no Pallas Mosaic GPU interpret mode (needs jax >= 0.12)", allow_module_level=True
    )

from lowering import lower_for_cuda  # noqa: E402
from numeric import assert_close  # noqa: E402

from pallas_kernels import GMM, gmm, gmm_reference, tgmm, tgmm_reference  # noqa: E402
from pallas_kernels.fp8 import BlockScaled, quantize  # noqa: E402
from pallas_kernels.gmm import fp8_path  # noqa: E402
from pallas_kernels.gmm_metadata import local_group_rows  # noqa: E402
from pallas_kernels.gmm_mosaic import MosaicTiling, gmm_mosaic, plan, work_list  # noqa: E402

F32 = jnp.float32


def _operands(m, k, n, e_loc, dtype=jnp.bfloat16, rhs_dtype=None, seed=0):
    kx, kw = jax.random.split(jax.random.key(seed))
    x = jax.random.normal(kx, (m, k), F32).astype(dtype)
    w = (jax.random.normal(kw, (e_loc, k, n), F32) / np.sqrt(k)).astype(rhs_dtype or dtype)
    return x, w


def _outside_rows(sizes, offset, e_loc, m):
    """Bool [M]: rows of no local group (other groups' and rows past sum(sizes))."""
    starts, ends = local_group_rows(jnp.asarray(sizes, jnp.int32), m=m, group_offset=offset, num_local_groups=e_loc)
    rows = np.arange(m)
    return (rows < int(starts[0])) | (rows >= int(ends[-1]))


def _mosaic(x, w, sizes, offset=0, **kw):
    """`gmm_mosaic` in GPU interpret mode under jit, float32 output unless asked."""
    kw.setdefault("preferred_element_type", F32)
    sizes = jnp.asarray(sizes, jnp.int32)
    return jax.jit(lambda a, b: gmm_mosaic(a, b, sizes, offset, interpret=True, **kw))(x, w)


# --------------------------------------------------------------------------------------------- the work list
@pytest.mark.parametrize(
    ("sizes", "offset", "e_loc", "m", "tm"),
    [
        ([100, 0, 60, 50], 0, 4, 256, 64),  # an empty group, rows past the sum
        ([3, 130, 0, 9, 1], 1, 3, 150, 64),  # group_offset, E_loc < E, unaligned starts
        ([0, 0, 0], 0, 3, 40, 64),  # nothing to do
        ([70, 58], 0, 2, 128, 128),
        ([5, 5, 5, 5, 5, 5, 5, 5], 2, 5, 48, 64),  # M < tm: the tile slides back to row 0
    ],
)
def test_work_list_stores_every_local_row_exactly_once(sizes, offset, e_loc, m, tm):
    rows = max(-(-m // 8) * 8, tm)
    bound = -(-rows // tm) + e_loc + -(-7 * e_loc // tm)
    items, count = work_list(
        jnp.asarray(sizes, jnp.int32),
        jnp.int32(offset),
        m=m,
        rows=rows,
        tm=tm,
        num_local_groups=e_loc,
        max_tiles=bound,
    )
    items, count = np.asarray(items), int(count[0])
    starts, ends = (
        np.asarray(a) for a in local_group_rows(jnp.asarray(sizes), m=m, group_offset=offset, num_local_groups=e_loc)
    )
    stored = np.zeros(m, int)
    for j, r0, lo, c in items[:count]:
        assert r0 % 8 == 0 and 0 <= r0 <= rows - tm, "8-aligned tiles inside the padded rows"
        assert c >= 1 and 0 <= lo and lo + c <= tm
        first = r0 + lo
        assert starts[j] <= first and first + c <= ends[j], "a tile stores rows of its own group only"
        stored[first : first + c] += 1
    want = np.zeros(m, int)
    for s, e in zip(starts, ends, strict=True):
        want[s:e] = 1
    np.testing.assert_array_equal(stored, want)
    assert count == sum(-(-(e - s // 8 * 8) // tm) for s, e in zip(starts, ends, strict=True) if e > s)
    assert count <= bound


def test_plan_chooses_decode_by_rows_per_group_and_fits_shared_memory():
    bf16 = dict(in_bytes=2, out_bytes=2)
    assert plan(8192, 2048, 1408, 16, **bf16).variant == "prefill"
    assert plan(16 * 64, 2048, 1408, 16, **bf16).variant == "decode"  # 64 rows per local group
    assert plan(8192, 2048, 1408, 16, **bf16, tiling=MosaicTiling(variant="decode")).variant == "decode"
    few = plan(64, 7168, 2048, 2, **bf16)  # two active experts on a 132-SM GPU: K is split to fill the SMs
    assert few.variant == "decode" and few.k_splits > 1 and few.num_sms == gm.DEFAULT_SMS
    assert few.k_pad % (few.tk * few.k_splits) == 0
    assert plan(64, 7168, 2048, 64, **bf16).k_splits == 1  # 64 experts × 16 column tiles fill them already
    # float32 tiles narrow to keep a pipeline (the 227 KiB limit itself is checked by the lowering test)
    wide = plan(8192, 2048, 1408, 16, in_bytes=4, out_bytes=4)
    assert wide.tn == 64 and wide.stages >= 2
    fp8 = plan(512, 2048, 1408, 4, **bf16, fp8_block=(128, 128))
    assert 128 % fp8.tk == 0 and 128 % fp8.tn == 0, "one FP8 scale per tile"
    with pytest.raises(ValueError, match="variant"):
        MosaicTiling(variant="big")
    with pytest.raises(ValueError, match="tk"):
        MosaicTiling(tk=32)
    with pytest.raises(ValueError, match="shared memory"):  # one stage of 256 x 128 x (2 x 128) and its output
        plan(512, 256, 512, 2, **bf16, tiling=MosaicTiling(tm=256, tk=128, tn=128))


# ------------------------------------------------------------------------------------------ values (interpret)
#: (variant, M, H, F, sizes, group_offset, E_loc, k_splits): every case has rows outside the local groups.
CASES = {
    "prefill": ("prefill", 256, 128, 256, [100, 0, 60, 50], 0, 4, None),  # empty group, 46 rows past the sum
    "prefill_offset": ("prefill", 256, 128, 192, [100, 0, 60, 50], 1, 2, None),  # groups 1-2 local, 1 empty
    "decode": ("decode", 100, 96, 80, [10, 0, 30, 20], 1, 3, None),  # M, H, F not multiples of the tiles
    "decode_split_k": ("decode", 128, 256, 128, [10, 0, 30, 20], 0, 4, 2),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_values_equal_the_reference(case, dtype):
    variant, m, k, n, sizes, offset, e_loc, splits = CASES[case]
    x, w = _operands(m, k, n, e_loc, dtype)
    tiling = MosaicTiling(variant=variant, k_splits=splits)
    out = _mosaic(x, w, sizes, offset, tiling=tiling)
    ref = gmm_reference(x, w, jnp.asarray(sizes), group_offset=offset, preferred_element_type=F32)
    assert_close(out, ref, F32)
    assert not np.asarray(out)[_outside_rows(sizes, offset, e_loc, m)].any(), "rows outside the local groups are 0"


def test_output_dtypes_float16_and_mixed_operands():
    sizes = [40, 0, 70, 10]
    x, w = _operands(128, 64, 128, 4, jnp.float16)
    out = _mosaic(x, w, sizes, preferred_element_type=None)
    assert out.dtype == jnp.float16
    assert_close(out.astype(F32), gmm_reference(x, w, jnp.asarray(sizes)).astype(F32), jnp.bfloat16)
    x, w = _operands(128, 64, 128, 4, jnp.bfloat16, rhs_dtype=F32)  # mixed: computed in float32, float32 out
    out = _mosaic(x, w, sizes, preferred_element_type=None)
    assert out.dtype == F32
    assert_close(out, gmm_reference(x, w, jnp.asarray(sizes)), F32)


def test_transposed_rhs_and_highest_precision():
    """d lhs's form (the weight [E, F, H] read transposed in place) and float32 at HIGHEST (3×TF32)."""
    sizes = [30, 50, 0, 20]
    x, w = _operands(128, 64, 96, 4, jnp.bfloat16)
    ref = gmm_reference(x, w, jnp.asarray(sizes), preferred_element_type=F32)
    assert_close(_mosaic(x, jnp.swapaxes(w, 1, 2), sizes, transpose_rhs=True), ref, F32)
    x, w = _operands(128, 64, 96, 4, F32)
    ref = gmm_reference(x, w, jnp.asarray(sizes))
    assert_close(_mosaic(x, w, sizes, precision=jax.lax.Precision.HIGHEST), ref, F32)


@pytest.mark.parametrize("transpose", [False, True])
def test_fp8_weights_dequantized_on_chip(transpose):
    """(128, 128) blocks: the kernel reads the e4m3 tiles (fp8_path "fp8"); H = 192 leaves a partial block."""
    sizes, m, k, n = [20, 0, 50, 30], 128, 192, 256
    x, w = _operands(m, k, n, 4, jnp.bfloat16)
    q, s = quantize(w.astype(F32), (128, 128))
    bs = BlockScaled(q, s, (128, 128))
    assert gm.fp8_in_kernel(bs.block, jnp.bfloat16) and fp8_path("mosaic", block=bs.block) == "fp8"
    ref = gmm_reference(x, bs, jnp.asarray(sizes), preferred_element_type=F32)
    out = _mosaic(x, bs.mT if transpose else bs, sizes, transpose_rhs=transpose, tiling=MosaicTiling(variant="decode"))
    assert_close(out, ref, F32)


def test_fp8_weights_dequantized_first_where_the_kernel_cannot_read_them():
    sizes = [20, 0, 50, 30]
    x, w = _operands(128, 64, 128, 4, jnp.bfloat16)
    q, s = quantize(w.astype(F32), (32, 64))  # 32-row blocks: not one scale per 64-deep tile
    bs = BlockScaled(q, s, (32, 64))
    assert not gm.fp8_in_kernel(bs.block, jnp.bfloat16) and fp8_path("mosaic", block=bs.block) == "dequantize"
    assert fp8_path("mosaic", dtype=F32, block=(128, 128)) == "dequantize"  # float32 lhs: dequantized first
    assert_close(_mosaic(x, bs, sizes), gmm_reference(x, bs, jnp.asarray(sizes), preferred_element_type=F32), F32)


def test_no_data_races_in_the_simulated_kernel():
    """The interpreter's happens-before race detector over the pipeline, the split-K stores and the FP8 dequant."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    params = plgpu.InterpretGPUParams(detect_races=True)  # raises on a race
    sizes = jnp.asarray([10, 0, 70, 30], jnp.int32)
    x, w = _operands(128, 128, 128, 4, jnp.bfloat16)
    q, s = quantize(w.astype(F32), (64, 64))
    for rhs, tiling in [
        (w, MosaicTiling(num_sms=3)),
        (w, MosaicTiling(variant="decode", k_splits=2, num_sms=3)),
        (BlockScaled(q, s, (64, 64)), MosaicTiling()),
    ]:
        out = jax.jit(
            lambda a, b, t=tiling: gmm_mosaic(a, b, sizes, 0, interpret=params, tiling=t, preferred_element_type=F32)
        )(x, rhs)
        assert_close(out, gmm_reference(x, rhs, sizes, preferred_element_type=F32), F32)


# ----------------------------------------------------------------------------- through gmm: dispatch and VJP
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_gmm_values_and_gradients_equal_the_reference(dtype):
    sizes = jnp.asarray([20, 0, 50, 30, 10], jnp.int32)  # groups 1-3 local: 20 rows before, 10 + 18 after
    x, w = _operands(128, 64, 96, 3, dtype)
    weights = jnp.cos(jnp.arange(96, dtype=F32))

    def loss(f):
        return lambda a, b: jnp.sum(f(a, b).astype(F32) * weights)

    def mosaic(a, b):
        return gmm(a, b, sizes, group_offset=1, implementation="mosaic", interpret=True)

    def reference(a, b):
        return gmm_reference(a, b, sizes, group_offset=1)

    out, ref = jax.jit(mosaic)(x, w), reference(x, w)
    assert out.dtype == ref.dtype == dtype
    assert_close(out.astype(F32), ref.astype(F32), dtype)
    grads = jax.jit(jax.grad(loss(mosaic), argnums=(0, 1)))(x, w)
    want = jax.grad(loss(reference), argnums=(0, 1))(x, w)
    for g, r in zip(grads, want, strict=True):
        assert g.dtype == r.dtype == dtype
        assert_close(g.astype(F32), r.astype(F32), dtype)


def test_gmm_fp8_weights_forward_and_lhs_gradient():
    sizes = jnp.asarray([20, 0, 50, 30], jnp.int32)
    x, w = _operands(128, 128, 128, 4, jnp.bfloat16)
    q, s = quantize(w.astype(F32), (64, 64))
    bs = BlockScaled(q, s, (64, 64))

    def mosaic(a):
        return gmm(a, bs, sizes, implementation="mosaic", interpret=True, preferred_element_type=F32)

    def reference(a):
        return gmm_reference(a, bs, sizes, preferred_element_type=F32)

    assert_close(jax.jit(mosaic)(x), reference(x), F32)
    g = jax.jit(jax.grad(lambda a: jnp.sum(mosaic(a) ** 2)))(x)
    assert_close(g.astype(F32), jax.grad(lambda a: jnp.sum(reference(a) ** 2))(x).astype(F32), jnp.bfloat16)


def test_tgmm_with_mosaic_equals_the_reference():
    sizes = jnp.asarray([20, 0, 50, 30, 10], jnp.int32)
    x = jax.random.normal(jax.random.key(0), (128, 64), F32)
    g = jax.random.normal(jax.random.key(1), (128, 96), F32)
    out = tgmm(x, g, sizes, group_offset=1, num_local_groups=3, implementation="mosaic", interpret=True)
    ref = tgmm_reference(x, g, sizes, group_offset=1, num_local_groups=3)
    assert_close(out, ref, F32)
    assert not np.asarray(out[0]).any(), "the empty group's gradient is exactly zero"


def test_auto_never_takes_mosaic_and_it_is_refused_without_a_gpu_or_interpret():
    for on in ("gpu", "cpu", "tpu"):
        assert GMM.resolve("auto", on=on) != "mosaic"
    assert GMM.resolve("mosaic") == "mosaic" and "mosaic" in GMM.names
    x, w = _operands(16, 64, 64, 2)
    with pytest.raises(ValueError, match="Mosaic GPU"):
        gmm(x, w, jnp.asarray([8, 8]), implementation="mosaic")  # CPU, no interpret


# ---------------------------------------------------------------------------------------- lowered for sm_90
def test_lowers_for_sm90_from_cpu():
    """Forward and both gradients of `gmm(implementation="mosaic")`, bfloat16 and FP8 weights, prefill and decode
    shapes, lowered for CUDA on an H100 target from this CPU host: Mosaic GPU's Python lowering runs (layout
    inference, swizzles, wgmma operand checks, the 227 KiB shared-memory limit) and emits its ``mosaic_gpu_v2``
    custom call, one per kernel launch. Not compiled: turning that module into PTX / SASS happens in jaxlib's CUDA
    plugin when XLA compiles for a GPU, and neither a CUDA plugin nor a GPU client exists on a CPU machine (a system
    ptxas alone does not help: the MLIR → PTX passes are in the plugin), so compilation and execution wait for a GPU
    run."""
    sizes = jax.ShapeDtypeStruct((16,), jnp.int32)
    for m in (4096, 256):  # prefill (256 rows per group) and decode (16)
        x = jax.ShapeDtypeStruct((m, 2048), jnp.bfloat16)
        w = jax.ShapeDtypeStruct((16, 2048, 1408), jnp.bfloat16)

        def fwd_bwd(a, b, s):
            f = lambda a, b: gmm(a, b, s, implementation="mosaic").astype(F32).sum()  # noqa: E731
            return jax.value_and_grad(f, argnums=(0, 1))(a, b)

        text = lower_for_cuda(fwd_bwd, x, w, sizes)
        assert len(re.findall(r"custom_call @mosaic_gpu_v2\(", text)) == 2, "forward and d lhs kernels"
    q = jax.ShapeDtypeStruct((16, 2048, 1408), jnp.float8_e4m3fn)
    scales = jax.ShapeDtypeStruct((16, 16, 11), F32)
    x = jax.ShapeDtypeStruct((256, 2048), jnp.bfloat16)

    def fp8_fwd(a, q, sc, s):
        return gmm(a, BlockScaled(q, sc, (128, 128)), s, implementation="mosaic")

    text = lower_for_cuda(fp8_fwd, x, q, scales, sizes)
    calls = re.findall(r"custom_call @mosaic_gpu_v2\(.*", text)
    assert len(calls) == 1 and "f8E4M3FN" in calls[0], "the e4m3 weight itself enters the kernel"


# ------------------------------------------------------------------------------------------------------ slow
@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_random_group_sizes_both_variants(seed):
    rng = np.random.default_rng(seed)
    e, e_loc, m = 8, 5, 384
    cuts = np.sort(rng.integers(0, m - 40, e - 1))
    sizes = np.diff(np.concatenate([[0], cuts, [m - 40]])).astype(np.int32)
    offset = int(rng.integers(0, e - e_loc + 1))
    x, w = _operands(m, 192, 320, e_loc, jnp.bfloat16, seed=seed)
    ref = gmm_reference(x, w, jnp.asarray(sizes), group_offset=offset, preferred_element_type=F32)
    for tiling in (MosaicTiling(variant="prefill", num_sms=3), MosaicTiling(variant="decode", k_splits=3)):
        out = _mosaic(x, w, sizes, offset, tiling=tiling)
        assert_close(out, ref, F32)
        assert not np.asarray(out)[_outside_rows(sizes, offset, e_loc, m)].any()
