"""Solver benchmark (`make bench-solver`): tempo vs every policy vs the proven optimum, and solve times.

Suites (TEMPO §4.2 "Optimality and cost"):
  synthetic  Zipf s ∈ {0, 0.6, 1.2} × B ∈ {32, 128, 512, 2048} tokens/GPU × EP ∈ {8, 16, 32}, 1.25× replicas
             with EPLB placement from the long-run popularity, Dirichlet fluctuation κ = 2000; DSv3 (E=256,
             top-8, dsv3_fp8_offline) and Qwen3 (E=128, top-8, qwen3_30b_offline) presets.
  real       batches of the recorded traces (FLAME-MoE-290M, HarMoEny switch-128 and Qwen1.5-MoE ranks) at
             their recorded EP, 1.25× EPLB placement from each layer's total load, DSv3 preset.
  timing     tempo solve time at EP8, E=256, 64 redundant slots, B ≤ 2048 (the paper's 1.9 ms figure).
  issue      issue 15's generator and grid: top-8 per token without replacement, Plackett–Luce over Zipf(s)
             weights shuffled over expert ids (no batch fluctuation), EP8, E = 256 + 64 redundant slots
             (`slots_for`, `Placement.from_eplb(..., spread_idle=True)` from the popularity), DSv3 fp8 offline;
             s ∈ {0.6, 1.2, 2.0} × B ∈ {16, 32, …, 4096} tokens per GPU; 12 timed solves per cell after 3
             warm-ups, MILP on the first timed batch of each cell.
  scale      the same generator at EP32 / EP64 × E = 256 (top-8) / E = 384 (DeepSeek-V4-Pro, top-6) × 1.25× /
             1.5× replication, s ∈ {0.6, 1.2} × B ∈ {16, 64, 256, 1024, 4096}; 6 timed solves after 1 warm-up.

``--baseline REV`` also runs the tempo of git revision REV (its `solvers` package, extracted with ``git archive``
and imported under another name) on the same instances in the same process, interleaved solve by solve, so
before/after share the machine's load. Prints one table per suite (ms median, p90/p95; quality ratios) and writes
results/bench_solver.json. Ratios are makespan / MILP optimum (only instances the MILP proved optimal count).

    python scripts/bench_solver.py                              # everything (tens of minutes on 2 cores)
    python scripts/bench_solver.py --baseline 2fb076e           # ... with the pre-issue-15 tempo beside it
    python scripts/bench_solver.py --suites issue,scale --milp-time-limit 0   # timing only
    python scripts/bench_solver.py --quick                      # a smoke-sized run
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import math
import os
import platform
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from solvers import PRESETS, SWEEP_POLICIES, DispatchProblem, Placement, slots_for, solve
from tempo_jax.text import table
from tempo_jax.workloads import SyntheticRouting, load_sample, load_trace

POLICIES = list(SWEEP_POLICIES)
MODELS = {"dsv3": ("dsv3_fp8_offline", 256, 8), "qwen3": ("qwen3_30b_offline", 128, 8)}
SUITES = ("synthetic", "real", "timing", "issue", "scale")
ISSUE_SKEWS, ISSUE_B = (0.6, 1.2, 2.0), (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
SCALE_CONFIGS = [(ep, E, K, rep) for ep in (32, 64) for E, K in ((256, 8), (384, 6)) for rep in (1.25, 1.5)]
SCALE_SKEWS, SCALE_B = (0.6, 1.2), (16, 64, 256, 1024, 4096)


def eplb(load: np.ndarray, ep: int, replication: float = 1.25) -> Placement:
    return Placement.from_eplb(load, slots_for(load.shape[0], ep, replication), ep, spread_idle=True)


# ---------------------------------------------------------------------------------------------- baseline
def load_baseline(rev: str):
    """The `solvers` package of git revision ``rev`` as a separate module ``solvers_<rev>`` (numpy-only, so it
    imports next to the current one: every import inside it is relative)."""
    root = Path(__file__).resolve().parents[1]
    blob = subprocess.run(["git", "archive", rev, "solvers"], cwd=root, check=True, capture_output=True).stdout
    dest = Path(tempfile.mkdtemp(prefix="bench_solver_"))
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        tar.extractall(dest, filter="data")
    name = f"solvers_{rev.replace('-', '_').replace('.', '_')}"
    spec = importlib.util.spec_from_file_location(
        name, dest / "solvers" / "__init__.py", submodule_search_locations=[str(dest / "solvers")]
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def as_baseline(mod, problem: DispatchProblem):
    """The same problem in the baseline package's classes."""
    pl = problem.placement
    placement = mod.Placement.from_phy2log(pl.phy2log, pl.num_gpus, pl.gpus_per_node, pl.num_experts)
    cost = mod.CostModel(**{k: v for k, v in problem.cost.to_dict().items()})
    return mod.DispatchProblem(np.asarray(problem.tokens), placement, cost)


