"""Reliability, round 6 (issue 73): what careless input does to the surfaces wave 5 added — meshes and their helpers,
layouts across meshes, the metrics watcher, `serve`'s metrics options, `report` and the CLI. Each test failed before
its fix (the item numbers are the issue's)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import tempo_jax
from solvers import PRESETS, Dispatch, DispatchProblem, Placement, expected_dispatch, plan_weights
from tempo_jax.cli import main
from tempo_jax.layer import MoEConfig, make_ep_mesh, make_mesh, moe_reference
from tempo_jax.layer.exchange import lowering_for
from tempo_jax.metrics import Watcher, WatchOptions, capture
from tempo_jax.metrics.record import layer_record
from tempo_jax.metrics.report import read_run

ROOT = Path(__file__).resolve().parents[1]
CFG = MoEConfig(hidden=8, ffn=4, experts=8, top_k=2, slots_per_rank=2)
COST = PRESETS["dsv3_fp8_offline"]


def _moe(config=CFG, placement=None, mesh=None, seed=0):
    mesh = make_ep_mesh(8) if mesh is None else mesh
    D = mesh.shape[config.axis]
    placement = Placement.spread(config.experts, D, config.slots_per_rank) if placement is None else placement
    return tempo_jax.MoE(config, placement, mesh=mesh, rngs=nnx.Rngs(params=seed, dispatch=1))


def _x(T=64, H=8, seed=1):
    return jax.random.normal(jax.random.key(seed), (T, H))


# ---------------------------------------------------------------------------------------- 1, 9, 16: the meshes
def test_make_mesh_refuses_a_mode_that_is_not_a_bool_and_a_device_named_twice():
    with pytest.raises(ValueError, match="make_mesh: explicit must be True or False, got 'False'"):
        make_mesh(ep=8, explicit="False")  # 1: a non-empty string is true: it built an Explicit mesh
    assert make_mesh(ep=8, explicit=np.bool_(False)).axis_types[0] == jax.sharding.AxisType.Auto
    d = jax.devices()
    with pytest.raises(ValueError, match=r"device .* is listed twice \(positions 0 and 1\)"):
        make_mesh(ep=4, devices=[d[0], d[0], d[1], d[2]])  # 9: accepted, then failed inside safe_zip at a call


@pytest.mark.parametrize("n", [0, -1, 9, 2.0, True])
def test_make_ep_mesh_refuses_a_device_count_it_cannot_build(n):
    with pytest.raises(ValueError, match="make_ep_mesh: num_devices must be a positive int no larger than the 8"):
        make_ep_mesh(n)  # 16: 0 meant every device, -1 gave JAX's message


def test_the_layer_refuses_a_placement_for_another_rank_count():
    """17: a placement for 8 ranks on a 4-rank axis (same slot count) was accepted, and the mesh's own placement
    refused by a later set_placement."""
    cfg = MoEConfig(hidden=8, ffn=4, experts=16, top_k=2, slots_per_rank=8)
    mesh = make_mesh(data=2, ep=4)
    with pytest.raises(ValueError, match=r"the placement spans 8 ranks, the mesh's 'ep' axis 4.*spread\(16, 4, 8\)"):
        _moe(cfg, Placement.spread(16, 8, 4), mesh)
    moe = _moe(cfg, Placement.spread(16, 4, 8), mesh)
    moe.set_placement(Placement.spread(16, 4, 8))


# ---------------------------------------------------------------------- 2: one rule for activations on a rank
def test_two_replicas_on_one_rank_are_one_group_and_priced_as_one_activation():
    """2: with phy2log [0, 0, 1, 1, …] and uniform tables the layer computed each rank's expert as two groups (two
    weight streams): live 29.56 µs against EPLB-even = optimum = 14.78. Now the layer merges them, and the record,
    the solvers and the executed groups agree; the output is the reference's, eager and under jit."""
    placement = Placement.from_phy2log(np.repeat(np.arange(8), 2), 8, None, 8)
    moe = _moe(placement=placement)
    x = _x(256)
    y = moe(x)
    rec = layer_record(capture(moe).layers()[0], COST, policy="tempo")
    assert rec["activated"] == [1] * 8
    mk = rec["makespan_us"]
    assert mk["live"] == pytest.approx(mk["eplb_even"]) and mk["live"] == pytest.approx(mk["optimum"])
    want = moe_reference(moe.logical_params(), x, CFG)
    np.testing.assert_allclose(np.asarray(y), np.asarray(want), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(nnx.jit(lambda m, t: m(t))(moe, x)), np.asarray(want), rtol=1e-5, atol=1e-5)


