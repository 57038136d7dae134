"""2 processes × 4 CPU devices (gloo on 127.0.0.1) give the same MoE outputs as 1 process × 8 devices: on one ``ep``
axis over both processes, and on a data × ep mesh with ``data`` across the processes and ``ep`` inside each (how
multi-node EP is deployed when the links between nodes are slow)."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _env(devices: int) -> dict:
    """The run's environment with ``devices`` CPU devices per process (the compile flags of conftest.py kept)."""
    kept = [f for f in os.environ.get("XLA_FLAGS", "").split() if "xla_force_host_platform_device_count" not in f]
    flags = " ".join([*kept, f"--xla_force_host_platform_device_count={devices}"])
    return dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=flags, PYTHON=sys.executable)


def _one_and_two_processes(tmp_path: Path, mode: str = "sample", *args: str):
    """scripts/multihost_moe.py with the same arguments on 1 process × 8 devices (``ref.npz``) and on 2 processes ×
    4 devices (``mh.npz``, through scripts/launch_multihost.sh); returns their arrays (two processes, one)."""
    ref, mh = tmp_path / "ref.npz", tmp_path / "mh.npz"
    one = [sys.executable, "scripts/multihost_moe.py", "--out", str(ref), "--dispatch-mode", mode, *args]
    subprocess.run(one, cwd=ROOT, env=_env(8), check=True, timeout=300)
    two = ["bash", "scripts/launch_multihost.sh", "2", "4", str(mh), mode, *args]
    r = subprocess.run(two, cwd=ROOT, env=_env(4), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return np.load(mh), np.load(ref)


@pytest.mark.slow  # fast twin: the checkpoint test below (the same two launches, loaded weights, counters too)
def test_two_processes_match_one(tmp_path):
    a, b = _one_and_two_processes(tmp_path)
    assert int(a["processes"]) == 2 and int(b["processes"]) == 1 and int(a["devices"]) == int(b["devices"]) == 8
    assert np.isfinite(a["out"]).all()
    np.testing.assert_allclose(a["out"], b["out"], atol=1e-5, rtol=1e-5)
    np.testing.assert_array_equal(a["counts"], b["counts"])
    # the refresher's counter read gathers a counter spread over both processes (process_allgather)
    assert not bool(a["addressable"]) and bool(b["addressable"])
    np.testing.assert_array_equal(a["counter"], b["counter"])
    np.testing.assert_array_equal(a["counter"], a["counts"])  # one call from zero: counter = counts


def test_two_processes_load_a_checkpoint_each_reading_only_its_slots(tmp_path):
    """`load_moe_layers(folder, mesh=..., placement=...)` on 2 processes × 4 devices: every process reads from the
    safetensors files only the experts of its own 8 slots; the gathered expert arrays equal the single-process load
    and the layer's output equals it. Both runs dispatch in the step (``dispatch="ingraph"``, issue 38): the plan's
    counts all-gathered across the two processes give the same per-rank tokens as one process."""
    import json

    from hf_reference import FAMILY_CONFIGS, hf_state
    from safetensors.numpy import save_file

    config = {**FAMILY_CONFIGS["qwen3_moe"], "num_hidden_layers": 1}
    state = hf_state("qwen3_moe", config, seed=3)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    names = sorted(state)
    save_file(
        {f"model.layers.0.mlp.{k}": state[k].astype(np.float32) for k in names[::2]},
        str(ckpt / "model-00001-of-00002.safetensors"),
    )
    save_file(
        {f"model.layers.0.mlp.{k}": state[k].astype(np.float32) for k in names[1::2]},
        str(ckpt / "model-00002-of-00002.safetensors"),
    )
    (ckpt / "config.json").write_text(json.dumps(config))
    a, b = _one_and_two_processes(tmp_path, "quota", "--checkpoint", str(ckpt), "--dispatch", "ingraph")
    assert int(a["processes"]) == 2 and int(b["processes"]) == 1
    for k in ("w_gate", "w_up", "w_down"):
        np.testing.assert_array_equal(a[k], b[k])  # the same tensors, read in pieces
    np.testing.assert_allclose(a["out"], b["out"], atol=1e-5, rtol=1e-5)
    phy2log = a["phy2log"].reshape(2, -1)  # process p's devices hold slots [8p, 8p + 8)
    np.testing.assert_array_equal(a["counts"], b["counts"])
    np.testing.assert_array_equal(a["gpu_tokens"], b["gpu_tokens"])  # the same in-graph plan on both
    # the refresher's counter read gathers a counter spread over both processes (process_allgather)
    assert not bool(a["addressable"]) and bool(b["addressable"])
    np.testing.assert_array_equal(a["counter"], b["counter"])
    np.testing.assert_array_equal(a["counter"], a["counts"])  # one call from zero: counter = counts
    for p in range(2):
        read = set(json.loads((tmp_path / f"mh.npz.reads{p}.json").read_text()))
        assert read == set(phy2log[p].tolist()), (p, read)
    assert set(json.loads((tmp_path / "ref.npz.reads0.json").read_text())) == set(range(8))


def test_data_across_two_processes_and_ep_inside_each_equals_one_process(tmp_path):
    """``--mesh data=2,ep=4`` (issue 49): each process is one EP group of 4 ranks, so every exchange stays inside a
    process and only the counts' and losses' sums cross between them; outputs, summed counts, the counter and every
    device's tokens equal one process running the same mesh on 8 devices."""
    a, b = _one_and_two_processes(tmp_path, "quota", "--mesh", "data=2,ep=4")
    assert int(a["processes"]) == 2 and int(b["processes"]) == 1
    np.testing.assert_allclose(a["out"], b["out"], atol=1e-5, rtol=1e-5)
    assert a["counts"].shape == (4, 12)  # [D, E]: the two EP groups' counts summed
    np.testing.assert_array_equal(a["counts"], b["counts"])
    np.testing.assert_array_equal(a["counter"], b["counter"])
    assert a["gpu_tokens"].shape == (8,)  # one per device: group b's rank d at 4b + d
    np.testing.assert_array_equal(a["gpu_tokens"], b["gpu_tokens"])
