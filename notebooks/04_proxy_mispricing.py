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
# # What proxy mispricing costs on real batches (TEMPO §2.3, Table 1)
#
# Same batch, same placement, only the split differs: each window is dispatched by the four proxy policies
# (static map, uniform/EPLB-even, token-LP, METRO) and by TEMPO, all scored under the proxy serving three-term
# model (Table 7: a = 16.4, b = 2.99, c = 15.6, β = 0.0179, c2 = 25, γ = 0.10), EP8, fresh EPLB placement with
# R = 64 redundant slots (128 physical slots for 64 experts). Reported: median/p95 over windows and layers of
# `proxy / TEMPO`, and the spread max/min over the four proxies of the same window.
#
# **Routing.** The paper's recorded proxy traces (DSv2-Lite on wikitext/GSM8K) are not public. We replay
# (a) FLAME-MoE-290M (the only public recording with the DSv2-Lite routing shape, E = 64, top-6; 2,048 tokens
# per layer, 8 layers, one stream per layer) and (b) synthetic Zipf(1.2) streams of the same shape with slowly
# drifting popularity. **B = tokens per step** across the EP group (serving concurrency, §5.13), so a GPU
# receives ≈ 0.75·B token–expert pairs; FLAME gives 16 / 4 / 2 windows per layer at B = 128 / 512 / 1024.
# See `tempo_jax.sim.replay` for the stream definitions. `SMALL=1` keeps 2 windows per stream.

# %%
import dataclasses
import os
import time

import matplotlib.pyplot as plt
import numpy as np

from tempo_jax.report import figures_dir, table
from tempo_jax.sim import PolicyConfig, SyntheticStreams, run_policies
from tempo_jax.sim.replay_summary import mispricing_table

SMALL = os.environ.get("SMALL", "0") == "1"
FIGURES = figures_dir()
t_start = time.perf_counter()

SYN = SyntheticStreams(streams=1, windows=2) if SMALL else SyntheticStreams(streams=4, windows=32)
BASE = PolicyConfig(
    tokens_per_step=(128, 512, 1024),
    drifts=(0,),  # fresh placement
    policies=("static", "uniform", "token_lp", "metro", "tempo"),
    max_windows=2 if SMALL else None,
)
WORKERS = 1 if SMALL else 2
SOURCES = {
    "FLAME-MoE (recorded)": BASE,
    "Zipf 1.2 (synthetic)": dataclasses.replace(BASE, source="synthetic", synthetic=SYN),
}

# %%
tables = {}
for label, cfg in SOURCES.items():
    t0 = time.perf_counter()
    rows = run_policies(cfg, workers=WORKERS, progress=not SMALL)
    tables[label] = mispricing_table(rows)
    print(f"{label}: {len(rows)} windows in {time.perf_counter() - t0:.1f} s")


# %%
def fmt(m, p):
    return "—" if not np.isfinite(m) else f"{m:.2f}/{p:.2f}"


labels = list(SOURCES)
rows = []
for i, t in enumerate(tables[labels[0]]):
    other = tables[labels[1]][i]
    rows.append([t["B"], t["policy"], fmt(t["paper_median"], t["paper_p95"]), fmt(t["median"], t["p95"]),
                 fmt(other["median"], other["p95"])])  # fmt: skip
print(table(rows, ["B", "proxy / TEMPO", "paper", labels[0], labels[1]], "Table 1 (median/p95): paper vs here"))

# %%
proxies = ("static", "uniform", "token_lp", "metro", "spread")
fig, axes = plt.subplots(1, 3, figsize=(14, 4.2), sharey=True)
for ax, B in zip(axes, BASE.tokens_per_step, strict=True):
    x = np.arange(len(proxies))
    for k, label in enumerate(labels):
        vals = [next(t for t in tables[label] if t["B"] == B and t["policy"] == p) for p in proxies]
        med = np.array([v["median"] for v in vals])
        p95 = np.array([v["p95"] for v in vals])
        ax.bar(x + (k - 0.5) * 0.38, med, 0.36, color=f"C{k}", label=label)
        ax.errorbar(x + (k - 0.5) * 0.38, med, yerr=[np.zeros_like(med), p95 - med], fmt="none", ecolor="k", lw=0.8)
    paper = [next(t for t in tables[labels[0]] if t["B"] == B and t["policy"] == p)["paper_median"] for p in proxies]
    ax.plot(x, paper, "D", color="k", ms=6, label="paper (median)")
    ax.axhline(1.0, color="0.4", lw=0.8)
    ax.set_xticks(x, ["static", "uniform", "token-LP", "METRO", "spread"])
    ax.set_title(f"B = {B} tokens per step")
    ax.grid(axis="y", alpha=0.3)
    ax.set_ylim(0.9, None)
axes[0].set_ylabel("block time / TEMPO (median; whisker p95)")
fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=3, fontsize=9, frameon=False)
fig.suptitle("Table 1: proxy dispatches vs TEMPO on the same batches (EP8, R = 64, three-term model)")
fig.tight_layout(rect=(0, 0.07, 1, 1))
fig.savefig(FIGURES / "table1_proxy_mispricing.png", dpi=120)
plt.show()

# %% [markdown]
# **Reading.** The regime flip is what the table is about: in the floor regime (B = 128, ≈ 96 pairs per GPU)
# the policies that split experts pay activation floors while METRO keeps experts whole; in the traffic regime
# (B ≥ 512) token-LP is optimal (TEMPO's ensemble picks it) and whole-expert policies pay. Where we differ:
#
# - *static at B = 128* pays as much as uniform here (paper: 1.17 vs 1.51). Our static map sends each source's
#   tokens of an expert to its own-GPU replica, else spreads sources over the replicas (`solvers.static_map`),
#   and at ≈ 1.5 pairs per (source, expert) almost every replica is touched — static activates as many
#   replicas as the uniform split. The paper's SGLang static map evidently touched fewer.
# - *static at B ≥ 512* pays only 8–11% (paper: 47–56%). FLAME-MoE routing is far more balanced than the
#   paper's proxy traces (a Zipf fit of its per-layer load gives s ≈ 0.2), so EPLB with R = 64 already balances
#   tokens; on the synthetic streams the hot experts get many replicas, which static spreads over evenly.
# - *METRO at B ≥ 512 on Zipf(1.2)* pays 1.5–1.7×: a hot expert kept whole on one replica is a pure traffic
#   bottleneck at this skew, far beyond the paper's traces. The two routings bracket the paper's; neither is
#   tuned to it.

# %%
print(f"notebook time {time.perf_counter() - t_start:.1f} s (SMALL={SMALL})")
