"""tempo_fast against the proven MILP optimum on small random instances (TEMPO §4.2, Theorem 2)."""

import numpy as np
import pytest

from solvers import CostModel, DispatchProblem, Placement, solve

COSTS = [
    CostModel(a=5.0, b=15.0, c=3.0, beta=0.1),
    CostModel(a=5.0, b=15.0, b2=5.0, tile=16, c=3.0, beta=0.1),
    CostModel(a=5.0, b=15.0, c=3.0, beta=0.05, c2=10.0, gamma=0.12),
]


def _instances(count: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    for i in range(count):
        E, G = int(rng.integers(3, 10)), int(rng.integers(2, 4))
        if i % 2:
            placement = Placement.full(E, G)
        else:
            spg = -(-E // G) + 1
            phy2log = rng.permutation(np.concatenate([np.arange(E), rng.integers(0, E, G * spg - E)]))
            placement = Placement.from_phy2log(phy2log, G, num_experts=E)
        tokens = np.round(rng.pareto(1.2, E) * rng.choice([5, 40, 200])).astype(int)
        yield DispatchProblem(tokens, placement, COSTS[i % len(COSTS)])


@pytest.fixture(scope="module")
def results():
    rows = []
    for problem in _instances(36):
        opt = solve(problem, "milp", time_limit=20.0)
        assert opt.info["status"] == "optimal"
        rows.append((problem, solve(problem, "tempo"), opt))
    return rows


def test_tempo_within_one_percent_of_opt_on_average(results):
    ratios = np.array([t.makespan / o.makespan for _, t, o in results])
    assert (ratios >= 1 - 1e-9).all()  # nothing beats the proven optimum
    assert ratios.mean() <= 1.01


def test_tempo_never_worse_than_lp_or_a3_beyond_tau(results):
    for problem, tempo, _ in results:
        best = solve(problem, "token_lp").makespan
        if problem.placement.is_full:
            best = min(best, solve(problem, "round_robin").makespan)
        assert tempo.makespan <= best * 1.01 + 1e-9


def test_theorem2_round_robin_against_opt(results):
    for problem, _, opt in results:
        if not problem.placement.is_full:
            continue
        c, n_max = problem.cost, problem.n.max()
        phis = [c.b + (c.b2 or 0.0) * max(np.ceil(n_max / c.tile) - 1, 0), c.beta * n_max]
        if c.gamma is not None:
            phis.append(c.gamma * n_max)
        assert solve(problem, "round_robin").makespan <= opt.makespan + max(phis) + 1e-9
