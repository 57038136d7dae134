"""The dispatch runtime's window accumulator: per-step counts (or counter snapshots) in, closed windows out.

Each step adds its per-source counts ``[D, E]``; after ``window`` steps the accumulated counts close as one
`Window` for the solver. Cumulative counter snapshots are differenced first (`CounterWindows`: wrap-safe
modulo 2^32, a baseline first, restarted rows). The accumulator also keeps the pair accounting's inflow.

Not thread-safe by itself: the `DispatchController` calls it under its lock.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .counters import CounterWindows

__all__ = ["Window", "WindowAccumulator"]


@dataclass(frozen=True)
class Window:
    """One closed window: ``counts [D, E]`` pairs, their total, the steps it spans and when it closed
    (``time.monotonic``)."""

    counts: np.ndarray
    pairs: float
    steps: int
    closed_at: float


class WindowAccumulator:
    """Counts of the open window, the counter differencing, and the pairs seen so far.

    Args:
      shape: ``(D, E)``, or ``(L, D, E)`` with a window per layer.
      window: steps per window.
      max_window_pairs: counter differences at or above this mean a restart (see `CounterWindows`).
    """

    def __init__(self, shape: tuple[int, ...], window: int, max_window_pairs: int):
        self.window = window
        self.counter = CounterWindows(max_window_pairs)
        self._acc = np.zeros(shape)
        self._steps_open = 0
        self.steps = 0  # every accepted step
        self.pairs_in = 0.0  # every accepted pair
        self.notes = {"baselines": 0, "wrapped": 0, "restarts": 0}

    @property
    def shape(self) -> tuple[int, ...]:
        return self._acc.shape

    @property
    def pending_pairs(self) -> float:
        """Pairs of the open window (accepted, not yet handed to the solver)."""
        return float(self._acc.sum())

    def add(self, counts: np.ndarray) -> Window | None:
        """Add one step's checked counts ``[D, E]``; returns the window when this step closes it."""
        self._acc += counts
        self._steps_open += 1
        self.steps += 1
        self.pairs_in += float(counts.sum())
        if self._steps_open < self.window:
            return None
        window = Window(self._acc, float(self._acc.sum()), self._steps_open, time.monotonic())
        self._acc, self._steps_open = np.zeros_like(self._acc), 0
        return window

    def difference(self, now: np.ndarray) -> tuple[np.ndarray | None, list[int]]:
        """Counter snapshot → ``(window counts [D, E] | None for a baseline, restarted source rows)``."""
        window, notes = self.counter.diff(now)
        self.notes["baselines"] += int(notes["baseline"])
        self.notes["wrapped"] += notes["wrapped"]
        self.notes["restarts"] += int(bool(notes["restarted_rows"]))
        return window, notes["restarted_rows"]
