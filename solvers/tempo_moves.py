"""Stages 1–3 of tempo_fast (TEMPO §4.2) on one dispatch state: seeding, augmenting chains, local search.

The state is a dense dispatch ``x [E, D]`` (tokens of expert e on rank g) with per-rank activations G_g, tiles
T_g and tokens N_g kept as Python lists (the scalar paths read them one at a time). Every candidate move is
scored in closed form, vectorised over the (expert, destination) pairs it concerns.

Where the time went before this module (cProfile, EP8, E = 256 + 64 slots, B = 512, s = 1.2; 82 ms a solve):
58% in target repair that could not succeed (the optimum was one activation level above the cheap bound),
33% in stages 2–3 run three times (heuristic and two polished ensemble starts), 4% in the HiGHS token LP. At
EP64 / E = 384 (up to 1 s a solve) the whole-expert seed put a hot expert with ten GPUs' worth of tokens on one
rank, and stages 2–3 then spent seconds in per-expert Python loops (relief moves, swaps) splitting it one piece
at a time. Hence: a certified bound stops the search (`solvers.bounds.certified_lower_bound`), the seed splits an
expert that cannot fit whole under the target, and the per-expert loops below are numpy expressions.

Moves are accepted only when they lower the bottleneck rank's time and keep the receiving rank below it, so
the sorted vector of rank times decreases lexicographically and every stage terminates. numpy only."""

from __future__ import annotations

import math
import time

import numpy as np

from .problem import DispatchProblem
from .target_repair import route_flow

__all__ = ["State", "chains", "local_search", "seed"]

_EPS = 1e-9


