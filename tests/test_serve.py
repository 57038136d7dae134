"""`tempo-jax serve` at CI size: the layer serving a drifting stream with live tables from the worker process,
the worker killed mid-run, step times with the worker on and off, the report and the figure."""

import json

import numpy as np
import pytest

from tempo_jax import cli
from tempo_jax.runtime.serve import ServeConfig
from tempo_jax.workloads import drifting_stream, recorded_stream


def test_serve_cli_small(tmp_path, capsys):
    rc = cli.main(["serve", "--steps", "12", "--tokens-per-rank", "16", "--experts", "16", "--top-k", "2",
                   "--every-steps", "2", "--block", "3", "--kill-worker-at", "5", "--out", str(tmp_path)])  # fmt: skip
    assert rc == 0
    text = capsys.readouterr().out
    assert "step    0 [on ]" in text and "step    3 [off]" in text and "killed the solver worker" in text
    assert "worker on" in text and "on/off =" in text and "modelled makespan, mean over steps" in text
    rep = json.loads((tmp_path / "serve.json").read_text())
    assert (tmp_path / "serve.png").stat().st_size > 10_000
    assert len(rep["steps"]) == 12 and rep["step_ms"]["on"]["n"] == 6 and rep["step_ms"]["off"]["n"] == 6
    assert rep["max_abs_diff_vs_reference"] < 1e-4  # the live tables never change the output
    m = rep["metrics"]
    assert m["worker_lost"]["died"] == 1 and m["restarts"] == 1 and m["errors"] == 0
    assert m["windows"]["published"] >= 1 and rep["publish_steps"]
    w, p = m["windows"], m["pairs"]
    assert w["closed"] == w["published"] + w["empty"] + sum(w["dropped"].values()) + w["in_flight"]
    assert p["in"] == pytest.approx(p["published"] + sum(p["dropped"].values()) + p["pending"])
    # step-driven refresher, only in "on" blocks (steps 0-2, 6-8; every 2nd on-step): the baseline + 3 windows
    assert rep["refresher"]["snapshots"] == 4 and w["closed"] == 3


def test_routing_streams():
    E, K, ids_fn, load = drifting_stream(experts=16, top_k=2, skew=1.0, drift=0.5, kappa=500.0, tokens_per_step=64,
                                         seed=0)  # fmt: skip
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
