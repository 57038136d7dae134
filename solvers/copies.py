"""Dynamic copies: which experts to copy into each rank's spare slots for one batch, and from which holder, priced
by the two-regime cost model with the copy's own time on the receiving rank (issue 52; docs/algorithms.md §7b).
numpy only; the exact yardstick is `copies_milp` (OR-Tools), which chooses copies and splits together.

The problem: the dispatch problem of `relief` (tokens ``x[e, r]`` of expert e over its replica columns, rank time
``t_g = max(a + b·G_g, c + β·N_g [, c2 + γ·N_g])``), where each rank also has ``k`` dynamic slots. A dynamic slot
of rank m may receive a copy of any expert m does not hold, from one of its fixed holders, for this batch only; a
rank that receives ``C_m`` copies waits ``o_m = max(0, C_m·τ − ω)`` longer (τ: one expert's bytes over the link,
ω: the transfer time the exchange hides), so its time is ``t_m + o_m``. Minimise the makespan ``max_g (t_g + o_g)``.

Algorithm (`plan_copies`; fixed-size loops, the same computation on every rank):

1. Relief over the fixed replicas (`relief.relief`): the dispatch without copies, makespan T0.
2. Copy rounds, at most ``D·k`` (each makes one copy or stops):
   a. The slowest rank g (lowest index among ties) and its time ``t_g + o_g``.
   b. Candidates: every expert e with tokens on g and every rank m that has a free dynamic slot and holds no
      replica of e (fixed or copied).
   c. Price: moving ``s`` of e's tokens from g to a new copy on m, for the whole share (g loses an activation) and
      for the split that equalises the two ranks' token terms, ``s = ⌊(β·(N_g − N_m) + o_g − o_m') / 2β⌋``
      clipped to ``[1, x_e − 1]`` (o_m' with the new copy): the pair's time after is
      ``max(t_g' + o_g, t_m' + o_m')``.
   d. The break-even guard: the best candidate (lowest pair time after; then lowest (e, m) index) is made only when
      its pair time after is below g's time before — the copy's own time is inside ``o_m'``, so a copy whose
      transfer costs more than the tokens it relieves is never made. Otherwise the rounds stop.
   e. Source: the holder of e (a fixed replica's rank) that sends the fewest copies so far (lowest rank on ties):
      one link per sender is spread over the copies (the send side is not priced: the receiver waits for it).
3. Copies the later rounds drained of tokens are dropped (their wait goes, no load changes). The plan: the fixed
   columns' shares, each copy's (expert, source, tokens) and the makespan with copy times. It is never above T0:
   each round lowers the slowest rank's time below what it was, and dropping a copy lowers a wait.

Complexity: per round O(E·D) candidate prices; at most D·k rounds after relief's.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .checks import check_int, check_real
from .cost import CostModel
from .relief import ROUNDS, check_relief_cost, rank_loads, rank_times, relief

__all__ = ["SPLIT_EPS", "CopyCost", "CopyPlan", "copies_milp", "plan_copies"]

#: Added before the split's floor: an exact integer must not fall to the one below by rounding, in float64 here and
#: float32 in the jnp twin (`tempo_jax.layer.copies`), so that both take the same split.
SPLIT_EPS = 1e-3


@dataclasses.dataclass(frozen=True)
class CopyCost:
    """What a copy costs the rank that receives it.

    Attributes:
      expert_bytes: one expert's weights (all its matrices), bytes.
      link_gbps: the receiving rank's link, GB/s (1e9 bytes per second).
      overlap_us: transfer time hidden behind the token exchange, µs (the copies start with the dispatch).
    """

    expert_bytes: float
    link_gbps: float
    overlap_us: float = 0.0

    def __post_init__(self) -> None:
        check_real("expert_bytes", self.expert_bytes, minimum=0.0, where="CopyCost")
        check_real("link_gbps", self.link_gbps, minimum=0.0, strict=True, where="CopyCost")
        check_real("overlap_us", self.overlap_us, minimum=0.0, where="CopyCost")

    @property
    def copy_us(self) -> float:
        """τ: one expert's bytes over the link, µs."""
        return self.expert_bytes / (self.link_gbps * 1e3)

    def exposed_us(self, copies) -> np.ndarray:
        """``o = max(0, C·τ − ω)``: how much longer a rank receiving ``copies`` (array of counts) waits, µs."""
        return np.maximum(0.0, np.asarray(copies, np.float64) * self.copy_us - self.overlap_us)


