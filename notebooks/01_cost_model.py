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
# # The cost model (TEMPO §1, §2.2, §4.1; Figs. 1–2, Table 6)
#
# Expert time is max-affine: `t_g = max(a + b·G_g, c + β·N_g)` — flat in tokens below the inflection
# n* = b/β (weight streaming from HBM dominates, cost attaches to activated replicas), linear above it.
#
# 1. **Fig. 1b toy**: one hot expert (600 tokens), six cold ones (30 each), two fully replicated GPUs,
#    `t_g = max(15·G_g, 0.1·N_g)`, dispatched three ways (`tempo_jax.sim.cost_demo.worked_example`).
# 2. **Fig. 2 profile**: one expert's time vs its tokens for the calibrated presets, n* marked.
# 3. **Table 6**: n* per preset.
# 4. **Calibration**: noisy samples of a preset on the paper's grid (G ∈ 1..40 × tokens per expert on a log
#    ladder 1..4096) refitted by alternating assignment (`solvers.fit_max_affine`).
#
# Nothing here is heavy; `SMALL=1` only shortens the calibration's noise sweep.

# %%
import os
import time

import matplotlib.pyplot as plt
import numpy as np

from solvers import PRESETS
from tempo_jax.report import figures_dir, table
from tempo_jax.sim.cost_demo import calibration_demo, expert_profile, inflection_rows, worked_example

SMALL = os.environ.get("SMALL", "0") == "1"
FIGURES = figures_dir()
NOISES = (0.05,) if SMALL else (0.0, 0.02, 0.05, 0.10)
t_start = time.perf_counter()

# %% [markdown]
# ## Fig. 1b: the worked example

# %%
toy = worked_example()
rows = [[r["label"], r["G"].tolist(), r["N"].round(0).tolist(), r["t"].round(1).tolist(), r["makespan"], r["paper"]]
        for r in toy]  # fmt: skip
print(table(rows, ["dispatch", "G per GPU", "N per GPU", "t per GPU (µs)", "makespan (µs)", "paper (µs)"], "Fig. 1b"))
ratio = toy[0]["makespan"] / toy[2]["makespan"]
print(f"lower bound {toy[0]['lower_bound']:.0f} µs; token balancing / optimal = {ratio:.2f}× (paper: 1.75×)")

# %%
fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), gridspec_kw={"width_ratios": [1.3, 1]})
ax = axes[0]
width = 0.35
for k, r in enumerate(toy):
    for g in range(2):
        floor, tokens = 15.0 * r["G"][g], 0.1 * r["N"][g]
        x = k + (g - 0.5) * width
        ax.bar(x, floor, width * 0.95, color="C0", alpha=0.85, label="floor 15·G" if k == g == 0 else None)
        ax.bar(x, tokens, width * 0.45, color="C3", alpha=0.9, label="tokens 0.1·N" if k == g == 0 else None)
        ax.text(x, 2, f"GPU{g}\nG={r['G'][g]}\nN={r['N'][g]:.0f}", ha="center", va="bottom", fontsize=7, color="w")
    ax.axhline(r["makespan"], xmin=(k + 0.05) / 3, xmax=(k + 0.95) / 3, color="k", lw=1.5)
    ax.text(k, r["makespan"] + 3, f"{r['makespan']:.0f} µs", ha="center", fontweight="bold")
ax.set_xticks(range(3), [r["label"].replace(" (", "\n(") for r in toy], fontsize=8)
ax.set_ylabel("per-GPU time (µs)")
ax.set_ylim(0, 125)
ax.set_title("(b) one batch, three dispatches: t_g = max(15·G_g, 0.1·N_g)")
ax.legend(loc="upper right", fontsize=8)
# Expert placement of each dispatch: token shares per GPU, hot expert first.
ax = axes[1]
for k, r in enumerate(toy):
    left = np.zeros(2)
    for e in range(r["x"].shape[0]):
        ax.barh([k - 0.18, k + 0.18], r["x"][e], 0.34, left=left, color="C1" if e == 0 else "C2",
                edgecolor="white", lw=0.6)  # fmt: skip
        left += r["x"][e]
