"""`tempo-jax plan`: will a preset's MoE layer fit on a mesh, and what does it send — its forward and one Adam training
step compiled ahead of time on fake CPU devices from shapes alone (`tempo_jax.layer.aot`), nothing allocated."""

from __future__ import annotations

import argparse
import json
import math

from ..text import table
from .args import int_at_least, prepare_out

__all__ = ["GPUS", "cmd_plan", "devices_needed", "plan_rows", "register"]

#: GPU memory per device a plan is checked against (bytes): an H100 SXM's 80 GB and an H200's 141 GB.
GPUS = {"H100 80 GB": 80e9, "H200 141 GB": 141e9}


def register(add) -> None:
    """Add ``plan`` to the command line (``add(name, **kw)`` makes a subparser)."""
    from ..layer.presets import MOE_PRESETS

    positive = int_at_least(1)
    p = add(
        "plan",
        help="will a preset's MoE layer fit on a mesh: memory per device and collectives, compiled ahead of time",
        description="Compile one MoE layer of a preset at its real size — its forward and one Adam training step — "
        "for a mesh of fake CPU devices from shapes alone (nothing is allocated), and print per device the "
        "arguments, outputs, temporaries and peak beside the analytic minimum (weights, Adam's moments, the "
        "exchange's row buffers), the collectives per mesh axis, and which GPU it fits.",
    )
    p.add_argument("--preset", required=True, choices=sorted(MOE_PRESETS), metavar="NAME", help="the model's MoE block")
    p.add_argument(
        "--mesh",
        default="ep=8",
        help="axis=size pairs, axes data / node / ep / tensor (default ep=8): e.g. ep=64, node=8,ep=8 (the experts "
        "over nodes × ranks) or data=2,ep=16,tensor=2",
    )
    p.add_argument(
        "--node-exchange",
        choices=("flat", "two_hop"),
        default="flat",
        help="with a node axis: one exchange over both axes (flat, default) or each token once per node and its pairs "
        "inside the node in rounds (two_hop)",
    )
    p.add_argument("--tokens-per-rank", type=positive, default=4096, help="tokens per token shard (default 4096)")
    p.add_argument(
        "--slots-per-rank",
        type=positive,
        help="expert slots per ep rank (default: ⌈E / ep⌉ + 1, one spare slot per rank for a replica)",
    )
    p.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16", help="weights and activations")
    p.add_argument("--no-train", action="store_true", help="compile the forward only")
    p.add_argument("--out", metavar="FILE", help="write the plan as JSON")
    p.set_defaults(fn=cmd_plan)


def devices_needed(argv: list[str]) -> int | None:
    """The fake CPU devices ``tempo-jax plan``'s ``--mesh`` needs (None: another command, or no usable --mesh: the
    parser reports it)."""
    if not argv or "plan" not in argv:
        return None
    from ..layer.mesh import parse_mesh

    text = "ep=8"
    for i, a in enumerate(argv):
        if a == "--mesh" and i + 1 < len(argv):
            text = argv[i + 1]
        elif a.startswith("--mesh="):
            text = a.split("=", 1)[1]
    try:
        sizes = parse_mesh(text)
    except ValueError:
        return None
    return math.prod(v for v in sizes.values() if v) if sizes["ep"] else None


