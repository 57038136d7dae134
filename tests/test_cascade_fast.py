"""The CascadeEP simulator's fast timeline (equal to the scalar reference), its inputs and cache, seeds and CIs,
and the dask backend of the job runner."""

import collections
import dataclasses
import json

import distributed
import numpy as np
import pytest

from tempo_jax.cli import main
from tempo_jax.sim.cascade import CascadeConfig, StepModel, cascade_trace, run_cascade, run_cascade_seeds
from tempo_jax.sim.cascade.attention_truth import attention_truth
from tempo_jax.sim.cascade.serving import StepBatch
from tempo_jax.sim.cascade.summary import SEED_FIGURES, seed_summary
from tempo_jax.sim.cascade.vocabulary import LAYER_MODES
from tempo_jax.sim.runner import bootstrap_ci, run_jobs
from tempo_jax.workloads.requests import MOONCAKE_SAMPLE_PATH

RTOL = 1e-9


def _batches(seed: int, D: int = 8) -> tuple[StepBatch, ...]:
    """A random step: 0–3 chunks per replica (idle replicas included), new tokens and cached prefixes drawn."""
    rng = np.random.default_rng(seed)
    out = []
    for d in range(D):
        m = int(rng.integers(0, 4))
        q, P = rng.integers(1, 6000, m), rng.integers(0, 30_000, m)
        out.append(StepBatch(replica=d, request_ids=np.arange(m), q=q, P=P, I=P + q))
    return tuple(out)


def _both(cfg: CascadeConfig, mode: str, seed: int):
    fast, ref = StepModel(cfg, mode), StepModel(dataclasses.replace(cfg, timeline="reference"), mode)
    fast.steps = ref.steps = seed
    b = _batches(seed)
    return fast(b)[1], ref(b)[1]


def _assert_same(a, b):
    np.testing.assert_allclose(a.layer_us, b.layer_us, rtol=RTOL)
    np.testing.assert_allclose(a.base_us, b.base_us, rtol=RTOL)
    outcomes = ("oewf_moves", "oewf_refused", "oewf_abandoned", "oewf_dropped", "oewf_longer")
    assert [getattr(a, k) for k in outcomes] == [getattr(b, k) for k in outcomes]
    assert a.gap_us == pytest.approx(b.gap_us, rel=RTOL, abs=1e-6)
    assert a.ffn_kernel_us == pytest.approx(b.ffn_kernel_us, rel=RTOL)


LINK_LAUNCH = [
    ("contention", "reactive"),
    ("contention", "planned"),
    ("contention", "layer"),
    ("fifo", "reactive"),
    ("paper", "reactive"),
    ("paper", "planned"),
]


@pytest.mark.parametrize("links, launch", LINK_LAUNCH)
def test_fast_timeline_equals_the_reference_on_random_steps(links, launch):
    cfg = CascadeConfig(trace="mooncake_sample", links=links, launch=launch)
    for mode in LAYER_MODES:
        _assert_same(*_both(cfg, mode, seed=len(mode)))


def test_app_c_commit_readings_place_a_kernel_where_the_text_says():
    """App. C's two readings on one helper (own kernels 0–10, 12–20, 30–40 µs; weights ready at 5): "first" takes
    the first idle interval from the arrival or abandons; "any" takes the earliest interval that holds the kernel."""
    from tempo_jax.sim.cascade.reference_timeline import protected_start

    K = collections.namedtuple("K", "start_us end_us")
    own = [K(0.0, 10.0), K(12.0, 20.0), K(30.0, 40.0)]
    assert protected_start(own, 5.0, 2.0) == 10.0 == protected_start(own, 5.0, 2.0, "any")
    assert protected_start(own, 5.0, 5.0) is None and protected_start(own, 5.0, 5.0, "any") == 20.0
    assert protected_start(own, 5.0, 15.0, "any") == 40.0 and protected_start(own, 41.0, 15.0) == 41.0


