"""The expert-parallel MoE layer on 8 fake CPU devices: the central invariant, gradients, quota plans."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from ep_case import D, E, small_ep_case  # E = 12 not divisible by the 8 ranks
from numeric import f32_close

from solvers import PRESETS, DispatchProblem, Placement, solve
from tempo_jax.layer import MoEConfig, init_params, moe_forward, moe_reference, to_logical, to_physical
from tempo_jax.layer import tables as dispatch_tables
from tempo_jax.layer.exchange import lowering_for

TOKENS = D * 16


@pytest.fixture(scope="module")
def setup():
    placement, config, params, mesh = small_ep_case(1)  # 2 slots per rank, 4 experts replicated
    x = jax.random.normal(jax.random.key(2), (TOKENS, 32))
    return placement, config, params, x, mesh


def _forward(placement, config, mesh):
    pa = dispatch_tables.placement_arrays(placement)

    @jax.jit
    def f(params, x, table, key):
        tables = dispatch_tables.Tables(table, pa.log2phy)
        return moe_forward(params, x, mesh=mesh, placement_arrays=pa, tables=tables, config=config, key=key)

    return f


@pytest.mark.parametrize("mode", ["sample", "quota"])
def test_output_independent_of_tables(setup, mode):
    placement, config, params, x, mesh = setup
    config = dataclasses.replace(config, dispatch_mode=mode)
    f = _forward(placement, config, mesh)
    ref = moe_reference(to_logical(params, placement), x, config)
    # First pass (uniform) gives the per-source counts the solver needs.
    _, counts, *_ = f(params, x, dispatch_tables.uniform(placement).table, jax.random.key(0))
    tempo = solve(DispatchProblem(np.asarray(counts), placement, PRESETS["dsv3_fp8_offline"]), "tempo")
    candidates = {
        "uniform": dispatch_tables.uniform(placement),
        "static": dispatch_tables.static(placement),
        "tempo": dispatch_tables.from_dispatch(tempo),
        "perturbed": dispatch_tables.perturbed(dispatch_tables.uniform(placement), seed=3),
        "torn": dispatch_tables.Tables(
            jnp.zeros_like(dispatch_tables.uniform(placement).table), dispatch_tables.uniform(placement).log2phy
        ),
    }
    seen_loads = set()
    for name, tables in candidates.items():
        res = f(params, x, tables.table, jax.random.key(7))
        out, c, aux = res.out, res.counts, res.stats
        f32_close(out, ref)
        np.testing.assert_array_equal(c, counts)  # counts depend on routing only
        assert int(aux.drops.sum()) == 0, name
        assert int(aux.gpu_tokens.sum()) == TOKENS * config.top_k
        seen_loads.add(tuple(np.asarray(aux.gpu_tokens).tolist()))
    assert len(seen_loads) > 1  # the tables really changed where tokens went


def test_skewed_and_single_expert_batches(setup):
    placement, config, params, x, mesh = setup
    f = _forward(placement, config, mesh)
    hot = dict(params)
    hot["router"] = params["router"].at[0, 5].set(100.0)  # feature 0 votes hard for expert 5
    x_pos = x.at[:, 0].set(5.0 + jnp.abs(x[:, 0]))  # every token carries feature 0
    ids = np.asarray(jax.lax.top_k(x_pos @ hot["router"], 1)[1])
    assert (ids == 5).all()
    res = f(hot, x_pos, dispatch_tables.static(placement).table, jax.random.key(1))
    out, counts, aux = res.out, res.counts, res.stats
    f32_close(out, moe_reference(to_logical(hot, placement), x_pos, config))
    assert int(np.asarray(counts)[:, 5].sum()) == TOKENS
    assert int(aux.drops.sum()) == 0


@pytest.mark.parametrize("gmm_impl", ["auto", pytest.param("tokamax", marks=pytest.mark.tokamax)])
def test_gradients_match_dense_reference(setup, gmm_impl):
    """Outputs and gradients equal the dense reference under jit, with the default grouped GEMM and with tokamax's
    (`make test-latest`: the layer's slot layout, 2 slots per rank, rows of each rank's local groups)."""
    placement, config, params, x, mesh = setup
    config = dataclasses.replace(config, gmm_impl=gmm_impl)
    pa = dispatch_tables.placement_arrays(placement)
    tables = dispatch_tables.perturbed(dispatch_tables.uniform(placement), seed=1)

    def loss(p, x):
        out, *_ = moe_forward(p, x, mesh=mesh, placement_arrays=pa, tables=tables, config=config)
        return jnp.sum(out**2)

    out, *_ = jax.jit(lambda p, x: moe_forward(p, x, mesh=mesh, placement_arrays=pa, tables=tables, config=config))(
        params, x
    )
    gp, gx = jax.jit(jax.grad(loss, argnums=(0, 1)))(params, x)
    logical = to_logical(params, placement)
    f32_close(out, moe_reference(logical, x, config), atol=1e-5, rtol=1e-5)
    rp, rx = jax.grad(lambda p, x: jnp.sum(moe_reference(p, x, config) ** 2), argnums=(0, 1))(logical, x)
    f32_close(gx, rx, atol=1e-4, rtol=1e-4)
    # every replica's gradient is its expert's (the replica group's sum), so the replicas stay identical
    rp = to_physical(rp, placement)
    for name in params:
        f32_close(gp[name], rp[name], atol=1e-4, rtol=1e-4)
        assert gp[name].sharding.spec == (
            jax.sharding.PartitionSpec("ep") if name != "router" else jax.sharding.PartitionSpec()
        ), name


def test_quota_mode_realises_the_plan(setup):
    placement, config, params, x, mesh = setup
    config = dataclasses.replace(config, dispatch_mode="quota")
    f = _forward(placement, config, mesh)
    _, counts, *_ = f(params, x, dispatch_tables.uniform(placement).table, jax.random.key(0))
    d = solve(DispatchProblem(np.asarray(counts), placement, PRESETS["dsv3_fp8_offline"]), "tempo")
    res = f(params, x, dispatch_tables.from_dispatch(d).table, jax.random.key(0))
    aux = res.stats
    rc = np.asarray(aux.replica_counts).sum(axis=0)  # [E, R] pairs per replica column
    l2p = placement.log2phy
    realised = np.zeros((E, D))
    for e in range(E):
        for r in range(placement.logcnt[e]):
            realised[e, placement.slot_gpu[l2p[e, r]]] += rc[e, r]
    assert np.abs(realised - d.x).max() <= D  # within one token per source rank
    np.testing.assert_array_equal(np.asarray(aux.gpu_tokens), realised.sum(axis=0))


def test_ragged_exchange_lowers(setup):
    """The GPU/TPU path traces and lowers here (XLA:CPU cannot run ragged_all_to_all; scripts/gpu_check.sh does)."""
    placement, config, params, x, mesh = setup
    config = dataclasses.replace(config, exchange="ragged")
    pa = dispatch_tables.placement_arrays(placement)
    f = jax.jit(
        lambda p, x: moe_forward(
            p, x, mesh=mesh, placement_arrays=pa, tables=dispatch_tables.uniform(placement), config=config
        )
    )
    with lowering_for("gpu"):  # XLA:CPU cannot run it: the layer refuses it on a CPU mesh outside this block
        assert "ragged_all_to_all" in f.lower(params, x).as_text()


def test_bad_inputs(setup):
    placement, config, params, x, mesh = setup
    pa = dispatch_tables.placement_arrays(placement)
    tables = dispatch_tables.uniform(placement)
    kw = dict(mesh=mesh, placement_arrays=pa, tables=tables, config=config)
    with pytest.raises(ValueError, match=r"mask must be bool \[T=128\]"):
        moe_forward(params, x, **kw, mask=jnp.ones((127,), bool))
    with pytest.raises(ValueError, match="D·S"):
        moe_forward(params, x, **{**kw, "config": dataclasses.replace(config, slots_per_rank=3)})
    with pytest.raises(ValueError, match="does not match config"):
        moe_forward(params, x[:, :16], **kw)
    with pytest.raises(ValueError, match="exchange: unknown implementation"):
        MoEConfig(hidden=4, ffn=4, experts=4, top_k=2, slots_per_rank=1, exchange="nccl")
    with pytest.raises(ValueError, match="top_k"):
        MoEConfig(hidden=4, ffn=4, experts=4, top_k=5, slots_per_rank=1)
    with pytest.raises(ValueError, match="mode"):
        MoEConfig(hidden=4, ffn=4, experts=4, top_k=2, slots_per_rank=1, dispatch_mode="greedy")


def test_extra_mesh_axis_bfloat16_and_explicit_mesh():
    """Extra mesh axes are left alone (replicated), bfloat16 experts work, Explicit meshes are resharded."""
    placement = Placement.from_eplb(np.arange(E) + 1.0, 16, 4)
    x = jax.random.normal(jax.random.key(2), (64, 32))
    pa, tables = dispatch_tables.placement_arrays(placement), dispatch_tables.uniform(placement)
    mesh2d = jax.make_mesh((2, 4), ("dp", "ep"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    cfg = MoEConfig(hidden=32, ffn=16, experts=E, top_k=2, slots_per_rank=4, dtype=jnp.bfloat16)
    params = init_params(jax.random.key(1), cfg, placement)
    out, counts, *_ = moe_forward(params, x, mesh=mesh2d, placement_arrays=pa, tables=tables, config=cfg)
    assert counts.shape == (4, E)
    ref = moe_reference(to_logical(params, placement), x, cfg).astype(jnp.float32)
    f32_close(out.astype(jnp.float32), ref, atol=2e-2, rtol=2e-2)  # the bfloat16 tolerance
    cfg32 = dataclasses.replace(cfg, dtype=jnp.float32)
    params32 = init_params(jax.random.key(1), cfg32, placement)
    explicit = jax.make_mesh((4,), ("ep",))  # Explicit axes by default in jax 0.10
    out, *_ = moe_forward(params32, x, mesh=explicit, placement_arrays=pa, tables=tables, config=cfg32)
    f32_close(out, moe_reference(to_logical(params32, placement), x, cfg32))
