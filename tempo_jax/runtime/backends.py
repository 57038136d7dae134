"""Where the dispatch runtime's solves run: one `SolverBackend` protocol, three implementations.

- `InlineBackend` (``solver_mode="inline"``): in the calling thread; `submit` returns once the result is in.
- `ThreadBackend` (``"thread"``): on a helper thread of this process (it shares the GIL with JAX's host work); a
  solve older than ``hang_s`` is abandoned and its late result ignored.
- `ProcessBackend` (``"process"``, the paper's deployment): a `solvers.worker.SolverWorker` process that imports
  numpy, scipy, OR-Tools and `solvers` only, plus an idle spare; a supervisor thread collects results, notices
  a dead or hung worker, swaps in the spare (or starts a fresh worker) and starts a new spare.

Every backend solves with `solvers.worker.solve_window`. The seam to the controller is one way: a backend reports
only by posting events through the ``post`` callable it is handed — `Solved` (a result, or the solver's error),
`SolverLost` (the solver died or hung: the job it held is lost), `Fault` (logged and recorded) and `Restarted` — and
the controller handles each event at once, in the posting thread, under its own lock. A backend never reads the
controller's state (it keeps the job it was handed itself; the controller decides, by sequence number, whether an
event still concerns the job it has in flight) and keeps its own state under its own lock, which it never holds
while it posts: the controller may call `ready`, `reconfigure` and `worker_metrics` under its lock, so the lock order
is controller → backend, never the reverse.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from solvers.checks import check_choice
from solvers.worker import FAULTS, SolverWorker, WorkerConfig, WorkerLost, solve_window

from .accumulator import Window

__all__ = [
    "SOLVER_MODES",
    "Event",
    "Fault",
    "InlineBackend",
    "Job",
    "ProcessBackend",
    "Restarted",
    "SolverBackend",
    "SolverLost",
    "Solved",
    "ThreadBackend",
    "make_backend",
]


@dataclass
class Job:
    """A window handed to a backend: sequence number, submit time, and the window's number among all closed windows
    (what `DispatchController.metrics` ``age_windows`` counts from)."""

    seq: int
    window: Window
    submitted_at: float
    window_no: int = 0

    @property
    def pairs(self) -> float:
        return self.window.pairs


# ---------------------------------------------------------------------- the events a backend posts
@dataclass(frozen=True)
class Solved:
    """The solve of job ``seq`` ended: ``weights`` ``[Gs, E, R]`` (or per layer) and ``info``; or ``weights=None``
    and ``info["error"]``, what the solver raised."""

    seq: int
    weights: object
    info: dict


@dataclass(frozen=True)
class SolverLost:
    """The solver died or hung (``kind``: ``"died"`` / ``"hung"``): job ``seq`` is lost, or, with ``seq=None``,
    whichever job is in flight (a worker process loses everything it was sent)."""

    kind: str
    message: str
    seq: int | None = None


@dataclass(frozen=True)
class Fault:
    """A fault to log and record (``kind``: ``"worker_lost"``, ``"spare_failed"``, ``"restart_failed"``)."""

    kind: str
    message: str


@dataclass(frozen=True)
class Restarted:
    """A lost solver was replaced (the spare swapped in, a fresh worker, an abandoned thread)."""

    message: str


#: What a backend posts.
Event = Solved | SolverLost | Fault | Restarted
#: The callable a backend posts through (the controller's `_post`).
Post = Callable[[Event], None]


class SolverBackend(Protocol):
    """What the controller needs from wherever solves run."""

    name: str

    @property
    def ready(self) -> bool:
        """Whether a solve can be submitted now (a process backend restarting its worker is not ready)."""

    def start(self) -> None:
        """Start background work (the process backend's supervisor)."""

    def submit(self, job: Job) -> BaseException | None:
        """Start solving ``job``; its `Solved` event follows. Inline: returns what the solver raised."""

    def check(self, now: float) -> None:
        """Housekeeping: notice a hung solve (posts `SolverLost`)."""

    def inject(self, kind: str, seconds: float) -> None:
        """Make the next solve fail as ``kind`` (`solvers.worker.FAULTS`)."""

    def close(self) -> None:
        """Stop whatever runs solves (idempotent)."""

    def reconfigure(self, config: WorkerConfig) -> None:
        """Solve the next windows with ``config`` (a new placement; the controller dropped the in-flight job)."""

    def kill_worker(self) -> int:
        """SIGKILL the worker process (process mode; ValueError otherwise). Returns the killed pid."""

    def probe(self, timeout: float = 30.0) -> dict:
        """What the worker process has imported (process mode; ValueError otherwise)."""

    def worker_metrics(self) -> dict | None:
        """The worker process's pid, liveness, readiness, start times and spare; None without one."""


class InlineBackend:
    """Solves in the calling thread."""

    name = "inline"

    def __init__(self, config: WorkerConfig, post: Post, *, hang_s: float):
        self.config, self._post, self.hang_s = config, post, hang_s
        self._fault: tuple[str, float] | None = None
        self._lock = threading.Lock()  # guards the fault to inject and (threads) the job a thread holds
        self._sent: Job | None = None  # threads: the newest job a solver thread holds, until it ends or is abandoned

    @property
    def ready(self) -> bool:
        return True

    def start(self) -> None:
        return None

    def _run(self, job: Job, fault) -> BaseException | None:
        try:
            weights, info = solve_window(self.config, job.window.counts, fault)
        except Exception as err:
            weights, info, raised = None, {"error": f"{type(err).__name__}: {err}"}, err
        else:
            raised = None
        with self._lock:
            if self._sent is job:
                self._sent = None
        self._post(Solved(job.seq, weights, info))
        return raised

    def _take(self, job: Job):
        """The fault to inject into ``job``'s solve (taken once), and ``job`` recorded as the one a solver holds."""
        with self._lock:
            fault, self._fault = self._fault, None
            self._sent = job
        return fault

    def submit(self, job: Job) -> BaseException | None:
        return self._run(job, self._take(job))

    def check(self, now: float) -> None:
        pass

    def inject(self, kind: str, seconds: float) -> None:
        if kind == "exit":
            raise ValueError(
                f"DispatchController.inject_fault: 'exit' needs solver_mode='process' (it would end "
                f"this process), not {self.name!r}"
            )
        with self._lock:
            self._fault = (kind, float(seconds))

    def close(self) -> None:
        pass

    def reconfigure(self, config: WorkerConfig) -> None:
        self.config = config

    def _no_worker(self, what: str) -> ValueError:
        return ValueError(f"DispatchController.{what}: solver_mode {self.name!r} has no worker process")

    def kill_worker(self) -> int:
        raise self._no_worker("kill_worker")

    def probe(self, timeout: float = 30.0) -> dict:
        raise self._no_worker("worker_probe")

    def worker_metrics(self) -> dict | None:
        return None


class ThreadBackend(InlineBackend):
    """Solves on a helper thread; a solve older than ``hang_s`` is abandoned (its late result is ignored)."""

    name = "thread"

    def submit(self, job: Job) -> None:
        fault = self._take(job)
        threading.Thread(target=self._run, args=(job, fault), name="tempo-solve", daemon=True).start()
        return None

    def check(self, now: float) -> None:
        with self._lock:
            job = self._sent
            hung = job is not None and now - job.submitted_at > self.hang_s
            if hung:
                self._sent = None  # abandoned: its thread's result will be late
        if hung:
            message = f"no result after {self.hang_s:g} s: the solver thread is abandoned"
            self._post(SolverLost("hung", message, job.seq))
            self._post(Restarted("solver thread abandoned"))


class ProcessBackend:
    """Solves in a worker process with an idle spare; a supervisor thread collects results and restarts."""

    name = "process"

    def __init__(self, config: WorkerConfig, post: Post, *, hang_s: float, start_timeout_s: float, spare: bool):
        self.config, self._post, self.hang_s = config, post, hang_s
        self._start_timeout_s = start_timeout_s
        self._want_spare = bool(spare)
        self._lock = threading.Lock()  # guards the worker / spare swaps, readiness and the job the worker holds
        self._stop = threading.Event()
        self._spare: SolverWorker | None = None
        self._sent: Job | None = None  # the newest job sent to the worker, until its result arrives
        self._probe_event = threading.Event()
        self._probe_reply: dict | None = None
        self.worker = SolverWorker(config, start_timeout_s=start_timeout_s).start()
        self._ready = True
        self._start_spare()
        self._supervisor = threading.Thread(target=self._supervise, name="tempo-supervisor", daemon=True)

    def start(self) -> None:
        """Start the supervisor (it posts events: only once the controller holds this backend)."""
        self._supervisor.start()

    @property
    def ready(self) -> bool:
        return self._ready

    @property
    def spare_ready(self) -> bool:
        return self._spare is not None

    def submit(self, job: Job) -> None:
        with self._lock:
            if not self._ready:
                return None  # the worker was lost meanwhile: the controller dropped the job (SolverLost)
            self._sent = job
            try:
                self.worker.submit(job.seq, job.window.counts)
            except WorkerLost:
                pass  # the supervisor sees the dead worker and posts SolverLost
        return None

    def check(self, now: float) -> None:
        pass  # the supervisor watches for hangs

    def inject(self, kind: str, seconds: float) -> None:
        try:
            with self._lock:
                self.worker.inject(kind, seconds)
        except WorkerLost as err:
            self._post(Fault("worker_lost", f"could not inject a fault: {err}"))

    def kill_worker(self) -> int:
        """SIGKILL the worker process: the supervisor notices and restarts it. Returns the killed pid."""
        with self._lock:
            pid = self.worker.pid
            if self.worker.proc is not None and self.worker.proc.poll() is None:
                self.worker.proc.kill()
        return pid

    def probe(self, timeout: float = 30.0) -> dict:
        """What the worker process has imported, asked when idle (the supervisor files the reply)."""
        self._probe_event.clear()
        with self._lock:
            self.worker.send(("probe",))
        if not self._probe_event.wait(timeout):
            raise TimeoutError(f"DispatchController.worker_probe: the worker did not answer within {timeout:g} s")
        return dict(self._probe_reply)

    def reconfigure(self, config: WorkerConfig) -> None:
        """The worker and the spare solve with ``config`` from now on (and restart with it): a message, no restart."""
        with self._lock:
            self.config = config
            for w in (self.worker, self._spare):
                if w is None:
                    continue
                w.config = config
                try:
                    w.send(("reconfig", config))
                except WorkerLost:
                    pass  # the supervisor restarts it, with the new config

    def worker_metrics(self) -> dict:
        with self._lock:
            return {
                "pid": self.worker.pid,
                "alive": self.worker.alive,
                "ready": self._ready,
                "start_s": list(self.worker.start_s),
                "spare_ready": self.spare_ready,
            }

    def close(self) -> None:
        self._stop.set()
        if self._supervisor.is_alive():
            self._supervisor.join(timeout=10.0)  # it returns within a poll
        with self._lock:
            workers = [w for w in (self.worker, self._spare) if w is not None]
            self._spare = None
        for w in workers:
            w.close()

    # ------------------------------------------------------------------ supervision
    def _supervise(self) -> None:
        """Collect results, notice a dead or hung worker, restart it. Runs until `close`."""
        while not self._stop.is_set():
            with self._lock:
                worker = self.worker
            try:
                msg = worker.recv(0.02)
            except WorkerLost as err:
                self._lose("died", str(err))
                self._restart()
                continue
            if msg is not None and msg[0] == "result":
                with self._lock:
                    if self._sent is not None and self._sent.seq == msg[1]:
                        self._sent = None
                self._post(Solved(msg[1], msg[2], msg[3]))
            elif msg is not None and msg[0] == "probe":
                self._probe_reply = msg[1]
                self._probe_event.set()
            elif msg is None:
                with self._lock:
                    job = self._sent
                if job is not None and time.monotonic() - job.submitted_at > self.hang_s:
                    self._lose("hung", f"no result after {self.hang_s:g} s: killing the worker")
                    worker.kill()
                    self._restart()

    def _lose(self, kind: str, message: str) -> None:
        """The worker is gone: not ready, and every job it was sent is lost."""
        with self._lock:
            self._ready = False
            self._sent = None
        self._post(SolverLost(kind, message))

    def _start_spare(self) -> None:
        """Start a spare worker on a helper thread (when ``spare``)."""
        if not self._want_spare:
            return

        def run():
            try:
                spare = SolverWorker(self.config, start_timeout_s=self._start_timeout_s).start()
            except Exception as err:
                self._post(Fault("spare_failed", f"{type(err).__name__}: {err}"))
                return
            with self._lock:
                if not self._stop.is_set() and self._spare is None:
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
        lock: it takes a second or more), retrying with back-off until it works or the backend closes."""
        with self._lock:
            spare, self._spare = self._spare, None
        if spare is not None and spare.alive:
            with self._lock:
                old, self.worker = self.worker, spare
                self._ready = True
            old.kill()
            self._post(Restarted(f"solver worker replaced by the spare (pid {spare.pid})"))
            self._start_spare()
            return
        delay = 0.1
        while not self._stop.is_set():
            try:
                self.worker.kill()
                self.worker.start()
            except Exception as err:  # e.g. the machine is out of processes: back off and retry
                self._post(Fault("restart_failed", f"{type(err).__name__}: {err}"))
                time.sleep(delay)
                delay = min(2 * delay, 5.0)
                continue
            with self._lock:
                self._ready = True
            self._post(Restarted(f"solver worker restarted (pid {self.worker.pid})"))
            self._start_spare()
            return


#: ``solver_mode`` → backend class.
_BACKENDS = {"inline": InlineBackend, "thread": ThreadBackend, "process": ProcessBackend}
#: Where the controller's solver runs (`DispatchController(solver_mode=...)`; see `tempo_jax.runtime.controller`).
SOLVER_MODES = tuple(_BACKENDS)


def make_backend(
    solver_mode: str, config: WorkerConfig, post: Post, *, hang_s: float, start_timeout_s: float, spare: bool
) -> SolverBackend:
    """The backend of ``solver_mode`` (one of `SOLVER_MODES`), reporting through ``post`` (see the module)."""
    check_choice("solver_mode", solver_mode, SOLVER_MODES, where="DispatchController")
    if solver_mode == "process":
        return ProcessBackend(config, post, hang_s=hang_s, start_timeout_s=start_timeout_s, spare=spare)
    return _BACKENDS[solver_mode](config, post, hang_s=hang_s)


def check_fault(kind: str) -> str:
    return check_choice("fault", kind, FAULTS, where="DispatchController.inject_fault")