@pytest.mark.parametrize("launch", ["reactive", "planned"])
def test_fast_timeline_equals_the_reference_under_either_commit_reading(launch):
    """``CascadeConfig(commit="any")``: both timelines agree under it too, step by step, and it commits moves the
    default reading abandons at commit ("any" abandons none; a move whose weights come late is dropped under both)."""
    abandoned = {}
    for commit in ("first", "any"):
        cfg = CascadeConfig(trace="mooncake_sample", launch=launch, commit=commit, routing="zipf", skew=1.2)
        abandoned[commit] = 0
        for seed in range(6):
            fast, ref = _both(cfg, "cascade", seed)
            _assert_same(fast, ref)
            abandoned[commit] += fast.oewf_abandoned
    assert abandoned["any"] == 0 < abandoned["first"], abandoned
    with pytest.raises(ValueError, match="commit='any' reads App. C's commit on the helper's GPU"):
        CascadeConfig(trace="mooncake_sample", links="paper", commit="any")  # the paper's links commit every move


@pytest.mark.slow
@pytest.mark.parametrize("estimates", ["paper", "exact"])
@pytest.mark.parametrize("links", ["contention", "fifo", "paper"])
def test_fast_timeline_equals_the_reference_on_more_steps(links, estimates):
    cfg = CascadeConfig(trace="mooncake_sample", links=links, estimates=estimates, routing="zipf", skew=1.2)
    for seed in range(4):
        for mode in LAYER_MODES:
            _assert_same(*_both(cfg, mode, seed))


def _served_equal(cfg: CascadeConfig, modes):
    fast = run_cascade(cfg, modes, workers=1, cache_dir=None, progress=False)
    ref = run_cascade(dataclasses.replace(cfg, timeline="reference"), modes, workers=1, cache_dir=None, progress=False)
    for m in modes:
        np.testing.assert_allclose(fast[m].layer_us, ref[m].layer_us, rtol=RTOL)
        np.testing.assert_allclose(fast[m].prefill.ttft_s, ref[m].prefill.ttft_s, rtol=RTOL)
    return fast


def test_fast_timeline_serves_the_bundled_sample_like_the_reference():
    runs = _served_equal(CascadeConfig(trace="mooncake_sample", max_requests=12, rate_rps=6.0), ("sync", "cascade"))
    assert runs["cascade"].summary()["oewf_moves"] > 0


@pytest.mark.slow
def test_fast_timeline_serves_the_whole_bundled_sample_like_the_reference():
    _served_equal(CascadeConfig(trace="mooncake_sample", max_requests=None), LAYER_MODES)


# ----------------------------------------------------------------------------------------------- inputs, cache
def _trace_file(tmp_path, lines: int, name="t.jsonl"):
    f = tmp_path / name
    f.write_bytes(b"".join(MOONCAKE_SAMPLE_PATH.read_bytes().splitlines(keepends=True)[:lines]))
    return f


def test_a_trace_path_serves_and_its_content_keys_the_cache(tmp_path):
    f = _trace_file(tmp_path, 12)
    cfg = CascadeConfig(trace=str(f), max_requests=None, rate_rps=4.0)
    assert len(cascade_trace(cfg)) == 12
    cache = tmp_path / "cache"
    a = run_cascade(cfg, ("sync",), workers=1, cache_dir=cache, progress=False)["sync"]
    # Same path, different content (one request less): the cache must not answer with the old run.
    _trace_file(tmp_path, 11)
    b = run_cascade(cfg, ("sync",), workers=1, cache_dir=cache, progress=False)["sync"]
    assert a.prefill.num_requests == 12 and b.prefill.num_requests == 11


