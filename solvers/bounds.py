"""Lower bounds on the optimal makespan of a dispatch problem (TEMPO §3.1, App. A). numpy + scipy.

Functions take a `solvers.DispatchProblem` (they read its ``n``, ``placement``, ``cost``, ``mask`` and
``live``); this module imports only the cost model and the polynomial limits, so `solvers.problem` can use it.

Three tiers, cheapest first: `forced_lower_bound` (closed form, microseconds), `certified_lower_bound` (adds the
token LP by max-flow and the activation-level test, well under a millisecond; what tempo_fast stops at) and
`problem_lower_bound` (the semi-matching and HiGHS token LP; what `Dispatch.lower_bound` reports).
"""

from __future__ import annotations

import math

import numpy as np

from .limits import semi_matching_value, token_flow, token_lp_shares

__all__ = [
    "certified_lower_bound",
    "forced_lower_bound",
    "level_lower_bound",
    "problem_lower_bound",
    "time_of_cap",
    "token_cap",
]


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


def token_cap(cost, t: float) -> float:
    """Most tokens one rank may hold and still finish by ``t`` (every token piece ≤ t); inf without one."""
    caps = [(t - cost.c) / cost.beta if cost.beta > 0 else math.inf]
    if cost.gamma:
        caps.append((t - cost.c2) / cost.gamma)
    return min(caps)


def time_of_cap(cost, cap: float) -> float:
    """The least time at which a rank holding ``cap`` tokens meets every token piece."""
    t = cost.c + cost.beta * cap
    return max(t, cost.c2 + cost.gamma * cap) if cost.gamma else t


class _LevelTest:
    """Necessary condition for a dispatch with at most k activations and at most C tokens on every rank.

    Forced experts (all replicas on one rank) load their rank whole. What is left on rank g is ``A_g = k − F_g``
    activations and ``R_g = C − Φ_g`` tokens. A flexible expert e then needs at least ``r_e`` pieces, the fewest
    of its replica ranks (with an activation left) whose token rooms add up to n_e; every piece is an
    activation, so ``Σ_e r_e ≤ Σ_g A_g`` (over ranks with A_g ≥ 1) must hold. With zero activation slack this is
    the whole-expert knapsack: an expert larger than every room it could go to needs a second piece that no
    rank can give. Vectorised: ``[E_flex, D]`` cumulative rooms, ranks in descending room order. The flexible
    tokens must also fit the rooms of the ranks with an activation to spare (in total, and with ``matching``,
    by a max-flow over the replica edges), and with ``matching`` the pieces must sit on distinct replica ranks
    within the spare activations (a b-matching by max-flow).
    """

    def __init__(self, problem):
        n, sole, D = problem.n, problem.placement.sole_gpu, problem.num_gpus
        forced = (n > 0) & (sole >= 0)
        self.count = np.bincount(sole[forced], minlength=D).astype(np.float64)  # F_g
        self.load = np.bincount(sole[forced], weights=n[forced], minlength=D)  # Φ_g
        flex = np.flatnonzero((n > 0) & (sole < 0))
        self.n = n[flex]
        self.mask = problem.mask[flex]

    def feasible(self, k: int, cap: float, matching: bool = False) -> bool:
        """The test at level k and token cap ``cap``; ``matching`` adds the b-matching check (one max-flow)."""
        acts, room = k - self.count, cap - self.load
        if (acts < 0).any() or (room < -1e-9 * max(1.0, cap)).any():
            return False
        if self.n.size == 0:
            return True
        usable = acts >= 1
        if self.n.sum() > np.maximum(room[usable], 0.0).sum() * (1 + 1e-12) + 1e-9:
            return False  # flexible tokens can only go to ranks with an activation to spare
        order = np.argsort(-room, kind="stable")
        rooms = np.where(self.mask[:, order] & usable[order], np.maximum(room[order], 0.0), 0.0)
        cum = np.cumsum(rooms, axis=1)
        need = self.n * (1 - 1e-12) - 1e-9
        if (cum[:, -1] < need).any():
            return False
        pieces = ((cum < need[:, None]) & (rooms > 0)).sum(axis=1) + 1  # ranks used before the last piece
        if int(pieces.sum()) > acts[usable].sum():
            return False
        if not matching:
            return True
        usable &= room > 0
        # Pieces: distinct replica ranks within their spare activations (a b-matching; with one piece each it
        # is the semi-matching condition of Lemma 2 on the spare activations).
        if not self._routable(pieces, np.ones(self.mask.shape, np.int64), np.maximum(acts, 0), usable):
            return False
        # Tokens: all flexible tokens into the usable ranks' rooms (Hall on those ranks), in 1/1000 tokens with
        # the rooms rounded up (a permissive test stays a valid bound). A room beyond all flexible tokens is as
        # good as that total (and keeps an unbounded cap, β = 0, finite).
        supply = np.round(self.n * 1000).astype(np.int64)
        rooms = np.ceil(np.minimum(np.maximum(room, 0.0) * 1000, supply.sum())).astype(np.int64)
        return self._routable(supply, supply[:, None] * np.ones((1, room.size), np.int64), rooms, usable)

    def _routable(self, supply: np.ndarray, edge: np.ndarray, sink_cap: np.ndarray, usable: np.ndarray) -> bool:
        """Max-flow check: source → flexible expert e (``supply[e]``) → usable replica rank g (``edge[e, g]``)
        → sink (``sink_cap[g]``) carries all of the supply."""
        from ortools.graph.python import max_flow

        m, D = self.n.size, usable.size
        ee, gg = np.nonzero(self.mask & usable[None, :])
        sink = m + D + 1
        tails = np.concatenate([np.zeros(m, np.int64), 1 + ee, 1 + m + np.arange(D)]).astype(np.int32)
        heads = np.concatenate([1 + np.arange(m), 1 + m + gg, np.full(D, sink)]).astype(np.int32)
        caps = np.concatenate([supply, edge[ee, gg], sink_cap]).astype(np.int64)
        flow = max_flow.SimpleMaxFlow()
        flow.add_arcs_with_capacity(tails, heads, caps)
        if flow.solve(0, sink) != flow.OPTIMAL:
            raise RuntimeError("level test: OR-Tools max-flow failed")
        return flow.optimal_flow() >= int(supply.sum())


