"""2 processes × 4 CPU devices (gloo on 127.0.0.1) give the same MoE outputs as 1 process × 8 devices."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _env(devices: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(
        JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", PYTHON=sys.executable
    )
    return env


def test_two_processes_match_one(tmp_path):
    ref = tmp_path / "ref.npz"
    mh = tmp_path / "mh.npz"
    subprocess.run(
        [sys.executable, "scripts/multihost_moe.py", "--out", str(ref)], cwd=ROOT, env=_env(8), check=True, timeout=300
    )
    r = subprocess.run(
        ["bash", "scripts/launch_multihost.sh", "2", "4", str(mh)],
        cwd=ROOT, env=_env(4), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    a, b = np.load(mh), np.load(ref)
    assert int(a["processes"]) == 2 and int(b["processes"]) == 1 and int(a["devices"]) == int(b["devices"]) == 8
    assert np.isfinite(a["out"]).all()
    np.testing.assert_allclose(a["out"], b["out"], atol=1e-5, rtol=1e-5)
    np.testing.assert_array_equal(a["counts"], b["counts"])
    # the refresher's counter read gathers a counter spread over both processes (process_allgather)
    assert not bool(a["addressable"]) and bool(b["addressable"])
    np.testing.assert_array_equal(a["counter"], b["counter"])
    np.testing.assert_array_equal(a["counter"], a["counts"])  # one call from zero: counter = counts
