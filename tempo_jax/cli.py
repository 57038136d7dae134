"""The `tempo-jax` command line (also `python -m tempo_jax`).

Commands:
  demo       the `make demo` job: presets, a real and a synthetic batch, every policy on the real batch
  solve      dispatch one batch from files (counts + placement) or from a routing trace, print/write it
  calibrate  fit the max-affine cost model to logged (G, N, t[, tiles]) samples from a CSV file
  phase      a phase-diagram panel: winning fixed policy and TEMPO's gain per (skew, batch size)
  cascade    CascadeEP prefill: serve a request trace under Sync / Async / Async+SF / CascadeEP, print the table
  serve      the MoE layer serving a routing stream with live tables from the solver worker (the runtime)
  bench      run a benchmark script (solver, gemm, ep)
  reproduce  execute the figure notebooks headless and report failures
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def _load_array(path: str, key: str) -> np.ndarray:
    p = Path(path)
    if not p.exists():
        raise SystemExit(f"error: {path} does not exist")
    if p.suffix == ".npz":
        with np.load(p) as z:
            if key not in z.files:
                raise SystemExit(f"error: {path} has no array {key!r} (arrays: {z.files})")
            return z[key]
    if p.suffix == ".npy":
        return np.load(p)
    data = json.loads(p.read_text())
    return np.asarray(data[key] if isinstance(data, dict) else data)


def _fake_cpu_devices(n: int = 8) -> None:
    """Let the CPU backend expose ``n`` devices (expert parallelism on one host) unless already configured.
    Must run before jax is imported; it does not affect GPUs."""
    import os

    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags and "jax" not in sys.modules:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()


def _cmd_demo(args: argparse.Namespace) -> int:
    _fake_cpu_devices()
    from .demo import run_demo

    run_demo(out_dir=args.out, milp_time_limit=args.milp_time_limit)
    return 0


def _problem_from_args(args: argparse.Namespace):
    from solvers import PRESETS, CostModel, DispatchProblem, Placement

    if args.cost_json:
        cost = CostModel.load(args.cost_json)
    elif args.cost in PRESETS:
        cost = PRESETS[args.cost]
    else:
        raise SystemExit(f"error: unknown cost preset {args.cost!r}; presets: {sorted(PRESETS)}")
    if args.trace:
        from .workloads import load_sample, load_trace

        try:
            trace = load_trace(args.trace)
        except FileNotFoundError:
            trace = load_sample(args.trace)
        layer = args.layer if args.layer is not None else trace.layers[0]
        counts = trace.batch_counts(layer, args.tokens_per_rank, args.gpus, batch=args.batch)
        load = trace.expert_load(layer)
    elif args.counts:
        counts = _load_array(args.counts, "counts")
        load = counts if counts.ndim == 1 else counts.sum(axis=0)
    else:
        raise SystemExit("error: give --counts FILE or --trace NAME")
    if args.placement:
        pdata = json.loads(Path(args.placement).read_text())
        placement = Placement.from_dict(pdata)
    elif args.replicas:
        placement = Placement.from_eplb(load, args.replicas, args.gpus, spread_idle=True)
    else:
        placement = Placement.full(np.shape(counts)[-1], args.gpus)
    return DispatchProblem(counts, placement, cost)


def _cmd_solve(args: argparse.Namespace) -> int:
    from solvers import solve

    from .report import table

    problem = _problem_from_args(args)
    options = json.loads(args.options) if args.options else {}
    d = solve(problem, args.policy, **options)
    rows = [
        (g, int(d.gpu_activations[g]), int(d.gpu_tiles[g]), float(d.gpu_tokens[g]), float(d.gpu_times[g]))
        for g in range(problem.num_gpus)
    ]
    print(table(rows, ["gpu", "experts", "tiles", "tokens", "time µs"], title=f"{args.policy}: {problem.placement}"))
    print(
        f"makespan {d.makespan:.2f} µs, lower bound {d.lower_bound:.2f} µs "
        f"(ratio {d.makespan / max(d.lower_bound, 1e-12):.4f}), solve {d.info['solve_time_s'] * 1e3:.2f} ms"
    )
    if args.out:
        out = Path(args.out)
        payload = {
            "policy": args.policy,
            "x": d.x.tolist(),
            "makespan": d.makespan,
            "lower_bound": d.lower_bound,
            "gpu_times": d.gpu_times.tolist(),
            "placement": problem.placement.to_dict(),
            "cost": problem.cost.to_dict(),
            "info": {k: v for k, v in d.info.items() if isinstance(v, int | float | str | bool)},
        }
        if out.suffix == ".npz":
            np.savez(out, x=d.x, gpu_times=d.gpu_times, phy2log=problem.placement.phy2log)
        else:
            out.write_text(json.dumps(payload, indent=1))
        print(f"wrote {out}")
    return 0


def _cmd_calibrate(args: argparse.Namespace) -> int:
    if args.measure:
        return _cmd_calibrate_measure(args)
    if args.csv is None:
        raise SystemExit("error: give a CSV of G,N,t[,T] samples, or --measure to profile this backend")
    from solvers import fit_max_affine

    data = np.genfromtxt(args.csv, delimiter=",", names=True)
    names = data.dtype.names or ()
    missing = [c for c in ("G", "N", "t") if c not in names]
    if missing:
        raise SystemExit(f"error: {args.csv} lacks columns {missing} (has {list(names)})")
    tiles = data["T"] if "T" in names else None
    model, report = fit_max_affine(data["G"], data["N"], data["t"], tiles=tiles, iters=args.iters)
    print(model.to_json())
    print(
        f"mean relative error {report.mean_rel_error:.2%}, samples per piece {report.samples_per_piece}, "
        f"{report.iterations} iterations, converged={report.converged}, n*={model.inflection:.1f}"
    )
    if args.out:
        model.save(args.out)
    return 0


def _cmd_calibrate_measure(args: argparse.Namespace) -> int:
    """`calibrate --measure`: profile the layer's expert FFN here, fit with CIs, roofline, ranking agreement."""
    from .calibrate import MeasureConfig, measure

    cfg = MeasureConfig.quick() if args.quick else MeasureConfig(bootstrap=args.bootstrap)
    report = measure(cfg, profile_csv=args.profile_csv, out_json=args.report)
    if args.out:
        from solvers import CostModel

        CostModel.from_dict(report["model"]).save(args.out)
        print(f"wrote {args.out} (serve with it: tempo-jax serve --cost-json {args.out})")
    return 0


