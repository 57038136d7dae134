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
)

__all__ = [
    "ROUNDS",
    "ROUND_STAGES",
    "Columns",
    "Rows",
    "columns",
    "move_rows",
    "plan",
    "quotas",
    "relief",
    "replica_ranks",
    "round_stages",
    "row_width",
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
    zeros — each entry's place from the running counts of its row and of the rows before (`_cumsum`), its flat index
    written there by one scatter."""
    A, B = mask.shape
    within = _cumsum(mask, 1).astype(jnp.int32)  # [A, B]
    per_row = within[:, -1]
    start = _cumsum(per_row, 0).astype(jnp.int32) - per_row  # [A]
    place = jnp.where(mask, start[:, None] + within - 1, size).reshape(-1)  # past the end: dropped
    flat = jnp.zeros(size, jnp.int32).at[place].set(jnp.arange(A * B, dtype=jnp.int32), mode="drop")
    return flat // B, flat % B


def _shifted(v: jax.Array, D: int, fill) -> jax.Array:
    """``v [C]`` → ``[C, 2D − 1]``: entry (c, o) is ``v[c + o − (D − 1)]`` (``fill`` past either end) — one gather
    from a padded copy (XLA:CPU runs a stack of 2D − 1 slices as as many operations)."""
    C = v.shape[0]
    padded = jnp.pad(v, (D - 1, D - 1), constant_values=fill)
    return padded[jnp.arange(C)[:, None] + jnp.arange(2 * D - 1)[None]]


def _neighbours(cols: Columns):
    """The columns that may share a column's expert (at most D side by side): ``(offset [2D − 1], same [C, 2D − 1]:
    the column at that offset is a live column of the same live expert)``."""
    D = cols.D
    off = jnp.arange(-(D - 1), D, dtype=jnp.int32)
    same = _shifted(cols.live, D, False) & cols.live[:, None] & (_shifted(cols.expert, D, -1) == cols.expert[:, None])
    return off, same


class Rows(NamedTuple):
    """Step 1's candidate moves — expert e's share on column a to its column b on another rank — by sender rank,
    ``[D, W]``: row d holds rank d's moves in the row-major (e, i, j) order of `solvers.relief.move_pairs` (its lowest
    first), padded at the end. W = min(E·(R − 1), P − E) bounds a rank's moves: Σ over its experts of their other
    ranks, at most Σ_e (r_e − 1) = P − E with every expert placed. A round's per-sender choices (a rank's best
    hand-off, its best move) are reductions along a row, one operation each."""

    a: jax.Array  # [D, W] int32 sender column (an index into `Columns`; 0 where invalid)
    b: jax.Array  # [D, W] int32 receiver column
    e: jax.Array  # [D, W] int32 expert
    h: jax.Array  # [D, W] int32 receiver rank (0 where invalid)
    valid: jax.Array  # [D, W] bool
    order: jax.Array  # [D, W] int32 the move's place in the (e, i, j) order (`NO_MOVE` where invalid): ties


#: `Rows.order` of the padding entries.
NO_MOVE = 2**31 - 1


def row_width(experts: int, replicas: int, num_slots: int) -> int:
    """`Rows`' width W for E experts, R replica columns and P slots."""
    return max(1, min(experts * (replicas - 1), num_slots - experts))


