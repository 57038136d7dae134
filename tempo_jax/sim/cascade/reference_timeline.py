"""One MoE layer of DEP prefill on D ranks under Sync / Async / Async+SF / CascadeEP (CascadeEP §3, Fig. 1).

This is the **reference** (scalar) timeline: plain loops over ranks, one layer at a time, every step spelled out.
`tempo_jax.sim.cascade.fast_timeline` computes the same numbers for all L layers of a step at once (tested equal to this
one to 1e-9 relative); the serving runs use that one.

Every rank d is one attention replica and one EP rank. Times are µs from the layer's start (all replicas start
a layer together: the layer barrier of §3.2).

1. **Attention, dispatch.** Replica d computes attention for ``a_d`` µs, then dispatches its remote token–expert
   pairs. Rank d's GPU runs its own attention first, so its expert kernels start at ≥ r_d (its dispatch done).
2. **Expert FFN per destination**, kernels one after another on the rank's GPU, each of N tokens lasting
   F(N) (`PrefillCosts.curve`), launched by a policy (`solvers.streamffn`):
   ``sync`` — one kernel once every source has arrived; ``async`` — one kernel per source as it arrives;
   ``stream`` — streamFFN's threshold θ and final flush.
3. **Combine.** Each kernel's outputs travel back right after it; a rank is done when its last output has
   left (and, on contended links, its own outputs are back). The layer ends when every rank is done (the
   barrier).

**Links** (``links``):

- ``"paper"`` (the model as the paper's equations read, and this simulator's first version): r_d = a_d + D_d with
  ``D_d = latency + remote bytes / link bandwidth``, the same at every destination; concurrent transfers never
  contend (every kernel's combine runs at full bandwidth beside the others); OEWF's weights are ready
  ``bytes / fetch bandwidth`` after the helper's dispatch and occupy no link; the helper's reassigned kernel runs
  on a side stream at no cost to its own kernels.
- ``"contention"`` (default): every rank has a send port and a receive port (full-duplex NVLink; D ≤ 8 sits in
  one node, so one intra-node port pair per rank), each of ``link_bytes_per_us``; over several nodes
  (``PrefillCosts.gpus_per_node``) a transfer between two nodes holds the same ports at ``node_link_bytes_per_us``
  (`PrefillCosts.link_bw`; the NIC's share and NVLink's in sequence). Transfers through a port are
  **serialised**, FIFO by the time they are issued (not fair-shared): a transfer holds the port for bytes /
  bandwidth and is delivered ``link_latency_us`` after the last of its ports has carried it. A source's dispatch
  leaves its send port as one all-to-all (its chunks progress together and finish together) and each chunk
  (s → d) also crosses d's receive port, so tokens from s arrive at d at ``max(r_s, chunk end at d) + latency``
  (in-port) — a per-(source, destination) readiness. An OEWF fetch (one expert buffer, issued when the helper's
  dispatch has left) crosses the donor's send port and the helper's receive port as a **protected transfer**
  (App. E: weight fetching "does not delay the current plan"): it runs in the ports' idle time and yields to every
  other transfer (`idle_fill`; a fetch issued before the donor's dispatch is paused while the dispatch holds the
  port, and what is left of it after the dispatch — a fetch then certain to arrive too late — never holds the
  port ahead of the donor's combines), so no dispatch, chunk or combine waits for it. A rank's combines (one per
  kernel, issued at the kernel's end) queue on its send port behind its dispatch (and, under ``"fifo"``, any fetch
  it served); each output chunk (d → s) also crosses s's receive port and arrives ``latency`` after the later of its
  two ports — the dispatch chunks' two-port model, applied to the combine (it serialises each port but does not
  re-time a sender whose chunk waits at a busy receiver: not a feasible flow schedule, an upper bound on neither
  side). A receive port serves **one FIFO by the time each chunk left its sender** over the dispatch chunks and the
  combine chunks into it (ties: dispatch chunks, then a FIFO fetch, then combines; lower sender first): a combine
  that left before a straggler's dispatch chunk is served ahead of it. As combines depend on kernels, which depend
  on arrivals, the ranks are run on the arrivals the previous pass's combines leave until those combines repeat
  (each transfer waits only for ones that left no later, so the passes settle in time order). A rank is done when
  its outputs have left and its own outputs are back. The helper's
  reassigned kernel runs on the helper's GPU, lasting ``F(N_trans) / HELPER_STREAM_EFFICIENCY`` — the paper's
  measured 97.3% retention of multi-stream execution (§4.3) as the efficiency of the second stream. Donors are
  the ranks still in attention at the helper's instant (§3.3: a rank the runtime has seen finish attention is no
  candidate, even while the estimates still place it there — its dispatch already holds its send port, so a fetch
  from it would arrive after its FFN started). A move commits at weight-ready as App. C does: only if the donor
  has not submitted the tokens' FFN (weights delivered before its dispatch left) and the helper's GPU has a
  protected interval for the whole kernel — the first idle interval from the weights' arrival, up to its next own
  kernel (`protected_start`; "without delaying existing work"). Otherwise the tokens stay with the donor (the
  fetch still used the links): **dropped at execution** when the weights arrive after the donor's dispatch left
  (`LayerResult.dropped`), **abandoned at commit** when they arrive in time but the helper's GPU has no protected
  interval (`LayerResult.abandoned`). A helper whose decision finds no move issues no fetch: **refused before a
  fetch** (`LayerResult.refused`).
- ``"fifo"``: as ``"contention"``, but fetches are served FIFO by issue time like any transfer (the ablation): a
  fetch can delay the donor's dispatch (queued behind it) and the tokens still arriving at the helper.

**Launch** (``launch``): ``"reactive"`` (default, the paper's runtime) launches on the actual per-source readiness
and actual token counts at each destination (a donor's counts before OEWF's moves: it keeps its original launch
eligibility, App. C; its kernels run on what is left); ``"planned"`` fixes each destination's launch groups from
the predicted arrivals (attention estimates + uncontended dispatch) and the predicted pairs (the previous layer's
counts), then runs them on the truth — what an in-graph schedule *per destination* would execute; ``"layer"`` is
the schedule `tempo_jax.layer.cascade_exec` executes today: one `solvers.LaunchSchedule.from_arrivals` partition
shared by every rank (the threshold on the *mean* predicted tokens per destination), run on the truth. (OEWF's
moves are decided alike in every launch mode, at each helper's dispatch on the predicted state; the layer's
`WeightFetch`es come from the same rule, `solvers.oewf_at_dispatch`, on the predictions.)

Modes (`LAYER_MODES`): ``sync`` (synchronous EP), ``async`` (per-source launching), ``async_sf`` (+ streamFFN),
``cascade`` (+ OEWF on every layer but the first). By default (``guard=False``) each rank launches with its
mode's own rule, as the paper's ablation does. With ``guard=True`` a rank launches with the best of its mode's
policy and the previous modes' by its *predicted* completion (the same predictions OEWF uses); under exact
estimates, paper links and planned launching this orders Sync ≥ Async ≥ Async+SF ≥ CascadeEP on every layer.

**OEWF** (§3.3) runs on the Async+SF plan: helpers decide one after another at their dispatch completion r_h,
with `solvers.oewf_decide_at` on the *predicted* state at that instant (remaining attention from the estimates,
N̂ from the estimated per-rank counts, the helper's own routed pairs exactly, weights ready after bytes / fetch
bandwidth). Admission (Eq. 6) therefore never sees contention or the helper's GPU time: under ``"contention"``
an accepted move can lengthen the layer; `LayerResult.base_end_us` is the same layer without OEWF, so
``end_us > base_end_us`` counts those. An accepted move takes the helper's tokens for the fetched experts off the
donor; its outputs stay local.

numpy + solvers only (no jax).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from solvers import CostModel, LaunchGroup, OEWFState, Reassignment, oewf_at_dispatch, oewf_decide_at
from solvers.checks import check_array, check_choice
from solvers.streamffn import partition_sources, run_partition

from .costs import PrefillCosts
from .vocabulary import COMMITS, HELPER_STREAM_EFFICIENCY, LAUNCHES, LAYER_MODES, LINKS, MODE_POLICIES

__all__ = [
    "LayerInputs",
    "LayerResult",
    "SideKernel",
    "idle_fill",
    "layer_timeline",
    "protected_start",
]


@dataclass(frozen=True, kw_only=True, eq=False)
class LayerInputs:
    """What one layer's timeline needs (µs and tokens).

    Attributes:
      attention_us: ``[D]`` true attention-stage time of each replica.
      dispatch_us: ``[D]`` uncontended dispatch time of each replica (latency + remote bytes / bandwidth; the
        planner's D_d).
      pairs: ``[D, D, E]`` true tokens source s routes to expert e computed on destination d.
      attention_est_us: ``[D]`` predicted attention times (default: exact).
      pairs_est: ``[D, D, E]`` predicted pairs for planned launch decisions (default: exact).
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
        est_p = (
            pairs
            if self.pairs_est is None
            else check_array("pairs_est", self.pairs_est, where=fn, shape=pairs.shape, nonnegative=True)
        )
        fields = {
            "attention_us": a,
            "dispatch_us": check_array("dispatch_us", self.dispatch_us, **vec),
            "pairs": pairs,
            "attention_est_us": a
            if self.attention_est_us is None
            else check_array("attention_est_us", self.attention_est_us, **vec),
            "pairs_est": est_p,
            "tokens_est": pairs.sum(axis=(0, 2))
            if self.tokens_est is None
            else check_array("tokens_est", self.tokens_est, **vec),
        }
        for name, v in fields.items():
            object.__setattr__(self, name, v)

    @property
    def num_ranks(self) -> int:
        return int(self.attention_us.shape[0])

    @property
    def ready_us(self) -> np.ndarray:
        """``[D]`` a_d + D_d: when source d's tokens are ready everywhere under uncontended links."""
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
      rank_end_us: ``[D]`` when each rank is done (last combine sent, or its side kernel).
      ready_us: ``[D]`` r_d: when each rank's dispatch has left (its GPU is free for expert kernels).
      arrival_us: ``[D, D]`` when source s's tokens are ready at destination d.
      policy: ``[D]`` launch policy each rank used (``sync`` / ``async`` / ``stream``).
      kernels: per rank, its kernels (`solvers.LaunchGroup`) in execution order.
      side: OEWF side kernels that ran.
      accepted: accepted OEWF reassignments (times relative to their helper's decision instant r_h).
      refused: helpers that decided without a reassignment (refused before a fetch: no donor in attention, no
        eligible expert, or Eq. 6 not met).
      abandoned: accepted moves abandoned at commit: the weights arrived before the donor's dispatch left, but the
        helper's GPU had no protected interval for the kernel (`protected_start`).
      dropped: accepted moves dropped at execution: the weights arrived after the donor's dispatch left (its FFN
        runs the tokens). ``len(side) + abandoned + dropped == len(accepted)``.
      base_end_us: for ``cascade``: the same layer without OEWF (the Async+SF end); else ``end_us``.
    """

    mode: str
    end_us: float
    rank_end_us: np.ndarray
    ready_us: np.ndarray
    arrival_us: np.ndarray
    policy: tuple[str, ...]
    kernels: tuple[tuple[LaunchGroup, ...], ...]
    side: tuple[SideKernel, ...] = ()
    accepted: tuple[Reassignment, ...] = ()
    refused: int = 0
    abandoned: int = 0
    dropped: int = 0
    base_end_us: float = field(default=float("nan"))


# ------------------------------------------------------------------------------------------------ links
@dataclass
class _Links:
    """What the links decided: readiness, arrivals, port state after the dispatch phase, and the moves."""

    ready: np.ndarray  # [D] dispatch left (GPU free for kernels)
    arrival: np.ndarray  # [D, D] source s ready at destination d
    send_free: np.ndarray  # [D] send port free after dispatch and served fetches
    moves: list  # [(TimedReassignment, delivered_us or None)] in decision order
    refused: int  # helpers that decided without a move
    # contended links: what the receive ports serve (`_receive`)
    start: np.ndarray | None = None  # [D] when each dispatch started on its send port
    chunk_us: np.ndarray | None = None  # [D, D] receive-port occupancy of the dispatch chunk s → d
    fetches: list = field(default_factory=list)  # [(TimedReassignment, donor send end)]
    protected: bool = True
    got: np.ndarray | None = None  # [D] when each rank has its outputs back (set by `_receive`)


def _paper_links(costs, inp: LayerInputs, run_oewf: bool, pricing, cost) -> _Links:
    """Uncontended links: r_d = a_d + D_d everywhere; OEWF as `solvers.oewf_at_dispatch` on the predictions."""
    ready = inp.ready_us
    D = inp.num_ranks
    moves, refused = [], 0
    if run_oewf:
        res = oewf_at_dispatch(
            ready,
            inp.attention_est_us,
            inp.dispatch_us,
            inp.tokens_est,
            inp.pairs,
            **costs.oewf_budget(),
            pricing=pricing,
            cost=cost,
        )
        moves, refused = [(a, a.start_us) for a in res.accepted], res.rejected
    return _Links(
        ready=ready,
        arrival=np.repeat(ready[:, None], D, axis=1),
        send_free=ready.copy(),
        moves=moves,
        refused=refused,
    )


def idle_fill(start: float, occupancy: float, busy) -> float:
    """When a transfer of ``occupancy`` µs that yields to every other transfer finishes on a port: it runs from
    ``start`` in the port's idle time around ``busy`` (the others' ``(start, end)`` intervals, in time order),
    paused while they hold the port."""
    cur, left = start, occupancy
    for s, e in busy:
        if e <= cur:
            continue
        if s > cur:
            if left <= s - cur:
                return cur + left
            left -= s - cur
        cur = e
    return cur + left


def _contended_links(
    costs, inp: LayerInputs, pairs: np.ndarray, run_oewf: bool, pricing, cost, protected: bool
) -> _Links:
    """Step 1 of the serialised ports (module doc): the send ports — dispatches and OEWF fetches in the order they
    are issued (``protected``: fetches yield to the dispatches, App. E; else FIFO by issue time). The receive ports,
    arrivals and the fetches' delivery come from `_receive`."""
    hw = costs.hardware
    lat, bw = hw.link_latency_us, costs.link_bw  # bw [s, d]: NVLink within a node, the NIC across nodes
    D = inp.num_ranks
    a = inp.attention_us
    sent = pairs.sum(axis=2)
    chunk = sent * (1.0 - np.eye(D)) * costs.dispatch_bytes_per_pair  # [s, d] bytes
    remote = chunk.sum(axis=1)
    dur = np.where(remote > 0, lat + costs.send_us(chunk), 0.0)  # [D] a dispatch alone on its send port
    # Step 1: dispatches in completion order; each helper decides (OEWF) when its own dispatch has left.
    free = np.zeros(D)  # send port: end of the fetches it served before its dispatch
    start, ready = np.full(D, np.nan), np.full(D, np.nan)
    after = np.zeros(D)  # send port: end of fetches served after its dispatch
    pending = np.ones(D, dtype=bool)
    base = (
        OEWFState(
            attention_us=inp.attention_est_us,
            dispatch_us=inp.dispatch_us,
            tokens=inp.tokens_est,
            pair_tokens=pairs,
            expert_bytes=np.broadcast_to(costs.expert_bytes, pairs.shape[2:]),
            budget_bytes=costs.helper_budget_bytes,
            fetch_bytes_per_us=costs.oewf_budget()["fetch_bytes_per_us"],
        )
        if run_oewf
        else None
    )
    books = (pairs.copy(), inp.tokens_est.astype(np.float64).copy(), np.zeros(D))
    last_attention = float(inp.attention_est_us.max())
    fetches = []  # (move, donor send end)
    refused = 0
    while pending.any():
        tentative = np.where(pending, np.maximum(a, free) + dur, np.inf)
        h = int(np.argmin(tentative))
        start[h], ready[h] = max(a[h], free[h]), tentative[h]
        pending[h] = False
        t = float(ready[h])
        if base is None or t >= last_attention:
            continue
        # §3.3: donors are the ranks still in attention at t (the runtime has seen the others leave it)
        gone = ~pending | (a <= t)
        move = oewf_decide_at(base, h, t, *books, curve=costs.curve, pricing=pricing, cost=cost, exclude=gone)
        if move is None:
            refused += 1
            continue
        d = move.reassignment.donor
        occ = move.reassignment.bytes / bw[d, h]
        if a[d] > t and protected:  # in the port's idle time before the donor's dispatch; the rest after it
            s0 = max(t, free[d])
            if s0 + occ <= a[d]:
                end = free[d] = s0 + occ
            else:
                end = max(a[d] + dur[d], after[d]) + occ - (a[d] - s0)
                free[d], after[d] = a[d], end
        elif a[d] > t:  # FIFO: issued before the donor's dispatch, which queues behind it
            end = max(t, free[d]) + occ
            free[d] = end
        else:  # the donor's dispatch is already on its port: the fetch follows it
            end = max(t, max(a[d], free[d]) + dur[d], after[d]) + occ
            after[d] = end
        fetches.append((move, end))
    # protected: what is left of a fetch after the donor's dispatch yields to its combines too (App. E)
    return _Links(
        ready=ready,
        arrival=np.repeat(ready[:, None], D, axis=1),
        send_free=ready if protected else np.maximum(ready, after),
        moves=[],
        refused=refused,
        start=start,
        chunk_us=chunk / bw,
        fetches=fetches,
        protected=protected,
    )


