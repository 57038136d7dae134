"""Phase-diagram simulator (tempo_jax.sim): boundary formula, flip band, tiny sweeps, cache, regime map."""

import dataclasses
import math

import numpy as np
import pytest
from scipy.optimize import brentq

from solvers import PRESETS, slots_for
from tempo_jax.sim import PhaseConfig, flip_boundary, run_phase, trace_regime_curve
from tempo_jax.sim import phase as phase_mod
from tempo_jax.sim.boundary import b_star_avg, b_star_hot, effective_experts, flip_band, in_band
from tempo_jax.sim.regimes import regime_curve
from tempo_jax.sim.summary import boundary_rows, phase_rows
from tempo_jax.workloads import RoutingTrace

TINY = PhaseConfig(
    presets=("dsv3_fp8_offline",),
    eps=(8,),
    replications=(1.25,),
    skews=(0.0, 1.2),
    tokens_per_gpu=(16, 2048),
    batches=2,
)


@pytest.fixture(scope="module")
def tiny():
    return run_phase(TINY, workers=1, cache_dir=None, progress=False)


# ---------------------------------------------------------------------------------------------- boundary
def test_effective_experts_hand_cases():
    # Two experts at p = 1/2: one pair activates each with prob 1/2, two pairs with prob 3/4.
    assert effective_experts([0.5, 0.5], [1, 2], 1) == pytest.approx(0.5 * 1 + 0.5 * 2)
    assert effective_experts([0.5, 0.5], [1, 2], 2) == pytest.approx(0.75 * 3)
    assert effective_experts([0.5, 0.5], [1, 2], 0) == 0.0
    np.testing.assert_allclose(effective_experts([0.5, 0.5], 1, np.array([1, 2])), [1.0, 1.5])


def test_uniform_full_activation_gives_textbook_boundary():
    # Uniform p, every expert activated, r_e = 1: E_eff = E and B*_avg = n*·E/(K·G).
    E, K, G, n_star = 64, 4, 4, 100.0
    p = np.full(E, 1 / E)
    assert effective_experts(p, 1, 1e6) == pytest.approx(E)
    assert b_star_avg(E, n_star, K, G) == pytest.approx(n_star * E / (K * G))  # 400
    assert b_star_hot(E, n_star, K, G, 1 / E) == pytest.approx(n_star * E * E / (K * G * G))  # 6400
    # At B = 400, T = 6400 pairs: (1 − 1/64)^6400 ≈ e^-100, so the fixed point is exactly 400.
    bd = flip_boundary(p, 1, n_star, K, G)
    assert bd.converged and bd.mechanism == "avg"
    assert bd.b_star == pytest.approx(400.0, rel=1e-9)
    assert bd.e_eff == pytest.approx(E)


def test_hot_mechanism_hand_case():
    # n* = 100, E_eff = 10, p1 = 0.5, K = 2, G = 2 → B*_hot = 100·10/(0.5·2·4) = 250.
    assert b_star_hot(10, 100.0, 2, 2, 0.5) == pytest.approx(250.0)
    # Two experts (p = 0.9, 0.1) on 4 GPUs, r = 1: at full activation avg = 50·2/4 = 25, hot = 50·2/(0.9·16).
    bd = flip_boundary([0.9, 0.1], [1, 1], 50.0, 1, 4)
    assert bd.mechanism == "hot" and bd.b_star == pytest.approx(bd.b_hot)
    assert bd.b_star < bd.b_avg


def test_fixed_point_converges_to_root_with_partial_activation():
    # E = 1000 uniform experts, K = G = 1, n* = 2: B = 2·E_eff(B) = 2000·(1 − 0.999^B), root by brentq.
    E = 1000
    p = np.full(E, 1 / E)
    bd = flip_boundary(p, 1, 2.0, 1, 1)
    root = brentq(lambda b: 2000 * (1 - (1 - 1 / E) ** b) - b, 1.0, 2000.0, xtol=1e-12)
    assert bd.converged
    assert bd.b_star == pytest.approx(root, rel=1e-6)
    assert 0 < bd.e_eff < E  # partial activation at the fixed point
    assert bd.b_star == pytest.approx(2 * bd.e_eff, rel=1e-6)


def test_flip_band_definition():
    bs = [16, 32, 64, 128]
    assert flip_band(bs, list("MMLL")) == (32.0, 64.0)
    assert flip_band(bs, list("MLME")) == (64.0, 128.0)  # last M, then the first compute win after it
    assert flip_band(bs, list("LLEE")) == (0.0, 16.0)  # the flip lies below the grid
    assert flip_band(bs, list("MMMM")) == (128.0, math.inf)  # above the grid
    assert in_band(40.0, (32.0, 64.0)) and in_band(32.0, (32.0, 64.0)) and not in_band(65.0, (32.0, 64.0))