def variants(baseline) -> dict:
    """name → (solve function on a current problem) returning (makespan, ms, info)."""

    def current(problem):
        d = solve(problem, "tempo")
        return d.makespan, 1e3 * d.info["solve_time_s"], d.info

    out = {"after": current}
    if baseline is not None:

        def before(problem, mod=baseline):
            d = mod.solve(as_baseline(mod, problem), "tempo")
            return d.makespan, 1e3 * d.info["solve_time_s"], d.info

        out = {"before": before, "after": current}
    return out


# ---------------------------------------------------------------------------------------------- suites
def synthetic_instances(args) -> list[tuple[dict, DispatchProblem]]:
    out = []
    for model, (preset, E, K) in MODELS.items():
        for s in args.skews:
            for ep in args.eps:
                routing = SyntheticRouting(num_experts=E, top_k=K, s=s, kappa=2000.0, seed=args.seed)
                placement = eplb(routing.popularity, ep)
                for B in args.batch_sizes:
                    for i in range(args.batches):
                        counts = routing.batch(B, ep, i)
                        key = dict(suite="synthetic", model=model, s=s, ep=ep, B=B, batch=i)
                        out.append((key, DispatchProblem(counts, placement, PRESETS[preset])))
    return out


def real_instances(args) -> list[tuple[dict, DispatchProblem]]:
    out = []
    specs = [
        ("flame_moe_290m", 8, (64, 128, 256)),
        ("harmoeny_switch128", 8, (256, 1024)),
        ("harmoeny_qwen", 6, (256,)),
    ]
    for name, ep, sizes in specs:
        try:
            trace = load_trace(name)
        except (FileNotFoundError, ValueError):
            trace = load_sample(name)
        for layer in trace.layers[: args.real_layers]:
            placement = eplb(trace.expert_load(layer), ep)
            for B in sizes:
                nb = min(trace.num_batches(layer, B, ep), args.batches)
                for i in range(nb):
                    counts = trace.batch_counts(layer, B, ep, batch=i)
                    key = dict(suite="real", model=name, layer=layer, ep=ep, B=B, batch=i)
                    out.append((key, DispatchProblem(counts, placement, PRESETS["dsv3_fp8_offline"])))
    return out


def milp_optimum(problem: DispatchProblem, hint: np.ndarray, limit: float, **options) -> dict:
    m = solve(problem, "milp", time_limit=limit, hint=hint, **options)
    return {
        "makespan": m.makespan,
        "bound": m.lower_bound,
        "status": m.info.get("status"),
        "solve_ms": 1e3 * m.info["solve_time_s"],
    }


def run_instance(problem: DispatchProblem, milp_limit: float, repeats: int, runs: dict, free: bool = False) -> dict:
    rec: dict = {}
    for policy in POLICIES:
        times = []
        for _ in range(repeats):
            d = solve(problem, policy)
            times.append(d.info["solve_time_s"])
        rec[policy] = {"makespan": d.makespan, "solve_ms": 1e3 * float(np.median(times))}
    tempo = solve(problem, "tempo")
    if "before" in runs:
        mk, ms, _ = runs["before"](problem)
        rec["tempo_before"] = {"makespan": mk, "solve_ms": ms}
    if milp_limit > 0:
        rec["milp"] = milp_optimum(problem, tempo.x, milp_limit)
        rec["milp"]["makespan"] = min(rec["milp"]["makespan"], tempo.makespan)
        if free:  # the pre-issue-15 MILP: free-running two-worker CP-SAT, wall-clock limit
            rec["milp_free"] = milp_optimum(problem, tempo.x, milp_limit, deterministic=False, threads=2)
    return rec


