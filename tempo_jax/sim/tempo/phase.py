"""Phase-diagram sweep (TEMPO §3.2, §3.3; Figs. 6 and 12): which fixed dispatch policy wins where, and TEMPO's gain.

Glossary additions: nc cells, nb batches per cell, s Zipf skew, batch sizes are tokens per GPU (``tokens_per_gpu``).

One *column* is (preset, EP, replication, skew): synthetic Zipf(s) routing over the preset's model shape
(:data:`MODEL_SHAPES`) with Dirichlet(κ) batch fluctuation, and one EPLB placement built from the column's
long-run average load. One *cell* is a column at one batch size: ``batches`` batches ``[D, E]`` are drawn
(step n of ``SyntheticRouting(E, K, s, κ, seed)``, the same steps in every cell) and dispatched by every policy;
the cell keeps each policy's model makespan per batch. The winning fixed policy of a cell is the argmin of
the batch-averaged makespan over METRO, token-LP and EPLB-even (ties go to that order); TEMPO's gain is
``1 − mean(tempo)/mean(best fixed)``.

Long-run load: the share of token–expert pairs each expert receives (`tempo_jax.workloads.pair_share`: top-K
sampling without replacement caps a hot expert near 1/K of the pairs, so the first-draw popularity would
over-replicate it) of the mean of ``placement_draws`` Dirichlet(κ·p) batch popularities (``placement_draws =
0`` uses p itself). At s = 0, p is exactly uniform and EPLB's deterministic tie-breaking then stacks both
replicas of each replicated expert on one GPU, which makes the extra slots useless; a finite long-run average
breaks those ties the way recorded traffic does.

Results are cached by `.runner.cached` (``results/cache``) so notebooks re-plot without solving.
numpy + solvers only (no jax).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

import numpy as np

from solvers import PRESETS, CostModel, DispatchProblem, Placement, slots_for, solve
from solvers.checks import plain_scalars
from solvers.limits import semi_matching
from tempo_jax.workloads import SyntheticRouting, check_sampled_pairs, pair_share

from ..runner import CACHE_DIR, cached, run_jobs

__all__ = [
    "FIXED_POLICIES",
    "LETTERS",
    "MODEL_SHAPES",
    "PHASE_POLICIES",
    "REFERENCES",
    "Cell",
    "PhaseConfig",
    "PhaseResult",
    "column_setup",
    "matching_dispatch",
    "run_phase",
]

#: Model shape (E experts, top-k K) of each cost preset swept by the phase diagram.
MODEL_SHAPES: dict[str, tuple[int, int]] = {
    "dsv3_fp8_offline": (256, 8),
    "qwen3_30b_offline": (128, 8),
    "dsv2_lite_offline": (64, 6),
}
#: Policies solved in every cell, in the order of ``PhaseResult.makespan``'s last axis.
PHASE_POLICIES: tuple[str, ...] = ("static", "uniform", "token_lp", "metro", "tempo")
#: Reference dispatches scored after the policies (last axis of ``PhaseResult.makespan``): ``matching`` keeps
#: experts whole on an optimal semi-matching (`solvers.limits.semi_matching`) — the activation-balancing
#: optimum METRO aims for (Lemma 2), which METRO's greedy does not always reach on EPLB placements.
REFERENCES: tuple[str, ...] = ("matching",)
COLUMNS: tuple[str, ...] = (*PHASE_POLICIES, *REFERENCES)
#: Fixed policies competing for the cell letter (tie order = this order).
FIXED_POLICIES: tuple[str, ...] = ("metro", "token_lp", "uniform")
LETTERS: dict[str, str] = {"metro": "M", "token_lp": "L", "uniform": "E"}


class Cell(NamedTuple):
    """One grid point: a column (preset, ep, replication, skew) at one batch size (tokens per GPU)."""

    preset: str
    ep: int
    replication: float
    skew: float
    tokens_per_gpu: int


@dataclass(frozen=True, kw_only=True)
class PhaseConfig:
    """Grid and knobs of a phase sweep (defaults: the paper's full grid, §3.2–3.3).

    Attributes:
      presets: cost presets (keys of :data:`MODEL_SHAPES`).
      eps: EP sizes D.
      replications: physical slots / experts; slots = `solvers.slots_for` (D·⌈replication·E/D⌉; the actual
        ratio can be higher).
      skews: Zipf exponents s.
      tokens_per_gpu: batch sizes in tokens per GPU, ascending.
      kappa: Dirichlet concentration κ of batch-to-batch fluctuation.
      batches: batches per cell (makespans are averaged over them).
      seed: routing seed (expert permutation of the popularity and the batch draws).
      placement_draws: Dirichlet draws averaged into the long-run load fed to EPLB (0 = the popularity).
      comm_slope: γ of the traffic piece ``c2 + γ·N`` (Eq. 4), µs/token; None = compute-only model.
      comm_floor: c2 of the traffic piece (used only with ``comm_slope``).
      tau: TEMPO's ensemble switching tolerance τ.
    """

    presets: tuple[str, ...] = tuple(MODEL_SHAPES)
    eps: tuple[int, ...] = (8, 16, 32, 64)
    replications: tuple[float, ...] = (1.25, 1.5)
    skews: tuple[float, ...] = (0.0, 0.3, 0.6, 0.9, 1.2, 1.5)
    tokens_per_gpu: tuple[int, ...] = (16, 32, 64, 128, 256, 512, 1024, 2048)
    kappa: float = 2000.0
    batches: int = 8
    seed: int = 0
    placement_draws: int = 256
    comm_slope: float | None = None
    comm_floor: float = 0.0
    tau: float = 0.01

    def __post_init__(self) -> None:
        plain_scalars(self)
        for name in ("presets", "eps", "replications", "skews", "tokens_per_gpu"):
            val = tuple(getattr(self, name))
            if not val:
                raise ValueError(f"PhaseConfig.{name} must not be empty")
            object.__setattr__(self, name, val)
        unknown = [p for p in self.presets if p not in MODEL_SHAPES]
        if unknown:
            raise ValueError(f"unknown presets {unknown}; valid: {sorted(MODEL_SHAPES)}")
        if list(self.tokens_per_gpu) != sorted(set(self.tokens_per_gpu)) or min(self.tokens_per_gpu) < 1:
            raise ValueError(f"tokens_per_gpu must be ascending, distinct and ≥ 1, got {self.tokens_per_gpu}")
        if min(self.eps) < 1 or min(self.replications) < 1 or min(self.skews) < 0:
            raise ValueError("eps ≥ 1, replications ≥ 1 and skews ≥ 0 are required")
        if self.batches < 1 or self.placement_draws < 0 or not 0 <= self.tau < 1:
            raise ValueError("batches ≥ 1, placement_draws ≥ 0 and 0 ≤ tau < 1 are required")
        if self.comm_slope is not None and self.comm_slope < 0:
            raise ValueError(f"comm_slope must be ≥ 0 or None, got {self.comm_slope}")
        if self.comm_slope is None and self.comm_floor:
            raise ValueError(
                f"PhaseConfig.comm_floor={self.comm_floor} is c2 of the traffic piece c2 + γ·N; without "
                "comm_slope (γ) there is no traffic piece: set comm_slope too or leave comm_floor out"
            )
        top_k = max(MODEL_SHAPES[p][1] for p in self.presets)  # the largest batch, checked before any work
        check_sampled_pairs(
            max(self.eps) * max(self.tokens_per_gpu),
            top_k,
            where="PhaseConfig",
            fix="lower tokens_per_gpu (--tokens-per-gpu) or eps (--ep)",
        )

    def cells(self) -> list[Cell]:
        """Every cell, column-major (preset, ep, replication, skew, tokens_per_gpu)."""
        return [
            Cell(pr, int(d), float(r), float(s), int(b))
            for pr in self.presets
            for d in self.eps
            for r in self.replications
            for s in self.skews
            for b in self.tokens_per_gpu
        ]

    def cost(self, preset: str) -> CostModel:
        """The preset's cost model, with the traffic piece ``(c2, γ)`` when ``comm_slope`` is set."""
        base = PRESETS[preset]
        if self.comm_slope is None:
            return base
        return dataclasses.replace(base, c2=float(self.comm_floor), gamma=float(self.comm_slope))


@lru_cache(maxsize=64)
def column_setup(
    preset: str, ep: int, replication: float, skew: float, *, kappa: float, seed: int, placement_draws: int
) -> tuple[SyntheticRouting, Placement]:
    """Routing and EPLB placement of one column (cached per process).

    Returns:
      ``(routing, placement)``: ``SyntheticRouting(E, K, skew, kappa, seed)`` and the EPLB placement of
      `solvers.slots_for` slots on ``ep`` GPUs from the long-run average load (see the module docstring).
    """
    E, K = MODEL_SHAPES[preset]
    routing = SyntheticRouting(E, K, skew, kappa=kappa, seed=seed)
    # Step 1: long-run average popularity (mean batch popularity over independent draws).
    popularity = routing.popularity
    if placement_draws and math.isfinite(kappa):
        rng = np.random.default_rng([seed, 7919, int(round(skew * 1e6))])
        popularity = rng.dirichlet(kappa * routing.popularity, size=placement_draws).mean(axis=0)
    # Step 2: the load a recording shows: each expert's share of token–expert pairs under top-K sampling
    # without replacement (a hot expert's share is capped near 1/K, whatever its first-draw popularity).
    load = pair_share(popularity, K)
    # Step 3: EPLB placement of the slot budget.
    placement = Placement.from_eplb(load, slots_for(E, ep, replication), ep)
    return routing, placement


def cell_setup(config: PhaseConfig, cell: Cell) -> tuple[SyntheticRouting, Placement]:
    """Routing and placement of the column a cell belongs to (`column_setup` with the config's knobs)."""
    return column_setup(
        cell.preset,
        cell.ep,
        cell.replication,
        cell.skew,
        kappa=config.kappa,
        seed=config.seed,
        placement_draws=config.placement_draws,
    )


def matching_dispatch(problem: DispatchProblem) -> np.ndarray:
    """``x [E, D]``: every live expert whole on its rank of an optimal semi-matching (fewest busiest-rank
    activations, Lemma 2; tokens ignored) — the activation-balancing optimum, a reference, not a policy."""
    assign = semi_matching(problem.placement.replica_mask, problem.n > 0)
    x = np.zeros(problem.placement.replica_mask.shape)
    live = np.flatnonzero(assign >= 0)
    x[live, assign[live]] = problem.n[live]
    return x


def _solve_cell(config: PhaseConfig, cell: Cell) -> tuple[np.ndarray, np.ndarray]:
    """Makespans ``[nb, len(COLUMNS)]`` (µs) and mean solve times (s) per policy ``[len(PHASE_POLICIES)]``."""
    routing, placement = cell_setup(config, cell)
    cost = config.cost(cell.preset)
    ms = np.empty((config.batches, len(COLUMNS)))
    st = np.zeros(len(PHASE_POLICIES))
    for step in range(config.batches):
        # Step 1: one batch [D, E] (step-seeded: identical across cells, processes and runs).
        counts = routing.batch(cell.tokens_per_gpu, cell.ep, step)
        problem = DispatchProblem(counts, placement, cost)
        # Step 2: every policy, scored under the same model.
        for j, policy in enumerate(PHASE_POLICIES):
            opts = {"tau": config.tau} if policy == "tempo" else {}
            d = solve(problem, policy, **opts)
            ms[step, j] = d.makespan
            st[j] += d.info["solve_time_s"] / config.batches
        # Step 3: the references.
        ms[step, COLUMNS.index("matching")] = cost.makespan(matching_dispatch(problem))
    return ms, st


@dataclass(frozen=True, eq=False)
class PhaseResult:
    """Outcome of :func:`run_phase`.

    Attributes:
      config: the sweep's configuration.
      cells: nc cells in ``config.cells()`` order.
      makespan: ``[nc, nb, len(COLUMNS)]`` model makespan (µs) per cell, batch and policy (in
        :data:`PHASE_POLICIES` order, then the :data:`REFERENCES`).
      solve_time: ``[nc, len(PHASE_POLICIES)]`` mean solve time per batch (s).
      from_cache: loaded from the cache instead of solved.
    """

    config: PhaseConfig
    cells: tuple[Cell, ...]
    makespan: np.ndarray
    solve_time: np.ndarray
    from_cache: bool = False

    # ------------------------------------------------------------------ per-cell views, all [nc]
    def mean(self, policy: str) -> np.ndarray:
        """``[nc]`` batch-averaged makespan of ``policy`` (a :data:`PHASE_POLICIES` or :data:`REFERENCES` name)."""
        if policy not in COLUMNS:
            raise ValueError(f"unknown policy {policy!r}; valid: {COLUMNS}")
        return self.makespan[:, :, COLUMNS.index(policy)].mean(axis=1)

    def best_fixed(self) -> np.ndarray:
        """``[nc]`` lowest batch-averaged makespan among :data:`FIXED_POLICIES`."""
        return np.min([self.mean(p) for p in FIXED_POLICIES], axis=0)

    def winner(self) -> np.ndarray:
        """``[nc]`` letter (M/L/E) of the winning fixed policy (ties go to M, then L)."""
        idx = np.argmin([self.mean(p) for p in FIXED_POLICIES], axis=0)
        return np.array([LETTERS[FIXED_POLICIES[i]] for i in idx])

    def gain(self) -> np.ndarray:
        """``[nc]`` TEMPO's gain over the best fixed policy, ``1 − mean(tempo)/best_fixed`` (positive = better)."""
        return 1.0 - self.mean("tempo") / self.best_fixed()

    def gain_vs_matching(self) -> np.ndarray:
        """``[nc]`` TEMPO's gain over the best of the fixed policies and the activation-balancing optimum
        (``matching``): what is left once activations are balanced exactly."""
        return 1.0 - self.mean("tempo") / np.minimum(self.best_fixed(), self.mean("matching"))

    def worst_ratio(self, against: tuple[str, ...] = ("static", *FIXED_POLICIES)) -> np.ndarray:
        """``[nc]`` max over batches of ``tempo / min(against)`` per batch (> 1/(1−τ) = lost by more than τ)."""
        cols = [COLUMNS.index(p) for p in against]
        per_batch = self.makespan[:, :, COLUMNS.index("tempo")] / self.makespan[:, :, cols].min(axis=2)
        return per_batch.max(axis=1)

    # ------------------------------------------------------------------ selection and grids
    def mask(self, **where) -> np.ndarray:
        """``[nc]`` bool: cells whose fields equal ``where`` (e.g. ``preset=..., ep=8, replication=1.25``)."""
        bad = set(where) - set(Cell._fields)
        if bad:
            raise ValueError(f"unknown cell fields {sorted(bad)}; valid: {Cell._fields}")
        return np.array([all(getattr(c, k) == v for k, v in where.items()) for c in self.cells], dtype=bool)

    def grid(self, values: np.ndarray, *, preset: str, ep: int, replication: float) -> np.ndarray:
        """``[len(skews), len(batch_sizes)]`` view of per-cell ``values [nc]`` for one panel."""
        out = np.asarray(values)[self.mask(preset=preset, ep=ep, replication=replication)]
        return out.reshape(len(self.config.skews), len(self.config.tokens_per_gpu))

    def columns(self) -> list[tuple[str, int, float, float]]:
        """Distinct (preset, ep, replication, skew), in cell order."""
        return list(dict.fromkeys(c[:4] for c in self.cells))

    def rows(self) -> list[dict]:
        """Tidy rows: cell fields, mean makespan per policy and reference, winner, gain, worst per-batch ratio."""
        means = {p: self.mean(p) for p in COLUMNS}
        win, gain, worst = self.winner(), self.gain(), self.worst_ratio()
        return [
            {
                **c._asdict(),
                **{p: float(means[p][i]) for p in COLUMNS},
                "winner": str(win[i]),
                "gain": float(gain[i]),
                "worst_ratio": float(worst[i]),
            }
            for i, c in enumerate(self.cells)
        ]


def cells_by_work(cells) -> list[int]:
    """Cell indices by descending work (tokens per GPU × ranks): the pool's long jobs start first."""
    return sorted(range(len(cells)), key=lambda i: -cells[i].tokens_per_gpu * cells[i].ep)


def _compute_phase(config: PhaseConfig, *, workers: int, progress: bool, backend: str | None = None) -> PhaseResult:
    cells = config.cells()
    order = cells_by_work(cells)
    out = run_jobs(
        _solve_cell,
        [(config, cells[i]) for i in order],
        workers=workers,
        desc="phase cells",
        progress=progress,
        backend=backend,
    )
    makespan = np.empty((len(cells), config.batches, len(COLUMNS)))
    solve_time = np.empty((len(cells), len(PHASE_POLICIES)))
    for i, (ms, st) in zip(order, out, strict=True):
        makespan[i], solve_time[i] = ms, st
    return PhaseResult(config, tuple(cells), makespan, solve_time)


def run_phase(
    config: PhaseConfig,
    *,
    workers: int = 2,
    cache_dir: str | Path | None = CACHE_DIR,
    progress: bool = True,
    backend: str | None = None,
) -> PhaseResult:
    """Solve every cell of ``config`` (or load the cached result).

    Args:
      config: the sweep.
      workers: worker processes (1 = in-process); the numbers do not depend on it (every batch is seeded by its
        step), so it is not part of the cache key.
      cache_dir: the cache folder (`.runner.cached`); None disables caching.
      progress: show a tqdm bar over cells.
      backend: `run_jobs` backend, ``"loky"`` or ``"dask"`` (default `runner.default_backend`); not keyed.

    Returns:
      A :class:`PhaseResult` (``from_cache`` tells whether anything was solved).
    """
    result, hit = cached(
        _compute_phase, config, cache_dir=cache_dir, workers=workers, progress=progress, backend=backend
    )
    return dataclasses.replace(result, from_cache=hit)
