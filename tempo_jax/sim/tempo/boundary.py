"""Analytic flip boundary B* of the phase diagram (TEMPO §3.2) and the simulated flip band it should land in.

Glossary additions: G GPUs (EP ranks), B tokens per GPU, nP = B·K·G token–expert pairs of one batch, p ``[E]``
long-run share of token–expert pairs per expert (sums to 1; for top-K routing drawn without replacement this is
`tempo_jax.workloads.pair_share`, not the first-draw popularity), r ``[E]`` replica counts.

Boundary (paper §3.2 (ii)): with ``E_eff(B) = Σ_e (1 − (1 − p_e)^nP)·r_e`` the expected number of activated
replicas (each of the nP pairs picks e with probability p_e; an activated expert activates all r_e replicas):

- avg: the balanced pieces cross, ``β·B·K = b·E_eff/G``  →  ``B*_avg = n*·E_eff/(K·G)``;
- hot: activation balancing keeps the hottest expert (p_1) whole, its GPU goes linear first:
  ``B*_hot = n*·E_eff/(p_1·K·G²)``;
- ``B* = min(B*_avg, B*_hot)``, a fixed point in B because E_eff depends on B.

Refined boundary (ours, :func:`flip_boundary_refined`; an option beside the paper's). Both mechanisms are one
equation: METRO's busiest GPU carries ``ρ_M`` times the mean tokens ``B·K`` and token-LP's busiest GPU holds
``A_LP`` activations, and the winner flips where METRO's token piece reaches token-LP's floor,
``c + β·ρ_M·B·K = a + b·A_LP`` (the paper's formula is ``A_LP = E_eff/G`` with ``ρ_M = max(1, p_1·G)``).
Neither holds on EPLB placements: a basic (vertex) token-LP solution splits at most G − 1 experts, so it
activates about ``(E_live + G − 1)/G`` replicas per GPU, not E_eff/G; and METRO, which never looks at tokens,
leaves its busiest GPU 1.1–1.6× the mean even at low skew. :func:`lp_activations` and :func:`metro_imbalance`
estimate both without simulating a batch (the placement, the pair shares and METRO's own rule on the expected
batch, plus the batch fluctuation through the expected maximum of G Gaussians).

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
from scipy.special import ndtr

from solvers import CostModel, DispatchProblem, Placement
from solvers.policies import metro

__all__ = [
    "Boundary",
    "RefinedBoundary",
    "b_star_avg",
    "b_star_hot",
    "effective_experts",
    "expected_max",
    "flip_band",
    "flip_boundary",
    "flip_boundary_refined",
    "in_band",
    "lp_activations",
    "metro_imbalance",
]


def effective_experts(popularity, replicas, total_pairs) -> float | np.ndarray:
    """Expected activated replicas ``E_eff = Σ_e (1 − (1 − p_e)^nP)·r_e``.

    Args:
      popularity: ``[E]`` per-pair probabilities p_e (non-negative; not renormalised).
      replicas: ``[E]`` replica counts r_e (or a scalar for all experts).
      total_pairs: nP = B·K·G token–expert pairs, a scalar or ``[N]`` (broadcast).

    Returns:
      A float, or ``[N]`` float64 for an array nP.
    """
    p = np.asarray(popularity, dtype=np.float64)
    r = np.broadcast_to(np.asarray(replicas, dtype=np.float64), p.shape)
    T = np.asarray(total_pairs, dtype=np.float64)
    if p.ndim != 1 or np.any(p < 0) or np.any(p > 1):
        raise ValueError("popularity must be [E] probabilities in [0, 1]")
    if np.any(T < 0):
        raise ValueError("total_pairs must be ≥ 0")
    # 1 − (1 − p)^nP computed as −expm1(nP·log1p(−p)); p = 1 gives log1p(−1) = −inf → 1 for nP > 0.
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
    popularity, replicas, n_star: float, top_k: int, num_gpus: int, *, tol: float = 1e-10, max_iter: int = 1000
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


# ------------------------------------------------------------------------------------------------ refined boundary
def expected_max(means, sds, caps=None, *, points: int = 2001) -> float:
    """``E[max_g min(cap_g, μ_g + σ_g·Z_g)]`` for independent standard normals Z_g (numerical integral).

    Args:
      means, sds: ``[G]`` means μ and standard deviations σ ≥ 0 (σ = 0 is a point mass).
      caps: ``[G]`` upper caps (None = uncapped).
      points: grid points of ``E[Y] = lo + ∫_lo^hi (1 − F(x)) dx`` with F the CDF of the maximum.
    """
    mu = np.asarray(means, dtype=np.float64)
    sd = np.maximum(np.asarray(sds, dtype=np.float64), 1e-12)
    cap = np.full(mu.shape, np.inf) if caps is None else np.asarray(caps, dtype=np.float64)
    if mu.ndim != 1 or mu.size == 0 or sd.shape != mu.shape or cap.shape != mu.shape:
        raise ValueError("means, sds (and caps) must be non-empty [G] arrays of one length")
    lo = float(np.min(np.minimum(mu - 8 * sd, cap)))
    hi = float(np.max(np.minimum(mu + 8 * sd, cap)))
    if hi <= lo:
        return hi
    x = np.linspace(lo, hi, points)
    cdf = np.where(x[:, None] > cap, 1.0, ndtr((x[:, None] - mu) / sd)).prod(axis=1)  # left limits at a cap
    return lo + float(np.trapezoid(1.0 - cdf, x))


def _fluctuation(tokens_per_gpu: float, top_k: int, num_gpus: int, kappa: float) -> float:
    """Relative standard deviation of one GPU's token count (an average 1/G share of the pairs): Dirichlet(κ)
    popularity noise ``(G − 1)/(κ + 1)`` plus the sampling noise of ``B·K`` pairs ``(G − 1)/(G·B·K)``."""
    G = num_gpus
    dirichlet = (G - 1) / (kappa + 1) if math.isfinite(kappa) else 0.0
    return math.sqrt(dirichlet + (G - 1) / (G * tokens_per_gpu * top_k))


def lp_activations(share, placement: Placement, top_k: int, tokens_per_gpu: float) -> float:
    """Expected activations on token-LP's busiest GPU, ``A_LP`` (tokens per GPU B).

    A basic token-LP solution has at most E_live + G − 1 non-zero shares, so beyond one replica per live expert
    at most G − 1 replicas are activated. Per GPU g: its live single-replica experts (always active) plus a
    Binomial(``m_g``, u) count of its ``m_g`` live replicated experts, with u = (replicated live experts + G − 1)
    / (their live replica slots); the busiest GPU is the expected maximum of those (Gaussian), capped at the
    experts g holds.

    Args:
      share: ``[E]`` pair shares p (sums to 1).
      placement: the column's placement (``replica_mask [E, G]``).
      top_k: K.
      tokens_per_gpu: B.
    """
    # Step 1: which experts are live in a batch of B·G tokens (each token picks e with probability K·p_e).
    p = np.asarray(share, dtype=np.float64)
    mask = placement.replica_mask  # [E, G]
    G = placement.num_gpus
    live = -np.expm1(tokens_per_gpu * G * np.log1p(-np.minimum(top_k * p, 1.0)))  # [E]
    r = mask.sum(axis=1)
    single, multi = (r == 1)[:, None] & mask, (r >= 2)[:, None] & mask
    # Step 2: per GPU, forced single-replica activations and the replicated experts' share u of their slots.
    forced = (single * live[:, None]).sum(axis=0)  # [G]
    forced_var = (single * (live * (1 - live))[:, None]).sum(axis=0)
    slots = (multi * live[:, None]).sum(axis=0)  # [G]
    replicated, replica_slots = float(live[r >= 2].sum()), float((live * r)[r >= 2].sum())
    u = min(1.0, (replicated + G - 1) / replica_slots) if replica_slots > 0 else 0.0
    # Step 3: the busiest GPU.
    return expected_max(forced + u * slots, np.sqrt(forced_var + slots * u * (1 - u)), mask.sum(axis=0))


def _metro_structure(share, placement: Placement) -> np.ndarray:
    """``[G]`` METRO's per-GPU tokens on the expected batch relative to the mean (whole experts, fewest
    activations first; integer counts in proportion to the pair shares, since only their order matters)."""
    p = np.asarray(share, dtype=np.float64)
    if p.ndim != 1 or p.shape[0] != placement.num_experts or np.any(p < 0) or p.sum() <= 0:
        raise ValueError(f"share must be [E] = [{placement.num_experts}] non-negative with a positive sum")
    counts = np.round(p / p.sum() * 1e9)
    tokens = metro(DispatchProblem(counts, placement, CostModel(b=1.0, beta=1.0))).sum(axis=0)
    return tokens / tokens.mean()


def metro_imbalance(share, placement: Placement, top_k: int, tokens_per_gpu: float, kappa: float) -> float:
    """Expected ratio of METRO's busiest GPU tokens to the mean, ``ρ_M`` (tokens per GPU B).

    METRO's own rule on the expected batch gives each GPU's structural load μ_g (relative to the mean); the
    batch adds a relative fluctuation σ (:func:`_fluctuation`), and ``ρ_M = E[max_g (μ_g + σ·Z_g)]``.
    """
    mu = _metro_structure(share, placement)
    sigma = _fluctuation(tokens_per_gpu, top_k, placement.num_gpus, kappa)
    return expected_max(mu, np.full(mu.shape, sigma))


@dataclass(frozen=True)
class RefinedBoundary:
    """Result of :func:`flip_boundary_refined`.

    Attributes:
      b_star: tokens per GPU where ``c + β·ρ_M·B·K = a + b·A_LP`` (inf when METRO's token piece never reaches
        token-LP's floor below ``b_max``; the smallest B tried when it already has).
      lp_activations: ``A_LP`` at ``b_star``.
      metro_imbalance: ``ρ_M`` at ``b_star``.
    """

    b_star: float
    lp_activations: float
    metro_imbalance: float


def flip_boundary_refined(
    share,
    placement: Placement,
    cost: CostModel,
    top_k: int,
    *,
    kappa: float = 2000.0,
    b_min: float = 1.0,
    b_max: float = 1e5,
) -> RefinedBoundary:
    """Refined flip boundary: the B where METRO's busiest GPU's token piece reaches token-LP's floor.

    Solves ``h(B) = a + b·A_LP(B) − c − β·ρ_M(B)·B·K = 0`` (:func:`lp_activations`, :func:`metro_imbalance`) by
    a geometric scan for the first sign change, then bisection in log B.

    Args:
      share: ``[E]`` pair shares p of the column's routing.
      placement: the column's placement.
      cost: the cost model (its traffic piece, if any, is taken into account on METRO's side).
      top_k: K.
      kappa: Dirichlet concentration of the batch fluctuation.
      b_min, b_max: the B range searched (tokens per GPU).
    """
    if not 0 < b_min < b_max:
        raise ValueError(f"need 0 < b_min < b_max, got {b_min}, {b_max}")
    mu = _metro_structure(share, placement)  # [G], independent of B

    def parts(B: float) -> tuple[float, float, float]:
        A = lp_activations(share, placement, top_k, B)
        sigma = _fluctuation(B, top_k, placement.num_gpus, kappa)
        rho = expected_max(mu, np.full(mu.shape, sigma))
        lp = cost.a + cost.b * A
        tokens = rho * B * top_k
        metro_t = cost.c + cost.beta * tokens
        if cost.c2 is not None:  # the traffic piece: METRO's busiest GPU receives ρ_M·B·K, token-LP's B·K
            metro_t = max(metro_t, cost.c2 + cost.gamma * tokens)
            lp = max(lp, cost.c2 + cost.gamma * B * top_k)
        return lp - metro_t, A, rho

    # Step 1: the first sign change on a geometric grid (h > 0: METRO still wins).
    grid = np.geomspace(b_min, b_max, 61)
    prev = b_min
    h, A, rho = parts(b_min)
    if h <= 0:
        return RefinedBoundary(b_min, A, rho)
    for B in grid[1:]:
        h, A, rho = parts(float(B))
        if h <= 0:
            lo, hi = prev, float(B)
            break
        prev = float(B)
    else:
        return RefinedBoundary(math.inf, A, rho)
    # Step 2: bisection in log B.
    for _ in range(40):
        mid = math.sqrt(lo * hi)
        if parts(mid)[0] > 0:
            lo = mid
        else:
            hi = mid
    _, A, rho = parts(hi)
    return RefinedBoundary(hi, A, rho)
