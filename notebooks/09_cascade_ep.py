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
# power-of-two, prefix-only) with per-replica prefix caches and chunked prefill
# (`tempo_jax.sim.simulate_prefill`); every forward step is timed layer by layer (`tempo_jax.sim.cascade`) under
# four modes:
#
# - **Sync**: every rank starts its expert FFN once all replicas have dispatched;
# - **Async**: a rank launches one FFN kernel per source replica as its tokens arrive;
# - **Async+SF**: streamFFN — ready tokens accumulate to the launch threshold θ (90% of peak FFN throughput);
# - **CascadeEP**: Async+SF + opportunistic expert-weight fetching (OEWF) from the second MoE layer on.
#
# Costs come from FLOPs and bytes of the model's shapes on B200 at stated efficiencies, with one calibration:
# the FFN curve reaches 90% of peak at θ = 28,672 tokens per rank (the paper's Fig. 4). Absolute ktok/s are
# ours; compare ratios. Planners see what the paper's do: attention predicted by `fit_attention` fitted on a
# profile over App. B's grid (the true time has per-layer-class coefficients, per-sequence work and step noise,
# so the accuracy is an output) and token counts from the previous layer.
#
# Every result is reported under the **link models** — `contention` (default: serialised link ports that carry
# dispatch, combine and OEWF's weight fetches; a combine also crosses its source's receive port, served there with
# the dispatch chunks in one FIFO by the time each left its sender; fetches are protected transfers that yield to
# every other transfer, App. E; the helper's reassigned kernel costs it GPU time at the paper's 97.3% multi-stream
# retention), `fifo` (the same with fetches served first come, first served: the
# ablation) and `paper` (uncontended links, free fetches and helper work: the equations as the paper writes them)
# — and the **launch modes**: `reactive` (actual per-source readiness and counts, the paper's runtime), `planned`
# (each destination's groups from predicted arrivals and previous-layer counts: what an in-graph schedule per
# destination would execute) and `layer` (the one schedule shared by every rank that the JAX layer executes today).
# A donor keeps its original launch eligibility (App. C).
#
# **Seeds draw workloads.** Seed 0 serves the trace and routing recording as they are; every other seed also
# draws a window of the trace, which recorded layer each model layer replays and how the experts are laid out over
# the ranks (`CascadeConfig.vary_workload`). Every figure is the mean over 10 seeds with a 95% bootstrap interval;
# an ordering between two modes is claimed only from their *paired* per-seed differences (the paired interval
# excludes 0 and a sign test gives p < 0.05). Every headline is reported at **three operating points**: the
# recorded request rate, an attention imbalance matched to the paper's R_tail (28%: sparse attention with the key
# budget that gives it, at 0.9 of its capacity), and 0.9 of Sync's capacity. `SMALL=1` serves a few dozen requests
# of the bundled trace sample, 2 seeds.
#
# **What changed since the previous numbers** (5 seeds sharing one workload, combines not charged to the receiving
# port, FIFO fetches, the donor's eligibility taken after OEWF's moves, the attribution from TTFT runs at one request
# rate): each reading item below gives the earlier figure beside the new one and says why it moved.

# %%
import dataclasses
import os
import time

import matplotlib.pyplot as plt
import numpy as np

from tempo_jax.repro import Recorder, figures_dir
from tempo_jax.sim import PLACEMENT_POLICIES, CascadeConfig, prefill_costs
from tempo_jax.sim.cascade import cascade_trace, run_cascade_seeds
from tempo_jax.sim.cascade.summary import (
    ATTRIBUTION,
    LABELS,
    PAPER,
    budget_for_tail_ratio,
    capacity_rps_seeds,
    layer_attribution,
    layer_example,
    oewf_rows,
    ordering,
    paired_difference,
    reduction_summary,
    seed_summary,
)
from tempo_jax.sim.runner import bootstrap_ci
from tempo_jax.text import table

SMALL = os.environ.get("SMALL", "0") == "1"
FIGURES = figures_dir()
REC = Recorder("09_cascade_ep")
WORKERS = 1 if SMALL else 2
t_start = time.perf_counter()

SEEDS = (0, 1) if SMALL else tuple(range(10))
BASE = CascadeConfig(trace="mooncake_sample", max_requests=30) if SMALL else CascadeConfig(max_requests=1000)
SIZES = (16, 24, 60) if SMALL else (200, 1000, None)  # None: every request of the 1-hour trace
SWEEP_REQUESTS = 24 if SMALL else 400
SWEEP_LOADS = (0.5, 0.9) if SMALL else (0.3, 0.6, 0.9)
LINK_SCALES = (0.5, 1.0, 2.0) if SMALL else (0.25, 0.5, 1.0, 2.0, 4.0)  # the sensitivity sweep's link bandwidth factors
SENS_SEEDS = SEEDS if SMALL else SEEDS[:6]  # 6: the fewest seeds an ordering can be claimed from
LOAD = 0.9  # the near-saturation point ("near saturation", as the paper's 5 req/s)
TARGET_R_TAIL = PAPER["tail_ratio"][0]
POINTS = ("rec", "tail", "90")  # the recorded rate, the paper's R_tail matched, 0.9 of Sync's capacity
POINT_LABEL = {"rec": "recorded rate", "tail": "R_tail matched", "90": "0.9 × capacity"}
MODES = ("sync", "async", "async_sf", "cascade")
COMBOS = {
    "c_r": ("contention", "reactive"),
    "c_p": ("contention", "planned"),
    "c_l": ("contention", "layer"),
    "f_r": ("fifo", "reactive"),
    "p_r": ("paper", "reactive"),
    "p_p": ("paper", "planned"),
}
MODELS = ("deepseek_v4_flash", "deepseek_v4_pro", "glm_5_3")
LINKS = ("contention", "paper")  # the sections after Fig. 8: both link models (reactive launching)
PRE = {"contention": "", "paper": "plinks_"}  # recorded-value prefix of each link model
REACTIVE = {"contention": "c_r", "paper": "p_r"}  # each link model's reactive cell of the Fig. 8 grid
#: What became of OEWF's decisions (`CascadeRun.oewf_outcomes`): accepted moves, executed ones, those abandoned at
#: commit (no protected interval on the helper), dropped at execution (weights after the donor's dispatch left), and
#: helper decisions refused before a fetch.
OUTCOMES = ("moves", "executed", "abandoned", "dropped", "refused")
ATTR_STEPS = 30 if SMALL else 120  # served steps replayed per seed for the attribution
#: The previous run's figures (commit e9269f6, before issue 53: one capacity and one matched rate for every seed,
#: R_tail at dispatch completion over busy time, OEWF committing moves that delayed the helper's own kernels, donors
#: that had left attention, fetches holding a donor's port ahead of its combines, drawn seed windows), quoted in
#: the reading.
PREVIOUS = {
    "cut": 0.180,
    "cut_lo": 0.138,
    "cut_hi": 0.235,
    "order": "Sync > Async ≈ Async+SF > CascadeEP",
    "cut_tail": 0.156,
    "cut_rec": 0.028,
    "thr": 1.123,
    "r_tail": 0.437,
    "tail_found": 0.280,
    "tail_budget": 26137,
    "longer": 864,
    "longer_share": 0.038,
    "moves": 297622,
    "dropped": 19266,
    "fig9_ge1": 0.150,
    "oewf_alone": 0.037,
    "oewf_attr": 0.010,
    "seeds": 10,
}
run = dict(workers=WORKERS, progress=not SMALL)


def seeds(cfg, modes=MODES, rates=None, which=SEEDS):
    """``{seed: {mode: CascadeRun}}`` of ``cfg`` over ``which`` (``rates``: each seed's request rate)."""
    return run_cascade_seeds(cfg, modes, seeds=which, rates=rates, **run)


_CAPACITY: dict = {}


def capacity(cfg, which=SEEDS):
    """``{seed: requests/s}``: Sync's capacity on each seed's own workload (`capacity_rps_seeds`; cached per config)."""
    key = (dataclasses.replace(cfg, rate_rps=None), tuple(which))
    if key not in _CAPACITY:
        _CAPACITY[key] = capacity_rps_seeds(key[0], which, **run)
    return _CAPACITY[key]


def spread(name, per_seed, mean_name=None):
    """``{mean_name or name: mean, name_lo: min, name_hi: max}`` of per-seed values (recorded as a figure's spread)."""
    vals = list(per_seed)
    return {mean_name or name: float(np.mean(vals)), f"{name}_lo": min(vals), f"{name}_hi": max(vals)}


def at_load(cfg, load=LOAD, which=SEEDS):
    """``{seed: requests/s}``: ``load`` of each seed's own Sync capacity (per-seed operating points)."""
    return {s: load * c for s, c in capacity(cfg, which).items()}


def ci(fig, pct=False, digits=3):
    """``value [lo, hi]`` of a seed figure."""
    lo, hi = fig["ci95"]
    if pct:
        return f"{100 * fig['value']:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}]"
    return f"{fig['value']:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


# %% [markdown]
# ## The deployments' costs (derived, see `tempo_jax.sim.cascade.costs`)

# %%
rows = []
for name in MODELS:
    c = prefill_costs(name)
    m = c.model
    rows.append(
        [
            name,
            f"{m.experts} × {m.top_k}, {m.hidden}, {m.expert_dim}, {m.layers}",
            f"{c.fixed_us:.0f} µs + N / {c.peak_tokens_per_us:.1f}",
            c.threshold,
            f"{c.expert_bytes / 1e6:.1f} MB",
        ]
    )
print(table(rows, ["model", "E × K, H, F, L", "F(N)", "θ (ρ = 0.9)", "one expert"], "B200, D = 8 (θ: Fig. 4)"))
costs = BASE.costs()
truth = BASE.attention_truth()
tempo_cost = costs.tempo_cost_model()
REC.update(
    theta=costs.threshold,
    n_star=tempo_cost.b / tempo_cost.beta,
    pairs_per_expert=BASE.max_batch_tokens * BASE.num_ranks * costs.model.top_k / costs.model.experts,
    fit_profile_accuracy=float(np.mean([r.accuracy for r in truth.reports])),
    attention_classes=truth.classes,
)
REC.claim("prefill_far_above_n_star", REC.values["pairs_per_expert"] > 10 * REC.values["n_star"])

