"""Lower bounds on the optimal makespan of a dispatch problem (TEMPO §3.1, App. A). numpy + scipy."""

from __future__ import annotations

import numpy as np

from .problem import DispatchProblem

__all__ = ["forced_lower_bound", "problem_lower_bound"]


def forced_lower_bound(problem: DispatchProblem) -> float:
    """Cheap bound (microseconds to compute): the full-replication formula, and per GPU the time of the load it
    cannot avoid — every live expert whose replicas all sit on that GPU (whole, with its tiles)."""
    cost, n, pl = problem.cost, problem.n, problem.placement
    lb = cost.lower_bound(n, problem.num_gpus)
    g = pl.sole_gpu
    forced = (g >= 0) & (n > 0)
    if not forced.any():
        return lb
    G = problem.num_gpus
    acts = np.bincount(g[forced], minlength=G)
    toks = np.bincount(g[forced], weights=n[forced], minlength=G)
    tiles = np.bincount(g[forced], weights=np.ceil(n[forced] / cost.tile), minlength=G)
    return float(max(lb, cost.gpu_times(acts, toks, tiles).max()))


def problem_lower_bound(problem: DispatchProblem) -> float:
    """The best cheap proven lower bound on OPT.

    Step 1: the full-replication formula ``max(a + b·⌈E_live/G⌉, c + β·N/G, …)`` (valid for any placement)
    and the forced per-GPU loads (`forced_lower_bound`).
    Step 2: under restricted replication, the activation term with the optimal semi-matching load SM
    (no dispatch has max_g G_g < SM, Lemma 2) and the token terms with the token-LP optimum (no dispatch has
    max_g N_g below it, Lemma 1). Needs the model's slopes to be non-negative (true of every preset).
    """
    from .policies import semi_matching_value, token_lp

    cost, n = problem.cost, problem.n
    lb = forced_lower_bound(problem)
    if problem.placement.is_full or not np.any(n > 0):
        return lb
    slopes = [cost.b, cost.beta, cost.b2 or 0.0, cost.gamma or 0.0]
    if min(slopes) < 0:
        return lb
    sm = semi_matching_value(problem.mask, problem.live)
    n_max = float(token_lp(problem).sum(axis=0).max())
    lb = max(lb, cost.a + cost.b * sm, cost.c + cost.beta * n_max)
    if cost.c2 is not None:
        lb = max(lb, cost.c2 + cost.gamma * n_max)
    return float(lb)
