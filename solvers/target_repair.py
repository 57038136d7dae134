"""Target repair: turn a dispatch into one whose makespan is at most a given target, when it can.

For a target time T the cost model caps every GPU at k(T) activated experts and C(T) tokens. Which (expert, GPU)
pairs are active is the hard, combinatorial part (Theorem 1); once the active pattern is fixed, whether the
tokens fit is a maximum flow (source → expert [n_e] → active pair → GPU [C(T)] → sink). The repair keeps the
pattern of the dispatch it starts from and edits it greedily:

1. Capacities k(T), C(T) at the target (models with a tile term are skipped: their caps depend on the split).
2. Activation shedding: while a GPU holds more than k(T) active pairs, take one off along the chain of expert
   moves (as in a semi-matching augmenting path) that keeps the most tokens routable; a chain ends at a GPU
   with a free activation or at an expert that is active elsewhere too.
3. Token routing: maximum flow over the pattern; while supply is left unrouted, the residual graph names the
   experts that cannot drain and the GPUs that are full. Score every edit that gives such an expert a pair on
   a replica GPU outside that set (as a split, or moved off a full GPU; the receiving GPU sheds an activation
   along a chain when it has none free) by the tokens it makes routable, and apply the best.
4. The flow is the dispatch; it is returned only when its modelled makespan is at most T.

Scoring an edit is one small max-flow: experts with a single active pair are fixed loads, so only the few
split experts enter the network (`_transport`, tens of microseconds in pure Python). tempo_fast calls the
repair with T = the cheap lower bound when that bound sits on an activation level and no candidate reaches
it; a success is a proven optimum. This closes, e.g., DeepSeek-V3 EP8 B=512 batches where the optimum moves
a hot expert off a GPU and re-splits it over GPUs that each shed another expert. numpy only.
"""

from __future__ import annotations

import math
import time

import numpy as np

from .problem import DispatchProblem

__all__ = ["route_flow", "target_repair"]


def _caps(problem: DispatchProblem, target: float) -> tuple[int, int] | None:
    """(k, C): activations and tokens one GPU may hold and still finish by `target`; None if unreachable."""
    c = problem.cost
    k = math.floor((target - c.a) / c.b + 1e-9) if c.b > 0 else problem.num_experts
    caps = [(target - c.c) / c.beta if c.beta > 0 else math.inf]
    if c.gamma:
        caps.append((target - c.c2) / c.gamma)
    C = min(caps)
    if k < 0 or C < 0 or (c.b <= 0 and target < c.a):
        return None
    return k, math.floor(C + 1e-9) if math.isfinite(C) else 2**62


def _transport(supply: list[int], adj: list[list[int]], room: list[int]) -> list[dict[int, int]]:
    """Maximum flow of a small transportation network: source f (supply[f]) → any GPU in adj[f] → GPU g
    (room[g]) → sink. Greedy fill, then shortest augmenting paths (an expert re-routes its tokens between
    the GPUs it is active on). Pure Python: the networks here have a few dozen experts, where this runs in
    tens of microseconds (scipy's general max-flow costs ~0.2 ms of overhead per call).

    Returns ``into[g] = {f: tokens}``.
    """
    rem, room = list(supply), list(room)
    into: list[dict[int, int]] = [{} for _ in room]
    # Step 1: greedy fill, roomiest GPU first.
    for f, gs in enumerate(adj):
        for g in sorted(gs, key=lambda g: -room[g]):
            d = min(rem[f], room[g])
            if d > 0:
                rem[f] -= d
                room[g] -= d
                into[g][f] = into[g].get(f, 0) + d
    # Step 2: augmenting paths f → g0 ⇢ f1 → g1 ⇢ … → g_end with room (⇢: f_i gives back flow it sends to g).
    for f, gs in enumerate(adj):
        while rem[f] > 0:
            parent = {g: (f, -1) for g in gs}  # gpu -> (expert that reaches it, gpu that expert leaves)
            frontier, end = list(gs), -1
            while frontier and end < 0:
                nxt = []
                for g in frontier:
                    if room[g] > 0:
                        end = g
                        break
                    for f2, amount in into[g].items():
                        if amount > 0 and f2 != f:
                            for g2 in adj[f2]:
                                if g2 not in parent:
                                    parent[g2] = (f2, g)
                                    nxt.append(g2)
                frontier = nxt
            if end < 0:
                break  # f is stuck: max flow reached for it
            d, g = min(rem[f], room[end]), end
            while parent[g][1] >= 0:
                f2, g_prev = parent[g]
                d = min(d, into[g_prev][f2])
                g = g_prev
            room[end] -= d
            rem[f] -= d
            g = end
            while True:
                f2, g_prev = parent[g]
                into[g][f2] = into[g].get(f2, 0) + d
                if g_prev < 0:
                    break
                into[g_prev][f2] -= d
                g = g_prev
    return into


