"""The per-batch dispatch problem (TEMPO §3.1, Problem 3) and its solutions.

A `DispatchProblem` is one batch's token counts, a placement and a cost model. A `Dispatch` is a solution
``x [E, G]``: tokens of logical expert e processed on GPU g, non-zero only where e has a replica on g.
numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from .cost import ACTIVE_EPS, CostModel, gpu_loads
from .placement import Placement

__all__ = ["DispatchProblem", "Dispatch"]


def _fmt(ids, limit: int = 10) -> str:
    ids = [int(i) for i in ids]
    return str(ids[:limit]) + (f" … (+{len(ids) - limit} more)" if len(ids) > limit else "")


@dataclass(frozen=True, eq=False)
class DispatchProblem:
    """One batch to dispatch.

    Attributes:
      tokens: ``[E]`` tokens per logical expert, or ``[S, E]`` per source rank × expert (token–expert
        pairs). Non-negative, finite, integer-valued.
      placement: replicas of the E experts on G GPUs.
      cost: the max-affine cost model scoring a dispatch.
    """

    tokens: np.ndarray
    placement: Placement
    cost: CostModel

    def __post_init__(self) -> None:
        t = np.asarray(self.tokens)
        if t.dtype.kind not in "iuf" or t.dtype == bool:
            raise ValueError(f"tokens must be numeric counts, got dtype {t.dtype}")
        t = t.astype(np.float64)
        if t.ndim not in (1, 2):
            raise ValueError(f"tokens must be [E] or [S, E], got shape {t.shape}")
        E = self.placement.num_experts
        if t.shape[-1] != E:
            raise ValueError(
                f"tokens has {t.shape[-1]} experts in its last axis but the placement has {E}; "
                "pass counts over the placement's logical experts"
            )
        if not np.all(np.isfinite(t)):
            raise ValueError("tokens contains NaN or inf")
        if np.any(t < 0):
            raise ValueError(f"tokens must be non-negative; negative counts at {_fmt(np.argwhere(t < 0)[:, -1])}")
        if np.any(t != np.round(t)):
            raise ValueError("tokens must be integer-valued token counts (got fractional values)")
        if not isinstance(self.cost, CostModel):
            raise ValueError(f"cost must be a solvers.CostModel, got {type(self.cost).__name__}")
        n = t if t.ndim == 1 else t.sum(axis=0)
        orphan = np.flatnonzero((n > 0) & (self.placement.logcnt == 0))
        if orphan.size:
            raise ValueError(f"live experts {_fmt(orphan)} have no replica in the placement")
        t.setflags(write=False)
        object.__setattr__(self, "tokens", t)

    @cached_property
    def n(self) -> np.ndarray:
        """``[E]`` tokens per logical expert (column sums of per-source counts)."""
        n = self.tokens if self.tokens.ndim == 1 else self.tokens.sum(axis=0)
        n = np.ascontiguousarray(n)
        n.setflags(write=False)
        return n

    @property
    def per_source(self) -> np.ndarray | None:
        """``[S, E]`` per-source counts, or None when only per-expert totals were given."""
        return self.tokens if self.tokens.ndim == 2 else None

    @property
    def num_experts(self) -> int:
        return self.placement.num_experts

    @property
    def num_gpus(self) -> int:
        return self.placement.num_gpus

    @property
    def mask(self) -> np.ndarray:
        """``[E, G]`` bool replica mask."""
        return self.placement.replica_mask

    @property
    def live(self) -> np.ndarray:
        """``[E]`` bool, experts with at least one token."""
        return self.n > 0


@dataclass(frozen=True, eq=False)
class Dispatch:
    """A solution of a `DispatchProblem`.

    Attributes:
      x: ``[E, G]`` float64 tokens of expert e processed on GPU g.
      problem: the problem it solves.
      policy: name of the policy that produced it.
      info: solver details (e.g. ``status``, ``solve_time_s``, ``bound`` for the MILP).
    """

    x: np.ndarray
    problem: DispatchProblem
    policy: str = ""
    info: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        x = np.asarray(self.x, dtype=np.float64)
        E, G = self.problem.num_experts, self.problem.num_gpus
        if x.shape != (E, G):
            raise ValueError(f"dispatch x must be [E, G] = [{E}, {G}], got {x.shape}")
        x.setflags(write=False)
        object.__setattr__(self, "x", x)

    @cached_property
    def _loads(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return gpu_loads(self.x, self.problem.cost.tile)

    @property
    def gpu_activations(self) -> np.ndarray:
        """``[G]`` activated (expert, GPU) pairs."""
        return self._loads[0]

    @property
    def gpu_tiles(self) -> np.ndarray:
        """``[G]`` 128-token M-tiles (per the cost model's tile size)."""
        return self._loads[1]

    @property
    def gpu_tokens(self) -> np.ndarray:
        """``[G]`` tokens processed per GPU."""
        return self._loads[2]

    @property
    def gpu_times(self) -> np.ndarray:
        """``[G]`` modelled per-GPU time (µs)."""
        G, T, N = self._loads
        return self.problem.cost.gpu_times(G, N, T)

    @property
    def makespan(self) -> float:
        """Modelled makespan max_g t_g (µs)."""
        return float(self.gpu_times.max(initial=0.0))

    @cached_property
    def lower_bound(self) -> float:
        """A proven lower bound on the optimal makespan of the problem.

        The best of: the full-replication formula (valid always), the restricted-replication bound
        ``a + b·SM`` with SM the optimal semi-matching load (Lemma 2) and ``c + β·LP`` with LP the token-LP
        optimum (Lemma 1), and a solver-proven bound in ``info["bound"]`` when the policy reports one.
        """
        from .bounds import problem_lower_bound

        lb = problem_lower_bound(self.problem)
        if "bound" in self.info and self.info["bound"] is not None:
            lb = max(lb, float(self.info["bound"]))
        return lb

    def validate(self, rtol: float = 1e-6) -> Dispatch:
        """Check conservation (within ``rtol`` relative), support on replicas and non-negativity.

        Returns self; raises ValueError naming the offending experts.
        """
        x, n = self.x, self.problem.n
        if not np.all(np.isfinite(x)):
            raise ValueError(f"{self.policy}: dispatch contains NaN or inf")
        neg = np.argwhere(x < -rtol)
        if neg.size:
            raise ValueError(f"{self.policy}: negative shares for experts {_fmt(neg[:, 0])}")
        off = np.argwhere((x > ACTIVE_EPS) & ~self.problem.mask)
        if off.size:
            raise ValueError(f"{self.policy}: tokens on GPUs without a replica for experts {_fmt(off[:, 0])}")
        bad = np.flatnonzero(np.abs(x.sum(axis=1) - n) > rtol * np.maximum(n, 1.0))
        if bad.size:
            raise ValueError(f"{self.policy}: token conservation violated for experts {_fmt(bad)}")
        return self

    def __repr__(self) -> str:
        return f"Dispatch(policy={self.policy!r}, makespan={self.makespan:.2f}, G={self.problem.num_gpus})"
