"""Tests of tempo_jax.workloads: trace loaders (real files and bundled sample), synthetic routing, regimes."""

import csv
import json
import math
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tempo_jax.workloads import (
    TRACES,
    RoutingTrace,
    SyntheticRouting,
    load_flame_moe,
    load_harmoeny,
    load_mixtral,
    load_sample,
    load_switch128,
    load_trace,
    mixed_fraction,
    pair_share,
    regime_stats,
    sample_topk,
    topk_inclusion,
    traces_dir,
    zipf_popularity,
)

# ------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def traces_root(shared_traces):
    if not shared_traces.exists():
        if os.environ.get("CI"):  # CI always has ../shared: a missing copy is a failure there, never a skip
            pytest.fail(f"full recordings not present at {shared_traces}")
        pytest.skip(f"full recordings not present at {shared_traces}")
    return shared_traces


@pytest.fixture(scope="module")
def full(traces_root):
    """Every registered trace loaded from ../shared/traces with the default loader options."""
    return {name: load_trace(name, path=traces_root / spec.relpath) for name, spec in TRACES.items()}


def _assert_distinct_rows(ids):
    if ids.shape[1] > 1:
        assert np.all(np.diff(np.sort(ids, axis=1), axis=1) > 0)


# ---------------------------------------------------------------------------------------------- paths


def test_import_does_not_pull_jax():
    code = "import sys, tempo_jax.workloads; assert 'jax' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_default_traces_dir_is_repo_sibling(shared_traces, monkeypatch):
    monkeypatch.delenv("TEMPO_JAX_TRACES", raising=False)
    assert traces_dir().resolve() == shared_traces.resolve()
    monkeypatch.setenv("TEMPO_JAX_TRACES", "/somewhere/else")
    assert str(traces_dir()) == "/somewhere/else"


@pytest.mark.parametrize("name", sorted(TRACES))
def test_missing_recording_says_what_and_how(name, tmp_path, monkeypatch):
    monkeypatch.setenv("TEMPO_JAX_TRACES", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="TEMPO_JAX_TRACES") as err:
        load_trace(name)
    assert TRACES[name].relpath in str(err.value)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_trace(name, path=tmp_path / "nope")


def test_unknown_names():
    with pytest.raises(ValueError, match="registered traces"):
        load_trace("nope")
    with pytest.raises(ValueError, match="registered traces"):
        load_sample("nope")
    with pytest.raises(ValueError, match="switch-exp128"):
        load_harmoeny("mixtral")


# ------------------------------------------------------------------------------------------ real files


def test_flame_moe(full, traces_root):
    t = full["flame_moe_290m"]
    assert (t.num_experts, t.top_k, t.layers, t.per_token) == (64, 6, tuple(range(2, 10)), True)
    for layer in t.layers:
        ids, w = t.topk_ids[layer], t.topk_weights[layer]
        assert ids.shape == w.shape == (2048, 6) and ids.dtype == np.int64
        assert ids.min() >= 0 and ids.max() < 64
        _assert_distinct_rows(ids)
        assert np.all(w > 0) and np.all(np.diff(w, axis=1) <= 0)  # ordered by score
    # Row 0 of layer 2 straight from the CSV: same 6 experts, same scores.
    with open(traces_root / "flame_moe_290m" / "layer_2.csv") as fh:
        reader = csv.reader(fh)
        next(reader)
        row = np.array(next(reader)[2:], dtype=float)
    assert set(np.flatnonzero(row)) == set(t.topk_ids[2][0].tolist())
    np.testing.assert_allclose(t.topk_weights[2][0], row[t.topk_ids[2][0]], rtol=1e-6)
    sub = load_flame_moe(traces_root / "flame_moe_290m", layers=[3, 5])
    assert sub.layers == (3, 5) and np.array_equal(sub.topk_ids[5], t.topk_ids[5])
    with pytest.raises(ValueError, match=r"available layers: \[2, 3, 4, 5, 6, 7, 8, 9\]"):
        load_flame_moe(traces_root / "flame_moe_290m", layers=[1, 2])


