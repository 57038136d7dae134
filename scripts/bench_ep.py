"""Expert-parallel MoE layer benchmark (`make bench-ep`): step time against compute baselines and a bound.

Runs `tempo_jax.moe_forward` on every available device (8 fake CPU devices here; real GPUs when present) and,
in the same run and process, the same tokens, router and expert weights through:

- **sorted gmm**: one device, every pair through the layer's own expert FFN (`stages.expert_ffn`: sorted by
  expert, the project's grouped GEMM) — the compute the layer must do, without the exchange and without
  splitting it over devices (the baseline the layer is measured against);
- **ragged_dot**: the same with `jax.lax.ragged_dot` (MaxText's dropless path);
- **dense bound**: three dense matmuls of the same FLOPs (every pair through one expert-sized FFN);
- **capacity einsum** (CPU only): a GShard-style dense capacity-einsum MoE (capacity factor 1.25).

The layer runs with the dropless worst-case capacity (``cap=worst``) and with the bucket that fits this batch
(``cap=auto``, what `MoE(capacity="auto")` uses). Times are medians after warm-up (`block_until_ready`),
compile time separate. Prints every ratio and writes JSON.

    python scripts/bench_ep.py                       # tokens per device 128, 512
    python scripts/bench_ep.py --quick
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from solvers import PRESETS, DispatchProblem, Placement, slots_for, solve  # noqa: E402
from tempo_jax.layer import (  # noqa: E402
    MoEConfig,
    capacity_bucket,
    init_params,
    make_ep_mesh,
    moe_forward,
    stages,  # noqa: E402
)
from tempo_jax.layer import tables as dispatch_tables  # noqa: E402
from tempo_jax.layer.presets import MOE_PRESETS, moe_preset  # noqa: E402
from tempo_jax.layer.stages import route  # noqa: E402
from tempo_jax.text import table  # noqa: E402


def dense_capacity_moe(params, x, config: MoEConfig, capacity_factor: float = 1.25):
    """GShard-style dense MoE: one-hot dispatch [T, E, C] and combine tensors, batched expert einsums."""
    T_, E, K = x.shape[0], config.experts, config.top_k
    C = int(np.ceil(T_ * K / E * capacity_factor))
    ids, w = route(x, params, config.router, K)[:2]
    onehot = jax.nn.one_hot(ids, E, dtype=jnp.int32)  # [T, K, E]
    pos = (jnp.cumsum(onehot.reshape(T_ * K, E), axis=0).reshape(T_, K, E) - 1) * onehot  # position in expert
    keep = (pos < C) & (onehot > 0)
    dispatch = (jax.nn.one_hot(pos, C) * keep[..., None]).sum(axis=1)  # [T, E, C]
    combine = (jax.nn.one_hot(pos, C) * (keep * w[..., None])[..., None]).sum(axis=1)
    xe = jnp.einsum("tec,th->ech", dispatch.astype(x.dtype), x)
    h = jax.nn.silu(jnp.einsum("ech,ehf->ecf", xe, params["w_gate"])) * jnp.einsum("ech,ehf->ecf", xe, params["w_up"])
    ye = jnp.einsum("ecf,efh->ech", h, params["w_down"])
    return jnp.einsum("tec,ech->th", combine.astype(x.dtype), ye)


def sorted_moe(params, x, config: MoEConfig, implementation: str):
    """One-device dropless MoE: route, then the layer's own expert FFN (`stages.expert_ffn`: pairs sorted by
    expert, gate+up and down grouped GEMMs, unsort) over every pair with the logical experts as groups, combine."""
    T_, K = x.shape[0], config.top_k
    ids, w = route(x, params, config.router, K)[:2]
    rows = x[jnp.arange(T_ * K) // K]
    y, _ = stages.expert_ffn(
        rows, ids.reshape(-1), params, expert=config.expert, gmm_impl=implementation, interpret=False
    )
    return jnp.einsum("tk,tkh->th", w.astype(y.dtype), y.reshape(T_, K, -1))


def dense_bound(params, x, config: MoEConfig):
    """The same FLOPs as the experts' work: every pair through one expert-sized SwiGLU FFN (a lower bound)."""
    xs = jnp.repeat(x, config.top_k, axis=0)
    h = jax.nn.silu(xs @ params["w_gate"][0]) * (xs @ params["w_up"][0])
    return h @ params["w_down"][0]