# ---------------------------------------------------------------------------------------------- sweep
def test_tempo_never_loses_by_more_than_tau(tiny):
    tau = TINY.tau
    assert np.all(np.isfinite(tiny.makespan)) and tiny.makespan.shape == (4, 2, 5)
    # Per batch, against every fixed policy (static, EPLB-even, token-LP, METRO).
    worst = tiny.worst_ratio()
    assert np.all(worst <= 1 / (1 - tau) + 1e-12), [r for r in tiny.rows() if r["worst_ratio"] > 1 / (1 - tau)]
    assert np.all(tiny.gain() >= -tau / (1 - tau) - 1e-12)


def test_metro_wins_small_batches_token_balance_wins_large(tiny):
    win = tiny.winner()
    for s in TINY.skews:
        col = win[tiny.mask(skew=s)]
        assert col[0] == "M", (s, col)
        assert col[-1] in ("L", "E"), (s, col)
    rows = boundary_rows(tiny)
    assert [r["lo"] for r in rows] == [16.0, 16.0] and [r["hi"] for r in rows] == [2048.0, 2048.0]
    assert all(r["agree"] for r in rows)  # any B* in [16, 2048] agrees with this coarse grid
    table = phase_rows(tiny, rows)
    assert table[0][2] == "2/2"


def test_cache_round_trip(tmp_path, monkeypatch):
    cfg = dataclasses.replace(TINY, skews=(0.6,), tokens_per_gpu=(64,), batches=1)
    first = run_phase(cfg, workers=1, cache_dir=tmp_path, progress=False)
    assert not first.from_cache and any(tmp_path.rglob("output.pkl"))

    def boom(*args, **kwargs):
        raise AssertionError("solved again instead of loading the cache")

    monkeypatch.setattr(phase_mod, "_solve_cell", boom)
    again = run_phase(cfg, workers=2, cache_dir=tmp_path, progress=False)  # workers: same key
    assert again.from_cache
    np.testing.assert_array_equal(again.makespan, first.makespan)
    np.testing.assert_array_equal(again.winner(), first.winner())
    assert again.cells == first.cells
    with pytest.raises(AssertionError, match="solved again"):  # another grid is another key
        run_phase(dataclasses.replace(cfg, seed=1), workers=1, cache_dir=tmp_path, progress=False)


def test_process_pool_matches_in_process():
    cfg = dataclasses.replace(TINY, presets=("dsv2_lite_offline",), skews=(0.6,), tokens_per_gpu=(32, 256))
    serial = run_phase(cfg, workers=1, cache_dir=None, progress=False)
    pooled = run_phase(cfg, workers=2, cache_dir=None, progress=False)
    np.testing.assert_array_equal(serial.makespan, pooled.makespan)


def test_config_validation_and_comm_model():
    with pytest.raises(ValueError, match="unknown presets"):
        PhaseConfig(presets=("nope",))
    with pytest.raises(ValueError, match="ascending"):
        PhaseConfig(tokens_per_gpu=(64, 16))
    cfg = PhaseConfig(comm_slope=0.0037)
    cost = cfg.cost("dsv3_fp8_offline")
    assert cost.gamma == 0.0037 and cost.c2 == 0.0 and cost.b == PRESETS["dsv3_fp8_offline"].b
    assert PhaseConfig().cost("dsv3_fp8_offline").gamma is None
    assert slots_for(256, 64, 1.25) == 320 and slots_for(128, 64, 1.25) == 192


# ---------------------------------------------------------------------------------------------- regimes
def test_regime_curve_on_hand_made_counts():
    mixed = np.array([20, 1, 1, 1, 1])  # 4/5 experts flat, 20/24 pairs linear (n* = 10)
    linear_only = np.array([20, 20, 0, 0, 0])  # no flat expert
    curve = regime_curve(lambda B: [mixed, linear_only] if B == 8 else [], [8, 16], 10.0, num_ranks=1, label="hand")
    assert curve.mixed[0] == pytest.approx(0.5)
    assert curve.flat_experts[0] == pytest.approx(0.4)
    assert curve.linear_tokens[0] == pytest.approx((20 / 24 + 1.0) / 2)
    assert curve.num_batches.tolist() == [2, 0] and math.isnan(curve.mixed[1])


def test_trace_regime_curve_on_hand_made_trace():
    counts = np.array([[[6, 1, 1, 0], [4, 0, 1, 3]]])  # [I=1, S=2, E=4], 8 tokens per rank, top-1
    trace = RoutingTrace(name="toy", model="toy", num_experts=4, top_k=1, rank_counts={0: counts})
    # Totals [10, 1, 2, 3], n* = 5: 3/4 experts flat, 10/16 pairs linear → mixed.
    curve = trace_regime_curve(trace, [8, 16], n_star=5.0)
    assert curve.num_ranks == 2
    assert curve.mixed[0] == 1.0 and curve.num_batches.tolist() == [1, 0]
    assert curve.flat_experts[0] == pytest.approx(0.75) and curve.linear_tokens[0] == pytest.approx(10 / 16)


def test_simulators_do_not_import_jax():
    import subprocess
    import sys

    code = "import sys, tempo_jax.sim, tempo_jax.sim.summary; assert 'jax' not in sys.modules, 'jax imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
