"""GPU check of the MoE layer, in this order: the in-graph plans' time a call (`tempo_jax.layer.relief.plan` and the
dynamic copy plan at EP8 / EP32, E 256 + 64 slots; the issue's goal: the plan within 100 µs at EP8); the layer per
call on one device for every exchange x gmm pair (`EXCHANGES` x the Mosaic GPU kernel, tokamax, the Pallas Triton
kernel, ragged_dot: one device, so the exchange is trivial and what is timed is the layer's own overhead), each
against the dense reference, plus FP8 experts through each gmm; the same on every visible device where there are
several; the model-family presets (`--presets`, default a DeepSeek-V3 and a gpt-oss block at reduced E) against the
dense reference; then CascadeEP's launch schedules and OEWF fetches against the synchronous layer (equal outputs,
step time per mode, `scripts/bench_cascade.py`; gpu_check.sh runs this step with XLA's latency-hiding scheduler).
Part of scripts/gpu_check.sh.

    python scripts/gpu_moe_check.py --out results/gpu/moe_check.json       # on a GPU machine
    python scripts/gpu_moe_check.py --smoke --out /tmp/moe_check.json       # CPU: tiny, interpret mode

On CPU (`--smoke`) the ragged exchanges cannot run (XLA:CPU lacks ragged_all_to_all): their rows say "not run", as
do those of a gmm this JAX or machine lacks (`bench_gemm.gmm_status`); the kernels run in interpret mode. Every case
is guarded: one that fails is recorded with its error and the others still run; with `--deadline` the cases that
would start after it are "not run: time budget" rows. The JSON is written after each part. Exit status 1 when any case
fails or errs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_cascade

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from pallas_kernels import fp8_path  # noqa: E402
from solvers import Placement  # noqa: E402
from tempo_jax.layer import MoEConfig, init_params, make_ep_mesh, moe_forward, moe_reference, to_logical  # noqa: E402
from tempo_jax.layer import tables as dispatch_tables  # noqa: E402
from tempo_jax.layer.presets import moe_preset  # noqa: E402
from tempo_jax.layer.scopes import stage_kernels  # noqa: E402

PRESETS = ("deepseek_v3", "gpt_oss_20b")

TOL = 2e-2  # max |y − dense| with TF32 dots on GPU; float32 on CPU lands near 1e-6


#: The layer's exchanges the per-call grid runs (every one `MoEConfig.exchange` names, "auto" aside).
EXCHANGES = ("padded", "ragged", "ragged_split", "ring")


class _Budget:
    """The step's deadline (`--deadline`, Unix time): once past, the cases not yet started are "not run: time
    budget"."""

    def __init__(self, deadline: float | None):
        self.deadline = deadline

    def spent(self) -> str | None:
        """The reason a case must not start now, or None."""
        if self.deadline is not None and time.time() > self.deadline:
            return "time budget: the step's deadline passed before this case"
        return None


def _layer_case(cfg: MoEConfig, mesh, placement, pa, tables, x, *, smoke: bool, repeats: int) -> dict:
    """One layer configuration: max |y − dense reference| (FP8: relative to the output's scale, the reference on the
    same dequantized weights), drops, and the jitted layer's median time a call (end to end: route, dispatch,
    exchange, expert FFN, return, combine)."""
    params = init_params(jax.random.key(1), cfg, placement, mesh=mesh)
    fwd = jax.jit(lambda p, x, c=cfg: moe_forward(p, x, mesh=mesh, placement_arrays=pa, tables=tables, config=c))
    fwd = fwd.lower(params, x).compile()
    t0 = time.perf_counter()
    res = jax.block_until_ready(fwd(params, x))
    first_ms = (time.perf_counter() - t0) * 1e3  # smoke: the one timed call (interpret-mode kernels are slow)
    ref = moe_reference(to_logical(params, placement), x, cfg).astype(jnp.float32)
    err = float(jnp.abs(res.out.astype(jnp.float32) - ref).max())
    if cfg.expert_dtype:  # bf16 activations: relative to the output's scale
        err /= max(1.0, float(jnp.abs(ref).max()))
    drops = int(res.stats.drops.sum())
    ms = first_ms if smoke else _median_ms(lambda x, f=fwd, p=params: f(p, x).out, x, repeats)  # the layer's call
    ok = bool(np.isfinite(err) and err < TOL and not drops)
    out = dict(max_abs_err=err, drops=drops, ms=ms, ok=ok, repeats=1 if smoke else repeats)
    # what each stage launches in the compiled program (issue 72, item 2: the fixed cost around the GEMMs)
    out["kernels"] = {stage: sum(ops.values()) for stage, ops in stage_kernels(fwd.as_text()).items()}
    if cfg.expert_dtype:
        out["fp8_path"] = fp8_path(cfg.gmm_impl, interpret=smoke, dtype=cfg.dtype)
    return out


