"""tempo-jax's MoE layer beside Levanter's (`make bench-peers`, issue 71): the JAX MoE its users already run.

Levanter (PyPI ``marin-levanter``: Python ≥ 3.12, jax < 0.12) ships grug's functional ``moe_mlp``: experts over an
``expert`` mesh axis, routing given by the caller, several transports. Both layers get the *same Hugging Face
checkpoint* — one Mixtral MoE block (top-2, H 256, F 512, float32) that `transformers.MixtralConfig` describes and
this script writes with safetensors — on the *same mesh* (one axis ``expert`` over the devices) in one process, with
the same jax:

- **tempo-jax**: `tempo_jax.hf.load_moe_layers` of the folder, `tempo_jax.moe_forward` (uniform tables), once with
  its default exchange (``exchange="auto"``) and once with each exchange it offers on this platform ("padded"
  all-to-all, "ring");
- **Levanter**: Mixtral's router written as its callers write it (softmax top-k over ``x @ gate``), then
  ``moe_mlp(implementation=...)`` with every transport that runs on XLA:CPU: "ring" (its CPU / TPU default),
  "ring_gather_combine", "fixed_all_to_all", "ring_filtered", "fixed_pooled_wave_all_to_all". Each drops pairs past
  a capacity; each runs at the smallest capacity factor of 1.25, 1.5, 2, 3, 4, 8 that drops nothing on this batch,
  so every output is exact.

Before timing, every output and gradient (x, router, experts) is asserted equal to tempo-jax's (float32 tolerance).
Timing: per round every variant is called once, in a fresh random order, with garbage collected before each call;
medians over the rounds, and the paired per-round ratio tempo-jax / Levanter (its best transport, and its default).
Forward (``out``) and forward + backward (the gradient of ``sum(out · cot)`` with respect to x and every weight), at
128 and 512 tokens per device, E 8 / 16 / 64, on 8 fake CPU devices and on one (each device count in its own
process). Never a timed test: a benchmark.

    make bench-peers                                  # creates .venv-peers, writes results/bench_peers.json
    .venv-peers/bin/python scripts/bench_peers.py --rounds 5 --experts 8 --tokens 128   # one quick row
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HIDDEN, FFN, TOP_K = 256, 512, 2
LEVANTER = ("ring", "ring_gather_combine", "fixed_all_to_all", "ring_filtered", "fixed_pooled_wave_all_to_all")
POOLED = ("ring_filtered", "fixed_pooled_wave_all_to_all")  # need pooled_transport_capacity_factor
CAPACITY_FACTORS = (1.25, 1.5, 2.0, 3.0, 4.0, 8.0)
PASSES = ("forward", "forward+backward")


def write_checkpoint(folder: Path, experts: int, seed: int = 0) -> None:
    """One Mixtral decoder layer's MoE block as transformers names and lays it out (the per-expert hub layout:
    ``block_sparse_moe.gate.weight [E, H]``, ``experts.e.w1 / w3 [F, H]``, ``w2 [H, F]``), float32, with the
    config.json of `transformers.MixtralConfig`. The router is drawn wide (N(0, 0.3²)) so routing is skewed, as
    trained routers are."""
    import numpy as np
    import transformers
    from safetensors.numpy import save_file

    cfg = transformers.MixtralConfig(
        hidden_size=HIDDEN,
        intermediate_size=FFN,
        num_local_experts=experts,
        num_experts_per_tok=TOP_K,
        num_hidden_layers=1,
        vocab_size=32,
    )
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(cfg.to_json_string())
    rng = np.random.default_rng(seed)
    p = "model.layers.0.block_sparse_moe."
    state = {p + "gate.weight": rng.normal(0, 0.3, (experts, HIDDEN))}
    for e in range(experts):
        state[f"{p}experts.{e}.w1.weight"] = rng.normal(0, HIDDEN**-0.5, (FFN, HIDDEN))
        state[f"{p}experts.{e}.w3.weight"] = rng.normal(0, HIDDEN**-0.5, (FFN, HIDDEN))
        state[f"{p}experts.{e}.w2.weight"] = rng.normal(0, FFN**-0.5, (HIDDEN, FFN))
    save_file({k: v.astype(np.float32) for k, v in state.items()}, str(folder / "model.safetensors"))


def tempo_variants(folder: Path, mesh, exchanges: tuple[str, ...]) -> dict:
    """``{name: (params, out_fn)}``: the checkpoint through `tempo_jax.hf.load_moe_layers` onto ``mesh``, one variant
    per exchange; ``out_fn(params, x) → [T, H]``."""
    import dataclasses

    import tempo_jax
    from tempo_jax.hf import load_moe_layers
    from tempo_jax.layer import tables

    block = load_moe_layers(folder, mesh=mesh, axis="expert")[0]
    pa, tab = tables.placement_arrays(block.placement), tables.uniform(block.placement)
    out = {}
    for exchange in exchanges:
        cfg = dataclasses.replace(block.config, exchange=exchange)

        def fn(params, x, cfg=cfg):
            kw = dict(mesh=mesh, placement_arrays=pa, tables=tab, config=cfg, aux_losses=False)
            return tempo_jax.moe_forward(params, x, **kw).out

        out[f"tempo {exchange}"] = (block.params, fn)
    return out, block


def levanter_params(folder: Path, mesh) -> dict:
    """Levanter's layout of the same tensors: ``router [H, E]``, ``w_up_gate [E, H, 2F]`` (w1ᵀ then w3ᵀ),
    ``w_down [E, F, H]`` (w2ᵀ), the expert arrays sharded over ``expert``."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P
    from safetensors.numpy import load_file

    s = load_file(str(folder / "model.safetensors"))
    p = "model.layers.0.block_sparse_moe."
    E = s[p + "gate.weight"].shape[0]
    w13 = np.stack(
        [np.concatenate([s[f"{p}experts.{e}.w1.weight"].T, s[f"{p}experts.{e}.w3.weight"].T], 1) for e in range(E)]
    )
    w2 = np.stack([s[f"{p}experts.{e}.w2.weight"].T for e in range(E)])
    put = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))  # noqa: E731
    expert = P("expert") if mesh.shape["expert"] > 1 else P()
    return {"router": put(s[p + "gate.weight"].T, P()), "w_up_gate": put(w13, expert), "w_down": put(w2, expert)}


