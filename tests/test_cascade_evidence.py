"""CascadeEP modelling choices a reviewer asks for (issue 39): OEWF's weight fetches as protected transfers (App. E;
FIFO kept as the ``links="fifo"`` ablation) and the donor's original launch eligibility (App. C)."""

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_cascade_sim import COSTS, _inputs

from tempo_jax.sim.cascade import CascadeConfig
from tempo_jax.sim.cascade.reference_timeline import LayerInputs, idle_fill, layer_timeline


def _brute_fill(start: float, occupancy: float, busy, step: float = 1e-3) -> float:
    """`idle_fill` by walking a fine time grid (the independent reference)."""
    t, left = start, occupancy
    while left > 1e-9:
        if not any(s <= t < e for s, e in busy):
            left -= step
        t += step
    return t


@given(
    start=st.floats(0, 5),
    occupancy=st.floats(0.01, 3),
    gaps=st.lists(st.tuples(st.floats(0.05, 2), st.floats(0.05, 2)), max_size=4),
)
def test_a_protected_transfer_runs_in_the_port_idle_time(start, occupancy, gaps):
    busy, t = [], 0.0
    for idle, hold in gaps:
        busy.append((t + idle, t + idle + hold))
        t += idle + hold
    got = idle_fill(start, occupancy, busy)
    assert got >= start + occupancy - 1e-12
    assert got == pytest.approx(_brute_fill(start, occupancy, busy), abs=5e-3)


def test_protected_fetches_never_delay_a_dispatch_or_a_chunk_while_fifo_ones_can():
    """Under protected transfers every dispatch and every chunk arrival is what it is without OEWF; FIFO fetches
    queue ahead of a straggler's dispatch on its send port and delay it (the ablation)."""
    delayed = 0
    for seed in range(16):
        inp = _inputs(seed, noise=0.3)
        base = layer_timeline(dataclasses.replace(inp, oewf=False), COSTS, "cascade")
        prot = layer_timeline(inp, COSTS, "cascade")
        fifo = layer_timeline(inp, COSTS, "cascade", links="fifo")
        np.testing.assert_array_equal(prot.ready_us, base.ready_us)
        np.testing.assert_array_equal(prot.arrival_us, base.arrival_us)
        assert prot.accepted[:1] == fifo.accepted[:1]  # the first decision is the same (later ones see the delays)
        delayed += bool((fifo.ready_us > base.ready_us + 1e-9).any() or (fifo.arrival_us > base.arrival_us).any())
    assert delayed > 0


def test_a_fetch_issued_before_the_donors_dispatch_yields_to_it():
    """Every other rank fetches from the straggler (rank 1): under FIFO the fetches hold rank 1's send port when its
    attention ends, its dispatch waits, and OEWF makes the layer longer than without it; protected, the dispatch
    leaves on time, the fetches finish after it, and OEWF shortens the layer."""
    D, E = 8, 256
    pairs = np.zeros((D, D, E))
    pairs[:, 1, :32] = 400.0  # every source sends rank 1's experts 0..31 plenty
    pairs[np.arange(D), np.arange(D), 100] = 50.0
    pairs[1, 2, 120] = 20_000.0  # the straggler has a dispatch of its own to send
    att = np.array([100.0, 800.0, 200, 300, 400, 500, 550, 580])
    sent = pairs.sum(axis=2)
    disp = COSTS.exchange_us((sent * (1 - np.eye(D))).sum(axis=1), COSTS.dispatch_bytes_per_pair)
    inp = LayerInputs(attention_us=att, dispatch_us=disp, pairs=pairs, oewf=True)
    base = layer_timeline(dataclasses.replace(inp, oewf=False), COSTS, "cascade")
    prot, fifo = (layer_timeline(inp, COSTS, "cascade", links=k) for k in ("contention", "fifo"))
    assert prot.accepted and prot.accepted[0].donor == 1
    assert prot.ready_us[1] == base.ready_us[1] < fifo.ready_us[1]
    assert prot.end_us < base.end_us < fifo.end_us


def test_donors_are_the_ranks_still_in_attention():
    """§3.3: a helper's donor is a rank still in attention at the helper's instant. With noisy estimates some ranks
    are predicted in attention after they finished it (their dispatch already on its port): they are no donors,
    and no move is dropped for arriving after its donor's dispatch left (the old rule took 69 of 1,688 such moves,
    all dropped)."""
    stale = moves = 0
    for seed in range(24):
        inp = _inputs(seed, noise=0.3)
        run = layer_timeline(inp, COSTS, "cascade")
        a, est = inp.attention_us, inp.attention_est_us
        for r in run.accepted:
            t = run.ready_us[r.helper]
            assert a[r.donor] > t, (seed, r)
            stale += int(((est > t) & (a <= t) & (run.ready_us > t)).sum())
            moves += 1
    assert moves > 10 and stale > 0  # the rule had ranks to refuse


