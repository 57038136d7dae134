"""`make demo` / `tempo-jax demo`: one real recorded batch and one synthetic batch, end to end.

1. Every cost preset's inflection n* (TEMPO Tables 6 and 7).
2. For a real FLAME-MoE batch and a synthetic Zipf batch at EP8 with an EPLB placement (1.25× replicas):
   per-GPU replicas, activated experts and tokens under EPLB's even split, and the regime statistics
   under the DSv3 preset.
3. For the real batch: every dispatch policy's modelled makespan, its ratio to tempo and to the proven
   optimum (OR-Tools MILP), and its solve time.
4. The JAX MoE layer (`moe_forward` on 8 devices) serving that batch under every policy: realised per-GPU
   tokens and activations, modelled makespan, and the check that outputs are identical across policies;
   figure ``results/demo_layer.png``.
5. CascadeEP (`tempo_jax.demo_cascade`): one Mooncake prefill step's planned layer timelines under Sync and
   CascadeEP, and the JAX layer running the planned asynchronous schedule + OEWF with identical outputs;
   figure ``results/demo_cascade.png``.
Numbers land in ``results/demo.json``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from solvers import PRESETS, SWEEP_POLICIES, DispatchProblem, Placement, slots_for, solve

from ..text import table
from ..workloads import SyntheticRouting, load_sample, regime_stats
from .args import fake_cpu_devices, prepare_out_dir, real
from .demo_cascade import cascade_demo

EP = 8
REPLICATION = 1.25
COST = "dsv3_fp8_offline"
POLICY_ORDER = [*SWEEP_POLICIES, "milp"]


def presets_table() -> str:
    rows = [
        (name, m.a, m.b, m.b2 if m.b2 is not None else float("nan"), m.c, m.beta, m.inflection)
        for name, m in PRESETS.items()
    ]
    return table(rows, ["preset", "a", "b", "b2", "c", "beta", "n*"], title="Cost presets (µs): n* = b/β")


def real_batch(tokens_per_rank: int = 128) -> tuple[str, np.ndarray, np.ndarray]:
    """FLAME-MoE-290M layer 2 (bundled copy of the recording): batch 0 ``[D, E]`` and the layer's total load."""
    trace = load_sample("flame_moe_290m")
    layer = trace.layers[0]
    counts = trace.batch_counts(layer, tokens_per_rank, EP, batch=0)
    label = f"FLAME-MoE-290M layer {layer}, recorded, B={tokens_per_rank} tokens/rank × {EP} ranks, top-{trace.top_k}"
    return label, counts, trace.expert_load(layer)


def synthetic_batch(tokens_per_rank: int = 128, s: float = 1.2, seed: int = 0) -> tuple[str, np.ndarray, np.ndarray]:
    """Synthetic Zipf(s) routing, E = 256, top-8, κ = 2000: one batch ``[D, E]`` and the long-run popularity."""
    routing = SyntheticRouting(num_experts=256, top_k=8, s=s, kappa=2000.0, seed=seed)
    counts = routing.batch(tokens_per_rank, EP, seed)
    label = f"Synthetic Zipf s={s}, E=256, top-8, κ=2000, B={tokens_per_rank} tokens/rank × {EP} ranks"
    return label, counts, routing.popularity


def eplb_placement(load: np.ndarray) -> Placement:
    return Placement.from_eplb(load, slots_for(load.shape[0], EP, REPLICATION), EP)


