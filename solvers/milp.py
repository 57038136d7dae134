"""Exact MILP baseline for the dispatch problem (TEMPO §3.1, Problem 3) on OR-Tools. numpy + ortools, no jax.

For a problem with token counts ``n [E]`` on replica mask ``[E, D]`` the model is, over live replica edges only:

    min M  s.t.  Σ_g x_eg = n_e,   x_eg ≤ min(n_e, N̄)·z_eg,   r_e = Σ_g z_eg ≥ 1,   z_eg ∈ {0, 1}
                 k_g = Σ_e z_eg ∈ ℤ,   K ≥ k_g, K ∈ ℤ,   M ≥ a + b·K,   M ≥ a + b·k_g [+ b2·(T_g − k_g)]
                 N_g = Σ_e x_eg,   M ≥ c + β·N_g  [, M ≥ c2 + γ·N_g],   LB ≤ M ≤ UB
                 ρ(ρ+1)(M − c) ≥ β·n_e·(2ρ + 1 − r_e)   (hot experts, ρ = 1, 2, …: M ≥ c + β·n_e/r_e)
    tile term:   y_eg ∈ ℤ,  tile·y_eg ≥ x_eg,  y_eg ≥ z_eg,  y_eg ≤ ⌈n_e/tile⌉·z_eg,  T_g = Σ_e y_eg

LB is `solvers.bounds.problem_lower_bound` (a + b·SM, c + β·LP, …); UB is the best heuristic/hint incumbent, which
also gives per-GPU caps N̄ (token pieces) and k_g ≤ (UB − a)/b: tight big-M, never a global constant. The integer
K = max_g k_g is what closes the gap: branching on it settles how many experts may split, and the secant cuts
(an expert on r_e replicas puts ≥ n_e/r_e tokens on one GPU) tie the splits of hot experts to M.

Tokens: ``cp_sat`` has integer x (token counts; active pairs carry ≥ 1 token) and integer M in units of 1/S µs,
S = 10^k making every cost coefficient an exact integer when one k ≤ 6 does (every preset), else floor-rounded
coefficients with S·UB ≈ 1e12 (the scaled model then never exceeds S·true cost, so its bound stays valid). The
pywraplp / math_opt backends default to continuous x (``integer_tokens=True`` makes them match cp_sat).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import timedelta

import numpy as np

from .bounds import problem_lower_bound
from .cost import CostModel
from .placement import Placement
from .policies import llep, metro, round_robin, token_lp
from .problem import OPTIMAL_RTOL, Dispatch, DispatchProblem

__all__ = ["MILP_BACKENDS", "MAX_MODEL_MAGNITUDE", "WALL_GUARD", "milp", "partition_instance"]

#: Deterministic CP-SAT runs stop on their own clock; a wall-clock guard at this multiple of ``time_limit`` ends a
#: run on a machine too slow or loaded for it (``info["wall_limited"]``: then not reproducible).
WALL_GUARD = 2.0

MILP_BACKENDS = ("cp_sat", "scip", "highs", "cbc", "math_opt_highs", "math_opt_scip")
_PYWRAPLP = {"scip": "SCIP", "highs": "HIGHS", "cbc": "CBC"}
_SLACK = 1e-9  # relative slack on UB-derived caps (float evaluation of the incumbent)
# Largest coefficient × variable bound a model may hold (see `_check_size`): CP-SAT sums in int64 (2^63; 2^60
# leaves headroom), the floating-point backends refuse or mistrust values above 1e15 (HiGHS: "|values| > 1e15").
MAX_MODEL_MAGNITUDE = {"cp_sat": float(2**60)} | dict.fromkeys(MILP_BACKENDS[1:], 1e15)
# CP-SAT deterministic seconds per wall second of one worker on the reference machine (measured on the 2-core
# development box: 0.25–0.3 on DeepSeek-V3-shaped models). The deterministic limit of a `time_limit` run.
_DET_PER_SECOND = 0.25


class _CpSat:
    """CP-SAT adapter: integer variables only; the caller passes integer coefficients."""

    integer_only = True

    def __init__(self, _kind=None):
        from ortools.sat.python import cp_model

        self.cp, self.m = cp_model, cp_model.CpModel()

    def var(self, lb, ub, integer=True):
        return self.m.new_int_var(math.floor(lb), math.ceil(ub), "")

    def add(self, ct):
        self.m.add(ct)

    def sum(self, terms):
        return self.cp.LinearExpr.sum(list(terms))

    def solve(self, objective, hints, time_limit, threads, deterministic=False):
        self.m.minimize(objective)
        for v, val in hints:
            self.m.add_hint(v, int(round(val)))
        s = self.cp.CpSolver()
        s.parameters.num_workers = int(threads)
        s.parameters.random_seed = 0
        if deterministic:
            # Reproducible: one worker (or the interleaved portfolio for several) and a limit on CP-SAT's
            # deterministic clock; the wall limit stays as a guard (hitting it first is reported).
            s.parameters.interleave_search = int(threads) > 1
            s.parameters.max_deterministic_time = _DET_PER_SECOND * float(time_limit)
            s.parameters.max_time_in_seconds = WALL_GUARD * float(time_limit)
        else:
            s.parameters.max_time_in_seconds = float(time_limit)
        st = s.solve(self.m)
        self.wall_limited = deterministic and s.wall_time >= WALL_GUARD * float(time_limit) * 0.999
        has = st in (self.cp.OPTIMAL, self.cp.FEASIBLE)
        limited = st in (self.cp.FEASIBLE, self.cp.UNKNOWN)
        return s.status_name(st), st == self.cp.OPTIMAL, limited, (s.value if has else None), s.best_objective_bound


class _Wraplp:
    """pywraplp adapter (SCIP, HiGHS, CBC)."""

    integer_only = False

    def __init__(self, kind):
        from ortools.linear_solver import pywraplp

        self.lp, self.s, self.kind = pywraplp, pywraplp.Solver.CreateSolver(kind), kind
        if self.s is None:
            raise RuntimeError(f"milp: OR-Tools was built without the {kind} backend")

    def var(self, lb, ub, integer=False):
        return self.s.IntVar(lb, ub, "") if integer else self.s.NumVar(lb, ub, "")

    def add(self, ct):
        self.s.Add(ct)

    def sum(self, terms):
        return self.s.Sum(list(terms))

    def solve(self, objective, hints, time_limit, threads, deterministic=False):
        lp, s = self.lp.Solver, self.s
        s.Minimize(objective)
        if hints and self.kind != "HIGHS":  # SetHint segfaults pywraplp's HiGHS (OR-Tools 9.15)
            s.SetHint([v for v, _ in hints], [float(val) for _, val in hints])
        s.SetTimeLimit(max(1, int(1000 * time_limit)))
        if self.kind != "CBC":  # CBC rejects the threads option
            s.SetNumThreads(int(threads))
        params = self.lp.MPSolverParameters()
        params.SetDoubleParam(params.RELATIVE_MIP_GAP, 1e-7)
        t0 = time.perf_counter()
        st = s.Solve(params)
        elapsed = time.perf_counter() - t0
        names = {lp.OPTIMAL: "OPTIMAL", lp.FEASIBLE: "FEASIBLE", lp.INFEASIBLE: "INFEASIBLE", lp.UNBOUNDED: "UNBOUNDED"}
        names.update({lp.ABNORMAL: "ABNORMAL", lp.NOT_SOLVED: "NOT_SOLVED", lp.MODEL_INVALID: "MODEL_INVALID"})
        has = st in (lp.OPTIMAL, lp.FEASIBLE)
        bound = s.Objective().BestBound() if has else -math.inf
        value = (lambda v: v.solution_value()) if has else None
        # HiGHS answers an undocumented status (99) or NOT_SOLVED, and no incumbent, at its time limit: a limit only
        # when the time was used up (a NOT_SOLVED after 0.07 s of a 10 s limit is a failure, not a timeout).
        limited = st not in (lp.OPTIMAL, lp.INFEASIBLE, lp.UNBOUNDED, lp.ABNORMAL, lp.MODEL_INVALID) and (
            has or elapsed >= 0.9 * time_limit
        )
        return names.get(st, f"UNKNOWN_{st}"), st == lp.OPTIMAL, limited, value, bound


class _MathOpt:
    """ortools.math_opt adapter (HiGHS, SCIP). Its CP_SAT silently rounds continuous variables: not offered."""

    integer_only = False

    def __init__(self, kind):
        from ortools.math_opt.python import mathopt

        self.mo, self.m, self.kind = mathopt, mathopt.Model(), getattr(mathopt.SolverType, kind)

    def var(self, lb, ub, integer=False):
        return self.m.add_variable(lb=lb, ub=ub, is_integer=integer)

    def add(self, ct):
        self.m.add_linear_constraint(ct)

    def sum(self, terms):
        return self.mo.fast_sum(list(terms))

    def solve(self, objective, hints, time_limit, threads, deterministic=False):
        mo = self.mo
        self.m.minimize(objective)
        threads = None if self.kind == mo.SolverType.HIGHS else int(threads)  # HiGHS takes threads only globally
        params = mo.SolveParameters(time_limit=timedelta(seconds=time_limit), threads=threads)
        params.relative_gap_tolerance = 1e-7
        mp = mo.ModelSolveParameters(solution_hints=[mo.SolutionHint(variable_values=dict(hints))]) if hints else None
        res = mo.solve(self.m, self.kind, params=params, model_params=mp)
        reason = res.termination.reason
        vals = res.variable_values() if res.has_primal_feasible_solution() else None
        limited = reason in (mo.TerminationReason.FEASIBLE, mo.TerminationReason.NO_SOLUTION_FOUND)
        value = vals.__getitem__ if vals is not None else None
        bound = res.termination.objective_bounds.dual_bound
        return reason.name, reason == mo.TerminationReason.OPTIMAL, limited, value, bound


_ADAPTERS = {"cp_sat": (_CpSat, None), "math_opt_highs": (_MathOpt, "HIGHS"), "math_opt_scip": (_MathOpt, "GSCIP")}
_ADAPTERS.update({k: (_Wraplp, v) for k, v in _PYWRAPLP.items()})


def _coefficients(cost: CostModel, integer_coefs: bool, ub: float) -> tuple[dict, float, bool]:
    """Cost coefficients in model units (µs·S) and the scale S; exact=False when they were floor-rounded."""
    raw = {"a": cost.a, "b": cost.b, "c": cost.c, "beta": cost.beta, "b2": cost.b2, "c2": cost.c2, "gamma": cost.gamma}
    raw = {k: float(v) for k, v in raw.items() if v is not None}
    if not integer_coefs:
        return raw, 1.0, True
    for k in range(7):
        s = 10.0**k
        if all(abs(v * s - round(v * s)) <= 1e-9 * max(1.0, abs(v * s)) for v in raw.values()):
            return {key: int(round(v * s)) for key, v in raw.items()}, s, True
    s = 10.0 ** max(0, math.floor(12 - math.log10(max(abs(ub), 1.0))))
    return {key: math.floor(v * s) for key, v in raw.items()}, s, False


def _round_rows(x: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Integer dispatch near x with exact row sums n (largest remainders, support ⊆ support(x))."""
    r = np.floor(x + 1e-9)
    for e in np.flatnonzero(n > 0):
        short = int(round(n[e] - r[e].sum()))
        if short > 0:
            frac = np.where(x[e] > 0, x[e] - r[e], -1.0)
            r[e, np.argsort(-frac, kind="stable")[:short]] += 1.0
    return r


