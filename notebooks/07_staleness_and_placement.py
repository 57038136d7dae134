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
# # Staleness and placement (TEMPO §5.5, §5.6, §5.12; Table 10)
#
# Three replays on the proxy setting (EP8, proxy three-term model, B = tokens per step; see notebook 04):
#
# 1. **Information regimes (§5.5).** The theory solves the current batch; the deployment solves the previous
#    window's counts. TEMPO with *exact* (current), *stale-1* (previous window) and *frozen* (first window)
#    counts — a stale solution's per-expert split fractions applied to the true counts
#    (`tempo_jax.sim.tempo.replay.apply_split`) — against *uniform* (no information: EPLB-even), all relative to
#    static on the same window. Fresh and drift-16 placements, R = 16 and 64, token scales 1× and 4× (§5.5's
#    "stable across R and 1–4× scale").
# 2. **Drift-K (§5.12, §5.15).** Placement and static map built from a recording whose top-K hot experts'
#    statistics were swapped with random cold ones (K = 8/16/32), serving the true traffic.
# 3. **Faster EPLB (§5.6, Table 10).** The drift-16 timeline with the placement rebuilt every 16 windows from
#    cumulative observed counts (cum16) or every 4 from the trailing 4 windows (w4), vs never refreshed.
#    Needs long streams: synthetic Zipf(1.2) streams with slowly drifting popularity (FLAME-MoE has 16 windows
#    per layer at B = 128, too few for a 16-window refresh).
#
# The numbers quoted below are recorded in `results/notebooks/07_staleness_and_placement.json`. `SMALL=1` keeps
# few windows per stream.

# %%
import dataclasses
import os
import time

import matplotlib.pyplot as plt
import numpy as np

from tempo_jax.repro import Recorder, figures_dir
from tempo_jax.sim import (
    InformationConfig,
    PolicyConfig,
    RefreshConfig,
    SyntheticStreams,
    information_tables,
    run_policies,
    run_refresh,
)
from tempo_jax.sim.tempo.replay_summary import LABELS, PAPER, drift_table, refresh_table
from tempo_jax.text import table

SMALL = os.environ.get("SMALL", "0") == "1"
FIGURES = figures_dir()
REC = Recorder("07_staleness_and_placement")
t_start = time.perf_counter()

SYN = SyntheticStreams(streams=1, windows=3) if SMALL else SyntheticStreams(streams=4, windows=32)
INFO = InformationConfig(
    tokens_per_step=(128, 512),
    scales=(1.0, 4.0),
    drifts=(0, 16),
    redundants=(64,) if SMALL else (16, 64),
    max_windows=3 if SMALL else None,
)
WORKERS = 1 if SMALL else 2
DRIFT = PolicyConfig(
    tokens_per_step=(128, 512),
    drifts=(0, 16, 32) if SMALL else (0, 8, 16, 32),
    policies=("static", "uniform", "token_lp", "tempo"),
    max_windows=1 if SMALL else None,
)
REFRESH = RefreshConfig(
    synthetic=SyntheticStreams(streams=1, windows=20) if SMALL else SyntheticStreams(streams=4, windows=64),
    tokens_per_step=(128, 512),
)
SOURCES = {"FLAME": {}, "Zipf1.2": {"source": "synthetic", "synthetic": SYN}}

# %% [markdown]
# ## 1. Information regimes

# %%
t0 = time.perf_counter()
info = information_tables(INFO, SOURCES, workers=WORKERS, progress=not SMALL)
print(f"{' and '.join(SOURCES)}: {time.perf_counter() - t0:.1f} s")
rows = []
KEY = ("redundant", "scale", "drift", "B")
for lab in SOURCES:
    for key in dict.fromkeys(tuple(t[k] for k in KEY) for t in info[lab]):
        sel = {t["regime"]: t for t in info[lab] if tuple(t[k] for k in KEY) == key}
        cells = [f"{sel[r]['mean']:.3f} ({sel[r]['median']:.3f})" for r in ("exact", "stale", "frozen", "uniform")]
        kept = f"{100 * sel['stale']['retained']:.0f}% / {100 * sel['frozen']['retained']:.0f}%"
        rows.append([lab, *key, *cells, kept])