def quality(rows: list[dict], key: str) -> dict:
    """tempo (or ``key``) / MILP optimum over the proven-optimal rows: mean, p95, max."""
    pairs = [
        (r[key]["makespan"], r["milp"]["makespan"]) for r in rows if "milp" in r and r["milp"]["status"] == "optimal"
    ]
    if not pairs:
        return {"proven": 0, "mean": math.nan, "p95": math.nan, "max": math.nan}
    ratio = np.array([t / min(o, t) for t, o in pairs])  # a baseline with real-valued shares may beat integer OPT
    return dict(
        proven=len(pairs), mean=float(ratio.mean()), p95=float(np.percentile(ratio, 95)), max=float(ratio.max())
    )


def summarise(rows: list[dict], title: str) -> tuple[str, dict]:
    tempo = np.array([r["tempo"]["makespan"] for r in rows])
    summary: dict = {"instances": len(rows)}
    lines = []
    if rows and "milp" in rows[0]:
        q = quality(rows, "tempo")
        vs_bound = np.array([r["tempo"]["makespan"] / r["milp"]["bound"] for r in rows])
        summary["tempo_vs_opt"] = q
        summary["tempo_vs_bound_max"] = float(vs_bound.max())
        summary["milp_ms_median"] = float(np.median([r["milp"]["solve_ms"] for r in rows]))
        summary["milp_ms_total"] = float(np.sum([r["milp"]["solve_ms"] for r in rows]))
        lines.append(
            f"tempo / OPT over {q['proven']}/{len(rows)} proven-optimal instances: mean {q['mean']:.4f}, "
            f"p95 {q['p95']:.4f}, max {q['max']:.4f}  (paper: 1.005 / 1.024 / 1.033; target mean ≤ 1.001, "
            f"max ≤ 1.01); tempo / bound max {vs_bound.max():.4f}; MILP median {summary['milp_ms_median']:.0f} ms"
        )
        if "milp_free" in rows[0]:
            free = [r["milp_free"] for r in rows]
            summary["milp_free"] = dict(
                ms_median=float(np.median([f["solve_ms"] for f in free])),
                ms_total=float(np.sum([f["solve_ms"] for f in free])),
                proven=sum(f["status"] == "optimal" for f in free),
            )
            mf = summary["milp_free"]
            lines.append(
                f"MILP reproducible (1 worker, deterministic clock): median {summary['milp_ms_median']:.0f} ms, "
                f"total {summary['milp_ms_total'] / 1e3:.1f} s, {q['proven']} proven; free-running 2 workers: "
                f"median {mf['ms_median']:.0f} ms, total {mf['ms_total'] / 1e3:.1f} s, {mf['proven']} proven"
            )
        if "tempo_before" in rows[0]:
            qb = quality(rows, "tempo_before")
            summary["tempo_before_vs_opt"] = qb
            lines.append(
                f"before (baseline tempo) / OPT: mean {qb['mean']:.4f}, p95 {qb['p95']:.4f}, max {qb['max']:.4f}"
            )
    table_rows = []
    names = POLICIES + (["tempo_before"] if rows and "tempo_before" in rows[0] else [])
    for policy in names:
        r = np.array([row[policy]["makespan"] for row in rows]) / tempo
        t = np.array([row[policy]["solve_ms"] for row in rows])
        summary[policy] = dict(
            ratio_median=float(np.median(r)),
            ratio_p95=float(np.percentile(r, 95)),
            ms_median=float(np.median(t)),
            ms_p95=float(np.percentile(t, 95)),
        )
        table_rows.append((policy, *summary[policy].values()))
    text = table(table_rows, ["policy", "/tempo median", "/tempo p95", "ms median", "ms p95"], title=title)
    return text + ("\n" + "\n".join(lines) if lines else ""), summary