def check_layer(
    *,
    smoke: bool,
    devices: int | None = None,
    exchanges: tuple[str, ...],
    impls: dict[str, str | None],
    budget: _Budget | None = None,
    fp8: bool = True,
) -> dict:
    """Run every (exchange, gmm implementation) pair on one batch on the first ``devices`` devices (None: all), and
    with ``fp8`` each implementation with FP8 experts on the first exchange (`_layer_case`). ``impls``: gmm
    implementation → None where it runs here, else why not; a pair that cannot run here (that implementation, or a
    ragged exchange on CPU, which XLA:CPU lacks) is a row {"not_run": reason, "ok": None}, as is every case past the
    time ``budget``."""
    D = jax.device_count() if devices is None else devices
    # smoke: the smallest layer that still routes to every expert (interpret-mode kernels cost per expert tile)
    E, tokens, hidden, ffn = ((4, 16, 32, 16) if D == 1 else (16, 32, 32, 16)) if smoke else (16, 256, 128, 64)
    placement = Placement.from_eplb(np.arange(E) + 1.0, max(4 * D, E), D)
    x = jax.random.normal(jax.random.key(2), (D * tokens, hidden))
    mesh = make_ep_mesh(D)
    pa, tables = (
        dispatch_tables.placement_arrays(placement),
        dispatch_tables.perturbed(dispatch_tables.uniform(placement), seed=1),
    )
    out = {}
    # FP8 experts (DeepSeek's block-scaled e4m3 beside bf16 activations) on the first exchange: tokamax and the Mosaic
    # kernel take them into their kernels where they can, the others dequantize per rank first (`fp8_path`, recorded)
    cases = [(ex, g, None) for ex in exchanges for g in impls] + [(exchanges[0], g, "fp8_block") for g in impls] * fp8
    for exchange, gmm_impl, expert_dtype in cases:
        name = f"{exchange}/{gmm_impl}" + ("/fp8" if expert_dtype else "")
        why = impls[gmm_impl]
        if why is None and exchange in ("ragged", "ragged_split") and jax.default_backend() == "cpu":
            why = "XLA:CPU has no ragged_all_to_all (the ragged exchanges run on a GPU or TPU)"
        if why is None and budget is not None:
            why = budget.spent()
        if why is not None:
            out[name] = dict(not_run=why, ok=None)
            print(f"  --   {name:24s} not run: {why}", flush=True)
            continue
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
            out[name] = _layer_case(cfg, mesh, placement, pa, tables, x, smoke=smoke, repeats=20)
        except Exception as e:  # recorded, and the other cases still run
            out[name] = dict(error=f"{type(e).__name__}: {str(e)[:300]}", ok=False)
        r = out[name]
        shown = r["error"] if "error" in r else f"max |y − dense| = {r['max_abs_err']:.2e}, {r['ms']:.3f} ms a call"
        print(f"  {'ok  ' if out[name]['ok'] else 'FAIL'} {name:24s} {shown}", flush=True)
    return dict(devices=D, backend=jax.default_backend(), jax=jax.__version__, tol=TOL, results=out)


def layer_impls(*, smoke: bool) -> dict[str, str | None]:
    """The gmm implementations of the per-call grid (`bench_gemm.GPU_GMMS` by `gmm`'s names: the Mosaic GPU kernel,
    tokamax, the Pallas Triton kernel, ragged_dot) → None where it runs here, else why not (`bench_gemm.gmm_status`:
    a smoke run has the rows a GPU run with this JAX would have)."""
    import bench_gemm

    return {bench_gemm.GMM_IMPL[n]: why for n, why in bench_gemm.gmm_status(interpret=smoke).items()}


