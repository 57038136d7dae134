"""`solve(problem, policy, **options)`: one entry point over every dispatch policy."""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable

from . import policies
from .milp import milp
from .problem import Dispatch, DispatchProblem
from .tempo_fast import tempo_fast

__all__ = ["POLICIES", "check_policy", "solve"]

# name → function(problem, **options) returning x [E, D] or (x, info).
POLICIES: dict[str, Callable] = {
    "static": policies.static,
    "uniform": policies.uniform,
    "token_lp": policies.token_lp,
    "metro": policies.metro,
    "llep": policies.llep,
    "round_robin": policies.round_robin,
    "tempo": tempo_fast,
    "milp": milp,
}


def _options_of(policy: str) -> list[str]:
    params = inspect.signature(POLICIES[policy]).parameters.values()
    return [p.name for p in params if p.kind == p.KEYWORD_ONLY or (p.default is not p.empty and p.name != "problem")]


def check_policy(policy: str, options: dict | None = None) -> dict:
    """``options`` as a dict if ``policy`` is one of `POLICIES` and every option is one it takes.

    Raises:
      ValueError: unknown policy or option (the message lists the valid ones).
    """
    if not isinstance(policy, str) or policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; valid policies: {sorted(POLICIES)}")
    if options is not None and not isinstance(options, dict):
        raise ValueError(f"options must be a dict of policy options, got {type(options).__name__}")
    options = dict(options or {})
    valid = _options_of(policy)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for policy {policy!r}; valid options: {valid}")
    return options


def solve(problem: DispatchProblem, policy: str = "tempo", **options) -> Dispatch:
    """Dispatch one batch with a named policy.

    Args:
      problem: tokens ``[E]`` or ``[Gs, E]``, placement and cost model.
      policy: one of `POLICIES` (static, uniform, token_lp, metro, llep, round_robin, tempo, milp).
      **options: policy options (e.g. ``tile_aware``, ``tau`` for tempo; ``backend``, ``time_limit`` for milp).

    Returns:
      A validated `Dispatch` whose ``info`` holds ``solve_time_s`` (and solver details).

    Raises:
      ValueError: unknown policy or option (the message lists the valid ones).
    """
    if not isinstance(problem, DispatchProblem):
        raise ValueError(f"solve: expected a solvers.DispatchProblem, got {type(problem).__name__}")
    check_policy(policy, options)
    t0 = time.perf_counter()
    out = POLICIES[policy](problem, **options)
    elapsed = time.perf_counter() - t0
    x, info = out if isinstance(out, tuple) else (out, {})
    info = {**info, "solve_time_s": elapsed}
    return Dispatch(x, problem, policy, info).validate()
