"""The TPU path (issue 72, item 4): megablox's grouped GEMM behind `gmm`, the dispatch kernel for Pallas TPU, both in
Pallas's TPU interpret mode against their references, and the layer lowered for a TPU from this CPU host."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from ep_case import small_ep_case

from pallas_kernels import (
    COUNTER_DTYPE,
    DISPATCH,
    GMM,
    dispatch,
    dispatch_reference,
    gmm,
    gmm_reference,
    tgmm,
    tgmm_reference,
)
from pallas_kernels.fp8 import BlockScaled, quantize
from tempo_jax.layer import moe_forward
from tempo_jax.layer import tables as dispatch_tables
from tempo_jax.layer.exchange import lowering_for


def _mb(*args, **kw):
    """megablox in TPU interpret mode, under `jax.jit` (eagerly, jax 0.10's interpret mode could deadlock)."""
    return jax.jit(lambda *a: gmm(*a, implementation="megablox", interpret=True, **kw))(*args)


def test_auto_on_a_tpu_takes_megablox_and_the_ragged_exchange():
    assert GMM.resolve("auto", on="tpu") == "megablox"
    assert DISPATCH.resolve("auto", on="tpu") == "xla"  # the TPU dispatch kernel waits for a TPU to time it
    assert DISPATCH.resolve("pallas_tpu") == "pallas_tpu"


# ------------------------------------------------------------------------------------------- the grouped GEMM
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize(("offset", "local"), [(0, 6), (2, 3), (4, 2)])
def test_megablox_gmm_values_and_gradients_equal_the_reference(dtype, offset, local):
    """Empty groups, rows past sum(group_sizes), local groups at the start, middle and end of group_sizes."""
    rng = np.random.default_rng(0)
    sizes = jnp.asarray([10, 0, 25, 7, 3, 12], jnp.int32)  # 57 of 70 rows
    lhs = jnp.asarray(rng.normal(size=(70, 48)), dtype)
    rhs = jnp.asarray(rng.normal(size=(local, 48, 40)), dtype)
    got = _mb(lhs, rhs, sizes, group_offset=offset)
    want = gmm_reference(lhs, rhs, sizes, group_offset=offset)
    assert got.dtype == want.dtype
    tol = 1e-5 if dtype == jnp.float32 else 1e-2
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=tol, atol=tol)
    assert np.abs(np.asarray(got, np.float32)).max() > 1.0  # something was computed
    cot = jnp.asarray(rng.normal(size=(70, 40)), jnp.float32)

    def loss(fn):
        return lambda a, b: jnp.sum(fn(a, b, sizes, group_offset=offset).astype(jnp.float32) * cot)

    got, want = jax.jit(jax.grad(loss(_mb), (0, 1)))(lhs, rhs), jax.grad(loss(gmm_reference), (0, 1))(lhs, rhs)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32), rtol=tol, atol=tol)


def test_megablox_tgmm_parts_and_fp8_weights():
    """tgmm (several contraction tiles), a weight in two parts, and a block-scaled FP8 weight (dequantized first)."""
    rng = np.random.default_rng(1)
    sizes = jnp.asarray([40, 0, 90, 30], jnp.int32)
    lhs = jnp.asarray(rng.normal(size=(176, 256)), jnp.float32)
    grad = jnp.asarray(rng.normal(size=(176, 136)), jnp.float32)
    got = jax.jit(
        lambda a, b: tgmm(a, b, sizes, group_offset=1, num_local_groups=3, implementation="megablox", interpret=True)
    )(lhs, grad)
    want = tgmm_reference(lhs, grad, sizes, group_offset=1, num_local_groups=3)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    w = jnp.asarray(rng.normal(size=(4, 256, 136)), jnp.float32)
    np.testing.assert_allclose(_mb(lhs, (w[:1], w[1:]), sizes), gmm_reference(lhs, w, sizes), rtol=1e-5, atol=1e-4)
    q = BlockScaled(*quantize(w, (128, 128)), (128, 128))
    np.testing.assert_allclose(_mb(lhs, q, sizes), gmm_reference(lhs, q, sizes), rtol=1e-5, atol=1e-4)


