"""In-graph dispatch (issue 38): each batch's tables from its own counts, inside the jitted step — pairwise relief
(`solvers.relief`, its numpy twin, holds the algorithm, its complexity and why it prices both regimes).

``MoEConfig(dispatch="ingraph", cost=CostModel(...), dispatch_mode="quota")``: in `moe_forward` every rank

1. counts its valid (token, expert) pairs, ``[E]``, and all-gathers them over the ``ep`` axis, ``[D, E]`` (one small
   collective: D·E int32);
2. runs pairwise relief on the totals (the same computation on every rank, so every rank holds the same plan
   ``x [E, R]``; a fixed number of rounds, static shapes, no host callback);
3. splits the plan over the sources (`quotas`: northwest-corner rule) and dispatches its own pairs with its row
   ``q[d] [E, R]`` in "quota" mode, which realises the plan exactly: every replica column receives ``x[e, r]`` pairs.

The output does not depend on it (replicas hold identical weights); only where each pair is computed changes.
`plan` is the same computation outside the layer (benchmarks, tests against the twin).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from solvers import CostModel
from solvers.relief import ROUNDS, price_moves, rank_times

__all__ = ["ROUNDS", "move_pairs", "plan", "quotas", "relief", "replica_ranks", "round_stages", "ROUND_STAGES"]


def replica_ranks(log2phy: jax.Array, slots_per_rank: int) -> jax.Array:
    """``log2phy [E, R]`` (−1 padded) → ``[E, R]`` int32 rank of each column, −1 for none or a repeated rank."""
    ranks = jnp.where(log2phy >= 0, log2phy // slots_per_rank, -1).astype(jnp.int32)
    for r in range(1, ranks.shape[1]):
        dup = jnp.any(ranks[:, r : r + 1] == ranks[:, :r], axis=1) & (ranks[:, r] >= 0)
        ranks = ranks.at[:, r].set(jnp.where(dup, -1, ranks[:, r]))
    return ranks


def _times(cost: CostModel, G, N):
    return rank_times(cost, G, N, xp=jnp)


def _loads(x, ranks, D: int):
    ok = ranks >= 0
    seg = jnp.where(ok, ranks, D).reshape(-1)  # columns without a rank go to a dropped segment
    N = jax.ops.segment_sum(jnp.where(ok, x, 0.0).reshape(-1), seg, num_segments=D + 1)[:D]
    G = jax.ops.segment_sum(((x > 0) & ok).astype(jnp.float32).reshape(-1), seg, num_segments=D + 1)[:D]
    return G, N


def _first_best(score, group, D: int):
    """Mask of the entries that are their group's maximum finite score, ties to the lowest index."""
    finite = jnp.isfinite(score)
    best = jax.ops.segment_max(jnp.where(finite, score, -jnp.inf), group, num_segments=D)
    top = finite & (score == best[group])
    idx = jnp.arange(score.shape[0], dtype=jnp.int32)
    first = jax.ops.segment_min(jnp.where(top, idx, score.shape[0]), group, num_segments=D)
    return top & (idx == first[group])


def _lexi_best(primary, secondary, group, D: int):
    """Each group's best entry by ``primary``, then ``secondary`` (−inf: not a candidate), then index."""
    finite = jnp.isfinite(secondary)
    best = jax.ops.segment_max(jnp.where(finite, primary, -jnp.inf), group, num_segments=D)
    return _first_best(jnp.where(finite & (primary == best[group]), secondary, -jnp.inf), group, D)


_FORWARD_FIELDS = ("f", "ci", "cm", "m", "y", "new", "t")


def move_pairs(ranks: jax.Array, num_slots: int, num_ranks: int):
    """Step 1's candidate moves (`solvers.relief.move_pairs`) at a static size K = min(E·R·(R − 1), D·(P − E)):
    ``(e, i, j, valid)`` ``[K]``, row-major, padded at the end with invalid entries."""
    E, R = ranks.shape
    ok = ranks >= 0
    size = max(1, min(E * R * (R - 1), num_ranks * max(num_slots - E, 0)))
    # The (e, i) columns in row-major order (at most P of them), then every j of each: row-major (e, i, j) without
    # the E·R·R mask.
    cols = min(E * R, max(num_slots, 1))
    ce, ci = jnp.nonzero(ok, size=cols, fill_value=0)
    has = jnp.arange(cols) < jnp.sum(ok)
    j = jnp.arange(R)
    pair = has[:, None] & ok[ce][:, j] & (ranks[ce, ci][:, None] != ranks[ce][:, j])  # [cols, R]
    flat, pj = jnp.nonzero(pair, size=size, fill_value=0)
    valid = jnp.arange(size) < jnp.sum(pair)
    return ce[flat], ci[flat], pj, valid


