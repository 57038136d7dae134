"""`DispatchController` probed as a careless user would (issue 14): every defect of the old controller, fixed.

In-process modes here (inline, thread); the worker process and the layer under faults are in
tests/test_runtime_faults.py."""

import dataclasses
import logging
import threading
import time

import numpy as np
import pytest

from solvers import PRESETS, Placement
from tempo_jax import DispatchController
from tempo_jax.layer import tables as dispatch_tables
from tempo_jax.runtime import CounterWindows, Refresher

D, E = 8, 16
COST = PRESETS["dsv3_fp8_offline"]


@pytest.fixture(scope="module")
def placement():
    return Placement.from_eplb(np.arange(E) + 1.0, 32, D)


@pytest.fixture(scope="module")
def counts():
    return np.random.default_rng(0).integers(0, 50, (D, E))


def check_accounting(m: dict) -> None:
    """Nothing lost: every accepted pair is published, dropped (by reason) or pending."""
    p = m["pairs"]
    assert p["in"] == pytest.approx(p["published"] + sum(p["dropped"].values()) + p["pending"])
    w = m["windows"]
    assert w["closed"] == w["published"] + w["empty"] + sum(w["dropped"].values()) + w["in_flight"]


# ------------------------------------------------------------------------------------- construction
@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"policy": "tempo "}, r"unknown policy 'tempo '; valid policies: \[.*'tempo'"),
        ({"options": {"taux": 0.0}}, r"unknown option\(s\) \['taux'\] for policy 'tempo'; valid options: \[.*'tau'"),
        ({"options": {"tau": 2.0}}, r"policy 'tempo' with options \{'tau': 2.0\} fails on a trial batch"),
        ({"policy": "round_robin"}, r"round_robin.*fails on a trial batch.*full replication"),
        ({"options": "tau=0"}, "options must be a dict"),
        ({"window": 1.5}, r"window must be an integer >= 1, got 1.5"),
        ({"window": 0}, r"window must be >= 1, got 0"),
        ({"window": True}, r"window must be an integer"),
        ({"solver_mode": "threads"}, r"unknown solver_mode 'threads'; valid: 'inline', 'thread', 'process'"),
        ({"budget_s": 0}, r"budget_s must be > 0"),
        ({"hang_s": 0.1}, r"hang_s must be >= 1.0"),
        ({"staleness_s": -1.0}, r"staleness_s must be > 0"),
        ({"fallback": "tempo"}, r"unknown fallback 'tempo'; valid: 'uniform', 'static'"),
        ({"max_window_pairs": 2**32}, r"max_window_pairs must be < 2\^32"),
    ],
)
def test_constructor_rejects_bad_arguments(placement, kw, match):
    with pytest.raises(ValueError, match=match):
        DispatchController(placement, COST, **kw)


def test_constructor_rejects_missing_cost_and_placement(placement):
    with pytest.raises(ValueError, match=r"cost must be a solvers.CostModel .*got None"):
        DispatchController(placement, None)
    with pytest.raises(ValueError, match="placement must be a solvers.Placement"):
        DispatchController(placement.to_dict(), COST)
    with pytest.raises(TypeError):
        DispatchController(placement, COST, polcy="tempo")  # a misspelt keyword is not swallowed
    with pytest.raises(TypeError):
        DispatchController(placement, COST, background=True)  # the legacy flag is gone: solver_mode="thread"


# ------------------------------------------------------------------------------------- solver failures
def test_background_failure_is_visible(placement, counts, caplog):
    ctl = DispatchController(placement, COST, solver_mode="thread", budget_s=5.0)  # a budget no load can miss
    ctl.inject_fault("raise")
    with caplog.at_level(logging.WARNING, logger="tempo_jax.runtime"):
        ctl.observe(counts)
        ctl.wait(raise_errors=False)
    m = ctl.metrics()
    assert m["errors"] == 1 and "injected fault" in m["last_error"] and m["version"] == 0
    assert m["windows"]["dropped"]["error"] == 1 and m["pairs"]["dropped"]["error"] == counts.sum()
    assert "error 1" in ctl.status_line()
    assert any("the solver raised" in r.message for r in caplog.records)
    ctl.inject_fault("raise")
    ctl.observe(counts)
    with pytest.raises(RuntimeError, match="injected fault"):
        ctl.wait()  # as before, wait() re-raises what failed in the background
    ctl.observe(counts)
    ctl.wait()  # the next solve works again and publishes
    assert ctl.version == 1 and len(ctl.history) == 1
    check_accounting(ctl.metrics())


