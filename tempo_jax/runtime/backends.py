"""Where the dispatch runtime's solves run: one `SolverBackend` protocol, three implementations.

- `InlineBackend` (``solver_mode="inline"``): in the calling thread; `submit` returns once the result is in.
- `ThreadBackend` (``"thread"``): on a helper thread of this process (it shares the GIL with JAX's host work); a
  solve older than ``hang_s`` is abandoned and its late result ignored.
- `ProcessBackend` (``"process"``, the paper's deployment): a `solvers.worker.SolverWorker` process that imports
  numpy, scipy, OR-Tools and `solvers` only, plus an idle spare; a supervisor thread collects results, notices
  a dead or hung worker, swaps in the spare (or starts a fresh worker) and starts a new spare.

Every backend solves with `solvers.worker.solve_window` and reports to its host through the small public
`BackendHost` protocol (the `DispatchController` hands each backend one): ``host.finish(job, weights, info)`` for a
result (without holding the lock), ``host.lose_inflight(kind, message)`` (under ``host.lock``) when the solver
holding the in-flight job is gone, ``host.event(kind, message)`` for a fault, ``host.count(name)`` for a counter.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Protocol

from solvers.checks import check_choice
from solvers.worker import FAULTS, SolverWorker, WorkerConfig, WorkerLost, solve_window

from .accumulator import Window

__all__ = [
    "SOLVER_MODES",
    "BackendHost",
    "InlineBackend",
    "Job",
    "ProcessBackend",
    "SolverBackend",
    "ThreadBackend",
    "make_backend",
]


class BackendHost(Protocol):
    """What a backend may use of its host (the `DispatchController`'s side of the seam)."""

    lock: threading.RLock  # guards the host's in-flight job and counters
    log: object  # a `logging.Logger`

    @property
    def inflight(self) -> Job | None: ...  # the job a solver holds now (read under ``lock``)

    @property
    def closed(self) -> bool: ...

    def finish(self, job: Job, weights, info: dict) -> None: ...  # a result (or ``{"error": ...}``) arrived

    def lose_inflight(self, kind: str, message: str) -> None: ...  # under ``lock``: the solver is gone

    def event(self, kind: str, message: str) -> None: ...  # a fault, logged and recorded

    def count(self, name: str) -> None: ...  # under ``lock``: one more ``restarts`` / ``late_results``

    def check_runtime(self) -> None: ...  # the supervisor's periodic check (staleness, hangs)


@dataclass
class Job:
    """A window handed to a backend: sequence number, restart generation, submit time, an injected fault, and the
    window's number among all closed windows (what `DispatchController.metrics` ``age_windows`` counts from)."""

    seq: int
    gen: int
    window: Window
    submitted_at: float
    fault: tuple[str, float] | None = None
    window_no: int = 0

    @property
    def pairs(self) -> float:
        return self.window.pairs


class SolverBackend(Protocol):
    """What the controller needs from wherever solves run."""

    name: str

    @property
    def ready(self) -> bool:
        """Whether a solve can be submitted now (a process backend restarting its worker is not ready)."""

    def start(self) -> None:
        """Start background work (the process backend's supervisor); called once the host holds the backend."""

    def submit(self, job: Job) -> BaseException | None:
        """Start solving ``job``; the result reaches ``host.finish``. Inline: returns what the solver raised."""

    def check(self, now: float) -> None:
        """Housekeeping: notice a hung solve."""

    def inject(self, kind: str, seconds: float) -> None:
        """Make the next solve fail as ``kind`` (`solvers.worker.FAULTS`)."""

    def close(self) -> None:
        """Stop whatever runs solves (idempotent)."""

    def reconfigure(self, config: WorkerConfig) -> None:
        """Solve the next windows with ``config`` (a new placement; the host dropped the in-flight job)."""


class InlineBackend:
    """Solves in the calling thread."""

    name = "inline"

    def __init__(self, config: WorkerConfig, host, *, hang_s: float):
        self.config, self.host, self.hang_s = config, host, hang_s
        self._fault: tuple[str, float] | None = None

    @property
    def ready(self) -> bool:
        return True

    def start(self) -> None:
        return None

    def _take_fault(self):
        fault, self._fault = self._fault, None
        return fault

    def _run(self, job: Job, fault) -> BaseException | None:
        try:
            weights, info = solve_window(self.config, job.window.counts, fault)
        except Exception as err:
            self.host.finish(job, None, {"error": f"{type(err).__name__}: {err}"})
            return err
        self.host.finish(job, weights, info)
        return None

    def submit(self, job: Job) -> BaseException | None:
        return self._run(job, self._take_fault())

    def check(self, now: float) -> None:
        pass

    def inject(self, kind: str, seconds: float) -> None:
        if kind == "exit":
            raise ValueError(
                f"DispatchController.inject_fault: 'exit' needs solver_mode='process' (it would end "
                f"this process), not {self.name!r}"
            )
        self._fault = (kind, float(seconds))

    def close(self) -> None:
        pass

    def reconfigure(self, config: WorkerConfig) -> None:
        self.config = config


class ThreadBackend(InlineBackend):
    """Solves on a helper thread; a solve older than ``hang_s`` is abandoned (its late result is ignored)."""

    name = "thread"

    def submit(self, job: Job) -> None:
        fault = self._take_fault()
        threading.Thread(target=self._run, args=(job, fault), name="tempo-solve", daemon=True).start()
        return None

    def check(self, now: float) -> None:
        host = self.host
        with host.lock:
            job = host.inflight
            if job is not None and now - job.submitted_at > self.hang_s:
                host.lose_inflight("hung", f"no result after {self.hang_s:g} s: the solver thread is abandoned")
                host.count("restarts")


class ProcessBackend:
    """Solves in a worker process with an idle spare; a supervisor thread collects results and restarts."""

    name = "process"

    def __init__(self, config: WorkerConfig, host, *, hang_s: float, start_timeout_s: float, spare: bool):
        self.config, self.host, self.hang_s = config, host, hang_s
        self._start_timeout_s = start_timeout_s
        self._want_spare = bool(spare)
        self._spare: SolverWorker | None = None
        self._probe_event = threading.Event()
        self._probe_reply: dict | None = None
        self.worker = SolverWorker(config, start_timeout_s=start_timeout_s).start()
        self._ready = True
        self._start_spare()
        self._supervisor = threading.Thread(target=self._supervise, name="tempo-supervisor", daemon=True)

    def start(self) -> None:
        """Start the supervisor: only now, because it calls back into the host, which must already hold this
        backend (starting it in the constructor raced the host's assignment: an AttributeError traceback)."""
        self._supervisor.start()

    @property
    def ready(self) -> bool:
        return self._ready

    @property
    def spare_ready(self) -> bool:
        return self._spare is not None

    def submit(self, job: Job) -> None:
        host = self.host
        with host.lock:
            if host.inflight is not job or not self._ready:
                return None  # lost meanwhile (the supervisor counted it)
            try:
                self.worker.submit(job.seq, job.window.counts)
            except WorkerLost:
                pass  # the supervisor sees the dead worker and drops the job
        return None

    def check(self, now: float) -> None:
        pass  # the supervisor watches for hangs

    def inject(self, kind: str, seconds: float) -> None:
        with self.host.lock:
            try:
                self.worker.inject(kind, seconds)
            except WorkerLost as err:
                self.host.event("worker_lost", f"could not inject a fault: {err}")

    def kill_worker(self) -> int:
        """SIGKILL the worker process: the supervisor notices and restarts it. Returns the killed pid."""
        with self.host.lock:
            pid = self.worker.pid
            if self.worker.proc is not None and self.worker.proc.poll() is None:
                self.worker.proc.kill()
        return pid

    def probe(self, timeout: float = 30.0) -> dict:
        """What the worker process has imported, asked when idle (the supervisor files the reply)."""
        self._probe_event.clear()
        with self.host.lock:
            self.worker.send(("probe",))
        if not self._probe_event.wait(timeout):
            raise TimeoutError(f"DispatchController.worker_probe: the worker did not answer within {timeout:g} s")
        return dict(self._probe_reply)

    def reconfigure(self, config: WorkerConfig) -> None:
        """The worker and the spare solve with ``config`` from now on (and restart with it): a message, no restart."""
        with self.host.lock:
            self.config = config
            for w in (self.worker, self._spare):
                if w is None:
                    continue
                w.config = config
                try:
                    w.send(("reconfig", config))
                except WorkerLost:
                    pass  # the supervisor restarts it, with the new config

    def metrics(self) -> dict:
        return {
            "pid": self.worker.pid,
            "alive": self.worker.alive,
            "ready": self._ready,
            "start_s": list(self.worker.start_s),
            "spare_ready": self.spare_ready,
        }

    def close(self) -> None:
        self._supervisor.join(timeout=10.0)  # the host is closed: the supervisor returns within a poll
        with self.host.lock:
            workers = [w for w in (self.worker, self._spare) if w is not None]
            self._spare = None
        for w in workers:
            w.close()

    # ------------------------------------------------------------------ supervision
    def _supervise(self) -> None:
        """Collect results, notice a dead or hung worker, restart it. Runs until the host closes."""
        host = self.host
        while True:
            with host.lock:
                if host.closed:
                    return
                worker, job = self.worker, host.inflight
            try:
                msg = worker.recv(0.02)
            except WorkerLost as err:
                with host.lock:
                    self._ready = False
                    host.lose_inflight("died", str(err))
                self._restart()
                continue
            if msg is not None and msg[0] == "result":
                with host.lock:
                    current = host.inflight
                if current is not None and current.seq == msg[1]:
                    host.finish(current, msg[2], msg[3])
                else:
                    with host.lock:
                        host.count("late_results")
                continue
            if msg is not None and msg[0] == "probe":
                self._probe_reply = msg[1]
                self._probe_event.set()
                continue
            if job is not None and time.monotonic() - job.submitted_at > self.hang_s:
                with host.lock:
                    if host.inflight is not job:
                        continue
                    self._ready = False
                    host.lose_inflight("hung", f"no result after {self.hang_s:g} s: killing the worker")
                worker.kill()
                self._restart()
            host.check_runtime()

    def _start_spare(self) -> None:
        """Start a spare worker on a helper thread (when ``spare``)."""
        if not self._want_spare:
            return
        host = self.host

        def run():
            try:
                spare = SolverWorker(self.config, start_timeout_s=self._start_timeout_s).start()
            except Exception as err:
                with host.lock:
                    host.event("spare_failed", f"{type(err).__name__}: {err}")
                return
            with host.lock:
                if not host.closed and self._spare is None:
                    if spare.config is not self.config:  # reconfigured while it started
                        spare.config = self.config
                        try:
                            spare.send(("reconfig", self.config))
                        except WorkerLost:
                            pass
                    self._spare, spare = spare, None
            if spare is not None:  # closed meanwhile
                spare.close()

        threading.Thread(target=run, name="tempo-spare", daemon=True).start()

    def _restart(self) -> None:
        """Replace the lost worker: swap in the spare when one is ready, else start a fresh one here (outside the
        lock: it takes a second or more), retrying with back-off until it works or the host closes."""
        host = self.host
        with host.lock:
            spare, self._spare = self._spare, None
        if spare is not None and spare.alive:
            with host.lock:
                old, self.worker = self.worker, spare
                self._ready = True
                host.count("restarts")
            old.kill()
            host.log.warning("dispatch runtime: solver worker replaced by the spare (pid %s)", spare.pid)
            self._start_spare()
            return
        delay = 0.1
        while True:
            with host.lock:
                if host.closed:
                    return
            try:
                self.worker.kill()
                self.worker.start()
            except Exception as err:  # e.g. the machine is out of processes: back off and retry
                host.event("restart_failed", f"{type(err).__name__}: {err}")
                time.sleep(delay)
                delay = min(2 * delay, 5.0)
                continue
            with host.lock:
                self._ready = True
                host.count("restarts")
            host.log.warning("dispatch runtime: solver worker restarted (pid %s)", self.worker.pid)
            self._start_spare()
            return


#: ``solver_mode`` → backend class.
_BACKENDS = {"inline": InlineBackend, "thread": ThreadBackend, "process": ProcessBackend}
#: Where the controller's solver runs (`DispatchController(solver_mode=...)`; see `tempo_jax.runtime.controller`).
SOLVER_MODES = tuple(_BACKENDS)


def make_backend(
    solver_mode: str, config: WorkerConfig, host, *, hang_s: float, start_timeout_s: float, spare: bool
) -> SolverBackend:
    """The backend of ``solver_mode`` (one of `SOLVER_MODES`)."""
    check_choice("solver_mode", solver_mode, SOLVER_MODES, where="DispatchController")
    if solver_mode == "process":
        return ProcessBackend(config, host, hang_s=hang_s, start_timeout_s=start_timeout_s, spare=spare)
    return _BACKENDS[solver_mode](config, host, hang_s=hang_s)


def check_fault(kind: str) -> str:
    return check_choice("fault", kind, FAULTS, where="DispatchController.inject_fault")
