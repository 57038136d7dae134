"""`tempo-jax phase` (one phase-diagram panel) and `tempo-jax cascade` (the CascadeEP prefill simulator; its options
are generated from `tempo_jax.sim.CascadeConfig`)."""

from __future__ import annotations

import argparse
import dataclasses

from ..sim import PLACEMENT_POLICIES, CascadeConfig, PhaseConfig, run_cascade, run_phase
from ..sim.cascade_summary import LABELS, capacity_rps, oewf_rows
from ..sim.phase import MODEL_SHAPES
from ..sim.prefill import HARDWARE, MODELS
from ..text import table
from ..workloads import TRACES
from .args import config_from_args, config_options, int_at_least, number_list, real

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
        choices={"model": sorted(MODELS), "hardware": sorted(HARDWARE), "trace": ("mooncake", "mooncake_sample",
                 "synthetic"), "placement": PLACEMENT_POLICIES, "attention": ("dense", "sparse"),
                 "dispatch": ("uniform", "tempo"), "estimates": ("paper", "exact"), "pricing": ("paper", "tempo"),
                 "routing": (*TRACES, "zipf")},
    )  # fmt: skip
    run = p.add_argument_group("run")
    run.add_argument("--load", type=real(0.0), default=0.9,
                     help="without --rate-rps: the rate as a fraction of Sync capacity (default 0.9)")  # fmt: skip
    run.add_argument("--modes", default="sync,async,async_sf,cascade", help="comma-separated layer modes")
    run.add_argument("--workers", type=positive, default=2, help="worker processes (default 2)")
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
    run_kw = dict(workers=args.workers, progress=True)
    if cfg.rate_rps is None:
        _, cap = capacity_rps(cfg, **run_kw)
        rate = args.load * cap
        print(f"Sync capacity {cap:.2f} req/s on this trace; serving at load {args.load} = {rate:.2f} req/s")
    else:
        rate = cfg.rate_rps
    runs = run_cascade(dataclasses.replace(cfg, rate_rps=rate), tuple(args.modes.split(",")), **run_kw)
    base = next(iter(runs.values())).prefill
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
