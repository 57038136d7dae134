"""The prepared GPU run (scripts/gpu_check.sh) runs end to end in its CPU smoke mode, and its report renders it.

GPU sessions are rare and short, so the script they run must not rot in between: the slow test runs the very same
steps (kernel check; benchmark with every grouped GEMM available, the flat-regime sweep and the expert-FFN profile;
the in-graph plans and the MoE layer per exchange x gmm) with tiny shapes and the kernels in interpret mode — the
Mosaic GPU kernel in Mosaic GPU's interpret mode where jax >= 0.12, a "not run" row with the reason below — and checks
every section a GPU session would bring back and that the report renders each. It takes minutes of interpret-mode
kernels, so it is marked slow: `make test-all` and `make gpu-smoke` run it. The fast tests render a synthetic run
(every section, every goal verdict), so a section the report drops fails CI at once, and check the step limits and
the "not run" bookkeeping of the benchmark.
"""

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pallas_kernels import gmm_mosaic, tokamax_backend, triton_backend
from solvers import read_samples

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_report  # noqa: E402  (scripts/: matplotlib, solvers; no JAX)

EXPECTED = {f"{s}.{ext}" for s in ("check", "bench_gemm", "moe_check") for ext in ("json", "log")}
EXPECTED |= {"profile.csv", "env.txt"}
GMMS = ("mosaic gmm", "tokamax gmm", "pallas gmm", "ragged_dot")  # bench_gemm.GPU_GMMS
LAYER = {"mosaic gmm": "mosaic", "tokamax gmm": "tokamax", "pallas gmm": "pallas", "ragged_dot": "ragged_dot"}
EXCHANGES = ("padded", "ragged", "ragged_split", "ring")  # gpu_moe_check.EXCHANGES
VERDICT = re.compile(r"\| (met|not met|not run[^|]*) \|$")


def _report(folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "scripts/gpu_report.py", str(folder)], cwd=ROOT, capture_output=True)


def _goal_verdicts(text: str) -> dict[str, str]:
    """Goal title → its verdict cell, from the report's goals table."""
    out = {}
    for _, title, _ in gpu_report.GOALS:
        line = next(ln for ln in text.splitlines() if ln.startswith(f"| {title} |"))
        out[title] = VERDICT.search(line).group(1)
    return out


def _expected_gmms() -> tuple[set[str], set[str]]:
    """(the grouped GEMMs a smoke run measures here, those it reports as not run): the Mosaic GPU kernel where jax
    >= 0.12, tokamax where installed, the Pallas kernel where JAX has not deprecated its Triton backend."""
    ran = {"ragged_dot"}
    ran |= {"mosaic gmm"} if gmm_mosaic.available() else set()
    ran |= {"tokamax gmm"} if tokamax_backend.available() else set()
    ran |= set() if triton_backend.deprecated() else {"pallas gmm"}
    return ran, set(GMMS) - ran