def test_flame_batches(full):
    t = full["flame_moe_290m"]
    B, G = 64, 8
    assert t.num_batches(2, B, G) == 2048 // (B * G) == 4
    all_batches = list(t.batches(2, B, G))
    assert len(all_batches) == 4
    for b, counts in enumerate(all_batches):
        assert counts.shape == (G, 64) and counts.dtype == np.int64
        assert np.all(counts.sum(axis=1) == B * 6)
        np.testing.assert_array_equal(counts, t.batch_counts(2, B, G, b))
        ids = t.batch_topk_ids(2, B, G, b)  # [G, B, K]
        for g in range(G):
            tokens = t.topk_ids[2][b * B * G + g * B : b * B * G + (g + 1) * B]
            np.testing.assert_array_equal(ids[g], tokens)
            np.testing.assert_array_equal(counts[g], np.bincount(tokens.ravel(), minlength=64))
    np.testing.assert_array_equal(sum(all_batches).sum(axis=0), t.expert_load(2))  # 2048 = 4·512: no leftover
    assert t.expert_load(2).sum() == 2048 * 6
    assert t.num_batches(2, 2048, 1) == 1 and t.num_batches(2, 2049, 1) == 0
    assert t.num_tokens(2) == 2048


def test_mixtral(full, traces_root):
    t = full["mixtral_8x7b"]
    assert (t.num_experts, t.top_k, t.layers) == (8, 2, tuple(range(32)))
    lengths = [t.num_tokens(layer) for layer in t.layers]
    assert min(lengths) == 334 and max(lengths) == 338
    with open(traces_root / "mixtral_8x7b" / "humaneval_2_routing.jsonl") as fh:
        recs = [json.loads(line) for line in fh]
    assert sum(lengths) == len(recs)
    first = recs[0]
    assert (first["problem_id"], first["layer"], first["token_idx"]) == (0, 0, 0)
    assert t.topk_ids[0][0].tolist() == first["experts"]
    for layer in t.layers:
        _assert_distinct_rows(t.topk_ids[layer])
        np.testing.assert_allclose(t.topk_weights[layer].sum(axis=1), 1.0, atol=1e-5)
    counts = t.batch_counts(0, 16, 4, 2)
    assert np.all(counts.sum(axis=1) == 32)


