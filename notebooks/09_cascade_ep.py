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
# # CascadeEP: asynchronous expert execution for MoE prefill under attention imbalance
#
# DeepSeek-V4-Flash prefill with DP8 attention + EP8 experts (one replica and one EP rank per GPU), serving the
# Mooncake conversation trace (real arrivals, input lengths and 512-token prefix blocks; the paper's
# Tool&Agent / AgentX traces are not public). Requests are placed on replicas (round-robin, least-loaded,
# power-of-two, prefix-only) with per-replica prefix caches and chunked prefill (`tempo_jax.sim.serve`); every
# forward step is timed layer by layer (`tempo_jax.sim.cascade`) under four modes:
#
# - **Sync**: every rank starts its expert FFN once all replicas have dispatched;
# - **Async**: a rank launches one FFN kernel per source replica as its tokens arrive;
# - **Async+SF**: streamFFN — ready tokens accumulate to the launch threshold θ (90% of peak FFN throughput);
# - **CascadeEP**: Async+SF + opportunistic expert-weight fetching (OEWF) from the second MoE layer on.
#
# Costs come from FLOPs and bytes of the model's shapes on B200 at stated efficiencies, with one calibration:
# the FFN curve reaches 90% of peak at θ = 28,672 tokens per rank (the paper's Fig. 4). Absolute ktok/s are
# ours; compare ratios. Planners see what the paper's do: attention predictions 90.3% accurate and token counts
# from the previous layer. `SMALL=1` serves a few dozen requests from the bundled trace sample.

# %%
import dataclasses
import os
import time

import matplotlib.pyplot as plt
import numpy as np

from tempo_jax.report import figures_dir, table
from tempo_jax.sim import PLACEMENT_POLICIES, CascadeConfig, prefill_costs, run_cascade
from tempo_jax.sim.cascade_summary import LABELS, ablation_rows, capacity_rps, layer_example, oewf_rows

SMALL = os.environ.get("SMALL", "0") == "1"
FIGURES = figures_dir()
WORKERS = 1 if SMALL else 2
t_start = time.perf_counter()

BASE = CascadeConfig(trace="mooncake_sample", max_requests=40) if SMALL else CascadeConfig(max_requests=1000)
SWEEP_REQUESTS = 24 if SMALL else 400
LOADS = (0.5, 0.9) if SMALL else (0.3, 0.6, 0.9)
MODES = ("sync", "async", "async_sf", "cascade")
run = dict(workers=WORKERS, progress=not SMALL)

# %% [markdown]
# ## The deployment's costs (derived, see `tempo_jax.sim.prefill`)

# %%
costs = prefill_costs(BASE.model)
m = costs.model
rows = [
    ["routed experts × top-k, H, F, L", f"{m.experts} × {m.top_k}, {m.hidden}, {m.expert_dim}, {m.layers}"],
    ["FFN per rank F(N) = t_fix + N/P", f"t_fix = {costs.fixed_us:.0f} µs, P = {costs.peak_tokens_per_us:.1f} tok/µs"],
    ["streamFFN θ (ρ = 0.9)", f"{costs.threshold} tokens per rank (paper Fig. 4: 28,672)"],
    ["F(98,304): a full step's tokens per rank", f"{float(costs.ffn_us(98_304)):.0f} µs"],
    ["attention α0, α1 (µs/token), α2 (µs/pair)",
     f"{costs.attention.alpha0:.0f}, {costs.attention.alpha1:.4f}, {costs.attention.alpha2:.2e}"],
    ["one expert's weights (OEWF fetch), helper buffer", f"{costs.expert_bytes / 1e6:.1f} MB, "
     f"{costs.hardware.helper_budget_experts} experts"],
]  # fmt: skip
print(table(rows, ["quantity", "value"], f"{m.name} on {costs.hardware.name}, D = {costs.num_ranks}"))

# %% [markdown]
# ## Fig. 8: incremental ablation (round-robin placement)
#
# Throughput is measured with every request arriving at once (each mode runs at its own capacity); TTFT at
# 90% of Sync's capacity ("near saturation", as the paper's 5 req/s).