def test_merged_replicas_give_the_reference_gradients_and_no_extra_flops():
    """2, under `jax.jit(jax.grad)`: each slot of the rank's twice-held expert gets the expert's whole logical
    gradient (replicas tied), x's gradient is the reference's, and the compiled forward multiplies no more than on
    a placement of distinct experts per rank (no row computed twice)."""
    from tempo_jax.layer import init_logical_params, moe_forward, to_physical
    from tempo_jax.layer import tables as dispatch_tables

    mesh = make_ep_mesh(8)
    logical = init_logical_params(jax.random.key(5), CFG)
    x = _x(256, seed=6)

    def loss_fn(placement):
        pa, tables = dispatch_tables.placement_arrays(placement), dispatch_tables.uniform(placement)
        return lambda p, x: jnp.sum(
            moe_forward(p, x, mesh=mesh, placement_arrays=pa, tables=tables, config=CFG).out ** 2
        )

    twice = Placement.from_phy2log(np.repeat(np.arange(8), 2), 8, None, 8)
    params = to_physical(logical, twice, mesh=mesh, config=CFG)
    gp, gx = jax.jit(jax.grad(loss_fn(twice), argnums=(0, 1)))(params, x)
    want_p, want_x = jax.grad(lambda p, x: jnp.sum(moe_reference(p, x, CFG) ** 2), argnums=(0, 1))(logical, x)
    np.testing.assert_allclose(np.asarray(gx), np.asarray(want_x), rtol=2e-5, atol=2e-5 * float(jnp.abs(want_x).max()))
    for k, g in to_physical(want_p, twice).items():
        scale = float(jnp.abs(g).max())
        np.testing.assert_allclose(np.asarray(gp[k]), np.asarray(g), rtol=2e-5, atol=2e-5 * scale, err_msg=k)

    def flops(placement):
        p = to_physical(logical, placement, mesh=mesh, config=CFG)
        return jax.jit(loss_fn(placement)).lower(p, x).compile().cost_analysis()["flops"]

    assert flops(twice) <= flops(Placement.spread(8, 8, 2))


def test_a_mixed_placement_executes_the_groups_the_solvers_price():
    """2, the general rule: ranks holding one expert twice beside ranks holding two experts: the layer's groups per
    rank are the (expert, rank) pairs with tokens — `solvers` G_g of the loads the tables produce — and the live
    makespan is the solvers' for those loads."""
    phy2log = np.array([0, 0, 1, 2, 3, 3, 4, 5, 6, 6, 7, 7, 1, 2, 4, 5])  # ranks 0, 2, 4, 5: one expert twice
    placement = Placement.from_phy2log(phy2log, 8, None, 8)
    moe = _moe(placement=placement)
    x = _x(512, seed=3)
    moe(x)
    stats = capture(moe).layers()[0]
    rec = layer_record(stats, COST)
    counts = np.asarray(stats["shard_counts"], np.float64)  # [D, E] per source rank
    loads = expected_dispatch(plan_weights("uniform", placement), counts.sum(0), placement)
    priced = Dispatch(loads, DispatchProblem(counts, placement, COST), "uniform")
    assert rec["activated"] == priced.gpu_activations.astype(int).tolist()
    assert rec["activated"][0] == 1 and rec["activated"][1] == 2
    assert rec["makespan_us"]["live"] == pytest.approx(rec["makespan_us"]["eplb_even"])  # flat regime: G decides


# ------------------------------------------------------------------------------ 4, 5, 6, 7, 10: the layer's call
def test_logical_params_on_an_explicit_mesh():
    """4: `to_logical` on a layer built on make_mesh(explicit=True) failed with "'int' object is not callable"."""
    moe = _moe(mesh=make_mesh(ep=8, explicit=True))
    logical = moe.logical_params()
    assert logical["w_up"].shape == (8, 8, 4)