def test_harmoeny_switch(full, traces_root):
    t = full["harmoeny_switch128"]
    assert (t.num_experts, t.top_k, t.layers, t.num_source_ranks, t.per_token) == (128, 1, tuple(range(6)), 8, False)
    for layer in t.layers:
        rc = t.rank_counts[layer]
        assert rc.shape == (2, 8, 128) and np.all(rc.sum(axis=2) == 5100)
        np.testing.assert_array_equal(t.recorded_tokens_per_rank(layer), np.full((2, 8), 5100))
    # Exact row of the CSV for rank 3, layer 4, iteration 1.
    with open(traces_root / "harmoeny/raw_trace/switch-exp128/3/moe_layer-4.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert t.rank_counts[4][1, 3].tolist() == json.loads(rows[1]["expert distribution"])
    everything = load_harmoeny(
        "switch-exp128", traces_root / "harmoeny/raw_trace/switch-exp128", include_degenerate=True
    )
    assert everything.layers == tuple(range(12))
    for layer in range(6, 12):
        rc = everything.rank_counts[layer]
        assert np.all(rc.sum(axis=2) == 85) and (rc.sum(axis=(0, 1)) > 0).sum() <= 6
    assert "Degenerate layers [6, 7, 8, 9, 10, 11]" in t.notes


def test_harmoeny_qwen(full):
    t = full["harmoeny_qwen"]
    assert (t.num_experts, t.top_k, t.layers, t.num_source_ranks) == (60, 1, tuple(range(24)), 6)
    for layer in t.layers:
        assert t.rank_counts[layer].shape == (2, 6, 60) and np.all(t.rank_counts[layer].sum(axis=2) == 8192)
    assert t.expert_load(0).sum() == 2 * 6 * 8192


def test_rank_trace_whole_and_sub_batches(full):
    t = full["harmoeny_qwen"]
    assert t.num_batches(3, 8192, 6) == 2
    for it in range(2):
        np.testing.assert_array_equal(t.batch_counts(3, 8192, 6, it), t.rank_counts[3][it])
    B = 1000  # 8 disjoint random sub-batches per iteration, 192 tokens per rank left over
    n = t.num_batches(3, B, 6)
    assert n == 16
    subs = list(t.batches(3, B, 6))
    assert len(subs) == n
    for b in (0, 7, 8, 15):
        np.testing.assert_array_equal(subs[b], t.batch_counts(3, B, 6, b))
    for c in subs:
        assert c.shape == (6, 60) and np.all(c.sum(axis=1) == B)
    for it in range(2):
        part = sum(subs[it * 8 : (it + 1) * 8])
        rec = t.rank_counts[3][it]
        assert np.all(part <= rec) and np.all((rec - part).sum(axis=1) == 192)
    np.testing.assert_array_equal(t.batch_counts(3, B, 6, 5), t.batch_counts(3, B, 6, 5))  # reproducible
    with pytest.raises(ValueError, match="use num_ranks=6"):
        t.batch_counts(3, B, 8)
    with pytest.raises(ValueError, match="per-rank counts only"):
        t.batch_topk_ids(3, B, 6)
    with pytest.raises(ValueError, match="has 0 batches"):
        t.batch_counts(3, 8193, 6)


def test_switch128_npy_is_iteration_zero(full):
    t, h = full["switch128_npy"], full["harmoeny_switch128"]
    assert (t.num_experts, t.top_k, t.layers, t.num_source_ranks) == (128, 1, tuple(range(6)), 8)
    for layer in t.layers:
        assert t.rank_counts[layer].shape == (1, 8, 128)
        np.testing.assert_array_equal(t.rank_counts[layer][0], h.rank_counts[layer][0])
    assert "sorted" in t.notes


def test_switch128_npy_rows_are_sorted_within_rank_blocks(traces_root):
    a = np.load(traces_root / "harmoeny/switch128_token_experts.npy")
    assert a.shape == (40800, 6)
    assert np.all(np.diff(a.reshape(8, 5100, 6), axis=1) >= 0)  # why rows are not tokens
    assert load_switch128(traces_root / "harmoeny/switch128_token_experts.npy").layers == tuple(range(6))


def test_load_mixtral_explicit_path(traces_root):
    t = load_mixtral(traces_root / "mixtral_8x7b/humaneval_2_routing.jsonl")
    assert t.layers == tuple(range(32))


@pytest.mark.parametrize("name", sorted(TRACES))
def test_sample_equals_full_recording(name, full):
    s, f = load_sample(name), full[name]
    assert (s.model, s.num_experts, s.top_k, s.layers, s.notes) == (f.model, f.num_experts, f.top_k, f.layers, f.notes)
    for layer in f.layers:
        if f.per_token:
            np.testing.assert_array_equal(s.topk_ids[layer], f.topk_ids[layer])
        else:
            np.testing.assert_array_equal(s.rank_counts[layer], f.rank_counts[layer])


# --------------------------------------------------------------------------------------------- sample


def test_sample_works_offline(monkeypatch, tmp_path):
    monkeypatch.setenv("TEMPO_JAX_TRACES", str(tmp_path))
    t = load_sample()
    assert t.name == "flame_moe_290m" and t.topk_ids[2].shape == (2048, 6) and t.topk_ids[2].dtype == np.int64
    assert np.all(t.batch_counts(2, 256, 8).sum(axis=1) == 256 * 6)
    assert load_sample("harmoeny_qwen").rank_counts[0].shape == (2, 6, 60)
    assert not t.topk_ids[2].flags.writeable


def test_sample_is_small():
    from tempo_jax.workloads.loaders import SAMPLE_PATH

    assert SAMPLE_PATH.stat().st_size < 200_000


# --------------------------------------------------------------------------------------- trace errors


def _toy_trace():
    ids = {0: np.array([[0, 1], [2, 3], [1, 2], [3, 0], [0, 2], [1, 3]])}
    return RoutingTrace("toy", "toy", num_experts=4, top_k=2, topk_ids=ids)


def test_trace_validation_errors():
    t = _toy_trace()
    with pytest.raises(ValueError, match=r"layer 5 not in trace 'toy'; available layers: \[0\]"):
        t.batch_counts(5, 1, 1)
    with pytest.raises(ValueError, match=r"batch 3 out of range.*has 3 batches.*valid 0..2"):
        t.batch_counts(0, 1, 2, 3)
    with pytest.raises(ValueError, match="batch -1 out of range"):
        t.batch_counts(0, 1, 2, -1)
    with pytest.raises(ValueError, match="has 0 batches"):
        t.batch_counts(0, 7, 1)
    for bad in (0, -3, 1.5, True):
        with pytest.raises(ValueError, match="tokens_per_rank"):
            t.batch_counts(0, bad, 1)
        with pytest.raises(ValueError, match="num_ranks"):
            t.num_batches(0, 1, bad)
    with pytest.raises(ValueError, match="exactly one"):
        RoutingTrace("x", "x", 4, 2)
    with pytest.raises(ValueError, match="outside"):
        RoutingTrace("x", "x", 4, 1, topk_ids={0: np.array([[4]])})
    with pytest.raises(ValueError, match="repeats an expert"):
        RoutingTrace("x", "x", 4, 2, topk_ids={0: np.array([[1, 1]])})
    with pytest.raises(ValueError, match="top_k=5 exceeds"):
        RoutingTrace("x", "x", 4, 5, topk_ids={0: np.zeros((1, 5), int)})
    with pytest.raises(ValueError, match="negative"):
        RoutingTrace("x", "x", 2, 1, rank_counts={0: np.array([[[1, -1]]])})
    with pytest.raises(ValueError, match="must hold integers"):
        RoutingTrace("x", "x", 4, 1, topk_ids={0: np.array([[1.5]])})
    with pytest.raises(ValueError, match="no layer"):
        RoutingTrace("x", "x", 4, 1, topk_ids={})
    with pytest.raises(ValueError, match=r"\[I, Gs, E=2\]"):
        RoutingTrace("x", "x", 2, 1, rank_counts={0: np.ones((1, 2), int)})


def test_toy_trace_counts():
    t = _toy_trace()
    np.testing.assert_array_equal(t.batch_counts(0, 2, 1, 1), [[1, 1, 1, 1]])
    np.testing.assert_array_equal(t.batch_counts(0, 1, 3, 0), [[1, 1, 0, 0], [0, 0, 1, 1], [0, 1, 1, 0]])
    np.testing.assert_array_equal(t.expert_load(0), [3, 3, 3, 3])
    rc = RoutingTrace("r", "r", 3, 2, rank_counts={1: np.array([[[2, 1, 1], [0, 2, 2]]])})
    np.testing.assert_array_equal(rc.batch_counts(1, 2, 2), rc.rank_counts[1][0])
    with pytest.raises(ValueError, match="replayed whole"):
        rc.batch_counts(1, 1, 2)


# ------------------------------------------------------------------------------------------ synthetic


def test_zipf_popularity():
    E, s = 16, 1.2
    p = zipf_popularity(E, s, seed=3)
    assert p.shape == (E,) and math.isclose(p.sum(), 1.0)
    w = np.arange(1, E + 1) ** -s
    np.testing.assert_allclose(np.sort(p)[::-1], w / w.sum())
    perm = np.random.default_rng(3).permutation(E)
    assert np.all(np.diff(p[perm]) < 0)  # perm[r] is the expert of rank r + 1
    assert not np.array_equal(p, zipf_popularity(E, s, seed=4))
    np.testing.assert_array_equal(zipf_popularity(E, 0.0, seed=9), np.full(E, 1 / E))
    assert zipf_popularity(E, 1.5).max() > zipf_popularity(E, 0.5).max()


@given(
    E=st.integers(1, 40),
    k=st.integers(1, 8),
    s=st.floats(0.0, 2.5),
    B=st.integers(1, 50),
    G=st.integers(1, 6),
    step=st.integers(0, 10**6),
)
def test_synthetic_batch_properties(E, k, s, B, G, step):
    K = min(k, E)
    r = SyntheticRouting(E, K, s, kappa=50.0, seed=1)
    counts = r.batch(B, G, step)
    assert counts.shape == (G, E) and counts.dtype == np.int64
    assert np.all(counts.sum(axis=1) == B * K) and counts.min() >= 0
    ids = r.topk_ids(B * G, step)
    assert ids.shape == (B * G, K) and ids.min() >= 0 and ids.max() < E
    _assert_distinct_rows(ids)
    flat = (np.arange(G)[:, None] * E + ids.reshape(G, B * K)).ravel()
    np.testing.assert_array_equal(np.bincount(flat, minlength=G * E).reshape(G, E), counts)  # same draws


def test_synthetic_reproducible_per_step():
    r = SyntheticRouting(32, 4, 1.0)
    np.testing.assert_array_equal(r.batch(64, 4, 7), r.batch(64, 4, 7))
    assert not np.array_equal(r.batch(64, 4, 7), r.batch(64, 4, 8))
    assert len(list(r.batches(8, 2, 3))) == 3
    g = np.random.default_rng(0)
    assert r.batch(8, 2, g).sum() == 64


def test_sample_topk_follows_plackett_luce():
    p = np.array([0.5, 0.3, 0.15, 0.05])
    n = 200_000
    ids = sample_topk(p, n, 2, np.random.default_rng(0))
    emp = np.zeros((4, 4))
    np.add.at(emp, (ids[:, 0], ids[:, 1]), 1)
    theory = p[:, None] * p[None, :] / (1 - p[:, None])
    np.fill_diagonal(theory, 0)
    assert np.abs(emp / n - theory).max() < 5 * np.sqrt(0.25 / n)
    # Skewed p exercises the exact CDF-skipping step.
    q = np.array([0.97, 0.02, 0.009, 0.001])
    ids = sample_topk(q, n, 3, np.random.default_rng(1))
    third = np.bincount(ids[:, 2], minlength=4) / n
    first_two = [(a, b) for a in range(4) for b in range(4) if a != b]
    want = np.zeros(4)
    for a, b in first_two:
        pab = q[a] * q[b] / (1 - q[a])
        for c in set(range(4)) - {a, b}:
            want[c] += pab * q[c] / (1 - q[a] - q[b])
    assert np.abs(third - want).max() < 5 * np.sqrt(0.25 / n)


def test_sample_topk_zero_mass_experts():
    q = np.array([0.0, 0.6, 0.0, 0.4, 0.0])
    ids = sample_topk(q, 20_000, 4, np.random.default_rng(2))
    assert set(ids[:, 0]) == {1, 3} and set(ids[:, 1]) == {1, 3}
    assert set(ids[:, 2]) <= {0, 2, 4} and set(ids[:, 3]) <= {0, 2, 4}
    assert abs(np.mean(ids[:, 0] == 1) - 0.6) < 0.02
    _assert_distinct_rows(ids)
    assert np.array_equal(
        np.sort(sample_topk(np.ones(5), 10, 5, np.random.default_rng(0)), axis=1), np.tile(np.arange(5), (10, 1))
    )


def test_dirichlet_fluctuation_shrinks_with_kappa():
    E = 16
    spreads = []
    for kappa in (20.0, 200.0, 2000.0, 20000.0):
        r = SyntheticRouting(E, 2, 1.0, kappa=kappa)
        q = np.stack([r.batch_popularity(step) for step in range(400)])
        var = q.var(axis=0)
        p = r.popularity
        np.testing.assert_allclose(var.sum(), (p * (1 - p)).sum() / (kappa + 1), rtol=0.25)
        np.testing.assert_allclose(q.mean(axis=0), p, atol=4 * np.sqrt(var.max() / 400) + 1e-12)
        spreads.append(np.abs(q - p).sum(axis=1).mean())
    assert all(a > 2 * b for a, b in zip(spreads, spreads[1:], strict=False))
    r = SyntheticRouting(E, 2, 1.0, kappa=math.inf)
    np.testing.assert_array_equal(r.batch_popularity(0), r.popularity)


def test_synthetic_is_fast():
    r = SyntheticRouting(256, 8, 1.2)
    r.batch(64, 4, 0)
    t0 = time.perf_counter()
    counts = r.batch(2048, 64, 1)
    elapsed = time.perf_counter() - t0
    assert np.all(counts.sum(axis=1) == 2048 * 8)
    assert elapsed < 1.5, f"64 x 2048-token batch took {elapsed:.2f} s"


def test_synthetic_errors():
    for bad in (-0.1, math.nan, math.inf, "1"):
        with pytest.raises(ValueError, match="s must"):
            zipf_popularity(8, bad)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="num_experts"):
            zipf_popularity(bad, 1.0)
    with pytest.raises(ValueError, match="seed"):
        zipf_popularity(8, 1.0, seed=-1)
    with pytest.raises(ValueError, match="top_k=9 exceeds num_experts=8"):
        SyntheticRouting(8, 9, 1.0)
    for bad in (0.0, -1.0, math.nan):
        with pytest.raises(ValueError, match="kappa"):
            SyntheticRouting(8, 2, 1.0, kappa=bad)
    with pytest.raises(ValueError, match="s must"):
        SyntheticRouting(8, 2, -1.0)
    r = SyntheticRouting(8, 2, 1.0)
    with pytest.raises(ValueError, match="tokens_per_rank"):
        r.batch(0, 2, 0)
    with pytest.raises(ValueError, match="num_ranks"):
        r.batch(4, 0, 0)
    with pytest.raises(ValueError, match="Generator or an integer step"):
        r.batch(4, 2, "seed")
    with pytest.raises(ValueError, match="step must be >= 0"):
        r.batch(4, 2, -1)
    with pytest.raises(ValueError, match="non-negative weights"):
        sample_topk(np.array([0.5, -0.1]), 3, 1, np.random.default_rng(0))
    with pytest.raises(ValueError, match="non-negative weights"):
        sample_topk(np.zeros(3), 3, 1, np.random.default_rng(0))
    with pytest.raises(ValueError, match="top_k=4 exceeds"):
        sample_topk(np.ones(3), 3, 4, np.random.default_rng(0))
    with pytest.raises(ValueError, match="Generator"):
        sample_topk(np.ones(3), 3, 1, 0)


