"""Expert-parallel MoE layer benchmark (`make bench-ep`): step time per policy and batch size.

Runs `tempo_jax.moe_forward` on every available device (8 fake CPU devices here; real GPUs when present;
all processes' devices when started under `jax.distributed`), with dispatch tables from each policy solved on
the batch's own counts. Times the jitted forward pass after warm-up (`block_until_ready`, median of repeats)
and reports compile time separately. On CPU it also times a dense GShard-style capacity-einsum MoE of the same
shapes (one-hot dispatch/combine tensors, capacity factor 1.25) as the baseline. Writes JSON.

    python scripts/bench_ep.py                       # default shapes
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

from solvers import PRESETS, DispatchProblem, Placement, solve  # noqa: E402
from tempo_jax import tables as T  # noqa: E402
from tempo_jax.moe import MoEConfig, init_params, make_ep_mesh, moe_forward, route  # noqa: E402
from tempo_jax.report import table  # noqa: E402


def dense_capacity_moe(params, x, config: MoEConfig, capacity_factor: float = 1.25):
    """GShard-style dense MoE: one-hot dispatch [T, E, C] and combine tensors, batched expert einsums."""
    T_, E, K = x.shape[0], config.experts, config.top_k
    C = int(np.ceil(T_ * K / E * capacity_factor))
    ids, w = route(x, params["router"], K, config.renormalize)
    onehot = jax.nn.one_hot(ids, E, dtype=jnp.int32)  # [T, K, E]
    pos = (jnp.cumsum(onehot.reshape(T_ * K, E), axis=0).reshape(T_, K, E) - 1) * onehot  # position in expert
    keep = (pos < C) & (onehot > 0)
    dispatch = (jax.nn.one_hot(pos, C) * keep[..., None]).sum(axis=1)  # [T, E, C]
    combine = (jax.nn.one_hot(pos, C) * (keep * w[..., None])[..., None]).sum(axis=1)
    xe = jnp.einsum("tec,th->ech", dispatch.astype(x.dtype), x)
    h = jax.nn.silu(jnp.einsum("ech,ehf->ecf", xe, params["w_gate"])) * jnp.einsum("ech,ehf->ecf", xe, params["w_up"])
    ye = jnp.einsum("ecf,efh->ech", h, params["w_down"])
    return jnp.einsum("tec,ech->th", combine.astype(x.dtype), ye)


def timed(fn, *args, repeats: int) -> tuple[float, float]:
    """(compile seconds, median step seconds) of a jitted fn."""
    jax.clear_caches()  # measure a cold compile, not a cache hit
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
    ap.add_argument("--batch-sizes", default="32,128,512", help="tokens per device")
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--top-k", type=int, default=6)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--ffn", type=int, default=128)
    ap.add_argument("--replication", type=float, default=1.25)
    ap.add_argument("--policies", default="uniform,static,token_lp,metro,tempo")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default="results/bench_ep.json")
    args = ap.parse_args(argv)
    if args.quick:
        args.batch_sizes, args.repeats, args.policies = "32,128", 3, "uniform,tempo"

    D = jax.device_count()
    E = args.experts
    slots = int(np.ceil(E * args.replication / D)) * D
    rng = np.random.default_rng(0)
    popularity = rng.zipf(1.6, E).astype(float)
    placement = Placement.from_eplb(popularity, slots, D)
    cfg = MoEConfig(hidden=args.hidden, ffn=args.ffn, experts=E, top_k=args.top_k,
                    slots_per_device=placement.slots_per_gpu, mode="quota")  # fmt: skip
    params = init_params(jax.random.key(0), cfg)
    mesh = make_ep_mesh(D)
    pa = T.placement_arrays(placement)
    cost = PRESETS["dsv3_fp8_offline"]
    rows, results = [], []
    print(f"{D} {jax.default_backend()} devices, {jax.process_count()} process(es); E={E}, top-{args.top_k}, "
          f"H={args.hidden}, F={args.ffn}, {slots} slots", flush=True)  # fmt: skip
    for B in [int(b) for b in args.batch_sizes.split(",")]:
        # A shared offset direction skews the router's choices like real routing does.
        x = jax.random.normal(jax.random.key(B), (B * D, args.hidden)) + jnp.asarray(rng.normal(size=(1, args.hidden)))

        def layer(params, x, table):
            return moe_forward(params, x, mesh=mesh, placement_arrays=pa, tables=T.Tables(table, pa.log2phy),
                               config=cfg)  # fmt: skip

        counts = jax.jit(layer)(params, x, T.uniform(placement).table).counts
        problem = DispatchProblem(np.asarray(counts), placement, cost)
        dense = None
        if jax.default_backend() == "cpu":
            dense = timed(lambda p, x: dense_capacity_moe(p, x, cfg), params, x, repeats=args.repeats)
        for policy in args.policies.split(","):
            d = solve(problem, policy)
            tables = {"static": T.static, "uniform": T.uniform}.get(policy)
            tables = tables(placement) if tables else T.from_dispatch(d)
            compile_s, step_s = timed(layer, params, x, tables.table, repeats=args.repeats)
            rec = dict(B=B, policy=policy, step_ms=step_s * 1e3, compile_s=compile_s, model_makespan_us=d.makespan,
                       dense_ms=dense[1] * 1e3 if dense else None,
                       vs_dense=step_s / dense[1] if dense else None)  # fmt: skip
            results.append(rec)
            rows.append((B, policy, rec["step_ms"], compile_s, d.makespan, rec["dense_ms"] or float("nan"),
                         rec["vs_dense"] or float("nan")))  # fmt: skip
            print(f"  B={B} {policy}: {rec['step_ms']:.2f} ms", flush=True)
    print(table(rows, ["B/dev", "policy", "step ms", "compile s", "model µs", "dense ms", "/dense"],
                title="\nEP MoE layer step time (forward, median) vs dense capacity-einsum MoE"))  # fmt: skip
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = dict(
        command="python " + " ".join(sys.argv),
        devices=D,
        backend=jax.default_backend(),
        processes=jax.process_count(),
        machine=platform.processor() or platform.machine(),
        args=vars(args),
    )
    out.write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