def _incumbents(problem: DispatchProblem, hint, integer: bool) -> list[tuple[str, np.ndarray]]:
    """Warm starts: the hint (and its integer rounding) and the cheap whole-expert policies."""
    out = []
    if hint is not None:
        out.append(("hint", hint))
        if integer and np.any(hint != np.round(hint)):
            out.append(("hint_rounded", _round_rows(hint, problem.n)))
    out += [("metro", metro(problem)), ("llep", llep(problem))]
    if problem.placement.is_full:
        out.append(("round_robin", round_robin(problem)))
    if not integer:
        out.append(("token_lp", token_lp(problem)))
    return out


def _model_pieces(coef: dict, k, T, N):
    """Model-unit pieces [floor, token(, traffic)] of one GPU."""
    floor = coef["a"] + coef["b"] * k + (coef["b2"] * (T - k) if "b2" in coef else 0)
    return [floor, coef["c"] + coef["beta"] * N] + ([coef["c2"] + coef["gamma"] * N] if "c2" in coef else [])


def _check_size(n: np.ndarray, ub: float, scale: float, D: int, backend: str) -> None:
    """ValueError when the model would hold numbers beyond `MAX_MODEL_MAGNITUDE` of the backend.

    In model units the largest terms are ρ(ρ+1)·M ≤ D²·S·UB and the secant constants β·n_e·(2ρ+1) ≤ 3D²·S·UB
    (β·n_e ≤ D·UB), and the token caps x ≤ n_e.
    """
    size, limit = max(3.0 * D * D * scale * ub, float(n.max(initial=0.0))), MAX_MODEL_MAGNITUDE[backend]
    if size > limit:
        about = float(n.sum()) * limit / size
        raise ValueError(
            f"milp: this batch ({n.sum():.4g} tokens, largest expert {n.max():.4g}) is too large for an exact model: "
            f"its coefficients reach {size:.3g} (makespan bound {ub:.4g} µs × scale {scale:g} × 3·D² with D={D}), "
            f"above the {limit:.3g} backend {backend!r} supports. With this cost model and D the MILP handles "
            f"batches up to about {about:.3g} tokens; use policy 'tempo' (any size) for larger ones"
        )


