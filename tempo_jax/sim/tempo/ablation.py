"""Component ablation of tempo_fast over the phase grid (TEMPO §4.2, Table 2).

Glossary additions: nc cells, nb batches per cell, V variants (`.variants.COMPONENTS`), s Zipf skew, batch sizes in
tokens per GPU (the phase diagram's convention).

On the same cells and batches as the phase sweep (:mod:`.phase`: synthetic Zipf(s) routing, EPLB placement
from the long-run load, one of the calibrated presets), each batch is solved by full TEMPO and by each variant
with one component switched off (partial moves, augmenting chains, ensemble, and our target repair), all under
the cell's model. The degradation of a variant in a cell is ``mean(variant)/mean(baseline) − 1`` over the
cell's batches (positive = the component helps); the baseline is full TEMPO, except for "no ensemble", which is
measured against "no repair" (the repair runs inside the ensemble step, `.variants.COMPONENT_BASELINES`). The
fixed policies are solved too, so each cell carries its winner letter (its regime). Table 2 pools the EP8 phase
grid and the EP8–64 scale grid. Results are cached by
`.runner.cached`. numpy + solvers only (no jax).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from solvers import DispatchProblem, solve

from ..runner import CACHE_DIR, cached, run_jobs, stats
from .phase import FIXED_POLICIES, LETTERS, Cell, PhaseConfig, cell_setup, cells_by_work
from .variants import COMPONENT_BASELINES, COMPONENTS, TEMPO_VARIANTS

__all__ = ["AblationResult", "component_ablation", "summarize"]


def _solve_cell(config: PhaseConfig, cell: Cell, chain_depth: int | None) -> np.ndarray:
    """``[nb, 1 + V + nf]`` makespans (µs): full TEMPO, each :data:`COMPONENTS` variant, then each fixed policy
    (:data:`.phase.FIXED_POLICIES`: the cell's regime letter)."""
    routing, placement = cell_setup(config, cell)
    base = {"tau": config.tau} | ({} if chain_depth is None else {"chain_depth": chain_depth})
    out = np.empty((config.batches, 1 + len(COMPONENTS) + len(FIXED_POLICIES)))
    for step in range(config.batches):
        # Step 1: the phase sweep's batch of this step (same seed, same counts).
        problem = DispatchProblem(
            routing.batch(cell.tokens_per_gpu, cell.ep, step), placement, config.cost(cell.preset)
        )
        # Step 2: full TEMPO and every one-component-off variant.
        for j, opts in enumerate([{}, *(TEMPO_VARIANTS[name][1] for name in COMPONENTS)]):
            out[step, j] = solve(problem, "tempo", **base, **opts).makespan
        # Step 3: the fixed policies, for the cell's winner letter.
        for j, policy in enumerate(FIXED_POLICIES):
            out[step, 1 + len(COMPONENTS) + j] = solve(problem, policy).makespan
    return out


@dataclass(frozen=True, eq=False)
class AblationResult:
    """Outcome of :func:`component_ablation`.

    Attributes:
      config: the phase grid.
      cells: nc cells (``config.cells()`` order).
      makespan: ``[nc, nb, 1 + V + nf]`` µs; column 0 = full TEMPO, then :data:`COMPONENTS` in order, then the
        nf fixed policies (:data:`.phase.FIXED_POLICIES`).
    """

    config: PhaseConfig
    cells: tuple[Cell, ...]
    makespan: np.ndarray

    def degradation(self) -> np.ndarray:
        """``[nc, V]`` ``mean(variant)/mean(baseline) − 1`` per cell (batch means); the baseline is full TEMPO or
        the variant named in :data:`.variants.COMPONENT_BASELINES`."""
        m = self.makespan.mean(axis=1)
        cols = ["full", *COMPONENTS]
        base = [cols.index(COMPONENT_BASELINES.get(name, "full")) for name in COMPONENTS]
        return m[:, 1 : 1 + len(COMPONENTS)] / m[:, base] - 1.0

    def winner(self) -> np.ndarray:
        """``[nc]`` letter of the cell's winning fixed policy (M/L/E, as :meth:`.phase.PhaseResult.winner`)."""
        m = self.makespan.mean(axis=1)[:, 1 + len(COMPONENTS) :]
        return np.array([LETTERS[FIXED_POLICIES[i]] for i in np.argmin(m, axis=1)])

    def rows(self) -> list[dict]:
        """Tidy rows: cell fields, the winner letter and each variant's degradation."""
        deg, win = self.degradation(), self.winner()
        names = list(COMPONENTS)
        return [
            {**c._asdict(), "winner": str(win[i]), **dict(zip(names, map(float, deg[i]), strict=True))}
            for i, c in enumerate(self.cells)
        ]


def summarize(results: list[AblationResult]) -> list[dict]:
    """Per variant, pooled over every cell of ``results``: mean, p95, max degradation and the max's cell (with
    the cell's winning fixed policy: M = memory regime, L/E = compute regime)."""
    rows = [r for res in results for r in res.rows()]
    out = []
    for name in COMPONENTS:
        vals = [r[name] for r in rows]
        worst = rows[int(np.argmax(vals))]
        where = f"{worst['preset']} EP{worst['ep']} {worst['replication']:g}× s={worst['skew']:g}"
        where += f" B={worst['tokens_per_gpu']} (winner {worst['winner']})"
        out.append({"variant": name, **stats(vals), "where": where, "winner": worst["winner"], "cell": worst})
    return out


def _compute_ablation(config: PhaseConfig, chain_depth: int | None, *, workers: int, progress: bool) -> np.ndarray:
    cells = config.cells()
    order = cells_by_work(cells)
    jobs = [(config, cells[i], chain_depth) for i in order]
    out = run_jobs(_solve_cell, jobs, workers=workers, desc="ablation cells", progress=progress)
    makespan = np.empty((len(cells), config.batches, 1 + len(COMPONENTS) + len(FIXED_POLICIES)))
    for i, m in zip(order, out, strict=True):
        makespan[i] = m
    return makespan


def component_ablation(
    config: PhaseConfig,
    *,
    chain_depth: int | None = None,
    workers: int = 2,
    cache_dir: str | Path | None = CACHE_DIR,
    progress: bool = True,
) -> AblationResult:
    """Solve every cell of ``config`` with full TEMPO and each `COMPONENTS` variant (or load the cache).

    Args:
      config: the phase grid (its ``comm_slope`` gives the comm-aware model).
      chain_depth: augmenting-chain depth of every TEMPO solve (None = the project's full depth; 2 = paper).
      workers: worker processes (not part of the cache key).
      cache_dir: the cache folder (`.runner.cached`); None disables caching.
      progress: tqdm bar over cells.
    """
    makespan, _ = cached(
        _compute_ablation, config, chain_depth, cache_dir=cache_dir, workers=workers, progress=progress
    )
    return AblationResult(config, tuple(config.cells()), makespan)