@pytest.mark.slow  # 2–3 minutes of interpret-mode kernels here (jax 0.10, 0.12); `make test-all`, `make gpu-smoke`
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
    ran, missing = _expected_gmms()
    mosaic, tokamax = "mosaic gmm" in ran, tokamax_backend.available()

    # 1. the kernel check: every kernel that runs here passes; a "not run" row (ok None) for each that cannot
    check = json.loads((tmp_path / "check.json").read_text())["check"]
    assert {"dispatch sample", "dispatch quota", "gmm bfloat16 offset=2", "gmm float32 offset=0"} <= set(check)
    assert ("tokamax gmm bfloat16 offset=2" in check) == tokamax  # else one "tokamax gmm" row saying why not
    assert ("mosaic gmm float32 offset=2" in check) == mosaic  # else one "mosaic gmm" row saying why not
    placeholders = {g for g, runs in (("tokamax gmm", tokamax), ("mosaic gmm", mosaic)) if not runs}
    assert {n for n, r in check.items() if r["ok"] is None} == placeholders
    assert all(r["ok"] is not False for r in check.values()), check
    if not mosaic:
        assert "jax >= 0.12" in check["mosaic gmm"]["not_run"]
    assert check["gmm fp8 bfloat16"]["path"] == "dequantize"  # FP8 weights: the Pallas kernel dequantizes first
    assert not tokamax or check["tokamax gmm fp8 bfloat16"]["path"] == "fp8"  # tokamax takes them (CPU: XLA's path)
    assert not mosaic or check["mosaic gmm fp8 bfloat16"]["path"] == "fp8"  # read as e4m3 in the Mosaic kernel

    # 2. the benchmark: implementations, ceilings, the shapes table, the flat-regime sweep, the profile
    bench = json.loads((tmp_path / "bench_gemm.json").read_text())
    gpu = bench["gpu"]
    assert bench["meta"]["plan"] == "smoke" and gpu["errors"] == {} and gpu["skipped"] == []
    assert {n for n, s in gpu["implementations"].items() if s == "runs"} == ran
    assert set(gpu["not_run"]) == missing and all(gpu["not_run"].values())
    ceil = gpu["ceilings"]
    assert ceil["tflops"] > 0 and ceil["gb_per_s"] > 0 and set(ceil["copies"]) == {"scale", "copy"}
    assert {"tiny_up", "tiny_down"} == set(gpu["shapes"])
    for s in gpu["shapes"].values():
        timed = {r["impl"] for r in s["rows"] if "best_s" in r}
        assert timed == {"dense"} | ran | {f"{g} fp8" for g in ran}  # bf16, then FP8 weights, every one that runs
        assert {r["impl"] for r in s["rows"] if "not_run" in r} == missing | {f"{g} fp8" for g in missing}
        assert all(r["vs_bound"] > 0 for r in s["rows"] if "best_s" in r)
        assert {r["kind"] for r in s["rows"] if "best_s" in r} == {"", "balanced", "skewed"}
    flat = gpu["flat"]
    assert set(flat["cells"]) == ran and set(flat["not_run"]) == missing
    for impl, cells in flat["cells"].items():
        assert len(cells) == len(flat["rows_per_group"]) * len(flat["groups"]) == 4
        assert all(c["us"] > 0 and c["frac_copy"] > 0 and c["frac_matmul"] > 0 for c in cells), impl
        assert {c["weight_copies"] for c in cells} == {1, 2}  # G = 1 rotates two weight copies, G = 4 one
        assert {g: type(m["within_tol"]) for g, m in flat["monotone"][impl].items()} == {"1": bool, "4": bool}
    assert set(gpu["profile"]) == ran and set(gpu["profile_not_run"]) == missing
    assert all(len(p) == 6 for p in gpu["profile"].values())

    # 3. the MoE step: plans, the layer per call on one device (every exchange x gmm), the layer on 8 devices
    moe = json.loads((tmp_path / "moe_check.json").read_text())
    assert moe["devices"] == 8
    assert moe["plans"] and all(r["ok"] and r["relief_ms"] > 0 and r["copies_ms"] > 0 for r in moe["plans"].values())
    per_call = moe["per_call"]
    names = {f"{ex}/{LAYER[g]}" for ex in EXCHANGES for g in GMMS} | {f"padded/{LAYER[g]}/fp8" for g in GMMS}
    assert set(per_call) == names
    for name, r in per_call.items():
        ex, impl = name.split("/")[:2]
        runs = impl in {LAYER[g] for g in ran} and ex not in ("ragged", "ragged_split")  # XLA:CPU: no ragged a2a
        assert (r["ok"] is True and r["ms"] > 0 and r["max_abs_err"] < (2e-2 if "fp8" in name else 1e-4)) == runs, r
        assert runs or (r["ok"] is None and r["not_run"])
        assert not runs or (r["kernels"]["moe_ffn"] > 0 and r["kernels"]["moe_dispatch"] > 0)  # what stages launch
    in_kernel = {"mosaic gmm", "tokamax gmm"}  # FP8 weights read as e4m3 in the kernel; the others dequantize first
    assert {g: per_call[f"padded/{LAYER[g]}/fp8"]["fp8_path"] for g in ran} == {
        g: "fp8" if g in in_kernel else "dequantize" for g in ran
    }
    assert set(moe["results"]) == {"padded/chunked", "padded/pallas"}  # across 8 ranks (FP8: the per-call grid)
    assert all(r["ok"] and r["max_abs_err"] < 1e-4 for r in moe["results"].values())
    cascade = moe["cascade"]  # CascadeEP schedules and OEWF against the synchronous layer
    assert (
        cascade["ran"]
        and cascade["ok"]
        and [r["mode"] for r in cascade["results"]] == ["sync", "async", "async_sf", "cascade"]
    )
    assert max(r["max_abs_diff_vs_sync"] for r in cascade["results"]) < 1e-3

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

    # The report a GPU session commits: every section, the goals with a verdict each, the two figures.
    rep = _report(tmp_path)
    assert rep.returncode == 0, rep.stderr.decode()[-2000:]
    text = (tmp_path / "report.md").read_text()
    for heading in gpu_report.SECTIONS:
        assert f"\n{heading}" in text, heading
    parts = ("dispatch quota | ok | bit-exact", "tiny_down", "vs bound", "padded/", "| ring |", "× copy")
    fp8 = ("FP8 path: dequantize", "FP8 weights: tokamax", "| padded/fp8 |")  # which path the FP8 rows took
    for part in parts + fp8:
        assert part in text, part
    for g in missing:  # every implementation that did not run says so, with its reason
        assert f"| {g} | not run: {gpu['not_run'][g]} |" in text
    verdicts = _goal_verdicts(text)
    assert verdicts[gpu_report.GOALS[4][1]].startswith("not run: cell EP8 E256+64 B512 not measured")  # smoke: EP4
    assert all(v.startswith("not run") for v in verdicts.values()) != mosaic  # the Mosaic goals: measured or why not
    assert (tmp_path / "profile.png").stat().st_size > 10_000 and (tmp_path / "flat.png").stat().st_size > 10_000


