"""The refresher (TEMPO §4.4): the serving-process side that feeds the solver.

The MoE layer keeps a cumulative per-(source rank, expert) pair counter ``[D, E]`` uint32 that wraps modulo
2^32 (`pallas_kernels.dispatch`). `Refresher` snapshots it every ``period_s`` seconds on a background thread
(the paper's 200 ms) or every ``every_steps`` steps on the serving thread and hands each snapshot to a
`DispatchController`, which differences it into a window (`tempo_jax.runtime.counters.CounterWindows`), solves it
(in a worker process in the paper's deployment) and publishes tables the layer picks up at its next step.

    ctl = DispatchController(placement, cost, solver_mode="process")
    refresher = Refresher(ctl, lambda: host_counter(state.counter), period_s=0.2).start()
    for step in ...:
        out = layer(..., tables=ctl.latest, counter=state.counter); state.counter = out.counter
    refresher.stop(); ctl.close()
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import numpy as np

from solvers.checks import check_int, check_real

__all__ = ["Refresher"]

log = logging.getLogger("tempo_jax.runtime")


class Refresher:
    """Feeds a `DispatchController` from a cumulative counter: by time on a background thread, or by steps.

    Args:
      controller: a `tempo_jax.DispatchController` (any mode).
      read_counter: returns the current cumulative counter ``[D, E]`` (uint32; numpy or jax).
      period_s: snapshot period of the background thread (default 0.2 s, the paper's refresh period).
      every_steps: snapshot every this many calls of `step` instead (on the calling thread; no background
        thread). Use it when snapshots must line up with steps (multi-process gathers, reproducible tests).
    """

    def __init__(
        self, controller, read_counter: Callable[[], object], *, period_s: float = 0.2, every_steps: int | None = None
    ):
        if not callable(read_counter):
            raise ValueError(f"Refresher: read_counter must be a callable returning the counter, got {read_counter!r}")
        self.controller = controller
        self.read_counter = read_counter
        self.period_s = check_real("period_s", period_s, minimum=0, strict=True, where="Refresher")
        self.every_steps = None if every_steps is None else check_int("every_steps", every_steps, where="Refresher")
        self.snapshots = 0
        self.errors = 0
        self.last_error: str | None = None
        self.snapshot_ms: list[float] = []
        self._steps = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Refresher:
        """Start the background thread (period mode; nothing to start in step mode)."""
        if self.every_steps is None and self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="tempo-refresher", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10.0)
            self._thread = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def step(self) -> None:
        """Call once per serving step: snapshots every ``every_steps`` steps in step mode; a no-op otherwise."""
        self._steps += 1
        if self.every_steps is not None and self._steps % self.every_steps == 0:
            self.refresh()

    def refresh(self) -> None:
        """One snapshot → window → controller, now. Errors are logged and counted, never raised (the serving
        loop must not die of a refresher fault); the controller counts its own faults."""
        t0 = time.perf_counter()
        try:
            snap = self.read_counter()
            self.snapshot_ms.append((time.perf_counter() - t0) * 1e3)
            self.controller.observe_counter(snap)
            self.snapshots += 1
        except Exception as err:
            self.errors += 1
            self.last_error = f"{type(err).__name__}: {err}"
            log.warning("refresher: snapshot failed (%s)", self.last_error)

    def _run(self) -> None:
        next_t = time.monotonic() + self.period_s
        while not self._stop.wait(max(0.0, next_t - time.monotonic())):
            self.refresh()
            self.controller.tick()
            next_t += self.period_s
            if next_t < time.monotonic():  # fell behind (a slow snapshot): skip, never burst
                next_t = time.monotonic() + self.period_s

    def metrics(self) -> dict:
        s = np.asarray(self.snapshot_ms[-1000:])
        return {
            "snapshots": self.snapshots,
            "errors": self.errors,
            "last_error": self.last_error,
            "snapshot_ms_p50": float(np.median(s)) if s.size else None,
            "mode": "steps" if self.every_steps is not None else "period",
            "period_s": self.period_s,
            "every_steps": self.every_steps,
        }
