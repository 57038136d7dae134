"""Steps 3–7 of the layer — send each pair's row to its slot's rank, run the expert FFN there, return the result,
weight it by its gate — behind one interface with four implementations.

    ExchangeFFN.run(x [T, H], gate [T, K], dest [T·K], local [T·K], weights)
        -> stages.Exchanged(out [T, H], group_sizes, wanted, sent, rounds)

- `OneExchange`: pack at C rows per block (the dropless worst case, or a fixed C that drops the rest), one
  exchange, one expert FFN over every received row, one return.
- `tempo_jax.layer.rounds.Rounds`: dropless rounds of C rows per block until every pair is computed (the default,
  ``capacity="auto"``; bounded memory, its own VJP).
- `tempo_jax.layer.cascade_exec.Scheduled`: CascadeEP's launch schedule — shifted exchanges per launch group, one
  grouped GEMM per group.
- `tempo_jax.layer.ring.Ring` (``exchange="ring"``): every token gathered over the group, each rank's own pairs
  computed (rounds local to the rank), the weighted results reduce-scattered back.

Each is a frozen dataclass of the same two settings, `stages.Wire` (how rows travel) and `stages.FFN` (the expert
FFN), plus its own (C, the schedule); `for_call` picks one from the config and the call's capacity. All four
compute every pair they send exactly once with the same FFN, so the layer's output does not depend on the choice.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

import jax
import jax.numpy as jnp

from . import remat, stages
from .cascade_exec import Scheduled
from .config import MoEConfig
from .exchange import block_exchange
from .ring import Ring
from .rounds import Rounds
from .two_hop import TwoHop

__all__ = ["ExchangeFFN", "OneExchange", "Ring", "Rounds", "Scheduled", "TwoHop", "for_call"]


class ExchangeFFN(Protocol):
    """Steps 3–6 on one rank (inside the layer's `shard_map`)."""

    wire: stages.Wire
    ffn: stages.FFN

    def run(self, x: jax.Array, gate: jax.Array, dest: jax.Array, local: jax.Array, weights: dict) -> stages.Exchanged:
        """``x [T, H]`` this rank's rows (``wire.top_k`` pairs each) and their pairs' weights ``gate [T, K]``,
        ``dest`` / ``local [T·K]`` int32 destination rank (D: never sent) and local slot there of each pair, this
        rank's per-slot expert ``weights`` → `stages.Exchanged`."""
        ...


@dataclasses.dataclass(frozen=True)
class OneExchange:
    """Steps 3–6 in one exchange of ``capacity`` C rows per block (rows past C are dropped and counted).
    ``by_slot``: C drops nothing (the dropless worst case), so each block is packed sorted by slot and the receiver
    orders its rows by counting (`stages.merge_by_slot`); a fixed C keeps each block in pair order."""

    wire: stages.Wire
    ffn: stages.FFN
    capacity: int
    by_slot: bool = True

    def run(self, x: jax.Array, gate: jax.Array, dest: jax.Array, local: jax.Array, weights: dict) -> stages.Exchanged:
        """See `ExchangeFFN.run`; ``rounds`` = 1."""
        w = self.wire
        D = jax.lax.axis_size(w.axis)
        # Step 3: pack by destination (rows and their slot ids travel together).
        packed = stages.pack(
            x, dest, local, top_k=w.top_k, num_ranks=D, capacity=self.capacity, dtype=w.dtype, by_slot=self.by_slot
        )
        # Step 4: one exchange; Step 5: expert FFN on every received row; Step 6: return.
        recv = stages.exchange_rows(
            packed, axis=w.axis, exchange=w.exchange, hidden=w.hidden, slots_per_rank=stages.num_slots(weights)
        )
        recv = remat.name(recv, remat.DISPATCHED)  # rows, slots and counts: what the backward reads of the exchange
        runs = D if self.by_slot else None
        y, group_sizes = self.ffn(recv.rows.reshape(-1, w.hidden), recv.slots.reshape(-1), weights, runs=runs)
        y_pairs = stages.return_rows(y.reshape(recv.rows.shape), recv.counts, packed, axis=w.axis, exchange=w.exchange)
        y_pairs = remat.name(y_pairs, remat.RETURNED)
        # Step 7: each token's pairs weighted by their gates.
        out = stages.combine(y_pairs, gate, jnp.float32)
        return stages.Exchanged(out, group_sizes, packed.wanted, packed.counts, jnp.int32(1))


def for_call(config: MoEConfig, *, exchange: str, capacity: tuple[str, int], top_k: int) -> ExchangeFFN:
    """The implementation of one layer call: the ring when ``exchange`` is "ring" (dropless unless ``capacity`` is
    ``("fixed", C)``), else dropless rounds when ``capacity`` is ``("rounds", C)``, else the config's launch schedule
    (`Scheduled`) or one exchange (``schedule="sync"``) at C rows per block; ``exchange`` is the resolved exchange
    implementation and ``top_k`` the pairs per row of the layer's ``x``."""
    wire = stages.Wire(config.expert_axes, exchange, config.expert_width, config.dtype, top_k)
    ffn = stages.FFN(config.expert, config.gmm_impl, config.interpret, config.fp8_activation_block)
    how, C = capacity
    if config.node_exchange == "two_hop":  # a block exchange per hop (the platform's where "auto" chose the ring)
        hop2 = Rounds if how == "rounds" else OneExchange  # inside the node: the flat stages over ep
        return TwoHop(dataclasses.replace(wire, exchange=block_exchange(exchange)), ffn, C, hop2)
    if exchange == "ring":
        return Ring(wire, ffn, C, drop=how == "fixed")
    if how == "rounds":
        return Rounds(wire, ffn, C)
    if config.schedule == "sync":
        return OneExchange(wire, ffn, C, by_slot=how != "fixed")
    return Scheduled(wire, ffn, C, config.schedule, by_slot=how != "fixed")
