"""The one plan → table seam (`solvers.plan_weights`, `solvers.expected_dispatch`) and the tables each policy
publishes through the `DispatchController`: they realise the policy's plan (numpy: exactly; the layer in quota
mode: within one token per source rank) and never change the layer's output."""

import jax
import numpy as np
import pytest

from solvers import (
    PRESETS,
    Dispatch,
    DispatchProblem,
    Placement,
    expected_dispatch,
    node_counts_from_sources,
    plan_weights,
    solve,
    solve_weights,
    static_map,
    topology_split,
)
from tempo_jax import DispatchController
from tempo_jax.layer import MoEConfig, init_params, make_ep_mesh, moe_forward, moe_reference, to_logical
from tempo_jax.layer import tables as dispatch_tables

D, E = 8, 12
COST = PRESETS["dsv3_fp8_offline"]
POLICIES = ("static", "uniform", "token_lp", "metro", "llep", "tempo")


@pytest.fixture(scope="module")
def two_node():
    """8 ranks on 2 nodes, 16 slots (4 experts replicated, some across nodes), per-source counts [D, E]."""
    rng = np.random.default_rng(0)
    load = rng.zipf(1.6, E).astype(float) + rng.random(E)
    pl = Placement.from_eplb(load, 16, D, num_nodes=2)
    counts = rng.multinomial(D * 30, load / load.sum(), size=D).astype(np.int64)
    counts[:, int(np.argmin(load))] = 0  # one expert nobody sends to
    return pl, counts


def test_named_plans(two_node):
    pl, counts = two_node
    valid = pl.log2phy >= 0
    uni = plan_weights("uniform", pl)
    assert uni.shape == (1, E, pl.log2phy.shape[1])
    np.testing.assert_allclose(uni[0], valid / pl.logcnt[:, None])
    st = plan_weights("static", pl)
    assert st.shape == (D, E, pl.log2phy.shape[1]) and set(np.unique(st)) <= {0.0, 1.0}
    np.testing.assert_array_equal(pl.log2phy[np.arange(E)[None], st.argmax(axis=2)], static_map(pl))
    problem = DispatchProblem(counts, pl, COST)
    # a Dispatch converts by its policy: the static policy's plan is the per-source map, not flat shares
    np.testing.assert_array_equal(plan_weights(solve(problem, "static")), st)
    np.testing.assert_allclose(plan_weights(solve(problem, "uniform")), uni)
    flat_static = plan_weights(solve(problem, "static").x, pl)
    assert flat_static.shape[0] == 1  # what the old controller published for policy="static"


@pytest.mark.parametrize("policy", POLICIES)
def test_every_plan_is_realised_exactly(two_node, policy):
    pl, counts = two_node
    problem = DispatchProblem(counts, pl, COST)
    d = solve(problem, policy)
    w = plan_weights(d)
    assert np.isfinite(w).all() and (w >= 0).all() and (w[:, pl.log2phy < 0] == 0).all()
    np.testing.assert_allclose(w.sum(axis=2), 1.0, rtol=1e-12)
    np.testing.assert_allclose(expected_dispatch(w, counts, pl), d.x, atol=1e-9)
    # the per-node split of the same plan: other source pairing, identical per-GPU loads
    w_node, d2 = solve_weights(problem, policy, per_node=True)
    assert w_node.shape[0] == (D if policy == "static" else 2)
    np.testing.assert_allclose(expected_dispatch(w_node, counts, pl), d2.x, atol=1e-9)


def test_per_node_split_matches_topology_split(two_node):
    pl, counts = two_node
    d = solve(DispatchProblem(counts, pl, COST), "tempo")
    y = topology_split(d, node_counts_from_sources(counts, pl), pl)
    w = plan_weights(y, pl)
    np.testing.assert_allclose(w, dispatch_tables.from_split(y, pl).table, rtol=1e-6)
    np.testing.assert_allclose(expected_dispatch(w, counts, pl), d.x, atol=1e-9)


def test_fallback_rule_is_one_rule():
    pl = Placement.from_phy2log([0, 1, 0, 2], 2, num_experts=3)  # expert 0 on both ranks
    y = np.zeros((2, 3, 2))
    y[0, 0] = [3, 1]  # group 0 saw expert 0; group 1 did not → the flat row (3:1)
    y[1, 1, 0] = 4  # expert 2 seen by nobody → uniform over its one replica
    w = plan_weights(y, pl)
    np.testing.assert_allclose(w[1, 0, :2], [0.75, 0.25])
    np.testing.assert_allclose(w[:, 1, 0], 1.0)
    np.testing.assert_allclose(w[:, 2, 0], 1.0)
    np.testing.assert_allclose(plan_weights(np.zeros((3, 2)), pl)[0], plan_weights("uniform", pl)[0])
    # a rank holding two replicas of an expert splits its share evenly between them
    pl2 = Placement.from_phy2log([0, 0, 1, 0], 2, num_experts=2)
    np.testing.assert_allclose(plan_weights(np.array([[4.0, 2.0], [0, 1]]), pl2)[0, 0], [1 / 3, 1 / 3, 1 / 3])
    # expected loads of an all-zero weight row: uniform, as the kernel reads it
    np.testing.assert_allclose(expected_dispatch(np.zeros((1, 2, 3)), np.array([6.0, 2.0]), pl2), [[4, 2], [0, 2]])


