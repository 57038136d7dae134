"""The solver worker's time per refresh (`make bench-refresh`): every MoE layer's window solved per refresh, as
TEMPO refreshes all layers each 200 ms window, against that 200 ms budget.

Two models, each through a layered `DispatchController` in process mode (the worker process solves every layer's
window in one solve; `tempo_jax.runtime.serving.lm_model.refresh_time`):

- a DeepSeek-V3-sized synthetic window: 58 MoE layers × 256 experts + 32 redundant replicas, EP8, 128 tokens per
  rank, top-8, Zipf(1) popularity per layer, EPLB per layer, the DSv3 fp8 cost preset;
- the tiny LM's size as `tempo-jax serve` runs it: 2 layers × 16 experts (+ 8), top-4, EP8, 128 tokens per rank,
  with prefill and decode tables per layer (4 windows per refresh).

A DeepSeek-V3 deployment serves prefill and decode on separate instances (disaggregated), so its worker refreshes
one phase's 58 tables.

Prints the worker-clock solve time per refresh (median, p90), per layer, the round trip, the ratio to the budget,
and writes JSON.

    python scripts/bench_refresh.py
    python scripts/bench_refresh.py --quick
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tempo_jax.runtime.serving import refresh_time  # noqa: E402
from tempo_jax.text import table  # noqa: E402

BUDGET_MS = 200.0  # TEMPO §4.4: one refresh per 200 ms window


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=10, help="refreshes per model")
    ap.add_argument("--policy", default="tempo")
    ap.add_argument("--processes", type=int, default=os.cpu_count() or 2, help="solver processes of the split run")
    ap.add_argument("--quick", action="store_true", help="3 refreshes, a 12-layer model instead of 58")
    ap.add_argument("--out", default="results/bench_refresh.json")
    args = ap.parse_args(argv)
    repeats = 3 if args.quick else args.repeats
    v3 = dict(layers=12 if args.quick else 58, experts=256, redundant=32)
    models = {
        "DeepSeek-V3 size (58 × 256+32, EP8), 1 solver process": v3,
        f"DeepSeek-V3 size (58 × 256+32, EP8), {args.processes} solver processes": dict(v3, processes=args.processes),
        "tiny LM (2 phases × 2 layers × 16, EP8)": dict(
            layers=4, experts=16, redundant=8, top_k=4, tokens_per_rank=128
        ),
    }
    load0 = os.getloadavg()
    results, rows = {}, []
    for name, kw in models.items():
        r = refresh_time(repeats=repeats, policy=args.policy, **kw)
        results[name] = r
        s = r["solve_ms"]
        rows.append(
            (
                name,
                r["layers"],
                f"{s['median']:.1f}",
                f"{s['p90']:.1f}",
                f"{r['per_layer_ms']:.2f}",
                f"{r['roundtrip_ms']['median']:.1f}",
                f"{s['median'] / BUDGET_MS:.2f}",
            )
        )
        print(f"  {name}: {s['median']:.1f} ms per refresh ({s['median'] / BUDGET_MS:.2f} of the budget)", flush=True)
    heads = ["model", "layers", "refresh ms", "p90 ms", "per layer ms", "round trip ms", "/ 200 ms"]
    print(table(rows, heads, title=f"\nSolver worker, every layer per refresh ({args.policy}, process mode)"))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = dict(
        command="python scripts/bench_refresh.py " + " ".join(argv or sys.argv[1:]),
        budget_ms=BUDGET_MS,
        loadavg_start=load0,
        loadavg_end=os.getloadavg(),
        cpus=os.cpu_count(),
    )
    out.write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    print(f"load average {load0[0]:.1f} → {os.getloadavg()[0]:.1f}; wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
