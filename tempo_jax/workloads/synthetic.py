"""Synthetic Zipf routing with Dirichlet batch-to-batch fluctuation (TEMPO §3.2 phase-diagram workload).

Glossary additions: B tokens per rank.

Model of one batch: the long-run expert popularity ``p [E]`` is Zipf(s) over a seeded random permutation
of the experts; the batch's popularity is ``q ~ Dirichlet(κ·p)`` (mean p, ``Var q_e = p_e(1−p_e)/(κ+1)``,
so fluctuation shrinks as κ grows; ``κ = inf`` means ``q = p``); each of the ``B·D`` tokens then picks K
distinct experts by sampling without replacement proportionally to q (successive draws renormalised over
the experts not yet picked: the Plackett–Luce law, the same as Gumbel-top-k). Tokens ``[g·B, (g+1)·B)``
sit on rank g. The sampler (:func:`sample_topk`) is vectorised over tokens (alias-table draws with rejection, then
an exact CDF-skipping draw for tokens still clashing), so a 64 x 2048-token batch with E = 256, K = 8
takes a few tens of milliseconds.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from numbers import Integral

import numpy as np

from solvers.checks import check_int, check_real

__all__ = [
    "MAX_SAMPLED_PAIRS",
    "SyntheticRouting",
    "check_sampled_pairs",
    "pair_share",
    "sample_topk",
    "topk_inclusion",
    "zipf_popularity",
]

#: Most token–expert pairs one batch may draw (T·K): 2^26 int64 ids = 512 MiB, a few seconds of sampling.
MAX_SAMPLED_PAIRS = 2**26


def check_sampled_pairs(num_tokens: int, top_k: int, *, where: str = "", fix: str = "draw fewer tokens") -> None:
    """ValueError, before any allocation, when ``num_tokens · top_k`` exceeds `MAX_SAMPLED_PAIRS`."""
    if num_tokens * top_k > MAX_SAMPLED_PAIRS:
        pre = f"{where}: " if where else ""
        raise ValueError(
            f"{pre}{num_tokens:,} tokens × top-{top_k} = {num_tokens * top_k:,} token–expert pairs per batch exceed "
            f"the limit of {MAX_SAMPLED_PAIRS:,} (2^26, 512 MiB of ids); {fix}"
        )


def zipf_popularity(num_experts: int, s: float, seed: int = 0) -> np.ndarray:
    """float64 ``[E]`` Zipf(s) popularity: the expert of rank r (1-based) gets ``∝ r^-s``; sums to 1.

    Ranks are assigned to experts by ``np.random.default_rng(seed).permutation(E)`` (``perm[r-1]`` is the
    expert of rank r), so the hot experts are not always ids 0, 1, ...; ``s = 0`` is exactly uniform.
    """
    E = check_int("num_experts", num_experts)
    s = check_real("s", s, minimum=0.0)
    seed = check_int("seed", seed, minimum=0)
    w = np.arange(1, E + 1, dtype=np.float64) ** -s
    p = np.empty(E)
    p[np.random.default_rng(seed).permutation(E)] = w / w.sum()
    return p


def _check_generator(rng: object) -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng must be a numpy Generator, got {type(rng).__name__}")
    return rng


def _alias_table(p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Walker/Vose alias table of a normalised ``p [E]``: draw ``i ~ U{0..E-1}``, keep i w.p. ``prob[i]``,
    else take ``alias[i]``."""
    E = p.size
    scaled = p * E
    prob = np.ones(E)
    alias = np.arange(E)
    small = [i for i in range(E) if scaled[i] < 1.0]
    large = [i for i in range(E) if scaled[i] >= 1.0]
    while small and large:
        lo, hi = small.pop(), large.pop()
        prob[lo], alias[lo] = scaled[lo], hi
        scaled[hi] -= 1.0 - scaled[lo]
        (small if scaled[hi] < 1.0 else large).append(hi)
    # Entries left in either list keep prob 1 (rounding); never let that draw a zero-mass expert.
    left = [i for i in small + large if p[i] == 0]
    prob[left], alias[left] = 0.0, int(np.argmax(p))
    return prob, alias


