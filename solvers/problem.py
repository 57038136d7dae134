"""The per-batch dispatch problem (TEMPO §3.1, Problem 3) and its solutions.

A `DispatchProblem` is one batch's token counts, a placement and a cost model. A `Dispatch` is a solution
``x [E, D]``: tokens of logical expert e processed on rank (GPU) d, non-zero only where e has a replica on d.
numpy only."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from .bounds import problem_lower_bound
from .checks import check_array, check_instance, fmt_ids
from .cost import ACTIVE_EPS, CostModel, gpu_loads
from .placement import Placement

__all__ = ["MAX_TIME_US", "OPTIMAL_RTOL", "DispatchProblem", "Dispatch"]

#: What "optimal" means, for every solver (``tempo``'s ``info["optimal"]``, ``milp``'s status "optimal"): the
#: makespan is proven within this relative tolerance of the optimum over integer token shares (the dispatches a
#: layer executes). ``info["gap"]`` is measured against ``Dispatch.lower_bound``, a bound over real-valued shares,
#: so an optimal dispatch can still show a positive gap: at most one token's time on the fullest rank (β / makespan).
OPTIMAL_RTOL = 1e-4

#: Largest rank time (µs) a problem's cost model may reach: no batch takes 10^30 µs, so a model that does holds a
#: unit error, and float64 arithmetic on such times (sums over ranks, ratios) would overflow.
MAX_TIME_US = 1e30


@dataclass(frozen=True, eq=False)
class DispatchProblem:
    """One batch to dispatch.

    Attributes:
      tokens: ``[E]`` tokens per logical expert, or ``[Gs, E]`` per source group × expert (token–expert
        pairs). Non-negative, finite, integer-valued.
      placement: replicas of the E experts on D ranks.
      cost: the max-affine cost model scoring a dispatch.

    Raises:
      ValueError: tokens not ``[E]`` / ``[Gs, E]``, negative, NaN, infinite, fractional or ≥ 2^53; a different E
        than the placement's; a cost model whose times for this batch exceed `MAX_TIME_US`.
      ArgTypeError (a TypeError): a placement that is not a `Placement`, a cost that is not a `CostModel`,
        non-numeric tokens.
    """

    tokens: np.ndarray
    placement: Placement
    cost: CostModel

    def __post_init__(self) -> None:
        hint = "build one with Placement.from_phy2log, Placement.full or Placement.from_eplb"
        check_instance("placement", self.placement, Placement, where="DispatchProblem", hint=hint)
        t = check_array("tokens", self.tokens, ndims=(1, 2), nonnegative=True, integer=True).astype(np.float64)
        E = self.placement.num_experts
        if t.shape[-1] != E:
            raise ValueError(
                f"tokens has {t.shape[-1]} experts in its last axis but the placement has {E}; "
                "pass counts over the placement's logical experts"
            )
        hint = "e.g. solvers.PRESETS['dsv3_fp8_offline'] or CostModel(b=..., beta=...)"
        check_instance("cost", self.cost, CostModel, where="DispatchProblem", hint=hint)
        n = t if t.ndim == 1 else t.sum(axis=0)
        orphan = np.flatnonzero((n > 0) & (self.placement.logcnt == 0))
        if orphan.size:
            raise ValueError(f"live experts {fmt_ids(orphan)} have no replica in the placement")
        total = float(n.sum())
        with np.errstate(over="ignore", invalid="ignore"):  # the worst case: every token and expert on one rank
            worst = float(self.cost.gpu_times(float(E), total, float(E) + total / self.cost.tile))
        if not worst <= MAX_TIME_US:
            raise ValueError(
                f"the cost model prices this batch at up to {worst:.3g} µs on one rank (b={self.cost.b:.3g}, "
                f"β={self.cost.beta:.3g}, {total:,.0f} tokens), beyond {MAX_TIME_US:.0e} µs: check the model's units "
                "(times in µs, slopes in µs per expert / per token)"
            )
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
        """``[Gs, E]`` per-source counts, or None when only per-expert totals were given."""
        return self.tokens if self.tokens.ndim == 2 else None

    @property
    def num_experts(self) -> int:
        return self.placement.num_experts

    @property
    def num_gpus(self) -> int:
        return self.placement.num_gpus

    @property
    def mask(self) -> np.ndarray:
        """``[E, D]`` bool replica mask."""
        return self.placement.replica_mask

    @property
    def live(self) -> np.ndarray:
        """``[E]`` bool, experts with at least one token."""
        return self.n > 0


@dataclass(frozen=True, eq=False)
class Dispatch:
    """A solution of a `DispatchProblem`.

    Attributes:
      x: ``[E, D]`` float64 tokens of expert e processed on rank d.
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
        E, D = self.problem.num_experts, self.problem.num_gpus
        if x.shape != (E, D):
            raise ValueError(f"dispatch x must be [E, D] = [{E}, {D}], got {x.shape}")
        x.setflags(write=False)
        object.__setattr__(self, "x", x)

    @cached_property
    def _loads(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return gpu_loads(self.x, self.problem.cost.tile)

    @property
    def gpu_activations(self) -> np.ndarray:
        """``[D]`` activated (expert, rank) pairs: the paper's G_g."""
        return self._loads[0]

    @property
    def gpu_tiles(self) -> np.ndarray:
        """``[D]`` 128-token M-tiles (per the cost model's tile size): the paper's T_g."""
        return self._loads[1]

    @property
    def gpu_tokens(self) -> np.ndarray:
        """``[D]`` tokens processed per rank: the paper's N_g."""
        return self._loads[2]

    @property
    def gpu_times(self) -> np.ndarray:
        """``[D]`` modelled per-rank time (µs)."""
        acts, tiles, toks = self._loads
        return self.problem.cost.gpu_times(acts, toks, tiles)

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
            raise ValueError(f"{self.policy}: negative shares for experts {fmt_ids(neg[:, 0])}")
        off = np.argwhere((x > ACTIVE_EPS) & ~self.problem.mask)
        if off.size:
            raise ValueError(f"{self.policy}: tokens on GPUs without a replica for experts {fmt_ids(off[:, 0])}")
        bad = np.flatnonzero(np.abs(x.sum(axis=1) - n) > rtol * np.maximum(n, 1.0))
        if bad.size:
            raise ValueError(f"{self.policy}: token conservation violated for experts {fmt_ids(bad)}")
        return self

    def __repr__(self) -> str:
        return f"Dispatch(policy={self.policy!r}, makespan={self.makespan:.2f}, D={self.problem.num_gpus})"
