"""`tempo-jax phase` (one phase-diagram panel) and `tempo-jax cascade` (the CascadeEP prefill simulator; its options
are generated from `tempo_jax.sim.CascadeConfig`)."""

from __future__ import annotations

import argparse
import dataclasses
import json

from ..sim import PLACEMENT_POLICIES, CascadeConfig, PhaseConfig, run_phase
from ..sim.cascade import TIMELINES, cascade_trace, run_cascade_seeds
from ..sim.cascade.costs import HARDWARE, MODELS
from ..sim.cascade.reference_timeline import LAUNCHES, LAYER_MODES, LINKS
from ..sim.cascade.summary import LABELS, SEED_FIGURES, capacity_rps, oewf_rows, paired_difference, seed_summary
from ..sim.runner import JOB_BACKENDS
from ..sim.tempo.phase import MODEL_SHAPES
from ..text import table
from ..workloads import TRACES
from .args import UsageError, config_from_args, config_options, int_at_least, number_list, prepare_out, real

#: Most seeds `tempo-jax cascade --seeds` runs (each seed serves the trace once per mode).
MAX_SEEDS = 10_000


def _ci(fig: dict, scale: float, digits: int) -> str:
    """``value [lo, hi]`` of a seed figure (`seed_summary`), scaled."""
    lo, hi = fig["ci95"]
    return f"{fig['value'] * scale:.{digits}f} [{lo * scale:.{digits}f}, {hi * scale:.{digits}f}]"


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
    bad = [m for m in modes if m not in LAYER_MODES]
    if bad or not modes:
        raise UsageError(
            f"--modes: unknown mode(s) {bad or modes}; use a comma-separated subset of {list(LAYER_MODES)}"
        )
    twice = sorted({m for m in modes if modes.count(m) > 1})
    if twice:
        raise UsageError(f"--modes: {twice} given twice; name each mode once (e.g. --modes sync,cascade)")
    if args.seeds > MAX_SEEDS:
        raise UsageError(
            f"--seeds {args.seeds:,} exceeds {MAX_SEEDS:,} (each seed is a whole serving run per mode); lower it"
        )
    run_kw = dict(workers=args.workers, progress=True, backend=args.backend)
    if cfg.rate_rps is not None and args.load is not None:
        raise UsageError(
            f"--rate {cfg.rate_rps:g} and --load {args.load:g} exclude each other: --load sets the rate "
            "as a fraction of Sync capacity; give one"
        )
    served = cascade_trace(dataclasses.replace(cfg, rate_rps=None))
    if served.duration_s <= 0:  # one instant: nothing to scale
        given = "--rate" if cfg.rate_rps is not None else "--load" if args.load is not None else None
        if given:
            raise UsageError(
                f"{given}: the {len(served)} request(s) served of {served.name} all arrive at t = 0 s, so "
                f"there are no inter-arrival times to scale; drop {given} to serve them as one burst, or "
                "raise --requests so that the arrivals span time"
            )
        rate = None
        print(f"the {len(served)} request(s) all arrive at t = 0 s: served as one burst (no rate to scale to a load)")
    elif cfg.rate_rps is None:
        load = 0.9 if args.load is None else args.load
        _, cap = capacity_rps(cfg, **run_kw)
        rate = load * cap
        print(f"Sync capacity {cap:.2f} req/s on this trace; serving at load {load} = {rate:.2f} req/s")
    else:
        rate = cfg.rate_rps
    cfg = dataclasses.replace(cfg, rate_rps=rate)
    seeds = tuple(range(cfg.seed, cfg.seed + args.seeds))  # (bounded by MAX_SEEDS before any work)
    by_seed = run_cascade_seeds(cfg, modes, seeds=seeds, **run_kw)
    summary = seed_summary(by_seed)
    runs = by_seed[seeds[0]]
    base = next(iter(runs.values())).prefill
    rows = []
    for mode, r in runs.items():
        s, f = r.summary(), summary[mode]
        rows.append(
            [
                LABELS[mode],
                _ci(f["throughput_tps"], 1e-3, 1),
                _ci(f["ttft_mean_s"], 1, 3),
                _ci(f["ttft_p95_s"], 1, 3),
                f"{100 * s['tail_ratio']:.1f}%",
                f"{s['alb']:.2f}",
                s["oewf_moves"],
                s["oewf_longer_layers"],
            ]
        )
    heads = ["mode", "ktok/s", "TTFT avg s", "p95 s", "R_tail", "ALB", "OEWF moves", "OEWF longer layers"]
    served_at = "one burst" if rate is None else f"{rate:.2f} req/s"
    title = (
        f"{cfg.model}, {cfg.placement}, links={cfg.links}, launch={cfg.launch}, {base.num_requests} requests at "
        f"{served_at}, {len(seeds)} seed(s) (mean [95% CI]; R_tail … of seed {seeds[0]})"
    )
    print(table(rows, heads, title))
    per_seed = {m: summary[m]["ttft_mean_s"]["per_seed"] for m in modes}
    pairs = zip(modes, modes[1:], strict=False) if len(seeds) > 1 else ()
    paired = {f"{a}-{b}": paired_difference(per_seed[a], per_seed[b]) for a, b in pairs}
    if paired:
        print(
            table(
                [
                    [
                        f"{LABELS[k.split('-')[0]]} − {LABELS[k.split('-')[1]]}",
                        f"{1e3 * p['value']:+.2f}",
                        f"[{1e3 * p['ci95'][0]:+.2f}, {1e3 * p['ci95'][1]:+.2f}]",
                        f"{p['wins']}/{p['n']}",
                        f"{p['sign_p']:.3f}",
                        p["order"],
                    ]
                    for k, p in paired.items()
                ],
                ["pair", "ΔTTFT avg ms", "paired 95% CI", "seeds a > b", "sign test p", "claimed"],
                "paired per-seed differences (an order is claimed only where the CI excludes 0 and p < 0.05)",
            )
        )
    if out is not None:
        payload = {
            "config": cfg.acting(),
            "seeds": list(seeds),
            "modes": {
                m: {k: {"value": summary[m][k]["value"], "ci95": summary[m][k]["ci95"]} for k in SEED_FIGURES}
                for m in modes
            },
            "paired_ttft_mean_s": paired,
        }
        out.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"wrote {out}")
    if "cascade" in runs:
        o = oewf_rows(runs["cascade"])
        print(
            f"OEWF: cuts ≥ 1% of the layer in {100 * o['ge_1pct']:.1f}% of layer forwards, ≥ 5% in "
            f"{100 * o['ge_5pct']:.1f}%, max {100 * o['max']:.2f}%"
        )
    return 0
