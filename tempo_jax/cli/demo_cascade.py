"""The CascadeEP section of `make demo`: one prefill step, the planner's timelines, and the JAX layer running the
planned asynchronous schedule (+ OEWF) with the synchronous layer's output.

1. Twenty-four requests of the bundled Mooncake sample, placed round-robin on 8 replicas, form one prefill step
   (first chunk of each, up to 16,384 new tokens per replica). DeepSeek-V4-Flash costs (`tempo_jax.sim.cascade.costs`):
   per-replica attention, dispatch, and one MoE layer's timeline under Sync and CascadeEP (exact estimates).
2. The demo's small JAX layer (E = 64, top-6, 8 devices) gets the launch schedule (streamFFN groups in the
   predicted arrival order) and the OEWF fetches planned for its own routing at those arrival times, and
   computes the same output as the synchronous layer.
Figure ``results/demo_cascade.png``: the predicted per-rank timelines.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from solvers import LaunchSchedule, oewf_at_dispatch

from ..sim.cascade import CascadeConfig, StepModel
from ..sim.cascade.reference_timeline import LayerInputs, layer_timeline
from ..sim.cascade.serving import StepBatch
from ..text import table
from ..workloads.requests import load_mooncake_sample

D = 8
BUDGET = 16_384


def _step_batches(requests: int = 24) -> tuple[StepBatch, ...]:
    """One step: request i on replica i mod D, first chunk of each request under the per-replica token budget."""
    trace = load_mooncake_sample(limit=requests)
    out = []
    for d in range(D):
        ids, q, left = [], [], BUDGET
        for i in range(d, len(trace), D):
            if left == 0:
                break
            take = min(int(trace.input_len[i]), left)
            ids.append(i)
            q.append(take)
            left -= take
        ids = np.array(ids, np.int64)
        out.append(StepBatch(replica=d, request_ids=ids, q=q, P=np.zeros(len(ids)), I=trace.input_len[ids]))
    return tuple(out)


def planned_layer():
    """The step's batches, the layer's `LayerInputs` and its Sync / CascadeEP `LayerResult`s (V4-Flash costs; the
    rank-uniform schedule (launch="layer") on the paper's uncontended links: the kind the JAX layer below executes)."""
    model = StepModel(CascadeConfig(estimates="exact", timeline="reference"), "cascade")
    batches = _step_batches()
    x = model.step_inputs(batches, np.random.default_rng(0))
    layer = 1  # the second layer: OEWF's first
    inputs = LayerInputs(
        attention_us=x["att"][layer],
        dispatch_us=x["dispatch"][layer],
        pairs=model.expert_pairs(layer, x["pairs"][layer]),
    )
    res = {m: layer_timeline(inputs, model.costs, m, links="paper", launch="layer") for m in ("sync", "cascade")}
    return batches, inputs, res, model.costs


def cascade_demo(out_dir: Path) -> tuple[str, dict]:
    """Print the planner's timelines and run the JAX layer under them; returns (text, numbers for demo.json)."""
    import jax
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from solvers import Placement, slots_for

    from ..layer import MoEConfig, init_params, make_ep_mesh, moe_forward
    from ..layer import tables as dispatch_tables
    from ..layer.cascade_plan import fetch_bytes, fetches_from_plan, pair_tokens

    # Step 1: the planner's view of one layer of the step.
    batches, inputs, res, costs = planned_layer()
    sync, cas = res["sync"], res["cascade"]
    moves = {r.helper: f"{r.helper}→{r.donor}: {r.n_trans:.0f} tok" for r in cas.accepted}
    cols = (inputs.attention_us, inputs.ready_us, sync.rank_end_us, cas.rank_end_us)
    rows = [(d, batches[d].new_tokens, *(f"{c[d]:.0f}" for c in cols), moves.get(d, "")) for d in range(D)]
    heads = ["rank", "new tokens", "attention µs", "ready µs", "Sync done µs", "CascadeEP done µs", "OEWF helper"]
    text = table(
        rows,
        heads,
        title=f"CascadeEP planner, one layer of a Mooncake prefill step (V4-Flash, DP{D}+EP{D}):"
        f" Sync {sync.end_us:.0f} µs → CascadeEP {cas.end_us:.0f} µs",
    )

    # Step 2: the JAX layer under that schedule and OEWF plan (its own routing, the planner's arrival times).
    E, K = 64, 6
    placement = Placement.from_eplb(np.random.default_rng(0).zipf(1.6, E).astype(float), slots_for(E, D, 1.25), D)
    cfg = MoEConfig(
        hidden=64, ffn=32, experts=E, top_k=K, slots_per_rank=placement.slots_per_rank, dispatch_mode="quota"
    )
    mesh = make_ep_mesh(D)
    pa, tables = dispatch_tables.placement_arrays(placement), dispatch_tables.uniform(placement)
    params = init_params(jax.random.key(0), cfg, placement, mesh=mesh)
    x = jax.random.normal(jax.random.key(1), (D * 64, cfg.hidden))
    run = jax.jit(
        lambda p, x, c: moe_forward(p, x, mesh=mesh, placement_arrays=pa, tables=tables, config=c), static_argnums=2
    )
    first = run(params, x, cfg)
    pairs = pair_tokens(first.stats.replica_counts, placement)  # [D, D, E]
    arrival = inputs.ready_us
    schedule = LaunchSchedule.from_arrivals(arrival, pairs.sum(axis=2), mode="stream", threshold=pairs.sum() / D / 3)
    plan = oewf_at_dispatch(
        arrival, inputs.attention_us, inputs.dispatch_us, pairs.sum(axis=(0, 2)), pairs, **costs.oewf_budget()
    )
    fetches = fetches_from_plan(plan)
    import dataclasses

    outs = {"sync": np.asarray(first.out)}
    for name, c in (
        ("schedule", dataclasses.replace(cfg, schedule=schedule)),
        ("schedule + OEWF", dataclasses.replace(cfg, schedule=schedule, fetches=fetches)),
    ):
        outs[name] = np.asarray(run(params, x, c).out)
    diff = {k: float(np.abs(v - outs["sync"]).max()) for k, v in outs.items()}
    text += (
        f"\n\nThe JAX layer ({D} devices, E = {E}, top-{K}) under the planned schedule: launch groups "
        f"{[list(g) for g in schedule.groups]}, {len(fetches)} OEWF fetches "
        f"({fetch_bytes(fetches, cfg.hidden, cfg.ffn, cfg.dtype) / 1e3:.0f} KB of weights); "
        f"max |out − Sync| = {max(diff.values()):.1e} (schedule {diff['schedule']:.1e}, "
        f"+ OEWF {diff['schedule + OEWF']:.1e})"
    )

    # Step 3: figure — the planner's per-rank timelines.
    fig, axes = plt.subplots(2, 1, figsize=(10, 5.4), sharex=True)
    for ax, (name, r) in zip(axes, (("Sync", sync), ("CascadeEP", cas)), strict=True):
        for d in range(D):
            ax.barh(d, inputs.ready_us[d], color="0.8", height=0.6)
            for k in r.kernels[d]:
                ax.barh(d, k.end_us - k.start_us, left=k.start_us, color="C0", height=0.6, edgecolor="w")
        for s in r.side:
            ax.barh(s.rank + 0.32, s.end_us - s.start_us, left=s.start_us, color="C3", height=0.25)
        ax.axvline(r.end_us, color="k", lw=1)
        ax.set_title(f"{name}: layer done at {r.end_us:.0f} µs", fontsize=9, loc="left")
        ax.set_ylabel("rank")
    axes[-1].set_xlabel("µs (grey: attention + dispatch, blue: expert FFN kernels, red: OEWF reassigned kernel)")
    fig.tight_layout()
    path = Path(out_dir) / "demo_cascade.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    record = dict(
        sync_us=sync.end_us,
        cascade_us=cas.end_us,
        groups=[list(g) for g in schedule.groups],
        fetches=len(fetches),
        max_abs_diff=max(diff.values()),
    )
    return text + f"\nwrote {path}", record
