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
# # Mixed regimes are the common case (TEMPO §2.4, Fig. 5)
#
# A batch is *mixed* when ≥ 20% of its activated experts are flat (fewer than n* tokens: weight streaming
# dominates) and ≥ 20% of its token–expert pairs sit in linear experts (n ≥ n*). We count mixed batches vs
# tokens per GPU B for (a) the recorded routing traces in `../shared/traces` (the bundled sample when they are
# absent) and (b) synthetic Zipf(s) routing with the DSv3 shape (E = 256, top-8, EP8, κ = 2000).
#
# The paper's real traces (Qwen3-30B, DSv2-Lite × wikitext/GSM8K) are not public; ours are FLAME-MoE-290M,
# Mixtral-8x7B, switch-base-128 and Qwen1.5-MoE recordings, classified with the n* of the nearest calibrated
# shape (`tempo_jax.sim.regimes.TRACE_PRESETS`). `SMALL=1` shrinks the ladders for CI.

# %%
import os
import time

import matplotlib.pyplot as plt
import numpy as np

from solvers import PRESETS
from tempo_jax.report import figures_dir, table
from tempo_jax.sim import MODEL_SHAPES, synthetic_regime_curve, trace_regime_curve
from tempo_jax.sim.summary import regime_rows
from tempo_jax.workloads import load_sample, load_trace

SMALL = os.environ.get("SMALL", "0") == "1"
FIGURES = figures_dir()
FIGURES.mkdir(parents=True, exist_ok=True)

LADDER = (16, 64, 256, 1024) if SMALL else (16, 32, 64, 128, 256, 512, 1024, 2048)
SKEWS = (0.0, 0.6, 1.2) if SMALL else (0.0, 0.3, 0.6, 0.9, 1.2, 1.5)
ZIPF_BATCHES = 4 if SMALL else 32
TRACE_BATCHES = 16 if SMALL else 256  # cap per B, spread over layers
TRACES = ("flame_moe_290m", "mixtral_8x7b", "harmoeny_switch128", "harmoeny_qwen")  # switch128_npy = a copy
t_start = time.perf_counter()

# %% [markdown]
# ## (a) Recorded traces

# %%
real = []
for name in TRACES:
    try:
        trace = load_trace(name)
    except FileNotFoundError:
        trace = load_sample(name)
    real.append(trace_regime_curve(trace, LADDER, max_batches=TRACE_BATCHES))
rows = [[c.label, c.num_ranks, f"{c.n_star:.0f}", *np.round(c.mixed, 2).tolist()] for c in real]  # — = no batch
print(table(rows, ["trace", "G", "n*", *[f"B={b}" for b in LADDER]], "fraction of mixed batches (recorded)"))

# %% [markdown]
# ## (b) Synthetic Zipf routing, DSv3 shape

# %%
E, K = MODEL_SHAPES["dsv3_fp8_offline"]
n_star = PRESETS["dsv3_fp8_offline"].inflection
zipf = [synthetic_regime_curve(E, K, s, LADDER, n_star, batches=ZIPF_BATCHES) for s in SKEWS]
rows = [[c.label, *np.round(c.mixed, 2).tolist()] for c in zipf]
print(table(rows, ["routing", *[f"B={b}" for b in LADDER]], f"fraction of mixed batches (Zipf, E={E}, K={K}, EP8)"))

# %%
fig, axes = plt.subplots(1, 2, figsize=(12, 5.0), sharey=True)
for ax, curves, title in ((axes[0], real, "(a) recorded traces"), (axes[1], zipf, "(b) synthetic Zipf, DSv3 shape")):
    for c in curves:
        ok = np.isfinite(c.mixed)
        ax.plot(c.tokens_per_gpu[ok], 100 * c.mixed[ok], "o-", label=f"{c.label} (D={c.num_ranks})")
    ax.set_xscale("log", base=2)
    ax.set_xticks(LADDER, [str(b) for b in LADDER])
    ax.axvspan(128, 512, color="0.9", zorder=0)
    ax.set_xlabel("tokens per GPU B")
    ax.set_title(title)
    ax.set_ylim(-3, 103)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, frameon=False)
axes[0].set_ylabel("mixed batches (%)")
axes[0].text(181, 2, "paper's decode band", fontsize=8, ha="center", color="0.4")
fig.suptitle("Fig. 5: batches with ≥ 20% flat experts and ≥ 20% of pairs in linear experts")
fig.tight_layout()
fig.savefig(FIGURES / "fig5_mixed_regimes.png", dpi=120)
plt.show()

# %%
print(table(regime_rows(real, zipf), ["quantity", "paper", "here"], "Fig. 5: paper vs here"))
print(f"\nnotebook time {time.perf_counter() - t_start:.1f} s (SMALL={SMALL})")
