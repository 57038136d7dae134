"""In-graph dispatch (issue 38): pairwise relief in numpy (`solvers.relief`, the ``"relief"`` policy) and in the
jitted step (`tempo_jax.layer.relief`, ``MoEConfig(dispatch="ingraph")``): the two agree, the plan is realised token
for token, the output and gradients do not depend on it, and what it cannot price is refused."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given
from hypothesis import strategies as st
from numeric import assert_close, assert_trees_close

import tempo_jax
from solvers import PRESETS, CostModel, DispatchProblem, Placement, slots_for, solve
from solvers.relief import relief as relief_np
from solvers.relief import replica_ranks, source_quotas
from tempo_jax.layer import MoEConfig, init_params, make_ep_mesh, moe_forward, relief
from tempo_jax.layer import tables as dispatch_tables
from tempo_jax.runtime import DispatchController
from tempo_jax.workloads import SyntheticRouting

D, E, S = 8, 16, 4
COST = PRESETS["dsv3_fp8_offline"]


def _problem(s: float, B: int, ep: int = 8, experts: int = 64, seed: int = 0) -> DispatchProblem:
    routing = SyntheticRouting(num_experts=experts, top_k=8, s=s, kappa=math.inf, seed=seed)
    pl = Placement.from_eplb(routing.popularity, slots_for(experts, ep, 1.25), ep, spread_idle=True)
    return DispatchProblem(routing.batch(B, ep, 0), pl, COST)


def _makespan(x, ranks, cost, num_ranks):
    out = np.zeros((x.shape[0], num_ranks))
    ok = ranks >= 0
    np.add.at(out, (np.nonzero(ok)[0], ranks[ok]), np.asarray(x, np.float64)[ok])
    return cost.makespan(out)


# ------------------------------------------------------------------------------------------------ the solver
def test_worked_example_reaches_the_optimum():
    """TEMPO Fig. 1b (docs/algorithms.md §1): one hot expert (600) and six cold (30), 2 ranks, full replication,
    b = 15, β = 0.1: token balancing 105, activation balancing 69, the makespan optimum 60 (split only the hot one)."""
    cost = CostModel(a=0.0, b=15.0, c=0.0, beta=0.1)
    problem = DispatchProblem(np.array([600, 30, 30, 30, 30, 30, 30]), Placement.full(7, 2), cost)
    d = solve(problem, "relief")
    assert d.makespan == 60.0 and solve(problem, "token_lp").makespan == 105.0
    assert solve(problem, "metro").makespan == 69.0
    assert np.count_nonzero(d.x[0]) == 2 and all(np.count_nonzero(d.x[e]) == 1 for e in range(1, 7))


@pytest.mark.parametrize("s, B", [(0.6, 16), (1.2, 128), (2.0, 512), (1.2, 4096)])
def test_relief_is_near_tempo_and_exact_in_tokens(s, B):
    problem = _problem(s, B)
    d = solve(problem, "relief")
    assert np.array_equal(d.x.sum(axis=1), problem.n) and np.array_equal(d.x, np.round(d.x))
    assert d.makespan <= 1.05 * solve(problem, "tempo").makespan


@pytest.mark.parametrize(
    "s, B", [pytest.param(0.6, 32, marks=pytest.mark.slow), (1.2, 256), pytest.param(2.0, 2048, marks=pytest.mark.slow)]
)
def test_in_graph_relief_equals_its_numpy_twin(s, B):
    """The jitted float32 relief and the numpy float64 twin: the same makespan (their shares may differ where two
    moves tie to the last bit)."""
    problem = _problem(s, B)
    pl = problem.placement
    ranks = replica_ranks(pl.log2phy, pl.slots_per_rank)
    want = relief_np(problem.n, ranks, COST, pl.num_gpus)
    run = jax.jit(lambda n, r: relief.relief(n, r, COST, pl.num_gpus, num_slots=pl.num_slots))
    got = np.asarray(run(jnp.asarray(problem.n, jnp.float32), jnp.asarray(ranks, jnp.int32)), np.float64)
    np.testing.assert_array_equal(got.sum(axis=1), problem.n)
    np.testing.assert_array_equal(relief.replica_ranks(jnp.asarray(pl.log2phy), pl.slots_per_rank), ranks)
    assert _makespan(got, ranks, COST, pl.num_gpus) == pytest.approx(
        _makespan(want, ranks, COST, pl.num_gpus), rel=1e-6
    )


def _stale(seed: int, ep: int, experts: int, tokens_per_rank: int) -> DispatchProblem:
    """A stale placement (every expert once, ep·S − E spare slots to random experts, shuffled) and one hot expert:
    expert 0 in every token's top-k, the other k − 1 uniform (k = 4 at E = 32, else 8)."""
    rng = np.random.default_rng(seed)
    phy2log = np.r_[np.arange(experts), rng.integers(0, experts, experts // 2)]
    rng.shuffle(phy2log)
    n = np.zeros(experts)
    k = 4 if experts == 32 else 8
    for _ in range(tokens_per_rank * ep):
        n[np.r_[0, rng.choice(np.arange(1, experts), k - 1, replace=False)]] += 1
    return DispatchProblem(n, Placement.from_phy2log(phy2log, ep, None, experts), COST)


@pytest.mark.parametrize("seed, ep, experts, B", [(2, 8, 32, 16), (5, 16, 64, 2), (5, 16, 64, 16)])
def test_hand_off_paths_reach_the_optimum_where_pairwise_moves_stop(seed, ep, experts, B):
    """Issue 52, item 3: on these stale placements, in the flat regime, pairwise moves and two-step chains stopped
    at 5 activations on some ranks where the optimum (CP-SAT) puts 4 on each (1.25×). A hand-off path of any
    length from the slowest rank (semi-matching's augmenting path, priced by the time function) reaches it; the
    jitted plan follows the same paths."""
    problem = _stale(seed, ep, experts, B)
    best = solve(problem, "milp", time_limit=300.0)
    assert best.info["status"] == "optimal"
    assert solve(problem, "relief").makespan == pytest.approx(best.makespan, rel=1e-9)
    pl = problem.placement
    ranks = replica_ranks(pl.log2phy, pl.slots_per_rank)
    run = jax.jit(lambda n, r: relief.relief(n, r, COST, ep, num_slots=pl.num_slots))
    got = np.asarray(run(jnp.asarray(problem.n, jnp.float32), jnp.asarray(ranks, jnp.int32)), np.float64)
    np.testing.assert_array_equal(got.sum(axis=1), problem.n)
    assert _makespan(got, ranks, COST, ep) == pytest.approx(best.makespan, rel=1e-6)


def test_relief_is_within_5_percent_of_the_optimum_on_independent_instances():
    """Issue 52, item 3's goal on a CI-sized sample of `scripts/bench_ingraph.py`'s optimum suite (EP8, random and
    EPLB placements, Zipf and hot-expert routing, flat and linear regimes): every instance within 1.05×."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    from bench_ingraph import optimum_instances

    instances = [(k, p) for k, p in optimum_instances(1) if k["ep"] == 8]
    assert len(instances) == 32
    for key, problem in instances:
        best = solve(problem, "milp", time_limit=300.0)
        assert best.info["status"] == "optimal", key
        assert solve(problem, "relief").makespan <= 1.05 * best.makespan, key


@given(st.lists(st.lists(st.integers(0, 40), min_size=5, max_size=5), min_size=1, max_size=4), st.data())
def test_source_quotas_split_each_plan_over_its_sources(counts, data):
    counts = np.array(counts, np.float64)  # [Ds, E]
    n = counts.sum(axis=0)
    x = np.zeros((5, 3))
    for e in range(5):  # any whole-token plan of n_e over 3 columns
        a = data.draw(st.integers(0, int(n[e])))
        b = data.draw(st.integers(0, int(n[e]) - a))
        x[e] = (a, b, n[e] - a - b)
    q = source_quotas(counts, x)
    np.testing.assert_array_equal(q.sum(axis=2), counts)
    np.testing.assert_array_equal(q.sum(axis=0), x)
    np.testing.assert_array_equal(np.asarray(relief.quotas(jnp.asarray(counts), jnp.asarray(x))), q)


@pytest.mark.parametrize("experts, ranks_, slots", [(1, 1, 1), (5, 2, 4), (12, 4, 5)])
def test_the_packed_plans_building_blocks_match_numpy(experts, ranks_, slots):
    """Issue 72, item 3: the pieces the faster plan is built from — `replica_ranks` with and without ``num_ranks``
    (one scatter of first columns vs pairwise comparisons; any row order, −1 padding, repeated ranks), the packed
    columns and the candidate moves by sender rank (`relief.columns` / `relief.move_rows`: the (e, i, j) triples of
    `solvers.relief.move_pairs`, each on its sender's row in that order, ``order`` its place in it), and the
    triangular-product cumulative sums and nonzero — equal the numpy twin's and jnp's own, on 25 random placements
    (every expert in at least one slot, the rest at random)."""
    from solvers.relief import move_pairs as move_pairs_np

    P = ranks_ * slots
    R = P - experts + 2  # the most slots one expert can hold, and a padding column

    @jax.jit
    def pieces(l2p, mask, whole):
        ranks = relief.replica_ranks(l2p, slots, ranks_)
        cols = relief.columns(ranks, ranks_, P)
        rows = relief.move_rows(ranks, cols, P)
        cumsums = [relief._cumsum(whole, axis) for axis in (0, 1)]
        return relief.replica_ranks(l2p, slots), ranks, cols, rows, relief._nonzero(mask, mask.size), cumsums

    rng = np.random.default_rng(0)
    for _ in range(25):
        phy2log = np.r_[np.arange(experts), rng.integers(0, experts, P - experts)]
        rng.shuffle(phy2log)
        held = [rng.permutation(np.flatnonzero(phy2log == e)) for e in range(experts)]  # any order within a row
        l2p = np.array([np.r_[h, -np.ones(R - len(h), int)] for h in held])
        mask = rng.random((experts, R)) < 0.4
        whole = rng.integers(0, 1000, (experts, R)).astype(np.float32)
        pairwise, ranks, cols, rows, nonzero, cumsums = pieces(l2p, mask, whole)
        want = replica_ranks(l2p, slots)
        np.testing.assert_array_equal(np.asarray(pairwise), want)
        np.testing.assert_array_equal(np.asarray(ranks), want)
        pe, pi, pj = move_pairs_np(want)
        a, b, e, h, valid, order = (np.asarray(v) for v in rows)
        assert np.all(valid == (np.arange(valid.shape[1]) < valid.sum(axis=1, keepdims=True)))  # packed, row by row
        assert all(np.all(np.diff(o[v]) > 0) for o, v in zip(order, valid, strict=True))  # in order along a row
        col_e, col_i, col_rank = (np.asarray(v) for v in (cols.expert, cols.column, cols.rank))
        np.testing.assert_array_equal(np.sort(order[valid]), np.arange(pe.size))  # every move once
        by_order = np.argsort(order[valid])
        for got, ref in ((col_e[a], pe), (col_i[a], pi), (col_e[b], pe), (col_i[b], pj), (e, pe)):
            np.testing.assert_array_equal(got[valid][by_order], ref)
        np.testing.assert_array_equal(col_rank[a][valid], np.nonzero(valid)[0])  # a move sits on its sender's row
        np.testing.assert_array_equal(col_rank[b][valid], h[valid])
        for got, ref in zip(nonzero, np.nonzero(mask), strict=True):
            np.testing.assert_array_equal(np.asarray(got)[: ref.size], ref)
            assert not np.any(np.asarray(got)[ref.size :])
        for axis in (0, 1):
            np.testing.assert_array_equal(np.asarray(cumsums[axis]), np.cumsum(whole, axis))


@pytest.mark.parametrize("stale, ep, experts, B", [(False, 8, 64, 256), (True, 8, 32, 256), (True, 16, 64, 16)])
def test_one_loop_trip_is_a_round_of_each_start(stale, ep, experts, B):
    """Issue 72, item 3: the plan carries its two starts side by side (`relief._side_by_side`: the second on
    ranks D…2D − 1, its rows, and columns C…2C − 1), so one loop trip — a round of the doubled problem — is a round of
    each start alone (the same moves accepted; plans to float32's tolerance, as two programs' outputs); a start whose
    rounds stopped (``frozen``) takes no move while the other's round is its own.
    Checked on the first rounds of both starts (where they differ), then the whole improvement — plans, makespans,
    rounds — against each start run alone, on stale and EPLB placements. The round's per-sender choices are
    reductions along the rows: its only scatters are the loads and the accepted moves' adds."""
    problem = _stale(seed=3, ep=ep, experts=experts, tokens_per_rank=B) if stale else _problem(1.2, B, ep, experts)
    pl = problem.placement
    ranks = jnp.asarray(replica_ranks(pl.log2phy, pl.slots_per_rank), jnp.int32)
    cols = relief.columns(ranks, ep, pl.num_slots)
    rows = relief.move_rows(ranks, cols, pl.num_slots)
    both_cols, both_rows = relief._side_by_side(cols, rows, 2)
    n = jnp.asarray(problem.n, jnp.float32)

    def alone(x):
        G, N = relief._loads(x, cols)
        t = relief.rank_times(COST, G, N, jnp)
        return relief._round(x, rows, COST, G, N, t, jnp.zeros(ep, bool))

    @jax.jit
    def together(x, frozen):
        G, N = relief._loads(x, both_cols)
        t = relief.rank_times(COST, G, N, jnp)
        return relief._round(x, both_rows, COST, G, N, t, jnp.repeat(frozen, ep))

    xs = [relief._seed(n, cols, COST, spread) for spread in (False, True)]
    assert jax.jit(alone).lower(xs[0]).as_text().count('"stablehlo.scatter"(') == 2  # the loads, the moves
    alone = jax.jit(alone)
    moved = 0
    for _ in range(3):
        one = [alone(x) for x in xs]
        x2, accepted = together(jnp.concatenate(xs), jnp.zeros(2, bool))
        assert_close(x2, np.concatenate([np.asarray(o[0]) for o in one]))  # two programs: float32's tolerance
        np.testing.assert_array_equal(np.asarray(accepted), np.concatenate([np.asarray(o[1]) for o in one]))
        moved += int(np.asarray(accepted).sum())
        for stop in (0, 1):  # one start frozen: it keeps its plan, the other runs its own round
            x2, accepted = together(jnp.concatenate(xs), jnp.arange(2) == stop)
            halves = np.asarray(x2).reshape(2, -1)
            np.testing.assert_array_equal(halves[stop], np.asarray(xs[stop]))
            assert_close(halves[1 - stop], np.asarray(one[1 - stop][0]))
            assert not np.asarray(accepted).reshape(2, -1)[stop].any()
        xs = [o[0] for o in one]
    assert moved > 0, "the rounds checked should move something"
    # the whole improvement (rounds, stuck starts' path searches, each start's stop): side by side = each alone
    improve = jax.jit(lambda starts: relief._improve(starts, cols, rows, COST, relief.ROUNDS))
    starts = jnp.stack([relief._seed(n, cols, COST, spread) for spread in (False, True)])
    together = improve(starts)
    for i in range(2):
        (x, ms, ran), (x1, ms1, ran1) = together, improve(starts[i : i + 1])
        assert_close(np.asarray(x)[i], np.asarray(x1)[0])
        assert_close(np.asarray(ms)[i], np.asarray(ms1)[0])
        assert int(ran[i]) == int(ran1[0])  # the rounds each start ran


def test_the_rounds_stages_run_and_keep_every_token():
    """`relief.round_stages` (the plan suite's stage-by-stage profile): every stage runs on the two starts side by
    side and gives a finite number; a whole round and a path search move tokens, never lose or make any."""
    problem = _problem(1.2, 256, 8, 64)
    pl = problem.placement
    ranks = jnp.asarray(replica_ranks(pl.log2phy, pl.slots_per_rank), jnp.int32)
    starts, bodies = relief.round_stages(jnp.asarray(problem.n), ranks, COST, 8, num_slots=pl.num_slots)
    assert list(bodies) == [*relief.ROUND_STAGES, "path search of a stuck round"]
    got = {name: float(jax.jit(body)(starts)) for name, body in bodies.items()}
    assert all(math.isfinite(v) for v in got.values()), got
    for name in (relief.ROUND_STAGES[-1], "path search of a stuck round"):
        assert got[name] == 2 * problem.n.sum(), name  # both starts' tokens, whole


def test_the_plan_suites_zipf_mix_times_every_batch_and_counts_its_rounds():
    """`scripts/bench_ingraph.py`'s plan suite on a Zipf mix (`plan_mix`, issue 72's ≤ 1 ms check), CI-sized: a row
    per (skew, tokens per device, batch), each batch's own rounds (as `relief.relief` counts them on its totals) and a
    time; and the suite named alone keeps its process to one CPU device (`_plan_only`)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    from bench_ingraph import _plan_only, plan_mix

    rows = plan_mix(16, 2, skews=(0.6, 2.0), tokens=(8, 64), batches=2)
    assert [(r["skew"], r["tokens_per_device"], r["batch"]) for r in rows] == [
        (s, b, i) for s in (0.6, 2.0) for b in (8, 64) for i in range(2)
    ]
    assert all(0 < r["ms"] < math.inf and 0 <= r["rounds_run"] <= relief.ROUNDS for r in rows)
    assert len({r["rounds_run"] for r in rows}) > 1  # the batches differ: skew and size change the rounds
    # the rounds `relief.plan(..., with_rounds=True)` reports are relief's own (the last row: s 2.0, 64 tokens)
    D, S = 8, slots_for(16, 8, 1.25) // 8
    routing = SyntheticRouting(num_experts=16, top_k=8, s=2.0, kappa=math.inf, seed=0)
    pl = Placement.from_eplb(routing.popularity, D * S, D, spread_idle=True)
    n = jnp.asarray(routing.batch(64 * D, D, 1).sum(axis=0))
    ranks = relief.replica_ranks(jnp.asarray(pl.log2phy), S, D)
    ran = jax.jit(lambda n: relief.relief(n, ranks, COST, D, num_slots=D * S, with_rounds=True)[1])(n)
    assert rows[-1]["rounds_run"] == int(ran)
    assert _plan_only(["--suites", "plan"]) and _plan_only(["--suites=plan", "--quick"])
    assert not _plan_only(["--suites", "plan,cost"]) and not _plan_only([])


@pytest.mark.parametrize(
    "shape, axis", [((31,), 0), ((32,), 0), ((33,), 0), ((320,), 0), ((1025,), 0), ((3, 70, 4), 1)]
)
def test_long_cumulative_sums_run_in_blocks_and_stay_exact(shape, axis):
    """Issue 72, item 3: `relief._cumsum` past its block (32) sums within blocks, then the blocks' totals — the
    numpy cumulative sum exactly, at and around the block's size and past two levels (1,025 = 33 blocks)."""
    x = np.random.default_rng(0).integers(0, 1000, shape).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda v: relief._cumsum(v, axis))(x)), np.cumsum(x, axis))


