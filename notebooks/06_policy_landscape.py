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
# or 4 (`tempo_jax.sim.tempo.replay.scale_counts`: binomial thinning below 1) — spanning the floor-bound, mixed and
# token-bound phases. Base windows: B = 256 tokens per step (≈ 192 pairs per GPU, below B*_a2a ≈ 300).
# Routing: FLAME-MoE-290M layers (recorded) and synthetic Zipf(1.2) streams (see notebook 04).
#
# Second part: the redundancy R × drift K grid of §5.12/§5.14 at scale 1 (the paper: at R = 16, K ≥ 16 every
# kernel collapses to 1.000 — the drifted hot set has no replicas and only placement can help).
#
# Third part (§5.13, Table 3): where adaptive dispatch stops paying — TEMPO / static on the drift-16 scenario over
# a batch ladder, which cost piece sets TEMPO's bottleneck GPU, and the all-to-all boundary
# `N* = (a + b·G − c2)/γ` at the activation count G TEMPO actually uses. The numbers quoted below are recorded in
# `results/notebooks/06_policy_landscape.json`. `SMALL=1` keeps one window per stream and a 2 × 2 grid.

# %%
import dataclasses
import os
import time

import matplotlib.pyplot as plt
import numpy as np

from solvers import PRESETS, SWEEP_POLICIES
from tempo_jax.repro import Recorder, figures_dir
from tempo_jax.sim import PolicyConfig, SyntheticStreams, run_policies
from tempo_jax.sim.tempo.replay_summary import LABELS, PAPER, a2a_table, drift_table, landscape_table
from tempo_jax.text import table

SMALL = os.environ.get("SMALL", "0") == "1"
FIGURES = figures_dir()
REC = Recorder("06_policy_landscape")
t_start = time.perf_counter()

