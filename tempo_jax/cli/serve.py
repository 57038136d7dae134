"""`tempo-jax serve`: the MoE layer serving a routing stream with live tables from the solver worker; its options
are generated from `tempo_jax.runtime.serve_config.ServeConfig`, its metrics options from
`tempo_jax.metrics.WatchOptions`. `tempo-jax report RUN`: the pictures of a watched run (`tempo_jax.metrics.report`)."""

from __future__ import annotations

import argparse
import logging
import socket

from pallas_kernels import DISPATCH_MODES
from solvers import POLICIES, PRESETS

from ..metrics import WatchOptions
from ..metrics.report import render_run
from ..runtime.controller import SOLVER_MODES
from ..runtime.publisher import FALLBACKS
from ..runtime.serve_config import ROUTINGS, ServeConfig
from ..runtime.serving import serve
from ..workloads import TRACES
from .args import UsageError, config_from_args, config_options, prepare_out_dir

__all__ = ["cmd_report", "cmd_serve", "register"]


def register(add) -> None:
    """Add ``serve`` to the command line (``add(name, **kw)`` makes a subparser)."""
    p = add("serve", help="serve a routing stream through the MoE layer with live tables from the worker")
    config_options(
        p,
        ServeConfig,
        choices={
            "routing": ROUTINGS,
            "trace": TRACES,
            "dispatch_mode": DISPATCH_MODES,
            "policy": POLICIES,
            "cost": sorted(PRESETS),
            "solver_mode": SOLVER_MODES,
            "fallback": FALLBACKS,
        },
    )
    out = p.add_argument_group("output")
    out.add_argument("--out", default="results", help="folder for serve.json and serve.png")
    out.add_argument("--no-figure", action="store_true", help="do not write serve.png")
    out.add_argument("--quiet", action="store_true", help="no per-step status lines")
    watch = p.add_argument_group("metrics (docs/runtime.md, 'Watching it'; OUT/metrics.jsonl is always written)")
    watch.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus /metrics here (0: a free port)")
    watch.add_argument("--metrics-addr", default="127.0.0.1", help="address of /metrics (0.0.0.0: other hosts)")
    watch.add_argument("--metrics-per-rank", action="store_true", help="add per-rank series (layers × ranks)")
    watch.add_argument("--metrics-per-expert", action="store_true", help="add per-expert series (layers × experts)")
    watch.add_argument(
        "--metrics-linger-s", type=float, default=0.0, help="after the run, keep /metrics up until one more scrape"
    )
    watch.add_argument("--logdir", default=None, help="also write TensorBoard event files here")
    p.set_defaults(fn=cmd_serve)

    p = add("report", help="draw a watched run's pictures: expert-load heatmap, balancedness, re-placements")
    p.add_argument("run", help="a run folder holding metrics.jsonl (serve --out, train logdir) or the file")
    p.add_argument("--out", default=None, help="folder for the PNGs (default: beside metrics.jsonl)")
    p.set_defaults(fn=cmd_report)


def cmd_serve(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    cfg = config_from_args(ServeConfig, args)
    if args.logdir is not None:  # the folders and the port before the run: nothing in --out is touched first
        prepare_out_dir(args.logdir, "--logdir", writes="TensorBoard event files")
    watch = WatchOptions(
        port=args.metrics_port,
        addr=args.metrics_addr,
        per_rank=args.metrics_per_rank,
        per_expert=args.metrics_per_expert,
        linger_s=args.metrics_linger_s,
        logdir=args.logdir,
    )
    out = prepare_out_dir(args.out, writes="serve.json, serve.png and metrics.jsonl")
    if args.metrics_port:
        check_port_free(args.metrics_addr, args.metrics_port)
    serve(cfg, out_dir=out, quiet=args.quiet, figure=not args.no_figure, watch=watch)
    return 0


def check_port_free(addr: str, port: int) -> None:
    """UsageError naming ``--metrics-port`` when ``addr:port`` cannot be bound now (in use, not this host's)."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET) as probe:
            probe.bind((addr, port))
    except OSError as err:
        raise UsageError(
            f"--metrics-port {port}: cannot serve /metrics on {addr}:{port} ({err.strerror or err}); pick a free "
            "port (0 picks one) or stop what holds it"
        ) from None


def cmd_report(args: argparse.Namespace) -> int:
    out = None if args.out is None else prepare_out_dir(args.out, writes="the report's PNGs")
    got = render_run(args.run, out)
    s = got["summary"]
    print(f"report: {s['steps']} steps × {s['layers']} MoE layers")
    for i in range(s["layers"]):
        print(
            f"  layer {i}: balancedness tokens {s['balancedness_tokens_mean'][i]:.3f}, time "
            f"{s['balancedness_time_mean'][i]:.3f} (mean over steps); hottest expert {s['hottest_expert'][i]} at "
            f"{s['hottest_over_mean'][i]:.2f}× the mean"
        )
    print(
        f"  re-placements {s['replacements']} applied, {s['dismissed']} dismissed; {s['stalled_steps']} steps stalled"
    )
    for path in got["figures"]:
        print(f"wrote {path}")
    return 0
