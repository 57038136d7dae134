"""Grouped-GEMM benchmark: `pallas_kernels.gmm` vs `jax.lax.ragged_dot` vs a dense matmul of the same FLOPs.

CPU (always, float32, forward and forward+backward): the CPU-fast path ("chunked", what `gmm` picks on CPU) now
(ladder schedule, `GmmTiling()`) and before (fixed 256-row chunks, `GmmTiling(chunk=256, schedule="fixed")`)
vs a dense matmul of the same FLOPs (x [M, H] @ w [H, F]), all timed round-robin in one run: 4096 x 1024 x 1024
with 8 balanced / halving-skewed groups (also vs `ragged_dot`), and the small expert shapes of an MoE layer —
H = 256, F = 128, M = 1024 or 4096 tokens x top-6, over E = 64 experts or the 10 local slots of an EP rank,
balanced and Zipf(1.2) group sizes — plus the one-device expert FFN (three gmms, SwiGLU) at E = 64. Targets:
>= 0.5 of dense on the small shapes, >= 0.8 (balanced) / 0.5 (skewed) on the big one.
GPU (when the default backend is a GPU): the non-interpret kernels vs the reference first (`--check`: the Mosaic
GPU kernel, the Pallas Triton kernel, tokamax, dispatch), then TFLOP/s and GB/s of every grouped GEMM this machine
has (`GPU_GMMS`: the project's Mosaic GPU kernel where jax >= 0.12, tokamax where installed, the Pallas Triton kernel
where jax < 0.11, `ragged_dot`; each missing one a "not run: <reason>" row) vs a dense matmul of the same FLOPs on
DeepSeek-V3 (hidden 7168, expert ffn 2048) and Qwen3-235B (hidden 4096, expert ffn 1536) expert shapes, bf16 and FP8
(`BlockScaled`) weights, balanced and skewed groups; the flat-regime sweep (1 to 256 rows in each of G = 1, 4, 16, 64
groups: µs a call, fractions of the run's measured matmul and copy ceilings, monotone in rows or not); and the
per-expert cost profile that TEMPO calibrates: the whole SwiGLU expert FFN (up, activation, down), G experts with n
tokens each, for several G; `--profile-csv` writes the fastest implementation's as G,N,T,t for `tempo-jax
calibrate`. Every GPU case is guarded: one that fails to compile or run is recorded in the JSON and the others still
run; with `--deadline` the cases that would start after it are "not run: time budget" rows.
`--smoke` runs all the GPU code paths with tiny shapes and the Pallas kernels in interpret mode (on CPU too);
tests/test_gpu_check.py does so in CI, so the prepared GPU run stays runnable.

Timing: compile time reported separately; then warm-up calls and the best / median of `--iters` timed
calls, each ended with `block_until_ready`. Results are printed as tables of ratios and written as JSON.

    python scripts/bench_gemm.py                      # CPU -> results/bench_gemm.json
    python scripts/bench_gemm.py --out results/gpu/bench_gemm.json   # on a GPU machine
    python scripts/bench_gemm.py --check --out results/gpu/check.json  # GPU correctness only
    python scripts/bench_gemm.py --smoke --check --out /tmp/check.json  # the GPU paths, tiny, on CPU
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.metadata
import itertools
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
from pallas_kernels import (  # noqa: E402
    DISPATCH_MODES,
    BlockScaled,
    GmmTiling,
    dispatch,
    dispatch_reference,
    fp8_path,
    gmm,
    gmm_reference,
    tokamax_backend,
)
from pallas_kernels.fp8 import quantize  # noqa: E402
from tempo_jax.workloads.models import MODEL_SPECS  # noqa: E402  (numpy-only: the MoE presets' dimensions)

#: MoE presets whose expert shapes (hidden H, expert FFN width F) the GPU benchmark runs (`--presets`).
GPU_PRESETS = ("deepseek_v3", "qwen3_235b_a22b")


def preset_shapes(names) -> tuple[tuple[str, int, int], ...]:
    """``(name, H, F)`` of MoE presets (`tempo_jax.layer.presets`) by name."""
    unknown = [n for n in names if n not in MODEL_SPECS]
    if unknown:
        raise SystemExit(f"bench_gemm: unknown presets {unknown}; one of {list(MODEL_SPECS)}")
    return tuple((n, MODEL_SPECS[n].hidden, MODEL_SPECS[n].ffn) for n in names)


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


def _row(
    name: str, r: dict, flops: float, nbytes: float | None, base: dict | None, unit: float, ceil: dict | None = None
) -> dict:
    """One result row: throughput in `unit` FLOP/s, GB/s, time ratio vs the dense baseline and, given measured
    ceilings, vs the roofline bound max(FLOPs / peak FLOP/s, bytes / peak bandwidth) (1.0 = at the bound)."""
    r = dict(r, name=name, flops=flops, throughput=flops / r["best_s"] / unit)
    if nbytes is not None:
        r["gb_per_s"] = nbytes / r["best_s"] / 1e9
    if base is not None:
        r["vs_dense"] = base["best_s"] / r["best_s"]
    if ceil is not None and nbytes is not None:
        bound_s = max(flops / (ceil["tflops"] * 1e12), nbytes / (ceil["gb_per_s"] * 1e9))
        r["vs_bound"] = bound_s / r["best_s"]
    return r


def _print(title: str, rows: list[dict], unit_name: str) -> None:
    print(f"\n{title}")
    head = f"  {'case':38s} {'compile s':>9s} {'best ms':>9s} {unit_name:>10s} {'vs dense':>9s} {'GB/s':>8s}"
    bound = any("vs_bound" in r for r in rows)
    print(head + (f" {'vs bound':>9s}" if bound else ""))
    for r in rows:
        if "best_s" not in r:  # a case without a time: why not
            why = f"not run: {r['not_run']}" if "not_run" in r else f"FAILED: {r.get('error', '?')}"
            print(f"  {r['name']:38s} {why[:110]}")
            continue
        gb = f"{r['gb_per_s']:8.1f}" if "gb_per_s" in r else " " * 8
        vs = f"{r['vs_dense']:9.2f}" if "vs_dense" in r else " " * 9
        vb = f" {r['vs_bound']:9.2f}" if "vs_bound" in r else ""
        print(f"  {r['name']:38s} {r['compile_s']:9.2f} {r['best_s'] * 1e3:9.2f} {r['throughput']:10.1f} {vs} {gb}{vb}")


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


@dataclasses.dataclass(frozen=True)
class CpuPlan:
    """Shapes of the CPU benchmark. `big`: one large grouped GEMM (M, H, F, groups). The small expert shapes of
    an MoE layer: H = `hidden`, F = `ffn`, M = tokens x `top_k` rows for each of `tokens`, over each of `groups`
    (E = 64 experts on one device, or the 10 local slots of a rank in the EP layer). `ffn_groups`: the expert
    FFN (three gmms, SwiGLU) is also timed with that many experts. `CpuPlan.smoke()` is a tiny plan for tests."""

    iters: int = 15
    big: tuple[int, int, int, int] = (4096, 1024, 1024, 8)
    hidden: int = 256
    ffn: int = 128
    tokens: tuple[int, ...] = (1024, 4096)
    top_k: int = 6
    groups: tuple[int, ...] = (64, 10)
    ffn_groups: int = 64
    ragged_dot_small: bool = False  # ragged_dot takes ~0.5 s per small forward on CPU: off by default

    @classmethod
    def smoke(cls) -> CpuPlan:
        return cls(iters=1, big=(96, 32, 48, 4), hidden=32, ffn=16, tokens=(16,), groups=(5,), ffn_groups=5)


#: The CPU-fast path now (the default ladder) and before (fixed 256-row chunks, the previous default).
CPU_VARIANTS = {"gmm": GmmTiling(), "gmm fixed (before)": GmmTiling(chunk=256, schedule="fixed")}


def _fwd_bwd(f):
    """f(x, w, *rest) -> its pullback applied to a dense cotangent (d x, d w)."""
    return lambda x, w, ct, *rest: jax.vjp(lambda x, w: f(x, w, *rest), x, w)[1](ct)


def _bench_gemm_shape(name, m, k, n, g, kinds, iters, ragged: bool) -> dict:
    """Dense vs every CPU variant (and ragged_dot) on one [M, H] x [g, H, F] float32 shape, forward and
    forward+backward, each direction timed round-robin over all its cases."""
    kx, kw, kd, kc = jax.random.split(jax.random.key(0), 4)
    x = jax.random.normal(kx, (m, k), jnp.float32)
    w = jax.random.normal(kw, (g, k, n), jnp.float32) / np.sqrt(k)
    w0 = jax.random.normal(kd, (k, n), jnp.float32) / np.sqrt(k)  # the dense baseline's own [H, F] weight
    ct = jax.random.normal(kc, (m, n), jnp.float32)  # a dense cotangent: no ones-shortcuts
    flops = 2.0 * m * k * n
    impls = {v: functools.partial(gmm, tiling=t) for v, t in CPU_VARIANTS.items()}
    if ragged:
        impls["ragged_dot"] = lambda x, w, gs: jax.lax.ragged_dot(x, w, gs)
    dense = lambda x, w: x @ w  # noqa: E731
    fwd = {"dense": (dense, (x, w0))}
    bwd = {"dense": (_fwd_bwd(dense), (x, w0, ct))}
    for kind, gs in kinds.items():
        fwd |= {f"{kind} {v}": (f, (x, w, gs)) for v, f in impls.items()}
        bwd |= {f"{kind} {v}": (_fwd_bwd(f), (x, w, ct, gs)) for v, f in impls.items()}
    t_fwd = time_interleaved(fwd, rounds=iters)
    t_bwd = time_interleaved(bwd, rounds=iters)
    rows = [_row(nm, r, flops, None, t_fwd["dense"], 1e9) for nm, r in t_fwd.items()]
    rows += [_row(f"{nm} fwd+bwd", r, 3 * flops, None, t_bwd["dense"], 1e9) for nm, r in t_bwd.items()]
    _print(f"CPU {name}: [{m}, {k}] x [{g}, {k}, {n}] float32 (GFLOP/s; vs dense = time ratio)", rows, "GFLOP/s")
    by = {r["name"]: r for r in rows}
    cases = {}
    for kind, gs in kinds.items():
        c = {"group_sizes": np.asarray(gs).tolist()}
        for v in impls:
            c[v] = {
                "fwd_vs_dense": by[f"{kind} {v}"]["vs_dense"],
                "fwd_bwd_vs_dense": by[f"{kind} {v} fwd+bwd"]["vs_dense"],
            }
        new, old = by[f"{kind} gmm"], by[f"{kind} gmm fixed (before)"]
        c["speedup_vs_before"] = {"fwd": old["best_s"] / new["best_s"]}
        c["speedup_vs_before"]["fwd_bwd"] = (
            by[f"{kind} gmm fixed (before) fwd+bwd"]["best_s"] / by[f"{kind} gmm fwd+bwd"]["best_s"]
        )
        if ragged:
            c["gmm_vs_ragged_dot"] = by[f"{kind} ragged_dot"]["best_s"] / new["best_s"]
        cases[kind] = c
    return {"m": m, "h": k, "f": n, "groups": g, "rows": rows, "cases": cases}


def _bench_expert_ffn(name, m, h, f, g, kinds, iters) -> dict:
    """The one-device sorted MoE expert FFN (gate, up, down gmms; SwiGLU) vs three dense matmuls of its FLOPs."""
    keys = jax.random.split(jax.random.key(2), 4)
    x = jax.random.normal(keys[0], (m, h), jnp.float32)
    wg, wu = (jax.random.normal(kk, (g, h, f), jnp.float32) / np.sqrt(h) for kk in keys[1:3])
    wd = jax.random.normal(keys[3], (g, f, h), jnp.float32) / np.sqrt(f)

    def ffn(tiling):
        def run(x, wg, wu, wd, gs):
            hid = jax.nn.silu(gmm(x, wg, gs, tiling=tiling)) * gmm(x, wu, gs, tiling=tiling)
            return gmm(hid, wd, gs, tiling=tiling)

        return run

    def dense(x, wg, wu, wd):
        return (jax.nn.silu(x @ wg[0]) * (x @ wu[0])) @ wd[0]

    cases = {"dense": (dense, (x, wg, wu, wd))}
    for kind, gs in kinds.items():
        cases |= {f"{kind} {v}": (ffn(t), (x, wg, wu, wd, gs)) for v, t in CPU_VARIANTS.items()}
    t = time_interleaved(cases, rounds=iters)
    rows = [_row(nm, r, 3 * 2.0 * m * h * f, None, t["dense"], 1e9) for nm, r in t.items()]
    _print(f"CPU {name}: expert FFN (3 gmms, SwiGLU), M = {m}, H = {h}, F = {f}, {g} experts", rows, "GFLOP/s")
    return {"m": m, "h": h, "f": f, "groups": g, "rows": rows}


def zipf_sizes(m: int, g: int, s: float = 1.2, seed: int = 0) -> np.ndarray:
    """[g] int32 sizes summing to m, shares ∝ rank^-s over a seeded random order of the groups (Zipf, s = 1.2
    as in the project's synthetic routing); the rounding remainder goes to the largest group."""
    w = np.random.default_rng(seed).permutation(np.arange(1, g + 1) ** -float(s))
    sizes = np.floor(m * w / w.sum()).astype(np.int64)
    sizes[np.argmax(w)] += m - sizes.sum()
    return sizes.astype(np.int32)


def bench_cpu(plan: CpuPlan) -> dict:
    """The CPU-fast path now (ladder schedule) and before (fixed chunks) vs dense (and ragged_dot), float32,
    forward and forward+backward: the big shape (balanced / halving-skewed groups) and the small expert shapes
    (balanced / Zipf groups), then the expert FFN. Every ratio compares cases timed in the same rounds."""
    out: dict = {"plan": dataclasses.asdict(plan), "variants": {v: str(t) for v, t in CPU_VARIANTS.items()}}
    m, k, n, g = plan.big
    kinds = {kind: jnp.asarray(group_sizes(kind, m, g)) for kind in ("balanced", "skewed")}
    out["big"] = _bench_gemm_shape("big", m, k, n, g, kinds, plan.iters, ragged=True)
    out["small"] = {}
    for tokens in plan.tokens:
        rows = tokens * plan.top_k
        for groups in plan.groups:
            name = f"{tokens} tokens x top-{plan.top_k}, {groups} groups"
            kinds = {"balanced": jnp.asarray(group_sizes("balanced", rows, groups))}
            kinds["zipf"] = jnp.asarray(zipf_sizes(rows, groups))
            out["small"][f"t{tokens}_g{groups}"] = _bench_gemm_shape(
                name, rows, plan.hidden, plan.ffn, groups, kinds, plan.iters, ragged=plan.ragged_dot_small
            )
    out["ffn"] = {}
    for tokens in plan.tokens:
        rows, groups = tokens * plan.top_k, plan.ffn_groups
        kinds = {"balanced": jnp.asarray(group_sizes("balanced", rows, groups))}
        kinds["zipf"] = jnp.asarray(zipf_sizes(rows, groups))
        out["ffn"][f"t{tokens}_g{groups}"] = _bench_expert_ffn(
            f"{tokens} tokens x top-{plan.top_k}", rows, plan.hidden, plan.ffn, groups, kinds, plan.iters
        )
    _print_cpu_summary(out)
    return out


def _print_cpu_summary(out: dict) -> None:
    """One line per case: gmm and the fixed-chunk path as fractions of dense, forward and forward+backward."""
    print("\nsummary (fraction of the dense same-FLOP rate; gmm = ladder schedule, before = fixed chunks)")
    print(f"  {'case':44s} {'fwd':>6s} {'before':>7s} {'fwd+bwd':>8s} {'before':>7s} {'speedup fwd / fwd+bwd':>22s}")
    shapes = {"big": out["big"]} | out["small"]
    for key, sh in shapes.items():
        for kind, c in sh["cases"].items():
            new, old, sp = c["gmm"], c["gmm fixed (before)"], c["speedup_vs_before"]
            name = f"{key} M={sh['m']} H={sh['h']} F={sh['f']} E={sh['groups']} {kind}"
            print(
                f"  {name:44s} {new['fwd_vs_dense']:6.2f} {old['fwd_vs_dense']:7.2f} {new['fwd_bwd_vs_dense']:8.2f} "
                f"{old['fwd_bwd_vs_dense']:7.2f} {sp['fwd']:10.2f}x / {sp['fwd_bwd']:.2f}x"
            )
    for key, ffn in out["ffn"].items():
        by = {r["name"]: r for r in ffn["rows"]}
        for kind in ("balanced", "zipf"):
            new, old = by[f"{kind} gmm"], by[f"{kind} gmm fixed (before)"]
            print(
                f"  {'ffn ' + key + ' ' + kind:44s} {new['vs_dense']:6.2f} {old['vs_dense']:7.2f} "
                f"{'':8s} {'':7s} {old['best_s'] / new['best_s']:10.2f}x   ({new['best_s'] * 1e3:.1f} vs "
                f"{old['best_s'] * 1e3:.1f} ms; dense {by['dense']['best_s'] * 1e3:.1f} ms)"
            )


def _bytes(m_used: int, k: int, n: int, nonempty: int, itemsize: int, m: int) -> float:
    return float(itemsize * (m_used * k + nonempty * k * n + m * n))


@dataclasses.dataclass(frozen=True)
class GpuPlan:
    """Sizes of the GPU check and benchmark. `GpuPlan.smoke()` shrinks every one of them so that the same
    code runs with the Pallas kernels in interpret mode on CPU (tests/test_gpu_check.py), which keeps the
    prepared GPU run from rotting between the sessions that have a GPU."""

    interpret: bool = False
    iters: int = 10
    warmup: int = 2
    check_mkn: tuple[int, int, int] = (1000, 256, 384)
    check_sizes: tuple[int, ...] = (0, 300, 1, 0, 450, 129)  # empty, tiny and tile-straddling groups
    dispatch_tker: tuple[int, int, int, int] = (4096, 8, 64, 4)  # pairs T, top-k K, experts E, replicas R
    shapes: tuple[tuple[str, int, int], ...] = preset_shapes(GPU_PRESETS)
    tilings: tuple[GmmTiling, ...] = tuple(GPU_TILINGS)
    rows: int = 8192
    local_experts: int = 16
    profile_groups: tuple[int, ...] = (1, 4, 16)
    profile_tokens: tuple[int, ...] = (1, 32, 96, 160, 256, 512, 1024)
    profile_reps: int = 20  # FFN applications per timed call: host dispatch overhead amortised away
    ceiling_n: int = 8192  # n x n x n bf16 matmul for the peak FLOP/s
    ceiling_bytes: int = 2 * 2**30  # buffer read and written for the peak bandwidth
    # The flat-regime sweep (the first shape's up projection): rows per group x groups G, every group that many rows.
    flat_rows: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    flat_groups: tuple[int, ...] = (1, 4, 16, 64)
    flat_chain: int = 8  # gmm calls per timed program (each on the previous call's output): launch overhead / 8
    flat_iters: int = 5
    flat_rotate_bytes: int = 256 * 2**20  # weight copies rotated so one program streams at least this (L2 is 50-60 MB)

    @classmethod
    def smoke(cls) -> GpuPlan:
        t = GmmTiling(tm=16, tk=16, tn=16, num_warps=4, num_stages=2)
        return cls(
            interpret=True,
            iters=1,
            warmup=1,
            check_mkn=(80, 64, 64),  # 64-wide: FP8 weights in the Mosaic kernel's own path (64-multiple blocks)
            check_sizes=(0, 30, 1, 0, 35, 13),
            dispatch_tker=(300, 4, 16, 4),
            shapes=(("tiny", 64, 64),),
            tilings=(t, dataclasses.replace(t, tm=32)),
            rows=64,
            local_experts=4,
            profile_groups=(1, 2),
            profile_tokens=(1, 8, 24),
            profile_reps=2,
            ceiling_n=64,
            ceiling_bytes=2**20,
            flat_rows=(1, 16),
            flat_groups=(1, 4),
            flat_chain=2,
            flat_iters=1,
            flat_rotate_bytes=40 * 1024,  # G = 1 rotates two weight copies, G = 4 one
        )


#: The grouped GEMMs the GPU benchmark measures, in this order (row names; `GMM_IMPL` maps them to `gmm`'s
#: ``implementation``): the project's Mosaic GPU kernel, tokamax's, the Pallas Triton kernel, XLA's ragged_dot.
GPU_GMMS = ("mosaic gmm", "tokamax gmm", "pallas gmm", "ragged_dot")
GMM_IMPL = {"mosaic gmm": "mosaic", "tokamax gmm": "tokamax", "pallas gmm": "pallas", "ragged_dot": "ragged_dot"}


def gmm_status(interpret: bool) -> dict[str, str | None]:
    """For each of `GPU_GMMS`: None where it runs here, else why not (the "not run" rows). The Mosaic GPU kernel
    needs jax >= 0.12 and a GPU or interpret mode; tokamax its package; the Pallas Triton kernel is measured only
    where JAX has not deprecated its Triton backend (jax < 0.11; interpret mode follows the same rule, so a smoke run
    has the rows a GPU run with that JAX would have); ragged_dot runs everywhere."""
    from pallas_kernels import gmm_mosaic, triton_backend

    status: dict[str, str | None] = dict.fromkeys(GPU_GMMS)
    if not gmm_mosaic.available():
        status["mosaic gmm"] = f"needs jax >= 0.12 with Pallas Mosaic GPU (jax {jax.__version__} here)"
    elif not (interpret or jax.default_backend() == "gpu"):
        status["mosaic gmm"] = f"needs a CUDA GPU or interpret mode (backend {jax.default_backend()})"
    if not tokamax_backend.available():
        status["tokamax gmm"] = "tokamax is not installed here (scripts/tokamax_wheels.sh carries its wheels)"
    if triton_backend.deprecated():
        status["pallas gmm"] = (
            f"Pallas Triton backend deprecated from jax 0.11 (jax {jax.__version__} here): measured only on jax < 0.11"
        )
    elif not (interpret or triton_backend.available()):
        status["pallas gmm"] = f"jax {jax.__version__} has no Pallas Triton backend"
    return status


def _pallas(plan: GpuPlan, tiling: GmmTiling | None = None):
    """`gmm` forced onto the Pallas kernel (interpret mode when the plan says so)."""
    extra = {} if tiling is None else {"tiling": tiling}
    return functools.partial(gmm, implementation="pallas", interpret=plan.interpret, **extra)


def _mosaic(plan: GpuPlan):
    """`gmm` forced onto the project's Mosaic GPU kernel (Mosaic GPU's interpret mode when the plan says so)."""
    return functools.partial(gmm, implementation="mosaic", interpret=plan.interpret)


def _tokamax():
    """`gmm` through tokamax's ragged_dot, or None where tokamax is not installed (recorded, not fatal)."""
    return functools.partial(gmm, implementation="tokamax") if tokamax_backend.available() else None


def _ragged_dot(x, w, gs):
    return jax.lax.ragged_dot(x, w, gs)


#: DeepSeek's FP8 block (128 × 128), shrunk to the weight where a smoke shape is smaller.
FP8_BLOCK = (128, 128)


def _fp8(w: jax.Array) -> BlockScaled:
    """``w [E, K, N]`` as DeepSeek-format FP8 (e4m3, one scale per 128 × 128 block, or the whole of a smaller K / N)."""
    block = (min(FP8_BLOCK[0], w.shape[1]), min(FP8_BLOCK[1], w.shape[2]))
    return BlockScaled(*quantize(w, block), block)


def _fp8_impls(impls: dict) -> dict:
    """The FP8-weight variant of each implementation (a `BlockScaled` weight): tokamax and the Mosaic kernel take the
    e4m3 weights into their kernels where they can, the others dequantize inside the call (`fp8_path`); ragged_dot
    through `gmm(implementation="ragged_dot")`, which dequantizes first."""
    fp8 = {f"{name} fp8": fn for name, fn in impls.items() if name != "ragged_dot"}
    if "ragged_dot" in impls:
        fp8["ragged_dot fp8"] = functools.partial(gmm, implementation="ragged_dot")
    return fp8


def _lowered_kernels(fn, *args) -> list[str]:
    """Which kernels a jitted call lowers to (Mosaic GPU, Triton, or none: XLA's own ops), so a tokamax row says
    whether tokamax ran its own kernel or fell back to XLA's lowering."""
    text = jax.jit(fn).lower(*args).as_text()
    marks = {"mosaic_gpu": "mosaic_gpu", "triton": "triton", "ragged_dot": "xla ragged_dot"}
    return [name for mark, name in marks.items() if mark in text] or ["xla"]


def _expert_ffn(gmm_fn, reps: int = 1):
    """SwiGLU expert FFN over sorted rows: x [M, H], w_up [E, H, 2F], w_down [E, F, H], sizes [E] -> [M, H].

    `reps` > 1 applies it `reps` times in one call, each on the previous output plus x (a residual keeps the
    values from shrinking to zeros), so a timed call measures device time, not host dispatch.
    """

    def ffn(x, w_up, w_down, sizes):
        gate, up = jnp.split(gmm_fn(x, w_up, sizes), 2, axis=1)
        return gmm_fn(jax.nn.silu(gate) * up, w_down, sizes)

    if reps == 1:
        return ffn
    return lambda x, *w: jax.lax.fori_loop(0, reps, lambda _, y: ffn(y, *w) + x, x)


def _chained(gmm_fn, chain: int):
    """``gmm_fn(x, w, sizes)`` called ``chain`` times in one program, the calls rotating over the weight copies ``ws``
    and each call's lhs taking one element of the previous call's output (a dependence: XLA can neither hoist nor
    merge the calls, and they run one after the other), so one timed program measures ``chain`` calls with one launch
    overhead; distinct weight copies keep a small weight from being served out of L2."""

    def run(x, ws, sizes):
        y = None
        for i in range(chain):
            y = gmm_fn(x, ws[i % len(ws)], sizes)
            x = x.at[0, 0].set(y[0, 0].astype(x.dtype))
        return y

    return run


#: Why a case past the step's deadline did not run.
TIME_BUDGET = "time budget: the step's deadline passed before this case"


class _Cases:
    """Times guarded cases for `bench_gpu`: one that fails to compile or run is recorded in ``out["errors"]`` (and
    its row says so) and the others still run; once ``deadline`` (Unix time) has passed, a case is not started and
    its row says "not run: time budget" (``out["skipped"]``), so a step cut short still writes every row."""

    def __init__(self, out: dict, plan: GpuPlan, deadline: float | None):
        self.out, self.plan, self.deadline = out, plan, deadline
        out.setdefault("errors", {})
        out.setdefault("skipped", [])

    def __call__(self, name: str, fn, *args, iters: int | None = None) -> dict:
        """{"compile_s", "best_s", "median_s"}, or {"error": ...}, or {"not_run": ...}."""
        if self.deadline is not None and time.time() > self.deadline:
            self.out["skipped"].append(name)
            return {"not_run": TIME_BUDGET}
        try:
            return timeit(fn, *args, iters=iters or self.plan.iters, warmup=self.plan.warmup)
        except Exception as e:  # a case the compiler rejects is reported, not fatal
            self.out["errors"][name] = f"{type(e).__name__}: {str(e)[:300]}"
            print(f"  FAILED {name}: {self.out['errors'][name]}", flush=True)
            return {"error": self.out["errors"][name]}


def _result_row(label: str, r: dict, flops, nbytes, base, ceil, **extra) -> dict:
    """A timed case's `_row`, or its label with the reason it has no time ("error" / "not_run")."""
    if "best_s" in r:
        return _row(label, r, flops, nbytes, base, 1e12, ceil) | extra
    return {"name": label, **r, **extra}


def bench_gpu(plan: GpuPlan, checkpoint=lambda out: None, deadline: float | None = None) -> dict:
    """bf16 and FP8 grouped GEMMs (every implementation this machine has) vs dense on model expert shapes, the
    flat-regime sweep, and the per-expert cost profile.

    Every case is guarded: a case that fails to compile or run is recorded as an error and the rest go on; with a
    ``deadline`` (Unix time) the cases that would start after it say "not run: time budget". `checkpoint(out)` is
    called after each step, so a run cut short by a time limit keeps what it measured.
    """
    dt, m, g = jnp.bfloat16, plan.rows, plan.local_experts
    out: dict = {"dtype": "bfloat16", "rows": m, "local_experts": g, "shapes": {}, "errors": {}, "skipped": []}
    run = _Cases(out, plan, deadline)
    key = jax.random.key(0)
    status = gmm_status(plan.interpret)
    out["implementations"] = {name: why or "runs" for name, why in status.items()}
    not_run = {name: why for name, why in status.items() if why}
    print("implementations: " + "; ".join(f"{n}: {w}" for n, w in out["implementations"].items()), flush=True)

    # Step 0: the ceilings every row is held against (measured, not datasheet): a large dense bf16 matmul, and the
    # best of two device-to-device copies of a large buffer (an elementwise pass and jnp.copy; bytes read + written).
    c = plan.ceiling_n
    a = jax.random.normal(key, (c, c), dt)
    mm = run("ceiling matmul", lambda a: a @ a, a)
    buf = jax.random.normal(key, (plan.ceiling_bytes // 2,), dt)
    copies = {"scale": run("ceiling copy (x * 2)", lambda b: b * 2, buf)}
    copies["copy"] = run("ceiling copy (jnp.copy)", jnp.copy, buf)
    if "best_s" in copies["copy"]:  # a copy that handed back its input buffer moved nothing: not a ceiling
        y = jax.jit(jnp.copy)(buf)
        if y.unsafe_buffer_pointer() == buf.unsafe_buffer_pointer():
            copies["copy"] = {"not_run": "jnp.copy returned its input buffer (no copy made)"}
        del y
    copy_gbs = {k: 2.0 * buf.nbytes / r["best_s"] / 1e9 for k, r in copies.items() if "best_s" in r}
    ceil = None
    if "best_s" in mm and copy_gbs:
        ceil = {"tflops": 2.0 * c**3 / mm["best_s"] / 1e12, "gb_per_s": max(copy_gbs.values()), "copies": copy_gbs}
        print(f"\nceilings: {ceil['tflops']:.1f} TFLOP/s bf16 matmul ({c}^3), {ceil['gb_per_s']:.0f} GB/s", flush=True)
    out["ceilings"] = ceil
    del a, buf
    # Step 1: pick the Pallas tiling on one representative problem (the first shape's up projection), where the
    # Pallas Triton kernel is measured at all.
    _, h, f = plan.shapes[0]
    x = jax.random.normal(key, (m, h), dt)
    w = (jax.random.normal(key, (g, h, 2 * f), jnp.float32) / np.sqrt(h)).astype(dt)
    gs = jnp.asarray(group_sizes("skewed", m, g))
    best = None
    if status["pallas gmm"] is None:
        sweep = {str(t): run(f"tiling {t}", _pallas(plan, t), x, w, gs) for t in plan.tilings}
        timed = {s: r["best_s"] for s, r in sweep.items() if "best_s" in r}
        best = plan.tilings[[str(t) for t in plan.tilings].index(min(timed, key=timed.get))] if timed else None
        out["tiling_sweep_s"] = {s: r.get("best_s", "failed") for s, r in sweep.items()}
        print(f"\nGPU tiling sweep ({plan.shapes[0][0]} up-proj, skewed): best {best}", flush=True)
        if best is None:
            not_run["pallas gmm"] = "no tiling of the sweep compiled"
    out["tiling"] = str(best) if best is not None else None
    checkpoint(out)
    impls: dict = {}
    if status["mosaic gmm"] is None:
        impls["mosaic gmm"] = _mosaic(plan)
    if (tk := _tokamax()) is not None:
        impls["tokamax gmm"] = tk
        out["tokamax_kernels"] = _lowered_kernels(tk, x, w, gs)
        print(f"tokamax lowers to: {', '.join(out['tokamax_kernels'])}", flush=True)
    if best is not None:
        impls["pallas gmm"] = _pallas(plan, best)
    impls["ragged_dot"] = _ragged_dot
    out["not_run"] = dict(not_run)
    fp8_impls = _fp8_impls(impls)
    w8 = _fp8(w)
    out["fp8_path"] = {
        "tokamax": fp8_path("tokamax") if tk is not None else "not installed",
        "pallas": fp8_path("pallas", interpret=plan.interpret),
        "mosaic": (
            fp8_path("mosaic", interpret=plan.interpret, shape=w8.shape, block=w8.block, dtype=dt)
            if "mosaic gmm" in impls
            else "not run"
        ),
        "tokamax_fp8_kernels": _lowered_kernels(tk, x, w8, gs) if tk is not None else [],
        "tokamax_refusal": tokamax_backend.fp8_refusal(jnp.dtype(dt)),  # why not "fp8" (None: it is)
    }
    print(f"FP8 weights: {out['fp8_path']}", flush=True)
    # Step 2: model shapes, up (gate+up fused, N = 2F) and down projections, both group-size kinds; bf16 weights,
    # then the same weights in FP8 (bytes: one per weight element); a "not run" row for each missing implementation.
    for model, h, f in plan.shapes:
        for proj, (k, n) in {"up": (h, 2 * f), "down": (f, h)}.items():
            x = jax.random.normal(key, (m, k), dt)
            w = (jax.random.normal(key, (g, k, n), jnp.float32) / np.sqrt(k)).astype(dt)
            w8 = _fp8(w)
            flops = 2.0 * m * k * n
            dense = run(f"{model} {proj} dense", lambda x, w: x @ w[0], x, w)
            base = dense if "best_s" in dense else None
            rows = [_result_row("dense", dense, flops, _bytes(m, k, n, 1, 2, m), base, ceil, impl="dense", kind="")]
            for kind in ("balanced", "skewed"):
                sizes = group_sizes(kind, m, g)
                nb = _bytes(m, k, n, int((sizes > 0).sum()), 2, m)
                nb8 = nb - int((sizes > 0).sum()) * k * n  # the weights in one byte each
                for name, fn in impls.items():
                    r = run(f"{model} {proj} {kind} {name}", fn, x, w, jnp.asarray(sizes))
                    rows.append(_result_row(f"{kind:8s} {name}", r, flops, nb, base, ceil, impl=name, kind=kind))
                for name, fn in fp8_impls.items():
                    r = run(f"{model} {proj} {kind} {name}", fn, x, w8, jnp.asarray(sizes))
                    rows.append(_result_row(f"{kind:8s} {name}", r, flops, nb8, base, ceil, impl=name, kind=kind))
            for name, why in not_run.items():
                rows += [{"name": nm, "impl": nm, "kind": "", "not_run": why} for nm in (name, f"{name} fp8")]
            out["shapes"][f"{model}_{proj}"] = {"k": k, "n": n, "rows_per_group": m // g, "rows": rows}
            _print(f"GPU {model} {proj}: [{m}, {k}] x [{g}, {k}, {n}] bf16 (TFLOP/s)", rows, "TFLOP/s")
            checkpoint(out)
    # Steps 3 and 4, one implementation after the other (the Mosaic kernel's first: a step cut short by its time
    # budget loses the last ones): the flat regime, 1 to 256 rows in every one of G groups, time per call against the
    # ceilings; then the per-expert cost profile TEMPO calibrates: the whole SwiGLU expert FFN (up, act, down) of the
    # first shape, G experts with n tokens each, compiled for exactly G * n rows (no padding tail).
    out["flat"] = flat = flat_sweep(plan, {}, not_run, ceil, run, checkpoint=lambda: None)
    out["profile"], out["profile_not_run"] = {}, dict(not_run)
    for name, fn in impls.items():
        part = flat_sweep(plan, {name: fn}, not_run, ceil, run, checkpoint=lambda: checkpoint(out))
        flat["cells"] |= part["cells"]
        flat["monotone"] |= part["monotone"]
        checkpoint(out)
        profile_experts(plan, {name: fn}, plan.shapes[0], run, out["profile"], lambda: checkpoint(out))
    if out["skipped"]:
        print(f"time budget: {len(out['skipped'])} cases not run (the step's deadline passed)", flush=True)
    return out


#: Noise allowed in "time is monotone in rows" (each point at least this fraction below the one before).
FLAT_MONOTONE_TOL = 0.05


def flat_sweep(plan: GpuPlan, impls: dict, not_run: dict, ceil: dict | None, run, checkpoint) -> dict:
    """The flat regime of each grouped GEMM: G groups (`GpuPlan.flat_groups`) of r rows each (`flat_rows`, balanced),
    on the first shape's up projection [G r, H] x [G, H, 2F], bf16. Per cell: µs a call (`flat_chain` dependent
    calls in one timed program, best of `flat_iters`), TFLOP/s and its fraction of the measured matmul ceiling, the
    activated experts' weight bytes (G·H·2F·2: what the flat regime streams) per second and its fraction of the
    measured copy ceiling, and whether the weight bytes at the copy ceiling outlast the FLOPs at the matmul ceiling
    (``bandwidth_bound``: the cells the bandwidth goal is held to). Per G: whether the time is monotone in r
    (``within_tol``: every step down at most `FLAT_MONOTONE_TOL`; ``strict``: no step down at all; None: a cell
    missing)."""
    model, h, f = plan.shapes[0]
    k, n, dt = h, 2 * f, jnp.bfloat16
    res: dict = {
        "shape": f"{model}_up",
        "k": k,
        "n": n,
        "dtype": "bfloat16",
        "rows_per_group": list(plan.flat_rows),
        "groups": list(plan.flat_groups),
        "chain": plan.flat_chain,
        "monotone_tol": FLAT_MONOTONE_TOL,
        "cells": {},
        "monotone": {},
        "not_run": dict(not_run),
    }
    for name, fn in impls.items():
        cells = res["cells"][name] = []
        timed = _chained(fn, plan.flat_chain)
        for gp in plan.flat_groups:
            wbytes = gp * k * n * jnp.dtype(dt).itemsize
            n_copies = max(1, min(plan.flat_chain, -(-plan.flat_rotate_bytes // wbytes)))
            ws = tuple(
                (jax.random.normal(jax.random.key(100 + i), (gp, k, n), jnp.float32) / np.sqrt(k)).astype(dt)
                for i in range(n_copies)
            )
            for r in plan.flat_rows:
                x = jax.random.normal(jax.random.key(r), (gp * r, k), dt)
                sizes = jnp.full((gp,), r, jnp.int32)
                t = run(f"flat {name} G={gp} r={r}", timed, x, ws, sizes, iters=plan.flat_iters)
                cell = {"G": gp, "rows_per_group": r, "M": gp * r, "weight_bytes": wbytes, "weight_copies": n_copies}
                if "best_s" not in t:
                    cells.append(cell | t)
                    continue
                s = t["best_s"] / plan.flat_chain
                flops = 2.0 * gp * r * k * n
                cell |= {"compile_s": t["compile_s"], "us": s * 1e6, "tflops": flops / s / 1e12}
                cell["gb_per_s"] = wbytes / s / 1e9
                if ceil:
                    cell["frac_matmul"] = cell["tflops"] / ceil["tflops"]
                    cell["frac_copy"] = cell["gb_per_s"] / ceil["gb_per_s"]
                    cell["bandwidth_bound"] = wbytes / (ceil["gb_per_s"] * 1e9) >= flops / (ceil["tflops"] * 1e12)
                cells.append(cell)
            del ws
            done = [c for c in cells if c["G"] == gp]
            us = [c["us"] for c in done if "us" in c]
            complete = len(us) == len(plan.flat_rows)
            res["monotone"].setdefault(name, {})[str(gp)] = {
                "within_tol": all(b >= a * (1 - FLAT_MONOTONE_TOL) for a, b in itertools.pairwise(us))
                if complete
                else None,
                "strict": all(b >= a for a, b in itertools.pairwise(us)) if complete else None,
            }
            shown = "  ".join(f"{c['rows_per_group']}:{c['us']:.1f}us" if "us" in c else "—" for c in done)
            print(f"  flat {name} G={gp:2d}: {shown}", flush=True)
            checkpoint()
    return res


def profile_experts(plan: GpuPlan, impls: dict, shape: tuple[str, int, int], run, prof: dict, checkpoint) -> dict:
    """Time of the expert FFN vs tokens per expert at several expert counts G, per implementation.

    Fills and returns `prof` = {impl: [{"G", "tokens_per_expert", "N", "tiles", "us"}, ...]}, `tiles` =
    G * ceil(n / 128); `checkpoint()` runs after each G. `run` times one case (`_Cases`): a case without a time
    (failed, or past the time budget) is left out of the profile.
    """
    _, h, f = shape
    key, dt = jax.random.key(3), jnp.bfloat16
    for name, fn in impls.items():
        ffn, prof[name] = _expert_ffn(fn, plan.profile_reps), []
        for gp in plan.profile_groups:
            w_up = (jax.random.normal(key, (gp, h, 2 * f), jnp.float32) / np.sqrt(h)).astype(dt)
            w_down = (jax.random.normal(key, (gp, f, h), jnp.float32) / np.sqrt(f)).astype(dt)
            for npe in plan.profile_tokens:
                x = jax.random.normal(jax.random.key(npe), (gp * npe, h), dt)
                sizes = jnp.full((gp,), npe, jnp.int32)
                r = run(f"profile {name} G={gp} n={npe}", ffn, x, w_up, w_down, sizes)
                if "best_s" in r:
                    n_tiles = gp * -(-npe // 128)
                    us = r["best_s"] * 1e6 / plan.profile_reps
                    prof[name].append(dict(G=gp, tokens_per_expert=npe, N=gp * npe, tiles=n_tiles, us=us))
            done = [p for p in prof[name] if p["G"] == gp]
            print(f"  profile {name} G={gp:2d}: " + "  ".join(f"{p['N']}:{p['us']:.0f}us" for p in done), flush=True)
            checkpoint()
    return prof


def write_profile_csv(profile: dict, path: Path) -> str | None:
    """Write the fastest implementation's profile as `G,N,T,t` (t in µs) for `tempo-jax calibrate`."""
    usable = {k: v for k, v in profile.items() if v}
    if not usable:
        return None
    impl = min(usable, key=lambda k: sum(p["us"] for p in usable[k]) / len(usable[k]))
    lines = ["G,N,T,t"] + [f"{p['G']},{p['N']},{p['tiles']},{p['us']:.3f}" for p in usable[impl]]
    path.write_text("\n".join(lines) + "\n")
    return impl


def check_gpu(plan: GpuPlan, deadline: float | None = None) -> dict:
    """Correctness of the kernels (non-interpret on a GPU) vs the references on the default backend: the project's
    Mosaic GPU kernel ("mosaic gmm"; a "not run" row where this JAX or machine cannot run it), the Pallas Triton
    kernel ("gmm", its old name: checked on every JAX that ships it, deprecated or not), tokamax's, the dispatch
    kernel. With a ``deadline`` (Unix time), cases that would start after it are "not run: time budget" rows.

    Fresh random inputs; relative error max|a − b| / max(1, max|b|) per output and gradient; NaN fails.
    """
    results, key = {}, jax.random.key(1)

    def out_of_time(name: str) -> bool:
        if deadline is None or time.time() <= deadline:
            return False
        results[name] = {"not_run": TIME_BUDGET, "ok": None}
        return True

    m, k, n = plan.check_mkn
    sizes = jnp.asarray(plan.check_sizes, jnp.int32)
    g = sizes.shape[0]
    impls = {}
    if (why := gmm_status(plan.interpret)["mosaic gmm"]) is None:
        impls["mosaic gmm"] = _mosaic(plan)
    else:
        results["mosaic gmm"] = {"not_run": why, "ok": None}  # neither passed nor failed
    impls["gmm"] = _pallas(plan)  # the Pallas kernel keeps its old names; tokamax's rows say "tokamax gmm"
    if (tk := _tokamax()) is not None:
        impls["tokamax gmm"] = tk
    else:
        results["tokamax gmm"] = {"not_run": tokamax_backend.INSTALL_HINT, "ok": None}
    for (label, fn), dt in itertools.product(impls.items(), (jnp.bfloat16, jnp.float32)):
        tol = 2e-2 if dt == jnp.bfloat16 else 1e-2  # float32 dots default to TF32 on GPU
        x = jax.random.normal(key, (m, k), jnp.float32).astype(dt)
        w = (jax.random.normal(key, (g, k, n), jnp.float32) / 16).astype(dt)
        for off, gl in ((0, g), (2, 3)):
            wl = w[off : off + gl]
            name = f"{label} {jnp.dtype(dt).name} offset={off}"
            if out_of_time(name):
                continue

            def loss(fn, x, wl, off=off):
                return jnp.sum(jnp.sin(fn(x, wl, sizes, group_offset=off).astype(jnp.float32)))

            try:
                got = fn(x, wl, sizes, group_offset=off)
                want = gmm_reference(x, wl, sizes, group_offset=off)
                dgot = jax.grad(lambda x, wl, fn=fn: loss(fn, x, wl), (0, 1))(x, wl)
                dwant = jax.grad(lambda x, wl: loss(gmm_reference, x, wl), (0, 1))(x, wl)
            except Exception as e:
                results[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}", "ok": False}
                continue
            errs = {}
            for part, a, b in (("out", got, want), ("dlhs", dgot[0], dwant[0]), ("drhs", dgot[1], dwant[1])):
                a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
                errs[part] = float(np.abs(a - b).max() / max(1.0, np.abs(b).max())) if np.isfinite(a).all() else 1e9
            results[name] = {"max_rel_err": errs, "tol": tol, "ok": all(v <= tol for v in errs.values())}
    results |= _check_fp8(impls, plan, sizes, out_of_time)
    t, kk, e, r = plan.dispatch_tker
    ids = jax.random.randint(key, (t, kk), 0, e, jnp.int32)
    valid = jnp.arange(t) < t - t // 40
    table = jax.random.uniform(key, (e, r)).at[3].set(0.0)  # a torn (all-zero) row
    l2p = jnp.arange(e * r, dtype=jnp.int32).reshape(e, r).at[5, 1].set(-1)  # a missing replica
    ctr = jnp.full((e,), 2**32 - 7, jnp.uint32)  # counters about to wrap
    u = jax.random.uniform(jax.random.key(2), (t, kk))
    for mode in DISPATCH_MODES:
        name = f"dispatch {mode}"
        if out_of_time(name):
            continue
        try:
            a = dispatch(
                ids, valid, table, l2p, ctr, mode=mode, uniforms=u, implementation="pallas", interpret=plan.interpret
            )
            b = dispatch_reference(ids, valid, table, l2p, ctr, mode=mode, uniforms=u)
        except Exception as exc:
            results[name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}", "ok": False}
            continue
        ok = all(bool((x == y).all()) for x, y in zip(a, b, strict=True))
        results[name] = {"exact": ok, "ok": ok}
    for name, res in results.items():
        verdict = {True: "ok  ", False: "FAIL", None: "--  "}[res["ok"]]  # None: not run here (said why)
        print(f"  {verdict} {name}: {res}", flush=True)
    return results


def _check_fp8(impls: dict, plan: GpuPlan, sizes: jax.Array, out_of_time=lambda name: False) -> dict:
    """FP8 weights (`BlockScaled`, DeepSeek's 128 × 128 blocks) through each implementation against the reference on
    their dequantized value: output and d lhs (the weights are frozen), bfloat16 activations, with the path each took
    (`fp8_path`: tokamax's kernel, or dequantize first)."""
    m, k, n = plan.check_mkn
    x = jax.random.normal(jax.random.key(4), (m, k), jnp.bfloat16)
    w = _fp8(jax.random.normal(jax.random.key(5), (sizes.shape[0], k, n), jnp.float32) / 16)
    out = {}
    for label, fn in impls.items():
        name = f"{label} fp8 bfloat16"
        if out_of_time(name):
            continue

        def loss(f, x):
            return jnp.sum(jnp.sin(f(x, w, sizes).astype(jnp.float32)))

        try:
            got, want = fn(x, w, sizes), gmm_reference(x, w, sizes)
            dgot, dwant = jax.grad(functools.partial(loss, fn))(x), jax.grad(functools.partial(loss, gmm_reference))(x)
        except Exception as e:
            out[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}", "ok": False}
            continue
        errs = {}
        for part, a, b in (("out", got, want), ("dlhs", dgot, dwant)):
            a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
            errs[part] = float(np.abs(a - b).max() / max(1.0, np.abs(b).max())) if np.isfinite(a).all() else 1e9
        impl = "tokamax" if label.startswith("tokamax") else "mosaic" if label.startswith("mosaic") else "pallas"
        path = fp8_path(impl, interpret=plan.interpret, shape=w.shape, block=w.block)
        out[name] = {"max_rel_err": errs, "tol": 2e-2, "path": path, "ok": all(v <= 2e-2 for v in errs.values())}
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="results/bench_gemm.json", help="JSON output path")
    p.add_argument("--iters", type=int, default=None, help="timed calls (rounds) per case; best and median kept")
    p.add_argument("--check", action="store_true", help="only check the Pallas kernels against the references")
    p.add_argument(
        "--smoke",
        action="store_true",
        help="run the GPU code paths with tiny shapes, Pallas in interpret mode (works on CPU)",
    )
    p.add_argument("--rows", type=int, default=None, help="GPU: rows (token-expert pairs) per GPU")
    p.add_argument("--local-experts", type=int, default=None, help="GPU: experts per GPU (groups)")
    p.add_argument("--profile-csv", default=None, help="GPU: also write the expert-FFN profile as G,N,T,t (µs)")
    p.add_argument(
        "--deadline",
        type=float,
        default=None,
        help="GPU: Unix time after which no further case starts (each says 'not run: time budget'); default none",
    )
    p.add_argument(
        "--presets",
        default=None,
        help=f"GPU: comma-separated MoE presets whose expert shapes to run (default {','.join(GPU_PRESETS)})",
    )
    args = p.parse_args()
    backend = jax.default_backend()
    plan = GpuPlan.smoke() if args.smoke else GpuPlan()
    overrides = {
        "iters": args.iters,
        "rows": args.rows,
        "local_experts": args.local_experts,
        "shapes": preset_shapes(args.presets.split(",")) if args.presets else None,
    }
    plan = dataclasses.replace(plan, **{k: v for k, v in overrides.items() if v is not None})
    meta = {
        "backend": backend,
        "device": str(jax.devices()[0]),
        "devices": jax.device_count(),
        "jax": jax.__version__,
        "jaxlib": importlib.metadata.version("jaxlib"),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "plan": "smoke" if args.smoke else "full",
        "loadavg_start": os.getloadavg(),  # 1, 5, 15 min: a shared CPU's load moves every ratio
    }
    print(f"backend {backend}: {meta['device']} (jax {meta['jax']}, plan {meta['plan']})", flush=True)
    gpu_paths = backend == "gpu" or args.smoke
    if args.check:
        if not gpu_paths:
            print("--check needs a GPU backend, or --smoke (CPU tests run the kernels in interpret mode)")
            return 2
        results = {"meta": meta, "check": check_gpu(plan, deadline=args.deadline)}
        ok = all(r["ok"] is not False for r in results["check"].values())
    elif gpu_paths:
        results = {"meta": meta, "gpu": {}}
        results["gpu"] = bench_gpu(
            plan, checkpoint=lambda out: _write_json(args.out, dict(results, gpu=out)), deadline=args.deadline
        )
        if args.profile_csv:
            impl = write_profile_csv(results["gpu"]["profile"], Path(args.profile_csv))
            results["gpu"]["profile_csv"] = {"path": args.profile_csv, "implementation": impl}
            print(f"wrote {args.profile_csv} ({impl}); fit it with: tempo-jax calibrate {args.profile_csv}")
        ok = not results["gpu"]["errors"]
    else:
        results = {"meta": meta, "cpu": bench_cpu(CpuPlan(iters=args.iters or CpuPlan.iters))}
        ok = True
    results["meta"]["loadavg_end"] = os.getloadavg()
    _write_json(args.out, results)
    print(f"\nload average {meta['loadavg_start']} at the start, {results['meta']['loadavg_end']} at the end")
    print(f"wrote {args.out}")
    return 0 if ok else 1


def _write_json(path: str, results: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    sys.exit(main())