# %% [markdown]
# ## Operating points
#
# Each seed serves its own workload, so each seed's operating point is set from its own Sync capacity: the
# recorded rate (each seed's load reported); 0.9 of the seed's capacity; and the paper's attention imbalance —
# R_tail (App. A: gaps at dispatch entry over wall-clock time) falls as the load rises (the long tail is a property
# of light batches), so no request rate reaches the paper's 28% under dense attention; sparse attention with a
# larger key budget does (`budget_for_tail_ratio`: the budget whose R_tail, averaged over the seeds each at 0.9 of
# its own capacity, is closest to 28%; the seeds' spread is reported).

# %%
t0 = time.perf_counter()
caps = capacity(BASE)
cap_rps = float(np.mean(list(caps.values())))
rec_loads = {}
for s_ in SEEDS:
    tr = cascade_trace(dataclasses.replace(BASE, seed=s_))
    rec_loads[s_] = (len(tr) - 1) / tr.duration_s / caps[s_]  # the window's recorded rate over its capacity
budget, tail_found, tail_rates, tail_by_seed = budget_for_tail_ratio(
    BASE, TARGET_R_TAIL, load=LOAD, seeds=SEEDS, iters=3 if SMALL else 8, **run
)
MATCHED = dataclasses.replace(BASE, attention="sparse", key_budget=budget)
POINT_CFG = {  # (config, per-seed rates)
    "rec": (dataclasses.replace(BASE, rate_rps=None), None),
    "tail": (MATCHED, tail_rates),
    "90": (BASE, at_load(BASE)),
}
REC.update(
    **spread("capacity_rps", caps.values()),
    **spread("rec_load", rec_loads.values(), "rec_load_mean"),
    **spread("tail", tail_by_seed.values(), "tail_found"),  # tail_found: the mean R_tail the match reached
    **spread("tail_rate", tail_rates.values()),
    rec_overloaded=sum(v > 1 for v in rec_loads.values()),
    tail_budget=budget,
    target_r_tail=TARGET_R_TAIL,
)
print(
    f"Sync capacity per seed {min(caps.values()):.2f}–{max(caps.values()):.2f} req/s (mean {cap_rps:.2f}); the "
    f"recorded rate is {min(rec_loads.values()):.2f}–{max(rec_loads.values()):.2f} of it "
    f"({REC.values['rec_overloaded']} seed(s) overloaded); R_tail {tail_found:.1%} over the seeds "
    f"({min(tail_by_seed.values()):.1%}–{max(tail_by_seed.values()):.1%}; target {TARGET_R_TAIL:.0%}) with a key "
    f"budget of {budget:,} — {time.perf_counter() - t0:.0f} s"
)

# %% [markdown]
# ## Fig. 8: the incremental ablation under every link and launch model, at the three operating points
#
# Throughput: every request arriving at once (each mode at its own capacity). TTFT: the same requests at each
# operating point (one request rate for all four modes of the system).

# %%
t0 = time.perf_counter()
grid, thr = {}, {}
for key, (links, launch) in COMBOS.items():
    thr[key] = seeds(dataclasses.replace(BASE, links=links, launch=launch, rate_rps=1e4))
    for point, (cfg, rates) in POINT_CFG.items():
        grid[key, point] = seeds(dataclasses.replace(cfg, links=links, launch=launch), rates=rates)
print(f"grid {time.perf_counter() - t0:.0f} s")
abl = []
for key, (links, launch) in COMBOS.items():
    gain = reduction_summary(thr[key], "throughput_tps")
    for point in POINTS:
        summ = seed_summary(grid[key, point])
        cut, cut95 = reduction_summary(grid[key, point]), reduction_summary(grid[key, point], "ttft_p95_s")
        for mode in MODES:
            f, c, c95, g = summ[mode]["ttft_mean_s"], cut[mode], cut95[mode], gain[mode]
            abl.append(
                {
                    "links": links,
                    "launch": launch,
                    "point": point,
                    "mode": mode,
                    "ttft_mean_s": f["value"],
                    "ttft_mean_lo": f["ci95"][0],
                    "ttft_mean_hi": f["ci95"][1],
                    "ttft_p95_s": summ[mode]["ttft_p95_s"]["value"],
                    "ttft_cut": c["value"],
                    "ttft_cut_lo": c["ci95"][0],
                    "ttft_cut_hi": c["ci95"][1],
                    "p95_cut": c95["value"],
                    "p95_cut_lo": c95["ci95"][0],
                    "p95_cut_hi": c95["ci95"][1],
                    "thr_ratio": 1 + g["value"],
                    "thr_lo": 1 + g["ci95"][0],
                    "thr_hi": 1 + g["ci95"][1],
                }
            )
            tag = f"{key}_{point}_{mode}"
            REC.update(
                **{
                    f"cut_{tag}": c["value"],
                    f"cut_{tag}_lo": c["ci95"][0],
                    f"cut_{tag}_hi": c["ci95"][1],
                    f"p95cut_{tag}": c95["value"],
                }
            )
            if point == "90":
                REC.update(
                    **{
                        f"thr_{key}_{mode}": 1 + g["value"],
                        f"thr_{key}_{mode}_lo": 1 + g["ci95"][0],
                        f"thr_{key}_{mode}_hi": 1 + g["ci95"][1],
                    }
                )
        REC.update(
            **{
                f"order_{key}_{point}": ordering(summ),
                f"order95_{key}_{point}": ordering(summ, "ttft_p95_s"),  # p95 orderings from paired p95s
                **spread(f"r_tail_{key}_{point}", [grid[key, point][s_]["sync"].tail_ratio for s_ in SEEDS]),
            }
        )
        sf_vs_async = paired_difference(
            summ["async"]["ttft_mean_s"]["per_seed"], summ["async_sf"]["ttft_mean_s"]["per_seed"]
        )
        REC.update(
            **{
                f"async_minus_sf_{key}_{point}": sf_vs_async["value"],
                f"async_minus_sf_{key}_{point}_lo": sf_vs_async["ci95"][0],
                f"async_minus_sf_{key}_{point}_hi": sf_vs_async["ci95"][1],
                f"async_minus_sf_{key}_{point}_p": sf_vs_async["sign_p"],
            }
        )
    REC.update(**{f"thr_order_{key}": ordering(seed_summary(thr[key]), "throughput_tps")})
REC.table("ablation", abl)
print(
    table(
        [
            [
                r["links"],
                r["launch"],
                POINT_LABEL[r["point"]],
                LABELS[r["mode"]],
                f"{r['thr_ratio']:.3f} [{r['thr_lo']:.3f}, {r['thr_hi']:.3f}]",
                f"{r['ttft_mean_s']:.3f} [{r['ttft_mean_lo']:.3f}, {r['ttft_mean_hi']:.3f}]",
                f"{100 * r['ttft_cut']:.1f}% [{100 * r['ttft_cut_lo']:.1f}, {100 * r['ttft_cut_hi']:.1f}]",
                f"{100 * r['p95_cut']:.1f}% [{100 * r['p95_cut_lo']:.1f}, {100 * r['p95_cut_hi']:.1f}]",
            ]
            for r in abl
        ],
        ["links", "launch", "operating point", "mode", "throughput vs Sync", "TTFT avg s", "avg cut", "p95 cut"],
        f"DeepSeek-V4-Flash, {BASE.max_requests} requests, mean [95% CI] over {len(SEEDS)} seeds",
    )
)
for key in COMBOS:
    print(
        key,
        " | ".join(f"{POINT_LABEL[p]}: {REC.values[f'order_{key}_{p}']}" for p in POINTS),
        "| throughput:",
        REC.values[f"thr_order_{key}"],
    )
REC.update(
    load_fraction=LOAD,
    seeds=len(SEEDS),
    requests=BASE.max_requests or 0,
    paper_thr_async=PAPER["throughput_ktok_s"]["async"] / PAPER["throughput_ktok_s"]["sync"],
    paper_thr_async_sf=PAPER["throughput_ktok_s"]["async_sf"] / PAPER["throughput_ktok_s"]["sync"],
    paper_thr_cascade=PAPER["throughput_ktok_s"]["cascade"] / PAPER["throughput_ktok_s"]["sync"],
    paper_ttft_mean_cut=PAPER["ttft_reduction"]["mean"],
    paper_ttft_p95_cut=PAPER["ttft_reduction"]["p95"],
    paper_oewf_alone_mean=PAPER["oewf_only_reduction"]["mean"],
    paper_oewf_alone_p95=PAPER["oewf_only_reduction"]["p95"],
    **{f"prev_{k}": v for k, v in PREVIOUS.items()},
)

# %% [markdown]
# ## Where the gains come from: early FFN, combine overlap, OEWF — on per-layer time with the same inputs
#
# Served steps of each seed's Sync run replayed under Sync and Async+SF with the combine as configured and free,
# and under CascadeEP: the same batches, attention noise and routing draws, so every variant runs at the same
# utilisation (a free-combine *serving* run at the same request rate runs lighter and understates early FFN).
# Shares of Sync's summed forward time, paired per seed, at each operating point. Values under the paper's links
# carry a `plinks_` prefix. The OEWF-alone rows are TTFT cuts against Async+SF (serving runs, paired per seed).

# %%
t0 = time.perf_counter()
attr_rows = []
for links in LINKS:
    pre, key = PRE[links], REACTIVE[links]
    for point in POINTS:
        per_seed = [layer_attribution(grid[key, point][s]["sync"], steps=ATTR_STEPS) for s in SEEDS]
        for part in ATTRIBUTION:
            vals = [a[part] for a in per_seed]
            lo, hi = bootstrap_ci(vals)
            attr_rows.append(
                {"links": links, "point": point, "part": part, "value": float(np.mean(vals)), "lo": lo, "hi": hi}
            )
            REC.update(
                **{
                    f"{pre}attr_{part}_{point}": float(np.mean(vals)),
                    f"{pre}attr_{part}_{point}_lo": lo,
                    f"{pre}attr_{part}_{point}_hi": hi,
                }
            )
    loaded, rates = POINT_CFG["90"]
    exact = seeds(dataclasses.replace(loaded, links=links, estimates="exact"), ("async_sf", "cascade"), rates)
    ex = reduction_summary(exact, base="async_sf")["cascade"]
    sf_base = reduction_summary(grid[key, "90"], base="async_sf")["cascade"]
    sf95 = reduction_summary(grid[key, "90"], "ttft_p95_s", base="async_sf")["cascade"]
    REC.update(
        **{
            f"{pre}oewf_alone_exact": ex["value"],
            f"{pre}oewf_alone_exact_lo": ex["ci95"][0],
            f"{pre}oewf_alone_exact_hi": ex["ci95"][1],
            f"{pre}oewf_alone_mean": sf_base["value"],
            f"{pre}oewf_alone_mean_lo": sf_base["ci95"][0],
            f"{pre}oewf_alone_mean_hi": sf_base["ci95"][1],
            f"{pre}oewf_alone_p95": sf95["value"],
        }
    )
