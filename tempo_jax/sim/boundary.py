"""Analytic flip boundary B* of the phase diagram (TEMPO §3.2) and the simulated flip band it should land in.

Glossary (shapes): E logical experts, K top-k, G GPUs (EP ranks), B tokens per GPU, T = B·K·G token–expert
pairs of one batch, p ``[E]`` long-run popularity (sums to 1), r ``[E]`` replica counts.

Boundary (paper §3.2 (ii)): with ``E_eff(B) = Σ_e (1 − (1 − p_e)^T)·r_e`` the expected number of activated
replicas (each of the T pairs picks e with probability p_e; an activated expert activates all r_e replicas):

- avg: the balanced pieces cross, ``β·B·K = b·E_eff/G``  →  ``B*_avg = n*·E_eff/(K·G)``;
- hot: activation balancing keeps the hottest expert (p_1) whole, its GPU goes linear first:
  ``B*_hot = n*·E_eff/(p_1·K·G²)``;
- ``B* = min(B*_avg, B*_hot)``, a fixed point in B because E_eff depends on B.

Flip band (simulation): along one column (fixed preset, EP, replication, skew), with the winning fixed policy
``W(B)`` per batch size (``M`` METRO, ``L`` token-LP, ``E`` EPLB-even):

- ``lo`` = the largest B where the memory-regime winner M wins (0 when M never wins: the flip lies below the
  grid);
- ``hi`` = the smallest B above ``lo`` where a compute-regime winner (L or E) wins (inf when none does: the flip
  lies above the grid);
- B* *agrees* with the column when ``lo ≤ B* ≤ hi`` (both ends inclusive).

numpy only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "Boundary",
    "b_star_avg",
    "b_star_hot",
    "effective_experts",
    "flip_band",
    "flip_boundary",
    "in_band",
]


def effective_experts(popularity, replicas, total_pairs) -> float | np.ndarray:
    """Expected activated replicas ``E_eff = Σ_e (1 − (1 − p_e)^T)·r_e``.

    Args:
      popularity: ``[E]`` per-pair probabilities p_e (non-negative; not renormalised).
      replicas: ``[E]`` replica counts r_e (or a scalar for all experts).
      total_pairs: T = B·K·G token–expert pairs, a scalar or ``[N]`` (broadcast).

    Returns:
      A float, or ``[N]`` float64 for an array T.
    """
    p = np.asarray(popularity, dtype=np.float64)
    r = np.broadcast_to(np.asarray(replicas, dtype=np.float64), p.shape)
    T = np.asarray(total_pairs, dtype=np.float64)
    if p.ndim != 1 or np.any(p < 0) or np.any(p > 1):
        raise ValueError("popularity must be [E] probabilities in [0, 1]")
    if np.any(T < 0):
        raise ValueError("total_pairs must be ≥ 0")
    # 1 − (1 − p)^T computed as −expm1(T·log1p(−p)); p = 1 gives log1p(−1) = −inf → 1 for T > 0.
    with np.errstate(divide="ignore"):
        logq = np.log1p(-p)  # [E]
    expo = np.where(T[..., None] > 0, T[..., None] * logq, 0.0)  # [..., E]
    hit = -np.expm1(expo)
    out = (hit * r).sum(axis=-1)
    return float(out) if out.ndim == 0 else out


def b_star_avg(e_eff, n_star: float, top_k: int, num_gpus: int):
    """``B*_avg = n*·E_eff/(K·G)``: tokens per GPU where β·B·K equals b·E_eff/G."""
    return n_star * np.asarray(e_eff, dtype=np.float64) / (top_k * num_gpus)


def b_star_hot(e_eff, n_star: float, top_k: int, num_gpus: int, p_max: float):
    """``B*_hot = n*·E_eff/(p_1·K·G²)``: the hottest expert, kept whole, reaches its GPU's floor."""
    return n_star * np.asarray(e_eff, dtype=np.float64) / (p_max * top_k * num_gpus**2)


@dataclass(frozen=True)
class Boundary:
    """Result of :func:`flip_boundary`.

    Attributes:
      b_star: ``min(b_avg, b_hot)`` at the fixed point (tokens per GPU).
      b_avg, b_hot: the two mechanisms evaluated at the fixed point.
      e_eff: expected activated replicas at ``B = b_star``.
      mechanism: ``"avg"`` or ``"hot"`` (which one is smaller).
      iterations: fixed-point iterations used.
      converged: relative change fell below the tolerance.
    """

    b_star: float
    b_avg: float
    b_hot: float
    e_eff: float
    mechanism: str
    iterations: int
    converged: bool


