"""Cumulative counters → count windows: wrap-safe differencing modulo 2^32, restarts, multi-process snapshots.

The MoE layer keeps a cumulative per-(source rank, expert) pair counter ``[D, E]`` uint32 that wraps modulo 2^32
(`pallas_kernels.dispatch` adds each step's counts to it). This module is the one place that turns snapshots of
it back into counts: `CounterWindows` (differencing, baselines, restarts) and `host_counter` (a snapshot on the
host, gathered across processes).

numpy only (jax only inside `host_counter`)."""

from __future__ import annotations

import numpy as np

from solvers.checks import check_int

__all__ = ["COUNTER_RANGE", "CounterWindows", "host_counter"]

#: Counters are uint32: differences are taken modulo this.
COUNTER_RANGE = 1 << 32


class CounterWindows:
    """Wrap-safe differencing of cumulative ``[D, E]`` uint32 counter snapshots into windows.

    The first snapshot is a baseline (no window: the counter may have run for a long time before the refresher
    started). A later snapshot gives ``(now − before) mod 2^32`` per entry: exact across a wrap as long as fewer
    than ``max_window_pairs`` pairs hit one entry between snapshots. An entry whose difference is at least
    ``max_window_pairs`` (by default 2^31: the counter went *down*) means its source row restarted from zero
    (a restarted rank or a re-created layer); that row's window is its current value, the pairs counted since
    the restart. A restart that lands above the old value cannot be told from traffic: keep snapshots frequent.

    Snapshots must be fed in the order they were taken (one refresher).
    """

    def __init__(self, max_window_pairs: int = 1 << 31):
        self.max_window_pairs = check_int("max_window_pairs", max_window_pairs, where="CounterWindows")
        if self.max_window_pairs >= COUNTER_RANGE:
            raise ValueError(f"CounterWindows: max_window_pairs must be < 2^32, got {max_window_pairs}")
        self.before: np.ndarray | None = None

    def diff(self, now: np.ndarray) -> tuple[np.ndarray | None, dict]:
        """``(window [D, E] int64 | None, notes)`` (or ``[L, D, E]`` for one counter per layer); notes: ``baseline``
        (bool), ``wrapped`` (entries that wrapped), ``restarted_rows`` (source rows that restarted: row ids, or
        [layer, row] pairs)."""
        now = np.asarray(now, dtype=np.uint32)
        if self.before is None or self.before.shape != now.shape:
            self.before = now.copy()
            return None, {"baseline": True, "wrapped": 0, "restarted_rows": []}
        before, self.before = self.before, now.copy()
        delta = (now.astype(np.int64) - before.astype(np.int64)) % COUNTER_RANGE
        restarted = (delta >= self.max_window_pairs).any(axis=-1)  # [..., D]: a source row (of a layer) restarted
        delta[restarted] = now[restarted]
        wrapped = int(((now < before) & ~restarted[..., None]).sum())
        rows = np.flatnonzero(restarted).tolist() if restarted.ndim == 1 else np.argwhere(restarted).tolist()
        return delta, {"baseline": False, "wrapped": wrapped, "restarted_rows": rows}

    def reset(self) -> None:
        """Forget the baseline: the next snapshot is a new baseline."""
        self.before = None


def host_counter(counter) -> np.ndarray:
    """A counter ``[D, E]`` on the host. A jax array spread over several processes is gathered with
    ``multihost_utils.process_allgather`` (a collective: every process must call it at the same step, so use a
    step-driven refresher there); otherwise one device → host copy."""
    try:
        import jax
    except ImportError:  # pragma: no cover - numpy-only callers
        return np.asarray(counter)
    if isinstance(counter, jax.Array) and not counter.is_fully_addressable:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(counter, tiled=True))
    return np.asarray(counter)