REC.table("attribution", attr_rows)
print(
    table(
        [
            [
                r["links"],
                POINT_LABEL[r["point"]],
                r["part"],
                f"{100 * r['value']:.2f}% [{100 * r['lo']:.2f}, {100 * r['hi']:.2f}]",
            ]
            for r in attr_rows
        ],
        ["links", "operating point", "part", "share of Sync's forward time: mean [95% CI]"],
        f"attribution on {ATTR_STEPS} replayed steps per seed — {time.perf_counter() - t0:.0f} s",
    )
)
fig, ax = plt.subplots(figsize=(7, 3.4))
width = 0.38
for k, links in enumerate(LINKS):
    bottom = np.zeros(len(POINTS))
    for part, color in zip(ATTRIBUTION, ("C2", "C0", "C3"), strict=True):
        v = np.array([100 * REC.values[f"{PRE[links]}attr_{part}_{p}"] for p in POINTS])
        ax.bar(
            np.arange(len(POINTS)) + (k - 0.5) * width,
            v,
            width,
            bottom=bottom,
            color=color,
            alpha=1 - 0.4 * k,
            label=f"{part.replace('_', ' ')} ({links})",
        )
        bottom += v
ax.set_xticks(np.arange(len(POINTS)), [POINT_LABEL[p] for p in POINTS])
ax.set_ylabel("cut of Sync's forward time (%)")
ax.grid(alpha=0.3, axis="y")
ax.legend(fontsize=7, ncol=2)
fig.tight_layout()
fig.savefig(FIGURES / "cascade_attribution.png", dpi=120)
plt.show()

# %% [markdown]
# ## Fig. 9 and OEWF's accepted moves that lengthen the layer (protected transfers against the FIFO ablation)

# %%
ofig, orows = {}, []
for key in COMBOS:
    runs_c = [grid[key, "90"][s]["cascade"] for s in SEEDS]
    o = [oewf_rows(r) for r in runs_c]
    outcomes = {k: sum(r.oewf_outcomes[k] for r in runs_c) for k in OUTCOMES}
    layers = sum(x["layers"] for x in o)
    moves = outcomes["moves"]
    row = {
        "links": COMBOS[key][0],
        "launch": COMBOS[key][1],
        "ge_1pct": float(np.mean([x["ge_1pct"] for x in o])),
        "ge_5pct": float(np.mean([x["ge_5pct"] for x in o])),
        "max": float(max(x["max"] for x in o)),
        "layers": layers,
        **outcomes,
        "longer_layers": sum(r.oewf_longer for r in runs_c),
    }
    row["longer_share"] = row["longer_layers"] / max(1, sum(int((r.oewf_reduction != 0).sum()) for r in runs_c))
    orows.append(row)
    ofig[key] = row
    REC.update(
        **{
            f"fig9_{key}_ge1": row["ge_1pct"],
            f"fig9_{key}_ge5": row["ge_5pct"],
            f"fig9_{key}_max": row["max"],
            f"longer_{key}": row["longer_layers"],
            **{f"{k}_{key}": outcomes[k] for k in OUTCOMES},
            f"layers_{key}": layers,
            f"longer_share_{key}": row["longer_share"],
        }
    )
REC.table("oewf", orows)
REC.update(
    fig9_threshold=0.01,
    ci_level=0.95,
    alpha=0.05,
    paper_fig9_ge1=PAPER["oewf_layers"]["ge_1pct"],
    paper_fig9_ge5=PAPER["oewf_layers"]["ge_5pct"],
    paper_fig9_max=PAPER["oewf_layers"]["max"],
)
print(
    table(
        [
            [
                r["links"],
                r["launch"],
                f"{100 * r['ge_1pct']:.1f}%",
                f"{100 * r['ge_5pct']:.1f}%",
                f"{100 * r['max']:.2f}%",
                r["moves"],
                r["executed"],
                r["abandoned"],
                r["dropped"],
                r["refused"],
                r["longer_layers"],
                f"{100 * r['longer_share']:.1f}%",
                r["layers"],
            ]
            for r in orows
        ],
        [
            "links",
            "launch",
            "cut ≥ 1%",
            "cut ≥ 5%",
            "max cut",
            "accepted moves",
            "executed",
            "abandoned at commit",
            "dropped at execution",
            "refused before a fetch",
            "layers made longer",
            "of layers OEWF changed",
            "layer forwards",
        ],
        "OEWF per layer forward (paper: 77.4% / 23.1% / 10.87%)",
    )
)
fig, ax = plt.subplots(figsize=(6, 3.6))
for key, color in (("c_r", "C3"), ("f_r", "C1"), ("p_r", "C0")):
    red = np.sort(100 * grid[key, "90"][SEEDS[0]]["cascade"].oewf_reduction)
    ax.plot(red, 100 * np.arange(1, red.size + 1) / red.size, color=color, label=f"links={COMBOS[key][0]}")
ax.plot([1, 5, 10.87], [100 - 77.4, 100 - 23.1, 100], "ks", label="paper (1%, 5%, max)")
ax.set_xlabel("layer latency reduction from OEWF (%; < 0: OEWF made it longer)")
ax.set_ylabel("cumulative fraction of layers (%)")
ax.grid(alpha=0.3)
ax.legend()
fig.tight_layout()
fig.savefig(FIGURES / "cascade_fig9_oewf_cdf.png", dpi=120)
plt.show()

# %% [markdown]
# ## App. C's two readings: every headline under each
#
# App. C commits a reassigned kernel only in "a protected interval that accommodates the complete helper invocation
# without delaying existing work"; otherwise it "is abandoned and execution remains with the current owner". The
# default (`commit="first"`) reads the interval as the helper's first idle interval from the weights' arrival, up to
# its next own kernel; `commit="any"` as the earliest idle interval that holds the whole kernel, before or after its
# later kernels (never abandoning). Only CascadeEP's OEWF reads it, so Sync, Async and Async+SF are the same runs;
# the paper's free links commit every move and have no second reading. The spread between the two columns is the
# reading's uncertainty.

# %%
t0 = time.perf_counter()
READ_COMBOS = tuple(k for k, (links, _) in COMBOS.items() if links != "paper")
any_grid, any_thr = {}, {}


def with_any(runs, cfg, key, rates=None):
    """``runs`` (``{seed: {mode: CascadeRun}}`` of ``cfg`` under ``COMBOS[key]``) with CascadeEP served again under
    commit="any" (the other modes read no commit rule: the same runs)."""
    links, launch = COMBOS[key]
    other = seeds(dataclasses.replace(cfg, links=links, launch=launch, commit="any"), ("cascade",), rates)
    return {s_: {**runs[s_], "cascade": other[s_]["cascade"]} for s_ in SEEDS}


for key in READ_COMBOS:
    any_thr[key] = with_any(thr[key], dataclasses.replace(BASE, rate_rps=1e4), key)
    for point, (cfg, rates) in POINT_CFG.items():
        any_grid[key, point] = with_any(grid[key, point], cfg, key, rates)
read_rows = []
for key in READ_COMBOS:
    for reading, g, th in (("first", grid, thr), ("any", any_grid, any_thr)):
        runs_c = [g[key, "90"][s_]["cascade"] for s_ in SEEDS]
        o = [oewf_rows(r) for r in runs_c]
        outcomes = {k: sum(r.oewf_outcomes[k] for r in runs_c) for k in OUTCOMES}
        row = {
            "links": COMBOS[key][0],
            "launch": COMBOS[key][1],
            "commit": reading,
            **{f"cut_{p}": reduction_summary(g[key, p])["cascade"]["value"] for p in POINTS},
            **{f"order_{p}": ordering(seed_summary(g[key, p])) for p in POINTS},
            "p95_cut_90": reduction_summary(g[key, "90"], "ttft_p95_s")["cascade"]["value"],
            "thr": 1 + reduction_summary(th[key], "throughput_tps")["cascade"]["value"],
            "oewf_alone": reduction_summary(g[key, "90"], base="async_sf")["cascade"]["value"],
            "fig9_ge1": float(np.mean([x["ge_1pct"] for x in o])),
            "fig9_ge5": float(np.mean([x["ge_5pct"] for x in o])),
            "fig9_max": float(max(x["max"] for x in o)),
            "longer": sum(r.oewf_longer for r in runs_c),
            **outcomes,
        }
        read_rows.append(row)
        if reading == "any":
            REC.update(**{f"any_{k}_{key}": v for k, v in row.items() if k not in ("links", "launch", "commit")})
REC.table("commit_readings", read_rows)
HEADLINES = (
    ("cut_rec", "CascadeEP mean-TTFT cut, recorded rate", True),
    ("cut_tail", "… R_tail matched", True),
    ("cut_90", "… 0.9 × capacity", True),
    ("p95_cut_90", "CascadeEP p95-TTFT cut, 0.9 × capacity", True),
    ("thr", "throughput vs Sync at capacity", False),
    ("oewf_alone", "OEWF alone (vs Async+SF), 0.9 × capacity", True),
    ("fig9_ge1", "Fig. 9: layer forwards cut ≥ 1%", True),
    ("fig9_ge5", "Fig. 9: cut ≥ 5%", True),
    ("fig9_max", "Fig. 9: largest cut", True),
    ("longer", "layer forwards made longer", False),
    ("executed", "moves executed", False),
    ("abandoned", "moves abandoned at commit", False),
    ("dropped", "moves dropped at execution", False),
    ("refused", "helper decisions refused before a fetch", False),
)
spreads = {}
for key in READ_COMBOS:
    first, other = (
        next(
            r for r in read_rows if r["links"] == COMBOS[key][0] and r["launch"] == COMBOS[key][1] and r["commit"] == c
        )
        for c in ("first", "any")
    )
    for name, _, _ in HEADLINES:
        spreads[key, name] = other[name] - first[name]