def level_lower_bound(problem, lower: float, upper: float, *, bisections: int = 24) -> float:
    """Raise a lower bound by activation levels: OPT ≥ the least t at which `_LevelTest` passes.

    A dispatch finishing by t holds at most ``k(t) = ⌊(t − a)/b⌋`` activations (the tile term only adds, b2 ≥ 0)
    and ``C(t)`` tokens on every rank. Step 1: for the level k of ``lower``, test the most permissive cap below
    the next level, ``C(min(a + b(k+1), upper))``; when even that fails, OPT ≥ a + b(k+1): move up a level.
    Step 2: on the first level that passes, bisect the token cap between ``C(lower)`` and that cap (the test is
    monotone in C) and return the time of the last failing cap. Step 1 also runs the b-matching check (one
    max-flow per level); the bisection uses the counting test only. Stops at ``upper`` (an incumbent's makespan):
    nothing above it is worth proving.

    Args:
      problem: the `DispatchProblem` (non-negative slopes; b > 0, else ``lower`` is returned).
      lower: a proven lower bound (µs), e.g. `forced_lower_bound`.
      upper: the makespan of a known dispatch (µs).
      bisections: token-cap bisection steps (each one `_LevelTest`, tens of microseconds).

    Returns:
      A proven lower bound ≥ ``lower`` (µs), never above ``upper``.
    """
    cost = problem.cost
    if cost.b <= 0 or min(cost.beta, cost.b2 or 0.0, cost.gamma or 0.0) < 0 or upper <= lower:
        return lower
    test = _LevelTest(problem)
    k = max(math.floor((lower - cost.a) / cost.b + 1e-9), 0)  # every rank pays ≥ a: start at level 0 or above
    lb = lower
    # Step 1: climb the levels that cannot hold the batch.
    while True:
        t_next = min(cost.a + cost.b * (k + 1), upper)
        if not test.feasible(k, token_cap(cost, t_next), matching=True):
            lb = max(lb, t_next)
            if t_next >= upper:
                return float(lb)
            k += 1
            continue
        break
    # Step 2: bisect the token cap on the first feasible level.
    lo, hi = token_cap(cost, lb), token_cap(cost, t_next)
    if not math.isfinite(hi) or test.feasible(k, lo):
        return float(lb)
    for _ in range(bisections):
        mid = 0.5 * (lo + hi)
        if test.feasible(k, mid):
            hi = mid
        else:
            lo = mid
    return float(max(lb, time_of_cap(cost, lo)))


def certified_lower_bound(problem, upper: float = math.inf, *, lower: float | None = None) -> tuple[float, dict]:
    """A proven lower bound on OPT in well under a millisecond, and what each part gave.

    Step 1: `forced_lower_bound` (or ``lower`` when the caller already has it).
    Step 2: the token LP optimum by max-flow (`solvers.limits.token_flow`; under full replication it is N/D and is
    skipped): OPT ≥ c + β·LP (and the traffic piece).
    Step 3: `level_lower_bound` between that and ``upper``.

    Returns:
      ``(bound, parts)``; ``parts`` maps ``forced``, ``token_flow``, ``level`` to the bound after each step,
      ``tokens`` to the token-LP optimum (no rank holds fewer tokens on its fullest rank: N/D under full
      replication) and, when step 2 ran, ``flow`` to its `TokenFlow` (integer token-LP shares, reusable as a
      dispatch).
    """
    cost = problem.cost
    lb = forced_lower_bound(problem) if lower is None else float(lower)
    parts: dict = {"forced": lb, "tokens": float(problem.n.sum()) / problem.num_gpus}
    if upper > lb and not problem.placement.is_full and min(cost.beta, cost.gamma or 0.0) >= 0:
        tf = token_flow(problem.n, problem.mask)
        parts["flow"], parts["tokens"] = tf, tf.bound
        lb = max(lb, time_of_cap(cost, tf.bound))
    parts["token_flow"] = lb
    lb = level_lower_bound(problem, lb, upper)
    parts["level"] = lb
    return lb, parts
