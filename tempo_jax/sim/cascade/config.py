"""`CascadeConfig`: one CascadeEP prefill experiment (model, hardware, trace, routing, each mode's options),
checked on construction."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from solvers.checks import check_choice, check_instance, check_int, check_real, plain_scalars

from .attention_truth import AttentionTruth, attention_truth
from .costs import HARDWARE, MODELS, PrefillCosts, check_gpus_per_node, prefill_costs
from .serving import PLACEMENT_POLICIES
from .vocabulary import COMMITS, LAUNCHES, LINKS

__all__ = ["TIMELINES", "TRACE_NAMES", "CascadeConfig"]

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


#: The largest sparse-attention key budget per query (beyond every context length; int64 arithmetic stays exact).
MAX_KEY_BUDGET = 1 << 31


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
        R_tail with it: `cascade.summary.budget_for_tail_ratio`).
      replication: physical slots / experts (1.0 = no redundancy; > 1: EPLB per layer).
      dispatch: how tokens split over replicas (``"uniform"`` EPLB-even, ``"tempo"``); needs replication > 1
        to matter.
      estimates: ``"paper"`` (fitted attention predictions, previous-layer token counts) or ``"exact"``.
      attention_step_noise: σ of the true attention time's lognormal step-to-step noise (per step, layer, replica).
      links: ``"contention"`` (serialised link ports; OEWF's fetches are protected transfers that yield to the
        dispatches, and the helper's reassigned kernel costs GPU time), ``"fifo"`` (the same with fetches served
        FIFO: the ablation) or ``"paper"`` (uncontended links, free fetches and helper work), see `reference_timeline`.
      launch: ``"reactive"`` (launch on actual per-source readiness and counts, the paper's runtime),
        ``"planned"`` (each destination's groups from predicted arrivals and previous-layer counts) or ``"layer"``
        (one schedule shared by every rank from the mean predicted tokens per destination: what
        `tempo_jax.layer.cascade_exec` executes); see `reference_timeline`.
      commit: App. C's commit of a reassigned kernel (`COMMITS`): ``"first"`` (the default: the helper's first idle
        interval from the weights' arrival, else abandoned) or ``"any"`` (the earliest idle interval that holds the
        whole kernel, wherever the helper's own kernels are not delayed); `reference_timeline.protected_start`.
      timeline: ``"fast"`` (all layers of a step at once) or ``"reference"`` (the scalar layer timeline).
      combine_scale: multiplies the combine's bytes per pair (1 = BF16 outputs; 0 = a free combine: the ablation
        that separates combine overlap from early FFN in notebook 09).
      link_scale: multiplies the hardware's link bandwidth — dispatch, combine and OEWF fetches alike (2 = twice the
        bandwidth; notebook 09's sensitivity sweep).
      gpus_per_node: ranks per node (None: every rank in one NVLink domain, the paper's 8-GPU testbed). With
        nodes, a transfer between two of them — a dispatch or combine chunk, an OEWF fetch — runs at the hardware's
        ``node_link_bytes_per_us`` (B200: 50 GB/s, one 400 Gb/s NIC per GPU) instead of NVLink's (`costs`).
      node_link_scale: multiplies the NIC bandwidth on top of ``link_scale`` (needs ``gpus_per_node``).
      helper_budget_experts: OEWF's helper weight buffer B_h in experts (None: the hardware's, 8; the paper gives no
        size, only that the buffer caps the budget).
      stream_rho: streamFFN's launch threshold θ as the fraction of peak FFN throughput it reaches (0.9, §3.2:
        θ = 28,672 tokens per rank for V4-Flash, Fig. 4).
      guard: ``False`` (default) launches with each mode's own rule, as the paper does; ``True`` picks the best
        predicted policy up to the mode's own (see `layer_timeline`).
      pricing: OEWF's admission model (``"paper"`` or ``"tempo"``).
      synthetic_requests: requests of the synthetic trace.
      synthetic_rate_rps: the synthetic trace's Poisson arrival rate (requests per second).
      seed: seeds routing draws, estimation noise and placement tie-breaks, and — with ``vary_workload`` — the
        workload itself (`workload_draw`): seed 0 serves the trace and recording as they are.
      vary_workload: seed ≥ 1 also draws a workload: the trace's seed-th window of ``max_requests`` requests (read as
        a cycle: `RequestTrace.rotate`; windows are disjoint while the trace holds them),
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
    commit: str = "first"
    timeline: str = "fast"
    combine_scale: float = 1.0
    link_scale: float = 1.0
    gpus_per_node: int | None = None
    node_link_scale: float = 1.0
    helper_budget_experts: int | None = None
    stream_rho: float = 0.9
    guard: bool = False
    pricing: str = "paper"
    synthetic_requests: int = 1000
    synthetic_rate_rps: float = 5.0
    seed: int = 0
    vary_workload: bool = True

    def timeline_options(self) -> dict:
        """The keywords `reference_timeline.layer_timeline` takes from this config: links, launch, guard, pricing
        and commit."""
        return dict(links=self.links, launch=self.launch, guard=self.guard, pricing=self.pricing, commit=self.commit)

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
            if self.key_budget > MAX_KEY_BUDGET:
                raise ValueError(
                    f"{fn}: key_budget={self.key_budget:,} exceeds {MAX_KEY_BUDGET:,} keys per query (longer than any "
                    "context the simulator serves); give at most that, or attention='dense' for no budget"
                )
        check_real("replication", self.replication, where=fn, minimum=1.0)
        check_choice("dispatch", self.dispatch, _DISPATCH, where=fn)
        check_choice("estimates", self.estimates, _ESTIMATES, where=fn)
        check_real("attention_step_noise", self.attention_step_noise, where=fn, minimum=0.0, maximum=0.5)
        check_choice("links", self.links, LINKS, where=fn)
        check_choice("launch", self.launch, LAUNCHES, where=fn)
        check_choice("commit", self.commit, COMMITS, where=fn)
        if self.commit != "first" and self.links == "paper":
            raise ValueError(
                f"{fn}: commit={self.commit!r} reads App. C's commit on the helper's GPU; links='paper' gives the "
                "helper a free side stream and commits every move (use links='contention' or 'fifo', or leave commit)"
            )
        check_choice("timeline", self.timeline, TIMELINES, where=fn)
        check_real("combine_scale", self.combine_scale, where=fn, minimum=0.0)
        check_real("link_scale", self.link_scale, where=fn, minimum=0.0, strict=True)
        check_gpus_per_node(self.gpus_per_node, self.num_ranks, where=fn)
        check_real("node_link_scale", self.node_link_scale, where=fn, minimum=0.0, strict=True)
        if self.gpus_per_node is None and self.node_link_scale != 1.0:
            raise ValueError(
                f"{fn}: node_link_scale={self.node_link_scale!r} scales the links between nodes, and without "
                "gpus_per_node every rank is on one node; set gpus_per_node (e.g. 8) or drop node_link_scale"
            )
        if self.helper_budget_experts is not None:
            check_int("helper_budget_experts", self.helper_budget_experts, where=fn, minimum=0)
        check_real("stream_rho", self.stream_rho, where=fn, minimum=0.0, maximum=1.0, strict=True)
        if self.stream_rho == 1.0:
            raise ValueError(
                f"{fn}: stream_rho=1.0 asks for peak FFN throughput, which F(N) reaches only at infinitely many "
                "tokens (θ = ∞); give a fraction below 1, e.g. 0.9"
            )
        for name in ("guard", "vary_workload"):  # a string such as "False" is truthy: never read one as a flag
            check_instance(name, getattr(self, name), bool, where=fn, hint="give True or False")
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
        ``trace="synthetic"``, ``node_link_scale`` on one node)."""
        return {
            k: v
            for k, v in dataclasses.asdict(self).items()
            if (k not in _NEEDS or getattr(self, _NEEDS[k][0]) == _NEEDS[k][1])
            and (k != "node_link_scale" or self.gpus_per_node is not None)
        }

    def costs(self) -> PrefillCosts:
        """The deployment's `PrefillCosts`: combine bytes scaled by ``combine_scale``, link, NIC and fetch bandwidth
        by ``link_scale`` (the NIC's also by ``node_link_scale``), nodes of ``gpus_per_node``, the helper buffer
        ``helper_budget_experts`` and θ at ``stream_rho``."""
        costs = prefill_costs(self.model, self.hardware, self.num_ranks, self.gpus_per_node)
        hw = costs.hardware
        budget = hw.helper_budget_experts if self.helper_budget_experts is None else self.helper_budget_experts
        hw = dataclasses.replace(
            hw,
            link_bytes_per_us=hw.link_bytes_per_us * self.link_scale,
            fetch_bytes_per_us=hw.fetch_bytes_per_us * self.link_scale,
            node_link_bytes_per_us=hw.node_link_bytes_per_us * self.link_scale * self.node_link_scale,
            helper_budget_experts=budget,
        )
        return dataclasses.replace(
            costs,
            hardware=hw,
            combine_bytes_per_pair=costs.combine_bytes_per_pair * self.combine_scale,
            stream_rho=self.stream_rho,
        )

    def attention_truth(self) -> AttentionTruth:
        """The true attention model and the planners' fits (`tempo_jax.sim.cascade.attention_truth`)."""
        budget = (self.key_budget or MODELS[self.model].key_budget) if self.attention == "sparse" else None
        return attention_truth(self.model, self.hardware, self.num_ranks, budget, float(self.attention_step_noise))