# %%
t0 = time.perf_counter()
cap_tps, cap_rps = capacity_rps(BASE, **run)
overloaded = run_cascade(dataclasses.replace(BASE, rate_rps=1e4), MODES, **run)
loaded = run_cascade(dataclasses.replace(BASE, rate_rps=0.9 * cap_rps), MODES, **run)
abl = ablation_rows(overloaded, loaded)
print(f"Sync capacity {cap_tps / 1e3:.0f} ktok/s = {cap_rps:.1f} req/s ({time.perf_counter() - t0:.0f} s)")
print(table([[LABELS[r["mode"]], f"{r['throughput_ktok_s']:.0f}", f"{r['throughput_ratio']:.3f}",
              f"{r['paper_ratio']:.3f}", f"{r['ttft_mean_s']:.2f}", f"{r['ttft_p95_s']:.2f}",
              f"{100 * r['ttft_mean_reduction']:.1f}%", f"{100 * r['ttft_p95_reduction']:.1f}%"] for r in abl],
            ["mode", "ktok/s", "vs Sync", "paper vs Sync", "TTFT avg s", "p95 s", "avg −", "p95 −"]))  # fmt: skip
sf, ce = loaded["async_sf"].serve, loaded["cascade"].serve
oewf_only = (1 - ce.ttft_mean_s / sf.ttft_mean_s, 1 - ce.ttft_p95_s / sf.ttft_p95_s)
full = next(r for r in abl if r["mode"] == "cascade")
print("\npaper vs here")
print(table([
    ["throughput Async / Async+SF / CascadeEP vs Sync", "1.034 / 1.113 / 1.166",
     " / ".join(f"{r['throughput_ratio']:.3f}" for r in abl[1:])],
    ["CascadeEP TTFT avg / p95 reduction vs Sync", "23.1% / 26.0%",
     f"{100 * full['ttft_mean_reduction']:.1f}% / {100 * full['ttft_p95_reduction']:.1f}%"],
    ["OEWF alone (CascadeEP vs Async+SF) avg / p95", "7.8% / 6.2%",
     f"{100 * oewf_only[0]:.1f}% / {100 * oewf_only[1]:.1f}%"],
], ["quantity", "paper", "here"]))  # fmt: skip

# %% [markdown]
# ## Fig. 9: per-layer latency reduction from OEWF (CascadeEP vs the same layers under Async+SF)

# %%
o = oewf_rows(loaded["cascade"])
print(table([["layer forwards cut ≥ 1%", "77.4%", f"{100 * o['ge_1pct']:.1f}%"],
             ["layer forwards cut ≥ 5%", "23.1%", f"{100 * o['ge_5pct']:.1f}%"],
             ["largest cut", "10.87%", f"{100 * o['max']:.2f}%"],
             ["mean cut", "—", f"{100 * o['mean']:.2f}%"],
             ["layer forwards with OEWF", "—", o["layers"]]], ["Fig. 9", "paper", "here"]))  # fmt: skip
red = np.sort(100 * loaded["cascade"].oewf_reduction)
fig, ax = plt.subplots(figsize=(6, 3.6))
ax.plot(red, 100 * np.arange(1, red.size + 1) / red.size, color="C3", label="here")
ax.plot([1, 5, 10.87], [100 - 77.4, 100 - 23.1, 100], "ks", label="paper (1%, 5%, max)")
ax.set_xlabel("layer latency reduction from OEWF (%)")
ax.set_ylabel("cumulative fraction of layers (%)")
ax.grid(alpha=0.3)
ax.legend()
fig.tight_layout()
fig.savefig(FIGURES / "cascade_fig9_oewf_cdf.png", dpi=120)
plt.show()

# %% [markdown]
# ## Fig. 1: one layer of the most imbalanced step, under every mode

# %%
example = layer_example(loaded["sync"], layer=1)
fig, axes = plt.subplots(len(MODES), 1, figsize=(11, 2.2 * len(MODES)), sharex=True)
for ax, mode in zip(axes, MODES, strict=True):
    res = example[mode]
    for d in range(len(res.ready_us)):
        ax.barh(d, res.ready_us[d], color="0.8", height=0.6)  # attention + dispatch
        for k in res.kernels[d]:
            ax.barh(d, k.end_us - k.start_us, left=k.start_us, color="C0", height=0.6, edgecolor="w")
        ax.barh(d, res.rank_end_us[d] - max([k.end_us for k in res.kernels[d]] + [res.ready_us[d]]),
                left=max([k.end_us for k in res.kernels[d]] + [res.ready_us[d]]), color="C2", height=0.6)  # fmt: skip
    for s in res.side:
        ax.barh(s.rank + 0.32, s.end_us - s.start_us, left=s.start_us, color="C3", height=0.25)
    ax.axvline(res.end_us, color="k", lw=1)
    ax.set_title(f"{LABELS[mode]}: layer ends at {res.end_us:.0f} µs", fontsize=9, loc="left")
    ax.set_ylabel("rank")