def _receive(costs, net: _Links, combines: tuple) -> _Links:
    """Step 2 of the contended links: every receive port serves **one FIFO by issue time** (ties: dispatch chunks,
    then the fetch, then combine chunks; lower sender first) over the dispatch chunks into its rank, its FIFO fetch
    (``"fifo"``) and the combine chunks into it (``combines``: ``(receiver, issued, sender, sent by, port µs)``, the
    previous pass's; `_timeline` repeats until they are the ones the ranks send). A protected fetch runs from its
    instant in the idle time between all of them (`idle_fill`). Returns ``net`` with the arrivals, the moves with
    their weights' delivery and ``got``."""
    lat, bw = costs.hardware.link_latency_us, costs.link_bw
    ready = net.ready
    D = ready.shape[0]
    arrival = np.repeat(ready[:, None], D, axis=1)
    got = np.zeros(D)
    delivered = {}
    fetch_at = {
        m.reassignment.helper: (m.reassignment.bytes / bw[m.reassignment.donor, m.reassignment.helper], end)
        for m, end in net.fetches
    }
    for d in range(D):
        items = [(net.start[s], 0, s, net.chunk_us[s, d], 0.0) for s in range(D) if net.chunk_us[s, d] > 0]
        if d in fetch_at and not net.protected:
            items.append((ready[d], 1, -1, fetch_at[d][0], 0.0))
        items += [(issued, 2, s, occ, sent) for r, issued, s, sent, occ in combines if r == d]
        port = 0.0
        busy = []  # every transfer's port interval
        for issued, kind, s, occ, sent in sorted(items):
            busy.append((max(issued, port), max(issued, port) + occ))
            port = busy[-1][1]
            if kind == 0:
                arrival[s, d] = max(ready[s], port + lat)
            elif kind == 1:
                delivered[d] = max(port, fetch_at[d][1]) + lat
            else:
                got[d] = max(got[d], max(sent, port) + lat)
        if d in fetch_at and net.protected:
            delivered[d] = max(idle_fill(float(ready[d]), fetch_at[d][0], busy), fetch_at[d][1]) + lat
    moves = [(m, delivered[m.reassignment.helper]) for m, _ in net.fetches]
    return replace(net, arrival=arrival, moves=moves, got=got)


