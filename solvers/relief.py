"""Pairwise relief: a makespan-aware dispatch of one batch in a fixed number of vectorised rounds — the numpy twin
of the in-graph dispatch (`tempo_jax.layer.relief`, issue 38), and the solver policy ``"relief"``.

The problem (docs/algorithms.md §2): tokens ``x[e, r]`` of expert e on its replica column r,
``Σ_r x[e, r] = n_e``, minimising the makespan ``max_g t_g``, ``t_g = max(a + b·G_g, c + β·N_g [, c2 + γ·N_g])``.

Algorithm (every step vectorised over experts, replica columns and ranks; no data-dependent control flow):

1. Columns: each expert's replica ranks (`replica_ranks`), a rank that holds two of its replicas counted once.
2. Two starts (`_seed`): an expert with one rank is fixed there; every replicated expert goes whole (one activation
   per expert, the fixed charge) to the rank cheapest under the fixed experts alone (start 1), or, in order of
   decreasing load, the k-th replicated expert to its (k mod r_e)-th cheapest rank (start 2: spread, which the
   flat regime's bipartite semi-matching needs when every expert is replicated). Steps 3-4 run from each, side by
   side, and the better plan is kept.
3. Rounds (a fixed number). With the current loads (G_g activations, N_g tokens, t_g times):
   a. Forwards: for every rank h, its best whole hand-off — the share of one expert f on h moved whole to another
      of f's ranks m, the m whose time after is lowest — and the best of another expert (`_forwards`).
   b. Moves: every (e, column i → column j) is priced as a *plain* move — the whole share ``x[e, i]`` (frees an
      activation on i's rank g) or the part that equalises the two ranks' tokens, ``⌊(N_g − N_h) / 2⌋`` clipped to
      ``[1, x[e, i] − 1]`` (g keeps its activation, j's rank h may gain one) — and, where no plain move gains, as
      a *chain*: the same move while h hands its best forward (of an expert other than e) on, to a third rank m
      or back to g (a swap); the part then equalises g and h after the hand-off. Its gain is the involved ranks'
      time before minus after, ``max(t_g, t_h[, t_m]) − max(t_g', t_h'[, t_m'])``, taken only downhill
      (``t_g ≥ t_h``) and positive.
   c. Selection: each rank keeps its best outgoing move; each rank accepts, among those coming in, the one from
      the slowest sender (then the largest gain); a rank that receives sends nothing that round, and a chain's
      third rank takes part in no other move. Ties: the lower flat index of (e, i, j). The accepted moves apply
      at once.
   d. A hand-off path (`_augment`), in a round that accepts no move: from the slowest rank g (the lowest index among
      ties), a breadth-first search over whole hand-offs (every rank reached hands one share it holds before the
      path to a rank not yet reached, the lowest candidate index first; at most D − 1 levels) gives a path to every
      reachable rank m. Moving each share along the path to m costs g an activation, gives m one, and leaves the
      ranks between with one in and one out — the augmenting paths of bipartite semi-matching, of any length,
      priced by the time function on every rank. The path whose plan is lexicographically best by (makespan, ranks
      at the makespan, m) is taken when it lowers the makespan, or keeps it with fewer ranks at it (a plateau
      step: the next path or move then lowers it); otherwise the rounds stop.
4. The best dispatch of the rounds (by makespan) is the answer; its shares are whole tokens. A round that accepts
   no move and finds no path leaves the plan unchanged, so the rounds stop there (the same answer, earlier).

Why it prices both regimes: every move is scored by the max-affine time itself. In the flat regime a whole move
saves the sender an activation ``b`` and chains move activations along (the augmenting paths of semi-matching); a
split is taken only when the tokens ``β·s`` it relieves outweigh the activation ``b`` it adds to the receiver.
Token balancing (LPLB: splits freely) and activation balancing (METRO: never splits) each leave one term out.

Complexity: the K candidate moves are the (expert, column, column) triples on distinct ranks (`move_pairs`:
K ≤ min(E·R·(R − 1), D·(P − E)), P slots, since only replicated experts move); per round O(K) prices (plain and
chain, whole and part) and segment maxima over D ranks, at most ``2·rounds·K`` in all (two starts; EP8, E = 256 +
64 redundant slots: K ≈ 130, 64 rounds); a path round (3d) costs O(D·K + D³) (the search's D − 1 levels over the
K candidates, then every terminal's path walked back at once); memory O(K + E·R + D²). `source_quotas` then
splits each expert's plan over the source ranks (northwest-corner rule, O(D·E·R)) so that a deterministic
dispatch realises it exactly.

Glossary additions: Ds source ranks."""

from __future__ import annotations

import numpy as np