@dataclasses.dataclass(frozen=True)
class CopyPlan:
    """One batch's copies and dispatch.

    Attributes:
      x: ``[E, R]`` tokens of each expert on its fixed replica columns.
      copy_expert: ``[D, k]`` expert copied into each dynamic slot (−1: none).
      copy_source: ``[D, k]`` rank it is copied from (−1: none).
      copy_tokens: ``[D, k]`` tokens the copy computes.
      makespan: ``max_g (t_g + o_g)``, µs, copy times included.
      makespan_without: relief's makespan over the fixed replicas alone (step 1), µs.
      rank_times: ``[D]`` ``t_g + o_g``, µs.
    """

    x: np.ndarray
    copy_expert: np.ndarray
    copy_source: np.ndarray
    copy_tokens: np.ndarray
    makespan: float
    makespan_without: float
    rank_times: np.ndarray

    @property
    def num_copies(self) -> int:
        return int((self.copy_expert >= 0).sum())


def _check(n, ranks, cost, num_ranks, dynamic_slots, copy_cost, where):
    check_relief_cost(cost, where)
    D = check_int("num_ranks", num_ranks, minimum=1, where=where)
    k = check_int("dynamic_slots", dynamic_slots, minimum=0, where=where)
    if not isinstance(copy_cost, CopyCost):
        raise ValueError(f"{where}: copy_cost must be a solvers.CopyCost, got {type(copy_cost).__name__}")
    n = np.asarray(n, np.float64)
    ranks = np.asarray(ranks, np.int64)
    if n.ndim != 1 or ranks.ndim != 2 or ranks.shape[0] != n.shape[0]:
        raise ValueError(f"{where}: n must be [E] and ranks [E, R] for the same E, got {n.shape} and {ranks.shape}")
    if (n < 0).any() or (n != np.round(n)).any():
        raise ValueError(f"{where}: n must be whole token counts >= 0")
    if (ranks >= D).any() or ((ranks < 0).all(axis=1) & (n > 0)).any():
        raise ValueError(f"{where}: every expert with tokens needs a replica on a rank in [0, {D})")
    return n, ranks, D, k