def test_a_call_without_a_hidden_axis_is_refused_naming_x():
    moe = _moe()
    with pytest.raises(ValueError, match=r"MoE: x must be \[\.\.\., H=8\] .*got shape \[\]"):
        moe(jnp.ones(()))  # 5: IndexError
    with pytest.raises(ValueError, match=r"got shape \[4, 3\]"):
        moe(jnp.ones((4, 3)))


@pytest.mark.parametrize("exchange", ["ragged", "ragged_split"])
def test_the_ragged_exchange_is_refused_on_cpu(exchange):
    cfg = MoEConfig(hidden=8, ffn=4, experts=8, top_k=2, slots_per_rank=2, exchange=exchange)
    with pytest.raises(ValueError, match=f"exchange='{exchange}'.*XLA:CPU does not implement.*'padded'"):
        _moe(cfg)(_x())  # 6: XLA's UNIMPLEMENTED: ragged-all-to-all
    moe = _moe(cfg)
    with lowering_for("gpu"):  # what the refusal points to: the GPU program, lowered (not run) on this CPU host
        text = nnx.jit(lambda m, x: m(x)).lower(moe, _x()).as_text()
    assert "ragged_all_to_all" in text
    with pytest.raises(ValueError, match="lowering_for: target must be 'gpu' or 'tpu', got 'cpu'"):
        with lowering_for("cpu"):
            pass


def test_weights_move_between_meshes_with_logical_params_and_load_logical():
    """7: weights from a (2, 4) model into a layer on 4 devices: "Received incompatible devices"."""
    cfg = MoEConfig(hidden=8, ffn=4, experts=8, top_k=2, slots_per_rank=2)
    moe24 = _moe(cfg, mesh=make_mesh(data=2, ep=4), seed=3)
    moe4 = _moe(cfg, mesh=make_ep_mesh(4), seed=4)
    moe4.load_logical(moe24.logical_params())
    for k, v in moe24.logical_params().items():
        np.testing.assert_array_equal(np.asarray(moe4.logical_params()[k]), np.asarray(v))
    x = _x(32)
    np.testing.assert_allclose(np.asarray(moe4(x)), np.asarray(moe24(x)), rtol=1e-5, atol=1e-5)


def test_activations_committed_to_one_device_are_moved_onto_the_mesh():
    """10: x committed to one device failed with "incompatible devices … _program.<locals>.run"."""
    moe = _moe()
    x = _x(16)
    want = np.asarray(moe(x))
    np.testing.assert_allclose(np.asarray(moe(jax.device_put(x, jax.devices()[3]))), want, rtol=1e-6, atol=1e-6)
    mask = jax.device_put(jnp.ones((16,), bool), jax.devices()[5])
    np.testing.assert_allclose(np.asarray(moe(x, mask=mask)), want, rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------------------- 11: checkpoints
def test_restoring_on_another_mesh_says_the_mesh_differs(tmp_path):
    """11: a checkpoint of a (2, 4) model restored into the same config on a 1-D mesh said "build the model with
    the saved configuration"; the mesh differs, not the configuration."""
    import orbax.checkpoint as ocp

    moe24 = _moe(mesh=make_mesh(data=2, ep=4))
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(tmp_path / "state", nnx.state(moe24))
    checkpointer.wait_until_finished()
    moe4 = _moe(mesh=make_ep_mesh(4))
    with pytest.raises(ValueError, match=r"stored for 8 token shards \(Ng·D\), this model's mesh has 4.*another mesh"):
        tempo_jax.restore_target(nnx.state(moe4), checkpointer.metadata(tmp_path / "state"))


# ----------------------------------------------------------------------------------- 15: the watcher's arguments
def test_the_watcher_refuses_a_policy_or_cost_it_cannot_use():
    with pytest.raises(ValueError, match="unknown policy 'nope'"):
        Watcher(WatchOptions(), policy="nope")  # accepted; every record was then dropped
    with pytest.raises(TypeError, match="Watcher: cost must be a CostModel"):
        Watcher(WatchOptions(), cost={"a": 1})
    with pytest.raises(TypeError, match="Watcher: options must be a WatchOptions"):
        Watcher({"port": 0})
    for name in ("logdir", "jsonl"):
        with pytest.raises(ValueError, match=f"WatchOptions: {name}='' is not a path"):
            WatchOptions(**{name: ""})


# ------------------------------------------------------------------------ 3, 12, 17: serve's metrics options
def _busy_port():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


def _earlier_run(folder: Path) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"step": 0, "layers": []}) + "\n"
    (folder / "metrics.jsonl").write_text(text)
    return text


