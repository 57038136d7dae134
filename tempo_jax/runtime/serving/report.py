"""What a serving run reports: step-time statistics, the publication steps, each model's summary and figure (the bare
layer's and the tiny LM's), a re-placement described, the report written (``serve.json``) and the figure's frame."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from solvers import DispatchProblem, expected_dispatch, plan_weights, solve

from ..serve_config import ServeConfig
from . import pricing

__all__ = [
    "LAYERS_MEAN",
    "figure_axes",
    "layer_figure",
    "layer_report",
    "layer_summary",
    "lm_figure",
    "lm_report",
    "lm_summary",
    "move_text",
    "publish_steps",
    "save_figure",
    "step_stats",
    "write_report",
]


#: How the LM labels a re-placement's price (every layer's makespan, averaged).
LAYERS_MEAN = "modelled makespan (mean of layers)"


def move_text(mv: dict, label: str = "modelled makespan") -> str:
    """One line for a re-placement (or a dismissed proposal) ``mv``; the first step after it when known."""
    priced_text = f"{label} {mv['makespan_before_us']:.1f} → {mv['makespan_after_us']:.1f} µs"
    verdict = ">" if mv["applied"] else "≤"
    pays = (
        f"gain {mv['gain_us']:.1f} µs over {mv['horizon_steps']} step{'s' * (mv['horizon_steps'] != 1)} {verdict} "
        f"{mv['margin']:g} × move "
        f"{mv['move_us']:.1f} µs"
    )
    if not mv["applied"]:
        return f"step {mv['step']:4d} placement proposal dismissed: {priced_text}; {pays}"
    nxt = f"; next step {mv['next_step_ms']:.0f} ms" if mv.get("next_step_ms") else ""
    return (
        f"step {mv['step']:4d} re-placed: {mv['moved_slots']} slots, {mv['bytes_moved'] / 1e6:.2f} MB moved in "
        f"{mv['seconds'] * 1e3:.1f} ms (+ compile {mv['compile_seconds']:.2f} s); {priced_text}; {pays}{nxt}"
    )


def step_stats(v) -> dict | None:
    """``{"median", "p90", "n"}`` of step times ``v`` (ms), None when there are none."""
    v = np.asarray(v, dtype=np.float64)
    return {"median": float(np.median(v)), "p90": float(np.percentile(v, 90)), "n": int(v.size)} if v.size else None


def publish_steps(rows: list[dict]) -> list[int]:
    """The steps at which a new table version was in place (``rows``: per-step dicts with ``step`` and ``version``)."""
    return [r["step"] for i, r in enumerate(rows) if i and r["version"] != rows[i - 1]["version"]]


def write_report(
    report: dict, out_dir, *, figure: bool, draw: Callable[[dict, Path], None], say: Callable[..., None]
) -> None:
    """``<out_dir>/serve.json`` and, with ``figure``, ``<out_dir>/serve.png`` drawn by ``draw`` (recorded in
    ``report["figure"]``); nothing when ``out_dir`` is None."""
    if out_dir is None:
        return
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "serve.json").write_text(json.dumps(report, indent=1, default=float))
    if figure:
        draw(report, out / "serve.png")
        report["figure"] = str(out / "serve.png")
    say(f"wrote {out / 'serve.json'}" + (f" and {out / 'serve.png'}" if figure else ""))


def figure_axes(rep: dict):
    """``(fig, ax, bx, steps [n])`` of a serving report's figure: modelled makespans above (publications marked),
    step times below; `save_figure` finishes it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = np.array([r["step"] for r in rep["steps"]])
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(10, 6), sharex=True, gridspec_kw={"height_ratios": [2, 1]})
    for i, p in enumerate(rep["publish_steps"]):
        ax.axvline(p, color="0.8", lw=0.8, zorder=0, label="tables published" if i == 0 else None)
    return fig, ax, bx, s