def sample_topk(p: np.ndarray, num_tokens: int, top_k: int, rng: np.random.Generator) -> np.ndarray:
    """int64 ``[T, K]``: for each of T tokens, K distinct experts drawn without replacement ∝ ``p [E]``.

    Column j is the j-th draw, from ``p`` renormalised over the experts the token has not picked yet (the
    Plackett–Luce law, same as Gumbel-top-k). Vectorised over tokens: draw j first tries two rounds of
    O(1) alias-table draws from ``p``, rejecting already-picked experts (exact: a rejected draw is just
    redrawn); tokens still clashing then draw a uniform on their remaining mass and map it back to the full
    CDF by skipping the intervals of their picked experts. Experts with ``p_e = 0`` are only drawn when
    fewer than K experts have positive mass (then uniformly among them).
    """
    p = np.asarray(p, dtype=np.float64)
    if p.ndim != 1 or p.size == 0 or not np.all(np.isfinite(p)) or p.min() < 0 or p.sum() <= 0:
        raise ValueError("p must be a 1-D array of finite non-negative weights with a positive sum")
    T = check_int("num_tokens", num_tokens, minimum=0)
    K = check_int("top_k", top_k)
    E = p.size
    if K > E:
        raise ValueError(f"top_k={K} exceeds num_experts={E}")
    check_sampled_pairs(T, K, where="sample_topk")
    rng = _check_generator(rng)
    p = p / p.sum()
    prob, alias = _alias_table(p)
    cdf = np.cumsum(p)
    cdf[-1] = 1.0
    lo = cdf - p  # [E] start of each expert's CDF interval
    out = np.empty((T, K), np.int64)
    reject = True  # rejection pays while most first-round draws are accepted
    for j in range(K):
        # Step 1: alias draws from p, rejecting experts the token already picked (two rounds).
        rows = np.arange(T)
        for r in range(2 if reject else 0):
            cand = rng.integers(0, E, rows.size)
            cand = np.where(rng.random(rows.size) < prob[cand], cand, alias[cand])
            clash = (out[rows, :j] == cand[:, None]).any(axis=1)
            out[rows[~clash], j] = cand[~clash]
            if r == 0 and 2 * clash.sum() > T:
                reject = False  # acceptance only falls with j: go straight to step 2 from now on
            rows = rows[clash]
            if rows.size == 0:
                break
        if rows.size == 0:
            continue
        # Step 2: exact draw from the remaining mass, mapped to the full CDF past the picked intervals.
        picked = np.sort(out[rows, :j], axis=1)  # ascending ids = ascending interval starts
        left = 1.0 - p[picked].sum(axis=1)
        y = rng.random(rows.size) * left
        for c in range(j):
            e = picked[:, c]
            y += np.where(lo[e] <= y, p[e], 0.0)
        idx = np.minimum(np.searchsorted(cdf, y, side="right"), E - 1)
        # Step 3 (rounding at interval edges, or no mass left): masked draw for those few tokens.
        bad = (picked == idx[:, None]).any(axis=1) | (p[idx] == 0) | (left <= 1e-12)
        if bad.any():
            sub = rows[bad]
            free = np.ones((sub.size, E), bool)
            np.put_along_axis(free, out[sub, :j], False, axis=1)
            w = np.where(free, p, 0.0)
            empty = w.sum(axis=1) <= 0
            w[empty] = free[empty]  # only zero-mass experts left: uniform over them
            c = np.cumsum(w, axis=1)
            u = rng.random(sub.size) * c[:, -1]
            idx[bad] = np.minimum((c <= u[:, None]).sum(axis=1), E - 1)
        out[rows, j] = idx
    return out


