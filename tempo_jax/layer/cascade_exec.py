"""CascadeEP inside the `shard_map` layer: per-source shifted exchanges, one expert FFN per launch group, OEWF.

`tempo_jax.layer.moe` calls these per-rank functions when `MoEConfig.schedule` is a `solvers.LaunchSchedule` or
`MoEConfig.fetches` is non-empty; they compose the stages of `tempo_jax.layer.stages`. The host-side half (plans →
`WeightFetch`es, pair counts for the planners) is `tempo_jax.layer.cascade_plan`.

**Asynchronous launching** (`Scheduled`, one of the `tempo_jax.layer.exchange_ffn.ExchangeFFN` implementations;
`scheduled_exchange_ffn`). The synchronous all-to-all is decomposed into the
schedule's shifts (`LaunchSchedule.shifts`): for launch group g and shift k, every source s of g sends its
block for rank (s + k) mod D with one `jax.lax.ppermute` (k = 0 is the local block, no collective). After
group g's D shifts, each rank runs one grouped-GEMM SwiGLU over the blocks of g's sources only and returns
their results with the reverse shifts. So group g's GEMM depends on g's shifts alone (checked on the jaxpr
in the tests): a scheduler (XLA's latency-hiding scheduler on GPU) can start it as soon as g's sources have
sent, while later groups are still in attention. The arrival order is fixed at compile time, from the
planner's predicted order; every row still goes through exactly one GEMM, so the output equals the
synchronous layer's.

**OEWF** (`apply_fetches`). A `WeightFetch` (helper h, donor d, logical experts) copies the donor's weights
of those experts to h with a `ppermute` that depends on no activation (a scheduler can hoist it under
attention) into extra local slots S, S+1, … of every rank (zeros where unused); h's own pairs routed to those
experts on d are redirected to its extra slots and computed locally; d receives fewer rows. Gradients of the
fetched weights flow back through the ppermute to the donor's replica, hence once to the logical weights.

Glossary additions: m sources in a launch group."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from solvers import LaunchSchedule

from . import stages

__all__ = ["Scheduled", "apply_fetches", "scheduled_exchange_ffn"]


def apply_fetches(fetches, ids, dest, local, phy2log, weights: dict, *, axis: str, slots_per_rank: int):
    """OEWF on one rank: fetch weights into extra local slots and redirect the helper's pairs to them.

    Args:
      fetches: `WeightFetch`es (static).
      ids: ``[T·K]`` logical expert of each pair; dest, local: ``[T·K]`` destination rank and its slot.
      phy2log: ``[P]`` logical expert of every physical slot.
      weights: this rank's per-slot expert arrays ``{name: [S, ...]}`` (w_gate, w_up, w_down and any biases).

    Returns:
      ``(dest, local, weights)`` with the helper's redirected pairs and every rank's arrays extended by
      ``Σ len(experts)`` slots (zeros where the rank is not the helper), as parts ``(stored [S, ...], fetched
      [Σ len(experts), ...])`` that `stages.expert_ffn` reads without concatenating them.
    """
    S = slots_per_rank
    me = jax.lax.axis_index(axis)
    mine = jax.lax.dynamic_slice_in_dim(phy2log, me * S, S)  # [S] logical experts of this rank's slots
    extra, off = {name: [] for name in weights}, 0
    for f in fetches:
        ex = jnp.asarray(f.experts, jnp.int32)
        # Step 1: on the donor, the local slot of each fetched expert; copy its arrays to the helper.
        idx = jnp.argmax(mine[None, :] == ex[:, None], axis=1)
        with jax.named_scope(f"oewf_fetch_{f.helper}_{f.donor}"):
            for name, w in weights.items():
                extra[name].append(jax.lax.ppermute(w[idx], axis, perm=[(f.donor, f.helper)]))
        # Step 2: on the helper, its pairs for those experts on the donor go to the fetched slots instead.
        for j, e in enumerate(f.experts):
            hit = (me == f.helper) & (dest == f.donor) & (ids == e)
            dest = jnp.where(hit, me, dest)
            local = jnp.where(hit, S + off + j, local)
        off += len(f.experts)
    # two parts along the slot axis (`stages.expert_ffn`): the stored slots are never copied into a longer array
    weights = {name: (w, jnp.concatenate(extra[name], axis=0)) if extra[name] else w for name, w in weights.items()}
    return dest, local, weights


@dataclasses.dataclass(frozen=True)
class Scheduled:
    """Steps 3–6 by a CascadeEP launch ``schedule`` (`solvers.LaunchSchedule`): pack at ``capacity`` C rows per
    block (the worst case: nothing is dropped), then `scheduled_exchange_ffn`. One of the three
    `tempo_jax.layer.exchange_ffn.ExchangeFFN` implementations."""

    wire: stages.Wire
    ffn: stages.FFN
    capacity: int
    schedule: LaunchSchedule
    by_slot: bool = True  # blocks packed sorted by slot (nothing dropped; `exchange_ffn.OneExchange`)

    def run(self, x: jax.Array, gate: jax.Array, dest: jax.Array, local: jax.Array, weights: dict) -> stages.Exchanged:
        """``x [T, H]`` (``wire.top_k`` pairs per row), ``gate [T, K]``, ``dest`` / ``local [T·K]``, this rank's
        ``weights`` → `stages.Exchanged` (``rounds`` = 1)."""
        w = self.wire
        D = self.schedule.num_ranks
        packed = stages.pack(
            x, dest, local, top_k=w.top_k, num_ranks=D, capacity=self.capacity, dtype=w.dtype, by_slot=self.by_slot
        )
        back, group_sizes = scheduled_exchange_ffn(
            packed, self.schedule, weights, wire=w, ffn=self.ffn, by_slot=self.by_slot
        )
        out = stages.combine(stages.unpack_rows(back, packed), gate, jnp.float32)
        return stages.Exchanged(out, group_sizes, packed.wanted, packed.counts, jnp.int32(1))


def scheduled_exchange_ffn(
    packed: stages.Packed,
    schedule: LaunchSchedule,
    weights: dict,
    *,
    wire: stages.Wire,
    ffn: stages.FFN,
    by_slot: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """Exchange and expert FFN shift by shift, one grouped GEMM per launch group (see the module doc).

    Args:
      packed: this rank's `stages.Packed` rows (``buffer [D, C, W]``, ``counts [D]``).
      schedule: the static `solvers.LaunchSchedule` (D ranks, groups in launch order).
      weights: the rank's per-slot expert arrays (extended by OEWF's fetched slots).
      wire: how the rows travel (`stages.Wire`: the ``ep`` axis, H). ffn: the call's expert FFN (`stages.FFN`).
      by_slot: ``packed``'s blocks are sorted by slot (`stages.pack(by_slot=True)`): each group's rows are ordered
        for its GEMM by counting, not by a sort.

    Returns:
      ``(back [D, C, H], group_sizes [slots_total])``: block j = results of the rows this rank sent to rank j
      (as `tempo_jax.layer.exchange.return_blocks` gives them), and the rows each slot computed (slots_total:
      the local slots with fetched ones, `stages.num_slots`).
    """
    D = schedule.num_ranks
    buf, counts = packed.buffer, packed.counts
    C = buf.shape[1]
    axis, hidden, slots_total = wire.axis, wire.hidden, stages.num_slots(weights)
    me = jax.lax.axis_index(axis)
    back = jnp.zeros((D, C, hidden), buf.dtype)
    sizes = jnp.zeros((slots_total,), jnp.int32)
    shifts = schedule.shifts
    for g, group in enumerate(schedule.groups):
        src = jnp.asarray(group, jnp.int32)
        in_group = jnp.any(src == me)
        # Step 1: g's shifts: source s sends its block for (s + k) mod D; shift k delivers source (me − k) mod D.
        got, got_counts = [], []
        for r in (r for r in shifts if r.group == g):
            block = jax.lax.dynamic_index_in_dim(buf, (me + r.shift) % D, keepdims=False)
            n = counts[(me + r.shift) % D]
            if r.shift == 0:
                got.append(jnp.where(in_group, block, 0))
                got_counts.append(jnp.where(in_group, n, 0))
                continue
            with jax.named_scope(f"cascade_shift_{g}_{r.shift}"):
                got.append(jax.lax.ppermute(block, axis, perm=list(r.pairs)))
                got_counts.append(jax.lax.ppermute(n, axis, perm=list(r.pairs)))
        # Step 2: keep the m shifts that carried a source of g to this rank (static count, rank-dependent shifts).
        ks = (me - src) % D  # [m] shift of each source of g
        blocks = jnp.stack(got)[ks]  # [m, C, W]
        recv = stages.received(blocks, jnp.stack(got_counts)[ks], hidden=hidden, slots_per_rank=slots_total)
        # Step 3: one grouped GEMM over g's rows.
        with jax.named_scope(f"cascade_group_{g}"):
            runs = len(group) if by_slot else None
            y, gs = ffn(recv.rows.reshape(-1, hidden), recv.slots.reshape(-1), weights, runs=runs)
        sizes = sizes + gs
        # Step 4: reverse shifts: results for source (me − k) mod D go back to it.
        per_shift = jnp.zeros((D, C, hidden), y.dtype).at[ks].set(y.reshape(-1, C, hidden))
        for r in (r for r in shifts if r.group == g):
            if r.shift == 0:
                ret = jnp.where(in_group, per_shift[0], 0)
            else:
                with jax.named_scope(f"cascade_return_{g}_{r.shift}"):
                    ret = jax.lax.ppermute(per_shift[r.shift], axis, perm=[(d, s) for s, d in r.pairs])
            back = back.at[(me + r.shift) % D].add(ret.astype(back.dtype))
    return back, sizes