class _Scorer:
    """Maximum flow of expert supplies `n [E]` over an active pattern `[E, D]` into GPUs of capacity `cap`.

    An expert with a single pair has no choice: its tokens are a fixed load (routed up to the GPU's capacity).
    Only experts with two or more pairs (a few dozen at most) enter the flow network (`_transport`). The
    pattern is kept as Python lists, so `routed(edits)` scores a few edits without rebuilding [E, D] arrays:
    only the edited experts change."""

    def __init__(self, n: np.ndarray, pattern: np.ndarray, cap: int):
        self.n, self.cap, self.shape = n.tolist(), cap, pattern.shape
        self.active: list[list[int]] = [[] for _ in range(pattern.shape[0])]
        for e, g in zip(*np.nonzero(pattern), strict=True):
            self.active[int(e)].append(int(g))
        self.fixed = [0] * pattern.shape[1]
        self.flex = set()
        for e, gs in enumerate(self.active):
            if len(gs) == 1:
                self.fixed[gs[0]] += self.n[e]
            elif len(gs) > 1 and self.n[e] > 0:
                self.flex.add(e)

    def _flow(self, edits) -> tuple[int, list[int], list[dict[int, int]]]:
        """(tokens routed as fixed loads, the flexible experts in flow order, their flow `into[g] = {i: tokens}`)."""
        changed: dict[int, list[int]] = {}
        for e, g, on in edits:
            gs = changed.setdefault(e, list(self.active[e]))
            if on and g not in gs:
                gs.append(g)
            elif not on and g in gs:
                gs.remove(g)
        fixed, flex, n = list(self.fixed), set(self.flex), self.n
        for e, gs in changed.items():
            if len(self.active[e]) == 1:
                fixed[self.active[e][0]] -= n[e]
            flex.discard(e)
            if len(gs) == 1:
                fixed[gs[0]] += n[e]
            elif len(gs) > 1 and n[e] > 0:
                flex.add(e)
        order = sorted(flex)
        adj = [changed.get(e, self.active[e]) for e in order]
        into = _transport([n[e] for e in order], adj, [max(self.cap - f, 0) for f in fixed])
        return sum(min(f, self.cap) for f in fixed), order, into

    def routed(self, edits=()) -> int:
        """Tokens routable once `edits` [(expert, gpu, active?), …] are applied to the pattern."""
        fixed, _, into = self._flow(edits)
        return fixed + sum(sum(row.values()) for row in into)

    def route(self) -> tuple[int, np.ndarray]:
        """(tokens routed, flow [E, D]) of the pattern itself."""
        fixed, order, into = self._flow(())
        x = np.zeros(self.shape)
        for e, gs in enumerate(self.active):
            if len(gs) == 1:
                x[e, gs[0]] = self.n[e]
        for g, row in enumerate(into):
            for i, amount in row.items():
                x[order[i], g] = amount
        return fixed + sum(sum(row.values()) for row in into), x


def route_flow(n: np.ndarray, pattern: np.ndarray, cap: int) -> tuple[int, np.ndarray]:
    """(tokens routed, flow [E, D]): the maximum flow of `n [E]` over `pattern [E, D]` into GPUs of `cap`."""
    return _Scorer(n, pattern, cap).route()


