"""The `tempo-jax` command line and the demo."""

import json
import subprocess
import sys

import numpy as np
import pytest

from solvers import PRESETS
from tempo_jax.cli import main


def test_solve_from_trace_writes_dispatch(tmp_path, capsys):
    out = tmp_path / "d.json"
    rc = main(["solve", "--trace", "flame_moe_290m", "--replicas", "80", "--tokens-per-rank", "64", "--out", str(out)])
    assert rc == 0
    d = json.loads(out.read_text())
    x = np.array(d["x"])
    assert x.shape == (64, 8) and d["makespan"] >= d["lower_bound"] - 1e-9
    assert "makespan" in capsys.readouterr().out


def test_solve_from_files(tmp_path):
    counts = tmp_path / "c.json"
    counts.write_text(json.dumps({"counts": [600, 30, 30, 30, 30, 30, 30]}))
    cost = tmp_path / "cost.json"
    cost.write_text(json.dumps({"b": 15, "beta": 0.1}))
    out = tmp_path / "d.json"
    assert main(["solve", "--counts", str(counts), "--gpus", "2", "--cost-json", str(cost), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["makespan"] == pytest.approx(60)


def test_solve_bad_policy_is_a_clear_error(tmp_path, capsys):
    counts = tmp_path / "c.json"
    counts.write_text("[1, 2, 3]")
    assert main(["solve", "--counts", str(counts), "--gpus", "2", "--policy", "nope"]) == 2
    assert "unknown policy 'nope'" in capsys.readouterr().err


def test_calibrate_csv(tmp_path, capsys):
    true = PRESETS["dsv3_a_gemm_refit"]
    G, n = (a.ravel() for a in np.meshgrid(np.arange(1, 41), np.geomspace(1, 4096, 20), indexing="ij"))
    t = true.gpu_times(G, G * n)
    csv = tmp_path / "samples.csv"
    np.savetxt(csv, np.stack([G, G * n, t], axis=1), delimiter=",", header="G,N,t", comments="")
    out = tmp_path / "fit.json"
    assert main(["calibrate", str(csv), "--out", str(out)]) == 0
    fitted = json.loads(out.read_text())
    assert fitted["b"] == pytest.approx(true.b, rel=1e-3) and fitted["beta"] == pytest.approx(true.beta, rel=1e-3)


def test_python_dash_m_entry_point():
    r = subprocess.run([sys.executable, "-m", "tempo_jax", "--help"], capture_output=True, text=True, check=True)
    assert "demo" in r.stdout and "solve" in r.stdout


@pytest.mark.one_env
def test_demo_runs_and_records_every_policy(tmp_path, capsys):
    from tempo_jax.cli.demo import POLICY_ORDER, run_demo

    record = run_demo(out_dir=tmp_path, milp_time_limit=5.0)
    text = capsys.readouterr().out
    assert "FLAME-MoE-290M" in text and "Synthetic Zipf" in text and "n* = b/β" in text
    rows = {r["policy"]: r for r in record["policies"]}
    assert list(rows) == POLICY_ORDER
    for r in rows.values():
        assert r["vs_opt"] >= 1 - 1e-9  # nobody beats the proven bound
    assert rows["token_lp"]["vs_tempo"] >= 0.99 - 1e-9  # Proposition 1: tempo ≤ token-LP / (1 − τ)
    layer = {r["policy"]: r for r in record["layer"]}
    assert set(layer) == set(POLICY_ORDER[:-1])
    for r in layer.values():  # the central invariant, end to end on 8 devices
        assert r["diff_vs_first"] < 1e-5 and r["diff_vs_dense"] < 1e-4
        assert r["realised"] == pytest.approx(r["planned"], rel=0.05)  # quota mode realises the plan
    assert (tmp_path / "demo_layer.png").exists()
    assert json.loads((tmp_path / "demo.json").read_text())["presets"]["dsv3_fp8_offline"] == pytest.approx(156.4, 0.01)


def test_phase_panel(capsys):
    rc = main(["phase", "--skews", "0,1.2", "--tokens-per-gpu", "16,2048", "--batches", "1", "--workers", "1"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "B=16" in out and "B=2048" in out and ("M " in out or "L " in out)


def test_bench_solver_quick(tmp_path, capsys):
    out = tmp_path / "b.json"
    argv = ["bench", "solver", "--quick", "--milp-time-limit", "0", "--repeats", "1", "--out", str(out)]
    assert main(argv) == 0
    data = json.loads(out.read_text())
    assert data["suites"]["synthetic"]["summary"]["tempo"]["ratio_median"] == 1.0
    assert "timing" in data and "/tempo median" in capsys.readouterr().out


def test_cascade_command_prints_the_mode_table(capsys):
    argv = ["cascade", "--trace", "mooncake_sample", "--requests", "12", "--rate", "5", "--modes", "sync,cascade"]
    assert main([*argv, "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "CascadeEP" in out and "Sync" in out and "OEWF: cuts" in out
    assert main(["cascade", "--placement", "random", "--trace", "mooncake_sample"]) == 2
    assert "unknown placement 'random'" in capsys.readouterr().err


def test_cascade_report_is_what_the_command_prints_and_writes(tmp_path, capsys):
    """`cascade_report` (the command's body as a function): two seeds at a fixed rate give the paired difference of
    the neighbouring modes, the JSON the command writes and the tables it prints; bad modes and seed counts are
    refused naming them."""
    from tempo_jax.sim.cascade import CascadeConfig
    from tempo_jax.sim.cascade.report import MAX_SEEDS, cascade_report

    cfg = CascadeConfig(trace="mooncake_sample", max_requests=40, rate_rps=5.0)
    report = cascade_report(cfg, ("sync", "cascade"), seeds=2, workers=1, progress=False)
    assert report.seeds == (0, 1) and report.capacity_rps is None and set(report.paired) == {"sync-cascade"}
    assert report.payload()["paired_ttft_mean_s"]["sync-cascade"]["n"] == 2
    out = tmp_path / "c.json"
    argv = ["cascade", "--trace", "mooncake_sample", "--requests", "40", "--rate", "5", "--modes", "sync,cascade"]
    assert main([*argv, "--seeds", "2", "--workers", "1", "--out", str(out)]) == 0
    assert json.loads(out.read_text()) == json.loads(json.dumps(report.payload()))
    assert report.tables() in capsys.readouterr().out
    for modes, seeds, match in ((("sync", "fast"), 1, "unknown mode"), (("sync",), MAX_SEEDS + 1, "outside 1")):
        with pytest.raises(ValueError, match=match):
            cascade_report(cfg, modes, seeds=seeds, progress=False)


def test_block_options_give_the_benchmarks_one_moe_block(capsys):
    """`block_options`: the MoE-block options bench_ep and bench_cascade share, with their defaults; an unknown
    preset is refused naming the valid ones."""
    import argparse

    from tempo_jax.cli.args import block_options

    parser = argparse.ArgumentParser()
    block_options(parser)
    got = parser.parse_args(["--experts", "16", "--preset", "qwen3_30b_a3b"])
    assert (got.experts, got.top_k, got.hidden, got.ffn, got.preset) == (16, 6, 256, 128, "qwen3_30b_a3b")
    assert parser.parse_args([]).preset is None
    with pytest.raises(SystemExit):
        parser.parse_args(["--preset", "nope"])
    err = capsys.readouterr().err
    assert "invalid choice: 'nope'" in err and "deepseek_v3" in err
