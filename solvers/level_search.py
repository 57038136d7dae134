"""Exact search at one activation level (beyond the paper): the flexible experts' subproblem on CP-SAT.

When tempo_fast's heuristic sits one activation level above its certified bound, the question left is
combinatorial and small: can the experts with a choice of rank (the flexible ones; EPLB leaves most experts on a
single rank) be cut into pieces and placed so that every rank holds at most k activations, and how few tokens
can the fullest rank then hold? Forced experts are constants, so the model has one boolean and one integer per
(flexible expert, usable replica rank) pair — tens to a few hundred — and CP-SAT answers in milliseconds
where local moves and pattern repair stall (a 3% gap on DeepSeek-V3 EP8 B = 512 batches) or where no cheap
argument proves the heuristic optimal.

Model for level k and token cap C (µs → tokens via the cost model's token pieces), over pairs (e, g) of a
flexible expert e and a replica rank g with a spare activation (``A_g = k − F_g > 0``, F_g forced experts on g):

    z_eg ∈ {0, 1},  x_eg ∈ ℤ,  z_eg ≤ x_eg ≤ min(n_e, R_g)·z_eg,  Σ_g x_eg = n_e,  Σ_e z_eg ≤ A_g,
    Φ_g + Σ_e x_eg ≤ Nmax ≤ ⌈C⌉,   minimise Nmax          (Φ_g: forced tokens on g, R_g = ⌈C − Φ_g⌉)

Integer tokens with rooms rounded up make the model a relaxation of real-valued shares within one token (a
feasible fractional dispatch rounds to an integer one with every rank at most ⌈its load⌉): so INFEASIBLE
proves that no dispatch at level k holds at most C tokens per rank, and a proven minimum Nmax proves the level's
best token load is above Nmax − 1. The search is deterministic (one worker, fixed seed, a limit on CP-SAT's
deterministic clock). numpy + ortools.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .problem import DispatchProblem

__all__ = ["LevelResult", "level_search"]


class LevelResult(NamedTuple):
    """Outcome of `level_search`.

    Attributes:
      status: ``feasible`` (a dispatch within the cap), ``optimal`` (with ``minimise``: Nmax proven minimal),
        ``infeasible`` (no dispatch at this level within the cap), ``unknown`` (limit reached first) or
        ``skipped`` (too large).
      x: ``[E, D]`` float64 integer dispatch at level k (None unless optimal / feasible).
      tokens: the fullest rank's tokens in ``x`` (Nmax), or nan.
      tokens_bound: a proven lower bound on the fullest rank's tokens of any real-valued dispatch at level k:
        Nmax − 1 when optimal, the cap when infeasible (none holds ≤ cap), else −inf.
    """

    status: str
    x: np.ndarray | None
    tokens: float
    tokens_bound: float


def level_search(
    problem: DispatchProblem,
    k: int,
    cap: float,
    *,
    hint: np.ndarray | None = None,
    minimise: bool = False,
    round_up: bool = True,
    work_limit: float = 0.2,
    wall_limit: float = math.inf,
    max_pairs: int = 800,
) -> LevelResult:
    """A dispatch with at most k activations and at most ``cap`` tokens per rank, or a proof that none exists;
    with ``minimise``, the fewest tokens on the fullest rank at that level (see the module).

    Args:
      problem: the dispatch problem (integer token counts).
      k: the activation level (each rank holds at most k activated experts).
      cap: token cap per rank (real; e.g. the token cap of the next level's time).
      hint: an ``[E, D]`` dispatch to warm-start from (its flexible shares; any level).
      minimise: minimise the fullest rank's tokens (else stop at the first dispatch within the cap).
      round_up: rooms rounded up (``⌈C − Φ_g⌉``: INFEASIBLE is then a proof for real-valued shares, and a dispatch
        found may exceed the cap by less than a token); False rounds the cap down (a dispatch found meets it,
        INFEASIBLE only rules out integer shares, and ``tokens_bound`` is −inf).
      work_limit: CP-SAT deterministic time limit (its work units, about 4 wall seconds each on the reference box).
      wall_limit: wall-clock guard in seconds (a time budget); hitting it first makes the run time-dependent.
      max_pairs: skip (status ``skipped``) when there are more (expert, rank) pairs than this.

    Returns:
      A `LevelResult`.
    """
    from ortools.sat.python import cp_model

    n, sole, mask = problem.n, problem.placement.sole_gpu, problem.mask
    E, D = mask.shape
    if not math.isfinite(cap):
        return LevelResult("skipped", None, math.nan, -math.inf)
    live = n > 0
    forced = np.flatnonzero(live & (sole >= 0))
    flex = np.flatnonzero(live & (sole < 0))
    spare = k - np.bincount(sole[forced], minlength=D)
    phi = np.round(np.bincount(sole[forced], weights=n[forced], minlength=D)).astype(np.int64)
    top = math.ceil(cap - 1e-9) if round_up else math.floor(cap + 1e-9)
    # Step 1: forced loads alone decide some cases.
    proof = cap if round_up else -math.inf
    if (spare < 0).any() or phi.max(initial=0) > top:
        return LevelResult("infeasible", None, math.nan, proof)
    ee, gg = np.nonzero(mask[flex] & (spare > 0)[None, :] & (phi < top)[None, :])
    if ee.size > max_pairs:
        return LevelResult("skipped", None, math.nan, -math.inf)
    nf = np.round(n[flex]).astype(np.int64)
    if np.bincount(ee, minlength=flex.size).min(initial=1) == 0:
        return LevelResult("infeasible", None, math.nan, proof)  # a flexible expert has no usable rank
    # Step 2: the model.
    m = cp_model.CpModel()
    room = top - phi
    z = [m.new_bool_var("") for _ in range(ee.size)]
    x = [m.new_int_var(0, int(min(nf[e], room[g])), "") for e, g in zip(ee.tolist(), gg.tolist(), strict=True)]
    nmax = m.new_int_var(int(phi.max(initial=0)), top, "")
    for i, (e, g) in enumerate(zip(ee.tolist(), gg.tolist(), strict=True)):
        m.add(x[i] <= int(min(nf[e], room[g])) * z[i])
        m.add(x[i] >= z[i])
    for e in range(flex.size):
        m.add(sum(x[i] for i in np.flatnonzero(ee == e).tolist()) == int(nf[e]))
    for g in range(D):
        idx = np.flatnonzero(gg == g).tolist()
        if idx:
            m.add(sum(z[i] for i in idx) <= int(spare[g]))
            m.add(int(phi[g]) + sum(x[i] for i in idx) <= nmax)
    if minimise:
        m.minimize(nmax)
    if hint is not None:
        h = np.asarray(hint)[flex[ee], gg]
        for i, v in enumerate(h.tolist()):
            m.add_hint(x[i], int(round(min(v, nf[ee[i]], room[gg[i]]))))
            m.add_hint(z[i], int(v > 0.5))
    # Step 3: solve, deterministically.
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = 0
    solver.parameters.max_deterministic_time = float(work_limit)
    solver.parameters.stop_after_first_solution = not minimise
    if math.isfinite(wall_limit):
        solver.parameters.max_time_in_seconds = max(float(wall_limit), 1e-3)
    status = solver.solve(m)
    if status == cp_model.INFEASIBLE:
        return LevelResult("infeasible", None, math.nan, proof)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return LevelResult("unknown", None, math.nan, -math.inf)
    out = np.zeros((E, D))
    out[forced, sole[forced]] = n[forced]
    out[flex[ee], gg] = [solver.value(v) for v in x]
    tokens = float(out.sum(axis=0).max())
    if status == cp_model.OPTIMAL and minimise:
        return LevelResult("optimal", out, tokens, tokens - 1.0 if round_up else -math.inf)
    return LevelResult("feasible", out, tokens, -math.inf)