def _stuck(n: np.ndarray, pattern: np.ndarray, x: np.ndarray, cap: int) -> tuple[np.ndarray, np.ndarray]:
    """Experts and GPUs reachable in the residual graph from the unrouted supply (bool [E], bool [D]): every
    such GPU is full, so only a new pair from a reachable expert to an unreachable GPU can route more. Unrouted
    supply sits with the flexible experts short of their total, and with every expert of an overloaded GPU."""
    over = x.sum(axis=0) > cap + 0.5
    seen_e = (x.sum(axis=1) < n - 0.5) | pattern[:, over].any(axis=1)
    seen_g = over.copy()
    frontier = seen_e.copy()
    while frontier.any():
        new_g = pattern[frontier].any(axis=0) & ~seen_g  # expert → any GPU it is active on
        seen_g |= new_g
        new_e = (x[:, new_g] > 0.5).any(axis=1) & ~seen_e  # GPU → experts that send it flow (reverse edge)
        seen_e |= new_e
        frontier = new_e
    return seen_e, seen_g


def _apply(pattern: np.ndarray, edits) -> np.ndarray:
    out = pattern.copy()
    for e, g, on in edits:
        out[e, g] = on
    return out


class _View:
    """An active pattern as Python lists (members of each GPU, GPUs of each expert, counts), cheap to edit."""

    def __init__(self, pattern: np.ndarray | None):
        if pattern is None:
            return
        E, D = pattern.shape
        self.acts = pattern.sum(axis=0).tolist()
        self.count = pattern.sum(axis=1).tolist()
        self.members: list[list[int]] = [[] for _ in range(D)]
        self.on: list[set[int]] = [set() for _ in range(E)]
        for e, g in zip(*(a.tolist() for a in np.nonzero(pattern)), strict=True):
            self.members[g].append(e)
            self.on[e].add(g)

    def edited(self, edits) -> _View:
        """A copy with `edits` [(expert, gpu, active?), …] applied (only the touched entries are copied)."""
        v = _View(None)
        v.acts, v.count, v.members, v.on = list(self.acts), list(self.count), list(self.members), list(self.on)
        for e, g, on in edits:
            if (g in v.on[e]) == on:
                continue
            v.on[e] = v.on[e] | {g} if on else v.on[e] - {g}
            v.members[g] = v.members[g] + [e] if on else [m for m in v.members[g] if m != e]
            d = 1 if on else -1
            v.acts[g] += d
            v.count[e] += d
        return v


def _shedding_chains(replicas: list[list[int]], view: _View, k: int, src: int):
    """Edit lists that take one activation off GPU `src`: a chain src → h1 → … of expert moves (each GPU on
    the way gives one expert to the next) ending at a GPU with a free activation, or at an expert that is also
    active elsewhere (its pair closes). Breadth-first; one chain per first reach of a GPU.
    `replicas[e]` lists expert e's replica GPUs; `view` is the current pattern."""
    paths = {src: ([], -1)}  # gpu -> (edits to get here, expert that arrived)
    frontier = [src]
    while frontier:
        nxt = []
        for u in frontier:
            path, arrived = paths[u]
            for e in view.members[u]:
                if e == arrived:
                    continue
                if view.count[e] > 1:
                    yield path + [(e, u, False)]
                    continue
                for h in replicas[e]:
                    if h in view.on[e]:
                        continue
                    step = path + [(e, u, False), (e, h, True)]
                    if view.acts[h] < k:
                        yield step
                    elif h not in paths:
                        paths[h] = (step, e)
                        nxt.append(h)
        frontier = nxt


