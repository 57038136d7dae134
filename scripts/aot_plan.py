"""Ahead-of-time plans for real models on real meshes: each preset's MoE layer at its real size, its forward and one
Adam training step compiled for EP8, EP32, EP64 and a data × ep × tensor mesh of 64 fake CPU devices from shapes
alone (`tempo_jax.layer.aot`; nothing is allocated), with per device the compiled arguments, outputs, temporaries
and peak beside the analytic minimum, the collectives per mesh axis, and the GPUs it fits.

    python scripts/aot_plan.py                       # every preset × mesh below → results/aot_plans.json
    .venv-latest/bin/python scripts/aot_plan.py      # the same under the newest jax (what docs/meshes.md shows)
    python scripts/aot_plan.py --presets deepseek_v3 --meshes ep=64 --tokens-per-rank 4096

Prints one table (GB per device) and writes the JSON (`tempo_jax.cli.plan.plan_rows`, one record per plan).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=64")

import jax  # noqa: E402
from tqdm import tqdm  # noqa: E402

from tempo_jax.cli.plan import plan_for, plan_rows  # noqa: E402
from tempo_jax.text import table  # noqa: E402

PRESETS = ("deepseek_v3", "kimi_k2", "qwen3_235b_a22b", "gpt_oss_120b", "gemma4_26b_a4b")
MESHES = ("ep=8", "ep=32", "ep=64", "data=2,ep=16,tensor=2")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--presets", nargs="+", default=list(PRESETS))
    ap.add_argument("--meshes", nargs="+", default=list(MESHES))
    ap.add_argument("--tokens-per-rank", type=int, default=4096)
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    ap.add_argument("--out", default="results/aot_plans.json")
    args = ap.parse_args()
    rows = []
    cases = [(p, m) for p in args.presets for m in args.meshes]
    for preset, mesh in tqdm(cases, desc="plans", unit="plan"):
        t0 = time.perf_counter()
        cfg, plan = plan_for(preset, mesh, args.tokens_per_rank, dtype=args.dtype)
        row = plan_rows(preset, cfg, plan) | {"compile_s": round(time.perf_counter() - t0, 1)}
        rows.append(row)
    gb = lambda b: f"{b / 1e9:.1f}"  # noqa: E731
    lines = [
        (
            r["preset"],
            r["mesh"],
            r["slots_per_rank"],
            gb(r["analytic"]["weights"]),
            gb(r["analytic"]["row_buffers"]),
            gb(r["forward"]["temporaries"]),
            f"{r['forward_temp_over_rows']:.2f}",
            gb(r["forward"]["peak"]),
            gb(r["train"]["peak"]),
            f"{r['train_temp_over_min']:.2f}",
            ", ".join(g.split()[0] for g in r["fits"]) or "—",
        )
        for r in rows
    ]
    heads = (
        "preset",
        "mesh",
        "S",
        "weights",
        "row buffers",
        "fwd temp",
        "fwd temp / rows",
        "fwd peak",
        "train peak",
        "train temp / min",
        "fits (train)",
    )
    print(table(lines, heads, title=f"GB per device, {args.tokens_per_rank} tokens per rank, {args.dtype}"))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "tokens_per_rank": args.tokens_per_rank,
        "dtype": args.dtype,
        "devices": "fake CPU devices (XLA:CPU)",
        "jax": jax.__version__,
    }
    out.write_text(json.dumps({"meta": meta, "plans": rows}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
