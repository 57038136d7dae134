"""CascadeEP in the JAX layer (`make bench-cascade`): Sync / Async / Async+SF / CascadeEP under attention imbalance.

Each rank first runs an "attention" stand-in whose length follows the per-replica prefill load of real requests
(the bundled Mooncake sample placed round-robin on D replicas: a chain of small matmuls, one per 512 new
tokens), then the MoE layer (`tempo_jax.moe_forward`) with:

- **Sync**: one all-to-all (``schedule="sync"``);
- **Async**: one launch group per source rank, in the predicted arrival order;
- **Async+SF**: launch groups by streamFFN's threshold on the predicted arrivals (`LaunchSchedule.from_arrivals`);
- **CascadeEP**: Async+SF plus the OEWF fetches `solvers.oewf_at_dispatch` plans on the predicted state.

Predicted arrivals come from the stand-in's lengths (exact estimates); pairs per (source, destination, expert)
from a first run's routing. It checks that every mode computes the synchronous layer's output and reports the
median step time (compile separate), writes JSON and a bar chart.

On CPU (fake devices) the collectives are synchronous and the devices share two cores, so nothing overlaps:
the CPU numbers measure overhead, not CascadeEP's gain. The GPU check (`scripts/gpu_check.sh`) runs this with
XLA's latency-hiding scheduler.

    python scripts/bench_cascade.py             # tokens per device 256
    python scripts/bench_cascade.py --quick
"""

from __future__ import annotations

import argparse
import dataclasses
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
from jax.sharding import PartitionSpec as P  # noqa: E402

from solvers import LaunchSchedule, Placement, oewf_at_dispatch, slots_for  # noqa: E402
from tempo_jax.cli.args import block_options  # noqa: E402
from tempo_jax.layer import MoEConfig, init_params, make_ep_mesh, moe_forward  # noqa: E402
from tempo_jax.layer import tables as dispatch_tables  # noqa: E402
from tempo_jax.layer.cascade_plan import fetch_bytes, fetches_from_plan, pair_tokens  # noqa: E402
from tempo_jax.layer.presets import moe_preset  # noqa: E402
from tempo_jax.sim import prefill_costs  # noqa: E402
from tempo_jax.text import table  # noqa: E402
from tempo_jax.workloads.requests import load_mooncake_sample  # noqa: E402

MODES = ("sync", "async", "async_sf", "cascade")
US_PER_ITER = 100.0  # nominal µs of one stand-in matmul, for the planner's predicted times


def replica_iterations(D: int, requests: int, max_iters: int) -> np.ndarray:
    """``[D]`` stand-in lengths: new tokens per replica of the first ``requests`` Mooncake requests placed
    round-robin, scaled so the busiest replica runs ``max_iters`` matmuls."""
    trace = load_mooncake_sample(limit=requests)
    load = np.bincount(np.arange(len(trace)) % D, weights=trace.input_len, minlength=D)
    return np.maximum(1, np.round(max_iters * load / load.max())).astype(np.int32)


def attention_stand_in(mesh, iters: np.ndarray, width: int):
    """x [T, H] → x (unchanged values) after rank d ran ``iters[d]`` dependent [T/D, width] matmuls."""
    a = jax.random.normal(jax.random.key(9), (width, width)) / np.sqrt(width)
    n = jnp.asarray(iters)

    def body(x, n, a):
        h0 = jnp.tanh(x[:, :1] * jnp.ones((1, width)))
        h = jax.lax.fori_loop(0, n[jax.lax.axis_index("ep")], lambda _, h: jnp.tanh(h @ a), h0)
        return x + 0.0 * h.sum()  # the MoE waits for this rank's "attention"

    f = jax.shard_map(body, mesh=mesh, in_specs=(P("ep"), P(), P()), out_specs=P("ep"), check_vma=False)
    return lambda x: f(x, n, a)


