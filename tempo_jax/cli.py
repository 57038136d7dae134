"""The `tempo-jax` command line (also `python -m tempo_jax`).

Commands:
  demo       the `make demo` job: presets, a real and a synthetic batch, every policy on the real batch
  solve      dispatch one batch from files (counts + placement) or from a routing trace, print/write it
  calibrate  fit the max-affine cost model to logged (G, N, t[, tiles]) samples from a CSV file
  phase      a phase-diagram panel: winning fixed policy and TEMPO's gain per (skew, batch size)
  cascade    CascadeEP prefill: serve a request trace under Sync / Async / Async+SF / CascadeEP, print the table
  serve      the MoE layer serving a routing stream with live tables from the solver worker (the runtime)
  bench      run a benchmark script (solver, gemm, ep, cascade)
  reproduce  execute the figure notebooks headless and report failures; --readme renders the README's table

Errors: one line on stderr, ``error: <what was wrong and how to fix it>``, and exit status 2 for a usage error
(bad option or argument, a missing, unreadable or malformed input file, input the library rejects) or 1 for a
runtime failure (a solver or the file system failing while the work runs, an internal error). ``--debug`` (before
or after the command name) adds the traceback. ``--out`` files: missing parent folders are created before the
work starts; an ``--out`` that is a folder, or under a file, is refused before any work.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import traceback
from pathlib import Path

import numpy as np

EXIT_USAGE = 2  # bad options, arguments or input files (argparse's own status for usage errors)
EXIT_FAILURE = 1  # the work itself failed


class UsageError(ValueError):
    """A bad command line or input file: reported on one line with exit status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: `main` prints them (argparse would print the usage block too)."""

    def error(self, message: str):
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")


# ------------------------------------------------------------------------------------ option value types
def _int_at_least(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    parse.__name__ = f"integer >= {minimum}"
    return parse


def _real(minimum: float = 0.0, *, strict: bool = True):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
        if not np.isfinite(value) or value < minimum or (strict and value == minimum):
            raise argparse.ArgumentTypeError(f"must be a finite number {'>' if strict else '>='} {minimum}, got {text}")
        return value

    parse.__name__ = "number"
    return parse


def _number_list(kind: type, minimum: float):
    def parse(text: str) -> tuple:
        out = []
        for item in text.split(","):
            try:
                value = kind(item)
            except ValueError:
                word = "integers" if kind is int else "numbers"
                msg = f"must be comma-separated {word}, got {item.strip()!r} in {text!r}"
                raise argparse.ArgumentTypeError(msg) from None
            if not np.isfinite(value) or value < minimum:
                raise argparse.ArgumentTypeError(f"values must be finite and >= {minimum}, got {item.strip()}")
            out.append(value)
        return tuple(out)

    parse.__name__ = "list"
    return parse


# ----------------------------------------------------------------------------------------- input files
def _load_array(path: str, key: str, option: str = "--counts") -> np.ndarray:
    """``key`` of a .npz, a .npy array, or a JSON list / ``{key: list}``; every error names the option and file."""
    from solvers.checks import read_json

    p = Path(path)
    if not p.exists():
        raise UsageError(f"{option} {path} does not exist")
    if p.is_dir():
        raise UsageError(f"{option} {path} is a folder; give a .json, .npy or .npz file")
    if p.suffix in (".npz", ".npy"):
        try:
            loaded = np.load(p, allow_pickle=False)
        except Exception as err:  # numpy/zipfile raise many types for a damaged file
            raise UsageError(f"{option} {path}: not a readable {p.suffix} file ({type(err).__name__}: {err})") from None
        if isinstance(loaded, np.ndarray):
            return loaded
        with loaded as z:
            if key not in z.files:
                raise UsageError(f"{option} {path} has no array {key!r} (arrays: {z.files})")
            return z[key]
    try:
        data = read_json(p, option)
    except ValueError as err:
        raise UsageError(str(err)) from None
    if isinstance(data, dict):
        if key not in data:
            raise UsageError(f"{option} {path}: JSON object without a {key!r} key (keys: {sorted(data)}); give "
                             f"{{\"{key}\": [...]}} or a bare list")  # fmt: skip
        data = data[key]
    try:
        return np.asarray(data)
    except ValueError as err:  # ragged lists
        raise UsageError(f"{option} {path}: {key} is not a rectangular array ({err})") from None


def _load_json_object(path: str, option: str) -> dict:
    from solvers.checks import read_json

    try:
        data = read_json(path, option)
    except (ValueError, FileNotFoundError) as err:
        raise UsageError(str(err)) from None
    if not isinstance(data, dict):
        raise UsageError(f"{option} {path}: expected a JSON object {{...}}, got {type(data).__name__}")
    return data


def _in_file(option: str, path: str, err: Exception) -> UsageError:
    return UsageError(f"{option} {path}: {err}")


def _build_from_json(path: str, option: str, build):
    """``build(dict)`` of the JSON object in ``path``; its ValueError / TypeError become a usage error naming the
    option and the file."""
    data = _load_json_object(path, option)
    try:
        return build(data)
    except (ValueError, TypeError) as err:
        raise _in_file(option, path, err) from None


def _prepare_out(path: str | None, option: str = "--out") -> Path | None:
    """Check an output file before the work: not a folder, its folder creatable (created now) and writable."""
    if not path:
        return None
    out = Path(path)
    if out.is_dir():
        raise UsageError(f"{option} {path} is a folder; give a file name inside it")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"{option} {path}: cannot create its folder {out.parent} ({err.strerror or err})") from None
    if not os.access(out.parent, os.W_OK):
        raise UsageError(f"{option} {path}: folder {out.parent} is not writable")
    return out


def _fake_cpu_devices(n: int = 8) -> None:
    """Let the CPU backend expose ``n`` devices (expert parallelism on one host) unless already configured.
    Must run before jax is imported; it does not affect GPUs."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags and "jax" not in sys.modules:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()


