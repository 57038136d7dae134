"""What watching costs a served step (`make bench-metrics`; issue 50's budget: ≤ 2% on CPU).

1. The tiny MoE LM as `tempo-jax serve` runs it (2 MoE layers × 16 experts + 8 replicas, top-4, 1,024 tokens per
   step on 8 fake CPU devices; prefill ``[64, 16]`` and decode ``[1024, 1]`` steps, eval mode), its jitted steps
   taking turns in blocks between not watched and three `tempo_jax.metrics.Watcher`s (JSON lines; + a Prometheus
   endpoint; + TensorBoard event files; each solving the optimum every 8 steps and watching for stalls), in one run,
   so the machine's drift hits all alike. A step's time is its jitted call (waited for) plus its `Watcher.step`.
2. The host time of one step's records at DeepSeek-V3 size (58 MoE layers × 256 experts + 32 replicas, EP8) from
   host arrays: what the records cost where the step is far longer than on this CPU.

Prints the median step time per variant (not watched; `tempo-jax serve`'s default ``metrics.jsonl``; + a Prometheus
endpoint; + TensorBoard), its ratio to not watched, the `Watcher.step` call's own time, and writes JSON
(``results/bench_metrics.json``). The writer thread's work (records, sinks) runs beside the step: on this 2-core
box it competes with XLA for the same cores, on a GPU host it uses idle host cores.

    python scripts/bench_metrics.py
    python scripts/bench_metrics.py --steps 40 --block 5
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402
from tqdm import tqdm  # noqa: E402

from solvers import Placement  # noqa: E402
from tempo_jax import make_ep_mesh  # noqa: E402
from tempo_jax.lm import LMConfig, TinyMoELM  # noqa: E402
from tempo_jax.metrics import Capture, Watcher, WatchOptions  # noqa: E402
from tempo_jax.text import table  # noqa: E402
from tempo_jax.workloads import SyntheticRouting  # noqa: E402


def served_steps(steps: int, block: int) -> dict:
    """Step times of the tiny LM's prefill/decode cycle, watched and not, alternating in blocks."""
    mesh = make_ep_mesh()
    D, E = mesh.shape["ep"], 16
    lm = LMConfig(dim=128, layers=2, ffn=128, experts=E, top_k=4, seq_len=16, batch=8, slots_per_rank=3)
    placements = [Placement.from_eplb(np.arange(E) + 1.0, 3 * D, D, spread_idle=True)] * 2
    model = TinyMoELM(lm, mesh=mesh, rngs=nnx.Rngs(params=0, dispatch=1), placements=placements)
    model.eval()
    prefill = nnx.jit(lambda m, t: m(t))
    decode = nnx.jit(lambda m, t: m(t, decode=True))
    rng = np.random.default_rng(0)
    pre = [jnp.asarray(rng.integers(0, 256, (64, 16)), jnp.int32) for _ in range(4)]
    dec = [jnp.asarray(rng.integers(0, 256, (1024, 1)), jnp.int32) for _ in range(4)]
    folder = tempfile.mkdtemp()
    variants = {
        "not watched": None,
        "metrics.jsonl (serve's default)": WatchOptions(jsonl=f"{folder}/a.jsonl"),
        "+ Prometheus endpoint": WatchOptions(jsonl=f"{folder}/b.jsonl", port=0),
        "+ TensorBoard (every sink)": WatchOptions(jsonl=f"{folder}/c.jsonl", port=0, logdir=f"{folder}/tb"),
    }
    watchers = {k: None if v is None else Watcher(v, say=lambda *a: None) for k, v in variants.items()}
    names = list(variants)
    times = {k: [] for k in names}
    call_ms = {k: [] for k in names}
    for s in tqdm(range(-4, steps), desc="served steps", leave=False):  # 4 warm-up steps compile both programs
        kind = "prefill" if s % 4 == 0 else "decode"
        if kind == "prefill":
            model.init_cache(1024, 4)
        name = names[(s // block) % len(names)]  # the variants take turns, block by block
        t0 = time.perf_counter()
        jax.block_until_ready(
            (prefill if kind == "prefill" else decode)(model, (pre if kind == "prefill" else dec)[s % 4])
        )
        t1 = time.perf_counter()
        if watchers[name] is not None:
            watchers[name].step(s, model, kind=kind, step_ms=(t1 - t0) * 1e3)
        t2 = time.perf_counter()
        if s >= 0:
            times[name].append((t2 - t0) * 1e3)
            call_ms[name].append((t2 - t1) * 1e3)
    writer_ms = {}
    for name, w in watchers.items():
        if w is not None:
            w.close()
            writer_ms[name] = w.writer_cpu_s * 1e3 / max(w.records, 1)
    med = {k: float(np.median(v)) for k, v in times.items()}
    return {
        "steps": {k: len(v) for k, v in times.items()},
        "median_ms": med,
        "p90_ms": {k: float(np.percentile(v, 90)) for k, v in times.items()},
        "over_not_watched": {k: med[k] / med["not watched"] for k in names},
        "watcher_call_ms": {k: float(np.median(v)) for k, v in call_ms.items()},
        "writer_cpu_ms": writer_ms,
    }


def deepseek_records(repeats: int) -> dict:
    """Host time of one step's records for 58 layers × 256 experts (+ 32 replicas), EP8, 128 tokens per rank, top-8:
    layer records with EPLB-even makespans, and with the optimum solved (every ``optimum_every``-th step)."""
    L, E, D, n_tok, K = 58, 256, 8, 128, 8
    arrays = []
    for layer in range(L):
        r = SyntheticRouting(num_experts=E, top_k=K, s=1.0, kappa=2000.0, seed=layer)
        p = Placement.from_eplb(r.popularity, E + 32, D, spread_idle=True)
        counts = r.batch(n_tok, D, layer).astype(np.int32)  # [D, E]
        load = np.bincount(p.phy2log, minlength=E)  # replicas per expert: the EPLB-even split
        per_slot = counts.sum(0)[p.phy2log] / load[p.phy2log]
        tokens = per_slot.reshape(D, -1).sum(1).astype(np.int32)
        acts = (per_slot.reshape(D, -1) > 0).sum(1).astype(np.int32)
        zeros = np.zeros(D, np.int32)
        arrays.append(
            {
                "shard_counts": counts,
                "gpu_tokens": tokens,
                "gpu_activations": acts,
                "drops": zeros,
                "rounds": zeros + 1,
                "invalid_ids": zeros,
                "plan_rounds": zeros,
                "phy2log": p.phy2log,
            }
        )
    cap = Capture(arrays, [(D, E)] * L, [1] * L, [False] * L)
    out = {}
    for label, every in (("records", 0), ("records + optimum", 1)):
        ms = []
        with Watcher(WatchOptions(port=0, optimum_every=every), say=lambda *a: None) as watcher:
            for s in range(repeats + 1):
                t0 = time.perf_counter()
                watcher.step(s, cap)
                watcher.flush()  # the writer's work: the records and the endpoint's update
                if s:
                    ms.append((time.perf_counter() - t0) * 1e3)
        out[label] = {"median_ms": float(np.median(ms)), "per_layer_ms": float(np.median(ms)) / L}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=960, help="served steps after the warm-up")
    ap.add_argument("--block", type=int, default=4, help="steps per turn of a variant (4: a prefill, 3 decodes)")
    ap.add_argument("--repeats", type=int, default=10, help="DeepSeek-V3-size record repeats")
    ap.add_argument("--out", default="results/bench_metrics.json")
    args = ap.parse_args(argv)
    load0 = os.getloadavg()
    served = served_steps(args.steps, args.block)
    big = deepseek_records(args.repeats)
    load1 = os.getloadavg()
    m = served["median_ms"]
    writer = served["writer_cpu_ms"]
    rows = [
        [
            k,
            f"{m[k]:.1f}",
            f"{served['p90_ms'][k]:.1f}",
            f"{served['over_not_watched'][k]:.3f}",
            f"{served['watcher_call_ms'][k]:.2f}",
            f"{writer[k]:.2f}" if k in writer else "-",
            served["steps"][k],
        ]
        for k in m
    ]
    heads = ["tiny LM served step (8 CPU devices)", "median ms", "p90 ms", "/ not watched", "call ms", "writer CPU ms"]
    print(table(rows, [*heads, "steps"]))
    for label, r in big.items():
        print(
            f"DeepSeek-V3 size (58 × 256+32, EP8), {label}: {r['median_ms']:.1f} ms per step "
            f"({r['per_layer_ms']:.2f} ms per layer)"
        )
    print(f"load average {load0[0]:.2f} → {load1[0]:.2f} (1 min)")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {"served": served, "deepseek_v3_records": big, "load_avg": [load0[0], load1[0]], "args": vars(args)},
            indent=1,
        )
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
