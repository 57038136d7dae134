"""The two polynomial limits of the dispatch problem (TEMPO §3.1), on plain arrays.

- Lemma 1 (b → 0): the token LP ``min max_g N_g`` over the replica sets (`token_lp_shares`, HiGHS).
- Lemma 2 (β → 0): the optimal semi-matching of live experts to replica ranks (`semi_matching`).

Both are the building blocks of the lower bounds (`solvers.bounds`) and of policies (`solvers.policies`).
Glossary: E logical experts, D EP ranks. numpy + scipy.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

__all__ = ["semi_matching", "semi_matching_value", "token_lp_shares"]


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