@dataclass(frozen=True)
class _Bounds:
    """Step 2's incumbents and the bounds they give: ``cands`` (name, x, makespan), the ``warm`` start, LB ``lb``,
    the slackened UB ``ub_s``, the per-GPU caps ``ncap`` (tokens) / ``kcap`` (experts), the model-unit
    coefficients ``coef`` at scale ``S`` (``exact``: not floor-rounded)."""

    cands: list
    warm: tuple
    lb: float
    ub_s: float
    ncap: float
    kcap: int
    coef: dict
    S: float
    exact: bool


@dataclass(frozen=True)
class _Model:
    """Steps 3–5's model: the solver adapter ``lib``, the live replica ``edges`` and their variables ``x``, ``z``
    (and tiles ``y``), the makespan ``M`` in ``[m_lo, m_hi]``, ``K`` = max_g k_g and each GPU's ``k``."""

    lib: object
    edges: list
    x: dict
    z: dict
    y: dict
    M: object
    K: object
    k: list
    m_lo: float
    m_hi: float


def _options(problem: DispatchProblem, backend, time_limit, threads, hint, integer_tokens):
    """Step 1: the options checked → ``(adapter class, its kind, integer_tokens, hint)`` (the hint clipped to the
    mask)."""
    if backend not in MILP_BACKENDS:
        raise ValueError(f"milp: unknown backend {backend!r}; valid backends: {list(MILP_BACKENDS)}")
    if (
        isinstance(time_limit, bool)
        or not isinstance(time_limit, int | float | np.number)
        or not 0 < time_limit < math.inf
    ):
        raise ValueError(f"milp: time_limit must be a positive number of seconds, got {time_limit!r}")
    if int(threads) != threads or threads < 1:
        raise ValueError(f"milp: threads must be a positive integer, got {threads!r}")
    cls, kind = _ADAPTERS[backend]
    if integer_tokens is None:
        integer_tokens = cls.integer_only
    if cls.integer_only and not integer_tokens:
        raise ValueError(f"milp: backend {backend!r} only supports integer_tokens=True")
    cost = problem.cost
    if min(cost.b, cost.beta, cost.b2 or 0.0, cost.gamma or 0.0) < 0:
        raise ValueError("milp: the model needs non-negative slopes b, beta, b2, gamma")
    if hint is not None:
        hint = np.asarray(hint, dtype=np.float64)
        Dispatch(hint, problem, "hint").validate()
        hint = np.where(problem.mask, np.maximum(hint, 0.0), 0.0)
    return cls, kind, integer_tokens, hint