def _cmd_demo(args: argparse.Namespace) -> int:
    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise UsageError(f"--out {args.out} is a file; demo writes a folder (demo.json, demo_layer.png)")
    _fake_cpu_devices()
    from .demo import run_demo

    run_demo(out_dir=args.out, milp_time_limit=args.milp_time_limit)
    return 0


def _problem_from_args(args: argparse.Namespace):
    from solvers import PRESETS, CostModel, DispatchProblem, Placement

    # Step 1: options that exclude each other or only make sense together.
    if args.placement and args.gpus is not None:
        raise UsageError("--gpus and --placement exclude each other: the placement file sets num_gpus")
    if args.placement and args.replicas is not None:
        raise UsageError("--replicas and --placement exclude each other: the placement file fixes the replicas")
    if args.counts:
        given = [o for o, v in (("--layer", args.layer), ("--batch", args.batch), ("--tokens-per-rank",
                 args.tokens_per_rank)) if v is not None]  # fmt: skip
        if given:
            raise UsageError(f"{', '.join(given)}: only with --trace (they pick its batch); --counts gives the batch")
    gpus = 8 if args.gpus is None else args.gpus
    # Step 2: the cost model.
    if args.cost_json:
        cost = _build_from_json(args.cost_json, "--cost-json", CostModel.from_dict)
    else:
        cost = PRESETS[args.cost or "dsv3_fp8_offline"]
    # Step 3: the batch.
    if args.trace:
        from .workloads import load_sample, load_trace

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
        from solvers.checks import check_array

        counts = _load_array(args.counts, "counts")
        try:
            counts = check_array("counts", counts, ndims=(1, 2), nonnegative=True, integer=True, hint="[E] or [D, E]")
        except ValueError as err:
            raise _in_file("--counts", args.counts, err) from None
        load = counts if counts.ndim == 1 else counts.sum(axis=0)
    # Step 4: the placement.
    if args.placement:
        placement = _build_from_json(args.placement, "--placement", Placement.from_dict)
    elif args.replicas:
        placement = Placement.from_eplb(load, args.replicas, gpus, spread_idle=True)
    else:
        placement = Placement.full(np.shape(counts)[-1], gpus)
    return DispatchProblem(counts, placement, cost)


