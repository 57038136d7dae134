"""The simulator's true attention time and the planners' fitted estimate of it (CascadeEP App. B, App. D).

The planners never see the truth's formula: they see `solvers.fit_attention` fitted on a profile of the truth, as the
paper's runtime does, and their accuracy is measured online (App. D's metric, 1 − mean |â − a| / a).

**Truth** (per layer class c, per replica batch with features Q, Π of App. B Eq. 10):

    a = α0 + α1·Q + κ_c · α2·Π + α_r·m,   times exp(σ·ε),  ε ~ N(0, 1) per (step, layer, replica)

with (α0, α1, α2) the FLOP-derived coefficients of `PrefillCosts.attention` and m the batch's requests. The
``α_r·m`` term is per-sequence work the features of Eq. 10 do not count (variable-length metadata, per-sequence
KV-cache updates and compression set-up; α_r = 15 µs, an assumption, not a measurement): the linear form of
Eq. 11 cannot express it, which is what App. D's measured error is about. Layer classes: DeepSeek-V4's layers
alternate two KV-compression settings (CSA and HCA), which App. B fits separately; here layer ℓ has class
ℓ mod 2 with κ = (1, 0.25) (the heavily compressed layers see a quarter of the key work; an assumption).
Models without that split have one class (κ = 1). σ (``step_noise``) is the step-to-step variation of one
batch's time (kernel timing jitter, interference): stated, not fitted.

**Estimate**: for each class, `fit_attention` on the truth sampled (with the same noise) over App. B's profile grid,
B ∈ {1, 2, 4, …, 64} equal-length requests × I ∈ {1K, …, 64K} tokens × prefix-hit ratio r ∈ {0, 20, 40, 60, 70,
80, 90, 95}%, omitting batches above ``max_profile_tokens`` (the paper omits those that exceed GPU memory).

numpy + solvers only (no jax).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from solvers import AttentionFitReport, AttentionModel, attention_features, fit_attention

from .costs import prefill_costs

__all__ = ["PROFILE_GRID", "AttentionTruth", "attention_truth"]

#: App. B's profile grid: batch sizes, input lengths (tokens), prefix-hit ratios.
PROFILE_GRID = {
    "batch": (1, 2, 4, 8, 16, 32, 64),
    "input": (1024, 2048, 4096, 8192, 16_384, 32_768, 65_536),
    "hit": (0.0, 0.2, 0.4, 0.6, 0.7, 0.8, 0.9, 0.95),
}
_PER_REQUEST_US = 15.0
_V4_KAPPA = (1.0, 0.25)  # CSA, HCA layers of DeepSeek-V4


@dataclass(frozen=True, eq=False)
class AttentionTruth:
    """True per-class attention time and its fitted estimators.

    Attributes:
      base: the FLOP-derived `AttentionModel` (α0, α1, α2).
      kappa: ``[C]`` key-work factor per layer class (layer ℓ has class ℓ mod C).
      step_noise: σ of the lognormal step-to-step noise.
      fitted: ``[C]`` the planners' `AttentionModel` per class (`fit_attention` on the profile).
      reports: ``[C]`` the fits' `AttentionFitReport` on their own profile.
      key_budget: the per-query key budget the features use (None = dense).
    """

    base: AttentionModel
    kappa: tuple[float, ...]
    step_noise: float
    fitted: tuple[AttentionModel, ...]
    reports: tuple[AttentionFitReport, ...]
    key_budget: int | None

    @property
    def classes(self) -> int:
        return len(self.kappa)

    def mean_us(self, Q: np.ndarray, Pi: np.ndarray, m: np.ndarray) -> np.ndarray:
        """``[C, ...]`` noiseless true time of batches with features ``Q [...]``, ``Pi [...]`` and ``m [...]``
        requests (µs)."""
        Q, Pi, m = (np.asarray(v, dtype=np.float64) for v in (Q, Pi, m))
        b = self.base
        rest = b.alpha0 + b.alpha1 * Q + _PER_REQUEST_US * m
        return np.stack([rest + k * b.alpha2 * Pi for k in self.kappa])

    def estimate_us(self, Q: np.ndarray, Pi: np.ndarray) -> np.ndarray:
        """``[C, ...]`` the planners' fitted estimate for features ``Q [...]``, ``Pi [...]`` (µs)."""
        Q, Pi = np.asarray(Q, dtype=np.float64), np.asarray(Pi, dtype=np.float64)
        return np.stack([m.alpha0 + m.alpha1 * Q + m.alpha2 * Pi for m in self.fitted])


def _profile(key_budget: int | None, max_tokens: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(Q [n], Π [n], B [n]) of App. B's equal-length profile batches (B requests of I tokens, P = r·I cached)."""
    Qs, Pis, Bs = [], [], []
    for B in PROFILE_GRID["batch"]:
        for I in PROFILE_GRID["input"]:
            if B * I > max_tokens:
                continue
            for r in PROFILE_GRID["hit"]:
                P = int(r * I)
                q, pi = attention_features([I], [P], key_budget)
                Qs.append(B * float(q))
                Pis.append(B * float(pi))
                Bs.append(float(B))
    return np.array(Qs), np.array(Pis), np.array(Bs)


@lru_cache(maxsize=32)
def attention_truth(
    model: str,
    hardware: str,
    num_ranks: int,
    key_budget: int | None,
    step_noise: float,
    *,
    max_profile_tokens: int = 1 << 20,
    seed: int = 0,
) -> AttentionTruth:
    """The truth of one deployment and its planners' fits (see the module doc); cached per arguments.

    Args:
      model, hardware, num_ranks: keys of `prefill.MODELS`, `prefill.HARDWARE` and D (for `prefill_costs`).
      key_budget: per-query key budget (None = dense attention).
      step_noise: σ of the lognormal step-to-step noise (≥ 0).
      max_profile_tokens: profile batches with B·I above this are omitted.
      seed: seeds the profile's noise.
    """
    costs = prefill_costs(model, hardware, num_ranks)
    kappa = _V4_KAPPA if costs.model.name.startswith("deepseek_v4") else (1.0,)
    truth = AttentionTruth(
        base=costs.attention, kappa=kappa, step_noise=float(step_noise), fitted=(), reports=(), key_budget=key_budget
    )
    # Step 1: the profile (App. B's grid) timed by the truth, with the step noise.
    Q, Pi, B = _profile(key_budget, max_profile_tokens)
    rng = np.random.default_rng([seed, 7])
    times = truth.mean_us(Q, Pi, B) * np.exp(step_noise * rng.standard_normal((truth.classes, Q.size)))
    # Step 2: one weighted least-squares fit per class (App. B).
    fits = [fit_attention(Q, Pi, times[c]) for c in range(truth.classes)]
    return AttentionTruth(
        base=costs.attention,
        kappa=kappa,
        step_noise=float(step_noise),
        fitted=tuple(f[0] for f in fits),
        reports=tuple(f[1] for f in fits),
        key_budget=key_budget,
    )