def _cmd_reproduce(args: argparse.Namespace) -> int:
    from .reproduce import reproduce

    runs = reproduce(args.names, small=args.small)
    failed = [r.name for r in runs if not r.ok]
    if failed:
        print(f"{len(failed)} of {len(runs)} notebooks failed: {failed}", file=sys.stderr)
        return 1
    print(f"all {len(runs)} notebooks ran; figures in notebooks/figures/")
    return 0


def _cmd_phase(args: argparse.Namespace) -> int:
    from .report import table
    from .sim import PhaseConfig, run_phase

    grid = dict(
        presets=(args.preset,),
        eps=(args.ep,),
        replications=(args.replication,),
        skews=tuple(float(v) for v in args.skews.split(",")),
        tokens_per_gpu=tuple(int(v) for v in args.tokens_per_gpu.split(",")),
        batches=args.batches,
    )
    result = run_phase(PhaseConfig(**grid), workers=args.workers)
    letters = result.grid(result.winner(), preset=args.preset, ep=args.ep, replication=args.replication)
    gains = result.grid(result.gain(), preset=args.preset, ep=args.ep, replication=args.replication)
    rows = [
        (s, *(f"{w} {100 * g:+.1f}%" for w, g in zip(lw, gw, strict=True)))
        for s, lw, gw in zip(result.config.skews, letters, gains, strict=True)
    ]
    title = (
        f"Phase diagram, {args.preset}, EP{args.ep}, {args.replication}× replicas: winning fixed policy "
        "(M = METRO, L = token-LP, E = EPLB-even) and TEMPO's gain over it"
    )
    print(table(rows, ["skew s", *(f"B={b}" for b in result.config.tokens_per_gpu)], title=title))
    return 0


