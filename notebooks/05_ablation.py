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
# # Ablations of tempo_fast (TEMPO §4.2; Tables 2, 8, 9) and Theorem 2 (§3.1, App. A.4)
#
# - **Table 2, components**: over the phase grid (EP8: three presets × two replication ratios × six skews ×
#   eight B, B = tokens per GPU as in the phase diagram) and the scale grid (DSv3, 1.25×, EP16–64), each batch
#   is solved by full TEMPO and with one component off — partial moves, augmenting chains, the ensemble, and our
#   target repair (beyond the paper). Degradation of a cell = `mean(variant)/mean(baseline) − 1` over its batches
#   (`tempo_jax.sim.tempo.ablation`); the baseline is full TEMPO, except for "no ensemble": the repair runs inside the
#   ensemble step, so switching the ensemble off switches the repair off too, and that row is measured against
#   full TEMPO without the repair (the ensemble's own share); the "no repair" row charges the repair. Each cell
#   also carries its winning fixed policy (M: memory regime, L/E: compute regime).
# - **Table 8, cumulative stages** and **Table 9, cost terms**: the drift-16 replay scenario (EP8, R = 64, proxy
#   three-term model; placement and static map built from a recording whose top-16 experts' loads were swapped
#   with random cold ones), median makespan / static over windows. Stage switches are tempo_fast's options; a
#   term ablation solves under the model with the term deleted (traffic: c2 = γ = 0; floor: a = b = 0, i.e.
#   tokens only) and scores under the full model (`tempo_jax.sim.tempo.protocols.run_variants`). B = tokens per step
#   (see notebook 04); routing: FLAME-MoE-290M layers (recorded) and synthetic Zipf(1.2) streams.
#
# - **Theorem 2**: A3's additive gap ε = Δ/LB on recorded decode batches and its tightness over a 1296-instance
#   probe suite (`tempo_jax.sim.tempo.theorem2`; also `python -m tempo_jax.sim.tempo.theorem2`).
#
# Our tempo_fast runs full-depth augmenting chains by default (the paper truncates at 2 steps). `SMALL=1`
# shrinks every grid; full-size results are cached in `results/cache/`, and the numbers quoted below are recorded
# in `results/notebooks/05_ablation.json`.

# %%
import dataclasses
import os
import time

import matplotlib.pyplot as plt
import numpy as np

from tempo_jax.repro import Recorder, figures_dir
from tempo_jax.sim import PhaseConfig, SyntheticStreams, VariantConfig, component_ablation, run_variants
from tempo_jax.sim.tempo.ablation import summarize
from tempo_jax.sim.tempo.replay_summary import LABELS, PAPER, component_table, variant_table
from tempo_jax.sim.tempo.theorem2 import PAPER as THM2_PAPER
from tempo_jax.sim.tempo.theorem2 import EpsilonConfig, ProbeConfig, run_theorem2, theorem2_table, theorem2_values
from tempo_jax.sim.tempo.variants import COMPONENTS, STAGES, TERMS
from tempo_jax.text import table

SMALL = os.environ.get("SMALL", "0") == "1"
FIGURES = figures_dir()
REC = Recorder("05_ablation")
KEYS = {"no partial moves": "partial", "no aug. chains": "chains", "no ensemble": "ensemble", "no repair": "repair"}
KEYS |= {"seed": "seed", "+chains": "chains", "+local": "local", "+ensemble": "full", "seed+local": "seed_local"}
KEYS |= {"drop_traffic": "drop_traffic", "drop_floor": "drop_floor"}
t_start = time.perf_counter()

if SMALL:
    PHASE = PhaseConfig(eps=(8,), skews=(0.0, 1.2), tokens_per_gpu=(16, 256, 2048), batches=1)
    SCALE = PhaseConfig(
        presets=("dsv3_fp8_offline",), replications=(1.25,), eps=(32,), skews=(1.2,), tokens_per_gpu=(64,), batches=1
    )
    SYN = SyntheticStreams(streams=1, windows=2)
else:
    PHASE = PhaseConfig(eps=(8,), batches=4)
    SCALE = PhaseConfig(presets=("dsv3_fp8_offline",), replications=(1.25,), eps=(16, 32, 64), batches=4)
    SYN = SyntheticStreams(streams=4, windows=32)
