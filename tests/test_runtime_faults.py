"""Fault injection on the dispatch runtime with the worker process and the real layer (issue 14's done-when):
kill, hang, raise, NaN results, over-budget solves, counter wrap and restart, torn publishes — nothing lost, the
layer's output unchanged; and the worker process never imports jax."""

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from ep_case import D, E, small_ep_case
from flax import nnx

from solvers import PRESETS, DispatchProblem, Placement, solve
from tempo_jax import DispatchController
from tempo_jax.layer import make_ep_mesh, moe_forward, moe_reference, to_logical
from tempo_jax.layer import tables as dispatch_tables
from tempo_jax.layer.module import MoE

H = 16
TOKENS = D * 16
COST = PRESETS["dsv3_fp8_offline"]
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def setup():
    pl, config, params, mesh = small_ep_case(1, hidden=H, ffn=8)
    pa = dispatch_tables.placement_arrays(pl)

    @jax.jit
    def step(x, table, counter, key):
        return moe_forward(
            params,
            x,
            mesh=mesh,
            placement_arrays=pa,
            tables=dispatch_tables.Tables(table, pa.log2phy),
            config=config,
            counter=counter,
            key=key,
        )

    logical = to_logical(params, pl)
    reference = jax.jit(lambda x: moe_reference(logical, x, config))
    return pl, config, params, mesh, step, reference