def timed(fn, *args, repeats: int) -> tuple[float, float]:
    """(compile seconds, median step seconds) of a jitted fn."""
    t0 = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_s = time.perf_counter() - t0
    jax.block_until_ready(compiled(*args))
    steps = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        steps.append(time.perf_counter() - t0)
    return compile_s, float(np.median(steps))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens-per-device", default="128,512", help="batch sizes, tokens per device")
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--top-k", type=int, default=6)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--ffn", type=int, default=128)
    ap.add_argument("--preset", choices=MOE_PRESETS, default=None,
                    help="run this model's MoE block (router, experts, shared experts) at the sizes above")  # fmt: skip
    ap.add_argument("--replication", type=float, default=1.25)
    ap.add_argument("--policies", default="uniform,tempo", help="dispatch tables the layer runs with")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default="results/bench_ep.json")
    args = ap.parse_args(argv)
    if args.quick:
        args.tokens_per_device, args.repeats, args.policies = "128", 3, "uniform"

    D = jax.device_count()
    E = args.experts
    placement = Placement.from_eplb(np.random.default_rng(0).zipf(1.6, E).astype(float),
                                    slots_for(E, D, args.replication), D)  # fmt: skip
    kw = dict(hidden=args.hidden, ffn=args.ffn, experts=E, top_k=args.top_k, slots_per_rank=placement.slots_per_rank,
              dispatch_mode="quota")  # fmt: skip
    cfg = moe_preset(args.preset, **kw) if args.preset else MoEConfig(**kw)
    params = init_params(jax.random.key(0), cfg)
    mesh = make_ep_mesh(D)
    pa = dispatch_tables.placement_arrays(placement)
    cost = PRESETS["dsv3_fp8_offline"]
    one = jax.devices()[0]
    print(f"{D} {jax.default_backend()} devices, {jax.process_count()} process(es); E={E}, top-{args.top_k}, "
          f"H={args.hidden}, F={args.ffn}, {placement.num_slots} slots", flush=True)  # fmt: skip
    rows, results = [], []
    for B in [int(b) for b in args.tokens_per_device.split(",")]:
        # A shared offset direction skews the router's choices like real routing does.
        rng = np.random.default_rng(B)
        x = jax.random.normal(jax.random.key(B), (B * D, args.hidden)) + jnp.asarray(rng.normal(size=(1, args.hidden)))

        def layer(params, x, table, capacity=None):
            return moe_forward(params, x, mesh=mesh, placement_arrays=pa, tables=dispatch_tables.keyed(table, pa),
                               config=cfg, capacity=capacity)  # fmt: skip

        first = jax.jit(layer)(params, x, dispatch_tables.uniform(placement).table)
        counts, need = np.asarray(first.counts), int(first.stats.max_block.max())
        worst = B * args.top_k
        # Step 1: the baselines, on one device, same tokens and weights.
        p1, x1 = jax.device_put(params, one), jax.device_put(x, one)
        base = {name: timed(fn, p1, x1, repeats=args.repeats)[1] for name, fn in (
            ("sorted gmm", lambda p, x: sorted_moe(p, x, cfg, "auto")),
            ("ragged_dot", lambda p, x: sorted_moe(p, x, cfg, "ragged_dot")),
            ("dense bound", lambda p, x: dense_bound(p, x, cfg)),
        )}  # fmt: skip
        if jax.default_backend() == "cpu":
            base["capacity einsum"] = timed(lambda p, x: dense_capacity_moe(p, x, cfg), p1, x1,
                                            repeats=args.repeats)[1]  # fmt: skip
        rec_base = {k: v * 1e3 for k, v in base.items()}
        # Step 2: the layer, per policy and capacity.
        for policy in args.policies.split(","):
            d = solve(DispatchProblem(counts, placement, cost), policy)
            tables = dispatch_tables.from_plan(d)  # the one plan → table seam (solvers.plan_weights)
            for cap_name, cap in (("worst", None), ("auto", capacity_bucket(need, cap=worst))):
                compile_s, step_s = timed(lambda p, x, t, c=cap: layer(p, x, t, c), params, x, tables.table,
                                          repeats=args.repeats)  # fmt: skip
                ms = step_s * 1e3
                rec = dict(tokens_per_device=B, policy=policy, capacity=cap_name, capacity_rows=cap or worst,
                           step_ms=ms, compile_s=compile_s, **{f"{k} ms": v for k, v in rec_base.items()},
                           vs_sorted_gmm=ms / rec_base["sorted gmm"], vs_dense=ms / rec_base["dense bound"],
                           model_makespan_us=d.makespan)  # fmt: skip
                results.append(rec)
                rows.append((B, policy, f"{cap_name} ({cap or worst})", f"{ms:.1f}", f"{rec_base['sorted gmm']:.1f}",
                             f"{rec['vs_sorted_gmm']:.2f}", f"{rec_base['ragged_dot']:.1f}",
                             f"{rec_base['dense bound']:.2f}", f"{rec['vs_dense']:.1f}",
                             f"{rec_base.get('capacity einsum', float('nan')):.1f}", f"{compile_s:.1f}"))  # fmt: skip
                print(f"  B={B} {policy} cap={cap_name}: {ms:.1f} ms", flush=True)
    heads = ["B/dev", "tables", "capacity", "layer ms", "sorted gmm ms", "layer/gmm", "ragged_dot ms", "dense ms",
             "layer/dense", "cap-einsum ms", "compile s"]  # fmt: skip
    print(table(rows, heads, title="\nEP MoE layer (forward, median) vs one-device baselines, same tokens"))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = dict(command="python " + " ".join(sys.argv), devices=D, backend=jax.default_backend(),
                processes=jax.process_count(), machine=platform.processor() or platform.machine(),
                cpus=os.cpu_count(), args=vars(args))  # fmt: skip
    out.write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