WORKERS = 1 if SMALL else 2
VARIANTS = (*STAGES, "drop_traffic", "drop_floor")
REPLAY = VariantConfig(
    tokens_per_step=(128, 512, 1024, 2048), drifts=(16,), variants=VARIANTS, max_windows=1 if SMALL else None
)
SOURCES = {"FLAME": REPLAY, "Zipf1.2": dataclasses.replace(REPLAY, source="synthetic", synthetic=SYN)}

# %% [markdown]
# ## Table 2: component ablation over the phase and scale grids

# %%
t0 = time.perf_counter()
ablations = [component_ablation(cfg, workers=WORKERS, progress=not SMALL) for cfg in (PHASE, SCALE)]
n_cells = sum(len(a.cells) for a in ablations)
print(f"{n_cells} cells in {time.perf_counter() - t0:.1f} s")
comp = component_table(summarize(ablations))


def _pp(c):
    return (
        "—"
        if not np.isfinite(c["paper_max"])
        else f"{c['paper_mean']:.1f} / {c['paper_p95']:.1f} / {c['paper_max']:.1f}"
    )


rows = [
    [c["variant"], _pp(c), c["paper_where"], f"{c['mean']:.1f} / {c['p95']:.1f} / {c['max']:.1f}", c["where"]]
    for c in comp
]
print(
    table(
        rows,
        ["variant", "paper mean/p95/max %", "paper: max at", "here mean/p95/max %", "here: max at"],
        "Table 2: degradation vs full tempo_fast, paper vs here",
    )
)

# The paper's tempo_fast truncates augmenting chains at 2 steps; ours searches full paths by default. The same
# ablation with the paper's truncation in every solve:
ablations2 = [component_ablation(cfg, chain_depth=2, workers=WORKERS, progress=not SMALL) for cfg in (PHASE, SCALE)]
comp2 = component_table(summarize(ablations2))
rows = [[c["variant"], _pp(c), f"{c['mean']:.1f} / {c['p95']:.1f} / {c['max']:.1f}", c["where"]] for c in comp2]
print(
    table(
        rows,
        ["variant", "paper mean/p95/max %", "here mean/p95/max %", "here: max at"],
        "Table 2 with depth-2 chains (the paper's truncation)",
    )
)
for prefix, tab in (("t2", comp), ("t2d2", comp2)):
    REC.table(prefix, tab)
    for c in tab:
        k = f"{prefix}_{KEYS[c['variant']]}"
        REC.update(
            **{
                f"{k}_mean": c["mean"] / 100,
                f"{k}_p95": c["p95"] / 100,
                f"{k}_max": c["max"] / 100,
                f"{k}_where": c["where"],
                f"{k}_winner": c["winner"],
            }
        )
        if prefix == "t2" and np.isfinite(c["paper_max"]):
            REC.update(**{f"paper_{k}_max": c["paper_max"] / 100, f"paper_{k}_where": c["paper_where"]})

# %%
fig, axes = plt.subplots(1, len(COMPONENTS), figsize=(17, 3.8), sharey=True)
for ax, (j, name) in zip(axes, enumerate(COMPONENTS), strict=True):
    for res in ablations:
        deg = 100 * res.degradation()[:, j]
        bs = np.array([c.tokens_per_gpu for c in res.cells])
        eps = np.array([c.ep for c in res.cells])
        for ep in sorted(set(eps)):
            m = int(np.log2(ep)) - 3  # EP8 → C0, EP16 → C1, EP32 → C2, EP64 → C3
            sel = eps == ep
            ax.scatter(bs[sel] * np.exp(0.08 * (m - 1.5)), deg[sel], s=10, alpha=0.6, label=f"EP{ep}", color=f"C{m}")
    ax.axhline(0, color="0.4", lw=0.8)
    ax.set_xscale("log", base=2)
    paper_max = PAPER["table2"][name][2]
    ax.set_title(f"{name} (paper max {paper_max}%)" if np.isfinite(paper_max) else f"{name} (not in the paper)")
    ax.set_xlabel("tokens per GPU B")
    ax.grid(alpha=0.3)
axes[0].set_ylabel("degradation vs full TEMPO (%)")
handles, labels = axes[0].get_legend_handles_labels()
uniq = dict(zip(labels, handles, strict=True))
axes[-1].legend(uniq.values(), uniq.keys(), fontsize=8)
fig.suptitle("Table 2: each cell's makespan without one component, relative to full tempo_fast")
fig.tight_layout()
fig.savefig(FIGURES / "table2_component_ablation.png", dpi=120)
plt.show()