def save_figure(fig, bx, path: Path) -> None:
    """Label the step-time axis, write ``path`` and close the figure."""
    import matplotlib.pyplot as plt

    bx.set_ylabel("step time (ms)")
    bx.set_xlabel("step")
    bx.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def layer_report(cfg, rows, cost, metrics, status, refresher, compile_s, D, Ng, E, K, slots) -> dict:
    per_step = []
    for r in rows:
        counts, placement = r.pop("counts"), r.pop("placement")
        static_w = plan_weights("static", placement)
        static = pricing.group_makespan(
            lambda c, w=static_w, p=placement: cost.makespan(expected_dispatch(w, c, p)), counts
        )
        oracle = pricing.group_makespan(
            lambda c, p=placement: solve(DispatchProblem(c, p, cost), cfg.policy).makespan, counts
        )
        per_step.append({**r, "static_us": static, "oracle_us": oracle})
    kept = [r for r in per_step if not r["first_after_move"]]  # the first step after a move compiles
    step_ms = np.array([r["step_ms"] for r in kept])
    is_on = np.array([r["on"] for r in kept], dtype=bool)
    times = {"on": step_stats(step_ms[is_on]), "off": step_stats(step_ms[~is_on])}
    if times["on"] and times["off"]:
        times["on_over_off"] = times["on"]["median"] / times["off"]["median"]
    mean = {k: float(np.mean([r[k] for r in per_step])) for k in ("live_us", "uniform_us", "static_us", "oracle_us")}
    publishes = publish_steps(per_step)
    return {
        "config": cfg.acting(),
        "shape": {"D": D, "Ng": Ng, "E": E, "K": K, "slots": slots},
        "compile_s": compile_s,
        "step_ms": times,
        "makespan_mean_us": mean,
        "live_over_uniform": mean["live_us"] / mean["uniform_us"],
        "live_over_oracle": mean["live_us"] / mean["oracle_us"],
        "publish_steps": publishes,
        "metrics": metrics,
        "status": status,
        "refresher": refresher.metrics(),
        "steps": per_step,
    }


def layer_summary(rep: dict) -> str:
    t, m, mk = rep["step_ms"], rep["metrics"], rep["makespan_mean_us"]
    lines = ["", "serve: final report", "  " + rep["status"]]
    if rep.get("max_abs_diff_vs_reference") is not None:
        lines.append(f"  layer output vs the dense reference: max |Δ| = {rep['max_abs_diff_vs_reference']:.2e}")
    if t["on"] and t["off"]:
        lines.append(
            f"  step time, median (p90): worker on {t['on']['median']:.1f} ({t['on']['p90']:.1f}) ms over "
            f"{t['on']['n']} steps, off {t['off']['median']:.1f} ({t['off']['p90']:.1f}) ms over "
            f"{t['off']['n']} steps: on/off = {t['on_over_off']:.3f}"
        )
    elif t["on"]:
        lines.append(f"  step time, median (p90): {t['on']['median']:.1f} ({t['on']['p90']:.1f}) ms")
    lines.append(
        f"  modelled makespan, mean over steps (µs): live {mk['live_us']:.1f}, EPLB-even "
        f"{mk['uniform_us']:.1f}, static {mk['static_us']:.1f}, oracle {mk['oracle_us']:.1f} (live/uniform "
        f"{rep['live_over_uniform']:.3f}, live/oracle {rep['live_over_oracle']:.3f})"
    )
    s = m["solve_ms"]
    if s["n"]:
        lines.append(
            f"  solve (worker clock): p50 {s['p50']:.2f} ms, p95 {s['p95']:.2f} ms, max {s['max']:.2f} ms "
            f"over {s['n']} solves; round trip p50 {m['roundtrip_ms']['p50']:.2f} ms"
        )
    for mv in rep.get("replacements", []):
        lines.append("  " + move_text(mv))
    more = " …" if len(rep["publish_steps"]) > 20 else ""
    lines.append(
        f"  publications at steps {rep['publish_steps'][:20]}{more}; restarts {m['restarts']}, fallbacks "
        f"{m['fallbacks']}, compile {rep['compile_s']:.1f} s"
    )
    return "\n".join(lines)


def layer_figure(rep: dict, path: Path) -> None:
    steps = rep["steps"]
    fig, ax, bx, s = figure_axes(rep)
    for key, label, style in (
        ("live_us", f"live ({rep['config']['policy']}, worker)", "-"),
        ("uniform_us", "EPLB-even", "--"),
        ("static_us", "static", ":"),
        ("oracle_us", "oracle (solved on the step itself)", "-."),
    ):
        ax.plot(s, [r[key] for r in steps], style, label=label)
    kill = rep["config"]["kill_worker_at"]
    if kill is not None:
        ax.axvline(kill, color="C3", lw=1.5, label="worker killed")
    for i, mv in enumerate(m for m in rep.get("replacements", []) if m["applied"]):
        ax.axvline(mv["step"], color="C4", lw=1.2, ls=":", label="experts re-placed" if i == 0 else None)
    ax.set_ylabel("modelled makespan (µs)")
    ax.legend(fontsize=8, ncol=3)
    shape = rep["shape"]
    ax.set_title(
        f"tempo-jax serve: {rep['config']['routing']} routing, E={shape['E']}, top-{shape['K']}, "
        f"EP{shape['D']}, {rep['config'].get('cost_json') or rep['config'].get('cost')}"
    )
    ms = np.array([r["step_ms"] for r in steps])
    on = np.array([r["on"] for r in steps])
    bx.scatter(s[on], ms[on], s=10, label="worker on")
    bx.scatter(s[~on], ms[~on], s=10, marker="x", label="worker off")
    save_figure(fig, bx, path)