# ------------------------------------------------------------------------------------------------ ranks
def _partition(costs, inp: LayerInputs, d: int, allowed, theta, arrival, tokens, launch):
    """(policy, source partition) of destination d: the allowed policy with the earliest *predicted* done time
    (ties: the simpler one); the partition from the predictions (planned) or the actual readiness (reactive)."""
    ready_est = inp.attention_est_us + inp.dispatch_us
    if launch == "layer":  # one schedule for every rank: the mean predicted tokens per destination
        tokens_est = inp.pairs_est.sum(axis=(1, 2)) / inp.num_ranks
    else:
        tokens_est = inp.pairs_est[:, d, :].sum(axis=1)
    best = None
    for p in allowed:
        groups = partition_sources(ready_est, tokens_est, p, theta)
        done = (
            _paper_done(
                costs,
                run_partition(
                    groups, ready_est, tokens_est, costs.curve.ffn_time_unchecked, start_us=float(ready_est[d])
                ),
                tokens_est,
                d,
                float(ready_est[d]),
            )
            if len(allowed) > 1
            else 0.0
        )
        if best is None or done < best[0]:
            best = (done, p, groups)
    if launch == "reactive":
        return best[1], partition_sources(arrival, tokens, best[1], theta)
    return best[1], best[2]


def _paper_done(costs: PrefillCosts, kernels, tokens, d: int, start: float) -> float:
    """Uncontended combine: every kernel's outputs leave right after it at full bandwidth, beside the others."""
    hw, per_pair = costs.hardware, costs.combine_bytes_per_pair
    done = start
    for k in kernels:
        remote = k.tokens - (float(tokens[d]) if d in k.sources else 0.0)
        cross = _cross_tokens(costs, k, tokens, d)
        combine = hw.link_latency_us + float(costs.port_us(remote * per_pair, cross * per_pair)) if remote > 0 else 0.0
        done = max(done, k.end_us + combine)
    return done


