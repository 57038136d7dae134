"""Baseline dispatch policies (TEMPO §1, §5.14) and the two polynomial limits (Lemmas 1 and 2).

Every function takes a `DispatchProblem` and returns ``x [E, G]`` float64 token shares. numpy + scipy.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

from .placement import static_map
from .problem import DispatchProblem

__all__ = [
    "static",
    "uniform",
    "token_lp",
    "metro",
    "llep",
    "round_robin",
    "semi_matching",
    "semi_matching_value",
]


def _desc_order(n: np.ndarray) -> np.ndarray:
    """Live experts by tokens descending, ties to the lower expert id."""
    live = np.flatnonzero(n > 0)
    return live[np.lexsort((live, -n[live]))]


def static(problem: DispatchProblem, source_gpus=None) -> np.ndarray:
    """Fixed per-source map (`solvers.static_map`): source s sends all its tokens of e to one replica.

    Uses per-source counts ``[S, E]`` when given (source s on GPU ``source_gpus[s]``, default s); with
    per-expert totals only, sources are assumed uniform over the G GPUs (shares n_e / G).
    """
    pl = problem.placement
    counts = problem.per_source
    if counts is None:
        counts = np.tile(problem.n / pl.num_gpus, (pl.num_gpus, 1))
    S = counts.shape[0]
    if source_gpus is None:
        if S != pl.num_gpus:
            raise ValueError(
                f"static: {S} source ranks but {pl.num_gpus} GPUs; pass source_gpus=[S] to say where each source is"
            )
        source_gpus = np.arange(S)
    slots = static_map(pl, source_gpus)  # [S, E]
    x = np.zeros((pl.num_experts, pl.num_gpus))
    np.add.at(x, (np.broadcast_to(np.arange(pl.num_experts), slots.shape), pl.slot_gpu[slots]), counts)
    return x


def uniform(problem: DispatchProblem) -> np.ndarray:
    """EPLB-even split: each expert's tokens spread evenly over its physical replicas."""
    pl = problem.placement
    return problem.n[:, None] * pl.replicas_on_gpu / np.maximum(pl.logcnt, 1)[:, None]


def token_lp(problem: DispatchProblem) -> np.ndarray:
    """Exact token LP ``min max_g N_g`` over the replica sets (Lemma 1; LPLB/UltraEP objective), HiGHS."""
    n, mask = problem.n, problem.mask
    E, G = mask.shape
    live = np.flatnonzero(n > 0)
    x = np.zeros((E, G))
    if live.size == 0:
        return x
    # Step 1: one variable per (live expert, replica GPU) edge, plus the makespan z (last column).
    ee, gg = np.nonzero(mask[live])
    m = ee.size
    c = np.zeros(m + 1)
    c[-1] = 1.0
    # Step 2: conservation Σ_g x_eg = n_e;  per-GPU Σ_e x_eg − z ≤ 0.
    A_eq = sp.csr_matrix((np.ones(m), (ee, np.arange(m))), shape=(live.size, m + 1))
    rows = np.concatenate([gg, np.arange(G)])
    cols = np.concatenate([np.arange(m), np.full(G, m)])
    vals = np.concatenate([np.ones(m), -np.ones(G)])
    A_ub = sp.csr_matrix((vals, (rows, cols)), shape=(G, m + 1))
    res = linprog(c, A_ub=A_ub, b_ub=np.zeros(G), A_eq=A_eq, b_eq=n[live], bounds=(0, None), method="highs")
    if res.status != 0:
        raise RuntimeError(f"token_lp: HiGHS failed: {res.message}")
    # Step 3: scatter back, clean LP dust and re-normalise each expert exactly.
    x[live[ee], gg] = np.maximum(res.x[:m], 0.0)
    x[x < 1e-9 * max(1.0, n.max())] = 0.0
    x[live] *= (n[live] / x[live].sum(axis=1))[:, None]
    return x


def metro(problem: DispatchProblem) -> np.ndarray:
    """METRO: whole experts, descending tokens, each to the replica GPU with fewest activated experts.

    Ties go to the lowest GPU rank.
    """
    n, mask = problem.n, problem.mask
    x = np.zeros(mask.shape)
    acts = np.zeros(mask.shape[1], dtype=np.int64)
    for e in _desc_order(n):
        gpus = np.flatnonzero(mask[e])
        g = gpus[np.argmin(acts[gpus])]
        x[e, g] = n[e]
        acts[g] += 1
    return x


def llep(problem: DispatchProblem) -> np.ndarray:
    """LLEP-R: least-loaded greedy spill restricted to existing replicas.

    Experts in descending token order; each fills its least-loaded replica GPU up to the balanced target
    ⌈N / G⌉ tokens, spilling the excess to the next least-loaded replica; what no replica can absorb under the
    target goes to the least-loaded one.
    """
    n, mask = problem.n, problem.mask
    G = mask.shape[1]
    x = np.zeros(mask.shape)
    load = np.zeros(G)
    cap = np.ceil(n.sum() / G)
    for e in _desc_order(n):
        gpus = np.flatnonzero(mask[e])
        gpus = gpus[np.lexsort((gpus, load[gpus]))]
        rest = n[e]
        for g in gpus:
            take = min(rest, max(cap - load[g], 0.0))
            if take > 0:
                x[e, g] += take
                load[g] += take
                rest -= take
            if rest <= 0:
                break
        if rest > 0:
            g = gpus[np.argmin(load[gpus])]
            x[e, g] += rest
            load[g] += rest
    return x


def round_robin(problem: DispatchProblem) -> np.ndarray:
    """A3 (Theorem 2): live experts by tokens descending; GPU i takes ranks i, i+G, i+2G, … whole.

    Needs full replication (every expert on every GPU).
    """
    if not problem.placement.is_full:
        raise ValueError("round_robin (A3) needs full replication; this placement restricts replicas")
    n = problem.n
    G = problem.num_gpus
    x = np.zeros((n.shape[0], G))
    order = _desc_order(n)
    x[order, np.arange(order.size) % G] = n[order]
    return x


def semi_matching(mask: np.ndarray, live: np.ndarray) -> np.ndarray:
    """Optimal semi-matching of live experts to replica GPUs (β → 0 limit, Lemma 2).

    Assigns every live expert to one GPU holding it so that the maximum number of experts per GPU is
    minimal: greedy start, then augmenting paths (Harvey et al. 2006) from a most-loaded GPU to a GPU
    with load ≤ max − 2 along alternating (GPU → assigned expert → other replica GPU) edges.

    Args:
      mask: ``[E, G]`` bool replica mask.
      live: ``[E]`` bool experts to assign.

    Returns:
      ``[E]`` int64 GPU of each live expert, −1 for dead ones.
    """
    mask = np.asarray(mask, dtype=bool)
    E, G = mask.shape
    assign = np.full(E, -1, dtype=np.int64)
    load = np.zeros(G, dtype=np.int64)
    experts_on: list[set[int]] = [set() for _ in range(G)]
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
    # Step 2: augment from a max-loaded GPU until no path to a GPU with load ≤ max − 2 exists.
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
