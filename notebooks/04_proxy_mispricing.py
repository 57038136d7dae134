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
# See `tempo_jax.sim.tempo.replay` for the stream definitions.
#
# Second part (§5.4): TEMPO's gap to a per-cell oracle — the best fixed policy of each batch size, chosen after
# the fact — on recorded routing under the calibrated offline models. The numbers quoted below are recorded in
# `results/notebooks/04_proxy_mispricing.json`. `SMALL=1` keeps 2 windows per stream.

# %%
import dataclasses
import os
import time

import matplotlib.pyplot as plt
import numpy as np

from tempo_jax.repro import Recorder, figures_dir
from tempo_jax.sim import PolicyConfig, SyntheticStreams, run_policies
from tempo_jax.sim.tempo.replay_summary import PAPER, mispricing_table, oracle_gap_table
from tempo_jax.text import table

SMALL = os.environ.get("SMALL", "0") == "1"
FIGURES = figures_dir()
REC = Recorder("04_proxy_mispricing")
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
    rows.append(
        [
            t["B"],
            t["policy"],
            fmt(t["paper_median"], t["paper_p95"]),
            fmt(t["median"], t["p95"]),
            fmt(other["median"], other["p95"]),
        ]
    )
print(table(rows, ["B", "proxy / TEMPO", "paper", labels[0], labels[1]], "Table 1 (median/p95): paper vs here"))
for label, key in zip(labels, ("flame", "zipf"), strict=True):
    REC.table(f"table1_{key}", tables[label])
    for t in tables[label]:
        REC.update(
            **{f"t1_{key}_{t['B']}_{t['policy']}": t["median"], f"t1_{key}_{t['B']}_{t['policy']}_p95": t["p95"]}
        )
for B, row in PAPER["table1"].items():
    REC.update(**{f"paper_t1_{B}_{p}": v[0] for p, v in row.items()})

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
# ## §5.4: TEMPO against a per-cell oracle on recorded routing
#
# Recorded FLAME-MoE-290M (DSv2-Lite shape) and switch-base-128 (HarMoEny, top-1, E = 128) routing, EP8, fresh
# EPLB placement at 1.25× (R = 16 / 32 redundant slots), the calibrated offline model of the nearest shape and
# the DSv3 model; per batch size (tokens per step) the oracle is the fixed policy (EPLB-even, token-LP, METRO)
# with the lowest mean makespan over the windows, and the gap is `1 − mean(TEMPO)/mean(oracle)`.

# %%
ORACLE_B = (128, 512, 2048) if SMALL else (128, 256, 512, 1024, 2048)
ORACLE = {
    ("flame", "dsv2_lite_offline"): dict(source="flame_moe_290m", redundants=(16,)),
    ("flame", "dsv3_fp8_offline"): dict(source="flame_moe_290m", redundants=(16,)),
    ("switch", "qwen3_30b_offline"): dict(source="harmoeny_switch128", redundants=(32,)),
    ("switch", "dsv3_fp8_offline"): dict(source="harmoeny_switch128", redundants=(32,)),
}
gaps = []
for (src, preset), over in ORACLE.items():
    policies = ("uniform", "token_lp", "metro", "tempo")
    cfg = PolicyConfig(
        tokens_per_step=ORACLE_B, drifts=(0,), preset=preset, policies=policies, max_windows=2 if SMALL else 16, **over
    )
    for g in oracle_gap_table(run_policies(cfg, workers=WORKERS, progress=not SMALL)):
        gaps.append({"source": src, "preset": preset, **g})
REC.table("oracle_gap", gaps)
print(
    table(
        [[g["source"], g["preset"], g["B"], g["windows"], g["oracle"], f"{g['gap']:+.1%}"] for g in gaps],
        ["routing", "cost model", "B", "windows", "oracle", "TEMPO gain over the oracle"],
        "§5.4",
    )
)
for src in ("flame", "switch"):
    calibrated = [g["gap"] for g in gaps if g["source"] == src and g["preset"] != "dsv3_fp8_offline"]
    dsv3 = [g["gap"] for g in gaps if g["source"] == src and g["preset"] == "dsv3_fp8_offline"]
    REC.update(
        **{
            f"oracle_{src}_lo": min(calibrated),
            f"oracle_{src}_hi": max(calibrated),
            f"oracle_{src}_dsv3_lo": min(dsv3),
            f"oracle_{src}_dsv3_hi": max(dsv3),
        }
    )
