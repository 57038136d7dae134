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
#    `t_g = max(15·G_g, 0.1·N_g)`, dispatched three ways (`tempo_jax.sim.tempo.cost_demo.worked_example`).
# 2. **Fig. 2 profile**: one expert's time vs its tokens for the calibrated presets, n* marked.
# 3. **Table 6**: n* per preset.
# 4. **Calibration**: noisy samples of a preset on the paper's grid (G ∈ 1..40 × tokens per expert on a log
#    ladder 1..4096) refitted by alternating assignment (`solvers.fit_max_affine`).
# 5. **Tile-aware dispatch at prefill scale (Eq. 2, §2.2)**: does pricing 128-token M-tiles change TEMPO's
#    solution, and by how much (`tempo_jax.sim.tempo.tiles`)?
#
# The numbers quoted below are recorded in `results/notebooks/01_cost_model.json`. `SMALL=1` shortens the
# calibration's noise sweep and the tile study.

# %%
import os
import time

import matplotlib.pyplot as plt
import numpy as np

from solvers import PRESETS
from tempo_jax.repro import Recorder, figures_dir
from tempo_jax.sim.tempo.cost_demo import (
    PROFILE_CSVS,
    calibration_demo,
    expert_profile,
    inflection_rows,
    measured_profile,
    worked_example,
)
from tempo_jax.sim.tempo.tiles import TileStudyConfig, run_tile_study, tile_summary
from tempo_jax.text import table

SMALL = os.environ.get("SMALL", "0") == "1"
FIGURES = figures_dir()
REC = Recorder("01_cost_model")
NOISES = (0.02, 0.05) if SMALL else (0.0, 0.02, 0.05, 0.10)
t_start = time.perf_counter()

# %% [markdown]
# ## Fig. 1b: the worked example

# %%
toy = worked_example()
rows = [
    [r["label"], r["G"].tolist(), r["N"].round(0).tolist(), r["t"].round(1).tolist(), r["makespan"], r["paper"]]
    for r in toy
]
print(table(rows, ["dispatch", "G per GPU", "N per GPU", "t per GPU (µs)", "makespan (µs)", "paper (µs)"], "Fig. 1b"))
ratio = toy[0]["makespan"] / toy[2]["makespan"]
print(f"lower bound {toy[0]['lower_bound']:.0f} µs; token balancing / optimal = {ratio:.2f}× (paper: 1.75×)")
REC.table("fig1b", [{k: r[k] for k in ("label", "policy", "G", "N", "t", "makespan", "paper")} for r in toy])
REC.update(**{f"toy_{r['policy']}": r["makespan"] for r in toy}, toy_lower_bound=toy[0]["lower_bound"], toy_ratio=ratio)

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
        ax.barh(
            [k - 0.18, k + 0.18], r["x"][e], 0.34, left=left, color="C1" if e == 0 else "C2", edgecolor="white", lw=0.6
        )
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
measured = {label: measured_profile(path) for label, path in PROFILE_CSVS.items()}
fig, axes = plt.subplots(1, 2, figsize=(13, 4.6))
ax = axes[0]
for k, preset in enumerate(("dsv3_bf16_offline", "dsv3_fp8_offline", "dsv2_lite_offline", "qwen3_30b_offline")):
    cost = PRESETS[preset]
    ax.plot(n, expert_profile(cost, n), color=f"C{k}", label=f"{preset} (b={cost.b:g}, β={cost.beta:g})")
    ax.axvline(cost.inflection, color=f"C{k}", ls=":", lw=1)
    ax.plot([cost.inflection], [cost.b], "o", color=f"C{k}")
    ax.annotate(
        f"n*≈{cost.inflection:.0f}",
        (cost.inflection, cost.b),
        textcoords="offset points",
        xytext=(4, -12),
        fontsize=8,
        color=f"C{k}",
    )
