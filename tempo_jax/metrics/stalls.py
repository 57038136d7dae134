"""Stalls that raise their hand: a gauge per kind, and a warning that names what stalled and since when.

`StallWatch.update` is fed once per step with plain numbers (the controller's `metrics()`, the step's re-placements,
the pairs the layers counted) and holds four conditions:

- ``publication``: ``publication_windows`` or more windows with tokens closed since the last published tables
  (since: the last publication, or the start);
- ``restart_loop``: ``restarts`` or more solver restarts within the last ``restart_window_s`` seconds (since: the
  first of them);
- ``replacement_churn``: the last ``churn_moves`` applied re-placements each moved slots for a modelled gain below
  ``min_gain`` (since: the first of them);
- ``counters``: ``frozen_steps`` steps in a row counted no pairs, or, while the runtime is fed, left its accepted
  pairs unchanged (since: the first such step).

A warning goes to the ``tempo_jax.runtime`` logger when a stall begins (and an info line when it ends), so a log
shows it without a dashboard.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque

from solvers.checks import check_int, check_real

from .specs import STALLS

__all__ = ["StallLimits", "StallWatch"]

log = logging.getLogger("tempo_jax.runtime")


@dataclasses.dataclass(frozen=True, kw_only=True)
class StallLimits:
    """When each stall of `StallWatch` begins (see the module's table)."""

    publication_windows: int = 10
    restarts: int = 3
    restart_window_s: float = 60.0
    churn_moves: int = 3
    min_gain: float = 0.01
    frozen_steps: int = 10

    def __post_init__(self):
        w = "StallLimits"
        for name in ("publication_windows", "restarts", "churn_moves", "frozen_steps"):
            check_int(name, getattr(self, name), where=w)
        check_real("restart_window_s", self.restart_window_s, minimum=0.0, strict=True, where=w)
        check_real("min_gain", self.min_gain, minimum=0.0, where=w)


class StallWatch:
    """Track the four stalls over a run; `update` once per step, `active` / `gauges` at any time."""

    def __init__(self, limits: StallLimits = StallLimits(), clock=time.monotonic):
        self.limits = limits
        self._clock = clock
        self._active: dict[str, dict] = {}  # what → {"since_s", "since_step", "detail"}
        self._published, self._closed_at_publication = 0, 0  # nothing published yet: every window counts
        self._last_publication = (clock(), 0)
        self._restarts = None
        self._restart_times: deque = deque()
        self._churn: list[tuple[int, float]] = []  # (step, gain) of the last applied re-placements
        self._frozen_since = None
        self._pairs_in = None
        self.events: list[tuple[str, str, int]] = []  # ("begin" | "end", what, step)

    def update(self, step: int, *, pairs: int, runtime: dict | None = None, moves=(), feeding: bool = True) -> dict:
        """Feed one step; returns `active`.

        Args:
          step: the step's index.
          pairs: token–expert pairs the MoE layers counted this step (all layers).
          runtime: the controller's `DispatchController.metrics()` (None: no runtime).
          moves: this step's re-placement records (``applied``, ``moved_slots``, ``makespan_before_us``,
            ``makespan_after_us``).
          feeding: whether the runtime is being fed counts this step (a loop that pauses its refresher says so).
        """
        now, lim = self._clock(), self.limits
        found = {}
        if runtime is not None:
            # Step 1: publication — windows closed since the last published tables.
            w = runtime["windows"]
            closed, published = w["closed"] - w["empty"], w["published"]  # empty windows have nothing to publish
            if published != self._published:
                self._published, self._closed_at_publication = published, closed
                self._last_publication = (now, step)
            waited = closed - self._closed_at_publication
            if waited >= lim.publication_windows:
                found["publication"] = (*self._last_publication, f"{waited} windows closed, none published")
            # Step 2: restart loop — restarts within the last restart_window_s.
            restarts = runtime["restarts"]
            new = 0 if self._restarts is None else restarts - self._restarts
            self._restarts = restarts
            self._restart_times.extend([(now, step)] * new)
            while self._restart_times and now - self._restart_times[0][0] > lim.restart_window_s:
                self._restart_times.popleft()
            if len(self._restart_times) >= lim.restarts:
                found["restart_loop"] = (
                    *self._restart_times[0],
                    f"{len(self._restart_times)} solver restarts within {lim.restart_window_s:g} s",
                )
        # Step 3: re-placement churn — applied moves that move slots for (almost) no modelled gain.
        for mv in moves:
            if mv.get("applied") and mv.get("moved_slots", 0) > 0:
                gain = mv["makespan_before_us"] / max(mv["makespan_after_us"], 1e-12) - 1.0
                self._churn = [*self._churn, (step, now, gain)][-lim.churn_moves :]
        if len(self._churn) == lim.churn_moves and all(g < lim.min_gain for *_, g in self._churn):
            step0, t0, _ = self._churn[0]
            gains = ", ".join(f"{g:+.1%}" for *_, g in self._churn)
            found["replacement_churn"] = (t0, step0, f"{lim.churn_moves} re-placements moved slots for gains {gains}")
        # Step 4: counters — no pairs counted, or the runtime's accepted pairs not moving while fed.
        pairs_in = None if runtime is None else runtime["pairs"]["in"]
        still = pairs == 0 or (feeding and pairs_in is not None and pairs_in == self._pairs_in)
        self._pairs_in = pairs_in
        self._frozen_since = (self._frozen_since or (now, step, 0)) if still else None
        if self._frozen_since is not None:
            t0, s0, _ = self._frozen_since
            if step - s0 + 1 >= lim.frozen_steps:
                why = "no pairs counted" if pairs == 0 else "the runtime's accepted pairs did not move"
                found["counters"] = (t0, s0, f"{why} for {step - s0 + 1} steps")
        self._transition(found, step, now)
        return self.active

    def _transition(self, found: dict, step: int, now: float) -> None:
        for what in STALLS:
            was, hit = what in self._active, found.get(what)
            if hit and not was:
                t0, s0, detail = hit
                self._active[what] = {"since_s": t0, "since_step": s0, "detail": detail}
                self.events.append(("begin", what, step))
                log.warning("tempo-jax stalled: %s since step %d (%.1f s ago): %s", what, s0, now - t0, detail)
            elif hit:
                self._active[what]["detail"] = hit[2]
            elif was:
                gone = self._active.pop(what)
                self.events.append(("end", what, step))
                log.info("tempo-jax: %s no longer stalled at step %d (since step %d)", what, step, gone["since_step"])

    @property
    def active(self) -> dict:
        """``{what: {"since_s", "since_step", "detail"}}`` of the stalls that hold now."""
        return {k: dict(v) for k, v in self._active.items()}

    def gauges(self) -> dict:
        """``{what: seconds stalled}`` for every kind in `STALLS` (0.0: not stalled)."""
        now = self._clock()
        return {w: (now - self._active[w]["since_s"]) if w in self._active else 0.0 for w in STALLS}
