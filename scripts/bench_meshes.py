"""The layer on multi-axis meshes (`python scripts/bench_ep.py --meshes`, issue 49): the same global batch and the
same logical weights on every mesh, in one process and one run.

Meshes (data × ep × tensor, `tempo_jax.layer.make_mesh`): (8,) ep; (2, 4) and (4, 2) data × ep; (4, 2) ep × tensor;
(2, 2, 2); and (2, 4) data × ep with the expert weights FSDP-sharded over ``data``. For each:

- **FLOPs per device** of the compiled forward (``cost_analysis()``), and its ratio to the 1-D mesh's;
- **bytes of every collective** of the compiled forward and of the training step (``compiled.as_text()`` through
  `tempo_jax.layer.collectives.program_collectives`), grouped by kind and mesh axes: the exchange along ``ep``, the
  output's reduction along ``tensor``, the counts and losses over ``data``, FSDP's gathers and reduce-scatters, the
  gradients' all-reduce over ``data`` and the replicas' gradient sum (on XLA:CPU the padded exchange or the
  all-reduce, whichever sends fewer bytes; on GPU/TPU the ragged exchange, whose bytes per rank follow from the
  placement: its shared experts' rows — printed beside the all-reduce it replaces, also with every expert twice);
- **expert bytes per device**: S slots × slot bytes / Tp / Fp (read from the arrays' shards);
- the forward's **time**: the `tempo_jax.MoE` module under ``nnx.jit`` (median of interleaved calls after warm-up:
  each round calls every mesh's module once), and its ratio to the 1-D mesh.

Also the tensor axis's reduction measured both ways on its shape: one ``psum`` against ``psum_scatter`` + all-gather
(bytes per device from the HLO, time). Times on the 8 fake CPU devices of one host measure the program, not a
network; FLOPs and bytes are what a GPU run would move.
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from solvers import Placement, slots_for
from tempo_jax.layer import MoEConfig, init_logical_params, layer_axes, make_mesh, moe_forward, to_physical
from tempo_jax.layer import tables as dispatch_tables
from tempo_jax.layer.collectives import program_collectives
from tempo_jax.layer.module import MoE
from tempo_jax.layer.replicas import replica_sync_method, shared_rows, tie_buffer_rows
from tempo_jax.text import table

#: (label, make_mesh sizes, extra MoEConfig fields)
MESHES = [
    ("(8,) ep", dict(data=1, ep=8, tensor=1), {}),
    ("(2, 4) data × ep", dict(data=2, ep=4, tensor=1), {}),
    ("(4, 2) data × ep", dict(data=4, ep=2, tensor=1), {}),
    ("(4, 2) ep × tensor", dict(data=1, ep=4, tensor=2), {"tensor_axis": "tensor"}),
    ("(2, 2, 2)", dict(data=2, ep=2, tensor=2), {"tensor_axis": "tensor"}),
    ("(2, 4) data × ep, FSDP", dict(data=2, ep=4, tensor=1), {"fsdp_axis": "data"}),
]


def median_ms(fns: dict, repeats: int) -> dict:
    """Interleaved calls (each round times every function once): the median ms of each."""
    times = {k: [] for k in fns}
    for _ in range(repeats):
        for k, f in fns.items():
            t0 = time.perf_counter()
            jax.block_until_ready(f())
            times[k].append((time.perf_counter() - t0) * 1e3)
    return {k: statistics.median(v) for k, v in times.items()}


def _summary(colls) -> dict:
    """``{"kind over axes": {"count", "bytes", "wire_bytes"}}`` of a program's collectives (groups of one left out)."""
    out: dict = {}
    for c in colls:
        if c.group < 2:
            continue
        key = f"{c.kind} over {'×'.join(c.axes)}" + (" (tie)" if "tie_replicas" in c.op_name else "")
        row = out.setdefault(key, {"count": 0, "bytes": 0, "wire_bytes": 0})
        row["count"] += 1
        row["bytes"] += c.bytes
        row["wire_bytes"] += c.wire_bytes
    return out