def test_megablox_gmm_lowers_for_a_tpu():
    lhs, rhs = jnp.zeros((256, 256), jnp.bfloat16), jnp.zeros((4, 256, 512), jnp.bfloat16)
    sizes = jnp.asarray([60, 70, 0, 100], jnp.int32)
    f = jax.jit(lambda a, b, s: gmm(a, b, s, implementation="megablox"))
    assert "tpu_custom_call" in f.trace(lhs, rhs, sizes).lower(lowering_platforms=("tpu",)).as_text()


# --------------------------------------------------------------------------------------- the dispatch kernel
def _dispatch_case(T=100, K=4, E=40, R=3, seed=0):
    """Hostile tables: a NaN row, a zero row (torn: uniform), an infinite entry, a missing replica, an expert with
    none; padding rows."""
    rng = np.random.default_rng(seed)
    table = rng.random((E, R)).astype(np.float32)
    table[3], table[5], table[7, R - 1] = np.nan, 0.0, np.inf
    l2p = rng.integers(0, 2 * E, (E, R))
    l2p[9, R - 1], l2p[11] = -1, -1
    ids = jnp.asarray(rng.integers(0, E, (T, K)), jnp.int32)
    valid = jnp.asarray(rng.random(T) > 0.1)
    uniforms = jnp.asarray(rng.random((T, K)), jnp.float32)
    return ids, valid, jnp.asarray(table), jnp.asarray(l2p, jnp.int32), jnp.zeros((E,), COUNTER_DTYPE), uniforms


@pytest.mark.parametrize("mode", ["sample", "quota"])
@pytest.mark.parametrize(("E", "R", "block"), [(40, 3, 64), (130, 1, 256), (16, 5, 8)])
def test_the_tpu_dispatch_kernel_equals_the_reference(mode, E, R, block):
    """Bit for bit (slots, counter, counts, replica counts), in TPU interpret mode; E past one 128-lane tile."""
    ids, valid, table, l2p, counter, u = _dispatch_case(E=E, R=R)
    got = dispatch(
        ids, valid, table, l2p, counter, mode=mode, uniforms=u, block=block, interpret=True, implementation="pallas_tpu"
    )
    want = dispatch_reference(ids, valid, table, l2p, counter, mode=mode, uniforms=u)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    assert int(np.asarray(got.counts).sum()) == int(np.asarray(valid).sum()) * ids.shape[1]


def test_the_tpu_dispatch_kernel_lowers_for_a_tpu():
    ids, valid, table, l2p, counter, _ = _dispatch_case()
    f = jax.jit(lambda *a: dispatch(*a, mode="quota", implementation="pallas_tpu"))
    text = f.trace(ids, valid, table, l2p, counter).lower(lowering_platforms=("tpu",)).as_text()
    assert "tpu_custom_call" in text


# ------------------------------------------------------------------------------------------------ the layer
def test_the_layer_lowers_for_a_tpu_with_megablox_and_the_ragged_exchange():
    """Forward and gradient, from this CPU host: megablox's kernels and two ragged all-to-alls a call."""
    placement, config, params, mesh = small_ep_case(1)
    config = dataclasses.replace(config, exchange="auto", gmm_impl="megablox")
    x = jax.random.normal(jax.random.key(2), (8 * 16, 32))
    pa, tables = dispatch_tables.placement_arrays(placement), dispatch_tables.uniform(placement)

    def loss(p, x):
        return moe_forward(p, x, mesh=mesh, placement_arrays=pa, tables=tables, config=config)[0].sum()

    with lowering_for("tpu"):  # the exchange as a TPU runs it ("auto": the ragged one)
        fwd = jax.jit(loss).trace(params, x).lower(lowering_platforms=("tpu",)).as_text()
        bwd = jax.jit(jax.grad(loss)).trace(params, x).lower(lowering_platforms=("tpu",)).as_text()
    for text in (fwd, bwd):
        assert "tpu_custom_call" in text
        assert text.count("ragged_all_to_all") >= 2
