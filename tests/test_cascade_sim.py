"""CascadeEP prefill simulator (`tempo_jax.sim.cascade`): costs, layer timelines, runs."""

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from solvers import LaunchGroup, launch_groups
from tempo_jax.sim.cascade import CascadeConfig, StepModel, run_cascade, step_batches
from tempo_jax.sim.cascade.costs import MODELS, prefill_costs
from tempo_jax.sim.cascade.reference_timeline import LayerInputs, layer_timeline, protected_start
from tempo_jax.sim.cascade.summary import ablation_rows, layer_example, oewf_rows
from tempo_jax.sim.cascade.vocabulary import HELPER_STREAM_EFFICIENCY, LAYER_MODES

COSTS = prefill_costs()
D, E = 8, 256


def _inputs(seed: int, *, noise: float = 0.0, skew: float = 0.5, oewf: bool = True) -> LayerInputs:
    """A random layer: replicas with 0–16k new tokens, attention ∝ load (± imbalance), Dirichlet routing."""
    rng = np.random.default_rng(seed)
    Q = rng.integers(0, 16_384, D)
    att = COSTS.attention.predict(Q, Q * rng.uniform(0, 4000, D)) * rng.uniform(0.5, 1.5, D)
    p = rng.dirichlet(np.full(E, skew))
    counts = np.stack([rng.multinomial(int(q) * 6, p) for q in Q]).astype(float)
    split = np.zeros((E, D))
    split[np.arange(E), np.arange(E) // (E // D)] = 1
    pairs = counts[:, None, :] * split.T[None]
    sent = pairs.sum(axis=2)
    dispatch = COSTS.exchange_us((sent * (1 - np.eye(D))).sum(axis=1), COSTS.dispatch_bytes_per_pair)
    est = att * (1 + noise * rng.standard_normal(D)).clip(0.1) if noise else None
    return LayerInputs(attention_us=att, dispatch_us=dispatch, pairs=pairs, attention_est_us=est, oewf=oewf)


# ----------------------------------------------------------------------------------------------- costs
def test_costs_reproduce_the_fig4_calibration_and_scale_with_the_model():
    assert COSTS.threshold == 28_672  # the one calibrated fact: θ(ρ = 0.9) of V4-Flash EP8 on B200
    F = COSTS.curve
    assert float(F.ffn_time(0)) == 0
    # F(N) = t_fix + N / P on the grid: affine, subadditive, monotone.
    n = np.array([1024.0, 4096.0, 65536.0])
    np.testing.assert_allclose(F.ffn_time(n), COSTS.fixed_us + n / COSTS.peak_tokens_per_us, rtol=1e-9)
    assert float(F.ffn_time(8192)) < 2 * float(F.ffn_time(4096))
    pro = prefill_costs("deepseek_v4_pro")
    assert pro.expert_bytes > COSTS.expert_bytes and pro.peak_tokens_per_us < COSTS.peak_tokens_per_us
    for name, total in {"deepseek_v4_flash": 284e9, "deepseek_v4_pro": 1.6e12, "glm_5_3": 753e9}.items():
        m = MODELS[name]  # routed experts hold 90–100% of Table 1's total parameters
        assert 0.9 < m.layers * m.experts * m.expert_params / total <= 1.01


def test_costs_reject_bad_input():
    with pytest.raises(ValueError, match="unknown model 'nope'"):
        prefill_costs("nope")
    with pytest.raises(ValueError, match="do not split evenly"):
        prefill_costs(num_ranks=3)


# ----------------------------------------------------------------------------------------------- one layer
PAPER = {"links": "paper", "launch": "planned"}


@given(seed=st.integers(0, 10_000), skew=st.sampled_from([0.1, 0.5, 2.0]))
def test_modes_are_ordered_on_every_layer_under_exact_estimates(seed, skew):
    inp = _inputs(seed, skew=skew)
    ends = [layer_timeline(inp, COSTS, m, guard=True, **PAPER).end_us for m in LAYER_MODES]
    assert all(a >= b - 1e-6 for a, b in zip(ends, ends[1:], strict=False)), dict(zip(LAYER_MODES, ends, strict=True))


@given(seed=st.integers(0, 10_000))
def test_oewf_never_lengthens_its_own_base_plan_under_paper_links_and_conserves_tokens(seed):
    inp = _inputs(seed)
    for guard, links in ((True, "paper"), (False, "paper"), (False, "contention")):
        r = layer_timeline(inp, COSTS, "cascade", guard=guard, links=links, launch="planned")
        if links == "paper":  # free fetches and helper work: Eq. 6 on exact estimates cannot lose
            assert r.end_us <= r.base_end_us + 1e-6
        computed = sum(k.tokens for ks in r.kernels for k in ks) + sum(s.tokens for s in r.side)
        assert computed == pytest.approx(inp.pairs.sum(), rel=1e-12)  # every routed pair computed exactly once
        assert len(r.side) + r.abandoned + r.dropped == len(r.accepted)
        # every helper that finished dispatch while a replica was predicted in attention decided once
        decided = int((r.ready_us < inp.attention_est_us.max()).sum())
        assert r.refused + len(r.accepted) == decided, (links, r.refused, len(r.accepted), decided)
        for s in r.side:  # side kernels run on a helper after its weights arrived, on its own tokens
            assert s.start_us > r.ready_us[s.rank] and s.end_us > s.start_us and s.rank != s.donor


def test_contention_charges_helper_work_and_a_commit_never_delays_the_helpers_own_kernels():
    """Under contention the helper's GPU runs the reassigned kernel at F(N) / 0.973, not for free; App. C commits it
    only in a protected interval, so a helper that is no donor runs its own kernels exactly as without OEWF (the
    old rule queued the reassigned kernel ahead of them), and moves without such an interval are abandoned."""
    sides = abandoned = 0
    for seed in range(12):
        inp = _inputs(seed)
        base = layer_timeline(dataclasses.replace(inp, oewf=False), COSTS, "cascade")
        cont = layer_timeline(inp, COSTS, "cascade", links="contention")
        donors = {s.donor for s in cont.side}
        for s in cont.side:
            want = float(COSTS.curve.ffn_time(s.tokens)) / HELPER_STREAM_EFFICIENCY
            assert s.end_us - s.start_us == pytest.approx(want, rel=1e-12)
            assert all(k.end_us <= s.start_us or k.start_us >= s.end_us for k in cont.kernels[s.rank])
            if s.rank not in donors:
                assert cont.kernels[s.rank] == base.kernels[s.rank]
            sides += 1
        abandoned += cont.abandoned
    assert sides > 5 and abandoned > 0


def test_a_reassigned_kernel_commits_only_in_a_protected_interval():
    """`protected_start`: the first idle interval from the weights' arrival (after the kernel running then), up to
    the next own kernel; None when the kernel does not fit there, even if a later gap would hold it."""
    own = tuple(
        LaunchGroup(sources=(0,), tokens=1.0, ready_us=s, start_us=s, end_us=e) for s, e in ((10, 20), (25, 40))
    )
    assert protected_start(own, 0.0, 10.0) == 0.0  # before the first kernel, ends exactly at its start
    assert protected_start(own, 0.0, 10.5) is None
    assert protected_start(own, 12.0, 5.0) == 20.0  # after the running kernel, fits the 5 µs gap
    assert protected_start(own, 12.0, 6.0) is None  # would delay the kernel at 25 (the gap after 40 is not taken)
    assert protected_start(own, 30.0, 100.0) == 40.0  # after the last kernel: nothing to delay
    assert protected_start((), 7.0, 1.0) == 7.0


def test_contended_ports_serialise_transfers():
    """Two sources dispatch at once to one destination: its receive port carries one chunk after the other."""
    D2 = 8
    pairs = np.zeros((D2, D2, 256))
    pairs[1, 0, 0] = pairs[2, 0, 0] = 30_000.0  # sources 1 and 2 each send 30,000 pairs to rank 0
    att = np.full(D2, 1000.0)
    disp = COSTS.exchange_us((pairs.sum(axis=2) * (1 - np.eye(D2))).sum(axis=1), COSTS.dispatch_bytes_per_pair)
    inp = LayerInputs(attention_us=att, dispatch_us=disp, pairs=pairs, oewf=False)
    hw = COSTS.hardware
    one = 30_000.0 * COSTS.dispatch_bytes_per_pair / hw.link_bytes_per_us
    paper = layer_timeline(inp, COSTS, "sync", links="paper")
    cont = layer_timeline(inp, COSTS, "sync", links="contention")
    assert paper.arrival_us[1, 0] == paper.arrival_us[2, 0] == pytest.approx(1000.0 + hw.link_latency_us + one)
    assert cont.arrival_us[1, 0] == pytest.approx(1000.0 + hw.link_latency_us + one)
    assert cont.arrival_us[2, 0] == pytest.approx(1000.0 + hw.link_latency_us + 2 * one)  # queued behind source 1
    assert cont.end_us > paper.end_us


def test_unguarded_modes_are_the_paper_launch_rules():
    inp = _inputs(3)
    for mode, rule in (("sync", "sync"), ("async", "async"), ("async_sf", "stream")):
        r = layer_timeline(inp, COSTS, mode, guard=False, links="paper")
        assert set(r.policy) == {rule}
        for d in range(D):  # the rank's kernels are exactly launch_groups with the true arrivals
            want = launch_groups(
                inp.ready_us,
                inp.pairs[:, d].sum(axis=1),
                COSTS.curve,
                mode=rule,
                threshold=COSTS.threshold,
                start_us=inp.ready_us[d],
            )
            assert [(k.sources, k.tokens) for k in r.kernels[d]] == [(k.sources, k.tokens) for k in want]
    # The first layer has no OEWF (§3.3): cascade = async_sf.
    first = _inputs(3, oewf=False)
    assert layer_timeline(first, COSTS, "cascade").end_us == layer_timeline(first, COSTS, "async_sf").end_us


def test_sync_layer_is_last_arrival_plus_the_slowest_rank():
    inp = _inputs(11)
    r = layer_timeline(inp, COSTS, "sync", links="paper")
    R = inp.ready_us.max()
    recv = inp.pairs.sum(axis=(0, 2))
    remote = recv - np.einsum("ddk->d", inp.pairs)
    want = R + COSTS.ffn_us(recv) + COSTS.exchange_us(remote, COSTS.combine_bytes_per_pair)
    assert r.end_us == pytest.approx(want.max())


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: layer_timeline(_inputs(0), COSTS, "fast"), "unknown mode 'fast'"),
        (
            lambda: LayerInputs(attention_us=[1.0, 2.0], dispatch_us=[1.0, 2.0], pairs=np.ones((2, 3, 4))),
            r"\[D, D, E\]",
        ),
        (lambda: LayerInputs(attention_us=[1.0, -2.0], dispatch_us=[1, 1], pairs=np.ones((2, 2, 1))), "≥ 0"),
        (lambda: LayerInputs(attention_us=[1.0, np.nan], dispatch_us=[1, 1], pairs=np.ones((2, 2, 1))), "NaN"),
        (lambda: layer_timeline(_inputs(0), prefill_costs(num_ranks=4), "sync"), "derived for 4"),
    ],
)
def test_layer_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ----------------------------------------------------------------------------------------------- runs
SMALL = CascadeConfig(trace="mooncake_sample", max_requests=40, rate_rps=8.0)