@given(D=st.integers(2, 9), K=st.integers(1, 40), seed=st.integers(0, 2**16))
def test_the_selection_on_each_senders_candidate_equals_the_twins(D, K, seed):
    """Issue 72, item 3: the jnp selection takes each sender's best move along its row (`relief._row_first`: the
    largest finite gain, ties to the lower move) and runs the rest on those D candidates (`relief._select`: ``[D, D]``
    pairwise) where the numpy twin runs on all K moves; the accepted moves are the same, on random moves with tied
    gains and sender times (small whole numbers, −inf: not a candidate), chains' third ranks and ranks that both
    send and receive."""
    from solvers.relief import _select as select_np

    rng = np.random.default_rng(seed)
    g = rng.integers(0, D, K)
    h = (g + rng.integers(1, D, K)) % D  # another rank
    gain = np.where(rng.random(K) < 0.3, -np.inf, rng.integers(1, 4, K)).astype(np.float64)
    t = rng.integers(0, 3, D).astype(np.float64)
    m = np.where(rng.random(K) < 0.5, -1, rng.integers(0, D, K))
    m = np.where(m == g, -1, m)  # `downhill_gains` gives no third rank equal to the sender
    want = select_np(gain, t[g], g, h, m, D)
    # the moves by sender, in their order (`relief.Rows`); padding: −inf gain
    order = np.full((D, K), relief.NO_MOVE, np.int64)
    for d in range(D):
        order[d, : np.sum(g == d)] = np.flatnonzero(g == d)
    k = np.minimum(order, K - 1)
    rows_gain = np.where(order < K, gain[k], -np.inf)

    @jax.jit
    def select(rows_gain, t, h, order, m):
        best, w = relief._row_first(rows_gain)
        h_k, order_k, m_k = relief._pick(w, h, order, m)
        return order_k, relief._select(jnp.isfinite(best), best, t, h_k, order_k, m_k)

    order_k, accepted = select(
        *(jnp.asarray(v, jnp.float32) for v in (rows_gain, t)),
        *(jnp.asarray(v, jnp.int32) for v in (h[k], order, m[k])),
    )
    got = np.zeros(K, bool)
    got[np.asarray(order_k)[np.asarray(accepted)]] = True
    np.testing.assert_array_equal(got, want)