def plan_copies(
    n: np.ndarray,
    ranks: np.ndarray,
    cost: CostModel,
    num_ranks: int,
    dynamic_slots: int,
    copy_cost: CopyCost,
    rounds: int = ROUNDS,
) -> CopyPlan:
    """Copies and dispatch of one batch (see the module): ``n [E]`` tokens per expert, ``ranks [E, R]`` the fixed
    replica columns (`relief.replica_ranks`), ``dynamic_slots`` = k spare slots per rank → `CopyPlan`."""
    n, ranks, D, k = _check(n, ranks, cost, num_ranks, dynamic_slots, copy_cost, "plan_copies")
    E = n.shape[0]
    # Step 1: relief over the fixed replicas.
    x = relief(n, ranks, cost, D, rounds).copy()
    G, N = rank_loads(x, ranks, D)
    on = np.zeros((E, D))  # tokens of each expert on each rank, fixed columns and copies
    np.add.at(on, (np.nonzero(ranks >= 0)[0], ranks[ranks >= 0]), x[ranks >= 0])
    held = np.zeros((E, D), bool)
    held[np.nonzero(ranks >= 0)[0], ranks[ranks >= 0]] = True
    copies = np.zeros(D, np.int64)
    sent = np.zeros(D, np.int64)
    cexp, csrc, ctok = (np.full((D, k), -1, np.int64) for _ in range(3))
    ctok[:] = 0
    without = float(rank_times(cost, G, N).max())
    # Step 2: rounds of one move each: to a rank that holds the expert, or to a new copy.
    for _ in range(rounds + D * k):
        o = copy_cost.exposed_us(copies)
        t = rank_times(cost, G, N) + o
        g = int(np.argmax(t))
        # b. candidates (e, m): e has tokens on g; m holds e already, or has a free dynamic slot for a copy of it
        cand = (on[:, g] > 0)[:, None] & (held | (copies < k)[None, :])
        cand[:, g] = False
        e_idx, m_idx = np.nonzero(cand)
        if e_idx.size == 0:
            break
        xe = on[e_idx, g]
        new_copy = ~held[e_idx, m_idx]
        o_m = np.where(new_copy, copy_cost.exposed_us(copies[m_idx] + 1), o[m_idx])
        gains_act = (on[e_idx, m_idx] == 0).astype(np.float64)  # m gains an activation
        # c. price the whole share and the equalising split
        beta = max(cost.beta, 1e-12)
        split = np.floor((beta * (N[g] - N[m_idx]) + o[g] - o_m) / (2 * beta) + SPLIT_EPS)
        split = np.clip(split, 1, np.maximum(xe - 1, 1))
        best_after = np.full(e_idx.size, np.inf)
        best_s = np.zeros(e_idx.size)
        for s in (xe, split):
            whole = s >= xe
            tg = rank_times(cost, G[g] - whole, N[g] - s) + o[g]
            tm = rank_times(cost, G[m_idx] + gains_act, N[m_idx] + s) + o_m
            after = np.maximum(tg, tm)
            better = after < best_after
            best_after, best_s = np.where(better, after, best_after), np.where(better, s, best_s)
        # d. the break-even guard: the move (a copy's time included) must lower the slowest rank's time
        c = int(np.argmin(best_after))  # lowest (e, m) index among ties: np.nonzero is row-major
        if not best_after[c] < t[g]:
            break
        e, m, s = int(e_idx[c]), int(m_idx[c]), float(best_s[c])
        if new_copy[c]:  # e. the source: the fixed holder of e that sends the fewest copies
            holders = np.unique(ranks[e][ranks[e] >= 0])
            src = int(holders[np.argmin(sent[holders])])
            slot = int(copies[m])
            cexp[m, slot], csrc[m, slot] = e, src
            copies[m] += 1
            sent[src] += 1
            held[e, m] = True
        G[g] -= s >= on[e, g]
        G[m] += on[e, m] == 0
        N[g] -= s
        N[m] += s
        on[e, g] -= s
        on[e, m] += s
        _take_from_rank(x, ctok, cexp, ranks, e, g, s)
        _give_to_rank(x, ctok, cexp, ranks, e, m, s)
    # Step 3: copies the rounds left without tokens are not made (their wait goes; no load changes).
    empty = (cexp >= 0) & (ctok <= 0)
    if empty.any():
        cexp, csrc, ctok = (np.where(empty, fill, a) for a, fill in ((cexp, -1), (csrc, -1), (ctok, 0)))
        order = np.argsort(cexp < 0, axis=1, kind="stable")  # made copies first in each rank's slots
        cexp, csrc, ctok = (np.take_along_axis(a, order, axis=1) for a in (cexp, csrc, ctok))
        copies = (cexp >= 0).sum(axis=1)
    times = rank_times(cost, G, N) + copy_cost.exposed_us(copies)
    return CopyPlan(x, cexp, csrc, ctok, float(times.max()), without, times)


def _take_from_rank(x, ctok, cexp, ranks, e: int, g: int, s: float) -> None:
    """Take ``s`` tokens of expert e off rank g, in place: its fixed column there first (`replica_ranks` keeps one
    column per rank), then a copy of e that g received in an earlier round."""
    cols = np.flatnonzero(ranks[e] == g)
    if cols.size:
        take = min(s, x[e, cols[0]])
        x[e, cols[0]] -= take
        s -= take
    if s > 0:
        ctok[g, int(np.flatnonzero(cexp[g] == e)[0])] -= s