REC.update(**{f"any_spread_{name}_{key}": v for (key, name), v in spreads.items()})


def _fmt(v, pct):
    return f"{100 * v:.1f}%" if pct else (f"{v:.3f}" if isinstance(v, float) else f"{v:,}")


print(
    table(
        [
            [
                label,
                *(
                    f"{_fmt(r[name], pct)}"
                    for r in read_rows
                    if r["links"] == "contention" and r["launch"] == "reactive"
                ),
                _fmt(spreads["c_r", name], pct),
            ]
            for name, label, pct in HEADLINES
        ]
        + [
            [
                f"order at {POINT_LABEL[p]}",
                *(r[f"order_{p}"] for r in read_rows if r["links"] == "contention" and r["launch"] == "reactive"),
                "",
            ]
            for p in POINTS
        ],
        ["headline (contention, reactive)", 'commit="first" (default)', 'commit="any"', "any − first"],
        f"App. C's two readings, {len(SEEDS)} seeds of {BASE.max_requests} requests — {time.perf_counter() - t0:.0f} s",
    )
)
print(
    table(
        [
            [
                r["links"],
                r["launch"],
                r["commit"],
                *(_fmt(r[f"cut_{p}"], True) for p in POINTS),
                _fmt(r["thr"], False),
                _fmt(r["oewf_alone"], True),
                _fmt(r["fig9_ge1"], True),
                r["executed"],
                r["abandoned"],
                r["dropped"],
                r["refused"],
            ]
            for r in read_rows
        ],
        [
            "links",
            "launch",
            "commit",
            *(f"cut, {POINT_LABEL[p]}" for p in POINTS),
            "throughput",
            "OEWF alone",
            "≥1% layers",
            "executed",
            "abandoned",
            "dropped",
            "refused",
        ],
        "both readings under every link and launch model that has two",
    )
)

# %% [markdown]
# ## Fig. 1: one layer of the most imbalanced step, under every mode (default model, exact estimates)

# %%
example = layer_example(grid["c_r", "90"][SEEDS[0]]["sync"], layer=1)
ex_sync = example["sync"]
REC.update(
    fig1_layer_ms=ex_sync.end_us / 1e3,
    fig1_straggler_ms=ex_sync.ready_us.max() / 1e3,
    fig1_movable_share=1 - ex_sync.ready_us.max() / ex_sync.end_us,
    fig1_cascade_cut=1 - example["cascade"].end_us / ex_sync.end_us,
)
REC.claim("fig1_cut_within_movable_share", REC.values["fig1_cascade_cut"] <= REC.values["fig1_movable_share"])
fig, axes = plt.subplots(len(MODES), 1, figsize=(11, 2.2 * len(MODES)), sharex=True)
for ax, mode in zip(axes, MODES, strict=True):
    res = example[mode]
    for d in range(len(res.ready_us)):
        ax.barh(d, res.ready_us[d], color="0.8", height=0.6)  # attention + dispatch
        for k in res.kernels[d]:
            ax.barh(d, k.end_us - k.start_us, left=k.start_us, color="C0", height=0.6, edgecolor="w")
        last = max([k.end_us for k in res.kernels[d]] + [res.ready_us[d]])
        ax.barh(d, res.rank_end_us[d] - last, left=last, color="C2", height=0.6)
    for s in res.side:
        ax.barh(s.rank + 0.32, s.end_us - s.start_us, left=s.start_us, color="C3", height=0.25)
    ax.axvline(res.end_us, color="k", lw=1)
    ax.set_title(f"{LABELS[mode]}: layer ends at {res.end_us:.0f} µs", fontsize=9, loc="left")
    ax.set_ylabel("rank")
axes[-1].set_xlabel(
    "µs from layer start (grey: attention + dispatch, blue: FFN kernels, green: combine tail, "
    "red: OEWF reassigned kernel)"
)
fig.tight_layout()
fig.savefig(FIGURES / "cascade_fig1_timeline.png", dpi=120)
plt.show()

# %% [markdown]
# ## Trace sizes: 200, 1,000 and all 12,031 requests, at the recorded rate and at 0.9 of Sync's capacity
#
# The whole trace is served at its recorded rate under contention only (each seed's rotation of it: a different
# first hour); the smaller sizes under both link models and both rates.

# %%
t0 = time.perf_counter()
size_rows = []
for n in SIZES:
    cfg_n = dataclasses.replace(BASE, max_requests=n)
    whole = n is None or n == SIZES[-1]
    rates_n = None if whole else at_load(cfg_n)  # each seed's Sync capacity: the same rates for both link models
    for links in ("contention",) if whole else LINKS:
        cfg = dataclasses.replace(cfg_n, links=links)
        for label, rates in (("recorded", None),) if whole else (("recorded", None), ("0.9 × capacity", rates_n)):
            res = seeds(dataclasses.replace(cfg, rate_rps=None), rates=rates)
            summ, cut = seed_summary(res), reduction_summary(res)
            served = res[SEEDS[0]]["sync"].prefill.num_requests
            size_rows.append(
                {
                    "requests": served,
                    "links": links,
                    "load": label,
                    "order": ordering(summ),
                    **{f"ttft_{m}": summ[m]["ttft_mean_s"]["value"] for m in MODES},
                    **{f"cut_{m}": cut[m]["value"] for m in MODES},
                    **{f"cut_{m}_lo": cut[m]["ci95"][0] for m in MODES},
                    **{f"cut_{m}_hi": cut[m]["ci95"][1] for m in MODES},
                }
            )
REC.table("sizes", size_rows)
print(
    table(
        [
            [
                r["requests"],
                r["links"],
                r["load"],
                *(f"{r[f'ttft_{m}']:.3f}" for m in MODES),
                *(
                    f"{100 * r[f'cut_{m}']:.1f}% [{100 * r[f'cut_{m}_lo']:.1f}, {100 * r[f'cut_{m}_hi']:.1f}]"
                    for m in MODES[1:]
                ),
                r["order"],
            ]
            for r in size_rows
        ],
        [
            "requests",
            "links",
            "load",
            *(f"{LABELS[m]} TTFT s" for m in MODES),
            *(f"{LABELS[m]} cut" for m in MODES[1:]),
            "ordering (paired)",
        ],
        f"trace sizes, reactive launching — {time.perf_counter() - t0:.0f} s",
    )
)
for links in LINKS:  # size0..: (200, 1,000) × (recorded, 0.9 × capacity), then all at the recorded rate
    pre = PRE[links]
    for i, r in enumerate(r for r in size_rows if r["links"] == links):
        REC.update(
            **{
                f"{pre}size{i}_n": r["requests"],
                f"{pre}size{i}_order": r["order"],
                f"{pre}size{i}_cut": r["cut_cascade"],
                f"{pre}size{i}_cut_lo": r["cut_cascade_lo"],
                f"{pre}size{i}_cut_hi": r["cut_cascade_hi"],
            }
        )

# %% [markdown]
# ## Models: DeepSeek-V4-Flash, DeepSeek-V4-Pro, GLM-5.3 (shapes from the model-family presets)

# %%
model_rows = []
for name in MODELS:
    cfg_m = dataclasses.replace(BASE, model=name)
    cap_m = float(np.mean(list(capacity(cfg_m).values())))
    for links in LINKS:
        pre, key = PRE[links], REACTIVE[links]
        cfg = dataclasses.replace(cfg_m, links=links)
        res = grid[key, "90"] if name == BASE.model else seeds(cfg, rates=at_load(cfg_m))
        summ, cut = seed_summary(res), reduction_summary(res)
        model_rows.append(
            {
                "model": name,
                "links": links,
                "capacity_rps": cap_m,
                "order": ordering(summ),
                **{f"cut_{m}": cut[m]["value"] for m in MODES},
                **{f"cut_{m}_lo": cut[m]["ci95"][0] for m in MODES},
                **{f"cut_{m}_hi": cut[m]["ci95"][1] for m in MODES},
            }
        )
        REC.update(
            **{
                f"{pre}{name}_cut": cut["cascade"]["value"],
                f"{pre}{name}_cut_lo": cut["cascade"]["ci95"][0],
                f"{pre}{name}_cut_hi": cut["cascade"]["ci95"][1],
                f"{pre}{name}_sf_cut": cut["async_sf"]["value"],
                f"{pre}{name}_order": ordering(summ),
            }
        )
REC.table("models", model_rows)
print(
    table(
        [
            [
                r["model"],
                r["links"],
                f"{r['capacity_rps']:.2f}",
                *(
                    f"{100 * r[f'cut_{m}']:.1f}% [{100 * r[f'cut_{m}_lo']:.1f}, {100 * r[f'cut_{m}_hi']:.1f}]"
                    for m in MODES[1:]
                ),
                r["order"],
            ]
            for r in model_rows
        ],
        ["model", "links", "Sync capacity req/s", *(f"{LABELS[m]} avg cut" for m in MODES[1:]), "ordering (CIs)"],
        f"{BASE.max_requests} requests at 0.9 of each model's Sync capacity (contention), reactive",
    )
)

# %% [markdown]
# ## Fig. 6 shape: p95 TTFT speedup of CascadeEP over Sync vs load, per placement policy

# %%
t0 = time.perf_counter()
sweep = []
for links in LINKS:
    for policy in PLACEMENT_POLICIES:
        for load in SWEEP_LOADS:
            small = dataclasses.replace(BASE, max_requests=SWEEP_REQUESTS)  # each seed's capacity
            cfg = dataclasses.replace(small, links=links, placement=policy)
            res = seeds(cfg, ("sync", "cascade"), at_load(small, load))
            sp = [res[s]["sync"].prefill.ttft_p95_s / res[s]["cascade"].prefill.ttft_p95_s for s in SEEDS]
            lo, hi = bootstrap_ci(sp)
            top = res[SEEDS[0]]["sync"].prefill
            sweep.append(
                {
                    "links": links,
                    "placement": policy,
                    "load": load,
                    "p95_speedup": float(np.mean(sp)),
                    "lo": lo,
                    "hi": hi,
                    "cache_hit": top.cache_hit_rate,
                    "alb": top.alb_mean,
                }
            )