def topk_inclusion(p, top_k: int, *, points: int = 1200) -> np.ndarray:
    """float64 ``[E]``: probability π_e that expert e is among a token's K draws of :func:`sample_topk` ∝ ``p``.

    The Plackett–Luce law without replacement is the order of an exponential race: expert i arrives at
    ``X_i ~ Exp(p_i)``, and e is picked iff fewer than K others arrive first, so

        π_e = ∫_0^∞ p_e·e^(−p_e·t) · P(#{i ≠ e : X_i < t} ≤ K − 1) dt,

    where the count is Poisson-binomial with ``q_i(t) = 1 − e^(−p_i·t)``. The integral is a trapezoid rule on
    ``points`` log-spaced t (the integrand is smooth in log t); the leave-one-out count law comes from prefix
    and suffix dynamic programmes truncated at K, so no division ever happens. ``Σ_e π_e = K`` (to ~1e-9;
    tested), and ``π_e / K`` is expert e's share of the token–expert pairs (:func:`pair_share`), which for a
    hot expert is capped near 1/K although its first-draw probability ``p_e`` may be far larger.

    Args:
      p: ``[E]`` non-negative weights with a positive sum (normalised here).
      top_k: K ≤ E.
      points: quadrature points in log t.

    Returns:
      ``[E]`` inclusion probabilities in [0, 1]. Zero-weight experts get 0, unless fewer than K experts have
      positive weight: then those are always picked and the zero-weight ones share the rest uniformly
      (what :func:`sample_topk` does).
    """
    p = np.asarray(p, dtype=np.float64)
    if p.ndim != 1 or p.size == 0 or not np.all(np.isfinite(p)) or p.min() < 0 or p.sum() <= 0:
        raise ValueError("p must be a 1-D array of finite non-negative weights with a positive sum")
    K = check_int("top_k", top_k)
    points = check_int("points", points, minimum=16)
    E = p.size
    if K > E:
        raise ValueError(f"top_k={K} exceeds num_experts={E}")
    p = p / p.sum()
    pos = p > 0
    out = np.zeros(E)
    if pos.sum() <= K:  # every positive expert is always drawn; zero-weight ones fill the rest uniformly
        out[pos] = 1.0
        if (~pos).any():
            out[~pos] = (K - pos.sum()) / (~pos).sum()
        return out
    # Step 1: the log-spaced race times t [nt] and trapezoid weights of ∫ f(t) dt = ∫ f(t)·t d(log t).
    pp = p[pos]
    lo, hi = math.log(1e-9 / pp.max()), math.log(60.0 / pp.min())
    s = np.linspace(lo, hi, points)
    t = np.exp(s)
    w = np.full(points, (hi - lo) / (points - 1)) * t
    w[[0, -1]] *= 0.5
    q = -np.expm1(-np.outer(t, pp))  # [nt, E+] P(X_i < t)
    # Step 2: prefix[i] = law of the count among experts < i, suffix[i] = among experts ≥ i, truncated at K.
    n = pp.size
    prefix = np.zeros((n + 1, points, K))
    suffix = np.zeros((n + 1, points, K))
    prefix[0, :, 0] = suffix[n, :, 0] = 1.0
    for i in range(n):
        a = prefix[i]
        prefix[i + 1] = a * (1 - q[:, i : i + 1])
        prefix[i + 1, :, 1:] += a[:, :-1] * q[:, i : i + 1]
        j = n - 1 - i
        b = suffix[j + 1]
        suffix[j] = b * (1 - q[:, j : j + 1])
        suffix[j, :, 1:] += b[:, :-1] * q[:, j : j + 1]
    # Step 3: P(others ≤ K − 1) = Σ_k prefix[e][k] · P(suffix[e+1] ≤ K − 1 − k), then the race integral.
    tail = np.cumsum(suffix[1:], axis=2)[:, :, ::-1]  # [E+, nt, K]: entry k = P(suffix count ≤ K − 1 − k)
    fewer = np.einsum("ejk,ejk->ej", prefix[:-1], tail)  # [E+, nt]
    out[pos] = np.clip(((pp[:, None] * np.exp(-np.outer(pp, t))) * fewer) @ w, 0.0, 1.0)
    return out


def pair_share(p, top_k: int) -> np.ndarray:
    """float64 ``[E]``: expected share of token–expert pairs per expert under top-K sampling ∝ ``p``: π_e / K.

    This, not the first-draw popularity ``p``, is what batches realise: ``E[n_e] = pair_share_e · T`` with
    T = tokens·K pairs (:func:`topk_inclusion`). Sums to 1.
    """
    return topk_inclusion(p, top_k) / check_int("top_k", top_k)


