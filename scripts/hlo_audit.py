"""What a layer call asks a GPU to do, stage by stage (issue 72, item 2): the layer lowered for CUDA from this host
(``lower(lowering_platforms=("cuda",))``, the exchange as a GPU runs it: `tempo_jax.layer.exchange.lowering_for`),
its StableHLO operations counted under each stage's named scope (`tempo_jax.layer.scopes`).

The data-movement operations a call makes around its grouped GEMMs — sorts, gathers, scatters, pads,
concatenations, dynamic slices — are the fixed cost an expert FFN carries on a GPU beyond its GEMMs: each is a
kernel launch (or several) per call. The audit names them and where they sit (``moe_ffn`` holds the ones between
the received rows and the first GEMM, and after the last), so each can be folded into the dispatch kernel or the
GEMM's prologue and the count checked again.

    python scripts/hlo_audit.py [--gmm tokamax] [--tokens-per-device 128] [--json results/hlo_audit.json]

Needs jax ≥ 0.12 (`make test-latest`'s environment: `.venv-latest`) for the Mosaic / tokamax GEMMs' CUDA lowering
on a host without a GPU. Prints one table per direction (forward; forward + backward) and writes the JSON.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import re
import sys
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import numpy as np  # noqa: E402

from solvers import Placement, slots_for  # noqa: E402
from tempo_jax.layer import MoEConfig, init_params, make_ep_mesh, moe_forward  # noqa: E402
from tempo_jax.layer import tables as dispatch_tables  # noqa: E402
from tempo_jax.layer.exchange import lowering_for  # noqa: E402
from tempo_jax.layer.scopes import STAGES, stage_kernels  # noqa: E402
from tempo_jax.text import table  # noqa: E402

#: The data movement a call makes around its grouped GEMMs (jaxpr primitive names).
MOVEMENT = ("sort", "gather", "scatter", "scatter-add", "pad", "concatenate", "dynamic_slice", "dynamic_update_slice")
#: The GEMMs (the grouped ones: ``ragged_dot_general``, tokamax's and XLA's; ``pallas_call``, the project's kernels).
GEMMS = ("dot_general", "ragged_dot_general", "pallas_call")
#: The collectives and loops.
OTHER = ("all_to_all", "ragged_all_to_all", "all_gather", "psum", "reduce_scatter", "while", "cumsum")
COUNTED = (*MOVEMENT, *GEMMS, *OTHER)


def _subjaxprs(params: dict):
    """The jaxprs inside an equation's parameters (shard_map's body, a loop's, a custom VJP's forward, …)."""
    for v in params.values():
        for u in v if isinstance(v, tuple | list) else (v,):
            if isinstance(u, jax.extend.core.ClosedJaxpr):
                yield u.jaxpr
            elif isinstance(u, jax.extend.core.Jaxpr):
                yield u


def audit(closed) -> dict[str, dict[str, int]]:
    """A traced call's ``closed`` jaxpr → ``{stage: {primitive: count}}`` for the `COUNTED` primitives, each under
    the innermost stage scope of its name stack (nested jaxprs inherit their equation's); ``"(outside)"``: none.
    Each primitive counts once where it is written: a loop's body once, not once per trip; a differentiated call's
    program may hold a stage more than once (the dropless rounds' first round and their loop, a custom VJP's primal
    beside its forward), so compare counts of one case before and after a change, not against a call's trips."""
    out: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)

    def walk(jaxpr, prefix: str):
        for eqn in jaxpr.eqns:
            names = f"{prefix}/{eqn.source_info.name_stack}"
            if eqn.primitive.name in COUNTED:
                stage = next((s for s in reversed(STAGES) if s in names), "(outside)")
                out[stage][eqn.primitive.name] += 1
            for sub in _subjaxprs(eqn.params):
                walk(sub, names)

    walk(closed.jaxpr, "")
    return {stage: dict(out[stage]) for stage in (*STAGES, "(outside)") if stage in out}


_TARGET = re.compile(r'call_target_name = "([^"]+)"|stablehlo\.custom_call @([\w$.]+)')


def custom_calls(text: str) -> dict[str, int]:
    """The custom calls of lowered StableHLO ``text`` by target (the GEMM kernels, the GPU sorts, …)."""
    found = collections.Counter()
    for a, b in _TARGET.findall(text):
        found[a or b] += 1
    return dict(found)