from .checks import check_int
from .cost import CostModel
from .problem import DispatchProblem
from .relief_prices import (
    chain_partners,
    downhill_gains,
    forward_prices,
    path_prices,
    price_gathered,
    price_moves,
    rank_times,
    spread_turns,
)

__all__ = [
    "check_relief_cost",
    "move_pairs",
    "price_gathered",
    "price_moves",
    "rank_loads",
    "rank_times",
    "relief",
    "relief_policy",
    "replica_ranks",
    "source_quotas",
]

#: Rounds of step 3 by default (measured against tempo in docs/results.md: the EP32 / EP64 grids need ~64).
ROUNDS = 64


def check_relief_cost(cost: CostModel, where: str = "relief") -> None:
    """Raise ValueError for a cost model pairwise relief cannot price (the tile term of Eq. 2: a share's cost
    depends on its 128-token tiles, which the equal-token split does not track)."""
    if not isinstance(cost, CostModel):
        raise ValueError(f"{where}: cost must be a solvers.CostModel, got {type(cost).__name__}")
    if cost.has_tiles:
        raise ValueError(
            f"{where}: the cost model has a tile term (b2 = {cost.b2}); pairwise relief prices Eq. 1 and "
            "the traffic piece of Eq. 4, not tiles: use CostModel.kernel_only() without b2, or the "
            "'tempo' policy with tile_aware=True"
        )