def _cross_tokens(costs: PrefillCosts, kernel, tokens, d: int) -> float:
    """Tokens of ``kernel`` on rank d that came from (and return to) other nodes."""
    return sum(float(tokens[s]) for s in kernel.sources if costs.cross_node[d, s])


def _contended_done(costs: PrefillCosts, kernels, tokens, d: int, start: float, port: float, sends: list) -> float:
    """Serialised combine: the kernels' outputs queue on the rank's send port (free from ``port``) in kernel order.
    Appends each output chunk ``(source, left at, d, sent by, receive-port µs)`` to ``sends``."""
    hw, per_pair = costs.hardware, costs.combine_bytes_per_pair
    done = start
    for k in kernels:
        remote = k.tokens - (float(tokens[d]) if d in k.sources else 0.0)
        if remote > 0:
            s0 = max(k.end_us, port)
            port = s0 + float(costs.port_us(remote * per_pair, _cross_tokens(costs, k, tokens, d) * per_pair))
            done = max(done, port + hw.link_latency_us)
            sends += [
                (s, s0, d, port, float(tokens[s]) * per_pair / costs.link_bw[d, s])
                for s in k.sources
                if s != d and tokens[s] > 0
            ]
        else:
            done = max(done, k.end_us)
    return done


def _rank_kernels(costs, inp: LayerInputs, net, pairs, d: int, allowed, theta, launch):
    """(policy, kernels, tokens [D]) of rank d's own launch groups on ``pairs``, run back to back from its
    dispatch; a donor keeps its launch eligibility: groups from the tokens before the moves (App. C)."""
    tokens = pairs[:, d, :].sum(axis=1)
    arrival = net.arrival[:, d]
    p, groups = _partition(costs, inp, d, allowed, theta, arrival, inp.pairs[:, d, :].sum(axis=1), launch)
    ks = run_partition(groups, arrival, tokens, costs.curve.ffn_time_unchecked, start_us=float(net.ready[d]))
    return p, ks, tokens