def _forwards(x, ranks, pe, pi, pj, valid, G, N, cost: CostModel, D: int) -> dict:
    """Step 3a (`solvers.relief._forwards`): per rank, ``[2, D]`` fields of its best whole hand-off and the best of
    another expert (``f = −1``: none)."""
    h, m = ranks[pe, pi], ranks[pe, pj]
    h = jnp.where(valid, h, 0)
    y, new = x[pe, pi], (x[pe, pj] == 0).astype(jnp.float32)
    t_m = _times(cost, G[m] + new, N[m] + y)
    score = jnp.where(valid & (y > 0), -t_m, -jnp.inf)
    fields = dict(zip(_FORWARD_FIELDS, (pe, pi, pj, m, y, new, t_m), strict=True))
    out = {k: [] for k in _FORWARD_FIELDS}
    size = score.shape[0]
    for k in range(2):
        if k:
            score = jnp.where(pe == out["f"][0][h], -jnp.inf, score)  # the second: another expert
        best = _first_best(score, h, D)
        at = jax.ops.segment_min(jnp.where(best, jnp.arange(size), size), h, num_segments=D)  # [D]
        found = at < size
        at = jnp.minimum(at, size - 1)
        for name, arr in fields.items():
            out[name].append(jnp.where(found, arr[at], -1 if name == "f" else 0).astype(arr.dtype))
    return {k: jnp.stack(v) for k, v in out.items()}


def _price(xi, new_h, G, N, t, F: dict, g, h, cost: CostModel) -> dict:
    """Step 3b: every candidate's best ``gain``, ``share`` and ``chain`` ``[K]`` — `solvers.relief.price_moves`
    itself, in `jax.numpy` and float32."""
    return price_moves(xi, new_h, G, N, t, F, g, h, cost, xp=jnp, dtype=jnp.float32)


def _select(gain, sender_time, g, h, m, D: int):
    """Step 3c (`solvers.relief._select`): the accepted moves, a mask ``[K]``."""
    sent = _first_best(gain, g, D)
    accepted = _lexi_best(jnp.where(sent, sender_time, -jnp.inf), jnp.where(sent, gain, -jnp.inf), h, D)
    receives = jax.ops.segment_max(accepted.astype(jnp.int32), h, num_segments=D) > 0
    accepted = accepted & ~receives[g]
    mm = jnp.where(m >= 0, m, D)
    one = accepted.astype(jnp.int32)
    used = (
        jax.ops.segment_sum(one, g, num_segments=D + 1)
        + jax.ops.segment_sum(one, h, num_segments=D + 1)
        + jax.ops.segment_sum(one, mm, num_segments=D + 1)
    )
    return accepted & ((m < 0) | (used[mm] == 1))


