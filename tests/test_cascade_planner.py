"""CascadeEP planning in solvers: attention model (App. B), FFN curve and θ (§3.2), launch schedules, OEWF (§3.3)."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solvers import (
    AttentionModel,
    CostModel,
    FetchPlan,
    LaunchSchedule,
    OEWFState,
    ThroughputCurve,
    admit,
    attention_features,
    attention_features_unchecked,
    fit_attention,
    launch_groups,
    oewf_plan,
    predicted_completion,
    select_weights,
    stream_threshold,
)

# F(N) = N / 10 µs on [1, 1e5] (η ≡ 1 there): hand-computable.
LINEAR = ThroughputCurve.from_profile([1, 100_000], [0.1, 10_000.0])
# TEMPO-style max-affine rank (b = 15 µs/expert, β = 0.1 µs/token, 32 experts per rank): θ(0.9) = 6144.
CONCAVE = ThroughputCurve.from_cost_model(CostModel(b=15.0, beta=0.1), 32)
SEEDS = st.integers(0, 2**32 - 1)


# ---------------------------------------------------------------- attention model (App. B, Eqs. 10–11)
def brute_pairs(I, P, k) -> int:
    return sum(min(k, p + j) for i, p, k in zip(I, P, k, strict=True) for j in range(1, i - p + 1))


@st.composite
def requests(draw):
    n = draw(st.integers(1, 6))
    I = draw(st.lists(st.integers(0, 40), min_size=n, max_size=n))
    P = [draw(st.integers(0, i)) for i in I]  # includes P = I (no new tokens)
    kind = draw(st.sampled_from(["dense", "scalar", "per_request"]))
    if kind == "dense":
        return I, P, None, [math.inf] * n
    if kind == "scalar":
        k = draw(st.integers(1, 50))
        return I, P, k, [k] * n
    ks = [draw(st.one_of(st.integers(1, 50), st.just(math.inf))) for _ in range(n)]  # k < P, between, ≥ I, dense
    return I, P, ks, ks


@given(requests())
def test_pair_count_matches_brute_force(req):
    I, P, budget, k = req
    Q, Pi = attention_features(I, P, key_budget=budget)
    assert Q == sum(I) - sum(P)
    assert Pi == brute_pairs(I, P, k)
    assert isinstance(Q, np.int64) and isinstance(Pi, np.int64)


@given(requests(), st.sampled_from([None, 1, 3, 7]), st.integers(1, 4))
def test_unchecked_features_are_the_checked_ones(req, budget, num_batches):
    """The simulators' unchecked path gives the same integers per batch (dense or one budget for all)."""
    I, P, _, _ = req
    batch = np.arange(len(I)) % num_batches
    want = attention_features(I, P, key_budget=budget, batch=batch, num_batches=num_batches)
    got = attention_features_unchecked(np.asarray(I), np.asarray(P), budget, batch, num_batches)
    for w, g in zip(want, got, strict=True):
        np.testing.assert_array_equal(g, w)
        assert g.dtype == np.int64