axes[-1].set_xlabel("µs from layer start (grey: attention + dispatch, blue: FFN kernels, green: combine tail, "
                    "red: OEWF reassigned kernel)")  # fmt: skip
fig.tight_layout()
fig.savefig(FIGURES / "cascade_fig1_timeline.png", dpi=120)
plt.show()

# %% [markdown]
# ## Fig. 6 shape: p95 TTFT speedup of CascadeEP over Sync vs load, per placement policy

# %%
t0 = time.perf_counter()
sweep = {}
for policy in PLACEMENT_POLICIES:
    for load in LOADS:
        cfg = dataclasses.replace(BASE, placement=policy, max_requests=SWEEP_REQUESTS, rate_rps=load * cap_rps)
        sweep[policy, load] = run_cascade(cfg, ("sync", "cascade"), **run)
print(f"sweep {time.perf_counter() - t0:.0f} s")
rows = []
for policy in PLACEMENT_POLICIES:
    sp = [sweep[policy, L]["sync"].serve.ttft_p95_s / sweep[policy, L]["cascade"].serve.ttft_p95_s for L in LOADS]
    s0 = sweep[policy, LOADS[-1]]["sync"].serve
    rows.append([policy, *(f"{v:.2f}×" for v in sp), f"{100 * s0.cache_hit_rate:.0f}%", f"{s0.alb_mean:.2f}"])
print(table(rows, ["placement", *(f"load {L}" for L in LOADS), "cache hit", "ALB"],
            "p95 TTFT speedup (Sync / CascadeEP); load = rate / Sync capacity (round-robin)"))  # fmt: skip
fig, axes = plt.subplots(1, 2, figsize=(12, 4))
for k, policy in enumerate(PLACEMENT_POLICIES):
    sp = [sweep[policy, L]["sync"].serve.ttft_p95_s / sweep[policy, L]["cascade"].serve.ttft_p95_s for L in LOADS]
    axes[0].plot([L * cap_rps for L in LOADS], sp, "o-", color=f"C{k}", label=policy)
    s0 = sweep[policy, LOADS[-1]]["sync"].serve
    axes[1].plot(100 * s0.cache_hit_rate, 100 * s0.alb_mean, "o", color=f"C{k}", ms=9, label=policy)
axes[0].set_xlabel("request rate (req/s)")
axes[0].set_ylabel("p95 TTFT speedup (Sync / CascadeEP)")
axes[0].axhline(1, color="k", lw=0.8)
axes[1].set_xlabel("cache-hit rate (%)")
axes[1].set_ylabel("attention load balance ALB (%)")
axes[1].set_title("Fig. 2 shape: cache reuse vs attention balance (Sync)", fontsize=9)
for ax in axes:
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(FIGURES / "cascade_fig6_fig2.png", dpi=120)
plt.show()

# %% [markdown]
# ## Imbalance, estimators and kernel efficiency

# %%
sync, sfr, cas = loaded["sync"], loaded["async_sf"], loaded["cascade"]
print(table([
    ["long-tail ratio R_tail (Sync)", "28.0% / 28.86%", f"{100 * sync.tail_ratio:.1f}%"],
    ["attention estimator accuracy", "90.3%", f"{100 * cas.attention_accuracy:.1f}% (noise set to the paper's)"],
    ["token-count estimator accuracy (previous layer)", "85.9%", f"{100 * cas.token_accuracy:.1f}%"],
    ["streamFFN matched-work FFN efficiency", "97.3%", f"{100 * sfr.ffn_efficiency:.1f}%"],
    ["ALB (mean over layers, Sync)", "Fig. 2: 20–70%", f"{100 * sync.serve.alb_mean:.0f}%"],
], ["quantity", "paper", "here"]))  # fmt: skip

# %% [markdown]
# ## Sensitivity and beyond the paper
#
# - **sparse attention**: every layer's queries see at most 2,048 keys, so attention time follows new tokens;
# - **a launch guard** (`guard=True`, beyond the paper): each rank launches with the best of its mode's rule and
#   the earlier modes' by its predicted completion (the default is the paper's rules: per source, by θ);
# - **OEWF priced with TEMPO's max-affine model** (a fetched expert costs the helper an activation);
# - **TEMPO inside each rank's expert time**: 1.25× EPLB replicas, tokens split EPLB-even vs by TEMPO.

