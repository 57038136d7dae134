"""Where the expert-parallel layer's forward time goes (issue 56, item 1): the layer against its pieces, each alone.

On ``bench_ep.py``'s layer (E 64, top-6, H 256, F 128, an EPLB placement at 1.25× replication, quota dispatch, 8
fake CPU devices, tokens skewed by a shared offset) at ``--tokens-per-device`` (512), every variant interleaved in
one process (median of ``--repeats`` calls, compile separate):

- **sorted gmm, 1 device**: the baseline of `bench_ep.py` (route, the layer's expert FFN over every pair, combine);
- **layer**: `tempo_jax.MoE` under ``nnx.jit(..., graph=False)`` at each ``--capacity-factors`` value (the rounds
  each needs on this batch are printed);
- **FFN alone, valid rows**: each rank's expert FFN (`stages.expert_ffn`, its own slots) on B·K rows, the pairs it
  receives when the load is even — the distributed compute with nothing else;
- **FFN alone, padded buffer**: the same valid rows inside the padded exchange buffer of the default capacity
  (D·C rows per rank, the rest padding), as the layer's FFN sees them on CPU;
- **exchange alone**: the padded exchange's two ``all_to_all`` (there and back) of ``[D, C, H + 1]`` rows per rank;
- **routing alone**: the router GEMM and top-k on each rank's tokens.

Prints the table and writes ``results/bench_layer_stages.json``.

    python scripts/bench_layer_stages.py [--tokens-per-device 512] [--capacity-factors 2,1.5,1.25] [--repeats 15]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from bench_ep import median_ms, sorted_moe  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from solvers import Placement, slots_for  # noqa: E402
from tempo_jax.layer import MoEConfig, auto_capacity, init_logical_params, make_ep_mesh, to_physical  # noqa: E402
from tempo_jax.layer.module import MoE  # noqa: E402
from tempo_jax.layer.stages import expert_ffn, route  # noqa: E402
from tempo_jax.text import table  # noqa: E402


def variants(B: int, factors: list[float]) -> tuple[dict, dict, dict]:
    """``(fns, rounds per layer variant, facts)`` for ``B`` tokens per device."""
    D, E, K, H, F = jax.device_count(), 64, 6, 256, 128
    placement = Placement.from_eplb(np.random.default_rng(0).zipf(1.6, E).astype(float), slots_for(E, D, 1.25), D)
    S = placement.slots_per_rank
    base = MoEConfig(hidden=H, ffn=F, experts=E, top_k=K, slots_per_rank=S, dispatch_mode="quota")
    mesh = make_ep_mesh(D)
    logical = init_logical_params(jax.random.key(0), base)
    rng = np.random.default_rng(B)
    x = jax.random.normal(jax.random.key(B), (B * D, H)) + jnp.asarray(rng.normal(size=(1, H)))  # bench_ep's batch
    one = jax.devices()[0]
    p1, x1 = jax.device_put(logical, one), jax.device_put(x, one)
    sorted_one = jax.jit(lambda p, x: sorted_moe(p, x, base))
    fns = {"sorted gmm, 1 device": lambda: sorted_one(p1, x1)}
    fwd, rounds = nnx.jit(lambda m, x: m(x), graph=False), {}
    for f in factors:
        cfg = dataclasses.replace(base, capacity_factor=f)
        layer = MoE(
            cfg,
            placement,
            mesh=mesh,
            rngs=nnx.Rngs(params=0, dispatch=1),
            params=to_physical(logical, placement, mesh=mesh),
        )
        name = f"layer, capacity factor {f:g} (C = {auto_capacity(cfg, B, D)})"
        fns[name] = lambda m=layer: fwd(m, x)
        fwd(layer, x)
        rounds[name] = int(layer.stats.get_value().rounds[0])
    C = auto_capacity(base, B, D)
    phys = to_physical(logical, placement, mesh=mesh)
    weights = [phys[k] for k in ("w_gate", "w_up", "w_down")]

    def rank_ffn(r, s, wg, wu, wd):
        return expert_ffn(
            r, s, dict(w_gate=wg, w_up=wu, w_down=wd), expert=base.expert, gmm_impl="auto", interpret=False
        )[0]

    ffn = jax.jit(jax.shard_map(rank_ffn, mesh=mesh, in_specs=(P("ep"),) * 5, out_specs=P("ep"), check_vma=False))
    for label, M in (("valid rows", B * K), (f"padded buffer (D·C = {D * C} rows)", D * C)):
        slots = np.full((D, M), S, np.int32)  # S: padding
        slots[:, : B * K] = np.random.default_rng(1).integers(0, S, (D, B * K))
        rows, slot_ids = jax.random.normal(jax.random.key(2), (D * M, H)), jnp.asarray(slots.reshape(-1))
        fns[f"FFN alone, {label}"] = lambda r=rows, s=slot_ids: ffn(r, s, *weights)

    def there_and_back(b):
        out = jax.lax.all_to_all(b, "ep", 0, 0, tiled=True)
        return jax.lax.all_to_all(out[..., :H] * 2.0, "ep", 0, 0, tiled=True)

    a2a = jax.jit(jax.shard_map(there_and_back, mesh=mesh, in_specs=P("ep"), out_specs=P("ep"), check_vma=False))
    buf = jax.random.normal(jax.random.key(3), (D * D, C, H + 1))
    fns["exchange alone (two all_to_all, D·C rows)"] = lambda: a2a(buf)
    rt = jax.jit(
        jax.shard_map(
            lambda x, r: route(x, dict(router=r), base.router, K)[0],
            mesh=mesh,
            in_specs=(P("ep"), P()),
            out_specs=P("ep"),
            check_vma=False,
        )
    )
    fns["routing alone (router GEMM, top-k)"] = lambda: rt(x, logical["router"])
    return fns, rounds, dict(devices=D, experts=E, top_k=K, hidden=H, ffn=F, slots_per_rank=S, capacity=C)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens-per-device", type=int, default=512)
    ap.add_argument("--capacity-factors", default="2,1.5,1.25", help="comma-separated MoEConfig.capacity_factor")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--out", default="results/bench_layer_stages.json")
    args = ap.parse_args(argv)
    factors = [float(f) for f in args.capacity_factors.split(",") if f]
    load0 = os.getloadavg()
    fns, rounds, facts = variants(args.tokens_per_device, factors)
    for f in fns.values():  # compile, then one warm call
        jax.block_until_ready(f())
        jax.block_until_ready(f())
    ms = median_ms(fns, args.repeats)
    base = ms["sorted gmm, 1 device"]
    rows = [dict(variant=k, ms=v, vs_sorted_gmm=v / base, rounds=rounds.get(k)) for k, v in ms.items()]
    print(
        table(
            [(r["variant"], f"{r['ms']:.1f}", f"{r['vs_sorted_gmm']:.2f}", r["rounds"] or "") for r in rows],
            ["variant", "ms", "vs sorted gmm", "rounds"],
            title=f"\nThe layer's forward and its pieces alone, {args.tokens_per_device} tokens per device "
            f"(median of {args.repeats}, interleaved)",
        )
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = dict(argv=sys.argv[1:] if argv is None else argv, load=[load0[0], os.getloadavg()[0]], jax=jax.__version__)
    out.write_text(
        json.dumps(dict(meta=meta, setup=facts, tokens_per_device=args.tokens_per_device, rows=rows), indent=1)
    )
    print(f"load average {load0[0]:.1f} → {os.getloadavg()[0]:.1f}; wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
