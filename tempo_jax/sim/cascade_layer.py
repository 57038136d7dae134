"""One MoE layer of DEP prefill on D ranks under Sync / Async / Async+SF / CascadeEP (CascadeEP §3, Fig. 1).

Every rank d is one attention replica and one EP rank. Times are µs from the layer's start (all replicas start
a layer together: the layer barrier of §3.2).

1. **Attention, dispatch.** Replica d computes attention for ``a_d`` µs, then dispatches for ``D_d`` µs; its
   tokens are ready at every destination at ``r_d = a_d + D_d`` (App. A's readiness). Rank d's GPU runs its
   own attention and dispatch first, so its expert kernels start at ≥ r_d.
2. **Expert FFN per destination**, kernels one after another on the rank's GPU, each of N tokens lasting
   F(N) (`PrefillCosts.curve`), launched by a policy (`solvers.streamffn`):
   ``sync`` — one kernel once every source has arrived; ``async`` — one kernel per source as it arrives;
   ``stream`` — streamFFN's threshold θ and final flush.
3. **Combine.** Each kernel's outputs travel back right after it, while later kernels run; a rank is done when
   its last output has returned: max over its kernels of ``end + combine(remote pairs)``. The layer ends when
   every rank is done (the barrier).

Modes (`LAYER_MODES`): ``sync`` (synchronous EP), ``async`` (per-source launching), ``async_sf`` (+ streamFFN),
``cascade`` (+ OEWF on every layer but the first). By default (``guard=False``) each rank launches with its
mode's own rule, as the paper's ablation does: per-source kernels in Async even when every source has already
arrived, θ-grouped kernels in Async+SF. With ``guard=True`` a rank launches with the best of its mode's policy and
the previous modes' by its *predicted* completion (from the attention and token estimates it has — the same
predictions OEWF uses), so under exact estimates Sync ≥ Async ≥ Async+SF ≥ CascadeEP on every layer. The paper's
rules do not order every layer: on 1,200 random layers of ``tests/test_cascade_sim.py``'s generator with exact
estimates, Async ended later than Sync on 39 (by up to 9%: a straggler that already holds every source pays for
per-source kernels) and Async+SF later than Async on 131 (by up to 24%); OEWF never lengthened its Async+SF
base. Under the paper's noisy estimates the guard mispredicts often enough to cost more than it saves in
aggregate (notebook 09), so it is off by default.

**OEWF** (§3.3) runs on the Async+SF plan: helpers decide one after another at their dispatch completion
r_h, with `solvers.oewf_plan` on the predicted state at that instant (remaining attention from the estimates,
N̂ from the estimated per-rank counts, the helper's own routed pairs exactly). An accepted move takes the
helper's tokens for the fetched experts off the donor; the helper computes them in a side kernel on its own
stream from ``r_h + bytes / fetch bandwidth`` for F(N_trans), overlapping its other work without slowing it
(the paper's α_h model); its outputs stay local. The donor's launch policy is then chosen again.

numpy + solvers only (no jax).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from solvers import CostModel, LaunchGroup, Reassignment, oewf_at_dispatch
from solvers.checks import check_array, check_choice
from solvers.streamffn import partition_sources, run_partition

from .prefill import PrefillCosts

__all__ = ["LAYER_MODES", "LayerInputs", "LayerResult", "SideKernel", "layer_timeline"]

LAYER_MODES = ("sync", "async", "async_sf", "cascade")
# Launch policies a rank may pick in each mode: the mode's own last (guard=False keeps only that one).
_POLICIES = {
    "sync": ("sync",),
    "async": ("sync", "async"),
    "async_sf": ("sync", "async", "stream"),
    "cascade": ("sync", "async", "stream"),
}


@dataclass(frozen=True, kw_only=True, eq=False)
class LayerInputs:
    """What one layer's timeline needs (µs and tokens).

    Attributes:
      attention_us: ``[D]`` true attention-stage time of each replica.
      dispatch_us: ``[D]`` dispatch time of each replica.
      pairs: ``[D, D, E]`` true tokens source s routes to expert e computed on destination d.
      attention_est_us: ``[D]`` predicted attention times (default: exact).
      pairs_est: ``[D, D, E]`` predicted pairs for launch decisions (default: exact).
      tokens_est: ``[D]`` N̂_d for OEWF (default: exact received counts).
      oewf: run OEWF in ``cascade`` mode (False on the first MoE layer, §3.3).
    """

    attention_us: np.ndarray
    dispatch_us: np.ndarray
    pairs: np.ndarray
    attention_est_us: np.ndarray | None = None
    pairs_est: np.ndarray | None = None
    tokens_est: np.ndarray | None = None
    oewf: bool = True

    def __post_init__(self) -> None:
        fn = "LayerInputs"
        a = check_array("attention_us", self.attention_us, where=fn, ndims=(1,), nonnegative=True)
        D = a.shape[0]
        vec = {"where": fn, "shape": (D,), "nonnegative": True}
        pairs = check_array("pairs", self.pairs, where=fn, ndims=(3,), nonnegative=True)
        if pairs.shape[:2] != (D, D):
            raise ValueError(f"{fn}: pairs must be [D, D, E] with D = {D}, got {pairs.shape}")
        est_p = pairs if self.pairs_est is None else check_array("pairs_est", self.pairs_est, where=fn,
                                                                 shape=pairs.shape, nonnegative=True)  # fmt: skip
        fields = {
            "attention_us": a,
            "dispatch_us": check_array("dispatch_us", self.dispatch_us, **vec),
            "pairs": pairs,
            "attention_est_us": a
            if self.attention_est_us is None
            else check_array("attention_est_us", self.attention_est_us, **vec),  # fmt: skip
            "pairs_est": est_p,
            "tokens_est": pairs.sum(axis=(0, 2))
            if self.tokens_est is None
            else check_array("tokens_est", self.tokens_est, **vec),  # fmt: skip
        }
        for name, v in fields.items():
            object.__setattr__(self, name, v)

    @property
    def num_ranks(self) -> int:
        return int(self.attention_us.shape[0])

    @property
    def ready_us(self) -> np.ndarray:
        """``[D]`` r_d = a_d + D_d: when source d's tokens are ready at every destination."""
        return self.attention_us + self.dispatch_us