def batch_report(label: str, counts: np.ndarray, placement: Placement) -> tuple[str, dict]:
    problem = DispatchProblem(counts, placement, PRESETS[COST])
    even = solve(problem, "uniform")
    rows = [
        (g, placement.slots_per_rank, int(even.gpu_activations[g]), float(even.gpu_tokens[g]), float(even.gpu_times[g]))
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
        else:
            solve(problem, policy, **opts)  # warm-up: first-use imports (OR-Tools) are not a solve time
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
    hdr = ["policy", "makespan µs", "/tempo", "/OPT", "warm solve ms", "max experts", "max tokens"]
    return table(rows, hdr, title=title), out


def layer_demo(out_dir: Path, tokens_per_rank: int = 128) -> tuple[str, list[dict]]:
    """The JAX MoE layer on 8 (fake CPU) devices serving the recorded FLAME-MoE batch under every policy.

    Routing is replayed from the recording (top-6 ids, equal gate weights); each policy's solver dispatch
    becomes quota-mode tables; the layer's realised per-GPU tokens and activated slots are scored under the
    cost model. Outputs must be identical across policies (the central invariant) and equal the dense reference.
    """
    import jax
    import jax.numpy as jnp
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..layer import MoEConfig, init_params, make_ep_mesh, moe_forward, moe_reference, to_logical
    from ..layer import tables as dispatch_tables

    # Step 1: the recorded batch, its placement and a small SwiGLU layer with 64 experts.
    trace = load_sample("flame_moe_290m")
    layer = trace.layers[0]
    ids = trace.batch_topk_ids(layer, tokens_per_rank, EP, 0).reshape(-1, trace.top_k)
    weights = np.full(ids.shape, 1.0 / trace.top_k, np.float32)
    counts = trace.batch_counts(layer, tokens_per_rank, EP, 0)
    placement = eplb_placement(trace.expert_load(layer))
    cost = PRESETS[COST]
    cfg = MoEConfig(
        hidden=64,
        ffn=32,
        experts=trace.num_experts,
        top_k=trace.top_k,
        slots_per_rank=placement.slots_per_rank,
        dispatch_mode="quota",
    )
    mesh = make_ep_mesh(EP)
    params = init_params(jax.random.key(0), cfg, placement, mesh=mesh)  # physical: each rank its own slots
    x = jax.random.normal(jax.random.key(1), (ids.shape[0], cfg.hidden))
    pa = dispatch_tables.placement_arrays(placement)
    routing = (jnp.asarray(ids, jnp.int32), jnp.asarray(weights))

    @jax.jit
    def run(table):
        tables = dispatch_tables.keyed(table, pa)
        return moe_forward(params, x, mesh=mesh, placement_arrays=pa, tables=tables, config=cfg, routing=routing)

    ref = np.asarray(moe_reference(to_logical(params, placement), x, cfg, routing=routing))
    # Step 2: every policy → tables → the layer.
    rows, times, first = [], {}, None
    for policy in POLICY_ORDER[:-1]:
        d = solve(DispatchProblem(counts, placement, cost), policy)
        res = run(dispatch_tables.from_plan(d).table)  # by policy: static → per-source map, uniform → even, else flat x
        out = np.asarray(res.out)
        first = out if first is None else first
        acts, toks = np.asarray(res.stats.gpu_activations), np.asarray(res.stats.gpu_tokens)
        times[policy] = cost.gpu_times(acts, toks)
        rows.append(
            dict(
                policy=policy,
                planned=d.makespan,
                realised=float(times[policy].max()),
                max_experts=int(acts.max()),
                max_tokens=int(toks.max()),
                diff_vs_first=float(np.abs(out - first).max()),
                diff_vs_dense=float(np.abs(out - ref).max()),
            )
        )
    # Step 3: figure — per-GPU modelled time by policy.
    fig, ax = plt.subplots(figsize=(9, 3.6))
    width = 0.8 / len(times)
    for i, (policy, t) in enumerate(times.items()):
        ax.bar(np.arange(EP) + i * width, t, width, label=policy)
    ax.set_xticks(np.arange(EP) + 0.4 - width / 2, [f"GPU {g}" for g in range(EP)])
    ax.set_ylabel("modelled time (µs)")
    ax.set_title(f"JAX MoE layer, FLAME-MoE layer {layer} batch, EP{EP}, {COST}: realised per-GPU time by policy")
    ax.set_ylim(0, 1.3 * max(t.max() for t in times.values()))
    ax.legend(ncol=len(times), fontsize=8, loc="upper center")
    fig.tight_layout()
    fig.savefig(out_dir / "demo_layer.png", dpi=110)
    plt.close(fig)
    headers = ["policy", "planned µs", "realised µs", "max experts", "max tokens", "|Δ out| vs first", "|Δ| vs dense"]
    title = f"The MoE layer on {EP} devices, recorded routing, quota-mode tables (outputs must not change)"
    text = table([tuple(r.values()) for r in rows], headers, title=title)
    return text + f"\nwrote {out_dir / 'demo_layer.png'}", rows


def run_demo(out_dir: str | Path = "results", milp_time_limit: float = 10.0, layer: bool = True) -> dict:
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
    if layer:
        text, record["layer"] = layer_demo(out)
        print("\n" + text)
        text, record["cascade"] = cascade_demo(out)
        print("\n" + text)
    (out / "demo.json").write_text(json.dumps(record, indent=2, default=float))
    print(f"\nwrote {out / 'demo.json'} (EP{EP}, {REPLICATION}× replicas, cost model {COST})")
    return record


def register(add) -> None:
    """Add ``demo`` to the command line (``add(name, **kw)`` makes a subparser)."""
    p = add("demo", help="run the demo (make demo)")
    p.add_argument("--out", default="results", help="folder for demo.json and demo_layer.png (created if missing)")
    p.add_argument("--milp-time-limit", type=real(0.0), default=10.0, help="MILP time limit per solve, s (> 0)")
    p.set_defaults(fn=cmd_demo)


def cmd_demo(args) -> int:
    out = prepare_out_dir(args.out, writes="demo.json and demo_layer.png")
    fake_cpu_devices()
    run_demo(out_dir=out, milp_time_limit=args.milp_time_limit)
    return 0
