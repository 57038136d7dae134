"""`DispatchController`: the dispatch runtime's host side (TEMPO §4.4) — count windows in, fresh tables out.

Each step the caller hands over the layer's per-source counts (`observe`) or its cumulative counter
(`observe_counter`, wrap-safe differencing); every ``window`` steps the accumulated counts are solved with the
configured policy and cost model (`solvers.worker.solve_window`: the policy, then the one plan → table
conversion `solvers.plan_weights`) and the weights are published as `Tables` with one host → device copy.
``latest`` is always a complete, checked `Tables`; the layer picks it up at its next step.

Three modes, one API:

- ``"inline"``: the solve runs in the calling thread (`observe` waits for it). A solver error propagates and the
  window's counts stay pending (they join the next window).
- ``"thread"``: the solve runs on a helper thread of this process (it shares the GIL with JAX's host work).
- ``"process"``: the solve runs in a `solvers.worker.SolverWorker` process that imports numpy, scipy, ortools and
  `solvers` only (the paper's deployment); a supervisor thread collects results, notices a dead or hung worker
  and restarts it.

Faults (each one is counted in `metrics()`, logged on the ``tempo_jax.runtime`` logger, shown by `status_line`):

| fault | what happens |
| --- | --- |
| a window closes while a solve is in flight | the window is dropped (``busy``), never queued |
| a solve ends past ``budget_s`` (submit → result) | its tables are not published (``over_budget``) |
| the solver raises | ``error`` (inline: re-raised, counts kept pending); ``last_error`` holds the message |
| the solver returns NaN / negative / misshapen weights | not published (``bad_result``) |
| the worker process dies (killed, crashed) | last good tables kept; worker restarted; ``worker_lost`` |
| no result within ``hang_s`` | process: killed and restarted; thread: abandoned (its late result is ignored) |
| counts with NaN, inf or negative entries | rejected with the reason logged (``rejected``); nothing accumulated |
| a window with no tokens | no solve (``empty``) |
| counter wrapped past 2^32 | differenced modulo 2^32 (``counter.wrapped``) |
| counter restarted (went down) | that source row's window = its new value (``counter.restarted_rows``) |
| first counter snapshot | a baseline, not a window from zero (``counter.baselines``) |
| tables older than ``staleness_s`` | the ``fallback`` policy's tables (uniform or static) are published |

Accounting: every accepted pair is published, dropped (by reason) or pending —
``pairs.in == pairs.published + Σ pairs.dropped + pairs.pending`` — so nothing is lost silently.

    with DispatchController(placement, PRESETS["dsv3_fp8_offline"], policy="tempo", mode="process") as ctl:
        for step in range(n):
            y = moe(x)                                          # the layer uses moe.table
            moe.set_tables(ctl.observe(moe.counts.get_value()))  # never blocks on the solver (thread/process)
        print(ctl.status_line()); ctl.metrics()
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from solvers import CostModel, Placement
from solvers.checks import check_array, check_choice, check_counter, check_int, check_real
from solvers.solve import check_policy
from solvers.worker import FAULTS, SolverWorker, WorkerConfig, WorkerLost, solve_window

from . import tables as T
from .refresher import CounterWindows

__all__ = ["DROP_REASONS", "FALLBACKS", "MODES", "DispatchController"]

log = logging.getLogger("tempo_jax.runtime")

MODES = ("inline", "thread", "process")
FALLBACKS = ("uniform", "static")
DROP_REASONS = ("busy", "over_budget", "error", "bad_result", "worker_lost", "worker_down")


@dataclass
class _Job:
    seq: int
    gen: int
    counts: np.ndarray
    pairs: float
    steps: int
    closed_at: float
    submitted_at: float
    fault: tuple[str, float] | None = None


def _dist(values) -> dict:
    v = np.asarray(list(values), dtype=np.float64)
    if not v.size:
        return {"n": 0, "p50": None, "p95": None, "max": None, "last": None}
    return {"n": int(v.size), "p50": float(np.median(v)), "p95": float(np.percentile(v, 95)),
            "max": float(v.max()), "last": float(v[-1])}  # fmt: skip


class DispatchController:
    """Accumulate counts per window, solve off the critical path, publish tables; count every fault.

    Args:
      placement: the placement the layer serves.
      cost: the cost model the policy optimises (a `solvers.CostModel`).
      policy: a `solvers.POLICIES` name.
      window: steps (observe calls) per solve.
      options: policy options (e.g. ``{"tau": 0.0}``); checked against the policy's signature.
      mode: ``"inline"``, ``"thread"`` or ``"process"`` (default: ``"thread"`` if ``background`` else ``"inline"``).
      background: the old spelling of ``mode="thread"``.
      per_node: one table per source node via the topology-aware split.
      budget_s: a solve whose result arrives later than this after submission is not published.
      hang_s: no result after this long = a hung solver (default ``max(10 · budget_s, 5 s)``).
      staleness_s: publish the ``fallback`` tables when the published tables' data are older than this
        (None: never).
      fallback: ``"uniform"`` or ``"static"``.
      max_window_pairs: counter differences at or above this mean a restart (see `CounterWindows`).
      history_size: solves and latencies kept for `history` and the metrics.
      worker_start_timeout_s: process mode: how long a worker (re)start may take.
      spare_worker: process mode: keep a second worker started and idle, so a restart is a swap (a fresh
        interpreter importing scipy and ortools takes a second or more); a new spare starts in the background.
    """

    def __init__(
        self,
        placement: Placement,
        cost: CostModel,
        *,
        policy: str = "tempo",
        window: int = 1,
        options: dict | None = None,
        mode: str | None = None,
        background: bool = False,
        per_node: bool = False,
        budget_s: float = 1.0,
        hang_s: float | None = None,
        staleness_s: float | None = None,
        fallback: str = "uniform",
        max_window_pairs: int = 1 << 31,
        history_size: int = 1000,
        worker_start_timeout_s: float = 120.0,
        spare_worker: bool = True,
    ):
        where = "DispatchController"
        # Step 1: validate everything now (a typo must not surface as uniform tables forever).
        if not isinstance(placement, Placement):
            raise ValueError(f"{where}: placement must be a solvers.Placement, got {type(placement).__name__}")
        if not isinstance(cost, CostModel):
            raise ValueError(f"{where}: cost must be a solvers.CostModel (e.g. PRESETS[...]), got {cost!r}")
        options = check_policy(policy, options)
        self.window = check_int("window", window, where=where)
        if not isinstance(background, bool) or not isinstance(per_node, bool):
            raise ValueError(f"{where}: background and per_node must be booleans, got {background!r}, {per_node!r}")
        if mode is None:
            mode = "thread" if background else "inline"
        elif background and mode != "thread":
            raise ValueError(f"{where}: background=True means mode='thread', but mode={mode!r} was given")
        self.mode = check_choice("mode", mode, MODES, where=where)
        self.budget_s = check_real("budget_s", budget_s, minimum=0, strict=True, where=where)
        hang = max(10 * self.budget_s, 5.0) if hang_s is None else hang_s
        self.hang_s = check_real("hang_s", hang, minimum=self.budget_s, where=where)
        self.staleness_s = None if staleness_s is None else check_real("staleness_s", staleness_s, minimum=0,
                                                                       strict=True, where=where)  # fmt: skip
        self.fallback = check_choice("fallback", fallback, FALLBACKS, where=where)
        history_size = check_int("history_size", history_size, where=where)
        self.placement, self.cost, self.policy, self.options, self.per_node = placement, cost, policy, options, per_node
        self.config = WorkerConfig(placement, cost, policy, options, per_node)
        # Step 2: a trial solve catches bad option values here rather than in the first window.
        if policy != "milp":
            try:
                solve_window(self.config, np.ones((placement.num_gpus, placement.num_experts)))
            except Exception as err:
                raise ValueError(f"{where}: policy {policy!r} with options {options} fails on a trial batch: "
                                 f"{type(err).__name__}: {err}") from None  # fmt: skip
        # Step 3: state.
        D, E = placement.num_gpus, placement.num_experts
        self._lock = threading.RLock()
        self._counter = CounterWindows(max_window_pairs)
        self._acc = np.zeros((D, E))
        self._acc_steps = 0
        self._steps = 0
        self._seq = 0
        self._gen = 0
        self._inflight: _Job | None = None
        self._fault: tuple[str, float] | None = None
        self._fallback_tables = T.uniform(placement) if fallback == "uniform" else T.static(placement)
        self._latest = T.uniform(placement)
        self._version = 0
        self._data_time = time.monotonic()
        self._in_fallback = False
        self._closed = False
        self._new_errors: list[str] = []
        self.history: list[dict] = []  # published solves, oldest first (the last `history_size`)
        self._history_size = history_size
        self.events: deque = deque(maxlen=200)  # (monotonic time, kind, message) of every fault
        self._solve_ms: deque = deque(maxlen=history_size)
        self._roundtrip_ms: deque = deque(maxlen=history_size)
        self._n = {k: 0 for k in ("windows", "published", "empty", "rejected", "late_results", "fallbacks",
                                  "restarts", "died", "hung", "baselines", "wrapped", "counter_restarts")}  # fmt: skip
        self._dropped = {r: 0 for r in DROP_REASONS}
        self._dropped_pairs = {r: 0.0 for r in DROP_REASONS}
        self._pairs_in = 0.0
        self._pairs_published = 0.0
        self.last_error: str | None = None
        self.last_rejection: str | None = None
        self._worker: SolverWorker | None = None
        self._worker_ready = False
        self._supervisor: threading.Thread | None = None
        self._probe_event = threading.Event()
        self._probe_reply: dict | None = None
        self._spare: SolverWorker | None = None
        self._spare_worker = bool(spare_worker)
        self._start_timeout_s = worker_start_timeout_s
        if self.mode == "process":
            self._worker = SolverWorker(self.config, start_timeout_s=worker_start_timeout_s).start()
            self._worker_ready = True
            self._start_spare()
            self._supervisor = threading.Thread(target=self._supervise, name="tempo-supervisor", daemon=True)
            self._supervisor.start()

    # ------------------------------------------------------------------ public API
    @property
    def latest(self) -> T.Tables:
        """The most recently published tables (complete and checked)."""
        with self._lock:
            return self._latest

    @property
    def version(self) -> int:
        """Number of publications so far (solves and fallbacks); changes exactly when `latest` does."""
        with self._lock:
            return self._version

    def observe(self, counts) -> T.Tables:
        """Add one step's per-source counts ``[D, E]``; returns the latest published tables.

        Raises:
          ValueError: counts of the wrong shape (a configuration error). Counts with NaN, inf or negative entries
            are rejected and counted instead (logged with the reason), and nothing is accumulated.
          Exception: inline mode only, what the solver raised (the window's counts stay pending).
        """
        self._check_runtime()
        D, E = self._acc.shape
        arr = np.asarray(counts)
        if arr.shape != (D, E):
            raise ValueError(f"DispatchController.observe: counts must be [D={D}, E={E}], got shape {arr.shape}")
        try:
            c = check_array("counts", arr, where="DispatchController.observe", nonnegative=True)
        except ValueError as err:
            with self._lock:
                self._n["rejected"] += 1
                self.last_rejection = str(err)
                self._event("rejected", str(err))
            return self.latest
        with self._lock:
            self._acc += c
            self._acc_steps += 1
            self._steps += 1
            self._pairs_in += float(c.sum())
            job = self._close_window() if self._acc_steps >= self.window else None
        if job is not None:
            self._dispatch(job)
        return self.latest

    def observe_counter(self, counter) -> T.Tables:
        """Like `observe`, from the layer's cumulative uint32 counter ``[D, E]`` (wrap-safe differencing; the
        first snapshot is a baseline; a source row whose counter went down restarted; see `CounterWindows`).

        Raises:
          ValueError: a counter that is not uint32-valued (floats, negatives, values ≥ 2^32) or of the wrong shape.
        """
        now = check_counter("counter", counter, where="DispatchController.observe_counter", shape=self._acc.shape)
        with self._lock:
            window, notes = self._counter.diff(now)
            if notes["baseline"]:
                self._n["baselines"] += 1
            self._n["wrapped"] += notes["wrapped"]
            if notes["restarted_rows"]:
                self._n["counter_restarts"] += 1
                self._event("counter_restart", f"counter rows {notes['restarted_rows']} went down: restarted; their "
                            "window is the count since the restart")  # fmt: skip
        if window is None:
            return self.latest
        return self.observe(window)

    def tick(self) -> None:
        """Housekeeping without new counts (the refresher calls it every period): hung solves, staleness."""
        self._check_runtime()

    def wait(self, timeout: float | None = None, *, raise_errors: bool = True) -> T.Tables:
        """Block until no solve is in flight; returns the latest tables.

        Raises:
          RuntimeError: ``raise_errors`` and the solver raised since the last `wait` (the message says what).
          TimeoutError: still in flight after ``timeout`` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._check_runtime()
            with self._lock:
                busy = self._inflight is not None or (self.mode == "process" and not self._worker_ready)
            if not busy:
                break
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"DispatchController.wait: a solve is still in flight after {timeout} s")
            time.sleep(0.002)
        with self._lock:
            errors, self._new_errors = self._new_errors, []
        if errors and raise_errors:
            raise RuntimeError(f"DispatchController: {len(errors)} solve(s) failed; last: {errors[-1]}")
        return self.latest

    def inject_fault(self, kind: str, seconds: float = 0.0) -> None:
        """Make the next solve fail as ``kind``: ``"hang"`` (sleep ``seconds`` first), ``"raise"``, ``"nan"`` (NaN
        weights) or, process mode only, ``"exit"`` (the worker process exits mid-solve). For tests and demos."""
        check_choice("fault", kind, FAULTS, where="DispatchController.inject_fault")
        if kind == "exit" and self.mode != "process":
            raise ValueError("DispatchController.inject_fault: 'exit' needs mode='process' (it would end this process)")
        with self._lock:
            if self.mode == "process":
                try:
                    self._worker.inject(kind, seconds)
                except WorkerLost as err:
                    self._event("worker_lost", f"could not inject a fault: {err}")
            else:
                self._fault = (kind, float(seconds))

    def kill_worker(self) -> int:
        """SIGKILL the worker process (process mode): the supervisor notices, keeps the last good tables and
        restarts it. Returns the killed pid."""
        if self.mode != "process":
            raise ValueError(f"DispatchController.kill_worker: mode {self.mode!r} has no worker process")
        with self._lock:
            pid = self._worker.pid
            if self._worker.proc is not None and self._worker.proc.poll() is None:
                self._worker.proc.kill()
        return pid

    def worker_probe(self) -> dict:
        """Process mode: what the worker process has imported (``{"jax": False, ...}``), asked when idle."""
        if self.mode != "process":
            raise ValueError(f"DispatchController.worker_probe: mode {self.mode!r} has no worker process")
        self.wait(raise_errors=False)
        self._probe_event.clear()
        with self._lock:
            self._worker.send(("probe",))  # the supervisor, the only reader of the worker's pipe, files the reply
        if not self._probe_event.wait(30.0):
            raise TimeoutError("DispatchController.worker_probe: the worker did not answer within 30 s")
        return dict(self._probe_reply)

    def close(self) -> None:
        """Stop the supervisor and the worker process (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._supervisor is not None:
            self._supervisor.join(timeout=10.0)
        with self._lock:
            workers = [w for w in (self._worker, self._spare) if w is not None]
            self._spare = None
        for w in workers:
            w.close()

    def __enter__(self) -> DispatchController:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ metrics
    def metrics(self) -> dict:
        """Every counter of the runtime as a plain dict (JSON-serialisable)."""
        self._check_runtime()
        with self._lock:
            n = self._n
            pending = float(self._acc.sum()) + (self._inflight.pairs if self._inflight else 0.0)
            out = {
                "mode": self.mode,
                "policy": self.policy,
                "version": self._version,
                "steps": self._steps,
                "windows": {
                    "closed": n["windows"],
                    "published": n["published"],
                    "empty": n["empty"],
                    "in_flight": int(self._inflight is not None),
                    "dropped": dict(self._dropped),
                },
                "pairs": {
                    "in": self._pairs_in,
                    "published": self._pairs_published,
                    "pending": pending,
                    "dropped": dict(self._dropped_pairs),
                },
                "rejected": n["rejected"],
                "last_rejection": self.last_rejection,
                "counter": {"baselines": n["baselines"], "wrapped": n["wrapped"], "restarts": n["counter_restarts"]},
                "solve_ms": _dist(self._solve_ms),
                "roundtrip_ms": _dist(self._roundtrip_ms),
                "age_s": time.monotonic() - self._data_time,
                "in_fallback": self._in_fallback,
                "fallbacks": n["fallbacks"],
                "restarts": n["restarts"],
                "worker_lost": {"died": n["died"], "hung": n["hung"]},
                "late_results": n["late_results"],
                "errors": self._dropped["error"],
                "last_error": self.last_error,
            }
            if self._worker is not None:
                out["worker"] = {"pid": self._worker.pid, "alive": self._worker.alive, "ready": self._worker_ready,
                                 "start_s": list(self._worker.start_s),
                                 "spare_ready": self._spare is not None}  # fmt: skip
            return out

    def status_line(self) -> str:
        """One line for a terminal: version, solve latency, data age, windows by outcome, restarts, fallback."""
        m = self.metrics()
        s, w = m["solve_ms"], m["windows"]
        lat = f"solve {s['last']:.1f} ms (p95 {s['p95']:.1f})" if s["n"] else "solve -"
        drops = " ".join(f"{k} {v}" for k, v in w["dropped"].items() if v)
        fallback = "ON" if m["in_fallback"] else "off"
        return (f"{self.policy}/{self.mode} v{m['version']} | {lat} | age {m['age_s']:.2f} s | windows "
                f"{w['closed']}: ok {w['published']} empty {w['empty']}{' ' + drops if drops else ''} | rejected "
                f"{m['rejected']} | restarts {m['restarts']} | fallback {fallback}")  # fmt: skip

    # ------------------------------------------------------------------ internals
    def _event(self, kind: str, message: str) -> None:
        self.events.append((time.monotonic(), kind, message))
        log.warning("dispatch runtime: %s: %s", kind, message)

    def _drop(self, reason: str, pairs: float) -> None:
        self._dropped[reason] += 1
        self._dropped_pairs[reason] += pairs

    def _close_window(self) -> _Job | None:
        """Under the lock: turn the accumulator into a job, or count why not."""
        batch, pairs, steps = self._acc, float(self._acc.sum()), self._acc_steps
        self._acc, self._acc_steps = np.zeros_like(batch), 0
        self._n["windows"] += 1
        if pairs == 0:
            self._n["empty"] += 1
            return None
        if self._inflight is not None:
            self._drop("busy", pairs)
            return None
        if self.mode == "process" and not self._worker_ready:
            self._drop("worker_down", pairs)
            return None
        self._seq += 1
        now = time.monotonic()
        job = _Job(self._seq, self._gen, batch, pairs, steps, now, now, self._fault)
        self._fault = None
        self._inflight = job
        return job

    def _dispatch(self, job: _Job) -> None:
        if self.mode == "inline":
            err = self._run_local(job)
            if err is not None:
                raise err
        elif self.mode == "thread":
            threading.Thread(target=self._run_local, args=(job,), name="tempo-solve", daemon=True).start()
        else:
            with self._lock:
                if self._inflight is not job or not self._worker_ready:
                    return  # lost meanwhile (the supervisor counted it)
                try:
                    self._worker.submit(job.seq, job.counts)
                except WorkerLost:
                    pass  # the supervisor sees the dead worker and drops the job

    def _run_local(self, job: _Job) -> BaseException | None:
        try:
            weights, info = solve_window(self.config, job.counts, job.fault)
        except Exception as err:
            self._finish(job, None, {"error": f"{type(err).__name__}: {err}"})
            return err
        self._finish(job, weights, info)
        return None

    def _finish(self, job: _Job, weights, info: dict) -> None:
        """A result arrived (any thread): publish it, or count why not."""
        tables, bad = None, None
        if weights is not None and "error" not in info:
            try:
                tables = T.from_weights(weights, self.placement)  # checks, then one host → device copy
            except ValueError as err:
                bad = str(err)
        with self._lock:
            if self._inflight is not job:  # abandoned (hung) or superseded: ignore
                self._n["late_results"] += 1
                return
            self._inflight = None
            rt = time.monotonic() - job.submitted_at
            self._roundtrip_ms.append(rt * 1e3)
            if "solve_ms" in info:
                self._solve_ms.append(info["solve_ms"])
            if "error" in info:
                self.last_error = info["error"]
                self._new_errors.append(info["error"])
                self._event("error", f"window {job.seq}: the solver raised {info['error']}")
                if self.mode == "inline":  # foreground: the caller sees the error; the counts stay pending
                    self._acc += job.counts
                    self._acc_steps += job.steps
                    self._dropped["error"] += 1
                else:
                    self._drop("error", job.pairs)
            elif bad is not None:
                self._drop("bad_result", job.pairs)
                self._event("bad_result", f"window {job.seq}: worker weights rejected: {bad}")
            elif rt > self.budget_s:
                self._drop("over_budget", job.pairs)
                self._event("over_budget", f"window {job.seq}: result after {rt * 1e3:.1f} ms > budget "
                            f"{self.budget_s * 1e3:.0f} ms; not published")  # fmt: skip
            else:
                self._latest = tables
                self._version += 1
                self._data_time = job.closed_at
                if self._in_fallback:
                    log.info("dispatch runtime: fresh tables published; fallback off")
                self._in_fallback = False
                self._n["published"] += 1
                self._pairs_published += job.pairs
                self.history.append({"version": self._version, "seq": job.seq, "step": self._steps,
                                     "pairs": job.pairs, "roundtrip_ms": rt * 1e3, **info})  # fmt: skip
                del self.history[: -self._history_size]

    def _lose_inflight(self, kind: str, message: str) -> None:
        """Under the lock: the solver holding the in-flight job is gone (``died``) or given up on (``hung``)."""
        self._n[kind] += 1
        job, self._inflight = self._inflight, None
        self._gen += 1
        if job is not None:
            self._drop("worker_lost", job.pairs)
        self._event(f"worker_{kind}", message + ("" if job is None else f"; window {job.seq} dropped"))

    def _check_runtime(self) -> None:
        now = time.monotonic()
        with self._lock:
            job = self._inflight
            if self.mode == "thread" and job is not None and now - job.submitted_at > self.hang_s:
                self._lose_inflight("hung", f"no result after {self.hang_s:g} s: the solver thread is abandoned")
                self._n["restarts"] += 1
            if self.staleness_s is not None and not self._in_fallback and now - self._data_time > self.staleness_s:
                self._latest = self._fallback_tables
                self._version += 1
                self._in_fallback = True
                self._n["fallbacks"] += 1
                self._event("stale", f"tables are {now - self._data_time:.2f} s old > {self.staleness_s:g} s: "
                            f"publishing the {self.fallback!r} fallback")  # fmt: skip

    # ------------------------------------------------------------------ process mode
    def _supervise(self) -> None:
        """Process mode: collect results, notice a dead or hung worker, restart it. Runs until `close`."""
        while True:
            with self._lock:
                if self._closed:
                    return
                worker, job = self._worker, self._inflight
            try:
                msg = worker.recv(0.02)
            except WorkerLost as err:
                with self._lock:
                    self._worker_ready = False
                    self._lose_inflight("died", str(err))
                self._restart()
                continue
            if msg is not None and msg[0] == "result":
                with self._lock:
                    current = self._inflight
                if current is not None and current.seq == msg[1]:
                    self._finish(current, msg[2], msg[3])
                else:
                    with self._lock:
                        self._n["late_results"] += 1
                continue
            if msg is not None and msg[0] == "probe":
                self._probe_reply = msg[1]
                self._probe_event.set()
                continue
            if job is not None and time.monotonic() - job.submitted_at > self.hang_s:
                with self._lock:
                    if self._inflight is not job:
                        continue
                    self._worker_ready = False
                    self._lose_inflight("hung", f"no result after {self.hang_s:g} s: killing the worker")
                worker.kill()
                self._restart()
            self._check_runtime()

    def _start_spare(self) -> None:
        """Start a spare worker on a helper thread (process mode with ``spare_worker``)."""
        if not self._spare_worker:
            return

        def run():
            try:
                spare = SolverWorker(self.config, start_timeout_s=self._start_timeout_s).start()
            except Exception as err:
                with self._lock:
                    self._event("spare_failed", f"{type(err).__name__}: {err}")
                return
            with self._lock:
                if not self._closed and self._spare is None:
                    self._spare, spare = spare, None
            if spare is not None:  # closed meanwhile
                spare.close()

        threading.Thread(target=run, name="tempo-spare", daemon=True).start()

    def _restart(self) -> None:
        """Replace the lost worker: swap in the spare when one is ready, else start a fresh one here (outside the
        lock: it takes a second or more), retrying with back-off until it works or the controller closes."""
        with self._lock:
            spare, self._spare = self._spare, None
        if spare is not None and spare.alive:
            with self._lock:
                old, self._worker = self._worker, spare
                self._worker_ready = True
                self._n["restarts"] += 1
            old.kill()
            log.warning("dispatch runtime: solver worker replaced by the spare (pid %s)", spare.pid)
            self._start_spare()
            return
        delay = 0.1
        while True:
            with self._lock:
                if self._closed:
                    return
            try:
                self._worker.kill()
                self._worker.start()
            except Exception as err:  # e.g. the machine is out of processes: back off and retry
                self._event("restart_failed", f"{type(err).__name__}: {err}")
                time.sleep(delay)
                delay = min(2 * delay, 5.0)
                continue
            with self._lock:
                self._worker_ready = True
                self._n["restarts"] += 1
            log.warning("dispatch runtime: solver worker restarted (pid %s)", self._worker.pid)
            self._start_spare()
            return