def lm_report(cfg: ServeConfig, rows, metrics, status, history, refresher, setup_s, D, Ng, L, phases) -> dict:
    step_ms = {}
    for kind in ("prefill", "decode"):
        for on in (True, False):  # the first step after a re-placement compiles: not a serving step time
            v = [r["step_ms"] for r in rows if r["kind"] == kind and r["on"] == on and not r["first_after_move"]]
            step_ms[f"{kind}_{'on' if on else 'off'}"] = step_stats(v)
    refresh = [h["solve_ms"] for h in history]
    live = float(np.mean([np.mean(r["live_us"]) for r in rows]))
    uniform = float(np.mean([np.mean(r["uniform_us"]) for r in rows]))
    by_phase = {}
    for kind in ("prefill", "decode"):
        pick = [r for r in rows if r["kind"] == kind]
        if pick:
            lv, un = (float(np.mean([np.mean(r[k]) for r in pick])) for k in ("live_us", "uniform_us"))
            by_phase[kind] = {"live": lv, "uniform": un, "live_over_uniform": lv / un, "steps": len(pick)}
    return {
        "config": cfg.acting(),
        "shape": {"D": D, "Ng": Ng, "layers": L, "E": cfg.experts, "K": cfg.top_k, "phases": list(phases)},
        "setup_s": setup_s,
        "step_ms": step_ms,
        "refresh_ms": step_stats(refresh),  # the worker's clock: every layer's window solved and converted
        "tables_per_refresh": history[-1]["layers"] if history else 0,
        "makespan_mean_us": {"live": live, "uniform": uniform},
        "live_over_uniform": live / uniform,
        "makespan_by_phase_us": by_phase,
        "publish_steps": publish_steps(rows),
        "metrics": metrics,
        "status": status,
        "refresher": refresher.metrics(),
        "steps": rows,
    }


def lm_summary(rep: dict) -> str:
    lines = ["", "serve: final report (tiny MoE LM)", "  " + rep["status"]]
    for mv in rep.get("replacements", []):
        lines.append("  " + move_text(mv, LAYERS_MEAN))
    for key, s in rep["step_ms"].items():
        if s:
            lines.append(
                f"  step time {key.replace('_', ', worker ')}: median {s['median']:.1f} ms (p90 "
                f"{s['p90']:.1f}) over {s['n']} steps"
            )
    r = rep["refresh_ms"]
    if r:
        shape = rep["shape"]
        lines.append(
            f"  refresh ({len(shape['phases'])} phases × {shape['layers']} layers' tables, worker clock): "
            f"median {r['median']:.2f} ms, "
            f"p90 {r['p90']:.2f} ms over {r['n']} refreshes"
        )
    mk = rep["makespan_mean_us"]
    lines.append(
        f"  modelled makespan, mean over steps and layers: live {mk['live']:.1f} µs vs EPLB-even "
        f"{mk['uniform']:.1f} µs ({rep['live_over_uniform']:.3f})"
    )
    for kind, v in rep["makespan_by_phase_us"].items():
        lines.append(
            f"    {kind}: live {v['live']:.1f} µs vs {v['uniform']:.1f} µs ({v['live_over_uniform']:.3f}) "
            f"over {v['steps']} steps"
        )
    return "\n".join(lines)


def lm_figure(rep: dict, path: Path) -> None:
    steps = rep["steps"]
    fig, ax, bx, s = figure_axes(rep)
    ax.plot(s, [np.mean(r["live_us"]) for r in steps], "-", label=f"live ({rep['config']['policy']}, worker)")
    ax.plot(s, [np.mean(r["uniform_us"]) for r in steps], "--", label="EPLB-even")
    ax.set_ylabel("modelled makespan (µs),\nmean over layers")
    ax.legend(fontsize=8)
    shape = rep["shape"]
    ax.set_title(
        f"tempo-jax serve: tiny MoE LM, {shape['layers']} layers × E={shape['E']}, top-{shape['K']}, EP{shape['D']}"
    )
    for i, mv in enumerate(m for m in rep.get("replacements", []) if m["applied"]):
        ax.axvline(mv["step"], color="C3", lw=1.2, ls=":", label="experts re-placed" if i == 0 else None)
    ax.legend(fontsize=8)
    for kind, marker in (("prefill", "o"), ("decode", "x")):
        pick = np.array([r["kind"] == kind for r in steps])
        bx.scatter(s[pick], np.array([r["step_ms"] for r in steps])[pick], s=10, marker=marker, label=kind)
    save_figure(fig, bx, path)
