"""Summarise one run of scripts/gpu_check.sh: markdown tables for the README, the issue's goals beside the numbers,
and figures of the flat-regime sweep and the cost profile.

    python scripts/gpu_report.py results/gpu      # -> results/gpu/report.md, flat.png and profile.png

Reads env.txt, check.json, bench_gemm.json (implementations, ceilings, throughput rows, the flat-regime sweep, the
expert-FFN profile) and moe_check.json (the in-graph plans, the layer per call for every exchange x gmm, the layer
check, presets) from the folder; whatever is missing is reported as missing, and every implementation or case that
did not run says why, never skipped silently. The profile of each implementation is fitted with
`solvers.fit_max_affine` (Eq. 1: t = max(a + b·G, c + β·N)), which gives the cost model TEMPO would use on that GPU;
the figure shows the measurements and the fitted model per G.

Goals (issue 72), each "met", "not met" or "not run" (`GOALS`; `goals` evaluates them):
  1. the Mosaic gmm at >= 0.85x a dense matmul of the same FLOPs at >= 128 rows per group, balanced (bf16 shapes table);
  2. in the flat regime (the sweep's bandwidth-bound cells) >= 0.85 of the measured copy bandwidth, and its time
     monotone in rows at every G;
  3. the expert FFN's fitted fixed cost a <= 10 µs (the Mosaic gmm's; every implementation's is in the profile table);
  4. the in-graph plan (relief, EP8, E 256 + 64 slots) <= 100 µs a call (the better of its default compilation and
     CUDA graphs, where those give the same plan).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from solvers import CostModel, fit_max_affine  # noqa: E402

#: The implementation the goals are held to (bench_gemm's row name).
GOAL_GMM = "mosaic gmm"
#: The cell of moe_check's plans the plan goal is held to (gpu_moe_check.PLAN_GOAL_CELL).
PLAN_GOAL_CELL = "EP8 E256+64 B512"
#: (key, goal as shown, target as shown) of each goal, in the report's order.
GOALS = (
    ("gmm_vs_dense", "Mosaic gmm vs dense, >= 128 rows per group, balanced (bf16)", ">= 0.85x"),
    ("flat_bandwidth", "Mosaic gmm, flat regime: fraction of the copy bandwidth", ">= 0.85"),
    ("flat_monotone", "Mosaic gmm, flat regime: time monotone in rows at every G", "monotone"),
    ("ffn_fixed_cost", "Expert FFN fixed cost a (Mosaic gmm fit)", "<= 10 µs"),
    ("plan", f"In-graph plan (relief) per call, {PLAN_GOAL_CELL}", "<= 100 µs"),
)
#: The headings every full report has (tests/test_gpu_check.py checks each is rendered).
SECTIONS = (
    "## Goals (issue 72)",
    "## Grouped GEMMs measured",
    "## Kernel correctness vs reference",
    "## Flat regime",
    "## Expert-FFN profile",
    "## The layer per call on one device",
    "## MoE layer on",
    "## In-graph plans",
)


def _md(headers: list[str], rows: list[list]) -> list[str]:
    def cell(v):
        return f"{v:.3g}" if isinstance(v, float) else str(v)

    return ["| " + " | ".join(headers) + " |", "|" + " --- |" * len(headers)] + [
        "| " + " | ".join(cell(v) for v in r) + " |" for r in rows
    ]


def _load(folder: Path, name: str, out: list[str]) -> dict | None:
    path = folder / name
    if not path.exists():
        out.append(f"_{name}: missing (the step did not finish)_\n")
        return None
    return json.loads(path.read_text())


def _why(r: dict) -> str:
    """The reason a row has no time: "not run: …" or "FAILED: …"."""
    if "not_run" in r:
        return f"not run: {r['not_run']}"
    return f"FAILED: {r.get('error', '?')}"


def fit_profile(rows: list[dict]) -> tuple[CostModel, dict]:
    """Fit Eq. 1 to one implementation's profile rows ({G, N, us}); returns (model, {error, n*})."""
    G, N, t = (np.array([r[k] for r in rows], float) for k in ("G", "N", "us"))
    model, rep = fit_max_affine(G, N, t)
    return model, {"mean_rel_error": rep.mean_rel_error, "n_star": model.inflection}


