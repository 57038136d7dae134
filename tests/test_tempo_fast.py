"""tempo_fast's certified bound, anytime budget and the pieces behind them (token_flow, level test, level partition)."""

import math

import numpy as np
import pytest
from hypothesis import given
from test_policies import problems

from solvers import PRESETS, DispatchProblem, Placement, slots_for, solve
from solvers.bounds import certified_lower_bound, forced_lower_bound, level_lower_bound
from solvers.limits import token_flow, token_lp_shares
from solvers.tempo_fast import TempoOptions
from solvers.tempo_moves import level_partition
from tempo_jax.workloads import SyntheticRouting


def _issue_batch(s: float, B: int, batch: int, ep: int = 8, E: int = 256, K: int = 8, rep: float = 1.25):
    """Issue 15's generator: top-K per token without replacement, Plackett–Luce over Zipf(s) weights shuffled over
    expert ids (no batch-to-batch fluctuation), EPLB placement, DeepSeek-V3 fp8 offline preset."""
    routing = SyntheticRouting(num_experts=E, top_k=K, s=s, kappa=math.inf, seed=0)
    placement = Placement.from_eplb(routing.popularity, slots_for(E, ep, rep), ep, spread_idle=True)
    return DispatchProblem(routing.batch(B, ep, batch), placement, PRESETS["dsv3_fp8_offline"])


# ---------------------------------------------------------------------------------------------- token flow
@given(problems(full=False))
def test_token_flow_matches_the_token_lp(problem):
    tf = token_flow(problem.n, problem.mask)
    lp = token_lp_shares(problem.n, problem.mask).sum(axis=0).max()
    assert tf.bound <= lp + 1e-6 and tf.tokens - 1 < lp + 1e-6 and lp <= tf.tokens + 1e-6
    assert tf.bound == pytest.approx(lp, rel=1e-9, abs=1e-9)  # the densest Hall set is found exactly
    np.testing.assert_allclose(tf.x.sum(axis=1), problem.n)
    assert not np.any(tf.x[~problem.mask] > 0) and np.all(tf.x == np.round(tf.x))
    assert tf.x.sum(axis=0).max(initial=0) <= tf.tokens


# ---------------------------------------------------------------------------------------------- bounds
@pytest.fixture(scope="module")
def small_optima():
    """Small random instances (two-piece, tile, three-piece) with their proven MILP optima."""
    from test_tempo_vs_milp import _instances

    out = []
    for problem in _instances(24, seed=3):
        opt = solve(problem, "milp", time_limit=20.0)
        assert opt.info["status"] == "optimal"
        out.append((problem, opt.makespan))
    return out


def test_certified_bound_never_exceeds_the_optimum(small_optima):
    raised = 0
    for problem, opt in small_optima:
        lb, parts = certified_lower_bound(problem)
        # the MILP has integer tokens: its optimum may exceed the real-valued one by one token on one GPU
        slack = max(problem.cost.beta, problem.cost.gamma or 0.0) + 1e-9
        assert parts["forced"] <= parts["token_flow"] <= parts["level"] == lb <= opt + slack
        raised += lb > parts["forced"] + 1e-9
        d = solve(problem, "tempo")
        assert d.info["lower_bound"] <= d.makespan + 1e-9 and 0 <= d.info["gap"] < 1
        assert d.lower_bound >= d.info["lower_bound"] - 1e-9  # Dispatch.lower_bound reads it
    assert raised >= 1  # the level test binds on some of them


def test_level_bound_proves_the_transition_band_optimum():
    """Issue 15's slow band (EP8, B = 512, s = 1.2): the optimum is one activation level above the cheap bound;
    the level test proves it (the hot expert fits no rank's room whole, and zero slack forbids a split), so
    tempo stops after the heuristic instead of running the ensemble and the repair."""
    problem = _issue_batch(1.2, 512, 0)
    lb0 = forced_lower_bound(problem)
    d = solve(problem, "tempo")
    assert d.makespan > lb0 * 1.02
    assert level_lower_bound(problem, lb0, d.makespan) == pytest.approx(d.makespan)
    assert d.info["optimal"] and d.info["stage"] == "heuristic" and "token_lp_makespan" not in d.info