POLICIES = SWEEP_POLICIES
SYN = SyntheticStreams(streams=1, windows=1) if SMALL else SyntheticStreams(streams=4, windows=32)
LANDSCAPE = PolicyConfig(
    tokens_per_step=(256,), scales=(0.25, 1.0, 4.0), drifts=(16,), policies=POLICIES, max_windows=1 if SMALL else None
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
SCALE_KEYS = {0.25: "s025", 1.0: "s1", 4.0: "s4"}
for lab, key in (("FLAME", "flame"), ("Zipf1.2", "zipf")):
    REC.table(f"table4_{key}", land[lab])
    REC.update(**{f"t4_{key}_{t['policy']}_{SCALE_KEYS[t['scale']]}": t["median"] for t in land[lab]})
for p, vals in PAPER["table4"].items():
    REC.update(**{f"paper_t4_{p}_{SCALE_KEYS[sc]}": v for sc, v in zip(PAPER["table4_scales"], vals, strict=True)})

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
            rows.append(
                [
                    lab,
                    R,
                    K,
                    *[f"{sel[p]['vs_static']:.3f}" for p in POLICIES[1:]],
                    f"{sel['static']['vs_fresh_static']:.3f}",
                ]
            )
print(
    table(
        rows,
        ["routing", "R", "K", *[LABELS[p] for p in POLICIES[1:]], "static / fresh static"],
        "median makespan / static (same placement); last column: what the drift costs static",
    )
)
for lab, key in (("FLAME", "flame"), ("Zipf1.2", "zipf")):
    REC.table(f"grid_{key}", grid[lab])
    collapse = [
        t["vs_static"] for t in grid[lab] if t["redundant"] == 16 and t["drift"] >= 16 and t["policy"] != "static"
    ]
    REC.update(**{f"grid_{key}_r16_k16_lo": min(collapse), f"grid_{key}_r16_k16_hi": max(collapse)})

# %% [markdown]
# ## §5.13, Table 3: where adaptive dispatch stops paying
#
# Drift-16, R = 64, proxy three-term model (a = 16.4, b = 2.99, c2 = 25, γ = 0.10), B = tokens per step (each GPU
# receives ≈ 0.75·B token–expert pairs at K = 6, EP8). Per B: median TEMPO / static, the piece of the cost model
# that sets TEMPO's bottleneck GPU in most windows, TEMPO's mean activations per GPU G, and `N*` at that G.

# %%
A2A = PolicyConfig(
    tokens_per_step=(128, 512, 1024) if SMALL else (32, 64, 128, 256, 384, 512, 768, 1024),
    drifts=(16,),
    policies=("static", "tempo"),
    max_windows=1 if SMALL else None,
)
cost = PRESETS[A2A.preset]
a2a = {}
for label, over in SOURCES.items():
    a2a[label] = a2a_table(run_policies(dataclasses.replace(A2A, **over), workers=WORKERS, progress=not SMALL), cost)
rows = [
    [
        lab,
        t["B"],
        f"{0.75 * t['B']:.0f}",
        t["term"],
        f"{t['term_share']:.0%}",
        f"{t['G']:.1f}",
        f"{t['n_star']:.0f}",
        f"{t['median']:.3f}",
        t["paper_term"],
        f"{t['paper_ratio']:.3f}",
    ]
    for lab in SOURCES
    for t in a2a[lab]
]
print(
    table(
        rows,
        [
            "routing",
            "B",
            "pairs/GPU",
            "TEMPO's bottleneck term",
            "share",
            "G",
            "N*",
            "TEMPO / static",
            "paper regime",
            "paper ratio",
        ],
        "Table 3 / §5.13",
    )
)
for lab, key in (("FLAME", "flame"), ("Zipf1.2", "zipf")):
    REC.table(f"table3_{key}", a2a[lab])
    REC.update(**{f"t3_{key}_{t['B']}": t["median"] for t in a2a[lab]})
    REC.update(**{f"t3_{key}_{t['B']}_term": t["term"] for t in a2a[lab]})
    floor = [t for t in a2a[lab] if t["term"] == "floor"]
    traffic = [t for t in a2a[lab] if t["term"] == "traffic"]
    REC.update(
        **{
            f"a2a_{key}_last_floor_b": max((t["B"] for t in floor), default=0),
            f"a2a_{key}_first_traffic_b": min((t["B"] for t in traffic), default=0),
            f"a2a_{key}_g": float(np.mean([t["G"] for t in a2a[lab]])),
            f"a2a_{key}_n_star": float(np.mean([t["n_star"] for t in a2a[lab]])),
        }
    )
REC.update(pairs_per_token_per_gpu=6 / 8)
REC.update(
    paper_a2a_g=PAPER["a2a"]["G"],
    paper_a2a_n_star=PAPER["a2a"]["N_star"],
    a2a_paper_check=(cost.a + cost.b * PAPER["a2a"]["G"] - cost.c2) / cost.gamma,
)
for B, (_term, ratio) in PAPER["table3"].items():
    REC.update(**{f"paper_t3_{B}": ratio})

# %%
v = REC.values
REC.claim(
    "tempo_best_or_tied_every_column_zipf",
    all(v[f"t4_zipf_tempo_{k}"] <= min(v[f"t4_zipf_{p}_{k}"] for p in POLICIES) + 0.005 for k in SCALE_KEYS.values()),
)
REC.claim("collapse_at_r16_k16_zipf", v["grid_zipf_r16_k16_hi"] < 1.03)
REC.claim("modelled_gain_persists_past_n_star", all(v[f"t3_{k}_1024"] < 0.99 for k in ("flame", "zipf")))
REC.reading("""
**Reading.** The paper's Table 4 is the phase diagram with named competitors, and the Zipf(1.2) column
reproduces its shape: in the floor-bound column (0.25×) uniform is worst ({t4_zipf_uniform_s025:.2f}; paper
{paper_t4_uniform_s025:.2f}), token-LP loses to static ({t4_zipf_token_lp_s025:.2f}; paper
{paper_t4_token_lp_s025:.3f}), METRO is the best proxy ({t4_zipf_metro_s025:.2f}; paper
{paper_t4_metro_s025:.2f}) and TEMPO is best ({t4_zipf_tempo_s025:.2f}; paper {paper_t4_tempo_s025:.3f}); in the
mixed column TEMPO leads ({t4_zipf_tempo_s1:.2f}; paper {paper_t4_tempo_s1:.3f}); in the token-bound column (4×)
TEMPO ties token-LP ({t4_zipf_tempo_s4:.3f} vs {t4_zipf_token_lp_s4:.3f}: its ensemble selects it; paper
{paper_t4_tempo_s4:.3f} both). Magnitudes differ because the routing differs: FLAME-MoE's layers are nearly
balanced (the drift-16 swap barely moves EPLB's replica counts, static is already good: TEMPO
{t4_flame_tempo_s1:.2f}, and uniform equals static because both touch every replica), and our Zipf(1.2) is more
skewed than the paper's proxy traces. The R × K grid shows the paper's collapse at R = 16, K ≥ 16 on skewed routing
(every kernel within {grid_zipf_r16_k16_lo:.3f}–{grid_zipf_r16_k16_hi:.3f} of static: the drifted hot set has no
spare replicas, only placement can help).

*§5.13.* Under the proxy model the piece that sets TEMPO's bottleneck GPU is the {t3_zipf_128_term} at
B = 128, the {t3_zipf_512_term} at B = 512 and the {t3_zipf_1024_term} at B = 1024 on Zipf(1.2) (FLAME:
{t3_flame_128_term} / {t3_flame_512_term} / {t3_flame_1024_term}). TEMPO activates G ≈ {a2a_zipf_g:.1f} replicas
per GPU on average (paper: G ≈ {paper_a2a_g}; the proxy shape here has E = 64 experts, 8 per GPU, where the
paper's deployment had DSv3's 32), so `N* = (a + b·G − c2)/γ` ≈ {a2a_zipf_n_star:.0f} pairs per GPU here; the
paper's G gives {a2a_paper_check:.0f} (paper: {paper_a2a_n_star}, i.e. B*_a2a ≈ {paper_a2a_n_star} in its units,
K = 8 pairs per token ≈ concurrency); at K = 6 a GPU receives ≈ {pairs_per_token_per_gpu:.2f}·B pairs
here. Table 3's block ratios,
TEMPO / static at B = 128 / 512 / 1024: {t3_zipf_128:.3f} / {t3_zipf_512:.3f} / {t3_zipf_1024:.3f} on Zipf,
{t3_flame_128:.3f} / {t3_flame_512:.3f} / {t3_flame_1024:.3f} on FLAME (paper {paper_t3_128:.3f} /
{paper_t3_512:.3f} / {paper_t3_1024:.3f}). The modelled gain does not vanish past N* — the paper's measured
throughput gains do, which a model replay cannot show.
""")

# %%
print(f"notebook time {time.perf_counter() - t_start:.1f} s (SMALL={SMALL})")
