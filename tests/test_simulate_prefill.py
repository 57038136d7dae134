"""tempo_jax.sim.cascade.serving: prefix caches, placement policies, chunked-prefill batches, `simulate_prefill`."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tempo_jax.sim import PLACEMENT_POLICIES, PrefillResult, StepBatch, simulate_prefill
from tempo_jax.sim.cascade.serving import PrefixCache, Router, ToyStepTime
from tempo_jax.workloads import RequestTrace, load_mooncake_sample, synthetic_requests

TOY = ToyStepTime(alpha0_s=2e-3, alpha1_s=2e-5, alpha2_s=1e-9, ffn_s_per_token=2e-5)


def max_tokens_step(batches):
    """Toy step time proportional to the largest per-replica batch (plus a floor), no record."""
    return 1e-3 + 1e-5 * max(b.new_tokens for b in batches)


def make_trace(arrival, lengths, blocks, block_size=512) -> RequestTrace:
    return RequestTrace(
        arrival_s=arrival,
        input_len=lengths,
        output_len=np.ones(len(lengths), dtype=np.int64),
        block_offsets=np.concatenate([[0], np.cumsum([len(b) for b in blocks])]),
        block_ids=np.concatenate([np.asarray(b, dtype=np.int64) for b in blocks]) if blocks else [],
        block_size=block_size,
    )


def check_accounting(res: PrefillResult, trace: RequestTrace, budget: int, max_req=None) -> None:
    """Every request's input tokens = prefix hit + its chunks' new tokens, each chunk continuing the last."""
    n, D = len(trace), res.num_replicas
    assert res.num_completed == n == res.num_requests
    assert np.all(res.ttft_s >= 0) and np.all(np.isfinite(res.ttft_s))
    assert np.all(res.hit_tokens >= 0) and np.all(res.hit_tokens <= trace.input_len - 1)
    assert np.all((res.hit_tokens % trace.block_size == 0) | (res.hit_tokens == trace.input_len - 1))
    computed = np.bincount(res.chunk_request, weights=res.chunk_q, minlength=n)
    np.testing.assert_array_equal(res.hit_tokens + computed, trace.input_len)
    assert np.all(res.chunk_q >= 1)
    for r in range(n):
        idx = np.flatnonzero(res.chunk_request == r)
        P, q = res.chunk_P[idx], res.chunk_q[idx]
        assert P[0] == res.hit_tokens[r]
        np.testing.assert_array_equal(P[1:], P[:-1] + q[:-1])  # later chunks see earlier ones as prefix
        assert np.all(np.diff(res.chunk_step[idx]) >= 1)  # one chunk per step
        assert np.all(res.chunk_replica[idx] == res.replica[r])
        assert res.completion_s[r] == res.step_end_s[res.chunk_step[idx[-1]]]
        assert res.num_chunks[r] == idx.size
    # steps: monotone, positive, within budget, matching the chunk log
    assert np.all(res.step_end_s > res.step_start_s)
    assert np.all(res.step_start_s[1:] >= res.step_end_s[:-1])
    assert res.step_new_tokens.shape == (res.num_steps, D)
    assert res.step_new_tokens.max() <= budget and np.all(res.step_new_tokens.sum(axis=1) > 0)
    per = np.zeros((res.num_steps, D), dtype=np.int64)
    np.add.at(per, (res.chunk_step, res.chunk_replica), res.chunk_q)
    np.testing.assert_array_equal(per, res.step_new_tokens)
    if max_req is not None:
        assert res.step_chunks.max() <= max_req
    # no request is computed before it arrives
    assert np.all(res.step_start_s[res.chunk_step] >= res.arrival_s[res.chunk_request])


# ------------------------------------------------------------------------------------------ PrefixCache
def test_prefix_cache_match_and_touch():
    c = PrefixCache(8)
    assert c.insert([1, 2, 3]) == 3 and len(c) == 3
    assert c.lru_order() == [3, 2, 1]  # chain touched deepest first: its head is most recent
    assert c.match([1, 2, 3, 4]) == 3 and c.match([1, 9, 3]) == 1 and c.match([2, 3]) == 2 and c.match([5]) == 0
    c.insert([4, 5])
    assert c.lru_order()[-2:] == [5, 4]
    c.match([1, 2], touch=False)
    assert c.lru_order()[-2:] == [5, 4]
    c.match([1, 2])  # a hit touches the matched blocks, not the rest
    assert c.lru_order() == [3, 5, 4, 2, 1]
    assert c.insert([1, 2, 3]) == 0


def test_prefix_cache_lru_eviction():
    c = PrefixCache(4)
    c.insert([1, 2])
    c.insert([10, 11])
    c.match([1])  # 1 becomes most recent; LRU order now 2, 11, 10, 1
    assert c.lru_order() == [2, 11, 10, 1]
    c.insert([20])  # evicts 2 (a chain tail) first
    assert 2 not in c and 1 in c and c.evictions == 1
    c.insert([1, 30, 31])  # touches 1, evicts 11 and 10 (never its own block 1)
    assert set(c.lru_order()) == {1, 30, 31, 20} and c.evictions == 3
    assert c.match([1, 30, 31]) == 3


def test_prefix_cache_long_chain_keeps_its_head():
    c = PrefixCache(3)
    c.insert(list(range(10)))  # only the first capacity blocks are kept: a suffix alone is useless
    assert sorted(c.lru_order()) == [0, 1, 2] and c.match(list(range(10))) == 3
    with pytest.raises(ValueError, match="capacity_blocks"):
        PrefixCache(0)


# ---------------------------------------------------------------------------------------------- Router
def _caches(*chains, cap=64):
    out = []
    for chain in chains:
        c = PrefixCache(cap)
        if chain:
            c.insert(chain)
        out.append(c)
    return out


def test_round_robin_cycles():
    r = Router("round_robin", 3)
    caches = _caches([], [], [])
    loads = np.array([0, 100, 5])
    assert [r.choose([1], loads, caches) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_least_loaded_picks_smallest_queue():
    r = Router("least_loaded", 4)
    caches = _caches([1, 2, 3], [], [], [])
    assert r.choose([1, 2, 3], np.array([5, 9, 3, 7]), caches) == 2
    assert r.choose([1], np.array([4, 2, 2, 9]), caches) == 1  # ties: lowest index


def test_power_of_two_seeded():
    D, loads, caches = 8, np.array([30, 10, 50, 0, 70, 20, 60, 40]), _caches(*[[]] * 8)
    r1, r2 = Router("power_of_two", D, seed=7), Router("power_of_two", D, seed=7)
    s1 = [r1.choose([1], loads, caches) for _ in range(50)]
    s2 = [r2.choose([1], loads, caches) for _ in range(50)]
    assert s1 == s2
    r3 = Router("power_of_two", D, seed=8)
    assert [r3.choose([1], loads, caches) for _ in range(50)] != s1
    rng = np.random.default_rng(7)  # each choice is the less loaded of two distinct uniform draws
    for got in s1:
        x, y = rng.choice(D, size=2, replace=False)
        assert got == (y if loads[y] < loads[x] else x)
    assert 4 not in s1  # the most loaded replica always loses its duel
    with pytest.raises(ValueError, match="num_replicas >= 2"):
        Router("power_of_two", 1)


def test_prefix_only_longest_match_then_least_loaded():
    r = Router("prefix_only", 4)
    caches = _caches([1, 2], [1, 2, 3], [1, 2, 3], [9])
    assert r.choose([1, 2, 3, 4], np.array([0, 50, 40, 0]), caches) == 2  # longest match, tie → less loaded
    assert r.choose([1, 7], np.array([30, 10, 20, 0]), caches) == 1  # all match 1 block among 0..2 → least loaded
    assert r.choose([5], np.array([3, 2, 1, 4]), caches) == 2  # no match anywhere → least loaded
    before = caches[1].lru_order()
    r.choose([1, 2, 3], np.zeros(4), caches)
    assert caches[1].lru_order() == before  # scoring does not touch the caches


def test_unknown_policy_lists_valid_ones():
    with pytest.raises(ValueError, match="round_robin.*least_loaded.*power_of_two.*prefix_only"):
        Router("random", 8)
    with pytest.raises(ValueError, match="unknown placement policy"):
        simulate_prefill(load_mooncake_sample(limit=3), step_time=max_tokens_step, policy="lmetric")


# ---------------------------------------------------------------------------------------------- serve
def test_serve_hand_example():
    # D=2, 1 s per step; two requests of 2 blocks each sharing block 5.
    tr = make_trace([0.0, 0.5, 10.0, 12.0], [1024, 1000, 600, 1024], [[5, 6], [5, 7], [8, 9], [5, 6]])
    res = simulate_prefill(tr, step_time=lambda b: 1.0, num_replicas=2, policy="round_robin", max_batch_tokens=800)
    # r0 on replica 0: 1024 tokens in chunks 800 + 224 (steps [0,1], [1,2]); r1 on replica 1, arrives during
    # step 0 (placed then, scheduled at t=1): chunks 800 + 200 in [1,2], [2,3].
    np.testing.assert_array_equal(res.replica, [0, 1, 0, 1])
    np.testing.assert_allclose(res.completion_s, [2.0, 3.0, 11.0, 13.0])
    np.testing.assert_allclose(res.ttft_s, [2.0, 2.5, 1.0, 1.0])
    np.testing.assert_allclose(res.step_start_s, [0, 1, 2, 10, 12])  # idle gap: the next step waits for r2
    # r3 (replica 1) finds block 5 only (r1 inserted [5, 7] at completion); r0's [5, 6] is on replica 0.
    np.testing.assert_array_equal(res.hit_tokens, [0, 0, 0, 512])
    np.testing.assert_array_equal(res.step_new_tokens, [[800, 0], [224, 800], [0, 200], [600, 0], [0, 512]])
    check_accounting(res, tr, 800)


def test_hit_cap_and_insertion_at_completion():
    # D=1, same two blocks each. r1 shares r0's batch → no hit (r0's KV is cached only at completion). r2 arrives
    # while r0 is computed but is scheduled after → the hit is fixed at scheduling: full match, capped at I − 1 so
    # one token is computed. r3 long after: same.
    tr = make_trace([0.0, 0.0, 0.1, 5.0], [1024] * 4, [[1, 2]] * 4)
    res = simulate_prefill(tr, step_time=lambda b: 1.0, num_replicas=1, max_batch_tokens=4096)
    np.testing.assert_array_equal(res.hit_tokens, [0, 0, 1023, 1023])
    assert res.chunk_q[res.chunk_request == 2].tolist() == [1]
    np.testing.assert_allclose(res.completion_s, [1.0, 1.0, 2.0, 6.0])
    assert res.cache_hit_rate == pytest.approx(2046 / 4096)


def test_max_batch_requests_and_unchunked():
    tr = make_trace([0.0] * 4, [100, 100, 100, 100], [[1], [2], [3], [4]])
    res = simulate_prefill(tr, step_time=lambda b: 1.0, num_replicas=1, max_batch_tokens=1000, max_batch_requests=3)
    np.testing.assert_array_equal(res.step_chunks[:, 0], [3, 1])
    check_accounting(res, tr, 1000, max_req=3)
    # without chunking, a request waits for room (head of line) instead of being split
    tr2 = make_trace([0.0] * 3, [600, 600, 300], [[1, 2], [3, 4], [5]])
    res2 = simulate_prefill(tr2, step_time=lambda b: 1.0, num_replicas=1, max_batch_tokens=1000, chunked_prefill=False)
    np.testing.assert_array_equal(res2.num_chunks, [1, 1, 1])
    np.testing.assert_array_equal(res2.step_new_tokens[:, 0], [600, 900])
    with pytest.raises(ValueError, match="request 0 needs 1200 new tokens.*never"):
        simulate_prefill(
            make_trace([0.0], [1200], [[1, 2, 3]]),
            step_time=lambda b: 1.0,
            max_batch_tokens=1000,
            chunked_prefill=False,
        )


def test_step_time_contract():
    tr = load_mooncake_sample(limit=40)
    seen = []

    def spy(batches):
        assert isinstance(batches, tuple) and len(batches) == 4
        assert [b.replica for b in batches] == [0, 1, 2, 3]
        for b in batches:
            assert isinstance(b, StepBatch) and b.q.dtype == np.int64
            assert b.request_ids.shape == b.q.shape == b.P.shape == b.I.shape
            assert np.all(b.P + b.q <= b.I) and np.all(b.is_last[:-1])  # only the last chunk can be cut
            assert not b.q.flags.writeable
        seen.append(sum(b.num_chunks for b in batches))
        return 0.5, {"k": len(seen)}

    res = simulate_prefill(tr, step_time=spy, num_replicas=4, max_batch_tokens=8192)
    assert [r["k"] for r in res.step_records] == list(range(1, res.num_steps + 1))
    assert res.alb_source == "new_tokens"
    for bad in (0.0, -1.0, float("nan"), float("inf"), "1", (None, None)):
        with pytest.raises(ValueError, match="step_time"):
            simulate_prefill(tr, step_time=lambda b, bad=bad: bad, num_replicas=4)
    for kw in ({"max_batch_tokens": 0}, {"cache_blocks": 0}, {"num_replicas": 0}, {"max_batch_requests": 0}):
        with pytest.raises(ValueError, match=next(iter(kw))):
            simulate_prefill(tr, step_time=max_tokens_step, **kw)


def test_alb_from_attention_records():
    tr = make_trace([0.0, 0.0], [100, 300], [[1], [2]])

    def layered(batches):  # [L=2, D=2] attention times: ALB per layer (0.5+1)/2/1 = 0.75 and 0 rows excluded
        return 1.0, {"attention_s": np.array([[0.5, 1.0], [0.0, 0.0]])}

    res = simulate_prefill(tr, step_time=layered, num_replicas=2, policy="round_robin")
    assert res.alb_source == "attention_s"
    np.testing.assert_allclose(res.alb_per_step, [0.75])
    assert res.alb_mean == pytest.approx(0.75)
    with pytest.raises(ValueError, match=r"attention_s must be finite \[D\] or \[L, D\] with D = 3"):
        _ = simulate_prefill(tr, step_time=layered, num_replicas=3).alb_mean
    proxy = simulate_prefill(tr, step_time=max_tokens_step, num_replicas=2, policy="round_robin")
    assert proxy.alb_source == "new_tokens" and proxy.alb_mean == pytest.approx(200 / 300)


@pytest.mark.parametrize("policy", PLACEMENT_POLICIES)
def test_serve_sample_all_policies(policy):
    tr = load_mooncake_sample()
    res = simulate_prefill(tr, step_time=TOY, policy=policy, max_batch_tokens=8192, cache_blocks=2048, seed=1)
    check_accounting(res, tr, 8192)
    s = res.summary()
    assert s["completed"] == len(tr) and s["alb_source"] == "attention_s"
    assert s["prompt_throughput_tps"] == pytest.approx(tr.total_input_tokens / s["makespan_s"])
    assert s["computed_throughput_tps"] == pytest.approx(s["prompt_throughput_tps"] * (1 - s["cache_hit_rate"]))
    assert 0 < s["alb_mean"] <= 1 and s["ttft_p95_s"] >= np.median(res.ttft_s)
    assert np.bincount(res.replica, minlength=8).min() > 0


def test_policy_ordering_on_repeated_prefixes():
    # Sample: conversations repeat their history; only prefix_only follows it.
    sample = load_mooncake_sample()
    hits = {
        p: simulate_prefill(sample, step_time=TOY, policy=p, cache_blocks=4096).cache_hit_rate
        for p in PLACEMENT_POLICIES
    }
    assert max(hits, key=hits.get) == "prefix_only" and hits["prefix_only"] > 2 * hits["round_robin"]
    # Many long shared prompts, small caches: prefix_only trades attention balance for cache hits (Fig. 2).
    tr = synthetic_requests(
        600,
        rate_rps=8,
        seed=0,
        mean_input=10_000,
        num_families=32,
        prefix_blocks=16,
        shared_fraction=0.9,
        min_input=16 * 512 + 512,
    )
    res = {p: simulate_prefill(tr, step_time=TOY, policy=p, cache_blocks=128) for p in PLACEMENT_POLICIES}
    hit = {p: r.cache_hit_rate for p, r in res.items()}
    alb = {p: r.alb_mean for p, r in res.items()}
    assert max(hit, key=hit.get) == "prefix_only" and hit["prefix_only"] > 2 * max(
        hit[p] for p in PLACEMENT_POLICIES if p != "prefix_only"
    )
    assert min(alb, key=alb.get) == "prefix_only" and alb["least_loaded"] > alb["prefix_only"] + 0.05


def test_load_balancing_beats_round_robin_under_load():
    tr = load_mooncake_sample().scale_rate(6.0)
    rr = simulate_prefill(tr, step_time=TOY, policy="round_robin")
    ll = simulate_prefill(tr, step_time=TOY, policy="least_loaded")
    assert ll.ttft_p95_s < rr.ttft_p95_s and ll.alb_mean > rr.alb_mean


@given(
    rows=st.lists(st.tuples(st.floats(0, 3), st.integers(1, 3000), st.integers(0, 3)), min_size=1, max_size=25),
    D=st.integers(1, 4),
    policy=st.sampled_from(PLACEMENT_POLICIES),
    budget=st.integers(1, 2500),
    max_req=st.one_of(st.none(), st.integers(1, 4)),
    cache=st.integers(1, 8),
)
def test_accounting_hypothesis(rows, D, policy, budget, max_req, cache):
    # prompt families: family f's block k has id 100 f + k; the rest fresh ids
    arrival = np.cumsum([r[0] for r in rows])
    lengths = [r[1] for r in rows]
    blocks, fresh = [], 10_000
    for _, length, fam in rows:
        nb = -(-length // 64)
        shared = min(nb, 3)
        ids = [100 * fam + k for k in range(shared)] + list(range(fresh, fresh + nb - shared))
        fresh += nb
        blocks.append(ids)
    tr = make_trace(arrival, lengths, blocks, block_size=64)
    if policy == "power_of_two" and D < 2:
        D = 2
    res = simulate_prefill(
        tr,
        step_time=max_tokens_step,
        num_replicas=D,
        policy=policy,
        max_batch_tokens=budget,
        max_batch_requests=max_req,
        cache_blocks=cache,
        seed=3,
    )
    check_accounting(res, tr, budget, max_req)
