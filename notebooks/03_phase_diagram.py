# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Phase diagram and flip boundary (TEMPO §3.2–3.3, Figs. 6 and 12)
#
# Synthetic Zipf(s) routing (κ = 2000), EPLB placement from the long-run average load, calibrated offline
# cost models (DSv3 fp8 / Qwen3-30B / DSv2-Lite shapes). Per cell (B tokens per GPU × skew s) every batch is
# dispatched by METRO (M), token-LP (L), EPLB-even (E), static and TEMPO, all scored under the same model.
# Letters: the winning fixed policy; colour: TEMPO's gain over it, `1 − tempo/best fixed`. The dashed line is
# the analytic boundary `B* = min(B*_avg, B*_hot)` (`tempo_jax.sim.boundary`), no fitting.
#
# Results are cached in `results/cache/` (keyed by the configuration), so re-running only re-plots.
# `SMALL=1` shrinks the grids for CI.

# %%
import dataclasses
import os
import time

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import TwoSlopeNorm

from tempo_jax.report import figures_dir, table
from tempo_jax.sim import PhaseConfig, run_phase
from tempo_jax.sim.summary import boundary_rows, phase_rows, scale_rows, scale_stats

SMALL = os.environ.get("SMALL", "0") == "1"
FIGURES = figures_dir()
FIGURES.mkdir(parents=True, exist_ok=True)
t_start = time.perf_counter()

# Fig. 6: three shapes × two replication ratios at EP8. Fig. 12: DSv3, 1.25×, EP 8–64 (compute-only and comm-aware).
if SMALL:
    LADDER = (16, 64, 256, 1024)
    FIG6 = PhaseConfig(eps=(8,), skews=(0.0, 0.6, 1.2), tokens_per_gpu=LADDER, batches=2)
    FIG12 = PhaseConfig(
        presets=("dsv3_fp8_offline",), replications=(1.25,), skews=(0.0, 1.2), tokens_per_gpu=LADDER, batches=2
    )
else:
    FIG6 = PhaseConfig(eps=(8,), batches=16)
    FIG12 = PhaseConfig(presets=("dsv3_fp8_offline",), replications=(1.25,), batches=8)
FIG12_COMM = dataclasses.replace(FIG12, comm_slope=0.0037)  # γ = k_r = 0.0037 µs/token, c2 = 0 (§3.3)

# %%
timings = {}
results = {}
for name, cfg in (("fig6", FIG6), ("fig12", FIG12), ("fig12_comm", FIG12_COMM)):
    t0 = time.perf_counter()
    results[name] = run_phase(cfg, progress=not SMALL)
    timings[name] = (time.perf_counter() - t0, results[name].from_cache, len(results[name].cells))
fig6, fig12, fig12_comm = results["fig6"], results["fig12"], results["fig12_comm"]
print(table([[k, f"{t:.1f}", c, n] for k, (t, c, n) in timings.items()], ["sweep", "seconds", "from cache", "cells"]))

# %% [markdown]
# ## Flip boundary vs the simulated flip band
#
# Band of a column (fixed shape, replication, skew): from the last B where METRO wins to the first larger B
# where token-LP or EPLB-even wins (0 / ∞ when the flip lies outside the grid). B* agrees when it lies in the
# band, ends included.

# %%
bounds = boundary_rows(fig6)


def _fmt_b(x):
    return "∞" if not np.isfinite(x) else f"{x:.0f}"


rows = [
    [b["preset"], b["replication"], b["skew"], b["winners"], f"[{_fmt_b(b['lo'])}, {_fmt_b(b['hi'])}]"]
    + [f"{b['b_avg']:.0f}", f"{b['b_hot']:.0f}", f"{b['b_star']:.0f}", b["mechanism"], "yes" if b["agree"] else "NO"]
    for b in bounds
]
print(table(rows, ["preset", "repl", "s", "winners by B", "flip band", "B*avg", "B*hot", "B*", "mech", "in band"]))
for preset in FIG6.presets:
    sel = [b["agree"] for b in bounds if b["preset"] == preset]
    print(f"{preset}: B* inside the flip band in {sum(sel)}/{len(sel)} (skew × replication) columns")

# %% [markdown]
# ## Fig. 6: phase diagrams


# %%
def draw_panel(ax, res, preset, ep, repl, bounds, norm):
    cfg = res.config
    bs, ss = np.asarray(cfg.tokens_per_gpu, float), np.asarray(cfg.skews, float)
    gain = 100 * res.grid(res.gain(), preset=preset, ep=ep, replication=repl)  # [skews, tokens_per_gpu]
    win = res.grid(res.winner(), preset=preset, ep=ep, replication=repl)
    # Cell edges: geometric midpoints in B, arithmetic midpoints in s.
    xe = np.concatenate([[bs[0] ** 1.5 / bs[1] ** 0.5], np.sqrt(bs[1:] * bs[:-1]), [bs[-1] ** 1.5 / bs[-2] ** 0.5]])
    ds = np.diff(ss).min() if ss.size > 1 else 1.0
    ye = np.concatenate([[ss[0] - ds / 2], (ss[1:] + ss[:-1]) / 2, [ss[-1] + ds / 2]])
    mesh = ax.pcolormesh(xe, ye, gain, cmap="RdBu", norm=norm, shading="flat")
    for i, s in enumerate(ss):
        for j, b in enumerate(bs):
            dark = abs(norm(gain[i, j]) - 0.5) > 0.35
            ax.text(b, s, f"{win[i, j]}\n{gain[i, j]:.1f}", ha="center", va="center", fontsize=7,
                    color="white" if dark else "black")  # fmt: skip
    col = [b for b in bounds if b["preset"] == preset and b["ep"] == ep and b["replication"] == repl]
    bstar = np.clip([b["b_star"] for b in col], xe[0], xe[-1])
    ax.plot(bstar, [b["skew"] for b in col], "k--", lw=1.6, marker="D", ms=4, label="analytic B*")
    ax.set_xscale("log", base=2)
    ax.set_xticks(bs, [str(int(b)) for b in bs])
    ax.set_yticks(ss, [f"{s:g}" for s in ss])
    ax.set_xlim(xe[0], xe[-1])
    ax.set_ylim(ye[0], ye[-1])
    ok = sum(b["agree"] for b in col)
    ax.set_title(f"{preset}, EP{ep}, {repl:g}× (B* in band {ok}/{len(col)})", fontsize=9)
    return mesh


