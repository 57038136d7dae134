"""tempo_fast (TEMPO §4.2): the makespan-aware dispatch heuristic, anytime, with a certified lower bound.

0. Certified lower bound (beyond the paper; `solvers.bounds.certified_lower_bound`, well under a millisecond):
   the forced loads, the token LP by max-flow and an activation-level test. Every stage stops as soon as it
   reaches the bound (within ``stop_gap``): the dispatch is then provably optimal.
1. Cost-aware greedy seeding: experts by tokens descending, each placed whole on the replica GPU whose
   modelled time after taking it is lowest; an expert that cannot fit whole under the bound is split over its
   roomiest replicas instead, and the token-flow point of step 0 is the seed when it is lower (``split_seed``;
   off = the paper's whole-expert seed).
2. Activation rebalancing by augmenting chains of whole-expert moves off the bottleneck GPU (floor-bound
   GPUs only): the semi-matching augmenting paths that are exact when β → 0 (Lemma 2). The paper truncates
   them at 1 and 2 steps (``chain_depth=2``); by default the search runs to full depth.
3. Bottleneck local search with partial migrations: whole-expert moves and partial splits off the
   bottleneck GPU, split sizes in closed form (`solvers.tempo_moves`); best move wins; ≤ ``max_iters``.
4. Ensemble (Proposition 1): score token-LP and A3 (full replication only) and switch only when one is
   more than τ better; skipped when the bound shows no candidate can be τ better. Candidates cheapest first,
   stopping at the bound: (a) the token-LP point — the integer max-flow optimum of step 0 (the HiGHS vertex
   with a tile term) — and A3; (b) beyond the paper, the level partition (`tempo_moves.level_partition`: whole
   experts matched and swapped at the bound's activation level); (c) beyond the paper, the exact search at that
   level (`solvers.level_search`, CP-SAT on the flexible experts): a dispatch at the bound, or a proof that
   raises the bound to the next level; (d) the METRO and token-LP points polished by stages 2–3.
5. Target repair (beyond the paper): when no candidate reached the bound and the bound sits on an activation
   level a + b·k, `target_repair` edits the active pattern of the HiGHS token-LP vertex, the heuristic's
   dispatch, the level partition, the token-flow point and the METRO point towards it (within
   ``repair_flows`` scored edits over all starts); a success is optimal.

Anytime: with ``time_budget_ms`` every stage checks the clock and the best dispatch found so far is returned
with its certified bound and gap (the seed always completes: it is the first valid dispatch). Without a budget,
or with one that is not reached, the result does not depend on time at all. numpy + scipy + ortools only.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from .bounds import certified_lower_bound, forced_lower_bound, time_of_cap, token_cap
from .level_search import level_search
from .limits import token_flow
from .policies import metro, round_robin, token_lp
from .problem import OPTIMAL_RTOL, DispatchProblem
from .target_repair import target_repair
from .tempo_moves import State, chains, level_partition, local_search, seed

__all__ = ["TempoOptions", "tempo_fast"]

_EPS = 1e-9


@dataclass(frozen=True, kw_only=True)
class TempoOptions:
    """Knobs of `tempo_fast` (each is also a keyword of `tempo_fast` and of ``solve(problem, "tempo", ...)``).

    Attributes:
      tile_aware: snap partial splits to ``cost.tile``-token tiles (None: when the model has a tile term).
      chains / local_search / partial_moves / ensemble: stage switches for ablations (seeding always runs).
      chain_depth: longest augmenting chain (2 = the paper's 1- and 2-step chains; None = D, full paths).
      tau: ensemble switching tolerance τ (Proposition 1), in [0, 1).
      max_iters: local-search iteration cap (the paper uses 300); also caps chain rounds.
      repair: try `target_repair` towards the bound when the ensemble ran and no candidate reached it.
      repair_flows: budget of repair edits scored (one small max-flow each) over all starts together.
      split_seed: split an expert in the seed when it cannot fit whole under the bound (False: the paper's seed).
      level_search: run the exact search at the bound's activation level (`solvers.level_search`, CP-SAT on the
        flexible experts) when the ensemble has not reached the bound.
      level_work: its CP-SAT deterministic time limit per level (about 4 wall seconds per unit on 2 cores;
        deterministic, so results do not depend on the machine's load).
      stop_gap: stop searching once ``makespan ≤ bound·(1 + stop_gap)``, or the time of ⌈token-LP optimum⌉ tokens
        when that is higher (integer token splits cannot meet a fractional token optimum).
      time_budget_ms: wall-clock budget in milliseconds (None: no budget). Checked between and inside stages.
    """

    tile_aware: bool | None = None
    chains: bool = True
    chain_depth: int | None = None
    local_search: bool = True
    partial_moves: bool = True
    ensemble: bool = True
    tau: float = 0.01
    max_iters: int = 300
    repair: bool = True
    repair_flows: int = 600
    split_seed: bool = True
    level_search: bool = True
    level_work: float = 0.05
    stop_gap: float = 1e-4
    time_budget_ms: float | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.tau, int | float) and 0 <= self.tau < 1):
            raise ValueError(f"tau must be in [0, 1) (a relative switching tolerance), got {self.tau!r}")
        if int(self.max_iters) != self.max_iters or self.max_iters < 0:
            raise ValueError(f"max_iters must be an integer ≥ 0, got {self.max_iters!r}")
        if self.chain_depth is not None and (int(self.chain_depth) != self.chain_depth or self.chain_depth < 1):
            raise ValueError(f"chain_depth must be an integer ≥ 1 or None (full depth), got {self.chain_depth!r}")
        if int(self.repair_flows) != self.repair_flows or self.repair_flows < 0:
            raise ValueError(f"repair_flows must be an integer ≥ 0, got {self.repair_flows!r}")
        if not (isinstance(self.level_work, int | float) and self.level_work > 0):
            raise ValueError(f"level_work must be > 0 (CP-SAT deterministic seconds), got {self.level_work!r}")
        if not (isinstance(self.stop_gap, int | float) and 0 <= self.stop_gap < 1):
            raise ValueError(f"stop_gap must be in [0, 1) (relative to the bound), got {self.stop_gap!r}")
        b = self.time_budget_ms
        if b is not None and (isinstance(b, bool) or not isinstance(b, int | float | np.number) or not b >= 0):
            raise ValueError(f"time_budget_ms must be a number of milliseconds ≥ 0, or None for no budget; got {b!r}")


class _Clock:
    """The deadline of a time budget (``time.perf_counter()`` seconds; inf without a budget)."""

    def __init__(self, budget_ms: float | None):
        self.t0 = time.perf_counter()
        self.deadline = math.inf if budget_ms is None else self.t0 + float(budget_ms) / 1e3
        self.hit = False

    def out(self) -> bool:
        if time.perf_counter() > self.deadline:
            self.hit = True
        return self.hit


class _Bound:
    """The certified lower bound as it rises, and the makespan that is good enough to stop at.

    ``integer``: a bound for dispatches with integer token shares (every stage makes those): the fullest rank
    holds at least ⌈token-LP optimum⌉ tokens, so its time is at least that many tokens' time. The bound reported
    stays the one for real-valued shares."""

    def __init__(self, lb: float, cost, stop_gap: float, tokens: float | None = None):
        self.lb, self.stop_gap = float(lb), stop_gap
        self.integer = time_of_cap(cost, math.ceil(tokens - 1e-9)) if tokens is not None else -math.inf

    @property
    def stop(self) -> float:
        return max(self.lb * (1 + self.stop_gap), self.integer) + _EPS

    def raise_to(self, value: float) -> None:
        self.lb = max(self.lb, float(value))


def tempo_fast(
    problem: DispatchProblem,
    *,
    tile_aware: bool | None = None,
    chains: bool = True,
    chain_depth: int | None = None,
    local_search: bool = True,
    partial_moves: bool = True,
    ensemble: bool = True,
    tau: float = 0.01,
    max_iters: int = 300,
    repair: bool = True,
    repair_flows: int = 600,
    split_seed: bool = True,
    level_search: bool = True,
    level_work: float = 0.05,
    stop_gap: float = 1e-4,
    time_budget_ms: float | None = None,
) -> tuple[np.ndarray, dict]:
    """Makespan-aware dispatch (tempo_fast). Works with the two-piece, tile and three-piece cost models.

    Args:
      problem: tokens ``[E]`` or ``[Gs, E]`` (per-expert totals are used), placement, cost model.
      tile_aware, chains, chain_depth, local_search, partial_moves, ensemble, tau, max_iters, repair,
        repair_flows, split_seed, level_search, level_work, stop_gap, time_budget_ms: see `TempoOptions`.

    Returns:
      ``(x [E, D], info)``. ``info`` holds:

      - ``stage``: which candidate won (``heuristic``, ``token_lp``, ``round_robin``, ``level``, ``level_search``,
        ``<start>+polish``, ``<start>+repair``); ``seed`` (``greedy`` or ``token_flow``), ``seed_makespan``,
        ``heuristic_makespan`` and ``<candidate>_makespan`` (µs) for every candidate scored, stage counters
        (``chain_rounds``, ``local_iters``, ``repair_flows``) and ``level_search`` (each CP-SAT call's outcome).
      - ``lower_bound`` (also under ``bound``, which `Dispatch.lower_bound` reads): a certified lower bound on
        the optimal makespan (µs), from `solvers.bounds.certified_lower_bound`; ``bound_parts`` says what each
        part of it gave.
      - ``gap``: ``(makespan − lower_bound) / makespan`` ≥ 0; ``optimal``: the makespan is within
        `solvers.problem.OPTIMAL_RTOL` of a proven bound over integer token shares (one definition for every
        solver; the gap, against the real-valued bound, can then still be up to β / makespan).
      - ``ensemble_skipped``: True when the bound showed no candidate could be τ better than the heuristic.
      - ``time_budget_ms`` (the budget, or None), ``budget_exhausted`` (the clock ran out before the search
        finished: the dispatch is the best found so far) and ``elapsed_ms`` (time inside tempo_fast).

    Raises:
      ValueError: an invalid knob (see `TempoOptions`), e.g. a negative ``time_budget_ms``.
    """
    opts = TempoOptions(
        tile_aware=tile_aware,
        chains=chains,
        chain_depth=chain_depth,
        local_search=local_search,
        partial_moves=partial_moves,
        ensemble=ensemble,
        tau=tau,
        max_iters=max_iters,
        repair=repair,
        repair_flows=repair_flows,
        split_seed=split_seed,
        level_search=level_search,
        level_work=level_work,
        stop_gap=stop_gap,
        time_budget_ms=time_budget_ms,
    )
    return _tempo(problem, opts)


def _tempo(problem: DispatchProblem, opts: TempoOptions) -> tuple[np.ndarray, dict]:
    clock = _Clock(opts.time_budget_ms)
    tile_aware = problem.cost.has_tiles if opts.tile_aware is None else bool(opts.tile_aware)
    cost = problem.cost
    depth = problem.num_gpus if opts.chain_depth is None else int(opts.chain_depth)
    info: dict = {}

    # Step 0: the certified lower bound (only the closed-form part when the budget is already gone).
    if clock.out():
        lb, parts = forced_lower_bound(problem), {}
    else:
        lb, parts = certified_lower_bound(problem)
    flow = parts.pop("flow", None)
    info["bound_parts"] = parts
    bound = _Bound(lb, cost, opts.stop_gap, parts.get("tokens"))

    def improve(st: State, tag: str) -> None:
        # Step 2: augmenting chains.  Step 3: bottleneck local search with partial migrations. The partial
        # moves of stage 3 can open chains that were blocked, so the pair repeats while it still helps.
        for sweep in range(4 if opts.chains and opts.local_search else 1):
            before = st.makespan()
            if before <= bound.stop or clock.out():
                break
            if opts.chains:
                info[f"{tag}chain_rounds"] = chains(st, opts.max_iters, depth, bound.stop, clock.deadline)
                if sweep == 0:
                    info[f"{tag}chains_makespan"] = st.makespan()
            if opts.local_search:
                info[f"{tag}local_iters"] = local_search(
                    st, opts.max_iters, tile_aware, opts.partial_moves, bound.stop, clock.deadline
                )
            if st.makespan() >= before - _EPS:
                break

    # Step 1: seed (always completes: the first valid dispatch).
    st = State(problem)
    seed(st, problem, lb if opts.split_seed else None)
    info["seed"] = "greedy"
    if opts.split_seed and flow is not None:
        # The token-flow point of the bound is a second seed for free (restricted placements): the greedy fill
        # can strand restricted experts without room; the flow never does. The lower of the two starts.
        alt = State(problem, flow.x)
        if alt.makespan() < st.makespan():
            st, info["seed"] = alt, "token_flow"
    info["seed_makespan"] = st.makespan()
    improve(st, "")
    x = st.x
    m_h = cost.makespan(x)
    info["heuristic_makespan"] = m_h
    info["stage"] = "heuristic"
    best = (m_h, "heuristic", x)

    # Step 4: ensemble against token-LP and A3, switching only when > τ better (Proposition 1); the token-LP and
    # METRO points are also polished by stages 2–3. Polishing only lowers a candidate's makespan, and the search
    # stops at the bound (nothing scores below it), so the rule picks what it would pick after every candidate.
    if opts.ensemble and m_h > 0:
        info["ensemble_skipped"] = (1 - opts.tau) * m_h <= bound.lb + _EPS
        if not info["ensemble_skipped"] and not clock.out():
            best = _ensemble(problem, opts, info, clock, improve, x, flow, bound)
            if not best[0] < (1 - opts.tau) * m_h:
                best = (m_h, "heuristic", x)
    x_out, info["stage"] = best[2], best[1]
    m = cost.makespan(x_out)
    lb = bound.lb
    info["lower_bound"] = info["bound"] = float(min(lb, m))
    info["gap"] = float(max(m - lb, 0.0) / m) if m > 0 else 0.0
    info["optimal"] = bool(m <= max(lb, bound.integer) * (1 + OPTIMAL_RTOL) + _EPS)  # see solvers.problem
    info["time_budget_ms"] = opts.time_budget_ms
    info["budget_exhausted"] = clock.hit
    info["elapsed_ms"] = 1e3 * (time.perf_counter() - clock.t0)
    return np.array(x_out), info


def _ensemble(problem, opts, info, clock, improve, x_h, flow, bound: _Bound):
    """Steps 4–5: score the candidates cheapest first; stop at the bound or the deadline. Returns the best
    candidate ``(makespan, name, x)`` other than the heuristic (inf when none was scored); ``bound`` may rise."""
    cost = problem.cost
    m_h = cost.makespan(x_h)
    best = (math.inf, "heuristic", x_h)
    points: dict[str, np.ndarray | None] = {"heuristic": x_h}  # every start built so far, by name

    def done() -> bool:
        return min(best[0], m_h) <= bound.stop or clock.out()

    def offer(name: str, xc: np.ndarray) -> bool:
        nonlocal best
        info[f"{name}_makespan"] = mc = cost.makespan(xc)
        if mc < best[0]:
            best = (mc, name, xc)
        return done()

    def point(name: str) -> np.ndarray | None:
        if name not in points:
            points[name] = metro(problem) if name == "metro" else token_lp(problem)  # token_lp_vertex: HiGHS
        return points[name]

    # Step 4a: the token-LP point: the integer max-flow optimum (the bound computed it under restriction); with a
    # tile term the HiGHS vertex instead, whose even fractional splits can save a tile where the flow's do not.
    if cost.has_tiles:
        points["token_lp"] = point("token_lp_vertex")
    else:
        points["token_lp"] = (flow if flow is not None else token_flow(problem.n, problem.mask)).x
    if offer("token_lp", points["token_lp"]):
        return best
    if problem.placement.is_full and offer("round_robin", round_robin(problem)):
        return best
    # Step 4b (beyond the paper): a dispatch built for the bound's activation level and token cap: whole experts
    # re-partitioned at equal counts, hot ones split over matched ranks (the moves local search cannot make when
    # the activation slack is zero).
    points["level"] = None
    levels = cost.b > 0 and not cost.has_tiles  # both level stages count activations, not tiles
    if levels:
        k = math.floor((bound.lb - cost.a) / cost.b + 1e-9)
        points["level"] = level_partition(problem, k, token_cap(cost, bound.lb))
        if points["level"] is not None and offer("level", points["level"]):
            return best
    # Step 4c (beyond the paper): the exact search at the bound's level (`level_search`, CP-SAT on the flexible
    # experts): a dispatch at the level, or a proof that the bound rises to the next level (often the
    # heuristic's own makespan, which is then certified optimal).
    if opts.level_search and levels:
        k = math.floor((bound.lb - cost.a) / cost.b + 1e-9)
        searches = []
        while not done():
            # First the bound itself with integer tokens (a dispatch there is optimal), then the most permissive
            # cap below the next level or the incumbent, rooms rounded up (infeasible: the bound rises to it).
            t_top = min(cost.a + cost.b * (k + 1), best[0], m_h)
            for t_cap, proof in ((bound.lb, False), (t_top, True)):
                wall = clock.deadline - time.perf_counter()
                # no hint: a level-partition start slowed CP-SAT down on the batches tried
                res = level_search(
                    problem, k, token_cap(cost, t_cap), round_up=proof, work_limit=opts.level_work, wall_limit=wall
                )
                searches.append(f"k={k}@{t_cap:.6g}:{res.status}")
                if res.x is not None and offer("level_search", res.x):
                    break
                if res.status != "infeasible":
                    break
                if proof:
                    bound.raise_to(t_cap)
            if res.status != "infeasible" or done():
                break
            k += 1
        info["level_search"] = searches
        if done():
            return best
    # Step 4d: polish the METRO and token-LP starts with stages 2–3 (the token-flow point only when the heuristic
    # did not already start from it).
    if opts.chains or opts.local_search:
        for name in ("metro", "token_lp"):
            if name == "token_lp" and info.get("seed") == "token_flow":
                continue
            polished = State(problem, point(name))
            improve(polished, f"{name}_")
            if offer(f"{name}+polish", polished.x):
                return best
    # Step 5: target repair towards the bound, while budget lasts. Only when the bound sits on an activation
    # level a + b·k (the flat regime, where the bound is usually the optimum). Which start a repair succeeds
    # from is hard to predict; on 9 DeepSeek-V3 EP8 batches that needed it each start succeeded on 5–6 of them,
    # the HiGHS token-LP vertex with the fewest edits (97 on average; built here only, a few ms). It goes first
    # with the whole edit budget, then the other starts with what is left.
    lb = bound.lb
    level = (lb - cost.a) / cost.b if cost.b > 0 else 0.5
    stats = {"flows": 0}
    if opts.repair and abs(level - round(level)) <= 1e-6:
        for name in ("token_lp_vertex", "heuristic", "level", "token_lp", "metro"):
            left = opts.repair_flows - stats["flows"]
            if done() or left <= 0:
                break
            start = point(name)
            if start is None:
                continue
            xr = target_repair(problem, start, lb, max_flows=left, stats=stats, deadline=clock.deadline)
            if xr is not None:
                offer(f"{name}+repair", xr)
    info["repair_flows"] = stats["flows"]
    return best
