"""The CascadeEP prefill simulator: requests → DEP forward steps → layer timelines (CascadeEP §3–4, App. A–D).

`run_cascade(config)` serves a request trace (`tempo_jax.workloads.RequestTrace`: the Mooncake trace, its
bundled sample, or a synthetic one) on D data-parallel attention replicas with `tempo_jax.sim.simulate_prefill` (request
placement, prefix caches, chunked-prefill batches) and times every forward step with a `StepModel`: for each of
the model's L MoE layers it draws the routing of the step's new tokens, builds the layer's `LayerInputs` and
runs `layer_timeline` in the configured mode. The step lasts the sum of its layers. One run per mode
(`LAYER_MODES`); the runs are cached and spread over worker processes by `tempo_jax.sim.runner`.

Per step the model uses (costs derived in `tempo_jax.sim.prefill`):

- **Attention** per replica and layer (`tempo_jax.sim.attention_truth`): the truth has one set of coefficients per
  layer class (V4's two KV-compression settings), per-sequence work Eq. 11 does not model, and lognormal
  step-to-step noise σ = ``attention_step_noise``; an idle replica runs a dummy batch (α0). With
  ``estimates="paper"`` the planners see `solvers.fit_attention` fitted on a profile of the truth over App. B's grid
  (their accuracy is an output, `CascadeRun.attention_accuracy`); ``"exact"`` gives them the truth.
- **Routing**: each replica's new tokens pick top-K experts; per layer, source s's pairs are a multinomial draw of
  ``K·Q_s`` pairs over the destination ranks with each rank's share of the layer's expert popularity — a recorded
  routing trace's layer loads (recorded experts split evenly into E / E_rec model experts; recorded layers reused
  cyclically) or Zipf(s) with a per-layer permutation. Experts sit ``E/D`` per rank in order. The rank-level counts
  are exactly the multinomial over experts summed per rank (the multinomial's aggregation property); within a
  (source, destination) pair the pairs split over the destination's experts in proportion to their popularity
  (the multinomial's mean, not a draw — OEWF's expert choice reads these shares). With ``replication > 1`` an EPLB
  placement per layer holds redundant replicas and the full per-expert multinomial is drawn; ``dispatch``
  (``"uniform"`` = EPLB-even, ``"tempo"``) splits each expert's tokens over them — TEMPO inside each rank's
  expert time, the two papers composed.
- **Token-count estimates** for OEWF and planned launching (App. D): N̂_d = the count rank d received in the
  previous layer (``estimates="paper"``) or the true count (``"exact"``); OEWF is skipped on the first layer.
- **The layer timeline**: ``timeline="fast"`` (default) runs `tempo_jax.sim.cascade_fast.step_timeline` over all
  layers of the step at once; ``"reference"`` runs `layer_timeline` layer by layer (the two agree to 1e-9;
  ``guard``, ``pricing="tempo"`` and ``replication > 1`` need the reference).

numpy + solvers only (no jax).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from solvers import Placement, attention_features, slots_for, solve
from solvers.checks import check_choice, check_int, check_real, plain_scalars
from tempo_jax.workloads import RequestTrace, load_trace, zipf_popularity
from tempo_jax.workloads.requests import load_mooncake, load_request_trace, synthetic_requests

from .attention_truth import AttentionTruth, attention_truth
from .cascade_fast import StepInputs, step_timeline, top_shares
from .cascade_layer import LAUNCHES, LAYER_MODES, LINKS, LayerInputs, layer_timeline
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
    "run_cascade_seeds",
    "workload_draw",
    "step_batches",
    "trace_digest",
    "trace_file",
]

_DISPATCH = ("uniform", "tempo")
_ESTIMATES = ("paper", "exact")
_PRICING = ("paper", "tempo")
#: Named request traces of `CascadeConfig.trace` (anything else is a path to a Mooncake-schema JSON-lines file).
TRACE_NAMES = ("mooncake", "mooncake_sample", "synthetic")
TIMELINES = ("fast", "reference")


#: Largest values of the size fields (each sizes arrays of the simulation: per-request state, the prefix cache,
#: per-step token buffers, per-rank timelines).
_SIZE_LIMITS = {
    "max_requests": 10**6,
    "synthetic_requests": 10**6,
    "max_batch_tokens": 2**22,
    "cache_blocks": 2**24,
    "num_ranks": 1024,
}


#: Options that act only with another option's value: name → (that option, its value).
_NEEDS = {
    "skew": ("routing", "zipf"),
    "synthetic_requests": ("trace", "synthetic"),
    "synthetic_rate_rps": ("trace", "synthetic"),
    "key_budget": ("attention", "sparse"),
}


@dataclass(frozen=True, kw_only=True)
class CascadeConfig:
    """One CascadeEP serving experiment (defaults: the paper's ablation set-up, DeepSeek-V4-Flash DP8 + EP8).

    Attributes:
      model, hardware: keys of `prefill.MODELS`, `prefill.HARDWARE`.
      num_ranks: D (attention replicas = EP ranks = GPUs).
      trace: ``"mooncake"`` (the full recording under the traces root; an error saying where to put it when it is
        missing, never a fallback), ``"mooncake_sample"`` (its first 400 requests, bundled), ``"synthetic"``
        (`synthetic_requests` with ``synthetic_rate_rps``), or the path of any JSON-lines file in the Mooncake
        schema (timestamp ms, input_length, output_length, hash_ids).
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
      key_budget: sparse attention's per-query key budget (None: the model's, 2,048 for V4-Flash); between the two
        extremes a larger budget sets the attention imbalance continuously (notebook 09 matches the paper's
        R_tail with it: `cascade_summary.budget_for_tail_ratio`).
      replication: physical slots / experts (1.0 = no redundancy; > 1: EPLB per layer).
      dispatch: how tokens split over replicas (``"uniform"`` EPLB-even, ``"tempo"``); needs replication > 1
        to matter.
      estimates: ``"paper"`` (fitted attention predictions, previous-layer token counts) or ``"exact"``.
      attention_step_noise: σ of the true attention time's lognormal step-to-step noise (per step, layer, replica).
      links: ``"contention"`` (serialised link ports; OEWF's fetches are protected transfers that yield to the
        dispatches, and the helper's reassigned kernel costs GPU time), ``"fifo"`` (the same with fetches served
        FIFO: the ablation) or ``"paper"`` (uncontended links, free fetches and helper work), see `cascade_layer`.
      launch: ``"reactive"`` (launch on actual per-source readiness and counts, the paper's runtime),
        ``"planned"`` (each destination's groups from predicted arrivals and previous-layer counts) or ``"layer"``
        (one schedule shared by every rank from the mean predicted tokens per destination: what
        `tempo_jax.layer.cascade_exec` executes); see `cascade_layer`.
      timeline: ``"fast"`` (all layers of a step at once) or ``"reference"`` (the scalar layer timeline).
      combine_scale: multiplies the combine's bytes per pair (1 = BF16 outputs; 0 = a free combine: the ablation
        that separates combine overlap from early FFN in notebook 09).
      guard: ``False`` (default) launches with each mode's own rule, as the paper does; ``True`` picks the best
        predicted policy up to the mode's own (see `layer_timeline`).
      pricing: OEWF's admission model (``"paper"`` or ``"tempo"``).
      synthetic_requests: requests of the synthetic trace.
      synthetic_rate_rps: the synthetic trace's Poisson arrival rate (requests per second).
      seed: seeds routing draws, estimation noise and placement tie-breaks, and — with ``vary_workload`` — the
        workload itself (`workload_draw`): seed 0 serves the trace and recording as they are.
      vary_workload: seed ≥ 1 also draws a workload: the window of the trace (read as a cycle: `RequestTrace.rotate`),
        which recorded layer each model layer replays, and how the experts are laid out over the ranks (a
        permutation of each layer's expert ids: another expert placement). False: seeds vary only the draws and
        the noise on one workload (the earlier behaviour, whose per-request TTFTs correlate ~0.99 across seeds).
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
    key_budget: int | None = None
    replication: float = 1.0
    dispatch: str = "uniform"
    estimates: str = "paper"
    attention_step_noise: float = 0.05
    links: str = "contention"
    launch: str = "reactive"
    timeline: str = "fast"
    combine_scale: float = 1.0
    guard: bool = False
    pricing: str = "paper"
    synthetic_requests: int = 1000
    synthetic_rate_rps: float = 5.0
    seed: int = 0
    vary_workload: bool = True

    def __post_init__(self) -> None:
        plain_scalars(self)
        fn = "CascadeConfig"
        check_choice("model", self.model, MODELS, where=fn)
        check_choice("hardware", self.hardware, HARDWARE, where=fn)
        check_int("num_ranks", self.num_ranks, where=fn)
        if not isinstance(self.trace, str) or not self.trace:
            raise ValueError(f"{fn}: trace must be one of {list(TRACE_NAMES)} or a file path, got {self.trace!r}")
        if self.trace not in TRACE_NAMES and not Path(self.trace).expanduser().is_file():
            raise ValueError(
                f"{fn}: trace={self.trace!r} is neither one of {list(TRACE_NAMES)} nor an existing file; give the "
                "path of a JSON-lines file in the Mooncake schema (timestamp ms, input_length, output_length, hash_ids)"
            )
        if self.max_requests is not None:
            check_int("max_requests", self.max_requests, where=fn)
        if self.rate_rps is not None:
            check_real("rate_rps", self.rate_rps, where=fn, minimum=0.0, strict=True)
        check_choice("placement", self.placement, PLACEMENT_POLICIES, where=fn)
        check_int("max_batch_tokens", self.max_batch_tokens, where=fn)
        check_int("cache_blocks", self.cache_blocks, where=fn)
        check_real("skew", self.skew, where=fn, minimum=0.0)
        check_choice("attention", self.attention, ("sparse", "dense"), where=fn)
        if self.key_budget is not None:
            check_int("key_budget", self.key_budget, where=fn, minimum=1)
        check_real("replication", self.replication, where=fn, minimum=1.0)
        check_choice("dispatch", self.dispatch, _DISPATCH, where=fn)
        check_choice("estimates", self.estimates, _ESTIMATES, where=fn)
        check_real("attention_step_noise", self.attention_step_noise, where=fn, minimum=0.0, maximum=0.5)
        check_choice("links", self.links, LINKS, where=fn)
        check_choice("launch", self.launch, LAUNCHES, where=fn)
        check_choice("timeline", self.timeline, TIMELINES, where=fn)
        check_real("combine_scale", self.combine_scale, where=fn, minimum=0.0)
        if self.timeline == "fast":
            slow = [
                f"{k}={v!r}"
                for k, v, ok in (
                    ("guard", self.guard, not self.guard),
                    ("pricing", self.pricing, self.pricing == "paper"),
                    ("replication", self.replication, self.replication == 1.0),
                )
                if not ok
            ]
            if slow:
                raise ValueError(
                    f"{fn}: timeline='fast' runs the paper's launch rules and pricing without redundant "
                    f"replicas; {', '.join(slow)} needs timeline='reference'"
                )
        check_choice("pricing", self.pricing, _PRICING, where=fn)
        if self.guard and self.launch == "layer":
            raise ValueError(
                f"{fn}: launch='layer' runs one schedule on every rank; guard=True would pick a launch "
                "policy per rank (use launch='planned' or 'reactive' with the guard)"
            )
        if self.dispatch == "tempo" and self.replication == 1.0:
            raise ValueError(
                f"{fn}: dispatch='tempo' needs replication > 1 (with one replica per expert every "
                "dispatch is the same, so it would be ignored); set replication, e.g. 1.25"
            )
        check_int("synthetic_requests", self.synthetic_requests, where=fn)
        for name, limit in _SIZE_LIMITS.items():  # sizes that drive allocations, checked before any work
            value = getattr(self, name)
            if value is not None and value > limit:
                raise ValueError(f"{fn}: {name}={value:,} exceeds the supported {limit:,}; lower it")
        check_real("synthetic_rate_rps", self.synthetic_rate_rps, where=fn, minimum=0.0, strict=True)
        check_int("seed", self.seed, where=fn, minimum=0)
        if MODELS[self.model].experts % self.num_ranks:
            raise ValueError(f"{fn}: {MODELS[self.model].experts} experts do not split over num_ranks={self.num_ranks}")
        if self.routing != "zipf":
            from tempo_jax.workloads import TRACES

            check_choice("routing", self.routing, (*TRACES, "zipf"), where=fn)
        # Options another option makes inert are refused, never ignored.
        default = {f.name: f.default for f in dataclasses.fields(self)}
        inert = [
            (name, f"{key}={value!r}")
            for name, (key, value) in _NEEDS.items()
            if getattr(self, key) != value and getattr(self, name) != default[name]
        ]
        if inert:
            name, why = inert[0]
            raise ValueError(
                f"{fn}: {name}={getattr(self, name)!r} acts only with {why} (here routing="
                f"{self.routing!r}, trace={self.trace!r}); drop {name} or set {why}"
            )

    def acting(self) -> dict:
        """The options that act in this config, as a dict (what a run's JSON records): every field but those another
        option makes inert (``skew`` without ``routing="zipf"``, the synthetic trace's sizes without
        ``trace="synthetic"``)."""
        return {
            k: v
            for k, v in dataclasses.asdict(self).items()
            if k not in _NEEDS or getattr(self, _NEEDS[k][0]) == _NEEDS[k][1]
        }

    def costs(self) -> PrefillCosts:
        """The deployment's `PrefillCosts` (combine bytes scaled by ``combine_scale``)."""
        costs = prefill_costs(self.model, self.hardware, self.num_ranks)
        if self.combine_scale == 1.0:
            return costs
        return dataclasses.replace(costs, combine_bytes_per_pair=costs.combine_bytes_per_pair * self.combine_scale)

    def attention_truth(self) -> AttentionTruth:
        """The true attention model and the planners' fits (`tempo_jax.sim.attention_truth`)."""
        budget = (self.key_budget or MODELS[self.model].key_budget) if self.attention == "sparse" else None
        return attention_truth(self.model, self.hardware, self.num_ranks, budget, float(self.attention_step_noise))


# ------------------------------------------------------------------------------------------------ routing
def workload_draw(seed: int, *, num_requests: int, recorded_layers: int, layers: int, experts: int) -> dict:
    """The workload seed ``seed`` ≥ 1 draws (`CascadeConfig.vary_workload`; each part from its own stream):
    ``{"start": first request of the trace window (`RequestTrace.rotate`), "layer_shift": model layer l replays
    recorded layer (l + shift) mod ``recorded_layers``, "expert_perm": [layers, experts] expert ids per layer (another
    layout of the experts over the ranks)}``; seed 0 draws the identity (start 0, shift 0, ``expert_perm`` None)."""
    if seed == 0:
        return {"start": 0, "layer_shift": 0, "expert_perm": None}
    start = int(np.random.default_rng([seed, 1]).integers(num_requests)) if num_requests else 0
    shift = int(np.random.default_rng([seed, 2]).integers(max(recorded_layers, 1)))
    perm = np.random.default_rng([seed, 3]).permuted(np.tile(np.arange(experts), (layers, 1)), axis=1)
    return {"start": start, "layer_shift": shift, "expert_perm": perm}


def _routing_popularity(config: CascadeConfig) -> np.ndarray:
    """``[L, E]`` expert popularity per model layer (each row sums to 1; computed once per process and key)."""
    if config.routing == "zipf":  # the seed draws the popularity itself
        return _popularity(config.model, config.routing, float(config.skew), config.seed, 0)
    return _popularity(config.model, config.routing, 0.0, 0, config.seed if config.vary_workload else 0)


@lru_cache(maxsize=8)
def _popularity(model_name: str, routing: str, skew: float, seed: int, workload_seed: int) -> np.ndarray:
    """`_routing_popularity` of one (model, routing, skew, seed, workload seed) (read-only)."""
    model = MODELS[model_name]
    L, E = model.layers, model.experts
    if routing == "zipf":
        out = np.stack([zipf_popularity(E, skew, seed=seed * 1000 + layer) for layer in range(L)])
        out.setflags(write=False)
        return out
    # The recording itself, or its bundled copy (the same counts, shipped with the package) when the shared traces
    # are not on disk: routing is a recording's name here, and both hold that recording's counts exactly.
    try:
        trace = load_trace(routing)
    except FileNotFoundError:
        from tempo_jax.workloads import load_sample

        trace = load_sample(routing)
    if E % trace.num_experts:
        raise ValueError(
            f"routing {routing!r} records {trace.num_experts} experts, which do not divide the model's {E}"
        )
    split = E // trace.num_experts
    draw = workload_draw(workload_seed, num_requests=0, recorded_layers=len(trace.layers), layers=L, experts=E)
    rows = []
    for layer in range(L):
        load = trace.expert_load(trace.layers[(layer + draw["layer_shift"]) % len(trace.layers)]).astype(np.float64)
        p = np.repeat(load / load.sum(), split) / split
        if draw["expert_perm"] is not None:  # another layout of the experts over the ranks
            p = p[draw["expert_perm"][layer]]
        rows.append(p)
    out = np.stack(rows)
    out.setflags(write=False)
    return out


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
      attention_s: ``[L, D]`` true attention-stage time of each replica in each layer (s) — `PrefillResult`
        computes ALB from it.
      layer_us: ``[L]`` each layer's time (µs) in this run's mode.
      base_us: ``[L]`` the same layers without OEWF (cascade mode; else equal to ``layer_us``).
      gap_us: Σ over layers and replicas of the readiness gap max_j r_j − r_d (App. A), µs.
      oewf_moves / oewf_tokens: accepted reassignments and moved tokens over the step's layers.
      oewf_dropped: accepted moves dropped at execution (weights after the donor's dispatch).
      oewf_longer: layers where OEWF's accepted moves made the layer longer than without them.
      attention_err: |â − a| / a of every (layer, replica) with tokens.
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
    oewf_dropped: int
    oewf_longer: int
    attention_err: np.ndarray
    token_err: np.ndarray
    ffn_kernel_us: float
    ffn_merged_us: float


class StepModel:
    """The `simulate_prefill` step-time callback of one mode: ``step(batches) -> (duration_s, StepRecord)``.

    Deterministic: step k's attention noise and routing come from ``default_rng([seed, k])``.
    """

    def __init__(self, config: CascadeConfig, mode: str):
        self.config = config
        self.mode = check_choice("mode", mode, LAYER_MODES, where="StepModel")
        self.costs = config.costs()
        self.model = MODELS[config.model]
        self.truth = config.attention_truth()
        self.popularity = _routing_popularity(config)
        self.placements = _placements(config, self.popularity)
        self.contiguous = _contiguous_split(self.model.experts, config.num_ranks)
        L, E, D = self.model.layers, self.model.experts, config.num_ranks
        pop = self.popularity.reshape(L, D, E // D)
        self.rank_share = pop.sum(axis=2)  # [L, D]
        self.expert_share = pop / np.where(self.rank_share > 0, self.rank_share, 1.0)[..., None]  # [L, D, S]
        self.top_share, self.fetch_experts = top_shares(
            self.expert_share, self.costs.expert_bytes, self.costs.helper_budget_bytes
        )
        self.layer_class = np.arange(L) % self.truth.classes
        self.key_budget = self.truth.key_budget
        self.steps = 0

    # -------------------------------------------------------------------------------------------- pieces
    def attention_us(self, batches: tuple[StepBatch, ...], rng: np.random.Generator | None = None):
        """``([L, D] true attention µs, [L, D] the planners' estimate, [D] new tokens Q)`` of a step's batches.

        Idle replicas run a dummy batch (α0, known to the planners). ``rng`` draws the step noise (None: none).
        """
        D, L = len(batches), self.model.layers
        m = np.array([b.num_chunks for b in batches], dtype=np.float64)
        P = np.concatenate([b.P for b in batches])
        I = P + np.concatenate([b.q for b in batches])
        Q, Pi = attention_features(
            I, P, self.key_budget, batch=np.repeat(np.arange(D), m.astype(np.int64)), num_batches=D
        )
        Q, Pi = Q.astype(np.float64), Pi.astype(np.float64)
        idle = Q == 0
        mean = self.truth.mean_us(Q, Pi, m)[self.layer_class]  # [L, D]
        noise = np.exp(self.truth.step_noise * rng.standard_normal((L, D))) if rng is not None else 1.0
        att = np.where(idle, self.truth.base.alpha0, mean * noise)
        if self.config.estimates == "exact":
            return att, att.copy(), Q
        est = np.maximum(self.truth.estimate_us(Q, Pi)[self.layer_class], 0.0)
        return att, np.where(idle, att, est), Q

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

    def rank_counts(self, Q: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """``[L, D, D]`` pairs source s sends to rank d per layer (no redundancy): a multinomial draw of K·Q_s pairs
        over the ranks' popularity shares (= the per-expert multinomial summed per rank)."""
        n = np.broadcast_to((Q.astype(np.int64) * self.model.top_k)[None, :], self.rank_share.shape)
        return rng.multinomial(n, self.rank_share[:, None, :]).astype(np.float64)

    def expert_pairs(self, layer: int, counts: np.ndarray) -> np.ndarray:
        """``[D, D, E]`` pairs of one layer from its rank-level ``counts [D, D]`` (no redundancy): each
        destination's pairs split over its experts by popularity."""
        D, S = counts.shape[0], self.expert_share.shape[2]
        out = np.zeros((D, D, D, S))
        out[:, np.arange(D), np.arange(D), :] = counts[:, :, None] * self.expert_share[layer][None, :, :]
        return out.reshape(D, D, D * S)

    def rank_sums(self, counts: np.ndarray) -> np.ndarray:
        """``[L, D, D]`` Σ over each destination's experts of `expert_pairs` (the same floats the reference sums)."""
        return (counts[..., None] * self.expert_share[:, None, :, :]).sum(axis=3)

    def layer_pairs(self, layer: int, Q: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """``[D, D, E]`` pairs of one layer with redundant replicas: multinomial K·Q_s draws per source over the
        experts, split over the replicas."""
        p = self.popularity[layer]
        counts = np.stack([rng.multinomial(int(q) * self.model.top_k, p) for q in Q]).astype(np.float64)
        return counts[:, None, :] * self.split(layer, counts).T[None, :, :]

    def step_inputs(self, batches: tuple[StepBatch, ...], rng: np.random.Generator) -> dict:
        """What every layer of the step needs, drawn in a fixed order: ``att``, ``att_est`` ``[L, D]``; ``pairs``,
        ``pairs_est`` (``[L, D, D]`` rank-level counts, or ``[L, D, D, E]`` with redundancy); ``sent``,
        ``sent_est`` ``[L, D, D]`` (their sums over experts); ``tokens_est``, ``dispatch`` ``[L, D]``;
        ``token_err``."""
        cfg, costs, D = self.config, self.costs, self.config.num_ranks
        att, att_est, Q = self.attention_us(batches, rng)
        full = self.placements is None
        if full:
            pairs = self.rank_counts(Q, rng)  # [L, D, D]
            sent = self.rank_sums(pairs)
        else:
            pairs = np.stack([self.layer_pairs(layer, Q, rng) for layer in range(self.model.layers)])
            sent = pairs.sum(axis=3)
        dispatch = costs.exchange_us((sent * (1.0 - np.eye(D))).sum(axis=2), costs.dispatch_bytes_per_pair)
        recv = sent.sum(axis=1)  # [L, D]
        if cfg.estimates == "paper":  # App. D: the previous layer's counts; the first layer assumes an even spread
            tokens_est = np.concatenate([np.full((1, D), recv[0].sum() / D), recv[:-1]])
            first = np.zeros_like(pairs[:1])
            if full:
                first[0] = sent[0].sum(axis=1)[:, None] / D
            else:
                first[0, :, :, 0] = sent[0].sum(axis=1)[:, None] / D
            pairs_est = np.concatenate([first, pairs[:-1]])
            share0 = self.expert_share[:1, None, :, :]
            first_sent = (first[..., None] * share0).sum(axis=3) if full else first.sum(axis=3)
            sent_est = np.concatenate([first_sent, sent[:-1]])  # the same floats as summing pairs_est again
            live = recv[1:] > 0
            token_err = np.abs(tokens_est[1:][live] - recv[1:][live]) / recv[1:][live]
        else:
            tokens_est, pairs_est, sent_est, token_err = recv, pairs, sent, np.empty(0)
        return dict(
            att=att,
            att_est=att_est,
            pairs=pairs,
            pairs_est=pairs_est,
            sent=sent,
            sent_est=sent_est,
            tokens_est=tokens_est,
            dispatch=dispatch,
            token_err=token_err,
            recv=recv,
        )

    # -------------------------------------------------------------------------------------------- step
    def __call__(self, batches: tuple[StepBatch, ...]) -> tuple[float, StepRecord]:
        cfg, costs = self.config, self.costs
        rng = np.random.default_rng([cfg.seed, self.steps])
        self.steps += 1
        L = self.model.layers
        # Step 1: attention, routing and the planners' estimates of every layer.
        x = self.step_inputs(batches, rng)
        att, att_est, pairs, pairs_est, dispatch = x["att"], x["att_est"], x["pairs"], x["pairs_est"], x["dispatch"]
        tokens_est = x["tokens_est"]
        # Step 2: the layers' timelines.
        if cfg.timeline == "fast":
            inputs = StepInputs(
                attention_us=att,
                attention_est_us=att_est,
                dispatch_us=dispatch,
                sent=x["sent"],
                sent_est=x["sent_est"],
                tokens_est=tokens_est,
                top_share=self.top_share,
                fetch_experts=self.fetch_experts,
                oewf=np.arange(L) > 0,
            )
            t = step_timeline(inputs, costs, self.mode, links=cfg.links, launch=cfg.launch)
            layer_us, base_us, ready = t.end_us, t.base_us, t.ready_us
            moves, moved, dropped, kernel_us = t.moves.sum(), t.moved_tokens.sum(), t.dropped.sum(), t.kernel_us.sum()
        else:
            layer_us, base_us, ready = np.empty(L), np.empty(L), np.empty((L, cfg.num_ranks))
            moves = moved = dropped = kernel_us = 0.0
            for layer in range(L):
                full = self.placements is None
                inp = LayerInputs(
                    attention_us=att[layer],
                    dispatch_us=dispatch[layer],
                    pairs=self.expert_pairs(layer, pairs[layer]) if full else pairs[layer],
                    attention_est_us=att_est[layer],
                    pairs_est=self.expert_pairs(layer, pairs_est[layer]) if full else pairs_est[layer],
                    tokens_est=tokens_est[layer],
                    oewf=layer > 0,
                )
                res = layer_timeline(
                    inp, costs, self.mode, links=cfg.links, launch=cfg.launch, guard=cfg.guard, pricing=cfg.pricing
                )
                layer_us[layer], base_us[layer], ready[layer] = res.end_us, res.base_end_us, res.ready_us
                moves += len(res.accepted)
                moved += float(sum(r.n_trans for r in res.accepted))
                dropped += res.dropped
                kernel_us += float(sum(k.duration_us for ks in res.kernels for k in ks))
        live = np.broadcast_to(np.array([b.num_chunks > 0 for b in batches])[None, :], att.shape)
        record = StepRecord(
            attention_s=att * 1e-6,
            layer_us=layer_us,
            base_us=base_us,
            gap_us=float((ready.max(axis=1, keepdims=True) - ready).sum()),
            oewf_moves=int(moves),
            oewf_tokens=float(moved),
            oewf_dropped=int(dropped),
            oewf_longer=int((layer_us > base_us * (1 + 1e-12)).sum()),
            attention_err=np.abs(att_est - att)[live] / att[live],
            token_err=x["token_err"],
            ffn_kernel_us=float(kernel_us),
            ffn_merged_us=float(costs.ffn_us(x["recv"]).sum()),
        )
        return float(layer_us.sum()) * 1e-6, record


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
        start = workload_draw(config.seed, num_requests=len(trace), recorded_layers=0, layers=0, experts=0)["start"]
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
    def oewf_longer(self) -> tuple[int, int, int]:
        """(layer forwards OEWF made longer, accepted moves, moves dropped at execution) over the run."""
        return (
            sum(r.oewf_longer for r in self.records),
            sum(r.oewf_moves for r in self.records),
            sum(r.oewf_dropped for r in self.records),
        )

    @property
    def oewf_reduction(self) -> np.ndarray:
        """Per layer forward with OEWF (layers ≥ 1): 1 − layer time / the same layer without OEWF."""
        return 1.0 - self.layer_us[:, 1:].ravel() / self.base_us[:, 1:].ravel()

    @property
    def attention_accuracy(self) -> float:
        """1 − mean relative error of the attention predictions over (step, layer, replica) with tokens (App. D's
        metric, computed online; paper 90.3%)."""
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
            "oewf_longer_layers": self.oewf_longer[0],
            "oewf_dropped": self.oewf_longer[2],
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


def _keyed_mode(config: CascadeConfig, mode: str, digest: str) -> CascadeRun:
    """`_serve_mode` with the trace content's digest in the cache key (unused otherwise)."""
    del digest
    return _serve_mode(config, mode)


def _cached_mode(config: CascadeConfig, mode: str, cache_dir, digest: str) -> CascadeRun:
    return cached(_keyed_mode, config, mode, digest, cache_dir=cache_dir)[0]


def run_cascade(
    config: CascadeConfig,
    modes: tuple[str, ...] = LAYER_MODES,
    *,
    workers: int = 2,
    cache_dir: str | Path | None = CACHE_DIR,
    progress: bool = True,
    backend: str | None = None,
) -> dict[str, CascadeRun]:
    """Serve ``config``'s trace once per mode (cached; modes in parallel jobs).

    Args:
      config: the experiment; modes: `LAYER_MODES` to run.
      workers: jobs in parallel; cache_dir: the cache folder (None: no cache); progress: a tqdm bar.
      backend: `run_jobs` backend (``"loky"`` local processes, ``"dask"`` a dask.distributed cluster).

    The cache key holds the config, the mode, a hash of the trace file's content and of every source file.

    Returns:
      ``{mode: CascadeRun}`` in ``modes`` order.
    """
    return run_cascade_seeds(
        config, modes, seeds=(config.seed,), workers=workers, cache_dir=cache_dir, progress=progress, backend=backend
    )[config.seed]


def run_cascade_seeds(
    config: CascadeConfig,
    modes: tuple[str, ...] = LAYER_MODES,
    *,
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4),
    workers: int = 2,
    cache_dir: str | Path | None = CACHE_DIR,
    progress: bool = True,
    backend: str | None = None,
) -> dict[int, dict[str, CascadeRun]]:
    """`run_cascade` for every seed of ``seeds`` (all (seed, mode) jobs in one pool): ``{seed: {mode: run}}``."""
    for m in modes:
        check_choice("mode", m, LAYER_MODES, where="run_cascade")
    if not seeds:
        raise ValueError("run_cascade_seeds: seeds is empty; give at least one seed")
    digest = trace_digest(config)
    cfgs = {s: dataclasses.replace(config, seed=int(s)) for s in seeds}
    jobs = [(cfgs[s], m, cache_dir, digest) for s in seeds for m in modes]
    runs = run_jobs(
        _cached_mode, jobs, workers=workers, desc=f"cascade {config.placement}", progress=progress, backend=backend
    )
    it = iter(runs)
    return {s: {m: next(it) for m in modes} for s in seeds}


def step_batches(result: PrefillResult, step: int) -> tuple[StepBatch, ...]:
    """Rebuild the per-replica batches of one served step from the result's chunk log (for timeline plots)."""
    sel = result.chunk_step == step
    out = []
    for d in range(result.num_replicas):
        m = sel & (result.chunk_replica == d)
        rid = result.chunk_request[m]
        out.append(
            StepBatch(replica=d, request_ids=rid, q=result.chunk_q[m], P=result.chunk_P[m], I=result.input_len[rid])
        )
    return tuple(out)