def test_foreground_error_drops_the_window_and_the_next_one_solves(placement, counts):
    ctl = DispatchController(placement, COST)  # inline
    ctl.inject_fault("raise")
    with pytest.raises(RuntimeError, match="injected fault"):
        ctl.observe(counts)
    m = ctl.metrics()  # dropped and counted, never kept pending (a refused window would be refused for ever)
    assert m["pairs"]["pending"] == 0 and m["pairs"]["dropped"]["error"] == counts.sum() and m["errors"] == 1
    ctl.observe(counts)
    assert ctl.version == 1 and ctl.history[-1]["pairs"] == counts.sum()
    check_accounting(ctl.metrics())


def test_bad_results_and_over_budget_are_not_published(placement, counts):
    ctl = DispatchController(placement, COST, budget_s=0.05, hang_s=5.0)
    ctl.inject_fault("nan")
    ctl.observe(counts)
    ctl.inject_fault("hang", 0.15)
    ctl.observe(counts)
    m = ctl.metrics()
    assert m["version"] == 0 and m["windows"]["dropped"]["bad_result"] == 1
    assert m["windows"]["dropped"]["over_budget"] == 1
    assert ctl.latest.table.shape == dispatch_tables.uniform(placement).table.shape  # still the initial tables
    np.testing.assert_array_equal(ctl.latest.table, dispatch_tables.uniform(placement).table)
    check_accounting(m)


def test_slow_solve_skips_windows_and_counts_them(placement, counts):
    ctl = DispatchController(placement, COST, solver_mode="thread", budget_s=5.0)
    ctl.inject_fault("hang", 0.4)
    for _ in range(20):
        ctl.observe(counts)
    m = ctl.metrics()
    assert m["windows"]["dropped"]["busy"] == 19 and m["pairs"]["dropped"]["busy"] == 19 * counts.sum()
    assert "busy 19" in ctl.status_line()
    ctl.wait()
    check_accounting(ctl.metrics())
    assert ctl.version == 1


def test_hung_thread_is_abandoned(placement, counts):
    # Margins of seconds, not milliseconds, and a cheap policy: the fresh solve must come back within budget on a
    # loaded machine too (tempo's CP-SAT stage can take a second there).
    ctl = DispatchController(placement, COST, policy="token_lp", solver_mode="thread", budget_s=2.0, hang_s=2.0)
    ctl.inject_fault("hang", 5.0)
    ctl.observe(counts)
    time.sleep(2.3)
    ctl.tick()
    m = ctl.metrics()
    assert m["worker_lost"]["hung"] == 1 and m["restarts"] == 1 and m["windows"]["dropped"]["worker_lost"] == 1
    ctl.observe(counts)  # a fresh solve is not blocked by the hung one
    ctl.wait()
    assert ctl.version == 1
    deadline = time.monotonic() + 30.0  # only against a real hang
    while ctl.metrics()["late_results"] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ctl.metrics()["late_results"] == 1 and ctl.version == 1  # the abandoned solve finished, ignored
    check_accounting(ctl.metrics())


# ------------------------------------------------------------------------------------- data faults
@pytest.mark.parametrize(("value", "reason"), [(np.nan, "NaN"), (-3, "≥ 0"), (np.inf, "finite")])
def test_bad_counts_are_rejected_with_a_logged_reason(placement, counts, caplog, value, reason):
    ctl = DispatchController(placement, COST)
    bad = counts.astype(np.float64)
    bad[2, 5] = value
    with caplog.at_level(logging.WARNING, logger="tempo_jax.runtime"):
        tables = ctl.observe(bad)
    m = ctl.metrics()
    assert tables is ctl.latest and m["rejected"] == 1 and reason in m["last_rejection"]
    assert "counts[2, 5]" in m["last_rejection"] and m["pairs"]["in"] == 0 and m["steps"] == 0
    assert any("rejected" in r.message and "counts[2, 5]" in r.message for r in caplog.records)
    with pytest.raises(ValueError, match=r"counts must be \[D=8, E=16\], got shape \(3, 16\)"):
        ctl.observe(np.ones((3, E)))