def move_rows(ranks: jax.Array, cols: Columns, num_slots: int) -> Rows:
    """Step 1's candidate moves (`Rows`, ``[D, W]``) of ``ranks [E, R]`` packed as ``cols``: each pair of columns of
    one expert on two ranks, at its sender's row after that rank's earlier pairs — a running count of the pairs
    per column, then per rank over the columns (`_cumsum`) — and written with one scatter."""
    E, R = ranks.shape
    D = cols.D
    W = row_width(E, R, num_slots)
    off, same = _neighbours(cols)
    pair = same & (_shifted(cols.rank, D, -1) != cols.rank[:, None]) & (off != 0)  # [C, 2D − 1], row-major (e, i, j)
    within = _cumsum(pair, 1).astype(jnp.int32)  # [C, 2D − 1]: the column's pairs so far
    count = within[:, -1]
    order = _cumsum(count, 0).astype(jnp.int32) - count  # [C]: pairs of the earlier columns
    mine = cols.rank[:, None] == jnp.arange(D, dtype=jnp.int32)[None]  # [C, D]; padding columns (rank D): none
    per_rank = _cumsum(jnp.where(mine, count[:, None], 0), 0).astype(jnp.int32)  # [C, D]
    start = jnp.sum(jnp.where(mine, per_rank, 0), axis=1) - count  # [C]: the rank's pairs in earlier columns
    pos = start[:, None] + within - 1
    place = jnp.where(pair & (pos < W), cols.rank[:, None] * W + pos, D * W).reshape(-1)  # past the end: dropped
    flat = jnp.full(D * W, -1, jnp.int32).at[place].set(jnp.arange(place.shape[0], dtype=jnp.int32), mode="drop")
    valid = flat >= 0
    c, o = jnp.maximum(flat, 0) // (2 * D - 1), jnp.maximum(flat, 0) % (2 * D - 1)
    a = jnp.where(valid, c, 0)
    b = jnp.where(valid, c + o - (D - 1), 0)
    h = jnp.where(valid, cols.rank[b], 0)
    rank_order = jnp.where(valid, order[c] + within[c, o] - 1, NO_MOVE)
    return Rows(*(v.reshape(D, W) for v in (a, b, cols.expert[a], h, valid, rank_order)))


def _loads(x, cols: Columns):
    """``(G [D], N [D])``: activations and tokens per rank of ``x [C]`` (whole tokens: exact in float32)."""
    D = cols.D
    both = jnp.stack([(x > 0).astype(jnp.float32), x], axis=1)  # [C, 2]: one scatter for both sums
    G, N = jax.ops.segment_sum(both, cols.rank, num_segments=D + 1)[:D].T  # padding columns: rank D, dropped
    return G, N


def _ahead(sq, iq, sp, ip):
    """Whether the entry (value ``sq``, index ``iq``) comes before (``sp``, ``ip``) in a row's order: the larger
    value first, then the lower index (a total order on distinct indices). The values the plan compares are finite or
    −inf (not a candidate), never NaN or +inf, so the finite ones come first without a test of finiteness (~5% of a
    plan on XLA:CPU: the test ran in every step of both reductions)."""
    return (sq > sp) | ((sq == sp) & (iq < ip))