def measure(
    *,
    tokens_per_device: int,
    experts: int,
    top_k: int,
    hidden: int,
    ffn: int,
    requests: int,
    max_iters: int,
    repeats: int,
    gmm_impl: str = "auto",
    interpret: bool = False,
    preset: str | None = None,
) -> dict:
    """Run every mode on the same inputs; returns ``{"meta": ..., "results": [...], "equal_outputs": bool}``.
    ``preset``: a `tempo_jax.layer.presets` name whose block (router, experts, shared experts) the layer runs, at
    the given experts / top_k / hidden / ffn."""
    # Step 1: the layer, the placement and the imbalance.
    D, E, B = jax.device_count(), experts, tokens_per_device
    rng = np.random.default_rng(0)
    placement = Placement.from_eplb(rng.zipf(1.6, E).astype(float), slots_for(E, D, 1.25), D)
    kw = dict(
        hidden=hidden,
        ffn=ffn,
        experts=E,
        top_k=top_k,
        slots_per_rank=placement.slots_per_rank,
        dispatch_mode="quota",
        gmm_impl=gmm_impl,
        interpret=interpret,
    )
    base = moe_preset(preset, **kw) if preset else MoEConfig(**kw)
    mesh = make_ep_mesh(D)
    params = init_params(jax.random.key(0), base, placement, mesh=mesh)
    pa, tables = dispatch_tables.placement_arrays(placement), dispatch_tables.uniform(placement)
    x = jax.random.normal(jax.random.key(1), (B * D, hidden)) + jnp.asarray(rng.normal(size=(1, hidden)))
    iters = replica_iterations(D, requests, max_iters)
    attend = attention_stand_in(mesh, iters, hidden)

    # Step 2: what the planner knows: arrivals (exact), pairs per (source, destination, expert) from routing.
    first = moe_forward(params, x, mesh=mesh, placement_arrays=pa, tables=tables, config=base)
    pairs = pair_tokens(first.stats.replica_counts, placement)  # [D, D, E]
    costs = prefill_costs("deepseek_v4_flash", num_ranks=8)
    arrival = iters * US_PER_ITER
    sf = LaunchSchedule.from_arrivals(arrival, pairs.sum(axis=2), mode="stream", threshold=pairs.sum() / D / 3)
    plan = oewf_at_dispatch(arrival, arrival, np.zeros(D), pairs.sum(axis=(0, 2)), pairs, **costs.oewf_budget())
    fetches = fetches_from_plan(plan)
    async_ = LaunchSchedule.from_arrivals(arrival, pairs.sum(axis=2), mode="async")
    configs = {
        "sync": base,
        "async": dataclasses.replace(base, schedule=async_),
        "async_sf": dataclasses.replace(base, schedule=sf),
        "cascade": dataclasses.replace(base, schedule=sf, fetches=fetches),
    }

    # Step 3: every mode, same inputs; compile separately, then the median step.
    results, outs = [], {}
    for mode, cfg in configs.items():
        step = jax.jit(
            lambda p, x, c=cfg: moe_forward(p, attend(x), mesh=mesh, placement_arrays=pa, tables=tables, config=c).out
        )
        t0 = time.perf_counter()
        compiled = step.lower(params, x).compile()
        compile_s = time.perf_counter() - t0
        outs[mode] = np.asarray(jax.block_until_ready(compiled(params, x)), np.float32)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            jax.block_until_ready(compiled(params, x))
            times.append(time.perf_counter() - t0)
        groups = len(cfg.schedule.groups) if cfg.schedule != "sync" else 1
        results.append(
            dict(
                mode=mode,
                step_ms=float(np.median(times)) * 1e3,
                compile_s=compile_s,
                max_abs_diff_vs_sync=float(np.abs(outs[mode] - outs["sync"]).max()),
                launch_groups=groups,
                fetches=len(cfg.fetches),
                fetch_bytes=fetch_bytes(cfg.fetches, hidden, ffn, cfg.dtype),
            )
        )
        print(f"  {mode}: {results[-1]['step_ms']:.1f} ms (compile {compile_s:.1f} s)", flush=True)
    meta = dict(
        devices=D,
        backend=jax.default_backend(),
        iterations=iters.tolist(),
        schedule_groups=[list(g) for g in sf.groups],
        fetches=[dataclasses.asdict(f) for f in fetches],
    )
    ok = all(r["max_abs_diff_vs_sync"] < 1e-3 for r in results)
    return {"meta": meta, "results": results, "equal_outputs": ok}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens-per-device", type=int, default=256)
    block_options(ap)
    ap.add_argument("--requests", type=int, default=64, help="Mooncake requests setting the per-replica imbalance")
    ap.add_argument("--max-iters", type=int, default=40, help="stand-in matmuls of the busiest replica")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default="results/bench_cascade.json")
    args = ap.parse_args(argv)
    if args.quick:
        args.tokens_per_device, args.repeats, args.max_iters = 64, 2, 8
    kw = {k: v for k, v in vars(args).items() if k not in ("quick", "out")}
    res = measure(**kw)
    results, D, iters = res["results"], res["meta"]["devices"], res["meta"]["iterations"]
    rows = [
        (
            r["mode"],
            f"{r['step_ms']:.1f}",
            f"{r['step_ms'] / results[0]['step_ms']:.2f}",
            f"{r['compile_s']:.1f}",
            f"{r['max_abs_diff_vs_sync']:.1e}",
            r["launch_groups"],
            r["fetches"],
            f"{r['fetch_bytes'] / 1e3:.0f}",
        )
        for r in results
    ]
    heads = ["mode", "step ms", "vs Sync", "compile s", "max |Δ| vs Sync", "groups", "fetches", "fetched KB"]
    title = (
        f"\nattention stand-in iterations per rank {iters}; {jax.default_backend()} ({D} devices)"
        " — CPU collectives do not overlap"
    )
    print(table(rows, heads, title=title))
    print("every mode computes the synchronous layer's output:", res["equal_outputs"])

    # JSON and a figure.
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    res["meta"] |= dict(
        command="python " + " ".join(sys.argv),
        machine=platform.processor() or platform.machine(),
        cpus=os.cpu_count(),
        args=vars(args),
    )
    out.write_text(json.dumps(res, indent=1))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    axes[0].bar(range(D), iters, color="0.6")
    axes[0].set(xlabel="rank", ylabel="attention stand-in matmuls", title="induced imbalance (Mooncake, RR)")
    axes[1].bar([r["mode"] for r in results], [r["step_ms"] for r in results], color=["C0", "C1", "C2", "C3"])
    axes[1].set(ylabel="step ms (median)", title=f"{jax.default_backend()}: layer step per mode")
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=110)
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0 if res["equal_outputs"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
