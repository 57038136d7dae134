"""Issue 27: no silently wrong result, crash, hang or raw traceback under careless or hostile input.

The table-driven rows (API, loaders, command line) are in tests/test_bad_input.py; this file holds the cases that
need a layer, a controller, a process or a property: the layer refuses non-float activations and float routing ids
before tracing, the controller refuses fractional and oversized counts at ``observe`` and drops (and counts) a
window the solver refused, ``optimal`` means the same for every solver, a HiGHS ``NOT_SOLVED`` before the limit is
not a timeout, EPLB never returns an inconsistent layout, and ``python -m solvers.worker`` by hand says what it is.
"""

import subprocess
import sys
import textwrap
import threading
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solvers import PRESETS, CostModel, DispatchProblem, Placement, UndeterminedFitWarning, fit_max_affine, solve
from solvers.eplb import rebalance_experts
from solvers.problem import OPTIMAL_RTOL
from tempo_jax import DispatchController
from tempo_jax.layer import MoEConfig, init_params, make_ep_mesh, moe_forward
from tempo_jax.layer import tables as dispatch_tables

D, E, K, H = 8, 8, 2, 8
COST = PRESETS["dsv3_fp8_offline"]


# ------------------------------------------------------------------------------------------------ the layer
@pytest.fixture(scope="module")
def layer():
    cfg = MoEConfig(hidden=H, ffn=4, experts=E, top_k=K, slots_per_rank=1, interpret=True)
    placement = Placement.from_phy2log(np.arange(D) % E, D)  # one expert per rank
    pa = dispatch_tables.placement_arrays(placement)
    kw = dict(mesh=make_ep_mesh(D), placement_arrays=pa, tables=dispatch_tables.uniform(placement), config=cfg)
    return init_params(jax.random.key(0), cfg, placement), kw


@pytest.mark.parametrize(
    ("x", "extra", "match"),
    [
        (np.ones((D, H), np.int32), {}, "x must be a floating-point array"),
        (np.ones((2, D, H), np.float32), {}, r"x must be \[T, H\].*x.reshape\(-1, H\)"),
        (
            np.ones((D, H), np.float32),
            {"routing": (np.zeros((D, K), np.float32), np.ones((D, K), np.float32))},
            "routing ids must be integers",
        ),
        (
            np.ones((D, H), np.float32),
            {"routing": (np.zeros((D, K), np.int32), np.ones((D, K), np.int32))},
            "routing weights must be floating point",
        ),
        (
            np.ones((D, H), np.float32),
            {"routing": (np.zeros((D, 1), np.int32), np.ones((D, 1), np.float32))},
            r"routing must be \(ids, weights\) of shape \[T=8, K=2\]",
        ),
        (
            np.ones((D, H), np.float32),
            {"counter": np.zeros((D, E + 1), np.uint32)},
            r"counter must be the \[D=8, E=8\]",
        ),
        (np.ones((D, H), np.float32), {"counter": np.zeros((D, E), np.int32)}, "dtype int32"),
    ],
)
def test_layer_refuses_before_tracing(layer, x, extra, match):
    params, kw = layer
    with pytest.raises(ValueError, match=match):
        moe_forward(params, x, **kw, **extra)


# ---------------------------------------------------------------------------------------------- controller
@pytest.fixture(scope="module")
def placement():
    return Placement.from_eplb(np.arange(16) + 1.0, 32, D)


def _accounting_holds(m: dict) -> bool:
    p = m["pairs"]
    return p["in"] == pytest.approx(p["published"] + sum(p["dropped"].values()) + p["pending"])


def _with(value: float, everywhere: bool = False) -> np.ndarray:
    counts = np.ones((D, 16))
    counts[(slice(None),) * 2 if everywhere else (3, 4)] = value
    return counts