def test_a_doomed_fetch_yields_to_the_donors_combines():
    """App. E: weight fetching does not delay the current plan. Rank 1 is predicted in attention until 800 µs but
    leaves it at 220: the seven helpers' fetches from it spill past its dispatch, all arrive after it and are
    dropped. What is left of them yields to rank 1's combines, so every rank ends as without OEWF (FIFO behind the
    dispatch, they held rank 1's send port ahead of its combines and delayed every rank by 0.4–1.0 ms)."""
    D, E = 8, 256
    pairs = np.zeros((D, D, E))
    pairs[:, 1, :32] = 5.0
    pairs[np.arange(D), np.arange(D), 100] = 50.0
    pairs[1, 2, 120] = 20_000.0  # rank 1's own dispatch
    att = np.full(D, 100.0)
    att[1] = 220.0
    est = att.copy()
    est[1] = 800.0
    sent = pairs.sum(axis=2)
    disp = COSTS.exchange_us((sent * (1 - np.eye(D))).sum(axis=1), COSTS.dispatch_bytes_per_pair)
    inp = LayerInputs(attention_us=att, dispatch_us=disp, pairs=pairs, attention_est_us=est, oewf=True)
    base = layer_timeline(dataclasses.replace(inp, oewf=False), COSTS, "cascade")
    run = layer_timeline(inp, COSTS, "cascade")
    assert len(run.accepted) == run.dropped == 7 and not run.side
    assert all(r.donor == 1 for r in run.accepted)
    np.testing.assert_array_equal(run.rank_end_us, base.rank_end_us)


def test_a_donor_keeps_its_launch_eligibility():
    """App. C: tokens moved to a helper leave the donor's launch groups as they were planned without the move (the
    groups' source sets are those of the run without OEWF; only their token counts shrink)."""
    checked = 0
    for seed in range(16):
        inp = _inputs(seed, noise=0.3)
        base = layer_timeline(dataclasses.replace(inp, oewf=False), COSTS, "cascade")
        run = layer_timeline(inp, COSTS, "cascade")
        for r in run.accepted:
            if any(s.donor == r.donor for s in run.side):
                want = [k.sources for k in base.kernels[r.donor]]
                assert [k.sources for k in run.kernels[r.donor]] == want
                assert sum(k.tokens for k in run.kernels[r.donor]) < sum(k.tokens for k in base.kernels[r.donor])
                checked += 1
    assert checked > 0


def test_combines_are_charged_to_the_receiving_port():
    """Rank 0 sends equal work to ranks 1 and 2, which finish together and return their outputs at once: rank 0's
    receive port carries one combine after the other, so the layer ends two transfers after the kernels (plus the
    latency), not one; uncontended (paper) links return both in parallel."""
    D, E = 8, 256
    pairs = np.zeros((D, D, E))
    pairs[0, 1, 32] = pairs[0, 2, 64] = 20_000.0  # experts 32 and 64 live on ranks 1 and 2
    att = np.full(D, 1000.0)
    disp = COSTS.exchange_us((pairs.sum(axis=2) * (1 - np.eye(D))).sum(axis=1), COSTS.dispatch_bytes_per_pair)
    inp = LayerInputs(attention_us=att, dispatch_us=disp, pairs=pairs, oewf=False)
    hw = COSTS.hardware
    occ = 20_000.0 * COSTS.combine_bytes_per_pair / hw.link_bytes_per_us
    for links in ("contention", "fifo"):
        r = layer_timeline(inp, COSTS, "sync", links=links)
        k1, k2 = r.kernels[1][0], r.kernels[2][0]
        assert k1.end_us == k2.end_us  # the same work, at the same time
        assert r.end_us == pytest.approx(k1.end_us + 2 * occ + hw.link_latency_us, rel=1e-12)
        assert r.rank_end_us[0] == r.end_us and r.rank_end_us[1] == pytest.approx(k1.end_us + occ + hw.link_latency_us)
    paper = layer_timeline(inp, COSTS, "sync", links="paper")
    assert paper.end_us == pytest.approx(paper.kernels[1][0].end_us + occ + hw.link_latency_us, rel=1e-12)


