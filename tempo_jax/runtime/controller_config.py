"""`ControllerConfig`: how a `tempo_jax.runtime.DispatchController` solves and publishes, checked once when built.

The controller's knobs as one frozen value (`ServeConfig.controller` builds it from a serving run's options, so a
serving run's controller is checked when its `ServeConfig` is): what the placement and cost model do not decide.
"""

from __future__ import annotations

import dataclasses

from solvers.checks import ArgTypeError, check_choice, check_int, check_real
from solvers.solve import check_policy

from .backends import SOLVER_MODES
from .publisher import FALLBACKS

__all__ = ["ControllerConfig"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ControllerConfig:
    """A `DispatchController`'s settings (every one checked here; the placement-dependent checks are the
    controller's).

    Attributes:
      policy: a `solvers.POLICIES` name.
      window: steps (observe calls) per solve.
      options: policy options (e.g. ``{"tau": 0.0}``); checked against the policy's signature.
      solver_mode: ``"inline"``, ``"thread"`` or ``"process"`` (`SOLVER_MODES`; see `tempo_jax.runtime.controller`).
      per_node: one table per source node via the topology-aware split.
      budget_s: a solve whose result arrives later than this after submission is not published.
      hang_s: no result after this long = a hung solver (None: ``max(10 · budget_s, 5 s)``; at least ``budget_s``).
      staleness_s: publish the ``fallback`` tables when the published tables' data are older than this
        (None: never); checked at every `observe`, `tick`, `wait` and `metrics` call.
      fallback: ``"uniform"`` or ``"static"``.
      max_window_pairs: counter differences at or above this mean a restart (see `CounterWindows`).
      history_size: solves and latencies kept for `history` and the metrics.
      worker_start_timeout_s: process mode: how long a worker (re)start may take.
      spare_worker: process mode: keep a second worker started and idle, so a restart is a swap (a fresh
        interpreter importing scipy and ortools takes a second or more); a new spare starts in the background.
      solver_processes: process mode with one placement per layer: the worker splits every window's layers over
        this many solver processes (1: it solves them in turn).
      rebalance_every: propose a new EPLB placement every this many windows (`proposal`; None: never).
    """

    policy: str = "tempo"
    window: int = 1
    options: dict | None = None
    solver_mode: str = "inline"
    per_node: bool = False
    budget_s: float = 1.0
    hang_s: float | None = None
    staleness_s: float | None = None
    fallback: str = "uniform"
    max_window_pairs: int = 1 << 31
    history_size: int = 1000
    worker_start_timeout_s: float = 120.0
    spare_worker: bool = True
    solver_processes: int = 1
    rebalance_every: int | None = None

    def __post_init__(self) -> None:
        where = "ControllerConfig"
        # the policy's options as the policy reads them (unknown or ill-typed options refused)
        object.__setattr__(self, "options", check_policy(self.policy, self.options))
        check_int("window", self.window, where=where)
        if not isinstance(self.per_node, bool):
            raise ValueError(f"{where}: per_node must be a boolean, got {self.per_node!r}")
        check_choice("solver_mode", self.solver_mode, SOLVER_MODES, where=where)
        check_real("budget_s", self.budget_s, minimum=0, strict=True, where=where)
        if self.hang_s is not None:
            check_real("hang_s", self.hang_s, minimum=self.budget_s, where=where)
        if self.staleness_s is not None:
            check_real("staleness_s", self.staleness_s, minimum=0, strict=True, where=where)
        check_choice("fallback", self.fallback, FALLBACKS, where=where)
        check_int("history_size", self.history_size, where=where)
        check_int("solver_processes", self.solver_processes, where=where)
        if self.rebalance_every is not None:
            check_int("rebalance_every", self.rebalance_every, where=where)

    @property
    def hang_limit_s(self) -> float:
        """The hung-solver limit in force: ``hang_s``, or ``max(10 · budget_s, 5 s)``."""
        return max(10 * self.budget_s, 5.0) if self.hang_s is None else self.hang_s

    @classmethod
    def of(cls, settings: ControllerConfig | None, options: dict) -> ControllerConfig:
        """``settings`` with ``options`` (keyword arguments of `DispatchController`) applied; an unknown one is an
        `ArgTypeError` (a TypeError, as a misspelt keyword is) naming the valid ones."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - names)
        if unknown:
            raise ArgTypeError(
                f"DispatchController: unknown option(s) {unknown}; valid: {sorted(names)} (`ControllerConfig`)"
            )
        if settings is None:
            return cls(**options)
        if not isinstance(settings, cls):
            raise ArgTypeError(
                f"DispatchController: settings must be a ControllerConfig, got {type(settings).__name__}"
            )
        return dataclasses.replace(settings, **options) if options else settings
