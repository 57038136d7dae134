"""FFN throughput curve and streamFFN's launch threshold (CascadeEP §3.2, Eq. 2; Fig. 4).

A profile gives the grouped-FFN time t_m of M expert-token counts N_m on one EP rank. Throughput N/t rises
quickly, then saturates; normalised by the observed peak it is η(N) ∈ (0, 1], and the FFN latency of Eq. 2 is

    F(N) = N / (η(N) · P_peak)   µs.

streamFFN launches a grouped kernel once the ready tokens reach θ = the smallest profiled count with
η ≥ ρ (ρ = 0.9 in the paper; θ = 28,672 tokens per EP rank for DeepSeek-V4-Flash EP8 on B200).
numpy only.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from .checks import check_array, check_real
from .cost import CostModel

__all__ = ["DEFAULT_TOKEN_LADDER", "ThroughputCurve", "stream_threshold"]

#: Half-octave ladder 1, 2, 3, 4, 6, 8, 12, …, 98304, 131072 tokens per EP rank (34 points; Fig. 4 spans 128k).
DEFAULT_TOKEN_LADDER: tuple[int, ...] = tuple(
    sorted({2**k for k in range(18)} | {3 * 2 ** (k - 1) for k in range(1, 17)})
)


@dataclass(frozen=True, kw_only=True)
class ThroughputCurve:
    """Profiled grouped-FFN time per EP rank and the latency F(N) it implies (Eq. 2).

    Attributes:
      tokens: ``[M]`` profiled expert-token counts N_m per rank: strictly ascending whole numbers ≥ 1.
      time_us: ``[M]`` FFN time t_m at each count (µs, > 0).
      source: where the profile comes from (not part of equality).

    Both are stored as tuples, so a curve is hashable. Between and outside the profile:

    * 0 < N ≤ N_1: F(N) = t_1, the smallest profiled kernel is the launch floor (a kernel never beats it);
      F(0) = 0 (no kernel).
    * N_m ≤ N ≤ N_{m+1}: F is linear in N between the two points (piecewise-linear time, so η between
      points is a harmonic interpolation of the two throughputs).
    * N > N_M: F(N) = t_M · N / N_M, i.e. the last profiled point's throughput continues (η constant):
      the profile is expected to reach the plateau.

    Profiles need not be monotone; F follows the measured points.
    """

    tokens: tuple[int, ...]
    time_us: tuple[float, ...]
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        fn = "ThroughputCurve"
        tok = check_array(
            "tokens", self.tokens, where=fn, ndims=(1,), integer=True, positive=True, hint="profiled token counts"
        )
        if tok.size == 0:
            raise ValueError(f"{fn}: empty profile; give at least one (tokens, time_us) point")
        t = check_array(
            "time_us", self.time_us, where=fn, shape=tok.shape, positive=True, hint="one time per token count"
        )
        step = np.diff(tok) <= 0
        if step.any():
            i = int(np.flatnonzero(step)[0])
            raise ValueError(
                f"{fn}: tokens must be strictly ascending, got tokens[{i}] = {tok[i]} then tokens[{i + 1}] = "
                f"{tok[i + 1]}; sort the profile and merge duplicate counts"
            )
        object.__setattr__(self, "tokens", tuple(int(v) for v in tok))
        object.__setattr__(self, "time_us", tuple(float(v) for v in t))

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_profile(cls, tokens, time_us, *, source: str = "profile") -> ThroughputCurve:
        """Curve from measured ``tokens [M]`` (ascending, ≥ 1) and ``time_us [M]`` (µs, > 0)."""
        return cls(tokens=tokens, time_us=time_us, source=source)

    @classmethod
    def from_cost_model(cls, cost: CostModel, experts_per_rank: int, tokens=None) -> ThroughputCurve:
        """The throughput curve implied by TEMPO's max-affine expert cost on one rank.

        Derivation. A rank hosts S = ``experts_per_rank`` expert slots. N routed (token, expert) pairs
        landing on the rank activate, in expectation under uniform routing over its S experts,

            G(N) = S · (1 − (1 − 1/S)^N)

        experts (the expected number of distinct slots hit by N uniform draws). We use the expectation rather
        than min(S, N): it is smooth, never above min(S, N), equals it at N ≤ 1 and as N ≫ S, and is the same
        occupancy form as TEMPO's E_eff boundary. The rank's FFN time is the kernel part of the model,

            t(N) = max(a + b·G(N) [+ b2·(T(N) − G(N))], c + β·N),   T(N) = max(G(N), N / tile),

        (the traffic piece c2 + γ·N is the exchange, priced separately as dispatch time, so it is dropped;
        T(N) counts at least one M-tile per active expert and N / tile tiles in all). Throughput N / t(N)
        is normalised by its maximum over the grid: η(N) = (N / t(N)) / max_M (M / t(M)).

        Args:
          cost: a `solvers.CostModel` (µs).
          experts_per_rank: S, expert slots per EP rank (≥ 1).
          tokens: ``[M]`` grid of token counts (default `DEFAULT_TOKEN_LADDER`, 1 … 131072).
        """
        fn = "ThroughputCurve.from_cost_model"
        if not isinstance(cost, CostModel):
            raise ValueError(f"{fn}: cost must be a solvers.CostModel, got {type(cost).__name__}")
        S = check_real("experts_per_rank", experts_per_rank, where=fn, minimum=1)
        if S != int(S):
            raise ValueError(f"{fn}: experts_per_rank must be a whole number ≥ 1, got {experts_per_rank!r}")
        grid = check_array(
            "tokens",
            DEFAULT_TOKEN_LADDER if tokens is None else tokens,
            where=fn,
            ndims=(1,),
            integer=True,
            positive=True,
        )
        # Step 1: expected activated experts under uniform routing (log1p/expm1 keep S = 1 and large N exact).
        N = grid.astype(np.float64)
        G = S if S == 1 else -S * np.expm1(N * np.log1p(-1.0 / S))
        G = np.broadcast_to(np.asarray(G, dtype=np.float64), N.shape)
        # Step 2: kernel time of the max-affine model.
        kernel = cost.kernel_only()
        T = np.maximum(G, N / kernel.tile) if kernel.has_tiles else None
        t = kernel.gpu_times(G, N, T)
        if (t <= 0).any():
            i = int(np.flatnonzero(t <= 0)[0])
            raise ValueError(
                f"{fn}: the cost model gives t({int(grid[i])} tokens) = {t[i].item()!r} µs ≤ 0; a throughput "
                "curve needs positive times (check a, b, c, beta)"
            )
        return cls(tokens=grid, time_us=t, source=f"max-affine {cost.source or cost!r}, S={int(S)}")

    # ------------------------------------------------------------------ profile quantities
    @property
    def peak(self) -> float:
        """P_peak: the highest profiled throughput, tokens per µs."""
        return float(np.max(np.asarray(self.tokens) / np.asarray(self.time_us)))

    @property
    def profile_eta(self) -> np.ndarray:
        """η at the profiled points, ``[M]`` in (0, 1] (1 at the peak)."""
        thr = np.asarray(self.tokens) / np.asarray(self.time_us)
        return thr / thr.max()

    # ------------------------------------------------------------------ evaluation
    def ffn_time(self, N):
        """F(N), FFN latency of a grouped kernel over N expert tokens on one rank (µs, Eq. 2).

        Vectorised over ``N [...]`` (tokens, ≥ 0, may be fractional estimates); returns float64 of the same
        shape (a numpy scalar for a scalar). F(0) = 0; interpolation and extrapolation as in the class doc.
        """
        return self.ffn_time_unchecked(check_array("N", N, where="ThroughputCurve.ffn_time", nonnegative=True))

    def ffn_time_unchecked(self, N):
        """`ffn_time` without input checks (simulators' inner loops): ``N`` float ≥ 0, scalar or array."""
        if isinstance(N, int | float):  # scalar fast path, same rule as the array path below
            if N <= 0:
                return 0.0
            tok, t = self.tokens, self.time_us
            if N >= tok[-1]:
                return N * (t[-1] / tok[-1])
            i = bisect.bisect_left(tok, N)
            if i == 0:
                return t[0]
            return t[i - 1] + (t[i] - t[i - 1]) * (N - tok[i - 1]) / (tok[i] - tok[i - 1])
        tok, t = self._points
        # np.interp holds t_1 below the first point (the launch floor) and we override past the last point.
        out = np.interp(N, tok, t)
        out = np.where(N > tok[-1], N * (t[-1] / tok[-1]), out)
        return np.where(N == 0, 0.0, out)[()]

    @cached_property
    def _points(self) -> tuple[np.ndarray, np.ndarray]:
        return np.asarray(self.tokens, dtype=np.float64), np.asarray(self.time_us, dtype=np.float64)

    def eta(self, N):
        """η(N) = N / (F(N) · P_peak), normalised throughput in (0, 1] (Eq. 2), vectorised over ``N [...]``.

        η(0) is not needed by F (F(0) = 0); it is reported as η at the smallest profiled point.
        """
        N = check_array("N", N, where="ThroughputCurve.eta", nonnegative=True)
        F = np.asarray(self.ffn_time(N))
        safe = np.where(N > 0, F, 1.0)
        return np.where(N > 0, N / (safe * self.peak), self.profile_eta[0])[()]


def stream_threshold(curve: ThroughputCurve, rho: float = 0.9) -> int:
    """streamFFN launch threshold θ (§3.2): the smallest profiled token count with η ≥ ρ.

    Args:
      curve: the rank's `ThroughputCurve`.
      rho: target fraction of peak throughput, in (0, 1] (paper: 0.90). ρ = 1 gives the peak's count.

    Returns:
      θ in tokens per EP rank (one of ``curve.tokens``). θ is non-decreasing in ρ.
    """
    if not isinstance(curve, ThroughputCurve):
        raise ValueError(f"stream_threshold: curve must be a ThroughputCurve, got {type(curve).__name__}")
    rho = check_real("rho", rho, where="stream_threshold", minimum=0.0, strict=True, maximum=1.0)
    # The peak point has η = 1 exactly, so some point always qualifies; 1e-12 absorbs rounding of N/t.
    idx = int(np.flatnonzero(curve.profile_eta >= rho - 1e-12)[0])
    return curve.tokens[idx]