# --------------------------------------------------------------------------------------------- regimes


def test_regime_stats_hand_cases():
    st_ = regime_stats(np.array([300, 200, 10, 5, 0, 0]), 100)
    assert (st_.activated, st_.tokens) == (4, 515)
    assert st_.flat_expert_fraction == 0.5 and math.isclose(st_.linear_token_fraction, 500 / 515)
    assert st_.mixed
    per_source = np.array([[100, 150, 10, 0, 0, 0], [200, 50, 0, 5, 0, 0]])
    assert regime_stats(per_source, 100) == st_
    flat = regime_stats([10, 10, 10], 100)  # all flat
    assert (flat.flat_expert_fraction, flat.linear_token_fraction, flat.mixed) == (1.0, 0.0, False)
    linear = regime_stats([500, 100], 100)  # n_e == n* is linear
    assert (linear.flat_expert_fraction, linear.linear_token_fraction, linear.mixed) == (0.0, 1.0, False)
    edge = regime_stats([1, 1, 1, 1, 8, 0], 5)  # 4/5 flat, 8/12 linear tokens
    assert edge.mixed and math.isclose(edge.flat_expert_fraction, 0.8)
    just = regime_stats([100, 100, 100, 100, 1], 100)  # flat fraction exactly 0.2: mixed (>=)
    assert just.flat_expert_fraction == 0.2 and just.mixed
    assert not regime_stats([100, 100, 100, 100, 1], 100, flat_threshold=0.21).mixed
    empty = regime_stats(np.zeros(4, int), 10)
    assert (empty.activated, empty.tokens, empty.flat_expert_fraction, empty.mixed) == (0, 0, 0.0, False)
    floats = regime_stats(np.array([150.5, 3.25]), 100.0)
    assert floats.tokens == 153.75 and floats.flat_expert_fraction == 0.5 and floats.mixed is True
    assert mixed_fraction([[300, 5], [10, 10], [300, 5, 5]], 100) == pytest.approx(2 / 3)