def levanter_fn(mesh, implementation: str, capacity_factor: float):
    """``fn(params, x) → ([T, H], dropped pairs)``: Mixtral's router (softmax over the top-k logits, which equals
    softmax-then-renormalise) and grug's ``moe_mlp``."""
    import jax
    from levanter.grug.grug_moe import moe_mlp

    kw = dict(implementation=implementation, capacity_factor=capacity_factor, report_capacity_overflow=True)
    if implementation in POOLED:
        kw["pooled_transport_capacity_factor"] = capacity_factor

    def fn(params, x):
        logits = x @ params["router"]
        top, ids = jax.lax.top_k(logits, TOP_K)
        out, counts = moe_mlp(x, ids, jax.nn.softmax(top, -1), params["w_up_gate"], params["w_down"], mesh=mesh, **kw)
        return out, counts.sender_dropped + counts.receiver_dropped

    return fn


def with_grad(fn, cot):
    """``(params, x) → (out, grads of sum(out · cot) w.r.t. (params, x))``: one forward, one backward."""
    import jax

    def both(params, x):
        out, vjp = jax.vjp(fn, params, x)
        return out, vjp(cot.astype(out.dtype))

    return both


def grads_logical(grads_tempo, block):
    """tempo-jax's parameter gradients in Levanter's layout (router ``[H, E]``, w_up_gate, w_down)."""
    import numpy as np

    from tempo_jax.layer import to_logical

    g = {k: np.asarray(v) for k, v in to_logical(grads_tempo, block.placement).items()}
    return {"router": g["router"], "w_up_gate": np.concatenate([g["w_gate"], g["w_up"]], 2), "w_down": g["w_down"]}


