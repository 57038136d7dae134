"""FP8 weights in the grouped GEMM (issue 55, item 2): a block-scaled e4m3 weight (`pallas_kernels.BlockScaled`) is
the function of its dequantized value on every implementation; tokamax takes it as stored (a qwix QArray whose
scale tiles its sm90 kernel accepts, forward and d lhs) and its FP8 kernel lowers for CUDA from this CPU;
implementations without an FP8 kernel dequantize inside the call, and `fp8_path` says which is which."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numeric import assert_close

from pallas_kernels import BlockScaled, GmmTiling, fp8_path, gmm, gmm_reference, tokamax_backend
from pallas_kernels.fp8 import quantize

TOKAMAX = pytest.param("tokamax", marks=pytest.mark.tokamax)
IMPLS = ["pallas", "chunked", "ragged_dot", TOKAMAX]
M, K, N, BLOCK = 90, 32, 48, (16, 16)  # K, N whole blocks; M not a multiple of any tile
SIZES = np.array([20, 0, 31, 9, 25], np.int32)  # 85 of 90 rows in 5 groups; the last 5 are padding


def _weights(e: int, k: int = K, n: int = N, block=BLOCK, seed: int = 1) -> BlockScaled:
    w = jax.random.normal(jax.random.key(seed), (e, k, n)) * jnp.linspace(0.05, 2.0, n)  # a scale per column block
    return BlockScaled(*quantize(w, block), block)


def _x(m: int = M, k: int = K, seed: int = 0) -> jax.Array:
    return jax.random.normal(jax.random.key(seed), (m, k)).astype(jnp.bfloat16)


def _run(impl):
    kw = dict(implementation=impl, interpret=impl == "pallas", tiling=GmmTiling(tm=32, tk=16, tn=16, chunk=16))
    return lambda x, parts, off: gmm(x, parts, jnp.asarray(SIZES), group_offset=off, **kw)


@pytest.mark.parametrize("impl", IMPLS)
def test_fp8_weights_compute_their_dequantized_value(impl):
    """Groups 1..4 on this rank as two FP8 parts (stored slots and a copy): under jit, the output equals the reference
    on the dequantized weights (bfloat16's tolerance: tokamax scales in bfloat16, the reference in float32), d x
    equals the reference's, and the FP8 weights get exactly zero gradient (frozen)."""
    a, b = _weights(3), _weights(1, seed=2)
    x, off = _x(), jnp.int32(1)
    dense = jnp.concatenate([a.dequantize(jnp.bfloat16), b.dequantize(jnp.bfloat16)])
    run = jax.jit(_run(impl))
    y = run(x, (a, b), off)
    assert y.dtype == jnp.bfloat16 and y.shape == (M, N)
    ref = gmm_reference(x, dense, SIZES, group_offset=1)
    assert_close(y, ref, dtype=jnp.bfloat16)
    assert float(jnp.abs(y[:20]).max()) == 0.0 and float(jnp.abs(y[85:]).max()) == 0.0  # other ranks' rows, padding

    def loss(f):
        return lambda x, w: jnp.sum(f(x, w).astype(jnp.float32) ** 2)

    dx, dw = jax.jit(jax.grad(loss(lambda x, w: run(x, w, off)), argnums=(0, 1)))(x, (a, b))
    dx_ref = jax.grad(loss(lambda x, w: gmm_reference(x, w, SIZES, group_offset=1)))(x, dense)
    assert_close(dx, dx_ref, dtype=jnp.bfloat16)
    for leaf in jax.tree.leaves(dw):
        assert float(jnp.abs(leaf.astype(jnp.float32)).max()) == 0.0


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("weights", ["fp8", "bf16"])
def test_fp8_activations_are_what_the_gemm_multiplies(impl, weights):
    """``quantize_lhs=16``: each row of lhs quantized to e4m3 per 16 columns — the output equals the reference on the
    quantized rows (and not the unquantized one) and d lhs passes straight through (the reference's, also straight
    through), with FP8 or bf16 weights."""
    w = _weights(5) if weights == "fp8" else _weights(5).dequantize(jnp.bfloat16)
    x = _x()
    kw = dict(implementation=impl, interpret=impl == "pallas", tiling=GmmTiling(tm=32, tk=16, tn=16))
    y = jax.jit(lambda x, w: gmm(x, w, SIZES, quantize_lhs=16, **kw))(x, w)
    ref = gmm_reference(x, w, SIZES, quantize_lhs=16)
    assert_close(y, ref, dtype=jnp.bfloat16)
    assert float(jnp.abs(ref.astype(jnp.float32) - gmm_reference(x, w, SIZES).astype(jnp.float32)).max()) > 0
    dx = jax.grad(lambda x: jnp.sum(gmm(x, w, SIZES, quantize_lhs=16, **kw).astype(jnp.float32) ** 2))(x)
    dx_ref = jax.grad(lambda x: jnp.sum(gmm_reference(x, w, SIZES, quantize_lhs=16).astype(jnp.float32) ** 2))(x)
    assert_close(dx, dx_ref, dtype=jnp.bfloat16)


@pytest.mark.parametrize("bad", [0, -128, True, 1.5])
def test_quantize_lhs_must_be_a_positive_int(bad):
    with pytest.raises(ValueError, match="quantize_lhs must be None or a positive int"):
        gmm(_x(), _weights(5), SIZES, quantize_lhs=bad, implementation="chunked")


def test_fp8_path_names_which_implementations_read_fp8():
    """Only tokamax takes FP8 weights (and only whole blocks, and only where it compiles its FP8 kernel for the
    activations' dtype); the Pallas kernel, the CPU path and ragged_dot dequantize first."""
    for impl in ("pallas", "chunked", "ragged_dot"):
        assert fp8_path(impl) == "dequantize"
    assert fp8_path("auto", interpret=True) == "dequantize"  # interpret mode: the Pallas kernel
    tokamax = "fp8" if tokamax_backend.available() else "dequantize"
    assert fp8_path("tokamax") == tokamax
    assert fp8_path("tokamax", shape=(4, 256, 384), block=(128, 128)) == tokamax
    assert fp8_path("tokamax", shape=(4, 200, 384), block=(128, 128)) == "dequantize"  # a partial block


@pytest.mark.tokamax
def test_tokamax_gets_the_fp8_weights_as_qarrays_with_tiles_its_kernel_takes(monkeypatch):
    """The forward hands tokamax ``QArray(q [E, K, N] e4m3, scale [E, K/bK, N])`` (scale tile (1, bK, 1), what the sm90
    kernel accepts), d lhs the transposed weight ``[E, N, K]`` with tile (1, bN, 1). A partial block, or a machine that
    cannot compile the FP8 kernel, gets a dequantized array."""
    seen = []
    real = tokamax_backend.ragged_dot_general()

    def recording(lhs, rhs, *args, **kwargs):
        seen.append(jax.tree.map(jax.typeof, rhs))  # the operand's shapes and dtypes (a QArray stays one)
        return real(lhs, rhs, *args, **kwargs)

    monkeypatch.setattr(tokamax_backend, "ragged_dot_general", lambda: recording)
    jax.clear_caches()  # the jitted ragged path must be traced again, through the recorder
    w, x = _weights(5, k=64, n=32, block=(32, 16)), _x(k=64)
    jax.grad(lambda x: jnp.sum(gmm(x, w, SIZES, implementation="tokamax").astype(jnp.float32)))(x)
    fwd, bwd = seen
    assert fwd.qvalue.dtype == jnp.float8_e4m3fn and fwd.qvalue.shape == (5, 64, 32)
    assert fwd.scale.dtype == jnp.bfloat16 and fwd.scale_tile_shape == (1, 32, 1)
    assert bwd.qvalue.shape == (5, 32, 64) and bwd.scale_tile_shape == (1, 16, 1)

    seen.clear()
    odd = _weights(5, k=40, n=32, block=(32, 16))  # 40 rows: a partial block along K
    gmm(_x(k=40), odd, SIZES, implementation="tokamax")
    assert not hasattr(seen[-1], "qvalue") and seen[-1].dtype == jnp.bfloat16
    monkeypatch.setattr(tokamax_backend, "fp8_compiles", lambda dtype: False)
    assert fp8_path("tokamax") == "dequantize"
    seen.clear()
    jax.clear_caches()
    gmm(_x(k=64), w, SIZES, implementation="tokamax")
    assert not hasattr(seen[-1], "qvalue") and seen[-1].dtype == jnp.bfloat16


@pytest.mark.tokamax
def test_fp8_compiles_refuses_when_the_gpu_compiler_does(monkeypatch):
    """On a GPU the FP8 kernel is compiled once per dtype; a compiler that refuses it (as Mosaic GPU does for e4m3 →
    bfloat16 on a ptxas older than PTX ISA 9.2), or a tokamax that falls back to XLA's ops for it (its sm100 kernels
    with e4m3 weights), answers False — warned once with the reason — so `gmm` dequantizes first."""

    class Refusing:
        @staticmethod
        def ragged_dot(*args, **kwargs):
            raise NotImplementedError("Hardware has no support for converting from f8E4M3FN to bf16")

        ragged_dot_general = ragged_dot

    bf16 = jnp.dtype(jnp.bfloat16)
    tokamax_backend.fp8_refusal.cache_clear()
    try:
        # asked as for a GPU here, tokamax lowers to XLA's ops (its kernels refuse this CPU): not a kernel of its own
        with pytest.warns(RuntimeWarning, match="lowers to XLA's ops, not a tokamax kernel.*gmm dequantizes them"):
            assert tokamax_backend.fp8_compiles(bf16, "gpu") is False
        with warnings.catch_warnings():  # asked again: the same answer, no second warning
            warnings.simplefilter("error")
            assert "XLA's ops" in tokamax_backend.fp8_refusal(bf16, "gpu")
        assert tokamax_backend.fp8_compiles(bf16, "cpu") is True  # XLA's path takes them
        monkeypatch.setattr(tokamax_backend, "_module", lambda: Refusing)
        tokamax_backend.fp8_refusal.cache_clear()
        with pytest.warns(RuntimeWarning, match="NotImplementedError: Hardware has no support .* f8E4M3FN to bf16"):
            assert tokamax_backend.fp8_compiles(bf16, "gpu") is False
    finally:
        tokamax_backend.fp8_refusal.cache_clear()


def _pretend_h100(monkeypatch, ptx_isa: int, sm100: bool = False):
    """tokamax's Mosaic GPU ragged dot pinned (no device check) with an H100's (``sm100``: a B200's) answers to what
    it asks the device, and Mosaic GPU told ptxas speaks PTX ISA ``ptx_isa``: enough to lower its kernels for CUDA on
    a CPU."""
    import types

    import jax.experimental.mosaic.gpu.fragmented_array as fragmented
    import tokamax._src.ops.ragged_dot.pallas_mosaic_gpu as mosaic
    import tokamax._src.ops.ragged_dot.pallas_mosaic_gpu_kernel_sm90_quant as sm90_quant

    monkeypatch.setattr(mosaic.gpu_utils, "is_sm90", lambda device=None: not sm100)
    monkeypatch.setattr(mosaic.gpu_utils, "is_sm100", lambda device=None: sm100)
    device = types.SimpleNamespace(get_default_device=lambda: types.SimpleNamespace(core_count=132))
    monkeypatch.setattr(sm90_quant, "backend", device)
    ext = types.SimpleNamespace(_get_ptxas_isa_version=lambda: ptx_isa)
    monkeypatch.setattr(fragmented, "mgpu_lib", types.SimpleNamespace(_mosaic_gpu_ext=ext))
    pinned = mosaic.PallasMosaicGpuRaggedDot()
    real = tokamax_backend._module().ragged_dot_general
    monkeypatch.setattr(
        tokamax_backend, "ragged_dot_general", lambda: lambda *a, **kw: real(*a, **kw, implementation=(pinned,))
    )
    jax.clear_caches()


def _lower(fn, *args) -> str:
    device = jax.sharding.AbstractDevice(device_kind="NVIDIA H100", num_cores=None, platform="gpu")
    mesh = jax.sharding.AbstractMesh((1,), ("target",), abstract_device=device)
    with jax.sharding.use_abstract_mesh(mesh):
        return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


#: Mosaic GPU converts e4m3 to bfloat16 on Hopper given a ptxas of PTX ISA >= 9.2 up to jax 0.12.0; from jax 0.12.1
#: only on Blackwell (and ISA >= 9.2; `jax.experimental.mosaic.gpu.fragmented_array`), so tokamax 0.0.17's sm90 FP8
#: kernel with bfloat16 activations no longer lowers for an H100 at all.
HOPPER_CONVERTS_E4M3_TO_BF16 = tuple(int(p) for p in jax.__version__.split(".")[:3]) < (0, 12, 1)


@pytest.mark.tokamax
def test_the_fp8_gemm_lowers_to_tokamaxs_sm90_fp8_kernel_for_cuda(monkeypatch):
    """`gmm` with DeepSeek-V3-like FP8 weights (128 × 128 blocks) and its d lhs lower, for an H100, to tokamax's
    sm90 quantized kernel — the e4m3 weights and scales are its operands — given a ptxas with PTX ISA >= 9.2; an
    older one cannot convert e4m3 to bfloat16 there, nor can any from jax 0.12.1 on (`HOPPER_CONVERTS_E4M3_TO_BF16`),
    which `tokamax_backend.fp8_compiles` asks before use (then the weights are dequantized first)."""
    _pretend_h100(monkeypatch, ptx_isa=92)
    x = jax.ShapeDtypeStruct((512, 256), jnp.bfloat16)
    w = BlockScaled(
        jax.ShapeDtypeStruct((4, 256, 384), jnp.float8_e4m3fn), jax.ShapeDtypeStruct((4, 2, 3), jnp.float32), (128, 128)
    )
    sizes = jax.ShapeDtypeStruct((4,), jnp.int32)

    def fwd(x, w, sizes):
        return gmm(x, w, sizes, implementation="tokamax")

    if not HOPPER_CONVERTS_E4M3_TO_BF16:
        with pytest.raises(NotImplementedError, match="f8E4M3FN to bf16"):
            _lower(fwd, x, w, sizes)
        return
    text = _lower(fwd, x, w, sizes)
    assert "ragged_dot_quant_sm90" in text and "f8E4M3FN" in text
    dx = _lower(jax.grad(lambda x, w, s: jnp.sum(fwd(x, w, s).astype(jnp.float32))), x, w, sizes)
    assert "ragged_dot_quant_sm90" in dx  # d lhs: the transposed FP8 weight through the same kernel
    w8a8 = _lower(lambda x, w, s: gmm(x, w, s, implementation="tokamax", quantize_lhs=128), x, w, sizes)
    assert "ragged_dot_quant_sm90" in w8a8  # FP8 activations: their values in bf16, the same kernel
    _pretend_h100(monkeypatch, ptx_isa=88)
    with pytest.raises(NotImplementedError, match="f8E4M3FN to bf16"):
        _lower(fwd, x, w, sizes)


@pytest.mark.parametrize(
    "bad, match",
    [
        (lambda w: BlockScaled(w.q.astype(jnp.bfloat16), w.scale_inv, w.block), r"q must be \[E, A, B\] float8_e4m3fn"),
        (lambda w: BlockScaled(w.q, w.scale_inv[:, :1], w.block), r"scale_inv must be float32\[3, 2, 3\]"),
        (lambda w: BlockScaled(w.q, w.scale_inv, (16, 0)), "block must be two positive ints"),
        (lambda w: (w, w.dequantize(jnp.bfloat16)), r"part 1 is bfloat16\[3, 32, 48\] but part 0 is BlockScaled"),
    ],
)
def test_bad_fp8_weights_are_named(bad, match):
    with pytest.raises(ValueError, match=match):
        gmm(_x(), bad(_weights(3)), SIZES[:3], implementation="chunked")


@pytest.mark.tokamax
def test_tokamaxs_sm100_kernels_take_no_e4m3_weights_yet(monkeypatch):
    """Why `fp8_path` asks the device: on sm100 tokamax (0.0.17) refuses e4m3 weights in its Mosaic kernels (they take
    int4), so its default chain would run XLA's ops there; `tokamax_backend.fp8_compiles` sees that and `gmm`
    dequantizes first. When this fails, tokamax has grown the kernel: time it on a B200 and drop the note."""
    _pretend_h100(monkeypatch, ptx_isa=92, sm100=True)
    x = jax.ShapeDtypeStruct((512, 256), jnp.bfloat16)
    w = BlockScaled(
        jax.ShapeDtypeStruct((4, 256, 384), jnp.float8_e4m3fn), jax.ShapeDtypeStruct((4, 2, 3), jnp.float32), (128, 128)
    )
    with pytest.raises(NotImplementedError, match="int4"):
        _lower(lambda x, w, s: gmm(x, w, s, implementation="tokamax"), x, w, jax.ShapeDtypeStruct((4,), jnp.int32))
