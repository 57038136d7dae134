"""Routing streams for serving loops: the expert ids of step s, reproducibly, and the long-run load.

- `drifting_stream`: synthetic, drifting Zipf popularity — the log popularity follows an AR(1) walk (one step per
  serving step), each step's batch draws Dirichlet noise around it, and every token picks top-K experts without
  replacement.
- `recorded_stream`: a recorded routing trace replayed batch by batch, layer by layer, cycled.

Both return a `RoutingStream` whose ``ids(step)`` is ``[T, K]`` int32 (T = tokens of one step over all ranks;
rank d serves rows ``[d·B, (d+1)·B)``) and whose ``load [E]`` is what a placement is built from.

Glossary additions: B tokens per rank."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from .loaders import load_sample, load_trace
from .synthetic import sample_topk, zipf_popularity

__all__ = ["RoutingStream", "drifting_stream", "recorded_stream"]


class RoutingStream(NamedTuple):
    """``num_experts`` E, ``top_k`` K, ``ids(step) -> [T, K]`` int32 expert ids, ``load [E]`` long-run load."""

    num_experts: int
    top_k: int
    ids: Callable[[int], np.ndarray]
    load: np.ndarray


def drifting_stream(
    *, experts: int, top_k: int, skew: float, drift: float, kappa: float, tokens_per_step: int, seed: int
) -> RoutingStream:
    """Zipf(``skew``) popularity over E experts whose log follows ``0.98·prev + drift·N(0, 1)`` per step; each step
    draws its batch mix from Dirichlet(``kappa``·p) (``kappa = inf``: p itself); ``ids`` is reproducible per step."""
    p0 = zipf_popularity(experts, skew, seed)
    walk = np.random.default_rng([seed, 1])
    path = [np.zeros(experts)]

    def ids(step: int) -> np.ndarray:
        while len(path) <= step:  # the log-popularity walk, one step per serving step
            path.append(0.98 * path[-1] + drift * walk.standard_normal(experts))
        p = p0 * np.exp(path[step])
        p /= p.sum()
        rng = np.random.default_rng([seed, 2, step])
        q = np.maximum(rng.dirichlet(kappa * p), 1e-300) if math.isfinite(kappa) else p
        return sample_topk(q, tokens_per_step, top_k, rng).astype(np.int32)

    return RoutingStream(experts, top_k, ids, p0 * tokens_per_step * top_k)


def recorded_stream(trace: str, *, tokens_per_rank: int, num_ranks: int) -> RoutingStream:
    """Batches of ``tokens_per_rank × num_ranks`` tokens of a recorded trace (the bundled copy when the recording
    is not on disk), every layer's batches in turn, cycled; ``load`` is the first layer's expert load.

    Raises:
      ValueError: the trace has no batch of that many tokens.
    """
    try:
        rec = load_trace(trace)
    except FileNotFoundError:  # offline: the bundled copy holds the same ids
        rec = load_sample(trace)
    batches = [(layer, b) for layer in rec.layers for b in range(rec.num_batches(layer, tokens_per_rank, num_ranks))]
    if not batches:
        raise ValueError(f"trace {trace!r} has no batch of {tokens_per_rank * num_ranks} tokens; lower tokens_per_rank")
    T = tokens_per_rank * num_ranks

    def ids(step: int) -> np.ndarray:
        layer, b = batches[step % len(batches)]
        return rec.batch_topk_ids(layer, tokens_per_rank, num_ranks, b).reshape(T, -1).astype(np.int32)

    return RoutingStream(rec.num_experts, rec.top_k, ids, rec.expert_load(rec.layers[0]).astype(np.float64))