def _row_first(values: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Each row's first best of ``values [D, W]`` (float, or complex ordered by the real part, the imaginary part
    carried along; finite or −inf, `_ahead`) → ``(its value [D], its index [D])``: the largest finite value, ties to
    the lower index; a row with none gives −inf. One reduction (its operands' producer fused in once: the value is its
    only input, the index an iota), whose order is total (`_ahead`), so any order of combining gives the same result."""
    D, W = values.shape
    key = jnp.real if jnp.iscomplexobj(values) else (lambda v: v)

    def first(p, q):
        (vp, ip), (vq, iq) = p, q
        take = _ahead(key(vq), iq, key(vp), ip)
        return jnp.where(take, vq, vp), jnp.where(take, iq, ip)

    index = jax.lax.broadcasted_iota(jnp.int32, (D, W), 1)
    init = (jnp.array(-jnp.inf, values.dtype), jnp.int32(W))
    return jax.lax.reduce((values, index), init, first, (1,))


def _row_two_first(score: jax.Array, group: jax.Array):
    """Each row's first best of ``score [D, W]`` (`_row_first`) and its first best among the entries of another
    ``group [D, W]`` than that one's → ``(s1, i1, s2, i2)``, each ``[D]``. One reduction whose state holds both:
    merging two, the better first wins, and the second is the better of the winner's second and the loser's first —
    or, where the loser's first is of the winner's group, the loser's second. Each state being right for its part,
    the merge is right for their union, so any order of combining gives the same result."""
    D, W = score.shape

    def merge(p, q):
        q_wins = _ahead(q[0], q[1], p[0], p[1])
        win = [jnp.where(q_wins, b, a) for a, b in zip(p, q, strict=True)]
        lose = [jnp.where(q_wins, a, b) for a, b in zip(p, q, strict=True)]
        other = lose[2] != win[2]
        s, i = jnp.where(other, lose[0], lose[3]), jnp.where(other, lose[1], lose[4])
        take = _ahead(s, i, win[3], win[4])
        return win[0], win[1], win[2], jnp.where(take, s, win[3]), jnp.where(take, i, win[4])

    index = jax.lax.broadcasted_iota(jnp.int32, (D, W), 1)
    none = (jnp.full((D, W), -jnp.inf, score.dtype), jnp.full((D, W), W, jnp.int32))  # each entry: no second
    init = (
        jnp.array(-jnp.inf, score.dtype),
        jnp.int32(W),
        jnp.int32(-1),
        jnp.array(-jnp.inf, score.dtype),
        jnp.int32(W),
    )
    s1, i1, _, s2, i2 = jax.lax.reduce((score, index, group.astype(jnp.int32), *none), init, merge, (1,))
    return s1, i1, s2, i2


def _pick(w, *arrays):
    """Each row's entries ``w [D]`` or ``[D, k]`` (clipped into the row) of ``arrays [D, W]`` (one dtype) → each
    ``[D]`` or ``[D, k]``, as one gather of their stack (XLA hoists the stack of loop-invariant rows out of the
    round's loop)."""
    at = jnp.minimum(w, arrays[0].shape[1] - 1).reshape(w.shape[0], -1, 1)
    both = jnp.take_along_axis(jnp.stack(arrays, axis=-1), at, axis=1)  # [D, k, len(arrays)]
    return tuple(both[..., i].reshape(w.shape) for i in range(len(arrays)))


_FORWARD_FIELDS = ("f", "ca", "cb", "m", "y", "new", "t")


def _forwards(x, rows: Rows, G, N, cost: CostModel) -> dict:
    """Step 3a (`solvers.relief._forwards`): per rank, ``[2, D]`` fields of its best whole hand-off and the best of
    another expert (``f = −1``: none; ``ca``, ``cb``: its columns) — both from one reduction along the rows of
    ``−t_m`` (`_row_two_first`)."""
    y, new = x[rows.a], (x[rows.b] == 0).astype(jnp.float32)
    score = forward_prices(y, new, G[rows.h], N[rows.h], cost, rows.valid, xp=jnp)[1]  # [D, W]
    s1, i1, s2, i2 = _row_two_first(score, rows.e)
    best, w = jnp.stack([s1, s2]), jnp.stack([i1, i2], axis=1)  # [2, D], [D, 2]
    found = jnp.isfinite(best)
    e, a, b, h = (v.T for v in _pick(w, rows.e, rows.a, rows.b, rows.h))  # [2, D]
    values = (e, a, b, h, x[a], (x[b] == 0).astype(jnp.float32), -best)  # t_m = −score, exactly
    return {
        name: jnp.where(found, v, -1 if name == "f" else 0).astype(v.dtype)
        for name, v in zip(_FORWARD_FIELDS, values, strict=True)
    }


def _best_moves(x, rows: Rows, G, N, t, F: dict, frozen, cost: CostModel):
    """Steps 3b and 3c's first choice: every candidate's best price (`solvers.relief_prices.price_moves` in
    `jax.numpy` and float32, then `downhill_gains`), and each sender rank's best move → ``(gain [D], 2·share + chain
    [D], w [D])``: the move's gain (non-finite: none), its share and whether it chains, and its entry in the row.

    The pricing (~150 operations per candidate) has one reader, the reduction along the rows (`_row_first`), whose
    value is ``gain + i·(2·share + chain)`` (exact: shares are whole tokens below 2²³): XLA fuses an elementwise
    producer into every reader, so the pricing runs once, inside the reduction, and is never written out."""
    g = jnp.arange(rows.a.shape[0], dtype=jnp.int32)[:, None]  # [D, 1]: a row's sender
    h = rows.h
    P = chain_partners(F, h, rows.e, xp=jnp)  # h's hand-off, of an expert other than e
    xi = x[rows.a]
    has = P["f"] >= 0
    swap = has & (P["m"] == g)
    t_m = jnp.where(has & ~swap, t[jnp.where(has, P["m"], 0)], -jnp.inf)
    loads = (G[:, None], N[:, None], t[:, None], G[h], N[h], t[h], t_m)  # the sender: the row's rank
    new_h = (x[rows.b] == 0).astype(jnp.float32)
    p = price_gathered(xi, new_h, loads, has, swap, P["y"], P["new"], P["t"], cost, xp=jnp, dtype=jnp.float32)
    gain = downhill_gains(p, xi, t[:, None], t[h], P["m"], g, rows.valid & ~frozen[:, None], xp=jnp)[0]
    best, w = _row_first(jax.lax.complex(gain, 2.0 * p["share"] + p["chain"].astype(jnp.float32)))
    return jnp.real(best), jnp.imag(best), w


def _select(found, gain, sender_time, h, order, third):
    """Step 3c (`solvers.relief._select`) on each sender rank's one candidate, its best move (all ``[D]``: whether it
    has one, its gain, the sender's time, its receiver, its place in the (e, i, j) order and a chain's third rank,
    −1: none) → ``accepted [D]``. A rank sends at most its best move, so the rest runs pairwise over ``[D, D]``:
    each receiver takes its slowest sender's (then the larger gain, then the lower move), receivers do not send, a
    chain's third rank is in no other accepted move."""
    D = found.shape[0]
    h = jnp.where(found, h, -1)
    third = jnp.where(found, third, -1)
    same = found[:, None] & found[None, :] & (h[:, None] == h[None, :])  # [d, d']: the same receiver
    p, s, k = sender_time, gain, order
    beaten = (p[None] > p[:, None]) | (
        (p[None] == p[:, None]) & ((s[None] > s[:, None]) | ((s[None] == s[:, None]) & (k[None] < k[:, None])))
    )
    accepted = found & ~jnp.any(same & beaten, axis=1)
    ranks = jnp.arange(D, dtype=jnp.int32)
    receives = jnp.any(accepted[None, :] & (h[None, :] == ranks[:, None]), axis=1)  # [D]
    accepted = accepted & ~receives  # a receiver does not send
    roles = sum((v[None, :] == ranks[:, None]).astype(jnp.int32) for v in (ranks, h, third))  # [r, d]: sender, …
    used = jnp.sum(jnp.where(accepted[None, :], roles, 0), axis=1)  # [D]: the accepted moves' roles each rank has
    return accepted & ((third < 0) | (used[jnp.maximum(third, 0)] == 1))


def _augment(x, rows: Rows, cost: CostModel, G, N, t):
    """Step 3d (`solvers.relief._augment`): the best hand-off path from the slowest rank, applied →
    ``(x, found)``; ``x [C]`` unchanged when no path lowers the makespan or the ranks at it. The search reaches
    each rank by the lowest move (in the (e, i, j) order, `Rows.order`) from the ranks reached before."""
    D, W = rows.a.shape
    a, b, v, valid, order = (r.reshape(-1) for r in (rows.a, rows.b, rows.h, rows.valid, rows.order))
    u = jnp.repeat(jnp.arange(D, dtype=jnp.int32), W)  # each move's sender
    moves = jnp.arange(D * W, dtype=jnp.int32)
    share = jnp.where(valid, x[a], 0.0)
    g = jnp.argmax(t)
    rank_ids = jnp.arange(D)

    def level(carry):
        _, reached, parent = carry
        mask = valid & reached[u] & ~reached[v] & (share > 0)
        lowest = jax.ops.segment_min(jnp.where(mask, order, NO_MOVE), v, num_segments=D)  # [D]
        first = jax.ops.segment_max(jnp.where(mask & (order == lowest[v]), moves, -1), v, num_segments=D)
        new = (lowest < NO_MOVE) & ~reached
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
        gets = jnp.where(live & (x[b[kk]] == 0), 1.0, 0.0)
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
        moved = x[a[k]]
        return u[k], x.at[b[k]].add(moved).at[a[k]].add(-moved)

    # m's path, from its end back to g (none when nothing was found: the walk starts at the root)
    _, x = jax.lax.while_loop(lambda c: parent[c[0]] >= 0, apply, (jnp.where(found, m, g), x))
    return x, found


def _spread_turns(n, count):
    """`solvers.relief_prices.spread_turns` for the replicated experts (``count [E]`` > 1; the others' turns are
    never read): each one's turn is the number of experts before it, in order of decreasing load ``n [E]`` (ties:
    the lower expert), whose column count is not 1 (as the twin counts them), mod its ranks — counted pairwise over
    ``[E, E]`` (the twin's two argsorts took ~0.1 ms on XLA:CPU)."""
    e = jnp.arange(n.shape[0])
    before = (n[:, None] > n[None, :]) | ((n[:, None] == n[None, :]) & (e[:, None] < e[None, :]))  # [e', e]
    kth = jnp.sum(before & (count[:, None] != 1), axis=0)
    return kth % jnp.maximum(count, 1)


def _seed(n, cols: Columns, cost: CostModel, spread: bool):
    """Step 2 (`solvers.relief._seed`): a start ``x [C]``, each expert whole on one column."""
    E = n.shape[0]
    per_expert = jnp.zeros(E, jnp.int32).at[cols.expert].add(cols.live.astype(jnp.int32))  # columns of each expert
    n_c = n[cols.expert]
    single = per_expert[cols.expert] == 1
    x = jnp.where(cols.live & single, n_c, 0.0)
    t = rank_times(cost, *_loads(x, cols), jnp)
    base = jnp.where(cols.live, t[jnp.minimum(cols.rank, t.shape[0] - 1)], jnp.inf)
    nth = _spread_turns(n, per_expert) if spread else jnp.zeros(E, jnp.int32)
    # each column's place among its expert's columns by (base, column): a stable argsort within the expert
    off, same = _neighbours(cols)
    near = _shifted(base, cols.D, jnp.inf)
    before = same & ((near < base[:, None]) | ((near == base[:, None]) & (off < 0)))
    place = jnp.sum(before, axis=1)
    return x + jnp.where(cols.live & ~single & (place == nth[cols.expert]), n_c, 0.0)


def _side_by_side(cols: Columns, rows: Rows, S: int) -> tuple[Columns, Rows]:
    """``S`` starts as one problem: each start's columns and moves, the s-th on ranks s·D…(s + 1)·D − 1 (its rows)
    and columns s·C…(s + 1)·C − 1 (``cols`` of S·C columns on S·D ranks, padding columns on rank S·D; ``rows``
    ``[S·D, W]``). No move joins two starts and every step of a round is elementwise, along a row or grouped by rank
    (an expert is compared only with the moves of its own ranks), so a round of this problem is a round of each
    start: one loop trip serves all."""
    C, D = cols.rank.shape[0], cols.D
    s = jnp.arange(S, dtype=jnp.int32)[:, None, None]

    def stacked(v, shift):
        return (v[None] + s * shift).reshape(-1, v.shape[1])

    rank = jnp.where(cols.live[None], cols.rank[None] + s[:, 0] * D, S * D).reshape(-1)
    out_cols = Columns(jnp.tile(cols.expert, S), jnp.tile(cols.column, S), rank, jnp.tile(cols.live, S), S * D)
    shifts = {"a": C, "b": C, "e": 0, "h": D}  # `order` breaks ties within a start only: unshifted
    tiled = (jnp.tile(getattr(rows, k), (S, 1)) for k in ("valid", "order"))
    out_rows = Rows(*(stacked(getattr(rows, k), v) for k, v in shifts.items()), *tiled)
    return out_cols, out_rows


def _moves(x, rows: Rows, cost: CostModel, G, N, t, frozen):
    """Step 3a-c on ``x [C]`` (the ranks' loads ``G, N [D]`` and times ``t [D]``; ``frozen [D]``: ranks whose moves
    may not be taken) → ``(accepted [D], at [4D], add [4D])``: whether each rank's best move is taken (`_select`),
    and the adds to ``x`` that apply them (a move's sender and receiver columns, a chain's hand-off's)."""
    F = _forwards(x, rows, G, N, cost)  # Step 3a
    gain, code, w = _best_moves(x, rows, G, N, t, F, frozen, cost)  # Step 3b, and each sender's best move
    found = jnp.isfinite(gain)
    share = jnp.floor(code / 2.0)
    chain = code > 2.0 * share
    a, b, e, h, order = _pick(w, rows.a, rows.b, rows.e, rows.h, rows.order)
    P = chain_partners(F, h, e, xp=jnp)  # the chain's partner: h's hand-off of another expert
    third = jnp.where(chain & (P["m"] != jnp.arange(h.shape[0])), P["m"], -1)  # `downhill_gains`' third rank
    accepted = _select(found, gain, t, h, order, third)  # Step 3c
    s = jnp.where(accepted, share, 0.0)
    y = jnp.where(accepted & chain, P["y"], 0.0)  # h's hand-off, when the move is a chain
    return accepted, jnp.concatenate([a, b, P["ca"], P["cb"]]), jnp.concatenate([-s, s, -y, y])


def _round(x, rows: Rows, cost: CostModel, G, N, t, frozen):
    """One round of pairwise moves on ``x [C]`` (`_moves`, applied) → ``(x, accepted [D])``."""
    accepted, at, add = _moves(x, rows, cost, G, N, t, frozen)
    return x.at[at].add(add), accepted  # whole tokens: any order of the adds sums exactly


def _improve(starts, cols: Columns, rows: Rows, cost: CostModel, rounds: int):
    """Steps 3-4 (`solvers.relief._improve`) from ``S`` starts ``[S, C]`` at once (`_side_by_side`) → ``(best plans
    [S, C], their makespans [S], rounds each ran [S])``.

    Each start runs as `solvers.relief._improve` does: rounds of pairwise moves until one accepts none (it counts: the
    start is *stuck*) or the rounds run out; a stuck start then searches the plan's hand-off path (step 3d) — applied,
    its rounds go on; none, it is done. A start whose rounds stopped takes no move and keeps its best while another
    runs on, and the path search waits until all have stopped (it is not in the round's loop)."""
    S, C = starts.shape
    D = cols.D
    all_cols, all_rows = _side_by_side(cols, rows, S)
    start_of = jnp.repeat(jnp.arange(S), D)  # [S·D]: each rank's start

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
        x, accepted = _round(x, all_rows, cost, G, N, t, ~run[start_of])
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
            x_s, found_s = _augment(x[s], rows, cost, G[s], N[s], t[s])
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
    Every expert needs a column (as `solvers.Placement` requires of every placement): the candidate moves' bound
    (`row_width`) counts on it, and an expert without one has nowhere to put its tokens.

    Its two starts run side by side, one loop trip a round of both (`_side_by_side`), each stopping when it is
    done: as many loop trips as the longer start's rounds rather than both starts' rounds, for the same plans (on a
    GPU a round costs its kernel launches and a loop trip a round trip to the host; docs/results.md, "The plan's
    time")."""
    D = num_ranks
    n = n.astype(jnp.float32)
    E, R = ranks.shape
    P = E * R if num_slots is None else num_slots
    cols = columns(ranks, D, P)
    rows = move_rows(ranks, cols, P)
    starts = jnp.stack([_seed(n, cols, cost, spread) for spread in (False, True)])  # Step 2
    xs, ms, ran = _improve(starts, cols, rows, cost, rounds)  # Steps 3-4, both starts side by side
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
    counts: jax.Array,
    log2phy: jax.Array,
    *,
    slots_per_rank: int,
    num_ranks: int,
    cost: CostModel,
    rounds: int = ROUNDS,
    with_rounds: bool = False,
) -> tuple[jax.Array, ...]:
    """The in-graph dispatch of one batch: per-source counts ``[Ds, E]`` and the placement's ``log2phy [E, R]`` →
    ``(x [E, R] per replica column, q [Ds, E, R] per source)``; ``with_rounds``: a third element, the improvement
    rounds relief ran (`relief`)."""
    ranks = replica_ranks(log2phy, slots_per_rank, num_ranks)
    n = jnp.sum(counts, axis=0)
    x, ran = relief(n, ranks, cost, num_ranks, rounds, num_slots=num_ranks * slots_per_rank, with_rounds=True)
    q = quotas(counts, x)
    return (x, q, ran) if with_rounds else (x, q)


#: `round_stages`' names, in the round's order (each cumulative: it runs the stages before it too).
ROUND_STAGES = (
    "loads and times",
    "+ best hand-offs",
    "+ pricing, each sender's best move",
    "+ selection",
    "+ applying the moves (a round)",
)


def round_stages(n: jax.Array, ranks: jax.Array, cost: CostModel, num_ranks: int, *, num_slots: int):
    """One improvement round of `relief` cut into its stages, for profiling (`scripts/bench_ingraph.py --suites
    plan`): ``n [E]`` tokens per expert, ``ranks [E, R]`` → ``(x [2C], {name: body})``, the two seeded starts side by
    side as the plan carries them (`_side_by_side`) and, per name of `ROUND_STAGES` (then ``"path search of a
    stuck round"``, each start's), a function ``x [2C] → a float32 scalar`` that runs the round up to that stage on
    ``x`` (its result depends on every stage run)."""
    cols = columns(ranks, num_ranks, num_slots)
    start_rows = move_rows(ranks, cols, num_slots)  # one start's
    both_cols, rows = _side_by_side(cols, start_rows, 2)
    n = n.astype(jnp.float32)
    starts = jnp.concatenate([_seed(n, cols, cost, spread) for spread in (False, True)])
    frozen = jnp.zeros(rows.a.shape[0], bool)

    def upto(x, stage: int):
        G, N = _loads(x, both_cols)
        t = rank_times(cost, G, N, jnp)
        if stage == 1:
            return jnp.max(t)
        F = _forwards(x, rows, G, N, cost)
        if stage == 2:
            return jnp.sum(F["t"])
        if stage == 3:
            gain = _best_moves(x, rows, G, N, t, F, frozen, cost)[0]
            return jnp.sum(jnp.where(jnp.isfinite(gain), gain, 0.0))
        if stage == 4:
            return jnp.sum(_moves(x, rows, cost, G, N, t, frozen)[0].astype(jnp.float32))
        return jnp.sum(_round(x, rows, cost, G, N, t, frozen)[0])

    def path_search(x):
        def one(x):
            G, N = _loads(x, cols)
            return jnp.sum(_augment(x, start_rows, cost, G, N, rank_times(cost, G, N, jnp))[0])

        return jnp.sum(jax.vmap(one)(x.reshape(2, -1)))

    bodies = {name: (lambda x, i=i: upto(x, i + 1)) for i, name in enumerate(ROUND_STAGES)}
    bodies["path search of a stuck round"] = path_search
    return starts, bodies