REC.table("sweep", sweep)
for links in LINKS:
    pre = PRE[links]
    for p in PLACEMENT_POLICIES:
        rs = [r for r in sweep if r["placement"] == p and r["links"] == links]
        REC.update(**{f"{pre}sweep_{p}_lo": rs[0]["p95_speedup"], f"{pre}sweep_{p}_hi": rs[-1]["p95_speedup"]})
print(
    table(
        [
            [
                r["links"],
                r["placement"],
                r["load"],
                f"{r['p95_speedup']:.3f} [{r['lo']:.3f}, {r['hi']:.3f}]",
                f"{100 * r['cache_hit']:.0f}%",
                f"{r['alb']:.2f}",
            ]
            for r in sweep
        ],
        ["links", "placement", "load", "p95 speedup Sync / CascadeEP", "cache hit", "ALB"],
        f"{SWEEP_REQUESTS} requests — {time.perf_counter() - t0:.0f} s",
    )
)
REC.update(load_lo=SWEEP_LOADS[0], load_hi=SWEEP_LOADS[-1])
fig, ax = plt.subplots(figsize=(6.5, 4))
for links, style in (("contention", "o-"), ("paper", "s--")):
    for k, policy in enumerate(PLACEMENT_POLICIES):
        rs = [r for r in sweep if r["placement"] == policy and r["links"] == links]
        ax.errorbar(
            [r["load"] for r in rs],
            [r["p95_speedup"] for r in rs],
            yerr=[[r["p95_speedup"] - r["lo"] for r in rs], [r["hi"] - r["p95_speedup"] for r in rs]],
            fmt=style,
            color=f"C{k}",
            label=f"{policy} ({links})",
            capsize=3,
        )
ax.axhline(1, color="k", lw=0.8)
ax.set_xlabel("load (fraction of Sync capacity)")
ax.set_ylabel("p95 TTFT speedup (Sync / CascadeEP)")
ax.set_title("solid: contended links, dashed: the paper's links", fontsize=9)
ax.grid(alpha=0.3)
ax.legend(fontsize=7, ncol=2)
fig.tight_layout()
fig.savefig(FIGURES / "cascade_fig6_fig2.png", dpi=120)
plt.show()

# %% [markdown]
# ## Sensitivity: under which conditions the paper's ordering appears
#
# The ablation departs from the paper in three places (streamFFN adds little, the gain is mostly combine overlap,
# OEWF improves few layers). Two parameters of the testbed decide them in the model: the link bandwidth (the
# combine's cost, hence what overlapping it is worth; and the time to fetch an expert, hence which helpers can
# fetch before their donor's FFN starts) and the attention imbalance (how long the early ranks wait). The sweep
# serves each (link bandwidth, imbalance) cell at 0.9 of each seed's own capacity there.

# %%
t0 = time.perf_counter()
IMBALANCE = {
    "sparse": dataclasses.replace(BASE, attention="sparse"),  # the model's own key budget: light imbalance
    "matched": MATCHED,  # R_tail matched to the paper's
    "dense": BASE,  # dense attention: the heaviest imbalance
}
sens_rows = []
for imb, cfg_i in IMBALANCE.items():
    for i, ls in enumerate(LINK_SCALES):
        cfg = dataclasses.replace(cfg_i, max_requests=SWEEP_REQUESTS, link_scale=ls)
        res = seeds(cfg, MODES, at_load(cfg, which=SENS_SEEDS), SENS_SEEDS)
        vs_sync, vs_async = reduction_summary(res), reduction_summary(res, base="async")
        vs_sf = reduction_summary(res, base="async_sf")
        row = {
            "imbalance": imb,
            "link_scale": ls,
            "link_gbps": ls * costs.hardware.link_bytes_per_us / 1e3,
            "r_tail": float(np.mean([res[s_]["sync"].tail_ratio for s_ in SENS_SEEDS])),
            "cascade_cut": vs_sync["cascade"]["value"],
            "async_cut": vs_sync["async"]["value"],
            "sf_over_async": vs_async["async_sf"]["value"],
            "oewf_alone": vs_sf["cascade"]["value"],
            "fig9_ge1": float(np.mean([oewf_rows(res[s_]["cascade"])["ge_1pct"] for s_ in SENS_SEEDS])),
            "order": ordering(seed_summary(res)),
        }
        sens_rows.append(row)
        # recorded under every name the reading uses: the first and last factor, ×1 (ours) and ×2
        names = ["first"] * (i == 0) + ["last"] * (i == len(LINK_SCALES) - 1) + {1.0: ["x1"], 2.0: ["x2"]}.get(ls, [])
        REC.update(**{f"sens_{imb}_{n}_{k}": v for n in names for k, v in row.items() if k != "imbalance"})
REC.table("sensitivity", sens_rows)
PAPER_ORDER = "Sync > Async > Async+SF > CascadeEP"
cells = [f"{r['imbalance']} ×{r['link_scale']:g}" for r in sens_rows if r["order"] == PAPER_ORDER]
REC.update(
    sens_verdict=(
        f"appears in {len(cells)} of {len(sens_rows)} cells of the sweep: {', '.join(cells)}"
        if cells
        else f"appears in none of the {len(sens_rows)} cells of the sweep"
    )
)
REC.update(
    sens_seeds=len(SENS_SEEDS),
    sens_requests=SWEEP_REQUESTS,
    sens_first=LINK_SCALES[0],
    sens_last=LINK_SCALES[-1],
    fixed_us=costs.fixed_us,
    link_gbps=costs.hardware.link_bytes_per_us / 1e3,
    expert_mb=costs.expert_bytes / 1e6,
    fetch_us=costs.expert_bytes / costs.hardware.fetch_bytes_per_us,
)
print(
    table(
        [
            [
                r["imbalance"],
                f"{r['link_gbps']:.0f}",
                f"{100 * r['r_tail']:.1f}%",
                f"{100 * r['cascade_cut']:.1f}%",
                f"{100 * r['async_cut']:.1f}%",
                f"{100 * r['sf_over_async']:+.1f}%",
                f"{100 * r['oewf_alone']:+.1f}%",
                f"{100 * r['fig9_ge1']:.1f}%",
                r["order"],
            ]
            for r in sens_rows
        ],
        [
            "imbalance",
            "link GB/s",
            "R_tail",
            "CascadeEP cut",
            "Async cut",
            "SF vs Async",
            "OEWF alone",
            "≥1% layers",
            "order",
        ],
        f"{SWEEP_REQUESTS} requests, {len(SENS_SEEDS)} seeds, 0.9 of each seed's capacity "
        f"({time.perf_counter() - t0:.0f} s)",
    )
)
fig, axes = plt.subplots(1, 4, figsize=(16, 3.6))
panels = (
    ("cascade_cut", "CascadeEP mean-TTFT cut vs Sync"),
    ("sf_over_async", "streamFFN: Async+SF vs Async"),
    ("oewf_alone", "OEWF alone: CascadeEP vs Async+SF"),
    ("fig9_ge1", "layer forwards cut ≥ 1% by OEWF"),
)
for ax, (k, title) in zip(axes, panels, strict=True):
    for imb in IMBALANCE:
        rs = [r for r in sens_rows if r["imbalance"] == imb]
        ax.plot([r["link_gbps"] for r in rs], [100 * r[k] for r in rs], marker="o", label=imb)
    ax.axvline(costs.hardware.link_bytes_per_us / 1e3, color="grey", lw=0.8, ls=":")
    ax.set_xscale("log", base=2)
    xs = sorted({r["link_gbps"] for r in sens_rows})
    ax.set_xticks(xs, [f"{x:.0f}\n×{s:g}" for x, s in zip(xs, sorted(LINK_SCALES), strict=True)])
    ax.tick_params(axis="x", which="minor", bottom=False)
    ax.set_xlabel("link bandwidth, GB/s (× the deployment's)")
    ax.set_title(title, fontsize=10)
    ax.set_ylabel("%")
axes[0].legend(title="attention imbalance", fontsize=8)
fig.tight_layout()
fig.savefig(FIGURES / "cascade_sensitivity.png", dpi=120)
plt.show()

# %% [markdown]
# ## Fig. 9 and "OEWF alone", one factor at a time
#
# The paper: OEWF cuts at least 1% of 77.4% of layer forwards and cuts mean TTFT by 7.8% against Async+SF; here
# (contention, reactive, 0.9 of capacity) far less. Each row below moves one factor of the simulated setting from
# ours to the paper's stated value — or, where the paper states none, over a range — and keeps the rest as ours.
# Factors that change Sync's capacity (imbalance, links, routing, combine) are served at 0.9 of each seed's own
# capacity under the change; the others at ours (the same request rates: Sync does not see them). The paper states
# R_tail (28%), the GPUs (B200 over NVLink: NVLink 5 carries 900 GB/s each way; the paper gives no figure) and θ at
# 90% of peak (Fig. 4); it gives no helper buffer size, fetch bandwidth or routing statistics. A fetch crosses the
# same NVLink ports as the dispatch and combine (at their bandwidth, yielding to them), so the fetch bandwidth moves
# with the link row; alone it enters only the helper's prediction of its weights' arrival (Eq. 6), where at our
# 22 µs per expert it does not bind. Last, the stated values together, with our links and with the paper's free
# ones.