def run_case(experts: int, tokens: int, rounds: int, exchanges, transports, rng) -> list[dict]:
    """Every variant of one (E, tokens per device) on this process's devices: equality asserted, then timed."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    D = len(jax.devices())
    mesh = jax.make_mesh((D,), ("expert",), axis_types=(jax.sharding.AxisType.Explicit,))
    with tempfile.TemporaryDirectory() as tmp, jax.set_mesh(mesh):
        write_checkpoint(Path(tmp), experts)
        tempo, block = tempo_variants(Path(tmp), mesh, exchanges)
        lev_params = levanter_params(Path(tmp), mesh)
    T = tokens * D
    x = jax.device_put(rng.normal(0, 1, (T, HIDDEN)).astype(np.float32), NamedSharding(mesh, P("expert")))
    cot = jax.device_put(rng.normal(0, 1, (T, HIDDEN)).astype(np.float32), NamedSharding(mesh, P("expert")))
    rows = []
    with jax.set_mesh(mesh):
        ref_fn = jax.jit(with_grad(tempo[f"tempo {exchanges[0]}"][1], cot))
        ref_out, (ref_gp, ref_gx) = ref_fn(block.params, x)
        ref_g = grads_logical(ref_gp, block)
        calls, levanter_cf = {p: {} for p in PASSES}, {}
        for name, (params, fn) in tempo.items():
            fwd, both = jax.jit(fn), jax.jit(with_grad(fn, cot))
            out, (gp, gx) = both(params, x)
            _check(name, ref_out, out, ref_gx, gx, ref_g, grads_logical(gp, block))
            calls["forward"][name] = lambda f=fwd, p=params: f(p, x)
            calls["forward+backward"][name] = lambda f=both, p=params: f(p, x)
        for impl in transports:
            for cf in CAPACITY_FACTORS:  # the smallest capacity that drops nothing on this batch
                fn = levanter_fn(mesh, impl, cf)
                if int(jax.jit(fn)(lev_params, x)[1]) == 0:
                    break
            else:
                raise AssertionError(f"levanter {impl}: drops pairs even at capacity factor {cf}")
            out_fn = lambda p, x, fn=fn: fn(p, x)[0]  # noqa: E731
            fwd, both = jax.jit(out_fn), jax.jit(with_grad(out_fn, cot))
            out, (gp, gx) = both(lev_params, x)
            name = f"levanter {impl}"
            _check(name, ref_out, out, ref_gx, gx, ref_g, {k: np.asarray(v) for k, v in gp.items()})
            calls["forward"][name] = lambda f=fwd: f(lev_params, x)
            calls["forward+backward"][name] = lambda f=both: f(lev_params, x)
            levanter_cf[name] = cf
        for pass_ in PASSES:
            ms = _time(calls[pass_], rounds, rng)
            rows.append(_row(D, experts, tokens, pass_, ms, levanter_cf))
    return rows


def _check(name, ref_out, out, ref_gx, gx, ref_g, g) -> None:
    """Outputs and gradients equal to tempo-jax's default (float32: 1e-4 relative to each array's scale)."""
    import numpy as np

    pairs = [("out", ref_out, out), ("grad x", ref_gx, gx)] + [(f"grad {k}", ref_g[k], g[k]) for k in ref_g]
    for what, a, b in pairs:
        a, b = np.asarray(a), np.asarray(b)
        err = float(np.max(np.abs(a - b)) / max(np.max(np.abs(a)), 1e-30))
        assert err < 1e-4, f"{name}: {what} differs from tempo-jax's by {err:.2e} (relative)"


def _time(calls: dict, rounds: int, rng) -> dict:
    """Each round calls every function once in a fresh random order, garbage collected before each → ``{name:
    [ms per round]}`` (one warm-up round first, not kept)."""
    import jax

    names = list(calls)
    out = {n: [] for n in names}
    for r in range(rounds + 1):
        for i in rng.permutation(len(names)):
            gc.collect()
            t0 = time.perf_counter()
            jax.block_until_ready(calls[names[i]]())
            if r:
                out[names[i]].append((time.perf_counter() - t0) * 1e3)
    return out


def _row(D, experts, tokens, pass_, ms: dict, levanter_cf: dict) -> dict:
    """One table row: every variant's median ms; tempo-jax's default against Levanter's best transport and its
    default ("ring"), as the median and [10th, 90th] percentiles of the paired per-round ratios."""
    import numpy as np

    med = {k: float(np.median(v)) for k, v in ms.items()}
    tempo = next(k for k in ms if k.startswith("tempo"))  # the default exchange is listed first
    lev = {k: v for k, v in med.items() if k.startswith("levanter")}
    best = min(lev, key=lev.get)

    def ratio(other):
        r = np.asarray(ms[tempo]) / np.asarray(ms[other])
        return {"median": float(np.median(r)), "p10": float(np.percentile(r, 10)), "p90": float(np.percentile(r, 90))}

    default = "levanter ring" if "levanter ring" in ms else best
    return {
        "devices": D,
        "experts": experts,
        "tokens_per_device": tokens,
        "pass": pass_,
        "median_ms": med,
        "rounds": len(ms[tempo]),
        "levanter_best": best,
        "levanter_capacity_factor": levanter_cf,
        "ratio_vs_best": ratio(best),
        "ratio_vs_ring": ratio(default),
    }


def exchange_sweep(rounds: int, rng, tokens: int = 512) -> list[dict]:
    """tempo-jax's two exchanges on the same call, and what ``exchange="auto"`` picks (`exchange.choose_exchange`):
    E 16, H 256, F 512, float32, ``tokens`` per rank, top-k 2 and 8, on the first 2, 4 and 8 devices."""
    import dataclasses

    import jax
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from pallas_kernels import platform
    from solvers import Placement
    from tempo_jax.layer import MoEConfig, auto_capacity, init_params, moe_forward
    from tempo_jax.layer import tables as dispatch_tables
    from tempo_jax.layer.exchange import CallShape, choose_exchange, exchange_cost

    E, rows = 16, []
    for D in (2, 4, 8):
        mesh = jax.make_mesh((D,), ("ep",), axis_types=(jax.sharding.AxisType.Explicit,), devices=jax.devices()[:D])
        placement = Placement.spread(E, D, E // D)
        for K in (2, 8):
            cfg = MoEConfig(hidden=HIDDEN, ffn=FFN, experts=E, top_k=K, slots_per_rank=E // D, dispatch_mode="quota")
            params = init_params(jax.random.key(0), cfg, placement, mesh=mesh)
            pa, tab = dispatch_tables.placement_arrays(placement), dispatch_tables.uniform(placement)
            x = jax.device_put(rng.normal(0, 1, (tokens * D, HIDDEN)).astype(np.float32), NamedSharding(mesh, P("ep")))
            calls = {p: {} for p in PASSES}
            with jax.set_mesh(mesh):
                for ex in ("padded", "ring"):
                    kw = dict(mesh=mesh, placement_arrays=pa, tables=tab, config=dataclasses.replace(cfg, exchange=ex))

                    def fn(p, x, kw=kw):
                        return moe_forward(p, x, **kw).out

                    fwd, both = jax.jit(fn), jax.jit(with_grad(fn, x))
                    calls["forward"][ex] = lambda f=fwd, p=params, x=x: f(p, x)
                    calls["forward+backward"][ex] = lambda f=both, p=params, x=x: f(p, x)
                C = auto_capacity(cfg, tokens, D)
                shape = CallShape(tokens, K, HIDDEN, D, C, itemsize=4)
                pick = choose_exchange("padded", shape, platform())
                model = {ex: exchange_cost(ex, shape, platform()).us for ex in ("padded", "ring")}
                for pass_ in PASSES:
                    ms = {k: float(np.median(v)) for k, v in _time(calls[pass_], rounds, rng).items()}
                    rows.append(
                        {
                            "devices": D,
                            "top_k": K,
                            "tokens_per_device": tokens,
                            "pass": pass_,
                            "median_ms": ms,
                            "faster": min(ms, key=ms.get),
                            "auto": pick,
                            "model_us": model,
                        }
                    )
    return rows


def worker(args) -> None:
    """One device count, every case: rows as JSON on stdout's last line."""
    import jax
    import numpy as np
    from tqdm import tqdm

    D = len(jax.devices())
    rng = np.random.default_rng(args.seed)
    exchanges = ("auto",) + tuple(e for e in args.exchanges if D > 1)
    transports = LEVANTER if D > 1 else ("scatter",)  # one device: its local path (no expert axis to cross)
    rows = []
    cases = [(e, t) for e in args.experts for t in args.tokens]
    for experts, tokens in tqdm(cases, desc=f"{D} device(s)", file=sys.stderr):
        rows += run_case(experts, tokens, args.rounds, exchanges, transports, rng)
    sweep = exchange_sweep(args.rounds, rng) if D > 1 and args.sweep else []
    print(json.dumps({"rows": rows, "exchange_sweep": sweep}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--experts", type=int, nargs="+", default=[8, 16, 64])
    ap.add_argument("--tokens", type=int, nargs="+", default=[128, 512], help="tokens per device")
    ap.add_argument("--devices", type=int, nargs="+", default=[8, 1])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--exchanges", nargs="*", default=["padded", "ring"], help="tempo-jax exchanges beside 'auto'")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "results" / "bench_peers.json"))
    ap.add_argument("--no-sweep", dest="sweep", action="store_false", help="leave out the exchange sweep")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    rows, sweep = [], []
    for D in args.devices:
        env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={D}"}
        cmd = [sys.executable, __file__, "--worker", "--rounds", str(args.rounds), "--seed", str(args.seed)]
        cmd += [
            "--experts",
            *map(str, args.experts),
            "--tokens",
            *map(str, args.tokens),
            "--exchanges",
            *args.exchanges,
        ]
        cmd += [] if args.sweep else ["--no-sweep"]
        done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, check=True)
        got = json.loads(done.stdout.strip().splitlines()[-1])
        rows, sweep = rows + got["rows"], sweep + got["exchange_sweep"]
    import jax

    meta = {
        "jax": jax.__version__,
        "levanter": _version("marin-levanter"),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "hidden": HIDDEN,
        "ffn": FFN,
        "top_k": TOP_K,
        "dtype": "float32",
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows, "exchange_sweep": sweep}, indent=1))
    print(markdown(rows))
    if sweep:
        print(sweep_markdown(sweep))
    print(f"wrote {args.out}")


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


