"""Fine-grid flip scan (TEMPO §3.2 (ii)): where the winning fixed policy flips, on a dense B ladder.

Glossary additions: nc cells, nb batches per cell, batch sizes are tokens per GPU (``tokens_per_gpu``), as in the
phase diagram.

The phase sweep (:mod:`.phase`) solves every policy, TEMPO included, on a power-of-two ladder, so a flip band is
a factor of two wide. Locating the flip only needs the fixed policies, so this scan solves METRO, token-LP and
EPLB-even (:data:`.phase.FIXED_POLICIES`) on any ladder (a geometric one with ratio 2^(1/8) by default), on the
same columns, batches and placements as the phase sweep (:func:`.phase.cell_setup`), and records the two
quantities the boundary formulas assume: token-LP's activations on its busiest GPU and METRO's busiest-GPU
tokens over the mean. Results are cached by `.runner.cached`. numpy + solvers only (no jax).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from solvers import DispatchProblem, gpu_loads, solve

from ..runner import CACHE_DIR, cached, run_jobs
from .phase import FIXED_POLICIES, LETTERS, Cell, PhaseConfig, cell_setup, cells_by_work

__all__ = ["FlipScan", "fine_ladder", "run_flip_scan"]


def fine_ladder(lo: int, hi: int, per_octave: int = 8) -> tuple[int, ...]:
    """Distinct integer batch sizes ``round(lo·2^(k/per_octave))`` from ``lo`` up to ``hi`` (tokens per GPU)."""
    if not 1 <= lo < hi or per_octave < 1:
        raise ValueError(f"need 1 ≤ lo < hi and per_octave ≥ 1, got {lo}, {hi}, {per_octave}")
    n = int(np.floor(per_octave * np.log2(hi / lo) + 1e-9)) + 1
    return tuple(sorted({int(round(lo * 2 ** (k / per_octave))) for k in range(n)}))


def _scan_cell(config: PhaseConfig, cell: Cell) -> np.ndarray:
    """``[nb, len(FIXED_POLICIES) + 2]``: each fixed policy's makespan (µs), then token-LP's busiest-GPU
    activations and METRO's busiest-GPU tokens / mean, per batch."""
    routing, placement = cell_setup(config, cell)
    cost = config.cost(cell.preset)
    out = np.empty((config.batches, len(FIXED_POLICIES) + 2))
    for step in range(config.batches):
        # Step 1: the phase sweep's batch of this step.
        problem = DispatchProblem(routing.batch(cell.tokens_per_gpu, cell.ep, step), placement, cost)
        # Step 2: the fixed policies and the loads the boundary formulas model.
        for j, policy in enumerate(FIXED_POLICIES):
            d = solve(problem, policy)
            out[step, j] = d.makespan
            acts, _, tokens = gpu_loads(d.x)
            if policy == "token_lp":
                out[step, -2] = acts.max()
            if policy == "metro":
                out[step, -1] = tokens.max() / tokens.mean()
    return out


@dataclass(frozen=True, eq=False)
class FlipScan:
    """Outcome of :func:`run_flip_scan`.

    Attributes:
      config: the grid (its ``tokens_per_gpu`` is the fine ladder).
      cells: nc cells in ``config.cells()`` order.
      data: ``[nc, nb, len(FIXED_POLICIES) + 2]`` (see :func:`_scan_cell`).
    """

    config: PhaseConfig
    cells: tuple[Cell, ...]
    data: np.ndarray

    def mean(self, policy: str) -> np.ndarray:
        """``[nc]`` batch-averaged makespan of a fixed policy."""
        return self.data[:, :, FIXED_POLICIES.index(policy)].mean(axis=1)

    def winner(self) -> np.ndarray:
        """``[nc]`` letter of the winning fixed policy (ties go to M, then L), as :meth:`.PhaseResult.winner`."""
        idx = np.argmin([self.mean(p) for p in FIXED_POLICIES], axis=0)
        return np.array([LETTERS[FIXED_POLICIES[i]] for i in idx])

    def lp_activations(self) -> np.ndarray:
        """``[nc]`` mean over batches of token-LP's activations on its busiest GPU."""
        return self.data[:, :, -2].mean(axis=1)

    def metro_imbalance(self) -> np.ndarray:
        """``[nc]`` mean over batches of METRO's busiest-GPU tokens / mean tokens."""
        return self.data[:, :, -1].mean(axis=1)

    def mask(self, **where) -> np.ndarray:
        """``[nc]`` bool: cells whose fields equal ``where``."""
        bad = set(where) - set(Cell._fields)
        if bad:
            raise ValueError(f"unknown cell fields {sorted(bad)}; valid: {Cell._fields}")
        return np.array([all(getattr(c, k) == v for k, v in where.items()) for c in self.cells], dtype=bool)

    def columns(self) -> list[tuple[str, int, float, float]]:
        """Distinct (preset, ep, replication, skew), in cell order."""
        return list(dict.fromkeys(c[:4] for c in self.cells))


def _compute_scan(config: PhaseConfig, *, workers: int, progress: bool) -> np.ndarray:
    cells = config.cells()
    order = cells_by_work(cells)
    out = run_jobs(
        _scan_cell, [(config, cells[i]) for i in order], workers=workers, desc="flip scan", progress=progress
    )
    data = np.empty((len(cells), config.batches, len(FIXED_POLICIES) + 2))
    for i, d in zip(order, out, strict=True):
        data[i] = d
    return data


def run_flip_scan(
    config: PhaseConfig, *, workers: int = 2, cache_dir: str | Path | None = CACHE_DIR, progress: bool = True
) -> FlipScan:
    """Solve the fixed policies on every cell of ``config`` (or load the cached result).

    ``workers`` (processes; not part of the cache key), ``cache_dir`` (None = no cache) and ``progress`` as in
    :func:`.phase.run_phase`.
    """
    data, _ = cached(_compute_scan, config, cache_dir=cache_dir, workers=workers, progress=progress)
    return FlipScan(config, tuple(config.cells()), data)