def replica_ranks(log2phy: np.ndarray, slots_per_rank: int) -> np.ndarray:
    """``log2phy [E, R]`` physical slots (−1 padded) → ``[E, R]`` int64 rank of each replica column, −1 where there
    is none or where an earlier column of the same expert is on the same rank (step 1)."""
    l2p = np.asarray(log2phy, np.int64)
    ranks = np.where(l2p >= 0, l2p // slots_per_rank, -1)
    for r in range(1, ranks.shape[1]):
        dup = (ranks[:, r : r + 1] == ranks[:, :r]).any(axis=1) & (ranks[:, r] >= 0)
        ranks[dup, r] = -1
    return ranks


def _loads(x: np.ndarray, ranks: np.ndarray, D: int) -> tuple[np.ndarray, np.ndarray]:
    ok = ranks >= 0
    G, N = np.zeros(D), np.zeros(D)
    np.add.at(N, ranks[ok], x[ok])
    np.add.at(G, ranks[ok], (x[ok] > 0).astype(np.float64))
    return G, N


def rank_loads(x: np.ndarray, ranks: np.ndarray, num_ranks: int) -> tuple[np.ndarray, np.ndarray]:
    """``(G [D], N [D])``: activations (columns with tokens) and tokens per rank of a plan ``x [E, R]``."""
    return _loads(x, ranks, num_ranks)


def _first_best(score: np.ndarray, group: np.ndarray, D: int) -> np.ndarray:
    """Mask of the entries that are their group's maximum finite score, ties to the lowest index."""
    finite = np.isfinite(score)
    best = np.full(D, -np.inf)
    np.maximum.at(best, group[finite], score[finite])
    top = finite & (score == best[group])
    idx = np.arange(score.size)
    first = np.full(D, score.size)
    np.minimum.at(first, group[top], idx[top])
    return top & (idx == first[group])


def _lexi_best(primary: np.ndarray, secondary: np.ndarray, group: np.ndarray, D: int) -> np.ndarray:
    """Mask of each group's best entry by ``primary``, then ``secondary`` (−inf: not a candidate), then index."""
    finite = np.isfinite(secondary)
    best = np.full(D, -np.inf)
    np.maximum.at(best, group[finite], primary[finite])
    return _first_best(np.where(finite & (primary == best[group]), secondary, -np.inf), group, D)


_FORWARD_FIELDS = ("f", "ci", "cm", "m", "y", "new", "t")


def move_pairs(ranks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Step 1's candidate moves: every (expert e, column i, column j) with both columns on distinct ranks, in
    row-major order → ``(e, i, j)`` int64 arrays of length K ≤ min(E·R·(R − 1), D·(P − E))."""
    ok = ranks >= 0
    pair = ok[:, :, None] & ok[:, None, :] & (ranks[:, :, None] != ranks[:, None, :])
    return np.nonzero(pair)


def _forwards(x, ranks, pe, pi, pj, G, N, cost, D):
    """Step 3a: per rank h, ``[2, D]`` arrays of its best whole hand-off and the best of another expert: the expert
    f, its columns on h (``ci``) and on m (``cm``), the rank m, the share y, whether m gains an activation, and m's
    time after. ``f = −1`` where a rank has none."""
    h, m = ranks[pe, pi], ranks[pe, pj]
    y, new = x[pe, pi], (x[pe, pj] == 0).astype(np.float64)
    t_m, score = forward_prices(y, new, G[m], N[m], cost)
    out = {k: np.zeros((2, D), np.int64 if k in ("f", "ci", "cm", "m") else np.float64) for k in _FORWARD_FIELDS}
    for k in range(2):
        best = _first_best(score, h, D)
        idx = np.flatnonzero(best)
        out["f"][k] = -1
        for name, arr in zip(_FORWARD_FIELDS, (pe, pi, pj, m, y, new, t_m), strict=True):
            out[name][k, h[idx]] = arr[idx]
        score = np.where(pe == out["f"][0][h], -np.inf, score)  # the second: another expert
    return out


def relief(n: np.ndarray, ranks: np.ndarray, cost: CostModel, num_ranks: int, rounds: int = ROUNDS) -> np.ndarray:
    """Pairwise relief (see the module) of ``n [E]`` tokens per expert over replica columns ``ranks [E, R]``
    (`replica_ranks`) → ``x [E, R]`` float64 whole tokens, ``Σ_r x[e, r] = n_e``, 0 on columns without a rank."""
    check_relief_cost(cost)
    rounds = check_int("rounds", rounds, minimum=0, where="relief")
    n = np.asarray(n, np.float64)
    ranks = np.asarray(ranks, np.int64)
    D = num_ranks
    # Step 2: the two starts; Steps 3-4 from each; the better plan (ties: the first start).
    best_x, best_ms = None, np.inf
    for spread in (False, True):
        x = _improve(_seed(n, ranks, cost, D, spread), ranks, cost, D, rounds)
        ms = rank_times(cost, *_loads(x, ranks, D)).max()
        if ms < best_ms:
            best_x, best_ms = x, ms
    return best_x


def _improve(x: np.ndarray, ranks: np.ndarray, cost: CostModel, D: int, rounds: int) -> np.ndarray:
    """Steps 3-4 from the start ``x [E, R]``: the rounds, then the best plan they visited."""
    pe, pi, pj = move_pairs(ranks)
    g, h = ranks[pe, pi], ranks[pe, pj]
    best_x, best_ms = x.copy(), np.inf
    for _ in range(rounds):
        G, N = _loads(x, ranks, D)
        t = rank_times(cost, G, N)
        if t.max() < best_ms:
            best_x, best_ms = x.copy(), t.max()
        fw = _forwards(x, ranks, pe, pi, pj, G, N, cost, D)  # Step 3a
        F = chain_partners(fw, h, pe)
        moves = price_moves(x[pe, pi], (x[pe, pj] == 0).astype(np.float64), G, N, t, F, g, h, cost)  # Step 3b
        gain, third = downhill_gains(moves, x[pe, pi], t[g], t[h], F["m"], g)
        accepted = _select(gain, t[g], g, h, third, D)  # Step 3c
        s = np.where(accepted, moves["share"], 0.0)
        np.add.at(x, (pe, pi), -s)
        np.add.at(x, (pe, pj), s)
        y = np.where(accepted & moves["chain"], F["y"], 0.0)
        np.add.at(x, (F["f"], F["ci"]), -y)
        np.add.at(x, (F["f"], F["cm"]), y)
        if not accepted.any():  # Step 3d; with no path either, every later round would repeat this one
            x, found = _augment(x, ranks, cost, D, pe, pi, pj, G, N, t)
            if not found:
                break
    # Step 4: the best of the rounds (the last moves included).
    if rank_times(cost, *_loads(x, ranks, D)).max() < best_ms:
        best_x = x
    return best_x


def _augment(x, ranks, cost, D, pe, pi, pj, G, N, t) -> tuple[np.ndarray, bool]:
    """Step 3d: the best hand-off path from the slowest rank (see the module), applied → ``(x, found)``; ``x`` is
    returned unchanged when no path lowers the makespan or the ranks at it."""
    K = pe.size
    if K == 0:  # no expert has two ranks: nothing can move
        return x, False
    u, v, share = ranks[pe, pi], ranks[pe, pj], x[pe, pi]
    g = int(np.argmax(t))
    # The search: parent[w] = the candidate whose hand-off first reached w (−1: the root, or not reached).
    reached = np.zeros(D, bool)
    reached[g] = True
    parent = np.full(D, -1, np.int64)
    idx = np.arange(K)
    for _ in range(D - 1):
        ok = reached[u] & ~reached[v] & (share > 0)
        first = np.full(D, K, np.int64)
        np.minimum.at(first, v[ok], idx[ok])
        new = first < K
        if not new.any():
            break
        parent = np.where(new, first, parent)
        reached |= new
    # Every terminal's path walked back at once: dG, dN [terminal, rank].
    dG, dN = np.zeros((D, D)), np.zeros((D, D))
    at = np.arange(D)
    for _ in range(D - 1):
        k = parent[at]
        live = k >= 0
        kk = np.where(live, k, 0)
        s_k = np.where(live, share[kk], 0.0)
        gets = np.where(live & (x[pe[kk], pj[kk]] == 0), 1.0, 0.0)
        rows = np.arange(D)
        np.add.at(dG, (rows, np.where(live, u[kk], 0)), np.where(live, -1.0, 0.0))
        np.add.at(dN, (rows, np.where(live, u[kk], 0)), -s_k)
        np.add.at(dG, (rows, np.where(live, v[kk], 0)), gets)
        np.add.at(dN, (rows, np.where(live, v[kk], 0)), s_k)
        at = np.where(live, u[kk], at)
    m, found = path_prices(G, N, t, dG, dN, reached, g, cost)
    if not found:
        return x, False
    m = int(m)
    # Apply m's path: each share along it moves whole, from the end back to g.
    x = x.copy()
    w = m
    while parent[w] >= 0:
        k = parent[w]
        x[pe[k], pj[k]] += x[pe[k], pi[k]]
        x[pe[k], pi[k]] = 0.0
        w = u[k]
    return x, True


def _seed(n: np.ndarray, ranks: np.ndarray, cost: CostModel, D: int, spread: bool) -> np.ndarray:
    """Step 2: a start ``x [E, R]``, each expert whole on one column (an expert with one rank there). A replicated
    expert goes to its rank that is cheapest under the fixed experts alone (``spread=False``), or, taken in order
    of decreasing load, the k-th replicated expert to its (k mod r_e)-th cheapest rank (``spread=True``)."""
    E, R = ranks.shape
    ok = ranks >= 0
    safe = np.where(ok, ranks, 0)
    single = ok.sum(axis=1) == 1
    x = np.zeros((E, R))
    x[np.arange(E), np.argmax(ok, axis=1)] = np.where(single, n, 0.0)
    base = np.where(ok, rank_times(cost, *_loads(x, ranks, D))[safe], np.inf)  # [E, R]
    nth = spread_turns(n, ok.sum(axis=1)) if spread else np.zeros(E, np.int64)
    pick = np.argsort(base, axis=1, kind="stable")[np.arange(E), nth]
    x[np.arange(E), pick] += np.where(single, 0.0, n)
    return x


def _select(gain, sender_time, g, h, m, D) -> np.ndarray:
    """Step 3c: the accepted moves (mask ``[K]``): one out per sender, one in per receiver (the slowest sender's),
    receivers do not send, a chain's third rank ``m`` (−1: none) is in no other move."""
    sent = _first_best(gain, g, D)
    accepted = _lexi_best(np.where(sent, sender_time, -np.inf), np.where(sent, gain, -np.inf), h, D)
    receives = np.zeros(D, bool)
    receives[h[accepted]] = True
    accepted &= ~receives[g]
    used = np.zeros(D + 1, np.int64)  # slot D: "no third rank"
    mm = np.where(m >= 0, m, D)
    np.add.at(used, g[accepted], 1)
    np.add.at(used, h[accepted], 1)
    np.add.at(used, mm[accepted], 1)
    return accepted & ((m < 0) | (used[mm] == 1))


def source_quotas(counts: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Each source's whole-token quota per replica column: ``counts [Ds, E]`` (tokens of e from source d) and a plan
    ``x [E, R]`` with ``Σ_r x[e, r] = Σ_d counts[d, e]`` → ``q [Ds, E, R]`` with ``Σ_r q[d, e, r] = counts[d, e]``
    and ``Σ_d q[d, e, r] = x[e, r]``: sources and columns laid end to end along ``[0, n_e)``, q the overlaps
    (northwest-corner rule). A table row ``q[d, e]`` in "quota" mode realises it token for token."""
    counts = np.asarray(counts, np.float64)
    x = np.asarray(x, np.float64)
    c_hi = np.cumsum(counts, axis=0)  # [Ds, E]
    c_lo = c_hi - counts
    x_hi = np.cumsum(x, axis=1)  # [E, R]
    x_lo = x_hi - x
    return np.maximum(0.0, np.minimum(c_hi[:, :, None], x_hi[None]) - np.maximum(c_lo[:, :, None], x_lo[None]))


def relief_policy(problem: DispatchProblem, rounds: int = ROUNDS) -> tuple[np.ndarray, dict]:
    """The ``"relief"`` policy of `solvers.solve`: pairwise relief of the batch's tokens → ``x [E, D]``."""
    pl = problem.placement
    ranks = replica_ranks(pl.log2phy, pl.slots_per_rank)
    x = relief(problem.n, ranks, problem.cost, pl.num_gpus, rounds)
    out = np.zeros((pl.num_experts, pl.num_gpus))
    ok = ranks >= 0
    np.add.at(out, (np.nonzero(ok)[0], ranks[ok]), x[ok])
    return out, {"rounds": rounds}
