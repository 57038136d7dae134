"""The prepared GPU run (scripts/gpu_check.sh) runs end to end in its CPU smoke mode.

GPU sessions are rare and short, so the script they run must not rot in between: this runs the very same
steps (kernel check, benchmark with the expert-FFN profile, MoE-layer check) with tiny shapes and the Pallas
kernels in interpret mode, and checks what a GPU session would bring back. The smoke run takes minutes of
interpret-mode kernels, so it is marked slow: `make test-all` and `make gpu-smoke` run it.
"""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pallas_kernels import tokamax_backend
from solvers import read_samples

ROOT = Path(__file__).resolve().parents[1]
EXPECTED = {f"{s}.{ext}" for s in ("check", "bench_gemm", "moe_check") for ext in ("json", "log")}
EXPECTED |= {"profile.csv", "env.txt"}


def _report(folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "scripts/gpu_report.py", str(folder)], cwd=ROOT, capture_output=True)


@pytest.mark.slow  # 3–8 minutes of interpret-mode kernels on this box; `make test-all` and `make gpu-smoke`
def test_gpu_check_smoke(tmp_path):
    # The steps have no wall-clock limit in smoke mode (a loaded machine is slow, not broken); the outer timeout
    # only guards against a real hang.
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    env |= {"OUT": str(tmp_path), "PY": sys.executable}
    proc = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--smoke"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    files = {p.name for p in tmp_path.iterdir()}
    assert files == EXPECTED  # at most 8 files: what the lent device machine hands back
    check = json.loads((tmp_path / "check.json").read_text())["check"]
    assert {"dispatch sample", "dispatch quota", "gmm bfloat16 offset=2", "gmm float32 offset=0"} <= set(check)
    tokamax = tokamax_backend.available()
    assert ("tokamax gmm bfloat16 offset=2" in check) == tokamax  # else one "tokamax gmm" row saying why not
    assert all(r["ok"] for n, r in check.items() if tokamax or n != "tokamax gmm")
    assert check["gmm fp8 bfloat16"]["path"] == "dequantize"  # FP8 weights: the Pallas kernel dequantizes first
    assert not tokamax or check["tokamax gmm fp8 bfloat16"]["path"] == "fp8"  # tokamax takes them (CPU: XLA's path)
    bench = json.loads((tmp_path / "bench_gemm.json").read_text())
    assert bench["meta"]["plan"] == "smoke" and bench["gpu"]["errors"] == {}
    assert {"tiny_up", "tiny_down"} == set(bench["gpu"]["shapes"])
    names = {r["name"].split(maxsplit=1)[-1] for s in bench["gpu"]["shapes"].values() for r in s["rows"]}
    gemms = {"pallas gmm"} | ({"tokamax gmm"} if tokamax else set())
    assert names == {"dense", "ragged_dot"} | gemms | {f"{g} fp8" for g in gemms}  # bf16, then FP8 weights
    ceil = bench["gpu"]["ceilings"]
    assert ceil["tflops"] > 0 and ceil["gb_per_s"] > 0
    assert all(r["vs_bound"] > 0 for s in bench["gpu"]["shapes"].values() for r in s["rows"])
    assert set(bench["gpu"]["profile"]) == {"pallas gmm", "ragged_dot"} | ({"tokamax gmm"} if tokamax else set())
    moe = json.loads((tmp_path / "moe_check.json").read_text())
    layer = {"padded/chunked", "padded/pallas"} | ({"padded/tokamax"} if tokamax else set())
    assert moe["devices"] == 8 and set(moe["results"]) == layer | {f"{n}/fp8" for n in layer}
    cascade = moe["cascade"]  # CascadeEP schedules and OEWF against the synchronous layer
    assert (
        cascade["ran"]
        and cascade["ok"]
        and [r["mode"] for r in cascade["results"]] == ["sync", "async", "async_sf", "cascade"]
    )
    assert max(r["max_abs_diff_vs_sync"] for r in cascade["results"]) < 1e-3
    assert all(r["ok"] and r["max_abs_err"] < (2e-2 if "fp8" in n else 1e-4) for n, r in moe["results"].items())
    assert {r["fp8_path"] for n, r in moe["results"].items() if "fp8" in n} == {"dequantize"} | (
        {"fp8"} if tokamax else set()
    )
    assert moe["plans"] and all(r["ok"] and r["relief_ms"] > 0 and r["copies_ms"] > 0 for r in moe["plans"].values())
    # The profile is what `tempo-jax calibrate` fits: G, N, tiles T and t (µs), all positive.
    with open(tmp_path / "profile.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * 3 and list(rows[0]) == ["G", "N", "T", "t"]
    G, N, T, t = (np.array([float(r[c]) for r in rows]) for c in ("G", "N", "T", "t"))
    assert G.tolist() == [1] * 3 + [2] * 3 and N.tolist() == [1, 8, 24, 2, 16, 48] and (t > 0).all()
    assert {k: v.tolist() for k, v in read_samples(tmp_path / "profile.csv").items()} == {
        "G": G.tolist(),
        "N": N.tolist(),
        "T": T.tolist(),
        "t": t.tolist(),
    }
    # Six smoke cells cannot determine the tile model (two values of G): calibrate fits or refuses in one line.
    fit = subprocess.run(
        [sys.executable, "-m", "tempo_jax", "calibrate", str(tmp_path / "profile.csv")],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert fit.returncode in (0, 2) and "Traceback" not in fit.stderr, fit.stderr
    assert "summary" in proc.stdout and "calibrate:" in proc.stdout
    # The report a GPU session commits: tables for every step and the profile figure.
    rep = _report(tmp_path)
    assert rep.returncode == 0, rep.stderr.decode()[-2000:]
    text = (tmp_path / "report.md").read_text()
    parts = ("Kernel correctness", "dispatch quota | ok | bit-exact", "tiny_down", "vs bound", "n* =", "padded/")
    fp8 = ("FP8 path: dequantize", "FP8 weights: tokamax", "/fp8 | ok")  # which path the FP8 rows took
    for part in parts + fp8:
        assert part in text, part
    assert (tmp_path / "profile.png").stat().st_size > 10_000


def test_gpu_report_names_what_is_missing(tmp_path):
    (tmp_path / "env.txt").write_text("no GPU\n")
    assert _report(tmp_path).returncode == 0
    text = (tmp_path / "report.md").read_text()
    assert all(f"{name}: missing" in text for name in ("check.json", "bench_gemm.json", "moe_check.json"))
    bad = _report(tmp_path / "nope")
    assert bad.returncode == 2 and b"is not a folder" in bad.stderr
