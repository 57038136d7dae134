"""`DispatchController`: the dispatch runtime's host side (TEMPO §4.4) — count windows in, fresh tables out.

Each step the caller hands over the layer's per-source counts (`observe`) or its cumulative counter
(`observe_counter`, wrap-safe differencing); every ``window`` steps the accumulated counts are solved with the
configured policy and cost model (`solvers.worker.solve_window`: the policy, then the one plan → table
conversion `solvers.plan_weights`) and the weights are published as `Tables` with one host → device copy.
``latest`` is always a complete, checked `Tables`; the layer picks it up at its next step.

The controller is three parts behind one API: a `WindowAccumulator` (counts, counter differencing, the open
window), a `Publisher` (result checks, versioned tables, the staleness fallback) and a `SolverBackend` chosen by
``solver_mode`` (`tempo_jax.runtime.backends`):

- ``"inline"``: the solve runs in the calling thread (`observe` waits for it). A solver error propagates (the window
  is dropped and counted as ``error``, as in every mode).
- ``"thread"``: the solve runs on a helper thread of this process (it shares the GIL with JAX's host work).
- ``"process"``: the solve runs in a `solvers.worker.SolverWorker` process that imports numpy, scipy, ortools and
  `solvers` only (the paper's deployment); a supervisor thread collects results, notices a dead or hung worker
  and restarts it.

A backend answers only by posting events (`backends.Solved`, `SolverLost`, `Fault`, `Restarted`) to `_post`, which
handles each at once under this controller's lock; it never reads the controller's state nor takes its lock.

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
| the placement changes (`set_placement`) while a solve is in flight | that window is dropped (``replaced``) |

Two timescales (``rebalance_every=N``): besides the tables of every window, every N windows the controller proposes
a new EPLB placement from the expert load it accumulated since the last placement (`proposal`; layers that share
one `Placement` object pool their loads and get one proposal). The caller moves the weights
(`tempo_jax.MoE.set_placement`) and hands the placement back (`set_placement`): the solver continues over it, and
the last closed window is solved again over the new placement at once (inline, in the caller's thread) and
published, so fresh data are never traded for the fallback tables (those only when no window has closed yet, or the
re-solve fails).

Accounting: every accepted pair is published, dropped (by reason) or pending —
``pairs.in == pairs.published + Σ pairs.dropped + pairs.pending`` — so nothing is lost silently.

    with DispatchController(placement, PRESETS["dsv3_fp8_offline"], policy="tempo", solver_mode="process") as ctl:
        for step in range(n):
            y = moe(x)                                          # the layer uses moe.table
            moe.set_tables(ctl.observe(moe.counts.get_value()))  # never blocks on the solver (thread/process)
        print(ctl.status_line()); ctl.metrics()
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import deque

import numpy as np

from solvers import CostModel, Placement
from solvers.checks import EXACT_INT_LIMIT, check_array, check_counter
from solvers.eplb import check_size as check_eplb_size
from solvers.worker import WorkerConfig, solve_window

from ..layer.tables import Tables
from .accumulator import Window, WindowAccumulator
from .backends import SOLVER_MODES, Event, Fault, Job, Restarted, Solved, SolverLost, check_fault, make_backend
from .controller_config import ControllerConfig
from .publisher import FALLBACKS, Publisher, prepare_tables

__all__ = ["DROP_REASONS", "FALLBACKS", "SOLVER_MODES", "ControllerConfig", "DispatchController"]

log = logging.getLogger("tempo_jax.runtime")

DROP_REASONS = ("busy", "over_budget", "error", "bad_result", "worker_lost", "worker_down", "replaced")


def _dist(values) -> dict:
    v = np.asarray(list(values), dtype=np.float64)
    if not v.size:
        return {"n": 0, "p50": None, "p95": None, "max": None, "last": None}
    return {
        "n": int(v.size),
        "p50": float(np.median(v)),
        "p95": float(np.percentile(v, 95)),
        "max": float(v.max()),
        "last": float(v[-1]),
    }


class DispatchController:
    """Accumulate counts per window, solve off the critical path, publish tables; count every fault.

    Args:
      placement: the placement the layer serves, or a sequence of them, one per MoE layer of a model (same D and
        E): windows are then ``[L, D, E]``, every layer's window is solved in the same solve, and ``latest`` is a
        tuple of L `Tables`.
      cost: the cost model the policy optimises (a `solvers.CostModel`).
      settings: a `ControllerConfig` (policy, window, solver mode, budget, hang and staleness limits, fallback,
        worker and history sizes, re-placement period); keyword ``options`` build one, or replace its fields.
    """

    def __init__(self, placement: Placement, cost: CostModel, settings: ControllerConfig | None = None, **options):
        where = "DispatchController"
        # Step 1: validate everything now (a typo must not surface as uniform tables forever): the placement and
        # cost here, the rest in `ControllerConfig` (``settings``, with any keyword ``options`` applied).
        if isinstance(placement, list | tuple):
            placement = tuple(placement)
            if not placement or not all(isinstance(p, Placement) for p in placement):
                raise ValueError(
                    f"{where}: placement must be a solvers.Placement or a non-empty sequence of them (one per layer)"
                )
            shapes = {(p.num_gpus, p.num_experts) for p in placement}
            if len(shapes) > 1:
                raise ValueError(f"{where}: every layer's placement needs the same D and E, got {sorted(shapes)}")
        elif not isinstance(placement, Placement):
            raise ValueError(f"{where}: placement must be a solvers.Placement, got {type(placement).__name__}")
        if not isinstance(cost, CostModel):
            raise ValueError(f"{where}: cost must be a solvers.CostModel (e.g. PRESETS[...]), got {cost!r}")
        st = self.settings = ControllerConfig.of(settings, options)
        if st.rebalance_every is not None:
            layers = placement if isinstance(placement, tuple) else (placement,)
            first = layers[0]
            # the proposals are EPLB layouts: refuse now what every window's proposal would refuse later
            check_eplb_size(
                len(layers), first.num_experts, first.num_slots, first.num_gpus, where=f"{where}(rebalance_every=...)"
            )
        if st.solver_processes > 1 and (st.solver_mode != "process" or not isinstance(placement, tuple)):
            raise ValueError(
                f"{where}: solver_processes={st.solver_processes} splits a window's layers over processes: "
                "it needs solver_mode='process' and one placement per layer"
            )
        policy, options = st.policy, st.options
        self.solver_mode, self.budget_s, self.hang_s, self.fallback = (
            st.solver_mode,
            st.budget_s,
            st.hang_limit_s,
            st.fallback,
        )
        self.placement, self.cost, self.policy, self.options = placement, cost, policy, options
        self.per_node = st.per_node
        self.window = st.window
        self.config = WorkerConfig(placement, cost, policy, options, st.per_node, st.solver_processes)
        # Step 2: a trial solve catches bad option values here rather than in the first window.
        if policy != "milp":
            try:
                solve_window(self.config, np.ones(self.config.window_shape))
            except Exception as err:
                raise ValueError(
                    f"{where}: policy {policy!r} with options {options} fails on a trial batch: "
                    f"{type(err).__name__}: {err}"
                ) from None
        self.rebalance_every = st.rebalance_every
        # Step 3: the three parts and the fault counters.
        self._lock = threading.RLock()
        self._log = log
        self._windows = WindowAccumulator(self.config.window_shape, st.window, st.max_window_pairs)
        self._publisher = Publisher(
            placement, fallback=st.fallback, staleness_s=st.staleness_s, history_size=st.history_size
        )
        self._seq = 0
        self._data_window = 0  # the closed window whose solve the published tables came from (0: none yet)
        self._last_window: Window | None = None  # the newest closed window with pairs (re-solved on set_placement)
        self._inflight: Job | None = None
        self._closed = False
        self._new_errors: list[str] = []
        self.events: deque = deque(maxlen=200)  # (monotonic time, kind, message) of every fault
        self._solve_ms: deque = deque(maxlen=st.history_size)
        self._roundtrip_ms: deque = deque(maxlen=st.history_size)
        self._n = {k: 0 for k in ("windows", "empty", "rejected", "late_results", "restarts", "died", "hung")}
        self._dropped = {r: 0 for r in DROP_REASONS}
        self._dropped_pairs = {r: 0.0 for r in DROP_REASONS}
        self.last_error: str | None = None
        self.last_rejection: str | None = None
        self._load = np.zeros(self.config.window_shape[:-2] + self.config.window_shape[-1:])  # [(L,) E] since placed
        self._proposal = None
        self._placements = {"proposed": 0, "applied": 0, "dismissed": 0, "resolve_failed": 0, "windows_since": 0}
        self._backend = make_backend(
            self.solver_mode,
            self.config,
            self._post,
            hang_s=self.hang_s,
            start_timeout_s=st.worker_start_timeout_s,
            spare=st.spare_worker,
        )
        self._backend.start()

    # ------------------------------------------------------------------ public API
    @property
    def latest(self) -> Tables | tuple[Tables, ...]:
        """The most recently published tables (complete and checked; one per layer for a layered controller)."""
        with self._lock:
            return self._publisher.latest

    @property
    def version(self) -> int:
        """Number of publications so far (solves and fallbacks); changes exactly when `latest` does."""
        with self._lock:
            return self._publisher.version

    @property
    def history(self) -> list[dict]:
        """Published solves, oldest first (the last ``history_size``)."""
        return self._publisher.history

    def observe(self, counts) -> Tables:
        """Add one step's per-source counts ``[D, E]`` (``[L, D, E]`` per layer); returns the latest published tables.

        Raises:
          ValueError: counts of the wrong shape (a configuration error). Counts with NaN, inf, negative or
            fractional entries, or that would take the window past the solver's limit (2^53 pairs), are rejected and
            counted instead (logged with the reason), and nothing is accumulated.
          RuntimeError: the controller is closed.
          Exception: inline mode only, what the solver raised (the window is dropped and counted as ``error``).
        """
        self._check_open("observe")
        self._check_runtime()
        shape = self._windows.shape
        arr = np.asarray(counts)
        if arr.shape != shape:
            names = ("L", "D", "E")[-len(shape) :]
            want = ", ".join(f"{n}={v}" for n, v in zip(names, shape, strict=True))
            raise ValueError(f"DispatchController.observe: counts must be [{want}], got shape {arr.shape}")
        try:
            c = check_array("counts", arr, where="DispatchController.observe", nonnegative=True, integer=True)
            if self._windows.pending_pairs + float(c.sum()) >= EXACT_INT_LIMIT:
                raise ValueError(
                    f"DispatchController.observe: the window would hold {self._windows.pending_pairs + c.sum():.3g} "
                    f"pairs, beyond the solver's exact-integer limit 2^53 ≈ {EXACT_INT_LIMIT:.1e}; pass per-step counts"
                )
        except ValueError as err:
            with self._lock:
                self._n["rejected"] += 1
                self.last_rejection = str(err)
                self._event("rejected", str(err))
            return self.latest
        with self._lock:
            window = self._windows.add(c)
            self._load += c.sum(axis=-2)
            if window is not None and window.pairs > 0:
                self._last_window = window
            if window is not None and self.rebalance_every is not None:
                self._placements["windows_since"] += 1
                if self._placements["windows_since"] % self.rebalance_every == 0:
                    self._propose()
            job = self._close_window(window) if window is not None else None
        if job is not None:
            err = self._backend.submit(job)
            if err is not None:
                raise err
        return self.latest

    def observe_counter(self, counter) -> Tables:
        """Like `observe`, from the layer's cumulative uint32 counter ``[D, E]`` (wrap-safe differencing; the
        first snapshot is a baseline; a source row whose counter went down restarted; see `CounterWindows`).

        Raises:
          ValueError: a counter that is not uint32-valued (floats, negatives, values ≥ 2^32) or of the wrong shape.
          RuntimeError: the controller is closed.
        """
        self._check_open("observe_counter")
        now = check_counter("counter", counter, where="DispatchController.observe_counter", shape=self._windows.shape)
        with self._lock:
            window, restarted = self._windows.difference(now)
            if restarted:
                self._event(
                    "counter_restart",
                    f"counter rows {restarted} went down: restarted; their window is the count since the restart",
                )
        if window is None:
            return self.latest
        return self.observe(window)

    @property
    def proposal(self) -> Placement | tuple[Placement, ...] | None:
        """The newest placement proposed from the accumulated expert load (``rebalance_every``) and not yet applied
        with `set_placement`; None when there is none. Shaped like ``placement``."""
        with self._lock:
            return self._proposal

    def expert_load(self) -> np.ndarray:
        """Pairs per expert accumulated since the current placement was set, ``[E]`` (``[L, E]`` per layer)."""
        with self._lock:
            return self._load.copy()

    def set_placement(self, placement: Placement | tuple[Placement, ...]) -> None:
        """Serve ``placement`` from now on (after the layer's weights moved, `tempo_jax.MoE.set_placement`): the
        solver solves over it; the newest closed window is solved again over it at once (inline, the controller's
        policy; its data keep their age) and published — the new placement's fallback tables only when no window
        has closed yet or that solve fails (counted in ``placements.resolve_failed``, ``last_error`` and an
        ``error`` event); a solve in flight for the old placement is
        dropped (``replaced``), the pending counts stay (they count logical experts), and the load accumulation
        restarts.

        Raises:
          ValueError: a placement of another shape (D, E or layer count) than the one served.
        """
        self._check_open("set_placement")
        old = self.config.placements
        new = tuple(placement) if isinstance(placement, list | tuple) else (placement,)
        layered = isinstance(self.placement, tuple)
        shaped = isinstance(placement, list | tuple) == layered and len(new) == len(old)
        if not shaped or not all(isinstance(p, Placement) for p in new):
            what = f"a sequence of {len(old)} solvers.Placements" if layered else "one solvers.Placement"
            raise ValueError(f"DispatchController.set_placement: give {what}, shaped like the placement served")
        for p, q in zip(new, old, strict=True):
            if (p.num_gpus, p.num_experts) != (q.num_gpus, q.num_experts):
                raise ValueError(
                    f"DispatchController.set_placement: a placement of D={p.num_gpus}, E={p.num_experts}"
                    f" for a runtime of D={q.num_gpus}, E={q.num_experts}"
                )
        placement = new if isinstance(self.placement, tuple) else new[0]
        config = dataclasses.replace(self.config, placement=placement)
        with self._lock:
            last = self._last_window
        resolved = None
        if last is not None:  # the freshest data, over the new placement (outside the lock: a solve)
            try:
                tables, bad = prepare_tables(solve_window(config, last.counts)[0], placement)
            except Exception as err:  # noqa: BLE001 - counted (resolve_failed, last_error) and logged below
                tables, bad = None, f"{type(err).__name__}: {err}"
            if bad is not None:  # the weights already moved: serve the fallback, and say so
                with self._lock:
                    self._placements["resolve_failed"] += 1
                    self.last_error = f"set_placement: re-solving the last window failed: {bad}"
                    self._event("error", f"{self.last_error}; the fallback tables serve until the next window")
            else:
                resolved = (tables, last.closed_at)
        with self._lock:
            if self._inflight is not None:
                self._drop("replaced", self._inflight.pairs)
                self._inflight = None
            self.placement, self.config = placement, config
            self._publisher.set_placement(placement, resolved)
            self._backend.reconfigure(config)
            self._load[...] = 0
            self._proposal = None
            self._placements["applied"] += 1
            self._placements["windows_since"] = 0
            self._event("placement", f"placement {self._placements['applied']} applied")

    def dismiss_proposal(self) -> None:
        """Decline the current `proposal` (e.g. it models no better than the placement served): it is dropped and
        the load accumulation restarts, so the next proposal reflects the load from now on."""
        with self._lock:
            if self._proposal is not None:
                self._proposal = None
                self._load[...] = 0
                self._placements["dismissed"] = self._placements.get("dismissed", 0) + 1

    def _propose(self) -> None:
        """Under the lock: EPLB over the accumulated load, one proposal per distinct placement object."""
        placements = self.config.placements
        loads = self._load if isinstance(self.placement, tuple) else self._load[None]
        pooled: dict[int, np.ndarray] = {}
        for p, load in zip(placements, loads, strict=True):
            pooled[id(p)] = pooled.get(id(p), 0) + load
        made: dict[int, Placement] = {}
        for p in placements:
            if id(p) not in made:
                made[id(p)] = Placement.from_eplb(
                    pooled[id(p)], p.num_slots, p.num_gpus, spread_idle=True, num_nodes=p.num_nodes
                )
        proposal = tuple(made[id(p)] for p in placements)
        self._proposal = proposal if isinstance(self.placement, tuple) else proposal[0]
        self._placements["proposed"] += 1

    def tick(self) -> None:
        """Housekeeping without new counts (the refresher calls it every period): hung solves, staleness."""
        self._check_runtime()

    def wait(self, timeout: float | None = None, *, raise_errors: bool = True) -> Tables:
        """Block until no solve is in flight; returns the latest tables (at once once the controller is closed).

        Raises:
          RuntimeError: ``raise_errors`` and the solver raised since the last `wait` (the message says what).
          TimeoutError: still in flight after ``timeout`` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._closed:
            self._check_runtime()
            with self._lock:
                busy = self._inflight is not None or not self._backend.ready
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
        self._backend.inject(check_fault(kind), seconds)

    def kill_worker(self) -> int:
        """SIGKILL the worker process (process mode): the supervisor notices, keeps the last good tables and
        restarts it. Returns the killed pid.

        Raises:
          ValueError: ``solver_mode`` is not ``"process"``.
        """
        return self._backend.kill_worker()

    def worker_probe(self) -> dict:
        """Process mode: what the worker process has imported (``{"jax": False, ...}``), asked when idle.

        Raises:
          ValueError: ``solver_mode`` is not ``"process"``.
        """
        self.wait(raise_errors=False)
        return self._backend.probe()

    def close(self) -> None:
        """Stop the supervisor and the worker process (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._backend.close()

    def __enter__(self) -> DispatchController:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ metrics
    def metrics(self) -> dict:
        """Every counter of the runtime as a plain dict (JSON-serialisable)."""
        self._check_runtime()
        with self._lock:
            n, pub, acc = self._n, self._publisher, self._windows
            pending = acc.pending_pairs + (self._inflight.pairs if self._inflight else 0.0)
            out = {
                "solver_mode": self.solver_mode,
                "policy": self.policy,
                "version": pub.version,
                "steps": acc.steps,
                "windows": {
                    "closed": n["windows"],
                    "published": pub.published,
                    "empty": n["empty"],
                    "in_flight": int(self._inflight is not None),
                    "dropped": dict(self._dropped),
                },
                "pairs": {
                    "in": acc.pairs_in,
                    "published": pub.pairs_published,
                    "pending": pending,
                    "dropped": dict(self._dropped_pairs),
                },
                "rejected": n["rejected"],
                "last_rejection": self.last_rejection,
                "counter": dict(acc.notes),
                "solve_ms": _dist(self._solve_ms),
                "roundtrip_ms": _dist(self._roundtrip_ms),
                "age_s": pub.age_s(),
                "age_windows": n["windows"] - self._data_window,
                "in_fallback": pub.in_fallback,
                "fallbacks": pub.fallbacks,
                "restarts": n["restarts"],
                "worker_lost": {"died": n["died"], "hung": n["hung"]},
                "late_results": n["late_results"],
                "errors": self._dropped["error"],
                "last_error": self.last_error,
                "placements": dict(self._placements),
            }
            worker = self._backend.worker_metrics()
            if worker is not None:
                out["worker"] = worker
            return out

    def status_line(self) -> str:
        """One line for a terminal: version, solve latency, data age, windows by outcome, restarts, fallback."""
        m = self.metrics()
        s, w = m["solve_ms"], m["windows"]
        lat = f"solve {s['last']:.1f} ms (p95 {s['p95']:.1f})" if s["n"] else "solve -"
        drops = " ".join(f"{k} {v}" for k, v in w["dropped"].items() if v)
        fallback = "ON" if m["in_fallback"] else "off"
        return (
            f"{self.policy}/{self.solver_mode} v{m['version']} | {lat} | age {m['age_s']:.2f} s | windows "
            f"{w['closed']}: ok {w['published']} empty {w['empty']}{' ' + drops if drops else ''} | rejected "
            f"{m['rejected']} | restarts {m['restarts']} | fallback {fallback}"
        )

    # ------------------------------------------------------------------ internals
    def _check_open(self, what: str) -> None:
        if self._closed:
            raise RuntimeError(f"DispatchController.{what}: the controller is closed; make a new one")

    def _event(self, kind: str, message: str) -> None:
        self.events.append((time.monotonic(), kind, message))
        log.warning("dispatch runtime: %s: %s", kind, message)

    def _drop(self, reason: str, pairs: float) -> None:
        self._dropped[reason] += 1
        self._dropped_pairs[reason] += pairs

    def _close_window(self, window: Window) -> Job | None:
        """Under the lock: turn a closed window into a job, or count why not."""
        self._n["windows"] += 1
        if window.pairs == 0:
            self._n["empty"] += 1
            return None
        if self._inflight is not None:
            self._drop("busy", window.pairs)
            return None
        if not self._backend.ready:
            self._drop("worker_down", window.pairs)
            return None
        self._seq += 1
        job = Job(self._seq, window, time.monotonic(), window_no=self._n["windows"])
        self._inflight = job
        return job

    def _post(self, event: Event) -> None:
        """A backend's event (any thread; `tempo_jax.runtime.backends`): handled at once, under this lock."""
        if isinstance(event, Solved):
            self._solved(event)
            return
        with self._lock:
            if isinstance(event, SolverLost):
                self._lost(event)
            elif isinstance(event, Restarted):
                self._n["restarts"] += 1
                self._event("restart", event.message)
            elif isinstance(event, Fault):
                self._event(event.kind, event.message)
            else:
                raise TypeError(f"DispatchController: not a backend event: {event!r}")

    def _solved(self, event: Solved) -> None:
        """A result arrived: publish it, or count why not (a job no longer in flight: a late result)."""
        weights, info = event.weights, event.info
        tables, bad = (None, None)
        if weights is not None and "error" not in info:
            tables, bad = self._publisher.prepare(weights)  # checks, then one host → device copy
        with self._lock:
            job = self._inflight
            if job is None or job.seq != event.seq:  # abandoned (hung), lost or superseded: ignore
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
                # Dropped and counted in every mode (inline: the caller also sees the error): a window the solver
                # refuses would be refused again, so it is never kept pending.
                self._drop("error", job.pairs)
            elif bad is not None:
                self._drop("bad_result", job.pairs)
                self._event("bad_result", f"window {job.seq}: worker weights rejected: {bad}")
            elif rt > self.budget_s:
                self._drop("over_budget", job.pairs)
                self._event(
                    "over_budget",
                    f"window {job.seq}: result after {rt * 1e3:.1f} ms > budget "
                    f"{self.budget_s * 1e3:.0f} ms; not published",
                )
            else:
                record = {
                    "seq": job.seq,
                    "step": self._windows.steps,
                    "pairs": job.pairs,
                    "roundtrip_ms": rt * 1e3,
                    **info,
                }
                self._data_window = job.window_no
                if self._publisher.publish(tables, closed_at=job.window.closed_at, pairs=job.pairs, record=record):
                    log.info("dispatch runtime: fresh tables published; fallback off")

    def _lost(self, event: SolverLost) -> None:
        """Under the lock: the solver died or hung; the in-flight job is dropped when it is the one lost."""
        self._n[event.kind] += 1
        job = self._inflight
        if event.seq is not None and (job is None or job.seq != event.seq):
            job = None  # that job is no longer in flight (its result or a new placement came first)
        if job is not None:
            self._inflight = None
            self._drop("worker_lost", job.pairs)
        self._event(f"worker_{event.kind}", event.message + ("" if job is None else f"; window {job.seq} dropped"))

    def _check_runtime(self) -> None:
        now = time.monotonic()
        self._backend.check(now)
        with self._lock:
            age = self._publisher.check_staleness(now)
            if age is not None:
                self._event(
                    "stale",
                    f"tables are {age:.2f} s old > {self._publisher.staleness_s:g} s: "
                    f"publishing the {self.fallback!r} fallback",
                )