def _close(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert np.isfinite(a).all()
    np.testing.assert_allclose(a, b, atol=2e-5, rtol=2e-5)


def _wait_for(cond, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def test_worker_never_imports_jax(tmp_path):
    """The serving script imports jax at the top; the worker process it starts must not (a worker started with
    multiprocessing's spawn would re-import this script, and jax with it)."""
    script = tmp_path / "serve_like.py"
    script.write_text(
        textwrap.dedent("""
        import json, sys
        import jax  # the serving process has jax
        import numpy as np
        from solvers import PRESETS, Placement
        from tempo_jax import DispatchController

        if __name__ == "__main__":
            pl = Placement.from_eplb(np.arange(16) + 1.0, 32, 8)
            with DispatchController(pl, PRESETS["dsv3_fp8_offline"], solver_mode="process") as ctl:
                ctl.observe(np.ones((8, 16)))
                ctl.wait()
                probe = ctl.worker_probe()
                print(json.dumps({"parent_jax": "jax" in sys.modules, "version": ctl.version, **probe}))
    """)
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    probe = json.loads(out.stdout.strip().splitlines()[-1])
    assert probe["parent_jax"] is True and probe["version"] == 1
    assert probe["jax"] is False and probe["jaxlib"] is False and probe["flax"] is False
    assert probe["tempo_jax"] is False and probe["pid"] != os.getpid()


def test_worker_warms_up_and_refuses_a_config_it_cannot_solve():
    """The worker pays its first-use costs (OR-Tools imports, one synthetic solve) before it reports ready, so
    the first real window is not the slow one; a config whose solve raises fails `start` with the solver's error."""
    from solvers.worker import SolverWorker, WorkerConfig, WorkerLost

    pl = Placement.from_eplb(np.arange(16) + 1.0, 32, 8)
    worker = SolverWorker(WorkerConfig(pl, COST)).start()
    try:
        assert worker.ready_probe["warmup_error"] is None and worker.ready_probe["warmup_ms"] > 0
    finally:
        worker.close()
    with pytest.raises(WorkerLost, match=r"cannot solve with this config: ValueError: tau must be in \[0, 1\)"):
        SolverWorker(WorkerConfig(pl, COST, options={"tau": 5})).start()


def test_faults_in_a_serving_loop(setup):
    """Eleven steps of the layer fed by its own counter (starting 5 below the uint32 wrap), with a fault at
    most steps. Every output equals the dense reference; every pair is accounted for; the last good tables stay
    published through every fault; each fault shows in the metrics."""
    pl, config, params, mesh, step, reference = setup
    ctl = DispatchController(pl, COST, solver_mode="process", budget_s=0.4, hang_s=1.5)
    counter = jnp.full((D, E), 2**32 - 5, jnp.uint32)
    cum = np.zeros((D, E), np.int64)  # pairs per entry before the counter restart
    ctl.observe_counter(np.asarray(counter))  # baseline
    faults = {
        2: lambda: (ctl.inject_fault("hang", 60.0), "kill"),  # killed mid-solve from outside
        4: lambda: (ctl.inject_fault("hang", 60.0), None),  # hangs past hang_s: killed and restarted
        5: lambda: (ctl.inject_fault("raise"), None),
        6: lambda: (ctl.inject_fault("nan"), None),
        7: lambda: (ctl.inject_fault("hang", 0.8), None),  # over budget (0.4 s), under hang_s
        9: lambda: (ctl.inject_fault("exit"), None),  # the worker exits mid-solve
    }
    pairs, pids = 0, {ctl.metrics()["worker"]["pid"]}
    for s in range(11):
        x = jax.random.normal(jax.random.key(100 + s), (TOKENS, H))
        before = ctl.latest
        if s == 8:
            counter = jnp.zeros((D, E), jnp.uint32)  # the layer was re-created: its counter restarts
        res = step(x, before.table, counter, jax.random.key(s))
        _close(res.out, reference(x))
        assert int(np.asarray(res.stats.drops).sum()) == 0
        counter = res.counter
        pairs += int(np.asarray(res.counts).sum())
        cum += np.asarray(res.counts) if s < 8 else 0
        action = faults.get(s, lambda: (None, None))()[1]
        version = ctl.version
        ctl.observe_counter(np.asarray(counter))
        if s == 3:
            ctl.observe(np.full((D, E), np.nan))  # corrupt counts: rejected, nothing accumulated
        if action == "kill":
            time.sleep(0.2)
            ctl.kill_worker()
        _wait_for(lambda: ctl.metrics()["windows"]["in_flight"] == 0 and ctl.metrics()["worker"]["ready"])
        if s in faults:
            assert ctl.version == version and ctl.latest is before  # the last good tables stay published
        pids.add(ctl.metrics()["worker"]["pid"])
    m = ctl.metrics()
    ctl.close()
    w, p = m["windows"], m["pairs"]
    assert w["dropped"] == {
        "busy": 0,
        "over_budget": 1,
        "error": 1,
        "bad_result": 1,
        "worker_lost": 3,
        "worker_down": 0,
        "replaced": 0,
    }
    assert m["worker_lost"] == {"died": 2, "hung": 1} and m["restarts"] == 3 and len(pids) == 4
    assert w["published"] == 11 - 6 and m["version"] == 5
    assert m["counter"] == {"baselines": 1, "wrapped": int((cum >= 5).sum()), "restarts": 1}
    assert m["rejected"] == 1 and p["in"] == pairs == 11 * TOKENS * config.top_k
    assert p["in"] == p["published"] + sum(p["dropped"].values()) + p["pending"] and p["pending"] == 0
    assert m["solve_ms"]["n"] >= 7 and m["solve_ms"]["p50"] > 0


def _torn(old: np.ndarray, new: np.ndarray, k: int) -> np.ndarray:
    """A table caught mid-copy: rows < k new, row k half written (its second half zeroed), rows > k old."""
    t = old.copy()
    t[:, :k] = new[:, :k]
    if k < t.shape[1]:
        half = t.shape[2] // 2
        t[:, k, :half] = new[:, k, :half]
        t[:, k, half:] = 0.0
    return t


@pytest.mark.parametrize("mode", ["sample", pytest.param("quota", marks=pytest.mark.slow)])
def test_torn_tables_change_nothing(setup, mode):
    """Every tear of an old → new table copy: the kernel renormalises each row at use, so the output is the
    reference's, nothing is dropped and no pair goes to a column without a replica."""
    pl, config, params, mesh, _, reference = setup
    config = dataclasses.replace(config, dispatch_mode=mode)
    pa = dispatch_tables.placement_arrays(pl)
    x = jax.random.normal(jax.random.key(7), (TOKENS, H))
    run = jax.jit(
        lambda table: moe_forward(
            params, x, mesh=mesh, placement_arrays=pa, tables=dispatch_tables.keyed(table, pa), config=config
        )
    )
    counts = np.asarray(run(dispatch_tables.uniform(pl).table).counts)
    old = np.asarray(dispatch_tables.static(pl).table)  # [D, E, R] one-hot per source rank
    new = np.broadcast_to(
        dispatch_tables.from_plan(solve(DispatchProblem(counts, pl, COST), "tempo")).table, old.shape
    ).copy()
    ref = reference(x)
    invalid = pl.log2phy < 0
    loads = set()
    for k in (0, 1, E // 2, E - 1, E):
        res = run(jnp.asarray(_torn(old, new, k)))
        _close(res.out, ref)
        assert int(np.asarray(res.stats.drops).sum()) == 0
        assert (np.asarray(res.stats.replica_counts)[:, invalid] == 0).all()
        loads.add(tuple(np.asarray(res.stats.gpu_tokens).tolist()))
    assert len(loads) > 1  # the tears really routed differently


def test_publishing_while_the_layer_runs(setup):
    """A publisher thread installs torn tables into the module as fast as it can while the serving thread runs
    steps: every step's output equals the reference."""
    pl, config, *_ = setup
    moe = MoE(config, pl, mesh=make_ep_mesh(D), rngs=nnx.Rngs(params=3, dispatch=4))
    reference = jax.jit(lambda x: moe_reference(moe.logical_params(), x, config))
    counts_tab = dispatch_tables.perturbed(dispatch_tables.uniform(pl), seed=5)
    old, new = np.asarray(dispatch_tables.uniform(pl).table), np.asarray(counts_tab.table)
    stop, published = threading.Event(), [0]

    def publisher():
        k = 0
        while not stop.is_set():
            moe.set_tables(dispatch_tables.Tables(_torn(old, new, k % (E + 1)), pl.log2phy))
            published[0] += 1
            k += 1
            time.sleep(0.001)

    thread = threading.Thread(target=publisher, daemon=True)
    thread.start()
    try:
        for s in range(6):
            x = jax.random.normal(jax.random.key(s), (TOKENS, H))
            _close(moe(x), reference(x))
    finally:
        stop.set()
        thread.join()
    assert published[0] > 6
