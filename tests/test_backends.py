"""The seam between `DispatchController` and its solver backends (issue 57, item 3): a backend reports only by the
events it posts (`Solved`, `SolverLost`, `Fault`, `Restarted`), never reads the controller, and never posts while it
holds its own lock (the controller may call into a backend under the controller's lock: that order only).

Each backend here gets nothing but a recording ``post``; the controller's handling of the same faults, end to end,
is in tests/test_controller.py (inline, thread) and tests/test_runtime_faults.py (the worker process)."""

import threading
import time

import numpy as np
import pytest

from solvers import PRESETS, Placement
from solvers.worker import WorkerConfig
from tempo_jax.runtime.accumulator import Window
from tempo_jax.runtime.backends import (
    InlineBackend,
    Job,
    ProcessBackend,
    Restarted,
    Solved,
    SolverLost,
    ThreadBackend,
)

D, E = 8, 16
CONFIG = WorkerConfig(Placement.from_eplb(np.arange(E) + 1.0, 32, D), PRESETS["dsv3_fp8_offline"], "token_lp")


class Recorder:
    """A ``post`` that records events and checks the backend does not hold its own lock while posting (a post made
    under it would wait here for the lock its own thread holds: refused after 5 s, and counted)."""

    def __init__(self):
        self.events: list = []
        self.under_lock = 0
        self.backend = None
        self._cv = threading.Condition()

    def __call__(self, event) -> None:
        lock = self.backend._lock
        if lock.acquire(timeout=5.0):
            lock.release()
        else:
            self.under_lock += 1
        with self._cv:
            self.events.append(event)
            self._cv.notify_all()

    def wait_for(self, kind, n: int = 1, timeout: float = 60.0) -> list:
        """The events of type ``kind`` once there are ``n`` of them (fails after ``timeout`` s: a real hang only)."""
        with self._cv:
            ok = self._cv.wait_for(lambda: len(self.of(kind)) >= n, timeout)
        assert ok, f"no {n} {kind.__name__} event(s) within {timeout} s; events: {self.events}"
        return self.of(kind)

    def of(self, kind) -> list:
        return [e for e in self.events if isinstance(e, kind)]


def _make(cls, **kw):
    post = Recorder()
    post.backend = cls(CONFIG, post, **kw)
    post.backend.start()
    return post.backend, post


def _job(seq: int) -> Job:
    counts = np.random.default_rng(seq).integers(0, 50, (D, E)).astype(float)
    return Job(seq, Window(counts, float(counts.sum()), 1, time.monotonic()), time.monotonic())


def test_inline_backend_posts_one_solved_event_per_job():
    backend, post = _make(InlineBackend, hang_s=5.0)
    assert backend.submit(_job(1)) is None
    backend.inject("raise", 0.0)
    err = backend.submit(_job(2))
    assert err is not None  # inline: the caller also gets what the solver raised
    solved = post.of(Solved)
    assert [e.seq for e in solved] == [1, 2] and post.events == solved
    assert solved[0].weights.shape[-2] == E and "error" not in solved[0].info
    assert solved[1].weights is None and "injected" in solved[1].info["error"]
    assert backend.worker_metrics() is None and post.under_lock == 0
    for call in (backend.kill_worker, backend.probe):
        with pytest.raises(ValueError, match="solver_mode 'inline' has no worker process"):
            call()


def test_a_hung_thread_is_posted_lost_then_its_result_arrives_late():
    backend, post = _make(ThreadBackend, hang_s=0.2)
    backend.inject("hang", 3.0)  # seconds of margin: the checks below use times relative to the submit
    job = _job(7)
    backend.submit(job)
    backend.check(job.submitted_at + 0.1)
    assert post.of(SolverLost) == []  # not hung yet
    backend.check(job.submitted_at + 0.3)
    assert post.events == [SolverLost("hung", post.events[0].message, 7), Restarted("solver thread abandoned")]
    backend.check(job.submitted_at + 5.0)
    assert len(post.events) == 2  # abandoned once
    (late,) = post.wait_for(Solved)
    assert late.seq == 7 and late.weights is not None  # the controller counts it as late (no longer in flight)
    assert post.under_lock == 0


def test_the_worker_process_reports_results_deaths_and_hangs_as_events():
    backend, post = _make(ProcessBackend, hang_s=3.0, start_timeout_s=120.0, spare=True)
    try:
        backend.submit(_job(1))
        assert post.wait_for(Solved)[0].seq == 1
        # killed: the job it held is lost (seq None: whatever the worker was sent), the spare is swapped in
        _spare_up(backend)
        first = backend.kill_worker()
        (died,) = post.wait_for(SolverLost)
        assert died.kind == "died" and died.seq is None
        assert "spare" in post.wait_for(Restarted)[0].message and backend.worker_metrics()["pid"] != first
        # hung past hang_s: lost, killed, replaced
        _spare_up(backend)
        backend.inject("hang", 60.0)
        backend.submit(_job(2))
        hung = post.wait_for(SolverLost, 2)[1]
        assert hung.kind == "hung" and "killing the worker" in hung.message
        post.wait_for(Restarted, 2)
        _wait(lambda: backend.ready)
        backend.submit(_job(3))
        assert post.wait_for(Solved, 2)[1].seq == 3
        assert [e.seq for e in post.of(Solved)] == [1, 3]  # the hung job never reports
        assert post.under_lock == 0
    finally:
        backend.close()


def _spare_up(backend, timeout: float = 120.0) -> None:
    _wait(lambda: backend.worker_metrics()["spare_ready"], timeout)


def _wait(cond, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_a_replaced_job_that_hangs_its_worker_is_noticed():
    """The backend watches the job it sent, not the controller's in-flight job: a solve dropped by `set_placement`
    (``replaced``) that then hangs the worker is noticed after ``hang_s``, the worker replaced, and the next window
    solves (before the events, the supervisor watched only the controller's in-flight job, and the next job queued
    behind the hung solve was lost a further ``hang_s`` later)."""
    from tempo_jax import DispatchController

    placement = CONFIG.placement
    margins = dict(budget_s=3.0, hang_s=3.0)  # seconds: the fresh worker's solve must count as on time
    with DispatchController(placement, CONFIG.cost, policy="token_lp", solver_mode="process", **margins) as ctl:
        counts = np.random.default_rng(0).integers(0, 50, (D, E))
        ctl.inject_fault("hang", 60.0)
        ctl.observe(counts)
        ctl.set_placement(placement)  # the in-flight job is dropped as replaced; its solve still hangs the worker
        _wait(lambda: ctl.metrics()["worker_lost"]["hung"] == 1 and ctl.metrics()["worker"]["ready"])
        m = ctl.metrics()
        assert m["restarts"] == 1 and m["windows"]["dropped"]["replaced"] == 1
        assert m["windows"]["dropped"]["worker_lost"] == 0  # nothing else was in flight
        version = ctl.version
        ctl.observe(counts)
        ctl.wait()
        assert ctl.version == version + 1 and ctl.metrics()["windows"]["dropped"]["worker_lost"] == 0
