"""`tempo_jax.MoE` (flax nnx), the DispatchController and the tiny MoE language model."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from numeric import assert_close

import tempo_jax
from solvers import PRESETS, Placement
from tempo_jax.layer import tables as dispatch_tables
from tempo_jax.layer.module import place_on_mesh
from tempo_jax.workloads import load_saved_trace, save_traces


@pytest.fixture(scope="module")
def layer():
    placement = Placement.from_eplb(np.arange(12) + 1.0, 16, 8)
    cfg = tempo_jax.MoEConfig(hidden=32, ffn=16, experts=12, top_k=2, slots_per_rank=2)
    return placement, cfg, tempo_jax.make_ep_mesh(8)


def test_module_matches_reference_and_trains(layer):
    placement, cfg, mesh = layer
    moe = tempo_jax.MoE(cfg, placement, mesh=mesh, rngs=nnx.Rngs(params=0, dispatch=1), record=True)
    x = jax.random.normal(jax.random.key(0), (4, 32, 32))
    y = moe(x)
    ref = tempo_jax.moe_reference(moe.logical_params(), x.reshape(-1, 32), cfg).reshape(x.shape)
    np.testing.assert_allclose(np.asarray(y), np.asarray(ref), atol=2e-5, rtol=2e-5)
    assert moe.counts.get_value().sum() == 4 * 32 * 2 and moe.topk_ids.get_value().shape == (128, 2)

    ctl = tempo_jax.DispatchController(placement, PRESETS["dsv3_fp8_offline"], solver_mode="thread")
    opt = nnx.Optimizer(moe, optax.adamw(1e-2), wrt=nnx.Param)
    place_on_mesh(opt, mesh)  # optimizer state on the mesh too: one compile for every step

    @nnx.jit
    def step(moe, opt, x):
        loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x) - x) ** 2))(moe)
        opt.update(moe, grads)
        return loss

    losses = []
    for _ in range(4):
        losses.append(float(step(moe, opt, x)))
        moe.set_tables(ctl.observe(moe.counts.get_value()))  # never blocks on the solver
    ctl.wait()
    ctl.close()
    assert losses[-1] < losses[0]
    assert len(ctl.history) >= 1 and ctl.history[-1]["makespan"] > 0
    # new tables change nothing but where tokens go
    y2 = moe(x)
    np.testing.assert_allclose(
        np.asarray(y2),
        np.asarray(tempo_jax.moe_reference(moe.logical_params(), x.reshape(-1, 32), cfg).reshape(x.shape)),
        atol=2e-5,
        rtol=2e-5,
    )
    with pytest.raises(ValueError, match="different placement"):
        moe.set_tables(dispatch_tables.uniform(Placement.from_eplb(np.ones(12), 16, 8)))


def test_installed_tables_are_checked_on_the_host(layer):
    """MoE(tables=...) and set_tables reject negative, NaN or infinite weights and wrong shapes with the
    function's name (the kernel would read a negative entry as 0); tables built in a traced program and installed
    later are caught here too."""
    placement, cfg, mesh = layer
    good = dispatch_tables.uniform(placement)
    bad = np.array(good.table)
    bad[0, 4, 0] = -1.0
    bad_tables = dispatch_tables.Tables._trusted(jnp.asarray(bad), good.log2phy)  # e.g. from a jit output or a tree map
    with pytest.raises(ValueError, match=r"^MoE: table must be ≥ 0.*table\[0, 4, 0\] = -1.0"):
        tempo_jax.MoE(cfg, placement, mesh=mesh, rngs=nnx.Rngs(params=0), tables=bad_tables)
    moe = tempo_jax.MoE(cfg, placement, mesh=mesh, rngs=nnx.Rngs(params=0), tables=dispatch_tables.static(placement))
    before = np.asarray(moe.table.get_value())
    for table, match in [
        (bad, "must be ≥ 0"),
        (np.where(bad < 0, np.nan, bad), "NaN"),
        (np.where(bad < 0, np.inf, bad), "finite"),
        (bad[0], r"table must be \[Gs, E, R\]"),
    ]:
        with pytest.raises(ValueError, match=r"^MoE.set_tables: .*" + match):
            moe.set_tables(dispatch_tables.Tables._trusted(jnp.asarray(table), good.log2phy))
    np.testing.assert_array_equal(moe.table.get_value(), before)  # nothing was installed
    moe.set_tables(good)
    np.testing.assert_array_equal(moe.table.get_value(), good.table)


def test_controller_windows_counter_and_per_node():
    placement = Placement.from_eplb(np.arange(16) + 1.0, 32, 8, num_groups=4, num_nodes=2)
    ctl = tempo_jax.DispatchController(placement, PRESETS["dsv3_fp8_offline"], window=2, per_node=True)
    rng = np.random.default_rng(0)
    counts = rng.integers(0, 50, (8, 16))
    first = ctl.observe(counts)
    assert ctl.history == [] and first.table.shape[0] == 1  # window not complete: still the initial table
    tables = ctl.observe(counts)
    assert tables.table.shape == (2, 16, placement.log2phy.shape[1])  # one table per source node
    # cumulative counters wrap modulo 2**32: differencing recovers the window; the first snapshot is a baseline
    c0 = np.full((8, 16), 2**32 - 5, dtype=np.uint32)
    ctl.observe_counter(c0)
    c1 = (c0.astype(np.uint64) + counts.astype(np.uint64)).astype(np.uint32)
    ctl.observe_counter(c1)
    ctl.observe_counter((c1.astype(np.uint64) + counts.astype(np.uint64)).astype(np.uint32))
    assert len(ctl.history) == 2 and ctl.history[-1]["pairs"] == 2 * counts.sum()
    assert ctl.metrics()["counter"]["baselines"] == 1
    with pytest.raises(ValueError, match="counts must be"):
        ctl.observe(np.ones((3, 16)))


@pytest.mark.slow  # fast twins: test_module_matches_reference_and_trains, test_serve's LM run; `make test-all`
def test_tiny_lm_loss_falls_and_records_routing(tmp_path):
    from tempo_jax.lm.model import LMConfig, corpus, train

    assert corpus().size > 300_000
    result = train(LMConfig(), steps=30, record=True)
    assert np.isfinite(result.losses).all()
    assert result.losses[-5:].mean() < result.losses[:5].mean() - 1.0
    trace = result.trace
    assert trace.layers == (0, 1) and trace.topk_ids[0].shape == (30 * 8 * 64, 2)
    path = save_traces([trace], tmp_path / "tiny.npz")
    again = load_saved_trace(path)
    np.testing.assert_array_equal(again.topk_ids[1], trace.topk_ids[1])
    assert again.batch_counts(0, 64, 8).sum() == 64 * 8 * 2


def test_aux_free_bias_steps_toward_under_loaded_experts(layer):
    """One forward with ``balance_rate``, eagerly and under ``nnx.jit``: the selection-only bias moves by
    rate·sign(mean(load) − load) for the step's own load, under-loaded experts up (the fast twin of the training run
    below)."""
    from tempo_jax.layer.routing import RouterConfig

    placement, cfg, mesh = layer
    cfg = dataclasses.replace(cfg, router=RouterConfig(score_bias=True, balance_rate=0.05))
    moe = tempo_jax.MoE(cfg, placement, mesh=mesh, rngs=nnx.Rngs(params=0, dispatch=1))
    jitted = nnx.jit(lambda m, x: m(x))
    for step, forward in enumerate((lambda m, x: m(x), jitted, jitted)):
        before = np.asarray(moe.score_bias.get_value())
        forward(moe, jax.random.normal(jax.random.key(step), (4, 32, 32)))
        load = np.asarray(moe.expert_load.get_value(), np.float64)
        assert load.min() < load.mean() < load.max()  # a step that has something to even out
        np.testing.assert_allclose(moe.score_bias.get_value(), before + 0.05 * np.sign(load.mean() - load), atol=1e-7)


@pytest.mark.slow  # two 24-step training runs; the bias update itself is checked by the test above
def test_aux_free_balancing_evens_out_a_skewed_router():
    """DeepSeek-V3's auxiliary-loss-free balancing (the selection-only score bias moves by rate·sign(mean − load)
    after every step) evens out a router skewed toward two experts; without it the skew stays."""
    from tempo_jax.lm.model import LMConfig, TinyMoELM, train

    mesh = tempo_jax.make_ep_mesh(8)
    runs = {}
    for rate in (0.0, 0.02):
        cfg = LMConfig(layers=1, balance_rate=rate)
        model = TinyMoELM(cfg, mesh=mesh, rngs=nnx.Rngs(params=0, dispatch=1))
        router = model.blocks[0].moe.router
        router.set_value(router.get_value().at[:, 0].add(0.8).at[:, 1].add(0.7))  # experts 0, 1 favoured
        runs[rate] = train(cfg, steps=24, mesh=mesh, model=model)
    off, on = (runs[r].imbalance for r in (0.0, 0.02))
    assert off[-8:].mean() > 2.4  # max / mean load: the skew persists without balancing
    assert on[-8:].mean() < 0.75 * off[-8:].mean() and on[-8:].mean() < on[:4].mean()
    bias = np.asarray(runs[0.02].model.blocks[0].moe.score_bias.get_value())
    assert np.abs(bias).max() > 0.02 and not hasattr(runs[0.0].model.blocks[0].moe, "score_bias")
    assert np.isfinite(runs[0.02].losses).all()


def test_tree_mode_jit_returns_only_the_changed_state_and_computes_the_same():
    """`nnx.jit(..., graph=False)` (the recipes' choice): the same outputs, statistics and training steps as flax's
    graph mode, and a call leaves the weight arrays it did not change in place (graph mode returns and replaces
    every array of the module: XLA copies them) while the counters it did change are replaced."""
    D, E = 8, 16
    cfg = tempo_jax.MoEConfig(hidden=32, ffn=16, experts=E, top_k=2, slots_per_rank=2, dispatch_mode="quota")
    placement = Placement.from_eplb(np.linspace(8.0, 1.0, E), D * 2, D)
    mesh = tempo_jax.make_ep_mesh(D)
    x = jax.random.normal(jax.random.key(0), (D * 8, 32))
    runs = {}
    for graph in (True, False):
        moe = tempo_jax.MoE(cfg, placement, mesh=mesh, rngs=nnx.Rngs(params=0, dispatch=1))
        w, c = moe.w_up.get_value(), moe.counter.get_value()
        y = nnx.jit(lambda m, x: m(x), graph=graph)(moe, x)
        assert (moe.w_up.get_value() is w) == (not graph) and moe.counter.get_value() is not c
        opt = nnx.Optimizer(moe, optax.adam(1e-2), wrt=nnx.Param)

        @nnx.jit(graph=graph)
        def step(m, o, x):
            loss, grads = nnx.value_and_grad(lambda m: jnp.sum(m(x) ** 2))(m)
            o.update(m, grads)
            return loss

        losses = [float(step(moe, opt, x)) for _ in range(2)]
        stats = moe.stats.get_value()
        counters = [np.asarray(x) for x in (moe.counter.get_value(), stats.drops, stats.rounds, stats.gpu_tokens)]
        runs[graph] = (np.asarray(y), losses, {k: np.asarray(v) for k, v in moe.params().items()}, counters)
    (y0, l0, p0, s0), (y1, l1, p1, s1) = runs[True], runs[False]  # two programs: the dtype's tolerance
    assert_close(y1, y0)
    np.testing.assert_allclose(l1, l0, rtol=1e-5)
    for k in p0:
        assert_close(p1[k], p0[k])
    for a, b in zip(s0, s1, strict=True):
        np.testing.assert_array_equal(a, b)  # integer counters: where the pairs went