rows.append(["paper", 64, "1–4", "?", "decode", "0.78 (0.80)", "0.85", "0.89", "1.09", "75–85% / 70–80%"])
print(
    table(
        rows,
        ["routing", "R", "scale", "K", "B", "exact", "stale-1", "frozen", "uniform", "gain kept stale/frozen"],
        "§5.5: makespan / static, mean (median) over windows t ≥ 1",
    )
)
for lab, src in (("FLAME", "flame"), ("Zipf1.2", "zipf")):
    REC.table(f"info_{src}", info[lab])
    for t in info[lab]:
        k = f"info_{src}_r{t['redundant']}_x{t['scale']:g}_k{t['drift']}_b{t['B']}_{t['regime']}"
        REC.update(**{k: t["mean"], f"{k}_median": t["median"]})
        if t["regime"] in ("stale", "frozen"):
            REC.value(f"{k}_kept", t["retained"])
    # Decode scale (the smallest B at 1×) vs traffic-bound rows (larger B or 4× tokens), fresh vs drifted placement.
    stale = [t for t in info[lab] if t["regime"] == "stale"]
    groups = {
        "decode": [t for t in stale if t["B"] == INFO.tokens_per_step[0] and t["scale"] == 1.0],
        "traffic_fresh": [
            t for t in stale if (t["B"], t["scale"]) != (INFO.tokens_per_step[0], 1.0) and t["drift"] == 0
        ],
        "traffic_drift": [
            t for t in stale if (t["B"], t["scale"]) != (INFO.tokens_per_step[0], 1.0) and t["drift"] > 0
        ],
    }
    for name, rows_ in groups.items():
        kept = [t["retained"] for t in rows_]
        REC.update(**{f"info_{src}_{name}_kept_lo": min(kept), f"info_{src}_{name}_kept_hi": max(kept)})
REC.update(**{f"paper_info_{k}": v for k, v in PAPER["information"].items()})
REC.update(paper_info_kept=PAPER["information_retained"]["stale"])

# %%
regimes = ("exact", "stale", "frozen", "uniform")
fig, axes = plt.subplots(1, len(SOURCES), figsize=(15, 4.2), sharey=True)
for ax, lab in zip(axes, SOURCES, strict=True):
    keys = list(dict.fromkeys(tuple(t[k] for k in KEY) for t in info[lab]))
    x = np.arange(len(keys))
    for k, reg in enumerate(regimes):
        vals = [
            next(t for t in info[lab] if tuple(t[c] for c in KEY) == key and t["regime"] == reg)["mean"] for key in keys
        ]
        ax.bar(x + (k - 1.5) * 0.2, vals, 0.19, color=f"C{k}", label=reg)
        ax.axhline(PAPER["information"][reg], color=f"C{k}", ls=":", lw=1)
    ax.axhline(1.0, color="0.3", lw=0.8)
    ax.set_xticks(x, [f"R={R}\n{sc:g}×\nK={K}\nB={B}" for R, sc, K, B in keys], fontsize=7)
    ax.set_title(f"here: {lab} (dotted: paper)")
    ax.grid(axis="y", alpha=0.3)
top = max([t["mean"] for lab in SOURCES for t in info[lab]] + list(PAPER["information"].values()))
axes[0].set_ylim(0, 1.05 * top)  # from zero (shared): bar heights are ratios to static
axes[0].set_ylabel("makespan / static (mean)")
axes[0].legend(fontsize=8, loc="lower left")
fig.suptitle("§5.5: exact, stale-1, frozen and no information")
fig.tight_layout()
fig.savefig(FIGURES / "sec55_information_regimes.png", dpi=120)
plt.show()

# %% [markdown]
# ## 2. Drift-K placements

# %%
drift = {}
for label, over in SOURCES.items():
    drift[label] = drift_table(
        run_policies(dataclasses.replace(DRIFT, **over), workers=WORKERS, progress=not SMALL), DRIFT.policies
    )
rows = []
for lab in SOURCES:
    for t in drift[lab]:
        if t["policy"] != "static":
            continue
        sel = {s["policy"]: s for s in drift[lab] if (s["drift"], s["B"]) == (t["drift"], t["B"])}
        cells = [f"{sel[p]['vs_static']:.3f} / {sel[p]['vs_fresh_static']:.3f}" for p in DRIFT.policies[1:]]
        rows.append([lab, t["B"], t["drift"], f"{sel['static']['vs_fresh_static']:.3f}", *cells])
heads = ["routing", "B", "K", "static / fresh static"]
heads += [f"{LABELS[p]}: vs static / vs fresh" for p in DRIFT.policies[1:]]
print(table(rows, heads, "drift-K (R = 64): median makespan vs same-placement static and vs fresh-placement static"))
for lab, src in (("FLAME", "flame"), ("Zipf1.2", "zipf")):
    REC.table(f"drift_{src}", drift[lab])
    st = [t for t in drift[lab] if t["policy"] == "static" and t["drift"] > 0]
    REC.update(
        **{
            f"drift_{src}_static_max": max(t["vs_fresh_static"] for t in st),
            f"drift_{src}_static_max_b": max(st, key=lambda t: t["vs_fresh_static"])["B"],
        }
    )
    for t in drift[lab]:
        REC.value(f"drift_{src}_{t['policy']}_k{t['drift']}_b{t['B']}", t["vs_fresh_static"])