def test_zero_window_does_not_solve(placement):
    ctl = DispatchController(placement, COST)
    ctl.observe(np.zeros((D, E)))
    m = ctl.metrics()
    assert m["windows"]["empty"] == 1 and m["version"] == 0 and m["solve_ms"]["n"] == 0


def test_stale_tables_fall_back(placement, counts):
    ctl = DispatchController(placement, COST, staleness_s=0.5, fallback="static")
    ctl.observe(counts)
    fresh = ctl.latest
    assert ctl.version == 1 and not ctl.metrics()["in_fallback"]
    time.sleep(0.6)
    ctl.tick()
    m = ctl.metrics()
    assert m["in_fallback"] and m["fallbacks"] == 1 and ctl.version == 2
    np.testing.assert_array_equal(ctl.latest.table, dispatch_tables.static(placement).table)
    assert "fallback ON" in ctl.status_line()
    ctl.observe(counts)
    assert not ctl.metrics()["in_fallback"] and ctl.latest is not fresh and ctl.version == 3


# ------------------------------------------------------------------------------------- counters
def test_counter_wrap_restart_and_first_snapshot(placement, counts):
    ctl = DispatchController(placement, COST, window=1)
    c0 = np.full((D, E), 1000, np.uint32)
    ctl.observe_counter(c0)  # first snapshot on a non-zero counter: a baseline, not 1000 pairs per entry
    m = ctl.metrics()
    assert m["counter"]["baselines"] == 1 and m["pairs"]["in"] == 0 and m["version"] == 0
    restarted = c0.copy()
    restarted[3] = 10  # rank 3's counter restarted (1000 → 10)
    ctl.observe_counter(restarted)
    m = ctl.metrics()
    assert m["counter"]["restarts"] == 1 and m["pairs"]["in"] == 10 * E  # not a 5.5e11-pair window
    near = np.full((D, E), 2**32 - 7, np.uint32)
    ctl2 = DispatchController(placement, COST)
    ctl2.observe_counter(near)
    ctl2.observe_counter((near.astype(np.uint64) + counts.astype(np.uint64)).astype(np.uint32))
    m2 = ctl2.metrics()
    assert m2["pairs"]["in"] == counts.sum() and m2["counter"]["wrapped"] == int((counts >= 7).sum())
    assert ctl2.history[-1]["pairs"] == counts.sum()


@pytest.mark.parametrize(
    ("counter", "match"),
    [
        (np.full((D, E), 2**32, np.int64), r"\[0, 2\^32\).*counter\[0, 0\] = 4294967296"),
        (np.full((D, E), -1, np.int64), r"counter\[0, 0\] = -1"),
        (np.ones((D, E), np.float32), "must be an unsigned 32-bit counter .*got dtype float32"),
        (np.ones((D, E), bool), "got dtype bool"),
        (np.ones((D, E - 1), np.uint32), r"shape \(8, 16\), got \(8, 15\)"),
    ],
)
def test_counter_dtype_is_checked(placement, counter, match):
    ctl = DispatchController(placement, COST)
    with pytest.raises(ValueError, match="DispatchController.observe_counter: .*" + match):
        ctl.observe_counter(counter)
    ctl.observe_counter(np.ones((D, E), np.int64))  # integers in range are fine


def test_counter_windows_unit():
    cw = CounterWindows(max_window_pairs=100)
    assert cw.diff(np.array([[5, 2**32 - 1]], np.uint32))[0] is None
    w, notes = cw.diff(np.array([[50, 3]], np.uint32))
    np.testing.assert_array_equal(w, [[45, 4]])
    assert notes["wrapped"] == 1 and notes["restarted_rows"] == []
    w, notes = cw.diff(np.array([[200, 4]], np.uint32))  # 150 ≥ 100 pairs in one window: a restart
    np.testing.assert_array_equal(w, [[200, 4]])
    assert notes["restarted_rows"] == [0]