def _cmd_cascade(args: argparse.Namespace) -> int:
    import dataclasses

    from .report import table
    from .sim import CascadeConfig, run_cascade
    from .sim.cascade_summary import LABELS, capacity_rps, oewf_rows

    cfg = CascadeConfig(
        model=args.model,
        trace=args.trace,
        max_requests=args.requests,
        placement=args.placement,
        attention=args.attention,
        estimates=args.estimates,
        guard=not args.no_guard,
        replication=args.replication,
        dispatch=args.dispatch,
    )
    run_kw = dict(workers=args.workers, progress=True)
    if args.rate is None:
        _, cap = capacity_rps(cfg, **run_kw)
        rate = args.load * cap
        print(f"Sync capacity {cap:.2f} req/s on this trace; serving at load {args.load} = {rate:.2f} req/s")
    else:
        rate = args.rate
    runs = run_cascade(dataclasses.replace(cfg, rate_rps=rate), tuple(args.modes.split(",")), **run_kw)
    base = next(iter(runs.values())).serve
    rows = []
    for mode, r in runs.items():
        s = r.summary()
        rows.append(
            [LABELS[mode], f"{s['throughput_ktok_s']:.1f}", f"{s['ttft_mean_s']:.3f}", f"{s['ttft_p95_s']:.3f}",
             f"{100 * (1 - s['ttft_p95_s'] / base.ttft_p95_s):+.1f}%", f"{100 * s['tail_ratio']:.1f}%",
             f"{s['alb']:.2f}", s["oewf_moves"]]
        )  # fmt: skip
    heads = ["mode", "ktok/s", "TTFT avg s", "p95 s", "p95 vs first", "R_tail", "ALB", "OEWF moves"]
    print(table(rows, heads, f"{cfg.model}, {cfg.placement}, {base.num_requests} requests at {rate:.2f} req/s"))
    if "cascade" in runs:
        o = oewf_rows(runs["cascade"])
        print(f"OEWF: cuts ≥ 1% of the layer in {100 * o['ge_1pct']:.1f}% of layer forwards, ≥ 5% in "
              f"{100 * o['ge_5pct']:.1f}%, max {100 * o['max']:.2f}%")  # fmt: skip
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    import runpy

    from .reproduce import NOTEBOOKS_DIR

    script = NOTEBOOKS_DIR.parent / "scripts" / f"bench_{args.which}.py"
    if not script.exists():
        raise SystemExit(f"error: {script} not found (benchmarks run from a source checkout)")
    argv, sys.argv = sys.argv, [str(script), *args.rest]
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as done:  # the scripts end with `raise SystemExit(main())`
        return int(done.code or 0)
    finally:
        sys.argv = argv
    return 0


# ---------------------------------------------------------------------------------------------- serve
def _cmd_serve(args: argparse.Namespace) -> int:
    _fake_cpu_devices()
    import logging

    from .serve import ServeConfig, serve

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    cfg = ServeConfig(
        steps=args.steps,
        tokens_per_rank=args.tokens_per_rank,
        routing=args.routing,
        trace=args.trace,
        experts=args.experts,
        top_k=args.top_k,
        skew=args.skew,
        drift=args.drift,
        policy=args.policy,
        cost=args.cost,
        cost_json=args.cost_json,
        mode=args.mode,
        period_s=args.period_ms / 1e3,
        every_steps=args.every_steps,
        budget_s=args.budget_ms / 1e3,
        staleness_s=args.staleness_s,
        kill_worker_at=args.kill_worker_at,
        block=args.block,
        seed=args.seed,
    )
    serve(cfg, out_dir=args.out, quiet=args.quiet, figure=not args.no_figure)
    return 0


