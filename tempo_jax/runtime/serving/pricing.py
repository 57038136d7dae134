"""What a serving run prices: the modelled makespan of a step whose EP groups (data replicas) each dispatch their own
tokens over the same tables, a re-placement's modelled move time and whether its gain over the steps it serves pays
for it (`priced`); the LM's per-layer forms (`lm_makespan`, `lm_move_us`)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from solvers import DispatchProblem, solve

from ...layer import plan_migration
from ...layer.params import slot_bytes

__all__ = ["group_makespan", "lm_makespan", "lm_move_us", "move_us", "priced"]


def group_makespan(makespan: Callable[[np.ndarray], float], counts) -> float:
    """The step's modelled makespan when each EP group dispatches its own tokens: the slowest group's
    ``makespan(counts [D, E])`` over ``counts [Ng, D, E]`` (Ng = 1: one group)."""
    return float(max(makespan(c) for c in np.asarray(counts)))


def move_us(rows: int, slot_bytes: int, gbps: float) -> float:
    """The modelled time of a re-placement, µs: ``rows`` over the busiest rank's link (`MigrationPlan.busiest_rows`)
    of ``slot_bytes`` each, at ``gbps`` GB/s."""
    return rows * slot_bytes / (gbps * 1e3)


def priced(before: float, after: float, *, horizon_steps: int, move: float, margin: float, scale: float = 1) -> dict:
    """A placement proposal priced: the modelled makespan per step under the old and the new placement (µs), the
    gain over the ``horizon_steps`` the new placement is expected to serve (``(before − after) · scale ·
    horizon_steps``; ``scale``: layers per step when ``before`` / ``after`` are means over layers), and whether it
    pays for the move: ``gain > margin · move`` (``move``: `move_us`). An equal makespan never pays."""
    gain = (before - after) * scale * horizon_steps
    return {
        "applied": bool(gain > margin * move),
        "makespan_before_us": before,
        "makespan_after_us": after,
        "horizon_steps": horizon_steps,
        "gain_us": gain,
        "move_us": move,
        "margin": margin,
    }


def lm_makespan(counts, placements, cost, policy: str) -> float:
    """The policy's modelled makespan of ``counts [L, Ng, D, E]`` (the last prefill batch, per EP group) on
    ``placements``: the slowest group's, mean over layers."""
    return float(
        np.mean(
            [
                group_makespan(lambda g, p=p: solve(DispatchProblem(g, p, cost), policy).makespan, c)
                for c, p in zip(counts, placements, strict=True)
            ]
        )
    )


def lm_move_us(model, old, new, gbps: float) -> float:
    """The modelled time of moving every layer from ``old`` to ``new`` placements, one layer after another, µs."""
    return sum(
        move_us(plan_migration(p, q).busiest_rows, slot_bytes(block.moe.params()), gbps)
        for block, p, q in zip(model.blocks, old, new, strict=True)
    )