def markdown(rows: list[dict]) -> str:
    """The table of docs/results.md: one row per (devices, E, tokens, pass)."""
    cols = ["devices", "E", "tokens / device", "pass", "tempo-jax ms", "Levanter best (transport) ms", "ring ms"]
    cols += ["tempo / best", "tempo / ring"]
    lines = ["| " + " | ".join(cols) + " |", "| " + " | ".join("---" for _ in cols) + " |"]
    for r in rows:
        med = r["median_ms"]
        tempo = next(v for k, v in med.items() if k.startswith("tempo"))
        best = r["levanter_best"]
        ring = med.get("levanter ring", med[best])
        rb, rr = r["ratio_vs_best"], r["ratio_vs_ring"]
        lines.append(
            f"| {r['devices']} | {r['experts']} | {r['tokens_per_device']} | {r['pass']} | {tempo:.1f} | "
            f"{med[best]:.1f} ({best.split()[1]}) | {ring:.1f} | "
            f"{rb['median']:.2f} [{rb['p10']:.2f}, {rb['p90']:.2f}] | "
            f"{rr['median']:.2f} [{rr['p10']:.2f}, {rr['p90']:.2f}] |"
        )
    return "\n".join(lines)


def sweep_markdown(rows: list[dict]) -> str:
    """The exchange table of docs/results.md: padded against ring per (devices, top-k, pass), and auto's pick."""
    lines = [
        "| devices | top-k | pass | padded ms | ring ms | faster | auto picks | model padded / ring µs |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        ms, m = r["median_ms"], r["model_us"]
        lines.append(
            f"| {r['devices']} | {r['top_k']} | {r['pass']} | {ms['padded']:.1f} | {ms['ring']:.1f} | {r['faster']} | "
            f"{r['auto']} | {m['padded']:.0f} / {m['ring']:.0f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