def _bounds(problem: DispatchProblem, hint, integer_tokens: bool, integer_only: bool, backend: str) -> _Bounds:
    """Step 2: incumbents, LB / UB and the caps they imply (any solution with M ≤ UB obeys them)."""
    cost, n, D = problem.cost, problem.n, problem.mask.shape[1]
    E = problem.mask.shape[0]
    cands = [(name, x, cost.makespan(x)) for name, x in _incumbents(problem, hint, integer_tokens)]
    fits = [c for c in cands if not integer_tokens or np.all(c[1] == np.round(c[1]))]
    warm = min(fits, key=lambda c: c[2])
    lb, ub = problem_lower_bound(problem), warm[2]
    ub_s = ub * (1 + _SLACK) + _SLACK
    ncap = min([(ub_s - c0) / s for c0, s in ((cost.c, cost.beta), (cost.c2, cost.gamma)) if s] or [math.inf])
    kcap = math.floor((ub_s - cost.a) / cost.b) if cost.b > 0 else E
    if integer_tokens and math.isfinite(ncap):
        ncap = math.floor(ncap)
    coef, S, exact = _coefficients(cost, integer_only, ub)
    _check_size(n, ub_s, S, D, backend)
    return _Bounds(cands, warm, lb, ub_s, ncap, kcap, coef, S, exact)


