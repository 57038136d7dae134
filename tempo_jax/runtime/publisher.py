"""The dispatch runtime's publisher: solver results in, versioned `Tables` out, with a staleness fallback.

A result is checked once (`tempo_jax.layer.tables.from_weights`: shape, finite, ≥ 0; one host → device copy)
before anything is published; ``latest`` is always a complete, trusted `Tables`. ``version`` changes exactly
when ``latest`` does. When the published data grow older than ``staleness_s`` the fallback policy's tables
(uniform or static) are published until a fresh solve arrives.

`prepare` runs outside the controller's lock (it copies to the device); every other method is called under it.
"""

from __future__ import annotations

import time

from solvers import Placement

from ..layer import tables as dispatch_tables

__all__ = ["FALLBACKS", "Publisher"]

FALLBACKS = ("uniform", "static")


def prepare_tables(
    weights, placement: Placement | tuple[Placement, ...]
) -> tuple[dispatch_tables.Tables | tuple | None, str | None]:
    """``(tables, None)`` over ``placement`` for good weights ``[Gs, E, R]`` (a list of one per layer with one
    placement per layer), ``(None, why)`` for bad ones."""
    try:
        if isinstance(placement, tuple):
            if not isinstance(weights, list | tuple) or len(weights) != len(placement):
                raise ValueError(f"expected {len(placement)} layers' weights, got {type(weights).__name__}")
            return tuple(dispatch_tables.from_weights(w, p) for w, p in zip(weights, placement, strict=True)), None
        return dispatch_tables.from_weights(weights, placement), None
    except ValueError as err:
        return None, str(err)


class Publisher:
    """``latest`` / ``version`` / the fallback, and the history of publications.

    Args:
      placement: the placement the tables are for.
      fallback: ``"uniform"`` or ``"static"``: what a stale runtime publishes.
      staleness_s: publish the fallback when the published data are older than this (None: never).
      history_size: publications kept in ``history``.
    """

    def __init__(
        self,
        placement: Placement | tuple[Placement, ...],
        *,
        fallback: str,
        staleness_s: float | None,
        history_size: int,
    ):
        self.placement = placement
        self.fallback = fallback
        self.staleness_s = staleness_s
        builder = dispatch_tables.uniform if fallback == "uniform" else dispatch_tables.static
        self.fallback_tables = self._each(builder)
        self.latest = self._each(dispatch_tables.uniform)
        self.version = 0
        self.data_time = time.monotonic()
        self.in_fallback = False
        self.fallbacks = 0
        self.published = 0
        self.pairs_published = 0.0
        self.history: list[dict] = []  # published solves, oldest first (the last `history_size`)
        self._history_size = history_size

    def set_placement(self, placement: Placement | tuple[Placement, ...], resolved: tuple | None = None) -> None:
        """Tables over a new placement from now on, published at once (a new version): ``resolved = (tables,
        closed_at)`` (the last window solved again over the new placement: its data keep their age), else the
        new placement's fallback tables (the staleness clock restarts). A re-solve is not a window's publication:
        ``published`` does not count it."""
        self.placement = placement
        builder = dispatch_tables.uniform if self.fallback == "uniform" else dispatch_tables.static
        self.fallback_tables = self._each(builder)
        self.version += 1
        if resolved is None:
            self.latest, self.data_time = self.fallback_tables, time.monotonic()
        else:
            (self.latest, self.data_time), self.in_fallback = resolved, False

    def _each(self, build):
        """``build(placement)``, or a tuple of one per layer."""
        if isinstance(self.placement, tuple):
            return tuple(build(p) for p in self.placement)
        return build(self.placement)

    def prepare(self, weights) -> tuple[dispatch_tables.Tables | None, str | None]:
        """``(tables, None)`` for good weights ``[Gs, E, R]`` (a list of one per layer with one placement per layer),
        ``(None, why)`` for bad ones. Outside the lock."""
        return prepare_tables(weights, self.placement)

    def publish(self, tables: dispatch_tables.Tables, *, closed_at: float, pairs: float, record: dict) -> bool:
        """Make ``tables`` the latest (data as of ``closed_at``); returns whether a fallback ended."""
        self.latest = tables
        self.version += 1
        self.data_time = closed_at
        self.published += 1
        self.pairs_published += pairs
        ended, self.in_fallback = self.in_fallback, False
        self.history.append({"version": self.version, **record})
        del self.history[: -self._history_size]
        return ended

    def age_s(self, now: float | None = None) -> float:
        """Seconds since the published data's window closed."""
        return (time.monotonic() if now is None else now) - self.data_time

    def check_staleness(self, now: float) -> float | None:
        """Publish the fallback if the data are too old; returns their age when it did, else None."""
        if self.staleness_s is None or self.in_fallback or now - self.data_time <= self.staleness_s:
            return None
        self.latest = self.fallback_tables
        self.version += 1
        self.in_fallback = True
        self.fallbacks += 1
        return now - self.data_time
