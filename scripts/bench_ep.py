"""Expert-parallel MoE layer benchmark (`make bench-ep`): the layer as users run it, against its compute baseline.

Every variant runs in one process and one run, on every available device (8 fake CPU devices here; real GPUs when
present), with the same tokens, router and expert weights:

- **sorted gmm** (the baseline): one device, every pair through the layer's own expert FFN (`stages.expert_ffn`,
  the project's grouped GEMM) — the compute the layer must do, without the exchange and without splitting it;
- **dense bound**: three dense matmuls of the same FLOPs (every pair through one expert-sized FFN);
- the `tempo_jax.MoE` module: eager; under ``nnx.jit`` (the module's state round-trips through the call); under
  ``nnx.jit`` with the state donated (``donate_argnums=0``: what a serving or training step does); each with the
  default ``capacity="auto"`` (dropless rounds, `tempo_jax.layer.rounds`), and under ``nnx.jit`` with the dropless
  worst case (``capacity=None``) and a fixed capacity of twice the mean block (drops possible, counted);
- the same default layer on a routing that sends every token to one rank (the rounds it takes).

Times are medians of interleaved calls after warm-up (``block_until_ready``), compile time separate; ratios are
against the sorted-gmm baseline. Also, in the same run:

- an **empty** ``nnx.jit`` call over the module (``lambda m, x: x``): what carrying the module's state through a
  jitted call costs by itself;
- the **collectives of the compiled training step** (the module + ``nnx.Optimizer(optax.adam)`` under ``nnx.jit``,
  from ``compiled.as_text()``): each all-reduce / all-gather / all-to-all / collective-permute with its operand
  shapes and bytes per device — no operand scales with E: the expert gradients stay on their rank, only the
  replica groups' sum [R, ...] (R = P − E) is all-reduced;
- ``--meshes`` (`scripts/bench_meshes.py`, alone): the layer on (8,), (2, 4), (4, 2) data × ep, (4, 2) ep × tensor,
  (2, 2, 2) and FSDP meshes — FLOPs per device, bytes of every collective, expert bytes per device, time, each
  against the 1-D mesh (``results/bench_ep_meshes.json``);
- ``--ep-memory`` (`scripts/bench_ep_memory.py`): per-device expert bytes and peak RSS of ``qwen3_30b_a3b`` at its
  real dimensions, slot-sharded against replicated, and the re-placements of 10% / 50% of its slots.

``--memory`` adds, per capacity, the peak RSS of a fresh process that runs one jitted forward at T = 65,536 tokens
(``/usr/bin/time -v``). Prints the tables and writes JSON.

    python scripts/bench_ep.py                       # tokens per device 128, 512
    python scripts/bench_ep.py --ep-memory           # + the real-size memory table and re-placements (minutes)
    python scripts/bench_ep.py --meshes              # only the multi-axis meshes (results/bench_ep_meshes.json)
    python scripts/bench_ep.py --memory              # + peak memory at T = 65,536
    python scripts/bench_ep.py --quick
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import bench_meshes  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from bench_meshes import median_ms  # noqa: E402  (bench_ingraph and bench_layer_stages take it from here)
from flax import nnx  # noqa: E402

from solvers import Placement, slots_for  # noqa: E402
from tempo_jax.cli.args import block_options  # noqa: E402
from tempo_jax.layer import MoEConfig, auto_capacity, init_logical_params, make_ep_mesh, to_physical  # noqa: E402
from tempo_jax.layer.module import MoE  # noqa: E402
from tempo_jax.layer.presets import moe_preset  # noqa: E402
from tempo_jax.layer.stages import expert_ffn, route  # noqa: E402
from tempo_jax.text import table  # noqa: E402


def sorted_moe(params, x, config: MoEConfig):
    """One-device dropless MoE: route, then the layer's own expert FFN (pairs sorted by expert, gate, up and down
    grouped GEMMs, unsort) over every pair with the logical experts as groups, combine."""
    T_, K = x.shape[0], config.top_k
    ids, w = route(x, params, config.router, K)[:2]
    rows = x[jnp.arange(T_ * K) // K]
    y, _ = expert_ffn(rows, ids.reshape(-1), params, expert=config.expert, gmm_impl="auto", interpret=False)
    return jnp.einsum("tk,tkh->th", w.astype(y.dtype), y.reshape(T_, K, -1))


def dense_bound(params, x, config: MoEConfig):
    """The same FLOPs as the experts' work: every pair through one expert-sized SwiGLU FFN (a lower bound)."""
    xs = jnp.repeat(x, config.top_k, axis=0)
    h = jax.nn.silu(xs @ params["w_gate"][0]) * (xs @ params["w_up"][0])
    return h @ params["w_down"][0]