def _build(problem: DispatchProblem, lib, bd: _Bounds, integer_tokens: bool, integer_only: bool) -> _Model:
    """Steps 3–5: the variables and constraints on live replica edges only (the module's model)."""
    cost, n, mask = problem.cost, problem.n, problem.mask
    D = mask.shape[1]
    live = np.flatnonzero(n > 0)
    coef, S, lb, ub_s = bd.coef, bd.S, bd.lb, bd.ub_s
    # Step 3: variables x, z (and tiles y) on live replica edges only.
    edges = [(int(e), int(g)) for e in live for g in np.flatnonzero(mask[e])]
    x, z, y = {}, {}, {}
    for e, g in edges:
        cap = min(float(n[e]), bd.ncap)
        cap = int(cap) if integer_tokens else cap
        x[e, g] = lib.var(0, cap, integer_tokens)
        z[e, g] = lib.var(0, 1, True)
        lib.add(x[e, g] <= cap * z[e, g])
        if integer_tokens:
            lib.add(x[e, g] >= z[e, g])
        if "b2" in coef:
            ymax = math.ceil(cap / cost.tile)
            y[e, g] = lib.var(0, ymax, True)
            lib.add(cost.tile * y[e, g] >= x[e, g])
            lib.add(y[e, g] >= z[e, g])
            lib.add(y[e, g] <= ymax * z[e, g])
    # Step 4: makespan M in [LB, UB]; conservation; cover Σ_g z_eg ≥ 1; replica-count cuts.
    m_lo = math.floor(S * (lb - 1e-12 * abs(lb)) - 1e-9) if integer_only else lb - 1e-12 * abs(lb)
    m_hi = math.ceil(S * ub_s) if integer_only else ub_s
    M = lib.var(min(m_lo, m_hi), m_hi, integer_only)
    token_pieces = [(coef["c"], coef["beta"])] + ([(coef["c2"], coef["gamma"])] if "c2" in coef else [])
    for e in live:
        gs = np.flatnonzero(mask[e])
        lib.add(lib.sum(x[int(e), int(g)] for g in gs) == (int(n[e]) if integer_only else float(n[e])))
        r_e = lib.sum(z[int(e), int(g)] for g in gs)
        lib.add(r_e >= 1)
        # An expert on r replicas puts ≥ n_e/r tokens on one GPU: M ≥ c + β·n_e/r for integer r, i.e. the secants
        # of this convex function between r = ρ and ρ + 1, ρ(ρ+1)(M − c) ≥ β·n_e·(2ρ + 1 − r). Only hot experts
        # (c + β·n_e/ρ above LB) need them.
        for c0, sl in token_pieces:
            for rho in range(1, gs.size):
                if (c0 + sl * n[e] / rho) / S <= lb:
                    break
                lib.add(rho * (rho + 1) * (M - c0) >= sl * int(n[e]) * (2 * rho + 1) - sl * int(n[e]) * r_e)
    # Step 5: per GPU, k_g = its active experts, K ≥ k_g, and M above each of its cost pieces.
    on_gpu = [[e for e, h in edges if h == g] for g in range(D)]
    k = []
    K = lib.var(0, min(max(map(len, on_gpu)), max(bd.kcap, 0)), True)  # max_g k_g: branching on it is what works
    lib.add(M >= coef["a"] + coef["b"] * K)
    for g in range(D):
        kg = lib.var(0, min(len(on_gpu[g]), max(bd.kcap, 0)), True)
        lib.add(kg == lib.sum(z[e, g] for e in on_gpu[g]))
        lib.add(K >= kg)
        Ng = lib.sum(x[e, g] for e in on_gpu[g])
        Tg = lib.sum(y[e, g] for e in on_gpu[g]) if y else kg
        for piece in _model_pieces(coef, kg, Tg, Ng):
            lib.add(M >= piece)
        k.append(kg)
    return _Model(lib, edges, x, z, y, M, K, k, m_lo, m_hi)