@pytest.fixture(scope="module")
def runs():
    return run_cascade(SMALL, workers=1, cache_dir=None, progress=False)


def test_runs_serve_every_request_once_and_report_the_paper_metrics(runs):
    served = {m: r.prefill for m, r in runs.items()}
    for m, s in served.items():
        assert s.num_completed == SMALL.max_requests
        assert np.array_equal(np.bincount(s.chunk_request, weights=s.chunk_q) + s.hit_tokens, s.input_len), m
        summ = runs[m].summary()
        assert 0 <= summ["tail_ratio"] < 1 and 0 < summ["alb"] <= 1
    # Routing pairs: every new token picks K experts in every layer.
    model = StepModel(SMALL, "sync")
    counts = model.rank_counts(np.array([10.0, 0, 5, 3, 0, 0, 1, 2]), np.random.default_rng(0))
    np.testing.assert_allclose(counts.sum(axis=2), np.broadcast_to(np.array([10, 0, 5, 3, 0, 0, 1, 2]) * 6, (43, 8)))
    np.testing.assert_allclose(model.expert_pairs(0, counts[0]).sum(axis=2), counts[0], rtol=1e-12)
    # Estimators: the attention fit's online accuracy is an output (< 1: the truth is not Eq. 11); tokens from the
    # previous layer.
    assert 0.5 < runs["cascade"].attention_accuracy < 0.99 and 0 < runs["cascade"].token_accuracy <= 1
    rows = ablation_rows(runs, runs)
    assert [r["mode"] for r in rows] == list(LAYER_MODES) and rows[0]["throughput_ratio"] == 1.0
    o = oewf_rows(runs["cascade"])
    assert o["layers"] == runs["cascade"].layer_us[:, 1:].size and o["max"] >= 0
    assert runs["sync"].oewf_reduction.max() == 0  # no OEWF outside cascade mode