def flip_boundary(
    popularity,
    replicas,
    n_star: float,
    top_k: int,
    num_gpus: int,
    *,
    tol: float = 1e-10,
    max_iter: int = 1000,
) -> Boundary:
    """Analytic flip boundary ``B* = min(B*_avg, B*_hot)`` by a fixed point in B (TEMPO §3.2).

    The map ``f(B) = min(B*_avg, B*_hot)`` evaluated at ``E_eff(B)`` is nondecreasing in B and bounded by its
    value at full activation (``E_eff = Σ r_e``). Starting there, the iterates decrease monotonically to the
    largest fixed point (B = 0 is a trivial fixed point that this start avoids).

    Args:
      popularity: ``[E]`` long-run per-pair popularity p (sums to 1); ``p_1 = max p``.
      replicas: ``[E]`` replica counts r_e (distinct GPUs holding e).
      n_star: inflection n* = b/β (tokens per expert).
      top_k: K.
      num_gpus: G.
      tol: relative stopping tolerance on successive iterates.
      max_iter: iteration cap (``converged`` is False when reached).
    """
    p = np.asarray(popularity, dtype=np.float64)
    r = np.broadcast_to(np.asarray(replicas, dtype=np.float64), p.shape)
    if not (n_star > 0 and top_k >= 1 and num_gpus >= 1) or p.sum() <= 0:
        raise ValueError("flip_boundary needs n_star > 0, top_k ≥ 1, num_gpus ≥ 1 and a non-zero popularity")
    p_max = float(p.max())

    def f(b: float) -> tuple[float, float, float, float]:
        e = effective_experts(p, r, b * top_k * num_gpus) if math.isfinite(b) else float(r[p > 0].sum())
        avg = float(b_star_avg(e, n_star, top_k, num_gpus))
        hot = float(b_star_hot(e, n_star, top_k, num_gpus, p_max))
        return min(avg, hot), avg, hot, e

    # Step 1: start from full activation (the map's supremum).
    b, avg, hot, e = f(math.inf)
    it, converged = 0, False
    # Step 2: iterate B ← f(B); monotone decreasing to the largest fixed point.
    while it < max_iter:
        it += 1
        nb, avg, hot, e = f(b)
        if abs(nb - b) <= tol * max(b, 1e-300):
            b, converged = nb, True
            break
        b = nb
    # Step 3: report the mechanism that sets the boundary.
    return Boundary(
        b_star=b,
        b_avg=avg,
        b_hot=hot,
        e_eff=e,
        mechanism="avg" if avg <= hot else "hot",
        iterations=it,
        converged=converged,
    )


def flip_band(
    tokens_per_gpu: Sequence[float], winners: Sequence[str], memory: str = "M", compute: Sequence[str] = ("L", "E")
) -> tuple[float, float]:
    """The simulated flip band ``(lo, hi)`` of one column (see the module docstring for the definition).

    Args:
      tokens_per_gpu: ``[n]`` ascending tokens per GPU.
      winners: ``[n]`` winning fixed-policy letter per batch size.
      memory: the memory-regime winner's letter.
      compute: the compute-regime winners' letters.

    Returns:
      ``(lo, hi)``: lo = last B where ``memory`` wins (0.0 if never), hi = first B > lo where a ``compute``
      letter wins (inf if none).
    """
    bs = np.asarray(tokens_per_gpu, dtype=np.float64)
    if bs.ndim != 1 or len(winners) != bs.size or np.any(np.diff(bs) <= 0):
        raise ValueError("tokens_per_gpu must be ascending and match winners in length")
    # Step 1: the last memory-regime win.
    mem = [i for i, w in enumerate(winners) if w == memory]
    lo_i = mem[-1] if mem else -1
    # Step 2: the first compute-regime win after it.
    comp = [i for i, w in enumerate(winners) if w in compute and i > lo_i]
    lo = float(bs[lo_i]) if lo_i >= 0 else 0.0
    hi = float(bs[comp[0]]) if comp else math.inf
    return lo, hi


def in_band(b_star: float, band: tuple[float, float]) -> bool:
    """``lo ≤ B* ≤ hi`` (inclusive)."""
    return band[0] <= b_star <= band[1]
