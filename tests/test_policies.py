"""Dispatch policies: validity on random problems, the worked example, guarantees, errors."""

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from solvers import (
    POLICIES,
    PRESETS,
    SWEEP_POLICIES,
    CostModel,
    Dispatch,
    DispatchProblem,
    Placement,
    semi_matching,
    semi_matching_value,
    solve,
)
from solvers.policies import round_robin

FAST_POLICIES = list(SWEEP_POLICIES)


def test_every_sweep_reads_one_policy_list():
    """A policy added to `POLICIES` joins the demo, the replays, the calibration ranking and the solver bench:
    each reads `SWEEP_POLICIES` (every policy but round_robin, relief and milp, in `POLICIES` order)."""
    import sys
    from pathlib import Path

    from tempo_jax.cli.demo import POLICY_ORDER
    from tempo_jax.runtime.calibrate import RANK_POLICIES
    from tempo_jax.sim.tempo.protocols import PolicyConfig
    from tempo_jax.sim.tempo.replay_summary import landscape_table

    assert SWEEP_POLICIES == tuple(p for p in POLICIES if p not in ("round_robin", "relief", "milp"))
    assert POLICY_ORDER == [*SWEEP_POLICIES, "milp"] and RANK_POLICIES == SWEEP_POLICIES
    assert PolicyConfig().policies == SWEEP_POLICIES
    assert landscape_table.__defaults__ == (SWEEP_POLICIES,)
    sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))
    import bench_solver

    assert bench_solver.POLICIES == list(SWEEP_POLICIES)


COST_FORMS = {
    "two_piece": CostModel(a=5.0, b=15.0, c=3.0, beta=0.1),
    "tile": CostModel(a=5.0, b=15.0, b2=5.0, tile=16, c=3.0, beta=0.1),
    "three_piece": CostModel(a=5.0, b=15.0, c=3.0, beta=0.05, c2=10.0, gamma=0.12),
}


