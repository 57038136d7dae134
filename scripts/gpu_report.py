"""Summarise one run of scripts/gpu_check.sh: markdown tables for the README and a figure of the cost profile.

    python scripts/gpu_report.py results/gpu      # -> results/gpu/report.md and results/gpu/profile.png

Reads env.txt, check.json, bench_gemm.json (ceilings, throughput rows, expert-FFN profile) and moe_check.json
from the folder; whatever is missing is reported as missing, not skipped silently. The profile of each
implementation is fitted with `solvers.fit_max_affine` (Eq. 1: t = max(a + b·G, c + β·N)), which gives the
cost model TEMPO would use on that GPU; the figure shows the measurements and the fitted model per G.
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


def report(folder: Path) -> str:
    """The markdown report of one GPU check folder (also writes profile.png there when there is a profile)."""
    out = [f"# GPU check: {folder}\n"]
    env = folder / "env.txt"
    out += ["```", env.read_text().strip() if env.exists() else "env.txt: missing", "```\n"]
    check = _load(folder, "check.json", out)
    if check:

        def detail(r):
            if "not_run" in r:
                return r["not_run"]
            if "error" in r:
                return r["error"]
            if "max_rel_err" in r:
                path = f"; FP8 path: {r['path']}" if "path" in r else ""  # tokamax's kernel or dequantize first
                return ", ".join(f"{k} {v:.1e}" for k, v in r["max_rel_err"].items()) + f" (tol {r['tol']:g}{path})"
            return "bit-exact" if r.get("exact") else "differs"

        verdicts = {True: "ok", False: "FAIL", None: "not run"}
        rows = [[name, verdicts[r["ok"]], detail(r)] for name, r in check["check"].items()]
        mode = "interpret mode (smoke run)" if check["meta"].get("plan") == "smoke" else "compiled kernels"
        out += [f"## Kernel correctness vs reference, {mode}\n", *_md(["case", "verdict", "max rel. error"], rows), ""]
    bench = _load(folder, "bench_gemm.json", out)
    gpu = (bench or {}).get("gpu", {})
    if gpu:
        ceil = gpu.get("ceilings")
        if ceil:
            out.append(f"Measured ceilings: {ceil['tflops']:.0f} TFLOP/s (bf16 matmul), {ceil['gb_per_s']:.0f} GB/s.")
        out.append(f"Tiling chosen by the sweep: `{gpu.get('tiling')}`.\n")
        if "fp8_path" in gpu:  # the "… fp8" rows: FP8 weights in tokamax's kernel, or dequantized first
            fp8 = gpu["fp8_path"]
            kernels = ", ".join(fp8.get("tokamax_fp8_kernels", [])) or "—"
            why = f"; why not fp8: {fp8['tokamax_refusal']}" if fp8.get("tokamax_refusal") else ""
            out.append(f"FP8 weights: tokamax {fp8['tokamax']} (lowers to {kernels}{why}), Pallas {fp8['pallas']}.\n")
        for shape, s in gpu.get("shapes", {}).items():
            rows = [
                [
                    r["name"],
                    r["throughput"],
                    r.get("gb_per_s", float("nan")),
                    r.get("vs_dense", float("nan")),
                    r.get("vs_bound", float("nan")),
                ]
                for r in s["rows"]
            ]
            out += [f"## {shape}: K = {s['k']}, N = {s['n']}, {gpu['rows']} rows, {gpu['local_experts']} groups\n"]
            out += [*_md(["case", "TFLOP/s", "GB/s", "vs dense", "vs bound"], rows), ""]
        for name, err in gpu.get("errors", {}).items():
            out.append(f"- error in {name}: {err}")
        profile = gpu.get("profile", {})
        fits = {}
        for impl, rows in profile.items():
            if len(rows) >= 4:
                fits[impl], stats = fit_profile(rows)
                m = fits[impl]
                out.append(
                    f"- expert-FFN profile, {impl}: a = {m.a:.1f}, b = {m.b:.2f} µs/expert, c = {m.c:.1f}, "
                    f"β = {m.beta:.4f} µs/token, n* = {stats['n_star']:.0f} tokens/expert, "
                    f"mean relative error {stats['mean_rel_error']:.1%}"
                )
        if profile:
            plot_profile(profile, fits, folder / "profile.png")
            out.append("\n![expert-FFN cost profile](profile.png)\n")
    moe = _load(folder, "moe_check.json", out)
    if moe:
        rows = [
            [
                name,
                "ok" if r["ok"] else "FAIL",
                r.get("max_abs_err", float("nan")),
                r.get("drops", "—"),
                r.get("ms", "—"),
                r.get("error", "") or r.get("fp8_path", ""),
            ]
            for name, r in moe["results"].items()
        ]
        out += [f"## MoE layer on {moe['devices']} device(s) ({moe['backend']})\n"]
        heads = ["exchange/gmm", "verdict", "max abs err vs dense", "drops", "ms a call", "error, or FP8 path"]
        out += [*_md(heads, rows), ""]
        plans = moe.get("plans")
        if plans is None:
            out += ["In-graph plans: not measured in this run (an older moe_check.json).", ""]
        else:
            rows = [
                [
                    name,
                    r.get("relief_ms", "—"),
                    r.get("rounds", "—"),
                    r.get("relief_ms_per_round", "—"),
                    r.get("copies_ms", "—"),
                    r.get("error", ""),
                ]
                for name, r in plans.items()
            ]
            out += ["## In-graph plans (jitted, median ms per call)\n"]
            out += [*_md(["cell", "relief ms", "rounds", "ms / round", "copies ms", "error"], rows), ""]
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