@given(D=st.integers(1, 5), W=st.integers(1, 12), seed=st.integers(0, 2**16))
def test_a_rows_best_and_best_of_another_group_in_one_reduction(D, W, seed):
    """Issue 72, item 3: `relief._row_two_first` — each row's first best (the largest finite score, ties to the lower
    entry) and its first best among the entries of another group (expert) — equals a search of each row, on scores
    with ties and −inf (not a candidate) and few groups; a row with no such entry gives a non-finite score."""
    rng = np.random.default_rng(seed)
    score = np.where(rng.random((D, W)) < 0.3, -np.inf, rng.integers(0, 3, (D, W))).astype(np.float32)
    group = rng.integers(0, 3, (D, W))
    s1, i1, s2, i2 = (np.asarray(v) for v in jax.jit(relief._row_two_first)(jnp.asarray(score), jnp.asarray(group)))

    def first(row, allowed):
        ok = [j for j in range(W) if allowed[j] and np.isfinite(row[j])]
        return min(ok, key=lambda j: (-row[j], j)) if ok else None

    for d in range(D):
        want1 = first(score[d], np.ones(W, bool))
        want2 = None if want1 is None else first(score[d], group[d] != group[d, want1])
        for s, i, want in ((s1[d], i1[d], want1), (s2[d], i2[d], want2)):
            assert (not np.isfinite(s)) if want is None else (i == want and s == score[d, want])