ax.set_xscale("log", base=2)
ax.set_yscale("log")
ax.set_xlabel("tokens per expert n")
ax.set_ylabel("expert time (µs) = max(b, β·n)")
ax.set_title("(a) the calibrated presets (model)")
ax.grid(alpha=0.3, which="both")
ax.legend(fontsize=8)
# Measured points: per-expert time t/G vs tokens per expert N/G, with their own max-affine fit.
ax = axes[1]
shown = []
for k, (label, prof) in enumerate(measured.items()):
    if prof is None:
        continue
    shown.append(label)
    for j, g in enumerate(sorted(set(prof["G"].tolist()))):
        sel = prof["G"] == g
        ax.plot(
            prof["per_expert_tokens"][sel],
            prof["t"][sel] / g,
            "os^D"[j % 4],
            color=f"C{k}",
            mfc="none",
            label=f"{label}, G = {g:g}",
        )
    fit = prof["fitted"]
    ax.plot(
        n,
        fit.gpu_times(np.ones_like(n), n),
        "-",
        color=f"C{k}",
        lw=1,
        label=f"fit: n* ≈ {fit.inflection:.0f}, error {prof['report'].mean_rel_error:.1%}",
    )
if shown:
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.legend(fontsize=7)
else:
    ax.text(
        0.5,
        0.5,
        "no measured profile committed yet:\n" + "\n".join(str(p) for p in PROFILE_CSVS.values()),
        ha="center",
        va="center",
        fontsize=8,
        transform=ax.transAxes,
    )
ax.set_xlabel("tokens per expert N/G")
ax.set_ylabel("measured time per expert t/G (µs)")
ax.set_title("(b) measured expert-FFN profiles (G,N,T,t CSVs)")
ax.grid(alpha=0.3, which="both")
fig.suptitle("Fig. 2: flat (weight streaming) below n*, linear above")
fig.tight_layout()
fig.savefig(FIGURES / "fig2_expert_profile.png", dpi=120)
plt.show()
REC.update(measured_profiles=len(shown), measured_profiles_text=", ".join(shown) or "none committed yet")
for label, prof in measured.items():
    if prof is not None:
        key = "gpu" if label.startswith("GPU") else "cpu"
        REC.update(
            **{
                f"{key}_fit_n_star": prof["fitted"].inflection,
                f"{key}_fit_error": prof["report"].mean_rel_error,
                f"{key}_fit_b": prof["fitted"].b,
                f"{key}_fit_beta": prof["fitted"].beta,
            }
        )

# %%
rows = [[r["preset"], r["b"], r["beta"], f"{r['n_star']:.1f}", f"≈{r['paper']:.0f}"] for r in inflection_rows()]
print(table(rows, ["preset", "b (µs/expert)", "β (µs/token)", "n* = b/β here", "paper n*"], "Table 6: paper vs here"))
REC.table("table6", inflection_rows())
REC.update(**{f"n_star_{r['preset']}": r["n_star"] for r in inflection_rows()})
REC.update(**{f"paper_n_star_{r['preset']}": r["paper"] for r in inflection_rows()})

# %% [markdown]
# ## Calibration demo
#
# Samples of the Testbed A EP8 GEMM refit (`dsv3_a_gemm_refit`: a = 116, b = 12.99, c = 176, β = 0.0851) on
# the paper's grid, with multiplicative Gaussian noise, refitted black-box.

# %%
cals = {noise: calibration_demo("dsv3_a_gemm_refit", noise=noise, seed=0) for noise in NOISES}
rows = [
    [f"{noise:.0%}", r["param"], r["true"], r["fitted"], f"{100 * r['rel_error']:.2f}%"]
    for noise, c in cals.items()
    for r in c.rows()
]
print(table(rows, ["noise", "param", "true", "fitted", "rel. error"], "fit_max_affine recovers the preset"))
for noise, c in cals.items():
    print(f"noise {noise:.0%}: mean relative fit error {c.report.mean_rel_error:.2%} (paper's real fits: 4–8%)")
REC.update(noise_lo=0.02, noise_hi=0.05)
REC.table("calibration", [{"noise": noise, **r} for noise, c in cals.items() for r in c.rows()])
for noise, c in cals.items():
    pct = f"{round(100 * noise):02d}"
    REC.update(
        **{
            f"fit_error_noise{pct}": c.report.mean_rel_error,
            f"n_star_error_noise{pct}": abs(c.fitted.inflection / c.true.inflection - 1),
        }
    )

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

