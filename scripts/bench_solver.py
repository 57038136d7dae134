"""Solver benchmark (`make bench-solver`): tempo vs every policy vs the proven optimum, and solve times.

Suites (TEMPO §4.2 "Optimality and cost"):
  synthetic  Zipf s ∈ {0, 0.6, 1.2} × B ∈ {32, 128, 512, 2048} tokens/GPU × EP ∈ {8, 16, 32}, 1.25× replicas
             with EPLB placement from the long-run popularity; DSv3 (E=256, top-8, dsv3_fp8_offline) and Qwen3
             (E=128, top-8, qwen3_30b_offline) presets.
  real       batches of the recorded traces (FLAME-MoE-290M, HarMoEny switch-128 and Qwen1.5-MoE ranks) at
             their recorded EP, 1.25× EPLB placement from each layer's total load, DSv3 preset.
  timing     tempo solve time at EP8, E=256, 64 redundant slots, B ≤ 256 (the paper's 1.9 ms figure).

Prints one table per suite and writes results/bench_solver.json. Ratios are makespan / MILP optimum (only
instances the MILP proved optimal count; the others are reported against the MILP's proven bound).

    python scripts/bench_solver.py                 # default size (minutes on 2 cores)
    python scripts/bench_solver.py --quick         # a smoke-sized run
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from solvers import PRESETS, DispatchProblem, Placement, slots_for, solve
from tempo_jax.report import table
from tempo_jax.workloads import SyntheticRouting, load_sample, load_trace

POLICIES = ["static", "uniform", "token_lp", "metro", "llep", "tempo"]
MODELS = {"dsv3": ("dsv3_fp8_offline", 256, 8), "qwen3": ("qwen3_30b_offline", 128, 8)}


def eplb(load: np.ndarray, ep: int, replication: float = 1.25) -> Placement:
    return Placement.from_eplb(load, slots_for(load.shape[0], ep, replication), ep, spread_idle=True)


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


def run_instance(problem: DispatchProblem, milp_limit: float, repeats: int) -> dict:
    rec: dict = {}
    for policy in POLICIES:
        times = []
        for _ in range(repeats):
            d = solve(problem, policy)
            times.append(d.info["solve_time_s"])
        rec[policy] = {"makespan": d.makespan, "solve_ms": 1e3 * float(np.median(times))}
    tempo = solve(problem, "tempo")
    if milp_limit > 0:
        m = solve(problem, "milp", time_limit=milp_limit, hint=tempo.x)
        best = min(m.makespan, tempo.makespan)
        rec["milp"] = {
            "makespan": best,
            "bound": m.lower_bound,
            "status": m.info.get("status"),
            "solve_ms": 1e3 * m.info["solve_time_s"],
        }
    return rec


def summarise(rows: list[dict], title: str) -> tuple[str, dict]:
    tempo = np.array([r["tempo"]["makespan"] for r in rows])
    summary: dict = {"instances": len(rows)}
    lines = []
    if rows and "milp" in rows[0]:
        opt = [(r["tempo"]["makespan"], r["milp"]["makespan"]) for r in rows if r["milp"]["status"] == "optimal"]
        ratio = np.array([t / o for t, o in opt]) if opt else np.array([np.nan])
        vs_bound = np.array([r["tempo"]["makespan"] / r["milp"]["bound"] for r in rows])
        summary["tempo_vs_opt"] = dict(
            proven=len(opt), mean=float(np.mean(ratio)), p95=float(np.percentile(ratio, 95)), max=float(np.max(ratio))
        )
        summary["tempo_vs_bound_max"] = float(vs_bound.max())
        summary["milp_ms_median"] = float(np.median([r["milp"]["solve_ms"] for r in rows]))
        lines.append(
            f"tempo / OPT over {len(opt)}/{len(rows)} proven-optimal instances: mean {np.mean(ratio):.4f}, "
            f"p95 {np.percentile(ratio, 95):.4f}, max {np.max(ratio):.4f}  (paper: 1.005 / 1.024 / 1.033); "
            f"tempo / bound max {vs_bound.max():.4f}; MILP median {summary['milp_ms_median']:.0f} ms"
        )
    table_rows = []
    for policy in POLICIES:
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke-sized run")
    ap.add_argument("--batches", type=int, default=3, help="batches per cell")
    ap.add_argument("--milp-time-limit", type=float, default=10.0, help="0 disables the MILP")
    ap.add_argument("--repeats", type=int, default=3, help="timing repeats per policy (median reported)")
    ap.add_argument("--real-layers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="results/bench_solver.json")
    args = ap.parse_args(argv)
    args.skews, args.batch_sizes, args.eps = (0.0, 0.6, 1.2), (32, 128, 512, 2048), (8, 16, 32)
    if args.quick:
        args.batches, args.eps, args.batch_sizes, args.real_layers = 1, (8,), (32, 512), 1
        args.milp_time_limit = min(args.milp_time_limit, 5.0)

    results: dict = {
        "command": "python scripts/bench_solver.py" + (" --quick" if args.quick else ""),
        "machine": f"{platform.processor() or platform.machine()}, {platform.python_version()}",
        "args": {k: v for k, v in vars(args).items() if isinstance(v, int | float | str | tuple)},
        "suites": {},
    }
    t0 = time.time()
    for suite, make in (("synthetic", synthetic_instances), ("real", real_instances)):
        instances = make(args)
        rows = []
        for key, problem in tqdm(instances, desc=suite, unit="batch"):
            rows.append({**key, **run_instance(problem, args.milp_time_limit, args.repeats)})
        text, summary = summarise(rows, f"\n== {suite}: {len(rows)} batches, ratios vs tempo (lower is better)")
        print(text)
        results["suites"][suite] = {"summary": summary, "rows": rows}

    # Timing suite: the paper's operating point.
    routing = SyntheticRouting(num_experts=256, top_k=8, s=1.2, kappa=2000.0, seed=args.seed)
    placement = eplb(routing.popularity, 8)
    timing = {}
    for B in (32, 64, 128, 256, 1024, 2048):
        ms = []
        for i in range(20 if not args.quick else 5):
            problem = DispatchProblem(routing.batch(B, 8, 1000 + i), placement, PRESETS["dsv3_fp8_offline"])
            ms.append(1e3 * solve(problem, "tempo").info["solve_time_s"])
        timing[B] = dict(median_ms=float(np.median(ms)), p95_ms=float(np.percentile(ms, 95)))
    print(
        table(
            [(B, v["median_ms"], v["p95_ms"]) for B, v in timing.items()],
            ["B", "tempo ms median", "p95"],
            title="\n== timing: EP8, E=256, 320 slots (64 redundant), DSv3 preset (paper: 1.9 ms for B ≤ 256)",
        )
    )
    results["timing"] = timing
    results["wall_s"] = time.time() - t0
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1, default=float))
    print(f"\nwrote {out} in {results['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
