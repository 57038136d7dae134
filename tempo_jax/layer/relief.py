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

from typing import NamedTuple

import jax
import jax.numpy as jnp

from solvers import CostModel
from solvers.relief import ROUNDS
from solvers.relief_prices import (
    chain_partners,
    downhill_gains,
    forward_prices,
    path_prices,
    price_gathered,
    rank_times,
    spread_turns,
)

__all__ = [
    "ROUNDS",
    "ROUND_STAGES",
    "Columns",
    "Moves",
    "columns",
    "move_pairs",
    "plan",
    "quotas",
    "relief",
    "replica_ranks",
    "round_stages",
]


def replica_ranks(log2phy: jax.Array, slots_per_rank: int, num_ranks: int | None = None) -> jax.Array:
    """``log2phy [E, R]`` (−1 padded) → ``[E, R]`` int32 rank of each column, −1 for none or a repeated rank.
    ``num_ranks`` D, when given, finds the repeats through each (expert, rank)'s first column, one scatter over
    ``[E, R]`` rather than ``[E, R, R]`` comparisons (at E 256 with R 27, ~0.3 ms on XLA:CPU)."""
    ranks = jnp.where(log2phy >= 0, jax.lax.div(jnp.maximum(log2phy, 0), slots_per_rank), -1).astype(jnp.int32)
    R = ranks.shape[1]
    col = jnp.arange(R, dtype=jnp.int32)
    if num_ranks is None:
        earlier = col[None, :] < col[:, None]  # [r, r']: r' comes before r
        dup = jnp.any((ranks[:, :, None] == ranks[:, None, :]) & earlier[None], axis=2)
    else:
        E, D = ranks.shape[0], num_ranks
        key = jnp.where(ranks >= 0, jnp.arange(E, dtype=jnp.int32)[:, None] * D + ranks, E * D)  # (expert, rank)
        first = jnp.full(E * D + 1, R, jnp.int32).at[key].min(jnp.broadcast_to(col, ranks.shape))  # first column
        dup = first[key] != col[None, :]
    return jnp.where(dup & (ranks >= 0), -1, ranks)


class Columns(NamedTuple):
    """The replica columns that hold a rank, packed row-major (an expert's columns side by side, at most D of them),
    ``C = min(E·R, E·D, P)`` entries, the live ones first. The plan runs on ``x [C]`` rather than ``[E, R]``, which is
    mostly empty (R is the most replicated expert's slot count; at E 256 + 64 slots, EP8, E·R = 6,912 and C = 320)."""

    expert: jax.Array  # [C] int32 (0 past the live ones)
    column: jax.Array  # [C] int32 index into R (0 past the live ones)
    rank: jax.Array  # [C] int32 (D past the live ones)
    live: jax.Array  # [C] bool
    D: int  # ranks (static)


class Moves(NamedTuple):
    """Step 1's candidate moves — expert e's share on column a to its column b on another rank — in the row-major
    (e, i, j) order of `solvers.relief.move_pairs`, at a static size K, padded at the end with invalid entries."""

    a: jax.Array  # [K] int32 sender column (an index into `Columns`; 0 where invalid)
    b: jax.Array  # [K] int32 receiver column
    e: jax.Array  # [K] int32 expert
    g: jax.Array  # [K] int32 sender rank (0 where invalid)
    h: jax.Array  # [K] int32 receiver rank (0 where invalid)
    valid: jax.Array  # [K] bool
    D: int  # ranks (static)


def columns(ranks: jax.Array, num_ranks: int, num_slots: int | None = None) -> Columns:
    """``ranks [E, R]`` (`replica_ranks`) → its columns that hold a rank, packed (`Columns`; ``num_slots`` P bounds
    their count: each is at least one slot)."""
    E, R = ranks.shape
    D = num_ranks
    ok = ranks >= 0
    C = max(1, min(E * min(R, D), E * R if num_slots is None else num_slots))
    ce, ci = _nonzero(ok, C)
    live = jnp.arange(C) < jnp.sum(ok)
    rank = jnp.where(live, ranks[ce, ci], D).astype(jnp.int32)
    return Columns(ce.astype(jnp.int32), ci.astype(jnp.int32), rank, live, D)


