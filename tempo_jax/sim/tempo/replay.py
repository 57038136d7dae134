"""Replay building blocks (TEMPO §5.5, 5.6, 5.12, 5.14): streams of windows, replay placements, stale splits.

Glossary additions: nw windows, Ex redundant slots (physical slots = E + Ex), B = tokens per step
(``tokens_per_step``).

**Batch size.** In the replay protocols B is the number of tokens of one step across the whole EP group
(the serving concurrency of TEMPO §5.13), so each of the D source ranks holds B/D tokens and each GPU receives
about B·K/D token–expert pairs (0.75·B for the proxy shape K = 6, G = 8). This is the reading under which the
paper's regime labels hold for the proxy model (B = 128 floor-bound, B ≥ 512 traffic-bound, B*_a2a ≈ 300
pairs per GPU); the phase diagram (:mod:`.phase`) counts B per GPU instead.

**Streams.** A :class:`Stream` is a sequence of windows ``[nw, D, E]`` plus the long-run load ``[E]`` that a
placement is built from (the "recording"). Two sources:

- recorded routing (:func:`trace_streams`): one stream per layer, windows = the layer's consecutive batches
  of B tokens (FLAME-MoE-290M, the only recording with the proxy's DSv2-Lite shape E = 64, top-6, holds
  2,048 tokens per layer: 16 windows at B = 128, 4 at B = 512, 2 at B = 1024, 1 at B = 2048). The
  long-run load is the layer's whole recording (a "fresh" placement sees the traffic it serves);
- synthetic (:func:`synthetic_stream`): Zipf(s) popularity whose log drifts slowly (an AR(1) random walk
  per expert), Dirichlet(κ) batch fluctuation on top, tokens drawn top-K without replacement. Long streams
  for the protocols that need them (refresh every 16 windows). The long-run load is a recording of
  the window-0 popularity (:data:`HISTORY_TOKENS` tokens).

**Stale information** (:func:`apply_split`): a dispatch solved on one window's counts is applied to another
window through the same placement by keeping its per-expert split fractions ``x[e, g]/n_e`` (uniform over
the replicas for experts it saw no token of) and scaling them by the true counts.

numpy + solvers only (no jax).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from solvers import Placement, drift_corrupt, expected_dispatch, plan_weights
from solvers.checks import plain_scalars
from tempo_jax.workloads import load_sample, load_trace, sample_topk, zipf_popularity

__all__ = [
    "HISTORY_TOKENS",
    "PROXY_PRESET",
    "Stream",
    "SyntheticStreams",
    "apply_split",
    "make_streams",
    "replay_placement",
    "scale_counts",
    "synthetic_stream",
    "trace_streams",
]

#: The paper's replay cost model: the proxy (DSv2-Lite shape) serving three-term model, Eq. 4 (Table 7).
PROXY_PRESET = "proxy_serving_3term"
#: Tokens of the recording a synthetic stream's placement is built from.
HISTORY_TOKENS = 16384


# ------------------------------------------------------------------------------------------------ streams
@dataclass(frozen=True, eq=False)
class Stream:
    """A sequence of routing windows and the long-run load a placement is built from.

    Attributes:
      label: name (``"flame_moe_290m/L2"``, ``"zipf1.2#0"``).
      windows: ``[nw, Gs, E]`` int64 token–expert pairs from each source rank to each expert, per window.
      history: ``[E]`` float64 long-run per-expert load (the recording EPLB sees).
      top_k: K.
    """

    label: str
    windows: np.ndarray
    history: np.ndarray
    top_k: int

    def __post_init__(self) -> None:
        plain_scalars(self)
        w = np.asarray(self.windows, dtype=np.int64)
        h = np.asarray(self.history, dtype=np.float64)
        if w.ndim != 3 or h.shape != (w.shape[2],):
            raise ValueError(f"windows must be [windows, sources, E] and history [E]; got {w.shape} and {h.shape}")
        if w.size and w.min() < 0:
            raise ValueError("windows must hold non-negative counts")
        for a in (w, h):
            a.setflags(write=False)
        object.__setattr__(self, "windows", w)
        object.__setattr__(self, "history", h)

    @property
    def num_windows(self) -> int:
        return int(self.windows.shape[0])

    @property
    def num_sources(self) -> int:
        return int(self.windows.shape[1])

    @property
    def num_experts(self) -> int:
        return int(self.windows.shape[2])

    def totals(self) -> np.ndarray:
        """``[nw, E]`` tokens per expert in each window."""
        return self.windows.sum(axis=1)

    def scaled(self, factor: float, seed: int = 0) -> Stream:
        """The stream with every window's counts scaled by ``factor`` (:func:`scale_counts`); history unchanged."""
        if factor == 1.0:
            return self
        rng = np.random.default_rng([seed, int(round(factor * 1e6))])
        return Stream(f"{self.label}×{factor:g}", scale_counts(self.windows, factor, rng), self.history, self.top_k)