# %%
t0 = time.perf_counter()
variants = {
    "dense attention (default)": (BASE, {}),
    "sparse attention": (dataclasses.replace(BASE, attention="sparse"), {}),
    "launch guard on": (dataclasses.replace(BASE, guard=True), {}),
    "OEWF priced by TEMPO": (dataclasses.replace(BASE, pricing="tempo"), {"modes": ("sync", "cascade")}),
    "1.25× replicas, EPLB-even": (dataclasses.replace(BASE, replication=1.25), {"modes": ("sync", "cascade")}),
    "1.25× replicas, TEMPO split": (dataclasses.replace(BASE, replication=1.25, dispatch="tempo"),
                                    {"modes": ("sync", "cascade")}),
}  # fmt: skip
rows = []
for name, (cfg, kw) in variants.items():
    modes = kw.get("modes", MODES)
    res = run_cascade(dataclasses.replace(cfg, rate_rps=0.9 * cap_rps), modes, **run)
    base = res["sync"].serve
    cells = []
    for mode in MODES:
        if mode in res:
            s = res[mode].serve
            cells.append(f"{s.ttft_mean_s:.2f} ({100 * (1 - s.ttft_mean_s / base.ttft_mean_s):+.0f}%)")
        else:
            cells.append("—")
    rows.append([name, *cells, f"{res['sync'].layer_us.mean():.0f}"])
print(table(rows, ["variant", *(f"{LABELS[m]} TTFT avg s" for m in MODES), "Sync µs/layer"],
            f"TTFT at 0.9 × Sync capacity (reduction vs Sync) — {time.perf_counter() - t0:.0f} s"))  # fmt: skip

# %% [markdown]
# **Reading** (full-size run; `make notebooks`). The ablation keeps the paper's order: each mechanism adds
# throughput (Async 1.075×, Async+SF 1.090×, CascadeEP 1.130× Sync; paper 1.034 / 1.113 / 1.166) and cuts TTFT
# at 0.9× Sync capacity (mean −14% / −21% / −24%, p95 −12% / −19% / −24%; paper CascadeEP −23.1% / −26.0%).
# Where the numbers differ, this is what the runs show:
#
# 1. *More imbalance.* R_tail (the idle share waiting for other replicas) is 47.9% here against the paper's
#    28%. That idle time is what per-source launching fills, and Async gains more than in the paper while
#    streamFFN adds less on top of it.
# 2. *OEWF is bounded by what remains after the straggler's attention.* OEWF alone cuts mean TTFT by 4.2% (paper
#    7.8%) and 51% of layer forwards by ≥ 1% (paper 77.4%). The estimators are not the reason: with exact
#    estimates it cuts 4.1%. OEWF only shortens the straggler's expert work that follows its own attention; in
#    the Fig. 1 layer the straggler's attention and dispatch take 12.9 ms of Sync's 14.8 ms, so at most the last
#    1.9 ms (13%) can move. Dense attention over long contexts makes that share small; sparse attention shrinks
#    the imbalance itself (Sync mean TTFT 0.27 s) and every mechanism gains less.
# 3. *streamFFN's kernels.* Matched-work FFN efficiency is 93.5% (paper 97.3%): groups launched before the last
#    arrival hold ≥ θ tokens and run near peak, but the final group (whatever remains) may be small, and every
#    group is priced against one merged kernel per rank.
# 4. *The launch guard* (beyond the paper, off by default): picking each rank's launch policy by its predicted
#    completion would guarantee the mode order under exact estimates, but with the paper's estimation noise it
#    mispredicts often enough to lose 6 points of Async+SF's TTFT cut (−15% vs −21%).
#
# Placement (Fig. 6 shape): CascadeEP's p95 speedup grows with load under every placement policy (round-robin
# 1.03× → 1.41×); the Mooncake conversation trace has few prefix hits (4–5%, 14% prefix-only), so the placements
# differ little in attention balance (ALB 0.37–0.38).
#
# TEMPO inside the experts (the two papers composed): prefill puts thousands of tokens on every expert
# (16,384 tokens per replica × 8 × top-6 / 256 experts ≈ 3,000, against n* = b/β ≈ 90 for these costs), so
# TEMPO's split is token balancing over the replicas: with 1.25× replicas it moves CascadeEP's mean TTFT from
# 1.40 s (EPLB-even) to 1.38 s; OEWF admitted by TEMPO's max-affine model instead of Eqs. 3–6 gives the same
# mean TTFT (1.34 s).

# %%
print(f"notebook time {time.perf_counter() - t_start:.1f} s (SMALL={SMALL})")