def protected_start(kernels, ready: float, duration: float, commit: str = "first") -> float | None:
    """App. C's commit: the start of a reassigned kernel of ``duration`` µs whose weights are ready at ``ready``,
    in the first idle interval of the helper's GPU from then (after the own kernel running then, if any) — or None
    when that interval ends, at the next own kernel's start, before the kernel would (it would delay existing
    work: the reassignment is abandoned and the tokens stay with the donor). ``commit="any"`` (`COMMITS`: the other
    reading) takes the earliest idle interval from then that holds the whole kernel, before or after the helper's
    later kernels, so it never delays them and never abandons. ``kernels``: the helper's own, in execution order."""
    s0 = ready
    for k in kernels:
        if k.end_us <= s0:
            continue
        if k.start_us <= s0:
            s0 = k.end_us
            continue
        if s0 + duration <= k.start_us:
            return s0
        if commit == "first":
            return None
        s0 = k.end_us  # "any": the interval after this kernel
    return s0


def _timeline(
    costs, inp: LayerInputs, allowed, theta, links: str, launch: str, run_oewf: bool, pricing, cost, commit="first"
):
    """(done [D], policy, kernels, side, links, (abandoned, dropped)) of one layer, with or without OEWF.

    Contended links: the receive ports serve the dispatch and combine chunks in one FIFO by issue time, and the
    combines depend on the kernels, which depend on the arrivals: the ranks are run on the arrivals the previous
    pass's combines leave, until those leave the arrivals and the fetches' delivery as they were (then the ranks
    would run as they did). Every transfer waits only for transfers issued no later, each issued after what it
    depends on arrived, so each pass settles the next transfers in time order and the passes end (at most one per
    transfer; on the served traces one, sometimes two)."""
    if links == "paper":
        net = _paper_links(costs, inp, run_oewf, pricing, cost)
        done, policy, kernels, side, lost, _ = _ranks(costs, inp, net, allowed, theta, links, launch, commit)
        return done, policy, kernels, side, net, lost
    sent = _contended_links(costs, inp, inp.pairs, run_oewf, pricing, cost, protected=links == "contention")
    net = _receive(costs, sent, ())
    for _ in range(2 * inp.num_ranks**2 + 2):
        done, policy, kernels, side, lost, sends = _ranks(costs, inp, net, allowed, theta, links, launch, commit)
        nxt = _receive(costs, sent, tuple(sends))
        if np.array_equal(nxt.arrival, net.arrival) and [t for _, t in nxt.moves] == [t for _, t in net.moves]:
            # the ranks would run as they did: a rank is done when its outputs have left and its own are back
            return np.maximum(done, nxt.got), policy, kernels, side, nxt, lost
        net = nxt
    raise RuntimeError("layer_timeline: the receive ports did not settle (a transfer waits for a later one)")