def scale_counts(counts: np.ndarray, factor: float, rng: np.random.Generator) -> np.ndarray:
    """Integer counts scaled by ``factor`` without bias: ``⌊f⌋·c + Binomial(c, f − ⌊f⌋)`` (token thinning).

    Args:
      counts: non-negative integer counts, any shape.
      factor: scale ``> 0`` (0.25 = keep each token with probability 1/4; 4 = every token four times).
      rng: the generator of the thinning draws.
    """
    if not factor > 0:
        raise ValueError(f"scale factor must be > 0, got {factor}")
    c = np.asarray(counts, dtype=np.int64)
    whole = math.floor(factor)
    frac = factor - whole
    out = c * whole
    if frac > 0:
        out = out + rng.binomial(c, frac)
    return out.astype(np.int64)


def trace_streams(trace, tokens_per_step: int, num_ranks: int = 8, *, min_windows: int = 1) -> list[Stream]:
    """One :class:`Stream` per layer of a recording: consecutive batches of ``tokens_per_step`` tokens.

    Args:
      trace: a `tempo_jax.workloads.RoutingTrace`.
      tokens_per_step: B tokens per step; each of the ``num_ranks`` sources gets ``B // num_ranks`` tokens.
      num_ranks: G source ranks.
      min_windows: layers with fewer whole windows are left out.

    Returns:
      Streams labelled ``"<trace>/L<layer>"``, history = the layer's whole recording (``expert_load``).
    """
    per_rank = tokens_per_step // num_ranks
    if per_rank < 1:
        raise ValueError(f"tokens_per_step={tokens_per_step} gives no token per rank on {num_ranks} ranks")
    out = []
    for layer in trace.layers:
        if trace.num_batches(layer, per_rank, num_ranks) < min_windows:
            continue
        windows = np.stack(list(trace.batches(layer, per_rank, num_ranks)))
        out.append(Stream(f"{trace.name}/L{layer}", windows, trace.expert_load(layer), trace.top_k))
    return out


@dataclass(frozen=True, kw_only=True)
class SyntheticStreams:
    """Synthetic drifting-Zipf streams (see the module docstring); defaults: the proxy (DSv2-Lite) shape.

    Attributes:
      num_experts, top_k: E and K (64, 6: DSv2-Lite, the paper's proxy).
      skew: Zipf exponent s of the popularity at window 0 (1.2: the paper's representative skew).
      kappa: Dirichlet concentration κ of batch-to-batch fluctuation.
      drift_sigma: stationary standard deviation of each expert's log-popularity drift.
      drift_rho: AR(1) coefficient of the drift per window (correlation time 1/(1 − ρ) windows).
      streams: independent streams (seeds ``seed .. seed + streams − 1``).
      windows: windows per stream.
      seed: base seed.
    """

    num_experts: int = 64
    top_k: int = 6
    skew: float = 1.2
    kappa: float = 2000.0
    drift_sigma: float = 0.3
    drift_rho: float = 0.95
    streams: int = 4
    windows: int = 64
    seed: int = 0

    def __post_init__(self) -> None:
        plain_scalars(self)
        if not (0 <= self.drift_rho <= 1 and self.drift_sigma >= 0 and self.kappa > 0):
            raise ValueError("need 0 ≤ drift_rho ≤ 1, drift_sigma ≥ 0 and kappa > 0")
        if self.streams < 1 or self.windows < 1 or self.top_k > self.num_experts:
            raise ValueError("need streams ≥ 1, windows ≥ 1 and top_k ≤ num_experts")


def synthetic_stream(spec: SyntheticStreams, tokens_per_step: int, num_ranks: int = 8, index: int = 0) -> Stream:
    """Stream ``index`` of ``spec`` at B = ``tokens_per_step`` tokens per step on ``num_ranks`` sources.

    Window t: popularity ``p_t ∝ p_0·exp(z_t)`` with ``z_t = ρ·z_{t−1} + √(1−ρ²)·σ·ε_t`` (z_0 = 0), batch
    popularity ``q_t ~ Dirichlet(κ·p_t)``, then ``B`` tokens × K distinct experts ∝ q_t, dealt to the
    sources in contiguous chunks of ``B // num_ranks``. History = the counts of a recording of
    :data:`HISTORY_TOKENS` tokens drawn from ``p_0`` (so a hot expert's load is capped by top-K sampling without
    replacement as in real routing). The same seed gives the same popularity path at every B.
    """
    per_rank = tokens_per_step // num_ranks
    if per_rank < 1:
        raise ValueError(f"tokens_per_step={tokens_per_step} gives no token per rank on {num_ranks} ranks")
    E, K, seed = spec.num_experts, spec.top_k, spec.seed + index
    p0 = zipf_popularity(E, spec.skew, seed)
    # Step 1: the popularity path (independent of B).
    walk = np.random.default_rng([seed, 1])
    z = np.zeros(E)
    out = np.empty((spec.windows, num_ranks, E), np.int64)
    for t in range(spec.windows):
        if t:
            z = spec.drift_rho * z + math.sqrt(1 - spec.drift_rho**2) * spec.drift_sigma * walk.standard_normal(E)
        p = p0 * np.exp(z)
        p /= p.sum()
        # Step 2: one batch of this window.
        rng = np.random.default_rng([seed, 2, tokens_per_step, t])
        q = rng.dirichlet(spec.kappa * p) if math.isfinite(spec.kappa) else p
        q = np.maximum(q, 1e-300)
        ids = sample_topk(q, per_rank * num_ranks, K, rng).reshape(num_ranks, per_rank * K)
        flat = (np.arange(num_ranks)[:, None] * E + ids).ravel()
        out[t] = np.bincount(flat, minlength=num_ranks * E).reshape(num_ranks, E)
    # Step 3: the recording a placement is built from: HISTORY_TOKENS tokens drawn from p_0 (no drift).
    rec = sample_topk(p0, HISTORY_TOKENS, K, np.random.default_rng([seed, 3]))
    history = np.bincount(rec.ravel(), minlength=E).astype(np.float64)
    return Stream(f"zipf{spec.skew:g}#{index}", out, history, K)