# %% [markdown]
# ## Tile-aware dispatch at prefill scale (Eq. 2)
#
# The paper: "on recorded routing rescaled to 4096–8192 tokens per GPU, tile-aware search changes the tile-blind
# solution in 97–99% of batches and cuts modelled block time by a median 4.5–6.0% (p95 9.4%), while the uniform
# replica split manufactures 3–10% extra padded tiles — vanishing by 16,384 tokens per GPU". Here: recorded
# FLAME-MoE-290M batches (256 tokens per GPU on EP8) and synthetic Zipf(1.2) DSv3-shape batches, every token
# repeated to reach B, EPLB 1.25×, Table 7's tile models without the traffic piece (Qwen3-235B for FLAME's small
# experts, DSv3 for the DSv3 shape). Each batch is solved by TEMPO tile-aware and tile-blind, both scored under
# Eq. 2. Two readings of "tokens per GPU": tokens (B = 4096–16384) and token–expert pairs (B = 512–2048 tokens,
# i.e. 4096–16384 pairs per GPU at K = 8).

# %%
TILE_B = {
    "tokens": (4096, 16384) if SMALL else (4096, 8192, 16384),
    "pairs": (512, 2048) if SMALL else (512, 1024, 2048),
}
SOURCES = {
    "flame": dict(source="flame_moe_290m", preset="qwen3_235b_b_tile"),
    "zipf": dict(source="synthetic", preset="dsv3_b_tile"),
}
tiles = []
for reading, bs in TILE_B.items():
    for name, src in SOURCES.items():
        cfg = TileStudyConfig(**src, tokens_per_gpu=bs, batches=2 if SMALL else 8)
        for row in tile_summary(run_tile_study(cfg, workers=1 if SMALL else 2, progress=not SMALL)):
            tiles.append({"source": name, "reading": reading, **row})
            key = f"tile_{name}_{row['B']}"
            REC.update(
                **{
                    f"{key}_changed": row["changed"],
                    f"{key}_cut": row["cut_median"],
                    f"{key}_cut_p95": row["cut_p95"],
                    f"{key}_extra": row["uniform_extra_tiles"],
                }
            )
REC.table("tiles", tiles)
print(
    table(
        [
            [
                t["source"],
                t["reading"],
                t["B"],
                t["batches"],
                f"{t['changed']:.0%}",
                f"{t['cut_median']:+.2%}",
                f"{t['cut_p95']:+.2%}",
                f"{t['uniform_extra_tiles']:.1%}",
            ]
            for t in tiles
        ],
        [
            "routing",
            "reading",
            "B (tokens/GPU)",
            "batches",
            "solution changed",
            "cut (median)",
            "cut (p95)",
            "uniform extra tiles",
        ],
        "tile-aware vs tile-blind TEMPO under Eq. 2",
    )
)
lo_b, hi_b = TILE_B["pairs"][0], TILE_B["pairs"][-1]
REC.update(tile_lo_b=lo_b, tile_hi_b=hi_b, tile_lo_tokens=TILE_B["tokens"][0], tile_hi_tokens=TILE_B["tokens"][-1])
REC.claim("tile_same_plan_where_tokens_bind", all(t["changed"] == 0.0 for t in tiles if t["reading"] == "tokens"))
REC.claim(
    "tile_zipf_pairs_always_change",
    all(t["changed"] == 1.0 for t in tiles if t["reading"] == "pairs" and t["source"] == "zipf"),
)
REC.claim(
    "tile_cut_small_in_token_reading", all(abs(t["cut_median"]) < 0.01 for t in tiles if t["reading"] == "tokens")
)
REC.update(
    paper_tile_cut_lo=0.045,
    paper_tile_cut_hi=0.06,
    paper_tile_changed_lo=0.97,
    paper_tile_changed_hi=0.99,
    paper_tile_extra_lo=0.03,
    paper_tile_extra_hi=0.10,
    paper_fit_lo=0.04,
    paper_fit_hi=0.08,
)

