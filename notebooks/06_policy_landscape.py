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
# # Policy landscape: dispatch kernels under one cost model (TEMPO §5.14, Table 4)
#
# Each scheme's dispatch-policy kernel under the identical replica constraint (move tokens, never weights):
# uniform (EPLB-even), token-LP (LPLB / UltraEP quota), METRO (activation balancing), LLEP-R (least-loaded
# spill restricted to replicas) and TEMPO, relative to the static map, on the drift-16 scenario (EP8, R = 64,
# proxy three-term model). Columns are token scales of the same windows — every count multiplied by 0.25, 1
# or 4 (`tempo_jax.sim.replay.scale_counts`: binomial thinning below 1) — spanning the floor-bound, mixed and
# token-bound phases. Base windows: B = 256 tokens per step (≈ 192 pairs per GPU, below B*_a2a ≈ 300).
# Routing: FLAME-MoE-290M layers (recorded) and synthetic Zipf(1.2) streams (see notebook 04).
#
# Second part: the redundancy R × drift K grid of §5.12/§5.14 at scale 1 (the paper: at R = 16, K ≥ 16 every
# kernel collapses to 1.000 — the drifted hot set has no replicas and only placement can help).
# `SMALL=1` keeps one window per stream and a 2 × 2 grid.

# %%
import dataclasses
import os
import time

import matplotlib.pyplot as plt
import numpy as np

from tempo_jax.report import figures_dir, table
from tempo_jax.sim import PolicyConfig, SyntheticStreams, run_policies
from tempo_jax.sim.replay_summary import LABELS, PAPER, drift_table, landscape_table

SMALL = os.environ.get("SMALL", "0") == "1"
FIGURES = figures_dir()
t_start = time.perf_counter()

POLICIES = ("static", "uniform", "token_lp", "metro", "llep", "tempo")
SYN = SyntheticStreams(streams=1, windows=1) if SMALL else SyntheticStreams(streams=4, windows=32)
LANDSCAPE = PolicyConfig(
    tokens_per_step=(256,),
    scales=(0.25, 1.0, 4.0),
    drifts=(16,),
    policies=POLICIES,
    max_windows=1 if SMALL else None,
)
WORKERS = 1 if SMALL else 2
GRID = dataclasses.replace(LANDSCAPE, scales=(1.0,), redundants=(16, 64), drifts=(0, 16) if SMALL else (0, 8, 16, 32))
SOURCES = {"FLAME": {}, "Zipf1.2": {"source": "synthetic", "synthetic": SYN}}

# %% [markdown]
# ## Table 4

# %%
land, timings = {}, {}
for label, over in SOURCES.items():
    t0 = time.perf_counter()
    land[label] = landscape_table(
        run_policies(dataclasses.replace(LANDSCAPE, **over), workers=WORKERS, progress=not SMALL), POLICIES
    )
    timings[label] = time.perf_counter() - t0
print({k: f"{v:.1f} s" for k, v in timings.items()})

rows = []
for p in POLICIES:
    row = [LABELS[p]]
    for scale in LANDSCAPE.scales:
        cells = [next(t for t in land[lab] if t["policy"] == p and t["scale"] == scale) for lab in SOURCES]
        row.append(f"{cells[0]['paper']:.3f} | " + " | ".join(f"{c['median']:.3f}" for c in cells))
    rows.append(row)
heads = [f"{s:g}× paper | {' | '.join(SOURCES)}" for s in LANDSCAPE.scales]
print(table(rows, ["policy / static (median)", *heads], "Table 4: paper vs here (drift-16, R = 64, B = 256 × scale)"))
for lab in SOURCES:
    best = {}
    for s in LANDSCAPE.scales:
        best[s] = min((t for t in land[lab] if t["scale"] == s), key=lambda t: t["median"])["policy"]
    print(f"best per column, {lab}: {best}  (paper: TEMPO in every column, tied with token-LP at 4×)")

# %%
fig, axes = plt.subplots(1, len(SOURCES) + 1, figsize=(15, 4.2), sharey=True)
x = np.arange(len(LANDSCAPE.scales))
w = 0.8 / len(POLICIES)
for ax, lab in zip(axes, ["paper", *SOURCES], strict=True):
    for k, p in enumerate(POLICIES):
        if lab == "paper":
            vals = PAPER["table4"][p]
        else:
            mine = {t["scale"]: t["median"] for t in land[lab] if t["policy"] == p}
            vals = [mine[s] for s in LANDSCAPE.scales]
        ax.bar(x + (k - (len(POLICIES) - 1) / 2) * w, vals, w * 0.95, color=f"C{k}", label=LABELS[p])
    ax.axhline(1.0, color="0.3", lw=0.8)
    ax.set_xticks(x, [f"{s:g}×" for s in LANDSCAPE.scales])
    ax.set_title("paper (recorded proxy routing)" if lab == "paper" else f"here: {lab}")
    ax.grid(axis="y", alpha=0.3)
axes[0].set_ylabel("block makespan / static (median)")
axes[0].legend(fontsize=8)
fig.suptitle("Table 4: policy kernels under the three-term model, by token scale (floor-bound → token-bound)")
fig.tight_layout()
fig.savefig(FIGURES / "table4_policy_landscape.png", dpi=120)
plt.show()

# %% [markdown]
# ## Redundancy R × drift K grid (scale 1)

# %%
grid = {}
for label, over in SOURCES.items():
    grid[label] = drift_table(
        run_policies(dataclasses.replace(GRID, **over), workers=WORKERS, progress=not SMALL), POLICIES
    )
rows = []
for lab in SOURCES:
    for R in GRID.redundants:
        for K in GRID.drifts:
            sel = {t["policy"]: t for t in grid[lab] if t["redundant"] == R and t["drift"] == K}
            rows.append([lab, R, K, *[f"{sel[p]['vs_static']:.3f}" for p in POLICIES[1:]],
                         f"{sel['static']['vs_fresh_static']:.3f}"])  # fmt: skip
print(table(rows, ["routing", "R", "K", *[LABELS[p] for p in POLICIES[1:]], "static / fresh static"],
            "median makespan / static (same placement); last column: what the drift costs static"))  # fmt: skip

# %% [markdown]
# **Reading.** The paper's Table 4 is the phase diagram with named competitors, and the Zipf(1.2) column
# reproduces its shape: in the floor-bound column (0.25×) uniform is worst (1.18; paper 1.30), token-LP loses to
# static (1.06; paper 1.006), METRO is the best proxy (0.83; paper 0.95) and TEMPO is best (0.77; paper 0.856);
# in the mixed column TEMPO leads (0.92; paper 0.764); in the token-bound column (4×) TEMPO ties token-LP (its
# ensemble selects it; paper 0.630 both). Magnitudes differ because the routing differs: FLAME-MoE's layers are
# nearly balanced (the drift-16 swap barely moves EPLB's replica counts, static is already good, and uniform
# equals static because both touch every replica), and our Zipf(1.2) is more skewed than the paper's proxy
# traces. The R × K grid shows the paper's collapse at R = 16, K ≥ 8 on skewed routing (every kernel within
# 1–2% of static: the drifted hot set has no spare replicas, only placement can help).

# %%
print(f"notebook time {time.perf_counter() - t_start:.1f} s (SMALL={SMALL})")
