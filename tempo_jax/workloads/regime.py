"""Mixed-regime statistics of a batch (TEMPO §3.3, Fig. 5).

An expert with ``n_e`` tokens (token–expert pairs) in the batch is *flat* when ``0 < n_e < n*`` (its cost
is dominated by the per-expert weight read) and *linear* when ``n_e >= n*`` (per-token compute dominates).
A batch is *mixed* when at least ``flat_threshold`` (20%) of the activated experts are flat and at least
``linear_threshold`` (20%) of its tokens are in linear experts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from solvers.checks import check_counts, check_real

__all__ = ["RegimeStats", "mixed_fraction", "regime_stats"]


@dataclass(frozen=True)
class RegimeStats:
    """Regime of one batch.

    Attributes:
        flat_expert_fraction: flat experts / activated experts (0 when none is activated).
        linear_token_fraction: tokens in linear experts / all tokens (0 for an empty batch).
        mixed: both fractions reach their thresholds (never for an empty batch).
        activated: experts with ``n_e > 0``.
        tokens: ``Σ_e n_e`` (token–expert pairs; an int for integer counts).
    """

    flat_expert_fraction: float
    linear_token_fraction: float
    mixed: bool
    activated: int
    tokens: int | float


def regime_stats(
    counts: np.ndarray, n_star: float, *, flat_threshold: float = 0.2, linear_threshold: float = 0.2
) -> RegimeStats:
    """Flat/linear split of a batch.

    Args:
        counts: per-expert loads ``[E]``, or ``[Gs, E]`` per source rank (summed over Gs first); finite, >= 0.
        n_star: inflection ``n* > 0`` (tokens per expert where the cost model turns from flat to linear).
        flat_threshold: minimum flat-expert fraction for ``mixed``, in [0, 1].
        linear_threshold: minimum linear-token fraction for ``mixed``, in [0, 1].
    """
    arr = check_counts("counts", counts, ndims=(1, 2))
    n_star = check_real("n_star", n_star, minimum=0.0, strict=True)
    ft = check_real("flat_threshold", flat_threshold, minimum=0.0)
    lt = check_real("linear_threshold", linear_threshold, minimum=0.0)
    if ft > 1 or lt > 1:
        raise ValueError(f"thresholds must lie in [0, 1], got flat={ft}, linear={lt}")
    n = arr.sum(axis=0) if arr.ndim == 2 else arr  # [E]
    active = n > 0
    activated = int(active.sum())
    tokens = n.sum()
    flat = int((active & (n < n_star)).sum())
    linear_tokens = n[n >= n_star].sum()
    flat_frac = flat / activated if activated else 0.0
    linear_frac = float(linear_tokens / tokens) if tokens > 0 else 0.0
    return RegimeStats(
        flat_expert_fraction=float(flat_frac),
        linear_token_fraction=linear_frac,
        mixed=bool(activated > 0 and flat_frac >= ft and linear_frac >= lt),
        activated=activated,
        tokens=int(tokens) if np.issubdtype(n.dtype, np.integer) else float(tokens),
    )


def mixed_fraction(batches: Iterable[np.ndarray], n_star: float, **thresholds: float) -> float:
    """Fraction of ``batches`` (each ``[E]`` or ``[Gs, E]``) that are mixed under :func:`regime_stats`."""
    flags = [regime_stats(c, n_star, **thresholds).mixed for c in batches]
    if not flags:
        raise ValueError("mixed_fraction needs at least one batch")
    return sum(flags) / len(flags)