def test_level_partition_is_a_valid_level_dispatch():
    problem = _issue_batch(0.6, 512, 1)
    lb, _ = certified_lower_bound(problem)
    k = math.floor(lb / problem.cost.b + 1e-9)
    x = level_partition(problem, k, lb / problem.cost.beta)
    d = solve(problem, "token_lp")  # only for the check helpers
    assert x is not None
    type(d)(x, problem, "level").validate()
    assert (x > 0).sum(axis=0).max() <= k
    assert level_partition(problem, 0, 1.0) is None  # forced experts alone exceed level 0


# ---------------------------------------------------------------------------------------------- anytime budget
def test_tiny_budget_returns_a_valid_dispatch_quickly():
    problem = _issue_batch(1.2, 512, 2, ep=64, E=384, K=6, rep=1.5)
    d = solve(problem, "tempo", time_budget_ms=0)
    d.validate()
    info = d.info
    assert info["budget_exhausted"] and info["time_budget_ms"] == 0
    assert 0 <= info["gap"] < 1 and info["lower_bound"] <= d.makespan
    assert info["stage"] == "heuristic"
    assert info["elapsed_ms"] < 250  # the seed alone (a few ms; generous for a loaded CI box)


@pytest.mark.parametrize(
    "case", [(1.2, 512, 0, 8, 256, 8, 1.25), (0.6, 512, 1, 8, 256, 8, 1.25), (1.2, 128, 0, 32, 384, 6, 1.5)]
)
def test_generous_budget_returns_the_unbudgeted_plan(case):
    problem = _issue_batch(*case)
    free = solve(problem, "tempo")
    timed = solve(problem, "tempo", time_budget_ms=60_000)
    np.testing.assert_array_equal(free.x, timed.x)
    assert free.info["stage"] == timed.info["stage"] and not timed.info["budget_exhausted"]
    assert timed.info["lower_bound"] == free.info["lower_bound"] and timed.info["gap"] == free.info["gap"]


def test_budget_and_knob_errors_name_the_argument():
    problem = _issue_batch(0.6, 32, 0)
    for bad in (-1, -0.5, math.nan, "5", True):
        with pytest.raises(ValueError, match="time_budget_ms"):
            solve(problem, "tempo", time_budget_ms=bad)
    for name, bad in (("tau", 1.0), ("max_iters", -1), ("chain_depth", 0), ("stop_gap", -0.1), ("repair_flows", 1.5)):
        with pytest.raises(ValueError, match=name):
            solve(problem, "tempo", **{name: bad})
    with pytest.raises(TypeError):
        TempoOptions(0.01)  # keyword-only knobs
    assert TempoOptions().time_budget_ms is None


@pytest.mark.parametrize("b, beta", [(15.0, 0.0), (0.0, 0.1)])
def test_degenerate_cost_models_reach_the_milp(b, beta):
    """One-piece models (no token slope, or no activation floor): the level test sees an unbounded token cap
    (β = 0) or no levels (b = 0) and the bound still closes at the optimum (a β = 0 cap once hung the max-flow)."""
    from solvers import CostModel

    rng = np.random.default_rng(0)
    for _ in range(3):
        n = rng.zipf(1.5, 64).astype(float) * 10
        problem = DispatchProblem(n, Placement.from_eplb(n, 80, 8), CostModel(b=b, beta=beta))
        d = solve(problem, "tempo")
        assert d.makespan == pytest.approx(solve(problem, "milp").makespan, rel=1e-9)
        assert d.makespan * (1 - 1e-4) <= d.info["lower_bound"] <= d.makespan + 1e-9  # proven within stop_gap
