"""Dynamic copies in jnp (issue 52): the per-batch copy plan of `solvers.copies.plan_copies`, step for step, as a
jittable function of the batch's counts — the computation every rank will run on the all-gathered counts inside the
step (static shapes, a fixed number of rounds, no host callback). `solvers.copies` holds the algorithm, its
break-even guard and its exact yardstick; tests/test_copies.py checks that the two plans are equal.

`fetch_copies` moves the planned copies' weights inside `shard_map`: one all-to-all of ``[D, k, ...]`` per array,
whose transpose returns each copy's gradient to the slot it was copied from (so training sums it into the home
slot, and the optimizer state stays there). `moe_forward` runs both with ``MoEConfig(dynamic_slots=k, copy_cost=)``:
the copies become extra columns of the in-graph table (rank m's dynamic slot j is physical slot ``D·S + m·k + j``),
on a 1-D mesh and inside each EP group of a data × ep × tensor mesh.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from solvers import CopyCost, CostModel
from solvers.copies import SPLIT_EPS
from tempo_jax.layer.exchange import send_blocks
from tempo_jax.layer.relief import ROUNDS, relief

__all__ = ["fetch_copies", "plan_copies"]


def _times(cost: CostModel, G, N):
    return cost.rank_times(G, N, xp=jnp)


def _exposed(copy_cost: CopyCost, copies):
    return jnp.maximum(0.0, copies.astype(jnp.float32) * copy_cost.copy_us - copy_cost.overlap_us)


def plan_copies(
    n: jax.Array,
    ranks: jax.Array,
    cost: CostModel,
    num_ranks: int,
    dynamic_slots: int,
    copy_cost: CopyCost,
    rounds: int = ROUNDS,
    *,
    num_slots: int | None = None,
    with_rounds: bool = False,
) -> tuple[jax.Array, ...]:
    """The copy plan of one batch: ``n [E]`` tokens per expert, ``ranks [E, R]`` the fixed replica columns
    (`relief.replica_ranks`), k = ``dynamic_slots`` spare slots per rank → ``(x [E, R] float32 tokens on the fixed
    columns, copy_expert [D, k] int32 (−1: none), copy_source [D, k] int32, copy_tokens [D, k] float32)`` — equal to
    `solvers.copies.plan_copies` (steps 1-3); ``num_slots`` bounds relief's candidate moves as in `relief.relief`;
    ``with_rounds``: a fifth element, the improvement rounds relief ran (step 1)."""
    D, k = num_ranks, dynamic_slots
    E, R = ranks.shape
    n = n.astype(jnp.float32)
    # Step 1: relief over the fixed replicas.
    x, ran = relief(n, ranks, cost, D, rounds, num_slots=num_slots, with_rounds=True)
    ok = ranks >= 0
    e_of = jnp.broadcast_to(jnp.arange(E)[:, None], ranks.shape)
    rk = jnp.where(ok, ranks, D)  # columns without a rank go to a dropped rank D
    on = jnp.zeros((E, D + 1), jnp.float32).at[e_of, rk].add(jnp.where(ok, x, 0.0))[:, :D]
    held = jnp.zeros((E, D + 1), bool).at[e_of, rk].set(ok)[:, :D]
    state = dict(
        x=x,
        on=on,
        held=held,
        copies=jnp.zeros(D, jnp.int32),
        sent=jnp.zeros(D, jnp.int32),
        cexp=jnp.full((D, k), -1, jnp.int32),
        csrc=jnp.full((D, k), -1, jnp.int32),
        ctok=jnp.zeros((D, k), jnp.float32),
        G=(on > 0).sum(axis=0).astype(jnp.float32),
        N=on.sum(axis=0),
        done=jnp.asarray(False),
    )
    if k == 0:
        return (x, state["cexp"], state["csrc"], state["ctok"]) + ((ran,) if with_rounds else ())
    beta = max(cost.beta, 1e-12)
    rank_ids = jnp.arange(D)

    def one_round(_, s):
        # a. the slowest rank
        o = _exposed(copy_cost, s["copies"])
        t = _times(cost, s["G"], s["N"]) + o
        g = jnp.argmax(t)
        # b. candidates (e, m): e has tokens on g; m holds e, or has a free dynamic slot
        xe = s["on"][:, g][:, None]
        cand = (xe > 0) & (s["held"] | (s["copies"] < k)[None, :]) & (rank_ids != g)[None, :]
        new_copy = ~s["held"]
        o_m = jnp.where(new_copy, _exposed(copy_cost, s["copies"] + 1)[None, :], o[None, :])
        gains_act = (s["on"] == 0).astype(jnp.float32)
        # c. the whole share and the equalising split
        split = jnp.floor((beta * (s["N"][g] - s["N"][None, :]) + o[g] - o_m) / (2 * beta) + SPLIT_EPS)
        split = jnp.clip(split, 1.0, jnp.maximum(xe - 1.0, 1.0))
        best_after = jnp.full((E, D), jnp.inf, jnp.float32)
        best_s = jnp.zeros((E, D), jnp.float32)
        for amount in (jnp.broadcast_to(xe, (E, D)), split):
            whole = (amount >= xe).astype(jnp.float32)
            tg = _times(cost, s["G"][g] - whole, s["N"][g] - amount) + o[g]
            tm = _times(cost, s["G"][None, :] + gains_act, s["N"][None, :] + amount) + o_m
            after = jnp.where(cand, jnp.maximum(tg, tm), jnp.inf)
            better = after < best_after
            best_after, best_s = jnp.where(better, after, best_after), jnp.where(better, amount, best_s)
        # d. the break-even guard
        c = jnp.argmin(best_after.reshape(-1))
        e, m = c // D, c % D
        take = (best_after.reshape(-1)[c] < t[g]) & ~s["done"]
        amt = best_s[e, m]
        copying = take & new_copy[e, m]
        # e. the source: the fixed holder of e sending the fewest copies (lowest rank on ties)
        holder = jnp.zeros(D + 1, bool).at[jnp.where(ranks[e] >= 0, ranks[e], D)].set(True)[:D]
        src = jnp.argmin(jnp.where(holder, s["sent"], jnp.iinfo(jnp.int32).max))
        slot = s["copies"][m]
        out = dict(s)
        out["cexp"] = jnp.where(copying, s["cexp"].at[m, slot].set(e), s["cexp"])
        out["csrc"] = jnp.where(copying, s["csrc"].at[m, slot].set(src), s["csrc"])
        out["copies"] = s["copies"].at[m].add(copying.astype(jnp.int32))
        out["sent"] = s["sent"].at[src].add(copying.astype(jnp.int32))
        out["held"] = s["held"].at[e, m].set(s["held"][e, m] | copying)
        d_amt = jnp.where(take, amt, 0.0)
        lose = (take & (amt >= s["on"][e, g])).astype(jnp.float32)
        gain = (take & (s["on"][e, m] == 0)).astype(jnp.float32)
        out["G"] = s["G"].at[g].add(-lose).at[m].add(gain)
        out["N"] = s["N"].at[g].add(-d_amt).at[m].add(d_amt)
        out["on"] = s["on"].at[e, g].add(-d_amt).at[e, m].add(d_amt)
        # take from g (its fixed column, then its copy of e) and give to m (its fixed column, else its copy)
        col_g, col_m = ranks[e] == g, ranks[e] == m
        from_fixed = jnp.minimum(d_amt, jnp.sum(jnp.where(col_g, s["x"][e], 0.0)))
        xr = s["x"][e] - jnp.where(col_g, from_fixed, 0.0)
        to_fixed = jnp.any(col_m)
        xr = xr + jnp.where(col_m & to_fixed, d_amt, 0.0)
        out["x"] = s["x"].at[e].set(xr)
        ctok = s["ctok"].at[g].add(-jnp.where(out["cexp"][g] == e, d_amt - from_fixed, 0.0))
        out["ctok"] = ctok.at[m].add(jnp.where((out["cexp"][m] == e) & ~to_fixed, d_amt, 0.0))
        out["done"] = s["done"] | ~take
        return out

    # Rounds until one makes no move (the rest would be no-ops), at most rounds + D·k.
    _, s = jax.lax.while_loop(
        lambda c: (c[0] < rounds + D * k) & ~c[1]["done"], lambda c: (c[0] + 1, one_round(c[0], c[1])), (0, state)
    )
    # Step 3: copies drained of tokens are dropped; made copies first in each rank's slots.
    empty = (s["cexp"] >= 0) & (s["ctok"] <= 0)
    cexp, csrc, ctok = jnp.where(empty, -1, s["cexp"]), jnp.where(empty, -1, s["csrc"]), jnp.where(empty, 0, s["ctok"])
    order = jnp.argsort(cexp < 0, axis=1, stable=True)
    cexp, csrc, ctok = (jnp.take_along_axis(a, order, axis=1) for a in (cexp, csrc, ctok))
    return (s["x"], cexp, csrc, ctok) + ((ran,) if with_rounds else ())


def fetch_copies(
    weights: dict,
    slot_experts: jax.Array,
    copy_expert: jax.Array,
    copy_source: jax.Array,
    *,
    axis: str,
    exchange: str = "padded",
):
    """Inside `shard_map` over ``axis`` (D ranks): this rank's k dynamic slots filled with the planned copies.

    Args:
      weights: this rank's per-slot expert arrays ``{name: [S, ...]}``.
      slot_experts: ``[S]`` logical expert of each of this rank's slots.
      copy_expert, copy_source: ``[D, k]`` the plan (`plan_copies`; the same on every rank): the expert copied into
        each rank's dynamic slot and the rank it comes from (−1: none).
      exchange: the exchange (`tempo_jax.layer.exchange.send_blocks`): "padded" (`jax.lax.all_to_all` of every block)
        or "ragged" / "ragged_split" (`jax.lax.ragged_all_to_all`: only the copies move; GPU / TPU).

    Returns:
      ``{name: [k, ...]}``: slot j holds the weights of ``copy_expert[me, j]`` (zeros where no copy is made).

    One exchange per dtype (the arrays flattened side by side) of blocks ``[D, k, Σ sizes]``: block m holds the
    slots rank m asked of this rank, first (in m's slot order), so ``counts[m]`` rows are real; "padded" moves D·k
    slots per rank, "ragged" only the copies. A plan without copies skips it (one `jax.lax.cond`, the same branch
    on every rank). Its transpose is the same exchange back: the gradient of a copy lands, summed, on the slot of
    its source — the home slot.
    """
    me = jax.lax.axis_index(axis)
    k = copy_expert.shape[1]
    serve = copy_source == me  # [D, k]: the requests this rank serves
    first = jnp.argsort(~serve, axis=1, stable=True)  # each block's served slots first, in the receiver's order
    serve_sorted = jnp.take_along_axis(serve, first, axis=1)
    want = jnp.take_along_axis(copy_expert, first, axis=1)
    local = jnp.argmax(slot_experts[None, None, :] == want[:, :, None], axis=-1)  # [D, k] slot of the expert
    counts = jnp.sum(serve, axis=1, dtype=jnp.int32)  # [D] copies this rank sends each rank
    mine = copy_source[me]  # [k] where each of this rank's dynamic slots comes from
    # slot j's row in its source's block: how many of this rank's earlier slots come from the same source
    row = jnp.sum((mine[None, :] == mine[:, None]) & (jnp.arange(k)[None, :] < jnp.arange(k)[:, None]), axis=1)
    src = jnp.maximum(mine, 0)
    dtypes = list(dict.fromkeys(w.dtype for w in weights.values()))
    names = {dt: [name for name, w in weights.items() if w.dtype == dt] for dt in dtypes}

    def move(weights):
        out = {}
        for dt in dtypes:
            rows = jnp.concatenate([weights[n][local].reshape(*local.shape, -1) for n in names[dt]], axis=2)
            send = jnp.where(serve_sorted[:, :, None], rows, jnp.zeros((), dt))
            recv, _ = send_blocks(send, counts, axis=axis, exchange=exchange)  # block s: what source s sent this rank
            got = jnp.where((mine >= 0)[:, None], recv[src, row], jnp.zeros((), dt))  # [k, Σ sizes]
            at = 0
            for n in names[dt]:
                size = int(np.prod(weights[n].shape[1:]))
                out[n] = got[:, at : at + size].reshape((k, *weights[n].shape[1:]))
                at += size
        return out

    def nothing(weights):  # k zero slots typed as `move`'s (`serve` varies over the axis, and is all False here)
        return {
            n: jnp.where(serve[me].reshape((k,) + (1,) * (w.ndim - 1)), w[local[me]], jnp.zeros((), w.dtype))
            for n, w in weights.items()
        }

    # The plan is the same on every rank, so every rank takes the same branch: a batch without copies moves nothing.
    return jax.lax.cond(jnp.any(copy_expert >= 0), move, nothing, weights)
