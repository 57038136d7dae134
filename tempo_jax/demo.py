"""`make demo` / `tempo-jax demo`: one real recorded batch and one synthetic batch, end to end.

1. Every cost preset's inflection n* (TEMPO Tables 6 and 7).
2. For a real FLAME-MoE batch and a synthetic Zipf batch at EP8 with an EPLB placement (1.25× replicas):
   per-GPU replicas, activated experts and tokens under EPLB's even split, and the regime statistics
   under the DSv3 preset.
3. For the real batch: every dispatch policy's modelled makespan, its ratio to tempo and to the proven
   optimum (OR-Tools MILP), and its solve time.
Numbers land in ``results/demo.json``. numpy + solvers only (no JAX compile).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

import solvers
from solvers import PRESETS, DispatchProblem, Placement, solve

from .report import table
from .workloads import SyntheticRouting, load_sample, regime_stats

EP = 8
REPLICATION = 1.25
COST = "dsv3_fp8_offline"
POLICY_ORDER = ["static", "uniform", "token_lp", "metro", "llep", "tempo", "milp"]


def presets_table() -> str:
    rows = [
        (name, m.a, m.b, m.b2 if m.b2 is not None else float("nan"), m.c, m.beta, m.inflection)
        for name, m in PRESETS.items()
    ]
    return table(rows, ["preset", "a", "b", "b2", "c", "beta", "n*"], title="Cost presets (µs): n* = b/β")


def real_batch(tokens_per_rank: int = 128) -> tuple[str, np.ndarray, np.ndarray]:
    """FLAME-MoE-290M layer 2 (bundled copy of the recording): batch 0 ``[G, E]`` and the layer's total load."""
    trace = load_sample("flame_moe_290m")
    layer = trace.layers[0]
    counts = trace.batch_counts(layer, tokens_per_rank, EP, batch=0)
    label = f"FLAME-MoE-290M layer {layer}, recorded, B={tokens_per_rank} tokens/rank × {EP} ranks, top-{trace.top_k}"
    return label, counts, trace.expert_load(layer)


def synthetic_batch(tokens_per_rank: int = 128, s: float = 1.2, seed: int = 0) -> tuple[str, np.ndarray, np.ndarray]:
    """Synthetic Zipf(s) routing, E = 256, top-8, κ = 2000: one batch ``[G, E]`` and the long-run popularity."""
    routing = SyntheticRouting(num_experts=256, top_k=8, s=s, kappa=2000.0, seed=seed)
    counts = routing.batch(tokens_per_rank, EP, seed)
    label = f"Synthetic Zipf s={s}, E=256, top-8, κ=2000, B={tokens_per_rank} tokens/rank × {EP} ranks"
    return label, counts, routing.popularity


def eplb_placement(load: np.ndarray) -> Placement:
    E = load.shape[0]
    slots = int(round(E * REPLICATION / EP)) * EP
    return Placement.from_eplb(load, slots, EP)


def batch_report(label: str, counts: np.ndarray, placement: Placement) -> tuple[str, dict]:
    problem = DispatchProblem(counts, placement, PRESETS[COST])
    even = solve(problem, "uniform")
    rows = [
        (g, placement.slots_per_gpu, int(even.gpu_activations[g]), float(even.gpu_tokens[g]), float(even.gpu_times[g]))
        for g in range(EP)
    ]
    stats = regime_stats(counts, PRESETS[COST].inflection)
    text = table(rows, ["gpu", "slots", "experts", "tokens", "time µs"], title=f"{label}\n  {placement}; EPLB even")
    text += (
        f"\n  regime under {COST} (n*={PRESETS[COST].inflection:.0f}): {stats.activated} activated experts, "
        f"{stats.flat_expert_fraction:.0%} flat, {stats.linear_token_fraction:.0%} of tokens linear, "
        f"mixed={stats.mixed}"
    )
    return text, {"label": label, "regime": stats.__dict__, "uniform_gpu_tokens": even.gpu_tokens.tolist()}


def policy_table(counts: np.ndarray, placement: Placement, milp_time_limit: float) -> tuple[str, list[dict]]:
    problem = DispatchProblem(counts, placement, PRESETS[COST])
    results = {}
    for policy in POLICY_ORDER:
        opts = {"time_limit": milp_time_limit} if policy == "milp" else {}
        if policy == "milp":
            opts["hint"] = results["tempo"].x
        results[policy] = solve(problem, policy, **opts)
    milp = results["milp"]
    bound = max(milp.lower_bound, results["tempo"].lower_bound)
    rows, out = [], []
    for policy, d in results.items():
        r = dict(
            policy=policy,
            makespan=d.makespan,
            vs_tempo=d.makespan / results["tempo"].makespan,
            vs_opt=d.makespan / bound,
            solve_ms=d.info["solve_time_s"] * 1e3,
            max_experts=int(d.gpu_activations.max()),
            max_tokens=float(d.gpu_tokens.max()),
        )
        out.append(r)
        rows.append(tuple(r.values()))
    status = milp.info.get("status", "?")
    title = (
        f"Every policy on the real batch ({COST}); OPT bound {bound:.1f} µs from the MILP "
        f"({milp.info.get('backend', '?')}, status {status})"
    )
    hdr = ["policy", "makespan µs", "/tempo", "/OPT", "solve ms", "max experts", "max tokens"]
    return table(rows, hdr, title=title), out


def run_demo(out_dir: str | Path = "results", milp_time_limit: float = 10.0) -> dict:
    """Print the demo and write ``<out_dir>/demo.json``; returns the recorded numbers."""
    print(presets_table(), end="\n\n")
    record: dict = {"presets": {k: v.inflection for k, v in PRESETS.items()}, "batches": []}
    real = None
    for make in (real_batch, synthetic_batch):
        label, counts, load = make()
        placement = eplb_placement(load)
        text, rec = batch_report(label, counts, placement)
        print(text, end="\n\n")
        record["batches"].append(rec)
        real = real or (counts, placement)
    text, rows = policy_table(*real, milp_time_limit=milp_time_limit)
    print(text)
    record["policies"] = rows
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "demo.json").write_text(json.dumps(record, indent=2, default=float))
    print(f"\nwrote {out / 'demo.json'}  (solvers {solvers.__name__}, EP{EP}, replication {REPLICATION}×)")
    return record