class State:
    """Dispatch ``x [E, D]`` with per-rank activations, tiles and tokens maintained incrementally."""

    def __init__(self, problem: DispatchProblem, x: np.ndarray | None = None):
        c = self.cost = problem.cost
        self.a, self.b, self.c, self.beta = c.a, c.b, c.c, c.beta
        self.b2 = c.b2 or 0.0
        self.c2 = c.c2 if c.c2 is not None else -math.inf
        self.gamma = c.gamma or 0.0
        self.tile = c.tile
        self.mask = problem.mask
        self.replicas = problem.placement.replica_gpu_lists
        E, D = self.mask.shape
        self.E, self.D = E, D
        if x is None:
            self.x = np.zeros((E, D))
        else:  # shares at or below _EPS are dust from an LP: dropped
            self.x = np.where(np.asarray(x, dtype=np.float64) > _EPS, x, 0.0)
        active = self.x > _EPS
        self.acts = active.sum(axis=0).astype(np.float64).tolist()
        self.tiles = (self.ntiles(self.x).sum(axis=0) if self.b2 else np.zeros(D)).tolist()
        self.toks = self.x.sum(axis=0).tolist()

    # -- cost model, scalar and vectorised -------------------------------------------------------------
    def ntiles(self, v):
        """M-tiles of a share (array or scalar); identically 0 when the model has no tile term."""
        if not self.b2:
            return 0.0 if not isinstance(v, np.ndarray) else np.zeros(v.shape)
        if isinstance(v, np.ndarray):
            return np.where(v > _EPS, np.maximum(1.0, np.ceil(v / self.tile - 1e-9)), 0.0)
        return max(1.0, math.ceil(v / self.tile - 1e-9)) if v > _EPS else 0.0

    def t(self, G, T, N):
        """Rank time from (activations, tiles, tokens); scalars or broadcasting arrays (`CostModel.rank_times`)."""
        arrays = isinstance(G, np.ndarray) or isinstance(T, np.ndarray) or isinstance(N, np.ndarray)
        return self.cost.rank_times(G, N, T, xp=np if arrays else None)

    def loads(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per-rank (activations, tiles, tokens) as arrays ``[D]``."""
        return np.array(self.acts), np.array(self.tiles), np.array(self.toks)

    def times(self) -> np.ndarray:
        """``[D]`` modelled rank times."""
        return self.t(*self.loads())

    def makespan(self) -> float:
        return float(self.times().max(initial=0.0))

    def on(self, g: int) -> np.ndarray:
        """Experts with a share on rank g, ascending."""
        return np.flatnonzero(self.x[:, g] > _EPS)

    # -- mutation ----------------------------------------------------------------------------------------
    def move(self, e: int, src: int, dst: int, amount: float) -> None:
        """Move ``amount`` tokens of expert e from rank src (or nowhere when src < 0) to rank dst."""
        for g, d in ((src, -amount), (dst, amount)):
            if g < 0:
                continue
            old = float(self.x[e, g])
            new = old + d
            if new < 0.5 and new < _EPS + 1e-6 * max(old, 1.0):
                new = 0.0
            self.x[e, g] = new
            self.acts[g] += float(new > _EPS) - float(old > _EPS)
            if self.b2:
                self.tiles[g] += self.ntiles(new) - self.ntiles(old)
            self.toks[g] += new - old


# ---------------------------------------------------------------------------------------------- stage 1
def seed(st: State, problem: DispatchProblem, target: float | None = None) -> None:
    """Stage 1: experts by tokens descending, each whole on the replica rank with the lowest resulting time.

    Step 1: experts with no choice (all replicas on one rank) go first, in one vectorised assignment, so the
    flexible ones see every rank's forced load. Step 2: the flexible ones, tokens descending (ties to the lower
    id), each to its best rank. With a ``target`` (a lower bound on the optimum), an expert whose best whole
    placement would end above both the target and the current makespan is split instead: it fills the
    roomiest replica ranks up to the target's token cap, fewest pieces first, and any rest is water-filled over
    its replicas. Without a target this is the paper's whole-expert seed.
    """
    n, sole = problem.n, problem.placement.sole_gpu
    # Step 1: forced experts.
    forced = np.flatnonzero((n > 0) & (sole >= 0))
    if forced.size:
        g = sole[forced]
        st.x[forced, g] = n[forced]
        D = st.D
        st.acts = (np.array(st.acts) + np.bincount(g, minlength=D)).tolist()
        st.toks = (np.array(st.toks) + np.bincount(g, weights=n[forced], minlength=D)).tolist()
        if st.b2:
            st.tiles = (np.array(st.tiles) + np.bincount(g, weights=st.ntiles(n[forced]), minlength=D)).tolist()
    # Step 2: flexible experts, tokens descending.
    flex = np.flatnonzero((n > 0) & (sole < 0))
    flex = flex[np.lexsort((flex, -n[flex]))]
    top = max(st.t(a, tl, nn) for a, tl, nn in zip(st.acts, st.tiles, st.toks, strict=True)) if st.D else 0.0
    for e in flex.tolist():
        ne = float(n[e])
        nt = st.ntiles(ne)
        best_g, best_t = -1, math.inf
        for g in st.replicas[e]:
            tg = st.t(st.acts[g] + 1.0, st.tiles[g] + nt, st.toks[g] + ne)
            if tg < best_t:
                best_g, best_t = g, tg
        if target is None or best_t <= max(target, top) + _EPS or len(st.replicas[e]) < 2:
            st.move(e, -1, best_g, ne)
            top = max(top, best_t)
            continue
        for g, amount in _split(st, e, ne, max(target, top)):
            st.move(e, -1, g, amount)
            top = max(top, st.t(st.acts[g], st.tiles[g], st.toks[g]))


def _split(st: State, e: int, ne: float, level: float) -> list[tuple[int, float]]:
    """Integer pieces ``[(rank, tokens), …]`` of expert e over its replica ranks for a seed at time ``level``."""
    gs = np.array(st.replicas[e])
    acts, tiles, toks = (np.array(v)[gs] for v in (st.acts, st.tiles, st.toks))
    caps = [(level - st.c) / st.beta if st.beta > 0 else math.inf]
    if st.gamma > 0:
        caps.append((level - st.c2) / st.gamma)
    cap = min(caps)
    floor_ok = st.a + st.b * (acts + 1) + st.b2 * (tiles + 1 - acts - 1) <= level + _EPS
    room = np.where(floor_ok, np.floor(np.minimum(cap, 1e18) - toks + 1e-9), 0.0)
    room = np.maximum(room, 0.0)
    if room.sum() >= ne:
        # Fewest pieces: roomiest ranks first, the last one takes the rest.
        order = np.lexsort((gs, -room))
        take = np.minimum(room[order], np.maximum(ne - np.concatenate([[0.0], np.cumsum(room[order])[:-1]]), 0.0))
        return [(int(gs[i]), float(v)) for i, v in zip(order, take, strict=True) if v > 0]
    # Water-fill the tokens over all replicas (level L with Σ max(0, L − N_g) = n_e), then round to integers.
    srt = np.sort(toks)
    cum = np.cumsum(srt)
    k = np.arange(1, srt.size + 1)
    levels = (ne + cum) / k
    j = int(np.flatnonzero((k == srt.size) | (levels <= np.append(srt[1:], np.inf)))[0])
    share = np.maximum(levels[j] - toks, 0.0)
    share = np.floor(share)
    rest = ne - share.sum()
    order = np.lexsort((gs, toks))
    share[order[: int(rest)]] += 1.0
    return [(int(g), float(v)) for g, v in zip(gs, share, strict=True) if v > 0]


# ---------------------------------------------------------------------------------------------- stage 2
def _relief(st: State, h: int, e: int, a: float, top: float, banned: np.ndarray):
    """A partial move that lets rank h take ``a`` tokens of expert e and stay below ``top``: move d tokens of
    another expert e3 from h to a rank h3 (``banned[h3]`` False) already running e3, when only h's token pieces
    bind. Vectorised over (e3, h3). Returns ``(e3, h, h3, d)`` or None."""
    limits = [(top - _EPS - st.c) / st.beta if st.beta > 0 else math.inf]
    if st.gamma > 0:
        limits.append((top - _EPS - st.c2) / st.gamma)
    need = math.floor(st.toks[h] + a - min(limits)) + 1.0  # tokens h must shed
    if need <= 0 or not math.isfinite(need):
        return None
    x = st.x
    col = x[:, h]
    cand = np.flatnonzero(col > need)
    cand = cand[cand != e]
    if cand.size == 0:
        return None
    ii, h3 = np.nonzero((x[cand] > _EPS) & ~banned[None, :])
    if ii.size == 0:
        return None
    e3 = cand[ii]
    acts, tiles, toks = st.loads()
    x3 = x[e3, h3]
    t_h3 = st.t(acts[h3], tiles[h3] - st.ntiles(x3) + st.ntiles(x3 + need), toks[h3] + need)
    xe, xh = float(x[e, h]), x[e3, h]
    new_act = 1.0 if xe <= _EPS else 0.0
    tiles_h = tiles[h] + st.ntiles(xe + a) - st.ntiles(xe) + st.ntiles(xh - need) - st.ntiles(xh)
    t_h = st.t(acts[h] + new_act, tiles_h, toks[h] + a - need)
    ok = np.flatnonzero((t_h3 < top - _EPS) & (t_h < top - _EPS))
    if ok.size == 0:
        return None
    i = int(ok[0])
    return (int(e3[i]), h, int(h3[i]), need)


def _augmenting_path(st: State, src: int, top: float, max_depth: int) -> list[tuple] | None:
    """Shortest chain src → h1 → … → hk of whole-share moves (expert e_i from h_{i−1} to h_i) after which src,
    every intermediate rank (one share in, one out) and the end rank (one share in) all run below ``top``.

    Breadth-first over ranks; each rank's expansion is one vectorised evaluation over (expert, target) pairs.
    A rank that a direct arrival cannot end on may still end the chain with a relief move (`_relief`).
    Returns ``[(expert, from, to, amount or None for the whole share), …]`` in application order (reversed)."""
    parent: dict[int, tuple[int, int, float] | None] = {src: None}
    frontier = [src]
    thr = top - _EPS
    x = st.x
    for _ in range(max_depth):
        nxt: list[int] = []
        acts, tiles, toks = st.loads()
        for g in frontier:
            inc = parent[g]
            # Step 1: the path so far (ranks it visits) and g's loads after its incoming share.
            path = np.zeros(st.D, dtype=bool)
            u = g
            while True:
                path[u] = True
                if parent[u] is None:
                    break
                u = parent[u][0]
            A, TL, N = acts[g], tiles[g], toks[g]
            es = st.on(g)
            if inc is not None:
                _, e_in, a_in = inc
                old = float(x[e_in, g])
                A += float(old <= _EPS)
                TL += st.ntiles(old + a_in) - st.ntiles(old)
                N += a_in
                es = es[es != e_in]
            if es.size == 0:
                continue
            # Step 2: experts whose whole share leaving brings g below the bottleneck time.
            share = x[es, g]
            leave = st.t(A - 1.0, TL - st.ntiles(share), N - share) < thr
            es, share = es[leave], share[leave]
            if es.size == 0:
                continue
            ii, hs = np.nonzero(st.mask[es] & ~path[None, :])
            if ii.size == 0:
                continue
            pe, pa = es[ii], share[ii]
            xh = x[pe, hs]
            t_h = st.t(acts[hs] + (xh <= _EPS), tiles[hs] - st.ntiles(xh) + st.ntiles(xh + pa), toks[hs] + pa)
            fits = np.flatnonzero(t_h < thr)
            end, k = None, -1
            if fits.size:
                k, end = int(fits[0]), []
            else:
                # Step 3: relief only where h's floor fits (only its token pieces can bind).
                floor_h = (
                    st.a
                    + st.b * (acts[hs] + (xh <= _EPS))
                    + st.b2 * (tiles[hs] - st.ntiles(xh) + st.ntiles(xh + pa) - acts[hs] - (xh <= _EPS))
                )
                for j in np.flatnonzero(floor_h < thr).tolist():
                    h = int(hs[j])
                    banned = path.copy()
                    banned[h] = True
                    relief = _relief(st, h, int(pe[j]), float(pa[j]), top, banned)
                    if relief is not None:
                        k, end = j, [relief]
                        break
            if end is not None:
                e, h = int(pe[k]), int(hs[k])
                out = [(e, g, h, None)]
                while parent[g] is not None:
                    prev, e_in, _ = parent[g]
                    out.append((e_in, prev, g, None))
                    g = prev
                return end + out
            for e, h, a in zip(pe.tolist(), hs.tolist(), pa.tolist(), strict=True):
                if h not in parent:
                    parent[h] = (g, e, a)
                    nxt.append(h)
        if not nxt:
            return None
        frontier = nxt
    return None


def chains(st: State, max_rounds: int, max_depth: int, stop: float = 0.0, deadline: float = math.inf) -> int:
    """Stage 2: augmenting chains of whole-expert moves off bottleneck ranks (activation rebalancing).

    ``max_depth`` = 2 is the paper's 1- and 2-step truncation; D searches full augmenting paths, which makes
    the stage exact for the activation count in the β → 0 limit (Lemma 2). Stops at ``stop`` (a makespan
    that is good enough: the certified bound) and at the ``deadline`` (``time.perf_counter()`` seconds).
    """
    rounds = 0
    while rounds < max_rounds:
        acts, tiles, toks = st.loads()
        times = st.t(acts, tiles, toks)
        top = float(times.max(initial=0.0))
        if top <= stop or time.perf_counter() > deadline:
            break
        # Only ranks whose floor sets their time: a rank held up by its tokens is local search's job (partial
        # moves), and whole-share chains with relief moves would balance its tokens one chain at a time.
        floor = st.a + st.b * acts + st.b2 * (tiles - acts)
        moved = False
        for src in np.flatnonzero((times >= top - _EPS) & (floor >= top - _EPS)).tolist():
            path = _augmenting_path(st, src, top, max_depth)
            if path is not None:
                # Apply from the far end (relief first) so each share moved is the one the path was built on.
                for e, g, h, amount in path:
                    st.move(e, g, h, float(st.x[e, g]) if amount is None else amount)
                moved = True
                break
        rounds += 1
        if not moved:
            break
    return rounds


# ---------------------------------------------------------------------------------------------- stage 3
def _split_best(st: State, base_s, base_h, xs: np.ndarray, xh: np.ndarray, tile_aware: bool):
    """Best partial split size per pair, vectorised: move d of a share ``xs`` from a source with loads
    ``base_s = (A, TL, N)`` to a destination with ``base_h`` already holding ``xh`` of the expert. The objective
    of one split size is a max of a non-increasing and a non-decreasing piecewise-linear function: its minimum
    lies at a crossing of their pieces, found in closed form and snapped to integer tokens (tiles when
    ``tile_aware``). Returns ``(d, worst)``; worst = inf where no valid split exists."""
    As, TLs, Ns = base_s
    Ah, TLh, Nh = base_h
    floor_s = st.a + st.b * As + st.b2 * (TLs - As)
    act_h = Ah + (xh <= _EPS)
    floor_h = st.a + st.b * act_h + st.b2 * (TLh - Ah)
    cands = [(Ns - Nh) / 2.0]
    if st.beta > 0:
        cands += [(st.c + st.beta * Ns - floor_h) / st.beta, (floor_s - st.c - st.beta * Nh) / st.beta]
    if st.gamma > 0:
        cands += [(st.c2 + st.gamma * Ns - floor_h) / st.gamma, (floor_s - st.c2 - st.gamma * Nh) / st.gamma]
        cands += [
            (st.c + st.beta * Ns - st.c2 - st.gamma * Nh) / (st.beta + st.gamma),
            (st.c2 + st.gamma * Ns - st.c - st.beta * Nh) / (st.beta + st.gamma),
        ]
    raw = np.stack([np.broadcast_to(c, xs.shape) for c in cands])  # [C, pairs]
    step = float(st.tile) if tile_aware else 1.0
    d = np.concatenate([np.floor(raw / step) * step, np.ceil(raw / step) * step])
    valid = (d >= 1.0) & (d <= xs - 1.0)
    d = np.where(valid, d, 1.0)
    t_src = st.t(As, TLs - st.ntiles(xs) + st.ntiles(xs - d), Ns - d)
    t_dst = st.t(act_h, TLh - st.ntiles(xh) + st.ntiles(xh + d), Nh + d)
    worst = np.where(valid, np.maximum(t_src, t_dst), np.inf)
    k = np.argmin(worst, axis=0)
    cols = np.arange(xs.size)
    return d[k, cols], worst[k, cols]


def _score(st: State, base_s, base_h, xs, xh, tile_aware: bool, partial: bool):
    """Per pair: the better of moving the whole share ``xs`` and the best partial split: (amount, worst)."""
    As, TLs, Ns = base_s
    Ah, TLh, Nh = base_h
    tw_s = st.t(As - 1, TLs - st.ntiles(xs), Ns - xs)
    tw_h = st.t(Ah + (xh <= _EPS), TLh - st.ntiles(xh) + st.ntiles(xh + xs), Nh + xs)
    worst, how = np.maximum(tw_s, tw_h), xs
    if partial:
        dp, wp = _split_best(st, base_s, base_h, xs, xh, tile_aware)
        better = wp < worst
        worst, how = np.where(better, wp, worst), np.where(better, dp, how)
    return how, np.where(how > 0, worst, np.inf)


def _pairs(st: State, src: int) -> tuple[np.ndarray, np.ndarray]:
    """(expert, destination) pairs of the experts on src and their other replica ranks, row-major order."""
    es = st.on(src)
    ii, hs = np.nonzero(st.mask[es])
    keep = hs != src
    return es[ii[keep]], hs[keep]


def _swap(st: State, src: int, top: float, tile_aware: bool, partial: bool) -> bool:
    """Best bottleneck-reducing swap off src: a whole expert e2 comes back from rank h while (part of) an
    expert e of src goes to h (the Fig. 1b move: split the hot expert, trade a cold one). Every (h, e2, e)
    triple is scored at once."""
    es, hs = _pairs(st, src)
    if es.size == 0:
        return False
    x = st.x
    acts, tiles, toks = st.loads()
    # Step 1: partners e2 on each destination h that may come back to src.
    he, e2s = [], []
    for h in np.unique(hs).tolist():
        back = st.on(h)
        back = back[st.mask[back, src]]
        he.append(np.full(back.size, h))
        e2s.append(back)
    if not he:
        return False
    hb, e2 = np.concatenate(he), np.concatenate(e2s)
    if e2.size == 0:
        return False
    # Step 2: triples (e2 back from h, e to h), e ≠ e2.
    jj, ii = np.nonzero(hb[:, None] == hs[None, :])  # partner j, pair i with the same destination
    keep = e2[jj] != es[ii]
    jj, ii = jj[keep], ii[keep]
    if jj.size == 0:
        return False
    h, e, b2 = hs[ii], es[ii], e2[jj]
    a2 = x[b2, h]
    x2s = x[b2, src]
    base_s = (acts[src] + (x2s <= _EPS), tiles[src] - st.ntiles(x2s) + st.ntiles(x2s + a2), toks[src] + a2)
    base_h = (acts[h] - 1.0, tiles[h] - st.ntiles(a2), toks[h] - a2)
    xs, xh = x[e, src], x[e, h]
    amount, worst = _score(st, base_s, base_h, xs, xh, tile_aware, partial)
    k = int(np.argmin(worst))
    if not worst[k] < top - _EPS:
        return False
    st.move(int(b2[k]), int(h[k]), src, float(a2[k]))
    st.move(int(e[k]), src, int(h[k]), float(amount[k]))
    return True


def local_search(
    st: State, max_iters: int, tile_aware: bool, partial: bool, stop: float = 0.0, deadline: float = math.inf
) -> int:
    """Stage 3: best bottleneck-reducing whole or partial move, repeated; a swap when no single move helps.

    Stops at ``stop`` (good enough: the certified bound), after ``max_iters`` moves, or at the ``deadline``.
    """
    it = 0
    while it < max_iters:
        times = st.times()
        top = float(times.max(initial=0.0))
        if top <= stop or time.perf_counter() > deadline:
            break
        acts, tiles, toks = st.loads()
        moved = False
        for src in np.flatnonzero(times >= top - _EPS).tolist():
            es, hs = _pairs(st, src)
            if es.size == 0:
                continue
            base_s = (acts[src], tiles[src], toks[src])
            amount, worst = _score(
                st, base_s, (acts[hs], tiles[hs], toks[hs]), st.x[es, src], st.x[es, hs], tile_aware, partial
            )
            k = int(np.argmin(worst))
            if worst[k] < top - _EPS:
                st.move(int(es[k]), src, int(hs[k]), float(amount[k]))
                moved = True
                break
            if _swap(st, src, top, tile_aware, partial):
                moved = True
                break
        it += 1
        if not moved:
            break
    return it


# ---------------------------------------------------------------------------------------------- level partition
def _bmatch(mask: np.ndarray, demand: np.ndarray, supply: np.ndarray) -> np.ndarray | None:
    """``[m, D]`` bool: each row e on ``demand[e]`` distinct allowed ranks (``mask``), rank g used by at most
    ``supply[g]`` rows (a max-flow b-matching, OR-Tools); None when no such assignment exists."""
    from ortools.graph.python import max_flow

    m, D = mask.shape
    ee, gg = np.nonzero(mask)
    sink = m + D + 1
    tails = np.concatenate([np.zeros(m, np.int64), 1 + ee, 1 + m + np.arange(D)]).astype(np.int32)
    heads = np.concatenate([1 + np.arange(m), 1 + m + gg, np.full(D, sink)]).astype(np.int32)
    caps = np.concatenate([demand, np.ones(ee.size, np.int64), np.maximum(supply, 0)]).astype(np.int64)
    flow = max_flow.SimpleMaxFlow()
    flow.add_arcs_with_capacity(tails, heads, caps)
    if flow.solve(0, sink) != flow.OPTIMAL or flow.optimal_flow() < int(demand.sum()):
        return None
    used = np.asarray(flow.flows(np.arange(m, m + ee.size, dtype=np.int32))) > 0
    out = np.zeros((m, D), dtype=bool)
    out[ee[used], gg[used]] = True
    return out


def _swap_items(size, owner, allowed, where, toks, count, spare, cap, max_swaps) -> None:
    """Moves (to a rank with a spare activation) and swaps of items off the rank with the most tokens while it
    holds more than ``cap``, each the one that lowers the larger of the two ranks' tokens the most; vectorised
    over all pairs. An item is a whole flexible expert or one of an expert's equal pieces (``owner``); pieces of
    one expert never share a rank, and an item only goes where ``allowed``. Updates ``where``, ``toks`` and
    ``count`` in place."""
    occ = np.zeros((int(owner.max()) + 1, toks.size), dtype=np.int64)
    np.add.at(occ, (owner, where), 1)
    for _ in range(max_swaps):
        g = int(np.argmax(toks))
        if toks[g] <= cap:
            return
        mine = np.flatnonzero(where == g)
        if mine.size == 0:
            return
        ii, hs = np.nonzero(allowed[mine] & (count < spare)[None, :] & (occ[owner[mine]] == 0))
        mv_new = np.maximum(toks[g] - size[mine[ii]], toks[hs] + size[mine[ii]])
        others = np.flatnonzero(where != g)
        ok = allowed[mine][:, where[others]] & allowed[others][:, g][None, :]
        ok &= (occ[owner[mine]][:, where[others]] == 0) & (occ[owner[others], g] == 0)[None, :]
        a, b = np.nonzero(ok)
        e1, e2 = mine[a], others[b]
        delta = size[e1] - size[e2]
        sw_new = np.maximum(toks[g] - delta, toks[where[e2]] + delta)
        v_mv = mv_new.min(initial=np.inf)
        v_sw = sw_new.min(initial=np.inf)
        if min(v_mv, v_sw) >= toks[g] - 1e-9:
            return
        if v_mv <= v_sw:
            j = int(np.argmin(mv_new))
            e, h = mine[ii[j]], hs[j]
            toks[g] -= size[e]
            toks[h] += size[e]
            count[g] -= 1
            count[h] += 1
            occ[owner[e], g] -= 1
            occ[owner[e], h] += 1
            where[e] = h
        else:
            j = int(np.argmin(sw_new))
            p, q = e1[j], e2[j]
            h = where[q]
            toks[g] -= delta[j]
            toks[h] += delta[j]
            occ[owner[p], g] -= 1
            occ[owner[p], h] += 1
            occ[owner[q], h] -= 1
            occ[owner[q], g] += 1
            where[p], where[q] = h, g


def _largest_first(size, owner, allowed, load, spare, cap, checked: int = 0) -> np.ndarray | None:
    """Items by size descending, each to the allowed rank with the most room left (a spare activation, no piece
    of the same expert); with at most ``checked`` items, only among ranks that leave the remaining items a
    matching (one max-flow per try). None when an item finds no rank."""
    where = np.full(size.size, -1)
    room = cap - np.asarray(load, dtype=np.float64)
    left = np.asarray(spare, dtype=np.int64).copy()
    owners = int(owner.max()) + 1
    used = np.zeros((owners, room.size), dtype=bool)
    order = np.lexsort((np.arange(size.size), -size)).tolist()
    check = size.size <= checked
    for pos, i in enumerate(order):
        ok = allowed[i] & (left > 0) & ~used[owner[i]]
        for g in np.flatnonzero(ok)[np.argsort(-room[ok], kind="stable")].tolist():
            if check and pos + 1 < len(order):
                rest = np.array(order[pos + 1 :])
                demand = np.bincount(owner[rest], minlength=owners)
                used[owner[i], g] = True
                left[g] -= 1
                can = np.zeros((owners, room.size), dtype=bool)
                can[owner[rest]] = allowed[rest]
                feasible = _bmatch(can & ~used & (left > 0)[None, :], demand, left) is not None
                used[owner[i], g] = False
                left[g] += 1
                if not feasible:
                    continue
            where[i] = g
            room[g] -= size[i]
            left[g] -= 1
            used[owner[i], g] = True
            break
        else:
            return None
    return where


def level_partition(problem: DispatchProblem, k: int, cap: float, max_swaps: int = 200) -> np.ndarray | None:
    """A dispatch built for activation level k and ``cap`` tokens per rank, from the bound's own reasoning.

    The move local search cannot make: with (nearly) no activation slack ``D·k − E_live``, reaching level k from
    level k + 1 means re-partitioning whole experts at equal counts, or re-splitting a hot expert over ranks that
    each shed another one. Step 1: experts with one replica rank are fixed; rank g keeps ``A_g = k − F_g``
    activations and ``R_g = ⌊cap⌋ − Φ_g`` tokens. Step 2: each flexible expert gets the fewest pieces its
    roomiest replica ranks can hold (as in `solvers.bounds`), and the pieces are matched to distinct replica
    ranks within the spare activations (b-matching by max-flow). Step 3: moves and swaps of items (a whole
    expert, or one of a split expert's equal pieces; pieces of one expert on distinct ranks) push the most
    loaded rank under the cap. Step 4: the tokens are routed over the chosen pattern by max-flow
    (`solvers.target_repair`), which re-balances the split experts; what does not fit stays on the expert's
    first rank.

    Returns:
      ``[E, D]`` float64 dispatch (integer tokens, at most k activations per rank; its tokens may exceed the cap
      when the pattern cannot hold them: then it is a start for `target_repair`), or None when no pattern
      exists (level k is out of reach this way).
    """
    n, sole, mask = problem.n, problem.placement.sole_gpu, problem.mask
    E, D = mask.shape
    cap = math.floor(cap + 1e-9) if math.isfinite(cap) else 2**62
    forced = np.flatnonzero((n > 0) & (sole >= 0))
    flex = np.flatnonzero((n > 0) & (sole < 0))
    spare = k - np.bincount(sole[forced], minlength=D)
    phi = np.bincount(sole[forced], weights=n[forced], minlength=D)
    room = cap - phi
    if (spare < 0).any():
        return None
    if flex.size == 0:
        x = np.zeros((E, D))
        x[forced, sole[forced]] = n[forced]
        return x
    # Step 2: pieces (fewest roomiest replica ranks) and their b-matching to ranks with spare activations.
    nf, usable = n[flex], (spare > 0) & (room > 0)
    mf = mask[flex] & usable[None, :]
    order = np.argsort(-room, kind="stable")
    cum = np.cumsum(np.where(mf[:, order], np.maximum(room[order], 0.0), 0.0), axis=1)
    if (cum[:, -1] < nf).any():
        return None
    pieces = ((cum < nf[:, None]) & mf[:, order]).sum(axis=1) + 1
    pattern = _bmatch(mf, pieces.astype(np.int64), spare)
    if pattern is None:
        return None
    # Step 3: items (a whole expert, or one of a split expert's equal pieces) from two starts, the matching and
    # (when that does not reach the cap) largest first to the roomiest allowed rank; moves and swaps improve each.
    owner, matched = np.nonzero(pattern)  # one item per matched (expert, rank) pair
    size = nf[owner] / pieces[owner]
    allowed = mask[flex][owner]
    best = None
    for start in ("matched", "largest_first"):
        if start == "matched":
            where = matched.copy()
        else:  # the plain greedy may run out of ranks: then again, keeping a matching for the rest
            where = _largest_first(size, owner, allowed, phi, spare, cap)
            if where is None:
                where = _largest_first(size, owner, allowed, phi, spare, cap, checked=64)
            if where is None:
                continue
        toks = phi + np.bincount(where, weights=size, minlength=D)
        count = np.bincount(where, minlength=D)
        _swap_items(size, owner, allowed, where, toks, count, spare, cap, max_swaps)
        if best is None or toks.max() < best[0]:
            best = (toks.max(), where)
        if toks.max() <= cap:
            break
    pattern = np.zeros_like(pattern)
    pattern[owner, best[1]] = True
    # Step 4: route the tokens over the pattern.
    full = np.zeros((E, D), dtype=bool)
    full[forced, sole[forced]] = True
    full[flex] = pattern
    _, x = route_flow(np.round(n).astype(np.int64), full, cap)
    short = n - x.sum(axis=1)
    for e in np.flatnonzero(short > 0.5).tolist():
        x[e, int(np.flatnonzero(full[e])[0])] += short[e]
    return x
