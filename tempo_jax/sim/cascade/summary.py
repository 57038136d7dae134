"""Reductions of CascadeEP runs to the paper's tables and figures (notebook 09, `tempo-jax cascade`).

Paper numbers (CascadeEP §4, App. A, D) are in `PAPER`; every function returns plain rows. numpy only.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..runner import bootstrap_ci
from .config import CascadeConfig
from .reference_timeline import LayerInputs, LayerResult, layer_timeline
from .run import CascadeRun, run_cascade, run_cascade_seeds, step_batches
from .step_model import StepModel
from .vocabulary import LABELS, LAYER_MODES
from .workload import cascade_trace

__all__ = [
    "ATTRIBUTION",
    "PAPER",
    "SEED_FIGURES",
    "ablation_rows",
    "budget_for_tail_ratio",
    "capacity_rps_seeds",
    "capacity_rps",
    "layer_attribution",
    "layer_example",
    "oewf_rows",
    "ordering",
    "paired_difference",
    "reduction_summary",
    "seed_summary",
]

#: Figures `seed_summary` reports per mode (each ``{"value": mean over seeds, "ci95": [lo, hi]}``).
SEED_FIGURES = ("ttft_mean_s", "ttft_p95_s", "throughput_tps")


def _figures(run: CascadeRun) -> dict[str, float]:
    s = run.prefill
    return {"ttft_mean_s": s.ttft_mean_s, "ttft_p95_s": s.ttft_p95_s, "throughput_tps": s.prompt_throughput_tps}


def seed_summary(by_seed: dict[int, dict[str, CascadeRun]], extra=None) -> dict[str, dict]:
    """Per mode, every `SEED_FIGURES` figure (and ``extra(run) -> {name: value}``'s) as ``{"value": mean over
    seeds, "ci95": [lo, hi] (95% percentile bootstrap of the mean), "per_seed": [...]}``.

    Args:
      by_seed: ``{seed: {mode: CascadeRun}}`` (`run_cascade_seeds`), the same modes for every seed.
      extra: optional function of one run returning more figures.
    """
    seeds = list(by_seed)
    modes = list(by_seed[seeds[0]])
    out: dict[str, dict] = {}
    for m in modes:
        rows = [{**_figures(by_seed[s][m]), **(extra(by_seed[s][m]) if extra else {})} for s in seeds]
        out[m] = {
            k: {
                "value": float(np.mean([r[k] for r in rows])),
                "ci95": list(bootstrap_ci([r[k] for r in rows])),
                "per_seed": [float(r[k]) for r in rows],
            }
            for k in rows[0]
        }
    return out


def reduction_summary(
    by_seed: dict[int, dict[str, CascadeRun]], figure: str = "ttft_mean_s", base: str = "sync"
) -> dict[str, dict]:
    """Per mode, ``1 − figure / figure(base)`` paired per seed: ``{"value": mean, "ci95": [lo, hi], "per_seed"}``
    (for throughput, ``figure / figure(base) − 1``: a gain is positive either way)."""
    out = {}
    for m in by_seed[next(iter(by_seed))]:
        vals = []
        for runs in by_seed.values():
            a, b = _figures(runs[m])[figure], _figures(runs[base])[figure]
            vals.append(a / b - 1.0 if figure == "throughput_tps" else 1.0 - a / b)
        out[m] = {"value": float(np.mean(vals)), "ci95": list(bootstrap_ci(vals)), "per_seed": vals}
    return out


def ordering(summary: dict[str, dict], figure: str = "ttft_mean_s", modes=LAYER_MODES) -> str:
    """``"Sync > Async ≈ Async+SF > CascadeEP"``: neighbouring modes of ``modes`` by ``figure`` (`seed_summary`,
    the same seeds in the same order for every mode), ``>`` / ``<`` only where `paired_difference` claims it
    (per-seed differences: their 95% interval excludes 0 and the sign test says p < 0.05), ``≈`` otherwise."""
    modes = [m for m in modes if m in summary]
    out = LABELS[modes[0]]
    for a, b in zip(modes, modes[1:], strict=False):
        diff = paired_difference(summary[a][figure]["per_seed"], summary[b][figure]["per_seed"])
        out += f" {diff['order']} {LABELS[b]}"
    return out


def paired_difference(a, b, *, alpha: float = 0.05) -> dict:
    """Paired statistics of one figure under two modes, seed by seed (``a``, ``b`` ``[n]``, the same seeds):
    ``{"value": mean of a − b, "ci95": its 95% percentile bootstrap, "wins": seeds with a > b, "losses": a < b,
    "n", "sign_p": two-sided sign test (ties dropped; `scipy.stats.binomtest`), "order": ">" / "<" when the
    interval excludes 0 on that side *and* sign_p < ``alpha``, else "≈"}``. With fewer than 6 untied seeds no sign
    test reaches p < 0.05, so no order is claimed."""
    from scipy.stats import binomtest

    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape or a.ndim != 1 or a.size == 0:
        raise ValueError(f"paired_difference: a and b must be per-seed values of one length, got {a.shape}, {b.shape}")
    d = a - b
    lo, hi = bootstrap_ci(d)
    wins, losses = int((d > 0).sum()), int((d < 0).sum())
    p = float(binomtest(wins, wins + losses).pvalue) if wins + losses else 1.0
    order = ">" if lo > 0 and p < alpha else "<" if hi < 0 and p < alpha else "≈"
    return {
        "value": float(d.mean()),
        "ci95": [lo, hi],
        "wins": wins,
        "losses": losses,
        "n": int(d.size),
        "sign_p": p,
        "order": order,
    }


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
    # A trace whose requests all arrive at one instant is overloaded as it is (and has no rate to scale).
    burst = cascade_trace(dataclasses.replace(config, rate_rps=None)).duration_s <= 0
    overloaded = dataclasses.replace(config, rate_rps=None if burst else 1e4)
    run = run_cascade(overloaded, (mode,), **run_kw)[mode]
    tps = run.prefill.prompt_throughput_tps
    return tps, tps / float(run.prefill.input_len.mean())


def capacity_rps_seeds(config: CascadeConfig, seeds, *, mode: str = "sync", **run_kw) -> dict[int, float]:
    """``{seed: requests/s}`` that ``mode`` sustains on each seed's own workload (`capacity_rps` per seed, the runs
    in one pool): the base of per-seed operating points (a load of each seed's own capacity)."""
    burst = cascade_trace(dataclasses.replace(config, rate_rps=None)).duration_s <= 0
    overloaded = dataclasses.replace(config, rate_rps=None if burst else 1e4)
    runs = run_cascade_seeds(overloaded, (mode,), seeds=tuple(seeds), **run_kw)
    return {
        s: float(r[mode].prefill.prompt_throughput_tps / float(r[mode].prefill.input_len.mean()))
        for s, r in runs.items()
    }


#: `layer_attribution`'s parts of the forward-time cut against Sync (each a share of Sync's forward time).
ATTRIBUTION = ("early_ffn", "combine_overlap", "oewf")


def layer_attribution(run: CascadeRun, *, steps: int | None = None) -> dict[str, float]:
    """Where CascadeEP's gain comes from, on per-layer time with the same inputs (no queueing feedback, so every
    variant sees the same utilisation): every served step of ``run`` (any mode of a serving run; at most
    ``steps``, evenly spaced) replayed through `StepModel` — the same batches, attention noise and routing draws
    (step k draws from ``[seed, k]``) — under Sync and Async+SF with the combine as configured and free
    (``combine_scale=0``), and under CascadeEP. Over the replayed steps' summed forward times T:

    - ``early_ffn`` = (T_sync − T_sf) / T_sync with a free combine (what launching early gains on its own);
    - ``combine_overlap`` = (T_sync − T_sf) / T_sync with the combine, minus ``early_ffn``;
    - ``oewf`` = (T_sf − T_cascade) / T_sync;

    and ``steps`` (how many were replayed), ``sync_us`` / ``cascade_us`` (T_sync, T_cascade). numpy only; a few ms
    per step and variant."""
    cfg = run.config
    n = len(run.records)
    picked = np.arange(n) if steps is None or steps >= n else np.unique(np.linspace(0, n - 1, steps).astype(int))
    free = dataclasses.replace(cfg, combine_scale=0.0)
    variants = {
        "sync": (cfg, "sync"),
        "sf": (cfg, "async_sf"),
        "cascade": (cfg, "cascade"),
        "sync_free": (free, "sync"),
        "sf_free": (free, "async_sf"),
    }
    total = dict.fromkeys(variants, 0.0)
    models = {k: StepModel(c, m) for k, (c, m) in variants.items()}
    for k in picked:
        batches = step_batches(run.prefill, int(k))
        for name, model in models.items():
            model.steps = int(k)
            total[name] += float(model(batches)[1].layer_us.sum())
    t = total["sync"]
    early = (total["sync_free"] - total["sf_free"]) / t
    return {
        "early_ffn": early,
        "combine_overlap": (t - total["sf"]) / t - early,
        "oewf": (total["sf"] - total["cascade"]) / t,
        "steps": int(picked.size),
        "sync_us": t,
        "cascade_us": total["cascade"],
    }


def budget_for_tail_ratio(
    config: CascadeConfig,
    target: float,
    *,
    load: float = 0.9,
    seeds=(0,),
    lo: int = 2048,
    hi: int = 1 << 20,
    iters: int = 10,
    **run_kw,
) -> tuple[int, float, dict[int, float], dict[int, float]]:
    """``(key_budget, R_tail, rates, tails)``: the sparse-attention key budget in ``[lo, hi]`` at which Sync's
    long-tail ratio R_tail (App. A), averaged over ``seeds`` — each seed served at ``load`` of its own capacity
    (`capacity_rps_seeds`) — is closest to ``target`` (e.g. the paper's 28%), by bisection on log2 of the budget:
    R_tail grows with the budget, from the model's sparse attention towards dense (the request rate cannot set it:
    measured, R_tail *falls* with the load). The endpoint when the target lies outside. ``rates``: each seed's
    request rate at that budget; ``tails``: each seed's R_tail (the spread around the mean)."""
    seeds = tuple(seeds)

    def tail(budget: int) -> tuple[float, dict, dict]:
        cfg = dataclasses.replace(config, attention="sparse", key_budget=int(budget))
        rates = {s: load * c for s, c in capacity_rps_seeds(cfg, seeds, **run_kw).items()}
        runs = run_cascade_seeds(cfg, ("sync",), seeds=seeds, rates=rates, **run_kw)
        tails = {s: runs[s]["sync"].tail_ratio for s in seeds}
        return float(np.mean(list(tails.values()))), rates, tails

    ends = {b: tail(b) for b in (lo, hi)}
    best = min(ends, key=lambda b: abs(ends[b][0] - target))
    if not min(ends[lo][0], ends[hi][0]) < target < max(ends[lo][0], ends[hi][0]):
        return best, *ends[best]
    rising, a, b, seen = ends[hi][0] > ends[lo][0], np.log2(lo), np.log2(hi), dict(ends)
    for _ in range(iters):
        mid = int(round(2 ** (0.5 * (a + b))))
        seen[mid] = tail(mid)
        a, b = (np.log2(mid), b) if (seen[mid][0] < target) == rising else (a, np.log2(mid))
    best = min(seen, key=lambda k: abs(seen[k][0] - target))
    return best, *seen[best]


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
    """Fig. 1: one layer of one served step replayed under every mode with the reference timeline (exact
    estimates; attention and routing drawn as in a run; the run's links and launch).

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
    exact = dataclasses.replace(run.config, estimates="exact", timeline="reference")
    model = StepModel(exact, "sync")
    x = model.step_inputs(step_batches(res, step), np.random.default_rng([exact.seed, step]))
    pairs = x["pairs"][layer]
    if model.expert_placements is None:
        pairs = model.expert_pairs(layer, pairs)
    inputs = LayerInputs(attention_us=x["att"][layer], dispatch_us=x["dispatch"][layer], pairs=pairs, oewf=layer > 0)
    return {m: layer_timeline(inputs, model.costs, m, **exact.timeline_options()) for m in LAYER_MODES}