def plan_for(
    preset: str,
    mesh_text: str,
    tokens_per_rank: int,
    *,
    slots_per_rank=None,
    dtype="bfloat16",
    train=True,
    node_exchange="flat",
):
    """``(config, AotPlan)`` of one preset's layer on the mesh ``mesh_text`` (`parse_mesh`'s form; with a node axis
    the experts span node × ep, crossing nodes by ``node_exchange``)."""
    import jax.numpy as jnp

    from ..layer.aot import aot_plan
    from ..layer.mesh import make_mesh, parse_mesh
    from ..layer.presets import moe_preset, preset_spec

    sizes = parse_mesh(mesh_text)
    mesh = make_mesh(**sizes)
    nodes = sizes["node"] > 1
    if node_exchange != "flat" and not nodes:
        raise ValueError(f"plan: node_exchange={node_exchange!r} crosses nodes; give a node axis (e.g. node=8,ep=8)")
    D = int(mesh.shape["ep"]) * sizes["node"]
    S = slots_per_rank or -(-preset_spec(preset).experts // D) + 1
    over_nodes = {"node_axis": "node", "node_exchange": node_exchange} if nodes else {}
    cfg = moe_preset(
        preset,
        slots_per_rank=S,
        dtype=jnp.dtype(dtype).type,
        tensor_axis="tensor" if sizes["tensor"] > 1 else None,
        **over_nodes,
    )
    return cfg, aot_plan(cfg, mesh, tokens_per_rank=tokens_per_rank, train=train)


def plan_rows(name: str, cfg, plan) -> dict:
    """One plan as a flat JSON-able record (bytes per device; ratios of the compiled to the analytic)."""
    a = plan.analytic
    row = {
        "preset": name,
        "mesh": "×".join(f"{k}={v}" for k, v in plan.axes.items() if v > 1) or "1",
        "devices": math.prod(plan.axes.values()),
        "experts": cfg.experts,
        "slots_per_rank": cfg.slots_per_rank,
        "tokens_per_rank": plan.tokens_per_rank,
        "capacity": a.capacity,
        "analytic": {"weights": a.weights, "moments": a.moments, "tokens": a.tokens, "row_buffers": a.row_buffers},
        "forward": vars(plan.forward) | {"peak": plan.forward.peak},
        "forward_temp_over_rows": plan.forward.temporaries / a.row_buffers,
        "collectives": plan.collectives,
    }
    if plan.train is not None:
        row["train"] = vars(plan.train) | {"peak": plan.train.peak}
        # a training step's temporaries at least: the gradients (the weights' size) and two rounds of row buffers
        row["train_temp_over_min"] = plan.train.temporaries / (a.weights + 2 * a.row_buffers)
    row["fits"] = [g for g, size in GPUS.items() if plan.fits(size)]
    return row


def _gb(b: float) -> str:
    return f"{b / 1e9:.2f}"


def cmd_plan(args: argparse.Namespace) -> int:
    out = prepare_out(args.out)
    cfg, plan = plan_for(
        args.preset,
        args.mesh,
        args.tokens_per_rank,
        slots_per_rank=args.slots_per_rank,
        dtype=args.dtype,
        train=not args.no_train,
        node_exchange=args.node_exchange,
    )
    row = plan_rows(args.preset, cfg, plan)
    a = plan.analytic
    print(
        f"{args.preset} on {row['mesh']} ({row['devices']} devices): E {cfg.experts}, {cfg.slots_per_rank} slots per "
        f"rank, {plan.tokens_per_rank} tokens per rank, capacity C {a.capacity} rows per block, {args.dtype}"
    )
    lines = []
    for name, mem in (("forward", plan.forward), ("train step", plan.train)):
        if mem is not None:
            lines.append(
                (name, _gb(mem.arguments), _gb(mem.outputs), _gb(mem.temporaries), _gb(mem.aliased), _gb(mem.peak))
            )
    print(table(lines, ("program", "arguments GB", "outputs GB", "temporaries GB", "aliased GB", "peak GB")))
    print(
        f"analytic per device: weights {_gb(a.weights)} GB, Adam moments {_gb(a.moments)} GB, row buffers "
        f"{_gb(a.row_buffers)} GB (forward temporaries / row buffers = {row['forward_temp_over_rows']:.2f})"
    )
    for name, rows in plan.collectives.items():
        parts = [
            f"{r['kind']} over {'×'.join(r['axes']) or 'one device'} ×{r['count']}: {_gb(r['bytes'])} GB" for r in rows
        ]
        print(f"collectives ({name}): " + ("; ".join(parts) or "none"))
    print("fits: " + (", ".join(row["fits"]) or f"none of {', '.join(GPUS)}"))
    if out is not None:
        out.write_text(json.dumps(row, indent=1))
        print(f"wrote {out}")
    return 0