# %%
t0 = time.perf_counter()
NVLINK5 = 900e3 / costs.hardware.link_bytes_per_us  # 900 GB/s each way over our 600
PER_RANK = int(costs.experts_per_rank)
STATED = {"attention": "sparse", "key_budget": budget, "link_scale": NVLINK5}
#: factor → (label, [(value label, config changes, served at its own capacity)]), ours first
FACTORS = {
    "imbalance": (
        "attention imbalance",
        [
            ("dense (ours)", {}, False),
            ("R_tail matched (paper's 28%)", {"attention": "sparse", "key_budget": budget}, True),
            ("sparse, model's key budget", {"attention": "sparse"}, True),
        ],
    ),
    "links": (
        "link bandwidth (all transfers)",
        [
            ("600 GB/s (ours)", {}, False),
            ("900 GB/s (NVLink 5)", {"link_scale": NVLINK5}, True),
            ("1,800 GB/s", {"link_scale": 2 * NVLINK5}, True),
        ],
    ),
    "budget": (
        "helper buffer (experts)",
        [
            (f"{costs.hardware.helper_budget_experts} (ours)", {}, False),
            *((f"{n}", {"helper_budget_experts": n}, False) for n in (2, 4, 16, PER_RANK)),
        ],
    ),
    "theta": (
        "θ (fraction of peak)",
        [
            (f"{costs.threshold:,} (ρ 0.9, paper's)", {}, False),
            *(
                (f"{dataclasses.replace(BASE, stream_rho=r).costs().threshold:,} (ρ {r})", {"stream_rho": r}, False)
                for r in (0.8, 0.95)
            ),
        ],
    ),
    "routing": (
        "routing concentration",
        [
            ("recorded (ours)", {}, False),
            *((f"Zipf s = {k}", {"routing": "zipf", "skew": k}, True) for k in (1.0, 1.5)),
        ],
    ),
    "combine": (
        "links model",
        [
            ("contention (ours)", {}, False),
            ("free combine", {"combine_scale": 0.0}, True),
            ("paper's free links", {"links": "paper"}, True),
        ],
    ),
    "commit": ("App. C reading", [("first (ours)", {}, False), ("any", {"commit": "any"}, False)]),
    "estimates": ("estimates", [("fitted (ours)", {}, False), ("exact", {"estimates": "exact"}, False)]),
    "stated": (
        "stated values together",
        [
            ("ours", {}, False),
            ("R_tail 28% + 900 GB/s", STATED, True),
            ("… + free links", {**STATED, "links": "paper"}, True),
        ],
    ),
}
f9_rows = []
for fk, (flabel, values) in FACTORS.items():
    for i, (vlabel, change, own) in enumerate(values):
        cfg = dataclasses.replace(BASE, **change)
        res = seeds(cfg, ("async_sf", "cascade"), at_load(cfg) if own else POINT_CFG["90"][1])
        alone = reduction_summary(res, base="async_sf")["cascade"]
        o = [oewf_rows(res[s_]["cascade"]) for s_ in SEEDS]
        out = [res[s_]["cascade"].oewf_outcomes for s_ in SEEDS]
        ge1 = [x["ge_1pct"] for x in o]
        row = {
            "factor": fk,
            "factor_label": flabel,
            "value": vlabel,
            "ours": i == 0,
            "fig9_ge1": float(np.mean(ge1)),
            "fig9_ge1_lo": bootstrap_ci(ge1)[0],
            "fig9_ge1_hi": bootstrap_ci(ge1)[1],
            "fig9_ge5": float(np.mean([x["ge_5pct"] for x in o])),
            "oewf_alone": alone["value"],
            "oewf_alone_lo": alone["ci95"][0],
            "oewf_alone_hi": alone["ci95"][1],
            "executed_share": sum(x["executed"] for x in out) / max(1, sum(x["moves"] + x["refused"] for x in out)),
        }
        f9_rows.append(row)
        REC.update(**{f"f9_{fk}_{i}_{k}": v for k, v in row.items() if k not in ("factor", "factor_label", "ours")})
REC.table("fig9_factors", f9_rows)
base_row = f9_rows[0]
moved = [r for r in f9_rows if not r["ours"] and r["factor"] != "stated"]
best_ge1 = max(moved, key=lambda r: r["fig9_ge1"])
best_alone = max(moved, key=lambda r: r["oewf_alone"])
close = [
    r
    for r in f9_rows
    if abs(r["fig9_ge1"] - PAPER["oewf_layers"]["ge_1pct"]) <= 0.05
    and abs(r["oewf_alone"] - PAPER["oewf_only_reduction"]["mean"]) <= 0.01
]
REC.update(
    f9_ours_ge1=base_row["fig9_ge1"],
    f9_ours_alone=base_row["oewf_alone"],
    f9_best_ge1=best_ge1["fig9_ge1"],
    f9_best_ge1_at=f"{best_ge1['factor_label']}: {best_ge1['value']}",
    f9_best_alone=best_alone["oewf_alone"],
    f9_best_alone_at=f"{best_alone['factor_label']}: {best_alone['value']}",
    f9_reproduced=(
        "; ".join(f"{r['factor_label']}: {r['value']}" for r in close)
        if close
        else "none (within 5 points of 77.4% and 1 point of 7.8% at once)"
    ),
    nvlink5_scale=NVLINK5,
)
print(
    table(
        [
            [
                r["factor_label"] if r["ours"] else "",
                r["value"],
                f"{100 * r['fig9_ge1']:.1f}% [{100 * r['fig9_ge1_lo']:.1f}, {100 * r['fig9_ge1_hi']:.1f}]",
                f"{100 * r['fig9_ge5']:.1f}%",
                f"{100 * r['oewf_alone']:+.1f}% [{100 * r['oewf_alone_lo']:+.1f}, {100 * r['oewf_alone_hi']:+.1f}]",
                f"{100 * r['executed_share']:.1f}%",
            ]
            for r in f9_rows
        ],
        ["factor", "value", "layers cut ≥ 1%", "≥ 5%", "OEWF alone (mean TTFT)", "decisions executed"],
        f"paper: 77.4% / 23.1% / 7.8%; {len(SEEDS)} seeds of {BASE.max_requests} requests, contention, reactive "
        f"({time.perf_counter() - t0:.0f} s)",
    )
)
fig, axes = plt.subplots(1, 2, figsize=(13, 0.32 * len(f9_rows) + 1.2), sharey=True)
ys = np.arange(len(f9_rows))[::-1]
labels = [f"{r['factor_label']}: {r['value']}" if r["ours"] else r["value"] for r in f9_rows]
for ax, (k, title, paper) in zip(
    axes,
    (
        ("fig9_ge1", "layer forwards OEWF cuts ≥ 1% (Fig. 9)", PAPER["oewf_layers"]["ge_1pct"]),
        ("oewf_alone", "OEWF alone: mean-TTFT cut vs Async+SF", PAPER["oewf_only_reduction"]["mean"]),
    ),
    strict=True,
):
    vals = np.array([100 * r[k] for r in f9_rows])
    lo = np.array([100 * r[f"{k}_lo"] for r in f9_rows])
    hi = np.array([100 * r[f"{k}_hi"] for r in f9_rows])
    colors = ["C7" if r["ours"] else "C0" for r in f9_rows]
    ax.hlines(ys, lo, hi, colors=colors, lw=2, alpha=0.6)
    ax.scatter(vals, ys, c=colors, zorder=3)
    ax.axvline(100 * base_row[k], color="C7", ls=":", lw=1, label="ours")
    ax.axvline(100 * paper, color="C3", ls="--", lw=1, label="paper")
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("% (mean over seeds, 95% CI)")
    ax.grid(alpha=0.3, axis="x")
for y, r in zip(ys, f9_rows, strict=True):
    if r["ours"]:
        for ax in axes:
            ax.axhline(y + 0.5, color="grey", lw=0.5)
axes[0].set_yticks(ys, labels, fontsize=7)
axes[0].legend(fontsize=8, loc="lower right")
fig.tight_layout()
fig.savefig(FIGURES / "cascade_fig9_factors.png", dpi=120)
plt.show()

# %% [markdown]
# **What the sweep says** (the committed full-size run; reading item 10 quotes its numbers, docs/reproduced.md
# discusses them). The link model decides both gaps: a free combine, the paper's free links or a faster link move
# Fig. 9 and OEWF alone furthest, and under the paper's free links OEWF alone lands on the paper's figure. The
# imbalance does not: matching the paper's R_tail lowers both (our dense attention is the more imbalanced). The
# helper buffer, θ, routing concentration, the commit reading and the estimators move Fig. 9 little or the other
# way. No setting reaches Fig. 9's share of layer forwards: that needs a straggler with work to take in nearly every
# layer forward at the paper's R_tail, a per-layer attention spread the paper reports only in aggregate.

# %% [markdown]
# ## Imbalance, estimators, kernel efficiency; sparse attention

# %%
sparse_rates = at_load(dataclasses.replace(BASE, attention="sparse"))  # the same per-seed rates for both models
for links in LINKS:
    pre, key = PRE[links], REACTIVE[links]
    runs0 = [grid[key, "90"][s] for s in SEEDS]
    REC.update(
        **{
            f"{pre}r_tail": float(np.mean([r["sync"].tail_ratio for r in runs0])),
            f"{pre}attention_accuracy": float(np.mean([r["cascade"].attention_accuracy for r in runs0])),
            f"{pre}token_accuracy": float(np.mean([r["cascade"].token_accuracy for r in runs0])),
            f"{pre}ffn_efficiency": float(np.mean([r["async_sf"].ffn_efficiency for r in runs0])),
            f"{pre}alb_sync": float(np.mean([r["sync"].prefill.alb_mean for r in runs0])),
        }
    )
    sparse_cfg = dataclasses.replace(BASE, links=links, attention="sparse")
    sparse_runs = seeds(sparse_cfg, rates=sparse_rates)
    sparse = reduction_summary(sparse_runs)
    sparse_tail = float(np.mean([sparse_runs[k]["sync"].tail_ratio for k in SEEDS]))
    REC.update(
        **{
            f"{pre}sparse_cut": sparse["cascade"]["value"],
            f"{pre}sparse_cut_lo": sparse["cascade"]["ci95"][0],
            f"{pre}sparse_cut_hi": sparse["cascade"]["ci95"][1],
            f"{pre}sparse_r_tail": sparse_tail,
        }
    )