# %% [markdown]
# ## Tables 8 and 9: stage and cost-term ablations on the drift-16 replay

# %%
results = {}
for label, cfg in SOURCES.items():
    t0 = time.perf_counter()
    rows = run_variants(cfg, workers=WORKERS, progress=not SMALL)
    results[label] = variant_table(rows, VARIANTS, "table8")
    results[label + "/t9"] = variant_table(rows, ("+ensemble", "drop_traffic", "drop_floor"), "table9")
    print(f"{label}: {len(rows)} windows in {time.perf_counter() - t0:.1f} s")


def _fmt(x):
    return "—" if not np.isfinite(x) else f"{x:.3f}"


def _side_by_side(key, variants, bs, title):
    out = []
    for v in variants:
        for B in bs:
            here = [next(t for t in results[lab + key] if t["variant"] == v and t["B"] == B) for lab in SOURCES]
            out.append(
                [LABELS[v], B, _fmt(here[0]["paper"]), *[_fmt(h["median"]) for h in here], f"{here[0]['ms']:.1f}"]
            )
    print(table(out, ["variant", "B", "paper", *[f"here {s}" for s in SOURCES], "ms (FLAME)"], title))


_side_by_side("", STAGES, PAPER["table8_B"], "Table 8: median makespan / static, cumulative stages (drift-16)")
print(f"paper solve ms at B=1024: { {LABELS[k]: v[3] for k, v in PAPER['table8'].items()} }")
print()
_side_by_side(
    "/t9",
    ("+ensemble", "drop_traffic", "drop_floor"),
    PAPER["table9_B"],
    "Table 9: median makespan / static, solve with terms deleted, score with the full model",
)
for lab, key in (("FLAME", "flame"), ("Zipf1.2", "zipf")):
    REC.table(f"t8_{key}", results[lab])
    REC.table(f"t9_{key}", results[lab + "/t9"])
    for t in results[lab]:
        REC.value(f"t8_{key}_{KEYS[t['variant']]}_{t['B']}", t["median"])
    REC.update(**{f"t8_{key}_ms_{KEYS[t['variant']]}_{t['B']}": t["ms"] for t in results[lab]})
for v, vals in PAPER["table8"].items():
    REC.update(**{f"paper_t8_{KEYS[v]}_{B}": x for B, x in zip(PAPER["table8_B"], vals[:3], strict=True)})
for v, vals in PAPER["table9"].items():
    REC.update(**{f"paper_t9_{KEYS[v]}_{B}": x for B, x in zip(PAPER["table9_B"], vals, strict=True)})