@given(
    n=st.lists(st.integers(0, 300), min_size=2, max_size=12),
    seed=st.integers(0, 2**16),
)
def test_the_shared_pricing_steps_agree_in_both_namespaces(n, seed):
    """Issue 77, item 3: the pricing steps both twins call (`solvers.relief_prices`) give the same results in
    numpy float64 and, jitted, in `jax.numpy` float32, on whole-token loads: the spread start's turns (ties in load
    to the lower expert), a hand-off's price, the downhill filter and the best hand-off path (a tie in makespan to
    the fewer ranks at it, then the lower index). The jitted plan's own spread turns (`relief._spread_turns`:
    counted pairwise, not sorted) equal them for every replicated expert, with and without many tied loads."""
    from solvers import relief_prices as rp

    exact = CostModel(a=8.0, b=2.0, c=4.0, beta=0.5)  # prices exact in float32: ties resolve alike in both

    rng = np.random.default_rng(seed)
    E = len(n)
    D, K = 4, 3 * E
    n = np.asarray(n, np.float64)
    count = rng.integers(0, 4, E)
    G, N = rng.integers(0, 6, D).astype(np.float64), rng.integers(0, 900, D).astype(np.float64)
    t = exact.rank_times(G, N)
    y, new = rng.integers(0, 200, K).astype(np.float64), rng.integers(0, 2, K).astype(np.float64)
    m, g = rng.integers(-1, D, K), rng.integers(0, D, K)
    reached = rng.random(D) < 0.7
    dG, dN = rng.integers(-1, 2, (D, D)).astype(np.float64), rng.integers(-50, 50, (D, D)).astype(np.float64)
    moves = {"gain": rng.integers(-10, 10, K) / 2.0, "chain": rng.random(K) < 0.5}

    def steps(xp, n, count, G, N, t, y, new, m, g, reached, dG, dN, moves):
        t_m, score = rp.forward_prices(y, new, G[g], N[g], exact, y < 150, xp=xp)
        gain, third = rp.downhill_gains(moves, y, t[g], t[m % D], m, g, new > 0, xp=xp)
        return (
            rp.spread_turns(n, count, xp=xp),
            t_m,
            score,
            gain,
            third,
            *rp.path_prices(G, N, t, dG, dN, reached, 1, exact, xp=xp),
        )

    want = steps(np, n, count, G, N, t, y, new, m, g, reached, dG, dN, moves)
    f32 = jax.tree.map(
        lambda a: jnp.asarray(a, jnp.float32) if a.dtype == np.float64 else jnp.asarray(a),
        (n, count, G, N, t, y, new, m, g, reached, dG, dN, moves),
    )
    got = jax.jit(lambda *a: steps(jnp, *a))(*f32)
    for w, h in zip(want, got, strict=True):  # two programs: floats to float32's tolerance, indices exactly
        if np.issubdtype(np.asarray(w).dtype, np.floating):
            np.testing.assert_allclose(np.asarray(h, np.float64), np.asarray(w, np.float64), rtol=1e-6, atol=0)
        else:
            np.testing.assert_array_equal(np.asarray(h), np.asarray(w))
    replicated = count > 1
    for loads in (n, n // 100):  # 0-3 after the division: many ties
        turns = jax.jit(relief._spread_turns)(jnp.asarray(loads, jnp.float32), jnp.asarray(count, jnp.int32))
        np.testing.assert_array_equal(np.asarray(turns)[replicated], rp.spread_turns(loads, count)[replicated])


# ------------------------------------------------------------------------------------------------ the layer
@pytest.fixture(scope="module")
def setup():
    mesh = make_ep_mesh(D)
    load = np.random.default_rng(0).pareto(1.5, E) + 0.1
    pl = Placement.from_eplb(load, D * S, D)
    base = MoEConfig(hidden=16, ffn=8, experts=E, top_k=2, slots_per_rank=S, dispatch_mode="quota")
    ingraph = dataclasses.replace(base, dispatch="ingraph", cost=COST)
    params = init_params(jax.random.key(0), base, pl, mesh=mesh)
    x = jax.random.normal(jax.random.key(1), (D * 32, 16)) * 2.0
    return mesh, pl, base, ingraph, params, x


def test_layer_output_and_gradients_do_not_depend_on_the_in_graph_dispatch(setup):
    """The central invariant under jit and grad: in-graph dispatch against uniform tables, the same output and the
    same gradients (replicas hold identical weights; only where each pair is computed changes)."""
    mesh, pl, base, ingraph, params, x = setup
    pa = dispatch_tables.placement_arrays(pl)

    def loss(p, x, cfg, tables):
        return jnp.sum(moe_forward(p, x, mesh=mesh, placement_arrays=pa, tables=tables, config=cfg).out ** 2)

    f = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)), static_argnums=2)
    (l0, (gp0, gx0)) = f(params, x, base, dispatch_tables.uniform(pl))
    (l1, (gp1, gx1)) = f(params, x, ingraph, None)
    assert_close(l1, l0)  # another program (another summation order): to the float32 tolerance
    assert_trees_close((gp1, gx1), (gp0, gx0))