@st.composite
def problems(draw, full=None):
    E = draw(st.integers(1, 12))
    G = draw(st.integers(1, 5))
    is_full = draw(st.booleans()) if full is None else full
    if is_full:
        pl = Placement.full(E, G)
    else:
        spg = draw(st.integers(-(-E // G), -(-E // G) + 2))
        extra = draw(st.lists(st.integers(0, E - 1), min_size=G * spg - E, max_size=G * spg - E))
        pl = Placement.from_phy2log(draw(st.permutations(list(range(E)) + extra)), G)
    tokens = draw(st.lists(st.sampled_from([0, 0, 1, 3, 17, 40, 128, 129, 300, 1000]), min_size=E, max_size=E))
    cost = COST_FORMS[draw(st.sampled_from(sorted(COST_FORMS)))]
    return DispatchProblem(np.array(tokens), pl, cost)


@given(problems())
def test_every_policy_validates(problem):
    for policy in FAST_POLICIES + (["round_robin"] if problem.placement.is_full else []):
        d = solve(problem, policy)
        d.validate()
        assert d.makespan >= d.lower_bound - 1e-6 * max(1.0, d.makespan), policy


@given(problems())
def test_tempo_never_worse_than_ensemble_candidates(problem):
    tau = 0.01
    m = solve(problem, "tempo").makespan
    assert m <= solve(problem, "token_lp").makespan / (1 - tau) + 1e-9
    if problem.placement.is_full:
        assert m <= solve(problem, "round_robin").makespan / (1 - tau) + 1e-9


@given(problems(full=True))
def test_theorem2_round_robin_additive_bound(problem):
    """M(A3) ≤ LB + max_k φ_k(n_max) ≤ OPT + max(b, β·n_max) (tile model: b + b2(⌈n/128⌉−1))."""
    c = problem.cost
    n_max = problem.n.max()
    phis = [c.b + (c.b2 or 0.0) * max(np.ceil(n_max / c.tile) - 1, 0), c.beta * n_max]
    if c.gamma is not None:
        phis.append(c.gamma * n_max)
    a3 = solve(problem, "round_robin").makespan
    assert a3 <= c.lower_bound(problem.n, problem.num_gpus) + max(phis) + 1e-9


def test_fig1b_worked_example():
    problem = DispatchProblem(np.array([600] + [30] * 6), Placement.full(7, 2), CostModel(b=15, beta=0.1))
    assert solve(problem, "uniform").makespan == pytest.approx(105)
    assert solve(problem, "token_lp").makespan == pytest.approx(105)
    assert solve(problem, "metro").makespan == pytest.approx(69)
    tempo = solve(problem, "tempo")
    assert tempo.makespan == pytest.approx(60)
    assert tempo.lower_bound == pytest.approx(60)
    np.testing.assert_allclose(tempo.x[0], [300, 300])


@given(problems())
def test_b_zero_tempo_matches_token_lp(problem):
    c = problem.cost
    zero_b = DispatchProblem(problem.tokens, problem.placement, CostModel(a=0, b=0, c=c.c, beta=c.beta))
    lp = solve(zero_b, "token_lp").makespan
    assert solve(zero_b, "tempo").makespan <= lp / 0.99 + 1e-9


def _brute_semi_matching(mask, live):
    E, G = mask.shape
    choices = [np.flatnonzero(mask[e]) if live[e] else [-1] for e in range(E)]
    best = None
    for combo in itertools.product(*choices):
        used = [g for g in combo if g >= 0]
        load = np.bincount(used, minlength=G).max() if used else 0
        best = load if best is None else min(best, load)
    return best


@given(problems(full=False))
def test_semi_matching_is_optimal(problem):
    mask, live = problem.mask, problem.live
    assign = semi_matching(mask, live)
    assert ((assign >= 0) == live).all()
    assert all(mask[e, assign[e]] for e in np.flatnonzero(live))
    assert semi_matching_value(mask, live) == _brute_semi_matching(mask, live)


def test_deterministic():
    rng = np.random.default_rng(7)
    pl = Placement.from_eplb(rng.random(32) * 100, 40, 8)
    problem = DispatchProblem(rng.integers(0, 300, 32), pl, PRESETS["dsv3_fp8_offline"])
    for policy in FAST_POLICIES:
        np.testing.assert_array_equal(solve(problem, policy).x, solve(problem, policy).x)


def test_static_uses_per_source_counts():
    pl = Placement.from_phy2log([0, 1, 0, 1], num_gpus=2)  # both experts on both GPUs
    counts = np.array([[10, 0], [0, 7]])  # source 0 sends expert 0, source 1 sends expert 1
    x = solve(DispatchProblem(counts, pl, CostModel(b=1, beta=1)), "static").x
    np.testing.assert_array_equal(x, [[10, 0], [0, 7]])  # each source keeps its tokens on its own GPU
    with pytest.raises(ValueError, match="source_gpus"):
        solve(DispatchProblem(np.ones((3, 2)), pl, CostModel(b=1, beta=1)), "static")


def test_errors_are_clear():
    pl = Placement.full(3, 2)
    cost = CostModel(b=1, beta=0.1)
    problem = DispatchProblem(np.array([1, 2, 3]), pl, cost)
    with pytest.raises(ValueError, match=r"unknown policy 'lpt'.*valid policies"):
        solve(problem, "lpt")
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['alpha'\].*valid options"):
        solve(problem, "tempo", alpha=3)
    with pytest.raises(ValueError, match="full replication"):
        round_robin(DispatchProblem(np.array([1, 2]), Placement.from_phy2log([0, 1], 2), cost))
    for bad, match in [
        (np.array([1, -2, 3]), "non-negative"),
        (np.array([1, np.nan, 3]), "NaN"),
        (np.array([1.5, 2, 3]), "integer-valued"),
        (np.array([1, 2]), "placement has 3"),
        (np.ones((2, 2, 3)), "1-D or 2-D"),
        (np.array(["a", "b", "c"]), "numeric"),
    ]:
        with pytest.raises(ValueError, match=match):
            DispatchProblem(bad, pl, cost)
    with pytest.raises(ValueError, match="CostModel"):
        DispatchProblem(np.array([1, 2, 3]), pl, {"b": 1})
    with pytest.raises(ValueError, match=r"\[E, D\]"):
        Dispatch(np.zeros((2, 2)), problem)
    with pytest.raises(ValueError, match="conservation"):
        Dispatch(np.zeros((3, 2)), problem, "bad").validate()


def test_dispatch_rejects_tokens_off_replicas():
    pl = Placement.from_phy2log([0, 1], num_gpus=2)
    problem = DispatchProblem(np.array([4, 4]), pl, CostModel(b=1, beta=1))
    with pytest.raises(ValueError, match="without a replica for experts \\[0\\]"):
        Dispatch(np.array([[2.0, 2.0], [0.0, 4.0]]), problem, "bad").validate()


def test_edge_cases_one_gpu_one_expert_all_zero():
    cost = COST_FORMS["tile"]
    for tokens, pl in [
        (np.array([5, 0, 9]), Placement.full(3, 1)),
        (np.array([1000]), Placement.full(1, 4)),
        (np.zeros(4, dtype=int), Placement.full(4, 2)),
    ]:
        problem = DispatchProblem(tokens, pl, cost)
        for policy in FAST_POLICIES + ["round_robin"]:
            solve(problem, policy).validate()
    one = solve(DispatchProblem(np.array([1000]), Placement.full(1, 4), cost), "tempo")
    assert one.makespan < cost.gpu_times(1, 1000, 63).item()  # the lone hot expert gets split