# %%
fig, axes = plt.subplots(1, 2, figsize=(12, 4), sharey=True)
for ax, B in zip(axes, DRIFT.tokens_per_step, strict=True):
    for k, p in enumerate(DRIFT.policies):
        for lab, style in zip(SOURCES, ("-o", "--s"), strict=True):
            t = [s for s in drift[lab] if s["policy"] == p and s["B"] == B]
            ax.plot(
                [s["drift"] for s in t],
                [s["vs_fresh_static"] for s in t],
                style,
                color=f"C{k}",
                label=f"{LABELS[p]} ({lab})",
            )
    ax.axhline(1.0, color="0.3", lw=0.8)
    ax.set_xticks(DRIFT.drifts)
    ax.set_xlabel("drift K (hot experts swapped)")
    ax.set_title(f"B = {B}")
    ax.grid(alpha=0.3)
axes[0].set_ylabel("median makespan / static on the fresh placement")
axes[1].legend(fontsize=7, ncol=2)
fig.suptitle("drift-K: what a stale placement costs, and how much dispatch wins back (solid FLAME, dashed Zipf 1.2)")
fig.tight_layout()
fig.savefig(FIGURES / "drift_k.png", dpi=120)
plt.show()

# %% [markdown]
# ## 3. Faster EPLB refresh (Table 10)

# %%
t0 = time.perf_counter()
ref = refresh_table(run_refresh(REFRESH, workers=WORKERS, progress=not SMALL))
print(f"refresh: {time.perf_counter() - t0:.1f} s")
order = ["static+never", "uniform+never", "uniform+cum16", "static+cum16", "tempo+never", "tempo+cum16", "tempo+w4"]
order += [t["policy"] for t in ref if t["B"] == REFRESH.tokens_per_step[0] and t["policy"] not in order]
rows = []
for col in order:
    row = [col]
    for B in REFRESH.tokens_per_step:
        t = next(t for t in ref if t["B"] == B and t["policy"] == col)
        paper = "—" if not np.isfinite(t["paper_median"]) else f"{t['paper_median']:.2f}/{t['paper_p95']:.2f}"
        row += [paper, f"{t['median']:.2f}/{t['p95']:.2f}"]
    rows.append(row)
heads = [h for B in REFRESH.tokens_per_step for h in (f"B={B} paper", f"B={B} here")]
print(table(rows, ["policy+refresh", *heads], "Table 10: median/p95 vs never-refreshed static (Zipf 1.2, drift-16)"))
REC.table("table10", ref)
for t in ref:
    k = f"t10_{t['B']}_{t['policy'].replace('+', '_')}"
    REC.update(**{k: t["median"], f"{k}_p95": t["p95"]})
    if np.isfinite(t["paper_median"]):
        REC.update(**{f"paper_{k}": t["paper_median"], f"paper_{k}_p95": t["paper_p95"]})

# %%
fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), sharey=True)
for ax, B in zip(axes, REFRESH.tokens_per_step, strict=True):
    x = np.arange(len(order))
    t = [next(s for s in ref if s["B"] == B and s["policy"] == c) for c in order]
    ax.bar(x - 0.2, [s["median"] for s in t], 0.38, color="C0", label="here: median")
    ax.errorbar(
        x - 0.2,
        [s["median"] for s in t],
        yerr=[np.zeros(len(t)), [s["p95"] - s["median"] for s in t]],
        fmt="none",
        ecolor="k",
        lw=0.8,
    )
    ax.bar(x + 0.2, [s["paper_median"] for s in t], 0.38, color="C1", alpha=0.7, label="paper: median")
    ax.axhline(1.0, color="0.3", lw=0.8)
    ax.set_xticks(x, order, rotation=40, ha="right", fontsize=8)
    ax.set_title(f"B = {B}")
    ax.grid(axis="y", alpha=0.3)
axes[0].set_ylabel("makespan / never-refreshed static (whisker: p95)")
axes[0].legend(fontsize=8)
fig.suptitle("Table 10: dispatch vs refreshing the placement faster (drift-16 timeline)")
fig.tight_layout()
fig.savefig(FIGURES / "table10_refresh.png", dpi=120)
plt.show()