@pytest.mark.parametrize(
    ("counts", "reason"),
    [
        (_with(0.5), "whole numbers"),  # was rounded by the worker and counted as published
        (_with(2.0**53), "too large for exact integer arithmetic"),  # the solver's limit, now at observe
        (_with(2.0**46, everywhere=True), "exact-integer limit"),  # whole numbers whose window passes 2^53
    ],
)
def test_observe_refuses_fractional_and_oversized_counts(placement, counts, reason):
    ctl = DispatchController(placement, COST, window=2)  # inline
    good = np.ones((D, 16))
    ctl.observe(good)  # half a window pending
    ctl.observe(counts)
    m = ctl.metrics()
    assert m["rejected"] == 1 and reason in ctl.last_rejection and _accounting_holds(m)
    assert m["pairs"]["pending"] == good.sum()  # the refused step added nothing
    ctl.observe(good)  # the window closes with the good steps only and publishes
    assert ctl.version == 1 and ctl.history[-1]["pairs"] == 2 * good.sum() and _accounting_holds(ctl.metrics())


def test_a_refused_window_is_dropped_and_later_windows_publish(placement):
    ctl = DispatchController(placement, COST)  # inline: the caller sees the solver's error once
    ctl.inject_fault("raise")
    with pytest.raises(RuntimeError, match="injected fault"):
        ctl.observe(np.ones((D, 16)))
    for _ in range(3):
        ctl.observe(np.full((D, 16), 2))
    m = ctl.metrics()
    assert ctl.version == 3 and m["pairs"]["dropped"]["error"] == D * 16 and m["pairs"]["pending"] == 0
    assert _accounting_holds(m)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.integers(0, 60).map(lambda v: np.full((D, 16), v)),
            st.floats(allow_nan=True, allow_infinity=True).map(lambda v: np.full((D, 16), v)),
            st.sampled_from(
                [
                    np.full((D, 16), 0.5),
                    np.full((D, 16), -1),
                    np.full((D, 16), 2.0**53),
                    np.array([["a"] * 16] * D),
                    np.full((D, 16), True),
                ]
            ),
        ),
        max_size=6,
    )
)
def test_observe_fuzz_keeps_the_accounting(placement, steps):
    """Whatever a step holds, observe accepts it or counts it as rejected; every accepted pair is published,
    dropped or pending, and a good step after junk still publishes."""
    ctl = DispatchController(placement, COST)
    for counts in steps:
        try:
            ctl.observe(counts)
        except (TypeError, ValueError) as err:  # only type errors (non-numeric arrays) may raise
            assert "numeric" in str(err)
        assert _accounting_holds(ctl.metrics())
    before = ctl.version
    ctl.observe(np.full((D, 16), 3))
    assert ctl.version == before + 1 and _accounting_holds(ctl.metrics())


