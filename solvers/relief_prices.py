"""The prices of pairwise relief (`solvers.relief`), written once for both twins: every function takes the array
namespace ``xp`` (numpy, float64, in `solvers.relief`; `jax.numpy`, float32, in `tempo_jax.layer.relief`, which
keeps only its static-shape control flow around them). Each is elementwise or a gather; the segment reductions and
the loops stay with each twin.

K candidate moves (expert e, sender column on rank g, receiver column on rank h); D ranks."""

from __future__ import annotations

import numpy as np

from .cost import CostModel

__all__ = [
    "best_path",
    "chain_partners",
    "downhill_gains",
    "forward_prices",
    "path_prices",
    "price_gathered",
    "price_moves",
    "rank_times",
    "spread_turns",
]


def rank_times(cost: CostModel, G, N, xp=np):
    """Each rank's time ``max(a + b·G, c + β·N [, c2 + γ·N])`` from its activations ``G [D]`` and tokens ``N [D]``
    (relief prices Eq. 1 and the traffic piece; no tile term: `solvers.relief.check_relief_cost` refuses it)."""
    return cost.rank_times(G, N, xp=xp)


def spread_turns(n, count, xp=np):
    """Step 2, the spread start: taken in order of decreasing load ``n [E]`` (ties: the lower expert), the k-th
    replicated expert's turn k mod r_e, ``count [E]`` its ranks r_e → ``[E]`` int: which of its ranks, by
    cheapness, it goes to."""
    order = xp.argsort(-n, stable=True)
    kth = xp.cumsum(count[order] != 1) - 1  # replicated experts before it, in that order
    return kth[xp.argsort(order, stable=True)] % xp.maximum(count, 1)


def forward_prices(y, new, G_m, N_m, cost: CostModel, valid=True, xp=np):
    """Step 3a: a whole hand-off of share ``y [K]`` to a rank m with activations and tokens ``G_m, N_m [K]``
    (``new``: 1 where m gains the expert's activation) → ``(t_m, score)``: m's time after and the score each rank
    picks its best hand-off by (−t_m; −inf where there is nothing to hand off or ``valid`` is False)."""
    t_m = rank_times(cost, G_m + new, N_m + y, xp)
    return t_m, xp.where(valid & (y > 0), -t_m, -xp.inf)


def chain_partners(fw: dict, h, e, xp=np) -> dict:
    """Each candidate's chain partner: the receiver h's best hand-off ``fw`` (fields ``[2, D]``, `forward_prices`'
    two best per rank) of an expert other than e → the same fields ``[K]``."""
    first = fw["f"][0][h] != e
    return {k: xp.where(first, v[0][h], v[1][h]) for k, v in fw.items()}


def price_moves(xi, new_h, G, N, t, F: dict, g, h, cost: CostModel, *, xp=np, dtype=None) -> dict:
    """Step 3b: every candidate move's best price — ``gain``, ``share`` (tokens of e moved) and ``chain`` (with
    h's hand-off) — from e's share on the sender ``xi`` and whether the receiver gains e's activation ``new_h``
    (all ``[K]``), the ranks' activations, tokens and times ``G, N, t [D]``, the chain partners ``F``
    (`chain_partners`, fields ``[K]``), senders ``g`` and receivers ``h [K]``. ``dtype``: the float dtype."""
    has = F["f"] >= 0
    swap = has & (F["m"] == g)  # the hand-off goes back to the sender
    t_m = xp.where(has & ~swap, t[xp.where(has, F["m"], 0)], -xp.inf)  # the third rank's time before
    loads = (G[g], N[g], t[g], G[h], N[h], t[h], t_m)
    return price_gathered(xi, new_h, loads, has, swap, F["y"], F["new"], F["t"], cost, xp=xp, dtype=dtype)


