"""Dropless exchange in rounds of a bounded capacity: the layer's default (`MoEConfig.capacity="auto"`).

A rank's token–expert pairs, sorted by destination, fill blocks of ``C`` rows per destination (C: twice the mean
block by default, `tempo_jax.layer.config.auto_capacity`, fixed at trace time from the shapes). Round r sends
the rows at positions ``[r·C, (r+1)·C)`` of every block: exchange, expert FFN, return, scatter into the pairs'
results. The ``ep`` group runs ``nr = ⌈max block / C⌉`` rounds, the largest block anywhere (``pmax`` over the axis)
deciding, so every pair is computed — dropless — while every buffer stays ``[D, C, ·]``, whatever the routing: a
batch that sends every token to one rank takes more rounds, not more memory, and nothing recompiles.

Under differentiation (`jax.grad`, `nnx.value_and_grad`) a `jax.custom_vjp` keeps the memory bound: the forward
pass saves the first round's residuals (the one round of a balanced batch) and the backward pass recomputes any
further round, as rematerialisation would, then runs its VJP (cotangents of the results travel the send direction,
cotangents of the rows the return direction). The rounds run in a `jax.lax.while_loop`, so they work under
`jax.jit`, `nnx.jit`, `nnx.scan` over layers and across processes (the round count is one collective).

Glossary additions: nr rounds."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from . import remat, stages
from .exchange import return_blocks, send_blocks

__all__ = ["Rounds", "num_rounds"]


@dataclasses.dataclass(frozen=True)
class Rounds:
    """Steps 3–6 in dropless rounds of ``capacity`` C rows per block (see the module): one of the three
    `tempo_jax.layer.exchange_ffn.ExchangeFFN` implementations. Hashable: the static argument of the rounds' VJP."""

    wire: stages.Wire
    ffn: stages.FFN
    capacity: int

    def run(self, x: jax.Array, gate: jax.Array, dest: jax.Array, local: jax.Array, weights: dict) -> stages.Exchanged:
        """Every pair of this rank through the expert FFN of its destination, in rounds of C rows per block.

        Args:
          x: ``[T, H]`` this rank's rows (``wire.top_k`` pairs each). gate: ``[T, K]`` their pairs' weights.
          dest, local: ``[T·K]`` int32 destination
            rank (D: never sent) and slot there of each pair. weights: this rank's per-slot expert arrays (with
            OEWF's fetched slots or the dynamic copies as parts).

        Returns:
          `stages.Exchanged`: dropless, so ``sent`` = ``wanted``; ``rounds`` = nr.
        """
        po = stages.order_pairs(dest, local, jax.lax.axis_size(self.wire.axis), by_slot=True)  # dropless
        y_pairs, group_sizes, nr = _rounds(x, weights, po, self)
        y_pairs = remat.name(y_pairs, remat.RETURNED)
        out = stages.combine(y_pairs, gate, jnp.float32)  # Step 7: each token's pairs weighted by their gates
        return stages.Exchanged(out, group_sizes, po.wanted, po.wanted, nr)


def _round_pairs(po: stages.PairOrder, r, C: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(pair [D, C], valid [D, C], counts [D])`` of round r: the pair at each row of each block (valid rows
    first; invalid rows point at pair 0)."""
    c = jnp.arange(C, dtype=jnp.int32)
    offset = r * C + c[None, :]  # [1, C] position within the block
    valid = offset < po.wanted[:, None]  # [D, C]
    idx = jnp.where(valid, po.start[:, None] + offset, 0)
    return po.order[idx], valid, jnp.clip(po.wanted - r * C, 0, C).astype(jnp.int32)


def _send(x, weights, po, r, how: Rounds):
    """Round r's rows to their destinations: ``(received rows [D·C, H], slots [D·C], recv counts [D], counts [D],
    pair [D, C], valid [D, C])``."""
    w = how.wire
    with jax.named_scope("moe_pack"):
        pair, valid, counts = _round_pairs(po, r, how.capacity)
        buf = jnp.where(
            valid[..., None], stages.with_slots(x[pair // w.top_k], po.local[pair], w.dtype), 0
        )  # [D, C, W]
    recv, recv_counts = send_blocks(buf, counts, axis=w.axis, exchange=w.exchange)
    got = stages.received(recv, recv_counts, hidden=w.hidden, slots_per_rank=stages.num_slots(weights))
    return got.rows.reshape(-1, w.hidden), got.slots.reshape(-1), recv_counts, counts, pair, valid


def num_rounds(wanted: jax.Array, C: int, axis: str) -> jax.Array:
    """Rounds the ``ep`` group needs: ⌈largest block anywhere / C⌉, at least 1 (one collective max)."""
    biggest = jax.lax.pmax(jnp.max(wanted), axis)
    return jnp.maximum(1, (biggest + C - 1) // C).astype(jnp.int32)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _rounds(x, weights, po, how: Rounds):
    """Without differentiation: every round in one loop (one traced copy of a round)."""
    return _forward(x, weights, po, how, keep_first=False)[0]


def _ffn(how: Rounds):
    """The expert FFN of a round, its rows' results in the exchange dtype (weights stored in another dtype promote
    the GEMM's output; the round's VJP takes cotangents in the dtype its results travel in)."""

    def ffn(rows, slots, weights):
        # a round's blocks arrive sorted by slot (`order_pairs(by_slot=True)`): ordered by counting, not a sort
        y, group_sizes = how.ffn(rows, slots, weights, runs=rows.shape[0] // how.capacity)
        return y.astype(how.wire.dtype), group_sizes

    return ffn


def _rounds_fwd(x, weights, po, how: Rounds):
    """Under differentiation: round 0 with its FFN's VJP kept (the one round of a balanced batch), then the rest."""
    out, vjp0 = _forward(x, weights, po, how, keep_first=True)
    return out, (x, weights, po, remat.name(vjp0, remat.DISPATCHED), remat.name(out[2], remat.ROUNDS))


