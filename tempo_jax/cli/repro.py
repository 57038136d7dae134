"""`tempo-jax reproduce` (the notebooks headless; `--docs`: the rendered result tables) and `tempo-jax bench` (a
benchmark script of the checkout)."""

from __future__ import annotations

import argparse
import os
import runpy
import sys

from ..repro.docs import PAGE, update_page
from ..repro.report import figures_dir, results_dir
from ..repro.reproduce import NOTEBOOKS_DIR, reproduce
from .args import UsageError

__all__ = ["BENCHMARKS", "cmd_bench", "cmd_reproduce", "register"]

BENCHMARKS = ("solver", "gemm", "ep", "cascade", "sim", "refresh", "metrics")


def register(add) -> None:
    """Add ``bench`` and ``reproduce`` to the command line (``add(name, **kw)`` makes a subparser)."""
    p = add(
        "bench",
        help="run a benchmark script (" + ", ".join(BENCHMARKS) + "); extra arguments pass through",
    )
    p.add_argument("which", choices=BENCHMARKS, help="benchmark: " + ", ".join(BENCHMARKS))
    p.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for the script (see its --help)")
    p.set_defaults(fn=cmd_bench)

    p = add("reproduce", help="execute the figure notebooks headless (nbclient)")
    p.add_argument("names", nargs="*", help="notebook names or numbers (default: all)")
    p.add_argument("--small", action="store_true", help="CI-sized grids (SMALL=1)")
    p.add_argument(
        "--docs",
        "--readme",
        dest="docs",
        action="store_true",
        help="only rewrite docs/reproduced.md's tables from results/notebooks/*.json",
    )
    p.set_defaults(fn=cmd_reproduce)


def cmd_bench(args: argparse.Namespace) -> int:
    script = NOTEBOOKS_DIR.parent / "scripts" / f"bench_{args.which}.py"
    if not script.exists():
        raise UsageError(f"{script} not found (benchmarks run from a source checkout)")
    argv, sys.argv = sys.argv, [str(script), *args.rest]
    path = list(sys.path)
    sys.path.insert(0, str(script.parent))  # as `python scripts/bench_X.py` has it: the scripts import each other
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as done:  # the scripts end with `raise SystemExit(main())`
        return int(done.code or 0)
    finally:
        sys.argv, sys.path[:] = argv, path
    return 0


def cmd_reproduce(args: argparse.Namespace) -> int:
    if args.docs:
        if args.names or args.small:
            raise UsageError("--docs renders the committed JSON; give no notebook names and no --small")
        changed = update_page()
        print(f"{'updated' if changed else 'unchanged'}: the reproduced-results tables of {PAGE}")
        return 0
    env = os.environ.get("SMALL", "")
    if env not in ("", "0", "1"):
        raise UsageError(f"SMALL={env!r} in the environment: set it to 1 (CI-sized grids) or 0, or unset it")
    small = args.small or env == "1"  # SMALL=1 is honoured: a full-size run would rewrite the committed results
    if small and not args.small:
        print("SMALL=1 in the environment: CI-sized grids (results and figures go to the temporary folders)")
    runs = reproduce(args.names, small=small)
    failed = [r.name for r in runs if not r.ok]
    if failed:
        print(f"{len(failed)} of {len(runs)} notebooks failed: {failed}", file=sys.stderr)
        return 1
    print(f"all {len(runs)} notebooks ran; figures in {figures_dir(small)}, numbers in {results_dir(small)}")
    return 0