def test_a_refused_watcher_leaves_an_earlier_metrics_file_alone(tmp_path):
    """3 at its root: the JSON lines file was opened (truncated) before the port was tried."""
    earlier = _earlier_run(tmp_path)
    with _busy_port() as held:
        port = held.getsockname()[1]
        with pytest.raises(ValueError, match=f"cannot serve /metrics on 127.0.0.1:{port}"):
            Watcher(WatchOptions(port=port, jsonl=str(tmp_path / "metrics.jsonl")), say=lambda *_: None)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="cannot make the logdir folder"):
        Watcher(WatchOptions(logdir=str(tmp_path / "file" / "tb"), jsonl=str(tmp_path / "metrics.jsonl")))
    assert (tmp_path / "metrics.jsonl").read_text() == earlier


def test_serve_checks_its_metrics_options_before_touching_the_output_folder(tmp_path, capsys, monkeypatch):
    """3: a port in use, or a bad --logdir, truncated an earlier run's metrics.jsonl; 12: --logdir FILE failed
    after the run started ("Not a directory"); 17: --logdir '' wrote into ./runs/ and exited 0."""
    earlier = _earlier_run(tmp_path / "out")
    (tmp_path / "file").write_text("x")
    monkeypatch.chdir(tmp_path)
    base = ["serve", "--steps", "1", "--out", str(tmp_path / "out"), "--no-figure", "--quiet"]
    with _busy_port() as held:
        port = held.getsockname()[1]
        assert main([*base, "--metrics-port", str(port)]) == 2
    assert f"--metrics-port {port}: cannot serve /metrics" in capsys.readouterr().err
    for logdir, says in ((tmp_path / "file", "--logdir"), ("", "--logdir is empty")):
        assert main([*base, "--logdir", str(logdir)]) == 2
        assert says in capsys.readouterr().err
    assert (tmp_path / "out" / "metrics.jsonl").read_text() == earlier
    assert not (tmp_path / "runs").exists()


# -------------------------------------------------------------------------------------------- 13, 14: report
def _record(step: int, experts: int, *, balancedness=True) -> dict:
    layer = {
        "expert_tokens": [1] * experts,
        "makespan_us": {"live": 1.0, "eplb_even": 1.0},
        **({"balancedness": {"tokens": 1.0, "time": 1.0}} if balancedness else {}),
    }
    return {"step": step, "layers": [layer]}


def test_report_names_the_line_and_field_it_cannot_read(tmp_path, capsys):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps(_record(0, 8)) + "\n" + json.dumps(_record(1, 8, balancedness=False)) + "\n")
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: layer 0 has no 'balancedness'"):
        read_run(tmp_path)  # 13: KeyError (internal failure)
    path.write_text(json.dumps(_record(0, 8)) + "\n" + json.dumps(_record(1, 16)) + "\n")
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: layer 0 has 16 experts, 8 at line 1"):
        read_run(tmp_path)  # 14: numpy's "inhomogeneous shape"
    assert main(["report", str(tmp_path)]) == 2
    assert "error: report:" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------- 8: the CLI's bench
def test_bench_help_runs_from_any_folder(tmp_path):
    """8: `tempo-jax bench ep --help` outside the checkout: ModuleNotFoundError: bench_meshes (the script imports a
    sibling, which runpy did not put on sys.path)."""
    done = subprocess.run(
        [sys.executable, "-m", "tempo_jax", "bench", "ep", "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "usage: bench_ep.py" in done.stdout