def _warm_start(model: _Model, bd: _Bounds, tile: float) -> list:
    """Step 6: ``(variable, value)`` hints from the best model-feasible incumbent."""
    wx, edges, D = bd.warm[1], model.edges, len(model.k)
    wz = wx > 0
    hints = [(model.x[eg], wx[eg]) for eg in edges] + [(model.z[eg], float(wz[eg])) for eg in edges]
    wy = np.where(wz, np.maximum(1.0, np.ceil(wx / tile - 1e-9)), 0.0)
    hints += [(model.y[eg], wy[eg]) for eg in model.y] + [(model.k[g], float(wz[:, g].sum())) for g in range(D)]
    wm = max(max(_model_pieces(bd.coef, wz[:, g].sum(), wy[:, g].sum(), wx[:, g].sum())) for g in range(D))
    hints.append((model.M, min(max(wm, model.m_lo), model.m_hi)))
    hints.append((model.K, float(wz.sum(axis=0).max())))
    return hints


def _read_back(model: _Model, value, problem: DispatchProblem, integer_tokens: bool) -> np.ndarray | None:
    """Step 8: the solver's ``x [E, D]`` (integers rounded, LP dust on z < ½ dropped, rows re-normalised to n);
    None when it has none or its rows miss n."""
    if value is None:
        return None
    n = problem.n
    live = np.flatnonzero(n > 0)
    xs = np.zeros(problem.mask.shape)
    for e, g in model.edges:
        v = value(model.x[e, g])
        xs[e, g] = 0.0 if value(model.z[e, g]) < 0.5 else max(v, 0.0)
    near = np.abs(xs - np.round(xs)) <= 1e-6 * np.maximum(1.0, xs)  # solver tolerance dust
    xs = np.where(near, np.round(xs), xs)
    if integer_tokens:
        xs = _round_rows(np.round(xs), n)
    rows = xs[live].sum(axis=1)
    xs[live] *= np.where(rows > 0, n[live] / np.where(rows > 0, rows, 1.0), 1.0)[:, None]
    return xs if np.allclose(xs.sum(axis=1), n, rtol=1e-9, atol=1e-9) else None