def price_gathered(xi, new_h, loads, has, swap, y_f, new_f, t_f, cost: CostModel, *, xp=np, dtype=None) -> dict:
    """`price_moves` after its gathers, elementwise over the K candidates: ``loads`` = the sender's and receiver's
    activations, tokens and times ``(G_g, N_g, t_g, G_h, N_h, t_h)`` and the third rank's time before ``t_m``
    (−inf: none), ``has`` / ``swap`` (h has a hand-off / it goes back to g) and the hand-off's share ``y_f``, new
    activation ``new_f`` and time after ``t_f``, all ``[K]``."""
    Gg, Ng, tg, Gh, Nh, th, t_m = loads
    gain_out = xp.full(xi.shape, -xp.inf, dtype)
    share_out = xp.zeros(xi.shape, dtype)
    chain_out = xp.zeros(xi.shape, bool)
    for chain in (False, True):
        y = xp.where(has, y_f, 0.0) if chain else 0.0
        back = xp.where(swap, y, 0.0) if chain else 0.0  # tokens g gets back
        g_act = xp.where(swap, new_f, 0.0) if chain else 0.0
        h_act = new_h - (1.0 if chain else 0.0)
        third = xp.where(has & ~swap, t_f, -xp.inf) if chain else -xp.inf  # m's time after
        before = xp.maximum(tg, th)
        if chain:
            before = xp.maximum(before, t_m)

        def after(share, frees, y=y, back=back, g_act=g_act, h_act=h_act, third=third):
            return xp.maximum(
                xp.maximum(
                    rank_times(cost, Gg - frees + g_act, Ng - share + back, xp),
                    rank_times(cost, Gh + h_act, Nh + share - y, xp),
                ),
                third,
            )

        whole = after(xi, 1.0)
        shift = (y + back) if chain else 0.0
        part = xp.clip(xp.floor((Ng - Nh + shift) / 2), 1, xp.maximum(xi - 1, 1))
        split = xp.where(xi >= 2, after(part, 0.0), xp.inf)
        gain = before - xp.minimum(whole, split)
        if chain:  # only where no plain move gains
            gain = xp.where(has & (gain_out <= 0), gain, -xp.inf)
        better = gain > gain_out
        gain_out = xp.where(better, gain, gain_out)
        share_out = xp.where(better, xp.where(split < whole, part, xi), share_out)
        chain_out = xp.where(better, chain, chain_out)
    return {"gain": gain_out, "share": share_out, "chain": chain_out}


def downhill_gains(moves: dict, xi, t_g, t_h, m, g, valid=True, xp=np):
    """Step 3b's filter: ``moves`` (`price_gathered`) taken only downhill (``t_g ≥ t_h``), from a share the sender
    holds and with a positive gain → ``(gain [K], third [K])``: the gain (−inf: not a candidate) and a chain's
    third rank (``m``: the partner's rank; −1 for a plain move or a swap back to g)."""
    gain = xp.where(valid & (xi > 0) & (t_g >= t_h) & (moves["gain"] > 0), moves["gain"], -xp.inf)
    return gain, xp.where(moves["chain"] & (m != g), m, -1)


def path_prices(G, N, t, dG, dN, reached, g, cost: CostModel, xp=np):
    """Step 3d's prices: the ranks' loads ``G, N [D]`` and times ``t [D]``, each terminal's path changes ``dG, dN
    [D, D]`` (terminal, rank), the ranks the search ``reached [D]`` from the slowest rank ``g`` → ``(m, found)``:
    the terminal whose plan is best by (makespan, ranks at it, m), when it lowers the makespan or keeps it with
    fewer ranks at it."""
    after = rank_times(cost, G[None] + dG, N[None] + dN, xp)  # [terminal, rank]
    ms = xp.max(after, axis=1)
    at_ms = xp.sum(after == ms[:, None], axis=1)
    top = xp.max(t)
    D = t.shape[0]
    useful = reached & (xp.arange(D) != g) & ((ms < top) | ((ms == top) & (at_ms < xp.sum(t == top))))
    return best_path(useful, ms, at_ms, xp)


def best_path(useful, ms, at_ms, xp=np):
    """Among the ``useful [D]`` terminals, the lowest makespan ``ms``, then the fewest ranks at it ``at_ms``, then
    the lowest index → ``(m, found)``."""
    pick = useful & (ms == xp.min(xp.where(useful, ms, xp.inf)))
    fewest = xp.min(xp.where(pick, at_ms, at_ms.shape[0] + 1))
    return xp.argmax(pick & (at_ms == fewest)), xp.any(useful)
