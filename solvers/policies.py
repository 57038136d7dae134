"""Baseline dispatch policies (TEMPO §1, §5.14).

Every function takes a `DispatchProblem` and returns ``x [E, D]`` float64 token shares (E logical experts,
D ranks). The two polynomial limits they build on live in `solvers.limits`. numpy + scipy.
"""

from __future__ import annotations

import numpy as np

from .limits import token_lp_shares
from .placement import static_map
from .problem import DispatchProblem

__all__ = ["static", "uniform", "token_lp", "metro", "llep", "round_robin", "experts_by_load"]


def experts_by_load(n: np.ndarray) -> np.ndarray:
    """Live experts by tokens descending, ties to the lower expert id."""
    live = np.flatnonzero(n > 0)
    return live[np.lexsort((live, -n[live]))]


def static(problem: DispatchProblem, source_gpus=None) -> np.ndarray:
    """Fixed per-source map (`solvers.static_map`): source s sends all its tokens of e to one replica.

    Uses per-source counts ``[Gs, E]`` when given (source s on rank ``source_gpus[s]``, default s); with
    per-expert totals only, sources are assumed uniform over the D ranks (shares n_e / D).
    """
    pl = problem.placement
    counts = problem.per_source
    if counts is None:
        counts = np.tile(problem.n / pl.num_gpus, (pl.num_gpus, 1))
    Gs = counts.shape[0]
    if source_gpus is None:
        if Gs != pl.num_gpus:
            raise ValueError(
                f"static: {Gs} source ranks but {pl.num_gpus} GPUs; pass source_gpus=[Gs] to say where each source is"
            )
        source_gpus = np.arange(Gs)
    slots = static_map(pl, source_gpus)  # [Gs, E]
    x = np.zeros((pl.num_experts, pl.num_gpus))
    np.add.at(x, (np.broadcast_to(np.arange(pl.num_experts), slots.shape), pl.slot_gpu[slots]), counts)
    return x


def uniform(problem: DispatchProblem) -> np.ndarray:
    """EPLB-even split: each expert's tokens spread evenly over its physical replicas."""
    pl = problem.placement
    return problem.n[:, None] * pl.replicas_on_gpu / np.maximum(pl.logcnt, 1)[:, None]


def token_lp(problem: DispatchProblem) -> np.ndarray:
    """Exact token LP ``min max_g N_g`` over the replica sets (Lemma 1; LPLB/UltraEP objective), HiGHS."""
    return token_lp_shares(problem.n, problem.mask)


def metro(problem: DispatchProblem) -> np.ndarray:
    """METRO: whole experts, descending tokens, each to the replica rank with fewest activated experts.

    Ties go to the lowest rank.
    """
    n, mask = problem.n, problem.mask
    x = np.zeros(mask.shape)
    order = experts_by_load(n)
    sole = problem.placement.sole_gpu[order]
    # Step 1: experts with one replica rank have no choice: place them at once, and count, for every position
    # in the order, how many of them each rank already holds (prefix counts [len(order), D]).
    fixed = sole >= 0
    x[order[fixed], sole[fixed]] = n[order[fixed]]
    before = np.zeros((order.size + 1, mask.shape[1]), dtype=np.int64)
    np.add.at(before, (np.flatnonzero(fixed) + 1, sole[fixed]), 1)
    before = np.cumsum(before, axis=0)
    # Step 2: the others in order, each to its replica rank with the fewest activated experts so far (the
    # fixed ones before it plus the flexible ones already placed); ties to the lowest rank.
    own = np.zeros(mask.shape[1], dtype=np.int64)
    replicas = problem.placement.replica_gpu_lists
    for i in np.flatnonzero(~fixed).tolist():
        e = int(order[i])
        ranks = replicas[e]
        acts = before[i, ranks] + own[ranks]
        d = ranks[int(np.argmin(acts))]
        x[e, d] = n[e]
        own[d] += 1
    return x


def llep(problem: DispatchProblem) -> np.ndarray:
    """LLEP-R: least-loaded greedy spill restricted to existing replicas.

    Experts in descending token order; each fills its least-loaded replica rank up to the balanced target
    ⌈N / D⌉ tokens, spilling the excess to the next least-loaded replica; what no replica can absorb under the
    target goes to the least-loaded one.
    """
    n, mask = problem.n, problem.mask
    D = mask.shape[1]
    x = np.zeros(mask.shape)
    load = np.zeros(D)
    cap = np.ceil(n.sum() / D)
    for e in experts_by_load(n):
        ranks = np.flatnonzero(mask[e])
        ranks = ranks[np.lexsort((ranks, load[ranks]))]
        rest = n[e]
        for d in ranks:
            take = min(rest, max(cap - load[d], 0.0))
            if take > 0:
                x[e, d] += take
                load[d] += take
                rest -= take
            if rest <= 0:
                break
        if rest > 0:
            d = ranks[np.argmin(load[ranks])]
            x[e, d] += rest
            load[d] += rest
    return x


def round_robin(problem: DispatchProblem) -> np.ndarray:
    """A3 (Theorem 2): live experts by tokens descending; rank i takes positions i, i+D, i+2D, … whole.

    Needs full replication (every expert on every rank).
    """
    if not problem.placement.is_full:
        raise ValueError("round_robin (A3) needs full replication; this placement restricts replicas")
    n = problem.n
    D = problem.num_gpus
    x = np.zeros((n.shape[0], D))
    order = experts_by_load(n)
    x[order, np.arange(order.size) % D] = n[order]
    return x
