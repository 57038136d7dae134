"""Request-level MoE prefill serving over D data-parallel attention replicas (CascadeEP §1–2, §4.1, App. A–B).

numpy only (no jax). Glossary additions: n requests, m chunks in one replica's batch, ns steps, nc chunks in a run.
numpy only (no jax). Times in seconds (simulated), lengths in tokens.

What happens (``simulate_prefill``):

1. **Placement.** A request is placed on one replica when it arrives, by a router that sees every replica's
   outstanding new tokens (its load) and prefix cache (:data:`PLACEMENT_POLICIES`). The router's view only
   changes at step boundaries: a request arriving during a step sees the state from the step's start
   (tokens being computed in that step still count as outstanding).
2. **Batch formation.** Each replica keeps a FIFO queue and, at every step, forms one prefill batch under a
   budget of ``max_batch_tokens`` new tokens (and at most ``max_batch_requests`` requests): it walks the queue
   in order, giving each request ``min(remaining, budget left)`` tokens (chunked prefill), so only the last
   request of a batch can be cut, and it heads the next batch. Without chunking, a request that does not
   fit the budget left waits (head of line); one that can never fit raises ``ValueError``.
3. **Prefix hits.** A request's prefix hit is fixed when its first chunk is scheduled (as SGLang matches its
   radix tree when the scheduler admits a request, not when the router places it): ``P_0 = min(block_size ×
   matched leading blocks, I − 1)``. The cap keeps at least one token computed (a prefill must produce the
   last position's logits). The matched blocks are touched (LRU). Chunk j of the request then has ``P_j =
   P_0 + tokens computed by chunks 0..j−1``, and ``q_j`` new tokens; ``P_0 + Σ_j q_j = I`` exactly.
4. **Step.** All replicas run each forward step in lockstep (DEP: an idle replica takes part with an empty
   batch). A step starts when the previous one ends, or, when every queue is empty, at the next arrival.
   ``step_time(batches)`` returns its duration. A request's TTFT = end of the step computing its last chunk −
   its arrival.
5. **Cache insertion.** When a request's prefill completes, all its ``ceil(I / block_size)`` block ids are
   inserted into its replica's cache (the KV exists only then; requests in the same batch do not share with
   each other). The cache holds reusable prefix KV only: the KV of requests still being prefilled is not
   charged against ``cache_blocks`` (no admission control on memory).

The step-time contract (:data:`StepTimeFn`): ``step_time(batches: tuple[StepBatch, ...]) -> (duration_s, record)``
where ``batches[d]`` is replica d's batch (``len(batches) == D``; empty batches included), ``duration_s`` a
finite float > 0 and ``record`` anything the caller wants kept per step (returned in
:attr:`PrefillResult.step_records`). A bare float is accepted as ``(duration_s, None)``. If every record carries
per-replica attention-stage times (``record.attention_s`` or ``record["attention_s"]``, float ``[D]`` or
``[L, D]`` per layer), ALB is computed from them (App. A, Eq. 8); otherwise from per-replica new tokens, a proxy.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tempo_jax.workloads import RequestTrace

__all__ = [
    "PLACEMENT_POLICIES",
    "PrefixCache",
    "Router",
    "PrefillResult",
    "StepBatch",
    "StepTimeFn",
    "ToyStepTime",
    "simulate_prefill",
]

PLACEMENT_POLICIES = ("round_robin", "least_loaded", "power_of_two", "prefix_only")


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _check_policy(policy: object) -> str:
    if policy not in PLACEMENT_POLICIES:
        raise ValueError(f"unknown placement policy {policy!r}; valid policies: {list(PLACEMENT_POLICIES)}")
    return str(policy)


# --------------------------------------------------------------------------------------------- prefix cache
class PrefixCache:
    """One replica's prefix KV cache: an LRU set of block ids holding at most ``capacity_blocks`` blocks.

    Chains are kept so that eviction trims them from the tail: :meth:`match` and :meth:`insert` touch a chain
    deepest block first, so its leading blocks are the most recently used and are evicted last (the effect of
    a radix tree evicting leaves first). A cached suffix without its prefix is never matched anyway
    (:meth:`match` counts *leading* cached blocks).
    """

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity_blocks = _positive_int("capacity_blocks", capacity_blocks)
        self._lru: OrderedDict[int, None] = OrderedDict()  # oldest first
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._lru)

    def __contains__(self, block: object) -> bool:
        return block in self._lru

    def lru_order(self) -> list[int]:
        """Cached block ids, least recently used first."""
        return list(self._lru)

    def match(self, blocks: Sequence[int], *, touch: bool = True) -> int:
        """Number of leading ``blocks`` that are cached; with ``touch`` those blocks become most recently used."""
        m = 0
        for b in blocks:
            if int(b) not in self._lru:
                break
            m += 1
        if touch:
            for b in reversed(blocks[:m]):
                self._lru.move_to_end(int(b))
        return m

    def hit_tokens(self, blocks: Sequence[int], input_len: int, *, block_size: int, touch: bool = False) -> int:
        """Prefix-hit tokens of a request: ``min(block_size × match(blocks), input_len − 1)``.

        The cap keeps at least one token to compute: a prefill must run the last prompt position to produce the
        first output token, even when every block (the last one possibly partial) is cached.
        """
        return min(block_size * self.match(blocks, touch=touch), int(input_len) - 1)

    def insert(self, blocks: Sequence[int]) -> int:
        """Cache the chain ``blocks`` (its first ``capacity_blocks`` blocks), evicting least recently used blocks.

        Returns the number of blocks newly added. Blocks of the chain already cached are touched first, so a
        chain never evicts its own blocks.
        """
        chain = [int(b) for b in blocks[: self.capacity_blocks]]
        # Step 1: touch what is already there (deepest first) so it is safe from this insert's evictions.
        for b in reversed(chain):
            if b in self._lru:
                self._lru.move_to_end(b)
        # Step 2: add the missing blocks deepest first; block 0 ends up most recently used.
        added = 0
        for b in reversed(chain):
            if b in self._lru:
                self._lru.move_to_end(b)
                continue
            if len(self._lru) >= self.capacity_blocks:
                self._lru.popitem(last=False)
                self.evictions += 1
            self._lru[b] = None
            added += 1
        return added


# --------------------------------------------------------------------------------------------------- router
class Router:
    """Request placement over ``num_replicas`` replicas by ``policy`` (one of :data:`PLACEMENT_POLICIES`).

    - ``round_robin``: replicas 0, 1, …, D−1, 0, … in arrival order (SGLang's default).
    - ``least_loaded``: the fewest outstanding new tokens; ties → lowest index.
    - ``power_of_two``: two distinct replicas drawn uniformly (seeded generator), the less loaded of the two;
      ties → the first drawn (Mitzenmacher 2001).
    - ``prefix_only``: the longest cached leading prefix (matched without touching); ties → least loaded →
      lowest index (Preble's prefix-only baseline: on a trace where every request shares a system prompt it
      keeps sending work where that prompt is cached).

    Load = outstanding new tokens of a replica: for its requests not yet started, ``I − estimated hit`` (the hit
    matched on its cache at placement), for started ones the tokens still to compute.
    """

    def __init__(self, policy: str, num_replicas: int, *, seed: int = 0) -> None:
        self.policy = _check_policy(policy)
        self.num_replicas = _positive_int("num_replicas", num_replicas)
        if self.policy == "power_of_two" and self.num_replicas < 2:
            raise ValueError("power_of_two needs num_replicas >= 2")
        self._rng = np.random.default_rng(seed)
        self._next = 0

    def choose(self, blocks: Sequence[int], loads: np.ndarray, caches: Sequence[PrefixCache]) -> int:
        """Replica for a request with prefix ``blocks``, given ``loads [D]`` (new tokens) and the ``caches [D]``."""
        D = self.num_replicas
        loads = np.asarray(loads)
        if loads.shape != (D,) or len(caches) != D:
            raise ValueError(f"loads must be [{D}] and caches {D} long, got {loads.shape} and {len(caches)}")
        if self.policy == "round_robin":
            d = self._next
            self._next = (self._next + 1) % D
            return d
        if self.policy == "least_loaded":
            return int(np.argmin(loads))
        if self.policy == "power_of_two":
            a, b = self._rng.choice(D, size=2, replace=False)
            return int(b) if loads[b] < loads[a] else int(a)
        matched = np.array([c.match(blocks, touch=False) for c in caches])
        best = np.flatnonzero(matched == matched.max())
        return int(best[np.argmin(loads[best])])


# ---------------------------------------------------------------------------------------------- batches
@dataclass(frozen=True, kw_only=True, eq=False)
class StepBatch:
    """One replica's prefill batch in one step: ``m`` chunks (m = 0 for an idle replica).

    Attributes:
        replica: the replica index d.
        request_ids: int64 ``[m]`` trace indices, in queue (FIFO) order.
        q: int64 ``[m]`` new tokens computed for each chunk (>= 1).
        P: int64 ``[m]`` prior tokens whose KV exists: prefix-cache hit + tokens of earlier chunks.
        I: int64 ``[m]`` the request's full input length (``P + q <= I``; ``==`` on its last chunk). For an
            attention model use ``q`` and ``P`` (App. B: ``Q = Σ q``, ``Π = Σ_i Σ_{j=1..q_i} min(k_i, P_i + j)``),
            not ``I − P``, which is the request's remaining work, not the chunk's.
    """

    replica: int
    request_ids: np.ndarray
    q: np.ndarray
    P: np.ndarray
    I: np.ndarray

    def __post_init__(self) -> None:
        for name in ("request_ids", "q", "P", "I"):  # read-only int64 copies: the callback cannot edit the books
            a = np.array(getattr(self, name), dtype=np.int64)
            a.setflags(write=False)
            object.__setattr__(self, name, a)

    @property
    def num_chunks(self) -> int:
        return int(self.q.size)

    @property
    def new_tokens(self) -> int:
        """``Σ q``: new tokens this replica computes this step."""
        return int(self.q.sum())

    @property
    def is_last(self) -> np.ndarray:
        """bool ``[m]``: the chunk completes its request's prefill."""
        return self.P + self.q == self.I


StepTimeFn = Callable[[tuple[StepBatch, ...]], "tuple[float, Any] | float"]


@dataclass(frozen=True, kw_only=True)
class ToyStepTime:
    """A toy step-time model for tests and demos (not calibrated; the CascadeEP timeline replaces it).

    Replica d's attention time ``a_d = alpha0_s + alpha1_s·Q_d + alpha2_s·Π_d`` when its batch is non-empty, else 0
    (App. B, Eq. 10–11, dense attention: ``Π_d = Σ_i (q_i·P_i + q_i(q_i+1)/2)``); the step is synchronous EP:
    ``max_d a_d + ffn_s_per_token · Σ_d Q_d / D`` (FFN work spread evenly over the D EP ranks). The record is
    ``{"attention_s": a [D], "new_tokens": Q [D]}``.
    """

    alpha0_s: float = 1e-3
    alpha1_s: float = 2e-6
    alpha2_s: float = 0.0
    ffn_s_per_token: float = 2e-6

    def __call__(self, batches: tuple[StepBatch, ...]) -> tuple[float, dict]:
        Q = np.array([b.new_tokens for b in batches], dtype=np.float64)
        pi = np.array([float(np.sum(b.q * b.P + b.q * (b.q + 1) / 2)) for b in batches])
        att = np.where(Q > 0, self.alpha0_s + self.alpha1_s * Q + self.alpha2_s * pi, 0.0)
        dur = float(att.max() + self.ffn_s_per_token * Q.sum() / len(batches))
        return dur, {"attention_s": att, "new_tokens": Q}


# ---------------------------------------------------------------------------------------------- results
def _attention_of(record: object) -> np.ndarray | None:
    att = getattr(record, "attention_s", None)
    if att is None and isinstance(record, Mapping):
        att = record.get("attention_s")
    return None if att is None else np.asarray(att, dtype=np.float64)


def _alb(times: np.ndarray) -> np.ndarray:
    """ALB per row of ``times [..., D]``: mean / max (App. A, Eq. 8, as a fraction); NaN where all are 0."""
    mx = times.max(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(mx > 0, times.mean(axis=-1) / np.where(mx > 0, mx, 1.0), np.nan)


@dataclass(frozen=True, kw_only=True, eq=False)
class PrefillResult:
    """Outcome of :func:`simulate_prefill` (all times in simulated seconds on the trace's clock).

    Per request (``[n]``): ``replica``, ``arrival_s``, ``input_len``, ``hit_tokens`` (prefix-cache hit P_0),
    ``completion_s`` (end of the step computing its last chunk), ``ttft_s`` = completion − arrival,
    ``num_chunks``. Per step (``[ns]``): ``step_start_s``, ``step_end_s``, ``step_new_tokens [ns, D]``,
    ``step_chunks [ns, D]``, ``step_records`` (what ``step_time`` returned). Per chunk (``[nc]``, in step then
    replica then queue order): ``chunk_step``, ``chunk_request``, ``chunk_replica``, ``chunk_q``, ``chunk_P``.
    """

    policy: str
    num_replicas: int
    max_batch_tokens: int
    max_batch_requests: int | None
    cache_blocks: int
    replica: np.ndarray
    arrival_s: np.ndarray
    input_len: np.ndarray
    hit_tokens: np.ndarray
    completion_s: np.ndarray
    ttft_s: np.ndarray
    num_chunks: np.ndarray
    step_start_s: np.ndarray
    step_end_s: np.ndarray
    step_new_tokens: np.ndarray
    step_chunks: np.ndarray
    step_records: tuple
    chunk_step: np.ndarray
    chunk_request: np.ndarray
    chunk_replica: np.ndarray
    chunk_q: np.ndarray
    chunk_P: np.ndarray
    cache_evictions: np.ndarray

    @property
    def num_requests(self) -> int:
        return int(self.replica.size)

    @property
    def num_completed(self) -> int:
        """Requests whose prefill completed (:func:`simulate_prefill` guarantees this equals the trace length)."""
        return int(np.count_nonzero(np.isfinite(self.completion_s)))

    @property
    def num_steps(self) -> int:
        return int(self.step_start_s.size)

    @property
    def ttft_mean_s(self) -> float:
        return float(self.ttft_s.mean())

    @property
    def ttft_p95_s(self) -> float:
        """95th percentile of TTFT (linear interpolation between order statistics)."""
        return float(np.percentile(self.ttft_s, 95))

    @property
    def makespan_s(self) -> float:
        """First arrival → last completion (App. A's T_E2E for a fully measured run)."""
        return float(self.completion_s.max() - self.arrival_s.min())

    @property
    def prompt_throughput_tps(self) -> float:
        """Prompt-token throughput, the paper's metric (Fig. 7, 8): input tokens (hits included) / makespan."""
        return float(self.input_len.sum() / self.makespan_s)

    @property
    def computed_throughput_tps(self) -> float:
        """New (computed, non-hit) tokens / makespan."""
        return float(self.chunk_q.sum() / self.makespan_s)

    @property
    def cache_hit_rate(self) -> float:
        """Prefix-hit tokens / input tokens (Fig. 2's x-axis)."""
        return float(self.hit_tokens.sum() / self.input_len.sum())

    @property
    def alb_source(self) -> str:
        """``"attention_s"`` if every step record carries per-replica attention times, else ``"new_tokens"`` (proxy)."""
        ok = self.step_records and all(_attention_of(r) is not None for r in self.step_records)
        return "attention_s" if ok else "new_tokens"

    def _alb_rows(self) -> list[np.ndarray]:
        if self.alb_source == "attention_s":
            rows = []
            for k, rec in enumerate(self.step_records):
                att = _attention_of(rec)
                if att.ndim not in (1, 2) or att.shape[-1] != self.num_replicas or not np.all(np.isfinite(att)):
                    raise ValueError(
                        f"step {k}: attention_s must be finite [D] or [L, D] with D = {self.num_replicas}, "
                        f"got shape {att.shape}"
                    )
                rows.append(np.atleast_2d(_alb(att)))
            return rows
        return [np.atleast_2d(a) for a in _alb(self.step_new_tokens.astype(np.float64))]

    @property
    def alb_per_step(self) -> np.ndarray:
        """float64 ``[ns]`` ALB = mean_d a_d / max_d a_d of each step (averaged over its layers if ``[L, D]``);
        a_d from the records' ``attention_s`` or, as a proxy, new tokens (see :attr:`alb_source`). NaN when all
        replicas have zero attention time."""
        rows = self._alb_rows()
        out = np.full(len(rows), np.nan)
        for i, r in enumerate(rows):
            if np.any(np.isfinite(r)):
                out[i] = np.nanmean(r)
        return out

    @property
    def alb_mean(self) -> float:
        """Mean ALB over layer invocations with some non-zero attention time (App. A, as for Fig. 2)."""
        rows = self._alb_rows()
        vals = np.concatenate([r.ravel() for r in rows]) if rows else np.empty(0)
        vals = vals[np.isfinite(vals)]
        return float(vals.mean()) if vals.size else math.nan

    def summary(self) -> dict:
        """Headline numbers as plain floats/ints."""
        return {
            "policy": self.policy,
            "requests": self.num_requests,
            "completed": self.num_completed,
            "steps": self.num_steps,
            "ttft_mean_s": self.ttft_mean_s,
            "ttft_p95_s": self.ttft_p95_s,
            "makespan_s": self.makespan_s,
            "prompt_throughput_tps": self.prompt_throughput_tps,
            "computed_throughput_tps": self.computed_throughput_tps,
            "cache_hit_rate": self.cache_hit_rate,
            "alb_mean": self.alb_mean,
            "alb_source": self.alb_source,
        }


# ------------------------------------------------------------------------------------------------ serving
def _call_step_time(step_time: StepTimeFn, batches: tuple[StepBatch, ...], step: int) -> tuple[float, Any]:
    out = step_time(batches)
    dur, rec = out if isinstance(out, tuple) and len(out) == 2 else (out, None)
    if isinstance(dur, bool) or not isinstance(dur, int | float | np.integer | np.floating):
        raise ValueError(f"step_time must return (duration_s, record) or a float; step {step} returned {out!r:.80}")
    dur = float(dur)
    if not math.isfinite(dur) or dur <= 0:
        raise ValueError(f"step_time returned duration {dur} s for step {step}; it must be finite and > 0")
    return dur, rec


class _Books:
    """One serving run's books (`simulate_prefill`): each replica's FIFO queue, the router's view of its
    outstanding new tokens and its prefix cache; per request its replica, the router's estimate of its new tokens,
    its hit P_0 (fixed at the first chunk), tokens computed, chunks and completion time; the chunk log."""

    def __init__(self, trace: RequestTrace, router: Router, caches: list[PrefixCache]) -> None:
        n, D = len(trace), len(caches)
        self.trace, self.router, self.caches = trace, router, caches
        self.replica = np.full(n, -1, dtype=np.int64)
        self.est_new = np.zeros(n, dtype=np.int64)  # router's estimate of new tokens, fixed at placement
        self.hit = np.full(n, -1, dtype=np.int64)  # P_0, fixed at the first chunk
        self.done = np.zeros(n, dtype=np.int64)  # new tokens computed so far
        self.nchunks = np.zeros(n, dtype=np.int64)
        self.completion = np.full(n, np.inf)
        self.loads = np.zeros(D, dtype=np.int64)  # outstanding new tokens per replica (router's view)
        self.queues: list[deque[int]] = [deque() for _ in range(D)]
        self.log: list[tuple[int, int, int, int, int]] = []  # (step, request, replica, q, P)
        self.nxt = self.completed = 0

    def place_until(self, t_s: float, *, inclusive: bool) -> None:
        """Step 2: the router places every request arriving by ``t_s`` (at ``t_s`` too when ``inclusive``)."""
        trace, arrival, ilen = self.trace, self.trace.arrival_s, self.trace.input_len
        while self.nxt < len(trace) and (arrival[self.nxt] <= t_s if inclusive else arrival[self.nxt] < t_s):
            r, blocks = self.nxt, trace.blocks(self.nxt)
            d = self.router.choose(blocks, self.loads, self.caches)
            est_hit = self.caches[d].hit_tokens(blocks, ilen[r], block_size=trace.block_size)
            self.replica[r], self.est_new[r] = d, ilen[r] - est_hit
            self.loads[d] += self.est_new[r]
            self.queues[d].append(r)
            self.nxt += 1

    def batches(self, budget: int, max_req: int | None, chunked_prefill: bool) -> tuple[StepBatch, ...]:
        """Step 3: one batch per replica (FIFO, token budget, chunked prefill); a request's first chunk fixes its
        hit and touches its cached blocks."""
        trace, ilen, bs = self.trace, self.trace.input_len, self.trace.block_size
        hit, done = self.hit, self.done
        out = []
        for d, queue in enumerate(self.queues):
            rids, qs, Ps = [], [], []
            left = budget
            for r in queue:
                if left == 0 or (max_req is not None and len(rids) == max_req):
                    break
                if hit[r] < 0:
                    P0 = self.caches[d].hit_tokens(trace.blocks(r), ilen[r], block_size=bs)
                    need = int(ilen[r]) - P0
                    if not chunked_prefill and need > budget:
                        raise ValueError(
                            f"request {r} needs {need} new tokens in one step but max_batch_tokens={budget} "
                            "(chunked_prefill=False): it can never be scheduled"
                        )
                    if not chunked_prefill and need > left:
                        break  # head of line waits for the next step
                    self.caches[d].match(trace.blocks(r), touch=True)
                    hit[r] = P0
                    self.loads[d] += need - self.est_new[r]
                q = min(int(ilen[r] - hit[r] - done[r]), left)
                rids.append(r)
                qs.append(q)
                Ps.append(int(hit[r] + done[r]))
                left -= q
            ids = np.array(rids, dtype=np.int64)
            out.append(StepBatch(replica=d, request_ids=ids, q=qs, P=Ps, I=ilen[ids]))
        return tuple(out)

    def account(self, batches: tuple[StepBatch, ...], k: int, t_end: float) -> None:
        """Step 5: step ``k``'s chunks at its end ``t_end``; completed requests enter their replica's cache and
        leave its queue."""
        ilen = self.trace.input_len
        for b in batches:
            d = b.replica
            for r, q, P in zip(b.request_ids.tolist(), b.q.tolist(), b.P.tolist(), strict=True):
                self.log.append((k, r, d, q, P))
                self.done[r] += q
                self.nchunks[r] += 1
                self.loads[d] -= q
                if self.hit[r] + self.done[r] == ilen[r]:
                    self.completion[r] = t_end
                    self.caches[d].insert(self.trace.blocks(r))
                    self.completed += 1
            queue = self.queues[d]
            while queue and np.isfinite(self.completion[queue[0]]):
                queue.popleft()

    def chunks(self) -> np.ndarray:
        """Step 6: the chunk log ``[chunks, 5]`` (step, request, replica, q, P), once nothing was lost."""
        n, ilen = len(self.trace), self.trace.input_len
        chunks = np.array(self.log, dtype=np.int64).reshape(-1, 5)
        computed = np.bincount(chunks[:, 1], weights=chunks[:, 3], minlength=n).astype(np.int64)
        hit = self.hit
        lost = self.completed != n or np.any(hit < 0) or np.any(hit + computed != ilen) or np.any(self.loads != 0)
        if lost or any(self.queues):
            raise RuntimeError("simulate_prefill: request accounting failed (a request was lost or double-counted)")
        return chunks


def simulate_prefill(
    trace: RequestTrace,
    *,
    step_time: StepTimeFn,
    num_replicas: int = 8,
    policy: str = "round_robin",
    max_batch_tokens: int = 16_384,
    max_batch_requests: int | None = None,
    cache_blocks: int = 4_096,
    chunked_prefill: bool = True,
    seed: int = 0,
    progress: bool = False,
) -> PrefillResult:
    """Serve ``trace``'s prefills on ``num_replicas`` DP attention replicas; see the module docstring.

    Args:
        trace: the requests (arrival order).
        step_time: the step-time callback (contract in the module docstring).
        num_replicas: D attention replicas.
        policy: placement policy, one of :data:`PLACEMENT_POLICIES`.
        max_batch_tokens: new tokens per replica per step (the chunked-prefill budget).
        max_batch_requests: at most this many requests (chunks) per replica batch (None: no limit).
        cache_blocks: each replica's prefix-cache capacity in blocks (the KV budget; ``block_size`` tokens each).
        chunked_prefill: split long requests over steps; if False a request runs whole in one step.
        seed: seeds ``power_of_two``'s draws.
        progress: tqdm bar over completed requests.

    Raises ``ValueError`` on bad knobs, on a request that can never fit a batch (``chunked_prefill=False``), and
    on a bad ``step_time`` return; ``RuntimeError`` if the accounting invariants fail (nothing may be lost).
    """
    # Step 1: check the knobs and set up the books.
    if not isinstance(trace, RequestTrace):
        raise ValueError(f"trace must be a RequestTrace, got {type(trace).__name__}")
    if len(trace) == 0:
        raise ValueError("simulate_prefill: the trace has no requests")
    if not callable(step_time):
        raise ValueError("step_time must be callable")
    D = _positive_int("num_replicas", num_replicas)
    router = Router(policy, D, seed=seed)
    budget = _positive_int("max_batch_tokens", max_batch_tokens)
    max_req = None if max_batch_requests is None else _positive_int("max_batch_requests", max_batch_requests)
    books = _Books(trace, router, [PrefixCache(_positive_int("cache_blocks", cache_blocks)) for _ in range(D)])
    n, arrival = len(trace), trace.arrival_s
    starts, ends, tokens, nchunks, records = [], [], [], [], []
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=n, desc=f"prefill[{policy}]", unit="req")
    t = float(arrival[0])
    while books.completed < n:
        # Step 2: place arrivals up to now; if nothing is queued, jump to the next arrival.
        books.place_until(t, inclusive=True)
        if not any(books.queues):
            t = max(t, float(arrival[books.nxt]))
            continue
        batches = books.batches(budget, max_req, chunked_prefill)  # Step 3
        # Step 4: time the step; arrivals during it see the pre-step state.
        k = len(starts)
        dur, rec = _call_step_time(step_time, batches, k)
        t_end = t + dur
        books.place_until(t_end, inclusive=False)
        books.account(batches, k, t_end)  # Step 5
        if bar is not None:
            bar.update(books.completed - bar.n)
        starts.append(t)
        ends.append(t_end)
        tokens.append(np.array([b.new_tokens for b in batches], dtype=np.int64))
        nchunks.append(np.array([b.num_chunks for b in batches], dtype=np.int64))
        records.append(rec)
        t = t_end
    if bar is not None:
        bar.close()
    chunks = books.chunks()  # Step 6: nothing lost; package the result.
    return PrefillResult(
        policy=router.policy,
        num_replicas=D,
        max_batch_tokens=budget,
        max_batch_requests=max_req,
        cache_blocks=books.caches[0].capacity_blocks,
        replica=books.replica,
        arrival_s=arrival.copy(),
        input_len=trace.input_len.copy(),
        hit_tokens=books.hit,
        completion_s=books.completion,
        ttft_s=books.completion - arrival,
        num_chunks=books.nchunks,
        step_start_s=np.array(starts, dtype=np.float64),
        step_end_s=np.array(ends, dtype=np.float64),
        step_new_tokens=np.array(tokens, dtype=np.int64).reshape(-1, D),
        step_chunks=np.array(nchunks, dtype=np.int64).reshape(-1, D),
        step_records=tuple(records),
        chunk_step=chunks[:, 0],
        chunk_request=chunks[:, 1],
        chunk_replica=chunks[:, 2],
        chunk_q=chunks[:, 3],
        chunk_P=chunks[:, 4],
        cache_evictions=np.array([c.evictions for c in books.caches], dtype=np.int64),
    )