def plot_profile(profile: dict, fits: dict, path: Path) -> None:
    """Time vs tokens per expert, one panel per implementation, one colour per G; dashed: the fitted model."""
    impls = [k for k, v in profile.items() if v]
    fig, axes = plt.subplots(1, max(len(impls), 1), figsize=(5.5 * max(len(impls), 1), 4), squeeze=False)
    for ax, impl in zip(axes[0], impls, strict=False):
        rows = profile[impl]
        for i, g in enumerate(sorted({r["G"] for r in rows})):
            pts = sorted((r["tokens_per_expert"], r["us"]) for r in rows if r["G"] == g)
            n, us = np.array(pts).T
            ax.plot(n, us, "o-", color=f"C{i}", label=f"G = {g} experts")
            if impl in fits:
                grid = np.linspace(max(n.min(), 1), n.max(), 200)
                ax.plot(grid, fits[impl].gpu_times(np.full_like(grid, g), g * grid), "--", color=f"C{i}", lw=1)
        title = impl if impl not in fits else f"{impl}: fit n* ≈ {fits[impl].inflection:.0f} tokens/expert"
        ax.set(xscale="log", yscale="log", xlabel="tokens per expert", ylabel="expert FFN time (µs)", title=title)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_flat(flat: dict, path: Path) -> None:
    """The flat-regime sweep: µs a call (top) and fraction of the copy ceiling (bottom) vs rows per group, one panel
    per implementation, one line per G; the goal (0.85) dotted."""
    impls = [k for k, v in flat.get("cells", {}).items() if any("us" in c for c in v)]
    if not impls:
        return
    fig, axes = plt.subplots(2, len(impls), figsize=(5 * len(impls), 7), squeeze=False, sharex=True)
    for j, impl in enumerate(impls):
        cells = flat["cells"][impl]
        for i, g in enumerate(sorted({c["G"] for c in cells})):
            pts = sorted(
                (c["rows_per_group"], c["us"], c.get("frac_copy", np.nan)) for c in cells if c["G"] == g and "us" in c
            )
            if not pts:
                continue
            r, us, frac = np.array(pts).T
            axes[0, j].plot(r, us, "o-", color=f"C{i}", label=f"G = {g}")
            axes[1, j].plot(r, frac, "o-", color=f"C{i}", label=f"G = {g}")
        axes[0, j].set(yscale="log", ylabel="µs a call", title=impl)
        axes[1, j].axhline(0.85, ls=":", color="k", lw=1)
        axes[1, j].set(xlabel="rows per group", ylabel="weight bytes / s ÷ copy ceiling")
        axes[1, j].set_xscale("log", base=2)
        axes[0, j].legend(fontsize=8)
    fig.suptitle(f"flat regime: {flat.get('shape')} (K = {flat.get('k')}, N = {flat.get('n')}), bf16")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ------------------------------------------------------------------------------------------------------ goals
def _verdict(ok: bool) -> str:
    return "met" if ok else "not met"