def test_a_missing_or_bad_trace_is_an_error_never_a_fallback(tmp_path, monkeypatch):
    monkeypatch.setenv("TEMPO_JAX_TRACES", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"mooncake/conversation_trace\.jsonl.*trace='mooncake_sample'"):
        cascade_trace(CascadeConfig(trace="mooncake"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}\n{"timestamp": 1}\n')
    with pytest.raises(ValueError, match=rf"{bad}:2: missing key\(s\)"):
        cascade_trace(CascadeConfig(trace=str(bad), max_requests=None))
    with pytest.raises(ValueError, match="neither one of"):
        CascadeConfig(trace=str(tmp_path / "nope.jsonl"))


# ----------------------------------------------------------------------------------------------- attention
def test_attention_truth_has_layer_classes_and_the_fit_is_not_the_truth():
    t = attention_truth("deepseek_v4_flash", "b200", 8, None, 0.05)
    assert t.classes == 2 and t.fitted[0] != t.fitted[1]  # CSA / HCA layers fitted separately (App. B)
    assert attention_truth("glm_5_3", "b200", 8, 2048, 0.05).classes == 1
    Q, Pi, m = np.array([4096.0, 16_000.0]), np.array([3e7, 4e8]), np.array([1.0, 12.0])
    truth, est = t.mean_us(Q, Pi, m), t.estimate_us(Q, Pi)
    assert truth.shape == est.shape == (2, 2) and not np.allclose(truth, est, rtol=1e-3)
    assert all(0.5 < r.accuracy < 1.0 for r in t.reports)  # an output of the fit, not an input
    model = StepModel(CascadeConfig(trace="mooncake_sample"), "sync")
    att, att_est, _ = model.attention_us(_batches(1), np.random.default_rng(0))
    assert att.shape == (43, 8) and not np.allclose(att[0], att[2])  # step noise differs per layer


# ----------------------------------------------------------------------------------------------- statistics
def test_bootstrap_ci_brackets_the_mean_and_is_reproducible():
    v = [1.0, 2.0, 3.0, 4.0, 10.0]
    lo, hi = bootstrap_ci(v)
    assert lo < np.mean(v) < hi and (lo, hi) == bootstrap_ci(v) and lo >= 1.0 and hi <= 10.0
    assert bootstrap_ci([2.5]) == (2.5, 2.5)
    with pytest.raises(ValueError, match="non-empty"):
        bootstrap_ci([])


def test_seeds_and_the_cli_json(tmp_path, capsys):
    f = _trace_file(tmp_path, 12)
    cfg = CascadeConfig(trace=str(f), max_requests=None, rate_rps=4.0)
    by_seed = run_cascade_seeds(cfg, ("sync", "cascade"), seeds=(0, 1), workers=1, cache_dir=None, progress=False)
    summ = seed_summary(by_seed)
    for m in ("sync", "cascade"):
        fig = summ[m]["ttft_mean_s"]
        assert fig["per_seed"] == [by_seed[s][m].prefill.ttft_mean_s for s in (0, 1)]
        assert fig["ci95"][0] <= fig["value"] <= fig["ci95"][1]
    out = tmp_path / "o.json"
    argv = [
        "cascade",
        "--trace",
        str(f),
        "--requests",
        "none",
        "--rate",
        "4",
        "--seeds",
        "2",
        "--modes",
        "sync,cascade",
        "--workers",
        "1",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    data = json.loads(out.read_text())
    assert data["config"]["trace"] == str(f) and data["seeds"] == [0, 1]
    assert set(data["modes"]) == {"sync", "cascade"}
    for m, figs in data["modes"].items():
        assert set(figs) == set(SEED_FIGURES)
        for k, v in figs.items():
            assert set(v) == {"value", "ci95"} and v["value"] == pytest.approx(summ[m][k]["value"])
    assert "CascadeEP" in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------- dask
def _square(x):
    return x * x


def test_dask_backend_on_a_local_cluster_equals_the_local_run():
    cfg = CascadeConfig(trace="mooncake_sample", max_requests=12, rate_rps=6.0)
    local = run_cascade(cfg, ("sync", "cascade"), workers=1, cache_dir=None, progress=False)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as lc:
        with distributed.Client(lc):
            assert run_jobs(_square, [(i,) for i in range(5)], workers=2, backend="dask", progress=False) == [
                0,
                1,
                4,
                9,
                16,
            ]
            remote = run_cascade(cfg, ("sync", "cascade"), workers=2, cache_dir=None, progress=False, backend="dask")
    for m in ("sync", "cascade"):
        np.testing.assert_array_equal(local[m].layer_us, remote[m].layer_us)
        np.testing.assert_array_equal(local[m].prefill.ttft_s, remote[m].prefill.ttft_s)


def test_dask_backend_without_a_cluster_says_how_to_start_one(monkeypatch):
    monkeypatch.delenv("TEMPO_JAX_DASK_SCHEDULER", raising=False)
    with pytest.raises(ValueError, match="no dask.distributed client"):
        run_jobs(_square, [(1,), (2,)], workers=2, backend="dask", progress=False)
    with pytest.raises(ValueError, match="unknown backend 'ray'"):
        run_jobs(_square, [(1,)], backend="ray", progress=False)