# %%
v = REC.values
REC.claim(
    "stale_keeps_most_at_decode_little_when_traffic_bound_fresh",
    v["info_zipf_traffic_fresh_kept_hi"] < 0.5 < v["info_zipf_decode_kept_lo"],
)
REC.claim("refresh_alone_helps_at_512", v["t10_512_uniform_cum16"] < 1.0)
REC.claim(
    "tempo_on_refreshed_best_at_512",
    min(v["t10_512_tempo_cum16"], v["t10_512_tempo_w4"])
    <= min(
        v[f"t10_512_{k}"] for k in ("static_never", "uniform_never", "uniform_cum16", "static_cum16", "tempo_never")
    ),
)
REC.claim("refresh_does_not_help_static_at_128", v["t10_128_static_cum16"] >= 1.0)
REC.reading("""
**Reading.** The paper's setting (decode scale, R = 64, drift-16) is closest to our Zipf(1.2) rows with R = 64,
K = 16, B = 128, scale 1×: exact {info_zipf_r64_x1_k16_b128_exact:.2f}, stale-1
{info_zipf_r64_x1_k16_b128_stale:.2f}, frozen {info_zipf_r64_x1_k16_b128_frozen:.2f}, uniform
{info_zipf_r64_x1_k16_b128_uniform:.2f} of static, stale-1 keeping {info_zipf_r64_x1_k16_b128_stale_kept:.0%} of the
exact gain (paper: {paper_info_exact:.2f}, {paper_info_stale:.2f}, {paper_info_frozen:.2f},
{paper_info_uniform:.2f}; {paper_info_kept}) — not tuned. The paper's "stable across R and 1–4× scale" holds
only at decode scale: at B = 128 and 1× stale-1 keeps {info_zipf_decode_kept_lo:.0%}–{info_zipf_decode_kept_hi:.0%}
of the exact gain on Zipf (R = 16 / 64, fresh or drifted; FLAME {info_flame_decode_kept_lo:.0%}–
{info_flame_decode_kept_hi:.0%}), but once the batch is traffic-bound (B = 512, or 4× the tokens) on a fresh
placement it keeps {info_zipf_traffic_fresh_kept_lo:.0%}–{info_zipf_traffic_fresh_kept_hi:.0%} (FLAME
{info_flame_traffic_fresh_kept_lo:.0%}–{info_flame_traffic_fresh_kept_hi:.0%}; negative: worse than static): the
gain there lives in token-exact splits, which one window of noise undoes. On the drifted placement the traffic-bound
gain is mostly the placement repair, which stale counts know as well as exact ones
({info_zipf_traffic_drift_kept_lo:.0%}–{info_zipf_traffic_drift_kept_hi:.0%} kept on Zipf). Our windows are single
batches (128–512 tokens), while the deployment's 200 ms windows aggregate many steps and are smoother. Uniform
splitting is the regime that inverts (worse than static) when floors bind.

The drift-K sweep shows the two halves of §5.12: on skewed routing a stale placement costs static up to
{drift_zipf_static_max:.2f}× (B = {drift_zipf_static_max_b}; the hot set lost its replicas); dispatch recovers part
of it (over fresh static at B = 512: static {drift_zipf_static_k16_b512:.2f} → TEMPO {drift_zipf_tempo_k16_b512:.2f}
at K = 16, {drift_zipf_static_k32_b512:.2f} → {drift_zipf_tempo_k32_b512:.2f} at K = 32) — the rest only
re-placement can recover. FLAME-MoE's near-balanced layers barely notice the
drift (static / fresh ≤ {drift_flame_static_max:.2f}).

Table 10 (synthetic drift-16 timeline) reproduces the composition argument in the compute regime (B = 512):
refreshing alone helps (uniform + cum16 {t10_512_uniform_cum16:.2f}; paper {paper_t10_512_uniform_cum16:.2f}),
TEMPO on the stale placement helps ({t10_512_tempo_never:.2f}; paper {paper_t10_512_tempo_never:.2f}), and TEMPO
on a refreshed placement is best (cum16 {t10_512_tempo_cum16:.2f}, w4 {t10_512_tempo_w4:.2f}; paper
{paper_t10_512_tempo_cum16:.2f}, {paper_t10_512_tempo_w4:.2f}). In the floor regime (B = 128) refreshing does not
help static or uniform: static + cum16 {t10_128_static_cum16:.2f} (paper {paper_t10_128_static_cum16:.2f}),
uniform {t10_128_uniform_never:.2f} → {t10_128_uniform_cum16:.2f} with cum16 (paper
{paper_t10_128_uniform_never:.2f} → {paper_t10_128_uniform_cum16:.2f}: a fresher, more balanced spread fragments
more experts), while TEMPO stays below static ({t10_128_tempo_never:.2f}; paper parity,
{paper_t10_128_tempo_never:.2f}). The paper's text quotes a p95 for the trailing-window refresh that its Table 10
does not show (its TEMPO + W4 row reads {paper_t10_128_tempo_w4:.2f} / {paper_t10_128_tempo_w4_p95:.2f}); ours is
{t10_128_tempo_w4_p95:.2f} at B = 128.
""")

# %%
print(f"notebook time {time.perf_counter() - t_start:.1f} s (SMALL={SMALL})")
