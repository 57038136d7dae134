"""Grouped-GEMM benchmark: `pallas_kernels.gmm` vs `jax.lax.ragged_dot` vs a dense matmul of the same FLOPs.

CPU (always): 4096 x 1024 x 1024 float32, 8 groups, balanced and skewed group sizes; the CPU-fast path
("chunked", what `gmm` picks on CPU) forward and forward+backward. Target: >= 50% of dense throughput on
skewed groups.
GPU (when the default backend is a GPU): the non-interpret kernels vs the reference first (`--check`), then
bfloat16 TFLOP/s and GB/s of the Pallas kernel vs `ragged_dot` (default lowering) vs dense on DeepSeek-V3
(hidden 7168, expert ffn 2048) and Qwen3-235B (hidden 4096, expert ffn 1536) expert shapes, plus the
per-expert cost profile (time vs tokens per expert at several group counts) that TEMPO calibrates.

Timing: compile time reported separately; then warm-up calls and the best / median of `--iters` timed
calls, each ended with `block_until_ready`. Results are printed as tables of ratios and written as JSON.

    python scripts/bench_gemm.py                      # CPU -> results/bench_gemm.json
    python scripts/bench_gemm.py --out results/gpu/bench_gemm.json   # on a GPU machine
    python scripts/bench_gemm.py --check --out results/gpu/check.json  # GPU correctness only
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pallas_kernels import GmmTiling, dispatch, dispatch_reference, gmm, gmm_reference  # noqa: E402

GPU_SHAPES = {  # name: (hidden H, expert ffn F)
    "deepseek_v3": (7168, 2048),
    "qwen3_235b": (4096, 1536),
}
GPU_TILINGS = [
    GmmTiling(tm=128, tk=64, tn=128, num_warps=8, num_stages=3),
    GmmTiling(tm=128, tk=64, tn=64, num_warps=4, num_stages=4),
    GmmTiling(tm=64, tk=64, tn=128, num_warps=4, num_stages=3),
    GmmTiling(tm=128, tk=32, tn=128, num_warps=4, num_stages=4),
]


def group_sizes(kind: str, m: int, g: int) -> np.ndarray:
    """[g] int32 sizes summing to m: "balanced" (equal) or "skewed" (halving shares, last g // 4 empty)."""
    if kind == "balanced":
        w = np.ones(g)
    elif kind == "skewed":
        w = np.where(np.arange(g) < g - g // 4, 0.5 ** np.arange(g), 0.0)
    else:
        raise ValueError(f"unknown group-size kind {kind!r}")
    sizes = np.floor(m * w / w.sum()).astype(np.int64)
    sizes[0] += m - sizes.sum()
    return sizes.astype(np.int32)


def _time_calls(compiled, args, iters: int, warmup: int) -> dict:
    for _ in range(warmup):
        jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - t0)
    return {"best_s": min(times), "median_s": statistics.median(times)}


def timeit(fn, *args, iters: int, warmup: int = 2) -> dict:
    """Compile (timed separately), warm up, then time `iters` calls; seconds."""
    t0 = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_s = time.perf_counter() - t0
    return {"compile_s": compile_s, **_time_calls(compiled, args, iters, warmup)}


def _row(name: str, r: dict, flops: float, nbytes: float | None, base: dict | None, unit: float) -> dict:
    r = dict(r, name=name, flops=flops, throughput=flops / r["best_s"] / unit)
    if nbytes is not None:
        r["gb_per_s"] = nbytes / r["best_s"] / 1e9
    if base is not None:
        r["vs_dense"] = base["best_s"] / r["best_s"]
    return r


def _print(title: str, rows: list[dict], unit_name: str) -> None:
    print(f"\n{title}")
    print(f"  {'case':38s} {'compile s':>9s} {'best ms':>9s} {unit_name:>10s} {'vs dense':>9s} {'GB/s':>8s}")
    for r in rows:
        gb = f"{r['gb_per_s']:8.1f}" if "gb_per_s" in r else " " * 8
        vs = f"{r['vs_dense']:9.2f}" if "vs_dense" in r else " " * 9
        print(f"  {r['name']:38s} {r['compile_s']:9.2f} {r['best_s'] * 1e3:9.2f} {r['throughput']:10.1f} {vs} {gb}")


def time_interleaved(cases: dict, rounds: int, warmup: int = 1) -> dict:
    """Compile every case, then time them round-robin (one call each per round) and keep each case's best
    and median: on a shared CPU, load changes hit all cases alike instead of whichever ran last."""
    out, compiled = {}, {}
    for name, (fn, args) in cases.items():
        t0 = time.perf_counter()
        compiled[name] = jax.jit(fn).lower(*args).compile()
        out[name] = {"compile_s": time.perf_counter() - t0, "times": []}
        for _ in range(warmup):
            jax.block_until_ready(compiled[name](*args))
    for _ in range(rounds):
        for name, (_, args) in cases.items():
            t0 = time.perf_counter()
            jax.block_until_ready(compiled[name](*args))
            out[name]["times"].append(time.perf_counter() - t0)
    for r in out.values():
        times = r.pop("times")
        r["best_s"], r["median_s"] = min(times), statistics.median(times)
    return out


def bench_cpu(iters: int) -> dict:
    """CPU-fast path vs dense vs ragged_dot on 4096 x 1024 x 1024 float32, 8 groups (forward, fwd+bwd)."""
    m, k, n, g = 4096, 1024, 1024, 8
    kx, kw = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (m, k), jnp.float32)
    w = jax.random.normal(kw, (g, k, n), jnp.float32) / np.sqrt(k)
    flops = 2.0 * m * k * n
    kinds = {kind: jnp.asarray(group_sizes(kind, m, g)) for kind in ("balanced", "skewed")}

    ct = jax.random.normal(jax.random.key(1), (m, n), jnp.float32)  # a dense cotangent: no ones-shortcuts

    def fwd_bwd(f):
        return lambda x, w, ct, *gs: jax.vjp(lambda x, w: f(x, w, *gs), x, w)[1](ct)

    impls = {"ragged_dot": lambda x, w, gs: jax.lax.ragged_dot(x, w, gs), "gmm chunked (auto)": gmm}
    dense_fn = lambda x, w: x @ w[0]  # noqa: E731
    fwd = {"dense x @ w[0]": (dense_fn, (x, w))}
    fwd |= {f"{kind:8s} {name}": (f, (x, w, gs)) for kind, gs in kinds.items() for name, f in impls.items()}
    bwd = {"dense fwd+bwd": (fwd_bwd(dense_fn), (x, w, ct))}
    for kind, gs in kinds.items():
        bwd |= {f"{kind:8s} {name} fwd+bwd": (fwd_bwd(f), (x, w, ct, gs)) for name, f in impls.items()}
    t_fwd = time_interleaved(fwd, rounds=iters)
    t_bwd = time_interleaved(bwd, rounds=max(2, iters // 2))
    rows = [_row(nm, r, flops, None, t_fwd["dense x @ w[0]"], 1e9) for nm, r in t_fwd.items()]
    rows += [_row(nm, r, 3 * flops, None, t_bwd["dense fwd+bwd"], 1e9) for nm, r in t_bwd.items()]
    out = {"shape": [m, k, n, g], "dtype": "float32", "rows": rows, "cases": {}}
    for kind, gs in kinds.items():
        by = {r["name"][len(f"{kind:8s} ") :]: r for r in rows if r["name"].startswith(kind)}
        out["cases"][kind] = {
            "group_sizes": gs.tolist(),
            "chunked_vs_dense": by["gmm chunked (auto)"]["vs_dense"],
            "chunked_vs_ragged_dot": by["ragged_dot"]["best_s"] / by["gmm chunked (auto)"]["best_s"],
            "chunked_fwd_bwd_vs_dense": by["gmm chunked (auto) fwd+bwd"]["vs_dense"],
        }
    _print(f"CPU grouped GEMM {m}x{k}x{n} float32, {g} groups (GFLOP/s; vs dense = time ratio)", rows, "GFLOP/s")
    for kind, c in out["cases"].items():
        print(
            f"  {kind}: chunked = {c['chunked_vs_dense']:.0%} of dense throughput (target >= 50% when skewed), "
            f"{c['chunked_vs_ragged_dot']:.1f}x ragged_dot; fwd+bwd {c['chunked_fwd_bwd_vs_dense']:.0%} of dense"
        )
    return out


def _bytes(m_used: int, k: int, n: int, nonempty: int, itemsize: int, m: int) -> float:
    return float(itemsize * (m_used * k + nonempty * k * n + m * n))


def bench_gpu(iters: int, rows_per_gpu: int, local_experts: int) -> dict:
    """bf16 Pallas gmm vs ragged_dot vs dense on model expert shapes, plus the per-expert cost profile."""
    dt, m, g = jnp.bfloat16, rows_per_gpu, local_experts
    out: dict = {"dtype": "bfloat16", "rows": m, "local_experts": g, "shapes": {}, "profile": {}}
    key = jax.random.key(0)
    # Step 1: pick the Pallas tiling on one representative problem.
    h, f = GPU_SHAPES["deepseek_v3"]
    x = jax.random.normal(key, (m, h), dt)
    w = (jax.random.normal(key, (g, h, 2 * f), jnp.float32) / np.sqrt(h)).astype(dt)
    gs = jnp.asarray(group_sizes("skewed", m, g))
    sweep = {}
    for t in GPU_TILINGS:
        try:
            sweep[str(t)] = timeit(
                lambda x, w, gs, t=t: gmm(x, w, gs, tiling=t, implementation="pallas"), x, w, gs, iters=iters
            )["best_s"]
        except Exception as e:  # a tiling the compiler rejects is reported, not fatal
            sweep[str(t)] = f"failed: {type(e).__name__}: {str(e)[:200]}"
    timed = {s: v for s, v in sweep.items() if isinstance(v, float)}
    best = GPU_TILINGS[[str(t) for t in GPU_TILINGS].index(min(timed, key=timed.get))]
    out["tiling_sweep_s"], out["tiling"] = sweep, str(best)
    print(f"\nGPU tiling sweep (DSv3 up-proj, skewed): best {best}")
    # Step 2: model shapes, up (gate+up fused, N = 2F) and down projections, both group-size kinds.
    for model, (h, f) in GPU_SHAPES.items():
        for proj, (k, n) in {"up": (h, 2 * f), "down": (f, h)}.items():
            x = jax.random.normal(key, (m, k), dt)
            w = (jax.random.normal(key, (g, k, n), jnp.float32) / np.sqrt(k)).astype(dt)
            flops = 2.0 * m * k * n
            dense = timeit(lambda x, w: x @ w[0], x, w, iters=iters)
            rows = [_row("dense", dense, flops, _bytes(m, k, n, 1, 2, m), dense, 1e12)]
            for kind in ("balanced", "skewed"):
                sizes = group_sizes(kind, m, g)
                gs = jnp.asarray(sizes)
                nb = _bytes(m, k, n, int((sizes > 0).sum()), 2, m)
                cases = {
                    "pallas gmm": lambda x, w, gs: gmm(x, w, gs, tiling=best, implementation="pallas"),
                    "ragged_dot": lambda x, w, gs: jax.lax.ragged_dot(x, w, gs),
                }
                for name, fn in cases.items():
                    rows.append(_row(f"{kind:8s} {name}", timeit(fn, x, w, gs, iters=iters), flops, nb, dense, 1e12))
            out["shapes"][f"{model}_{proj}"] = {"k": k, "n": n, "rows": rows}
            _print(f"GPU {model} {proj}: [{m}, {k}] x [{g}, {k}, {n}] bf16 (TFLOP/s)", rows, "TFLOP/s")
    # Step 3: per-expert cost profile on the DSv3 down projection: time vs tokens per expert at several G.
    h, f = GPU_SHAPES["deepseek_v3"]
    per_expert = [0, 16, 64, 128, 256, 512, 1024]
    for gp in (1, 4, 16):
        x = jax.random.normal(key, (gp * per_expert[-1], f), dt)
        w = (jax.random.normal(key, (gp, f, h), jnp.float32) / np.sqrt(f)).astype(dt)
        fn = jax.jit(lambda x, w, gs: gmm(x, w, gs, tiling=best, implementation="pallas"))
        compiled = fn.lower(x, w, jnp.zeros((gp,), jnp.int32)).compile()
        prof = []
        for npe in per_expert:  # one compiled shape per G: rows past sum(group_sizes) are skipped tiles
            gs = jnp.full((gp,), npe, jnp.int32)
            t = _time_calls(compiled, (x, w, gs), iters, warmup=2)
            prof.append({"tokens_per_expert": npe, "us": t["best_s"] * 1e6})
        out["profile"][f"G={gp}"] = prof
        print(f"  profile G={gp:2d}: " + "  ".join(f"{p['tokens_per_expert']}:{p['us']:.0f}us" for p in prof))
    return out


def _pallas_gmm(*args, **kwargs):
    return gmm(*args, **kwargs, implementation="pallas")


def check_gpu() -> dict:
    """Correctness of the non-interpret kernels vs the references on the default (GPU) backend."""
    results, key = {}, jax.random.key(1)
    m, k, n, g = 1000, 256, 384, 6
    sizes = jnp.asarray([0, 300, 1, 0, 450, 129], jnp.int32)  # empty, tiny, tile-straddling groups
    for dt, tol in ((jnp.bfloat16, 2e-2), (jnp.float32, 1e-2)):  # float32 dots default to TF32 on GPU
        x = jax.random.normal(key, (m, k), jnp.float32).astype(dt)
        w = (jax.random.normal(key, (g, k, n), jnp.float32) / 16).astype(dt)
        for off, gl in ((0, g), (2, 3)):
            wl = w[off : off + gl]

            def loss(fn, x, wl, off=off):
                return jnp.sum(jnp.sin(fn(x, wl, sizes, group_offset=off).astype(jnp.float32)))

            got = gmm(x, wl, sizes, group_offset=off, implementation="pallas")
            want = gmm_reference(x, wl, sizes, group_offset=off)
            dgot = jax.grad(lambda x, wl: loss(_pallas_gmm, x, wl), (0, 1))(x, wl)
            dwant = jax.grad(lambda x, wl: loss(gmm_reference, x, wl), (0, 1))(x, wl)
            errs = {}
            for name, a, b in (("out", got, want), ("dlhs", dgot[0], dwant[0]), ("drhs", dgot[1], dwant[1])):
                a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
                errs[name] = float(np.abs(a - b).max() / max(1.0, np.abs(b).max())) if np.isfinite(a).all() else 1e9
            ok = all(v <= tol for v in errs.values())
            results[f"gmm {jnp.dtype(dt).name} offset={off}"] = {"max_rel_err": errs, "tol": tol, "ok": ok}
    t, kk, e, r = 4096, 8, 64, 4
    ids = jax.random.randint(key, (t, kk), 0, e, jnp.int32)
    valid = jnp.arange(t) < t - 100
    table = jax.random.uniform(key, (e, r)).at[3].set(0.0)
    l2p = jnp.arange(e * r, dtype=jnp.int32).reshape(e, r).at[5, 1].set(-1)
    ctr = jnp.full((e,), 2**32 - 7, jnp.uint32)
    u = jax.random.uniform(jax.random.key(2), (t, kk))
    for mode in ("sample", "quota"):
        a = dispatch(ids, valid, table, l2p, ctr, mode=mode, uniforms=u, implementation="pallas")
        b = dispatch_reference(ids, valid, table, l2p, ctr, mode=mode, uniforms=u)
        ok = all(bool((x == y).all()) for x, y in zip(a, b, strict=True))
        results[f"dispatch {mode}"] = {"exact": ok, "ok": ok}
    for name, res in results.items():
        print(f"  {'ok  ' if res['ok'] else 'FAIL'} {name}: {res}")
    return results


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="results/bench_gemm.json", help="JSON output path")
    p.add_argument("--iters", type=int, default=15, help="timed calls (rounds) per case; best and median reported")
    p.add_argument("--check", action="store_true", help="only check the GPU kernels against the references")
    p.add_argument("--rows", type=int, default=8192, help="GPU: rows (token-expert pairs) per GPU")
    p.add_argument("--local-experts", type=int, default=16, help="GPU: experts per GPU (groups)")
    args = p.parse_args()
    backend = jax.default_backend()
    meta = {
        "backend": backend,
        "device": str(jax.devices()[0]),
        "jax": jax.__version__,
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
    }
    print(f"backend {backend}: {meta['device']}")
    if args.check:
        if backend != "gpu":
            print("--check needs a GPU backend (CPU tests run the kernels in interpret mode)")
            return 2
        results = {"meta": meta, "check": check_gpu()}
        ok = all(r["ok"] for r in results["check"].values())
    else:
        results = {"meta": meta}
        if backend == "cpu":
            results["cpu"] = bench_cpu(args.iters)
        else:
            results["gpu"] = bench_gpu(args.iters, args.rows, args.local_experts)
        ok = True
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2, default=str))
    print(f"\nwrote {path}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