# %%
REC.reading("""
**Reading.** *Fig. 1b* reproduces exactly: token balancing {toy_uniform:.0f} µs, METRO {toy_metro:.0f} µs, TEMPO
{toy_tempo:.0f} µs (= the lower bound {toy_lower_bound:.0f} µs), a {toy_ratio:.2f}× gap. *Table 6*'s n* are b/β of
the presets (DSv3 fp8 {n_star_dsv3_fp8_offline:.1f}, bf16 {n_star_dsv3_bf16_offline:.1f}, DSv2-Lite
{n_star_dsv2_lite_offline:.1f}, Qwen3-30B {n_star_qwen3_30b_offline:.1f}; the paper rounds to
{paper_n_star_dsv3_fp8_offline:.0f} / {paper_n_star_dsv3_bf16_offline:.0f} / {paper_n_star_dsv2_lite_offline:.0f}
/ {paper_n_star_qwen3_30b_offline:.0f}). *Calibration*: on synthetic samples with {noise_lo:.0%} / {noise_hi:.0%}
multiplicative noise the
alternating-assignment fit recovers the preset with a mean relative error of {fit_error_noise02:.1%} /
{fit_error_noise05:.1%} and n* within {n_star_error_noise05:.1%} (the paper's real fits: {paper_fit_lo:.0%}–
{paper_fit_hi:.0%}; real measurements carry structure noise does not). *Fig. 2* overlays measured profiles when
a profile CSV is committed (here: {measured_profiles_text}); no GPU profile is recorded yet (no session has had
a GPU). The CPU profile (the layer's expert FFN, H = F = 256, float32, on this 2-core machine) fits
b = {cpu_fit_b:.0f} µs, β = {cpu_fit_beta:.2f} µs/token, n* ≈ {cpu_fit_n_star:.0f} with a mean relative error of
{cpu_fit_error:.1%} (shared-machine timings): a different machine and expert shape, so it shows the two-regime
shape, not the presets' constants.

*Tile-aware dispatch.* Read as tokens per GPU (B = {tile_lo_tokens}–{tile_hi_tokens}), the token piece binds on
every GPU and the tile term never does: both searches stop at the same certified token bound and return the same
plan (solutions changed: {tile_zipf_4096_changed:.0%} on Zipf, {tile_flame_4096_changed:.0%} on FLAME at
B = {tile_lo_tokens}; median cut {tile_zipf_4096_cut:+.2%}). Read as token–expert pairs per GPU
(B = {tile_lo_b}–{tile_hi_b} tokens), the floor and tile pieces compete where experts are big: on Zipf the
tile-aware solution differs in every batch, with a median cut of {tile_zipf_512_cut:.1%} (p95
{tile_zipf_512_cut_p95:.1%}) at B = {tile_lo_b} and {tile_zipf_2048_cut:.1%} at B = {tile_hi_b}; on FLAME's
smaller experts it differs in {tile_flame_512_changed:.0%} of batches at B = {tile_lo_b} (cut
{tile_flame_512_cut:.1%}) and {tile_flame_2048_changed:.0%} at B = {tile_hi_b}, where tokens bind again.
The uniform split adds {tile_zipf_512_extra:.1%} padded tiles at B = {tile_lo_b} and {tile_zipf_2048_extra:.1%}
at B = {tile_hi_b} on Zipf ({tile_flame_512_extra:.1%} / {tile_flame_2048_extra:.1%}
on FLAME). The paper: solutions change in {paper_tile_changed_lo:.0%}–{paper_tile_changed_hi:.0%} of batches, a
median cut of {paper_tile_cut_lo:.1%}–{paper_tile_cut_hi:.1%}, {paper_tile_extra_lo:.0%}–{paper_tile_extra_hi:.0%}
extra tiles for uniform, vanishing by 16,384 per GPU. Neither reading matches all of it: the pairs reading gives
cuts and padded tiles of the paper's order that shrink with B, the tokens reading the vanishing.
Our routings are not the paper's recorded Qwen3-235B / DSv3 traffic.
""")

# %%
print(f"notebook time {time.perf_counter() - t_start:.1f} s (SMALL={SMALL})")