REC.update(
    paper_r_tail=PAPER["tail_ratio"][0],
    paper_attention_accuracy=PAPER["attention_accuracy"],
    paper_token_accuracy=PAPER["token_accuracy"],
    paper_ffn_efficiency=PAPER["ffn_efficiency"],
)
v = REC.values
paper_rows = [
    [
        "throughput vs Sync: Async / Async+SF / CascadeEP (contention, reactive)",
        "1.034 / 1.113 / 1.166",
        " / ".join(f"{v[f'thr_c_r_{m}']:.3f}" for m in MODES[1:]),
    ],
    [
        "the same, paper links, planned",
        "1.034 / 1.113 / 1.166",
        " / ".join(f"{v[f'thr_p_p_{m}']:.3f}" for m in MODES[1:]),
    ],
    [
        "CascadeEP TTFT avg / p95 cut vs Sync (contention, reactive)",
        "23.1% / 26.0%",
        f"{100 * v['cut_c_r_90_cascade']:.1f}% / {100 * v['p95cut_c_r_90_cascade']:.1f}%",
    ],
    [
        "the same, paper links, planned",
        "23.1% / 26.0%",
        f"{100 * v['cut_p_p_90_cascade']:.1f}% / {100 * v['p95cut_p_p_90_cascade']:.1f}%",
    ],
    [
        "OEWF alone (CascadeEP vs Async+SF) avg / p95",
        "7.8% / 6.2%",
        f"{100 * v['oewf_alone_mean']:.1f}% / {100 * v['oewf_alone_p95']:.1f}%",
    ],
    [
        "Fig. 9 cut ≥ 1% / ≥ 5% / max (contention; paper links)",
        "77.4% / 23.1% / 10.87%",
        f"{100 * v['fig9_c_r_ge1']:.1f}% / {100 * v['fig9_c_r_ge5']:.1f}% / {100 * v['fig9_c_r_max']:.2f}%; "
        f"{100 * v['fig9_p_r_ge1']:.1f}% / {100 * v['fig9_p_r_ge5']:.1f}% / {100 * v['fig9_p_r_max']:.2f}%",
    ],
    ["long-tail ratio R_tail (Sync)", "28.0% / 28.86%", f"{100 * v['r_tail']:.1f}%"],
    ["attention estimator accuracy (online; fit on App. B's grid)", "90.3%", f"{100 * v['attention_accuracy']:.1f}%"],
    ["token-count estimator accuracy (previous layer)", "85.9%", f"{100 * v['token_accuracy']:.1f}%"],
    ["streamFFN matched-work FFN efficiency", "97.3%", f"{100 * v['ffn_efficiency']:.1f}%"],
]
REC.table("paper", [{"quantity": q, "paper": p, "here": h} for q, p, h in paper_rows])
print(table(paper_rows, ["quantity", "paper", "here"], "paper vs here (load 0.9, mean over seeds)"))

