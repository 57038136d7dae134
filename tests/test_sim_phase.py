"""Phase-diagram simulator (tempo_jax.sim): boundary formula, flip band, tiny sweeps, cache, regime map."""

import dataclasses
import math

import numpy as np
import pytest
from scipy.optimize import brentq

from solvers import PRESETS, DispatchProblem, Placement, gpu_loads, slots_for
from solvers.limits import semi_matching_value
from tempo_jax.sim import PhaseConfig, flip_boundary, run_phase, trace_regime_curve
from tempo_jax.sim.tempo import phase as phase_mod
from tempo_jax.sim.tempo.boundary import (
    b_star_avg,
    b_star_hot,
    effective_experts,
    expected_max,
    flip_band,
    flip_boundary_refined,
    in_band,
    lp_activations,
    metro_imbalance,
)
from tempo_jax.sim.tempo.diagnose import cell_diagnostics, metro_token_ties
from tempo_jax.sim.tempo.flipscan import fine_ladder, run_flip_scan
from tempo_jax.sim.tempo.phase import COLUMNS, column_setup, matching_dispatch
from tempo_jax.sim.tempo.phase_summary import (
    boundary_rows,
    phase_rows,
    phase_values,
    scale_rows,
    scale_values,
    scan_rows,
)
from tempo_jax.sim.tempo.regime_map import regime_curve
from tempo_jax.workloads import RoutingTrace