def check_presets(names, *, smoke: bool, budget: _Budget | None = None) -> dict:
    """Each preset's block (router, expert variant, shared experts) at reduced E on every device vs the dense
    reference (`moe_reference`), bf16 experts on GPU."""
    D = jax.device_count()
    mesh = make_ep_mesh(D)
    out = {}
    for name in names:
        if budget is not None and (why := budget.spent()):
            out[name] = dict(not_run=why, ok=None)
            print(f"  --   preset {name:18s} not run: {why}", flush=True)
            continue
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


def check_cascade(*, smoke: bool, budget: _Budget | None = None) -> dict:
    """Sync / Async / Async+SF / CascadeEP on the same batch (`bench_cascade.measure`); needs ≥ 2 devices."""
    D = jax.device_count()
    if D < 2:
        print(f"  cascade: not run — launch schedules need ≥ 2 devices, this machine has {D}", flush=True)
        return dict(ok=True, ran=False, reason=f"{D} device(s): launch schedules need at least 2")
    if budget is not None and (why := budget.spent()):
        print(f"  cascade: not run — {why}", flush=True)
        return dict(ok=True, ran=False, reason=why)
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
    """Median ms of ``repeats`` calls of ``f(arg)``, after one untimed call (compile, warm-up)."""
    import statistics

    jax.block_until_ready(f(arg))  # compile
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(f(arg))
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


#: Compile options that run the plan as CUDA graphs: XLA's default command buffers plus WHILE and CONDITIONAL, so
#: a while loop's body and its predicate become one graph with conditional nodes (CUDA >= 12.3) and a round is
#: neither a kernel launch per operation nor a round trip to the host; every fusion goes in (a graph of one
#: fusion too). XLA:CPU ignores them. A model sets the same with XLA_FLAGS="--xla_gpu_enable_command_buffer=
#: +WHILE,+CONDITIONAL --xla_gpu_graph_min_graph_size=1" or `.lower(...).compile(GRAPH_OPTIONS)`.
GRAPH_OPTIONS = {
    "xla_gpu_enable_command_buffer": "FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,DYNAMIC_SLICE_FUSION,WHILE,CONDITIONAL",
    "xla_gpu_graph_min_graph_size": 1,
}


def _time_graphed(plan, counts, repeats: int) -> dict:
    """``plan`` (jitted, one argument) compiled with `GRAPH_OPTIONS`: its median ms and whether its plan equals the
    default compilation's — or, where XLA refuses the options, the error (the plain timing stands)."""
    try:
        graphed = plan.lower(counts).compile(GRAPH_OPTIONS)
        ms = _median_ms(graphed, counts, repeats)
        same = all(np.array_equal(a, b) for a, b in zip(graphed(counts), plan(counts), strict=True))
        return dict(relief_graph_ms=ms, relief_graph_equal=bool(same))
    except Exception as e:  # recorded beside the plain timing
        return dict(relief_graph_error=f"{type(e).__name__}: {str(e)[:300]}")


def _time_plan(D: int, E: int, S: int, B: int, repeats: int, graphs: bool) -> dict:
    """One cell of `time_plans`: D ranks, E experts, S slots per rank (spares to random experts), B tokens per rank;
    ``graphs``: relief compiled as CUDA graphs too (`_time_graphed`)."""
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
    plan = jax.jit(lambda c: relief.plan(c, l2p, slots_per_rank=S, num_ranks=D, cost=cost, with_rounds=True))
    res = {
        "relief_ms": _median_ms(plan, counts, repeats),
        **(_time_graphed(plan, counts, repeats) if graphs else {}),
        "copies_ms": _median_ms(
            jax.jit(lambda c: copies.plan_copies(jnp.sum(c, 0), ranks, cost, D, 1, cc, num_slots=D * S)),
            counts,
            repeats,
        ),
    }
    ran = int(plan(counts)[2])  # the timed program's own count (no eager run of relief on the device)
    return res | dict(rounds=ran, relief_ms_per_round=res["relief_ms"] / max(ran, 1), ok=True)


#: The cell of `time_plans` the issue's goal (the in-graph plan within 100 µs a call) is held to.
PLAN_GOAL_CELL = "EP8 E256+64 B512"