def layer_case(B: int, gmm: str, exchange: str = "auto"):
    """The audited layer: E 64 + 16 redundant slots, top-6, H 256, F 128, EP8, an EPLB placement of a Zipf load,
    ``B`` tokens per device, quota dispatch; the grouped GEMM ``gmm`` and the ``exchange`` (`MoEConfig.exchange`)."""
    D, E, K, H, F = 8, 64, 6, 256, 128
    placement = Placement.from_eplb(np.random.default_rng(0).zipf(1.6, E).astype(float), slots_for(E, D, 1.25), D)
    config = MoEConfig(
        hidden=H,
        ffn=F,
        experts=E,
        top_k=K,
        slots_per_rank=placement.slots_per_rank,
        dispatch_mode="quota",
        gmm_impl=gmm,
        exchange=exchange,
    )
    mesh = make_ep_mesh(D)
    params = init_params(jax.random.key(0), config, placement, mesh=mesh)
    x = jax.random.normal(jax.random.key(1), (B * D, H))
    pa, tables = dispatch_tables.placement_arrays(placement), dispatch_tables.uniform(placement)

    def loss(p, x):
        return moe_forward(p, x, mesh=mesh, placement_arrays=pa, tables=tables, config=config).out.sum()

    return loss, params, x, config


def traced(fn, *args):
    """``(jaxpr, StableHLO text)`` of ``jax.jit(fn)`` traced with the exchange as a GPU runs it and lowered for
    CUDA (the lowering proves the program is one a GPU can be given). The layer's inner jit caches its traces
    without `lowering_for`'s target, so the caches are cleared before (no CPU trace reused) and after (no GPU trace
    left for a CPU call)."""
    jax.clear_caches()
    try:
        with lowering_for("gpu"):
            t = jax.jit(fn).trace(*args)
            return t.jaxpr, t.lower(lowering_platforms=("cuda",)).as_text()
    finally:
        jax.clear_caches()


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gmm", default="tokamax", help="the grouped GEMM lowered (tokamax, mosaic, ragged_dot, …)")
    ap.add_argument("--tokens-per-device", type=int, default=128)
    ap.add_argument("--json", default="results/hlo_audit.json")
    ap.add_argument(
        "--compiled",
        action="store_true",
        help="also compile the forward for this machine's backend and count what each stage launches "
        "(`stage_kernels`; on a GPU: its kernels; the exchange as the backend runs it)",
    )
    args = ap.parse_args(argv)
    loss, params, x, config = layer_case(args.tokens_per_device, args.gmm)
    result = {
        "command": "python scripts/hlo_audit.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "jax": jax.__version__,
        "case": dataclasses.asdict(config) | {"tokens_per_device": args.tokens_per_device},
    }
    if args.compiled:  # this backend's own program: the exchange and kernels as it chooses them
        result["compiled_backend"] = jax.default_backend()
        result["compiled_forward"] = stage_kernels(jax.jit(loss).lower(params, x).compile().as_text())
        rows = [
            [stage, sum(ops.values()), ", ".join(f"{k} {v}" for k, v in ops.items())]
            for stage, ops in result["compiled_forward"].items()
        ]
        print(f"\ncompiled forward on {jax.default_backend()}: what each stage launches")
        print(table(rows, ["stage", "units", "by opcode"]))
    for direction, fn in (("forward", loss), ("forward_and_backward", jax.grad(loss))):
        jaxpr, text = traced(fn, params, x)
        result[direction] = audit(jaxpr)
        result[f"{direction}_custom_calls"] = custom_calls(text)
    for direction in ("forward", "forward_and_backward"):
        counts = result[direction]
        ops = [op for op in COUNTED if any(op in c for c in counts.values())]
        rows = [[stage, *(c.get(op, 0) for op in ops)] for stage, c in counts.items()]
        print(f"\n{direction.replace('_', ' ')} (jax {jax.__version__}, gmm {args.gmm}): StableHLO ops per stage")
        print(table(rows, ["stage", *ops]))
        print("CUDA custom calls:", result[f"{direction}_custom_calls"])
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1, default=str) + "\n")
    return result


if __name__ == "__main__":
    main()