def _tie(placement: Placement, cfg: MoEConfig, slot_bytes: int, colls=()) -> dict:
    """The replicas' gradient sum per rank (`tempo_jax.layer.replicas`): on a GPU/TPU the ragged exchange sends each
    rank's shared experts' rows (the most any rank sends, from the placement); the ring all-reduce of the Rb
    redundant rows it replaces; on XLA:CPU the collective ``"auto"`` takes with the padded exchange and its bytes
    from the compiled step's HLO (``colls``). ``slot_bytes``: one slot's bytes on one device."""
    D, S = placement.num_gpus, placement.slots_per_rank
    rb = tie_buffer_rows(cfg.experts, placement.num_slots)
    cpu = [c for c in colls if "tie_replicas" in c.op_name and c.group > 1]
    return {
        "gpu_exchange_rows_per_rank": int(shared_rows(placement).max()),
        "gpu_exchange_bytes_per_rank": int(shared_rows(placement).max()) * slot_bytes,
        "all_reduce_rows": rb,
        "all_reduce_wire_bytes_per_rank": int(2 * (D - 1) / D * rb * slot_bytes),
        "cpu_method": replica_sync_method("auto", "padded", num_ranks=D, slots_per_rank=S, num_experts=cfg.experts),
        "cpu_bytes": sum(c.bytes for c in cpu),
        "cpu_wire_bytes": sum(c.wire_bytes for c in cpu),
    }


def one_mesh(label, sizes, extra, base: MoEConfig, logical, x, load, replication, timed: dict) -> dict:
    """Every measure of one mesh but its time (see the module); ``timed[label]`` gets the module's jitted call."""
    mesh = make_mesh(**sizes)
    D = sizes["ep"]
    placement = Placement.from_eplb(load, slots_for(base.experts, D, replication), D)
    cfg = dataclasses.replace(base, slots_per_rank=placement.slots_per_rank, **extra)
    axes = layer_axes(cfg, mesh)
    params = to_physical(logical, placement, mesh=mesh, config=cfg)
    pa, tables = dispatch_tables.placement_arrays(placement), dispatch_tables.uniform(placement)
    xs = jax.device_put(x, NamedSharding(mesh, axes.token_spec))

    def forward(p, x):
        return moe_forward(p, x, mesh=mesh, placement_arrays=pa, tables=tables, config=cfg).out

    def train(p, x):
        return jax.grad(lambda p: jnp.mean(forward(p, x) ** 2))(p)

    compiled = jax.jit(forward).lower(params, xs).compile()
    flops = float(compiled.cost_analysis()["flops"])
    fwd_colls = program_collectives(compiled.as_text(), mesh)
    train_colls = program_collectives(jax.jit(train).lower(params, xs).compile().as_text(), mesh)
    # the time: the module as users run it, under nnx.jit (its own copy of the weights)
    moe = MoE(cfg, placement, mesh=mesh, rngs=nnx.Rngs(params=0, dispatch=1), params=jax.tree.map(jnp.copy, params))
    step = nnx.jit(lambda m, x: m(x))
    jax.block_until_ready(step(moe, xs))
    timed[label] = lambda: step(moe, xs)
    expert_bytes = sum(
        int(np.prod(v.addressable_shards[0].data.shape)) * v.dtype.itemsize
        for k, v in params.items()
        if k in ("w_gate", "w_up", "w_down")
    )
    slot_bytes = expert_bytes // placement.slots_per_rank  # one slot's share on one device
    twice = Placement.spread(cfg.experts, D, 2 * cfg.experts // D)  # every expert replicated twice (P = 2E)

    return {
        "mesh": label,
        "sizes": sizes,
        "config": {k: v for k, v in extra.items()},
        "D": D,
        "Ng": axes.groups,
        "slots_per_rank": placement.slots_per_rank,
        "flops_per_device": flops,
        "expert_bytes_per_device": expert_bytes,
        "forward_collectives": _summary(fwd_colls),
        "train_collectives": _summary(train_colls),
        "replica_sync": _tie(placement, cfg, slot_bytes, train_colls),
        "replica_sync_every_expert_twice": _tie(
            twice, dataclasses.replace(cfg, slots_per_rank=twice.slots_per_rank), slot_bytes
        ),
        "no_token_over_batch_axes": all(
            c.kind == "all-reduce" and c.bytes <= 4 * (2 * cfg.experts + 4)
            for c in fwd_colls
            if c.group > 1 and set(c.axes) & set(axes.batch) and not (axes.fsdp and c.axes == (axes.fsdp,))
        ),
    }


def tensor_reduction(rows: int, hidden: int, repeats: int) -> dict:
    """One ``psum`` over the tensor axis of a ``[rows, H]`` float32 output per device against ``psum_scatter`` +
    all-gather (the same result): bytes per device from the HLO and the median time."""
    mesh = make_mesh(data=1, ep=4, tensor=2)
    x = jax.device_put(jnp.ones((4 * rows, hidden)), NamedSharding(mesh, P("ep")))
    spec = P("ep")

    def psum(x):
        return jax.lax.psum(x, "tensor")

    def scatter_gather(x):
        return jax.lax.all_gather(
            jax.lax.psum_scatter(x, "tensor", scatter_dimension=0, tiled=True), "tensor", tiled=True
        )

    out, fns = {}, {}
    for name, body in (("psum", psum), ("psum_scatter + all_gather", scatter_gather)):
        f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False))
        colls = [c for c in program_collectives(f.lower(x).compile().as_text(), mesh) if c.group > 1]
        jax.block_until_ready(f(x))
        fns[name] = lambda f=f: f(x)
        out[name] = {
            "bytes": sum(c.bytes for c in colls),
            "wire_bytes": sum(c.wire_bytes for c in colls),
            "collectives": [c.kind for c in colls],
        }
    for name, ms in median_ms(fns, max(repeats, 20)).items():
        out[name]["ms"] = ms
    return out


