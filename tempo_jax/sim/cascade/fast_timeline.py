"""The fast layer timeline: every MoE layer of one forward step at once (the same numbers as `layer_timeline`).

`step_timeline(inputs, costs, mode, links=..., launch=...)` computes, for all L layers of a step together, what
`tempo_jax.sim.cascade.reference_timeline.layer_timeline` computes one layer at a time — the same rules (read that
module's doc), in numpy arrays ``[L, D]`` / ``[L, D, D]`` with loops only over the D ranks' positions (source
arrival order, helper decision order, port queues). It is tested equal to the reference to 1e-9 relative on random
layers and on served runs (`tests/test_cascade_sim.py`).

What it needs that the reference derives from ``pairs [D, D, E]``: the rank-level pairs ``sent [L, D, D]`` and, for
OEWF, ``top_share [L, D]`` — the share of a (helper → donor) pair's tokens that the helper's buffer takes (the
donor's most popular experts that fit the budget, `top_shares`), since within a (source, destination) pair the
simulator splits pairs over the destination's experts by popularity (`tempo_jax.sim.cascade`). It supports the
paper's launch rules (``guard=False``) and OEWF pricing (``pricing="paper"``); the reference covers the rest.

Checks run once per call (shapes, modes), never per layer or rank. numpy + solvers only (no jax).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from solvers.checks import check_choice
from solvers.streamffn import partition_ends

from .costs import PrefillCosts
from .vocabulary import COMMITS, HELPER_STREAM_EFFICIENCY, LAUNCHES, LAYER_MODES, LINKS, MODE_POLICIES

__all__ = ["StepInputs", "StepTimes", "step_timeline", "top_shares"]


@dataclass(frozen=True, kw_only=True, eq=False)
class StepInputs:
    """All L layers of one step (µs and tokens; float64 arrays).

    Attributes:
      attention_us: ``[L, D]`` true attention time of each replica in each layer.
      attention_est_us: ``[L, D]`` the planners' predictions.
      dispatch_us: ``[L, D]`` uncontended dispatch times (the planner's D_d).
      sent: ``[L, D, D]`` true pairs source s sends to destination d.
      sent_est: ``[L, D, D]`` predicted pairs (planned launching).
      tokens_est: ``[L, D]`` N̂_d for OEWF.
      top_share: ``[L, D]`` share of a helper's pairs on donor d its buffer takes (`top_shares`).
      fetch_experts: ``[L, D]`` experts that take (their bytes = this × one expert's).
      oewf: ``[L]`` bool, run OEWF in this layer (cascade mode).
    """

    attention_us: np.ndarray
    attention_est_us: np.ndarray
    dispatch_us: np.ndarray
    sent: np.ndarray
    sent_est: np.ndarray
    tokens_est: np.ndarray
    top_share: np.ndarray
    fetch_experts: np.ndarray
    oewf: np.ndarray

    def __post_init__(self) -> None:
        L, D = np.shape(self.attention_us)
        want = {
            "attention_est_us": (L, D),
            "dispatch_us": (L, D),
            "sent": (L, D, D),
            "sent_est": (L, D, D),
            "tokens_est": (L, D),
            "top_share": (L, D),
            "fetch_experts": (L, D),
            "oewf": (L,),
        }
        for name, shape in want.items():
            if np.shape(getattr(self, name)) != shape:
                raise ValueError(f"StepInputs: {name} must be {list(shape)}, got {list(np.shape(getattr(self, name)))}")


@dataclass(frozen=True, kw_only=True, eq=False)
class StepTimes:
    """`step_timeline`'s result per layer.

    Attributes:
      end_us: ``[L]`` layer times; base_us: ``[L]`` the same without OEWF (= end_us outside cascade mode).
      ready_us: ``[L, D]`` when each rank's dispatch left.
      moves: ``[L]`` accepted OEWF moves; moved_tokens: ``[L]`` their N_trans sum.
      refused, abandoned, dropped: ``[L]`` helpers that decided without a move (no fetch), accepted moves abandoned
        at commit (no protected interval) and dropped at execution (weights after the donor's dispatch left), as
        `reference_timeline.LayerResult`.
      kernel_us: ``[L]`` Σ of the ranks' own kernel durations.
    """

    end_us: np.ndarray
    base_us: np.ndarray
    ready_us: np.ndarray
    moves: np.ndarray
    refused: np.ndarray
    abandoned: np.ndarray
    dropped: np.ndarray
    moved_tokens: np.ndarray
    kernel_us: np.ndarray


def top_shares(expert_share: np.ndarray, expert_bytes: float, budget_bytes: float) -> tuple[np.ndarray, np.ndarray]:
    """What Algorithm 1 takes from a donor when pairs split by popularity: ``(share [L, D], experts [L, D])``.

    Args:
      expert_share: ``[L, D, S]`` each expert's share of the pairs a destination receives (rows sum to 1).
      expert_bytes, budget_bytes: one expert's bytes and the helper buffer.

    The experts are taken by share descending (ties to the lower id) while their bytes fit (the same float
    subtraction as `solvers.oewf.select_weights`); ``share`` sums the taken ones.
    """
    # Step 1: how many equal-size experts fit, by the solver's own subtraction.
    fit, left = 0, float(budget_bytes)
    while expert_bytes <= left and fit < expert_share.shape[2]:
        left -= expert_bytes
        fit += 1
    # Step 2: the most popular ones among those with tokens.
    nonzero = (expert_share > 0).sum(axis=2)
    take = np.minimum(fit, nonzero)
    ranked = -np.sort(-expert_share, axis=2, kind="stable")
    keep = np.arange(expert_share.shape[2])[None, None, :] < take[..., None]
    return np.where(keep, ranked, 0.0).sum(axis=2), take.astype(np.float64)


def _ffn(costs: PrefillCosts, n: np.ndarray) -> np.ndarray:
    return np.asarray(costs.curve.ffn_time_unchecked(np.maximum(n, 0.0)), dtype=np.float64)


def _take(a: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """``a[l, idx[l]]`` for ``a [L, D]``, ``idx [L]``."""
    return a[np.arange(a.shape[0]), idx]


def _along(order: np.ndarray, n: int) -> np.ndarray:
    """Flat indices into an ``[L, n, D]`` array of ``a[l, order[l, j, d], d]`` for ``order [L, M, D]`` (one
    `np.take` per array gathered with the same order: take_along_axis on axis 1 at a fraction of its cost)."""
    L, _, D = order.shape
    return order * D + (np.arange(L) * (n * D))[:, None, None] + np.arange(D)


def _decide(costs, inp: StepInputs, h, t, active, n_hat, floor_abs, candidates):
    """One round of helper decisions (helper ``h [L]`` at ``t [L]``, layers where ``active``; donors among
    ``candidates [L, D]``, None: any rank predicted in attention): Algorithm 1 + Eq. 6 on the predicted state, as
    `solvers.oewf_decide_at`. Returns (accepted [L], donor, n_trans, bytes, start, end)
    and updates ``n_hat`` / ``floor_abs`` in place."""
    L, D = n_hat.shape
    rows = np.arange(L)
    a_est, disp = inp.attention_est_us, inp.dispatch_us
    own = np.arange(D)[None, :] == h[:, None]
    # Step 1: the predicted state at t.
    rem = np.maximum(a_est - t[:, None], 0.0)
    rem[own] = 0.0
    if candidates is not None:
        rem[~candidates] = 0.0
    left = np.where(rem > 0, disp, np.maximum(a_est + disp - t[:, None], 0.0))
    left[own] = 0.0
    floor = np.maximum(floor_abs - t[:, None], 0.0)
    T = np.maximum(rem + left + _ffn(costs, n_hat), floor)
    # Step 2: the donor (latest predicted completion among those in attention), its experts that fit.
    donors = rem > 0
    d = np.argmax(np.where(donors, T, -np.inf), axis=1)
    n_hd = inp.sent[rows, h, d]
    k = _take(inp.fetch_experts, d)
    ok = active & donors.any(axis=1) & (n_hd > 0) & (k > 0)
    n_trans = n_hd * _take(inp.top_share, d)
    nbytes = k * costs.expert_bytes
    # Step 3: Eq. 6 (paper pricing) with weights ready bytes / fetch bandwidth after t.
    s_h = nbytes / costs.fetch_bw[h, d]
    rem_d, left_d = rem[rows, d], left[rows, d]
    kept, work = _ffn(costs, np.stack([n_hat[rows, d] - n_trans, n_trans]))  # the donor's kernel, the helper's
    donor_after = np.maximum(rem_d + left_d + kept, floor[rows, d])
    T_d, T_h = T[rows, d], T[rows, h]
    helper_after = np.maximum(T_h, s_h + work)
    ok &= (s_h < rem_d + left_d) & (np.maximum(donor_after, helper_after) <= np.maximum(T_d, T_h))
    # Step 4: apply to the books.
    n_hat[rows[ok], d[ok]] = np.maximum(0.0, n_hat[rows[ok], d[ok]] - n_trans[ok])
    start = t + s_h
    end = start + work
    floor_abs[rows[ok], h[ok]] = np.maximum(floor_abs[rows[ok], h[ok]], end[ok])
    return ok, d, n_trans, nbytes, start, end


@dataclass
class _Net:
    ready: np.ndarray  # [L, D]
    arrival: np.ndarray  # [L, D(src), D(dst)]
    send_free: np.ndarray  # [L, D]
    moves: list  # per round: (ok [L], helper [L], donor [L], n_trans [L], start [L], end [L], delivered [L])
    refused: np.ndarray  # [L] helpers that decided without a move
    # contended links: what the receive ports serve (`_receive`)
    start: np.ndarray | None = None  # [L, D] when each dispatch started on its send port
    chunk_us: np.ndarray | None = None  # [L, s, d] receive-port occupancy of the dispatch chunks
    fetch_us: np.ndarray | None = None  # [L, D] receive-port occupancy of each helper's fetch (0: none)
    fetch_send: np.ndarray | None = None  # [L, D] when each helper's fetch left its donor's send port
    rounds: list = field(default_factory=list)  # per round: (ok, helper, donor, n_trans, start, end)
    protected: bool = True
    got: np.ndarray | None = None  # [L, D] when each rank has its outputs back (set by `_receive`)


def _paper_net(costs, inp: StepInputs, run_oewf: np.ndarray) -> _Net:
    L, D = inp.attention_us.shape
    ready = inp.attention_us + inp.dispatch_us
    moves, refused = [], np.zeros(L)
    if run_oewf.any():
        n_hat, floor_abs = inp.tokens_est.astype(np.float64).copy(), np.zeros((L, D))
        last = inp.attention_est_us.max(axis=1)
        order = np.argsort(ready, axis=1, kind="stable")
        for k in range(D):
            h = order[:, k]
            t = _take(ready, h)
            active = run_oewf & (t < last)
            ok, d, n, _, start, end = _decide(costs, inp, h, t, active, n_hat, floor_abs, None)
            moves.append((ok, h, d, n, start, end, start))
            refused += active & ~ok
    return _Net(
        ready=ready, arrival=np.repeat(ready[:, :, None], D, axis=2), send_free=ready, moves=moves, refused=refused
    )


def _contended_net(costs, inp: StepInputs, run_oewf: np.ndarray, protected: bool) -> _Net:
    hw = costs.hardware
    lat, bw = hw.link_latency_us, costs.link_bw  # bw [s, d]: NVLink within a node, the NIC across nodes
    L, D = inp.attention_us.shape
    rows = np.arange(L)
    a = inp.attention_us
    chunk = inp.sent * (1.0 - np.eye(D))[None] * costs.dispatch_bytes_per_pair  # [L, s, d] bytes
    remote = chunk.sum(axis=2)
    dur = np.where(remote > 0, lat + costs.send_us(chunk), 0.0)
    # Step 1: dispatches in completion order; each helper decides when its own dispatch has left.
    free, after = np.zeros((L, D)), np.zeros((L, D))
    start, ready = np.zeros((L, D)), np.zeros((L, D))
    pending = np.ones((L, D), dtype=bool)
    n_hat, floor_abs = inp.tokens_est.astype(np.float64).copy(), np.zeros((L, D))
    last = inp.attention_est_us.max(axis=1)
    rounds, refused = [], np.zeros(L)
    for _ in range(D if run_oewf.any() else 0):  # without OEWF no port is taken early: each starts at once
        tentative = np.where(pending, np.maximum(a, free) + dur, np.inf)
        h = np.argmin(tentative, axis=1)
        start[rows, h] = np.maximum(a[rows, h], free[rows, h])
        t = tentative[rows, h]
        ready[rows, h] = t
        pending[rows, h] = False
        active = run_oewf & (t < last)
        if not active.any():
            continue
        in_attention = pending & (a > t[:, None])  # §3.3: donors are the ranks still in attention at t
        ok, d, n, nbytes, s0, s1 = _decide(costs, inp, h, t, active, n_hat, floor_abs, in_attention)
        refused += active & ~ok
        occ = nbytes / bw[d, h]
        a_d, free_d, after_d, dur_d = a[rows, d], free[rows, d], after[rows, d], dur[rows, d]
        before = a_d > t
        end_before = np.maximum(t, free_d) + occ
        end_after = np.maximum(np.maximum(t, np.maximum(a_d, free_d) + dur_d), after_d) + occ
        if protected:  # before the donor's dispatch: its port's idle time, the rest after the dispatch
            spill = before & (end_before > a_d)
            end_spill = np.maximum(a_d + dur_d, after_d) + end_before - a_d
            free_new = np.where(spill, a_d, end_before)
            after_new = np.where(before, np.where(spill, end_spill, after_d), end_after)
            send_end = np.where(before, np.where(spill, end_spill, end_before), end_after)
        else:
            free_new, after_new = end_before, np.where(before, after_d, end_after)
            send_end = np.where(before, end_before, end_after)
        free[rows[ok & before], d[ok & before]] = free_new[ok & before]
        after[rows[ok], d[ok]] = after_new[ok]
        rounds.append((ok, h, d, n, s0, s1, send_end, occ))
    if not rounds:
        start = np.maximum(a, free)
        ready = start + dur
    fetch_us, fetch_send = np.zeros((L, D)), np.zeros((L, D))
    for ok, h, _, _, _, _, send_end, occ in rounds:
        fetch_us[rows[ok], h[ok]] = occ[ok]
        fetch_send[rows[ok], h[ok]] = send_end[ok]
    # protected: what is left of a fetch after the donor's dispatch yields to its combines too (App. E)
    return _Net(
        ready=ready,
        arrival=np.repeat(ready[:, :, None], D, axis=2),
        send_free=ready if protected else np.maximum(ready, after),
        moves=[],
        refused=refused,
        start=start,
        chunk_us=chunk / bw[None],
        fetch_us=fetch_us,
        fetch_send=fetch_send,
        rounds=[r[:6] for r in rounds],
        protected=protected,
    )


def _receive(costs, net: _Net, combines=None) -> _Net:
    """`reference_timeline._receive`, all layers at once: each receive port d serves one FIFO by issue time over the
    dispatch chunks into d, its FIFO fetch and the combine chunks into it (``combines``: ``(issued, sent by, port
    µs)`` ``[L, sender, receiver]``, port µs 0 where none; None: no combine yet); a protected fetch fills the idle
    time between them."""
    lat = costs.hardware.link_latency_us
    ready = net.ready
    L, D = ready.shape
    rows = np.arange(L)
    # Step 1: the port's items [L, n, d]: dispatch chunks (by source), the fetch, combines (by sender).
    issued = [np.broadcast_to(net.start[:, :, None], (L, D, D)), ready[:, None, :]]
    occ = [net.chunk_us, (0.0 if net.protected else 1.0) * net.fetch_us[:, None, :]]
    sent = [np.zeros((L, D + 1, D))]
    if combines is not None:
        for parts, c in zip((issued, sent, occ), combines, strict=True):
            parts.append(c)
    issued, occ, sent = (np.concatenate(parts, axis=1) for parts in (issued, occ, sent))
    n = issued.shape[1]
    valid = occ > 0
    order = np.argsort(np.where(valid, issued, np.inf), axis=1, kind="stable")
    at = _along(order, n)
    iss_s, occ_s, ok_s, sent_s = (np.take(x, at) for x in (np.where(valid, issued, -np.inf), occ, valid, sent))
    # Step 2: serve them in order (the valid ones sort first: as many steps as the busiest port has transfers; an
    # invalid item, issued at -inf for 0 µs, leaves the port as it is).
    port = np.zeros((L, D))
    ends_s = np.zeros((L, n, D))
    for j in range(int(valid.sum(axis=1).max(initial=0))):
        port = np.maximum(iss_s[:, j], port) + occ_s[:, j]
        ends_s[:, j] = port
    # Step 3: a protected fetch runs from its instant in the idle time between them.
    if net.protected:
        received = _idle_fill(ready, net.fetch_us, iss_s, ends_s, ok_s) if net.fetch_us.any() else ready.copy()
    ends_s = np.where(ok_s, ends_s, 0.0)
    back = ok_s & (order > D)  # the combines served: each is back one latency after it left
    got = np.max(np.where(back, np.maximum(sent_s, ends_s) + lat, 0.0), axis=1)
    ends = np.zeros((L, n, D))
    np.put(ends, at, ends_s)
    arrival = np.where(valid[:, :D, :], np.maximum(ready[:, :, None], ends[:, :D, :] + lat), ready[:, :, None])
    if not net.protected:
        received = ends[:, D, :]
    delivered = np.maximum(received, net.fetch_send) + lat  # [L, helper]
    moves = [(ok, h, d, n, s0, s1, delivered[rows, h]) for ok, h, d, n, s0, s1 in net.rounds]
    return dataclasses.replace(net, arrival=arrival, moves=moves, got=got)


def _idle_fill(start, left, issued, ends, ok):
    """When each protected fetch of ``left [L, d]`` µs, free to start at ``start [L, d]``, has been received in
    the idle time of its receive port d, whose items in serving order were issued at ``issued`` and ended at
    ``ends`` ``[L, item, d]`` (``ok``: real items, a prefix). Each idle gap from ``start`` on is spent in turn (the
    fetch ``left`` shrinking by it) until one holds what is left; past the last item the fetch runs on.
    Returns ``[L, d]``, the floats of the item-by-item loop of `reference_timeline._receive`."""
    L, _, D = ends.shape
    before = np.concatenate([np.zeros((L, 1, D)), ends[:, :-1]], axis=1)  # the port's end before each item
    began = np.maximum(issued, before)
    rel = ok & (ends > start[:, None, :])  # the items that end after the fetch could start (a suffix of the prefix)
    cur = np.maximum(start[:, None, :], before)  # where the fetch stands when each relevant item comes
    gap = began - cur
    spent = np.where(rel, np.maximum(gap, 0.0), 0.0)
    remaining = np.subtract.accumulate(np.concatenate([left[:, None, :], spent], axis=1), axis=1)  # in turn
    fits = rel & (gap > 0) & (remaining[:, :-1] <= gap)
    first = np.argmax(fits, axis=1)[:, None, :]
    fitted = np.take_along_axis(cur + remaining[:, :-1], first, axis=1)[:, 0]
    last = np.where(rel.any(axis=1), np.where(rel, ends, -np.inf).max(axis=1), start)
    return np.where(fits.any(axis=1), fitted, last + remaining[:, -1])


def _partition_ends(part_arrival, part_tokens, rule: str, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """(order [L, d, pos], group ends [L, d, pos] bool): `solvers.streamffn.partition_ends` per destination, for
    arrivals / tokens ``[L, s, d]``."""
    return partition_ends(np.swapaxes(part_arrival, 1, 2), np.swapaxes(part_tokens, 1, 2), rule, theta)


def _gathered(x: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """``x [L, d, pos]`` summed over each launch group up to each position (from 0 after each group's end)."""
    out, acc = np.empty(x.shape), np.zeros(x.shape[:2])
    for j in range(x.shape[2]):
        acc = acc + x[:, :, j]
        out[:, :, j] = acc
        acc = np.where(ends[:, :, j], 0.0, acc)
    return out


def _own_kernels(costs, arr, tk, ends, gpu):
    """Every rank's own kernels, launch groups back to back from ``gpu [L, D]`` (its dispatch left): arrivals
    ``arr`` and tokens ``tk [L, d, pos]`` in each destination's arrival order, group ends ``ends [L, d, pos]``.
    Returns ``(launched, start, end, tokens)`` ``[L, d, pos]``, set at the position that closes each group."""
    L, D, _ = tk.shape
    start, end = np.zeros((L, D, D)), np.zeros((L, D, D))
    tokens = _gathered(tk, ends)  # the kernels' sizes do not depend on time
    launched = ends & (tokens > 0)
    duration = _ffn(costs, tokens)
    rdy = np.full((L, D), -np.inf)
    for j in range(D):
        rdy = np.maximum(rdy, arr[:, :, j])
        k0 = np.maximum(rdy, gpu)
        k1 = k0 + duration[:, :, j]
        gpu = np.where(launched[:, :, j], k1, gpu)
        start[:, :, j], end[:, :, j] = k0, k1
        rdy = np.where(ends[:, :, j], -np.inf, rdy)
    return launched, start, end, tokens


def _protected_start(launched, start, end, ready, duration, commit="first"):
    """`reference_timeline.protected_start` for helpers' kernels ``[n, pos]``, weights ready at ``ready [n]``, under
    either commit reading (`COMMITS`): ``(start [n], fits [n])``."""
    s0, nxt, stopped = ready.copy(), np.full(ready.shape, np.inf), np.zeros(ready.shape, dtype=bool)
    for j in range(launched.shape[1]):
        act = launched[:, j] & ~stopped & (end[:, j] > s0)
        inside = act & (start[:, j] <= s0)
        s0 = np.where(inside, end[:, j], s0)
        hit = act & ~inside
        if commit == "any":  # a kernel the side kernel does not fit before: try the interval after it
            hit &= s0 + duration <= start[:, j]
            s0 = np.where(act & ~inside & ~hit, end[:, j], s0)
        nxt, stopped = np.where(hit, start[:, j], nxt), stopped | hit
    return s0, s0 + duration <= nxt


def _in_order_index(order: np.ndarray) -> np.ndarray:
    """Flat indices into an ``[L, s, d]`` array of destination d's sources in its arrival ``order [L, d, pos]``."""
    L, D, _ = order.shape
    return order * D + (np.arange(L) * (D * D))[:, None, None] + np.arange(D)[None, :, None]


def _ranks(
    costs,
    inp: StepInputs,
    net: _Net,
    rule: str,
    links: str,
    launch: str,
    theta: float,
    with_moves: bool,
    commit: str = "first",
):
    """(done [L, D], kernel_us [L], moves [L], abandoned [L], dropped [L], moved [L], combines) of every rank, with
    or without OEWF, on the links' arrivals (``combines``: `_combines`)."""
    lat, cpp = costs.hardware.link_latency_us, costs.combine_bytes_per_pair
    L, D = inp.attention_us.shape
    rows = np.arange(L)
    # Step 1: launch groups per destination.
    if launch == "reactive":  # a donor keeps its launch eligibility: tokens before the moves (App. C)
        order, ends = _partition_ends(net.arrival, inp.sent, rule, theta)
    else:  # planned: per destination; layer: one schedule from the mean predicted tokens per destination
        est_ready = inp.attention_est_us + inp.dispatch_us
        est = inp.sent_est if launch == "planned" else np.repeat(inp.sent_est.sum(axis=2, keepdims=True) / D, D, axis=2)
        order, ends = _partition_ends(np.repeat(est_ready[:, :, None], D, axis=2), est, rule, theta)
    at = _in_order_index(order)  # [L, d, pos] → [L, s, d]: the source at position pos of d's order
    arr = np.take(net.arrival, at)  # [L, d, pos]
    # Step 2: the moves that commit, round by round in decision order (`reference_timeline._timeline`, step 1).
    tok = inp.sent.copy()
    side_end = np.full((L, D), -np.inf)
    moves, abandoned, dropped, moved = np.zeros(L), np.zeros(L), np.zeros(L), np.zeros(L)
    if with_moves:
        for ok, h, d, n, _, s1, delivered in net.moves:
            moves += ok
            moved += np.where(ok, n, 0.0)
            if links == "paper":  # weights ready at the planned instant, a free side stream
                r = rows[ok]
                tok[r, h[ok], d[ok]] = inp.sent[r, h[ok], d[ok]] - n[ok]
                side_end[r, h[ok]] = s1[ok]
                continue
            in_time = delivered < net.ready[rows, d]  # else the donor's dispatch left: its FFN runs the tokens
            dropped += ok & ~in_time
            run = ok & in_time
            r = rows[run]
            if r.size:
                hr = h[run]
                launched, k0, k1, _ = _own_kernels(costs, arr[r], np.take(tok, at[r]), ends[r], net.ready[r].copy())
                duration = _ffn(costs, n[run]) / HELPER_STREAM_EFFICIENCY
                i = np.arange(r.size)
                s0, fits = _protected_start(launched[i, hr], k0[i, hr], k1[i, hr], delivered[run], duration, commit)
                run[r[~fits]] = False
                r, hr, s0, duration = r[fits], hr[fits], s0[fits], duration[fits]
                tok[r, hr, d[run]] = inp.sent[r, hr, d[run]] - n[run]
                side_end[r, hr] = s0 + duration
            abandoned += ok & in_time & ~run  # no protected interval on the helper's GPU
    # Step 3: own kernels back to back on the final tokens; their combines; the helpers' side kernels.
    tk = np.take(tok, at)
    is_own = order == np.arange(D)[None, :, None]
    launched, k0s, k1s, accs = _own_kernels(costs, arr, tk, ends, net.ready.copy())
    remote = accs - _gathered(np.where(is_own, tk, 0.0), ends)  # each kernel's tokens from other ranks
    from_node = np.take(np.broadcast_to(costs.cross_node, (L, D, D)), at)  # [L, d, pos] source on another node
    cross = _gathered(np.where(from_node, tk, 0.0), ends)  # each kernel's tokens from other nodes
    per_pos = np.ascontiguousarray(np.swapaxes(np.where(launched, k1s - k0s, 0.0), 1, 2)).sum(axis=2)  # [L, pos]
    kernel_us = np.cumsum(per_pos, axis=1)[:, -1]  # position by position, as the reference adds them
    back_us = costs.port_us(remote * cpp, cross * cpp)
    if links == "paper":
        out = k1s + np.where(remote > 0, lat + back_us, 0.0)
        left_at = sent_by = np.zeros((L, D, D))
    else:  # each kernel's combine waits for d's send port; the group's members' combines leave with it
        sending = launched & (remote > 0)
        sent_start, sent_end, port = np.empty((L, D, D)), np.empty((L, D, D)), net.send_free.copy()
        for j in range(D):
            sent_start[:, :, j] = np.maximum(k1s[:, :, j], port)
            sent_end[:, :, j] = sent_start[:, :, j] + back_us[:, :, j]
            port = np.where(sending[:, :, j], sent_end[:, :, j], port)
        out = np.where(remote > 0, sent_end + lat, k1s)
        closing = np.minimum.accumulate(np.where(ends, np.arange(D), D)[:, :, ::-1], axis=2)[:, :, ::-1]
        member = closing < D  # [L, d, pos] closed by a later (or its own) group end
        at_close = np.minimum(closing, D - 1) + (np.arange(L * D) * D).reshape(L, D, 1)
        mark = member & np.take(sending, at_close)
        left_at = np.where(mark, np.take(sent_start, at_close), 0.0)
        sent_by = np.where(mark, np.take(sent_end, at_close), 0.0)
    done = np.maximum(net.ready, np.where(launched, out, -np.inf).max(axis=2))
    done = np.maximum(done, side_end)
    combines = _combines(costs, order, left_at, sent_by, np.where(is_own, 0.0, tk))
    return done, kernel_us, moves, abandoned, dropped, moved, combines


def _combines(costs, order, left_at, sent_by, remote_tokens):
    """The combine chunks ``(issued, sent by, receive-port µs)`` ``[L, sender d, receiver s]`` from ``[L, d, pos]``
    arrays (``order`` maps positions to sources); all 0 where d sends s nothing."""
    L, D, _ = order.shape
    at = order + (np.arange(L * D) * D).reshape(L, D, 1)  # flat [L, d, s]
    issued, sent, occ = np.zeros((L, D, D)), np.zeros((L, D, D)), np.zeros((L, D, D))
    bw = np.take(np.broadcast_to(costs.link_bw, (L, D, D)), at)  # [L, d, pos]: d → the source at pos
    np.put(occ, at, remote_tokens * costs.combine_bytes_per_pair / bw)
    np.put(issued, at, left_at)
    np.put(sent, at, sent_by)
    valid = occ > 0
    return np.where(valid, issued, 0.0), np.where(valid, sent, 0.0), occ


def _rows(x, idx: np.ndarray):
    """``x`` (an array ``[L, ...]``, a list / tuple of them, or a dataclass of them) at the layers ``idx``."""
    if isinstance(x, np.ndarray):
        return x[idx]
    if isinstance(x, (list, tuple)):
        return type(x)(_rows(v, idx) for v in x)
    if dataclasses.is_dataclass(x):
        return dataclasses.replace(x, **{f.name: _rows(getattr(x, f.name), idx) for f in dataclasses.fields(x)})
    return x


def _settle(costs, inputs: StepInputs, sent: _Net, how: tuple) -> tuple:
    """`reference_timeline._timeline` on contended links, all layers at once: the ranks run on the arrivals the
    previous pass's combines leave, until those leave the arrivals and the fetches' delivery as they were; each
    pass reruns only the layers still moving. Returns ``(done [L, D], kernel_us [L], moves, abandoned, dropped,
    moved [L])``."""
    L, D = inputs.attention_us.shape
    out = (np.zeros((L, D)), np.zeros(L), np.zeros(L), np.zeros(L), np.zeros(L), np.zeros(L))
    live = np.arange(L)  # the layers still moving
    net = _receive(costs, sent)
    for _ in range(2 * D * D + 2):
        done, *rest, combines = _ranks(costs, inputs, net, *how)
        nxt = _receive(costs, sent, combines)
        same = (nxt.arrival == net.arrival).all(axis=(1, 2))
        for (*_, t_now), (*_, t_next) in zip(net.moves, nxt.moves, strict=True):
            same &= t_now == t_next
        for o, v in zip(out, (np.maximum(done, nxt.got), *rest), strict=True):
            o[live[same]] = v[same]
        if same.all():
            return out
        keep = np.flatnonzero(~same)
        live, inputs, sent, net = live[keep], _rows(inputs, keep), _rows(sent, keep), _rows(nxt, keep)
    raise RuntimeError("step_timeline: the receive ports did not settle (a transfer waits for a later one)")


def step_timeline(
    inputs: StepInputs,
    costs: PrefillCosts,
    mode: str,
    *,
    links: str = "contention",
    launch: str = "reactive",
    commit: str = "first",
) -> StepTimes:
    """Every layer of one step under ``mode`` (the rules of `layer_timeline` with ``guard=False``, paper pricing).

    Args:
      inputs: the step's `StepInputs` (all layers).
      costs: the deployment's `PrefillCosts`.
      mode: one of `LAYER_MODES`; links: one of `LINKS`; launch: one of `LAUNCHES`; commit: one of `COMMITS`.

    Returns:
      `StepTimes` (per layer).
    """
    fn = "step_timeline"
    mode = check_choice("mode", mode, LAYER_MODES, where=fn)
    links = check_choice("links", links, LINKS, where=fn)
    launch = check_choice("launch", launch, LAUNCHES, where=fn)
    commit = check_choice("commit", commit, COMMITS, where=fn)
    if not isinstance(inputs, StepInputs) or inputs.attention_us.shape[1] != costs.num_ranks:
        raise ValueError(f"{fn}: needs StepInputs with D = {costs.num_ranks} ranks")
    L = inputs.attention_us.shape[0]
    theta = float(costs.threshold)
    rule = MODE_POLICIES[mode][-1]

    def net_of(run_oewf):
        """The links' `_Net`: the dispatches (and, where ``run_oewf [L]``, the helpers' decisions and fetches)."""
        if links == "paper":
            return _paper_net(costs, inputs, run_oewf)
        return _contended_net(costs, inputs, run_oewf, protected=links == "contention")

    def ranks(inp, net, with_moves):
        """(done [L', D], kernel_us, moves, abandoned, dropped, moved [L']) of the layers of ``inp`` / ``net``."""
        if links == "paper":
            return _ranks(costs, inp, net, rule, links, launch, theta, with_moves, commit)[:6]
        return _settle(costs, inp, net, (rule, links, launch, theta, with_moves, commit))

    # Step 1: without OEWF (every mode; the base of cascade).
    base_net = net_of(np.zeros(L, dtype=bool))
    done, kernel_us, *_ = ranks(inputs, base_net, False)
    base = done.max(axis=1)
    times = StepTimes(
        end_us=base.copy(),
        base_us=base,
        ready_us=base_net.ready.copy(),
        moves=np.zeros(L),
        refused=np.zeros(L),
        abandoned=np.zeros(L),
        dropped=np.zeros(L),
        moved_tokens=np.zeros(L),
        kernel_us=kernel_us,
    )
    if mode != "cascade" or not inputs.oewf.any():
        return times
    # Step 2: with OEWF where it runs. A layer where no helper takes work runs as its base (the layers' rows never
    # mix), so only the layers with a move run again.
    net = net_of(inputs.oewf.astype(bool))
    times.refused[:] = net.refused
    taken = np.zeros(L, dtype=bool)
    for ok, *_ in net.moves if links == "paper" else net.rounds:
        taken |= ok
    rows = np.flatnonzero(taken)
    if not rows.size:
        return times
    done, kernel_moved, moves, abandoned, dropped, moved = ranks(_rows(inputs, rows), _rows(net, rows), True)
    for out, value in (
        (times.end_us, done.max(axis=1)),
        (times.ready_us, net.ready[rows]),
        (times.moves, moves),
        (times.abandoned, abandoned),
        (times.dropped, dropped),
        (times.moved_tokens, moved),
        (times.kernel_us, kernel_moved),
    ):
        out[rows] = value
    return times