def test_pair_count_cases_and_batches():
    # (I, P, k): no new tokens, k < P, k between P and I, dense.
    I, P, k = [8, 10, 10, 10], [8, 6, 2, 3], [5, 4, 6, math.inf]
    Q, Pi = attention_features(I, P, key_budget=k, batch=[0, 0, 2, 2], num_batches=4)
    np.testing.assert_array_equal(Q, [0 + 4, 0, 8 + 7, 0])
    np.testing.assert_array_equal(Pi, [brute_pairs(I[:2], P[:2], k[:2]), 0, brute_pairs(I[2:], P[2:], k[2:]), 0])
    assert brute_pairs([10], [6], [4]) == 4 * 4  # k < P: every new token sees k keys
    # Exact at the paper's largest profile: 64 requests × 64K tokens, dense, 20% prefix hit.
    I, P = [65536] * 64, [13107] * 64
    q = 65536 - 13107
    _, Pi = attention_features(I, P)
    assert int(Pi) == 64 * (q * 13107 + q * (q + 1) // 2) == 64 * sum(range(13108, 65537))


def test_fit_recovers_alpha_with_noise():
    rng = np.random.default_rng(0)
    truth = AttentionModel(alpha0=200.0, alpha1=0.05, alpha2=1e-6)
    B, L, r = np.meshgrid([1, 2, 4, 8, 16, 32, 64], 1024 * 2 ** np.arange(7), [0, 0.2, 0.4, 0.6, 0.7, 0.8, 0.9, 0.95])
    B, L, r = B.ravel(), L.ravel(), r.ravel()
    I = np.repeat(L, B)
    P = np.repeat(np.floor(r * L).astype(int), B)
    Q, Pi = attention_features(I, P, batch=np.repeat(np.arange(B.size), B))
    sigma = 0.04  # multiplicative noise U(−σ, σ): E|ε| = σ/2
    t = truth.predict(Q, Pi) * (1 + rng.uniform(-sigma, sigma, Q.size))
    model, rep = fit_attention(Q, Pi, t)
    assert model.alpha0 == pytest.approx(truth.alpha0, rel=0.05)
    assert model.alpha1 == pytest.approx(truth.alpha1, rel=0.03)
    assert model.alpha2 == pytest.approx(truth.alpha2, rel=0.03)
    assert rep.num_samples == Q.size
    assert rep.accuracy == pytest.approx(1 - sigma / 2, abs=0.005)
    assert rep.mean_rel_error == pytest.approx(1 - rep.accuracy)
    # Remaining time (Eq. 1): clipped at 0 once the prediction has run out.
    f = model.predict(Q[:3], Pi[:3])
    np.testing.assert_allclose(model.remaining(Q[:3], Pi[:3], [0.0, f[1] / 2, 2 * f[2]]), [f[0], f[1] / 2, 0.0])


# ---------------------------------------------------------------- FFN curve and θ (§3.2, Eq. 2)
def test_curve_interpolation_rules():
    c = ThroughputCurve.from_profile([10, 20, 40], [5.0, 6.0, 8.0])
    assert c.peak == pytest.approx(5.0)
    np.testing.assert_allclose(c.profile_eta, [0.4, 20 / 6 / 5, 1.0])
    np.testing.assert_allclose(c.ffn_time([10, 20, 40]), [5, 6, 8])  # profile points
    assert c.ffn_time(0) == 0.0  # no kernel
    assert c.ffn_time(3) == 5.0  # below the first point: its time is the launch floor
    assert c.ffn_time(30) == pytest.approx(7.0)  # linear between points
    assert c.ffn_time(80) == pytest.approx(16.0)  # past the last point: its throughput continues
    N = np.array([1, 15, 40, 100, 1e6])
    eta = c.eta(N)
    assert np.all((eta > 0) & (eta <= 1))
    np.testing.assert_allclose(c.ffn_time(N), N / (eta * c.peak))  # Eq. 2
    assert c == ThroughputCurve.from_profile(np.array([10, 20, 40]), (5, 6, 8)) and hash(c)


@st.composite
def profiles(draw):
    rng = np.random.default_rng(draw(SEEDS))
    M = draw(st.integers(1, 12))
    tokens = np.cumsum(rng.integers(1, 5000, M))
    return ThroughputCurve.from_profile(tokens, rng.uniform(1, 1000, M))


@given(profiles(), st.floats(0.01, 1.0), st.floats(0.01, 1.0))
def test_theta_non_decreasing_in_rho(curve, r1, r2):
    lo, hi = sorted((r1, r2))
    assert stream_threshold(curve, lo) <= stream_threshold(curve, hi)
    theta = stream_threshold(curve, hi)
    i = curve.tokens.index(theta)
    assert curve.profile_eta[i] >= hi - 1e-12 and np.all(curve.profile_eta[:i] < hi)


def test_curve_from_cost_model():
    # G(N) = S(1 − (1 − 1/S)^N); t = max(15 G, 0.1 N): peak 10 tok/µs once the token piece dominates.
    assert CONCAVE.peak == pytest.approx(10.0)
    G = 32 * (1 - (31 / 32) ** 96)  # 96 is a ladder point
    assert CONCAVE.ffn_time(96) == pytest.approx(15 * G)
    assert stream_threshold(CONCAVE, 0.9) == 6144  # η(4096) = 4096 / (15·32·10) ≈ 0.853 < 0.9
    assert stream_threshold(CONCAVE, 1.0) == 6144
    one = ThroughputCurve.from_cost_model(CostModel(a=5.0, b=2.0, c=1.0, beta=0.5, c2=99.0, gamma=9.0), 1, [1, 4])
    np.testing.assert_allclose(one.time_us, [7.0, 7.0])  # S = 1: G = 1; the traffic piece is dropped
    tiled = ThroughputCurve.from_cost_model(CostModel(b=10.0, b2=3.0, beta=0.001, tile=128), 1, [512])
    assert tiled.time_us[0] == pytest.approx(10 + 3 * (4 - 1))  # 4 tiles on one expert


# ---------------------------------------------------------------- launch groups (streamFFN, §3.2)
@st.composite
def arrivals(draw):
    rng = np.random.default_rng(draw(SEEDS))
    Gs = draw(st.integers(1, 8))
    arrival = rng.choice([0.0, 50.0, 100.0, 400.0, 1000.0, 1500.0], Gs) + rng.integers(0, 2, Gs) * rng.random(Gs)
    tokens = rng.integers(0, 6000, Gs) * (rng.random(Gs) < 0.8)
    return arrival, tokens.astype(float)


def check_sequential(groups, arrival, curve, start_us=0.0, slow=1.0):
    free = start_us
    for g in groups:
        assert g.ready_us == arrival[list(g.sources)].max()
        assert g.start_us == max(g.ready_us, free)
        assert g.duration_us == pytest.approx(curve.ffn_time(g.tokens) * slow)
        free = g.end_us


@given(arrivals(), st.sampled_from(["sync", "async", "stream"]), st.sampled_from([0.0, 2000.0, 6144.0, math.inf]))
def test_launch_groups_cover_every_token_once(arr, mode, theta):
    arrival, tokens = arr
    groups = launch_groups(arrival, tokens, CONCAVE, mode=mode, threshold=theta, start_us=20.0)
    listed = [s for g in groups for s in g.sources]
    assert len(listed) == len(set(listed))  # at most one group per source
    assert set(np.flatnonzero(tokens > 0)) <= set(listed)  # every source with tokens in exactly one
    assert sum(g.tokens for g in groups) == pytest.approx(tokens.sum())
    for g in groups:
        assert g.tokens == tokens[list(g.sources)].sum() > 0
    check_sequential(groups, arrival, CONCAVE, 20.0)
    if mode == "sync" and groups:
        assert len(groups) == 1 and groups[0].start_us == max(arrival.max(), 20.0)
    if mode == "async":
        assert [g.sources for g in groups] == [(s,) for s in np.argsort(arrival, kind="stable") if tokens[s] > 0]
    if mode == "stream":
        for k, g in enumerate(groups):
            last = arrival[list(g.sources)] == g.ready_us
            earlier = tokens[list(g.sources)][~last]
            assert earlier.size == 0 or earlier.sum() < theta  # launched at the first instant reaching θ
            assert k == len(groups) - 1 or g.tokens >= theta  # only the flush may be short
        if groups and groups[-1].tokens < theta:
            assert groups[-1].ready_us == arrival.max()  # flush when every source has arrived


@given(arrivals(), st.sampled_from([0.0, 3000.0, 1e9]))
def test_linear_curve_orders_async_stream_sync(arr, theta):
    # With additive F, async is work-conserving and stream only delays it; stream never waits longer than sync.
    arrival, tokens = arr
    ends = {m: launch_groups(arrival, tokens, LINEAR, mode=m, threshold=theta) for m in ("sync", "async", "stream")}
    end = {m: g[-1].end_us if g else 0.0 for m, g in ends.items()}
    assert end["async"] <= end["stream"] + 1e-9 and end["stream"] <= end["sync"] + 1e-9


@given(st.lists(st.integers(0, 20_000), min_size=1, max_size=8), st.floats(0, 1e4))
def test_simultaneous_arrivals_stream_is_sync_and_beats_async(tokens, t):
    # F(N)/N is non-increasing on CONCAVE (throughput never drops), so F is subadditive: one big kernel wins.
    tokens, arrival = np.array(tokens, dtype=float), np.full(len(tokens), t)
    run = {m: launch_groups(arrival, tokens, CONCAVE, mode=m) for m in ("sync", "async", "stream")}
    assert run["stream"] == run["sync"]
    if tokens.sum() > 0:
        assert run["sync"][-1].end_us <= run["async"][-1].end_us * (1 + 1e-12)


def test_concave_curve_stream_beats_async_and_sync():
    # Eight sources, 2000 tokens each, 100 µs apart: θ = 6144 groups them four by four.
    arrival, tokens = np.arange(8) * 100.0, np.full(8, 2000.0)
    run = {m: launch_groups(arrival, tokens, CONCAVE, mode=m) for m in ("sync", "async", "stream")}
    assert [g.sources for g in run["stream"]] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert [g.start_us for g in run["stream"]] == [300.0, 1100.0]
    assert run["stream"][-1].end_us == pytest.approx(1900.0)  # 300 + 2 × F(8000) = 300 + 2 × 800
    assert run["sync"][0].start_us == 700.0 and run["sync"][0].end_us == pytest.approx(2300.0)
    assert run["async"][-1].end_us == pytest.approx(8 * CONCAVE.ffn_time(2000))  # small kernels back to back
    assert run["stream"][-1].end_us < run["sync"][-1].end_us < run["async"][-1].end_us
    slow = launch_groups(arrival, tokens, CONCAVE, mode="stream", efficiency=0.973)
    check_sequential(slow, arrival, CONCAVE, slow=1 / 0.973)


def test_flush_and_zero_token_sources():
    # Below θ throughout: one flush at the last arrival, which a zero-token source can be.
    g = launch_groups([0.0, 5.0, 9.0], [10.0, 20.0, 0.0], CONCAVE, mode="stream", threshold=1000)
    assert len(g) == 1 and g[0].sources == (0, 1, 2) and g[0].ready_us == 9.0 and g[0].tokens == 30.0
    # Simultaneous arrivals are ready together; trailing zero-token sources create no kernel.
    g = launch_groups([1.0, 1.0, 2.0, 3.0], [600.0, 600.0, 0.0, 0.0], CONCAVE, mode="stream", threshold=1000)
    assert [x.sources for x in g] == [(0, 1)] and g[0].tokens == 1200.0
    assert launch_groups([0.0, 1.0], [0.0, 0.0], CONCAVE, mode="sync") == ()
    assert [x.sources for x in launch_groups([3.0, 1.0], [5.0, 0.0], CONCAVE, mode="sync")] == [(1, 0)]


# ---------------------------------------------------------------- rank-uniform LaunchSchedule
@given(SEEDS, st.integers(1, 8), st.sampled_from(["sync", "async", "stream"]))
def test_schedule_partitions_and_rounds(seed, D, mode):
    rng = np.random.default_rng(seed)
    arrival = rng.choice([0.0, 10.0, 20.0, 500.0], D) + rng.random(D)
    tokens = rng.integers(0, 3000, (D, D)).astype(float)
    s = LaunchSchedule.from_arrivals(arrival, tokens, CONCAVE, mode=mode, rho=0.5)
    assert sorted(r for g in s.groups for r in g) == list(range(D))
    assert list(s.order) == list(np.argsort(arrival, kind="stable"))
    pairs = [p for r in s.shifts for p in r.pairs]
    assert sorted(pairs) == [(a, b) for a in range(D) for b in range(D)]  # every pair exactly once
    for r in s.shifts:
        src, dst = zip(*r.pairs, strict=True)
        assert len(set(src)) == len(src) and len(set(dst)) == len(dst)  # partial permutation
        assert all(d == (a + r.shift) % D for a, d in r.pairs) and set(src) == set(s.groups[r.group])
    assert len(s.shifts) == D * len(s.groups)
    same = LaunchSchedule(num_ranks=D, order=s.order, groups=s.groups)
    assert same.key == s.key and hash(same.key) == hash(s.key) and same == s
    if mode == "sync":
        assert len(s.groups) == 1
    if mode == "async":
        assert len(s.groups) == D
    if mode == "stream":
        mean = tokens.sum(axis=1) / D  # the per-destination rule on mean tokens gives the same groups
        per_dest = launch_groups(arrival, mean, CONCAVE, mode="stream", rho=0.5)
        assert [g.sources for g in per_dest] == [g for g in s.groups if mean[list(g)].sum() > 0]


def test_schedule_sync_and_threshold():
    s = LaunchSchedule.sync(4)
    assert s.groups == ((0, 1, 2, 3),) and s.group_of == (0, 0, 0, 0)
    s = LaunchSchedule.from_arrivals([30.0, 0.0, 10.0, 20.0], np.full((4, 4), 250.0), threshold=1000)
    assert s.groups == ((1, 2, 3, 0),)  # 1000 mean tokens only once all four arrived
    s = LaunchSchedule.from_arrivals([30.0, 0.0, 10.0, 20.0], np.full((4, 4), 250.0), threshold=500)
    assert s.groups == ((1, 2), (3, 0)) and s.group_of == (1, 0, 0, 1)


# ---------------------------------------------------------------- OEWF (§3.3, Algorithm 1, Eqs. 3–6)
def three_rank_state(**kw) -> OEWFState:
    """Ranks 0, 1 finished attention (helpers); rank 2 is 100 µs from the end of its attention (donor).

    Experts {0, 1} live on rank 0, {2, 3} on rank 1, {4, 5} on rank 2.
    """
    pair = np.zeros((3, 3, 6))
    pair[:, 0, :2] = [[50, 50], [50, 0], [100, 50]]
    pair[:, 1, 2:4] = [[40, 0], [60, 0], [50, 50]]
    pair[:, 2, 4:] = [[150, 0], [0, 300], [100, 0]]
    args = {
        "attention_us": [0.0, 0.0, 100.0],
        "dispatch_us": [5.0, 8.0, 10.0],
        "tokens": pair.sum(axis=(0, 2)),  # [300, 200, 550]: exact estimates
        "pair_tokens": pair,
        "expert_bytes": [1000.0] * 5 + [2500.0],
        "budget_bytes": 3000.0,
        "fetch_bytes_per_us": 250.0,
    }
    return OEWFState(**(args | kw))


def test_three_rank_example_paper_pricing():
    state = three_rank_state()
    np.testing.assert_allclose(predicted_completion(state, curve=LINEAR), [35.0, 28.0, 165.0])  # Eq. 3
    plan = oewf_plan(state, curve=LINEAR)
    first, second = plan.accepted
    # Helper 0 (dispatch done first): donor 2, only expert 4 carries its tokens; s_0 = 5 + 1000/250 = 9.
    assert (first.helper, first.donor, first.experts, first.tokens, first.bytes) == (0, 2, (4,), (150.0,), 1000.0)
    assert first.ready_us == 9.0 and first.work_us == pytest.approx(15.0) and first.alpha == 0.0  # hidden
    assert first.donor_after_us == pytest.approx(110 + 40) and first.helper_after_us == 35.0
    # Helper 1: expert 5 (300 tokens, 2500 B ≤ 3000); s_1 = 8 + 10 = 18, T_1' = max(28, 18 + 30) = 48.
    assert (second.helper, second.experts, second.n_trans, second.ready_us) == (1, (5,), 300.0, 18.0)
    assert second.alpha == pytest.approx(20 / 30) and second.helper_after_us == pytest.approx(48.0)
    assert second.donor_before_us == pytest.approx(150.0) and second.donor_after_us == pytest.approx(120.0)
    np.testing.assert_allclose(plan.completion_after_us, [35.0, 48.0, 120.0])
    np.testing.assert_allclose(plan.layer_trace_us, [165.0, 150.0, 120.0])
    assert plan.layer_before_us == 165.0 and plan.layer_after_us == pytest.approx(120.0) and not plan.rejected
    assert plan.state.pair_tokens[0, 2, 4] == 0 and plan.state.pair_tokens[2, 2, 4] == 100  # moved pairs only


def test_three_rank_example_tempo_pricing():
    # t(G, N) = max(20 G, 0.1 N); activated experts from pair_tokens: 2 per rank.
    cost = CostModel(b=20.0, beta=0.1)
    state = three_rank_state()
    np.testing.assert_allclose(predicted_completion(state, pricing="tempo", cost=cost), [45.0, 48.0, 165.0])
    plan = oewf_plan(state, pricing="tempo", cost=cost)
    first, second = plan.accepted
    # Helper 0 takes expert 4 (rank 2 still computes it for itself: m = 0) and pays one activation:
    # T_0' = 5 + max(20·3, 0.1·450) = 65; donor 110 + max(40, 40) = 150.
    assert (first.helper_new_experts, first.donor_dropped_experts) == (1, 0)
    assert first.helper_after_us == pytest.approx(65.0) and first.donor_after_us == pytest.approx(150.0)
    assert first.alpha == pytest.approx(1.0)
    # Helper 1 takes expert 5, which nobody else sends to rank 2: the donor drops it (m = 1):
    # donor 110 + max(20·1, 0.1·100) = 130; helper max(8 + max(60, 50), 18 + max(20, 30)) = 68.
    assert second.donor_dropped_experts == 1 and second.donor_after_us == pytest.approx(130.0)
    assert second.helper_after_us == pytest.approx(68.0)
    np.testing.assert_allclose(plan.completion_after_us, [65.0, 68.0, 130.0])
    np.testing.assert_allclose(plan.state.activated, [3, 3, 1])
    np.testing.assert_allclose(plan.state.tokens, [450, 500, 100])


@pytest.mark.parametrize(
    "kw, reasons",
    [
        ({"budget_bytes": [500.0, 3000.0, 0.0]}, ["budget", "accepted"]),  # best expert (1000 B) exceeds 500 B
        ({"attention_us": [0.0, 0.0, 0.0]}, ["no_donor", "no_donor"]),
        ({"fetch_bytes_per_us": 5.0}, ["donor_started", "donor_started"]),  # weights after the donor starts
        # The donor's estimate N_2 = 10 is below the 150 tokens helper 0 moves, and the fetch is slow:
        # s_0 + F(150) = 105 + 15 > T_2(S) = 111 (Eq. 6 fails); helper 1's weights come after the donor starts.
        ({"tokens": [300.0, 200.0, 10.0], "fetch_bytes_per_us": 10.0}, ["not_improving", "donor_started"]),
    ],
)
def test_oewf_rejections(kw, reasons):
    plan = oewf_plan(three_rank_state(**kw), curve=LINEAR)
    got = {r.helper: r.reason for r in plan.rejected} | {r.helper: "accepted" for r in plan.accepted}
    assert [got[0], got[1]] == reasons
    assert plan.layer_after_us <= plan.layer_before_us
    for r in plan.rejected:
        assert (r.proposal is not None) == (r.reason in ("donor_started", "not_improving"))


def test_tempo_pricing_rejects_moves_that_cost_activations():
    # With b = 200 µs per activated expert every rank is activation-bound: the donor gains nothing from losing
    # tokens of an expert it still computes, and the helper pays a whole activation per fetched expert.
    # Paper pricing (F of the token count only) accepts both moves.
    cost = CostModel(b=200.0, beta=0.1)
    plan = oewf_plan(three_rank_state(), pricing="tempo", cost=cost)
    assert not plan.accepted and [r.reason for r in plan.rejected] == ["not_improving"] * 2
    first, second = (r.proposal for r in plan.rejected)
    assert first.donor_after_us == first.donor_before_us == 510.0 and first.helper_after_us == 605.0
    assert second.donor_dropped_experts == 1 and second.donor_after_us == 310.0 and second.helper_after_us == 608.0
    assert plan.layer_after_us == plan.layer_before_us == 510.0
    assert len(oewf_plan(three_rank_state(), curve=LINEAR).accepted) == 2


def test_no_eligible_experts_and_explicit_order():
    pair = three_rank_state().pair_tokens.copy()
    pair[1, 2] = 0.0  # helper 1 routed nothing to the donor
    plan = oewf_plan(three_rank_state(pair_tokens=pair), curve=LINEAR, helpers=[1, 0])
    assert plan.rejected[0].helper == 1 and plan.rejected[0].reason == "no_eligible_experts"
    assert plan.rejected[0].donor == 2 and [r.helper for r in plan.accepted] == [0]


@st.composite
def oewf_instances(draw):
    rng = np.random.default_rng(draw(SEEDS))
    D, E = draw(st.integers(2, 6)), draw(st.integers(1, 10))
    A = rng.uniform(1, 2000, D) * (rng.random(D) < 0.6)
    A[rng.integers(D)] = 0.0  # at least one helper
    pair = np.zeros((D, D, E))
    host = rng.integers(0, D, E)
    for e in range(E):
        pair[:, host[e], e] = rng.integers(0, 800, D) * (rng.random(D) < 0.7)
    exact = pair.sum(axis=(0, 2))
    # Mostly exact estimates (App. E); sometimes the previous layer's count is off (App. D) — the predicted
    # layer time must still never grow, since Eq. 6 compares predictions.
    noise = 1.0 if rng.random() < 0.7 else rng.uniform(0.2, 1.5, D)
    state = OEWFState(
        attention_us=A,
        dispatch_us=rng.uniform(0, 300, D),
        tokens=exact * noise,
        pair_tokens=pair,
        expert_bytes=rng.uniform(1e3, 1e4, E),
        budget_bytes=rng.uniform(0, 3e4, D),
        fetch_bytes_per_us=rng.uniform(10, 2000, D),
    )
    cost = CostModel(a=rng.uniform(0, 50), b=rng.uniform(0.5, 30), c=rng.uniform(0, 50), beta=rng.uniform(0.01, 0.5))
    curve = ThroughputCurve.from_cost_model(cost, int(rng.integers(1, 64)))
    return state, curve, cost


@given(oewf_instances(), st.sampled_from(["paper", "tempo"]))
def test_app_e_sequential_updates_never_increase_layer_time(inst, pricing):
    state, curve, cost = inst
    plan = oewf_plan(state, curve=curve, pricing=pricing, cost=cost)
    trace = np.array(plan.layer_trace_us)
    assert np.all(np.diff(trace) <= 0)  # M(S_k) ≤ M(S_{k-1}) (App. E, Eq. 17)
    assert plan.layer_after_us <= plan.layer_before_us == plan.completion_before_us.max()
    np.testing.assert_array_equal(
        plan.completion_after_us, predicted_completion(plan.state, curve=curve, pricing=pricing, cost=cost)
    )
    touched = set()
    for r in plan.accepted:
        assert max(r.donor_after_us, r.helper_after_us) <= max(r.donor_before_us, r.helper_before_us)  # Eq. 6
        assert plan.completion_after_us[r.helper] == r.helper_after_us
        assert r.ready_us < state.attention_us[r.donor] + state.dispatch_us[r.donor]
        touched |= {r.helper, r.donor}
    untouched = [d for d in range(state.num_ranks) if d not in touched]
    np.testing.assert_array_equal(plan.completion_after_us[untouched], plan.completion_before_us[untouched])
    assert len(plan.accepted) + len(plan.rejected) == int((state.attention_us == 0).sum())


@given(oewf_instances(), st.sampled_from(["paper", "tempo"]))
def test_algorithm1_argmax_donor_and_budget(inst, pricing):
    state, curve, cost = inst
    T = predicted_completion(state, curve=curve, pricing=pricing, cost=cost)
    for h in np.flatnonzero(state.attention_us == 0):
        fetch = select_weights(int(h), state, curve=curve, pricing=pricing, cost=cost)
        donors = [d for d in range(state.num_ranks) if state.attention_us[d] > 0 and d != h]
        if fetch is None:
            continue
        assert fetch.donor == max(donors, key=lambda d: (T[d], -d))  # Eq. 4, ties to the lowest rank
        sent = state.pair_tokens[h, fetch.donor]
        ranked = sorted(np.flatnonzero(sent > 0), key=lambda e: (-sent[e] / state.expert_bytes[e], e))
        k = len(fetch.experts)
        assert list(fetch.experts) == ranked[:k]  # greedy prefix of the tokens-per-byte order
        assert fetch.bytes <= state.budget_bytes[h]
        if k < len(ranked):  # the paper's break: the next expert did not fit
            assert state.expert_bytes[ranked[k]] > state.budget_bytes[h] - fetch.bytes
        assert fetch.tokens == tuple(sent[list(fetch.experts)])
        r = admit(fetch, state, curve=curve, pricing=pricing, cost=cost)
        assert r.accepted == (r.reason == "accepted")


# ---------------------------------------------------------------- clear errors
def _state(**kw):
    return three_rank_state(**kw)


ERRORS = [
    (lambda: attention_features([10], [11]), "prefix_len[0] = 11 exceeds input_len[0] = 10"),
    (lambda: attention_features([10, 5], [1]), "prefix_len must have shape (2,)"),
    (lambda: attention_features([10.5], [1]), "input_len must be whole numbers"),
    (lambda: attention_features([-1], [0]), "input_len must be ≥ 0"),
    (lambda: attention_features([np.nan], [0]), "input_len contains NaN"),
    (lambda: attention_features([10], [1], key_budget=0), "key_budget must be > 0"),
    (lambda: attention_features([10], [1], key_budget=2.5), "key_budget[0] = 2.5 must be a whole number ≥ 1"),
    (lambda: attention_features([10], [1], batch=[-1]), "batch must be ≥ 0"),
    (lambda: fit_attention([1, 2], [1, 2], [1, 2]), "need at least 3 profiled batches"),
    (lambda: fit_attention([1, 2, 3], [1, 4, 9], [1, 0, 2]), "time_us[1] = 0.0 must be > 0"),
    (lambda: fit_attention([1, 2, 3], [1, 4, 9], [1, np.nan, 2]), "time_us contains NaN"),
    (lambda: fit_attention([1, 2, 3], [2, 4, 6], [1, 2, 3]), "rank 2 < 3"),
    (lambda: fit_attention([1, 2, 3], [1, 4], [1, 2, 3]), "Pi must have shape (3,)"),
    (lambda: AttentionModel(alpha1=math.nan, alpha2=0.0), "alpha1 must be finite"),
    (lambda: AttentionModel(alpha1=1.0, alpha2=0.0).remaining(1, 1, -5.0), "elapsed must be ≥ 0"),
    (lambda: ThroughputCurve.from_profile([], []), "empty profile"),
    (lambda: ThroughputCurve.from_profile([2, 1], [1, 1]), "strictly ascending"),
    (lambda: ThroughputCurve.from_profile([1, 2], [1, -1]), "time_us must be > 0"),
    (lambda: ThroughputCurve.from_profile([1, 2], [1]), "time_us must have shape (2,)"),
    (lambda: LINEAR.ffn_time(-1.0), "N must be ≥ 0"),
    (lambda: stream_threshold(LINEAR, 0.0), "rho must lie in (0.0, 1.0]"),
    (lambda: stream_threshold(LINEAR, 1.5), "rho must lie in (0.0, 1.0]"),
    (lambda: stream_threshold(LINEAR, math.nan), "rho must be a finite number"),
    (lambda: ThroughputCurve.from_cost_model(CostModel(b=1.0, beta=0.1), 0), "experts_per_rank must be >= 1"),
    (lambda: ThroughputCurve.from_cost_model(CostModel(b=0.0, beta=0.0), 4), "CostModel prices no load"),
    (lambda: launch_groups([0], [1], LINEAR, mode="bogus"), "unknown mode 'bogus'; valid: 'sync', 'async', 'stream'"),
    (lambda: launch_groups([0, 1], [1], LINEAR, mode="sync"), "tokens must have shape (2,)"),
    (lambda: launch_groups([0, -1], [1, 1], LINEAR, mode="sync"), "arrival_us must be ≥ 0"),
    (lambda: launch_groups([0], [1], LINEAR, mode="stream", efficiency=1.5), "efficiency must lie in (0.0, 1.0]"),
    (lambda: launch_groups([0], [1], LINEAR, mode="stream", threshold=-1), "threshold must be >= 0.0"),
    (lambda: LaunchSchedule(num_ranks=3, order=(0, 1, 2), groups=((0,), (2, 1))), "consecutive runs"),
    (lambda: LaunchSchedule(num_ranks=3, order=(0, 1, 1), groups=((0, 1, 1),)), "permutation of 0..2"),
    (lambda: LaunchSchedule.from_arrivals([0, 1], np.ones((2, 3)), LINEAR), "tokens must have shape (2, 2)"),
    (lambda: LaunchSchedule.from_arrivals([], np.ones((0, 0)), LINEAR), "arrival_us is empty"),
    (lambda: LaunchSchedule.from_arrivals([0, 1], np.ones((2, 2))), "needs a ThroughputCurve"),
    (lambda: _state(pair_tokens=np.zeros((3, 2, 6))), "pair_tokens must be [D, D, E] with D = 3"),
    (lambda: _state(expert_bytes=[0.0] * 6), "expert_bytes must be > 0"),
    (lambda: _state(attention_us=[0.0, np.nan, 1.0]), "attention_us contains NaN"),
    (lambda: _state(tokens=[1.0, -2.0, 3.0]), "tokens must be ≥ 0"),
    (lambda: _state(budget_bytes=[1.0, 2.0]), "budget_bytes must be a scalar or shape (3,)"),
    (lambda: oewf_plan(_state(), curve=LINEAR, pricing="magic"), "unknown pricing 'magic'; valid: 'paper', 'tempo'"),
    (lambda: oewf_plan(_state(), pricing="tempo"), "pricing='tempo' needs cost=CostModel"),
    (lambda: oewf_plan(_state()), "pricing='paper' needs curve=ThroughputCurve"),
    (lambda: oewf_plan(_state(), curve=LINEAR, helpers=[0, 0]), "repeat a rank"),
    (lambda: select_weights(2, _state(), curve=LINEAR), "rank 2 is still in attention"),
    (lambda: select_weights(7, _state(), curve=LINEAR), "helper must be a rank in 0..2"),
    (
        lambda: admit(FetchPlan(helper=0, donor=2, experts=(4,), tokens=(-1.0,), bytes=1.0), _state(), curve=LINEAR),
        "fetch.tokens must be > 0",
    ),
    (
        lambda: admit(FetchPlan(helper=0, donor=0, experts=(4,), tokens=(1.0,), bytes=1.0), _state(), curve=LINEAR),
        "fetch.donor = 0 must be a rank other than the helper",
    ),
]


@pytest.mark.parametrize("call, fragment", ERRORS, ids=[f"err{i}" for i in range(len(ERRORS))])
def test_clear_errors(call, fragment):
    with pytest.raises(ValueError) as info:
        call()
    assert fragment in str(info.value)


def test_straggler_schedules_are_canonical_two_group_plans():
    s = LaunchSchedule.stragglers(8, [6, 2])
    assert s.groups == ((0, 1, 3, 4, 5, 7), (2, 6)) and s.key == LaunchSchedule.stragglers(8, (2, 6, 6)).key
    assert LaunchSchedule.stragglers(8, []).key == LaunchSchedule.sync(8).key
    assert LaunchSchedule.stragglers(4, range(4)).groups == ((0, 1, 2, 3),)
    with pytest.raises(ValueError, match="late ranks"):
        LaunchSchedule.stragglers(4, [4])


def test_oewf_at_dispatch_decides_in_readiness_order_and_moves_only_helper_pairs():
    from solvers import oewf_at_dispatch

    rng = np.random.default_rng(5)
    D, E = 4, 8
    pairs = rng.integers(0, 2000, size=(D, D, E)).astype(float)
    att = np.array([100.0, 2500.0, 400.0, 3000.0])
    disp = np.full(D, 50.0)
    curve = ThroughputCurve.from_profile([1, 1024, 65536], [80.0, 100.0, 1300.0])
    res = oewf_at_dispatch(
        att + disp,
        att,
        disp,
        pairs.sum(axis=(0, 2)),
        pairs,
        expert_bytes=1e6,
        budget_bytes=4e6,
        fetch_bytes_per_us=1e4,
        curve=curve,
    )
    assert res.accepted, "the early ranks should help the two stragglers"
    times = [a.decided_us for a in res.accepted]
    assert times == sorted(times) and all(a.start_us > a.decided_us for a in res.accepted)
    moved = pairs - res.pair_tokens
    assert (moved >= 0).all() and np.isclose(moved.sum(), sum(a.reassignment.n_trans for a in res.accepted))
    for a in res.accepted:  # only the helper's own row towards its donor changes
        r = a.reassignment
        assert moved[r.helper, r.donor].sum() > 0 and att[r.helper] < att[r.donor]


def _walk_groups(arrival, tokens, mode, theta):
    """The launch rule walked source by source (the independent reference of `partition_ends`)."""
    order = sorted(range(len(arrival)), key=lambda s: (arrival[s], s))
    if mode == "sync":
        return [order]
    if mode == "async":
        return [[s] for s in order]
    groups, pending, total = [], [], 0.0
    for i, s in enumerate(order):
        pending.append(s)
        total += tokens[s]
        last_of_instant = i + 1 == len(order) or arrival[order[i + 1]] != arrival[s]
        if last_of_instant and (total >= theta or i + 1 == len(order)):
            groups.append(pending)
            pending, total = [], 0.0
    return groups


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 3),
    st.integers(0, 7),
    st.integers(0, 2**31 - 1),
    st.sampled_from(["sync", "async", "stream"]),
    st.sampled_from([0.0, 25.0, 60.0, np.inf]),
)
def test_partition_ends_matches_the_walk_on_every_row(rows, S, seed, mode, theta):
    from solvers.streamffn import partition_ends, partition_sources

    rng = np.random.default_rng(seed)
    arrival = rng.integers(0, 3, (rows, S)).astype(float)  # ties: sources of one instant join together
    tokens = rng.integers(0, 40, (rows, S)).astype(float)
    order, ends = partition_ends(arrival, tokens, mode, theta)
    for r in range(rows):
        want = _walk_groups(list(arrival[r]), list(tokens[r]), mode, theta)
        assert partition_sources(arrival[r], tokens[r], mode, theta) == want
        cuts = np.flatnonzero(ends[r]) + 1
        got = [list(map(int, g)) for g in np.split(order[r], cuts[:-1])] if S else ([[]] if mode == "sync" else [])
        assert got == want