def test_a_receive_port_serves_dispatch_and_combine_chunks_in_one_fifo_by_issue_time():
    """Rank 1 computes rank 0's tokens and returns them while the straggler (rank 2) is still in attention; rank 2's
    dispatch chunk into rank 0 is issued while that combine holds rank 0's receive port: it waits behind the combine
    (issued first), and the combine is not delayed by it. The old rule (every dispatch chunk into a rank ahead of
    every combine into it) would deliver the chunk at rank 2's dispatch end and the combine after it."""
    D, E = 8, 256
    hw = COSTS.hardware
    pairs = np.zeros((D, D, E))
    pairs[0, 1, 32] = 20_000.0  # rank 0 → expert 32 on rank 1
    pairs[2, 0, 0] = 5_000.0  # the straggler → expert 0 on rank 0

    def run(a2: float, links: str = "contention"):
        att = np.full(D, 1000.0)
        att[2] = a2
        disp = COSTS.exchange_us((pairs.sum(axis=2) * (1 - np.eye(D))).sum(axis=1), COSTS.dispatch_bytes_per_pair)
        return layer_timeline(LayerInputs(attention_us=att, dispatch_us=disp, pairs=pairs, oewf=False), COSTS, "async")

    c0 = run(1e6).kernels[1][0].end_us  # when rank 1's combine leaves (its send port is free: it dispatched nothing)
    occ_c = 20_000.0 * COSTS.combine_bytes_per_pair / hw.link_bytes_per_us
    occ_d = 5_000.0 * COSTS.dispatch_bytes_per_pair / hw.link_bytes_per_us
    a2 = c0 + occ_c / 2  # rank 2 starts dispatching halfway through the combine into rank 0
    r = run(a2)
    assert r.kernels[1][0].end_us == c0 and r.ready_us[2] == pytest.approx(a2 + hw.link_latency_us + occ_d)
    # the chunk waits for the combine: it holds rank 0's port from the combine's end
    assert r.arrival_us[2, 0] == pytest.approx(c0 + occ_c + occ_d + hw.link_latency_us, rel=1e-12)
    assert r.arrival_us[2, 0] > r.ready_us[2] + occ_c / 4
    assert r.kernels[0][0].start_us == r.arrival_us[2, 0]
    # rank 0 is done when its outputs to rank 2 have left and rank 1's combine is back: one transfer after it
    # left, not after the chunk
    k0 = r.kernels[0][0]
    combine_back = c0 + occ_c + hw.link_latency_us
    back_to_2 = k0.end_us + occ_d * COSTS.combine_bytes_per_pair / COSTS.dispatch_bytes_per_pair + hw.link_latency_us
    assert r.rank_end_us[0] == pytest.approx(max(combine_back, back_to_2), rel=1e-12)
    assert r.rank_end_us[2] == pytest.approx(back_to_2, rel=1e-12)


def test_the_layers_own_schedule_is_one_partition_shared_by_every_rank():
    """launch='layer' runs what `tempo_jax.layer.cascade_exec` executes: every destination launches the same source
    groups — `LaunchSchedule.from_arrivals` on the predicted arrivals and the mean predicted tokens per
    destination — while 'planned' may group each destination's sources differently."""
    from solvers import LaunchSchedule

    differs = 0
    for seed in range(8):
        inp = _inputs(seed, noise=0.3, oewf=False)
        ready_est = inp.attention_est_us + inp.dispatch_us
        want = LaunchSchedule.from_arrivals(ready_est, inp.pairs_est.sum(axis=2), threshold=float(COSTS.threshold))
        layer = layer_timeline(inp, COSTS, "async_sf", launch="layer")
        planned = layer_timeline(inp, COSTS, "async_sf", launch="planned")
        for d in range(inp.num_ranks):
            got = tuple(tuple(k.sources) for k in layer.kernels[d])
            assert got == tuple(tuple(g) for g in want.groups if inp.pairs[list(g), d].sum() > 0), (seed, d)
        differs += any(
            tuple(k.sources for k in planned.kernels[d]) != tuple(k.sources for k in layer.kernels[d])
            for d in range(inp.num_ranks)
        )
    assert differs > 0
    with pytest.raises(ValueError, match="one schedule on every rank"):
        layer_timeline(inp, COSTS, "async_sf", launch="layer", guard=True)


