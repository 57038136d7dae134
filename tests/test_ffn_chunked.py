"""The fused CPU expert FFN (`pallas_kernels.ffn_chunked`, issue 71): gate, up, activation and down per row chunk in
one loop, against its pure-jnp reference (three `gmm_reference` calls) — outputs and every gradient, with parts,
biases, empty groups, rows past the groups, bfloat16 — and the layer's FFN taking it on CPU."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numeric import assert_close

from pallas_kernels.ffn_chunked import FfnChunks, ffn_chunked, ffn_reference
from tempo_jax.layer import stages
from tempo_jax.layer.experts import ExpertConfig, glu

M, H, F, E = 200, 24, 40, 5
SIZES = [30, 0, 77, 9, 50]  # 166 rows of 200: an empty group, groups below and above the chunks, padding after


SWIGLU = ExpertConfig()


def _act(expert=SWIGLU):
    return lambda g, u: glu(g, u, expert)


def _weights(rng, dtype, bias):
    w = {
        "w_gate": rng.normal(size=(E, H, F)) * 0.2,
        "w_up": rng.normal(size=(E, H, F)) * 0.2,
        "w_down": rng.normal(size=(E, F, H)) * 0.2,
    }
    if bias:
        w.update(b_gate=rng.normal(size=(E, F)), b_up=rng.normal(size=(E, F)), b_down=rng.normal(size=(E, H)))
    return {k: jnp.asarray(v, dtype) for k, v in w.items()}


def _parts(w):
    return {k: ((v[:3], v[3:]) if k.startswith("w_") else v) for k, v in w.items()}


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("bias", [False, True], ids=["", "bias"])
@pytest.mark.parametrize("parts", [False, True], ids=["whole", "parts"])
def test_ffn_chunked_equals_its_reference_with_gradients(dtype, bias, parts):
    """Small ladder (64, 16, 8) so groups take full, smaller and masked chunks; weights whole or as two parts."""
    rng = np.random.default_rng(0)
    act, gs = _act(), jnp.asarray(SIZES, jnp.int32)
    st = FfnChunks(act, chunk=64, small_chunk=16, min_chunk=8)
    x = jnp.asarray(rng.normal(size=(M, H)), dtype)
    w = _weights(rng, dtype, bias)
    wp = _parts(w) if parts else w
    y = jax.jit(ffn_chunked, static_argnums=3)(x, gs, wp, st)
    ref = ffn_reference(x, gs, w, act)
    assert y.dtype == ref.dtype == dtype
    assert_close(y, ref, dtype)
    assert not np.asarray(y[sum(SIZES) :]).any()  # rows past the groups: zeros
    cot = jnp.asarray(rng.normal(size=(M, H)), jnp.float32)
    g = jax.jit(jax.grad(lambda x, w: jnp.sum(ffn_chunked(x, gs, w, st).astype(jnp.float32) * cot), argnums=(0, 1)))(
        x, wp
    )
    g_ref = jax.grad(lambda x, w: jnp.sum(ffn_reference(x, gs, w, act).astype(jnp.float32) * cot), argnums=(0, 1))(x, w)
    assert_close(g[0], g_ref[0], dtype)
    for k, v in g[1].items():
        got = jnp.concatenate(v) if isinstance(v, tuple) else v
        assert got.dtype == w[k].dtype, k
        assert_close(got, g_ref[1][k], dtype)


def test_ffn_chunked_with_clamped_and_gpt_oss_activations():
    """The activation is a parameter: DeepSeek-V4's clamped SwiGLU and gpt-oss's (differentiated through the clamps)."""
    rng = np.random.default_rng(1)
    gs = jnp.asarray(SIZES, jnp.int32)
    x = jnp.asarray(rng.normal(size=(M, H)) * 3, jnp.float32)
    w = _weights(rng, jnp.float32, True)
    for expert in (ExpertConfig(activation="swiglu_clamp", limit=0.5), ExpertConfig(activation="gpt_oss", limit=1.0)):
        act = _act(expert)
        st = FfnChunks(act, chunk=64, small_chunk=16, min_chunk=8)
        assert_close(ffn_chunked(x, gs, w, st), ffn_reference(x, gs, w, act))
        g = jax.grad(lambda x, st=st: jnp.sum(ffn_chunked(x, gs, w, st) ** 2))(x)
        assert_close(g, jax.grad(lambda x, act=act: jnp.sum(ffn_reference(x, gs, w, act) ** 2))(x))


def test_ffn_chunked_refuses_partial_biases():
    rng = np.random.default_rng(2)
    w = _weights(rng, jnp.float32, True)
    del w["b_up"]
    with pytest.raises(ValueError, match="b_up"):
        ffn_chunked(jnp.zeros((M, H)), jnp.asarray(SIZES), w, FfnChunks(_act()))


def test_the_layers_ffn_runs_fused_on_cpu_and_equals_three_gemms():
    """`stages.expert_ffn` with the CPU grouped GEMM ("chunked") is one `ffn_chunked` loop; the same rows through the
    three `gmm` calls ("ragged_dot") give the same output and gradients."""
    rng = np.random.default_rng(3)
    rows = jnp.asarray(rng.normal(size=(64, H)), jnp.float32)
    slots = jnp.asarray(rng.integers(0, E + 1, 64), jnp.int32)  # slot E: padding
    w = _weights(rng, jnp.float32, True)
    kw = dict(expert=ExpertConfig(bias=True), interpret=False)
    fused = jax.make_jaxpr(lambda r: stages.expert_ffn(r, slots, w, gmm_impl="chunked", **kw))(rows)
    assert "custom_vjp_call" in str(fused) and str(fused).count("while") >= 1
    outs = {
        impl: jax.value_and_grad(
            lambda r, impl=impl: jnp.sum(stages.expert_ffn(r, slots, w, gmm_impl=impl, **kw)[0] ** 2)
        )(rows)
        for impl in ("chunked", "ragged_dot")
    }
    assert_close(outs["chunked"][0], outs["ragged_dot"][0])
    assert_close(outs["chunked"][1], outs["ragged_dot"][1])
