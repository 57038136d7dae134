"""`tempo-jax serve` at CI size: the tiny LM (live tables per phase and layer) and the bare layer serving with
live tables from the worker process, the worker killed mid-run, step times with the worker on and off, the report
and the figure."""

import json

import numpy as np
import pytest

from tempo_jax import cli
from tempo_jax.runtime.serve_config import ServeConfig
from tempo_jax.workloads import drifting_stream, recorded_stream


def test_serve_layer_cli_small(tmp_path, capsys):
    rc = cli.main(
        [
            "serve",
            "--model",
            "layer",
            "--steps",
            "12",
            "--tokens-per-rank",
            "256",
            "--experts",
            "16",
            "--top-k",
            "2",
            "--skew",
            "1.5",
            "--every-steps",
            "2",
            "--block",
            "3",
            "--kill-worker-at",
            "5",
            "--rebalance-every",
            "2",
            "--out",
            str(tmp_path),
        ]
    )
    assert rc == 0
    text = capsys.readouterr().out
    assert "step    0 [on ]" in text and "step    3 [off]" in text and "killed the solver worker" in text
    assert "worker on" in text and "on/off =" in text and "modelled makespan, mean over steps" in text
    rep = json.loads((tmp_path / "serve.json").read_text())
    assert (tmp_path / "serve.png").stat().st_size > 10_000
    # the slow timescale: after 2 windows a proposal, whose modelled gain over the steps until the next one pays
    # for its move, so the experts moved (weights and the placement the solver serves)
    moves = rep["replacements"]
    assert len(moves) == 1 and moves[0]["applied"] and moves[0]["moved_slots"] > 0 and "re-placed:" in text
    assert moves[0]["gain_us"] > moves[0]["margin"] * moves[0]["move_us"] > 0
    assert moves[0]["makespan_after_us"] < moves[0]["makespan_before_us"]
    assert moves[0]["bytes_moved"] % (3 * 128 * 128 * 4) == 0 and moves[0]["bytes_moved"] > 0
    assert moves[0]["next_step_ms"] > 0 and rep["metrics"]["placements"]["applied"] == 1
    assert len(rep["steps"]) == 12 and rep["step_ms"]["on"]["n"] + rep["step_ms"]["off"]["n"] == 12 - len(moves)
    assert rep["max_abs_diff_vs_reference"] < 1e-4  # neither the live tables nor the placement change the output
    m = rep["metrics"]
    assert m["worker_lost"]["died"] == 1 and m["restarts"] == 1 and m["errors"] == 0
    assert m["windows"]["published"] >= 1 and rep["publish_steps"]
    w, p = m["windows"], m["pairs"]
    assert w["closed"] == w["published"] + w["empty"] + sum(w["dropped"].values()) + w["in_flight"]
    assert p["in"] == pytest.approx(p["published"] + sum(p["dropped"].values()) + p["pending"])
    # step-driven refresher, only in "on" blocks (steps 0-2, 6-8; every 2nd on-step): the baseline + 3 windows
    assert rep["refresher"]["snapshots"] == 4 and w["closed"] == 3


def test_routing_streams():
    E, K, ids_fn, load = drifting_stream(
        experts=16, top_k=2, skew=1.0, drift=0.5, kappa=500.0, tokens_per_step=64, seed=0
    )
    a, b = ids_fn(0), ids_fn(5)
    assert a.shape == (64, 2) and a.dtype == np.int32 and (a[:, 0] != a[:, 1]).all()
    np.testing.assert_array_equal(ids_fn(0), a)  # reproducible per step
    assert not np.array_equal(a, b) and load.shape == (E,)
    E, K, ids_fn, load = recorded_stream("flame_moe_290m", tokens_per_rank=16, num_ranks=8)
    assert (E, K) == (64, 6) and ids_fn(0).shape == (128, 6) and ids_fn(0).max() < E
    with pytest.raises(ValueError, match="kill_worker_at needs solver_mode='process'"):
        ServeConfig(solver_mode="thread", kill_worker_at=3)
    with pytest.raises(ValueError, match="unknown routing 'zipf'"):
        ServeConfig(routing="zipf")