def test_each_source_realises_its_quota_token_for_token(setup):
    """Realised per-replica pairs (`MoEStats.replica_counts`) equal the plan's quotas exactly, per source and in
    total (in dropless rounds too: capacity factor 0.5 forces several)."""
    mesh, pl, _, ingraph, params, x = setup
    pa = dispatch_tables.placement_arrays(pl)
    cfg = dataclasses.replace(ingraph, capacity_factor=0.5)
    out = jax.jit(lambda p, x: moe_forward(p, x, mesh=mesh, placement_arrays=pa, tables=None, config=cfg))(params, x)
    assert int(np.max(out.stats.rounds)) > 1
    counts = np.asarray(out.counts)  # [D, E] per source
    plan = jax.jit(lambda c, l2p: relief.plan(c, l2p, slots_per_rank=S, num_ranks=D, cost=COST))
    xs, q = plan(jnp.asarray(counts), jnp.asarray(pl.log2phy))
    np.testing.assert_array_equal(np.asarray(out.stats.replica_counts), np.asarray(q))
    np.testing.assert_array_equal(np.asarray(out.stats.replica_counts).sum(axis=0), np.asarray(xs))
    # the plan is the numpy twin's (same makespan)
    ranks = replica_ranks(pl.log2phy, S)
    twin = relief_np(counts.sum(axis=0), ranks, COST, D)
    assert _makespan(np.asarray(xs), ranks, COST, D) == pytest.approx(_makespan(twin, ranks, COST, D), rel=1e-6)