def test_regime_stats_errors():
    with pytest.raises(ValueError, match="negative"):
        regime_stats([1, -1], 10)
    with pytest.raises(ValueError, match="NaN"):
        regime_stats([1.0, math.nan], 10)
    with pytest.raises(ValueError, match="1-D or 2-D"):
        regime_stats(np.ones((2, 2, 2)), 10)
    with pytest.raises(ValueError, match="numeric"):
        regime_stats(["a", "b"], 10)
    for bad in (0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="n_star"):
            regime_stats([1, 2], bad)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        regime_stats([1, 2], 10, flat_threshold=1.5)
    with pytest.raises(ValueError, match="linear_threshold"):
        regime_stats([1, 2], 10, linear_threshold=-0.1)
    with pytest.raises(ValueError, match="at least one batch"):
        mixed_fraction([], 10)


def test_synthetic_skew_is_mixed():
    """TEMPO Fig. 5: Zipf s = 1.2 decode-size batches are mixed (n* ≈ 160, E = 128, K = 8, EP8)."""
    r = SyntheticRouting(128, 8, 1.2, seed=0)
    frac = mixed_fraction(r.batches(128, 8, 8), 160.0)
    assert frac == 1.0


# ---------------------------------------------------------------------------------------------- pair shares
def _brute_force_inclusion(p, K):
    """Inclusion probabilities of K draws without replacement ∝ p, by enumerating ordered draws."""
    import itertools

    p = np.asarray(p, float) / np.sum(p)
    pi = np.zeros(p.size)
    for seq in itertools.permutations(range(p.size), K):
        prob, left = 1.0, 1.0
        for e in seq:
            prob *= p[e] / left
            left -= p[e]
        pi[list(seq)] += prob
    return pi


