"""`tempo-jax phase` (one phase-diagram panel) and `tempo-jax cascade` (the CascadeEP prefill simulator; its options
are generated from `tempo_jax.sim.CascadeConfig`)."""

from __future__ import annotations

import argparse
import json

from ..sim import PLACEMENT_POLICIES, CascadeConfig, PhaseConfig, run_phase
from ..sim.cascade import LAUNCHES, LINKS, TIMELINES
from ..sim.cascade.costs import HARDWARE, MODELS
from ..sim.cascade.report import cascade_report
from ..sim.runner import JOB_BACKENDS
from ..sim.tempo.phase import MODEL_SHAPES
from ..text import table
from ..workloads import TRACES
from .args import UsageError, config_from_args, config_options, int_at_least, number_list, prepare_out, real

__all__ = ["cmd_cascade", "cmd_phase", "register"]


def register(add) -> None:
    """Add ``phase`` and ``cascade`` to the command line (``add(name, **kw)`` makes a subparser)."""
    positive = int_at_least(1)
    p = add("phase", help="phase-diagram sweep of one panel (cached under results/cache)")
    p.add_argument(
        "--preset",
        default="dsv3_fp8_offline",
        choices=sorted(MODEL_SHAPES),
        metavar="PRESET",
        help=f"cost preset and model shape: {', '.join(sorted(MODEL_SHAPES))} (default dsv3_fp8_offline)",
    )
    p.add_argument("--ep", type=positive, default=8, help="expert-parallel ranks (GPUs) D (default 8)")
    p.add_argument(
        "--replication",
        type=real(1.0, strict=False),
        default=1.25,
        help="physical slots / experts, >= 1 (default 1.25)",
    )
    p.add_argument(
        "--skews",
        type=number_list(float, 0.0),
        default=(0.0, 0.6, 1.2),
        help="Zipf skews s >= 0, comma-separated (default 0,0.6,1.2)",
    )
    p.add_argument(
        "--tokens-per-gpu",
        "--batch-sizes",
        type=number_list(int, 1),
        default=(16, 64, 256, 1024),
        dest="tokens_per_gpu",
        help="batch sizes B, tokens per GPU, ascending, comma-separated",
    )
    p.add_argument("--batches", type=positive, default=4, help="batches per cell (default 4)")
    p.add_argument("--workers", type=positive, default=2, help="worker processes (default 2)")
    p.set_defaults(fn=cmd_phase)

    p = add("cascade", help="CascadeEP prefill simulation of one configuration (cached under results/cache)")
    config_options(
        p,
        CascadeConfig,
        aliases={"max_requests": ["--requests"], "rate_rps": ["--rate"]},
        choices={
            "model": sorted(MODELS),
            "hardware": sorted(HARDWARE),
            "placement": PLACEMENT_POLICIES,
            "attention": ("dense", "sparse"),
            "dispatch": ("uniform", "tempo"),
            "estimates": ("paper", "exact"),
            "pricing": ("paper", "tempo"),
            "routing": (*TRACES, "zipf"),
            "links": LINKS,
            "launch": LAUNCHES,
            "timeline": TIMELINES,
        },
    )
    run = p.add_argument_group("run")
    run.add_argument(
        "--load",
        type=real(0.0),
        default=None,
        help="without --rate-rps: the rate as a fraction of Sync capacity (default 0.9)",
    )
    run.add_argument("--modes", default="sync,async,async_sf,cascade", help="comma-separated layer modes")
    seeds_help = "run seeds seed, seed+1, …, seed+K−1; figures are their mean with a 95%% bootstrap CI"
    run.add_argument("--seeds", type=positive, default=1, help=seeds_help)
    out_help = "write per mode ttft_mean_s, ttft_p95_s, throughput_tps ({value, ci95}) and the config"
    run.add_argument("--out", default=None, metavar="FILE.json", help=out_help)
    run.add_argument("--workers", type=positive, default=2, help="worker processes (default 2)")
    backend_help = (
        "where the jobs run: loky (local processes) or dask (a dask.distributed cluster: "
        "$TEMPO_JAX_DASK_SCHEDULER or the running client); default $TEMPO_JAX_BACKEND or loky"
    )
    run.add_argument("--backend", choices=JOB_BACKENDS, default=None, help=backend_help)
    p.set_defaults(fn=cmd_cascade)


def cmd_phase(args: argparse.Namespace) -> int:
    grid = dict(
        presets=(args.preset,),
        eps=(args.ep,),
        replications=(args.replication,),
        skews=args.skews,
        tokens_per_gpu=args.tokens_per_gpu,
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


def cmd_cascade(args: argparse.Namespace) -> int:
    cfg = config_from_args(CascadeConfig, args)
    out = prepare_out(args.out)
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    flags = {"seeds": "--seeds", "rate": "--rate", "load": "--load", "max_requests": "--requests"}
    try:  # cascade_report checks the modes, seeds, rate and load before any run, naming them as flags
        report = cascade_report(
            cfg,
            modes,
            seeds=args.seeds,
            load=args.load,
            workers=args.workers,
            backend=args.backend,
            progress=True,
            option_names=flags,
        )
    except ValueError as err:  # modes, seeds, a rate for a trace without inter-arrival times
        raise UsageError(f"tempo-jax cascade: {err}") from None
    if report.config.rate_rps is None:
        print("the requests all arrive at t = 0 s: served as one burst (no rate to scale to a load)")
    if report.capacity_rps is not None:
        print(
            f"Sync capacity {report.capacity_rps:.2f} req/s on this trace; serving at load "
            f"{report.config.rate_rps / report.capacity_rps:g} = {report.config.rate_rps:.2f} req/s"
        )
    print(report.tables())
    if out is not None:
        out.write_text(json.dumps(report.payload(), indent=2) + "\n")
        print(f"wrote {out}")
    return 0
