"""CascadeEP's host-side adapters for the layer (numpy only): plans in, what the in-graph layer executes out.

- `WeightFetch`: one OEWF reassignment as the layer executes it (helper, donor, logical experts).
- `fetches_from_plan`: the accepted moves of a `solvers.OEWFPlan` / `solvers.LayerOEWF` as `WeightFetch`es.
- `pair_tokens`: a layer run's per-replica counts → pairs per (source, destination, expert), what the planners
  take; `fetch_bytes`: the bytes a set of fetches moves; `check_fetches`: fetches against a placement.

The in-graph half (shifted exchanges per launch group, the weight copies) is `tempo_jax.layer.cascade_exec`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solvers import LayerOEWF, OEWFPlan

__all__ = ["WeightFetch", "check_fetches", "fetch_bytes", "fetches_from_plan", "pair_tokens"]


@dataclass(frozen=True)
class WeightFetch:
    """One OEWF reassignment as the layer executes it: ``helper`` fetches the full weights of logical
    ``experts`` from ``donor`` and computes its own tokens for them (from `solvers.oewf_plan`'s accepted moves)."""

    helper: int
    donor: int
    experts: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "experts", tuple(int(e) for e in self.experts))
        if self.helper == self.donor or min(self.helper, self.donor) < 0:
            raise ValueError(f"WeightFetch: helper {self.helper} and donor {self.donor} must be distinct ranks ≥ 0")
        if not self.experts or len(set(self.experts)) != len(self.experts):
            raise ValueError(f"WeightFetch: experts must be distinct and non-empty, got {self.experts}")


def pair_tokens(replica_counts, placement) -> np.ndarray:
    """``[D, D, E]`` pairs per (source rank, destination rank, logical expert) from a layer run's
    ``MoEOutput.stats.replica_counts`` ``[D, E, R]`` (pairs per source and replica column) and its `Placement`:
    what `solvers.LaunchSchedule.from_arrivals` (summed over E) and `solvers.oewf_at_dispatch` plan with."""
    rc = np.asarray(replica_counts, np.float64)
    D, E, R = rc.shape
    if E != placement.num_experts or D != placement.num_gpus:
        raise ValueError(
            f"pair_tokens: replica_counts has shape {rc.shape}, the placement has "
            f"D = {placement.num_gpus}, E = {placement.num_experts}"
        )
    out = np.zeros((D, D, E))
    for e in range(E):
        for r in range(int(placement.logcnt[e])):
            out[:, placement.slot_gpu[placement.log2phy[e, r]], e] += rc[:, e, r]
    return out


def fetches_from_plan(plan: OEWFPlan | LayerOEWF) -> tuple[WeightFetch, ...]:
    """The accepted reassignments of a `solvers.OEWFPlan` (`oewf_plan`) or a `solvers.LayerOEWF`
    (`oewf_at_dispatch`), in decision order."""
    moves = [getattr(a, "reassignment", a) for a in plan.accepted]
    return tuple(WeightFetch(r.helper, r.donor, tuple(r.experts)) for r in moves)


def fetch_bytes(fetches, hidden: int, ffn: int, dtype) -> int:
    """Bytes the weight copies move: Σ experts × 3·H·F × itemsize."""
    return sum(len(f.experts) for f in fetches) * 3 * hidden * ffn * np.dtype(dtype).itemsize


def check_fetches(fetches, phy2log: np.ndarray, num_ranks: int, slots_per_rank: int) -> None:
    """Host check: every fetch names ranks of the mesh and experts its donor holds."""
    for f in fetches:
        if max(f.helper, f.donor) >= num_ranks:
            raise ValueError(f"{f}: ranks must lie in 0..{num_ranks - 1}")
        held = set(phy2log[f.donor * slots_per_rank : (f.donor + 1) * slots_per_rank].tolist())
        missing = [e for e in f.experts if e not in held]
        if missing:
            raise ValueError(f"{f}: donor {f.donor} holds no replica of experts {missing}; fetch what it holds")