def timing_cell(cell: dict, runs: dict, timed: int, warmup: int, milp_batches: int, milp_limit: float) -> dict:
    """Solve ``warmup + timed`` batches of one cell with every variant, interleaved batch by batch; MILP on the
    first ``milp_batches`` timed ones."""
    routing = SyntheticRouting(num_experts=cell["E"], top_k=cell["K"], s=cell["s"], kappa=math.inf, seed=0)
    placement = eplb(routing.popularity, cell["ep"], cell["rep"])
    cost = PRESETS["dsv3_fp8_offline"]
    out = {name: {"ms": [], "makespan": [], "stage": [], "gap": []} for name in runs}
    opt = []
    for i in range(warmup + timed):
        problem = DispatchProblem(routing.batch(cell["B"], cell["ep"], i), placement, cost)
        for name, run in runs.items():
            mk, ms, info = run(problem)
            if i < warmup:
                continue
            rec = out[name]
            rec["ms"].append(ms)
            rec["makespan"].append(mk)
            rec["stage"].append(str(info.get("stage")))
            rec["gap"].append(float(info.get("gap", math.nan)))
        if i >= warmup and i - warmup < milp_batches and milp_limit > 0:
            hint = solve(problem, "tempo").x
            opt.append(milp_optimum(problem, hint, milp_limit) | {"index": i - warmup})
    for rec in out.values():
        ms = np.array(rec["ms"])
        rec.update(median=float(np.median(ms)), p90=float(np.percentile(ms, 90)), p95=float(np.percentile(ms, 95)))
        rec["max"] = float(ms.max())
        rec["ratios"] = [
            rec["makespan"][o["index"]] / min(o["makespan"], rec["makespan"][o["index"]])
            for o in opt
            if o["status"] == "optimal"
        ]
    return {**cell, "variants": out, "milp": opt}


def timing_cells(suite: str, args) -> list[dict]:
    if suite == "issue":
        return [dict(suite=suite, ep=8, E=256, K=8, rep=1.25, s=s, B=B) for s in args.issue_skews for B in args.issue_b]
    return [
        dict(suite=suite, ep=ep, E=E, K=K, rep=rep, s=s, B=B)
        for ep, E, K, rep in args.scale_configs
        for s in args.scale_skews
        for B in args.scale_b
    ]


def report_timing(suite: str, cells: list[dict], names: list[str]) -> tuple[str, dict]:
    """Tables: median ms (p90 / p95) per cell and variant; quality ratios per variant."""
    out, summary = [], {}
    if suite == "issue":
        for name in names:
            rows = []
            for s in sorted({c["s"] for c in cells}):
                row = [s]
                for c in [c for c in cells if c["s"] == s]:
                    v = c["variants"][name]
                    row.append(f"{v['median']:.2f} ({v['p90']:.1f}/{v['p95']:.1f})")
                rows.append(row)
            bs = sorted({c["B"] for c in cells})
            out.append(
                table(rows, ["s", *[f"B={b}" for b in bs]], title=f"\n== issue grid, {name}: tempo ms median (p90/p95)")
            )
    else:
        for name in names:
            rows = []
            keys = sorted({(c["ep"], c["E"], c["K"], c["rep"], c["s"]) for c in cells})
            bs = sorted({c["B"] for c in cells})
            for key in keys:
                sel = [c for c in cells if (c["ep"], c["E"], c["K"], c["rep"], c["s"]) == key]
                label = f"EP{key[0]} E={key[1]} top-{key[2]} {key[3]}× s={key[4]}"
                v = [c["variants"][name] for c in sel]
                rows.append([label, *[f"{x['median']:.1f} ({x['p95']:.0f})" for x in v]])
            out.append(
                table(
                    rows, ["config", *[f"B={b}" for b in bs]], title=f"\n== scale rows, {name}: tempo ms median (p95)"
                )
            )
    for name in names:
        med = np.array([c["variants"][name]["median"] for c in cells])
        p95 = np.array([c["variants"][name]["p95"] for c in cells])
        ratios = np.array([r for c in cells for r in c["variants"][name]["ratios"]])
        stages: dict = {}
        for c in cells:
            for st in c["variants"][name]["stage"]:
                stages[st] = stages.get(st, 0) + 1
        summary[name] = dict(
            cell_median_max=float(med.max()),
            cell_p95_max=float(p95.max()),
            ratio_proven=int(ratios.size),
            ratio_mean=float(ratios.mean()) if ratios.size else math.nan,
            ratio_max=float(ratios.max()) if ratios.size else math.nan,
            stages=stages,
        )
        s = summary[name]
        out.append(
            f"{name}: worst cell median {s['cell_median_max']:.2f} ms, worst cell p95 {s['cell_p95_max']:.2f} ms; "
            f"tempo / OPT over {s['ratio_proven']} proven: mean {s['ratio_mean']:.4f}, max {s['ratio_max']:.4f}"
        )
    return "\n".join(out), summary