@dataclass(frozen=True)
class SideKernel:
    """An OEWF reassigned kernel on helper ``rank``: ``tokens`` of its own pairs, ``[start_us, end_us)``."""

    rank: int
    donor: int
    tokens: float
    start_us: float
    end_us: float


@dataclass(frozen=True, kw_only=True, eq=False)
class LayerResult:
    """One layer's timeline.

    Attributes:
      mode: the layer mode.
      end_us: the layer's end (every rank's outputs combined; the barrier).
      rank_end_us: ``[D]`` when each rank is done (last kernel + its combine, or its side kernel).
      ready_us: ``[D]`` r_d (attention + dispatch).
      policy: ``[D]`` launch policy each rank used (``sync`` / ``async`` / ``stream``).
      kernels: per rank, its kernels (`solvers.LaunchGroup`) in execution order.
      side: OEWF side kernels.
      accepted: accepted OEWF reassignments (times relative to their helper's decision instant r_h).
      rejected: number of helpers that decided without a reassignment.
      base_end_us: for ``cascade``: the same layer without OEWF (the Async+SF end); else ``end_us``.
    """

    mode: str
    end_us: float
    rank_end_us: np.ndarray
    ready_us: np.ndarray
    policy: tuple[str, ...]
    kernels: tuple[tuple[LaunchGroup, ...], ...]
    side: tuple[SideKernel, ...] = ()
    accepted: tuple[Reassignment, ...] = ()
    rejected: int = 0
    base_end_us: float = field(default=float("nan"))


def _done(costs: PrefillCosts, kernels, tokens, d: int, start: float) -> float:
    """When rank d is done: every kernel's outputs travel back right after it (in parallel with later kernels),
    so done = max over kernels of end + combine(its remote pairs); ``start`` if it ran nothing."""
    hw, per_pair = costs.hardware, costs.combine_bytes_per_pair
    done = start
    for k in kernels:
        remote = k.tokens - (float(tokens[d]) if d in k.sources else 0.0)
        combine = hw.link_latency_us + remote * per_pair / hw.link_bytes_per_us if remote > 0 else 0.0
        done = max(done, k.end_us + combine)
    return done


def _rank_plan(costs: PrefillCosts, ready, tokens, d: int, groups):
    """Kernels of destination d for a source partition ``groups`` and the rank's done time."""
    kernels = run_partition(groups, ready, tokens, costs.curve.ffn_time_unchecked, start_us=float(ready[d]))
    return kernels, _done(costs, kernels, tokens, d, float(ready[d]))


def _choose(costs, inp: LayerInputs, d: int, allowed: tuple[str, ...], pairs_est: np.ndarray, theta: float):
    """(policy, source partition) of the allowed launch policy with the earliest *predicted* done time for rank d
    (ties: the simpler one). The partition is what executes: streamFFN's groups are fixed by predicted arrivals."""
    ready_est = inp.attention_est_us + inp.dispatch_us
    tokens_est = pairs_est[:, d, :].sum(axis=1)
    best = None
    for p in allowed:
        groups = partition_sources(ready_est, tokens_est, p, theta)
        done = _rank_plan(costs, ready_est, tokens_est, d, groups)[1] if len(allowed) > 1 else 0.0
        if best is None or done < best[0]:
            best = (done, p, groups)
    return best[1], best[2]


