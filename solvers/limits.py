"""The two polynomial limits of the dispatch problem (TEMPO §3.1), on plain arrays.

- Lemma 1 (b → 0): the token LP ``min max_g N_g`` over the replica sets (`token_lp_shares`, HiGHS; `token_flow`,
  the same optimum by parametric max-flow on OR-Tools, ~20× faster, with integer shares and a Hall-set bound).
- Lemma 2 (β → 0): the optimal semi-matching of live experts to replica ranks (`semi_matching`).

Both are the building blocks of the lower bounds (`solvers.bounds`) and of policies (`solvers.policies`).
numpy + scipy + ortools."""

from __future__ import annotations

import math
from collections import deque
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

__all__ = ["TokenFlow", "semi_matching", "semi_matching_value", "token_flow", "token_lp_shares"]


def token_lp_shares(n: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Exact token LP ``min max_g N_g`` over the replica sets (Lemma 1; LPLB/UltraEP objective), HiGHS.

    Args:
      n: ``[E]`` tokens per logical expert.
      mask: ``[E, D]`` bool, expert e has a replica on rank d.

    Returns:
      ``[E, D]`` float64 shares; each live expert's row sums exactly to its tokens.
    """
    n, mask = np.asarray(n, dtype=np.float64), np.asarray(mask, dtype=bool)
    E, D = mask.shape
    live = np.flatnonzero(n > 0)
    x = np.zeros((E, D))
    if live.size == 0:
        return x
    # Step 1: one variable per (live expert, replica rank) edge, plus the makespan z (last column).
    ee, dd = np.nonzero(mask[live])
    m = ee.size
    c = np.zeros(m + 1)
    c[-1] = 1.0
    # Step 2: conservation Σ_d x_ed = n_e;  per rank Σ_e x_ed − z ≤ 0.
    A_eq = sp.csr_matrix((np.ones(m), (ee, np.arange(m))), shape=(live.size, m + 1))
    rows = np.concatenate([dd, np.arange(D)])
    cols = np.concatenate([np.arange(m), np.full(D, m)])
    vals = np.concatenate([np.ones(m), -np.ones(D)])
    A_ub = sp.csr_matrix((vals, (rows, cols)), shape=(D, m + 1))
    res = linprog(c, A_ub=A_ub, b_ub=np.zeros(D), A_eq=A_eq, b_eq=n[live], bounds=(0, None), method="highs")
    if res.status != 0:
        raise RuntimeError(f"token_lp: HiGHS failed: {res.message}")
    # Step 3: scatter back, clean LP dust and re-normalise each expert exactly.
    x[live[ee], dd] = np.maximum(res.x[:m], 0.0)
    # Dust is < 1e-9 of the largest count, but never more than 1e-3 of the row's own tokens: a row of 1 token
    # beside one of 1e11 keeps its shares (every live row keeps ≥ 1/D of its tokens, so none is emptied).
    tol = np.minimum(1e-9 * max(1.0, n.max()), 1e-3 * n)[:, None]
    x[x < tol] = 0.0
    x[live] *= (n[live] / x[live].sum(axis=1))[:, None]
    return x


class TokenFlow(NamedTuple):
    """Result of `token_flow`.

    Attributes:
      bound: the token-LP optimum ``min max_g N_g`` (real-valued shares), certified by the densest Hall set:
        ``N / D`` or ``Σ_{e : R(e) ⊆ S} n_e / |S|`` over a set S of ranks.
      tokens: the integer optimum ``⌈LP⌉``: the least integer cap every rank can meet (``bound > tokens − 1``).
      x: ``[E, D]`` float64 integer shares meeting that cap (a maximum flow; rows sum to ``n``).
    """

    bound: float
    tokens: int
    x: np.ndarray


def token_flow(n: np.ndarray, mask: np.ndarray) -> TokenFlow:
    """Token LP ``min max_g N_g`` over the replica sets by parametric max-flow (OR-Tools ``SimpleMaxFlow``).

    Network: source → expert e (capacity n_e) → each replica rank of e (unbounded) → sink (capacity C). All of
    ``n`` is routable iff no set S of ranks is overfull (Hall): ``Σ_{e : R(e) ⊆ S} n_e ≤ C·|S|``, so the LP
    optimum is the densest such ratio. Newton/Dinkelbach on the integer cap: start at ``⌈N/D⌉``; while the flow
    is short, the source side of the minimum cut is an overfull set S, and the cap jumps to ``⌈ratio(S)⌉``.
    Then the same on the exact rational cap (capacities scaled by its denominator) until it routes: the bound is
    the LP optimum exactly. Two to five max-flows (tens of microseconds each at E = 384, D = 64) instead of one
    HiGHS LP (milliseconds).

    Args:
      n: ``[E]`` integer-valued tokens per logical expert.
      mask: ``[E, D]`` bool replica mask (every live expert has a replica).

    Returns:
      A `TokenFlow`: the bound, the integer optimum and integer shares ``x [E, D]`` that meet it.
    """
    from ortools.graph.python import max_flow  # OR-Tools C++ max-flow; no jax (solvers stays numpy-only)

    n, mask = np.asarray(n, dtype=np.float64), np.asarray(mask, dtype=bool)
    E, D = mask.shape
    x = np.zeros((E, D))
    live = np.flatnonzero(n > 0)
    if live.size == 0:
        return TokenFlow(0.0, 0, x)
    # Step 1: the network. Nodes: source 0, experts 1..m, ranks m+1..m+D, sink m+D+1.
    m = live.size
    ni = np.round(n[live]).astype(np.int64)
    total = int(ni.sum())
    ee, dd = np.nonzero(mask[live])
    sink = m + D + 1
    tails = np.concatenate([np.zeros(m, np.int64), 1 + ee, 1 + m + np.arange(D)]).astype(np.int32)
    heads = np.concatenate([1 + np.arange(m), 1 + m + dd, np.full(D, sink)]).astype(np.int32)
    cap0 = math.ceil(total / D)
    caps = np.concatenate([ni, np.full(ee.size, total), np.full(D, cap0)]).astype(np.int64)
    flow = max_flow.SimpleMaxFlow()
    flow.add_arcs_with_capacity(tails, heads, caps)
    rank_arcs = np.arange(m + ee.size, m + ee.size + D, dtype=np.int32)
    all_arcs = np.arange(m + ee.size + D, dtype=np.int32)
    num, den, cap = total, D, cap0  # the bound num/den: the densest overfull set found so far

    def overfull() -> tuple[int, int]:
        side = np.asarray(flow.get_source_side_min_cut(), dtype=np.int64)
        experts = side[(side >= 1) & (side <= m)] - 1
        ranks = side[(side > m) & (side < sink)]
        if ranks.size == 0:  # only possible for an expert without replicas (DispatchProblem rejects those)
            raise ValueError("token_flow: a live expert has no replica rank")
        return int(ni[experts].sum()), int(ranks.size)

    def routes() -> bool:
        if flow.solve(0, sink) != flow.OPTIMAL:
            raise RuntimeError("token_flow: OR-Tools max-flow failed")
        return flow.optimal_flow() >= flow_total

    # Step 2: raise the integer cap to the densest overfull set until everything routes.
    flow_total = total
    while True:
        flow.set_arcs_capacity(rank_arcs, np.full(D, cap, dtype=np.int64))
        if routes():
            break
        p, q = overfull()
        if p * den > num * q:
            num, den = p, q
        cap = max(cap + 1, math.ceil(p / q - 1e-9))
    # Step 3: the shares (integer flows on the expert → rank arcs).
    f = np.asarray(flow.flows(np.arange(m, m + ee.size, dtype=np.int32)), dtype=np.float64)
    x[live[ee], dd] = f
    # Step 4: the exact optimum (Dinkelbach on rational caps num/den, all capacities scaled by den): a feasible
    # cap equal to an overfull ratio is the LP optimum; usually one more max-flow.
    while num * 1.0 / den < cap - 1e-12:
        flow_total = total * den
        caps_scaled = np.concatenate([ni * den, np.full(ee.size, total * den), np.full(D, num)]).astype(np.int64)
        flow.set_arcs_capacity(all_arcs, caps_scaled)
        if routes():
            break
        p, q = overfull()
        if p * den <= num * q:
            break  # no denser set (rounding cannot occur in integers, but never loop)
        num, den = p, q
    return TokenFlow(num / den, int(cap), x)


def semi_matching(mask: np.ndarray, live: np.ndarray) -> np.ndarray:
    """Optimal semi-matching of live experts to replica ranks (β → 0 limit, Lemma 2).

    Assigns every live expert to one rank holding it so that the maximum number of experts per rank is
    minimal: greedy start, then augmenting paths (Harvey et al. 2006) from a most-loaded rank to a rank
    with load ≤ max − 2 along alternating (rank → assigned expert → other replica rank) edges.

    Args:
      mask: ``[E, D]`` bool replica mask.
      live: ``[E]`` bool experts to assign.

    Returns:
      ``[E]`` int64 rank of each live expert, −1 for dead ones.
    """
    mask = np.asarray(mask, dtype=bool)
    E, D = mask.shape
    assign = np.full(E, -1, dtype=np.int64)
    load = np.zeros(D, dtype=np.int64)
    experts_on: list[set[int]] = [set() for _ in range(D)]
    # Step 1: greedy, most constrained experts first.
    ids = np.flatnonzero(live)
    for e in ids[np.argsort(mask[ids].sum(axis=1), kind="stable")]:
        gpus = np.flatnonzero(mask[e])
        if gpus.size == 0:
            raise ValueError(f"semi_matching: live expert {e} has no replica")
        g = int(gpus[np.argmin(load[gpus])])
        assign[e] = g
        load[g] += 1
        experts_on[g].add(int(e))
    # Step 2: augment from a max-loaded rank until no path to a rank with load ≤ max − 2 exists.
    while True:
        top = int(load.max(initial=0))
        improved = False
        for src in np.flatnonzero(load == top):
            parent: dict[int, tuple[int, int]] = {int(src): (-1, -1)}
            queue = deque([int(src)])
            target = -1
            while queue and target < 0:
                g = queue.popleft()
                for e in sorted(experts_on[g]):
                    for h in np.flatnonzero(mask[e]):
                        h = int(h)
                        if h in parent:
                            continue
                        parent[h] = (g, e)
                        if load[h] <= top - 2:
                            target = h
                            break
                        queue.append(h)
                    if target >= 0:
                        break
            if target < 0:
                continue
            # Step 3: shift each expert on the path one hop towards the target.
            h = target
            while parent[h][0] >= 0:
                g, e = parent[h]
                experts_on[g].discard(e)
                experts_on[h].add(e)
                assign[e] = h
                h = g
            load[target] += 1
            load[int(src)] -= 1
            improved = True
            break
        if not improved:
            return assign


def semi_matching_value(mask: np.ndarray, live: np.ndarray) -> int:
    """Optimal semi-matching max load: the least possible max_g G_g of any dispatch (β → 0 bound)."""
    assign = semi_matching(mask, live)
    if not np.any(assign >= 0):
        return 0
    return int(np.bincount(assign[assign >= 0], minlength=np.asarray(mask).shape[1]).max())
