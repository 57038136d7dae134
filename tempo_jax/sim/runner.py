"""The one runner every simulator uses: results cached on disk, jobs in worker processes with progress, statistics.

- `cached(fn, *args, **kwargs)` memoises ``fn(*args, **kwargs)`` with `joblib.Memory` under ``results/cache``.
  The key is the function, its arguments and `fingerprint()` — a hash of every source the numbers depend on
  (`solvers`, `tempo_jax.workloads` and `tempo_jax.sim` itself), so a changed solver or simulator never
  re-plots stale results. ``workers`` and ``progress`` are passed through but are not part of the key: the
  simulators seed every job on its own, so the numbers do not depend on them.
- `run_jobs(fn, jobs, workers=...)` maps a module-level function over argument tuples in `joblib.Parallel`
  worker processes (loky: fresh interpreters, no fork of a process holding jax; no ``__main__`` guard
  needed), with a tqdm bar, results in job order.
- `stats(values)` is the summary every table reduction uses.

numpy + joblib only (no jax).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np

__all__ = ["CACHE_DIR", "cached", "fingerprint", "run_jobs", "stats"]

_ROOT = Path(__file__).resolve().parents[2]
#: Default cache folder: ``<repo>/results/cache`` (results/ is gitignored).
CACHE_DIR = _ROOT / "results" / "cache"
#: Sources whose behaviour cached numbers depend on (every ``*.py`` below them).
_SOURCES = ("solvers", "tempo_jax/workloads", "tempo_jax/sim")
_UNKEYED = ("workers", "progress")


@lru_cache(maxsize=1)
def fingerprint() -> str:
    """sha256 (16 hex) of every source file under `_SOURCES`, in path order."""
    h = hashlib.sha256()
    for folder in _SOURCES:
        for f in sorted((_ROOT / folder).rglob("*.py")):
            h.update(str(f.relative_to(_ROOT)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _call(fn: Callable, code: str, args: tuple, keyed: dict, unkeyed: dict):
    """What the cache memoises: ``code`` (the fingerprint) is part of the key and otherwise unused."""
    del code
    return fn(*args, **keyed, **unkeyed)


def cached(fn: Callable, *args, cache_dir: str | Path | None = CACHE_DIR, **kwargs) -> tuple[object, bool]:
    """``(fn(*args, **kwargs), hit)``, memoised on disk (``cache_dir=None`` computes without caching).

    ``fn`` must be a module-level function; its arguments must be picklable (frozen config dataclasses).
    ``hit`` tells whether the value came from the cache.
    """
    unkeyed = {k: kwargs.pop(k) for k in _UNKEYED if k in kwargs}
    if cache_dir is None:
        return fn(*args, **kwargs, **unkeyed), False
    import joblib

    memo = joblib.Memory(Path(cache_dir), verbose=0).cache(_call, ignore=["unkeyed"])
    call = (fn, fingerprint(), args, kwargs, unkeyed)
    hit = memo.check_call_in_cache(*call)
    return memo(*call), hit


def _indexed(i: int, fn: Callable, job: tuple):
    return i, fn(*job)


def run_jobs(fn: Callable, jobs: Sequence[tuple], *, workers: int = 1, desc: str = "", progress: bool = True) -> list:
    """``[fn(*job) for job in jobs]`` in job order: in-process when ``workers == 1``, else in ``workers`` joblib
    (loky) processes; a tqdm bar counts finished jobs. ``fn`` must be a module-level (picklable) function."""
    from tqdm import tqdm

    if int(workers) != workers or workers < 1:
        raise ValueError(f"workers must be a positive integer, got {workers!r}")
    out: list = [None] * len(jobs)
    with tqdm(total=len(jobs), desc=desc, disable=not progress) as bar:
        if workers == 1 or len(jobs) <= 1:
            for i, job in enumerate(jobs):
                out[i] = fn(*job)
                bar.update()
        else:
            from joblib import Parallel, delayed

            pool = Parallel(n_jobs=min(workers, len(jobs)), return_as="generator_unordered")
            for i, value in pool(delayed(_indexed)(i, fn, job) for i, job in enumerate(jobs)):
                out[i] = value
                bar.update()
    return out


def stats(values: Iterable[float]) -> dict:
    """``{"n", "mean", "median", "p95", "max"}`` of the finite values (NaN when there are none)."""
    v = np.asarray([x for x in values if x is not None and math.isfinite(x)], dtype=np.float64)
    if v.size == 0:
        return {"n": 0, "mean": math.nan, "median": math.nan, "p95": math.nan, "max": math.nan}
    return {
        "n": int(v.size),
        "mean": float(v.mean()),
        "median": float(np.median(v)),
        "p95": float(np.percentile(v, 95)),
        "max": float(v.max()),
    }
