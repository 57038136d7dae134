"""Regime map (TEMPO §2.4, Fig. 5): fraction of mixed batches vs tokens per GPU, synthetic and recorded routing.

Glossary additions: G ranks, B tokens per rank, nB batch sizes on the ladder.

A batch ``[G, E]`` is *mixed* when ≥ 20% of its activated experts are flat (``n_e < n*``) and ≥ 20% of its
token–expert pairs sit in linear experts (``n_e ≥ n*``), with ``n_e`` summed over the G ranks
(:func:`tempo_jax.workloads.regime_stats`). The curves pool every batch of every layer at each B.

Recorded traces are replayed at the recorded rank count for per-rank recordings (HarMoEny) and at
``DEFAULT_RANKS = 8`` ranks (EP8, the paper's testbed) for per-token recordings; a per-token recording only
covers the B for which ``B·G`` fits in its tokens. :data:`TRACE_PRESETS` names the calibrated shape whose
inflection n* classifies each trace (all lie in 156–168 tokens). numpy only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from solvers import PRESETS
from tempo_jax.workloads import RoutingTrace, SyntheticRouting, regime_stats

__all__ = [
    "DEFAULT_RANKS",
    "TRACE_PRESETS",
    "RegimeCurve",
    "regime_curve",
    "synthetic_regime_curve",
    "trace_regime_curve",
]

DEFAULT_RANKS = 8
#: Cost preset whose n* classifies each registered trace (nearest calibrated expert shape).
TRACE_PRESETS: dict[str, str] = {
    "flame_moe_290m": "dsv2_lite_offline",  # E=64, top-6: the DSv2-Lite routing shape
    "mixtral_8x7b": "dsv3_fp8_offline",  # few, large experts
    "harmoeny_switch128": "qwen3_30b_offline",  # E=128
    "harmoeny_qwen": "qwen3_30b_offline",  # Qwen1.5-MoE, E=60
    "switch128_npy": "qwen3_30b_offline",
}


@dataclass(frozen=True)
class RegimeCurve:
    """Mixed-regime statistics along a batch ladder.

    Attributes:
      label: curve name (trace or ``"zipf s=..."``).
      n_star: inflection used to classify experts.
      tokens_per_gpu: ``[nB]`` tokens per rank.
      num_ranks: G.
      mixed: ``[nB]`` fraction of mixed batches (NaN where no batch exists).
      flat_experts: ``[nB]`` mean fraction of activated experts that are flat.
      linear_tokens: ``[nB]`` mean fraction of pairs in linear experts.
      num_batches: ``[nB]`` int, batches pooled at each B.
    """

    label: str
    n_star: float
    tokens_per_gpu: np.ndarray
    num_ranks: int
    mixed: np.ndarray
    flat_experts: np.ndarray
    linear_tokens: np.ndarray
    num_batches: np.ndarray

    def rows(self) -> list[dict]:
        """Tidy rows, one per batch size."""
        return [
            {
                "label": self.label,
                "B": int(b),
                "mixed": float(self.mixed[i]),
                "flat_experts": float(self.flat_experts[i]),
                "linear_tokens": float(self.linear_tokens[i]),
                "batches": int(self.num_batches[i]),
            }
            for i, b in enumerate(self.tokens_per_gpu)
        ]


def regime_curve(
    batches_at: Callable[[int], Iterable[np.ndarray]],
    tokens_per_gpu: Sequence[int],
    n_star: float,
    *,
    num_ranks: int,
    label: str = "",
) -> RegimeCurve:
    """Pool :func:`regime_stats` over the batches ``batches_at(B)`` (each ``[G, E]`` or ``[E]``) per B."""
    nB = len(tokens_per_gpu)
    mixed, flat, lin = np.full(nB, np.nan), np.full(nB, np.nan), np.full(nB, np.nan)
    count = np.zeros(nB, dtype=np.int64)
    for i, B in enumerate(tokens_per_gpu):
        # Step 1: classify every batch at this B.
        stats = [regime_stats(c, n_star) for c in batches_at(int(B))]
        if not stats:
            continue
        # Step 2: pool.
        count[i] = len(stats)
        mixed[i] = np.mean([s.mixed for s in stats])
        flat[i] = np.mean([s.flat_expert_fraction for s in stats])
        lin[i] = np.mean([s.linear_token_fraction for s in stats])
    return RegimeCurve(label, float(n_star), np.asarray(tokens_per_gpu), int(num_ranks), mixed, flat, lin, count)


def synthetic_regime_curve(
    num_experts: int,
    top_k: int,
    skew: float,
    tokens_per_gpu: Sequence[int],
    n_star: float,
    *,
    num_ranks: int = DEFAULT_RANKS,
    batches: int = 32,
    kappa: float = 2000.0,
    seed: int = 0,
) -> RegimeCurve:
    """Mixed fraction of ``batches`` synthetic Zipf(``skew``) batches ``[G, E]`` at each B (Fig. 5b)."""
    routing = SyntheticRouting(num_experts, top_k, skew, kappa=kappa, seed=seed)
    return regime_curve(
        lambda B: routing.batches(B, num_ranks, batches),
        tokens_per_gpu,
        n_star,
        num_ranks=num_ranks,
        label=f"zipf s={skew:g}",
    )


def trace_regime_curve(
    trace: RoutingTrace,
    tokens_per_gpu: Sequence[int],
    n_star: float | None = None,
    *,
    num_ranks: int | None = None,
    max_batches: int = 256,
) -> RegimeCurve:
    """Mixed fraction of a recorded trace's batches at each B, pooled over its layers (Fig. 5a).

    Args:
      trace: a loaded recording.
      tokens_per_gpu: tokens per rank B.
      n_star: inflection (default: n* of ``TRACE_PRESETS[trace.name]``).
      num_ranks: G (default: the recorded rank count, else :data:`DEFAULT_RANKS`).
      max_batches: cap per B, spread evenly over layers (the first batches of each layer).
    """
    if n_star is None:
        n_star = PRESETS[TRACE_PRESETS[trace.name]].inflection
    G = num_ranks or trace.num_source_ranks or DEFAULT_RANKS
    per_layer = max(1, math.ceil(max_batches / len(trace.layers)))

    def batches_at(B: int):
        for layer in trace.layers:
            if trace.num_batches(layer, B, G) == 0:
                continue
            for j, counts in enumerate(trace.batches(layer, B, G)):
                if j >= per_layer:
                    break
                yield counts

    return regime_curve(batches_at, tokens_per_gpu, n_star, num_ranks=G, label=trace.name)
