"""`tempo-jax serve`: the MoE layer serving a routing stream with live tables from the solver worker; its options
are generated from `tempo_jax.runtime.serve.ServeConfig`."""

from __future__ import annotations

import argparse
import logging

from solvers import POLICIES, PRESETS

from ..runtime.controller import SOLVER_MODES
from ..runtime.publisher import FALLBACKS
from ..runtime.serve import ROUTINGS, ServeConfig, serve
from ..workloads import TRACES
from .args import config_from_args, config_options, prepare_out_dir

__all__ = ["cmd_serve", "register"]


def register(add) -> None:
    """Add ``serve`` to the command line (``add(name, **kw)`` makes a subparser)."""
    p = add("serve", help="serve a routing stream through the MoE layer with live tables from the worker")
    config_options(
        p,
        ServeConfig,
        choices={
            "routing": ROUTINGS,
            "trace": TRACES,
            "dispatch_mode": ("sample", "quota"),
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
    p.set_defaults(fn=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    cfg = config_from_args(ServeConfig, args)
    out = prepare_out_dir(args.out, writes="serve.json and serve.png")
    serve(cfg, out_dir=out, quiet=args.quiet, figure=not args.no_figure)
    return 0
