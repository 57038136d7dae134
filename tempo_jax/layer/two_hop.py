"""Steps 3–7 in two hops over a ``node × ep`` mesh (`MoEConfig(node_axis=, node_exchange="two_hop")`): each token
crosses to another node once per node that holds one of its experts, not once per expert (DeepEP's inter-node
dispatch: RDMA between nodes, NVLink inside one).

    rank (n, e):  x [T, H], gate [T, K], dest / local [T·K]      (dest: flat rank n'·|ep| + e'; D: never sent)
      hop 1, over ``node`` (to rank (m, e) of every node m the token needs, the same ep index):
        block m = the tokens with a pair on node m, in token order, each with its K pairs' (ep index, slot, gate)
        there (ep index −1: the pair is elsewhere)                                        [Nn, T, H] + metadata
      hop 2, over ``ep`` inside the node: the received tokens with their node-local pairs and gates through the flat
        stages 3–7 over ``ep`` (`TwoHop.inner`: the expert FFN on each pair's rank, the return, each received token's
        node-local pairs weighted and summed in float32) → one partial row per (token, node), in the row dtype
                                                                                                      [Nn, T, H]
      return hop 1, over ``node``: the partial rows back to the token's rank, summed over the nodes → out [T, H]

Every pair is computed once, by the slot its table picked, and weighted by its gate: the same function as the flat
exchange over both axes (`tempo_jax.layer.exchange_ffn.OneExchange` with the expert axes ``(node, ep)``). Bytes over
``node``: a token's row goes to each distinct node of its pairs once (K·H per token flat, at most Nn·H here, fewer
when its pairs share nodes); the return carries one row per (token, node) instead of one per pair.

Capacities: hop 1 is one exchange of C1 = T rows per node block (a token needs a node once: dropless). Hop 2 is the
layer's dropless choice over ``ep``: with ``capacity="auto"`` rounds of C2 = Nn·C rows per block (C the flat
exchange's; a relay forwards about T·K pairs over De ranks where a rank sends T·K over D: `tempo_jax.layer.rounds`,
memory bounded by C2), with ``capacity=None`` one exchange of C2 = Nn·T·K rows (every received token's pairs on one
rank). JAX differentiates hop 1 as it is (the all-to-alls transpose to
all-to-alls over the same axes); hop 2 keeps its implementation's VJP.

Glossary additions: De ranks per node (the ``ep`` axis; D = Nn·De), C1 rows per block of the node hop, C2 rows per
block of the ep hop.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from . import stages
from .exchange import return_blocks, send_blocks

__all__ = ["TwoHop", "node_rows"]


def node_rows(dest: jax.Array, top_k: int, num_ranks: int, ranks_per_node: int) -> tuple[jax.Array, jax.Array]:
    """Which nodes each token needs: ``dest [T·K]`` flat destination ranks (``num_ranks`` D: never sent) →
    ``(need [T, N] bool, pos [T, N] int32)``: whether token t has a pair on node m, and its row in hop 1's block m
    (the tokens that need m, in token order)."""
    N = num_ranks // ranks_per_node
    d = dest.reshape(-1, top_k)
    node = jnp.where(d < num_ranks, d // ranks_per_node, N)  # [T, K]; N: never sent
    need = jnp.any(node[:, :, None] == jnp.arange(N)[None, None, :], axis=1)  # [T, N]
    pos = (jnp.cumsum(need, axis=0) - 1).astype(jnp.int32)
    return need, pos


@dataclasses.dataclass(frozen=True)
class TwoHop:
    """Steps 3–7 as two hops: ``wire.axis`` is ``(node, ep)`` (the expert axes, rank = node · |ep| + ep index); one of
    the `tempo_jax.layer.exchange_ffn.ExchangeFFN` implementations. The block exchanges of both hops are
    ``wire.exchange`` ("padded" or the ragged ones). Hop 2 is ``hop2`` — `tempo_jax.layer.rounds.Rounds` (dropless
    rounds, ``capacity="auto"``) or `tempo_jax.layer.exchange_ffn.OneExchange` (one exchange, ``capacity=None``) —
    over ``ep`` at Nn·``capacity`` rows per block (``capacity``: the flat exchange's C; T·K at the worst case)."""

    wire: stages.Wire
    ffn: stages.FFN
    capacity: int
    hop2: type

    def inner(self, nodes: int):
        """Hop 2's stages over ``ep`` on a mesh of ``nodes`` nodes: ``hop2`` at Nn·C rows per block."""
        w = self.wire
        wire = stages.Wire(w.axis[1], w.exchange, w.hidden, w.dtype, w.top_k)
        return self.hop2(wire, self.ffn, nodes * self.capacity)

    def run(self, x: jax.Array, gate: jax.Array, dest: jax.Array, local: jax.Array, weights: dict) -> stages.Exchanged:
        """See `tempo_jax.layer.exchange_ffn.ExchangeFFN.run`; ``rounds`` = hop 2's, ``wanted`` / ``sent [D]`` the
        pairs this rank's tokens send to each flat rank (dropless: equal)."""
        w = self.wire
        node_axis, _ = w.axis
        N, Ep = jax.lax.axis_size(node_axis), jax.lax.axis_size(w.axis[1])
        D, K = N * Ep, w.top_k
        T = x.shape[0]
        # Step 1: hop 1's blocks — each token once per node it needs, with its pairs' (ep index, slot, gate) there.
        need, pos = node_rows(dest, K, D, Ep)
        d = dest.reshape(T, K)
        node = jnp.where(d < D, d // Ep, N)
        here = node[:, None, :] == jnp.arange(N)[None, :, None]  # [T, N, K]: pair k of t is on node m
        ep_of = jnp.where(here, (d % Ep)[:, None, :], -1)  # [T, N, K]
        slot_of = jnp.where(here, local.reshape(T, K)[:, None, :], 0)
        gate_of = jnp.where(here, gate.reshape(T, K)[:, None, :].astype(jnp.float32), 0.0)
        row = jnp.where(need, pos, T)  # [T, N]; T: not sent to that node (dropped by the scatter)
        m_idx = jnp.broadcast_to(jnp.arange(N)[None, :], (T, N))

        def scatter(values, fill, dtype):
            """``values [T, N, ...]`` into the node blocks ``[N, T, ...]`` at each token's row."""
            out = jnp.full((N, T, *values.shape[2:]), fill, dtype)
            return out.at[m_idx, row].set(values.astype(dtype), mode="drop")

        rows1 = scatter(jnp.broadcast_to(x[:, None, :], (T, N, x.shape[1])), 0, w.dtype)
        meta1 = scatter(jnp.concatenate([ep_of, slot_of], axis=-1), -1, jnp.int32)  # [N, T, 2K]
        gates1 = scatter(gate_of, 0.0, jnp.float32)  # [N, T, K]
        counts1 = jnp.sum(need, axis=0).astype(jnp.int32)  # [N]
        # Step 2: hop 1 over the node axis (rank (n, e) → (m, e)); the rows past each block's count are not real.
        hop = dict(axis=node_axis, exchange=w.exchange)
        recv1, recv_counts1 = send_blocks(rows1, counts1, **hop)
        meta_r = jax.lax.stop_gradient(send_blocks(meta1, counts1, **hop)[0])  # ids: no gradient
        gates_r = send_blocks(gates1, counts1, **hop)[0]
        valid = (jnp.arange(T)[None, :] < recv_counts1[:, None])[..., None]  # [N, T, 1]
        ep_r = jnp.where(valid, meta_r[..., :K], -1).reshape(-1)  # [N·T·K]
        slot_r = meta_r[..., K:].reshape(-1)
        gates_r = jnp.where(valid, gates_r, 0.0).reshape(N * T, K)
        # Step 3: hop 2 — the flat stages over ``ep`` on the received tokens and their node-local pairs: the expert
        # FFN, the return, each token's pairs weighted and summed (float32) into one partial row.
        dest2 = jnp.where(ep_r >= 0, ep_r, Ep).astype(jnp.int32)  # Ep: not on this node
        hop2 = self.inner(N).run(recv1.reshape(N * T, -1), gates_r, dest2, slot_r, weights)
        partial = hop2.out.reshape(N, T, -1).astype(w.dtype)  # in the row dtype, as the flat exchange returns
        # Step 4: return hop 1 and the sum over the nodes.
        back = return_blocks(partial, recv_counts1, counts1, **hop)  # [N, T, H]: block m = node m's partial rows
        got = back[m_idx, jnp.where(need, pos, 0)]  # [T, N, H]
        out = jnp.sum(jnp.where(need[..., None], got.astype(jnp.float32), 0.0), axis=1)
        wanted = jnp.bincount(dest, length=D).astype(jnp.int32)
        return stages.Exchanged(out, hop2.group_sizes, wanted, wanted, hop2.rounds)
