"""Counter windows and the refresher (TEMPO §4.4): the serving-process side that feeds the solver.

The MoE layer keeps a cumulative per-(source rank, expert) pair counter ``[D, E]`` uint32 that wraps modulo
2^32 (`pallas_kernels.dispatch`). `CounterWindows` turns snapshots of it into count windows by wrap-safe
differencing and detects counters that restarted; `Refresher` snapshots the counter every ``period_s``
seconds on a background thread (the paper's 200 ms) or every ``every_steps`` steps on the serving thread, and
hands each window to a `DispatchController`, which solves it (in a worker process in the paper's deployment)
and publishes tables the layer picks up at its next step.

    ctl = DispatchController(placement, cost, mode="process")
    refresher = Refresher(ctl, lambda: host_counter(state.counter), period_s=0.2).start()
    for step in ...:
        out = layer(..., tables=ctl.latest, counter=state.counter); state.counter = out.counter
    refresher.stop(); ctl.close()

Glossary: D ranks (source rows of the counter), E logical experts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import numpy as np

from solvers.checks import check_int, check_real

__all__ = ["COUNTER_RANGE", "CounterWindows", "Refresher", "host_counter"]

log = logging.getLogger("tempo_jax.runtime")

#: Counters are uint32: differences are taken modulo this.
COUNTER_RANGE = 1 << 32


class CounterWindows:
    """Wrap-safe differencing of cumulative ``[D, E]`` uint32 counter snapshots into windows.

    The first snapshot is a baseline (no window: the counter may have run for a long time before the refresher
    started). A later snapshot gives ``(now − before) mod 2^32`` per entry: exact across a wrap as long as fewer
    than ``max_window_pairs`` pairs hit one entry between snapshots. An entry whose difference is at least
    ``max_window_pairs`` (by default 2^31: the counter went *down*) means its source row restarted from zero
    (a restarted rank or a re-created layer); that row's window is its current value, the pairs counted since
    the restart. A restart that lands above the old value cannot be told from traffic: keep snapshots frequent.

    Snapshots must be fed in the order they were taken (one refresher).
    """

    def __init__(self, max_window_pairs: int = 1 << 31):
        self.max_window_pairs = check_int("max_window_pairs", max_window_pairs, where="CounterWindows")
        if self.max_window_pairs >= COUNTER_RANGE:
            raise ValueError(f"CounterWindows: max_window_pairs must be < 2^32, got {max_window_pairs}")
        self.before: np.ndarray | None = None

    def diff(self, now: np.ndarray) -> tuple[np.ndarray | None, dict]:
        """``(window [D, E] int64 | None, notes)``; notes: ``baseline`` (bool), ``wrapped`` (entries that wrapped),
        ``restarted_rows`` (list of source rows that restarted)."""
        now = np.asarray(now, dtype=np.uint32)
        if self.before is None or self.before.shape != now.shape:
            self.before = now.copy()
            return None, {"baseline": True, "wrapped": 0, "restarted_rows": []}
        before, self.before = self.before, now.copy()
        delta = (now.astype(np.int64) - before.astype(np.int64)) % COUNTER_RANGE
        restarted = (delta >= self.max_window_pairs).any(axis=1)
        delta[restarted] = now[restarted]
        wrapped = int(((now < before) & ~restarted[:, None]).sum())
        return delta, {"baseline": False, "wrapped": wrapped, "restarted_rows": np.flatnonzero(restarted).tolist()}

    def reset(self) -> None:
        """Forget the baseline: the next snapshot is a new baseline."""
        self.before = None


def host_counter(counter) -> np.ndarray:
    """A counter ``[D, E]`` on the host. A jax array spread over several processes is gathered with
    ``multihost_utils.process_allgather`` (a collective: every process must call it at the same step, so use a
    step-driven refresher there); otherwise one device → host copy."""
    try:
        import jax
    except ImportError:  # pragma: no cover - numpy-only callers
        return np.asarray(counter)
    if isinstance(counter, jax.Array) and not counter.is_fully_addressable:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(counter, tiled=True))
    return np.asarray(counter)


class Refresher:
    """Feeds a `DispatchController` from a cumulative counter: by time on a background thread, or by steps.

    Args:
      controller: a `tempo_jax.DispatchController` (any mode).
      read_counter: returns the current cumulative counter ``[D, E]`` (uint32; numpy or jax).
      period_s: snapshot period of the background thread (default 0.2 s, the paper's refresh period).
      every_steps: snapshot every this many calls of `step` instead (on the calling thread; no background
        thread). Use it when snapshots must line up with steps (multi-process gathers, reproducible tests).
    """

    def __init__(self, controller, read_counter: Callable[[], object], *, period_s: float = 0.2,
                 every_steps: int | None = None):  # fmt: skip
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
