"""Lower bounds on the optimal makespan of a dispatch problem (TEMPO §3.1, App. A). numpy + scipy.

Functions take a `solvers.DispatchProblem` (they read its ``n``, ``placement``, ``cost``, ``mask`` and
``live``); this module imports only the cost model and the polynomial limits, so `solvers.problem` can use it.
Glossary: E logical experts, D ranks; per rank the paper's G_g activations, N_g tokens, T_g tiles.
"""

from __future__ import annotations

import numpy as np

from .limits import semi_matching_value, token_lp_shares

__all__ = ["forced_lower_bound", "problem_lower_bound"]


def forced_lower_bound(problem) -> float:
    """Cheap bound (microseconds to compute): the full-replication formula, and per rank the time of the load it
    cannot avoid — every live expert whose replicas all sit on that rank (whole, with its tiles)."""
    cost, n, pl = problem.cost, problem.n, problem.placement
    lb = cost.lower_bound(n, problem.num_gpus)
    d = pl.sole_gpu
    forced = (d >= 0) & (n > 0)
    if not forced.any():
        return lb
    D = problem.num_gpus
    acts = np.bincount(d[forced], minlength=D)
    toks = np.bincount(d[forced], weights=n[forced], minlength=D)
    tiles = np.bincount(d[forced], weights=np.ceil(n[forced] / cost.tile), minlength=D)
    return float(max(lb, cost.gpu_times(acts, toks, tiles).max()))


def problem_lower_bound(problem) -> float:
    """The best cheap proven lower bound on OPT.

    Step 1: the full-replication formula ``max(a + b·⌈E_live/D⌉, c + β·N/D, …)`` (valid for any placement)
    and the forced per-rank loads (`forced_lower_bound`).
    Step 2: under restricted replication, the activation term with the optimal semi-matching load SM
    (no dispatch has max_g G_g < SM, Lemma 2) and the token terms with the token-LP optimum (no dispatch has
    max_g N_g below it, Lemma 1). Needs the model's slopes to be non-negative (true of every preset).
    """
    cost, n = problem.cost, problem.n
    lb = forced_lower_bound(problem)
    if problem.placement.is_full or not np.any(n > 0):
        return lb
    slopes = [cost.b, cost.beta, cost.b2 or 0.0, cost.gamma or 0.0]
    if min(slopes) < 0:
        return lb
    sm = semi_matching_value(problem.mask, problem.live)
    n_max = float(token_lp_shares(n, problem.mask).sum(axis=0).max())
    lb = max(lb, cost.a + cost.b * sm, cost.c + cost.beta * n_max)
    if cost.c2 is not None:
        lb = max(lb, cost.c2 + cost.gamma * n_max)
    return float(lb)