# ------------------------------------------------------------------------------------------------ refusals
@pytest.mark.parametrize(
    "change, match",
    [
        (dict(dispatch="ingraph", dispatch_mode="quota"), r"give cost=solvers.CostModel"),
        (dict(dispatch="ingraph", dispatch_mode="sample", cost=COST), r"set dispatch_mode='quota'"),
        (dict(dispatch="ingraph", dispatch_mode="quota", cost=PRESETS["dsv3_b_tile"]), "has a tile term"),
        (dict(dispatch="ingraph", dispatch_mode="quota", cost="dsv3"), "cost must be a solvers.CostModel"),
        (dict(cost=COST), "used only by dispatch='ingraph'"),
        (dict(dispatch="fresh"), "must be 'tables' or 'ingraph'"),
        (dict(dispatch="ingraph", dispatch_mode="quota", cost=COST, dispatch_rounds=0), "dispatch_rounds must be"),
    ],
)
def test_what_it_cannot_price_or_use_is_refused(change, match):
    with pytest.raises(ValueError, match=match):
        MoEConfig(hidden=16, ffn=8, experts=E, top_k=2, slots_per_rank=S, **change)


def test_tables_and_in_graph_dispatch_are_not_mixed(setup):
    mesh, pl, base, ingraph, params, x = setup
    pa = dispatch_tables.placement_arrays(pl)
    with pytest.raises(ValueError, match="pass tables=None"):
        moe_forward(params, x, mesh=mesh, placement_arrays=pa, tables=dispatch_tables.uniform(pl), config=ingraph)
    with pytest.raises(ValueError, match="tables are required"):
        moe_forward(params, x, mesh=mesh, placement_arrays=pa, tables=None, config=base)
    with pytest.raises(ValueError, match="tile term"):
        solve(dataclasses.replace(_problem(1.2, 64), cost=PRESETS["dsv3_b_tile"]), "relief")