def _ranks(costs, inp: LayerInputs, net: _Links, allowed, theta, links: str, launch: str, commit: str = "first"):
    """(done [D], policy, kernels, side, (abandoned, dropped), combine chunks) of every rank on the links' arrivals."""
    D = inp.num_ranks
    # Step 1: the moves that commit, in decision order (App. C, at weight-ready): the donor has not submitted the
    # tokens' FFN (weights delivered before its dispatch left) and the helper's GPU has a protected interval for
    # the whole kernel. A rank that helps is no donor of a later move (it has left attention), so each helper's
    # own kernels are final when its move commits.
    pairs = inp.pairs.copy()
    sides: dict[int, tuple] = {}  # helper → (donor, tokens, start, end)
    abandoned = dropped = 0
    for m, delivered in net.moves:
        r = m.reassignment
        if links == "paper":  # the paper's model: weights ready at the planned instant, a free side stream
            sides[r.helper] = (r.donor, r.n_trans, delivered, m.end_us)
        else:
            duration = float(costs.curve.ffn_time_unchecked(r.n_trans)) / HELPER_STREAM_EFFICIENCY
            if delivered >= net.ready[r.donor]:  # the donor's dispatch left: its FFN runs the tokens
                dropped += 1
                continue
            own = _rank_kernels(costs, inp, net, pairs, r.helper, allowed, theta, launch)[1]
            s0 = protected_start(own, delivered, duration, commit)
            if s0 is None:  # no protected interval on the helper's GPU
                abandoned += 1
                continue
            sides[r.helper] = (r.donor, r.n_trans, s0, s0 + duration)
        pairs[r.helper, r.donor, list(r.experts)] = 0.0
    # Step 2: per rank, launch groups and kernels; the combine; the helper's side kernel.
    done = np.empty(D)
    policy, kernels, side = [], [], []
    sends: list = []  # combine chunks (contended links)
    for d in range(D):
        p, ks, tokens = _rank_kernels(costs, inp, net, pairs, d, allowed, theta, launch)
        start = float(net.ready[d])
        if links == "paper":
            done[d] = _paper_done(costs, ks, tokens, d, start)
        else:
            done[d] = _contended_done(costs, ks, tokens, d, start, float(net.send_free[d]), sends)
        if d in sides:
            donor, n, s0, s1 = sides[d]
            done[d] = max(done[d], s1)
            side.append(SideKernel(rank=d, donor=donor, tokens=n, start_us=s0, end_us=s1))
        policy.append(p)
        kernels.append(ks)
    return done, tuple(policy), tuple(kernels), tuple(side), (abandoned, dropped), sends


