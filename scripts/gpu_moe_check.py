"""GPU check of the MoE layer: the ragged_all_to_all exchange and the Pallas kernels against the padded/XLA
path and the dense reference, on every visible device; the model-family presets (`--presets`, default a
DeepSeek-V3 and a gpt-oss block at reduced E) against the dense reference; then CascadeEP's launch schedules and
OEWF fetches against the synchronous layer (equal outputs, step time per mode, `scripts/bench_cascade.py`;
gpu_check.sh runs this step with XLA's latency-hiding scheduler). Part of scripts/gpu_check.sh.

    python scripts/gpu_moe_check.py --out results/gpu/moe_check.json       # on a GPU machine
    python scripts/gpu_moe_check.py --smoke --out /tmp/moe_check.json       # CPU: padded exchange, interpret

On CPU (`--smoke`) the ragged exchange cannot run (XLA:CPU lacks ragged_all_to_all), so only the padded
exchange is checked there, with the Pallas kernels in interpret mode. Every case is guarded: one that fails
is recorded with its error and the others still run. Exit status 1 when any case fails or errs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_cascade

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from pallas_kernels import fp8_path, tokamax_backend  # noqa: E402
from solvers import Placement  # noqa: E402
from tempo_jax.layer import MoEConfig, init_params, make_ep_mesh, moe_forward, moe_reference, to_logical  # noqa: E402
from tempo_jax.layer import tables as dispatch_tables  # noqa: E402
from tempo_jax.layer.presets import moe_preset  # noqa: E402

PRESETS = ("deepseek_v3", "gpt_oss_20b")

TOL = 2e-2  # max |y − dense| with TF32 dots on GPU; float32 on CPU lands near 1e-6


def check_layer(*, smoke: bool) -> dict:
    """Run every (exchange, gmm implementation) pair on one batch, and each implementation with FP8 experts; max
    |y − dense reference| (FP8: the reference on the same dequantized weights), drops, and the jitted layer's
    median time a call (end to end: route, dispatch, exchange, expert FFN, return, combine)."""
    D = jax.device_count()
    E, tokens, hidden, ffn = (16, 32, 32, 16) if smoke else (16, 256, 128, 64)
    placement = Placement.from_eplb(np.arange(E) + 1.0, max(4 * D, E), D)
    x = jax.random.normal(jax.random.key(2), (D * tokens, hidden))
    mesh = make_ep_mesh(D)
    pa, tables = (
        dispatch_tables.placement_arrays(placement),
        dispatch_tables.perturbed(dispatch_tables.uniform(placement), seed=1),
    )
    exchanges = ("padded",) if smoke else ("padded", "ragged", "ragged_split")
    tokamax = ("tokamax",) if tokamax_backend.available() else ()
    impls = (("chunked", "pallas") if smoke else ("ragged_dot", "pallas")) + tokamax
    out = {}
    # FP8 experts (DeepSeek's block-scaled e4m3 beside bf16 activations) on the first exchange: tokamax takes them
    # into its kernel where this GPU compiles it, the others dequantize per rank first (`fp8_path`, recorded)
    cases = [(ex, g, None) for ex in exchanges for g in impls] + [(exchanges[0], g, "fp8_block") for g in impls]
    for exchange, gmm_impl, expert_dtype in cases:
        name = f"{exchange}/{gmm_impl}" + ("/fp8" if expert_dtype else "")
        cfg = MoEConfig(
            hidden=hidden,
            ffn=ffn,
            experts=E,
            top_k=2,
            slots_per_rank=placement.slots_per_rank,
            exchange=exchange,
            gmm_impl=gmm_impl,
            interpret=smoke,
            expert_dtype=expert_dtype,
            dtype=jnp.bfloat16 if expert_dtype else jnp.float32,
        )
        try:
            params = init_params(jax.random.key(1), cfg, placement, mesh=mesh)
            fwd = jax.jit(
                lambda p, x, c=cfg: moe_forward(p, x, mesh=mesh, placement_arrays=pa, tables=tables, config=c)
            )
            res = fwd(params, x)
            ref = moe_reference(to_logical(params, placement), x, cfg).astype(jnp.float32)
            err = float(jnp.abs(res.out.astype(jnp.float32) - ref).max())
            if expert_dtype:  # bf16 activations: relative to the output's scale
                err /= max(1.0, float(jnp.abs(ref).max()))
            drops = int(res.stats.drops.sum())
            ms = _median_ms(lambda x, f=fwd, p=params: f(p, x).out, x, 3 if smoke else 20)  # the layer's call
            ok = bool(np.isfinite(err) and err < TOL and not drops)
            out[name] = dict(max_abs_err=err, drops=drops, ms=ms, ok=ok)
            if expert_dtype:
                out[name]["fp8_path"] = fp8_path(gmm_impl, interpret=smoke, dtype=cfg.dtype)
        except Exception as e:  # recorded, and the other cases still run
            out[name] = dict(error=f"{type(e).__name__}: {str(e)[:300]}", ok=False)
        r = out[name]
        shown = r["error"] if "error" in r else f"max |y − dense| = {r['max_abs_err']:.2e}, {r['ms']:.3f} ms a call"
        print(f"  {'ok  ' if out[name]['ok'] else 'FAIL'} {name:20s} {shown}", flush=True)
    return dict(devices=D, backend=jax.default_backend(), jax=jax.__version__, tol=TOL, results=out)


def check_presets(names, *, smoke: bool) -> dict:
    """Each preset's block (router, expert variant, shared experts) at reduced E on every device vs the dense
    reference (`moe_reference`), bf16 experts on GPU."""
    D = jax.device_count()
    mesh = make_ep_mesh(D)
    out = {}
    for name in names:
        try:
            small = dict(experts=16, hidden=32, ffn=16) if smoke else dict(experts=32)
            slots = -(-2 * small["experts"] // D)  # ~2 replicas per expert
            cfg = moe_preset(
                name,
                slots_per_rank=slots,
                dtype=jnp.float32 if smoke else jnp.bfloat16,
                interpret=smoke,
                gmm_impl="chunked" if smoke else "auto",
                **small,
            )
            placement = Placement.from_eplb(np.arange(cfg.experts) + 1.0, slots * D, D)
            pa, tables = dispatch_tables.placement_arrays(placement), dispatch_tables.uniform(placement)
            params = init_params(jax.random.key(3), cfg, placement, mesh=mesh)
            x = jax.random.normal(jax.random.key(4), (D * (16 if smoke else 256), cfg.hidden))
            run = jax.jit(
                lambda p, x, c=cfg, pa=pa, t=tables: moe_forward(
                    p, x, mesh=mesh, placement_arrays=pa, tables=t, config=c
                )
            )
            res = run(params, x)
            ref = moe_reference(to_logical(params, placement), x, cfg)
            err = float(jnp.abs(res.out.astype(jnp.float32) - ref.astype(jnp.float32)).max())
            scale = float(jnp.abs(ref.astype(jnp.float32)).max())
            tol = 1e-4 if smoke else 5e-2  # bf16 experts on GPU: relative to the output's scale
            out[name] = dict(
                hidden=cfg.hidden,
                ffn=cfg.ffn,
                experts=cfg.experts,
                max_abs_err=err,
                scale=scale,
                ok=bool(np.isfinite(err) and err <= tol * max(scale, 1.0)),
            )
        except Exception as e:  # recorded, and the other presets still run
            out[name] = dict(error=f"{type(e).__name__}: {str(e)[:300]}", ok=False)
        r = out[name]
        shown = r["error"] if "error" in r else f"max |y − dense| = {r['max_abs_err']:.2e} (scale {r['scale']:.2f})"
        print(f"  {'ok  ' if r['ok'] else 'FAIL'} preset {name:18s} {shown}", flush=True)
    return out


def check_cascade(*, smoke: bool) -> dict:
    """Sync / Async / Async+SF / CascadeEP on the same batch (`bench_cascade.measure`); needs ≥ 2 devices."""
    D = jax.device_count()
    if D < 2:
        print(f"  cascade: not run — launch schedules need ≥ 2 devices, this machine has {D}", flush=True)
        return dict(ok=True, ran=False, reason=f"{D} device(s): launch schedules need at least 2")
    import bench_cascade

    shape = (
        dict(tokens_per_device=32, experts=16, hidden=32, ffn=16, max_iters=4, repeats=1)
        if smoke
        else dict(tokens_per_device=512, experts=64, hidden=1024, ffn=512, max_iters=40, repeats=5)
    )
    try:
        res = bench_cascade.measure(
            top_k=2 if smoke else 6, requests=64, interpret=smoke, gmm_impl="chunked" if smoke else "auto", **shape
        )
    except Exception as e:  # recorded, like the other cases
        return dict(ok=False, ran=True, error=f"{type(e).__name__}: {str(e)[:300]}")
    flags = os.environ.get("XLA_FLAGS", "")
    return dict(ok=res["equal_outputs"], ran=True, xla_flags=flags, **res)


def _median_ms(f, arg, repeats: int) -> float:
    import statistics
    import time

    jax.block_until_ready(f(arg))  # compile
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(f(arg))
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _time_plan(D: int, E: int, S: int, B: int, repeats: int) -> dict:
    """One cell of `time_plans`: D ranks, E experts, S slots per rank (spares to random experts), B tokens per rank."""
    from solvers import PRESETS, CopyCost
    from tempo_jax.layer import copies, relief
    from tempo_jax.workloads.synthetic import SyntheticRouting

    cost = PRESETS["dsv3_fp8_offline"]  # TEMPO Table 6, DSv3 shape
    rng = np.random.default_rng(0)
    placement = Placement.from_phy2log(np.r_[np.arange(E), rng.integers(0, E, D * S - E)], D, None, E)
    counts = jnp.asarray(SyntheticRouting(num_experts=E, top_k=min(8, E // 2), s=1.2, seed=0).batch(B, D, 0))
    l2p = jnp.asarray(placement.log2phy, jnp.int32)
    ranks = relief.replica_ranks(l2p, S)
    cc = CopyCost(3 * 7168 * 2048, 450.0)  # a DSv3 expert in fp8 over NVLink
    res = {
        "relief_ms": _median_ms(
            jax.jit(lambda c: relief.plan(c, l2p, slots_per_rank=S, num_ranks=D, cost=cost)), counts, repeats
        ),
        "copies_ms": _median_ms(
            jax.jit(lambda c: copies.plan_copies(jnp.sum(c, 0), ranks, cost, D, 1, cc, num_slots=D * S)),
            counts,
            repeats,
        ),
    }
    ran = int(relief.relief(jnp.sum(counts, 0), ranks, cost, D, num_slots=D * S, with_rounds=True)[1])
    return res | dict(rounds=ran, relief_ms_per_round=res["relief_ms"] / max(ran, 1), ok=True)


def time_plans(*, smoke: bool) -> dict:
    """The in-graph plans on the device: `tempo_jax.layer.relief.plan` (pairwise relief; every rank runs it on the
    all-gathered counts) and the dynamic copy plan (`tempo_jax.layer.copies.plan_copies`, k = 1), jitted, median of
    repeated calls, at EP8 / E 256 + 64 and EP32 / E 256 + 64 slots, 512 tokens per rank, Zipf(1.2) top-8 (smoke:
    EP4 / E 8 + 4). Per call, and per improvement round relief ran (on a GPU: many small ops per round)."""
    cells = ((4, 8, 3, 64),) if smoke else ((8, 256, 40, 512), (32, 256, 10, 512))  # D, E, S, B
    out = {}
    for D, E, S, B in cells:
        name = f"EP{D} E{E}+{D * S - E} B{B}"
        try:
            out[name] = r = _time_plan(D, E, S, B, repeats=3 if smoke else 20)
            print(
                f"  plan {name}: relief {r['relief_ms']:.2f} ms ({r['rounds']} rounds, "
                f"{r['relief_ms_per_round']:.3f} ms each), copies {r['copies_ms']:.2f} ms",
                flush=True,
            )
        except Exception as e:  # recorded, like the other cases
            out[name] = dict(error=f"{type(e).__name__}: {str(e)[:300]}", ok=False)
            print(f"  FAIL plan {name}: {out[name]['error']}", flush=True)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="results/gpu/moe_check.json", help="JSON output path")
    p.add_argument("--smoke", action="store_true", help="tiny shapes; padded exchange; Pallas in interpret mode")
    p.add_argument("--presets", default=",".join(PRESETS), help="comma-separated MoE presets to check at reduced E")
    args = p.parse_args()
    res = check_layer(smoke=args.smoke)
    res["presets"] = check_presets(args.presets.split(","), smoke=args.smoke)
    res["cascade"] = check_cascade(smoke=args.smoke)
    res["plans"] = time_plans(smoke=args.smoke)
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=1))
    print(f"wrote {path}")
    cases = (*res["results"].values(), *res["presets"].values(), *res["plans"].values())
    ok = all(r["ok"] for r in cases) and res["cascade"]["ok"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