# ------------------------------------------------------------------------------------------------- solvers
@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31), st.sampled_from(["tempo", "milp"]))
def test_optimal_means_the_same_for_every_solver(seed, policy):
    """``optimal``: within OPTIMAL_RTOL of the integer-share optimum, so the gap to the real-valued bound is at most
    one token's time on the fullest rank."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 400, 6) * (rng.random(6) < 0.8)
    problem = DispatchProblem(counts, Placement.from_eplb(counts + 1.0, 8, 4), COST)
    d = solve(problem, policy, **({"time_limit": 5.0} if policy == "milp" else {}))
    optimal = d.info["optimal"] if policy == "tempo" else d.info["status"] == "optimal"
    if optimal:
        slack = max(COST.beta, COST.gamma or 0.0) + OPTIMAL_RTOL * d.makespan + 1e-9
        assert d.makespan - d.lower_bound <= slack


def test_highs_not_solved_before_the_limit_is_not_a_timeout(monkeypatch):
    from ortools.linear_solver import pywraplp

    monkeypatch.setattr(pywraplp.Solver, "Solve", lambda self, *a: pywraplp.Solver.NOT_SOLVED)
    problem = DispatchProblem(np.array([600, 30, 30, 30]), Placement.full(4, 2), COST)
    d = solve(problem, "milp", backend="highs", time_limit=30.0)
    assert d.info["status"] == "not_solved" and d.info["solver_status"] == "NOT_SOLVED"
    assert d.info["incumbent"] != "solver" and np.allclose(d.x.sum(axis=1), [600, 30, 30, 30])


def test_eplb_layouts_stay_consistent_near_float32_limits():
    for w in ([[1e38, 1, 1, 1]], [[3e38, 1e30, 1, 1]], [[1e-40, 1e-45, 0, 1]]):
        phy2log, log2phy, logcnt = rebalance_experts(np.array(w), 8, 1, 1, 2)
        assert (np.bincount(phy2log[0], minlength=4) == logcnt[0]).all() and logcnt.min() >= 1


def test_undetermined_fit_is_said_loudly():
    # Undetermined by construction, whatever the least squares' rounding: eight samples at N = 8 lie on the floor
    # piece (t rising with G), two at N = 10,000 are 5× slower than any floor could be. Every start of the fit ends
    # with the two slow samples alone on the token piece: one N value, so c and β are not determined. Each
    # assignment along the way is decided by a margin of ≥ 1% of t (measured: 1.5%), 10^13 times float64 rounding.
    G = np.array([1, 2, 3, 4, 5, 6, 7, 8, 1, 2], np.float64)
    N = np.array([8] * 8 + [10_000] * 2, np.float64)
    t = np.array([150, 300, 400, 500, 600, 700, 800, 900, 5000, 5000], np.float64)
    with pytest.warns(UndeterminedFitWarning, match="the fit is undetermined") as caught:
        model, report = fit_max_affine(G, N, t)
    assert report.undetermined == ("c", "beta") and report.samples_per_piece == (8, 2)
    assert "c, beta" in str(caught[0].message)
    assert model.c + model.beta * 10_000 == pytest.approx(5000, rel=1e-6)  # the one thing the piece does fix
    G, N = np.repeat([1.0, 2.0, 4.0, 8.0], 3), np.tile([10.0, 1000.0, 8000.0], 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a determined fit says nothing
        _, rep = fit_max_affine(G, N, np.maximum(20 + 5 * G, 0.05 * N))
    assert rep.undetermined == ()


def test_cost_model_without_slopes_is_refused_where_serving_would_divide_by_it():
    with pytest.raises(ValueError, match="prices no load"):
        CostModel(a=3.0, c=4.0, b=0.0, beta=0.0)
    assert CostModel(b=0.0, beta=0.0, c2=1.0, gamma=0.1).gamma == 0.1  # a traffic slope prices tokens


# ---------------------------------------------------------------------------------------------- processes
def test_worker_module_by_hand_prints_usage_not_a_traceback():
    for argv in ([], ["55", "66"], ["x"]):
        proc = subprocess.run([sys.executable, "-m", "solvers.worker", *argv], capture_output=True, text=True)
        assert proc.returncode == 2 and "usage: python -m solvers.worker" in proc.stderr
        assert "Traceback" not in proc.stderr


def test_jnp_arrays_pass_the_layer_checks(layer):
    params, kw = layer
    out = moe_forward(params, jnp.ones((D, H), jnp.bfloat16).astype(jnp.float32), **kw)
    assert out.out.shape == (D, H) and out.out.dtype == jnp.float32


def test_process_controller_after_close_raises_or_returns_at_once(placement):
    ctl = DispatchController(placement, COST, solver_mode="process")
    ctl.close()
    with pytest.raises(RuntimeError, match="the controller is closed"):
        ctl.observe(np.ones((D, 16)))
    done = threading.Event()
    worker = threading.Thread(target=lambda: (ctl.wait(), done.set()), daemon=True)
    worker.start()
    worker.join(timeout=120)  # only against a real hang: wait() after close returns at once
    assert done.is_set()


@pytest.mark.one_env
def test_closing_while_the_spare_warms_up_prints_no_traceback():
    """Closing a process-mode controller at once (the spare worker still warming up) used to print a
    BrokenPipeError traceback from the worker about one close in five."""
    script = textwrap.dedent(
        """
        import numpy as np
        from solvers import PRESETS, Placement
        from tempo_jax import DispatchController
        pl = Placement.from_eplb(np.arange(16) + 1.0, 32, 8)
        for _ in range(3):
            DispatchController(pl, PRESETS["dsv3_fp8_offline"], solver_mode="process").close()
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr[-2000:]