# ------------------------------------------------------------------------------------------------ seeds
def test_a_rotated_trace_keeps_every_request_and_gap():
    from tempo_jax.workloads.requests import load_request_trace

    t = load_request_trace("mooncake_conversation", sample=True).head(50)
    r = t.rotate(20)
    assert len(r) == len(t) and r.arrival_s[0] == 0.0 and (np.diff(r.arrival_s) >= 0).all()
    np.testing.assert_array_equal(r.input_len, np.concatenate([t.input_len[20:], t.input_len[:20]]))
    np.testing.assert_allclose(np.diff(r.arrival_s[:30]), np.diff(t.arrival_s[20:]))
    np.testing.assert_allclose(np.diff(r.arrival_s[30:]), np.diff(t.arrival_s[:20]))
    for i, j in ((0, 20), (30, 0), (49, 19)):
        np.testing.assert_array_equal(r.blocks(i), t.blocks(j))
    assert t.rotate(0) is t and t.rotate(50) is t


def test_a_seed_draws_a_workload_and_seed_0_is_the_recording():
    from tempo_jax.sim.cascade import cascade_trace, workload_draw
    from tempo_jax.sim.cascade.step_model import _routing_popularity

    base = CascadeConfig(trace="mooncake_sample", max_requests=40)
    one, fixed = dataclasses.replace(base, seed=1), dataclasses.replace(base, seed=1, vary_workload=False)
    assert workload_draw(0, num_requests=9, recorded_layers=8, layers=4, experts=16)["expert_perm"] is None
    d1 = workload_draw(1, num_requests=1000, recorded_layers=8, layers=4, experts=16)
    again = workload_draw(1, num_requests=1000, recorded_layers=8, layers=4, experts=16)
    assert again["start"] == d1["start"] and np.array_equal(again["expert_perm"], d1["expert_perm"])
    assert sorted(d1["expert_perm"][0]) == list(range(16)) and d1["start"] > 0
    t0, t1, tf = (cascade_trace(c) for c in (base, one, fixed))
    assert not np.array_equal(t0.input_len, t1.input_len) and np.array_equal(t0.input_len, tf.input_len)
    p0, p1, pf = (_routing_popularity(c) for c in (base, one, fixed))
    assert not np.allclose(p0, p1) and np.array_equal(p0, pf)
    np.testing.assert_allclose(np.sort(p1, axis=1).sum(axis=1), 1.0)  # still one distribution per layer


def test_seeds_serve_disjoint_windows_of_the_trace():
    """Seed k serves requests [k · n, (k + 1) · n) of the trace (n = max_requests): no request in two seeds' runs
    while the trace holds them (the draws it replaces shared up to 738 of 1,000 requests between two seeds); past
    that, windows wrap around."""
    from tempo_jax.sim.cascade import cascade_trace

    base = CascadeConfig(trace="mooncake_sample", max_requests=40)
    full = cascade_trace(dataclasses.replace(base, max_requests=None))  # 400 requests
    for k in range(12):
        t = cascade_trace(dataclasses.replace(base, seed=k))
        i = (40 * k + np.arange(40)) % len(full)
        np.testing.assert_array_equal(t.input_len, full.input_len[i])
        np.testing.assert_array_equal(np.diff(t.arrival_s)[:-1], np.diff(full.arrival_s[i])[:-1])


def test_each_seed_runs_at_its_own_operating_point():
    """Per-seed operating points: `capacity_rps_seeds` measures Sync's capacity on each seed's own workload and
    `run_cascade_seeds(rates=)` serves each seed at its own rate; a seed without a rate is refused."""
    from tempo_jax.sim.cascade import run_cascade_seeds
    from tempo_jax.sim.cascade.summary import capacity_rps, capacity_rps_seeds

    cfg = CascadeConfig(trace="mooncake_sample", max_requests=24)
    kw = dict(workers=1, cache_dir=None, progress=False)
    caps = capacity_rps_seeds(cfg, (0, 1), **kw)
    assert caps[0] == pytest.approx(capacity_rps(cfg, **kw)[1]) and caps[0] != caps[1]
    rates = {s: 0.9 * c for s, c in caps.items()}
    runs = run_cascade_seeds(cfg, ("sync",), seeds=(0, 1), rates=rates, **kw)
    for s in (0, 1):
        assert runs[s]["sync"].config.rate_rps == rates[s] and runs[s]["sync"].config.seed == s
    with pytest.raises(ValueError, match=r"no rate for seeds \[1\]"):
        run_cascade_seeds(cfg, ("sync",), seeds=(0, 1), rates={0: 1.0}, **kw)
    with pytest.raises(ValueError, match="rates\\[0\\]"):
        run_cascade_seeds(cfg, ("sync",), seeds=(0,), rates={0: 0.0}, **kw)