def test_counter_windows_wrap_safe():
    """(now − before) mod 2^32 per entry, the one differencing rule of the runtime."""
    cw = CounterWindows()
    cw.diff(np.asarray([[2**32 - 3, 5, 0]], np.uint32))
    w, notes = cw.diff(np.asarray([[7, 5, 2**31 - 1]], np.uint32))  # the first entry wrapped after 10 pairs
    np.testing.assert_array_equal(w, [[10, 0, 2**31 - 1]])
    assert notes["wrapped"] == 1


# ------------------------------------------------------------------------------------- threads
def test_observe_is_thread_safe(placement):
    """Two threads × many calls: every pair counted exactly once (the old controller over-counted)."""
    ctl = DispatchController(placement, COST, solver_mode="thread", window=500)
    rng = np.random.default_rng(1)
    batches = [rng.integers(0, 20, (D, E)) for _ in range(2)]
    n = 3000
    start = threading.Barrier(2)

    def feed(c):
        start.wait()
        for _ in range(n):
            ctl.observe(c)

    threads = [threading.Thread(target=feed, args=(c,)) for c in batches]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ctl.wait()
    m = ctl.metrics()
    assert m["steps"] == 2 * n and m["pairs"]["in"] == n * (batches[0].sum() + batches[1].sum())
    assert m["windows"]["closed"] == 2 * n // 500
    check_accounting(m)


def test_refresher_feeds_the_controller(placement, counts):
    ctl = DispatchController(placement, COST, solver_mode="thread")
    state = {"counter": np.zeros((D, E), np.uint32)}
    ref = Refresher(ctl, lambda: state["counter"], every_steps=2)
    for _ in range(6):
        state["counter"] = (state["counter"] + counts).astype(np.uint32)
        ref.step()
        ctl.wait()
    m = ctl.metrics()
    assert ref.snapshots == 3 and m["counter"]["baselines"] == 1
    assert m["pairs"]["in"] == 4 * counts.sum() and ctl.version == 2
    timed = Refresher(ctl, lambda: state["counter"], period_s=0.02).start()
    time.sleep(0.2)
    timed.stop()
    assert timed.snapshots >= 3 and not timed.running
    bad = Refresher(ctl, lambda: np.ones((D, E), np.float32), every_steps=1)
    bad.step()  # a refresher fault is counted and logged, never raised into the serving loop
    assert bad.errors == 1 and "unsigned 32-bit" in bad.last_error


def test_one_settings_value_configures_the_controller_and_a_serving_run_checks_it_once(placement):
    """`ControllerConfig`: the controller's knobs as one frozen value (keywords build or replace it), checked when
    built; `ServeConfig.controller` is a serving run's, so `ServeConfig` refuses a bad budget before any run."""
    from tempo_jax.runtime import ControllerConfig
    from tempo_jax.runtime.serve_config import ServeConfig

    settings = ControllerConfig(solver_mode="thread", budget_s=2.0, fallback="static", staleness_s=3.0)
    ctl = DispatchController(placement, COST, settings, budget_s=4.0)
    try:
        assert ctl.settings == dataclasses.replace(settings, budget_s=4.0) and ctl.budget_s == 4.0
        assert ctl.hang_s == 40.0 and ctl.fallback == "static" and ctl.solver_mode == "thread"
    finally:
        ctl.close()
    with pytest.raises(ValueError, match="hang_s must be >= 2.0"):
        ControllerConfig(budget_s=2.0, hang_s=1.0)
    with pytest.raises(TypeError, match="settings must be a ControllerConfig"):
        DispatchController(placement, COST, {"budget_s": 1.0})
    serve = ServeConfig(budget_s=0.5, solver_mode="thread", rebalance_every=None, staleness_s=None)
    assert serve.controller == ControllerConfig(budget_s=0.5, solver_mode="thread", staleness_s=None)
    with pytest.raises(ValueError, match="budget_s must be > 0"):
        ServeConfig(budget_s=0.0)