def _compile_s(f) -> float:
    t0 = time.perf_counter()
    jax.block_until_ready(f())
    return time.perf_counter() - t0


def _layer(cfg, placement, mesh, capacity, logical):
    """A `MoE` over ``placement`` from the ``logical`` weights (its own buffers: a donated step deletes them)."""
    import dataclasses

    own = to_physical(logical, placement, mesh=mesh)
    return MoE(
        dataclasses.replace(cfg, capacity=capacity),
        placement,
        mesh=mesh,
        rngs=nnx.Rngs(params=0, dispatch=1),
        params=own,
    )


def _hot(cfg: MoEConfig, D: int):
    """A placement whose rank 0 alone holds experts 0 and 1, and router weights that send every token to them."""
    S = cfg.slots_per_rank
    phy2log = np.array([0, 1] + [2 + (i % (cfg.experts - 2)) for i in range(D * S - 2)])
    return Placement.from_phy2log(phy2log, D, num_experts=cfg.experts)


def bench(B: int, cfg: MoEConfig, placement: Placement, params: dict, mesh, repeats: int) -> list[dict]:
    """Every variant at ``B`` tokens per device (see the module). ``params``: the logical weights (the baseline's
    experts; each layer lays them out over its placement)."""
    D, H = mesh.shape["ep"], cfg.hidden
    rng = np.random.default_rng(B)
    # A shared offset direction skews the router's choices like real routing does.
    x = jax.random.normal(jax.random.key(B), (B * D, H)) + jnp.asarray(rng.normal(size=(1, H)))
    one = jax.devices()[0]
    p1, x1 = jax.device_put(params, one), jax.device_put(x, one)
    base_fns = {
        "sorted gmm": jax.jit(lambda p, x: sorted_moe(p, x, cfg)),
        "dense bound": jax.jit(lambda p, x: dense_bound(p, x, cfg)),
    }
    worst = B * cfg.top_k
    fixed = auto_capacity(cfg, B, D)  # the same C as auto, one exchange, overflow dropped (and counted)
    layers = {
        "auto": _layer(cfg, placement, mesh, "auto", params),
        "worst": _layer(cfg, placement, mesh, None, params),
        "fixed": _layer(cfg, placement, mesh, fixed, params),
    }
    hot_params = dict(
        params, router=jnp.asarray(np.where(np.arange(cfg.experts) < 2, 5.0, -5.0)[None].repeat(H, 0), jnp.float32)
    )
    hot = _layer(cfg, _hot(cfg, D), mesh, "auto", hot_params)
    xh = jnp.abs(x)
    step = nnx.jit(lambda m, x: m(x))
    donated = nnx.jit(lambda m, x: m(x), donate_argnums=0)
    tree = nnx.jit(lambda m, x: m(x), graph=False)  # flax's tree mode: only the state that changed comes back
    variants = {
        "eager, auto": lambda: layers["auto"](x),
        "nnx.jit, auto": lambda: step(layers["auto"], x),
        "nnx.jit donated, auto": lambda: donated(layers["auto"], x),
        "nnx.jit graph=False, auto": lambda: tree(layers["auto"], x),
        "nnx.jit, worst case": lambda: step(layers["worst"], x),
        "nnx.jit donated, worst case": lambda: donated(layers["worst"], x),
        f"nnx.jit donated, fixed {fixed}": lambda: donated(layers["fixed"], x),
        "nnx.jit donated, auto, all to one rank": lambda: donated(hot, xh),
    }
    fns = {k: (lambda f=f: f(p1, x1)) for k, f in base_fns.items()} | variants
    compile_s = {k: _compile_s(f) for k, f in fns.items()}
    for f in fns.values():  # one more warm call each
        jax.block_until_ready(f())
    ms = median_ms(fns, repeats)
    base = ms["sorted gmm"]
    capacity = {"auto": f"auto (C = {fixed})", "worst case": f"{worst}"}
    rows = []
    for name in fns:
        m = {"worst": layers["worst"], "fixed": layers["fixed"], "one rank": hot}
        mod = next((m[k] for k in m if k in name), layers["auto"] if "auto" in name else None)
        rec = dict(
            tokens_per_device=B,
            variant=name,
            step_ms=ms[name],
            compile_s=compile_s[name],
            vs_sorted_gmm=ms[name] / base,
            rounds=int(mod.stats.get_value().rounds[0]) if mod is not None else None,
            drops=int(mod.stats.get_value().drops.sum()) if mod is not None else None,
            capacity=next((v for k, v in capacity.items() if k in name), None),
        )
        rows.append(rec)
        print(
            f"  B={B} {name}: {ms[name]:.1f} ms ({ms[name] / base:.2f}×), compile {compile_s[name]:.1f} s", flush=True
        )
    return rows