def test_layer_example_replays_a_step_under_every_mode(runs):
    ex = layer_example(runs["sync"], layer=1)
    assert ex["cascade"].base_end_us == pytest.approx(ex["async_sf"].end_us, rel=1e-12)  # OEWF's base: Async+SF
    for r in ex.values():  # nobody finishes before the last replica's dispatch has left
        assert r.end_us >= r.ready_us.max() and r.rank_end_us.shape == (8,)
    batches = step_batches(runs["sync"].prefill, 0)
    assert sum(b.new_tokens for b in batches) == runs["sync"].prefill.step_new_tokens[0].sum()


def test_runs_are_deterministic_and_cached(tmp_path):
    cfg = dataclasses.replace(SMALL, max_requests=12)
    a = run_cascade(cfg, ("cascade",), workers=1, cache_dir=tmp_path, progress=False)["cascade"]
    b = run_cascade(cfg, ("cascade",), workers=1, cache_dir=tmp_path, progress=False)["cascade"]
    c = run_cascade(cfg, ("cascade",), workers=1, cache_dir=None, progress=False)["cascade"]
    np.testing.assert_array_equal(a.layer_us, b.layer_us)
    np.testing.assert_array_equal(a.layer_us, c.layer_us)
    assert any(tmp_path.rglob("output.pkl"))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"model": "gpt"}, "unknown model"),
        ({"placement": "random"}, "unknown placement 'random'"),
        ({"rate_rps": -1.0}, "rate_rps must be"),
        ({"routing": "nope"}, "unknown routing 'nope'"),
        ({"attention": "flash"}, "unknown attention"),
        ({"num_ranks": 3}, "do not split"),
        ({"attention_step_noise": 0.9}, "attention_step_noise must lie in"),
        ({"dispatch": "lp"}, "unknown dispatch"),
        ({"links": "free"}, "unknown links 'free'"),
        ({"launch": "eager"}, "unknown launch 'eager'"),
        ({"trace": "/no/such/trace.jsonl"}, "neither one of .* nor an existing file"),
        ({"guard": True}, "guard=True needs timeline='reference'"),
        ({"replication": 1.25}, "replication=1.25 needs timeline='reference'"),
        ({"helper_budget_experts": -1}, "helper_budget_experts must"),
        ({"helper_budget_experts": 2.5}, "helper_budget_experts"),
        ({"stream_rho": 1.0}, "stream_rho=1.0 asks for peak FFN throughput"),
        ({"stream_rho": 0.0}, "stream_rho must"),
    ],
)
def test_config_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CascadeConfig(**kwargs)