REC.update(paper_oracle=PAPER["oracle_gap"][0], paper_oracle_dsv3=PAPER["oracle_gap"][1])
REC.claim("tempo_never_worse_than_oracle_beyond_tau", all(g["gap"] >= -0.0102 for g in gaps))

# %%
zipf_metro = [REC.values[f"t1_zipf_{B}_metro"] for B in (512, 1024)]
flame_static = [REC.values[f"t1_flame_{B}_static"] for B in (512, 1024)]
REC.update(
    zipf_metro_lo=min(zipf_metro),
    zipf_metro_hi=max(zipf_metro),
    flame_static_lo=min(flame_static),
    flame_static_hi=max(flame_static),
)
REC.claim(
    "static_as_costly_as_uniform_at_128",
    abs(REC.values["t1_flame_128_static"] - REC.values["t1_flame_128_uniform"]) < 0.05,
)
REC.claim(
    "token_lp_optimal_at_large_B",
    all(REC.values[f"t1_{k}_{B}_token_lp"] < 1.005 for k in ("flame", "zipf") for B in (512, 1024)),
)
REC.reading("""
**Reading.** The regime flip is what Table 1 is about: in the floor regime (B = 128, ≈ 96 pairs per GPU) the
policies that split experts pay activation floors while METRO keeps experts whole (FLAME
{t1_flame_128_metro:.2f}, Zipf {t1_zipf_128_metro:.2f} of TEMPO; paper {paper_t1_128_metro:.2f}); in the
traffic regime (B ≥ 512) token-LP is optimal (TEMPO's ensemble picks it: {t1_flame_512_token_lp:.2f} /
{t1_zipf_512_token_lp:.2f} at B = 512) and whole-expert policies pay. Where we differ:

- *static at B = 128* pays as much as uniform here ({t1_flame_128_static:.2f} vs {t1_flame_128_uniform:.2f} on
  FLAME; paper {paper_t1_128_static:.2f} vs {paper_t1_128_uniform:.2f}). Our static map sends each source's
  tokens of an expert to its own-GPU replica, else spreads sources over the replicas (`solvers.static_map`), and at
  ≈ 1.5 pairs per (source, expert) almost every replica is touched — static activates as many replicas as the
  uniform split. The paper's SGLang static map evidently touched fewer.
- *static at B ≥ 512* pays only {flame_static_lo:.2f}–{flame_static_hi:.2f}× on FLAME (paper
  {paper_t1_512_static:.2f}–{paper_t1_1024_static:.2f}). FLAME-MoE routing is far more balanced than the paper's
  proxy traces (a Zipf fit of its per-layer load gives s ≈ 0.2), so EPLB with R = 64 already balances tokens; on
  the synthetic streams the hot experts get many replicas, which static spreads over evenly.
- *METRO at B ≥ 512 on Zipf(1.2)* pays {zipf_metro_lo:.2f}–{zipf_metro_hi:.2f}× (paper
  {paper_t1_512_metro:.2f}–{paper_t1_1024_metro:.2f}): a hot expert kept whole on one replica is a pure traffic
  bottleneck at this skew, far beyond the paper's traces. The two routings bracket the paper's; neither is tuned
  to it.

*§5.4.* Against the per-cell oracle TEMPO gains {oracle_flame_lo:.1%} to {oracle_flame_hi:.1%} on FLAME under
the DSv2-Lite model and {oracle_switch_lo:.1%} to {oracle_switch_hi:.1%} on switch-base-128 under the Qwen3-30B
model, {oracle_flame_dsv3_lo:.1%} to {oracle_flame_dsv3_hi:.1%} / {oracle_switch_dsv3_lo:.1%} to
{oracle_switch_dsv3_hi:.1%} under the DSv3 model (paper: {paper_oracle}, with DSv3 costs {paper_oracle_dsv3},
on its Qwen3-30B and DSv2-Lite traces). The two models price alike (n* 156 vs 161 tokens; only b/β matters to
these ratios when a = c = 0). Our recorded routing is near-balanced (FLAME) or top-1 (switch), so where TEMPO's
gain lives differs from the paper's traces; the oracle also needs hindsight, which no deployment has.
""")

# %%
print(f"notebook time {time.perf_counter() - t_start:.1f} s (SMALL={SMALL})")