def run(base: MoEConfig, *, tokens_per_device: int, replication: float, repeats: int) -> dict:
    """Every mesh at ``tokens_per_device`` (the same global batch), the tensor reduction, printed tables."""
    n = 8
    logical = jax.tree.map(np.asarray, init_logical_params(jax.random.key(0), base))
    x = np.asarray(jax.random.normal(jax.random.key(1), (tokens_per_device * n, base.hidden)))
    load = np.random.default_rng(0).zipf(1.6, base.experts).astype(float)
    rows, timed = [], {}
    for label, sizes, extra in MESHES:
        if base.ffn % sizes["tensor"] or base.hidden % (sizes["data"] if extra.get("fsdp_axis") else 1):
            continue
        print(f"  mesh {label} …", flush=True)
        rows.append(one_mesh(label, sizes, extra, base, logical, x, load, replication, timed))
    times = median_ms(timed, repeats)  # every mesh's module in each round, so drift touches all alike
    for r in rows:
        r["forward_ms"] = times[r["mesh"]]
    ref = rows[0]
    for r in rows:
        r["flops_vs_1d"] = r["flops_per_device"] / ref["flops_per_device"]
        r["time_vs_1d"] = r["forward_ms"] / ref["forward_ms"]
    reduction = tensor_reduction(tokens_per_device, base.hidden, repeats)

    def coll_text(summary):
        return "; ".join(f"{k} {v['bytes'] / 1e3:,.1f} kB" for k, v in summary.items())

    print(
        table(
            [
                (
                    r["mesh"],
                    f"{r['flops_per_device'] / 1e6:,.1f}",
                    f"{r['flops_vs_1d']:.3f}",
                    f"{r['expert_bytes_per_device'] / 1e3:,.0f}",
                    f"{r['forward_ms']:.1f}",
                    f"{r['time_vs_1d']:.2f}",
                    coll_text(r["forward_collectives"])[:100],
                )
                for r in rows
            ],
            ["mesh", "MFLOP/dev", "vs 1-D", "expert kB/dev", "fwd ms", "vs 1-D", "forward collectives (bytes/dev)"],
            title=f"\nThe layer on each mesh: {tokens_per_device * n} tokens, E={base.experts}, top-{base.top_k}, "
            f"H={base.hidden}, F={base.ffn}",
        )
    )

    def tie_row(r, key):
        t = r[key]
        return (
            r["mesh"],
            f"{t['gpu_exchange_rows_per_rank']} rows, {t['gpu_exchange_bytes_per_rank'] / 1e3:,.1f}",
            f"{t['all_reduce_rows']} rows, {t['all_reduce_wire_bytes_per_rank'] / 1e3:,.1f}",
        )

    heads = ["mesh", "GPU/TPU: ragged exchange, kB/rank", "all-reduce instead, wire kB/rank"]
    print(
        table(
            [
                (
                    *tie_row(r, "replica_sync"),
                    f"{r['replica_sync']['cpu_method']}: {r['replica_sync']['cpu_bytes'] / 1e3:,.1f}",
                    coll_text({k: v for k, v in r["train_collectives"].items() if "data" in k})[:70],
                )
                for r in rows
            ],
            [*heads, "CPU (padded): kB", "over data (train)"],
            title="\nTraining step: the replicas' gradient sum per rank, and the data-parallel reductions",
        )
    )
    print(
        table(
            [tie_row(r, "replica_sync_every_expert_twice") for r in rows],
            heads,
            title="\nThe replicas' gradient sum with every expert twice (Placement.spread(E, D, 2E/D), P = 2E)",
        )
    )
    print(
        table(
            [(k, f"{v['bytes']:,}", f"{v['wire_bytes']:,}", f"{v['ms']:.3f}") for k, v in reduction.items()],
            ["tensor reduction", "bytes/dev", "wire bytes/dev", "ms"],
            title=f"\nThe output's reduction over the tensor axis, [{tokens_per_device}, {base.hidden}] float32",
        )
    )
    return {"meshes": rows, "tensor_reduction": reduction, "tokens_per_device": tokens_per_device}
