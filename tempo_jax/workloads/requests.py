"""Request traces for prefill serving studies (CascadeEP §4.1, App. B): arrivals, input lengths, prefix blocks.

numpy only (no jax, no solvers). Glossary additions: n requests, nnz prefix blocks over all requests; times in
seconds, lengths in tokens.

- :class:`RequestTrace` — ``arrival_s [n]`` float64 s, ``input_len [n]`` / ``output_len [n]`` int64 tokens,
  prefix-block hashes in CSR form (``block_offsets [n+1]``, ``block_ids [nnz]``), ``block_size`` tokens per
  block. Request i's input is covered by ``ceil(input_len[i] / block_size)`` blocks (the last one may be
  partial); identical block ids mean reusable prefix KV (the ids are prefix-chained, so block k equal implies
  blocks 0..k equal in the recording).
- :func:`load_mooncake` — the Mooncake FAST'25 conversation trace (``<traces>/mooncake/conversation_trace.jsonl``),
  :func:`load_mooncake_sample` — its first 400 lines bundled as ``tempo_jax/data/mooncake_sample.jsonl``
  (byte-for-byte; :func:`build_mooncake_sample` rewrites it).
- :func:`synthetic_requests` — Poisson arrivals, lognormal input lengths, shared system-prompt families.
- :data:`REQUEST_TRACES` — the request-trace registry, kept apart from the routing :data:`~.loaders.TRACES`:
  that registry's loaders return :class:`~.trace.RoutingTrace` and :func:`~.loaders.build_sample` writes every
  entry into the routing ``.npz`` sample, neither of which fits a request trace.

Mooncake file format (checked on the whole released file, 12,031 lines): one JSON object per line with
``timestamp`` (integer ms, non-decreasing, first 0; within ±2^53 here), ``input_length``, ``output_length``
(integers >= 1; here output 0 is allowed and both are at most 2^31 − 1) and
``hash_ids`` (list of ints, ``len == ceil(input_length / 512)`` on every line, no repeats inside a line; every
request starts with block 0, a 512-token shared system prompt). The loader enforces all of it except the
first timestamp being 0 (times are taken relative to the first request) and ignores extra keys. Blank lines
are skipped. Any violation raises ``ValueError("<file>:<line>: ...")`` with the 1-based line number.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import numpy as np

from solvers.checks import EXACT_INT_LIMIT, check_input_file, check_int, check_real

from .loaders import resolve_trace_path

__all__ = [
    "BLOCK_SIZE",
    "MOONCAKE_RELPATH",
    "REQUEST_TRACES",
    "RequestTrace",
    "RequestTraceSpec",
    "build_mooncake_sample",
    "load_mooncake",
    "load_mooncake_sample",
    "load_request_trace",
    "resolve_mooncake",
    "synthetic_requests",
]

BLOCK_SIZE = 512  # tokens per prefix block (Mooncake hash_ids granularity)
MAX_TOKENS = 2**31 - 1  # input / output lengths a line may give (a request longer than any model's context)
MOONCAKE_RELPATH = "mooncake/conversation_trace.jsonl"
MOONCAKE_SAMPLE_PATH = Path(__file__).resolve().parents[1] / "data" / "mooncake_sample.jsonl"
MOONCAKE_SAMPLE_LINES = 400
_REQUIRED_KEYS = ("timestamp", "input_length", "output_length", "hash_ids")


def _frozen(a: np.ndarray, dtype: type) -> np.ndarray:
    out = np.array(a, dtype=dtype, copy=True)
    out.setflags(write=False)
    return out


@dataclass(frozen=True, kw_only=True, eq=False)
class RequestTrace:
    """``n`` requests in arrival order (arrays are copied and made read-only).

    Attributes:
        arrival_s: float64 ``[n]`` arrival times in seconds, non-decreasing (loaders: seconds from the first
            request; :meth:`slice` / :meth:`window` keep the original clock).
        input_len: int64 ``[n]`` prompt tokens, each ``>= 1``.
        output_len: int64 ``[n]`` output tokens, each ``>= 0`` (not used by prefill simulations).
        block_offsets: int64 ``[n+1]``, ``block_offsets[0] == 0``; request i's blocks are
            ``block_ids[block_offsets[i]:block_offsets[i+1]]``, ``ceil(input_len[i] / block_size)`` of them.
        block_ids: int64 ``[nnz]`` prefix-block hashes (equal ids = reusable KV of the same prefix).
        block_size: tokens per block (512 for Mooncake).
        name, source: labels.
    """

    arrival_s: np.ndarray
    input_len: np.ndarray
    output_len: np.ndarray
    block_offsets: np.ndarray
    block_ids: np.ndarray
    block_size: int = BLOCK_SIZE
    name: str = "requests"
    source: str = ""

    def __post_init__(self) -> None:
        # Step 1: copy to the canonical dtypes, read-only.
        for name, dtype in (
            ("arrival_s", np.float64),
            ("input_len", np.int64),
            ("output_len", np.int64),
            ("block_offsets", np.int64),
            ("block_ids", np.int64),
        ):
            src = np.asarray(getattr(self, name))
            if dtype is np.int64 and src.size and not np.issubdtype(src.dtype, np.integer):
                raise ValueError(f"RequestTrace.{name} must hold integers, got dtype {src.dtype}")
            if src.ndim != 1:
                raise ValueError(f"RequestTrace.{name} must be 1-D, got shape {src.shape}")
            object.__setattr__(self, name, _frozen(src, dtype))
        object.__setattr__(self, "block_size", check_int("block_size", self.block_size))
        # Step 2: shapes and value ranges.
        n = self.arrival_s.size
        if self.input_len.size != n or self.output_len.size != n or self.block_offsets.size != n + 1:
            raise ValueError(
                f"RequestTrace: arrival_s [{n}], input_len [{self.input_len.size}], output_len "
                f"[{self.output_len.size}] and block_offsets [{self.block_offsets.size}] must be [n], [n], [n], [n+1]"
            )
        if not np.all(np.isfinite(self.arrival_s)) or np.any(np.diff(self.arrival_s) < 0):
            raise ValueError("RequestTrace.arrival_s must be finite and non-decreasing")
        if n and self.input_len.min() < 1:
            raise ValueError(f"RequestTrace.input_len must be >= 1 (min {self.input_len.min()})")
        if n and self.output_len.min() < 0:
            raise ValueError(f"RequestTrace.output_len must be >= 0 (min {self.output_len.min()})")
        # Step 3: CSR consistency: ceil(I / block_size) blocks per request.
        counts = np.diff(self.block_offsets)
        want = -(-self.input_len // self.block_size)
        if self.block_offsets[0] != 0 or self.block_offsets[-1] != self.block_ids.size or np.any(counts != want):
            bad = np.flatnonzero(counts != want)
            raise ValueError(
                "RequestTrace: block_offsets must start at 0, end at len(block_ids) and give each request "
                f"ceil(input_len / {self.block_size}) blocks"
                + (f" (request {bad[0]} has {counts[bad[0]]}, needs {want[bad[0]]})" if bad.size else "")
            )
        # Step 4: no block repeats inside a request (the prefix cache would hit more than was ever computed).
        req = np.repeat(np.arange(n), counts)
        order = np.lexsort((self.block_ids, req))
        r, b = req[order], self.block_ids[order]
        dup = np.flatnonzero((r[1:] == r[:-1]) & (b[1:] == b[:-1]))
        if dup.size:
            raise ValueError(
                f"RequestTrace: request {r[dup[0]]} repeats prefix block {b[dup[0]]}; each block of a "
                "prompt is a distinct prefix block"
            )

    # ------------------------------------------------------------------------------------------- access
    def __len__(self) -> int:
        return int(self.arrival_s.size)

    @property
    def num_blocks(self) -> np.ndarray:
        """int64 ``[n]`` prefix blocks per request (``ceil(input_len / block_size)``)."""
        return np.diff(self.block_offsets)

    def blocks(self, i: int) -> np.ndarray:
        """int64 ``[ceil(input_len[i] / block_size)]`` prefix-block ids of request ``i`` (a read-only view)."""
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"request {i} out of range for a trace of {n} requests")
        i %= n
        return self.block_ids[self.block_offsets[i] : self.block_offsets[i + 1]]

    @property
    def total_input_tokens(self) -> int:
        return int(self.input_len.sum())

    @property
    def duration_s(self) -> float:
        """Seconds from the first to the last arrival (0 for fewer than 2 requests)."""
        return float(self.arrival_s[-1] - self.arrival_s[0]) if len(self) else 0.0

    @property
    def rate_rps(self) -> float:
        """Mean arrival rate in requests/s: ``(n - 1) / (last arrival - first arrival)`` = 1 / mean inter-arrival.

        Raises ``ValueError`` when undefined (fewer than 2 requests, or all at the same instant).
        """
        if len(self) < 2 or self.duration_s <= 0:
            raise ValueError(
                f"{self.name}: arrival rate undefined for {len(self)} requests spanning {self.duration_s} s"
            )
        return (len(self) - 1) / self.duration_s

    # ------------------------------------------------------------------------------------- sub-traces
    def slice(self, start: int | None = None, stop: int | None = None) -> RequestTrace:
        """Requests ``[start, stop)`` (Python slice semantics, step 1), arrival times unchanged."""
        lo, hi, _ = slice(start, stop).indices(len(self))
        hi = max(hi, lo)
        off = self.block_offsets[lo : hi + 1]
        return RequestTrace(
            arrival_s=self.arrival_s[lo:hi],
            input_len=self.input_len[lo:hi],
            output_len=self.output_len[lo:hi],
            block_offsets=off - off[0],
            block_ids=self.block_ids[off[0] : off[-1]],
            block_size=self.block_size,
            name=self.name,
            source=self.source,
        )

    def head(self, n: int) -> RequestTrace:
        """The first ``n`` requests."""
        return self.slice(0, check_int("n", n, minimum=0))

    def rotate(self, start: int) -> RequestTrace:
        """The same requests from request ``start`` on, wrapping around (a window of the trace read as a cycle):
        arrivals re-based to 0, the wrapped part following the last request after the trace's mean inter-arrival
        gap, every other gap unchanged. ``start`` is taken modulo the length; 0 returns the trace itself."""
        n = len(self)
        start = check_int("start", start, minimum=0) % max(n, 1)
        if start == 0:
            return self
        a, b = self.slice(start), self.slice(0, start)
        gap = self.duration_s / (n - 1)
        ta = a.arrival_s - a.arrival_s[0]
        tb = b.arrival_s - b.arrival_s[0] + ta[-1] + gap
        return RequestTrace(
            arrival_s=np.concatenate([ta, tb]),
            input_len=np.concatenate([a.input_len, b.input_len]),
            output_len=np.concatenate([a.output_len, b.output_len]),
            block_offsets=np.concatenate([a.block_offsets, b.block_offsets[1:] + a.block_offsets[-1]]),
            block_ids=np.concatenate([a.block_ids, b.block_ids]),
            block_size=self.block_size,
            name=f"{self.name}@{start}",
            source=self.source,
        )

    def window(self, t0_s: float, t1_s: float) -> RequestTrace:
        """Requests arriving in ``[t0_s, t1_s)`` seconds, arrival times unchanged."""
        t0 = check_real("t0_s", t0_s, allow_inf=True)
        t1 = check_real("t1_s", t1_s, allow_inf=True)
        if t1 < t0:
            raise ValueError(f"window: t1_s={t1} < t0_s={t0}")
        lo, hi = np.searchsorted(self.arrival_s, [t0, t1], side="left")
        return self.slice(int(lo), int(hi))

    def scale_rate(self, target_rps: float) -> RequestTrace:
        """The same requests with every inter-arrival time multiplied by ``rate_rps / target_rps`` (CascadeEP §4.1:
        "we scale the original inter-arrival times to match the target request rate").

        The first arrival stays put; the new trace's :attr:`rate_rps` equals ``target_rps`` (up to rounding).
        """
        target = check_real("target_rps", target_rps, minimum=0.0, strict=True)
        factor = self.rate_rps / target
        t0 = self.arrival_s[0]
        arrival = t0 + (self.arrival_s - t0) * factor
        return RequestTrace(
            arrival_s=arrival,
            input_len=self.input_len,
            output_len=self.output_len,
            block_offsets=self.block_offsets,
            block_ids=self.block_ids,
            block_size=self.block_size,
            name=f"{self.name}@{target:g}rps",
            source=self.source,
        )


# ------------------------------------------------------------------------------------------- Mooncake
def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _parse_line(raw: bytes, where: str) -> tuple[float, int, int, list[int]]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{where}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    try:
        rec = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{where}: not JSON ({err.msg} at column {err.colno})") from None
    if not isinstance(rec, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    missing = [k for k in _REQUIRED_KEYS if k not in rec]
    if missing:
        raise ValueError(f"{where}: missing key(s) {missing} (a request needs {list(_REQUIRED_KEYS)})")
    ts, ilen, olen, ids = (rec[k] for k in _REQUIRED_KEYS)
    # JSON integers are unbounded: every number is bounded before it meets a float or an int64.
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not -EXACT_INT_LIMIT <= ts <= EXACT_INT_LIMIT:
        raise ValueError(f"{where}: timestamp must be a finite number of ms within ±2^53, got {str(ts)[:40]}")
    for key, value, low in (("input_length", ilen, 1), ("output_length", olen, 0)):
        if not _is_int(value) or not low <= value <= MAX_TOKENS:
            raise ValueError(f"{where}: {key} must be an integer in [{low}, {MAX_TOKENS:,}], got {str(value)[:40]}")
    if not isinstance(ids, list) or not all(_is_int(h) for h in ids):
        raise ValueError(f"{where}: hash_ids must be a list of integers, got {str(ids)[:60]}")
    if any(not -(2**63) <= h < 2**63 for h in ids):
        raise ValueError(f"{where}: hash_ids must fit in int64")
    want = -(-ilen // BLOCK_SIZE)
    if len(ids) != want:
        raise ValueError(
            f"{where}: {len(ids)} hash_ids for input_length {ilen}; expected ceil({ilen}/{BLOCK_SIZE}) = {want}"
        )
    if len(set(ids)) != len(ids):
        seen: set[int] = set()
        dup = next(h for h in ids if h in seen or seen.add(h))
        raise ValueError(
            f"{where}: hash_id {dup} repeats inside one request; each block of a prompt is a "
            "distinct prefix block (a repeat lets the cache hit more than was computed)"
        )
    return float(ts), ilen, olen, ids


def resolve_mooncake(path: str | os.PathLike | None = None) -> Path:
    """The Mooncake conversation trace's file: ``path`` (the ``.jsonl`` or its folder) or the default under the traces
    root; ``FileNotFoundError`` says where to put it (`load_mooncake_sample` works without it)."""
    return resolve_trace_path(
        path,
        MOONCAKE_RELPATH,
        "Mooncake trace",
        holding="mooncake/",
        fallback="load_mooncake_sample() works without it.",
        in_folder=True,
    )


def load_mooncake(
    path: str | os.PathLike | None = None, *, limit: int | None = None, name: str = "mooncake_conversation"
) -> RequestTrace:
    """The Mooncake FAST'25 conversation trace as a :class:`RequestTrace` (12,031 requests, mean input 12,035 tokens).

    Args:
        path: the ``.jsonl`` file or its folder (default ``<traces>/mooncake/conversation_trace.jsonl``, traces root
            from ``$TEMPO_JAX_TRACES`` or ``<repo>/../shared/traces``).
        limit: read only the first ``limit`` requests (blank lines do not count).
        name: label of the returned trace.

    ``arrival_s`` = (timestamp − first timestamp) / 1000. Raises ``ValueError("<file>:<line>: ...")`` on a bad line
    (see the module docstring for what is checked) and ``FileNotFoundError`` naming the expected path.
    """
    file = check_input_file(resolve_mooncake(path), "Mooncake trace")  # devices and huge files refused
    if limit is not None:
        limit = check_int("limit", limit, minimum=1)
    ts: list[float] = []
    ilens: list[int] = []
    olens: list[int] = []
    counts: list[int] = [0]
    ids: list[int] = []
    # Step 1: parse line by line (binary, so a bad encoding is reported with its line).
    with open(file, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            if limit is not None and len(ts) >= limit:
                break
            if not raw.strip():
                continue
            where = f"{file}:{lineno}"
            t, ilen, olen, hashes = _parse_line(raw, where)
            if ts and t < ts[-1]:
                raise ValueError(f"{where}: timestamp {t:g} ms goes backwards (previous request at {ts[-1]:g} ms)")
            ts.append(t)
            ilens.append(ilen)
            olens.append(olen)
            counts.append(len(hashes))
            ids.extend(hashes)
    if not ts:
        raise ValueError(f"{file}: no requests")
    # Step 2: arrays (times in seconds from the first request).
    t_ms = np.asarray(ts, dtype=np.float64)
    return RequestTrace(
        arrival_s=(t_ms - t_ms[0]) / 1000.0,
        input_len=np.asarray(ilens, dtype=np.int64),
        output_len=np.asarray(olens, dtype=np.int64),
        block_offsets=np.cumsum(counts, dtype=np.int64),
        block_ids=np.asarray(ids, dtype=np.int64),
        block_size=BLOCK_SIZE,
        name=name,
        source=str(file),
    )


def build_mooncake_sample(
    out: str | os.PathLike | None = None, *, path: str | os.PathLike | None = None, lines: int = MOONCAKE_SAMPLE_LINES
) -> Path:
    """Copy the first ``lines`` lines of the Mooncake trace byte-for-byte to ``out`` (default: the bundled sample)."""
    src = resolve_mooncake(path)
    lines = check_int("lines", lines)
    dst = Path(out) if out is not None else MOONCAKE_SAMPLE_PATH
    dst.parent.mkdir(parents=True, exist_ok=True)
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        for k, raw in enumerate(fin):
            if k >= lines:
                break
            fout.write(raw)
    return dst


def load_mooncake_sample(*, limit: int | None = None) -> RequestTrace:
    """The bundled first 400 requests of the Mooncake trace (``tempo_jax/data/mooncake_sample.jsonl``, ~97 KB).

    Works without ``../shared/traces``: 400 requests over 141 s (2.83 req/s), mean input 14,276 tokens.
    """
    if not MOONCAKE_SAMPLE_PATH.exists():
        raise FileNotFoundError(
            f"bundled sample {MOONCAKE_SAMPLE_PATH} missing; rebuild it with build_mooncake_sample()"
        )
    trace = load_mooncake(MOONCAKE_SAMPLE_PATH, limit=limit, name="mooncake_conversation")
    return dataclasses.replace(trace, source=f"{MOONCAKE_SAMPLE_PATH} (sample)")


# ------------------------------------------------------------------------------------------- registry
@dataclass(frozen=True, kw_only=True)
class RequestTraceSpec:
    """A registered request trace: loader, path under the traces root, bundled-sample loader, one line about it."""

    name: str
    loader: Callable[..., RequestTrace]
    relpath: str
    sample: Callable[..., RequestTrace] | None
    description: str


REQUEST_TRACES = MappingProxyType(
    {
        "mooncake_conversation": RequestTraceSpec(
            name="mooncake_conversation",
            loader=load_mooncake,
            relpath=MOONCAKE_RELPATH,
            sample=load_mooncake_sample,
            description="Mooncake FAST'25 conversation trace: 12,031 requests over 59 min, mean input 12,035 tokens, "
            "512-token prefix-block hashes",
        )
    }
)


def load_request_trace(
    name: str, path: str | os.PathLike | None = None, *, sample: bool = False, **kwargs
) -> RequestTrace:
    """Load registered request trace ``name`` (a key of :data:`REQUEST_TRACES`), or its bundled sample."""
    if name not in REQUEST_TRACES:
        raise ValueError(f"unknown request trace {name!r}; registered: {sorted(REQUEST_TRACES)}")
    spec = REQUEST_TRACES[name]
    if sample:
        if spec.sample is None:
            raise ValueError(f"request trace {name!r} has no bundled sample")
        return spec.sample(**kwargs)
    return spec.loader(path, **kwargs)


# ------------------------------------------------------------------------------------------ synthetic
def synthetic_requests(
    n: int,
    *,
    rate_rps: float,
    seed: int = 0,
    mean_input: float = 12_000.0,
    sigma: float = 1.0,
    min_input: int = 128,
    max_input: int = 131_072,
    mean_output: float = 350.0,
    num_families: int = 8,
    prefix_blocks: int | Sequence[int] = 4,
    shared_fraction: float = 0.5,
    block_size: int = BLOCK_SIZE,
) -> RequestTrace:
    """``n`` synthetic requests with Poisson arrivals and shared system prompts, for sweeps.

    Model:

    - Arrivals: the first at 0 s, then i.i.d. exponential gaps of mean ``1 / rate_rps`` (Poisson process).
    - Input lengths: lognormal with mean ``mean_input`` *before clipping* (``mu = ln(mean_input) − sigma²/2``),
      rounded and clipped to ``[min_input, max_input]`` tokens (long-tailed; with the defaults the clip moves the
      mean by < 2%). Output lengths: lognormal (sigma 1) with mean ``mean_output``, clipped to ``[1, 4096]``.
    - Shared prompts: ``num_families`` families, family f owning a fixed chain of ``prefix_blocks[f]`` block ids.
      Each request independently starts with a family prompt with probability ``shared_fraction`` (family
      uniform); it then shares ``min(prefix_blocks[f], input_len // block_size)`` leading blocks (only full
      blocks are shared) and all its other blocks get fresh ids, unique in the trace.
    - Block ids: family blocks first (ids ``0 .. Σ prefix_blocks − 1``), fresh ids after.
    """
    # Step 1: check the knobs.
    n = check_int("n", n, minimum=0)
    rate = check_real("rate_rps", rate_rps, minimum=0.0, strict=True)
    seed = check_int("seed", seed, minimum=0)
    mean_input = check_real("mean_input", mean_input, minimum=1.0)
    sigma = check_real("sigma", sigma, minimum=0.0)
    min_input = check_int("min_input", min_input)
    max_input = check_int("max_input", max_input, minimum=min_input)
    mean_output = check_real("mean_output", mean_output, minimum=1.0)
    num_families = check_int("num_families", num_families, minimum=0)
    frac = check_real("shared_fraction", shared_fraction, minimum=0.0)
    if frac > 1:
        raise ValueError(f"shared_fraction must be in [0, 1], got {frac}")
    block_size = check_int("block_size", block_size)
    fam_blocks = [prefix_blocks] * num_families if isinstance(prefix_blocks, int) else list(prefix_blocks)
    if len(fam_blocks) != num_families:
        raise ValueError(f"prefix_blocks has {len(fam_blocks)} entries for {num_families} families")
    fam_blocks = np.array([check_int("prefix_blocks", b) for b in fam_blocks], dtype=np.int64)
    if frac > 0 and num_families == 0:
        raise ValueError("shared_fraction > 0 needs num_families >= 1")
    rng = np.random.default_rng(seed)
    # Step 2: arrivals and lengths.
    gaps = rng.exponential(1.0 / rate, size=max(n - 1, 0))
    arrival = np.concatenate([np.zeros(min(n, 1)), np.cumsum(gaps)])
    mu = math.log(mean_input) - sigma**2 / 2
    ilen = np.clip(np.rint(rng.lognormal(mu, sigma, size=n)), min_input, max_input).astype(np.int64)
    olen = np.clip(np.rint(rng.lognormal(math.log(mean_output) - 0.5, 1.0, size=n)), 1, 4096).astype(np.int64)
    # Step 3: family membership and shared block counts.
    fam = np.where(rng.random(n) < frac, rng.integers(0, max(num_families, 1), size=n), -1)
    nblocks = -(-ilen // block_size)
    shared = np.where(
        fam >= 0, np.minimum(fam_blocks[np.maximum(fam, 0)] if num_families else 0, ilen // block_size), 0
    )
    # Step 4: CSR block ids (family chains, then fresh ids in request order).
    fam_start = np.concatenate([[0], np.cumsum(fam_blocks)]).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(nblocks)]).astype(np.int64)
    ids = np.empty(int(offsets[-1]), dtype=np.int64)
    pos = np.arange(ids.size) - np.repeat(offsets[:-1], nblocks)  # block index inside its request
    req = np.repeat(np.arange(n), nblocks)
    is_shared = pos < shared[req]
    ids[is_shared] = fam_start[fam[req[is_shared]]] + pos[is_shared]
    ids[~is_shared] = fam_start[-1] + np.arange(int((~is_shared).sum()))
    return RequestTrace(
        arrival_s=arrival,
        input_len=ilen,
        output_len=olen,
        block_offsets=offsets,
        block_ids=ids,
        block_size=block_size,
        name=f"synthetic(n={n}, rate={rate:g}, seed={seed})",
        source="synthetic_requests",
    )