def _augment(x, ranks, cost: CostModel, D: int, moves: tuple, G, N, t):
    """Step 3d (`solvers.relief._augment`): the best hand-off path from the slowest rank, applied →
    ``(x, found)``; ``x`` unchanged when no path lowers the makespan or the ranks at it."""
    pe, pi, pj, valid = moves
    K = pe.shape[0]
    u = jnp.where(valid, ranks[pe, pi], 0)
    v = jnp.where(valid, ranks[pe, pj], 0)
    share = jnp.where(valid, x[pe, pi], 0.0)
    top = jnp.max(t)
    g = jnp.argmax(t)
    idx = jnp.arange(K, dtype=jnp.int32)
    rank_ids = jnp.arange(D)

    def level(carry):
        _, reached, parent = carry
        ok = valid & reached[u] & ~reached[v] & (share > 0)
        first = jax.ops.segment_min(jnp.where(ok, idx, K), jnp.where(ok, v, 0), num_segments=D)
        new = (first < K) & ~reached
        return jnp.any(new), reached | new, jnp.where(new, first, parent)

    reached0 = rank_ids == g
    parent0 = jnp.full((D,), -1, jnp.int32)
    _, reached, parent = jax.lax.while_loop(lambda c: c[0], level, (jnp.bool_(D > 1), reached0, parent0))

    def walk(carry):
        at, dG, dN = carry
        k = parent[at]
        live = k >= 0
        kk = jnp.where(live, k, 0)
        s_k = jnp.where(live, share[kk], 0.0)
        gets = jnp.where(live & (x[pe[kk], pj[kk]] == 0), 1.0, 0.0)
        src, dst = jnp.where(live, u[kk], 0), jnp.where(live, v[kk], 0)
        dG = dG.at[rank_ids, src].add(jnp.where(live, -1.0, 0.0)).at[rank_ids, dst].add(gets)
        dN = dN.at[rank_ids, src].add(-s_k).at[rank_ids, dst].add(s_k)
        return jnp.where(live, src, at), dG, dN

    zeros = jnp.zeros((D, D), jnp.float32)  # walked back as deep as the search went (a path has < D steps)
    _, dG, dN = jax.lax.while_loop(lambda c: jnp.any(parent[c[0]] >= 0), walk, (rank_ids, zeros, zeros))
    after = _times(cost, G[None] + dG, N[None] + dN)
    ms = jnp.max(after, axis=1)
    at_ms = jnp.sum(after == ms[:, None], axis=1)
    useful = reached & (rank_ids != g) & ((ms < top) | ((ms == top) & (at_ms < jnp.sum(t == top))))
    best_ms = jnp.min(jnp.where(useful, ms, jnp.inf))
    pick = useful & (ms == best_ms)
    fewest = jnp.min(jnp.where(pick, at_ms, D + 1))
    m = jnp.argmax(pick & (at_ms == fewest))
    found = jnp.any(useful)

    def apply(carry):
        w, x = carry
        k = parent[w]
        moved = x[pe[k], pi[k]]
        return u[k], x.at[pe[k], pj[k]].add(moved).at[pe[k], pi[k]].add(-moved)

    # m's path, from its end back to g (none when nothing was found: the walk starts at the root)
    _, x = jax.lax.while_loop(lambda c: parent[c[0]] >= 0, apply, (jnp.where(found, m, g), x))
    return x, found


def _seed(n, ranks, cost: CostModel, D: int, spread: bool):
    """Step 2 (`solvers.relief._seed`): a start ``x [E, R]``, each expert whole on one column."""
    E = ranks.shape[0]
    ok = ranks >= 0
    safe = jnp.where(ok, ranks, 0)
    rows = jnp.arange(E)
    single = jnp.sum(ok, axis=1) == 1
    x = jnp.zeros(ranks.shape, jnp.float32).at[rows, jnp.argmax(ok, axis=1)].set(jnp.where(single, n, 0.0))
    base = jnp.where(ok, _times(cost, *_loads(x, ranks, D))[safe], jnp.inf)
    nth = jnp.zeros(E, jnp.int32)
    if spread:
        order = jnp.argsort(-n, stable=True)
        nth = nth.at[order].set(jnp.cumsum(~single[order]).astype(jnp.int32) - 1)
        nth = nth % jnp.maximum(jnp.sum(ok, axis=1), 1)
    pick = jnp.argsort(base, axis=1, stable=True)[rows, nth]
    return x.at[rows, pick].add(jnp.where(single, 0.0, n))