def load_snapshot() -> dict:
    """Machine load when the run starts and ends (1-minute load average; the benchmark itself adds ~1)."""
    try:
        return {"loadavg": os.getloadavg()[0], "cpus": os.cpu_count()}
    except OSError:
        return {}


def _parse(argv: list[str]) -> tuple[argparse.Namespace, list[str], dict]:
    """The arguments with the suites' grids (``--quick`` shrinks them), the suites to run (unknown ones refused) and
    the warm-up solves per issue / scale cell."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke-sized run")
    ap.add_argument("--suites", default=",".join(SUITES), help=f"comma-separated subset of {SUITES}")
    ap.add_argument("--baseline", default=None, help="git revision whose tempo runs beside the current one")
    ap.add_argument("--batches", type=int, default=3, help="batches per cell (synthetic / real suites)")
    ap.add_argument("--milp-time-limit", type=float, default=10.0, help="0 disables the MILP")
    ap.add_argument("--repeats", type=int, default=3, help="timing repeats per policy (median reported)")
    ap.add_argument("--real-layers", type=int, default=2)
    ap.add_argument("--issue-batches", type=int, default=12, help="timed solves per issue/scale cell")
    ap.add_argument("--scale-batches", type=int, default=6, help="timed solves per scale cell")
    ap.add_argument("--milp-batches", type=int, default=1, help="MILP-checked batches per issue/scale cell")
    ap.add_argument("--milp-free", action="store_true", help="also time the free-running (old default) MILP")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="results/bench_solver.json")
    args = ap.parse_args(argv)
    args.skews, args.batch_sizes, args.eps = (0.0, 0.6, 1.2), (32, 128, 512, 2048), (8, 16, 32)
    args.issue_skews, args.issue_b = ISSUE_SKEWS, ISSUE_B
    args.scale_configs, args.scale_skews, args.scale_b = SCALE_CONFIGS, SCALE_SKEWS, SCALE_B
    warm = {"issue": 3, "scale": 1}
    if args.quick:
        args.batches, args.eps, args.batch_sizes, args.real_layers = 1, (8,), (32, 512), 1
        args.milp_time_limit = min(args.milp_time_limit, 5.0)
        args.issue_batches, args.scale_batches, warm = 3, 2, {"issue": 1, "scale": 1}
        args.issue_skews, args.issue_b = (1.2,), (32, 512)
        args.scale_configs, args.scale_skews, args.scale_b = [(32, 384, 6, 1.5)], (1.2,), (256,)
    suites = [s for s in args.suites.split(",") if s]
    unknown = sorted(set(suites) - set(SUITES))
    if unknown:
        raise SystemExit(f"error: unknown suite(s) {unknown}; valid: {list(SUITES)}")
    return args, suites, warm


def policy_suite(suite: str, instances: list[tuple[dict, DispatchProblem]], args, runs: dict) -> dict:
    """The synthetic or real suite: every policy (and the MILP) on each instance; prints the ratio table and returns
    ``{"summary", "rows"}``."""
    rows = []
    for key, problem in tqdm(instances, desc=suite, unit="batch"):
        rows.append({**key, **run_instance(problem, args.milp_time_limit, args.repeats, runs, args.milp_free)})
    text, summary = summarise(rows, f"\n== {suite}: {len(rows)} batches, ratios vs tempo (lower is better)")
    print(text)
    return {"summary": summary, "rows": rows}


def timing_suite(args, runs: dict) -> dict:
    """The paper's operating point (EP8, E=256, s=1.2, κ = 2000, DSv3): every variant's solve time over 20 batches
    (5 with ``--quick``) per B; prints the table and returns ``{B: {variant: {"median_ms", "p95_ms"}}}``."""
    routing = SyntheticRouting(num_experts=256, top_k=8, s=1.2, kappa=2000.0, seed=args.seed)
    placement = eplb(routing.popularity, 8)
    timing = {}
    for B in (32, 64, 128, 256, 1024, 2048):
        ms: dict = {name: [] for name in runs}
        for i in range(20 if not args.quick else 5):
            problem = DispatchProblem(routing.batch(B, 8, 1000 + i), placement, PRESETS["dsv3_fp8_offline"])
            for name, run in runs.items():
                ms[name].append(run(problem)[1])
        timing[B] = {
            name: dict(median_ms=float(np.median(v)), p95_ms=float(np.percentile(v, 95))) for name, v in ms.items()
        }
    print(
        table(
            [(B, *[f"{v[n]['median_ms']:.2f} / {v[n]['p95_ms']:.2f}" for n in runs]) for B, v in timing.items()],
            ["B", *[f"{n}: ms median / p95" for n in runs]],
            title="\n== timing: EP8, E=256, 320 slots (64 redundant), κ = 2000, DSv3 (paper: 1.9 ms for B ≤ 256)",
        )
    )
    return timing


def warm_variants(runs: dict) -> None:
    """Solve once with every variant a batch that reaches tempo's CP-SAT level search (its first call loads the
    solver: ~0.1–0.2 s paid once by a long-lived worker, not per solve)."""
    routing = SyntheticRouting(num_experts=256, top_k=8, s=1.2, kappa=2000.0, seed=0)
    warm_problem = DispatchProblem(routing.batch(512, 8, 2), eplb(routing.popularity, 8), PRESETS["dsv3_fp8_offline"])
    for run in runs.values():
        run(warm_problem)


def cell_suite(suite: str, args, runs: dict, warmup: int) -> dict:
    """The issue or scale suite: `timing_cell` over its grid with ``warmup`` untimed solves per cell; prints its
    tables and returns ``{"summary", "cells"}``."""
    timed = args.issue_batches if suite == "issue" else args.scale_batches
    cells = [
        timing_cell(c, runs, timed, warmup, args.milp_batches, args.milp_time_limit)
        for c in tqdm(timing_cells(suite, args), desc=suite, unit="cell")
    ]
    text, summary = report_timing(suite, cells, list(runs))
    print(text)
    return {"summary": summary, "cells": cells}


def write_results(results: dict, out: Path, t0: float) -> None:
    """Add the end load and the wall time since ``t0`` to ``results``, write it to ``out`` and say so."""
    results["load_end"] = load_snapshot()
    results["wall_s"] = time.time() - t0
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1, default=float))
    print(
        f"\nwrote {out} in {results['wall_s']:.0f} s (load average {results['load_start'].get('loadavg')} → "
        f"{results['load_end'].get('loadavg')})"
    )


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args, suites, warm = _parse(argv)
    runs = variants(load_baseline(args.baseline) if args.baseline else None)
    results: dict = {
        "command": "python scripts/bench_solver.py " + " ".join(argv),
        "machine": f"{platform.processor() or platform.machine()}, {platform.python_version()}",
        "load_start": load_snapshot(),
        "args": {k: v for k, v in vars(args).items() if isinstance(v, int | float | str | tuple | type(None))},
        "suites": {},
    }
    t0 = time.time()
    for suite, make in (("synthetic", synthetic_instances), ("real", real_instances)):
        if suite in suites:
            results["suites"][suite] = policy_suite(suite, make(args), args, runs)
    if "timing" in suites:
        results["timing"] = timing_suite(args, runs)
    if "issue" in suites or "scale" in suites:
        warm_variants(runs)
    for suite in ("issue", "scale"):
        if suite in suites:
            results["suites"][suite] = cell_suite(suite, args, runs, warm[suite])
    write_results(results, Path(args.out), t0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