def test_orders_are_claimed_from_paired_differences():
    from tempo_jax.sim.cascade.summary import ordering, paired_difference

    rng = np.random.default_rng(0)
    common = rng.normal(1.0, 0.3, 12)  # a workload effect shared by both modes, seed by seed
    a, b = common + 0.01 + rng.normal(0, 0.002, 12), common
    p = paired_difference(a, b)
    assert p["order"] == ">" and p["wins"] == 12 and p["sign_p"] < 1e-3 and p["ci95"][0] > 0
    assert paired_difference(b, a)["order"] == "<"
    assert paired_difference(a[:5], b[:5])["order"] == "≈"  # 5 seeds: no sign test reaches p < 0.05
    noisy = common + rng.normal(0, 0.02, 12)
    assert paired_difference(noisy, b)["order"] == "≈"
    summary = {m: {"ttft_mean_s": {"per_seed": list(v)}} for m, v in (("sync", a), ("async", b), ("async_sf", b))}
    assert ordering(summary) == "Sync > Async ≈ Async+SF"
    with pytest.raises(ValueError, match="one length"):
        paired_difference([1.0, 2.0], [1.0])


# ------------------------------------------------------------------------------------------------ attribution
def test_gain_attribution_replays_the_served_steps_with_the_same_inputs():
    """The attribution replays each served step (same batches, noise and routing draws) under every variant, so
    every variant runs at one utilisation: the Sync replay reproduces the Sync run's own layer times exactly, the
    parts add up to CascadeEP's forward-time cut, and with a free combine there is no combine overlap to find."""
    from tempo_jax.sim.cascade import run_cascade
    from tempo_jax.sim.cascade.summary import layer_attribution

    cfg = CascadeConfig(trace="mooncake_sample", max_requests=30, rate_rps=8.0)
    sync = run_cascade(cfg, ("sync",), workers=1, cache_dir=None, progress=False)["sync"]
    a = layer_attribution(sync)
    assert a["steps"] == len(sync.records)
    assert a["sync_us"] == pytest.approx(float(sync.layer_us.sum()), rel=1e-12)
    parts = a["early_ffn"] + a["combine_overlap"] + a["oewf"]
    assert parts == pytest.approx(1 - a["cascade_us"] / a["sync_us"], rel=1e-9, abs=1e-12)
    assert a["combine_overlap"] > 0  # outputs travelling while later kernels run
    free = run_cascade(
        dataclasses.replace(cfg, combine_scale=0.0), ("sync",), workers=1, cache_dir=None, progress=False
    )["sync"]
    assert layer_attribution(free, steps=5)["combine_overlap"] == pytest.approx(0.0, abs=1e-12)
    assert layer_attribution(free, steps=5)["steps"] == 5


def test_r_tail_is_appendix_as_at_dispatch_entry_over_wall_clock_time():
    """App. A, Eq. 7: w_d = max_j r_j − r_d with r_d the entry into dispatch (the end of attention, not the dispatch's
    completion), summed over layer forwards and replicas, over D · T_E2E (first arrival to the last first token,
    not the engine's busy time)."""
    from tempo_jax.sim.cascade import run_cascade

    cfg = CascadeConfig(trace="mooncake_sample", max_requests=40, rate_rps=6.0)
    run = run_cascade(cfg, ("sync",), workers=1, cache_dir=None, progress=False)["sync"]
    gaps = sum(float((r.attention_s.max(axis=1, keepdims=True) - r.attention_s).sum()) for r in run.records)
    e2e = run.prefill.completion_s.max() - run.prefill.arrival_s.min()
    assert run.e2e_s == pytest.approx(e2e) and run.e2e_s > run.busy_s  # the engine idles between steps here
    assert run.tail_ratio == pytest.approx(gaps / (cfg.num_ranks * e2e), rel=1e-9)


def test_the_key_budget_sets_the_imbalance_between_sparse_and_dense():
    """R_tail grows with sparse attention's key budget (the knob notebook 09 matches the paper's R_tail with); the
    budget is refused with dense attention."""
    from tempo_jax.sim.cascade import run_cascade

    base = CascadeConfig(trace="mooncake_sample", max_requests=40, rate_rps=6.0, attention="sparse")
    tails = [
        run_cascade(dataclasses.replace(base, key_budget=b), ("sync",), workers=1, cache_dir=None, progress=False)[
            "sync"
        ].tail_ratio
        for b in (256, 4096, 1 << 20)
    ]
    assert tails[0] < tails[1] < tails[2]
    with pytest.raises(ValueError, match="key_budget=512 acts only with attention='sparse'"):
        CascadeConfig(key_budget=512)
