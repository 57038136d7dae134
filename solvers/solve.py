"""`solve(problem, policy, **options)`: one entry point over every dispatch policy."""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable
from numbers import Integral, Real

import numpy as np

from . import policies
from .checks import ArgTypeError, check_instance
from .milp import milp
from .problem import Dispatch, DispatchProblem
from .relief import relief_policy
from .tempo_fast import tempo_fast

__all__ = ["POLICIES", "SWEEP_POLICIES", "check_policy", "solve"]

# name → function(problem, **options) returning x [E, D] or (x, info).
POLICIES: dict[str, Callable] = {
    "static": policies.static,
    "uniform": policies.uniform,
    "token_lp": policies.token_lp,
    "metro": policies.metro,
    "llep": policies.llep,
    "round_robin": policies.round_robin,
    "tempo": tempo_fast,
    "relief": relief_policy,
    "milp": milp,
}
#: The policies a sweep solves on every batch, in `POLICIES` order: all of them but ``round_robin`` (A3: needs every
#: expert on every rank), ``relief`` (the in-graph dispatch's numpy twin, timed by its own bench) and ``milp`` (the
#: exact yardstick, seconds per batch). A policy added to `POLICIES` joins every sweep, demo and bench that reads this.
SWEEP_POLICIES: tuple[str, ...] = tuple(p for p in POLICIES if p not in ("round_robin", "relief", "milp"))


@functools.cache
def _signature(policy: str) -> inspect.Signature:
    """The policy function's signature (cached: every solve of the runtime checks its options)."""
    return inspect.signature(POLICIES[policy])


def _options_of(policy: str) -> list[str]:
    params = _signature(policy).parameters.values()
    return [p.name for p in params if p.kind == p.KEYWORD_ONLY or (p.default is not p.empty and p.name != "problem")]


# Annotation words of policy options → the Python types they accept (bool is not a number here).
_ACCEPTS = {"bool": (bool, np.bool_), "int": (Integral,), "float": (Real,), "str": (str,), "None": (type(None),)}


def _check_option_types(policy: str, options: dict) -> None:
    """ArgTypeError for an option whose value does not match its annotation (``tau: float`` gets ``"x"``)."""
    params = _signature(policy).parameters
    for name, value in options.items():
        words = [w.strip() for w in str(params[name].annotation).split("|")]
        if not words or any(w not in _ACCEPTS for w in words):
            continue  # unannotated or structured (arrays): the policy checks it
        is_bool = isinstance(value, bool | np.bool_)  # a bool is not a number here
        ok = ("bool" in words) if is_bool else any(isinstance(value, _ACCEPTS[w]) for w in words)
        if not ok:
            raise ArgTypeError(
                f"solve: option {name} of policy {policy!r} must be {' or '.join(words)}, "
                f"got {value!r} ({type(value).__name__})"
            )


def check_policy(policy: str, options: dict | None = None) -> dict:
    """``options`` as a dict if ``policy`` is one of `POLICIES` and every option is one it takes, of the type
    its annotation names.

    Raises:
      ValueError: unknown policy or option (the message lists the valid ones).
      ArgTypeError: a policy that is not a string, options that are not a dict, an option of the wrong type.
    """
    if not isinstance(policy, str) or policy not in POLICIES:
        err = ValueError if isinstance(policy, str) else ArgTypeError
        raise err(f"unknown policy {policy!r}; valid policies: {sorted(POLICIES)}")
    if options is not None and not isinstance(options, dict):
        raise ArgTypeError(f"options must be a dict of policy options, got {type(options).__name__}")
    options = dict(options or {})
    valid = _options_of(policy)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for policy {policy!r}; valid options: {valid}")
    _check_option_types(policy, options)
    return options


def solve(problem: DispatchProblem, policy: str = "tempo", **options) -> Dispatch:
    """Dispatch one batch with a named policy.

    Args:
      problem: tokens ``[E]`` or ``[Gs, E]``, placement and cost model.
      policy: one of `POLICIES` (static, uniform, token_lp, metro, llep, round_robin, tempo, relief, milp).
      **options: policy options (e.g. ``tile_aware``, ``tau`` for tempo; ``backend``, ``time_limit`` for milp).

    Returns:
      A validated `Dispatch` whose ``info`` holds ``solve_time_s`` (and solver details).

    Raises:
      ValueError: unknown policy or option (the message lists the valid ones), an option value out of range.
      ArgTypeError (a TypeError): a problem that is not a `DispatchProblem`, an option of the wrong type.
    """
    check_instance("problem", problem, DispatchProblem, where="solve", hint="build one with DispatchProblem(...)")
    check_policy(policy, options)
    t0 = time.perf_counter()
    out = POLICIES[policy](problem, **options)
    elapsed = time.perf_counter() - t0
    x, info = out if isinstance(out, tuple) else (out, {})
    info = {**info, "solve_time_s": elapsed}
    return Dispatch(x, problem, policy, info).validate()
