"""Routing workloads (numpy only, no jax): real recordings, synthetic Zipf routing, regimes.

Argument checks come from `solvers.checks` (numpy only); nothing else of `solvers` is used here.
Glossary additions: batch sizes are tokens per rank (``tokens_per_rank``).

- :class:`RoutingTrace` — one representation for every recording: per-token ``topk_ids[layer] [T, K]`` or
  per-rank ``rank_counts[layer] [I, Gs, E]``; ``batch_counts(layer, tokens_per_rank, D, batch) -> [D, E]``.
- Loaders: :func:`load_flame_moe`, :func:`load_mixtral`, :func:`load_harmoeny`, :func:`load_switch128`,
  :func:`load_trace` over the :data:`TRACES` registry, and :func:`load_sample` (bundled copy, works offline).
- Synthetic: :func:`zipf_popularity`, :class:`SyntheticRouting` (``batch(tokens_per_rank, D, step) -> [D, E]``),
  :func:`sample_topk`, and the pair shares it realises (:func:`topk_inclusion`, :func:`pair_share`).
- Serving streams: :func:`drifting_stream` (drifting Zipf), :func:`recorded_stream` (a recording replayed),
  both a :class:`RoutingStream` (``ids(step) -> [T, K]``, long-run ``load [E]``).
- Trace files: :func:`save_traces`, :func:`load_saved_trace` (``.npz``; also used for recorded traces).
- Regimes: :func:`regime_stats` -> :class:`RegimeStats`, :func:`mixed_fraction`.
- Request traces (prefill serving, CascadeEP): :class:`RequestTrace` (arrivals [n] s, input/output lengths [n]
  tokens, CSR prefix-block ids), :func:`load_mooncake`, :func:`load_mooncake_sample` (bundled, offline),
  :func:`synthetic_requests`, the :data:`REQUEST_TRACES` registry and :func:`load_request_trace`.
"""

from . import requests as _requests
from .io import load_array, load_saved_trace, save_traces, saved_trace_names
from .loaders import (
    TRACES,
    TRACES_ENV,
    TraceSpec,
    build_sample,
    load_flame_moe,
    load_harmoeny,
    load_mixtral,
    load_sample,
    load_switch128,
    load_trace,
    traces_dir,
)
from .regime import RegimeStats, mixed_fraction, regime_stats
from .requests import *  # noqa: F403  (request traces: requests.__all__)
from .stream import RoutingStream, drifting_stream, recorded_stream
from .synthetic import (
    MAX_SAMPLED_PAIRS,
    SyntheticRouting,
    check_sampled_pairs,
    pair_share,
    sample_topk,
    topk_inclusion,
    zipf_popularity,
)
from .trace import RoutingTrace

__all__ = [
    "TRACES",
    "TRACES_ENV",
    "RegimeStats",
    "RoutingStream",
    "RoutingTrace",
    "MAX_SAMPLED_PAIRS",
    "SyntheticRouting",
    "check_sampled_pairs",
    "TraceSpec",
    "build_sample",
    "load_array",
    "drifting_stream",
    "load_flame_moe",
    "load_harmoeny",
    "load_mixtral",
    "load_sample",
    "load_saved_trace",
    "save_traces",
    "saved_trace_names",
    "load_switch128",
    "load_trace",
    "recorded_stream",
    "mixed_fraction",
    "regime_stats",
    "pair_share",
    "sample_topk",
    "topk_inclusion",
    "traces_dir",
    "zipf_popularity",
    *_requests.__all__,
]
