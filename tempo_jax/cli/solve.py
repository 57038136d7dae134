"""`tempo-jax solve` (dispatch one batch from files or a trace) and `tempo-jax calibrate` (fit the cost model to a
CSV of samples, or `--measure` it on this backend)."""

from __future__ import annotations

import argparse
import json
import sys
import warnings

import numpy as np

from solvers import (
    POLICIES,
    PRESETS,
    CostModel,
    DispatchProblem,
    Placement,
    UndeterminedFitWarning,
    fit_max_affine,
    read_samples,
    solve,
)
from solvers.checks import check_array

from ..text import table
from ..workloads import TRACES, load_array
from .args import UsageError, build_from_json, int_at_least, policy_options, prepare_out

DEFAULT_REPORT = "results/calibration.json"

__all__ = ["cmd_calibrate", "cmd_solve", "problem_from_args", "register"]


def register(add) -> None:
    """Add ``solve`` and ``calibrate`` to the command line (``add(name, **kw)`` makes a subparser)."""
    positive, count = int_at_least(1), int_at_least(0)
    presets = ", ".join(sorted(PRESETS))
    p = add(
        "solve",
        help="dispatch one batch",
        description="Dispatch one batch: token counts from a file or a "
        "routing trace, a placement (file, EPLB, or full replication) and a cost model.",
    )
    src = p.add_argument_group("batch (give exactly one of --counts and --trace)")
    one = src.add_mutually_exclusive_group(required=True)
    one.add_argument(
        "--counts",
        metavar="FILE",
        help="JSON list or {'counts': list}, .npy, or .npz with array 'counts': token "
        "counts [E] or [D, E] (per source rank), non-negative integers",
    )
    one.add_argument(
        "--trace",
        metavar="NAME",
        help=f"routing trace: {', '.join(TRACES)}; the bundled sample when the recording is not on disk",
    )
    src.add_argument("--layer", type=count, help="with --trace: MoE layer id (default: the trace's first layer)")
    src.add_argument("--batch", type=count, help="with --trace: batch index within the layer (default 0)")
    src.add_argument("--tokens-per-rank", type=positive, help="with --trace: tokens per source rank (default 128)")
    pl = p.add_argument_group("placement (--placement, or --gpus with optional --replicas; default: 8 GPUs, full)")
    pl.add_argument("--gpus", type=positive, help="number of GPUs (EP ranks) D (default 8); not with --placement")
    pl.add_argument("--placement", metavar="FILE", help="JSON {phy2log, num_gpus[, gpus_per_node, num_experts]}")
    pl.add_argument(
        "--replicas",
        type=positive,
        help="build an EPLB placement with this many physical slots "
        "(>= experts) from the batch's load; without it every GPU holds every expert",
    )
    co = p.add_argument_group("cost model (one of)")
    cost = co.add_mutually_exclusive_group()
    cost.add_argument(
        "--cost", metavar="PRESET", choices=sorted(PRESETS), help=f"cost preset (default dsv3_fp8_offline): {presets}"
    )
    cost.add_argument("--cost-json", metavar="FILE", help="CostModel JSON file {b, beta[, a, c, b2, tile, c2, gamma]}")
    p.add_argument(
        "--policy", default="tempo", metavar="NAME", help=f"dispatch policy: {', '.join(POLICIES)} (default tempo)"
    )
    p.add_argument(
        "--options",
        metavar="JSON",
        help="policy options as a JSON object, e.g. '{\"tau\": 0.0}' for tempo or '{\"time_limit\": 5}' for milp",
    )
    p.add_argument(
        "--out",
        metavar="FILE",
        help="write the dispatch to FILE.npz (arrays) or any other name (JSON); missing folders are created",
    )
    p.set_defaults(fn=cmd_solve)

    p = add("calibrate", help="fit the max-affine cost model to a CSV of G,N,t[,T] samples, or --measure")
    p.add_argument(
        "csv",
        metavar="CSV",
        nargs="?",
        help="samples, one per row, with a header naming the columns G (activated "
        "experts), N (tokens), t (time, µs, > 0) and optionally T (M-tiles: adds the tile term b2); at "
        "least 4 rows (5 with T); not with --measure",
    )
    p.add_argument("--iters", type=positive, default=50, help="alternating-assignment iterations (default 50)")
    p.add_argument("--out", metavar="FILE", help="write the fitted CostModel JSON here (missing folders are created)")
    m = p.add_argument_group("measure (profile the layer's expert FFN on this backend; tempo_jax.runtime.calibrate)")
    m.add_argument("--measure", action="store_true", help="sweep, fit with bootstrap CIs, roofline, ranking agreement")
    m.add_argument("--quick", action="store_true", help="CI-sized sweep (seconds)")
    m.add_argument("--bootstrap", type=positive, help="cluster-bootstrap replicates (default 1000)")
    m.add_argument("--profile-csv", metavar="FILE", help="write the measured profile (G,n,N,T,t_us,...) here")
    m.add_argument("--report", metavar="FILE", help=f"the full report (JSON; default {DEFAULT_REPORT})")
    p.set_defaults(fn=cmd_calibrate)


