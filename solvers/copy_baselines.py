"""The per-batch copy policies of others, as the dynamic copy plan (`solvers.copies`) is measured against them
(issue 52, notebook 11). numpy only.

Both balance *tokens* and copy weights without pricing the copy: the baseline the break-even guard is meant to beat.

- `equalise_rows` ("MoonEP-style"): each rank keeps ``k`` spare slots; hot experts' tokens move into copies on the
  ranks below the mean until every rank computes as close to the same number of rows as whole tokens allow. The
  copies are made whatever they cost (MoonEP plans every microbatch this way; Megatron-LM #6274).
- `least_loaded` ("LLEP-style", arXiv 2601.17111): with no slot limit, whenever the busiest rank carries more than
  ``threshold`` × the mean tokens, its excess moves to the least-loaded ranks with the experts' weights.

Algorithm (`balance_tokens`, shared by both):

1. Start: each expert's tokens split evenly over the ranks that hold it (EPLB-even, whole tokens: the remainder to
   the lowest replica columns).
2. While the busiest rank g is above the target ``⌈Σ n / D⌉`` (and, for LLEP, above ``threshold`` × the mean):
   a. its expert with the most tokens on g that can still move (a rank below the target holds it, or has a free
      slot for a copy of it);
   b. the receiver: the least-loaded rank below the target that holds it, else the least-loaded with a free slot
      (lowest index on ties);
   c. move ``min(tokens of e on g, N_g − target, target − N_m)`` tokens (at least 1); a copy is made on m if it did
      not hold e.
   Stop when no move is possible.
3. Times: ``t_g = max(a + b·G_g, c + β·N_g [, c2 + γ·N_g]) + max(0, C_g·τ − ω)`` with ``C_g`` the copies rank g
   received — the copies' time is counted, though the policy did not weigh it.

Complexity: at most ``E·D`` moves of O(E·D) each.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .checks import check_int, check_real
from .copies import CopyCost
from .cost import CostModel
from .relief import check_relief_cost, rank_times

__all__ = ["TokenPlan", "balance_tokens", "equalise_rows", "even_split", "least_loaded", "plan_times"]


@dataclasses.dataclass(frozen=True)
class TokenPlan:
    """A batch's tokens per (expert, rank) and the copies it made.

    Attributes:
      on: ``[E, D]`` tokens of each expert on each rank (fixed replicas and copies).
      copies: ``[D]`` experts each rank received for this batch.
      makespan: ``max_g t_g`` with the copies' time, µs.
      rank_times: ``[D]`` µs.
    """

    on: np.ndarray
    copies: np.ndarray
    makespan: float
    rank_times: np.ndarray

    @property
    def num_copies(self) -> int:
        return int(self.copies.sum())


def plan_times(on: np.ndarray, copies: np.ndarray, cost: CostModel, copy_cost: CopyCost) -> TokenPlan:
    """Step 3: the `TokenPlan` of tokens ``on [E, D]`` with ``copies [D]`` received per rank."""
    on = np.asarray(on, np.float64)
    copies = np.asarray(copies, np.int64)
    t = rank_times(cost, (on > 0).sum(axis=0), on.sum(axis=0)) + copy_cost.exposed_us(copies)
    return TokenPlan(on, copies, float(t.max()), t)


def even_split(n: np.ndarray, ranks: np.ndarray, num_ranks: int) -> np.ndarray:
    """Step 1: ``n [E]`` tokens split evenly over each expert's ranks ``ranks [E, R]`` (−1: none) → ``[E, D]``
    whole tokens (the remainder to the lowest replica columns)."""
    n = np.asarray(n, np.int64)
    ranks = np.asarray(ranks, np.int64)
    on = np.zeros((n.shape[0], num_ranks))
    for e in range(n.shape[0]):
        cols = ranks[e][ranks[e] >= 0]
        if n[e] and cols.size == 0:
            raise ValueError(f"even_split: expert {e} has {n[e]} tokens and no replica")
        if cols.size:
            share = np.full(cols.size, n[e] // cols.size) + (np.arange(cols.size) < n[e] % cols.size)
            np.add.at(on[e], cols, share)
    return on


def balance_tokens(
    n: np.ndarray,
    ranks: np.ndarray,
    cost: CostModel,
    num_ranks: int,
    copy_cost: CopyCost,
    *,
    slots: int | None,
    threshold: float = 1.0,
) -> TokenPlan:
    """Token balancing with unpriced copies (see the module): ``n [E]`` tokens per expert, ``ranks [E, R]`` the
    fixed replica columns (`relief.replica_ranks`), ``slots`` spare slots per rank (None: no limit),
    ``threshold``: act only while the busiest rank is above this × the mean → `TokenPlan`."""
    check_relief_cost(cost, "balance_tokens")
    D = check_int("num_ranks", num_ranks, minimum=1, where="balance_tokens")
    if slots is not None:
        check_int("slots", slots, minimum=0, where="balance_tokens")
    check_real("threshold", threshold, minimum=1.0, where="balance_tokens")
    if not isinstance(copy_cost, CopyCost):
        raise ValueError(f"balance_tokens: copy_cost must be a solvers.CopyCost, got {type(copy_cost).__name__}")
    n = np.asarray(n, np.float64)
    if n.ndim != 1 or (n < 0).any() or (n != np.round(n)).any():
        raise ValueError("balance_tokens: n must be [E] whole token counts >= 0")
    # Step 1.
    on = even_split(n, ranks, D)
    held = np.zeros(on.shape, bool)
    rk = np.asarray(ranks, np.int64)
    held[np.nonzero(rk >= 0)[0], rk[rk >= 0]] = True
    copies = np.zeros(D, np.int64)
    limit = np.inf if slots is None else slots
    target = np.ceil(n.sum() / D)
    # Step 2: one move per round; each lowers the busiest rank or fills a receiver up to the target.
    for _ in range(on.size + D):
        N = on.sum(axis=0)
        g = int(np.argmax(N))
        if N[g] <= target or N[g] <= threshold * N.mean():
            break
        below = N < target
        can_hold = held & below[None, :]
        can_copy = ~held & below[None, :] & (copies < limit)[None, :]
        movable = (on[:, g] > 0) & (can_hold | can_copy).any(axis=1)
        if not movable.any():
            break
        e = int(np.argmax(np.where(movable, on[:, g], -1.0)))  # a. the most tokens on g
        pool = can_hold[e] if can_hold[e].any() else can_copy[e]  # b. a holder first, else a free slot
        m = int(np.argmin(np.where(pool, N, np.inf)))
        s = max(1.0, min(on[e, g], N[g] - target, target - N[m]))  # c.
        if not held[e, m]:
            held[e, m] = True
            copies[m] += 1
        on[e, g] -= s
        on[e, m] += s
    return plan_times(on, copies, cost, copy_cost)


def equalise_rows(n, ranks, cost: CostModel, num_ranks: int, slots: int, copy_cost: CopyCost) -> TokenPlan:
    """MoonEP-style: ``slots`` spare slots per rank filled with copies until the rows are even (`balance_tokens`)."""
    return balance_tokens(n, ranks, cost, num_ranks, copy_cost, slots=slots)


def least_loaded(n, ranks, cost: CostModel, num_ranks: int, copy_cost: CopyCost, threshold: float = 1.0) -> TokenPlan:
    """LLEP-style: the busiest rank's excess over the mean to the least-loaded ranks, weights moved with it, no slot
    limit, whenever its load exceeds ``threshold`` × the mean (1: always; `balance_tokens`)."""
    return balance_tokens(n, ranks, cost, num_ranks, copy_cost, slots=None, threshold=threshold)