def _run_ranks(costs, inp: LayerInputs, pairs, pairs_est, allowed, theta):
    """(policy [D], partitions [D], kernels per rank, done [D]): policies chosen by prediction, run on truth."""
    ready = inp.ready_us
    policy, partitions, kernels, done = [], [], [], np.empty(inp.num_ranks)
    for d in range(inp.num_ranks):
        p, groups = _choose(costs, inp, d, allowed, pairs_est, theta)
        k, done[d] = _rank_plan(costs, ready, pairs[:, d, :].sum(axis=1), d, groups)
        policy.append(p)
        partitions.append(groups)
        kernels.append(k)
    return tuple(policy), partitions, tuple(kernels), done


def _oewf(costs: PrefillCosts, inp: LayerInputs, pricing: str, cost: CostModel | None):
    """`solvers.oewf_at_dispatch` on the layer's predictions: (pairs after the moves, side kernels, accepted, no)."""
    res = oewf_at_dispatch(
        inp.ready_us, inp.attention_est_us, inp.dispatch_us, inp.tokens_est, inp.pairs,
        expert_bytes=costs.expert_bytes, budget_bytes=costs.helper_budget_bytes,
        fetch_bytes_per_us=costs.hardware.fetch_bytes_per_us, curve=costs.curve, pricing=pricing, cost=cost,
    )  # fmt: skip
    side = tuple(
        SideKernel(
            rank=a.reassignment.helper,
            donor=a.reassignment.donor,
            tokens=a.reassignment.n_trans,
            start_us=a.start_us,
            end_us=a.end_us,
        )  # fmt: skip
        for a in res.accepted
    )
    return res.pair_tokens, side, tuple(a.reassignment for a in res.accepted), res.rejected


def layer_timeline(
    inputs: LayerInputs,
    costs: PrefillCosts,
    mode: str,
    *,
    guard: bool = False,
    pricing: str = "paper",
    cost: CostModel | None = None,
) -> LayerResult:
    """Simulate one MoE layer under ``mode`` (see the module doc).

    Args:
      inputs: the layer's `LayerInputs` (true and predicted times and pairs).
      costs: the deployment's `PrefillCosts` (F(N), links, expert bytes, helper budget).
      mode: one of `LAYER_MODES`.
      guard: launch with the mode's own policy only (default, the paper's rules), or with the best predicted
        policy up to the mode's own (``True``).
      pricing: OEWF's admission model, ``"paper"`` (Eqs. 3–6) or ``"tempo"`` (max-affine, beyond the paper).
      cost: the `CostModel` for ``pricing="tempo"`` (default `PrefillCosts.tempo_cost_model`).

    Returns:
      `LayerResult`.
    """
    fn = "layer_timeline"
    mode = check_choice("mode", mode, LAYER_MODES, where=fn)
    if not isinstance(inputs, LayerInputs) or not isinstance(costs, PrefillCosts):
        raise ValueError(
            f"{fn}: needs LayerInputs and PrefillCosts, got {type(inputs).__name__}, {type(costs).__name__}"
        )
    if inputs.num_ranks != costs.num_ranks:
        raise ValueError(f"{fn}: inputs have {inputs.num_ranks} ranks but costs were derived for {costs.num_ranks}")
    allowed = _POLICIES[mode] if guard else _POLICIES[mode][-1:]
    theta = float(costs.threshold)
    # Step 1: every rank's launch policy and kernels (the Async+SF plan in cascade mode).
    policy, partitions, kernels, done = _run_ranks(costs, inputs, inputs.pairs, inputs.pairs_est, allowed, theta)
    base = float(done.max())
    if mode != "cascade" or not inputs.oewf:
        return LayerResult(mode=mode, end_us=base, rank_end_us=done, ready_us=inputs.ready_us, policy=policy,
                           kernels=kernels, base_end_us=base)  # fmt: skip
    # Step 2: OEWF on top. Ranks keep their launch groups (App. C: a donor keeps its launch eligibility even when
    # reassignment leaves it below θ) and run them with the pairs that stay; helpers add their side kernels.
    if pricing == "tempo" and cost is None:
        cost = costs.tempo_cost_model()
    pairs, side, accepted, rejected = _oewf(costs, inputs, pricing, cost)
    if accepted:
        ready = inputs.ready_us
        runs = [_rank_plan(costs, ready, pairs[:, d, :].sum(axis=1), d, partitions[d]) for d in range(len(ready))]
        kernels = tuple(k for k, _ in runs)
        done = np.array([t for _, t in runs])
        for k in side:
            done[k.rank] = max(done[k.rank], k.end_us)
    return LayerResult(
        mode=mode,
        end_us=float(done.max()),
        rank_end_us=done,
        ready_us=inputs.ready_us,
        policy=policy,
        kernels=kernels,
        side=side,
        accepted=accepted,
        rejected=rejected,
        base_end_us=base,
    )