# %%
fig, axes = plt.subplots(1, 2, figsize=(13, 4.4))
PANELS = (("", STAGES, "table8"), ("/t9", TERMS, "table9"))
for ax, (key, variants, tab) in zip(axes, PANELS, strict=True):
    for k, v in enumerate(variants):
        for lab, style in zip(SOURCES, ("-o", "--s"), strict=True):
            t = [r for r in results[lab + key] if r["variant"] == v]
            ax.plot(
                [r["B"] for r in t], [r["median"] for r in t], style, color=f"C{k}", ms=4, label=f"{LABELS[v]} ({lab})"
            )
        if v in PAPER[tab]:
            ax.plot(PAPER[f"{tab}_B"], PAPER[tab][v][: len(PAPER[f"{tab}_B"])], "D", color=f"C{k}", mfc="none", ms=8)
    ax.axhline(1.0, color="0.4", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("B (tokens per step)")
    ax.set_ylabel("median makespan / static")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
axes[0].set_title("Table 8: cumulative stages (◇ paper)")
axes[1].set_title("Table 9: cost terms deleted from the objective (◇ paper)")
fig.suptitle("drift-16 replay, EP8, R = 64, proxy three-term model: solid FLAME-MoE, dashed Zipf(1.2)")
fig.tight_layout()
fig.savefig(FIGURES / "tables8_9_stage_term_ablation.png", dpi=120)
plt.show()

# %% [markdown]
# ## Theorem 2: A3's additive gap and its tightness
#
# A3 (descending-token round-robin of whole experts, full replication) satisfies M(A3) ≤ OPT + Δ with
# Δ = max(b, β·n_max). The paper reports ε = Δ/LB (so M(A3) ≤ (1 + ε)·OPT) of median 4.1% / max 7.7% on recorded
# decode batches and 31% at 4× token scale, and a worst M(A3)/(OPT + Δ) of 0.998 over 1296 probe instances. Our
# reading (the grid is not in the paper): recorded = our FLAME-MoE / HarMoEny recordings at B = 16–64 tokens per
# rank (and 4× that), plus DeepSeek-V3-shaped synthetic batches (E = 256 at EP8, issue 15's generator); the probe
# grid is g ∈ {2, 4, 8, 16} × E ∈ {16, 64, 256, 512} × 9 token families × B ∈ {32, 128, 512} × 3 seeds
# (`tempo_jax.sim.tempo.theorem2` docstring). OPT is tempo's certified optimum, else the MILP's, else a bracket.

# %%
t0 = time.perf_counter()
if SMALL:
    T2 = (
        EpsilonConfig(traces=(("flame_moe_290m", 8),), synthetic=((256, 8, 8, 1.2),), max_batches=2),
        ProbeConfig(gpus=(2, 8), experts=(16, 64), tokens_per_gpu=(128,), seeds=1),
    )
else:
    T2 = (EpsilonConfig(), ProbeConfig())
t2 = run_theorem2(*T2, workers=WORKERS, progress=not SMALL)
print(f"{len(t2.probes)} probes, {len(t2.epsilon)} ε batches in {time.perf_counter() - t0:.1f} s")
t2_rows = theorem2_table(t2)
print(table(t2_rows, ["quantity", "paper", "here"], "Theorem 2: paper vs here"))
REC.table("theorem2", [dict(zip(("quantity", "paper", "here"), r, strict=True)) for r in t2_rows])
REC.update(**{f"thm2_{k}": x for k, x in theorem2_values(t2).items()})
REC.update(**{f"paper_thm2_{k}": x for k, x in THM2_PAPER.items()})

# %%
v = REC.values
REC.claim("table2_each_component_helps_somewhere", all(v[f"t2_{k}_max"] > 0 for k in ("partial", "chains", "ensemble")))
REC.claim(
    "chains_never_worse_than_seed",
    all(
        v[f"t8_{s}_chains_{B}"] <= v[f"t8_{s}_seed_{B}"] + 1e-9
        for s in ("flame", "zipf")
        for B in REPLAY.tokens_per_step
    ),
)
REC.claim("seed_only_differs_at_128", abs(v["t8_flame_seed_128"] - v["paper_t8_seed_128"]) > 0.05)
REC.claim(
    "drop_floor_exact_above_floor_regime",
    all(
        abs(v[f"t8_{s}_drop_floor_{B}"] - v[f"t8_{s}_full_{B}"]) < 0.01 for s in ("flame", "zipf") for B in (1024, 2048)
    ),
)
REC.claim("thm2_proof_inequality_everywhere", v["thm2_theorem_holds"] == v["thm2_instances"])
REC.claim("thm2_floor_dominates_our_recordings", v["thm2_token_share"] < 0.5)
REC.claim("thm2_additive_term_tight", v["thm2_tight_high"] > 0.99 and v["thm2_delta_used"] >= 0.9)
REC.claim("thm2_a3_over_opt_is_g", abs(v["thm2_a3_over_opt"] - v["thm2_a3_over_opt_g"]) < 0.05)
REC.reading("""
**Reading.** *Table 2*: each component binds in its own region, as in the paper, but by less, because our
heuristic's seed is stronger: it splits an expert that cannot fit whole under the certified bound and starts from
the token-flow point when that is lower (`split_seed`). Without partial moves the chains, whole-expert moves and
swaps recover all but {t2_partial_max:.1%} (at {t2_partial_where}; paper {paper_t2_partial_max:.1%},
{paper_t2_partial_where}). Without augmenting chains the loss is at most {t2_chains_max:.1%} (at
{t2_chains_where}; paper {paper_t2_chains_max:.1%}, {paper_t2_chains_where}). The ensemble — which also hosts the
level partition and the CP-SAT level search, and is measured against full TEMPO without the repair — is worth up
to {t2_ensemble_max:.1%} (mean {t2_ensemble_mean:.1%}) at {t2_ensemble_where} (paper {paper_t2_ensemble_max:.1%},
{paper_t2_ensemble_where}); the winner letter says which regime that cell is in (M: the memory regime, where METRO
wins; L / E: compute). Our target repair, now the last resort after the level stages, adds at most
{t2_repair_max:.1%} (mean {t2_repair_mean:.1%}). With the paper's depth-2 chains the largest losses are
{t2d2_partial_max:.1%} / {t2d2_chains_max:.1%} / {t2d2_ensemble_max:.1%} / {t2d2_repair_max:.1%} (partial moves /
chains / ensemble / repair; the ensemble's at {t2d2_ensemble_where}, where only the level stages find the
optimum).

*Table 9* reproduces the paper's structure: deleting the traffic term gives {t8_flame_drop_traffic_128:.3f} vs
{t8_flame_full_128:.3f} on FLAME at B = 128 (Zipf {t8_zipf_drop_traffic_128:.3f} vs {t8_zipf_full_128:.3f}) and
most in the traffic regime (B = 512: FLAME {t8_flame_drop_traffic_512:.3f} vs {t8_flame_full_512:.3f}, Zipf
{t8_zipf_drop_traffic_512:.3f} vs {t8_zipf_full_512:.3f}; paper {paper_t9_drop_traffic_512:.3f} vs
{paper_t9_full_512:.3f}); deleting the floor (≡ token balancing) costs only in the floor regime (B = 128: FLAME
{t8_flame_drop_floor_128:.3f}, Zipf {t8_zipf_drop_floor_128:.3f}; paper {paper_t9_drop_floor_128:.3f}) and is
exact above it.

*Table 8* differs in two places. Our "seed only" is the split-aware seed or the token-flow point, not the paper's
whole-expert seed (`split_seed=False` is the paper's), and it is already well below static at B = 128 (FLAME
{t8_flame_seed_128:.3f}, Zipf {t8_zipf_seed_128:.3f}; paper {paper_t8_seed_128:.3f}); part of that gap is
static's: at B = 128 our static map touches almost every replica (≈ 1.5 pairs per source and expert; notebook 04)
and pays an activation floor for each. And the paper's augmenting chains *hurt* in the traffic regime
({paper_t8_seed_512:.3f} → {paper_t8_chains_512:.3f} at B = 512) because they equalise activation counts blindly;
ours accept a chain only when it lowers the bottleneck GPU's modelled time (`solvers.tempo_moves`), so `+chains`
is never worse than the seed (a tested property; here FLAME {t8_flame_seed_512:.3f} → {t8_flame_chains_512:.3f})
and local search has less to repair. The absolute ratios differ from the paper's because the routing differs
(FLAME-MoE is nearly balanced, Zipf(1.2) strongly skewed; the paper's traces are not public) — not tuned.

*Theorem 2*: on DeepSeek-V3-shaped batches (32 experts per GPU, like the paper's traces) ε has median
{thm2_syn_eps_median:.1%} and max {thm2_syn_eps_max:.1%} ({thm2_syn_eps_max_4x:.1%} at {thm2_scale}× tokens; paper
{paper_thm2_eps_median:.1%} / {paper_thm2_eps_max:.1%} / {paper_thm2_eps_max_4x:.0%}). Our own recordings have 8–16
experts per GPU and mostly small experts: there Δ is the floor b on all but {thm2_token_share:.0%} of the batches,
so ε is at least one over the experts per GPU before any token term (median {thm2_eps_median:.1%}, max
{thm2_eps_max:.1%}) — the paper's "Δ = β·n_max on all our traces" does not hold for them. The additive term is tight
in both senses the paper means: M(A3)/(OPT + Δ) reaches {thm2_tight_high:.4f} (paper {paper_thm2_tightness:.3f};
{thm2_tight_where}; where OPT is only bracketed the upper end counts), and a single giant expert needs
{thm2_delta_used:.3f} of Δ ({thm2_delta_used_where}: 1 − 1/g, the necessity argument of App. A.4); M(A3)/OPT reaches
{thm2_a3_over_opt:.1f} (= g at {thm2_a3_over_opt_where}; paper {paper_thm2_a3_over_opt_max:.1f}). The proof's
inequality M(A3) ≤ LB + Δ holds on {thm2_theorem_holds} of {thm2_instances} instances (OPT proven on {thm2_proven}).
""")

# %%
print(f"notebook time {time.perf_counter() - t_start:.1f} s (SMALL={SMALL})")