def problem_from_args(args: argparse.Namespace):
    # Step 1: options that exclude each other or only make sense together.
    if args.placement and args.gpus is not None:
        raise UsageError("--gpus and --placement exclude each other: the placement file sets num_gpus")
    if args.placement and args.replicas is not None:
        raise UsageError("--replicas and --placement exclude each other: the placement file fixes the replicas")
    if args.counts:
        given = [
            o
            for o, v in (("--layer", args.layer), ("--batch", args.batch), ("--tokens-per-rank", args.tokens_per_rank))
            if v is not None
        ]
        if given:
            raise UsageError(f"{', '.join(given)}: only with --trace (they pick its batch); --counts gives the batch")
    gpus = 8 if args.gpus is None else args.gpus
    # Step 2: the cost model.
    if args.cost_json:
        cost = build_from_json(args.cost_json, "--cost-json", CostModel.from_dict)
    else:
        cost = PRESETS[args.cost or "dsv3_fp8_offline"]
    # Step 3: the batch.
    if args.trace:
        from ..workloads import load_sample, load_trace

        try:
            trace = load_trace(args.trace)
        except FileNotFoundError:
            trace = load_sample(args.trace)
        layer = args.layer if args.layer is not None else trace.layers[0]
        tokens = 128 if args.tokens_per_rank is None else args.tokens_per_rank
        try:
            counts = trace.batch_counts(layer, tokens, gpus, batch=args.batch or 0)
        except ValueError as err:
            hint = "(num_ranks is --gpus, tokens_per_rank --tokens-per-rank)"
            raise UsageError(f"--trace {args.trace}: {err} {hint}") from None
        load = trace.expert_load(layer)
    else:
        counts = load_array(args.counts, "counts", "--counts")
        try:
            counts = check_array("counts", counts, ndims=(1, 2), nonnegative=True, integer=True, hint="[E] or [D, E]")
        except ValueError as err:
            raise UsageError(f"--counts {args.counts}: {err}") from None
        if counts.size == 0:
            raise UsageError(
                f"--counts {args.counts}: no counts (shape {counts.shape}); give token counts [E] or "
                "[D, E] with E >= 1 experts"
            )
        load = counts if counts.ndim == 1 else counts.sum(axis=0)
    # Step 4: the placement.
    if args.placement:
        placement = build_from_json(args.placement, "--placement", Placement.from_dict)
    elif args.replicas:
        placement = Placement.from_eplb(load, args.replicas, gpus, spread_idle=True)
    else:
        placement = Placement.full(np.shape(counts)[-1], gpus)
    return DispatchProblem(counts, placement, cost)


def cmd_solve(args: argparse.Namespace) -> int:
    problem = problem_from_args(args)
    options = policy_options(args.options)
    out = prepare_out(args.out)
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
    if out:
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


def cmd_calibrate(args: argparse.Namespace) -> int:
    if args.measure:
        if args.csv is not None:
            raise UsageError(f"--measure profiles this backend; it takes no CSV (got {args.csv})")
        return cmd_calibrate_measure(args)
    if args.csv is None:
        raise UsageError("give a CSV of G,N,t[,T] samples, or --measure to profile this backend")
    given = [
        o
        for o, v in (
            ("--quick", args.quick),
            ("--bootstrap", args.bootstrap),
            ("--profile-csv", args.profile_csv),
            ("--report", args.report),
        )
        if v not in (None, False)
    ]
    if given:
        raise UsageError(f"{', '.join(given)}: only with --measure (fitting {args.csv} would ignore them)")
    out = prepare_out(args.out)
    data = read_samples(args.csv)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", UndeterminedFitWarning)
            model, report = fit_max_affine(data["G"], data["N"], data["t"], tiles=data.get("T"), iters=args.iters)
    except ValueError as err:
        raise UsageError(f"{args.csv}: {err}") from None
    for w in caught:
        print(f"WARNING: {w.message}", file=sys.stderr)
    print(model.to_json())
    print(
        f"mean relative error {report.mean_rel_error:.2%}, samples per piece {report.samples_per_piece}, "
        f"{report.iterations} iterations, converged={report.converged}, n*={model.inflection:.1f}"
        + (f", UNDETERMINED: {', '.join(report.undetermined)}" if report.undetermined else "")
    )
    if report.outside_domain:
        # A fit outside the model's domain is not hidden: warn and report the constrained (>= 0) fit instead.
        free = ", ".join(f"{k} = {v:.4g}" for k, v in report.outside_domain.items())
        print(
            f"warning: {args.csv}: the unconstrained fit leaves the model's domain ({free} < 0; e.g. times that "
            f"fall as G rises); the model above holds {', '.join(report.outside_domain)} at 0 (every parameter "
            "must be >= 0). Check the samples before using it.",
            file=sys.stderr,
        )
    if out:
        model.save(out)
    return 0


def cmd_calibrate_measure(args: argparse.Namespace) -> int:
    """`calibrate --measure`: profile the layer's expert FFN here, fit with CIs, roofline, ranking agreement."""
    from ..runtime.calibrate import MeasureConfig, measure

    if args.quick and args.bootstrap is not None:
        raise UsageError("--quick sets its own bootstrap size; drop --bootstrap or --quick")
    out = prepare_out(args.out)
    profile_csv = prepare_out(args.profile_csv, "--profile-csv")
    report_json = prepare_out(args.report or DEFAULT_REPORT, "--report")
    cfg = MeasureConfig.quick() if args.quick else MeasureConfig(bootstrap=args.bootstrap or 1000)
    report = measure(cfg, profile_csv=profile_csv, out_json=report_json)
    if out:
        CostModel.from_dict(report["model"]).save(out)
        print(f"wrote {out} (serve with it: tempo-jax serve --cost-json {out})")
    return 0