# ------------------------------------------------------------------------------------------------ state and traffic
def empty_call_ms(cfg: MoEConfig, placement: Placement, params: dict, mesh, repeats: int) -> dict:
    """Median ms of an ``nnx.jit`` call over the module that does nothing (``lambda m, x: x``), donated or not, in
    flax's graph mode (the default) and tree mode (``graph=False``: only the state that changed is returned)."""
    x = jnp.ones((8, cfg.hidden))
    moe = _layer(cfg, placement, mesh, "auto", params)
    plain, donated = nnx.jit(lambda m, x: x), nnx.jit(lambda m, x: x, donate_argnums=0)
    tree, tree_donated = nnx.jit(lambda m, x: x, graph=False), nnx.jit(lambda m, x: x, graph=False, donate_argnums=0)
    fns = {
        "empty nnx.jit call": lambda: plain(moe, x),
        "empty nnx.jit call, donated": lambda: donated(moe, x),
        "empty nnx.jit call, graph=False": lambda: tree(moe, x),
        "empty nnx.jit call, graph=False, donated": lambda: tree_donated(moe, x),
    }
    for f in fns.values():
        jax.block_until_ready(f())
        jax.block_until_ready(f())
    return median_ms(fns, max(repeats, 20))


_KINDS = "all-reduce|all-gather|all-to-all|collective-permute|reduce-scatter"
_COLLECTIVE = re.compile(rf"\s*(?:ROOT )?%\S+ = (.*?) ({_KINDS})(?:-start)?\(")
_ITEMSIZE = {"f32": 4, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "s8": 1, "u8": 1, "pred": 1, "f64": 8, "s64": 8}


def training_collectives(cfg: MoEConfig, placement: Placement, params: dict, mesh, B: int) -> list[dict]:
    """Every collective of the compiled training step (the module + Adam under ``nnx.jit``): kind, operand shapes,
    bytes per device."""
    import optax

    moe = _layer(cfg, placement, mesh, "auto", params)
    opt = nnx.Optimizer(moe, optax.adam(1e-3), wrt=nnx.Param)
    graph, state = nnx.split((moe, opt))
    x = jnp.ones((B * mesh.shape["ep"], cfg.hidden))

    def step(state, x):
        m, o = nnx.merge(graph, state)
        loss, grads = nnx.value_and_grad(lambda m: jnp.mean(m(x) ** 2))(m)
        o.update(m, grads)
        return loss, nnx.state((m, o))

    out = []
    for line in jax.jit(step).lower(state, x).compile().as_text().splitlines():
        m = _COLLECTIVE.match(line)
        if not m:
            continue
        shapes = re.findall(r"(\w+)\[([\d,]*)\]", m[1])
        dims = [(t, tuple(int(d) for d in ds.split(",") if d)) for t, ds in shapes]
        nbytes = sum(_ITEMSIZE.get(t, 4) * int(np.prod(d)) for t, d in dims)
        names = [f"{t}{list(d)}" for t, d in dims]
        grouped = [f"{names.count(n)}× {n}" if names.count(n) > 1 else n for n in dict.fromkeys(names)]
        out.append({"kind": m[2], "shapes": grouped, "bytes": nbytes})
    return out


# ------------------------------------------------------------------------------------------------ memory
def memory_child(tokens: int, capacity: str, cfg_kw: dict) -> None:
    """One jitted forward at ``tokens`` tokens (the parent measures this process's peak RSS)."""
    D = jax.device_count()
    cfg = MoEConfig(**cfg_kw, capacity=None if capacity == "worst" else "auto")
    placement = Placement.from_eplb(
        np.random.default_rng(0).zipf(1.6, cfg.experts).astype(float), D * cfg.slots_per_rank, D
    )
    moe = MoE(cfg, placement, mesh=make_ep_mesh(D), rngs=nnx.Rngs(params=0, dispatch=1))
    x = jax.random.normal(jax.random.key(0), (tokens, cfg.hidden))
    t0 = time.perf_counter()
    y = jax.block_until_ready(nnx.jit(lambda m, x: m(x), donate_argnums=0)(moe, x))
    print(
        json.dumps(
            {
                "first_call_s": time.perf_counter() - t0,
                "rounds": int(moe.stats.get_value().rounds[0]),
                "drops": int(moe.stats.get_value().drops.sum()),
                "finite": bool(jnp.isfinite(y).all()),
            }
        )
    )


