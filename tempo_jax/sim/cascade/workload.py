"""What a CascadeEP run serves: the request trace (`trace_file`, `cascade_trace`, `trace_digest`) and the workload
each seed draws (`workload_draw`)."""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

import numpy as np

from tempo_jax.workloads import RequestTrace
from tempo_jax.workloads.requests import load_mooncake, load_request_trace, synthetic_requests

from .config import CascadeConfig

__all__ = ["cascade_trace", "trace_digest", "trace_file", "workload_draw"]


# ------------------------------------------------------------------------------------------------ routing
def workload_draw(
    seed: int, *, num_requests: int, recorded_layers: int, layers: int, experts: int, window: int | None = None
) -> dict:
    """The workload seed ``seed`` ≥ 1 draws (`CascadeConfig.vary_workload`; each part from its own stream):
    ``{"start": first request of the trace window (`RequestTrace.rotate`), "layer_shift": model layer l replays
    recorded layer (l + shift) mod ``recorded_layers``, "expert_perm": [layers, experts] expert ids per layer (another
    layout of the experts over the ranks)}``; seed 0 draws the identity (start 0, shift 0, ``expert_perm`` None).

    With ``window`` (the requests a run serves) seed k's window starts at k · window (mod ``num_requests``): seeds
    0 … ⌊num_requests / window⌋ − 1 serve disjoint windows, so no request is in two of them (later seeds wrap around
    and share requests with earlier ones); without it the start is drawn uniformly."""
    if seed == 0:
        return {"start": 0, "layer_shift": 0, "expert_perm": None}
    if window:
        start = (seed * int(window)) % num_requests if num_requests else 0
    else:
        start = int(np.random.default_rng([seed, 1]).integers(num_requests)) if num_requests else 0
    shift = int(np.random.default_rng([seed, 2]).integers(max(recorded_layers, 1)))
    perm = np.random.default_rng([seed, 3]).permuted(np.tile(np.arange(experts), (layers, 1)), axis=1)
    return {"start": start, "layer_shift": shift, "expert_perm": perm}


# ------------------------------------------------------------------------------------------------ runs
def trace_file(config: CascadeConfig) -> Path | None:
    """The JSON-lines file ``config.trace`` reads (None for ``"synthetic"``).

    Raises ``FileNotFoundError`` saying where to put the full Mooncake trace (``trace="mooncake"``) when it is
    missing: a missing trace is an error, never a silent fallback to the bundled sample.
    """
    from tempo_jax.workloads.requests import MOONCAKE_SAMPLE_PATH, resolve_mooncake

    if config.trace == "synthetic":
        return None
    if config.trace == "mooncake_sample":
        return MOONCAKE_SAMPLE_PATH
    if config.trace == "mooncake":
        try:
            return resolve_mooncake(None)
        except FileNotFoundError as err:
            raise FileNotFoundError(f"{err} Or run on the bundled sample: trace='mooncake_sample'.") from None
    return Path(config.trace).expanduser()


def trace_digest(config: CascadeConfig) -> str:
    """sha256 (16 hex) of the trace file's bytes (``"synthetic"``: its generator's name): part of the cache key."""
    f = trace_file(config)
    if f is None:
        return "synthetic"
    h = hashlib.sha256()
    with open(f, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


@lru_cache(maxsize=4)
def _load_jsonl(path: str, limit: int | None, name: str, mtime_ns: int, size: int) -> RequestTrace:
    """`load_mooncake` of the first ``limit`` lines, kept per process (keyed by the file's mtime and size too)."""
    del mtime_ns, size
    return load_mooncake(path, limit=limit, name=name)


def cascade_trace(config: CascadeConfig) -> RequestTrace:
    """The request trace a config serves: loaded (errors name the file and line), cut to ``max_requests``,
    rate-scaled."""
    if config.trace == "synthetic":
        trace = synthetic_requests(config.synthetic_requests, rate_rps=config.synthetic_rate_rps, seed=config.seed)
    elif config.trace == "mooncake_sample":
        trace = load_request_trace("mooncake_conversation", sample=True)
    else:
        f = trace_file(config)
        name = "mooncake_conversation" if config.trace == "mooncake" else Path(config.trace).stem
        stat = f.stat()
        limit = None if config.vary_workload and config.seed else config.max_requests  # a window needs them all
        trace = _load_jsonl(str(f), limit, name, stat.st_mtime_ns, stat.st_size)
    if config.trace != "synthetic" and config.vary_workload and config.seed:  # the seed's window of the trace
        draw = workload_draw(
            config.seed, num_requests=len(trace), recorded_layers=0, layers=0, experts=0, window=config.max_requests
        )
        start = draw["start"]
        trace = trace.rotate(start)
    if config.max_requests is not None:
        trace = trace.head(min(config.max_requests, len(trace)))
    if config.rate_rps is not None:
        if trace.duration_s <= 0:
            raise ValueError(
                f"CascadeConfig.rate_rps={config.rate_rps:g}: the {len(trace)} request(s) served of {trace.name} all "
                "arrive at the same instant, so there are no inter-arrival times to scale; set rate_rps=None to serve "
                "them as one burst, or serve more requests (max_requests) whose arrivals span time"
            )
        trace = trace.scale_rate(config.rate_rps)
    return trace