ax.set_yticks([k + d for k in range(3) for d in (-0.18, 0.18)], [f"{r['policy']} GPU{g}" for r in toy for g in (0, 1)])
ax.invert_yaxis()
ax.set_xlabel("tokens (orange: hot expert, green: cold experts)")
ax.set_title("token shares per GPU")
fig.suptitle("Fig. 1b: split only the hot expert — 60 µs, 1.75× better than token balancing")
fig.tight_layout()
fig.savefig(FIGURES / "fig1_worked_example.png", dpi=120)
plt.show()

# %% [markdown]
# ## Fig. 2: per-expert profile and Table 6 n*

# %%
n = np.unique(np.round(np.logspace(0, np.log10(4096), 400)))
fig, ax = plt.subplots(figsize=(7.5, 4.6))
for k, preset in enumerate(("dsv3_bf16_offline", "dsv3_fp8_offline", "dsv2_lite_offline", "qwen3_30b_offline")):
    cost = PRESETS[preset]
    ax.plot(n, expert_profile(cost, n), color=f"C{k}", label=f"{preset} (b={cost.b:g}, β={cost.beta:g})")
    ax.axvline(cost.inflection, color=f"C{k}", ls=":", lw=1)
    ax.plot([cost.inflection], [cost.b], "o", color=f"C{k}")
    ax.annotate(f"n*≈{cost.inflection:.0f}", (cost.inflection, cost.b), textcoords="offset points", xytext=(4, -12),
                fontsize=8, color=f"C{k}")  # fmt: skip
ax.set_xscale("log", base=2)
ax.set_yscale("log")
ax.set_xlabel("tokens per expert n")
ax.set_ylabel("expert time (µs) = max(b, β·n)")
ax.set_title("Fig. 2: flat (weight streaming) below n*, linear above")
ax.grid(alpha=0.3, which="both")
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(FIGURES / "fig2_expert_profile.png", dpi=120)
plt.show()

# %%
rows = [[r["preset"], r["b"], r["beta"], f"{r['n_star']:.1f}", f"≈{r['paper']:.0f}"] for r in inflection_rows()]
print(table(rows, ["preset", "b (µs/expert)", "β (µs/token)", "n* = b/β here", "paper n*"], "Table 6: paper vs here"))

# %% [markdown]
# ## Calibration demo
#
# Samples of the Testbed A EP8 GEMM refit (`dsv3_a_gemm_refit`: a = 116, b = 12.99, c = 176, β = 0.0851) on
# the paper's grid, with multiplicative Gaussian noise, refitted black-box.

# %%
cals = {noise: calibration_demo("dsv3_a_gemm_refit", noise=noise, seed=0) for noise in NOISES}
rows = [[f"{noise:.0%}", r["param"], r["true"], r["fitted"], f"{100 * r['rel_error']:.2f}%"]
        for noise, c in cals.items() for r in c.rows()]  # fmt: skip
print(table(rows, ["noise", "param", "true", "fitted", "rel. error"], "fit_max_affine recovers the preset"))
for noise, c in cals.items():
    print(f"noise {noise:.0%}: mean relative fit error {c.report.mean_rel_error:.2%} (paper's real fits: 4–8%)")

# %%
c = cals[0.05]
tpe = c.N / c.G
fig, ax = plt.subplots(figsize=(7.5, 4.6))
for k, g in enumerate((1, 8, 20, 40)):
    sel = c.G == g
    ax.plot(tpe[sel], c.t[sel], "o", ms=3.5, color=f"C{k}", label=f"G = {g} samples")
    ax.plot(tpe[sel], c.fitted.gpu_times(c.G[sel], c.N[sel]), "-", color=f"C{k}", lw=1)
ax.set_xscale("log", base=2)
ax.set_yscale("log")
ax.set_xlabel("tokens per expert (N/G)")
ax.set_ylabel("per-GPU time (µs)")
ax.set_title(f"calibration: 5% noise, fitted n* = {c.fitted.inflection:.0f} (true {c.true.inflection:.0f})")
ax.grid(alpha=0.3, which="both")
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(FIGURES / "calibration_demo.png", dpi=120)
plt.show()

# %%
print(f"notebook time {time.perf_counter() - t_start:.1f} s (SMALL={SMALL})")
