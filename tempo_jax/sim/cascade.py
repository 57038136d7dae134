"""The CascadeEP prefill simulator: requests → DEP forward steps → layer timelines (CascadeEP §3–4, App. A–D).

`run_cascade(config)` serves a request trace (`tempo_jax.workloads.RequestTrace`: the Mooncake trace, its
bundled sample, or a synthetic one) on D data-parallel attention replicas with `tempo_jax.sim.simulate_prefill` (request
placement, prefix caches, chunked-prefill batches) and times every forward step with a `StepModel`: for each of
the model's L MoE layers it draws the routing of the step's new tokens, builds the layer's `LayerInputs` and
runs `layer_timeline` in the configured mode. The step lasts the sum of its layers. One run per mode
(`LAYER_MODES`); the runs are cached and spread over worker processes by `tempo_jax.sim.runner`.

Per step the model uses (all derived in `tempo_jax.sim.prefill`):

- **Attention** per replica from its batch (App. B, Eqs. 10–11: Q and Π of its chunks with the model's sparse
  key budget), the same in every layer; an idle replica runs a dummy batch (α0). With ``estimates="paper"`` the
  planner sees a noisy prediction ``a·(1 + ε)``, ε ~ N(0, σ) per replica and step, σ set so that the mean
  relative error equals ``attention_noise`` (the paper's estimator: 90.3% accurate → 0.097).
- **Routing**: each replica's new tokens pick top-K experts; per layer, the pair counts of source s are a
  multinomial draw of ``K·Q_s`` pairs from the layer's expert popularity — a recorded routing trace's layer
  loads (recorded experts split evenly into E / E_rec model experts; recorded layers reused cyclically) or
  Zipf(s) with a per-layer permutation. Experts sit ``E/D`` per rank in order; with ``replication > 1`` an EPLB
  placement per layer holds redundant replicas and ``dispatch`` (``"uniform"`` = EPLB-even, ``"tempo"``)
  splits each expert's tokens over them — TEMPO inside each rank's expert time, the two papers composed.
- **Token-count estimates** for OEWF (App. D): N̂_d = the count rank d received in the previous layer
  (``estimates="paper"``) or the true count (``"exact"``); OEWF is skipped on the first layer.

numpy + solvers only (no jax).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from solvers import Placement, attention_features, slots_for, solve
from solvers.checks import check_choice, check_int, check_real
from tempo_jax.workloads import RequestTrace, load_trace, zipf_popularity
from tempo_jax.workloads.requests import load_request_trace, synthetic_requests

from .cascade_layer import LAYER_MODES, LayerInputs, layer_timeline
from .prefill import HARDWARE, MODELS, PrefillCosts, prefill_costs
from .requests import PLACEMENT_POLICIES, PrefillResult, StepBatch, simulate_prefill
from .runner import CACHE_DIR, cached, run_jobs

__all__ = [
    "CascadeConfig",
    "CascadeRun",
    "StepModel",
    "StepRecord",
    "cascade_trace",
    "run_cascade",
    "step_batches",
]

_DISPATCH = ("uniform", "tempo")
_ESTIMATES = ("paper", "exact")
_PRICING = ("paper", "tempo")


@dataclass(frozen=True, kw_only=True)
class CascadeConfig:
    """One CascadeEP serving experiment (defaults: the paper's ablation set-up, DeepSeek-V4-Flash DP8 + EP8).

    Attributes:
      model, hardware: keys of `prefill.MODELS`, `prefill.HARDWARE`.
      num_ranks: D (attention replicas = EP ranks = GPUs).
      trace: ``"mooncake"`` (the full recording; the bundled sample when it is not on disk),
        ``"mooncake_sample"`` or ``"synthetic"`` (`synthetic_requests` with ``synthetic_rate_rps``).
      max_requests: serve the first this many requests of the trace (None = all).
      rate_rps: scale the trace's inter-arrival times to this request rate (None = as recorded).
      placement: request placement over replicas (`PLACEMENT_POLICIES`).
      max_batch_tokens: new tokens per replica per step (chunked prefill).
      cache_blocks: per-replica prefix-cache budget in 512-token blocks (the same for every mode).
      routing: a routing-trace name of `tempo_jax.workloads.TRACES` (recorded layer loads) or ``"zipf"``.
      skew: Zipf exponent s for ``routing="zipf"``.
      attention: ``"dense"`` (default: every query attends to its whole context, k = ∞ in App. B's Π, so the
        stage time grows with context length as in V4's compressed-attention layers that see every compressed
        token) or ``"sparse"`` (the model's per-query key budget in every layer, DSA-style: the stage time is
        then nearly proportional to new tokens). The two extremes bracket the paper's mixed CSA/HCA stack.
      replication: physical slots / experts (1.0 = no redundancy; > 1: EPLB per layer).
      dispatch: how tokens split over replicas (``"uniform"`` EPLB-even, ``"tempo"``); needs replication > 1
        to matter.
      estimates: ``"paper"`` (noisy attention predictions, previous-layer token counts) or ``"exact"``.
      attention_noise: mean relative error of the attention prediction under ``estimates="paper"``.
      guard: ``False`` (default) launches with each mode's own rule, as the paper does; ``True`` picks the best
        predicted policy up to the mode's own (see `layer_timeline`).
      pricing: OEWF's admission model (``"paper"`` or ``"tempo"``).
      synthetic_requests: requests of the synthetic trace.
      synthetic_rate_rps: the synthetic trace's Poisson arrival rate (requests per second).
      seed: seeds routing draws, estimation noise and placement tie-breaks.
    """

    model: str = "deepseek_v4_flash"
    hardware: str = "b200"
    num_ranks: int = 8
    trace: str = "mooncake"
    max_requests: int | None = 1000
    rate_rps: float | None = None
    placement: str = "round_robin"
    max_batch_tokens: int = 16_384
    cache_blocks: int = 4_096
    routing: str = "flame_moe_290m"
    skew: float = 0.6
    attention: str = "dense"
    replication: float = 1.0
    dispatch: str = "uniform"
    estimates: str = "paper"
    attention_noise: float = 0.097
    guard: bool = False
    pricing: str = "paper"
    synthetic_requests: int = 1000
    synthetic_rate_rps: float = 5.0
    seed: int = 0

    def __post_init__(self) -> None:
        fn = "CascadeConfig"
        check_choice("model", self.model, MODELS, where=fn)
        check_choice("hardware", self.hardware, HARDWARE, where=fn)
        check_int("num_ranks", self.num_ranks, where=fn)
        check_choice("trace", self.trace, ("mooncake", "mooncake_sample", "synthetic"), where=fn)
        if self.max_requests is not None:
            check_int("max_requests", self.max_requests, where=fn)
        if self.rate_rps is not None:
            check_real("rate_rps", self.rate_rps, where=fn, minimum=0.0, strict=True)
        check_choice("placement", self.placement, PLACEMENT_POLICIES, where=fn)
        check_int("max_batch_tokens", self.max_batch_tokens, where=fn)
        check_int("cache_blocks", self.cache_blocks, where=fn)
        check_real("skew", self.skew, where=fn, minimum=0.0)
        check_choice("attention", self.attention, ("sparse", "dense"), where=fn)
        check_real("replication", self.replication, where=fn, minimum=1.0)
        check_choice("dispatch", self.dispatch, _DISPATCH, where=fn)
        check_choice("estimates", self.estimates, _ESTIMATES, where=fn)
        check_real("attention_noise", self.attention_noise, where=fn, minimum=0.0, maximum=0.5)
        check_choice("pricing", self.pricing, _PRICING, where=fn)
        check_int("synthetic_requests", self.synthetic_requests, where=fn)
        check_real("synthetic_rate_rps", self.synthetic_rate_rps, where=fn, minimum=0.0, strict=True)
        check_int("seed", self.seed, where=fn, minimum=0)
        if MODELS[self.model].experts % self.num_ranks:
            raise ValueError(f"{fn}: {MODELS[self.model].experts} experts do not split over num_ranks={self.num_ranks}")
        if self.routing != "zipf":
            from tempo_jax.workloads import TRACES

            check_choice("routing", self.routing, (*TRACES, "zipf"), where=fn)

    def costs(self) -> PrefillCosts:
        return prefill_costs(self.model, self.hardware, self.num_ranks)


# ------------------------------------------------------------------------------------------------ routing
def _routing_popularity(config: CascadeConfig) -> np.ndarray:
    """``[L, E]`` expert popularity per model layer (each row sums to 1)."""
    model = MODELS[config.model]
    L, E = model.layers, model.experts
    if config.routing == "zipf":
        return np.stack([zipf_popularity(E, config.skew, seed=config.seed * 1000 + layer) for layer in range(L)])
    try:
        trace = load_trace(config.routing)
    except FileNotFoundError:
        from tempo_jax.workloads import load_sample

        trace = load_sample(config.routing)
    if E % trace.num_experts:
        raise ValueError(
            f"routing {config.routing!r} records {trace.num_experts} experts, which do not divide the model's {E}"
        )
    split = E // trace.num_experts
    rows = []
    for layer in range(L):
        load = trace.expert_load(trace.layers[layer % len(trace.layers)]).astype(np.float64)
        p = np.repeat(load / load.sum(), split) / split
        rows.append(p)
    return np.stack(rows)


def _placements(config: CascadeConfig, popularity: np.ndarray) -> list[Placement] | None:
    """EPLB placement per layer (None without redundancy: expert e on rank e // (E/D))."""
    if config.replication == 1.0:
        return None
    E, D = popularity.shape[1], config.num_ranks
    slots = slots_for(E, D, config.replication)
    return [Placement.from_eplb(p, slots, D) for p in popularity]


def _contiguous_split(E: int, D: int) -> np.ndarray:
    f = np.zeros((E, D))
    f[np.arange(E), np.arange(E) // (E // D)] = 1.0
    return f


@dataclass(frozen=True, kw_only=True)
class StepRecord:
    """What `StepModel` keeps of one forward step (the serve loop stores it per step).

    Attributes:
      attention_s: ``[D]`` attention-stage time of each replica (s) — `PrefillResult` computes ALB from it.
      layer_us: ``[L]`` each layer's time (µs) in this run's mode.
      base_us: ``[L]`` the same layers without OEWF (cascade mode; else equal to ``layer_us``).
      gap_us: Σ over layers and replicas of the readiness gap max_j r_j − r_d (App. A), µs.
      oewf_moves / oewf_tokens: accepted reassignments and moved tokens over the step's layers.
      attention_err: ``[D]`` |â − a| / a of the replicas that had tokens (NaN for idle ones).
      token_err: relative errors |N̂ − N| / N of the per-rank token estimates, layers ≥ 1, ranks with N > 0.
      ffn_kernel_us / ffn_merged_us: Σ over ranks and layers of the kernels' F(n) and of F(Σ n) per rank
        (matched-work FFN efficiency = merged / kernel).
    """

    attention_s: np.ndarray
    layer_us: np.ndarray
    base_us: np.ndarray
    gap_us: float
    oewf_moves: int
    oewf_tokens: float
    attention_err: np.ndarray
    token_err: np.ndarray
    ffn_kernel_us: float
    ffn_merged_us: float


class StepModel:
    """The `simulate_prefill` step-time callback of one mode: ``step(batches) -> (duration_s, StepRecord)``.

    Deterministic: step k's routing and estimation noise come from ``default_rng([seed, k])``.
    """

    def __init__(self, config: CascadeConfig, mode: str):
        self.config = config
        self.mode = check_choice("mode", mode, LAYER_MODES, where="StepModel")
        self.costs = config.costs()
        self.model = MODELS[config.model]
        self.popularity = _routing_popularity(config)
        self.placements = _placements(config, self.popularity)
        self.contiguous = _contiguous_split(self.model.experts, config.num_ranks)
        self.noise_sigma = config.attention_noise * math.sqrt(math.pi / 2)
        self.key_budget = self.model.key_budget if config.attention == "sparse" else None
        self.steps = 0

    # -------------------------------------------------------------------------------------------- pieces
    def attention_us(self, batches: tuple[StepBatch, ...]) -> tuple[np.ndarray, np.ndarray]:
        """``([D] attention µs, [D] new tokens Q)`` of a step's batches (idle replicas: α0, Q = 0)."""
        att = np.empty(len(batches))
        Q = np.zeros(len(batches))
        for d, b in enumerate(batches):
            if b.num_chunks == 0:
                att[d] = self.costs.attention.alpha0
                continue
            q, pi = attention_features(b.P + b.q, b.P, self.key_budget)
            att[d] = float(self.costs.attention.predict(q, pi))
            Q[d] = float(q)
        return att, Q

    def split(self, layer: int, counts: np.ndarray) -> np.ndarray:
        """``[E, D]`` share of each expert's tokens per rank in ``layer`` for source counts ``[D, E]``."""
        if self.placements is None:
            return self.contiguous
        pl = self.placements[layer]
        if self.config.dispatch == "uniform":
            return pl.replicas_on_gpu / pl.logcnt[:, None]
        from solvers import DispatchProblem

        n = counts.sum(axis=0)
        x = solve(DispatchProblem(np.round(counts), pl, self.costs.tempo_cost_model()), "tempo").x
        uniform = pl.replicas_on_gpu / pl.logcnt[:, None]
        return np.where(n[:, None] > 0, x / np.maximum(n, 1)[:, None], uniform)

    def layer_pairs(self, layer: int, Q: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """``[D, D, E]`` pairs of one layer: multinomial K·Q_s draws per source, split over ranks."""
        p = self.popularity[layer]
        counts = np.stack([rng.multinomial(int(q) * self.model.top_k, p) for q in Q]).astype(np.float64)
        return counts[:, None, :] * self.split(layer, counts).T[None, :, :]

    # -------------------------------------------------------------------------------------------- step
    def __call__(self, batches: tuple[StepBatch, ...]) -> tuple[float, StepRecord]:
        cfg, costs, D = self.config, self.costs, self.config.num_ranks
        rng = np.random.default_rng([cfg.seed, self.steps])
        self.steps += 1
        # Step 1: attention per replica (true and predicted).
        att, Q = self.attention_us(batches)
        if cfg.estimates == "paper" and self.noise_sigma > 0:
            att_est = att * np.maximum(1.0 + self.noise_sigma * rng.standard_normal(D), 0.1)
        else:
            att_est = att.copy()
        att_err = np.where(Q > 0, np.abs(att_est - att) / att, np.nan)
        L = self.model.layers
        layer_us, base_us = np.empty(L), np.empty(L)
        gap = moves = moved = kernel_us = merged_us = 0.0
        token_err: list[np.ndarray] = []
        prev_recv = prev_pairs = None
        for layer in range(L):
            # Step 2: routing and dispatch of this layer.
            pairs = self.layer_pairs(layer, Q, rng)
            sent = pairs.sum(axis=2)
            remote = (sent * (1.0 - np.eye(D))).sum(axis=1)
            dispatch = costs.exchange_us(remote, costs.dispatch_bytes_per_pair)
            recv = sent.sum(axis=0)
            # Step 3: what the planner knows: previous-layer counts (App. D) or the truth.
            if cfg.estimates == "paper" and layer > 0:
                tokens_est, pairs_est = prev_recv, prev_pairs
                live = recv > 0
                token_err.append(np.abs(tokens_est[live] - recv[live]) / recv[live])
            elif cfg.estimates == "paper":  # first layer: nothing measured yet, assume an even spread
                tokens_est = np.full(D, recv.sum() / D)
                pairs_est = np.zeros_like(pairs)
                pairs_est[:, :, 0] = sent.sum(axis=1)[:, None] / D
            else:
                tokens_est, pairs_est = recv, pairs
            inputs = LayerInputs(
                attention_us=att,
                dispatch_us=dispatch,
                pairs=pairs,
                attention_est_us=att_est,
                pairs_est=pairs_est,
                tokens_est=tokens_est,
                oewf=layer > 0,
            )
            # Step 4: the layer's timeline.
            res = layer_timeline(inputs, costs, self.mode, guard=cfg.guard, pricing=cfg.pricing)
            layer_us[layer], base_us[layer] = res.end_us, res.base_end_us
            ready = inputs.ready_us
            gap += float((ready.max() - ready).sum())
            moves += len(res.accepted)
            moved += float(sum(r.n_trans for r in res.accepted))
            kernel_us += float(sum(k.duration_us for ks in res.kernels for k in ks))
            merged_us += float(costs.ffn_us(recv).sum())
            prev_recv, prev_pairs = recv, pairs
        record = StepRecord(
            attention_s=att * 1e-6,
            layer_us=layer_us,
            base_us=base_us,
            gap_us=gap,
            oewf_moves=int(moves),
            oewf_tokens=moved,
            attention_err=att_err,
            token_err=np.concatenate(token_err) if token_err else np.empty(0),
            ffn_kernel_us=kernel_us,
            ffn_merged_us=merged_us,
        )
        return float(layer_us.sum()) * 1e-6, record


# ------------------------------------------------------------------------------------------------ runs
def cascade_trace(config: CascadeConfig) -> RequestTrace:
    """The request trace a config serves: loaded (sample when offline), cut to ``max_requests``, rate-scaled."""
    if config.trace == "synthetic":
        trace = synthetic_requests(config.synthetic_requests, rate_rps=config.synthetic_rate_rps, seed=config.seed)
    elif config.trace == "mooncake_sample":
        trace = load_request_trace("mooncake_conversation", sample=True)
    else:
        try:
            trace = load_request_trace("mooncake_conversation")
        except FileNotFoundError:
            trace = load_request_trace("mooncake_conversation", sample=True)
    if config.max_requests is not None:
        trace = trace.head(min(config.max_requests, len(trace)))
    if config.rate_rps is not None:
        trace = trace.scale_rate(config.rate_rps)
    return trace


@dataclass(frozen=True, kw_only=True, eq=False)
class CascadeRun:
    """One mode's serving run: the `PrefillResult` (records are `StepRecord`s) and its layer statistics.

    Attributes:
      config, mode: what ran.
      prefill: the prefill simulation's result (TTFT, throughput, cache hits, ALB, per-step records).
      layer_us: ``[S, L]`` layer times; base_us: ``[S, L]`` without OEWF (cascade mode).
    """

    config: CascadeConfig
    mode: str
    prefill: PrefillResult
    layer_us: np.ndarray = field(repr=False)
    base_us: np.ndarray = field(repr=False)

    @property
    def records(self) -> tuple[StepRecord, ...]:
        return self.prefill.step_records

    @property
    def busy_s(self) -> float:
        """Σ of step durations: the time the engine ran (App. A's T_E2E for R_tail)."""
        return float(self.layer_us.sum()) * 1e-6

    @property
    def tail_ratio(self) -> float:
        """R_tail = Σ_i Σ_d w_{d,i} / (D · T_E2E) (App. A): idle share waiting for other replicas' dispatch."""
        gap = sum(r.gap_us for r in self.records) * 1e-6
        return gap / (self.config.num_ranks * self.busy_s)

    @property
    def oewf_reduction(self) -> np.ndarray:
        """Per layer forward with OEWF (layers ≥ 1): 1 − layer time / the same layer without OEWF."""
        return 1.0 - self.layer_us[:, 1:].ravel() / self.base_us[:, 1:].ravel()

    @property
    def attention_accuracy(self) -> float:
        """1 − mean relative error of the attention predictions (App. D's metric; paper 90.3%)."""
        err = np.concatenate([r.attention_err for r in self.records])
        err = err[np.isfinite(err)]
        return float(1.0 - err.mean()) if err.size else math.nan

    @property
    def token_accuracy(self) -> float:
        """1 − mean relative error of N̂ (previous layer's count) vs the true count (paper 85.9%)."""
        err = np.concatenate([r.token_err for r in self.records])
        return float(1.0 - err.mean()) if err.size else math.nan

    @property
    def ffn_efficiency(self) -> float:
        """Matched-work FFN efficiency: Σ F(all of a rank's tokens) / Σ F(each kernel) (paper: 97.3% for SF)."""
        kernel = sum(r.ffn_kernel_us for r in self.records)
        return sum(r.ffn_merged_us for r in self.records) / kernel if kernel else math.nan

    def summary(self) -> dict:
        s = self.prefill
        return {
            "mode": self.mode,
            "requests": s.num_requests,
            "steps": s.num_steps,
            "ttft_mean_s": s.ttft_mean_s,
            "ttft_p95_s": s.ttft_p95_s,
            "throughput_ktok_s": s.prompt_throughput_tps / 1e3,
            "cache_hit_rate": s.cache_hit_rate,
            "alb": s.alb_mean,
            "tail_ratio": self.tail_ratio,
            "oewf_moves": int(sum(r.oewf_moves for r in self.records)),
            "attention_accuracy": self.attention_accuracy,
            "token_accuracy": self.token_accuracy,
            "ffn_efficiency": self.ffn_efficiency,
        }


def _serve_mode(config: CascadeConfig, mode: str, *, progress: bool = False) -> CascadeRun:
    model = StepModel(config, mode)
    result = simulate_prefill(
        cascade_trace(config),
        step_time=model,
        num_replicas=config.num_ranks,
        policy=config.placement,
        max_batch_tokens=config.max_batch_tokens,
        cache_blocks=config.cache_blocks,
        seed=config.seed,
        progress=progress,
    )
    layer = np.stack([r.layer_us for r in result.step_records])
    base = np.stack([r.base_us for r in result.step_records])
    return CascadeRun(config=config, mode=mode, prefill=result, layer_us=layer, base_us=base)


def _cached_mode(config: CascadeConfig, mode: str, cache_dir) -> CascadeRun:
    return cached(_serve_mode, config, mode, cache_dir=cache_dir)[0]


def run_cascade(
    config: CascadeConfig,
    modes: tuple[str, ...] = LAYER_MODES,
    *,
    workers: int = 2,
    cache_dir: str | Path | None = CACHE_DIR,
    progress: bool = True,
) -> dict[str, CascadeRun]:
    """Serve ``config``'s trace once per mode (cached; modes in parallel worker processes).

    Returns:
      ``{mode: CascadeRun}`` in ``modes`` order.
    """
    for m in modes:
        check_choice("mode", m, LAYER_MODES, where="run_cascade")
    jobs = [(config, m, cache_dir) for m in modes]
    runs = run_jobs(_cached_mode, jobs, workers=workers, desc=f"cascade {config.placement}", progress=progress)
    return dict(zip(modes, runs, strict=True))


def step_batches(result: PrefillResult, step: int) -> tuple[StepBatch, ...]:
    """Rebuild the per-replica batches of one served step from the result's chunk log (for timeline plots)."""
    sel = result.chunk_step == step
    out = []
    for d in range(result.num_replicas):
        m = sel & (result.chunk_replica == d)
        rid = result.chunk_request[m]
        out.append(StepBatch(replica=d, request_ids=rid, q=result.chunk_q[m], P=result.chunk_P[m],
                             I=result.input_len[rid]))  # fmt: skip
    return tuple(out)
