"""`tempo-jax calibrate --measure` (tempo_jax.runtime.calibrate): the committed CPU profile, the ranking-agreement count
against a known truth, and the command at CI size."""

import json

import numpy as np
import pytest

from solvers import CostModel
from tempo_jax import cli
from tempo_jax.runtime.calibrate import PROFILE_PATH, MeasureConfig, Profile, load_profile, ranking_agreement


class ModelTimedFFN:
    """Stands in for the expert FFN: a rank's "measured" time is ``truth`` on its (G, N)."""

    def __init__(self, truth: CostModel):
        self.truth = truth

    def prepare(self, sizes, offset=0):
        sizes = np.asarray(sizes)
        t = float(self.truth.gpu_times(np.count_nonzero(sizes), sizes.sum()))
        return lambda: t


def test_ranking_agreement_counts_pairs():
    cfg = MeasureConfig(rank_experts=16, rank_tokens=(16, 256), rank_seeds=(0,), rank_repeats=1)
    truth = CostModel(a=5.0, b=15.0, c=5.0, beta=0.1)
    same = ranking_agreement(truth, cfg, ModelTimedFFN(truth))
    assert same["pairs"] > 0 and same["agree"] == same["pairs"] and same["agreement"] == 1.0
    assert same["pairs"] + same["ties"] == 2 * 15  # 6 policies: 15 pairs per batch
    counts_only = CostModel(b=1.0, beta=1e-6)  # (nearly) blind to tokens: misorders the token-bound batch
    blind = ranking_agreement(counts_only, cfg, ModelTimedFFN(truth))
    assert blind["agree"] < 0.5 * blind["pairs"] and blind["model_ties"] > 0


def test_committed_cpu_profile():
    prof = load_profile()
    assert PROFILE_PATH.exists() and prof.meta["backend"] == "cpu" and int(prof.meta["chunk"]) > 0
    assert (prof.N == prof.G * prof.n).all() and (prof.t_us > 0).all()
    assert (prof.t_us <= prof.t_median_us).all() and (prof.t_median_us <= prof.t_max_us).all()
    assert (prof.G == 1).sum() >= 5  # the one-expert curve for notebook 01's Fig. 2
    model, rep = prof.fit()
    assert model.b > 0 and model.beta > 0 and np.isfinite(rep.mean_rel_error)


def test_profile_round_trip(tmp_path):
    a = np.array([1, 2])
    prof = Profile(
        a,
        a * 4,
        a * a * 4,
        a,
        np.array([10.0, 20.0]),
        np.array([11.0, 21.0]),
        np.array([12.0, 25.0]),
        {"backend": "cpu", "hidden": 8},
    )
    back = load_profile(prof.save(tmp_path / "p.csv"))
    np.testing.assert_array_equal(back.N, prof.N)
    np.testing.assert_allclose(back.t_max_us, prof.t_max_us)
    assert back.meta == {"backend": "cpu", "hidden": "8"}
    with pytest.raises(FileNotFoundError, match="calibrate --measure"):
        load_profile(tmp_path / "missing.csv")


@pytest.mark.slow  # profiles a real FFN for ~40 s; `make test-all`
def test_calibrate_measure_cli_quick(tmp_path, capsys):
    report, model, csv = tmp_path / "cal.json", tmp_path / "model.json", tmp_path / "prof.csv"
    rc = cli.main(
        ["calibrate", "--measure", "--quick", "--report", str(report), "--out", str(model), "--profile-csv", str(csv)]
    )
    assert rc == 0
    text = capsys.readouterr().out
    assert "fit (Eq. 1)" in text and "b vs roofline" in text and "ranking agreement (§5.2)" in text
    rep = json.loads(report.read_text())
    assert rep["roofline"]["bandwidth_GBps"] > 0 and rep["roofline"]["b_streaming_bound_us"] > 0
    assert set(rep["bootstrap"]["ci"]) >= {"a", "b", "c", "beta", "n_star"}
    r = rep["ranking"]
    assert r["pairs"] + r["ties"] == len(r["batches"]) * 15 and 0 <= r["agree"] <= r["pairs"]
    assert CostModel.load(model).b == pytest.approx(rep["model"]["b"])
    assert len(load_profile(csv).G) == 3 * 4
    capsys.readouterr()
    assert cli.main(["calibrate"]) == 2  # a usage error: one line on stderr, exit 2
    assert "or --measure" in capsys.readouterr().err
    assert cli.main(["calibrate", "--measure", "x.csv"]) == 2