def test_topk_inclusion_matches_enumeration_and_sums_to_k():
    for p, K in (([0.5, 0.2, 0.15, 0.1, 0.05], 2), ([3, 1, 1, 1, 0.5, 0.2], 3), ([1, 1, 1, 1], 4)):
        np.testing.assert_allclose(topk_inclusion(p, K), _brute_force_inclusion(p, K), atol=1e-7)
    share = pair_share(zipf_popularity(256, 1.5, 0), 8)
    assert share.sum() == pytest.approx(1.0, abs=1e-7) and share.max() < 1 / 8


def test_topk_inclusion_edge_cases():
    # Fewer positive weights than K: those are always drawn, the rest share what is left uniformly.
    np.testing.assert_allclose(topk_inclusion([1.0, 0.0, 0.0, 0.0], 2), [1.0, 1 / 3, 1 / 3, 1 / 3])
    np.testing.assert_allclose(topk_inclusion([2.0, 1.0, 0.0], 1), [2 / 3, 1 / 3, 0.0], atol=1e-7)
    with pytest.raises(ValueError, match="top_k"):
        topk_inclusion([0.5, 0.5], 3)
    with pytest.raises(ValueError, match="non-negative"):
        topk_inclusion([0.5, -0.1], 1)


def test_pair_share_is_what_the_sampler_realises():
    # The numbers: DSv2-Lite s = 1.2 first-draw 0.293 → 0.151 of the pairs; DSv3 s = 1.5 0.402 → 0.124.
    r = SyntheticRouting(64, 6, 1.2, kappa=math.inf)
    assert r.popularity.max() == pytest.approx(0.2925, abs=1e-4) and r.pair_share.max() == pytest.approx(
        0.1515, abs=1e-3
    )
    assert SyntheticRouting(256, 8, 1.5).pair_share.max() == pytest.approx(0.1243, abs=1e-3)
    ids = sample_topk(r.popularity, 200_000, 6, np.random.default_rng(0))
    measured = np.bincount(ids.ravel(), minlength=64) / ids.size
    np.testing.assert_allclose(measured, r.pair_share, atol=5e-4)
    # With Dirichlet fluctuation (κ = 2000) the batches' long-run share stays within a few 1e-3.
    r2 = SyntheticRouting(64, 6, 1.2, kappa=2000.0)
    counts = sum(r2.batch(512, 8, step) for step in range(16)).sum(axis=0)
    np.testing.assert_allclose(counts / counts.sum(), r2.pair_share, atol=6e-3)