# ------------------------------------------------------------------------------------------------ with a controller
@pytest.mark.one_env
def test_with_a_dispatch_controller_both_timescales(setup):
    """With a `DispatchController`: a table-driven layer can take the ``"relief"`` policy's tables off the critical
    path, and an in-graph layer under ``nnx.jit`` uses the controller for the slow timescale only
    (``rebalance_every``: the placement moves, its tables stay in the step; installing tables is refused). Both
    compute the same function as the EPLB-even layer, step after step."""
    mesh, pl, base, ingraph, params, x = setup
    ref = tempo_jax.MoE(base, pl, mesh=mesh, rngs=nnx.Rngs(0), params=params)
    tabled = tempo_jax.MoE(base, pl, mesh=mesh, rngs=nnx.Rngs(0), params=params)
    fresh = tempo_jax.MoE(ingraph, pl, mesh=mesh, rngs=nnx.Rngs(0), params=params)
    step = nnx.jit(lambda m, x: m(x))
    with pytest.raises(ValueError, match="computes each call's tables in the step"):
        fresh.set_tables(dispatch_tables.uniform(pl))
    moved = 0
    with (
        DispatchController(pl, COST, policy="relief") as ctl_tables,
        DispatchController(pl, COST, policy="relief", rebalance_every=2) as ctl_place,
    ):
        for i in range(3):
            xi = x * (1.0 + 0.1 * i)
            want = step(ref, xi)
            assert_close(step(tabled, xi), want)
            assert_close(step(fresh, xi), want)
            tabled.set_tables(ctl_tables.observe(tabled.counts.get_value()))
            ctl_place.observe(fresh.counts.get_value())
            if ctl_place.proposal is not None:
                new = ctl_place.proposal
                moved += fresh.set_placement(new).moved_slots
                ctl_place.set_placement(new)
                with pytest.raises(ValueError, match="they would never be read"):
                    fresh.set_placement(new, tables=dispatch_tables.uniform(new))
        assert ctl_tables.metrics()["windows"]["published"] == 3
        assert ctl_place.metrics()["placements"]["applied"] >= 1
    assert moved > 0
    assert not np.array_equal(tabled.table.get_value(), np.asarray(dispatch_tables.uniform(pl).table))
