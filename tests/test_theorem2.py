"""Theorem 2 (tempo_jax.sim.tempo.theorem2): A3's additive term, ε, and the tightness probes on a tiny grid."""

import numpy as np
import pytest

from solvers import CostModel, DispatchProblem, Placement, solve
from tempo_jax.sim.tempo.theorem2 import (
    FAMILIES,
    PAPER,
    EpsilonConfig,
    ProbeConfig,
    additive_term,
    epsilon,
    probe_counts,
    run_theorem2,
    theorem2_table,
)


def test_additive_term_and_epsilon_by_hand():
    cost = CostModel(b=15.0, beta=0.1)
    n = np.array([600] + [30] * 6)  # Fig. 1b: Δ = max(15, 60) = 60, LB = max(15·⌈7/2⌉, 0.1·780/2) = 60
    assert additive_term(cost, n) == pytest.approx(60.0)
    eps, token = epsilon(cost, n, 2)
    assert eps == pytest.approx(1.0) and token
    tiles = CostModel(b=8.0, b2=2.0, tile=128, beta=0.01)
    assert additive_term(tiles, np.array([300, 5])) == pytest.approx(8.0 + 2.0 * 2)  # ⌈300/128⌉ − 1 = 2 tiles
    assert additive_term(cost, np.zeros(3)) == 0.0
    # A3 never exceeds LB + Δ (the proof's inequality) on Fig. 1b
    a3 = solve(DispatchProblem(n, Placement.full(7, 2), cost), "round_robin").makespan
    assert a3 <= cost.lower_bound(n, 2) + 60.0


@pytest.mark.parametrize("family", FAMILIES)
def test_probe_counts_carry_every_pair(family):
    n = probe_counts(family, 64, 4, 32, seed=1)
    assert n.dtype == np.int64 and n.min() >= 0 and n.sum() == 32 * 4 * 8
    if family == "single":
        assert np.count_nonzero(n) == 1
    if family == "giant_half":
        assert n.max() == 32 * 4 * 8 // 2
    np.testing.assert_array_equal(n, probe_counts(family, 64, 4, 32, seed=1))  # reproducible


def test_tiny_grid_paper_vs_here():
    eps_cfg = EpsilonConfig(traces=(("flame_moe_290m", 8),), synthetic=((256, 8, 8, 1.2),), max_batches=1)
    probe_cfg = ProbeConfig(
        gpus=(2, 4), experts=(16,), families=("zipf1.2", "giant_gpu", "single"), tokens_per_gpu=(64,), seeds=1
    )
    res = run_theorem2(eps_cfg, probe_cfg, workers=1, progress=False, cache_dir=None)
    assert len(res.probes) == 6 and all(r["theorem_holds"] for r in res.probes)
    for r in res.probes:
        assert r["opt_lower"] <= r["opt_upper"] * (1 + 1e-9)
        assert 0 < r["ratio_low"] <= r["ratio_high"] <= 1 + 1e-9  # M(A3) ≤ OPT + Δ
        assert r["proven"]
    single = [r for r in res.probes if r["family"] == "single"]
    assert all(r["a3_over_opt"] > 1.5 for r in single)  # a whole giant against a split one
    assert {r["source"] for r in res.epsilon} == {"recorded", "synthetic"}
    assert all(r["eps"] > 0 for r in res.epsilon)
    rows = theorem2_table(res)
    assert [r[1] for r in rows[:2]] == [f"{100 * PAPER['eps_median']:.1f}%", f"{100 * PAPER['eps_max']:.1f}%"]
    assert rows[-1][2] == "6/6"


def test_probe_config_rejects_unknown_families():
    with pytest.raises(ValueError, match="families"):
        ProbeConfig(families=("zipf9",))