def _add_serve_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve a routing stream through the MoE layer with live tables from the worker")
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--tokens-per-rank", type=int, default=128)
    p.add_argument("--routing", default="synthetic", choices=["synthetic", "recorded"])
    p.add_argument("--trace", default="flame_moe_290m", help="recorded routing: a trace name (bundled if offline)")
    p.add_argument("--experts", type=int, default=16, help="synthetic routing: E")
    p.add_argument("--top-k", type=int, default=4, help="synthetic routing: K")
    p.add_argument("--skew", type=float, default=1.0, help="synthetic routing: Zipf s")
    p.add_argument("--drift", type=float, default=0.1, help="synthetic routing: log-popularity walk σ per step")
    p.add_argument("--policy", default="tempo")
    p.add_argument("--cost", default="dsv3_fp8_offline", help="cost preset")
    p.add_argument("--cost-json", help="a CostModel JSON (e.g. from calibrate --measure --out) instead of --cost")
    p.add_argument("--mode", default="process", choices=["inline", "thread", "process"], help="where the solver runs")
    p.add_argument("--period-ms", type=float, default=200.0, help="refresher snapshot period")
    p.add_argument("--every-steps", type=int, help="refresh every N steps instead of by time")
    p.add_argument("--budget-ms", type=float, default=200.0, help="results arriving later are not published")
    p.add_argument("--staleness-s", type=float, default=5.0, help="older tables → the uniform fallback")
    p.add_argument("--kill-worker-at", type=int, metavar="STEP", help="SIGKILL the solver worker after this step")
    p.add_argument("--block", type=int, default=10, help="steps per worker on/off block of the step-time comparison")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="results", help="folder for serve.json and serve.png")
    p.add_argument("--no-figure", action="store_true")
    p.add_argument("--quiet", action="store_true", help="no per-step status lines")
    p.set_defaults(fn=_cmd_serve)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tempo-jax", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("demo", help="run the demo (make demo)")
    p.add_argument("--out", default="results", help="folder for demo.json")
    p.add_argument("--milp-time-limit", type=float, default=10.0)
    p.set_defaults(fn=_cmd_demo)

    p = sub.add_parser("solve", help="dispatch one batch")
    src = p.add_argument_group("batch")
    src.add_argument(
        "--counts", help="JSON list/dict{'counts'}, .npy or .npz{'counts'}: [E] or [D, E] (per source rank)"
    )
    src.add_argument("--trace", help="trace name (see tempo_jax.workloads.TRACES); bundled sample if not on disk")
    src.add_argument("--layer", type=int)
    src.add_argument("--batch", type=int, default=0)
    src.add_argument("--tokens-per-rank", type=int, default=128)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--placement", help="JSON {phy2log, num_gpus[, gpus_per_node, num_experts]}")
    p.add_argument("--replicas", type=int, help="build an EPLB placement with this many physical slots")
    p.add_argument("--cost", default="dsv3_fp8_offline", help="cost preset name")
    p.add_argument("--cost-json", help="CostModel JSON file (overrides --cost)")
    p.add_argument("--policy", default="tempo")
    p.add_argument("--options", help="policy options as JSON, e.g. '{\"tau\": 0.0}'")
    p.add_argument("--out", help="write the dispatch to .json or .npz")
    p.set_defaults(fn=_cmd_solve)

    p = sub.add_parser("calibrate", help="fit the max-affine cost model to a CSV of G,N,t[,T] samples, or --measure")
    p.add_argument("csv", nargs="?", help="samples to fit (not with --measure)")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--out", help="write the fitted CostModel JSON here")
    m = p.add_argument_group("measure (profile the layer's expert FFN on this backend; tempo_jax.calibrate)")
    m.add_argument("--measure", action="store_true", help="sweep, fit with bootstrap CIs, roofline, ranking agreement")
    m.add_argument("--quick", action="store_true", help="CI-sized sweep (seconds)")
    m.add_argument("--bootstrap", type=int, default=1000, help="cluster-bootstrap replicates")
    m.add_argument("--profile-csv", help="write the measured profile (G,n,N,T,t_us,...) here")
    m.add_argument("--report", default="results/calibration.json", help="the full report (JSON)")
    p.set_defaults(fn=_cmd_calibrate)
    p = sub.add_parser("phase", help="phase-diagram sweep of one panel (cached under results/cache)")
    p.add_argument("--preset", default="dsv3_fp8_offline")
    p.add_argument("--ep", type=int, default=8)
    p.add_argument("--replication", type=float, default=1.25)
    p.add_argument("--skews", default="0,0.6,1.2")
    p.add_argument("--tokens-per-gpu", "--batch-sizes", default="16,64,256,1024", dest="tokens_per_gpu",
                   help="batch sizes B, tokens per GPU, comma-separated")  # fmt: skip
    p.add_argument("--batches", type=int, default=4)
    p.add_argument("--workers", type=int, default=2)
    p.set_defaults(fn=_cmd_phase)

    p = sub.add_parser("cascade", help="CascadeEP prefill simulation of one configuration (cached under results/cache)")
    p.add_argument("--model", default="deepseek_v4_flash", help="deepseek_v4_flash, deepseek_v4_pro or glm_5_3")
    p.add_argument("--trace", default="mooncake", help="mooncake, mooncake_sample or synthetic")
    p.add_argument("--requests", type=int, default=400, help="serve the first N requests of the trace")
    p.add_argument("--placement", default="round_robin",
                   help="round_robin, least_loaded, power_of_two or prefix_only")  # fmt: skip
    p.add_argument("--rate", type=float, help="request rate (req/s); default: --load × Sync capacity")
    p.add_argument("--load", type=float, default=0.9, help="rate as a fraction of Sync capacity (without --rate)")
    p.add_argument("--modes", default="sync,async,async_sf,cascade", help="comma-separated layer modes")
    p.add_argument("--attention", default="dense", help="dense or sparse")
    p.add_argument("--estimates", default="paper", help="paper (noisy, previous layer) or exact")
    p.add_argument("--no-guard", action="store_true", help="paper-literal launch rules (no predicted-completion guard)")
    p.add_argument("--replication", type=float, default=1.0, help="expert replicas / experts (EPLB per layer)")
    p.add_argument("--dispatch", default="uniform", help="uniform or tempo (with --replication > 1)")
    p.add_argument("--workers", type=int, default=2)
    p.set_defaults(fn=_cmd_cascade)

    _add_serve_parser(sub)

    p = sub.add_parser("bench", help="run a benchmark script (solver, gemm or ep); extra arguments pass through")
    p.add_argument("which", choices=["solver", "gemm", "ep"])
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(fn=_cmd_bench)

    p = sub.add_parser("reproduce", help="execute the figure notebooks headless (nbclient)")
    p.add_argument("names", nargs="*", help="notebook names or numbers (default: all)")
    p.add_argument("--small", action="store_true", help="CI-sized grids (SMALL=1)")
    p.set_defaults(fn=_cmd_reproduce)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except ValueError as err:  # bad input: say what was wrong, no traceback
        print(f"error: {err}", file=sys.stderr)
        return 2