def _result(mode: str, done: np.ndarray, net, policy, kernels, **extra) -> LayerResult:
    """The `LayerResult` of one timeline: rank ends ``done`` [D] (µs), the network's ready and arrival times, the
    launch policy and kernels, and ``extra`` fields."""
    return LayerResult(
        mode=mode,
        end_us=float(done.max()),
        rank_end_us=done,
        ready_us=net.ready,
        arrival_us=net.arrival,
        policy=policy,
        kernels=kernels,
        **extra,
    )


def layer_timeline(
    inputs: LayerInputs,
    costs: PrefillCosts,
    mode: str,
    *,
    links: str = "contention",
    launch: str = "reactive",
    guard: bool = False,
    pricing: str = "paper",
    cost: CostModel | None = None,
    commit: str = "first",
) -> LayerResult:
    """Simulate one MoE layer under ``mode`` (see the module doc): the reference timeline.

    Args:
      inputs: the layer's `LayerInputs` (true and predicted times and pairs).
      costs: the deployment's `PrefillCosts` (F(N), links, expert bytes, helper budget).
      mode: one of `LAYER_MODES`.
      links: ``"contention"`` (serialised ports, charged fetches and helper kernels) or ``"paper"`` (`LINKS`).
      launch: ``"reactive"`` (actual readiness and counts) or ``"planned"`` (predictions) (`LAUNCHES`).
      guard: launch with the mode's own policy only (default, the paper's rules), or with the best predicted
        policy up to the mode's own (``True``).
      pricing: OEWF's admission model, ``"paper"`` (Eqs. 3–6) or ``"tempo"`` (max-affine, beyond the paper).
      cost: the `CostModel` for ``pricing="tempo"`` (default `PrefillCosts.tempo_cost_model`).
      commit: App. C's commit reading, ``"first"`` or ``"any"`` (`COMMITS`; `protected_start`).

    Returns:
      `LayerResult`.
    """
    fn = "layer_timeline"
    mode = check_choice("mode", mode, LAYER_MODES, where=fn)
    links = check_choice("links", links, LINKS, where=fn)
    launch = check_choice("launch", launch, LAUNCHES, where=fn)
    commit = check_choice("commit", commit, COMMITS, where=fn)
    if guard and launch == "layer":
        raise ValueError(
            f"{fn}: launch='layer' runs one schedule on every rank; guard=True would pick a policy per "
            "rank (use launch='planned' with the guard)"
        )
    if not isinstance(inputs, LayerInputs) or not isinstance(costs, PrefillCosts):
        raise ValueError(
            f"{fn}: needs LayerInputs and PrefillCosts, got {type(inputs).__name__}, {type(costs).__name__}"
        )
    if inputs.num_ranks != costs.num_ranks:
        raise ValueError(f"{fn}: inputs have {inputs.num_ranks} ranks but costs were derived for {costs.num_ranks}")
    allowed = MODE_POLICIES[mode] if guard else MODE_POLICIES[mode][-1:]
    theta = float(costs.threshold)
    if pricing == "tempo" and cost is None:
        cost = costs.tempo_cost_model()
    # Step 1: every rank's launch policy and kernels (the Async+SF plan in cascade mode).
    done, policy, kernels, _, net, _ = _timeline(
        costs, inputs, allowed, theta, links, launch, False, pricing, cost, commit
    )
    base = float(done.max())
    if mode != "cascade" or not inputs.oewf:
        return _result(mode, done, net, policy, kernels, base_end_us=base)
    # Step 2: OEWF on top, decided on the predictions, run on the truth.
    done, policy, kernels, side, net, (abandoned, dropped) = _timeline(
        costs, inputs, allowed, theta, links, launch, True, pricing, cost, commit
    )
    return _result(
        mode,
        done,
        net,
        policy,
        kernels,
        side=side,
        accepted=tuple(m.reassignment for m, _ in net.moves),
        refused=net.refused,
        abandoned=abandoned,
        dropped=dropped,
        base_end_us=base,
    )