def goals(gpu: dict | None, moe: dict | None, fits: dict, refused: dict | None = None) -> dict[str, tuple[str, str]]:
    """Each goal (`GOALS`) → (measured, verdict), verdict "met", "not met" or "not run: <why>"; ``refused``: the
    implementations whose profile `fit_profile` refused, with its reason."""
    gpu = gpu or {}
    impls = gpu.get("implementations", {})
    missing = impls.get(GOAL_GMM, "this run did not measure it (an older bench_gemm.json)")
    absent = f"not run: {missing}" if missing != "runs" else None
    if not gpu:
        absent = "not run: bench_gemm.json missing"
    out: dict[str, tuple[str, str]] = {}

    # 1. vs dense on the shapes table, balanced, >= 128 rows per group
    rows, small = [], []
    for shape, s in gpu.get("shapes", {}).items():
        rpg = s.get("rows_per_group", 0)
        mine = [r for r in s["rows"] if r.get("impl") == GOAL_GMM and r.get("kind") == "balanced"]
        (rows if rpg >= 128 else small).extend((shape, rpg, r) for r in mine)
    if absent:
        out["gmm_vs_dense"] = ("—", absent)
    elif not rows:
        rpgs = sorted({s.get("rows_per_group", 0) for s in gpu.get("shapes", {}).values()})
        out["gmm_vs_dense"] = ("—", f"not run: no balanced shape with >= 128 rows per group here ({rpgs})")
    else:
        timed = [(sh, rpg, r["vs_dense"]) for sh, rpg, r in rows if "vs_dense" in r]
        bad = [f"{sh}: {_why(r)}" for sh, _, r in rows if "vs_dense" not in r]
        shown = ", ".join(f"{sh} {v:.2f}x ({rpg} rows/group)" for sh, rpg, v in timed)
        if bad and all("not run" in b for b in bad) and not timed:
            out["gmm_vs_dense"] = ("—", f"not run: {bad[0]}")
        else:
            ok = not bad and min(v for *_, v in timed) >= 0.85
            out["gmm_vs_dense"] = ("; ".join([shown, *bad]), _verdict(ok))

    # 2. the flat regime: bandwidth-bound cells' fraction of the copy ceiling, and monotone time
    flat = gpu.get("flat", {})
    cells = flat.get("cells", {}).get(GOAL_GMM)
    if absent or cells is None:
        why = absent or f"not run: {flat.get('not_run', {}).get(GOAL_GMM, 'no flat-regime sweep in this run')}"
        out["flat_bandwidth"] = out["flat_monotone"] = ("—", why)
    else:
        bound = [c for c in cells if c.get("bandwidth_bound")]
        if not bound:
            why = (
                "no cell of the sweep is bandwidth-bound by this run's ceilings"
                if gpu.get("ceilings")
                else "no ceilings"
            )
            out["flat_bandwidth"] = ("—", f"not run: {why}")
        else:
            worst = min(bound, key=lambda c: c["frac_copy"])
            shown = (
                f"min {worst['frac_copy']:.2f} (G = {worst['G']}, {worst['rows_per_group']} rows/group) over "
                f"{len(bound)} bandwidth-bound cells"
            )
            out["flat_bandwidth"] = (shown, _verdict(worst["frac_copy"] >= 0.85))
        mono = flat.get("monotone", {}).get(GOAL_GMM, {})
        known = {g: m["within_tol"] for g, m in mono.items() if m["within_tol"] is not None}
        if not known:
            out["flat_monotone"] = ("—", "not run: no G with every row count measured")
        else:
            tol = flat.get("monotone_tol", 0.05)
            shown = ", ".join(f"G = {g}: {'yes' if v else 'no'}" for g, v in known.items())
            shown += f" (steps down within {tol:.0%} allowed)"
            if len(known) < len(mono):
                shown += f"; {len(mono) - len(known)} G incomplete"
            out["flat_monotone"] = (shown, _verdict(all(known.values()) and len(known) == len(mono)))

    # 3. the FFN's fixed cost a
    if absent:
        out["ffn_fixed_cost"] = ("—", absent)
    elif GOAL_GMM in (refused or {}):
        out["ffn_fixed_cost"] = ("—", f"not run: the profile's fit refused its samples ({refused[GOAL_GMM]})")
    elif GOAL_GMM not in fits:
        n = len(gpu.get("profile", {}).get(GOAL_GMM, []))
        out["ffn_fixed_cost"] = ("—", f"not run: {n} profile points for {GOAL_GMM} (a fit needs 4)")
    else:
        a = fits[GOAL_GMM].a
        out["ffn_fixed_cost"] = (f"a = {a:.1f} µs", _verdict(a <= 10.0))

    # 4. the in-graph plan
    plans = (moe or {}).get("plans")
    cell = (moe or {}).get("plan_goal_cell", PLAN_GOAL_CELL)
    if moe is None:
        out["plan"] = ("—", "not run: moe_check.json missing")
    elif plans is None:
        out["plan"] = ("—", "not run: no in-graph plans in this run (an older moe_check.json)")
    elif cell not in plans:
        here = ", ".join(plans) or "none"
        out["plan"] = ("—", f"not run: cell {cell} not measured in this run (cells: {here})")
    elif "relief_ms" not in plans[cell]:
        out["plan"] = ("—", f"not met: {plans[cell].get('error', '?')}")
    else:
        r = plans[cell]
        us = r["relief_ms"] * 1e3
        shown = f"{us:.0f} µs ({r.get('rounds', '?')} rounds)"
        if r.get("relief_graph_equal"):  # compiled as CUDA graphs, the same plan: the better of the two counts
            shown += f"; as CUDA graphs {r['relief_graph_ms'] * 1e3:.0f} µs"
            us = min(us, r["relief_graph_ms"] * 1e3)
        out["plan"] = (shown, _verdict(us <= 100.0))
    return out