def _verdict(cands: list, bd: _Bounds, cost: CostModel, integer_tokens: bool, solved) -> tuple:
    """Step 9: the best incumbent (the solver's first: it wins ties), conservative bounds and an honest status
    from ``solved = (proven, limited, has a value, raw bound)`` → ``(x, info fields)``."""
    proven, limited, has_value, raw_bound = solved
    src, xb, obj = min(cands, key=lambda c: c[2])
    mb = raw_bound / bd.S if raw_bound is not None and math.isfinite(raw_bound) else -math.inf
    delta = max(cost.beta, cost.gamma or 0.0) if integer_tokens else 0.0
    bound = max(bd.lb, min(mb - delta, obj))
    optimal = proven and abs(obj - mb) <= OPTIMAL_RTOL * max(abs(obj), 1e-12)  # one definition: solvers.problem
    if optimal:
        status = "optimal"
    elif limited:
        status = "timeout"
    else:  # stopped on its own: with an incumbent of its own "feasible", without one "not_solved"
        status = "feasible" if has_value else "not_solved"
    gap = (obj - bound) / obj if obj > 0 else 0.0
    fields = dict(status=status, objective=obj, bound=bound, model_bound=mb, gap=gap, incumbent=src)
    return xb, fields | {"candidates": {name: mk for name, _, mk in cands}}


