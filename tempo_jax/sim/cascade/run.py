"""`run_cascade` / `run_cascade_seeds`: serve a trace once per mode (cached, in worker processes) → `CascadeRun`;
`step_batches` rebuilds the batches of one served step."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from solvers.checks import check_choice, check_int, check_real

from ..runner import CACHE_DIR, cached, run_jobs
from .config import CascadeConfig
from .serving import PrefillResult, StepBatch, simulate_prefill
from .step_model import StepModel, StepRecord
from .vocabulary import LAYER_MODES
from .workload import cascade_trace, trace_digest

__all__ = ["CascadeRun", "run_cascade", "run_cascade_seeds", "serve_mode", "step_batches"]


@dataclass(frozen=True, kw_only=True, eq=False)
class CascadeRun:
    """One mode's serving run: the `PrefillResult` (records are `StepRecord`s) and its layer statistics.

    Attributes:
      config, mode: what ran.
      prefill: the prefill simulation's result (TTFT, throughput, cache hits, ALB, per-step records).
      layer_us: ``[S, L]`` layer times; base_us: ``[S, L]`` without OEWF (cascade mode).
    """

    config: CascadeConfig
    mode: str
    prefill: PrefillResult
    layer_us: np.ndarray = field(repr=False)
    base_us: np.ndarray = field(repr=False)

    @property
    def records(self) -> tuple[StepRecord, ...]:
        return self.prefill.step_records

    @property
    def busy_s(self) -> float:
        """Σ of step durations: the time the engine ran (its busy time; R_tail divides by `e2e_s`)."""
        return float(self.layer_us.sum()) * 1e-6

    @property
    def e2e_s(self) -> float:
        """App. A's T_E2E: wall-clock time from the first measured request's arrival until the last one's first
        token (seconds on the trace's clock)."""
        p = self.prefill
        return float(p.completion_s.max() - p.arrival_s.min()) if p.arrival_s.size else math.nan

    @property
    def tail_ratio(self) -> float:
        """R_tail = Σ_i Σ_d w_{d,i} / (D · T_E2E) (App. A, Eq. 7): the idle time waiting for the other replicas to
        *enter* dispatch (`StepRecord.gap_us`), averaged over replicas, over the run's wall-clock time `e2e_s`
        (not the engine's busy time `busy_s`, which excludes the idle time between steps)."""
        gap = sum(r.gap_us for r in self.records) * 1e-6
        return gap / (self.config.num_ranks * self.e2e_s)

    @property
    def oewf_longer(self) -> int:
        """Layer forwards OEWF's accepted moves made longer than without them, over the run."""
        return sum(r.oewf_longer for r in self.records)

    @property
    def oewf_outcomes(self) -> dict:
        """What became of OEWF's decisions over the run: ``moves`` (accepted), ``refused`` (helpers that decided
        without a move: no fetch), and of the accepted moves ``abandoned`` (at commit: no protected interval on the
        helper's GPU), ``dropped`` (at execution: weights after the donor's dispatch left) and ``executed`` (ran on
        the helper); ``moves == executed + abandoned + dropped``."""
        out = {
            k: sum(getattr(r, f"oewf_{k}") for r in self.records) for k in ("moves", "refused", "abandoned", "dropped")
        }
        out["executed"] = out["moves"] - out["abandoned"] - out["dropped"]
        return out

    @property
    def oewf_reduction(self) -> np.ndarray:
        """Per layer forward with OEWF (layers ≥ 1): 1 − layer time / the same layer without OEWF."""
        return 1.0 - self.layer_us[:, 1:].ravel() / self.base_us[:, 1:].ravel()

    @property
    def attention_accuracy(self) -> float:
        """1 − mean relative error of the attention predictions over (step, layer, replica) with tokens (App. D's
        metric, computed online; paper 90.3%)."""
        err = np.concatenate([r.attention_err for r in self.records])
        err = err[np.isfinite(err)]
        return float(1.0 - err.mean()) if err.size else math.nan

    @property
    def token_accuracy(self) -> float:
        """1 − mean relative error of N̂ (previous layer's count) vs the true count (paper 85.9%)."""
        err = np.concatenate([r.token_err for r in self.records])
        return float(1.0 - err.mean()) if err.size else math.nan

    @property
    def ffn_efficiency(self) -> float:
        """Matched-work FFN efficiency: Σ F(all of a rank's tokens) / Σ F(each kernel) (paper: 97.3% for SF)."""
        kernel = sum(r.ffn_kernel_us for r in self.records)
        return sum(r.ffn_merged_us for r in self.records) / kernel if kernel else math.nan

    def summary(self) -> dict:
        s = self.prefill
        return {
            "mode": self.mode,
            "requests": s.num_requests,
            "steps": s.num_steps,
            "ttft_mean_s": s.ttft_mean_s,
            "ttft_p95_s": s.ttft_p95_s,
            "throughput_ktok_s": s.prompt_throughput_tps / 1e3,
            "cache_hit_rate": s.cache_hit_rate,
            "alb": s.alb_mean,
            "tail_ratio": self.tail_ratio,
            "oewf_moves": int(sum(r.oewf_moves for r in self.records)),
            "oewf_longer_layers": self.oewf_longer,
            **{f"oewf_{k}": v for k, v in self.oewf_outcomes.items() if k != "moves"},
            "attention_accuracy": self.attention_accuracy,
            "token_accuracy": self.token_accuracy,
            "ffn_efficiency": self.ffn_efficiency,
        }


def serve_mode(config: CascadeConfig, mode: str, *, progress: bool = False) -> CascadeRun:
    """Serve ``config``'s trace in one mode, uncached and in this process (`run_cascade` caches it per mode)."""
    model = StepModel(config, mode)
    result = simulate_prefill(
        cascade_trace(config),
        step_time=model,
        num_replicas=config.num_ranks,
        policy=config.placement,
        max_batch_tokens=config.max_batch_tokens,
        cache_blocks=config.cache_blocks,
        seed=config.seed,
        progress=progress,
    )
    layer = np.stack([r.layer_us for r in result.step_records])
    base = np.stack([r.base_us for r in result.step_records])
    return CascadeRun(config=config, mode=mode, prefill=result, layer_us=layer, base_us=base)


def _keyed_mode(config: CascadeConfig, mode: str, digest: str) -> CascadeRun:
    """`serve_mode` with the trace content's digest in the cache key (unused otherwise)."""
    del digest
    return serve_mode(config, mode)


def _cached_mode(config: CascadeConfig, mode: str, cache_dir, digest: str) -> CascadeRun:
    return cached(_keyed_mode, config, mode, digest, cache_dir=cache_dir)[0]


def run_cascade(
    config: CascadeConfig,
    modes: tuple[str, ...] = LAYER_MODES,
    *,
    workers: int = 2,
    cache_dir: str | Path | None = CACHE_DIR,
    progress: bool = True,
    backend: str | None = None,
) -> dict[str, CascadeRun]:
    """Serve ``config``'s trace once per mode (cached; modes in parallel jobs).

    Args:
      config: the experiment; modes: `LAYER_MODES` to run.
      workers: jobs in parallel; cache_dir: the cache folder (None: no cache); progress: a tqdm bar.
      backend: `run_jobs` backend (``"loky"`` local processes, ``"dask"`` a dask.distributed cluster).

    The cache key holds the config, the mode, a hash of the trace file's content and of every source file.

    Returns:
      ``{mode: CascadeRun}`` in ``modes`` order.
    """
    return run_cascade_seeds(
        config, modes, seeds=(config.seed,), workers=workers, cache_dir=cache_dir, progress=progress, backend=backend
    )[config.seed]


def run_cascade_seeds(
    config: CascadeConfig,
    modes: tuple[str, ...] = LAYER_MODES,
    *,
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4),
    rates: dict[int, float] | None = None,
    workers: int = 2,
    cache_dir: str | Path | None = CACHE_DIR,
    progress: bool = True,
    backend: str | None = None,
) -> dict[int, dict[str, CascadeRun]]:
    """`run_cascade` for every seed of ``seeds`` (all (seed, mode) jobs in one pool): ``{seed: {mode: run}}``.
    ``rates``: each seed's request rate (``{seed: rps}``, e.g. a load of each seed's own capacity:
    `summary.capacity_rps_seeds`), in place of ``config.rate_rps``.

    Raises:
      ValueError: an unknown or repeated mode, no seeds, a seed that is not an integer >= 0 (0.5 would run as seed 0
        under the key 0.5), a repeated seed, or ``rates`` without a positive rate for every seed.
    """
    for m in modes:
        check_choice("mode", m, LAYER_MODES, where="run_cascade")
    twice = sorted({m for m in modes if modes.count(m) > 1})
    if twice:
        raise ValueError(f"run_cascade_seeds: modes {twice} are given twice; each mode runs once per seed")
    if not seeds:
        raise ValueError("run_cascade_seeds: seeds is empty; give at least one seed")
    for s in seeds:
        check_int("seed", s, minimum=0, where="run_cascade_seeds")
    seeds = tuple(int(s) for s in seeds)
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"run_cascade_seeds: seeds {list(seeds)} repeat a seed; give each once")
    if rates is not None:
        missing = [s for s in seeds if s not in rates]
        if missing:
            raise ValueError(f"run_cascade_seeds: rates has no rate for seeds {missing}; give one per seed")
        for s in seeds:
            check_real(f"rates[{s}]", rates[s], minimum=0.0, strict=True, where="run_cascade_seeds")
    digest = trace_digest(config)
    cfgs = {
        s: dataclasses.replace(config, seed=int(s), **({} if rates is None else {"rate_rps": float(rates[s])}))
        for s in seeds
    }
    jobs = [(cfgs[s], m, cache_dir, digest) for s in seeds for m in modes]
    runs = run_jobs(
        _cached_mode, jobs, workers=workers, desc=f"cascade {config.placement}", progress=progress, backend=backend
    )
    it = iter(runs)
    return {s: {m: next(it) for m in modes} for s in seeds}


def step_batches(result: PrefillResult, step: int) -> tuple[StepBatch, ...]:
    """Rebuild the per-replica batches of one served step from the result's chunk log (for timeline plots)."""
    sel = result.chunk_step == step
    out = []
    for d in range(result.num_replicas):
        m = sel & (result.chunk_replica == d)
        rid = result.chunk_request[m]
        out.append(
            StepBatch(replica=d, request_ids=rid, q=result.chunk_q[m], P=result.chunk_P[m], I=result.input_len[rid])
        )
    return tuple(out)