# ------------------------------------------------------------------------------------------------------ sections
def _flat_section(flat: dict, folder: Path) -> list[str]:
    out = [f"## Flat regime: {flat.get('shape')} (K = {flat['k']}, N = {flat['n']}), bf16, every group r rows\n"]
    out.append(
        f"µs a call ({flat['chain']} dependent calls per timed program), the activated experts' weight bytes per "
        "second as a fraction of the run's copy ceiling (× copy) and the FLOP rate as a fraction of its matmul ceiling "
        "(× matmul); * marks the bandwidth-bound cells (weight bytes at the copy ceiling outlast the FLOPs at the "
        "matmul ceiling), which the bandwidth goal is held to.\n"
    )
    for impl, why in flat.get("not_run", {}).items():
        out.append(f"- {impl}: not run: {why}")
    if flat.get("not_run"):
        out.append("")
    gs = flat["groups"]
    for impl, cells in flat.get("cells", {}).items():
        by = {(c["G"], c["rows_per_group"]): c for c in cells}
        heads = ["rows/group"] + [f"G={g} {h}" for g in gs for h in ("µs", "× copy", "× matmul")]
        rows = []
        for r in flat["rows_per_group"]:
            row: list = [r]
            for g in gs:
                c = by.get((g, r))
                if c is None or "us" not in c:
                    row += ["not run" if c is None or "not_run" in c else "FAILED", "—", "—"]
                else:
                    star = "*" if c.get("bandwidth_bound") else ""
                    row += [
                        f"{c['us']:.1f}",
                        f"{c.get('frac_copy', float('nan')):.3g}{star}",
                        c.get("frac_matmul", "—"),
                    ]
            rows.append(row)
        out += [f"### {impl}\n", *_md(heads, rows), ""]
        mono = flat.get("monotone", {}).get(impl, {})
        shown = ", ".join(
            f"G = {g}: "
            + ("incomplete" if m["within_tol"] is None else ("yes" if m["within_tol"] else "no"))
            + ("" if m["strict"] in (None, m["within_tol"]) else f" (strictly: {'yes' if m['strict'] else 'no'})")
            for g, m in mono.items()
        )
        out += [f"Monotone in rows (steps down within {flat.get('monotone_tol', 0.05):.0%}): {shown}.", ""]
        for c in cells:
            if "error" in c or ("not_run" in c and "time budget" not in c["not_run"]):
                out.append(f"- G = {c['G']}, {c['rows_per_group']} rows: {_why(c)}")
    plot_flat(flat, folder / "flat.png")
    if (folder / "flat.png").exists():
        out.append("\n![flat-regime sweep](flat.png)\n")
    return out


def _per_call_section(per_call: dict, title: str) -> list[str]:
    """A matrix exchange x gmm of ms a call (FP8 experts as extra rows), then the reasons for what did not run."""
    names = list(per_call)
    gmms = list(dict.fromkeys(n.split("/")[1] for n in names))
    rows_of = list(dict.fromkeys(n.split("/")[0] + ("/fp8" if n.endswith("/fp8") else "") for n in names))
    rows, notes = [], {}
    for rk in rows_of:
        ex, fp8 = rk.split("/")[0], rk.endswith("/fp8")
        row: list = [rk]
        for g in gmms:
            r = per_call.get(f"{ex}/{g}" + ("/fp8" if fp8 else ""))
            if r is None:
                row.append("—")
            elif "ms" in r:
                row.append(f"{r['ms']:.3f}" + ("" if r["ok"] else " (FAIL)"))
            else:
                why = _why(r)
                notes.setdefault(why, []).append(f"{ex}/{g}" + ("/fp8" if fp8 else ""))
                row.append("not run" if "not_run" in r else "FAILED")
        rows.append(row)
    out = [title, *_md(["exchange", *gmms], rows), ""]
    out += [f"- {', '.join(cases)}: {why}" for why, cases in notes.items()]
    launched = {name: r["kernels"] for name, r in per_call.items() if r.get("kernels")}
    if launched:  # the compiled program's units of work per stage (`tempo_jax.layer.scopes.stage_kernels`)
        by_size = sorted(launched.values(), key=len, reverse=True)  # each case's stages come in call order
        stages = [s for s in dict.fromkeys(s for k in by_size for s in k) if s != "(outside)"] + ["(outside)"]
        out += ["", "What each stage launches (compiled program, units of work a call; issue 72, item 2):", ""]
        out += _md(["case", *stages], [[name, *(k.get(s, 0) for s in stages)] for name, k in launched.items()])
    return [*out, ""]


