"""The step at scale, simulated (issue 75, item 4): the TEMPO step replay and the CascadeEP simulator on EP64 —
8 nodes × 8 GPUs, NVLink inside a node and one 50 GB/s NIC per GPU between nodes — beside the same 64 GPUs in
one NVLink domain, so the dispatch policies' and OEWF's effect shows where the inter-node links dominate.

    python scripts/scale_sim.py                      # → results/scale_sim.json, docs/figures/scale_sim.png
    python scripts/scale_sim.py --requests 400 --seeds 1 --batches 1     # a quick look (~1 min)

Part 1 (TEMPO, `tempo_jax.sim.tempo.scale`): DeepSeek-V3's shape and FP8 kernel model, EPLB with 1.25× slots,
Zipf 1.2 routing; each policy's step = dispatch + the slowest rank's experts + combine, with the NIC at 50 GB/s
and (one domain) at the NVLink figure. Part 2 (CascadeEP, `tempo_jax.sim.cascade`): DeepSeek-V4-Flash prefill,
DP64 attention + EP64, the Mooncake trace at 0.9 of each seed's Sync capacity, `gpus_per_node=8` against one
domain. Prints both tables and writes one JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from tempo_jax.sim.cascade import CascadeConfig, run_cascade_seeds  # noqa: E402
from tempo_jax.sim.cascade.summary import capacity_rps_seeds  # noqa: E402
from tempo_jax.sim.cascade.vocabulary import LAYER_MODES  # noqa: E402
from tempo_jax.sim.runner import bootstrap_ci  # noqa: E402
from tempo_jax.sim.tempo.scale import EXCHANGES, NVLINK_GBPS, ScaleConfig, scale_replay, scale_summary  # noqa: E402
from tempo_jax.text import table  # noqa: E402

#: The two link settings compared: 8 nodes of 8 (NIC between nodes) and one 64-GPU NVLink domain.
DOMAINS = {"8 nodes × 8": 8, "one domain": None}


def tempo_part(args) -> dict:
    out = {}
    for label, per_node in DOMAINS.items():
        cfg = ScaleConfig(
            tokens_per_gpu=tuple(args.tokens_per_gpu),
            batches=args.batches,
            splits=("topology",),
            exchanges=EXCHANGES if per_node else ("flat",),  # one domain: no node to cross twice
            nic_gbps=ScaleConfig.nic_gbps if per_node else NVLINK_GBPS,
        )
        out[label] = {
            "config": dataclasses.asdict(cfg),
            "summary": scale_summary(scale_replay(cfg, progress=args.progress)),
        }
    return out


def cascade_part(args) -> dict:
    out = {}
    seeds = tuple(range(args.seeds))
    for label, per_node in DOMAINS.items():
        cfg = CascadeConfig(num_ranks=64, gpus_per_node=per_node, trace=args.trace, max_requests=args.requests)
        run_kw = dict(cache_dir=None, workers=args.workers, progress=args.progress)
        rates = {s: args.load * r for s, r in capacity_rps_seeds(cfg, seeds, **run_kw).items()}
        runs = run_cascade_seeds(cfg, LAYER_MODES, seeds=seeds, rates=rates, **run_kw)
        ttft = {m: np.array([runs[s][m].summary()["ttft_mean_s"] for s in seeds]) for m in LAYER_MODES}
        cut = 1.0 - ttft["cascade"] / ttft["sync"]
        alone = 1.0 - ttft["cascade"] / ttft["async_sf"]
        outcomes = {k: int(sum(runs[s]["cascade"].oewf_outcomes[k] for s in seeds)) for k in ("moves", "executed")}
        outcomes |= {k: int(sum(runs[s]["cascade"].oewf_outcomes[k] for s in seeds)) for k in ("abandoned", "dropped")}
        out[label] = {
            "config": cfg.acting(),
            "capacity_rps": {str(s): r / args.load for s, r in rates.items()},
            "ttft_mean_s": {m: float(v.mean()) for m, v in ttft.items()},
            "cascade_cut": {"mean": float(cut.mean()), "ci95": list(bootstrap_ci(cut))},
            "oewf_alone": {"mean": float(alone.mean()), "ci95": list(bootstrap_ci(alone))},
            "oewf": outcomes,
        }
    return out


def print_tables(result: dict) -> None:
    rows = []
    for label, part in result["tempo"].items():
        for r in part["summary"]:
            rows.append(
                (
                    label,
                    r["exchange"],
                    r["B"],
                    r["policy"],
                    f"{r['step_us']:,.0f}",
                    f"{r['expert_us']:,.0f}",
                    f"{r['dispatch_us'] + r['combine_us']:,.0f}",
                    f"{100 * r['exchange_share']:.0f}%",
                    f"{100 * r['nic_fraction']:.1f}%",
                    f"{r['vs_tempo']:.3f}",
                )
            )
    head = [
        "links",
        "exchange",
        "B/GPU",
        "policy",
        "step µs",
        "experts µs",
        "exchange µs",
        "exch. share",
        "over NIC",
        "× TEMPO",
    ]
    print(table(rows, head, title="TEMPO step on EP64 (DeepSeek-V3 shape, FP8 kernel model)"))
    rows = []
    for label, part in result["cascade"].items():
        c, a, o = part["cascade_cut"], part["oewf_alone"], part["oewf"]
        rows.append(
            (
                label,
                f"{np.mean(list(part['capacity_rps'].values())):.1f}",
                *(f"{part['ttft_mean_s'][m]:.3f}" for m in LAYER_MODES),
                f"{100 * c['mean']:.1f}% [{100 * c['ci95'][0]:.1f}, {100 * c['ci95'][1]:.1f}]",
                f"{100 * a['mean']:.1f}% [{100 * a['ci95'][0]:.1f}, {100 * a['ci95'][1]:.1f}]",
                f"{o['executed']:,} / {o['moves']:,} ({o['dropped']:,} late)",
            )
        )
    head = ["links", "Sync cap. rps", *(f"TTFT {m} s" for m in LAYER_MODES), "cut vs Sync", "OEWF alone", "moves run"]
    print(table(rows, head, title="CascadeEP prefill on DP64 + EP64 (V4-Flash, Mooncake, 0.9 of capacity)"))


def figure(result: dict, path: Path) -> None:
    """One panel per B: each policy's step split into dispatch, experts and combine, for 8 nodes (flat and two-hop
    exchange) and one domain; bars past the axis (METRO) are cut and labelled with their height."""
    parts = result["tempo"]
    Bs = sorted({r["B"] for p in parts.values() for r in p["summary"]})
    cols = min(2, len(Bs))
    rows_ = -(-len(Bs) // cols)
    fig, axes = plt.subplots(rows_, cols, figsize=(6.0 * cols, 3.9 * rows_), squeeze=False)
    for ax in axes.ravel()[len(Bs) :]:
        ax.set_visible(False)
    colors = (("dispatch_us", "#4c72b0"), ("expert_us", "#dd8452"), ("combine_us", "#55a868"))
    for ax, B in zip(axes.ravel(), Bs, strict=False):
        bars = [
            (f"{r['policy']}\n{'1 dom.' if label == 'one domain' else r['exchange'].replace('_', '-')}", r)
            for label, part in parts.items()
            for r in part["summary"]
            if r["B"] == B
        ]
        top = 1.5 * max(r["step_us"] for _, r in bars if r["policy"] != "metro") / 1e3
        for x, (_, r) in enumerate(bars):
            bottom = 0.0
            for key, color in colors:
                ax.bar(x, r[key] / 1e3, bottom=bottom, color=color, label=key[:-3] if x == 0 else None)
                bottom += r[key] / 1e3
            if bottom > top:
                ax.text(x, top * 0.97, f"{bottom:.1f}", ha="center", va="top", fontsize=6, rotation=90, color="white")
        ax.set_ylim(0, top)
        ax.set_xticks(range(len(bars)), [b[0] for b in bars], fontsize=5.5, rotation=90)
        ax.set_title(f"B = {B} tokens per GPU", fontsize=9)
        ax.set_ylabel("ms per layer")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(
        "TEMPO's step on EP64: 8 nodes × 8 (NIC 50 GB/s; flat and two-hop) against one NVLink domain", fontsize=10
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens-per-gpu", type=int, nargs="+", default=[16, 128, 512, 2048])
    ap.add_argument("--batches", type=int, default=3, help="TEMPO batches per B")
    ap.add_argument("--trace", default="mooncake", help="CascadeEP request trace (mooncake needs ../shared/traces)")
    ap.add_argument("--requests", type=int, default=2000, help="CascadeEP requests per seed")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--load", type=float, default=0.9, help="CascadeEP rate as a fraction of each seed's capacity")
    ap.add_argument("--workers", type=int, default=2, help="CascadeEP runs in parallel")
    ap.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    ap.add_argument("--out", default="results/scale_sim.json")
    ap.add_argument("--figure", default="docs/figures/scale_sim.png")
    args = ap.parse_args(argv)
    t0 = time.time()
    result = {
        "command": " ".join(["scripts/scale_sim.py", *(sys.argv[1:] if argv is None else argv)]),
        "tempo": tempo_part(args),
        "cascade": cascade_part(args),
    }
    result["seconds"] = time.time() - t0
    print_tables(result)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    figure(result, Path(args.figure))
    print(f"wrote {args.out} and {args.figure} in {result['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
