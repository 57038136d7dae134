"""The `tempo-jax` command line (also `python -m tempo_jax`).

Commands:
  demo       the `make demo` job: presets, a real and a synthetic batch, every policy on the real batch
  solve      dispatch one batch from files (counts + placement) or from a routing trace, print/write it
  calibrate  fit the max-affine cost model to logged (G, N, t[, tiles]) samples from a CSV file
  phase      a phase-diagram panel: winning fixed policy and TEMPO's gain per (skew, batch size)
  cascade    CascadeEP prefill: serve a request trace under Sync / Async / Async+SF / CascadeEP, print the table
  serve      the MoE layer serving a routing stream with live tables from the solver worker (the runtime)
  plan       will a preset's MoE layer fit on a mesh: memory per device and collectives, compiled ahead of time
  report     a watched run's pictures: expert-load heatmap, balancedness over time, re-placements
  bench      run a benchmark script (solver, gemm, ep, cascade)
  reproduce  execute the figure notebooks headless and report failures; --docs renders docs/reproduced.md's tables

Errors: one line on stderr, ``error: <what was wrong and how to fix it>``, and exit status 2 for a usage error
(bad option or argument, a missing, unreadable or malformed input file, input the library rejects) or 1 for a
runtime failure (a solver or the file system failing while the work runs, an internal error). ``--debug`` (before
or after the command name) adds the traceback. ``--out`` files: missing parent folders are created before the
work starts; an ``--out`` that is a folder, or under a file, is refused before any work.
"""

from __future__ import annotations

import argparse
import re
import sys
import traceback

from . import demo, plan, repro, serve, sim, solve
from .args import EXIT_FAILURE, EXIT_USAGE, Parser, fake_cpu_devices

__all__ = ["build_parser", "main"]

#: The command groups, each a module with ``register(add)``, in the order of ``--help``.
COMMAND_GROUPS = (demo, solve, sim, serve, plan, repro)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="tempo-jax",
        description=__doc__.split("\n")[0],
        epilog="Exit status: 0 ok, 1 runtime failure, 2 usage error (one line on stderr; --debug adds the traceback).",
    )
    parser.add_argument("--debug", action="store_true", help="print the traceback of an error")
    # Every command also takes --debug after its name (SUPPRESS: only set when given).
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS, help="print the traceback of an error"
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser, metavar="COMMAND")
    for group in COMMAND_GROUPS:
        group.register(lambda name, **kw: sub.add_parser(name, parents=[common], **kw))
    return parser


def _one_line(text: str) -> str:
    return re.sub(r"\s*\n\s*", " ", text).strip()


def _report(err: BaseException) -> tuple[int, str]:
    """Exit status and the one-line message for an error that ended a command."""
    msg = _one_line(str(err)) or type(err).__name__
    if isinstance(err, ValueError | TypeError | FileNotFoundError | IsADirectoryError | NotADirectoryError):
        return EXIT_USAGE, f"error: {msg}"  # bad input (UsageError, ArgTypeError, JSON/Unicode errors included)
    if isinstance(err, OSError):
        return EXIT_FAILURE, f"error: {msg}"
    return EXIT_FAILURE, f"error: {type(err).__name__}: {msg} (internal failure; rerun with --debug for the traceback)"


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the exit status (0 ok, 1 runtime failure, 2 usage error). Errors are one line
    on stderr (``--debug``: with the traceback)."""
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    debug = "--debug" in argv
    # before jax starts: the layer's commands run on 8 CPU devices without a GPU (`plan`: as many as its --mesh has)
    fake_cpu_devices(plan.devices_needed(argv) or 8)
    try:
        args = build_parser().parse_args(argv)
        debug = debug or bool(getattr(args, "debug", False))
        return args.fn(args)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # noqa: BLE001 - the command line's one place that turns errors into statuses
        code, line = _report(err)
        if debug:
            traceback.print_exc()
        print(line, file=sys.stderr)
        return code
