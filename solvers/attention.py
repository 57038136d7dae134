"""Attention-stage time model of CascadeEP (App. B, Eqs. 10–11) and the remaining time A_d (§3.3, Eq. 1).

A replica's batch is a list of requests; request i has I_i input tokens of which P_i hit the prefix cache, so
it computes q_i = I_i − P_i new tokens, and its j-th new token attends to min(k_i, P_i + j) keys (k_i the
sparse key budget, ∞ for dense attention). Per batch (Eq. 10):

    Q = Σ_i q_i,        Π = Σ_i Σ_{j=1..q_i} min(k_i, P_i + j)

and the attention stage lasts (Eq. 11)

    f = α0 + α1·Q + α2·Π   µs,

with (α0, α1, α2) fitted to offline profiles by weighted least squares minimising relative error. The
remaining time of a replica that has spent ``elapsed`` µs in attention is A = max(0, f − elapsed) (Eq. 1).
numpy only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .checks import check_array

__all__ = [
    "AttentionFitReport",
    "AttentionModel",
    "attention_features",
    "attention_features_unchecked",
    "fit_attention",
]

# Features are summed in int64; refuse inputs whose pair count could leave the exactly representable range.
_INT64_SAFE = float(2**62)


def _pair_count(q: np.ndarray, P: np.ndarray, k: np.ndarray | None) -> np.ndarray:
    """Exact Σ_{j=1..q} min(k, P + j) per request, int64, closed form.

    Dense (k = ∞): the keys seen are P+1, …, P+q, so the sum is q·P + q(q+1)/2. With a budget k, the first
    m = clip(k − P, 0, q) new tokens see P + j ≤ k keys and the remaining q − m see exactly k:
    m·P + m(m+1)/2 + (q − m)·k. When k ≤ P every new token sees k keys (m = 0).
    """
    if k is None:
        return q * P + q * (q + 1) // 2
    m = np.clip(k - P, 0, q)
    return m * P + m * (m + 1) // 2 + (q - m) * k


def attention_features(input_len, prefix_len, key_budget=None, batch=None, *, num_batches: int | None = None):
    """Workload features (Q, Π) of App. B, Eq. 10, summed per batch (one batch per replica).

    Args:
      input_len: ``[n]`` input lengths I_i (tokens, whole numbers ≥ 0) of n requests.
      prefix_len: ``[n]`` matched (cached) prefix lengths P_i, 0 ≤ P_i ≤ I_i. P_i = I_i is allowed: the
        request computes no new token and contributes 0 to both features.
      key_budget: per-query key budget k_i of sparse selection: ``None`` or ``inf`` for dense attention
        (k_i = ∞), a scalar for every request, or ``[n]`` (``inf`` entries mark dense requests). Finite
        budgets are whole numbers ≥ 1.
      batch: optional ``[n]`` batch index (≥ 0) of each request, e.g. the replica it runs on.
      num_batches: number of batches when ``batch`` is given (default ``max(batch) + 1``); batches with no
        request get zeros.

    Returns:
      ``(Q, Pi)``: new tokens and query–key pairs. Without ``batch``: two numpy int64 scalars (all requests
      form one batch). With ``batch``: two int64 arrays ``[num_batches]``. Exact integer arithmetic; no
      loop over tokens.
    """
    fn = "attention_features"
    # Step 1: validate lengths (whole tokens, 0 ≤ P ≤ I).
    I = check_array(
        "input_len",
        input_len,
        where=fn,
        ndims=(1,),
        integer=True,
        nonnegative=True,
        hint="one input length per request",
    )
    P = check_array(
        "prefix_len", prefix_len, where=fn, shape=I.shape, integer=True, nonnegative=True, hint="one per request"
    )
    over = P > I
    if over.any():
        i = int(np.flatnonzero(over)[0])
        raise ValueError(
            f"{fn}: prefix_len[{i}] = {P[i]} exceeds input_len[{i}] = {I[i]}; a cached prefix cannot be longer "
            "than the input (use prefix_len ≤ input_len; prefix_len == input_len means no new tokens)"
        )
    q = I - P

    # Step 2: key budgets (None or inf = dense).
    k = None
    if key_budget is not None:
        kb = check_array("key_budget", key_budget, where=fn, positive=True, allow_inf=True)
        if kb.ndim not in (0, 1) or (kb.ndim == 1 and kb.shape != I.shape):
            raise ValueError(f"{fn}: key_budget must be a scalar or shape {I.shape}, got {kb.shape}")
        kb = np.broadcast_to(kb, I.shape)
        finite = np.isfinite(kb)
        frac = finite & ((kb != np.round(kb)) | (kb < 1))
        if frac.any():
            i = int(np.flatnonzero(frac)[0])
            raise ValueError(f"{fn}: key_budget[{i}] = {kb[i].item()!r} must be a whole number ≥ 1 (or inf for dense)")
        if finite.any():
            # A budget ≥ P + q is never binding: cap it there so int64 never sees inf.
            k = np.where(finite, np.minimum(np.where(finite, kb, 0), I), I).astype(np.int64)

    # Step 3: guard the int64 range (per-request Π ≤ q·(P + q) ≤ I²), then the closed form per request.
    bound = (I.astype(np.float64) ** 2).sum()
    if bound >= _INT64_SAFE:
        raise ValueError(f"{fn}: Σ input_len² = {bound:.3g} overflows int64 features; split the batch")
    pi = _pair_count(q, P, k)

    # Step 4: per-batch sums (exact integer scatter-add).
    if batch is None:
        if num_batches is not None:
            raise ValueError(f"{fn}: num_batches={num_batches!r} needs batch=[n] batch indices")
        return np.int64(q.sum()), np.int64(pi.sum())
    b = check_array(
        "batch", batch, where=fn, shape=I.shape, integer=True, nonnegative=True, hint="batch index of each request"
    )
    nb = int(b.max()) + 1 if b.size else 0
    if num_batches is not None:
        if int(num_batches) != num_batches or num_batches < nb:
            raise ValueError(f"{fn}: num_batches={num_batches!r} must be an integer ≥ max(batch) + 1 = {nb}")
        nb = int(num_batches)
    Q_out = np.zeros(nb, dtype=np.int64)
    Pi_out = np.zeros(nb, dtype=np.int64)
    np.add.at(Q_out, b, q)
    np.add.at(Pi_out, b, pi)
    return Q_out, Pi_out


def attention_features_unchecked(
    input_len: np.ndarray, prefix_len: np.ndarray, key_budget: int | None, batch: np.ndarray, num_batches: int
) -> tuple[np.ndarray, np.ndarray]:
    """`attention_features` without input checks (simulators' inner loops): int64 ``input_len`` / ``prefix_len``
    ``[n]`` with 0 ≤ P ≤ I, ``key_budget`` None or a whole number ≥ 1, ``batch [n]`` in ``[0, num_batches)``.
    Returns ``(Q, Pi)`` int64 ``[num_batches]``, the same integers."""
    k = None if key_budget is None else np.minimum(key_budget, input_len).astype(np.int64)
    q = input_len - prefix_len
    Q_out, Pi_out = np.zeros(num_batches, dtype=np.int64), np.zeros(num_batches, dtype=np.int64)
    np.add.at(Q_out, batch, q)
    np.add.at(Pi_out, batch, _pair_count(q, prefix_len, k))
    return Q_out, Pi_out


def _features(fn: str, Q, Pi) -> tuple[np.ndarray, np.ndarray]:
    Q = check_array("Q", Q, where=fn, nonnegative=True)
    Pi = check_array("Pi", Pi, where=fn, nonnegative=True)
    try:
        np.broadcast_shapes(Q.shape, Pi.shape)
    except ValueError as err:
        raise ValueError(f"{fn}: Q {Q.shape} and Pi {Pi.shape} do not broadcast; give one value per batch") from err
    return Q, Pi


@dataclass(frozen=True, kw_only=True)
class AttentionModel:
    """Attention-stage duration f = α0 + α1·Q + α2·Π (App. B, Eq. 11), µs.

    Attributes:
      alpha0: fixed cost of an attention stage (µs).
      alpha1: µs per new token (projections and other token-proportional work).
      alpha2: µs per query–key pair (core attention).
      source: where the numbers come from (not part of equality).
    """

    alpha0: float = 0.0
    alpha1: float
    alpha2: float
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        for name in ("alpha0", "alpha1", "alpha2"):
            v = getattr(self, name)
            if not math.isfinite(float(v)):
                raise ValueError(f"AttentionModel.{name} must be finite, got {v!r}")

    def predict(self, Q, Pi):
        """Predicted attention-stage duration f (µs, Eq. 11) from features ``Q [...]``, ``Pi [...]``.

        Returns a float64 array of the broadcast shape (a numpy scalar for scalar inputs).
        """
        Q, Pi = _features("AttentionModel.predict", Q, Pi)
        return (self.alpha0 + self.alpha1 * Q + self.alpha2 * Pi)[()]

    def remaining(self, Q, Pi, elapsed):
        """Remaining attention time A = max(0, f − elapsed) (µs, Eq. 1).

        Args:
          Q, Pi: features ``[...]`` of each replica's batch (`attention_features`).
          elapsed: ``[...]`` µs each replica has already spent in its attention stage (≥ 0).

        A replica whose prediction has run out gets A = 0 and is no longer a candidate donor (§3.3).
        """
        el = check_array("elapsed", elapsed, where="AttentionModel.remaining", nonnegative=True)
        return np.maximum(0.0, self.predict(Q, Pi) - el)[()]


@dataclass(frozen=True, kw_only=True)
class AttentionFitReport:
    """Quality of `fit_attention` on its own samples.

    Attributes:
      accuracy: the paper's estimator accuracy 1 − mean(|ŷ − y| / y) (App. D; 90.3% reported online).
      mean_rel_error: mean(|ŷ − y| / y).
      max_rel_error: max(|ŷ − y| / y).
      num_samples: number of profiled batches used.
    """

    accuracy: float
    mean_rel_error: float
    max_rel_error: float
    num_samples: int


def fit_attention(Q, Pi, time_us) -> tuple[AttentionModel, AttentionFitReport]:
    """Fit (α0, α1, α2) of Eq. 11 by weighted least squares minimising relative error (App. B).

    Minimises Σ_s ((α0 + α1·Q_s + α2·Π_s − t_s) / t_s)², i.e. ordinary least squares on rows scaled by 1/t_s
    (profiles span orders of magnitude, so unweighted least squares would ignore short batches). Columns
    are rescaled before solving for conditioning (Π reaches 1e11).

    Args:
      Q: ``[n]`` new tokens per profiled batch (≥ 0).
      Pi: ``[n]`` query–key pairs per profiled batch (≥ 0).
      time_us: ``[n]`` measured attention-stage durations (µs, > 0).

    Returns:
      ``(AttentionModel, AttentionFitReport)``.

    Raises:
      ValueError: fewer than 3 samples, NaN or negative features, non-positive times, mismatched lengths,
        or features that cannot separate the three coefficients (collinear profiles).
    """
    fn = "fit_attention"
    # Step 1: validate.
    t = check_array("time_us", time_us, where=fn, ndims=(1,), hint="one measured duration per profiled batch")
    n = t.shape[0]
    if n < 3:
        raise ValueError(f"{fn}: need at least 3 profiled batches for 3 coefficients, got {n}; profile more shapes")
    Q = check_array("Q", Q, where=fn, shape=(n,), nonnegative=True, hint="one value per entry of time_us")
    Pi = check_array("Pi", Pi, where=fn, shape=(n,), nonnegative=True, hint="one value per entry of time_us")
    if (t <= 0).any():
        i = int(np.flatnonzero(t <= 0)[0])
        raise ValueError(f"{fn}: time_us[{i}] = {t[i].item()!r} must be > 0 (the fit minimises relative error)")

    # Step 2: design matrix, rows scaled by 1/t (relative error), columns scaled to unit max.
    X = np.stack([np.ones(n), Q, Pi], axis=1)
    scale = np.abs(X).max(axis=0)
    scale[scale == 0] = 1.0
    Xw = X / scale / t[:, None]
    rank = np.linalg.matrix_rank(Xw)
    if rank < 3:
        raise ValueError(
            f"{fn}: the features have rank {rank} < 3 (e.g. one input length only, or Π ∝ Q); profile several "
            "batch sizes and input lengths so α0, α1, α2 are identifiable"
        )

    # Step 3: solve and unscale.
    theta, *_ = np.linalg.lstsq(Xw, np.ones(n), rcond=None)
    alpha = theta / scale
    model = AttentionModel(alpha0=float(alpha[0]), alpha1=float(alpha[1]), alpha2=float(alpha[2]), source=fn)

    # Step 4: the paper's accuracy metric (App. D).
    rel = np.abs(X @ alpha - t) / t
    report = AttentionFitReport(
        accuracy=float(1.0 - rel.mean()),
        mean_rel_error=float(rel.mean()),
        max_rel_error=float(rel.max()),
        num_samples=n,
    )
    return model, report