def _policy_options(text: str | None) -> dict:
    if not text:
        return {}
    try:
        options = json.loads(text)
    except json.JSONDecodeError as err:
        raise UsageError(f"--options: invalid JSON ({err.msg} at column {err.colno}) in {text!r}") from None
    if not isinstance(options, dict):
        raise UsageError(f"--options must be a JSON object such as '{{\"tau\": 0.0}}', got {text!r}")
    return options


def _cmd_solve(args: argparse.Namespace) -> int:
    from solvers import solve

    from .report import table

    problem = _problem_from_args(args)
    options = _policy_options(args.options)
    out = _prepare_out(args.out)
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


_CSV_COLUMNS = {"G": "activated experts", "N": "tokens", "t": "time (µs)", "T": "M-tiles (optional)"}


def _read_samples(path: str) -> dict[str, np.ndarray]:
    """Columns G, N, t (and T if present) of a calibration CSV; errors name the file and line."""
    import csv
    import io

    from solvers.checks import read_text

    try:
        text = read_text(path, "calibrate CSV")
    except (ValueError, FileNotFoundError) as err:
        raise UsageError(str(err)) from None
    rows = [(n, row) for n, row in enumerate(csv.reader(io.StringIO(text)), 1) if any(c.strip() for c in row)]
    if not rows:
        raise UsageError(f"{path} is empty; expected a header row G,N,t[,T] and one sample per row")
    header = [c.strip() for c in rows[0][1]]
    missing = [c for c in ("G", "N", "t") if c not in header]
    if missing:
        raise UsageError(f"{path}:{rows[0][0]}: header lacks columns {missing} (has {header}); expected G,N,t[,T]")
    wanted = {c: header.index(c) for c in _CSV_COLUMNS if c in header}
    values = {c: [] for c in wanted}
    for n, row in rows[1:]:
        if len(row) != len(header):
            raise UsageError(f"{path}:{n}: {len(row)} values, the header has {len(header)} columns; truncated?")
        for c, i in wanted.items():
            try:
                v = float(row[i])
            except ValueError:
                raise UsageError(f"{path}:{n}: column {c} = {row[i].strip()[:40]!r} is not a number") from None
            if not np.isfinite(v) or v < 0 or (c == "t" and v == 0):
                bound = "> 0" if c == "t" else ">= 0"
                raise UsageError(f"{path}:{n}: column {c} ({_CSV_COLUMNS[c]}) must be finite and {bound}, got {v}")
            values[c].append(v)
    need = 5 if "T" in wanted else 4  # one row per parameter: a, b[, b2], c, beta
    if len(rows) - 1 < need:
        cols = "G,N,t,T" if "T" in wanted else "G,N,t"
        raise UsageError(f"{path} has {len(rows) - 1} sample row(s); the fit needs at least {need} rows of {cols}")
    return {c: np.array(v) for c, v in values.items()}


