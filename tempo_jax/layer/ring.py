"""Steps 3–7 as a ring (`MoEConfig(exchange="ring")`): gather every token of the ``ep`` group, compute the pairs this
rank's slots own, reduce-scatter the weighted results back.

    x [T, H], gate [T, K], dest / local [T·K]           (this rank's rows and pairs)
      → all_gather over ``ep``: x_all [D·T, H], pairs_all [D·T, 2K] (gate, slot code)   one collective each
      → this rank's pairs (dest = me) sorted by local slot; rounds of D·C rows: gather rows, expert FFN (groups
        already contiguous: no sort inside), each row times its gate, added into its token's row of [D·T, H]
      → psum_scatter over ``ep`` → out [T, H]                                          one collective

Beside the all-to-all paths (`tempo_jax.layer.exchange_ffn`), the same function: every pair is computed once, by the
slot its table picked, and weighted by its gate. What differs is traffic and work: a rank receives every token of
its group once (D·T rows of H) instead of only the pairs routed to it (T·K rows of W), and returns D·T float32 rows
summed by the collective instead of its pairs' rows; no (source, destination) blocks to pack, no counts to exchange,
no round count to agree on (the rounds are local: nothing but the first and last collective crosses ranks).
`tempo_jax.layer.exchange.exchange_cost` prices both; `exchange="auto"` takes the cheaper.

Capacity follows the block exchange's: C rows per (source, destination) block, so at most D·C rows reach a rank's
FFN per round (the memory of the all-to-all's receive buffer). Dropless (``capacity="auto"`` / None): as many local
rounds as this rank's pairs need. A fixed C: pairs past C in their (source, destination) block, in the source's
pair order, are dropped and counted exactly as the padded exchange drops them.

Under differentiation a `jax.custom_vjp` over the local part keeps the rounds' memory bounded (round 0's VJP saved,
later rounds recomputed in the backward, as `tempo_jax.layer.rounds`); JAX transposes the two collectives (the
gather's cotangent is reduce-scattered, the reduce-scatter's gathered): the backward is a ring too.

Glossary additions: nr rounds (local to the rank), Cr = D·C rows per round.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from . import remat, stages

__all__ = ["Ring"]


@dataclasses.dataclass(frozen=True)
class Ring:
    """Steps 3–7 as a ring over ``wire.axis`` at ``capacity`` C rows per (source, destination) block; ``drop``:
    pairs past C in their block are dropped (a fixed capacity), else the rounds are dropless. One of the
    `tempo_jax.layer.exchange_ffn.ExchangeFFN` implementations; hashable (the static argument of its VJP)."""

    wire: stages.Wire
    ffn: stages.FFN
    capacity: int
    drop: bool = False

    def run(self, x: jax.Array, gate: jax.Array, dest: jax.Array, local: jax.Array, weights: dict) -> stages.Exchanged:
        """See `tempo_jax.layer.exchange_ffn.ExchangeFFN.run`; ``rounds`` = this rank's local rounds."""
        w = self.wire
        D, me = jax.lax.axis_size(w.axis), jax.lax.axis_index(w.axis)
        T, K, S = x.shape[0], w.top_k, stages.num_slots(weights)
        # Step 1: each pair's slot code (destination · S' + local slot; −1: never sent or dropped at capacity).
        po = stages.order_pairs(dest, local, D)
        sent = po.wanted
        code = jnp.where(dest < D, dest * S + local, -1)
        if self.drop:
            pos = (
                jnp.zeros_like(dest)
                .at[po.order]
                .set(jnp.arange(dest.shape[0], dtype=jnp.int32) - po.start[dest[po.order]])
            )
            code = jnp.where(pos < self.capacity, code, -1)
            sent = jnp.minimum(po.wanted, self.capacity)
        # Step 2: the ring's first collective(s): every token of the group and its pairs (gate, code) on every rank.
        with jax.named_scope("moe_exchange"):
            x_all = remat.name(jax.lax.all_gather(x.astype(w.dtype), w.axis, tiled=True), remat.DISPATCHED)  # [D·T, H]
            meta = jnp.concatenate([gate.reshape(T, K).astype(jnp.float32), code.reshape(T, K).astype(jnp.float32)], 1)
            meta_all = jax.lax.all_gather(meta, w.axis, tiled=True)  # [D·T, 2K]: codes < 2^24 are exact in float32
        meta_all = remat.name(meta_all, remat.DISPATCHED)
        gate_all = meta_all[:, :K].reshape(-1)
        code_all = jnp.round(jax.lax.stop_gradient(meta_all[:, K:])).astype(jnp.int32).reshape(-1)
        # Step 3: this rank's pairs, sorted by local slot (the grouped GEMM's groups, contiguous).
        mine = (code_all >= 0) & (code_all // S == me)
        slot = jnp.where(mine, code_all % S, S)
        sel = _Selection(jnp.argsort(slot, stable=True).astype(jnp.int32), slot, jnp.sum(mine, dtype=jnp.int32))
        # Step 4: local rounds (expert FFN, weighted, added per token); Step 5: reduce-scatter back.
        out_all, nr = _local(x_all, gate_all, weights, sel, self)
        with jax.named_scope("moe_return"):
            out = jax.lax.psum_scatter(out_all, w.axis, scatter_dimension=0, tiled=True)  # [T, H] float32
        out = remat.name(out, remat.RETURNED)
        group_sizes = jnp.bincount(slot, length=S + 1)[:S].astype(jnp.int32)
        return stages.Exchanged(out, group_sizes, po.wanted, sent, nr)


class _Selection(NamedTuple):
    """This rank's pairs among the group's ``D·T·K``: ``order`` pair indices sorted by local slot (this rank's
    first), ``slot`` local slot of each pair (S: another rank's or none), ``count`` how many are this rank's."""

    order: jax.Array
    slot: jax.Array
    count: jax.Array


def _round(x_all, sel: _Selection, r, how: Ring, num_slots: int):
    """Round r's rows: ``(rows [Cr, H], slots [Cr], token [Cr], pair [Cr], valid [Cr])`` (invalid rows: slot S,
    token D·T — out of range, dropped by the scatter)."""
    K, Cr = how.wire.top_k, _rows(how, x_all)
    i = r * Cr + jnp.arange(Cr, dtype=jnp.int32)
    valid = i < sel.count
    pair = sel.order[jnp.minimum(i, sel.order.shape[0] - 1)]
    token = jnp.where(valid, pair // K, x_all.shape[0])
    rows = x_all[jnp.where(valid, pair // K, 0)]
    slots = jnp.where(valid, sel.slot[pair], num_slots)
    return rows, slots, token, pair, valid


def _rows(how: Ring, x_all) -> int:
    """Rows per round, Cr = D·C (at most every pair of the group)."""
    D_T = x_all.shape[0]
    return min(how.capacity * jax.lax.axis_size(how.wire.axis), D_T * how.wire.top_k)


def _num_rounds(sel: _Selection, Cr: int) -> jax.Array:
    return jnp.maximum(1, (sel.count + Cr - 1) // Cr).astype(jnp.int32)


def _ffn(how: Ring):
    """The round's FFN on rows already grouped by slot, results in float32."""

    def ffn(rows, slots, weights):
        y, _ = how.ffn(rows, slots, weights, presorted=True)
        return y.astype(jnp.float32)

    return ffn


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _local(x_all, gate_all, weights, sel: _Selection, how: Ring):
    """Every round of this rank's pairs → ``(out_all [D·T, H] float32, nr)``: Σ over its pairs of gate · FFN(row)."""
    return _forward(x_all, gate_all, weights, sel, how, keep_first=False)[0]


def _forward(x_all, gate_all, weights, sel, how: Ring, *, keep_first: bool):
    ffn, H = _ffn(how), x_all.shape[1]
    nr = _num_rounds(sel, _rows(how, x_all))

    def one_round(r, out, keep_vjp):
        rows, slots, token, pair, valid = _round(x_all, sel, r, how, stages.num_slots(weights))
        if keep_vjp:
            y, vjp = jax.vjp(lambda rows, ws: ffn(rows, slots, ws), rows, weights)
        else:
            y, vjp = ffn(rows, slots, weights), None
        g = jnp.where(valid, gate_all[pair], 0.0)
        return out.at[token].add(y * g[:, None], mode="drop"), (vjp, y)

    out = jnp.zeros((x_all.shape[0], H), jnp.float32)
    first, saved = 0, None
    if keep_first:  # Step 1 (under differentiation): round 0 with its FFN's VJP and results kept
        out, saved = one_round(0, out, True)
        first = 1

    def body(carry):  # Step 2: the (further) rounds, local to this rank
        r, out = carry
        return r + 1, one_round(r, out, False)[0]

    _, out = jax.lax.while_loop(lambda c: c[0] < nr, body, (jnp.int32(first), out))
    return (out, nr), saved


def _local_fwd(x_all, gate_all, weights, sel, how: Ring):
    (out, nr), saved = _forward(x_all, gate_all, weights, sel, how, keep_first=True)
    return (out, nr), (x_all, gate_all, weights, sel, remat.name(saved, remat.DISPATCHED), nr)


def _local_bwd(how: Ring, res, cotangents):
    x_all, gate_all, weights, sel, saved, nr = res
    dout = cotangents[0]
    ffn = _ffn(how)

    def back_round(r, vjp, y, dx, dg, dw):
        """Round r's VJP: the rows' cotangent is the token's times the gate; the gate's is ⟨y, token's⟩."""
        _, _, token, pair, valid = _round(x_all, sel, r, how, stages.num_slots(weights))
        dtok = jnp.where(valid[:, None], dout[jnp.minimum(token, dout.shape[0] - 1)], 0.0)
        g = jnp.where(valid, gate_all[pair], 0.0)
        drows, dweights = vjp(dtok * g[:, None])
        dx = dx.at[token].add(drows.astype(dx.dtype), mode="drop")
        dg = dg.at[jnp.where(valid, pair, dg.shape[0])].add(jnp.sum(y * dtok, axis=1), mode="drop")
        dw = jax.tree.map(lambda a, b: a + b.astype(a.dtype), dw, dweights)
        return dx, dg, dw

    dx = jnp.zeros(x_all.shape, jnp.float32)
    dg = jnp.zeros(gate_all.shape, jnp.float32)
    dw = jax.tree.map(lambda v: jnp.zeros(v.shape, jnp.float32), weights)
    # Step 1: round 0 from its saved VJP.
    dx, dg, dw = back_round(0, saved[0], saved[1], dx, dg, dw)

    # Step 2: every further round recomputed, then its VJP.
    def body(carry):
        r, dx, dg, dw = carry
        rows, slots, *_ = _round(x_all, sel, r, how, stages.num_slots(weights))
        y, vjp = jax.vjp(lambda rows, ws: ffn(rows, slots, ws), rows, weights)
        return (r + 1, *back_round(r, vjp, y, dx, dg, dw))

    _, dx, dg, dw = jax.lax.while_loop(lambda c: c[0] < nr, body, (jnp.int32(1), dx, dg, dw))
    dw = jax.tree.map(lambda g, v: g.astype(v.dtype), dw, weights)
    return dx.astype(x_all.dtype), dg.astype(gate_all.dtype), dw, None


_local.defvjp(_local_fwd, _local_bwd)