def report(folder: Path) -> str:
    """The markdown report of one GPU check folder (also writes flat.png and profile.png there when it has them)."""
    out = [f"# GPU check: {folder}\n"]
    env = folder / "env.txt"
    out += ["```", env.read_text().strip() if env.exists() else "env.txt: missing", "```\n"]
    body: list[str] = []
    check = _load(folder, "check.json", body)
    bench = _load(folder, "bench_gemm.json", body)
    moe = _load(folder, "moe_check.json", body)
    gpu = (bench or {}).get("gpu", {})
    smoke = any((d or {}).get("meta", {}).get("plan") == "smoke" for d in (check, bench))
    # The profile fits first: the goals need the Mosaic gmm's fixed cost.
    profile, fits, fit_stats, refused = gpu.get("profile", {}), {}, {}, {}
    for impl, rows in profile.items():
        if len(rows) >= 4:
            try:
                fits[impl], fit_stats[impl] = fit_profile(rows)
            except ValueError as e:  # samples no Eq. 1 prices (times that do not rise): said, not a lost report
                refused[impl] = str(e).split(";")[0]
    # Goals
    g = goals(gpu if bench else None, moe, fits, refused)
    out.append("## Goals (issue 72)\n")
    if smoke:
        out.append("_A smoke run (CPU, tiny shapes, interpret mode): the verdicts only show that the report works._\n")
    out += [*_md(["goal", "target", "measured", "verdict"], [[t, tgt, *g[k]] for k, t, tgt in GOALS]), ""]
    out += body
    if gpu:
        out.append("## Grouped GEMMs measured\n")
        impls = gpu.get("implementations", {})
        if not impls:
            out.append("Not recorded in this run (an older bench_gemm.json): the shapes tables list what ran.")
        else:
            rows = [[n, s if s == "runs" else f"not run: {s}"] for n, s in impls.items()]
            out += _md(["implementation", "status"], rows)
        out.append("")
    if check:

        def detail(r):
            if "not_run" in r:
                return r["not_run"]
            if "error" in r:
                return r["error"]
            if "max_rel_err" in r:
                path = f"; FP8 path: {r['path']}" if "path" in r else ""  # in the kernel, or dequantize first
                return ", ".join(f"{k} {v:.1e}" for k, v in r["max_rel_err"].items()) + f" (tol {r['tol']:g}{path})"
            return "bit-exact" if r.get("exact") else "differs"

        verdicts = {True: "ok", False: "FAIL", None: "not run"}
        rows = [[name, verdicts[r["ok"]], detail(r)] for name, r in check["check"].items()]
        mode = "interpret mode (smoke run)" if check["meta"].get("plan") == "smoke" else "compiled kernels"
        out += [f"## Kernel correctness vs reference, {mode}\n", *_md(["case", "verdict", "max rel. error"], rows), ""]
    if gpu:
        ceil = gpu.get("ceilings")
        if ceil:
            copies = ", ".join(f"{k} {v:.0f}" for k, v in ceil.get("copies", {}).items())
            out.append(
                f"Measured ceilings: {ceil['tflops']:.0f} TFLOP/s (bf16 matmul), {ceil['gb_per_s']:.0f} GB/s (best "
                f"device-to-device copy, bytes read + written{': ' + copies if copies else ''})."
            )
        else:
            out.append("Measured ceilings: none (the ceiling cases failed or did not run).")
        tiling = gpu.get("tiling")
        out.append(
            f"Pallas tiling chosen by the sweep: `{tiling}`.\n" if tiling else "No Pallas tiling sweep in this run.\n"
        )
        if "fp8_path" in gpu:  # the "… fp8" rows: FP8 weights in the kernel, or dequantized first
            fp8 = gpu["fp8_path"]
            kernels = ", ".join(fp8.get("tokamax_fp8_kernels", [])) or "—"
            why = f"; why not fp8: {fp8['tokamax_refusal']}" if fp8.get("tokamax_refusal") else ""
            out.append(
                f"FP8 weights: tokamax {fp8['tokamax']} (lowers to {kernels}{why}), Pallas {fp8['pallas']}, "
                f"Mosaic {fp8.get('mosaic', '—')}.\n"
            )
        for shape, s in gpu.get("shapes", {}).items():
            rows = []
            for r in s["rows"]:
                if "best_s" not in r:
                    rows.append([r["name"], _why(r), "", "", ""])
                    continue
                vals = [r.get(k, float("nan")) for k in ("gb_per_s", "vs_dense", "vs_bound")]
                rows.append([r["name"], r["throughput"], *vals])
            rpg = f", {s['rows_per_group']} rows per group balanced" if "rows_per_group" in s else ""
            out += [f"## {shape}: K = {s['k']}, N = {s['n']}, {gpu['rows']} rows, {gpu['local_experts']} groups{rpg}\n"]
            out += [*_md(["case", "TFLOP/s", "GB/s", "vs dense", "vs bound"], rows), ""]
        for name, err in gpu.get("errors", {}).items():
            out.append(f"- error in {name}: {err}")
        if gpu.get("skipped"):
            out.append(f"- time budget: {len(gpu['skipped'])} cases not run (first: {gpu['skipped'][0]})")
        out.append("")
        if "flat" in gpu:
            out += _flat_section(gpu["flat"], folder)
        else:
            out += ["## Flat regime: not measured in this run (an older bench_gemm.json)", ""]
        out.append("## Expert-FFN profile (Eq. 1 fit per implementation: t = max(a + b·G, c + β·N))\n")
        rows = []
        for impl, m in fits.items():
            st = fit_stats[impl]
            met = _verdict(m.a <= 10.0)
            rows.append(
                [impl, m.a, m.b, m.c, f"{m.beta:.4f}", f"{st['n_star']:.0f}", f"{st['mean_rel_error']:.1%}", met]
            )
        for impl, pts in profile.items():
            if impl in refused:
                rows.append([impl, f"fit refused: {refused[impl]}", "", "", "", "", "", "not run"])
            elif impl not in fits:
                rows.append([impl, f"not run: {len(pts)} points (a fit needs 4)", "", "", "", "", "", "not run"])
        for impl, why in gpu.get("profile_not_run", {}).items():
            rows.append([impl, f"not run: {why}", "", "", "", "", "", "not run"])
        heads = [
            "implementation",
            "a (µs)",
            "b (µs/expert)",
            "c (µs)",
            "β (µs/token)",
            "n*",
            "mean rel. err",
            "a <= 10 µs",
        ]
        out += [*_md(heads, rows), ""]
        if profile:
            csv = gpu.get("profile_csv", {}).get("implementation")
            if csv:
                out.append(f"profile.csv (for `tempo-jax calibrate`) holds {csv}'s profile (the fastest).\n")
            plot_profile(profile, fits, folder / "profile.png")
            out.append("![expert-FFN cost profile](profile.png)\n")
    if moe:
        per_call = moe.get("per_call")
        if per_call is None:
            out += ["## The layer per call on one device: not measured in this run (an older moe_check.json)", ""]
        else:
            title = "## The layer per call on one device (ms a call, jitted, median; every exchange x gmm)\n"
            out += _per_call_section(per_call, title)
        rows = [
            [
                name,
                {True: "ok", False: "FAIL", None: "not run"}[r["ok"]],
                r.get("max_abs_err", "—"),
                r.get("drops", "—"),
                r.get("ms", "—"),
                r.get("error", "") or (f"not run: {r['not_run']}" if "not_run" in r else r.get("fp8_path", "")),
            ]
            for name, r in moe["results"].items()
        ]
        out += [f"## MoE layer on {moe['devices']} device(s) ({moe['backend']})\n"]
        heads = ["exchange/gmm", "verdict", "max abs err vs dense", "drops", "ms a call", "error, or FP8 path"]
        out += [*_md(heads, rows), ""]
        plans = moe.get("plans")
        if plans is None:
            out += ["## In-graph plans: not measured in this run (an older moe_check.json).", ""]
        else:
            rows = [
                [
                    name,
                    r.get("relief_ms", "—"),
                    r.get("relief_graph_ms", r.get("relief_graph_error", "—")),
                    r.get("relief_graph_equal", "—"),
                    r.get("rounds", "—"),
                    r.get("relief_ms_per_round", "—"),
                    r.get("copies_ms", "—"),
                    r.get("error", ""),
                ]
                for name, r in plans.items()
            ]
            out += ["## In-graph plans (jitted, median ms per call)\n"]
            heads = ["cell", "relief ms", "as CUDA graphs", "same plan", "rounds", "ms / round", "copies ms", "error"]
            out += [*_md(heads, rows), ""]
    return "\n".join(out) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", nargs="?", default="results/gpu", help="the folder gpu_check.sh wrote")
    args = p.parse_args()
    folder = Path(args.folder)
    if not folder.is_dir():
        print(f"error: {folder} is not a folder (run scripts/gpu_check.sh first)", file=sys.stderr)
        return 2
    text = report(folder)
    (folder / "report.md").write_text(text)
    print(text)
    print(f"wrote {folder / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
