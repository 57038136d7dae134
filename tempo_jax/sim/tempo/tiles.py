"""Tile-aware dispatch at prefill scale (TEMPO §2.2, Eq. 2): does pricing M-tiles change the solution?

Glossary additions: nb batches, batch sizes are tokens per GPU (``tokens_per_gpu``), reached by scaling recorded or
synthetic decode batches up.

The paper rescales recorded routing to 4096–8192 tokens per GPU and reports that tile-aware search changes the
tile-blind solution in 97–99% of batches and cuts the modelled block time by a median 4.5–6.0% (p95 9.4%),
while the uniform replica split manufactures 3–10% extra padded tiles, vanishing by 16,384 tokens per GPU.

Per source and batch size: base batches ``[D, E]`` (a recording's consecutive batches of ``base_tokens`` per
GPU, or synthetic Zipf batches), every count multiplied by ``B / base_tokens`` (each token repeated; exact for
integer factors), an EPLB placement of ``replication × E`` slots from the source's long-run load, and the tile
cost model of Table 7 without its traffic piece (the study prices the grouped GEMM). Each batch is solved by
TEMPO twice — under the tile model (tile-aware search, snapped to 128-token tiles) and under the same model
with the tile term deleted (tile-blind, Eq. 1) — and both are scored under the tile model. Reported per batch:
whether the two dispatches differ, the tile-aware cut ``1 − M(aware)/M(blind)``, and the uniform split's
padded tiles over the fewest any dispatch needs (``Σ_e ⌈n_e/128⌉``). Cached by `.runner.cached`.
numpy + solvers only (no jax).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from solvers import PRESETS, DispatchProblem, Placement, gpu_loads, slots_for, solve
from tempo_jax.workloads import SyntheticRouting, load_sample, load_trace

from ..runner import CACHE_DIR, cached, run_jobs, stats

__all__ = ["TileStudyConfig", "run_tile_study", "tile_summary"]


@dataclass(frozen=True, kw_only=True)
class TileStudyConfig:
    """One source of routing for the tile study (defaults: recorded FLAME-MoE, Qwen3-235B tile model).

    Attributes:
      source: a trace name (recorded; the bundled sample when offline) or ``"synthetic"`` (Zipf ``skew``, the
        preset's model shape from :data:`.phase.MODEL_SHAPES` or ``experts``/``top_k``).
      preset: a tile-aware cost preset of `solvers.PRESETS` (its traffic piece is dropped).
      tokens_per_gpu: batch sizes B after scaling.
      base_tokens: tokens per GPU of the base batches (B must be a multiple of it).
      num_gpus: D.
      replication: physical slots / experts.
      batches: base batches per source (consecutive batches of each layer, layers in turn).
      experts, top_k, skew, kappa: the synthetic routing (``source == "synthetic"``).
      seed: synthetic routing seed.
    """

    source: str = "flame_moe_290m"
    preset: str = "qwen3_235b_b_tile"
    tokens_per_gpu: tuple[int, ...] = (4096, 8192, 16384)
    base_tokens: int = 256
    num_gpus: int = 8
    replication: float = 1.25
    batches: int = 8
    experts: int = 256
    top_k: int = 8
    skew: float = 1.2
    kappa: float = 2000.0
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "tokens_per_gpu", tuple(int(b) for b in self.tokens_per_gpu))
        if self.preset not in PRESETS or not PRESETS[self.preset].has_tiles:
            raise ValueError(f"preset must be a tile-aware preset of solvers.PRESETS, got {self.preset!r}")
        if self.base_tokens < 1 or any(b % self.base_tokens for b in self.tokens_per_gpu):
            raise ValueError(f"every tokens_per_gpu must be a multiple of base_tokens={self.base_tokens}")
        if self.batches < 1 or self.replication < 1:
            raise ValueError("need batches ≥ 1 and replication ≥ 1")


def _base(config: TileStudyConfig) -> tuple[list[np.ndarray], np.ndarray]:
    """``(batches [nb] of [D, E], long-run load [E])`` of the source at ``base_tokens`` per GPU."""
    D, B = config.num_gpus, config.base_tokens
    if config.source == "synthetic":
        routing = SyntheticRouting(config.experts, config.top_k, config.skew, kappa=config.kappa, seed=config.seed)
        return [routing.batch(B, D, step) for step in range(config.batches)], routing.pair_share
    try:
        trace = load_trace(config.source)
    except FileNotFoundError:  # offline: the bundled copy holds the same ids
        trace = load_sample(config.source)
    batches, load = [], np.zeros(trace.num_experts)
    for layer in trace.layers:
        load += trace.expert_load(layer)
    for i in range(max(trace.num_batches(layer, B, D) for layer in trace.layers)):
        for layer in trace.layers:
            if i < trace.num_batches(layer, B, D) and len(batches) < config.batches:
                batches.append(trace.batch_counts(layer, B, D, batch=i))
    if not batches:
        raise ValueError(f"{config.source!r} has no batch of {B} tokens on {D} ranks")
    return batches, load


def _study(config: TileStudyConfig, tokens_per_gpu: int) -> list[dict]:
    """Rows of one batch size: per base batch, the tile-aware and tile-blind solutions scored under Eq. 2."""
    batches, load = _base(config)
    E = batches[0].shape[1]
    placement = Placement.from_eplb(load, slots_for(E, config.num_gpus, config.replication), config.num_gpus)
    tile = PRESETS[config.preset].kernel_only()
    blind = dataclasses.replace(tile, b2=None)
    factor = tokens_per_gpu // config.base_tokens
    rows = []
    for i, base in enumerate(batches):
        # Step 1: the batch at prefill scale (every token repeated `factor` times).
        counts = base * factor
        # Step 2: tile-aware and tile-blind TEMPO, both scored under the tile model.
        aware = solve(DispatchProblem(counts, placement, tile), "tempo")
        plain = solve(DispatchProblem(counts, placement, blind), "tempo")
        m_aware, m_blind = tile.makespan(aware.x), tile.makespan(plain.x)
        # Step 3: the uniform split's tiles over the fewest any dispatch needs.
        uni = solve(DispatchProblem(counts, placement, tile), "uniform")
        n = counts.sum(axis=0)
        min_tiles = float(np.ceil(n[n > 0] / tile.tile - 1e-9).sum())
        rows.append(
            {
                "B": tokens_per_gpu,
                "batch": i,
                "changed": bool(np.abs(aware.x - plain.x).max() > 0.5),
                "cut": 1.0 - m_aware / m_blind,
                "uniform_extra_tiles": float(gpu_loads(uni.x, tile.tile)[1].sum()) / min_tiles - 1.0,
            }
        )
    return rows


def _compute(config: TileStudyConfig, *, workers: int, progress: bool) -> list[dict]:
    out = run_jobs(
        _study, [(config, B) for B in config.tokens_per_gpu], workers=workers, desc="tile study", progress=progress
    )
    return [r for rows in out for r in rows]


def run_tile_study(
    config: TileStudyConfig, *, workers: int = 2, cache_dir: str | Path | None = CACHE_DIR, progress: bool = True
) -> list[dict]:
    """Per batch: ``{B, batch, changed, cut, uniform_extra_tiles}`` (see the module docstring); cached."""
    rows, _ = cached(_compute, config, cache_dir=cache_dir, workers=workers, progress=progress)
    return rows


def tile_summary(rows: list[dict]) -> list[dict]:
    """Per B: share of batches whose solution changed, median / p95 cut, median uniform extra tiles."""
    out = []
    for B in dict.fromkeys(r["B"] for r in rows):
        sel = [r for r in rows if r["B"] == B]
        cut, extra = stats(r["cut"] for r in sel), stats(r["uniform_extra_tiles"] for r in sel)
        out.append(
            {
                "B": B,
                "batches": len(sel),
                "changed": float(np.mean([r["changed"] for r in sel])),
                "cut_median": cut["median"],
                "cut_p95": cut["p95"],
                "uniform_extra_tiles": extra["median"],
            }
        )
    return out