# %%
REC.reading("""
**Reading.** Mean over {seeds} seeds of {requests} requests (DeepSeek-V4-Flash), each seed its own workload
(the trace's seed-th window of {requests} requests — no request in two seeds' runs —, recorded layers, expert
layout; seed 0 the recording as it is), {ci_level:.0%} bootstrap intervals in brackets; an ordering is claimed only
from paired per-seed differences (interval excludes 0, sign test p < {alpha}: at least 6 seeds), for the mean and,
separately, for the p95 TTFT. Each seed's operating points come from its own Sync capacity
({capacity_rps_lo:.2f}–{capacity_rps_hi:.2f} req/s): the recorded rate (a load of {rec_load_lo:.2f}–{rec_load_hi:.2f}
of capacity; {rec_overloaded} seed(s) overloaded); R_tail (App. A: readiness gaps at dispatch *entry* over
wall-clock time) matched to the paper's {target_r_tail:.0%} over the seeds (sparse attention, key budget
{tail_budget:,}: R_tail {tail_found:.1%}, from {tail_lo:.1%} to {tail_hi:.1%} by seed, at {tail_rate_lo:.2f}–
{tail_rate_hi:.2f} req/s); 0.9 of each seed's capacity. Previously one capacity (seed 0's) and one matched rate
served every seed, and R_tail was measured at dispatch completion over busy time.

1. *Headline (contention, reactive)*: CascadeEP cuts mean TTFT by {cut_c_r_rec_cascade:.1%}
   [{cut_c_r_rec_cascade_lo:.1%}, {cut_c_r_rec_cascade_hi:.1%}] at the recorded rate ({order_c_r_rec}),
   {cut_c_r_tail_cascade:.1%} [{cut_c_r_tail_cascade_lo:.1%}, {cut_c_r_tail_cascade_hi:.1%}] at the paper's
   imbalance ({order_c_r_tail}) and {cut_c_r_90_cascade:.1%} [{cut_c_r_90_cascade_lo:.1%},
   {cut_c_r_90_cascade_hi:.1%}] at 0.9 of capacity ({order_c_r_90}); paper {paper_ttft_mean_cut:.1%}. p95 TTFT:
   {p95cut_c_r_90_cascade:.1%} at 0.9 ({order95_c_r_90}, ordered on paired p95s); paper {paper_ttft_p95_cut:.1%}.
   Previously {prev_cut_rec:.1%} / {prev_cut_tail:.1%} / {prev_cut:.1%} [{prev_cut_lo:.1%}, {prev_cut_hi:.1%}]
   ({prev_order} at 0.9). Async − Async+SF, paired: {async_minus_sf_c_r_90:+.4f} s
   [{async_minus_sf_c_r_90_lo:+.4f}, {async_minus_sf_c_r_90_hi:+.4f}] (sign test p = {async_minus_sf_c_r_90_p:.3f})
   at 0.9 of capacity, {async_minus_sf_c_r_rec:+.4f} s (p = {async_minus_sf_c_r_rec_p:.3f}) at the recorded rate
   (negative: Async ahead; at light load streamFFN's threshold holds small batches back until the final flush).
   Throughput at capacity: CascadeEP {thr_c_r_cascade:.3f}× [{thr_c_r_cascade_lo:.3f}, {thr_c_r_cascade_hi:.3f}]
   Sync (previously {prev_thr:.3f}×; paper {paper_thr_cascade:.3f}×).
2. *The JAX layer's own schedule* (launch = layer: one partition shared by every rank): {cut_c_l_rec_cascade:.1%} /
   {cut_c_l_tail_cascade:.1%} / {cut_c_l_90_cascade:.1%} at the three points ({order_c_l_90} at 0.9), against
   planned per destination {cut_c_p_rec_cascade:.1%} / {cut_c_p_tail_cascade:.1%} / {cut_c_p_90_cascade:.1%}
   ({order_c_p_90}) and reactive {cut_c_r_rec_cascade:.1%} / {cut_c_r_tail_cascade:.1%} /
   {cut_c_r_90_cascade:.1%}: what sharing one schedule costs is the gap between the first two.
   Under the paper's free links: reactive {cut_p_r_90_cascade:.1%}, planned {cut_p_p_90_cascade:.1%}
   [{cut_p_p_90_cascade_lo:.1%}, {cut_p_p_90_cascade_hi:.1%}] at 0.9 ({order_p_p_90}).
3. *Where the gains come from*, on per-layer time with the same inputs (equal utilisation), as shares of Sync's
   forward time (contention, reactive; recorded / R_tail matched / 0.9): early FFN {attr_early_ffn_rec:.2%} /
   {attr_early_ffn_tail:.2%} / {attr_early_ffn_90:.2%} [{attr_early_ffn_90_lo:.2%}, {attr_early_ffn_90_hi:.2%}],
   combine overlap {attr_combine_overlap_rec:.2%} / {attr_combine_overlap_tail:.2%} / {attr_combine_overlap_90:.2%}
   [{attr_combine_overlap_90_lo:.2%}, {attr_combine_overlap_90_hi:.2%}], OEWF {attr_oewf_rec:.2%} /
   {attr_oewf_tail:.2%} / {attr_oewf_90:.2%} [{attr_oewf_90_lo:.2%}, {attr_oewf_90_hi:.2%}] (previously OEWF
   {prev_oewf_attr:.2%} at 0.9); under the paper's links at 0.9: {plinks_attr_early_ffn_90:.2%} /
   {plinks_attr_combine_overlap_90:.2%} / {plinks_attr_oewf_90:.2%}.
4. *OEWF as App. C commits it*: donors are the ranks still in attention (§3.3), a move commits only in a protected
   interval of the helper's GPU that delays none of its own kernels, and a fetch yields to every transfer (App. E).
   {longer_c_r} of {layers_c_r} OEWF layer forwards got longer ({longer_share_c_r:.1%} of those OEWF changed);
   of {moves_c_r} accepted moves {executed_c_r} ran on their helper, {abandoned_c_r} were abandoned at commit (the
   weights came in time but the helper's GPU had no protected interval) and {dropped_c_r} dropped at execution (the
   weights came after the donor's dispatch left, so its FFN ran the tokens); {refused_c_r} helper decisions found no
   move and fetched nothing. Served FIFO: {longer_f_r} longer ({longer_share_f_r:.1%}). Previously {prev_longer}
   ({prev_longer_share:.1%}; {prev_moves} moves, {prev_dropped} abandoned or dropped, not told apart).
   OEWF alone cuts mean TTFT by {oewf_alone_mean:.1%} [{oewf_alone_mean_lo:.1%}, {oewf_alone_mean_hi:.1%}]
   against Async+SF (previously {prev_oewf_alone:.1%}; paper
   {paper_oewf_alone_mean:.1%}), {oewf_alone_exact:.1%} with exact estimates; it cuts at least {fig9_threshold:.0%}
   of {fig9_c_r_ge1:.1%} of layer forwards (previously {prev_fig9_ge1:.1%}; paper {paper_fig9_ge1:.1%};
   {fig9_p_r_ge1:.1%} under free links).
5. *Trace sizes*: CascadeEP's cut is {size0_cut:.1%} [{size0_cut_lo:.1%}, {size0_cut_hi:.1%}] at {size0_n}
   requests as recorded ({size0_order}), {size2_cut:.1%} [{size2_cut_lo:.1%}, {size2_cut_hi:.1%}] at {size2_n}
   ({size2_order}) and {size4_cut:.1%} [{size4_cut_lo:.1%}, {size4_cut_hi:.1%}] at all {size4_n} requests
   ({size4_order}); at 0.9 of capacity {size1_cut:.1%} ({size1_n}) and {size3_cut:.1%} ({size3_n}). Under the
   paper's links: {plinks_size0_cut:.1%} / {plinks_size1_cut:.1%} and {plinks_size2_cut:.1%} /
   {plinks_size3_cut:.1%}.
6. *Models* (CascadeEP's mean-TTFT cut at 0.9 of each model's capacity, per seed): V4-Flash
   {deepseek_v4_flash_cut:.1%} [{deepseek_v4_flash_cut_lo:.1%}, {deepseek_v4_flash_cut_hi:.1%}], V4-Pro
   {deepseek_v4_pro_cut:.1%} [{deepseek_v4_pro_cut_lo:.1%}, {deepseek_v4_pro_cut_hi:.1%}]
   ({deepseek_v4_pro_order}), GLM-5.3 {glm_5_3_cut:.1%} [{glm_5_3_cut_lo:.1%}, {glm_5_3_cut_hi:.1%}]
   ({glm_5_3_order}); under the paper's links {plinks_deepseek_v4_flash_cut:.1%} /
   {plinks_deepseek_v4_pro_cut:.1%} / {plinks_glm_5_3_cut:.1%}.
7. *Estimators and imbalance*: the attention fit is {attention_accuracy:.1%} accurate online (paper
   {paper_attention_accuracy:.1%}; {fit_profile_accuracy:.1%} on its own profile), token counts
   {token_accuracy:.1%} (paper {paper_token_accuracy:.1%}); R_tail (App. A) {r_tail_c_r_90:.1%} at 0.9 of capacity
   ({r_tail_c_r_90_lo:.1%}–{r_tail_c_r_90_hi:.1%} by seed) and {r_tail_c_r_rec:.1%} at the recorded rate
   (previously {prev_r_tail:.1%} at 0.9 on busy time; paper {paper_r_tail:.0%}); streamFFN's matched-work efficiency
   {ffn_efficiency:.1%} (paper {paper_ffn_efficiency:.1%}). With the model's sparse attention R_tail is
   {sparse_r_tail:.1%} and CascadeEP cuts {sparse_cut:.1%} [{sparse_cut_lo:.1%}, {sparse_cut_hi:.1%}]
   ({plinks_sparse_cut:.1%} under the paper's links).
   Placement (Fig. 6 shape): CascadeEP's p95 speedup goes from {sweep_round_robin_lo:.2f}× to
   {sweep_round_robin_hi:.2f}× under round-robin and {sweep_least_loaded_lo:.2f}× to {sweep_least_loaded_hi:.2f}×
   under least-loaded from load {load_lo} to {load_hi} of each seed's capacity; under the paper's links
   {plinks_sweep_round_robin_lo:.2f}× to {plinks_sweep_round_robin_hi:.2f}×.
8. *Why the ablation departs from the paper, and where it does not* (`cascade_sensitivity.png`; {sens_seeds} seeds
   of {sens_requests} requests at 0.9 of each seed's capacity in every cell). Two assumptions of the testbed decide
   it in this model; θ ({theta} tokens, Fig. 4's calibration) and the expert size ({expert_mb:.1f} MB, V4-Flash's
   shapes) are the paper's own and are not swept.
   - *Link bandwidth* (ours {link_gbps:.0f} GB/s per port, swept ×{sens_first} to ×{sens_last}). The combine costs
     bytes over the link, so on a slow link most of what launching early gains is the combine leaving early (item
     3), and streamFFN's batching — which holds small kernels back until θ — holds their combines back too: at
     our bandwidth, R_tail matched, Async+SF against Async is {sens_matched_x1_sf_over_async:+.1%} and the order
     {sens_matched_x1_order}. At twice the bandwidth the combine is cheap, the fixed cost of many small per-source
     kernels (F(N) = {fixed_us:.0f} µs + N / peak) dominates, and streamFFN's batching pays:
     {sens_matched_x2_sf_over_async:+.1%} ({sens_matched_x2_order}; dense attention {sens_dense_x2_order}); at
     ×{sens_last} Async alone is {sens_matched_last_async_cut:+.1%} against Sync and Async+SF
     {sens_matched_last_sf_over_async:+.1%} against Async. An expert takes {fetch_us:.0f} µs to fetch at our
     bandwidth; a helper's fetch must land before its donor's FFN starts, so the share of layer forwards OEWF
     cuts by at least {fig9_threshold:.0%} grows with the bandwidth: {sens_matched_x1_fig9_ge1:.1%} at ×1,
     {sens_matched_x2_fig9_ge1:.1%} at ×2, {sens_matched_last_fig9_ge1:.1%} at ×{sens_last} (paper
     {paper_fig9_ge1:.1%}); OEWF alone {sens_matched_x1_oewf_alone:+.1%} / {sens_matched_x2_oewf_alone:+.1%} /
     {sens_matched_last_oewf_alone:+.1%}.
   - *Attention imbalance* (sparse attention with the model's key budget, R_tail matched, dense): R_tail
     {sens_sparse_x1_r_tail:.1%} / {sens_matched_x1_r_tail:.1%} / {sens_dense_x1_r_tail:.1%} at our bandwidth, and
     CascadeEP's cut {sens_sparse_x1_cascade_cut:.1%} / {sens_matched_x1_cascade_cut:.1%} /
     {sens_dense_x1_cascade_cut:.1%}: there is idle time to turn into work only where the replicas wait for each
     other; with the model's own sparse attention the order is {sens_sparse_x2_order} even at twice the bandwidth.
   The paper's ordering (Sync > Async > Async+SF > CascadeEP, claimed from paired differences) {sens_verdict};
   where our headline figures depart from the paper's, the sweep points at these two conditions of the testbed.
9. *App. C's two readings* (contention, reactive; `commit="first"`, the default, against `"any"`): CascadeEP's
   mean-TTFT cut {cut_c_r_rec_cascade:.1%} / {any_cut_rec_c_r:.1%} at the recorded rate, {cut_c_r_tail_cascade:.1%} /
   {any_cut_tail_c_r:.1%} at R_tail matched, {cut_c_r_90_cascade:.1%} / {any_cut_90_c_r:.1%} at 0.9 of capacity
   ({order_c_r_90} / {any_order_90_c_r}); p95 {p95cut_c_r_90_cascade:.1%} / {any_p95_cut_90_c_r:.1%}; throughput
   {thr_c_r_cascade:.3f}× / {any_thr_c_r:.3f}×; OEWF alone {oewf_alone_mean:.1%} / {any_oewf_alone_c_r:.1%}; layer
   forwards cut ≥ {fig9_threshold:.0%} {fig9_c_r_ge1:.1%} / {any_fig9_ge1_c_r:.1%}, made longer {longer_c_r} /
   {any_longer_c_r}; moves executed {executed_c_r} / {any_executed_c_r}, abandoned at commit {abandoned_c_r} /
   {any_abandoned_c_r}, dropped at execution {dropped_c_r} / {any_dropped_c_r}. The spread (any − first:
   {any_spread_cut_90_c_r:+.2%} on the cut at 0.9, {any_spread_oewf_alone_c_r:+.2%} on OEWF alone,
   {any_spread_fig9_ge1_c_r:+.2%} on Fig. 9) is the reading's uncertainty; the other link and launch models are in
   the table `commit_readings`. The default stays "first": App. C validates one interval when the weights are ready —
   "a protected interval that accommodates the complete helper invocation" — and on failure the work "is abandoned
   and execution remains with the current owner"; it describes no search of later intervals, and a kernel placed
   after the helper's later work would run when the donor may already have finished it.
10. *Fig. 9 and OEWF alone, one factor at a time* (`cascade_fig9_factors.png`, the table `fig9_factors`; paper
   {paper_fig9_ge1:.1%} of layer forwards cut ≥ {fig9_threshold:.0%}, OEWF alone {paper_oewf_alone_mean:.1%}). Ours:
   {f9_ours_ge1:.1%} / {f9_ours_alone:+.1%}. Moving one factor: R_tail matched {f9_imbalance_1_fig9_ge1:.1%} /
   {f9_imbalance_1_oewf_alone:+.1%} (sparse {f9_imbalance_2_fig9_ge1:.1%} / {f9_imbalance_2_oewf_alone:+.1%}); links
   at NVLink 5's 900 GB/s {f9_links_1_fig9_ge1:.1%} / {f9_links_1_oewf_alone:+.1%}, at 1,800 GB/s
   {f9_links_2_fig9_ge1:.1%} / {f9_links_2_oewf_alone:+.1%}; a helper buffer of {f9_budget_1_value} /
   {f9_budget_2_value} / {f9_budget_3_value} / {f9_budget_4_value} experts {f9_budget_1_fig9_ge1:.1%} /
   {f9_budget_2_fig9_ge1:.1%} / {f9_budget_3_fig9_ge1:.1%} / {f9_budget_4_fig9_ge1:.1%}; θ {f9_theta_1_value} /
   {f9_theta_2_value} {f9_theta_1_fig9_ge1:.1%} / {f9_theta_2_fig9_ge1:.1%}; Zipf routing s = 1.0 / 1.5
   {f9_routing_1_fig9_ge1:.1%} / {f9_routing_2_fig9_ge1:.1%}; a free combine {f9_combine_1_fig9_ge1:.1%} /
   {f9_combine_1_oewf_alone:+.1%}, the paper's free links {f9_combine_2_fig9_ge1:.1%} /
   {f9_combine_2_oewf_alone:+.1%}; commit "any" {f9_commit_1_fig9_ge1:.1%}; exact estimates
   {f9_estimates_1_fig9_ge1:.1%} / {f9_estimates_1_oewf_alone:+.1%}. Furthest toward the paper's Fig. 9:
   {f9_best_ge1_at} ({f9_best_ge1:.1%}); toward its OEWF alone: {f9_best_alone_at} ({f9_best_alone:+.1%}). The stated
   values together (R_tail matched, 900 GB/s): {f9_stated_1_fig9_ge1:.1%} / {f9_stated_1_oewf_alone:+.1%}; with the
   paper's free links {f9_stated_2_fig9_ge1:.1%} / {f9_stated_2_oewf_alone:+.1%}. Settings within reach of both paper
   figures at once: {f9_reproduced}.
""")

# %%
print(f"notebook time {time.perf_counter() - t_start:.1f} s (SMALL={SMALL})")