def _cumsum(x: jax.Array, axis: int, block: int = 32) -> jax.Array:
    """Inclusive cumulative sum of whole numbers (exact in float32 below 2²⁴) along ``axis`` → float32, as products
    with triangular matrices: XLA:CPU's scan (a reduce-window) took ~0.1 ms on a few thousand entries. Longer than
    ``block``, in two levels — within blocks of ``block``, then the blocks' totals — so no triangle is larger than
    ``max(block, n / block)`` on a side (XLA builds them every call: at n = 320 one triangle took ~0.1 ms)."""
    n = x.shape[axis]
    last = jnp.moveaxis(x.astype(jnp.float32), axis, -1)
    if n > block:
        m = -(-n // block)
        parts = jnp.pad(last, [(0, 0)] * (last.ndim - 1) + [(0, m * block - n)]).reshape(*last.shape[:-1], m, block)
        within = _cumsum(parts, -1, block)  # [..., m, block]
        before = _cumsum(within[..., -1], -1, block) - within[..., -1]  # [..., m]: the earlier blocks' totals
        out = (within + before[..., None]).reshape(*last.shape[:-1], m * block)[..., :n]
        return jnp.moveaxis(out, -1, axis)
    upper = (jnp.arange(n)[:, None] <= jnp.arange(n)[None, :]).astype(jnp.float32)  # [i, j]: i <= j
    # HIGHEST: float32 products and sums on every backend (a GPU's default TF32 would round the counts)
    out = jnp.tensordot(last, upper, axes=1, precision=jax.lax.Precision.HIGHEST)
    return jnp.moveaxis(out, -1, axis)


def _nonzero(mask: jax.Array, size: int) -> tuple[jax.Array, jax.Array]:
    """``jnp.nonzero(mask [A, B], size=size, fill_value=0)``: the (row, column) of each True entry, row-major, then
    zeros — each entry's place from the running counts of its row and of the rows before (`_cumsum`)."""
    A, B = mask.shape
    within = _cumsum(mask, 1).astype(jnp.int32)  # [A, B]
    per_row = within[:, -1]
    start = _cumsum(per_row, 0).astype(jnp.int32) - per_row  # [A]
    place = jnp.where(mask, start[:, None] + within - 1, size).reshape(-1)  # past the end: dropped
    rows = jnp.broadcast_to(jnp.arange(A, dtype=jnp.int32)[:, None], (A, B)).reshape(-1)
    cols = jnp.broadcast_to(jnp.arange(B, dtype=jnp.int32)[None, :], (A, B)).reshape(-1)
    zeros = jnp.zeros(size, jnp.int32)
    return zeros.at[place].set(rows, mode="drop"), zeros.at[place].set(cols, mode="drop")


def _neighbours(cols: Columns):
    """The columns that may share a column's expert (at most D side by side): ``(offset [2D − 1], index [C, 2D − 1]
    clipped into range, same [C, 2D − 1]: a live column of the same live expert)``."""
    C, D = cols.rank.shape[0], cols.D
    off = jnp.arange(-(D - 1), D, dtype=jnp.int32)
    at = jnp.arange(C, dtype=jnp.int32)[:, None] + off[None]
    idx = jnp.clip(at, 0, C - 1)
    same = (at >= 0) & (at < C) & cols.live[idx] & cols.live[:, None] & (cols.expert[idx] == cols.expert[:, None])
    return off, idx, same


def move_pairs(ranks: jax.Array, cols: Columns, num_slots: int) -> Moves:
    """Step 1's candidate moves (`Moves`) of ``ranks [E, R]`` packed as ``cols``, at the static size
    K = min(E·R·(R − 1), D·(P − E)) (only replicated experts move: P − E spare slots, at most D ranks each)."""
    E, R = ranks.shape
    D = cols.D
    size = max(1, min(E * R * (R - 1), D * max(num_slots - E, 0)))
    off, idx, same = _neighbours(cols)
    pair = same & (cols.rank[idx] != cols.rank[:, None]) & (off != 0)  # [C, 2D − 1], row-major (e, i, j)
    flat, o = _nonzero(pair, size)
    valid = jnp.arange(size) < jnp.sum(pair)
    a = jnp.where(valid, flat, 0).astype(jnp.int32)
    b = jnp.where(valid, idx[flat, o], 0).astype(jnp.int32)
    g = jnp.where(valid, cols.rank[a], 0)
    h = jnp.where(valid, cols.rank[b], 0)
    return Moves(a, b, cols.expert[a], g, h, valid, D)


def _loads(x, cols: Columns):
    """``(G [D], N [D])``: activations and tokens per rank of ``x [C]`` (whole tokens: exact in float32)."""
    D = cols.D
    both = jnp.stack([(x > 0).astype(jnp.float32), x], axis=1)  # [C, 2]: one scatter for both sums
    G, N = jax.ops.segment_sum(both, cols.rank, num_segments=D + 1)[:D].T  # padding columns: rank D, dropped
    return G, N


def _group_first(mask, group, D: int):
    """Each group's lowest index where ``mask [K]`` holds (K: none) → ``[D]`` int32."""
    K = mask.shape[0]
    return jax.ops.segment_min(jnp.where(mask, jnp.arange(K, dtype=jnp.int32), K), group, num_segments=D)


def _first_best(score, group, D: int, *, with_first: bool = False):
    """Mask of the entries that are their group's maximum finite score, ties to the lowest index (``with_first``:
    and each group's index of it, ``[D]``, K where the group has none)."""
    finite = jnp.isfinite(score)
    best = jax.ops.segment_max(jnp.where(finite, score, -jnp.inf), group, num_segments=D)
    top = finite & (score == best[group])
    first = _group_first(top, group, D)
    mask = top & (jnp.arange(score.shape[0]) == first[group])
    return (mask, first) if with_first else mask


_FORWARD_FIELDS = ("f", "ca", "cb", "m", "y", "new", "t")


def _forwards(x, mv: Moves, G, N, cost: CostModel) -> dict:
    """Step 3a (`solvers.relief._forwards`): per rank, ``[2, D]`` fields of its best whole hand-off and the best of
    another expert (``f = −1``: none; ``ca``, ``cb``: its columns)."""
    y, new = x[mv.a], (x[mv.b] == 0).astype(jnp.float32)
    t_m, score = forward_prices(y, new, G[mv.h], N[mv.h], cost, mv.valid, xp=jnp)
    fields = dict(zip(_FORWARD_FIELDS, (mv.e, mv.a, mv.b, mv.h, y, new, t_m), strict=True))
    out = {k: [] for k in _FORWARD_FIELDS}
    K, D = score.shape[0], G.shape[0]
    for k in range(2):
        if k:
            score = jnp.where(mv.e == out["f"][0][mv.g], -jnp.inf, score)  # the second: another expert
        at = _first_best(score, mv.g, D, with_first=True)[1]  # [D]
        found = at < K
        at = jnp.minimum(at, K - 1)
        for name, arr in fields.items():
            out[name].append(jnp.where(found, arr[at], -1 if name == "f" else 0).astype(arr.dtype))
    return {k: jnp.stack(v) for k, v in out.items()}


def _price(xi, new_h, G, N, t, F: dict, g, h, cost: CostModel) -> dict:
    """Step 3b: every candidate's best ``gain``, ``share`` and ``chain`` ``[K]`` — `solvers.relief_prices.price_moves`
    itself, in `jax.numpy` and float32.

    Computed once per round, elementwise: the gathers first (`price_moves`' own), then
    `solvers.relief_prices.price_gathered` (~150 operations per candidate). XLA copies an elementwise producer into
    every fusion that reads it, so the pricing would run once per result it has, with its gathers inside (scalar
    code), and XLA:CPU drops optimisation barriers: the gathered inputs (``[14, K]``) and the three results (one
    complex64 array: gain, 2·share + chain — exact, shares being whole tokens below 2²³) are each written once by
    `_materialize`. (A loop of one trip did this before; on a GPU each trip of a loop is a round trip to the host.)"""
    has = F["f"] >= 0
    swap = has & (F["m"] == g)
    t_m = jnp.where(has & ~swap, t[jnp.where(has, F["m"], 0)], -jnp.inf)
    zero = jnp.minimum(jnp.sum(xi * 0.0).astype(jnp.int32), 0)  # 0, as data XLA cannot fold
    gathered = (xi, new_h, G[g], N[g], t[g], G[h], N[h], t[h], t_m, has, swap, F["y"], F["new"], F["t"])
    rows = _materialize(jnp.stack([a.astype(jnp.float32) for a in gathered]), zero)  # [14, K]: the gathers, once
    xi, new_h, Gg, Ng, tg, Gh, Nh, th, t_m, has, swap, y_f, new_f, t_f = rows
    p = price_gathered(
        xi, new_h, (Gg, Ng, tg, Gh, Nh, th, t_m), has > 0, swap > 0, y_f, new_f, t_f, cost, xp=jnp, dtype=jnp.float32
    )
    out = _materialize(jax.lax.complex(p["gain"], 2.0 * p["share"] + p["chain"].astype(jnp.float32)), zero)
    code = jnp.imag(out)
    share = jnp.floor(code / 2.0)
    return {"gain": jnp.real(out), "share": share, "chain": code > 2.0 * share}


def _materialize(values: jax.Array, zero: jax.Array) -> jax.Array:
    """``values [K]`` written once to memory: a scatter to its own places (``zero``: 0, as data XLA cannot fold), which
    XLA does not fuse through, so every reader loads the values rather than recomputing their producer."""
    flat = values.reshape(-1)
    at = jnp.arange(flat.shape[0], dtype=jnp.int32) + zero
    return jnp.zeros_like(flat).at[at].set(flat, unique_indices=True).reshape(values.shape)


def _select(gain, sender_time, mv: Moves, m):
    """Step 3c (`solvers.relief._select`) → ``(k [D], accepted [D])``: each sender rank's one candidate — its best
    move, an index into the K moves (K: none) — and whether it is accepted (``gain``, ``sender_time``, ``m``: the
    moves' gains, their sender's time and a chain's third rank, −1: none, all ``[K]``).

    A rank sends at most its best move, so after that first choice the selection runs on D candidates, not K: each
    receiver takes its slowest sender's (then the larger gain, then the lower move), pairwise over ``[D, D]``."""
    D, K = mv.D, gain.shape[0]
    k = _first_best(gain, mv.g, D, with_first=True)[1]  # [D]: sender d's move
    has = k < K
    kk = jnp.minimum(k, K - 1)
    h = jnp.where(has, mv.h[kk], -1)
    primary, secondary = sender_time[kk], gain[kk]
    third = jnp.where(has, m[kk], -1)
    same = has[:, None] & has[None, :] & (h[:, None] == h[None, :])  # [d, d']: the same receiver
    beaten = (primary[None] > primary[:, None]) | (
        (primary[None] == primary[:, None])
        & ((secondary[None] > secondary[:, None]) | ((secondary[None] == secondary[:, None]) & (k[None] < k[:, None])))
    )
    accepted = has & ~jnp.any(same & beaten, axis=1)
    ranks = jnp.arange(D, dtype=jnp.int32)
    receives = jnp.any(accepted[None, :] & (h[None, :] == ranks[:, None]), axis=1)  # [D]
    accepted = accepted & ~receives  # a receiver does not send
    roles = sum((v[None, :] == ranks[:, None]).astype(jnp.int32) for v in (ranks, h, third))  # [r, d]: sender, …
    used = jnp.sum(jnp.where(accepted[None, :], roles, 0), axis=1)  # [D]: the accepted moves' roles each rank has
    return k, accepted & ((third < 0) | (used[jnp.maximum(third, 0)] == 1))


def _augment(x, cols: Columns, mv: Moves, cost: CostModel, G, N, t):
    """Step 3d (`solvers.relief._augment`): the best hand-off path from the slowest rank, applied →
    ``(x, found)``; ``x [C]`` unchanged when no path lowers the makespan or the ranks at it."""
    D, K = cols.D, mv.a.shape[0]
    u, v = mv.g, mv.h
    share = jnp.where(mv.valid, x[mv.a], 0.0)
    g = jnp.argmax(t)
    rank_ids = jnp.arange(D)

    def level(carry):
        _, reached, parent = carry
        first = _group_first(mv.valid & reached[u] & ~reached[v] & (share > 0), v, D)
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
        gets = jnp.where(live & (x[mv.b[kk]] == 0), 1.0, 0.0)
        src, dst = jnp.where(live, u[kk], 0), jnp.where(live, v[kk], 0)
        dG = dG.at[rank_ids, src].add(jnp.where(live, -1.0, 0.0)).at[rank_ids, dst].add(gets)
        dN = dN.at[rank_ids, src].add(-s_k).at[rank_ids, dst].add(s_k)
        return jnp.where(live, src, at), dG, dN

    zeros = jnp.zeros((D, D), jnp.float32)  # walked back as deep as the search went (a path has < D steps)
    _, dG, dN = jax.lax.while_loop(lambda c: jnp.any(parent[c[0]] >= 0), walk, (rank_ids, zeros, zeros))
    m, found = path_prices(G, N, t, dG, dN, reached, g, cost, xp=jnp)

    def apply(carry):
        w, x = carry
        k = parent[w]
        moved = x[mv.a[k]]
        return u[k], x.at[mv.b[k]].add(moved).at[mv.a[k]].add(-moved)

    # m's path, from its end back to g (none when nothing was found: the walk starts at the root)
    _, x = jax.lax.while_loop(lambda c: parent[c[0]] >= 0, apply, (jnp.where(found, m, g), x))
    return x, found


def _seed(n, cols: Columns, cost: CostModel, spread: bool):
    """Step 2 (`solvers.relief._seed`): a start ``x [C]``, each expert whole on one column."""
    E = n.shape[0]
    per_expert = jnp.zeros(E, jnp.int32).at[cols.expert].add(cols.live.astype(jnp.int32))  # columns of each expert
    n_c = n[cols.expert]
    single = per_expert[cols.expert] == 1
    x = jnp.where(cols.live & single, n_c, 0.0)
    t = rank_times(cost, *_loads(x, cols), jnp)
    base = jnp.where(cols.live, t[jnp.minimum(cols.rank, t.shape[0] - 1)], jnp.inf)
    nth = spread_turns(n, per_expert, xp=jnp) if spread else jnp.zeros(E, jnp.int32)
    # each column's place among its expert's columns by (base, column): a stable argsort within the expert
    off, idx, same = _neighbours(cols)
    before = same & ((base[idx] < base[:, None]) | ((base[idx] == base[:, None]) & (off < 0)))
    place = jnp.sum(before, axis=1)
    return x + jnp.where(cols.live & ~single & (place == nth[cols.expert]), n_c, 0.0)


def _side_by_side(cols: Columns, mv: Moves, S: int) -> tuple[Columns, Moves]:
    """``S`` starts as one problem: each start's columns and moves, the s-th on ranks s·D…(s + 1)·D − 1 and columns
    s·C…(s + 1)·C − 1 (``cols`` / ``mv`` of S·C columns, S·K moves, S·D ranks; padding columns on rank S·D). No move
    joins two starts and every step of a round is elementwise or grouped by rank (an expert is compared only with
    the moves of its own ranks), so a round of this problem is a round of each start: one loop trip serves all."""
    C, D = cols.rank.shape[0], cols.D
    s = jnp.arange(S, dtype=jnp.int32)[:, None]

    def stacked(v, shift):
        return (v[None] + s * shift).reshape(-1)

    rank = jnp.where(cols.live[None], cols.rank[None] + s * D, S * D).reshape(-1)
    live = jnp.tile(cols.live, S)
    out_cols = Columns(jnp.tile(cols.expert, S), jnp.tile(cols.column, S), rank, live, S * D)
    shifts = {"a": C, "b": C, "e": 0, "g": D, "h": D}
    out_mv = Moves(*(stacked(getattr(mv, k), v) for k, v in shifts.items()), jnp.tile(mv.valid, S), S * D)
    return out_cols, out_mv


def _round(x, cols: Columns, mv: Moves, cost: CostModel, G, N, t, frozen):
    """Step 3a-c and the accepted moves applied: one round of pairwise moves on ``x [C]`` (the ranks' loads
    ``G, N [D]`` and times ``t [D]``; ``frozen [K]``: moves that may not be taken) → ``(x, accepted [D])``: whether
    each rank's move was taken (`_select`)."""
    g, h = mv.g, mv.h
    F = chain_partners(_forwards(x, mv, G, N, cost), h, mv.e, xp=jnp)  # Step 3a
    xi = x[mv.a]
    moves = _price(xi, (x[mv.b] == 0).astype(jnp.float32), G, N, t, F, g, h, cost)  # Step 3b
    gain, third = downhill_gains(moves, xi, t[g], t[h], F["m"], g, mv.valid, xp=jnp)
    k, accepted = _select(jnp.where(frozen, -jnp.inf, gain), t[g], mv, third)  # Step 3c
    k = jnp.minimum(k, mv.a.shape[0] - 1)  # only the D candidates move (whole tokens: any order sums exactly)
    s = jnp.where(accepted, moves["share"][k], 0.0)
    y = jnp.where(accepted & moves["chain"][k], F["y"][k], 0.0)  # h's hand-off, when the move is a chain
    at = jnp.concatenate([mv.a[k], mv.b[k], F["ca"][k], F["cb"][k]])
    return x.at[at].add(jnp.concatenate([-s, s, -y, y])), accepted


def _improve(starts, cols: Columns, mv: Moves, cost: CostModel, rounds: int):
    """Steps 3-4 (`solvers.relief._improve`) from ``S`` starts ``[S, C]`` at once (`_side_by_side`) → ``(best plans
    [S, C], their makespans [S], rounds each ran [S])``.

    Each start runs as `solvers.relief._improve` does: rounds of pairwise moves until one accepts none (it counts: the
    start is *stuck*) or the rounds run out; a stuck start then searches the plan's hand-off path (step 3d) — applied,
    its rounds go on; none, it is done. A start whose rounds stopped takes no move and keeps its best while another
    runs on, and the path search waits until all have stopped (it is not in the round's loop)."""
    S, C = starts.shape
    D, K = cols.D, mv.a.shape[0]
    all_cols, all_mv = _side_by_side(cols, mv, S)
    start_of = jnp.repeat(jnp.arange(S), K)  # [S·K]: each move's start

    def times(x):
        G, N = _loads(x, all_cols)
        return G, N, rank_times(cost, G, N, jnp)

    def one_round(carry):
        i, x, best_x, best_ms, run, stuck = carry
        G, N, t = times(x)
        ms = jnp.max(t.reshape(S, D), axis=1)
        better = run & (ms < best_ms)
        best_x = jnp.where(better[:, None], x.reshape(S, C), best_x)
        best_ms = jnp.where(better, ms, best_ms)
        x, accepted = _round(x, all_cols, all_mv, cost, G, N, t, ~run[start_of])
        i = i + run.astype(jnp.int32)
        now_stuck = run & ~jnp.any(accepted.reshape(S, D), axis=1)  # x unchanged where stuck
        return i, x, best_x, best_ms, run & ~now_stuck & (i < rounds), stuck | now_stuck

    def rounds_then_paths(carry):
        i, x, best_x, best_ms, run = carry
        init = (i, x, best_x, best_ms, run, jnp.zeros(S, bool))
        i, x, best_x, best_ms, _, stuck = jax.lax.while_loop(lambda c: jnp.any(c[4]), one_round, init)
        G, N, t = (v.reshape(S, D) for v in times(x))
        x, found = x.reshape(S, C), []
        for s in range(S):  # Step 3d, each start's search (on XLA:CPU cheaper run than skipped by a `cond`)
            x_s, found_s = _augment(x[s], cols, mv, cost, G[s], N[s], t[s])
            found_s = stuck[s] & found_s  # kept where the start is stuck
            x, found = x.at[s].set(jnp.where(found_s, x_s, x[s])), [*found, found_s]
        return i, x.reshape(-1), best_x, best_ms, jnp.stack(found) & (i < rounds)

    init = (jnp.zeros(S, jnp.int32), starts.reshape(-1), starts, jnp.full(S, jnp.inf), jnp.full(S, rounds > 0))
    i, x, best_x, best_ms, _ = jax.lax.while_loop(lambda c: jnp.any(c[4]), rounds_then_paths, init)
    # Step 4: the best of the rounds (the last moves included).
    last = jnp.max(times(x)[2].reshape(S, D), axis=1)
    x = x.reshape(S, C)
    return jnp.where((last < best_ms)[:, None], x, best_x), jnp.minimum(last, best_ms), i


def _unpack(x, cols: Columns, shape) -> jax.Array:
    """``x [C]`` on the packed columns → ``[E, R]`` (0 on columns without a rank)."""
    return jnp.zeros(shape, jnp.float32).at[cols.expert, cols.column].add(jnp.where(cols.live, x, 0.0))


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
    (`solvers.relief.relief`, step for step, on the packed columns (`Columns`)); ``num_slots`` P bounds the columns
    and candidate moves (default: E·R). ``with_rounds``: ``(x, rounds)``, the improvement rounds the chosen start ran
    (int32, at most ``rounds``).

    Its two starts run side by side, one loop trip a round of both (`_side_by_side`), each stopping when it is
    done: as many loop trips as the longer start's rounds rather than both starts' rounds, for the same plans (on a
    GPU a round costs its kernel launches and a loop trip a round trip to the host; docs/results.md, "The plan's
    time")."""
    D = num_ranks
    n = n.astype(jnp.float32)
    E, R = ranks.shape
    P = E * R if num_slots is None else num_slots
    cols = columns(ranks, D, P)
    mv = move_pairs(ranks, cols, P)
    starts = jnp.stack([_seed(n, cols, cost, spread) for spread in (False, True)])  # Step 2
    xs, ms, ran = _improve(starts, cols, mv, cost, rounds)  # Steps 3-4, both starts side by side
    x = _unpack(jnp.where(ms[1] < ms[0], xs[1], xs[0]), cols, ranks.shape)
    return (x, jnp.where(ms[1] < ms[0], ran[1], ran[0])) if with_rounds else x


def quotas(counts: jax.Array, x: jax.Array) -> jax.Array:
    """``counts [Ds, E]`` per source and a plan ``x [E, R]`` → whole-token quotas ``q [Ds, E, R]`` (row sums
    ``counts``, column sums ``x``; `solvers.relief.source_quotas`)."""
    counts = counts.astype(jnp.float32)
    c_hi = _cumsum(counts, 0)
    c_lo = c_hi - counts
    x_hi = _cumsum(x, 1)
    x_lo = x_hi - x
    return jnp.maximum(0.0, jnp.minimum(c_hi[:, :, None], x_hi[None]) - jnp.maximum(c_lo[:, :, None], x_lo[None]))


def plan(
    counts: jax.Array, log2phy: jax.Array, *, slots_per_rank: int, num_ranks: int, cost: CostModel, rounds: int = ROUNDS
) -> tuple[jax.Array, jax.Array]:
    """The in-graph dispatch of one batch: per-source counts ``[Ds, E]`` and the placement's ``log2phy [E, R]`` →
    ``(x [E, R] per replica column, q [Ds, E, R] per source)``."""
    ranks = replica_ranks(log2phy, slots_per_rank, num_ranks)
    x = relief(jnp.sum(counts, axis=0), ranks, cost, num_ranks, rounds, num_slots=num_ranks * slots_per_rank)
    return x, quotas(counts, x)


#: `round_stages`' names, in the round's order (each cumulative: it runs the stages before it too).
ROUND_STAGES = ("loads and times", "+ best hand-offs", "+ pricing", "+ selection", "+ applying the moves (a round)")


def round_stages(n: jax.Array, ranks: jax.Array, cost: CostModel, num_ranks: int, *, num_slots: int):
    """One improvement round of `relief` cut into its stages, for profiling (`scripts/bench_ingraph.py --suites
    plan`): ``n [E]`` tokens per expert, ``ranks [E, R]`` → ``(x [2C], {name: body})``, the two seeded starts side by
    side as the plan carries them (`_side_by_side`) and, per name of `ROUND_STAGES` (then ``"path search of a
    stuck round"``, each start's), a function ``x [2C] → a float32 scalar`` that runs the round up to that stage on
    ``x`` (its result depends on every stage run)."""
    cols = columns(ranks, num_ranks, num_slots)
    mv = move_pairs(ranks, cols, num_slots)
    both_cols, both_mv = _side_by_side(cols, mv, 2)
    g, h = both_mv.g, both_mv.h
    n = n.astype(jnp.float32)
    starts = jnp.concatenate([_seed(n, cols, cost, spread) for spread in (False, True)])

    def upto(x, stage: int):
        G, N = _loads(x, both_cols)
        t = rank_times(cost, G, N, jnp)
        if stage == 1:
            return jnp.max(t)
        fw = _forwards(x, both_mv, G, N, cost)
        if stage == 2:
            return jnp.sum(fw["t"])
        F = chain_partners(fw, h, both_mv.e, xp=jnp)
        xi = x[both_mv.a]
        moves = _price(xi, (x[both_mv.b] == 0).astype(jnp.float32), G, N, t, F, g, h, cost)
        if stage == 3:
            return jnp.sum(jnp.where(jnp.isfinite(moves["gain"]), moves["gain"], 0.0))
        gain, third = downhill_gains(moves, xi, t[g], t[h], F["m"], g, both_mv.valid, xp=jnp)
        accepted = _select(gain, t[g], both_mv, third)[1]
        if stage == 4:
            return jnp.sum(accepted.astype(jnp.float32))
        return jnp.sum(_round(x, both_cols, both_mv, cost, G, N, t, jnp.zeros(g.shape, bool))[0])

    def path_search(x):
        def one(x):
            G, N = _loads(x, cols)
            return jnp.sum(_augment(x, cols, mv, cost, G, N, rank_times(cost, G, N, jnp))[0])

        return jnp.sum(jax.vmap(one)(x.reshape(2, -1)))

    bodies = {name: (lambda x, i=i: upto(x, i + 1)) for i, name in enumerate(ROUND_STAGES)}
    bodies["path search of a stuck round"] = path_search
    return starts, bodies