# ------------------------------------------------------------------------------------------------------ fast tests
def _synthetic_run(folder: Path, *, mosaic: bool, graphs_equal: bool = False, falling: bool = False) -> None:
    """A GPU run's eight files in miniature: every section the report renders, numbers chosen so the goals come out
    met (vs dense, the FFN's a), not met (bandwidth, monotone, the plan), or, without the Mosaic gmm, not run.
    ``graphs_equal``: the plan as CUDA graphs (90 µs) gave the same plan as its default compilation (250 µs);
    ``falling``: every profile's time falls with the load (noise of a loaded machine), which no Eq. 1 fits."""
    folder.mkdir(exist_ok=True)
    (folder / "env.txt").write_text("2026-12-04 | jax 0.12.1 | NVIDIA H100\n")
    why = "needs jax >= 0.12 with Pallas Mosaic GPU (jax 0.11.2 here)"
    check = {
        "mosaic gmm bfloat16 offset=0": {"max_rel_err": {"out": 1e-3, "dlhs": 2e-3}, "tol": 0.02, "ok": True},
        "tokamax gmm": {"not_run": "tokamax is not installed here", "ok": None},
        "dispatch quota": {"exact": True, "ok": True},
    }
    if not mosaic:
        check = {"mosaic gmm": {"not_run": why, "ok": None}} | check
    (folder / "check.json").write_text(json.dumps({"meta": {"plan": "full"}, "check": check}))
    impls = {
        "mosaic gmm": "runs" if mosaic else why,
        "tokamax gmm": "runs",
        "pallas gmm": "deprecated",
        "ragged_dot": "runs",
    }
    ran = [g for g, s in impls.items() if s == "runs"]
    not_run = {g: s for g, s in impls.items() if s != "runs"}

    def row(name, impl, kind, vs_dense):
        return dict(name=name, impl=impl, kind=kind, best_s=1e-3, throughput=600 * vs_dense, gb_per_s=800.0,
                    vs_dense=vs_dense, vs_bound=0.8 * vs_dense)  # fmt: skip

    rows = [row("dense", "dense", "", 1.0)]
    rows += [row(f"{k:8s} {g}", g, k, 0.9 if k == "balanced" else 0.6) for k in ("balanced", "skewed") for g in ran]
    rows += [{"name": n, "impl": n, "kind": "", "not_run": w} for g, w in not_run.items() for n in (g, f"{g} fp8")]
    flat_rows, groups = [1, 2, 4, 256], [1, 4]
    cells = {}
    for g in ran:
        cells[g] = []
        for G in groups:
            for r in flat_rows:
                us = {1: 30.0, 2: 31.0, 4: 29.0 if G == 4 else 32.0, 256: 90.0}[r]  # G = 4: a step down at 4 rows
                frac = 0.8 if (G, r) == (1, 1) else 0.9
                cell = dict(G=G, rows_per_group=r, M=G * r, us=us, tflops=1.0, frac_matmul=0.01 * r)
                cell |= dict(gb_per_s=2700.0, frac_copy=frac, bandwidth_bound=r < 256, weight_copies=1)
                cells[g].append(cell)
    monotone = {
        g: {"1": {"within_tol": True, "strict": True}, "4": {"within_tol": False, "strict": False}} for g in ran
    }
    # Eq. 1 with a = 5 µs: the fit recovers it (met); ragged_dot's profile has too few points to fit (not run)
    prof = [
        dict(G=G, tokens_per_expert=n, N=G * n, tiles=G * -(-n // 128), us=max(5 + 20 * G, 3 + 0.2 * G * n))
        for G in (1, 4, 16)
        for n in (1, 64, 512, 2048)
    ]
    if falling:
        prof = [r | dict(us=1000.0 / (1 + r["N"])) for r in prof]
    profile = {g: (prof[:3] if g == "ragged_dot" else prof) for g in ran}
    gpu = {
        "rows": 8192,
        "local_experts": 16,
        "implementations": impls,
        "not_run": not_run,
        "ceilings": {"tflops": 700.0, "gb_per_s": 3000.0, "copies": {"scale": 2900.0, "copy": 3000.0}},
        "tiling": None,
        "errors": {},
        "skipped": ["profile ragged_dot G=16 n=2048"],
        "shapes": {"dsv3_up": {"k": 7168, "n": 4096, "rows_per_group": 512, "rows": rows}},
        "flat": dict(
            shape="dsv3_up",
            k=7168,
            n=4096,
            rows_per_group=flat_rows,
            groups=groups,
            chain=8,
            monotone_tol=0.05,
            cells=cells,
            monotone=monotone,
            not_run=not_run,
        ),  # fmt: skip
        "profile": profile,
        "profile_not_run": not_run,
        "profile_csv": {"path": "profile.csv", "implementation": ran[0]},
    }
    (folder / "bench_gemm.json").write_text(json.dumps({"meta": {"plan": "full"}, "gpu": gpu}))
    layer = {}
    for ex in EXCHANGES:
        for g, s in impls.items():
            ok = s == "runs"
            layer[f"{ex}/{LAYER[g]}"] = (
                dict(max_abs_err=1e-3, drops=0, ms=0.5, ok=True, kernels={"moe_dispatch": 1, "moe_ffn": 7})
                if ok
                else dict(not_run=s, ok=None)
            )
    moe = {
        "devices": 1,
        "backend": "gpu",
        "plans": {
            "EP8 E256+64 B512": dict(
                relief_ms=0.25,
                relief_graph_ms=0.09,
                relief_graph_equal=graphs_equal,
                copies_ms=0.1,
                rounds=3,
                relief_ms_per_round=0.08,
                ok=True,
            )
        },
        "plan_goal_cell": "EP8 E256+64 B512",
        "per_call": layer,
        "results": layer,
        "presets": {},
        "cascade": {"ok": True, "ran": False},
    }
    (folder / "moe_check.json").write_text(json.dumps(moe))


@pytest.mark.parametrize("mosaic", [True, False], ids=["mosaic", "no-mosaic"])
def test_gpu_report_renders_every_section(tmp_path, mosaic):
    _synthetic_run(tmp_path, mosaic=mosaic)
    rep = _report(tmp_path)
    assert rep.returncode == 0, rep.stderr.decode()[-2000:]
    text = (tmp_path / "report.md").read_text()
    for heading in gpu_report.SECTIONS:  # a section the report drops fails here
        assert f"\n{heading}" in text, heading
    verdicts = _goal_verdicts(text)
    titles = [t for _, t, _ in gpu_report.GOALS]
    if mosaic:
        assert [verdicts[t] for t in titles] == ["met", "not met", "not met", "met", "not met"], verdicts
        assert "min 0.80 (G = 1, 1 rows/group)" in text and "G = 1: yes, G = 4: no" in text
        assert "| mosaic gmm | 5" in text  # the fitted fixed cost, per implementation
    else:
        assert all(verdicts[t].startswith("not run: needs jax >= 0.12") for t in titles[:4]), verdicts
        assert verdicts[titles[4]] == "not met"  # the plan does not need the Mosaic gmm
        assert "- mosaic gmm: not run: needs jax >= 0.12" in text  # the flat sweep names it
        assert "| mosaic gmm | not run: needs jax >= 0.12" in text  # the implementations table too
    assert "| ragged_dot | not run: 3 points (a fit needs 4)" in text
    assert "| pallas gmm | not run: deprecated |" in text  # a row for the implementation that did not run
    assert "time budget: 1 cases not run" in text
    assert "| case | moe_dispatch | moe_ffn | (outside) |" in text  # what each stage launches, per case
    assert (tmp_path / "flat.png").stat().st_size > 10_000 and (tmp_path / "profile.png").stat().st_size > 10_000


@pytest.mark.parametrize("equal", [True, False])
def test_the_plan_goal_counts_cuda_graphs_only_where_they_give_the_same_plan(tmp_path, equal):
    """The plan's goal (≤ 100 µs) takes the better of the default compilation and CUDA graphs
    (`gpu_moe_check.GRAPH_OPTIONS`) only where the two plans are equal; the plans table shows both."""
    _synthetic_run(tmp_path, mosaic=True, graphs_equal=equal)
    assert _report(tmp_path).returncode == 0
    text = (tmp_path / "report.md").read_text()
    verdict = _goal_verdicts(text)[gpu_report.GOALS[4][1]]
    assert verdict == ("met" if equal else "not met"), verdict
    assert ("as CUDA graphs 90 µs" in text) == equal
    assert "| EP8 E256+64 B512 | 0.25 | 0.09 |" in text


def test_the_report_says_a_profile_no_model_fits_rather_than_failing(tmp_path):
    """A profile whose times fall with the load (a smoke run on a loaded CPU gave one) makes `solvers.fit_max_affine`
    refuse its samples: the report still renders, and the FFN goal and the profile table say why there is no fit."""
    _synthetic_run(tmp_path, mosaic=True, falling=True)
    rep = _report(tmp_path)
    assert rep.returncode == 0, rep.stderr.decode()[-2000:]
    text = (tmp_path / "report.md").read_text()
    verdict = _goal_verdicts(text)[gpu_report.GOALS[3][1]]
    assert verdict.startswith("not run: the profile's fit refused its samples (fit_max_affine: "), verdict
    assert "| mosaic gmm | fit refused: fit_max_affine: the samples contradict the model" in text


def test_gpu_report_names_what_is_missing(tmp_path):
    (tmp_path / "env.txt").write_text("no GPU\n")
    assert _report(tmp_path).returncode == 0
    text = (tmp_path / "report.md").read_text()
    assert all(f"{name}: missing" in text for name in ("check.json", "bench_gemm.json", "moe_check.json"))
    assert all(v.startswith("not run") for v in _goal_verdicts(text).values())
    bad = _report(tmp_path / "nope")
    assert bad.returncode == 2 and b"is not a folder" in bad.stderr


def test_gpu_check_fits_one_device_call():
    """The GPU step limits sum to at most 540 s (one device call of 9 minutes), each step gets a deadline inside its
    limit, and the eight files it brings back are the ones the report reads."""
    script = (ROOT / "scripts" / "gpu_check.sh").read_text()
    line = next(ln for ln in script.splitlines() if ln.startswith("LIMIT_CHECK="))  # the GPU limits (smoke: none)
    limits = dict(re.findall(r"(LIMIT_\w+)=(\d+)", line))
    assert set(limits) == {"LIMIT_CHECK", "LIMIT_BENCH", "LIMIT_MOE"} and sum(map(int, limits.values())) <= 540
    assert "--deadline" in script and int(re.search(r"MARGIN=(\d+)", script).group(1)) > 0


def test_bench_gemm_says_why_not(tmp_path):
    """Every grouped GEMM the GPU benchmark knows is either run or has a reason, and a case past the step's deadline
    is a "not run: time budget" row, not a missing one."""
    import time

    import bench_gemm

    status = bench_gemm.gmm_status(interpret=True)
    ran, missing = _expected_gmms()
    assert tuple(status) == bench_gemm.GPU_GMMS == GMMS and set(bench_gemm.GMM_IMPL) == set(GMMS)
    assert {g for g, why in status.items() if why is None} == ran and all(status[g] for g in missing)
    out = {}
    run = bench_gemm._Cases(out, bench_gemm.GpuPlan.smoke(), deadline=time.time() - 1)
    assert run("late case", lambda x: x, np.ones(3)) == {"not_run": bench_gemm.TIME_BUDGET}
    assert out == {"errors": {}, "skipped": ["late case"]}