def milp(
    problem: DispatchProblem,
    *,
    backend: str = "cp_sat",
    time_limit: float = 10.0,
    threads: int = 1,
    hint=None,
    integer_tokens: bool | None = None,
    deterministic: bool = True,
) -> tuple[np.ndarray, dict]:
    """Solve Problem (3) exactly (or to the time limit) with a MILP / CP-SAT model.

    Args:
      problem: tokens ``[E]`` or ``[Gs, E]``, placement (mask ``[E, D]``) and cost model (non-negative slopes).
      backend: one of `MILP_BACKENDS`: ``cp_sat`` (default), ``scip``, ``highs``, ``cbc`` (pywraplp),
        ``math_opt_highs``, ``math_opt_scip``.
      time_limit: solver time limit in seconds (> 0). Wall clock, except for cp_sat with ``deterministic``.
      threads: solver threads / CP-SAT workers (default 1).
      deterministic: cp_sat only (the default backend): the same call gives the same x on every run. CP-SAT runs
        with a fixed seed, one worker (several: its interleaved, deterministic portfolio, measured 2–13× slower
        wall time than the free-running one on 2 cores, so one is the default) and stops on its deterministic
        clock after ``0.25·time_limit`` units (≈ time_limit seconds of one worker on the 2-core reference box),
        with a wall-clock guard at ``2·time_limit`` (``info["wall_limited"]``: the guard stopped it, and the
        run is not reproducible). False: the previous behaviour (wall-clock limit, free-running workers).
      hint: optional ``[E, D]`` feasible dispatch (e.g. from tempo) used as warm start; it is returned when the
        solver finds nothing better (so is the best cheap heuristic when no hint is given).
      integer_tokens: integer token shares (default: True for cp_sat, which cannot do otherwise; False else).

    Returns:
      ``(x [E, D] float64, info)``. ``info``: ``status`` ("optimal" only when the solver proved its model optimal
      and the recomputed objective is within `solvers.problem.OPTIMAL_RTOL` relative of the unscaled solver
      bound; "timeout" when it stopped at the time limit; "not_solved" when it stopped without a result before
      it; else "feasible"), ``objective`` (``cost.makespan(x)``), ``bound`` (a proven lower
      bound valid for every real-valued dispatch: with integer tokens, the solver bound minus max(β, γ), since
      rounding a dispatch to integers adds < 1 token per GPU; never below `problem_lower_bound`),
      ``model_bound`` (the solver's bound for its own model), ``gap`` ((objective − bound)/objective),
      ``backend``, ``wall_s``, ``solver_status``, ``deterministic``, ``wall_limited`` (see ``deterministic``),
      ``incumbent`` (solver / hint / heuristic name), ``candidates``
      (makespan of each), ``scale`` (S), ``exact_scaling``, ``integer_tokens``. No live expert: zeros, "optimal",
      bound = objective = ``cost.makespan(0)`` (idle GPUs still cost max(a, c)).

    Raises:
      ValueError: unknown backend (lists valid ones), time_limit ≤ 0, threads < 1, a bad hint, negative slopes,
        ``integer_tokens=False`` with cp_sat, a batch too large for exact coefficients (the makespan bound
        × scale × 3·D², or a count, above `MAX_MODEL_MAGNITUDE`: 2^60 for cp_sat, 1e15 for the others; with the
        presets and D = 8 about 1e12 and 1e10 tokens): use ``tempo`` there.
      RuntimeError: the solver called the model infeasible / invalid (a modelling bug).
    """
    t0 = time.perf_counter()
    cls, kind, integer_tokens, hint = _options(problem, backend, time_limit, threads, hint, integer_tokens)  # Step 1
    cost, n, mask = problem.cost, problem.n, problem.mask
    info = {"backend": backend, "integer_tokens": bool(integer_tokens)}
    if not np.any(n > 0):
        x = np.zeros(mask.shape)
        obj = cost.makespan(x)
        info.update(status="optimal", objective=obj, bound=obj, model_bound=obj, gap=0.0, solver_status="EMPTY")
        return x, {**info, "incumbent": "empty", "scale": 1.0, "wall_s": time.perf_counter() - t0}
    bd = _bounds(problem, hint, integer_tokens, cls.integer_only, backend)  # Step 2
    model = _build(problem, cls(kind), bd, integer_tokens, cls.integer_only)  # Steps 3-5
    hints = _warm_start(model, bd, cost.tile)  # Step 6
    # Step 7: solve.
    name, proven, limited, value, raw_bound = model.lib.solve(model.M, hints, time_limit, threads, bool(deterministic))
    info.update(solver_status=name, scale=bd.S, exact_scaling=bd.exact, num_vars=len(hints))
    info["deterministic"] = bool(deterministic) and backend == "cp_sat"
    info["wall_limited"] = bool(getattr(model.lib, "wall_limited", False))
    if value is None and name in ("INFEASIBLE", "MODEL_INVALID", "UNBOUNDED", "INFEASIBLE_OR_UNBOUNDED"):
        raise RuntimeError(f"milp[{backend}]: solver status {name} on a feasible problem (modelling bug)")
    xs = _read_back(model, value, problem, integer_tokens)  # Step 8
    cands = ([("solver", xs, cost.makespan(xs))] if xs is not None else []) + bd.cands
    xb, fields = _verdict(cands, bd, cost, integer_tokens, (proven, limited, value is not None, raw_bound))  # Step 9
    info.update(fields)
    return xb.astype(np.float64), {**info, "wall_s": time.perf_counter() - t0}


def partition_instance(values, T: float = 100.0) -> DispatchProblem:
    """Theorem 1's reduction of balanced PARTITION to Problem (3).

    m items (m even) with integer values w → m experts with n_e = w_e on 2 fully replicated GPUs, a = c = 0,
    b = T/(m/2), β = T/W with W = Σw/2. The optimum is ≤ T exactly when the items split into two halves of m/2
    items summing to W each (any split adds an activation, so both GPUs take m/2 whole experts and W tokens).
    """
    w = np.asarray(values)
    m = w.shape[0] if w.ndim == 1 else 0
    if m < 2 or m % 2 or np.any(w <= 0) or np.any(w != np.round(w)):
        raise ValueError(f"partition_instance: need an even number m ≥ 2 of positive integer values, got {values!r}")
    W = float(w.sum()) / 2
    cost = CostModel(a=0.0, b=T / (m / 2), c=0.0, beta=T / W, source=f"Theorem 1 PARTITION reduction, T={T}")
    return DispatchProblem(w.astype(np.float64), Placement.full(m, 2), cost)