def time_plans(*, smoke: bool) -> dict:
    """The in-graph plans on the device: `tempo_jax.layer.relief.plan` (pairwise relief; every rank runs it on the
    all-gathered counts) and the dynamic copy plan (`tempo_jax.layer.copies.plan_copies`, k = 1), jitted, median of
    repeated calls, at EP8 / E 256 + 64 and EP32 / E 256 + 64 slots, 512 tokens per rank, Zipf(1.2) top-8 (smoke:
    EP4 / E 8 + 4). Per call, and per improvement round relief ran (on a GPU: many small ops per round); relief also
    compiled as CUDA graphs (`GRAPH_OPTIONS`) in the goal's cell (and the smoke cell), with whether that plan is the
    same."""
    cells = ((4, 8, 3, 64),) if smoke else ((8, 256, 40, 512), (32, 256, 10, 512))  # D, E, S, B
    out = {}
    for D, E, S, B in cells:
        name = f"EP{D} E{E}+{D * S - E} B{B}"
        try:
            graphs = smoke or name == PLAN_GOAL_CELL  # a second compilation: only where the goal reads it
            out[name] = r = _time_plan(D, E, S, B, repeats=3 if smoke else 20, graphs=graphs)
            if "relief_graph_ms" in r:
                graphed = f"{r['relief_graph_ms']:.2f} ms as CUDA graphs (same plan: {r['relief_graph_equal']})"
            else:
                graphed = f"as CUDA graphs: {r.get('relief_graph_error', 'not timed in this cell')}"
            print(
                f"  plan {name}: relief {r['relief_ms']:.2f} ms ({r['rounds']} rounds, "
                f"{r['relief_ms_per_round']:.3f} ms each), {graphed}, copies {r['copies_ms']:.2f} ms",
                flush=True,
            )
        except Exception as e:  # recorded, like the other cases
            out[name] = dict(error=f"{type(e).__name__}: {str(e)[:300]}", ok=False)
            print(f"  FAIL plan {name}: {out[name]['error']}", flush=True)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="results/gpu/moe_check.json", help="JSON output path")
    p.add_argument("--smoke", action="store_true", help="tiny shapes on CPU, kernels in interpret mode")
    p.add_argument("--presets", default=",".join(PRESETS), help="comma-separated MoE presets to check at reduced E")
    p.add_argument("--deadline", type=float, default=None, help="Unix time after which no case starts ('not run')")
    args = p.parse_args()
    budget = _Budget(args.deadline)
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    D = jax.device_count()
    res = dict(devices=D, backend=jax.default_backend(), jax=jax.__version__, tol=TOL)

    def save() -> None:  # after each part: a step cut short by its time limit keeps what it measured
        path.write_text(json.dumps(res, indent=1))

    # The in-graph plans first (cheap, and the goal), then the layer per call on one device for every
    # exchange x gmm pair (the exchange is trivial there: the layer's own overhead), then the check on every device
    # (on one device that is the same grid, run once).
    print("in-graph plans", flush=True)
    res["plans"] = time_plans(smoke=args.smoke)
    res["plan_goal_cell"] = PLAN_GOAL_CELL
    save()
    impls = layer_impls(smoke=args.smoke)
    print("the layer per call on one device, every exchange x gmm", flush=True)
    per_call = check_layer(smoke=args.smoke, devices=1, exchanges=EXCHANGES, impls=impls, budget=budget)
    res["per_call"] = per_call["results"]
    save()
    if D == 1:
        res["results"] = per_call["results"]
    else:
        print(f"the layer on {D} devices", flush=True)
        if args.smoke:  # CPU: the padded exchange across ranks with the CPU path and the Pallas kernel (interpret);
            # the other gmms, and FP8 experts, ran in the per-call grid above
            exchanges, all_impls = ("padded",), {"chunked": None, "pallas": None}
        else:
            exchanges, all_impls = EXCHANGES, impls
        multi = check_layer(smoke=args.smoke, exchanges=exchanges, impls=all_impls, budget=budget, fp8=not args.smoke)
        res["results"] = multi["results"]
    save()
    res["presets"] = check_presets(args.presets.split(","), smoke=args.smoke, budget=budget)
    save()
    res["cascade"] = check_cascade(smoke=args.smoke, budget=budget)
    save()
    print(f"wrote {path}")
    cases = (*res["results"].values(), *res["per_call"].values(), *res["presets"].values(), *res["plans"].values())
    ok = all(r["ok"] is not False for r in cases) and res["cascade"]["ok"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