def _cmd_calibrate(args: argparse.Namespace) -> int:
    if args.measure:
        if args.csv is not None:
            raise UsageError(f"--measure profiles this backend; it takes no CSV (got {args.csv})")
        return _cmd_calibrate_measure(args)
    if args.csv is None:
        raise UsageError("give a CSV of G,N,t[,T] samples, or --measure to profile this backend")
    from solvers import fit_max_affine

    out = _prepare_out(args.out)
    data = _read_samples(args.csv)
    try:
        model, report = fit_max_affine(data["G"], data["N"], data["t"], tiles=data.get("T"), iters=args.iters)
    except ValueError as err:
        raise UsageError(f"{args.csv}: {err}") from None
    print(model.to_json())
    print(
        f"mean relative error {report.mean_rel_error:.2%}, samples per piece {report.samples_per_piece}, "
        f"{report.iterations} iterations, converged={report.converged}, n*={model.inflection:.1f}"
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
    from .report import figures_dir, results_dir

    if args.readme:
        from .readme import README, update_readme

        if args.names or args.small:
            raise UsageError("--readme renders the committed JSON; give no notebook names and no --small")
        changed = update_readme()
        print(f"{'updated' if changed else 'unchanged'}: the reproduced-results tables of {README}")
        return 0
    from .reproduce import reproduce

    runs = reproduce(args.names, small=args.small)
    failed = [r.name for r in runs if not r.ok]
    if failed:
        print(f"{len(failed)} of {len(runs)} notebooks failed: {failed}", file=sys.stderr)
        return 1
    print(f"all {len(runs)} notebooks ran; figures in {figures_dir()}, numbers in {results_dir(args.small)}")
    return 0


def _cmd_phase(args: argparse.Namespace) -> int:
    from .report import table
    from .sim import PhaseConfig, run_phase

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
        guard=args.guard,
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
        raise UsageError(f"{script} not found (benchmarks run from a source checkout)")
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


def _add_serve_parser(add) -> None:
    p = add("serve", help="serve a routing stream through the MoE layer with live tables from the worker")
    p.add_argument("--steps", type=_int_at_least(1), default=80, help="layer steps to serve (default 80)")
    p.add_argument(
        "--tokens-per-rank", type=_int_at_least(1), default=128, help="tokens per rank per step (default 128)"
    )
    p.add_argument(
        "--routing",
        default="synthetic",
        choices=["synthetic", "recorded"],
        help="synthetic drifting Zipf stream or a recorded trace (default synthetic)",
    )
    p.add_argument("--trace", default="flame_moe_290m", help="recorded routing: a trace name (bundled if offline)")
    p.add_argument("--experts", type=_int_at_least(1), default=16, help="synthetic routing: E")
    p.add_argument("--top-k", type=_int_at_least(1), default=4, help="synthetic routing: K")
    p.add_argument("--skew", type=float, default=1.0, help="synthetic routing: Zipf s")
    p.add_argument("--drift", type=float, default=0.1, help="synthetic routing: log-popularity walk σ per step")
    p.add_argument(
        "--policy", default="tempo", help="dispatch policy the worker solves (default tempo; see solve --help)"
    )
    p.add_argument("--cost", default="dsv3_fp8_offline", help="cost preset")
    p.add_argument("--cost-json", help="a CostModel JSON (e.g. from calibrate --measure --out) instead of --cost")
    p.add_argument("--mode", default="process", choices=["inline", "thread", "process"], help="where the solver runs")
    p.add_argument("--period-ms", type=float, default=200.0, help="refresher snapshot period")
    p.add_argument("--every-steps", type=int, help="refresh every N steps instead of by time")
    p.add_argument("--budget-ms", type=float, default=200.0, help="results arriving later are not published")
    p.add_argument("--staleness-s", type=float, default=5.0, help="older tables → the uniform fallback")
    p.add_argument("--kill-worker-at", type=int, metavar="STEP", help="SIGKILL the solver worker after this step")
    p.add_argument(
        "--block", type=_int_at_least(1), default=10, help="steps per worker on/off block of the step-time comparison"
    )
    p.add_argument("--seed", type=int, default=0, help="routing and parameter seed (default 0)")
    p.add_argument("--out", default="results", help="folder for serve.json and serve.png")
    p.add_argument("--no-figure", action="store_true", help="do not write serve.png")
    p.add_argument("--quiet", action="store_true", help="no per-step status lines")
    p.set_defaults(fn=_cmd_serve)


def build_parser() -> argparse.ArgumentParser:
    from solvers import POLICIES, PRESETS

    from .sim.phase import MODEL_SHAPES
    from .workloads import TRACES

    parser = _Parser(
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
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")
    add = lambda name, **kw: sub.add_parser(name, parents=[common], **kw)  # noqa: E731
    positive, count = _int_at_least(1), _int_at_least(0)
    presets = ", ".join(sorted(PRESETS))

    p = add("demo", help="run the demo (make demo)")
    p.add_argument("--out", default="results", help="folder for demo.json and demo_layer.png (created if missing)")
    p.add_argument("--milp-time-limit", type=_real(0.0), default=10.0, help="MILP time limit per solve, s (> 0)")
    p.set_defaults(fn=_cmd_demo)

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
    p.set_defaults(fn=_cmd_solve)

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
    m = p.add_argument_group("measure (profile the layer's expert FFN on this backend; tempo_jax.calibrate)")
    m.add_argument("--measure", action="store_true", help="sweep, fit with bootstrap CIs, roofline, ranking agreement")
    m.add_argument("--quick", action="store_true", help="CI-sized sweep (seconds)")
    m.add_argument("--bootstrap", type=positive, default=1000, help="cluster-bootstrap replicates (default 1000)")
    m.add_argument("--profile-csv", metavar="FILE", help="write the measured profile (G,n,N,T,t_us,...) here")
    m.add_argument("--report", metavar="FILE", default="results/calibration.json", help="the full report (JSON)")
    p.set_defaults(fn=_cmd_calibrate)

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
        type=_real(1.0, strict=False),
        default=1.25,
        help="physical slots / experts, >= 1 (default 1.25)",
    )
    p.add_argument(
        "--skews",
        type=_number_list(float, 0.0),
        default=(0.0, 0.6, 1.2),
        help="Zipf skews s >= 0, comma-separated (default 0,0.6,1.2)",
    )
    p.add_argument(
        "--tokens-per-gpu",
        "--batch-sizes",
        type=_number_list(int, 1),
        default=(16, 64, 256, 1024),
        dest="tokens_per_gpu",
        help="batch sizes B, tokens per GPU, ascending, comma-separated",
    )
    p.add_argument("--batches", type=positive, default=4, help="batches per cell (default 4)")
    p.add_argument("--workers", type=positive, default=2, help="worker processes (default 2)")
    p.set_defaults(fn=_cmd_phase)

    p = add("cascade", help="CascadeEP prefill simulation of one configuration (cached under results/cache)")
    p.add_argument("--model", default="deepseek_v4_flash", help="deepseek_v4_flash, deepseek_v4_pro or glm_5_3")
    p.add_argument("--trace", default="mooncake", help="mooncake, mooncake_sample or synthetic")
    p.add_argument("--requests", type=positive, default=400, help="serve the first N requests of the trace")
    p.add_argument("--placement", default="round_robin", help="round_robin, least_loaded, power_of_two or prefix_only")
    p.add_argument("--rate", type=_real(0.0), help="request rate (req/s); default: --load × Sync capacity")
    p.add_argument("--load", type=_real(0.0), default=0.9, help="rate as a fraction of Sync capacity (without --rate)")
    p.add_argument("--modes", default="sync,async,async_sf,cascade", help="comma-separated layer modes")
    p.add_argument("--attention", default="dense", help="dense or sparse")
    p.add_argument("--estimates", default="paper", help="paper (noisy, previous layer) or exact")
    p.add_argument(
        "--guard",
        action="store_true",
        help="launch with the best predicted policy up to each mode's own (default: the paper's rules)",
    )
    p.add_argument(
        "--replication",
        type=_real(1.0, strict=False),
        default=1.0,
        help="expert replicas / experts, >= 1 (EPLB per layer)",
    )
    p.add_argument("--dispatch", default="uniform", help="uniform or tempo (with --replication > 1)")
    p.add_argument("--workers", type=positive, default=2, help="worker processes (default 2)")
    p.set_defaults(fn=_cmd_cascade)

    _add_serve_parser(add)

    p = add("bench", help="run a benchmark script (solver, gemm, ep or cascade); extra arguments pass through")
    p.add_argument("which", choices=["solver", "gemm", "ep", "cascade"], help="benchmark: solver, gemm, ep or cascade")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for the script (see its --help)")
    p.set_defaults(fn=_cmd_bench)

    p = add("reproduce", help="execute the figure notebooks headless (nbclient)")
    p.add_argument("names", nargs="*", help="notebook names or numbers (default: all)")
    p.add_argument("--small", action="store_true", help="CI-sized grids (SMALL=1)")
    p.add_argument("--readme", action="store_true",
                   help="only rewrite README.md's reproduced-results table from results/notebooks/*.json")  # fmt: skip
    p.set_defaults(fn=_cmd_reproduce)
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
