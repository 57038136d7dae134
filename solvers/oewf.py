"""Opportunistic expert weight fetching, OEWF (CascadeEP §3.3, Algorithm 1, Eqs. 3–6; App. C, E).

Ranks that finished attention (helpers) fetch full expert weights from a rank still in attention (the
donor) and compute, on their own retained inputs, the tokens they had routed to those experts on the donor.
All times are µs measured from one planning instant (the decision instant of App. E), per rank d:

    T_d(S) = A_d + D_d + F(N_d)                                          (Eq. 3)

A_d remaining attention time (`AttentionModel.remaining`), D_d dispatch time, N_d estimated received
expert tokens (the previous MoE layer's count, App. D; OEWF is skipped on the first MoE layer), F the FFN
latency (`ThroughputCurve.ffn_time`, Eq. 2). For helper h, donor d and N_trans moved tokens, with fetched
weights ready at s_h:

    T_d(S') = A_d + D_d + F(N_d − N_trans)                               (Eq. 5)
    T_h(S') = T_h(S) + α_h·F(N_trans) = max(T_h(S), s_h + F(N_trans)),
    α_h = max(0, s_h + F(N_trans) − T_h(S)) / F(N_trans),
    accept iff max(T_d(S'), T_h(S')) ≤ max(T_d(S), T_h(S))              (Eq. 6)

Ranks outside {d, h} are untouched, so every accepted update keeps max_r T_r from growing (App. E).

Modelling choices where the paper is silent (also in the function docs):

* s_h = A_h + D_h + bytes / bandwidth_h: the helper issues its one fetch when its own dispatch completes
  (§3.3: "immediately after dispatch") and the copy runs at the helper's fetch bandwidth.
* A donor's FFN work counts as submitted from A_d + D_d on (Eq. 3's start); weights ready at or after that
  instant cannot take its tokens (App. C), the reassignment is rejected as ``"donor_started"``.
* F(N_d − N_trans) clamps at 0 tokens when the estimate N_d is below the moved tokens.
* The helper's own completion follows Eq. 3 like every rank; the wait for other sources' tokens is not
  modelled (as in the paper).

``pricing="tempo"`` (beyond the paper) replaces F by the TEMPO max-affine kernel time per rank,
t(G, N) = max(a + b·G, c + β·N) (`CostModel.kernel_only`; 0 when N = 0, no kernel runs):

* helper: T_h(S') = max(A_h + D_h + t(G_h + k, N_h + N_trans), s_h + t(k, N_trans)): the k fetched experts
  are new slots on the helper, each paying an activation b, and the merged load is priced as one rank load
  (streams share the GPU, so the reassigned work is not free when it "overlaps"); it cannot finish before
  its weights are ready plus its own time.
* donor: T_d(S') = A_d + D_d + t(G_d − m, N_d − N_trans), m = moved experts the donor no longer computes at
  all (no other source still sends it tokens of that expert, per ``pair_tokens`` of the current plan).

numpy only.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from .checks import check_array, check_choice
from .cost import CostModel
from .throughput import ThroughputCurve

__all__ = [
    "PRICINGS",
    "REJECT_REASONS",
    "FetchPlan",
    "LayerOEWF",
    "OEWFPlan",
    "OEWFState",
    "Reassignment",
    "Rejection",
    "TimedReassignment",
    "admit",
    "oewf_at_dispatch",
    "oewf_decide_at",
    "oewf_plan",
    "predicted_completion",
    "select_weights",
]

#: Valid ``pricing`` names: the paper's F(N) (Eqs. 2–6) or TEMPO's max-affine per-rank time.
PRICINGS = ("paper", "tempo")

#: Why a helper ends without a reassignment.
REJECT_REASONS = ("no_donor", "no_eligible_experts", "budget", "donor_started", "not_improving")


def _freeze(a: np.ndarray) -> np.ndarray:
    a = np.array(a, dtype=np.float64)
    a.setflags(write=False)
    return a


@dataclass(frozen=True, kw_only=True, eq=False)
class OEWFState:
    """A joint FFN execution plan S: the per-rank estimates OEWF reasons about (times in µs).

    Attributes:
      attention_us: ``[D]`` remaining attention time A_d (0 for ranks that finished; those are helpers).
      dispatch_us: ``[D]`` dispatch time D_d (dispatched tokens / profiled dispatch throughput).
      tokens: ``[D]`` estimated expert tokens N_d each rank computes.
      pair_tokens: ``[D, D, E]`` tokens source h routes to expert e hosted on destination d, still computed
        there under this plan.
      expert_bytes: ``[E]`` bytes to fetch one expert's full weights (> 0).
      budget_bytes: ``[D]`` (or a scalar for all) helper weight-buffer budget B_h, bytes.
      fetch_bytes_per_us: fetch bandwidth, bytes per µs (> 0): a scalar, ``[D]`` per helper, or ``[D, D]`` per
        (helper, donor) pair (two link classes: a donor on the helper's node over NVLink, others over the NIC).
      activated: ``[D]`` activated experts G_d (``pricing="tempo"`` only); default: experts with tokens in
        ``pair_tokens`` on each rank.
      floor_us: ``[D]`` earliest completion of each rank (set by accepted reassignments on helpers: their
        reassigned kernel ends at s_h + F(N_trans)); default zeros.
    """

    attention_us: np.ndarray
    dispatch_us: np.ndarray
    tokens: np.ndarray
    pair_tokens: np.ndarray
    expert_bytes: np.ndarray
    budget_bytes: np.ndarray
    fetch_bytes_per_us: np.ndarray
    activated: np.ndarray | None = None
    floor_us: np.ndarray | None = None

    def __post_init__(self) -> None:
        fn = "OEWFState"
        A = check_array(
            "attention_us", self.attention_us, where=fn, ndims=(1,), nonnegative=True, hint="remaining A_d per rank"
        )
        D = A.shape[0]
        if D == 0:
            raise ValueError(f"{fn}: attention_us is empty; give one value per EP rank")
        vec = {"shape": (D,), "nonnegative": True, "hint": f"one value per rank, D = {D}"}
        pair = check_array(
            "pair_tokens",
            self.pair_tokens,
            where=fn,
            ndims=(3,),
            nonnegative=True,
            hint="[source, destination, expert]",
        )
        if pair.shape[:2] != (D, D):
            raise ValueError(f"{fn}: pair_tokens must be [D, D, E] with D = {D}, got shape {pair.shape}")
        E = pair.shape[2]
        fields = {
            "attention_us": A,
            "dispatch_us": check_array("dispatch_us", self.dispatch_us, where=fn, **vec),
            "tokens": check_array("tokens", self.tokens, where=fn, **vec),
            "pair_tokens": pair,
            "expert_bytes": check_array(
                "expert_bytes",
                self.expert_bytes,
                where=fn,
                shape=(E,),
                positive=True,
                hint=f"bytes per expert, E = {E}",
            ),
        }
        for name in ("budget_bytes", "fetch_bytes_per_us"):
            v = check_array(
                name, getattr(self, name), where=fn, nonnegative=True, positive=name == "fetch_bytes_per_us"
            )
            pairwise = name == "fetch_bytes_per_us" and v.shape == (D, D)
            if not pairwise and (v.ndim not in (0, 1) or (v.ndim == 1 and v.shape != (D,))):
                also = f" or ({D}, {D}) per (helper, donor)" if name == "fetch_bytes_per_us" else ""
                raise ValueError(f"{fn}: {name} must be a scalar or shape ({D},){also}, got {v.shape}")
            fields[name] = v if pairwise else np.broadcast_to(v, (D,))
        G = (pair.sum(axis=0) > 0).sum(axis=1) if self.activated is None else self.activated
        fields["activated"] = check_array("activated", G, where=fn, **vec)
        fields["floor_us"] = check_array(
            "floor_us", np.zeros(D) if self.floor_us is None else self.floor_us, where=fn, **vec
        )
        for name, v in fields.items():
            object.__setattr__(self, name, _freeze(v))

    @classmethod
    def unchecked(cls, **fields) -> OEWFState:
        """Build a state from float64 arrays of the right shapes without validation (simulators' inner loops;
        ``activated`` and ``floor_us`` must be given, ``budget_bytes`` as ``[D]``, ``fetch_bytes_per_us`` as ``[D]``
        or ``[D, D]``)."""
        state = object.__new__(cls)
        for f in dataclasses.fields(cls):
            object.__setattr__(state, f.name, fields[f.name])
        return state

    @property
    def num_ranks(self) -> int:
        return self.attention_us.shape[0]

    @property
    def num_experts(self) -> int:
        return self.pair_tokens.shape[2]


@dataclass(frozen=True)
class _Pricer:
    """FFN time of one rank's load: F(N) (paper) or the max-affine kernel time t(G, N) (tempo)."""

    pricing: str
    curve: ThroughputCurve | None
    kernel: CostModel | None

    def time(self, G, N) -> np.ndarray:
        N = np.maximum(np.asarray(N, dtype=np.float64), 0.0)
        if self.pricing == "paper":
            return np.asarray(self.curve.ffn_time_unchecked(N))
        t = self.kernel.gpu_times(np.maximum(G, 0.0), N)
        return np.where(N > 0, t, 0.0)


def _pricer(fn: str, curve, pricing, cost) -> _Pricer:
    pricing = check_choice("pricing", pricing, PRICINGS, where=fn)
    if pricing == "paper":
        if not isinstance(curve, ThroughputCurve):
            raise ValueError(f"{fn}: pricing='paper' needs curve=ThroughputCurve (F of Eq. 2), got {curve!r}")
        return _Pricer("paper", curve, None)
    if not isinstance(cost, CostModel):
        raise ValueError(f"{fn}: pricing='tempo' needs cost=CostModel (max-affine per-rank time), got {cost!r}")
    return _Pricer("tempo", None, cost.kernel_only())


def _state(fn: str, state) -> OEWFState:
    if not isinstance(state, OEWFState):
        raise ValueError(f"{fn}: state must be an OEWFState, got {type(state).__name__}")
    return state


def _completion(state: OEWFState, pr: _Pricer) -> np.ndarray:
    ffn = pr.time(state.activated, state.tokens)
    return np.maximum(state.attention_us + state.dispatch_us + ffn, state.floor_us)


def predicted_completion(state: OEWFState, *, curve=None, pricing: str = "paper", cost=None) -> np.ndarray:
    """Predicted FFN completion T_d(S) = A_d + D_d + F(N_d) of every rank (µs, Eq. 3).

    Args:
      state: the plan S (`OEWFState`).
      curve: `ThroughputCurve` for F (``pricing="paper"``).
      pricing: ``"paper"`` or ``"tempo"`` (F replaced by ``cost``'s max-affine t(G_d, N_d)).
      cost: `CostModel` for ``pricing="tempo"``.

    Returns:
      ``[D]`` float64, never below ``state.floor_us`` (a helper's reassigned kernel end).
    """
    fn = "predicted_completion"
    return _completion(_state(fn, state), _pricer(fn, curve, pricing, cost))


@dataclass(frozen=True, kw_only=True)
class FetchPlan:
    """Algorithm 1's P_h = (h, d*, E_h, {T_{h d* e}}): which weights helper h fetches from donor d*.

    Attributes:
      helper, donor: ranks h and d*.
      experts: E_h, in selection order (tokens per byte descending).
      tokens: ``|T_{h d* e}|`` per selected expert (tokens h routed to e on d*).
      bytes: Σ_e b_e over E_h (≤ the helper's budget).
    """

    helper: int
    donor: int
    experts: tuple[int, ...]
    tokens: tuple[float, ...]
    bytes: float

    @property
    def n_trans(self) -> float:
        """N_trans: tokens moved from the donor to the helper."""
        return float(sum(self.tokens))


def _check_helper(fn: str, helper, state: OEWFState) -> int:
    if not isinstance(helper, int | np.integer) or not 0 <= helper < state.num_ranks:
        raise ValueError(f"{fn}: helper must be a rank in 0..{state.num_ranks - 1}, got {helper!r}")
    if state.attention_us[helper] > 0:
        raise ValueError(
            f"{fn}: rank {int(helper)} is still in attention (attention_us = "
            f"{state.attention_us[helper].item()!r} > 0); only ranks that finished attention (A = 0) can help"
        )
    return int(helper)


def _select(h: int, state: OEWFState, T: np.ndarray) -> tuple[FetchPlan | None, str, int | None]:
    """Algorithm 1 for helper h against plan S with completions ``T [D]``: (plan, reason, donor)."""
    # Step 1 (line 2–3): candidate donors are the other ranks still in attention.
    donors = np.flatnonzero(state.attention_us > 0)
    donors = donors[donors != h]
    if donors.size == 0:
        return None, "no_donor", None
    # Step 2 (line 4, Eq. 4): the donor with the latest predicted completion; ties to the lowest rank.
    d = int(donors[np.argmax(T[donors])])
    # Step 3 (line 5): experts h routed tokens to on d*, by tokens per byte descending, ties to lower id.
    sent = state.pair_tokens[h, d]
    eligible = np.flatnonzero(sent > 0)
    if eligible.size == 0:
        return None, "no_eligible_experts", d
    ratio = sent[eligible] / state.expert_bytes[eligible]
    ranked = eligible[np.lexsort((eligible, -ratio))]
    # Step 4 (lines 6–13): take experts while their bytes fit; stop at the first that does not.
    left = float(state.budget_bytes[h])
    chosen: list[int] = []
    for e in ranked:
        b = float(state.expert_bytes[e])
        if b > left:
            break
        chosen.append(int(e))
        left -= b
    if not chosen:
        return None, "budget", d
    # Step 5 (lines 14–17): the fetch plan P_h.
    plan = FetchPlan(
        helper=h,
        donor=d,
        experts=tuple(chosen),
        tokens=tuple(float(sent[e]) for e in chosen),
        bytes=float(state.expert_bytes[chosen].sum()),
    )
    return plan, "selected", d


def select_weights(helper: int, state: OEWFState, *, curve=None, pricing: str = "paper", cost=None):
    """Algorithm 1 (SelectWeights): the donor and expert weights helper h fetches, or ``None``.

    Donors are the ranks still in attention (A_d > 0) other than h; d* = argmax_d T_d(S) (Eq. 4, ties to the
    lowest rank). Eligible experts are those with ``pair_tokens[h, d*, e] > 0``, sorted by tokens per byte
    descending (ties to the lower expert id); they are taken greedily while ``expert_bytes`` fit the
    remaining budget B_h, stopping at the first that does not (the paper's ``break``; smaller experts
    further down are not tried).

    Args:
      helper: h, a rank with ``attention_us[h] == 0``.
      state: the current plan S.
      curve, pricing, cost: how T_d(S) is priced (see `predicted_completion`).

    Returns:
      A `FetchPlan`, or ``None`` when there is no donor, h sent nothing to d*, or the first expert exceeds
      the budget (`oewf_plan` reports which).
    """
    fn = "select_weights"
    state = _state(fn, state)
    pr = _pricer(fn, curve, pricing, cost)
    h = _check_helper(fn, helper, state)
    return _select(h, state, _completion(state, pr))[0]


@dataclass(frozen=True, kw_only=True)
class Reassignment:
    """An evaluated move of N_trans tokens from donor d to helper h (Eqs. 5–6), times in µs.

    Attributes:
      helper, donor, experts, tokens, bytes: the fetch plan (tokens per expert, total bytes).
      n_trans: moved tokens N_trans.
      ready_us: s_h, when the fetched weights are ready (the reassigned kernel's earliest launch).
      work_us: the reassigned kernel alone: F(N_trans) (paper) or t(k, N_trans) (tempo).
      alpha: α_h = (T_h(S') − T_h(S)) / work_us, the fraction of the reassigned work that extends the
        helper (Eq. 5); may exceed 1 when the helper would otherwise idle before the weights arrive.
      donor_before_us / donor_after_us: T_d(S), T_d(S').
      helper_before_us / helper_after_us: T_h(S), T_h(S').
      helper_new_experts: k, fetched experts the helper activates (= len(experts)).
      donor_dropped_experts: m, moved experts the donor no longer computes at all.
      accepted: Eq. 6 holds and the donor had not started.
      reason: ``"accepted"``, ``"donor_started"`` or ``"not_improving"``.
    """

    helper: int
    donor: int
    experts: tuple[int, ...]
    tokens: tuple[float, ...]
    bytes: float
    n_trans: float
    ready_us: float
    work_us: float
    alpha: float
    donor_before_us: float
    donor_after_us: float
    helper_before_us: float
    helper_after_us: float
    helper_new_experts: int
    donor_dropped_experts: int
    accepted: bool
    reason: str


def _admit(fetch: FetchPlan, state: OEWFState, pr: _Pricer, T: np.ndarray) -> Reassignment:
    h, d = fetch.helper, fetch.donor
    ex = np.asarray(fetch.experts, dtype=np.int64)
    n_trans = fetch.n_trans
    A, Dd, N, G = state.attention_us, state.dispatch_us, state.tokens, state.activated
    # Step 1: weights ready at s_h: the fetch starts when h's dispatch completes.
    bw = state.fetch_bytes_per_us
    s_h = float(A[h] + Dd[h] + fetch.bytes / (bw[h] if bw.ndim == 1 else bw[h, d]))
    # Step 2: experts the helper adds (k) and the donor drops (m: no other source still sends it e).
    k = int(ex.size)
    still_sent = (np.delete(state.pair_tokens[:, d, ex], h, axis=0) > 0).any(axis=0)
    m = int((~still_sent).sum())
    # Step 3: donor after (Eq. 5), tokens clamped at 0.
    T_d, T_h = float(T[d]), float(T[h])
    donor_after = float(max(A[d] + Dd[d] + pr.time(G[d] - m, max(0.0, N[d] - n_trans)), state.floor_us[d]))
    # Step 4: helper after: max(T_h(S), s_h + W) (paper) or the merged max-affine load (tempo).
    work = float(pr.time(k, n_trans))
    if pr.pricing == "paper":
        helper_after = max(T_h, s_h + work)
    else:
        merged = float(A[h] + Dd[h] + pr.time(G[h] + k, N[h] + n_trans))
        helper_after = max(merged, float(state.floor_us[h]), s_h + work)
    alpha = (helper_after - T_h) / work if work > 0 else 0.0
    # Step 5: eligibility (App. C: the donor's work is unsubmitted before A_d + D_d) and Eq. 6.
    if s_h >= A[d] + Dd[d]:
        ok, reason = False, "donor_started"
    elif max(donor_after, helper_after) <= max(T_d, T_h):
        ok, reason = True, "accepted"
    else:
        ok, reason = False, "not_improving"
    return Reassignment(
        helper=h,
        donor=d,
        experts=fetch.experts,
        tokens=fetch.tokens,
        bytes=fetch.bytes,
        n_trans=n_trans,
        ready_us=s_h,
        work_us=work,
        alpha=float(alpha),
        donor_before_us=T_d,
        donor_after_us=donor_after,
        helper_before_us=T_h,
        helper_after_us=float(helper_after),
        helper_new_experts=k,
        donor_dropped_experts=m,
        accepted=ok,
        reason=reason,
    )


def _check_fetch(fn: str, fetch, state: OEWFState) -> FetchPlan:
    if not isinstance(fetch, FetchPlan):
        raise ValueError(f"{fn}: fetch must be a FetchPlan (from select_weights), got {type(fetch).__name__}")
    _check_helper(fn, fetch.helper, state)
    if not 0 <= fetch.donor < state.num_ranks or fetch.donor == fetch.helper:
        raise ValueError(f"{fn}: fetch.donor = {fetch.donor!r} must be a rank other than the helper")
    if not fetch.experts or len(fetch.tokens) != len(fetch.experts):
        raise ValueError(f"{fn}: fetch needs ≥ 1 expert and one token count per expert, got {fetch!r}")
    if any(not 0 <= e < state.num_experts for e in fetch.experts):
        raise ValueError(f"{fn}: fetch.experts {fetch.experts} must lie in 0..{state.num_experts - 1}")
    check_array("fetch.tokens", fetch.tokens, where=fn, positive=True)
    check_array("fetch.bytes", fetch.bytes, where=fn, positive=True)
    return fetch


def admit(fetch: FetchPlan, state: OEWFState, *, curve=None, pricing: str = "paper", cost=None) -> Reassignment:
    """Cost-based reassignment decision once helper h's weights are ready (Eqs. 5–6, App. E).

    Prices the revised plan S' that moves ``fetch.n_trans`` tokens from the donor to the helper and accepts
    iff max(T_d(S'), T_h(S')) ≤ max(T_d(S), T_h(S)) (Eq. 6, ties accepted), provided the weights arrive
    before the donor submits its FFN work (s_h < A_d + D_d). Paper pricing: T_h(S') = max(T_h(S),
    s_h + F(N_trans)), i.e. α_h = max(0, s_h + F(N_trans) − T_h(S)) / F(N_trans); T_d(S') =
    A_d + D_d + F(max(0, N_d − N_trans)). Tempo pricing: see the module doc.

    Args:
      fetch: the `FetchPlan` from `select_weights` (on this ``state``).
      state: the latest joint plan S.
      curve, pricing, cost: see `predicted_completion`.

    Returns:
      A `Reassignment` with ``accepted`` and ``reason``; the state is not modified (`oewf_plan` applies it).
    """
    fn = "admit"
    state = _state(fn, state)
    pr = _pricer(fn, curve, pricing, cost)
    fetch = _check_fetch(fn, fetch, state)
    return _admit(fetch, state, pr, _completion(state, pr))


def _replaced(state: OEWFState, **changes) -> OEWFState:
    """A copy of a (validated) state with some arrays replaced by arrays derived from it (no re-validation)."""
    fields = {f.name: getattr(state, f.name) for f in dataclasses.fields(OEWFState)}
    return OEWFState.unchecked(**{**fields, **{k: _freeze(v) for k, v in changes.items()}})


def _apply(state: OEWFState, r: Reassignment) -> OEWFState:
    """The plan after an accepted reassignment: donor loses N_trans tokens, helper gains its new floor."""
    tokens = state.tokens.copy()
    activated = state.activated.copy()
    floor = state.floor_us.copy()
    pair = state.pair_tokens.copy()
    tokens[r.donor] = max(0.0, tokens[r.donor] - r.n_trans)
    activated[r.donor] = max(0.0, activated[r.donor] - r.donor_dropped_experts)
    pair[r.helper, r.donor, list(r.experts)] = 0.0
    floor[r.helper] = max(floor[r.helper], r.ready_us + r.work_us)
    return _replaced(state, tokens=tokens, activated=activated, floor_us=floor, pair_tokens=pair)


def _apply_tempo(state: OEWFState, r: Reassignment) -> OEWFState:
    """Tempo pricing also adds the moved tokens and the k fetched experts to the helper's own load."""
    s = _apply(state, r)
    tokens, activated = s.tokens.copy(), s.activated.copy()
    tokens[r.helper] += r.n_trans
    activated[r.helper] += r.helper_new_experts
    return _replaced(s, tokens=tokens, activated=activated)


@dataclass(frozen=True, kw_only=True, eq=False)
class Rejection:
    """A helper that ends without a reassignment.

    Attributes:
      helper: the rank.
      reason: one of `REJECT_REASONS`: ``"no_donor"`` (no other rank in attention), ``"no_eligible_experts"``
        (h routed nothing to d*), ``"budget"`` (d*'s best expert exceeds B_h), ``"donor_started"`` (weights
        ready only after the donor submitted its FFN), ``"not_improving"`` (Eq. 6 fails).
      donor: d* when one was chosen.
      proposal: the evaluated `Reassignment` for the last two reasons, else ``None``.
    """

    helper: int
    reason: str
    donor: int | None = None
    proposal: Reassignment | None = None


@dataclass(frozen=True, kw_only=True, eq=False)
class OEWFPlan:
    """Result of `oewf_plan` (times in µs from the planning instant).

    Attributes:
      accepted: accepted `Reassignment`s in decision order.
      rejected: `Rejection`s in decision order.
      completion_before_us / completion_after_us: ``[D]`` T_r(S_0) and T_r(S_K).
      layer_before_us / layer_after_us: predicted layer completion max_r T_r before and after.
      layer_trace_us: max_r T_r after each helper's decision (first entry: before any), non-increasing.
      state: the final plan S_K (moved pairs zeroed in ``pair_tokens``).
      pricing: ``"paper"`` or ``"tempo"``.
    """

    accepted: tuple[Reassignment, ...]
    rejected: tuple[Rejection, ...]
    completion_before_us: np.ndarray
    completion_after_us: np.ndarray
    layer_before_us: float
    layer_after_us: float
    layer_trace_us: tuple[float, ...]
    state: OEWFState
    pricing: str


def _helper_order(fn: str, helpers, state: OEWFState) -> list[int]:
    if helpers is None:
        # Ranks done with attention, by dispatch completion A + D (= D), ties to the lower rank.
        done = np.flatnonzero(state.attention_us == 0)
        return [int(h) for h in done[np.argsort(state.dispatch_us[done], kind="stable")]]
    order = [_check_helper(fn, h, state) for h in helpers]
    if len(set(order)) != len(order):
        raise ValueError(f"{fn}: helpers {list(helpers)} repeat a rank; each helper decides once per layer")
    return order


def oewf_plan(state: OEWFState, *, curve=None, pricing: str = "paper", cost=None, helpers=None) -> OEWFPlan:
    """OEWF for one MoE layer: helpers select weights and admit reassignments one after another (§3.3).

    Each helper runs Algorithm 1 (`select_weights`) and the admission test (`admit`) against the latest
    joint plan: an accepted reassignment lowers the donor's N_d (and, for ``pricing="tempo"``, its G_d),
    raises the helper's completion floor (tempo: also its G_h and N_h) and removes the moved
    ``pair_tokens``, before the next helper decides. Each helper decides once (App. C: one fetch decision
    per rank per layer forward; a rejection does not trigger another selection).

    Args:
      state: the no-fetch plan S_0 (`OEWFState`).
      curve: `ThroughputCurve` for F (``pricing="paper"``).
      pricing: ``"paper"`` (Eqs. 3–6) or ``"tempo"`` (max-affine per-rank time, see the module doc).
      cost: `CostModel` for ``pricing="tempo"``.
      helpers: ranks in decision order (each with ``attention_us == 0``); default: every rank that finished
        attention, by dispatch completion time A_h + D_h (ties to the lower rank).

    Returns:
      `OEWFPlan`. Under exact estimates layer_after_us ≤ layer_before_us (App. E, Proposition 1).
    """
    fn = "oewf_plan"
    # Step 1: validate and order the helpers.
    state = _state(fn, state)
    pr = _pricer(fn, curve, pricing, cost)
    order = _helper_order(fn, helpers, state)
    apply = _apply if pr.pricing == "paper" else _apply_tempo

    # Step 2: the no-fetch plan S_0.
    before = _completion(state, pr)
    trace = [float(before.max())]
    accepted: list[Reassignment] = []
    rejected: list[Rejection] = []

    # Step 3: helpers in order, each against the latest plan.
    cur, T = state, before
    for h in order:
        fetch, reason, donor = _select(h, cur, T)
        if fetch is None:
            rejected.append(Rejection(helper=h, reason=reason, donor=donor))
        else:
            r = _admit(fetch, cur, pr, T)
            if r.accepted:
                cur = apply(cur, r)
                T = _completion(cur, pr)
                accepted.append(r)
            else:
                rejected.append(Rejection(helper=h, reason=r.reason, donor=r.donor, proposal=r))
        trace.append(float(T.max()))

    # Step 4: package.
    return OEWFPlan(
        accepted=tuple(accepted),
        rejected=tuple(rejected),
        completion_before_us=_freeze(before),
        completion_after_us=_freeze(T),
        layer_before_us=trace[0],
        layer_after_us=trace[-1],
        layer_trace_us=tuple(trace),
        state=cur,
        pricing=pr.pricing,
    )


@dataclass(frozen=True, kw_only=True)
class TimedReassignment:
    """An accepted OEWF move with its absolute times (µs from the layer's start).

    Attributes:
      reassignment: the `Reassignment` (its times are relative to ``decided_us``).
      decided_us: the helper's decision instant (its dispatch completion).
      start_us / end_us: the helper's reassigned kernel: weights ready → F(N_trans) later.
    """

    reassignment: Reassignment
    decided_us: float
    start_us: float
    end_us: float


@dataclass(frozen=True, kw_only=True, eq=False)
class LayerOEWF:
    """`oewf_at_dispatch`'s result for one layer.

    Attributes:
      accepted: `TimedReassignment`s in decision order.
      rejected: helpers that decided without a move.
      pair_tokens: ``[D, D, E]`` the pairs each destination still computes (moved pairs zeroed).
    """

    accepted: tuple[TimedReassignment, ...]
    rejected: int
    pair_tokens: np.ndarray


def oewf_at_dispatch(
    ready_us,
    attention_est_us,
    dispatch_us,
    tokens_est,
    pair_tokens,
    *,
    expert_bytes,
    budget_bytes,
    fetch_bytes_per_us,
    curve: ThroughputCurve,
    pricing: str = "paper",
    cost: CostModel | None = None,
) -> LayerOEWF:
    """OEWF over one layer with per-helper decision instants (§3.3, App. C): each rank decides once, when its own
    dispatch completes (``ready_us``, ascending), against the latest joint plan, as a helper of the ranks still
    predicted to be in attention at that instant.

    At helper h's instant t the state is built relative to t: remaining attention ``max(0, â_d − t)``,
    remaining dispatch, the token estimates N̂ minus earlier moves, the pairs after earlier moves, and the
    floors of earlier helpers' reassigned kernels; then `oewf_plan` decides for h alone (Algorithm 1 + Eq. 6).
    Later helpers stop once no rank is predicted to be in attention.

    Args:
      ready_us: ``[D]`` when each rank finished dispatch (µs from the layer's start): its decision instant.
      attention_est_us: ``[D]`` predicted attention-stage times â_d (µs).
      dispatch_us: ``[D]`` dispatch times D_d (µs).
      tokens_est: ``[D]`` N̂_d, predicted expert tokens per rank.
      pair_tokens: ``[D, D, E]`` tokens source h routes to expert e on destination d.
      expert_bytes: ``[E]`` or a scalar; budget_bytes: a scalar or ``[D]``; fetch_bytes_per_us: a scalar, ``[D]``
        or ``[D, D]`` (helper, donor) (see `OEWFState`).
      curve, pricing, cost: see `oewf_plan`.

    Returns:
      `LayerOEWF`.
    """
    fn = "oewf_at_dispatch"
    # Step 1: validate once (the per-helper states below are built from these checked arrays).
    base = OEWFState(
        attention_us=attention_est_us,
        dispatch_us=dispatch_us,
        tokens=tokens_est,
        pair_tokens=pair_tokens,
        expert_bytes=np.broadcast_to(expert_bytes, np.shape(pair_tokens)[2:]),
        budget_bytes=budget_bytes,
        fetch_bytes_per_us=fetch_bytes_per_us,
    )
    D = base.num_ranks
    ready = check_array("ready_us", ready_us, where=fn, shape=(D,), nonnegative=True)
    pairs, n_hat, floor_abs = base.pair_tokens.copy(), base.tokens.copy(), np.zeros(D)
    last_attention = float(base.attention_us.max())
    accepted: list[TimedReassignment] = []
    rejected = 0
    for h in np.argsort(ready, kind="stable"):
        t = float(ready[h])
        if t >= last_attention:  # nobody is predicted to be in attention any more: no donor for later helpers
            break
        # Steps 2–4: the predicted state at the helper's instant, Algorithm 1 and Eq. 6, applied to the books.
        move = oewf_decide_at(base, int(h), t, pairs, n_hat, floor_abs, curve=curve, pricing=pricing, cost=cost)
        if move is None:
            rejected += 1
        else:
            accepted.append(move)
    return LayerOEWF(accepted=tuple(accepted), rejected=rejected, pair_tokens=pairs)


def oewf_decide_at(
    base: OEWFState,
    helper: int,
    t: float,
    pairs: np.ndarray,
    n_hat: np.ndarray,
    floor_abs: np.ndarray,
    *,
    curve: ThroughputCurve,
    pricing: str = "paper",
    cost: CostModel | None = None,
    exclude: np.ndarray | None = None,
) -> TimedReassignment | None:
    """One helper's OEWF decision at its instant ``t`` (µs from the layer's start), against the books so far.

    The state is built relative to t: remaining attention ``max(0, â_d − t)`` (``base.attention_us`` holds â,
    ``base.dispatch_us`` the dispatch times), remaining dispatch, the token estimates ``n_hat [D]`` and pairs
    ``pairs [D, D, E]`` after earlier moves, and the floors ``floor_abs [D]`` of earlier helpers' reassigned
    kernels; `oewf_plan` then decides for ``helper`` alone (Algorithm 1 + Eq. 6). Ranks with ``exclude[d]`` True
    (e.g. donors a runtime already saw start) are no donors. No validation: `oewf_at_dispatch` and the simulators
    pass checked arrays.

    Returns:
      the accepted `TimedReassignment` (``pairs``, ``n_hat`` and ``floor_abs`` updated in place: the donor loses
      the helper's pairs of the fetched experts, the helper's kernel ends at weights-ready + F(N_trans)), or None.
    """
    att, disp = base.attention_us, base.dispatch_us
    # Step 1: the predicted state at the instant (times relative to t).
    remaining = np.maximum(att - t, 0.0)
    remaining[helper] = 0.0
    if exclude is not None:
        remaining[exclude] = 0.0
    left = np.where(remaining > 0, disp, np.maximum(att + disp - t, 0.0))
    left[helper] = 0.0
    state = OEWFState.unchecked(
        attention_us=remaining,
        dispatch_us=left,
        tokens=n_hat.copy(),
        pair_tokens=pairs.copy(),
        expert_bytes=base.expert_bytes,
        budget_bytes=base.budget_bytes,
        fetch_bytes_per_us=base.fetch_bytes_per_us,
        activated=(pairs.sum(axis=0) > 0).sum(axis=1).astype(np.float64),
        floor_us=np.maximum(floor_abs - t, 0.0),
    )
    # Step 2: Algorithm 1 and Eq. 6 for this helper alone.
    plan = oewf_plan(state, curve=curve, pricing=pricing, cost=cost, helpers=[int(helper)])
    if not plan.accepted:
        return None
    # Step 3: apply: the donor loses the helper's pairs of the fetched experts; the helper runs a side kernel.
    r = plan.accepted[0]
    pairs[helper, r.donor, list(r.experts)] = 0.0
    n_hat[r.donor] = max(0.0, n_hat[r.donor] - r.n_trans)
    start = t + r.ready_us
    end = start + float(curve.ffn_time_unchecked(r.n_trans))
    floor_abs[helper] = max(floor_abs[helper], end)
    return TimedReassignment(reassignment=r, decided_us=t, start_us=start, end_us=end)