@lru_cache(maxsize=8)
def _trace(name: str):
    try:
        return load_trace(name)
    except FileNotFoundError:  # offline: the bundled copy holds the same ids
        return load_sample(name)


@lru_cache(maxsize=64)
def make_streams(
    source: str,
    tokens_per_step: int,
    num_ranks: int = 8,
    synthetic: SyntheticStreams = SyntheticStreams(),  # noqa: B008 (frozen, hashable)
    max_windows: int | None = None,
    min_windows: int = 1,
) -> tuple[Stream, ...]:
    """Streams of a named source at B tokens per step (cached per process).

    Args:
      source: a trace name of `tempo_jax.workloads.TRACES` (recorded; bundled sample when offline) or
        ``"synthetic"`` (``synthetic`` gives the parameters).
      tokens_per_step: B.
      num_ranks: G.
      synthetic: parameters of the synthetic streams.
      max_windows: keep at most this many windows per stream (None = all).
      min_windows: drop streams with fewer windows.
    """
    if source == "synthetic":
        streams = [synthetic_stream(synthetic, tokens_per_step, num_ranks, i) for i in range(synthetic.streams)]
    else:
        streams = trace_streams(_trace(source), tokens_per_step, num_ranks, min_windows=min_windows)
    if max_windows is not None:
        streams = [dataclasses.replace(s, windows=s.windows[:max_windows]) for s in streams]
    return tuple(s for s in streams if s.num_windows >= min_windows)


# ------------------------------------------------------------------------------------------------ placement
def replay_placement(
    load,
    *,
    num_gpus: int = 8,
    redundant: int = 64,
    drift: int = 0,
    seed: int = 0,
    num_groups: int = 1,
    num_nodes: int = 1,
) -> Placement:
    """EPLB placement of ``E + redundant`` slots from a (drift-corrupted) long-run load.

    Args:
      load: ``[E]`` long-run per-expert load (the recording).
      num_gpus: G.
      redundant: Ex redundant slots (the paper's R = 16/64); E + Ex must be a multiple of the GPUs.
      drift: K of the drift-K corruption (`solvers.drift_corrupt`): the top-K hot experts' loads are swapped
        with K random cold ones before EPLB sees them (0 = fresh placement).
      seed: seed of the corruption's cold partners.
      num_groups, num_nodes: hierarchical EPLB (1, 1 = global).
    """
    load = np.asarray(load, dtype=np.float64)
    slots = load.shape[0] + redundant
    if redundant < 0 or slots % num_gpus:
        raise ValueError(f"E + redundant = {slots} slots must be a non-negative multiple of num_gpus = {num_gpus}")
    if drift:
        load = drift_corrupt(load, drift, seed)
    return Placement.from_eplb(load, slots, num_gpus, num_groups=num_groups, num_nodes=num_nodes)


def apply_split(x_stale, n_true, placement: Placement) -> np.ndarray:
    """Apply the per-expert split fractions of a stale dispatch to the true current counts.

    Args:
      x_stale: ``[E, G]`` dispatch solved on other (stale) counts for ``placement`` (or a `Dispatch`).
      n_true: ``[E]`` true tokens per expert (or ``[S, E]`` per source; summed).
      placement: the placement both live on.

    Returns:
      ``x [E, G]``: ``n_e · x_stale[e, g] / Σ_g x_stale[e, g]``, or ``n_e`` spread over e's replicas as the
      uniform policy does when the stale dispatch holds no token of e. Rows sum to ``n_true``; zero off
      the replica mask.
    """
    # The one plan → table conversion and back (`solvers.plan_weights`, `solvers.expected_dispatch`): what the
    # stale plan's tables would do with the true counts.
    n = np.asarray(n_true, dtype=np.float64)
    n = n.sum(axis=0) if n.ndim == 2 else n
    if n.shape != (placement.num_experts,):
        raise ValueError(f"apply_split: n_true must be [E] = [{placement.num_experts}] (or [S, E]), got {n.shape}")
    return expected_dispatch(plan_weights(getattr(x_stale, "x", x_stale), placement), n, placement)