def _give_to_rank(x, ctok, cexp, ranks, e: int, m: int, s: float) -> None:
    """Give ``s`` tokens of expert e to rank m, in place: its fixed column there, else its copy there."""
    cols = np.flatnonzero(ranks[e] == m)
    if cols.size:
        x[e, cols[0]] += s
    else:
        ctok[m, int(np.flatnonzero(cexp[m] == e)[0])] += s


def copies_milp(
    n: np.ndarray,
    ranks: np.ndarray,
    cost: CostModel,
    num_ranks: int,
    dynamic_slots: int,
    copy_cost: CopyCost,
    *,
    time_limit: float = 60.0,
    solver: str = "SCIP",
) -> dict:
    """The exact yardstick: copies and whole-token splits chosen together (OR-Tools MILP, ``solver`` "SCIP" or
    "CBC"), for small instances.

    Variables per (expert e, rank g): tokens ``x ≥ 0`` (integer), activation ``a ∈ {0, 1}`` (``x ≤ n_e·a``), and
    where g holds no fixed replica of e a copy ``y ∈ {0, 1}`` (``a ≤ y``, ``Σ_e y ≤ k``); per rank the copy wait
    ``o_g ≥ τ·Σ_e y − ω, o_g ≥ 0``; ``T ≥ a + b·Σ_e a + o_g``, ``T ≥ c + β·Σ_e x + o_g`` (and ``c2 + γ·Σ_e x``);
    minimise T.

    Returns:
      ``{"makespan", "optimal", "copies" [(e, g)], "x" [E, D] tokens per rank, "status"}``.
    """
    n, ranks, D, k = _check(n, ranks, cost, num_ranks, dynamic_slots, copy_cost, "copies_milp")
    check_real("time_limit", time_limit, minimum=0.0, strict=True, where="copies_milp")
    from ortools.linear_solver import pywraplp

    s = pywraplp.Solver.CreateSolver(solver)
    if s is None:
        raise ValueError(f"copies_milp: OR-Tools has no solver {solver!r} here; use 'SCIP' or 'CBC'")
    E = n.shape[0]
    fixed = np.zeros((E, D), bool)
    fixed[np.nonzero(ranks >= 0)[0], ranks[ranks >= 0]] = True
    inf = s.infinity()
    x = [[s.IntVar(0, float(n[e]), f"x{e}_{g}") for g in range(D)] for e in range(E)]
    a = [[s.BoolVar(f"a{e}_{g}") for g in range(D)] for e in range(E)]
    y = {(e, g): s.BoolVar(f"y{e}_{g}") for e in range(E) for g in range(D) if not fixed[e, g]}
    o = [s.NumVar(0, inf, f"o{g}") for g in range(D)]
    T = s.NumVar(0, inf, "T")
    for e in range(E):
        s.Add(sum(x[e]) == float(n[e]))
        for g in range(D):
            s.Add(x[e][g] <= float(n[e]) * a[e][g])
            if not fixed[e, g]:
                s.Add(a[e][g] <= y[e, g])
    for g in range(D):
        ys = [y[e, g] for e in range(E) if (e, g) in y]
        if ys:
            s.Add(sum(ys) <= k)
            s.Add(o[g] >= copy_cost.copy_us * sum(ys) - copy_cost.overlap_us)
        tokens = sum(x[e][g] for e in range(E))
        s.Add(T >= cost.a + cost.b * sum(a[e][g] for e in range(E)) + o[g])
        s.Add(T >= cost.c + cost.beta * tokens + o[g])
        if cost.c2 is not None:
            s.Add(T >= cost.c2 + cost.gamma * tokens + o[g])
    s.Minimize(T)
    s.SetTimeLimit(int(time_limit * 1000))
    status = s.Solve()
    if status not in (s.OPTIMAL, s.FEASIBLE):
        raise RuntimeError(f"copies_milp: the solver found no solution (status {status})")
    copies = sorted((e, g) for (e, g), v in y.items() if v.solution_value() > 0.5)
    xs = np.array([[x[e][g].solution_value() for g in range(D)] for e in range(E)])
    return {
        "makespan": float(T.solution_value()),
        "optimal": status == s.OPTIMAL,
        "copies": copies,
        "x": np.round(xs),
        "status": int(status),
    }