def _improve(x, ranks, cost: CostModel, D: int, rounds: int, moves: tuple):
    """Steps 3-4 (`solvers.relief._improve`) from the start ``x [E, R]`` → ``(best plan, its makespan, rounds run)``
    (a round that accepts no move ends the loop; it counts)."""
    pe, pi, pj, valid = moves
    g = jnp.where(valid, ranks[pe, pi], 0)
    h = jnp.where(valid, ranks[pe, pj], 0)

    def one_round(carry):
        i, x, best_x, best_ms, _ = carry
        G, N = _loads(x, ranks, D)
        t = _times(cost, G, N)
        better = jnp.max(t) < best_ms
        best_x, best_ms = jnp.where(better, x, best_x), jnp.where(better, jnp.max(t), best_ms)
        fw = _forwards(x, ranks, pe, pi, pj, valid, G, N, cost, D)  # Step 3a
        first = fw["f"][0][h] != pe
        F = {k: jnp.where(first, fw[k][0][h], fw[k][1][h]) for k in _FORWARD_FIELDS}
        xi = x[pe, pi]
        moves = _price(xi, (x[pe, pj] == 0).astype(jnp.float32), G, N, t, F, g, h, cost)  # Step 3b
        gain = jnp.where(valid & (xi > 0) & (t[g] >= t[h]) & (moves["gain"] > 0), moves["gain"], -jnp.inf)
        third = jnp.where(moves["chain"] & (F["m"] != g), F["m"], -1)
        accepted = _select(gain, t[g], g, h, third, D)  # Step 3c
        s = jnp.where(accepted, moves["share"], 0.0)
        x = x.at[pe, pi].add(-s).at[pe, pj].add(s)
        y = jnp.where(accepted & moves["chain"], F["y"], 0.0)
        f = jnp.where(F["f"] >= 0, F["f"], 0)
        x = x.at[f, F["ci"]].add(-y).at[f, F["cm"]].add(y)
        return i + 1, x, best_x, best_ms, ~jnp.any(accepted)  # stuck: x unchanged

    def pairwise_then_path(carry):
        """Rounds of pairwise moves until one accepts none (or the rounds run out), then, in that stuck round,
        step 3d: the plan's hand-off path. Carried out this way (not a path search inside every round) the
        search runs once per stuck round even when the two starts run side by side under `jax.vmap`."""
        i, x, best_x, best_ms, _ = carry
        i, x, best_x, best_ms, stuck = jax.lax.while_loop(
            lambda c: (c[0] < rounds) & ~c[4], one_round, (i, x, best_x, best_ms, jnp.bool_(False))
        )
        G, N = _loads(x, ranks, D)
        x_path, found = _augment(x, ranks, cost, D, (pe, pi, pj, valid), G, N, _times(cost, G, N))
        found = stuck & found
        return i, jnp.where(found, x_path, x), best_x, best_ms, found

    # At most ``rounds``; a round that accepts no move and finds no path leaves x as it was, so every later round
    # would too.
    best_x, best_ms, ran = x, jnp.float32(jnp.inf), jnp.int32(0)
    if rounds:
        carry = (ran, x, best_x, best_ms, jnp.bool_(True))
        ran, x, best_x, best_ms, _ = jax.lax.while_loop(lambda c: (c[0] < rounds) & c[4], pairwise_then_path, carry)
    # Step 4: the best of the rounds (the last moves included).
    last = jnp.max(_times(cost, *_loads(x, ranks, D)))
    return jnp.where(last < best_ms, x, best_x), jnp.minimum(last, best_ms), ran


def relief(
    n: jax.Array,
    ranks: jax.Array,
    cost: CostModel,
    num_ranks: int,
    rounds: int = ROUNDS,
    *,
    num_slots: int | None = None,
    with_rounds: bool = False,
) -> jax.Array:
    """Pairwise relief of ``n [E]`` tokens per expert over ``ranks [E, R]`` → ``x [E, R]`` float32 whole tokens
    (`solvers.relief.relief`, step for step; its two starts run side by side under `jax.vmap`); ``num_slots`` P
    bounds the candidate moves (default: E·R). ``with_rounds``: ``(x, rounds)``, the improvement rounds the chosen
    start ran (int32, at most ``rounds``)."""
    D = num_ranks
    n = n.astype(jnp.float32)
    E, R = ranks.shape
    moves = move_pairs(ranks, E * R if num_slots is None else num_slots, D)
    starts = jnp.stack([_seed(n, ranks, cost, D, spread) for spread in (False, True)])  # Step 2
    xs, ms, ran = jax.vmap(lambda x0: _improve(x0, ranks, cost, D, rounds, moves))(starts)
    x = jnp.where(ms[1] < ms[0], xs[1], xs[0])
    return (x, jnp.where(ms[1] < ms[0], ran[1], ran[0])) if with_rounds else x