TINY = PhaseConfig(
    presets=("dsv3_fp8_offline",),
    eps=(8,),
    replications=(1.25,),
    skews=(0.0, 0.9),  # at s = 1.2 and B = 16 METRO and token-LP nearly tie on two batches
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
    assert np.all(np.isfinite(tiny.makespan)) and tiny.makespan.shape == (4, 2, len(COLUMNS))
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
    # Any boundary in [16, 2048] agrees with this coarse grid.
    assert all(r["agree"] and r["agree_ref"] and r["agree_first_draw"] for r in rows)
    values = phase_values(tiny, rows)
    assert values["in_band_dsv3"] == values["in_band_ref_dsv3"] == values["columns_dsv3"] == 2
    table = phase_rows(values, TINY.presets, TINY.replications)
    assert table[0]["here"].startswith("2/2") and {"quantity", "paper", "here"} == set(table[0])
    assert values["min_gain"] >= -TINY.tau / (1 - TINY.tau) - 1e-12


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
    cfg = PhaseConfig(comm_slope=0.10, comm_floor=25.0)
    cost = cfg.cost("dsv3_fp8_offline")
    assert cost.gamma == 0.10 and cost.c2 == 25.0 and cost.b == PRESETS["dsv3_fp8_offline"].b
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

    code = (
        "import sys, tempo_jax.sim, tempo_jax.sim.tempo.phase_summary; assert 'jax' not in sys.modules, 'jax imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------------------------------------- pair shares
def test_placement_and_boundary_use_pair_shares():
    # The hottest DSv2-Lite expert at s = 1.2 has first-draw popularity 0.293 but only ~0.151 of the pairs.
    routing, placement = column_setup("dsv2_lite_offline", 8, 1.25, 1.2, kappa=math.inf, seed=0, placement_draws=0)
    assert routing.popularity.max() == pytest.approx(0.2925, abs=1e-3)
    assert routing.pair_share.max() == pytest.approx(0.1515, abs=1e-3)
    from_share = Placement.from_eplb(routing.pair_share, slots_for(64, 8, 1.25), 8)
    np.testing.assert_array_equal(placement.phy2log, from_share.phy2log)
    hot = int(np.argmax(routing.popularity))
    first_draw = Placement.from_eplb(routing.popularity, slots_for(64, 8, 1.25), 8)
    assert placement.logcnt[hot] < first_draw.logcnt[hot]  # the first-draw load over-replicates it


# ---------------------------------------------------------------------------------------------- refined boundary
def test_expected_max_against_closed_forms():
    # One normal: its mean. Two iid standard normals: 1/sqrt(pi). A cap clips.
    assert expected_max([3.0], [2.0]) == pytest.approx(3.0, abs=1e-4)
    assert expected_max([0.0, 0.0], [1.0, 1.0]) == pytest.approx(1 / math.sqrt(math.pi), abs=1e-4)
    assert expected_max([0.0, 5.0], [1.0, 0.0]) == pytest.approx(5.0, abs=1e-6)
    # E[min(8, X)], X ~ N(10, 1): 8 − E[(8 − X)+] = 8 − (φ(2) − 2·Φ(−2)).
    clipped = 8 - (math.exp(-2) / math.sqrt(2 * math.pi) - 2 * 0.5 * math.erfc(2 / math.sqrt(2)))
    assert expected_max([10.0], [1.0], [8.0]) == pytest.approx(clipped, abs=1e-4)
    rng = np.random.default_rng(0)
    mc = np.max(rng.normal([1.0, 1.2, 0.8], [0.3, 0.1, 0.5], size=(200_000, 3)), axis=1).mean()
    assert expected_max([1.0, 1.2, 0.8], [0.3, 0.1, 0.5]) == pytest.approx(mc, abs=5e-3)
    with pytest.raises(ValueError, match="non-empty"):
        expected_max([], [])


def test_lp_activations_and_metro_imbalance_hand_case():
    # Two GPUs, four experts, no replication: each GPU always holds its two live experts.
    placement = Placement.from_phy2log(np.array([0, 1, 2, 3]), 2)
    share = np.full(4, 0.25)
    assert lp_activations(share, placement, 1, 1e6) == pytest.approx(2.0, abs=1e-3)
    # METRO on the expected batch is balanced here; only the batch fluctuation lifts ρ_M above 1.
    rho = metro_imbalance(share, placement, 1, 1e6, math.inf)
    assert rho == pytest.approx(1.0, abs=1e-3)
    assert metro_imbalance(share, placement, 1, 16, 2000.0) > rho
    with pytest.raises(ValueError, match="share"):
        metro_imbalance(np.ones(3), placement, 1, 16, 2000.0)


def test_refined_boundary_solves_its_equation():
    routing, placement = column_setup("dsv2_lite_offline", 8, 1.25, 0.0, kappa=2000.0, seed=0, placement_draws=256)
    cost = PRESETS["dsv2_lite_offline"]
    ref = flip_boundary_refined(routing.pair_share, placement, cost, routing.top_k)
    # a + b·A_LP = c + β·ρ_M·B·K at the root, and the estimates lie where the fine scan measured them.
    lhs = cost.a + cost.b * ref.lp_activations
    rhs = cost.c + cost.beta * ref.metro_imbalance * ref.b_star * routing.top_k
    assert lhs == pytest.approx(rhs, rel=1e-6)
    assert 9.0 < ref.lp_activations <= 10.0 and 1.05 < ref.metro_imbalance < 1.3
    assert 200 < ref.b_star < 260  # the simulated flip of this column lies in [228, 249]
    paper = flip_boundary(routing.pair_share, placement.replica_mask.sum(axis=1), cost.inflection, 6, 8)
    assert paper.b_star > ref.b_star
    with pytest.raises(ValueError, match="b_min"):
        flip_boundary_refined(routing.pair_share, placement, cost, 6, b_min=10, b_max=5)


def test_fine_ladder():
    assert fine_ladder(64, 128, 4) == (64, 76, 91, 108, 128)
    assert fine_ladder(100, 1000)[-1] <= 1000 and len(fine_ladder(100, 1000)) == 27
    with pytest.raises(ValueError):
        fine_ladder(10, 5)


def test_flip_scan_and_rows():
    cfg = dataclasses.replace(TINY, presets=("dsv2_lite_offline",), skews=(0.0,), tokens_per_gpu=(64, 512), batches=1)
    scan = run_flip_scan(cfg, workers=1, cache_dir=None, progress=False)
    assert scan.data.shape == (2, 1, 5)
    assert list(scan.winner()) == ["M", "L"]
    assert np.all(scan.metro_imbalance() >= 1.0) and np.all(scan.lp_activations() >= 8)
    (row,) = scan_rows(scan)
    assert (row["lo"], row["hi"]) == (64.0, 512.0) and row["flip"] == pytest.approx(math.sqrt(64 * 512))
    assert row["agree_ref"] and row["err_ref"] == pytest.approx(row["b_ref"] / row["flip"] - 1)


# ---------------------------------------------------------------------------------------------- mechanisms
def test_matching_reference_reaches_the_semi_matching_value(tiny):
    routing, placement = column_setup("dsv3_fp8_offline", 8, 1.25, 1.2, kappa=2000.0, seed=0, placement_draws=256)
    problem = DispatchProblem(routing.batch(16, 8, 0), placement, PRESETS["dsv3_fp8_offline"])
    x = matching_dispatch(problem)
    np.testing.assert_allclose(x.sum(axis=1), problem.n)
    acts = gpu_loads(x)[0]
    assert acts.max() == semi_matching_value(placement.replica_mask, problem.n > 0)
    assert acts.sum() == int((problem.n > 0).sum())  # whole experts
    # METRO's greedy never beats the optimum on activations; token ties keep experts whole too.
    xm = metro_token_ties(problem)
    assert (gpu_loads(xm)[0].sum() == acts.sum()) and gpu_loads(xm)[0].max() >= acts.max()
    assert np.all(tiny.gain_vs_matching() <= tiny.gain() + 1e-12)


def test_cell_diagnostics_and_scale_values(tiny):
    d = cell_diagnostics(TINY, tiny.cells[0])
    assert d["matching_acts"] <= min(d["metro_acts"], d["tempo_acts"]) + 1e-9
    assert d["gain"] == pytest.approx(float(tiny.gain()[0]))
    assert d["gain_matching"] <= d["gain"] + 1e-12
    v = scale_values(tiny, tiny)
    assert v["comm_dgain_max"] == 0.0 and v["comm_cells_changed"] == 0
    assert math.isnan(v["scale_mean_s0_ep32"])  # EP32 not run
    assert {r["quantity"] for r in scale_rows(v)} >= {"max gain (any EP, s, B)"}