@pytest.mark.one_env
def test_serve_lm_with_live_tables_in_every_layer(tmp_path, capsys):
    """The tiny LM served: prefill and decode steps, one worker refreshing every (phase, layer)'s tables per
    window, the worker killed mid-run; every layer picks the new tables up."""
    rc = cli.main(
        [
            "serve",
            "--steps",
            "6",
            "--tokens-per-rank",
            "16",
            "--experts",
            "16",
            "--top-k",
            "2",
            "--hidden",
            "32",
            "--ffn",
            "32",
            "--every-steps",
            "2",
            "--block",
            "0",
            "--decode-steps",
            "2",
            "--train-steps",
            "0",
            "--kill-worker-at",
            "3",
            "--rebalance-every",
            "1",
            "--budget-s",
            "60",  # every result is published, however slow a loaded box makes the worker (0.2 s lost some)
            "--out",
            str(tmp_path),
            "--no-figure",
        ]
    )
    assert rc == 0
    text = capsys.readouterr().out
    assert "tiny MoE LM, 2 MoE layers" in text and "prefill" in text and "decode" in text
    rep = json.loads((tmp_path / "serve.json").read_text())
    kinds = [r["kind"] for r in rep["steps"]]
    assert kinds[:4] == ["prefill", "decode", "decode", "prefill"] and len(rep["steps"]) == 6
    assert all(len(r["live_us"]) == 2 for r in rep["steps"])  # one modelled makespan per layer
    assert rep["shape"]["phases"] == ["prefill", "decode"] and set(rep["makespan_by_phase_us"]) == {"prefill", "decode"}
    assert rep["tables_per_refresh"] == 4  # one window per (phase, layer) in every solve
    m = rep["metrics"]
    assert m["worker_lost"]["died"] == 1 and m["windows"]["published"] >= 2 and rep["publish_steps"]
    assert rep["refresh_ms"]["n"] >= 2 and m["errors"] == 0
    moves = rep["replacements"]  # a proposal every window: applied (experts moved live) or dismissed, priced
    assert moves and m["placements"]["applied"] + m["placements"]["dismissed"] == len(moves)
    for mv in moves:  # a move pays for itself: its modelled gain until the next proposal beats its move time
        gain = (mv["makespan_before_us"] - mv["makespan_after_us"]) * 2 * mv["horizon_steps"]  # 2 layers
        assert mv["gain_us"] == pytest.approx(gain) and mv["move_us"] > 0
        assert (mv["gain_us"] > mv["margin"] * mv["move_us"]) == mv["applied"]
    applied = [mv["step"] for mv in moves if mv["applied"]]
    assert all(r["first_after_move"] == (r["step"] - 1 in applied) for r in rep["steps"])
    assert m["pairs"]["in"] == pytest.approx(
        m["pairs"]["published"] + sum(m["pairs"]["dropped"].values()) + m["pairs"]["pending"]
    )


def test_layered_controller_solves_every_layer_per_window():
    from solvers import PRESETS, Placement
    from tempo_jax.runtime import DispatchController

    placements = [Placement.from_eplb(np.random.default_rng(i).random(16) + 0.1, 24, 8) for i in range(3)]
    counts = np.random.default_rng(0).integers(0, 9, (3, 8, 16))
    with DispatchController(placements, PRESETS["dsv3_fp8_offline"]) as ctl:
        tables = ctl.observe(counts)
        assert isinstance(tables, tuple) and len(tables) == 3 and ctl.version == 1
        assert ctl.history[-1]["layers"] == 3 and len(ctl.history[-1]["layer_ms"]) == 3
        for t, p in zip(tables, placements, strict=True):
            assert t.placement_key == p.key and t.table.shape[1:] == p.log2phy.shape
        ctl.observe_counter(np.zeros((3, 8, 16), np.uint32))
        ctl.observe_counter(counts.astype(np.uint32))
        assert ctl.version == 2 and ctl.metrics()["pairs"]["published"] == 2 * counts.sum()
        with pytest.raises(ValueError, match=r"counts must be \[L=3, D=8, E=16\]"):
            ctl.observe(counts[0])
    with pytest.raises(ValueError, match="same D and E"):
        DispatchController([placements[0], Placement.full(16, 4)], PRESETS["dsv3_fp8_offline"])
    with pytest.raises(ValueError, match="solver_processes=2 .* needs solver_mode='process'"):
        DispatchController(placements, PRESETS["dsv3_fp8_offline"], solver_processes=2)


def test_serve_lm_on_a_data_ep_mesh(tmp_path, capsys):
    """``--mesh data=2,ep=4`` (issue 49): two EP groups serve their own tokens (each device ``tokens_per_rank``), the
    controller observes their summed counts, and each step's modelled makespans are the slowest group's."""
    argv = ["serve", "--mesh", "data=2,ep=4", "--steps", "3", "--tokens-per-rank", "16", "--experts", "8"]
    argv += ["--top-k", "2", "--hidden", "32", "--ffn", "32", "--every-steps", "1", "--block", "0"]
    argv += ["--decode-steps", "1", "--train-steps", "0", "--solver-mode", "inline", "--rebalance-every", "none"]
    rc = cli.main([*argv, "--out", str(tmp_path), "--no-figure"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "128 tokens/step on 8 cpu devices ({'data': 2, 'ep': 4, 'tensor': 1}" in text
    rep = json.loads((tmp_path / "serve.json").read_text())
    assert rep["shape"]["D"] == 4 and rep["shape"]["Ng"] == 2 and rep["config"]["mesh"] == "data=2,ep=4"
    assert len(rep["steps"]) == 3 and all(np.isfinite(r["live_us"]).all() for r in rep["steps"])
    assert rep["metrics"]["windows"]["published"] >= 1
    with pytest.raises(ValueError, match=r"ServeConfig\.mesh: 'dp=2' is not axis=size"):
        ServeConfig(mesh="dp=2")