def quotas(counts: jax.Array, x: jax.Array) -> jax.Array:
    """``counts [Ds, E]`` per source and a plan ``x [E, R]`` → whole-token quotas ``q [Ds, E, R]`` (row sums
    ``counts``, column sums ``x``; `solvers.relief.source_quotas`)."""
    counts = counts.astype(jnp.float32)
    c_hi = jnp.cumsum(counts, axis=0)
    c_lo = c_hi - counts
    x_hi = jnp.cumsum(x, axis=1)
    x_lo = x_hi - x
    return jnp.maximum(0.0, jnp.minimum(c_hi[:, :, None], x_hi[None]) - jnp.maximum(c_lo[:, :, None], x_lo[None]))


def plan(
    counts: jax.Array, log2phy: jax.Array, *, slots_per_rank: int, num_ranks: int, cost: CostModel, rounds: int = ROUNDS
) -> tuple[jax.Array, jax.Array]:
    """The in-graph dispatch of one batch: per-source counts ``[Ds, E]`` and the placement's ``log2phy [E, R]`` →
    ``(x [E, R] per replica column, q [Ds, E, R] per source)``."""
    ranks = replica_ranks(log2phy, slots_per_rank)
    x = relief(jnp.sum(counts, axis=0), ranks, cost, num_ranks, rounds, num_slots=num_ranks * slots_per_rank)
    return x, quotas(counts, x)


#: `round_stages`' names, in the round's order (each cumulative: it runs the stages before it too).
ROUND_STAGES = ("loads and times", "+ best hand-offs", "+ pricing", "+ selection", "+ applying the moves (a round)")


def round_stages(n: jax.Array, ranks: jax.Array, cost: CostModel, num_ranks: int, *, num_slots: int):
    """One improvement round of `relief` cut into its stages, for profiling (`scripts/bench_ingraph.py --suites
    plan`): ``n [E]`` tokens per expert, ``ranks [E, R]`` → ``(starts [2, E, R], {name: body})``, the two seeded
    starts and, per name of `ROUND_STAGES` (then ``"path search of a stuck round"``), a function ``x [E, R] → a
    float32 scalar`` that runs the round up to that stage on ``x`` (its result depends on every stage run)."""
    D, cost_ = num_ranks, cost
    moves = move_pairs(ranks, num_slots, D)
    pe, pi, pj, valid = moves
    g, h = jnp.where(valid, ranks[pe, pi], 0), jnp.where(valid, ranks[pe, pj], 0)
    n = n.astype(jnp.float32)
    starts = jnp.stack([_seed(n, ranks, cost_, D, spread) for spread in (False, True)])

    def upto(x, stage: int):
        G, N = _loads(x, ranks, D)
        t = _times(cost_, G, N)
        if stage == 1:
            return jnp.max(t)
        fw = _forwards(x, ranks, pe, pi, pj, valid, G, N, cost_, D)
        if stage == 2:
            return jnp.sum(fw["t"])
        first = fw["f"][0][h] != pe
        F = {k: jnp.where(first, fw[k][0][h], fw[k][1][h]) for k in _FORWARD_FIELDS}
        xi = x[pe, pi]
        mv = _price(xi, (x[pe, pj] == 0).astype(jnp.float32), G, N, t, F, g, h, cost_)
        if stage == 3:
            return jnp.sum(jnp.where(jnp.isfinite(mv["gain"]), mv["gain"], 0.0))
        gain = jnp.where(valid & (xi > 0) & (t[g] >= t[h]) & (mv["gain"] > 0), mv["gain"], -jnp.inf)
        accepted = _select(gain, t[g], g, h, jnp.where(mv["chain"] & (F["m"] != g), F["m"], -1), D)
        if stage == 4:
            return jnp.sum(accepted.astype(jnp.float32))
        s = jnp.where(accepted, mv["share"], 0.0)
        y = jnp.where(accepted & mv["chain"], F["y"], 0.0)
        f = jnp.where(F["f"] >= 0, F["f"], 0)
        return jnp.sum(x.at[pe, pi].add(-s).at[pe, pj].add(s).at[f, F["ci"]].add(-y).at[f, F["cm"]].add(y))

    def path_search(x):
        G, N = _loads(x, ranks, D)
        return jnp.sum(_augment(x, ranks, cost_, D, moves, G, N, _times(cost_, G, N))[0])

    bodies = {name: (lambda x, i=i: upto(x, i + 1)) for i, name in enumerate(ROUND_STAGES)}
    bodies["path search of a stuck round"] = path_search
    return starts, bodies