@pytest.mark.parametrize(
    ("plan", "kw", "match"),
    [
        ("tempo ", {}, r"plan_weights: unknown plan 'tempo '; valid: 'uniform', 'static'"),
        (np.ones(3), {}, r"plan must be 2-D or 3-D"),
        (np.ones((3, 3, 4)), {}, r"Gs source groups dividing D = 4"),
        (np.ones((1, 3, 4)), {}, r"tokens of expert 0 on rank \d, a rank without a replica"),
        (np.full((3, 4), np.nan), {}, r"NaN at plan\[0, 0\]"),
        (-np.ones((3, 4)), {}, r"must be ≥ 0 .*plan\[0, 0\] = -1.0"),
    ],
)
def test_plan_errors(plan, kw, match):
    pl = Placement.from_eplb(np.arange(3) + 1.0, 8, 4)
    with pytest.raises(ValueError, match=match):
        plan_weights(plan, pl, **kw)


def test_expected_dispatch_errors(two_node):
    pl, counts = two_node
    w = plan_weights("static", pl)
    with pytest.raises(ValueError, match=r"need per-source counts \[D, E\]"):
        expected_dispatch(w, counts.sum(axis=0), pl)
    with pytest.raises(ValueError, match="weights must be"):
        expected_dispatch(w[:, :3], counts, pl)
    with pytest.raises(ValueError, match=r"counts must be \[D=8"):
        expected_dispatch(w, counts[:3], pl)


# ------------------------------------------------------------------------------ the layer, quota mode
@pytest.fixture(scope="module")
def layer(two_node):
    pl, _ = two_node
    config = MoEConfig(hidden=16, ffn=8, experts=E, top_k=2, slots_per_rank=pl.slots_per_rank, dispatch_mode="quota")
    mesh = make_ep_mesh(D)
    params = init_params(jax.random.key(0), config, pl, mesh=mesh)
    x = jax.random.normal(jax.random.key(1), (D * 24, 16)) + 0.7 * jax.random.normal(jax.random.key(2), (1, 16))
    pa = dispatch_tables.placement_arrays(pl)

    @jax.jit
    def run(table):
        return moe_forward(
            params, x, mesh=mesh, placement_arrays=pa, tables=dispatch_tables.Tables(table, pa.log2phy), config=config
        )

    return run, np.asarray(moe_reference(to_logical(params, pl), x, config)), config


def _realised(stats, pl) -> np.ndarray:
    rc = np.asarray(stats.replica_counts).sum(axis=0)  # [E, R] pairs per replica column
    x = np.zeros((E, D))
    valid = pl.log2phy >= 0
    np.add.at(x, (np.nonzero(valid)[0], pl.slot_gpu[pl.log2phy[valid]]), rc[valid])
    return x


@pytest.mark.parametrize("per_node", [False, True])
def test_published_tables_realise_the_plan_in_quota_mode(two_node, layer, per_node):
    """What the controller publishes for every policy is what that policy planned (static: the per-source map,
    exactly); the layer's output is the dense reference's whatever the tables."""
    pl, _ = two_node
    run, ref, _ = layer
    first = run(dispatch_tables.uniform(pl).table)
    counts = np.asarray(first.counts)
    outs = []
    for policy in POLICIES:
        ctl = DispatchController(pl, COST, policy=policy, per_node=per_node)
        tables = ctl.observe(counts)
        assert ctl.version == 1 and ctl.metrics()["pairs"]["published"] == counts.sum()
        assert tables.num_groups == (D if policy == "static" else 2 if per_node else 1)
        d = solve(DispatchProblem(counts, pl, COST), policy)
        res = run(tables.table)
        np.testing.assert_array_equal(res.counts, counts)  # the routing is the same
        realised = _realised(res.stats, pl)
        tol = 0 if policy == "static" else D  # within one token per source rank (exact for one-hot rows)
        assert np.abs(realised - d.x).max() <= tol, policy
        np.testing.assert_array_equal(np.asarray(res.stats.gpu_tokens), realised.sum(axis=0))
        assert int(np.asarray(res.stats.drops).sum()) == 0
        outs.append(np.asarray(res.out))
    for out in outs:
        np.testing.assert_allclose(out, ref, atol=2e-5, rtol=2e-5)


def test_from_plan_wrapper(two_node):
    pl, counts = two_node
    d = solve(DispatchProblem(counts, pl, COST), "static")
    np.testing.assert_array_equal(dispatch_tables.from_plan(d).table, dispatch_tables.static(pl).table)
    np.testing.assert_array_equal(dispatch_tables.from_plan("uniform", pl).table, dispatch_tables.uniform(pl).table)
    with pytest.raises(ValueError, match=r"tables.from_weights: weights must be \[Gs, E, R\]"):
        dispatch_tables.from_weights(np.ones((E, 3)), pl)
    with pytest.raises(ValueError, match=r"tables.from_plan: dispatch.x .*dispatch.x\[0, \d\] = -1.0"):
        dispatch_tables.from_plan(Dispatch(np.where(d.x > 0, -1.0, 0.0), d.problem, "tempo"))
