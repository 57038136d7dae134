"""`DispatchController`: hosts the makespan solver beside the MoE layer (TEMPO §4.4, in-process here).

Each step the caller hands over the layer's per-source counts (or its cumulative counter); at the end of every
window of ``window`` steps the controller solves the accumulated batch with the configured policy and cost
model and publishes fresh `Tables`. With ``background=True`` the solve runs on a worker thread and
`observe` never waits for it: the layer keeps using the last published tables until new ones are ready.

    ctl = DispatchController(placement, PRESETS["dsv3_fp8_offline"], policy="tempo", background=True)
    for step in range(n):
        y = moe(x)                                  # the layer uses moe.table
        tables = ctl.observe(moe.counts.get_value())      # never blocks on the solver
        moe.set_tables(tables)
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from pallas_kernels import window_counts
from solvers import CostModel, DispatchProblem, Placement, node_counts_from_sources, solve, topology_split
from solvers.checks import check_array

from . import tables as T

__all__ = ["DispatchController"]


class DispatchController:
    """Accumulate counts per window, solve, publish tables.

    Args:
      placement: the placement the layer serves.
      cost: cost model the policy optimises.
      policy: a `solvers.POLICIES` name.
      window: steps per solve.
      options: policy options (e.g. ``{"tau": 0.0}``).
      background: solve on a worker thread (non-blocking `observe`).
      per_node: publish one table per source node via the topology-aware split (needs a multi-node placement).
    """

    def __init__(
        self,
        placement: Placement,
        cost: CostModel,
        *,
        policy: str = "tempo",
        window: int = 1,
        options: dict | None = None,
        background: bool = False,
        per_node: bool = False,
    ):
        if window < 1:
            raise ValueError(f"window must be ≥ 1, got {window}")
        self.placement, self.cost, self.policy, self.window = placement, cost, policy, window
        self.options = dict(options or {})
        self.per_node = per_node
        self.history: list[dict] = []
        self._acc = np.zeros((placement.num_gpus, placement.num_experts))
        self._steps = 0
        self._last_counter: np.ndarray | None = None
        self._latest = T.uniform(placement)
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=1) if background else None
        self._pending: Future | None = None

    @property
    def latest(self) -> T.Tables:
        """The most recently published tables."""
        with self._lock:
            return self._latest

    def observe(self, counts) -> T.Tables:
        """Add one step's per-source counts ``[D, E]``; returns the latest published tables."""
        c = check_array("counts", counts, ndims=(2,), nonnegative=True)
        if c.shape != self._acc.shape:
            raise ValueError(f"counts must be [D={self._acc.shape[0]}, E={self._acc.shape[1]}], got {c.shape}")
        self._acc += c
        self._steps += 1
        if self._steps % self.window == 0:
            batch, self._acc = self._acc, np.zeros_like(self._acc)
            if self._pool is None:
                self._publish(self._solve(batch))
            elif self._pending is None or self._pending.done():  # a solve in flight: skip, never queue up
                self._pending = self._pool.submit(lambda b=batch: self._publish(self._solve(b)))
        return self.latest

    def observe_counter(self, counter) -> T.Tables:
        """Like `observe`, from the layer's cumulative uint32 counter ``[D, E]`` (wrap-safe differencing)."""
        now = np.asarray(counter, dtype=np.uint32)
        before = self._last_counter if self._last_counter is not None else np.zeros_like(now)
        self._last_counter = now
        return self.observe(window_counts(now, before).astype(np.float64))

    def wait(self) -> T.Tables:
        """Block until a background solve in flight has published (tests, shutdown)."""
        if self._pending is not None:
            self._pending.result()
        return self.latest

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    # ------------------------------------------------------------------ internals
    def _solve(self, counts: np.ndarray) -> T.Tables:
        t0 = time.perf_counter()
        problem = DispatchProblem(np.round(counts), self.placement, self.cost)
        d = solve(problem, self.policy, **self.options)
        if self.per_node:
            y = topology_split(d, node_counts_from_sources(problem.tokens, self.placement), self.placement)
            tables = T.from_split(y, self.placement)
        else:
            tables = T.from_dispatch(d, self.placement)
        self.history.append(
            dict(
                step=self._steps,
                makespan=d.makespan,
                solve_ms=d.info["solve_time_s"] * 1e3,
                total_ms=(time.perf_counter() - t0) * 1e3,
            )  # fmt: skip
        )
        return tables

    def _publish(self, tables: T.Tables) -> None:
        with self._lock:
            self._latest = tables
