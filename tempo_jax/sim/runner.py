"""The one runner every simulator uses: results cached on disk, jobs in worker processes with progress, statistics.

- `cached(fn, *args, **kwargs)` memoises ``fn(*args, **kwargs)`` with `joblib.Memory` under ``results/cache``.
  The key is the function, its arguments and `fingerprint()` — a hash of every source file of the project
  (`solvers` and `tempo_jax`, bundled data included), so a changed solver, simulator or sample never re-plots stale
  results. Inputs read from outside the project (a request trace) enter the key through the caller's arguments
  (`tempo_jax.sim.cascade` passes a hash of the trace file's content). ``workers``, ``progress`` and
  ``backend`` are passed through but are not part of the key: the simulators seed every job on its own, so the
  numbers do not depend on them.
- `run_jobs(fn, jobs, workers=..., backend=...)` maps a module-level function over argument tuples with
  `joblib.Parallel`, a tqdm bar, results in job order. ``backend="loky"`` (default): worker processes on this
  machine (fresh interpreters, no fork of a process holding jax; no ``__main__`` guard needed).
  ``backend="dask"``: the jobs go to a `dask.distributed` cluster through joblib's dask backend — the client of
  ``$TEMPO_JAX_DASK_SCHEDULER`` (a scheduler address) if set, else the running client (`distributed.get_client`);
  every sweep built on `run_jobs` (phase diagram, CascadeEP) then runs on the cluster unchanged. The default
  backend is ``$TEMPO_JAX_BACKEND`` when set, else ``"loky"``.
- `stats(values)` is the summary every table reduction uses; `bootstrap_ci(values)` the 95% percentile-bootstrap
  interval of a mean over seeds.

numpy + joblib only (no jax).
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np

__all__ = ["JOB_BACKENDS", "CACHE_DIR", "bootstrap_ci", "cached", "default_backend", "fingerprint", "run_jobs", "stats"]

_ROOT = Path(__file__).resolve().parents[2]
#: Default cache folder: ``<repo>/results/cache`` (results/ is gitignored).
CACHE_DIR = _ROOT / "results" / "cache"
#: Sources whose behaviour cached numbers depend on: every file below them (code and bundled data).
_SOURCES = ("solvers", "tempo_jax")
_SKIP = ("__pycache__",)
_UNKEYED = ("workers", "progress", "backend")
#: `run_jobs` backends.
JOB_BACKENDS = ("loky", "dask")
BACKEND_ENV = "TEMPO_JAX_BACKEND"
SCHEDULER_ENV = "TEMPO_JAX_DASK_SCHEDULER"


@lru_cache(maxsize=1)
def fingerprint() -> str:
    """sha256 (16 hex) of every file under `_SOURCES` (``*.py`` and bundled data; caches skipped), in path order."""
    h = hashlib.sha256()
    for folder in _SOURCES:
        files = (f for f in (_ROOT / folder).rglob("*") if f.is_file() and not set(f.parts) & set(_SKIP))
        for f in sorted(files, key=lambda f: f.relative_to(_ROOT).as_posix()):
            if f.suffix in (".pyc", ".pyo"):
                continue
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


def default_backend() -> str:
    """``$TEMPO_JAX_BACKEND`` when set (one of `JOB_BACKENDS`), else ``"loky"``."""
    value = os.environ.get(BACKEND_ENV, "loky")
    if value not in JOB_BACKENDS:
        raise ValueError(f"${BACKEND_ENV}={value!r} is not a run_jobs backend; use one of {list(JOB_BACKENDS)}")
    return value


def _dask_client():
    """The dask.distributed client the jobs go to (``$TEMPO_JAX_DASK_SCHEDULER`` or the running one)."""
    try:
        from distributed import Client, get_client
    except ImportError as err:
        raise ValueError("backend='dask' needs dask.distributed: pip install 'dask[distributed]'") from err
    address = os.environ.get(SCHEDULER_ENV)
    if address:
        return Client(address)
    try:
        return get_client()
    except ValueError:
        raise ValueError(
            f"backend='dask' found no dask.distributed client: start one first (distributed.Client(...), e.g. on a "
            f"LocalCluster) or set ${SCHEDULER_ENV} to the scheduler's address (host:port)"
        ) from None


def run_jobs(
    fn: Callable,
    jobs: Sequence[tuple],
    *,
    workers: int = 1,
    desc: str = "",
    progress: bool = True,
    backend: str | None = None,
) -> list:
    """``[fn(*job) for job in jobs]`` in job order; a tqdm bar counts finished jobs. ``fn`` must be a module-level
    (picklable) function.

    Args:
      fn, jobs: the function and its argument tuples ``[n_jobs]``.
      workers: with ``backend="loky"``, worker processes (1 = in this process); with ``"dask"``, the most jobs
        in flight at once on the cluster.
      desc, progress: the bar's label, and whether it shows.
      backend: ``"loky"`` (local processes) or ``"dask"`` (a dask.distributed cluster, see the module doc);
        default `default_backend()`.
    """
    from tqdm import tqdm

    if int(workers) != workers or workers < 1:
        raise ValueError(f"workers must be a positive integer, got {workers!r}")
    backend = default_backend() if backend is None else backend
    if backend not in JOB_BACKENDS:
        raise ValueError(f"run_jobs: unknown backend {backend!r}; use one of {list(JOB_BACKENDS)}")
    out: list = [None] * len(jobs)
    with tqdm(total=len(jobs), desc=desc, disable=not progress) as bar:
        if backend == "loky" and (workers == 1 or len(jobs) <= 1):
            for i, job in enumerate(jobs):
                out[i] = fn(*job)
                bar.update()
        elif backend == "loky":
            from joblib import Parallel, delayed

            pool = Parallel(n_jobs=min(workers, len(jobs)), return_as="generator_unordered")
            for i, value in pool(delayed(_indexed)(i, fn, job) for i, job in enumerate(jobs)):
                out[i] = value
                bar.update()
        else:
            from joblib import Parallel, delayed, parallel_config

            client = _dask_client()
            with parallel_config(backend="dask", client=client, wait_for_workers_timeout=60):
                pool = Parallel(n_jobs=max(1, min(workers, len(jobs))))
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


def bootstrap_ci(
    values: Iterable[float], *, confidence: float = 0.95, resamples: int = 10_000, seed: int = 0
) -> tuple[float, float]:
    """Percentile-bootstrap interval of the mean of ``values [n]`` (n ≥ 1; e.g. one figure per seed).

    Resamples the n values with replacement ``resamples`` times (seeded, so the interval is reproducible) and
    returns the ``(1 − confidence) / 2`` and ``(1 + confidence) / 2`` quantiles of the resampled means. One value
    gives ``(v, v)``.
    """
    v = np.asarray(list(values), dtype=np.float64)
    if v.ndim != 1 or v.size == 0 or not np.all(np.isfinite(v)):
        raise ValueError(f"bootstrap_ci: values must be a non-empty list of finite numbers, got {v!r:.80}")
    if not 0 < confidence < 1:
        raise ValueError(f"bootstrap_ci: confidence must lie in (0, 1), got {confidence!r}")
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, v.size, size=(int(resamples), v.size))].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - confidence) / 2, (1 + confidence) / 2])
    return float(lo), float(hi)