def memory(tokens: int, cfg_kw: dict) -> list[dict]:
    """Peak RSS (``/usr/bin/time -v``) of a fresh process running `memory_child` per capacity."""
    out = []
    for capacity in ("auto", "worst"):
        cmd = [
            "/usr/bin/time",
            "-v",
            sys.executable,
            __file__,
            "--memory-child",
            str(tokens),
            capacity,
            json.dumps(cfg_kw),
        ]
        r = subprocess.run(cmd, capture_output=True, text=True, check=False)
        m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", r.stderr)
        rec = dict(
            tokens=tokens, capacity=capacity, peak_rss_gb=int(m.group(1)) / 1e6 if m else None, ok=r.returncode == 0
        )
        if r.returncode == 0:
            rec.update(json.loads(r.stdout.strip().splitlines()[-1]))
        else:
            rec["error"] = r.stderr[-500:]
        out.append(rec)
        print(f"  memory T={tokens} capacity={capacity}: peak RSS {rec['peak_rss_gb']} GB, {rec}", flush=True)
    return out


def _meta(args, argv, load0) -> dict:
    """The run's command, machine, arguments and load averages (start, end) for the JSON."""
    return dict(
        command="python scripts/bench_ep.py " + " ".join(argv),
        devices=jax.device_count(),
        backend=jax.default_backend(),
        processes=jax.process_count(),
        machine=platform.processor() or platform.machine(),
        cpus=os.cpu_count(),
        args=vars(args),
        loadavg_start=load0,
        loadavg_end=os.getloadavg(),
    )


def meshes(args, argv) -> int:
    """``--meshes``: `bench_meshes.run` at the first ``--tokens-per-device``, JSON beside ``--out``."""

    kw = dict(hidden=args.hidden, ffn=args.ffn, experts=args.experts, top_k=args.top_k, slots_per_rank=1)
    cfg = moe_preset(args.preset, **kw) if args.preset else MoEConfig(dispatch_mode="quota", **kw)
    load0 = os.getloadavg()
    tokens = int(args.tokens_per_device.split(",")[0])
    res = bench_meshes.run(cfg, tokens_per_device=tokens, replication=args.replication, repeats=args.repeats)
    out = Path(args.out).with_name(Path(args.out).stem + "_meshes.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": _meta(args, argv, load0), **res}, indent=1))
    print(f"load average {load0[0]:.1f} → {os.getloadavg()[0]:.1f}; wrote {out}")
    return 0