@dataclass(frozen=True)
class SyntheticRouting:
    """Zipf(s) routing over E experts with Dirichlet(κ·p) batch fluctuation (see the module docstring).

    Args:
        num_experts: E.
        top_k: K distinct experts per token (``K <= E``).
        s: Zipf exponent ``>= 0`` (0 = uniform).
        kappa: Dirichlet concentration ``> 0``; larger = steadier batches; ``math.inf`` = no fluctuation.
        seed: seeds the expert permutation of the popularity and, via ``rng=step``, the batch draws.

    ``rng`` arguments take a ``numpy.random.Generator`` or an integer step; step n uses
    ``np.random.default_rng([seed, n])``, so ``batch(B, D, n)`` is reproducible per step.
    """

    num_experts: int
    top_k: int
    s: float
    kappa: float = 2000.0
    seed: int = 0
    popularity: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        E = check_int("num_experts", self.num_experts)
        K = check_int("top_k", self.top_k)
        if K > E:
            raise ValueError(f"top_k={K} exceeds num_experts={E}")
        check_real("kappa", self.kappa, minimum=0.0, strict=True, allow_inf=True)
        p = zipf_popularity(E, self.s, self.seed)  # validates s and seed
        p.setflags(write=False)
        object.__setattr__(self, "popularity", p)

    @cached_property
    def pair_share(self) -> np.ndarray:
        """float64 ``[E]`` expected share of token–expert pairs per expert (:func:`pair_share` of the
        popularity): capped near 1/K for hot experts, since each token picks K distinct experts."""
        share = pair_share(self.popularity, self.top_k)
        share.setflags(write=False)
        return share

    def rng(self, step: object) -> np.random.Generator:
        """The generator used for ``step`` (an integer ``>= 0``), or ``step`` itself if it is a Generator."""
        if isinstance(step, np.random.Generator):
            return step
        if isinstance(step, bool) or not isinstance(step, Integral):
            raise ValueError(f"rng must be a numpy Generator or an integer step, got {type(step).__name__}")
        return np.random.default_rng([self.seed, check_int("step", step, minimum=0)])

    def batch_popularity(self, rng: np.random.Generator | int) -> np.ndarray:
        """float64 ``[E]`` popularity of one batch: ``q ~ Dirichlet(κ·p)`` (``p`` itself if κ is inf)."""
        gen = self.rng(rng)
        if math.isinf(self.kappa):
            return self.popularity.copy()
        return gen.dirichlet(self.kappa * self.popularity)

    def topk_ids(self, num_tokens: int, rng: np.random.Generator | int) -> np.ndarray:
        """int64 ``[T, K]`` expert ids of one batch of T tokens (one Dirichlet draw for the whole batch)."""
        check_int("num_tokens", num_tokens)
        gen = self.rng(rng)
        return sample_topk(self.batch_popularity(gen), num_tokens, self.top_k, gen)

    def batch(self, tokens_per_rank: int, num_ranks: int, rng: np.random.Generator | int) -> np.ndarray:
        """int64 ``[D, E]`` token–expert-pair counts of one batch of B tokens on each of D ranks.

        Rows sum to B·K; rank g holds tokens ``[g·B, (g+1)·B)`` of ``topk_ids(B·D, rng)``.
        """
        B = check_int("tokens_per_rank", tokens_per_rank)
        D = check_int("num_ranks", num_ranks)
        E = self.num_experts
        ids = self.topk_ids(B * D, rng).reshape(D, B * self.top_k)
        flat = (np.arange(D)[:, None] * E + ids).ravel()
        return np.bincount(flat, minlength=D * E).reshape(D, E).astype(np.int64)

    def batches(self, tokens_per_rank: int, num_ranks: int, num_batches: int, start: int = 0) -> Iterator[np.ndarray]:
        """Yield ``batch(B, D, step)`` for ``step`` in ``range(start, start + num_batches)``, ``[D, E]`` each."""
        n = check_int("num_batches", num_batches, minimum=0)
        start = check_int("start", start, minimum=0)
        for step in range(start, start + n):
            yield self.batch(tokens_per_rank, num_ranks, step)