gain_all = 100 * fig6.gain()
# Asymmetric scale: losses (≤ τ by construction) stay pale next to gains of several percent.
norm = TwoSlopeNorm(vmin=min(-2.0, gain_all.min()), vcenter=0.0, vmax=max(2.0, gain_all.max()))
nrow, ncol = len(FIG6.presets), len(FIG6.replications)
fig, axes = plt.subplots(nrow, ncol, figsize=(6.2 * ncol, 3.6 * nrow), squeeze=False, constrained_layout=True)
for r, preset in enumerate(FIG6.presets):
    for c, repl in enumerate(FIG6.replications):
        mesh = draw_panel(axes[r, c], fig6, preset, 8, repl, bounds, norm)
        axes[r, c].set_xlabel("tokens per GPU B")
        axes[r, c].set_ylabel("Zipf skew s")
axes[0, 0].legend(loc="upper right", fontsize=8)
fig.colorbar(mesh, ax=axes, shrink=0.6, label="TEMPO gain over best fixed policy (%)")
fig.suptitle("Fig. 6: winning fixed policy (M = METRO, L = token-LP, E = EPLB-even) and TEMPO gain, EP8")
fig.savefig(FIGURES / "fig6_phase_diagram.png", dpi=110)
plt.show()

# %%
print(table(phase_rows(fig6, bounds), ["quantity", "paper", "here"], "Fig. 6 / §3.2: paper vs here"))

# %% [markdown]
# ## Fig. 12: scale extrapolation, DSv3 shape, 1.25× replication

# %%
bounds12 = boundary_rows(fig12)
rows = [[b["ep"], b["skew"], b["winners"], f"[{_fmt_b(b['lo'])}, {_fmt_b(b['hi'])}]", f"{b['b_star']:.0f}", b["agree"]]
        for b in bounds12]  # fmt: skip
print(table(rows, ["EP", "s", "winners by B", "flip band", "B*", "in band"], "Fig. 12 columns: flip band vs B*"))
print(f"B* inside the flip band in {sum(b['agree'] for b in bounds12)}/{len(bounds12)} (EP × skew) columns")

show = [s for s in (0.0, 1.2) if s in FIG12.skews]
fig, axes = plt.subplots(1, len(show) + 1, figsize=(5.2 * (len(show) + 1), 4), sharey=True, squeeze=False)
axes = axes[0]
bs = np.asarray(FIG12.tokens_per_gpu)
for ax, skew in zip(axes, [*show, None], strict=True):
    for k, ep in enumerate(FIG12.eps):
        for res, style in ((fig12, "-"), (fig12_comm, ":")):
            g = res.gain()
            if skew is None:  # mean over every skew
                vals = np.mean([res.grid(g, preset="dsv3_fp8_offline", ep=ep, replication=1.25)], axis=(0, 1))
            else:
                vals = g[res.mask(ep=ep, skew=skew)]
            label = f"EP{ep}" if style == "-" else None
            ax.plot(bs, 100 * vals, style, marker="o" if style == "-" else None, color=f"C{k}", label=label)
        if skew is not None:  # analytic B* of this column
            b = next(b for b in bounds12 if b["ep"] == ep and b["skew"] == skew)
            ax.axvline(b["b_star"], color=f"C{k}", ls="--", lw=1, alpha=0.7)
    ax.axhline(0, color="0.5", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xticks(bs, [str(b) for b in bs])
    ax.set_xlim(bs[0] / 1.3, bs[-1] * 1.3)  # a B* below the ladder is off the plot (see the table above)
    ax.set_xlabel("tokens per GPU B")
    every = ", ".join(f"{s:g}" for s in FIG12.skews)
    ax.set_title(f"s = {skew:g}" if skew is not None else f"mean over s ∈ {{{every}}}")
    ax.grid(alpha=0.3)
axes[0].set_ylabel("TEMPO gain over best fixed (%)")
axes[0].plot([], [], "k:", label="comm-aware (γ = 0.0037)")
axes[0].plot([], [], "k--", lw=1, label="analytic B* (per EP)")
axes[0].legend(fontsize=8)
fig.suptitle("Fig. 12: mean TEMPO gain vs batch size, DSv3 shape, 1.25× replication")
fig.tight_layout()
fig.savefig(FIGURES / "fig12_scale.png", dpi=110)
plt.show()

# %%
st = scale_stats(fig12, "dsv3_fp8_offline", 1.25)
rows = [[s["ep"], s["skew"], f"{100 * s['mean_gain']:.2f}%", f"{100 * s['max_gain']:.2f}%", s["argmax_B"]] for s in st]
print(table(rows, ["EP", "s", "mean gain over B", "max gain", "at B"], "Fig. 12 per (EP, s)"))
print()
print(table(scale_rows(fig12, fig12_comm), ["quantity", "paper", "here"], "Fig. 12 / §3.3: paper vs here"))
print(f"\nnotebook time {time.perf_counter() - t_start:.1f} s (SMALL={SMALL})")