def _forward(x, weights, po, how: Rounds, *, keep_first: bool):
    w, ffn = how.wire, _ffn(how)
    D, C, H = po.wanted.shape[0], how.capacity, w.hidden
    R = num_rounds(po.wanted, C, w.axis)
    n_pairs = po.order.shape[0]

    def scatter(y_pairs, back, pair, valid):
        target = jnp.where(valid, pair, n_pairs).reshape(-1)  # invalid rows: dropped by mode="drop"
        return y_pairs.at[target].set(back.reshape(-1, H).astype(y_pairs.dtype), mode="drop")

    def one_round(r, y_pairs, sizes, keep_vjp):
        rows, slots, recv_counts, counts, pair, valid = _send(x, weights, po, r, how)
        if keep_vjp:
            y, vjp, gs = jax.vjp(lambda rows, ws: ffn(rows, slots, ws), rows, weights, has_aux=True)
        else:
            (y, gs), vjp = ffn(rows, slots, weights), None
        back = return_blocks(y.reshape(D, C, H), recv_counts, counts, axis=w.axis, exchange=w.exchange)
        return scatter(y_pairs, back, pair, valid), sizes + gs, vjp

    # Step 1 (under differentiation): round 0 on its own, its FFN's VJP kept for the backward pass.
    y_pairs = jnp.zeros((n_pairs, H), w.dtype)
    sizes = jnp.zeros((stages.num_slots(weights),), jnp.int32)
    vjp0, first = None, 0
    if keep_first:
        y_pairs, sizes, vjp0 = one_round(0, y_pairs, sizes, True)
        first = 1

    # Step 2: the (further) rounds while any block anywhere has rows left.
    def body(carry):
        r, y_pairs, sizes = carry
        y_pairs, sizes, _ = one_round(r, y_pairs, sizes, False)
        return r + 1, y_pairs, sizes

    _, y_pairs, sizes = jax.lax.while_loop(lambda c: c[0] < R, body, (jnp.int32(first), y_pairs, sizes))
    return (y_pairs, sizes, R), vjp0


def _rounds_bwd(how: Rounds, res, cotangents):
    w, ffn = how.wire, _ffn(how)
    x, weights, po, vjp0, R = res
    dy_pairs = cotangents[0]
    D, C, H, K = po.wanted.shape[0], how.capacity, w.hidden, w.top_k

    def back_round(r, vjp, dx, dw):
        """The VJP of round r: result cotangents go where the rows were computed, row cotangents come back."""
        pair, valid, counts = _round_pairs(po, r, C)
        dback = jnp.where(valid[..., None], dy_pairs[pair], 0).astype(w.dtype)  # [D, C, H] at the source
        drecv, drecv_counts = send_blocks(dback, counts, axis=w.axis, exchange=w.exchange)  # transpose of return
        drows, dweights = vjp(drecv.reshape(-1, H).astype(w.dtype))
        dbuf = return_blocks(drows.reshape(D, C, H), drecv_counts, counts, axis=w.axis, exchange=w.exchange)
        token = jnp.where(valid, pair // K, x.shape[0]).reshape(-1)
        dx = dx.at[token].add(dbuf.reshape(-1, H).astype(dx.dtype), mode="drop")
        dw = jax.tree.map(lambda a, b: a + b.astype(a.dtype), dw, dweights)
        return dx, dw

    dx = jnp.zeros(x.shape, jnp.float32)
    dw = jax.tree.map(lambda v: jnp.zeros(v.shape, jnp.float32), weights)
    # Step 1: round 0 from its saved VJP.
    dx, dw = back_round(0, vjp0, dx, dw)

    # Step 2: every further round recomputed (the forward kept no residuals of them), then its VJP.
    def body(carry):
        r, dx, dw = carry
        rows, slots, *_ = _send(x, weights, po, r, how)
        _, vjp, _ = jax.vjp(lambda rows, ws: ffn(rows, slots, ws), rows, weights, has_aux=True)
        dx, dw = back_round(r, vjp, dx, dw)
        return r + 1, dx, dw

    _, dx, dw = jax.lax.while_loop(lambda c: c[0] < R, body, (jnp.int32(1), dx, dw))
    dw = jax.tree.map(lambda g, v: g.astype(v.dtype), dw, weights)
    return dx.astype(x.dtype), dw, None


_rounds.defvjp(_rounds_fwd, _rounds_bwd)