def _edits(n, replicas, mask, pattern, x, k: int, cap: int):
    """Candidate pattern edits [(expert, gpu, active?), …] that can route more: a stuck expert e gets a pair on
    a replica GPU h outside the stuck set, either split (e stays where it is) or moved off a stuck GPU g; when
    h then holds more than k activations it sheds one along a chain (`_shedding_chains`), which may end on
    the activation e freed."""
    stuck_e, stuck_g = _stuck(n, pattern, x, cap)
    room = cap - x.sum(axis=0)
    view = _View(pattern)
    es, hs = np.nonzero(stuck_e[:, None] & ~stuck_g[None, :] & mask & ~pattern & (room > 0)[None, :])
    for e, h in zip(es.tolist(), hs.tolist(), strict=True):
        starts = [[(e, h, True)]] + [[(e, h, True), (e, g, False)] for g in sorted(view.on[e]) if stuck_g[g]]
        for base in starts:
            if view.acts[h] + 1 <= k:
                yield base
                continue
            # h sheds one of its other experts (e is not there yet), possibly onto the activation e freed
            for chain in _shedding_chains(replicas, view.edited(base[1:]), k, h):
                yield base + chain


def target_repair(
    problem: DispatchProblem,
    x: np.ndarray,
    target: float,
    *,
    max_rounds: int = 64,
    max_flows: int = 400,
    stats: dict | None = None,
    deadline: float = math.inf,
) -> np.ndarray | None:
    """A dispatch with makespan ≤ `target` built by editing the active pattern of `x`, or None.

    Args:
      problem: the dispatch problem (integer token counts; per-expert totals are used).
      x: ``[E, D]`` a dispatch to start from (usually tempo_fast's).
      target: the makespan to reach (µs), e.g. a lower bound.
      max_rounds: cap on pattern edits in each of steps 2 and 3.
      max_flows: cap on candidate edits scored (one maximum flow each, ~0.1–0.3 ms).
      stats: if given, ``stats["flows"]`` is increased by the number of candidates scored.
      deadline: ``time.perf_counter()`` time after which no more candidates are scored (a time budget).

    Returns:
      ``[E, D]`` float dispatch (integer tokens) with ``cost.makespan ≤ target``, or None when the greedy
      edits do not get there within the caps (or the model has a tile term).
    """
    cost, n = problem.cost, problem.n  # whole token counts (DispatchProblem checks)
    if cost.b2:
        return None
    # Step 1: capacities at the target.
    caps = _caps(problem, target)
    if caps is None:
        return None
    k, cap = caps
    n = np.round(n).astype(np.int64)
    mask = problem.mask.astype(bool)
    replicas = problem.placement.replica_gpu_lists
    pattern = (x > 0.5) & mask & (n[:, None] > 0)
    budget = [max_flows]
    if stats is not None:
        stats.setdefault("flows", 0)

    def best_of(candidates):
        """(tokens routed, flow, edits) of the best-scoring candidate edit, within the flow budget."""
        best, scorer = None, _Scorer(n, pattern, cap)
        for edits in candidates:
            if budget[0] <= 0 or time.perf_counter() > deadline:
                break
            budget[0] -= 1
            if stats is not None:
                stats["flows"] += 1
            v = scorer.routed(edits)
            if best is None or v > best[0]:
                best = (v, edits)
        if best is None:
            return None
        return (*route_flow(n, _apply(pattern, best[1]), cap), best[1])

    # Step 2: activation shedding along chains, best chain first (the one that leaves the most routable tokens).
    for _ in range(max_rounds):
        acts = pattern.sum(axis=0)
        over = np.flatnonzero(acts > k)
        if over.size == 0:
            break
        best = best_of(_shedding_chains(replicas, _View(pattern), k, int(over[np.argmax(acts[over])])))
        if best is None:
            return None
        pattern = _apply(pattern, best[2])
    else:
        return None
    # Step 3: token routing. While supply is stuck, apply the pattern edit that routes the most tokens.
    total = int(n.sum())
    value, xr = route_flow(n, pattern, cap)
    for _ in range(max_rounds):
        if value >= total:
            break
        best = best_of(_edits(n, replicas, mask, pattern, xr, k, cap))
        if best is None or best[0] <= value:
            return None
        value, xr, edits = best
        pattern = _apply(pattern, edits)
    else:
        return None
    # Step 4: accept only a dispatch that really finishes by the target.
    return xr if cost.makespan(xr) <= target + 1e-6 * max(1.0, abs(target)) else None
