"""Reductions of CascadeEP runs to the paper's tables and figures (notebook 09, `tempo-jax cascade`).

Paper numbers (CascadeEP §4, App. A, D) are in `PAPER`; every function returns plain rows. numpy only.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .cascade import CascadeConfig, CascadeRun, StepModel, run_cascade, step_batches
from .cascade_layer import LAYER_MODES, LayerInputs, LayerResult, layer_timeline

__all__ = [
    "LABELS",
    "PAPER",
    "ablation_rows",
    "capacity_rps",
    "layer_example",
    "oewf_rows",
]

LABELS = {"sync": "Sync", "async": "Async", "async_sf": "Async+SF", "cascade": "CascadeEP"}
#: The paper's numbers this module's rows are compared with.
PAPER = {
    "throughput_ktok_s": {"sync": 247.2, "async": 255.5, "async_sf": 275.1, "cascade": 288.2},
    "ttft_reduction": {"mean": 0.231, "p95": 0.260},
    "oewf_only_reduction": {"mean": 0.078, "p95": 0.062},
    "oewf_layers": {"ge_1pct": 0.774, "ge_5pct": 0.231, "max": 0.1087},
    "tail_ratio": (0.280, 0.2886),
    "attention_accuracy": 0.903,
    "token_accuracy": 0.859,
    "ffn_efficiency": 0.973,
}


def capacity_rps(config: CascadeConfig, *, mode: str = "sync", **run_kw) -> tuple[float, float]:
    """``(prompt tokens/s, requests/s)`` that ``mode`` sustains on ``config``'s trace when overloaded (every
    request arrives within a few ms: the run measures the serving capacity)."""
    overloaded = dataclasses.replace(config, rate_rps=1e4)
    run = run_cascade(overloaded, (mode,), **run_kw)[mode]
    tps = run.prefill.prompt_throughput_tps
    return tps, tps / float(run.prefill.input_len.mean())


def ablation_rows(throughput: dict[str, CascadeRun], latency: dict[str, CascadeRun]) -> list[dict]:
    """Fig. 8: per mode, throughput (overloaded runs) and TTFT (loaded runs), with ratios to Sync."""
    base_t = throughput["sync"].prefill.prompt_throughput_tps
    base_l = latency["sync"].prefill
    rows = []
    for m in LAYER_MODES:
        if m not in throughput or m not in latency:
            continue
        t, s = throughput[m].prefill.prompt_throughput_tps, latency[m].prefill
        rows.append(
            {
                "mode": m,
                "throughput_ktok_s": t / 1e3,
                "throughput_ratio": t / base_t,
                "paper_ratio": PAPER["throughput_ktok_s"][m] / PAPER["throughput_ktok_s"]["sync"],
                "ttft_mean_s": s.ttft_mean_s,
                "ttft_p95_s": s.ttft_p95_s,
                "ttft_mean_reduction": 1 - s.ttft_mean_s / base_l.ttft_mean_s,
                "ttft_p95_reduction": 1 - s.ttft_p95_s / base_l.ttft_p95_s,
            }
        )
    return rows


def oewf_rows(run: CascadeRun) -> dict:
    """Fig. 9: share of layer forwards (layers ≥ 1) where OEWF cuts ≥ 1% / ≥ 5% of the layer time, and the max."""
    red = run.oewf_reduction
    return {
        "layers": int(red.size),
        "ge_1pct": float((red >= 0.01).mean()) if red.size else float("nan"),
        "ge_5pct": float((red >= 0.05).mean()) if red.size else float("nan"),
        "max": float(red.max()) if red.size else float("nan"),
        "mean": float(red.mean()) if red.size else float("nan"),
    }


def layer_example(run: CascadeRun, *, layer: int = 1, step: int | None = None) -> dict[str, LayerResult]:
    """Fig. 1: one layer of one served step replayed under every mode (exact estimates; routing drawn as in a run).

    ``step`` defaults to the step with the lowest attention load balance (the largest imbalance) among those
    where every replica has work.
    """
    res = run.prefill
    if step is None:
        busy = (res.step_new_tokens > 0).all(axis=1)
        alb = run.prefill.alb_per_step
        cand = np.flatnonzero(busy & np.isfinite(alb))
        if cand.size == 0:
            raise ValueError("layer_example: no step in this run has work on every replica")
        step = int(cand[np.argmin(alb[cand])])
    exact = dataclasses.replace(run.config, estimates="exact")
    model = StepModel(exact, "sync")
    batches = step_batches(res, step)
    rng = np.random.default_rng([exact.seed, step])
    att, Q = model.attention_us(batches)
    pairs = None
    for ell in range(layer + 1):  # replay the step's routing draws up to the layer asked for
        pairs = model.layer_pairs(ell, Q, rng)
    sent = pairs.sum(axis=2)
    D = exact.num_ranks
    dispatch = model.costs.exchange_us((sent * (1.0 - np.eye(D))).sum(axis=1), model.costs.dispatch_bytes_per_pair)
    inputs = LayerInputs(attention_us=att, dispatch_us=dispatch, pairs=pairs, oewf=layer > 0)
    return {m: layer_timeline(inputs, model.costs, m, guard=exact.guard, pricing=exact.pricing) for m in LAYER_MODES}