def _parse(argv: list[str]) -> argparse.Namespace:
    """The command-line arguments; ``--quick``: 128 tokens per device only, 3 repeats."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens-per-device", default="128,512", help="batch sizes, tokens per device")
    block_options(ap)
    ap.add_argument("--replication", type=float, default=1.25)
    ap.add_argument(
        "--capacity-factor", type=float, default=MoEConfig.capacity_factor, help="C of capacity='auto' in mean blocks"
    )
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--memory", action="store_true", help="also the peak RSS at T = 65,536 (fresh processes)")
    ap.add_argument("--ep-memory", action="store_true", help="also qwen3_30b_a3b at its real size (bench_ep_memory)")
    ap.add_argument("--memory-tokens", type=int, default=65_536)
    ap.add_argument("--meshes", action="store_true", help="only the multi-axis meshes (scripts/bench_meshes.py)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default="results/bench_ep.json")
    args = ap.parse_args(argv)
    if args.quick:
        args.tokens_per_device, args.repeats = "128", 3
    return args


def _setup(args) -> tuple[MoEConfig, dict, Placement, jax.sharding.Mesh, dict]:
    """``(cfg, kw, placement, mesh, params)``: the layer on every device (D of them) — an EPLB placement of Zipf(1.6)
    expert loads at ``--replication``, its `MoEConfig` (``--preset`` if given) and the keywords it was built from
    (what `memory` passes its children), the 1-D ``ep`` mesh and the logical weights (the baseline's experts; each
    layer lays them out over its placement)."""
    D = jax.device_count()
    E = args.experts
    placement = Placement.from_eplb(
        np.random.default_rng(0).zipf(1.6, E).astype(float), slots_for(E, D, args.replication), D
    )
    kw = dict(
        hidden=args.hidden,
        ffn=args.ffn,
        experts=E,
        top_k=args.top_k,
        slots_per_rank=placement.slots_per_rank,
        dispatch_mode="quota",
        capacity_factor=args.capacity_factor,
    )
    cfg = moe_preset(args.preset, **kw) if args.preset else MoEConfig(**kw)
    mesh = make_ep_mesh(D)
    params = init_logical_params(jax.random.key(0), cfg)  # the baseline's experts; the layers lay them out
    return cfg, kw, placement, mesh, params


def _forward(args, cfg: MoEConfig, placement: Placement, params: dict, mesh) -> list[dict]:
    """`bench` at every ``--tokens-per-device``: its records in order (one per batch size and variant)."""
    results = []
    for B in [int(b) for b in args.tokens_per_device.split(",")]:
        results += bench(B, cfg, placement, params, mesh, args.repeats)
    return results


def _empty_call(cfg: MoEConfig, placement: Placement, params: dict, mesh, repeats: int) -> dict:
    """`empty_call_ms`, one printed line per call."""
    empty = empty_call_ms(cfg, placement, params, mesh, repeats)
    for k, v in empty.items():
        print(f"  {k}: {v:.2f} ms", flush=True)
    return empty


def _collectives(cfg: MoEConfig, placement: Placement, params: dict, mesh) -> list[dict]:
    """`training_collectives` at 128 tokens per device, printed as a table."""
    E, P = placement.num_experts, placement.num_slots
    comm = training_collectives(cfg, placement, params, mesh, 128)
    print(
        table(
            [(c["kind"], ", ".join(c["shapes"])[:90], f"{c['bytes']:,}") for c in comm],
            ["collective", "operands (per device)", "bytes"],
            title=f"\nCollectives of the compiled training step (Adam, E={E}, P={P}: R = P − E = {P - E} replica rows)",
        )
    )
    return comm


def _ep_memory() -> dict:
    """``--ep-memory``: `bench_ep_memory.run` (it prints its own tables)."""
    import bench_ep_memory

    return bench_ep_memory.run()


def _forward_table(results: list[dict]) -> None:
    """Print `bench`'s records as one table, against the sorted-gmm baseline."""
    rows = [
        (
            r["tokens_per_device"],
            r["variant"],
            r["capacity"] or "",
            f"{r['step_ms']:.1f}",
            f"{r['vs_sorted_gmm']:.2f}",
            "" if r["rounds"] is None else r["rounds"],
            "" if r["drops"] is None else r["drops"],
            f"{r['compile_s']:.1f}",
        )
        for r in results
    ]
    heads = ["B/dev", "variant", "capacity", "ms", "vs sorted gmm", "rounds", "drops", "compile s"]
    print(table(rows, heads, title="\nEP MoE layer (forward, median) vs the one-device sorted-gmm baseline"))


def _memory_table(mem: list[dict]) -> None:
    """Print `memory`'s records as one table (nothing when there are none)."""
    if not mem:
        return
    print(
        table(
            [
                (
                    m["tokens"],
                    m["capacity"],
                    m["peak_rss_gb"],
                    m.get("rounds"),
                    m.get("drops"),
                    f"{m.get('first_call_s', float('nan')):.1f}",
                )
                for m in mem
            ],
            ["T", "capacity", "peak RSS GB", "rounds", "drops", "first call s"],
            title="\nPeak memory of one jitted forward (fresh process, /usr/bin/time -v)",
        )
    )


def _write(args, argv, load0, parts: dict) -> None:
    """Write ``{"meta": _meta(...), **parts}`` to ``--out`` and print the load averages and the path."""
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": _meta(args, argv, load0), **parts}, indent=1))
    print(f"load average {load0[0]:.1f} → {os.getloadavg()[0]:.1f}; wrote {out}")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--memory-child":
        memory_child(int(argv[1]), argv[2], json.loads(argv[3]))
        return 0
    args = _parse(argv)
    if args.meshes:
        return meshes(args, argv)
    cfg, kw, placement, mesh, params = _setup(args)
    load0 = os.getloadavg()
    print(
        f"{jax.device_count()} {jax.default_backend()} devices, {jax.process_count()} process(es); E={args.experts}, "
        f"top-{args.top_k}, H={args.hidden}, F={args.ffn}, {placement.num_slots} slots; load {load0[0]:.1f}",
        flush=True,
    )
    results = _forward(args, cfg, placement, params, mesh)
    mem = memory(args.memory_tokens, kw) if args.memory and not args.preset else []
    empty = _empty_call(cfg, placement, params, mesh, args.repeats)
    comm = _collectives(cfg, placement, params, mesh)
    ep_mem = _ep_memory() if args.ep_memory else {}
    _forward_table(results)
    _memory_table(mem)
    parts = dict(results=results, memory=mem, empty_call_ms=empty, training_collectives=comm, ep_memory=ep_mem)
    _write(args, argv, load0, parts)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
