"""Replay protocols on recorded and synthetic routing (TEMPO §5.5, 5.6, 5.12, 5.14; Tables 1, 4, 8, 9, 10).

Glossary additions: nw windows, Ex redundant slots, drift = the paper's drift-K (hot experts swapped), batch sizes are
tokens per step across the EP group (``tokens_per_step``, the rows' ``B`` column; see :mod:`.replay` for the
convention and the stream sources).

Every protocol replays, for each stream (a layer of a recording, or a synthetic stream) at each B, each token
scale, each redundancy Ex and each drift K, the stream's windows through a placement built from the stream's
long-run load (drift-K corrupted when K > 0), and scores dispatches under one cost model (default: the proxy
serving three-term model of Table 7). It returns tidy rows, one per window, keyed by ``stream, B, scale,
redundant, drift, window``; the reductions to the paper's tables live in :mod:`.replay_summary`.

- :func:`run_policies` (Tables 1 and 4, drift-K sweep): makespan of each named policy per window, plus
  ``static_fresh`` (static on the fresh placement: what the drift costs).
- :func:`run_information` (§5.5): TEMPO with exact (current), stale-1 (previous window) and frozen (first
  window) information — stale and frozen splits applied to the true counts by :func:`.replay.apply_split` —
  against static and uniform (no information). Windows t ≥ 1.
- :func:`run_refresh` (§5.6, Table 10): the placement rebuilt every n windows from cumulative observed
  counts (``cum<n>``) or from the trailing n windows (``w<n>``), vs never (``never``); static/uniform/TEMPO.
- :func:`run_variants` (Tables 8, 9): TEMPO variants (`.variants`) — cumulative stages (``STAGES``) and
  objectives with cost terms deleted (``TERMS``) — each solved under its own model, all scored under the full one.

Results are cached by `.runner.cached`. numpy + solvers only (no jax).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from solvers import PRESETS, SWEEP_POLICIES, CostModel, DispatchProblem, gpu_loads, solve
from solvers.relief import check_relief_cost
from solvers.solve import check_policy

from ..runner import CACHE_DIR, cached, run_jobs
from .replay import PROXY_PRESET, Stream, SyntheticStreams, apply_split, make_streams, replay_placement
from .replay_summary import information_table
from .variants import STAGES, TEMPO_VARIANTS, variant_problem

__all__ = [
    "InformationConfig",
    "PolicyConfig",
    "RefreshConfig",
    "ReplayConfig",
    "VariantConfig",
    "bottleneck_term",
    "information_tables",
    "run_information",
    "run_policies",
    "run_refresh",
    "run_variants",
    "replay_stream",
]


# ------------------------------------------------------------------------------------------------ configs
@dataclass(frozen=True, kw_only=True)
class ReplayConfig:
    """What to replay (defaults: the paper's drift-16 scenario on the proxy shape, EP8, Ex = 64).

    Attributes:
      source: a trace name (recorded; the bundled sample when offline) or ``"synthetic"``.
      synthetic: parameters of the synthetic streams (used when ``source == "synthetic"``).
      tokens_per_step: batch sizes, tokens per step across the EP group (the rows' ``B``).
      scales: token scales applied to every window's counts (Table 4: 0.25, 1, 4).
      redundants: Ex redundant slots (placement has E + Ex slots).
      drifts: drift corruptions (hot experts swapped, the paper's drift-K) of the placement's long-run load
        (0 = fresh placement).
      num_gpus: D (= source ranks).
      preset: cost model (a key of `solvers.PRESETS`).
      max_windows: cap on windows per stream (None = all).
      tau: TEMPO's ensemble switching tolerance.
      chain_depth: TEMPO's augmenting-chain depth (None = the project's full depth; 2 = the paper's).
      seed: seeds the drift corruption (per stream: ``1000·seed + stream index``) and count scaling.
    """

    source: str = "flame_moe_290m"
    synthetic: SyntheticStreams = SyntheticStreams()
    tokens_per_step: tuple[int, ...] = (128, 512, 1024)
    scales: tuple[float, ...] = (1.0,)
    redundants: tuple[int, ...] = (64,)
    drifts: tuple[int, ...] = (16,)
    num_gpus: int = 8
    preset: str = PROXY_PRESET
    max_windows: int | None = None
    tau: float = 0.01
    chain_depth: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("tokens_per_step", "scales", "redundants", "drifts"):
            val = tuple(getattr(self, name))
            if not val:
                raise ValueError(f"{type(self).__name__}.{name} must not be empty")
            object.__setattr__(self, name, val)
        if self.preset not in PRESETS:
            raise ValueError(f"unknown preset {self.preset!r}; valid: {sorted(PRESETS)}")
        if min(self.tokens_per_step) < self.num_gpus or min(self.scales) <= 0 or min(self.drifts) < 0:
            raise ValueError("need tokens_per_step ≥ num_gpus, scales > 0 and drifts ≥ 0")
        if not 0 <= self.tau < 1:
            raise ValueError("need 0 ≤ tau < 1")
        if self.source != "synthetic" and self.synthetic != SyntheticStreams():
            raise ValueError(
                f"{type(self).__name__}.synthetic sets the synthetic streams; source={self.source!r} "
                "replays a recording and would ignore it (set source='synthetic' or leave synthetic out)"
            )

    @property
    def cost(self) -> CostModel:
        return PRESETS[self.preset]

    def tempo_options(self) -> dict:
        opts: dict = {"tau": self.tau}
        if self.chain_depth is not None:
            opts["chain_depth"] = self.chain_depth
        return opts


@dataclass(frozen=True, kw_only=True)
class PolicyConfig(ReplayConfig):
    """:func:`run_policies`: ``policies`` are names of `solvers.solve` (tempo gets ``tempo_options``)."""

    policies: tuple[str, ...] = SWEEP_POLICIES


@dataclass(frozen=True, kw_only=True)
class InformationConfig(ReplayConfig):
    """:func:`run_information`: fresh and drift-16 placements by default; ``policy`` is the solved one.

    ``fresh`` names policies of `solvers.solve` also solved on each window's own counts (rows ``fresh_<policy>``):
    e.g. ``("relief", "token_lp")`` for the in-graph dispatch (`solvers.relief`, issue 38) and LPLB-style per-batch
    token balancing.
    """

    drifts: tuple[int, ...] = (0, 16)
    policy: str = "tempo"
    fresh: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "fresh", tuple(self.fresh))
        for name in (self.policy, *self.fresh):
            check_policy(name, {})
        if "relief" in self.fresh:
            check_relief_cost(self.cost, f"InformationConfig(preset={self.preset!r})")


@dataclass(frozen=True, kw_only=True)
class RefreshConfig(ReplayConfig):
    """:func:`run_refresh`: long synthetic streams; ``modes`` are ``never``, ``cum<n>``, ``w<n>``."""

    source: str = "synthetic"
    tokens_per_step: tuple[int, ...] = (128, 512)
    modes: tuple[str, ...] = ("never", "cum16", "w4")
    policies: tuple[str, ...] = ("static", "uniform", "tempo")

    def __post_init__(self) -> None:
        super().__post_init__()
        for m in self.modes:
            _parse_mode(m)


@dataclass(frozen=True, kw_only=True)
class VariantConfig(ReplayConfig):
    """:func:`run_variants`: names of `.variants.TEMPO_VARIANTS`."""

    variants: tuple[str, ...] = STAGES

    def __post_init__(self) -> None:
        super().__post_init__()
        bad = sorted(set(self.variants) - set(TEMPO_VARIANTS))
        if bad:
            raise ValueError(f"unknown variants {bad}; valid: {sorted(TEMPO_VARIANTS)}")


def _parse_mode(mode: str) -> tuple[str, int]:
    """``"never"`` → (never, 0); ``"cum16"`` → (cum, 16); ``"w4"`` → (w, 4)."""
    if mode == "never":
        return "never", 0
    for kind in ("cum", "w"):
        if mode.startswith(kind) and mode[len(kind) :].isdigit() and int(mode[len(kind) :]) > 0:
            return kind, int(mode[len(kind) :])
    raise ValueError(f"refresh mode {mode!r} must be 'never', 'cum<n>' or 'w<n>' (n ≥ 1 windows)")


# ------------------------------------------------------------------------------------------------ per window
@dataclass(frozen=True)
class _Ctx:
    config: ReplayConfig
    stream: Stream
    placement: object  # solvers.Placement, drift corrupted
    fresh: object  # the fresh (drift 0) placement of the same stream and redundancy
    redundant: int


def _solve(config: ReplayConfig, counts, placement, policy: str, cost: CostModel | None = None, **extra):
    cost = config.cost if cost is None else cost
    opts = {**config.tempo_options(), **extra} if policy == "tempo" else {}
    return solve(DispatchProblem(counts, placement, cost), policy, **opts)


def bottleneck_term(cost: CostModel, x) -> tuple[str, float]:
    """``(term, mean activations per GPU)`` of a dispatch ``x [E, D]``: which piece of the cost model sets the
    bottleneck GPU's time (``floor`` a + b·G (+ tiles), ``tokens`` c + β·N or ``traffic`` c2 + γ·N; ties go in
    that order) and the mean of G_g over GPUs."""
    acts, tiles, tokens = gpu_loads(x, cost.tile)
    g = int(np.argmax(cost.gpu_times(acts, tokens, tiles)))
    pieces = cost.rank_pieces(float(acts[g]), float(tokens[g]), float(tiles[g]))
    return max(pieces, key=lambda k: (pieces[k], -list(pieces).index(k))), float(acts.mean())


def _policies_rows(ctx: _Ctx) -> Iterator[dict]:
    cfg: PolicyConfig = ctx.config
    for t, counts in enumerate(ctx.stream.windows):
        row = {"window": t}
        for policy in cfg.policies:
            d = _solve(cfg, counts, ctx.placement, policy)
            row[policy] = d.makespan
            if policy == "tempo":
                row["tempo_ms"] = 1e3 * d.info["solve_time_s"]
                row["tempo_term"], row["tempo_acts"] = bottleneck_term(cfg.cost, d.x)
        row["static_fresh"] = _solve(cfg, counts, ctx.fresh, "static").makespan
        yield row


def _information_rows(ctx: _Ctx) -> Iterator[dict]:
    cfg: InformationConfig = ctx.config
    cost, pl = cfg.cost, ctx.placement
    # Step 1: the exact solve of every window (window t's exact solution is window t + 1's stale one).
    xs = [_solve(cfg, counts, pl, cfg.policy).x for counts in ctx.stream.windows]
    # Step 2: score each information regime on the true counts of windows t ≥ 1.
    for t in range(1, ctx.stream.num_windows):
        counts = ctx.stream.windows[t]
        yield {
            "window": t,
            "static": _solve(cfg, counts, pl, "static").makespan,
            "uniform": _solve(cfg, counts, pl, "uniform").makespan,
            "exact": cost.makespan(xs[t]),
            "stale": cost.makespan(apply_split(xs[t - 1], counts, pl)),
            "frozen": cost.makespan(apply_split(xs[0], counts, pl)),
        } | {f"fresh_{p}": _solve(cfg, counts, pl, p).makespan for p in cfg.fresh}


def _refresh_rows(ctx: _Ctx) -> Iterator[dict]:
    cfg: RefreshConfig = ctx.config
    totals = ctx.stream.totals()  # [nw, E]
    W = ctx.stream.num_windows
    # Step 1: the placement in force at every window, per mode.
    placements: dict[str, list] = {}
    for mode in cfg.modes:
        kind, every = _parse_mode(mode)
        seq, current = [], ctx.placement
        for t in range(W):
            if kind != "never" and t > 0 and t % every == 0:
                observed = totals[:t].sum(axis=0) if kind == "cum" else totals[max(0, t - every) : t].sum(axis=0)
                current = replay_placement(observed, num_gpus=cfg.num_gpus, redundant=ctx.redundant)
            seq.append(current)
        placements[mode] = seq
    # Step 2: every (policy, mode) on every window, exact information.
    for t, counts in enumerate(ctx.stream.windows):
        row = {"window": t}
        for mode in cfg.modes:
            for policy in cfg.policies:
                row[f"{policy}+{mode}"] = _solve(cfg, counts, placements[mode][t], policy).makespan
        yield row


def _variant_rows(ctx: _Ctx) -> Iterator[dict]:
    cfg: VariantConfig = ctx.config
    cost = cfg.cost
    for t, counts in enumerate(ctx.stream.windows):
        row = {"window": t, "static": _solve(cfg, counts, ctx.placement, "static").makespan}
        for name in cfg.variants:
            seen, opts = variant_problem(name, cost)
            d = _solve(cfg, counts, ctx.placement, "tempo", seen, **opts)
            row[name] = cost.makespan(d.x)  # solved under its objective, scored under the full model
            row[f"{name}_ms"] = 1e3 * d.info["solve_time_s"]
        yield row


_KINDS: dict[str, tuple[Callable[[_Ctx], Iterator[dict]], int]] = {
    # kind → (per-window rows, minimum windows per stream)
    "policies": (_policies_rows, 1),
    "information": (_information_rows, 2),
    "refresh": (_refresh_rows, 1),
    "variants": (_variant_rows, 1),
}


# ------------------------------------------------------------------------------------------------ driver
def replay_stream(kind: str, config: ReplayConfig, stream: Stream, placement, *, fresh=None) -> list[dict]:
    """Per-window rows of protocol ``kind`` on one stream and placement (no key columns, no scaling, no cache).

    Args:
      kind: ``"policies"``, ``"information"``, ``"refresh"`` or ``"variants"``.
      config: the protocol's config (its source, tokens_per_step, scales, drifts are ignored here).
      stream: the windows to replay.
      placement: the placement served (for ``refresh``: the initial one).
      fresh: the fresh placement ``static_fresh`` is scored on (default: ``placement``).
    """
    if kind not in _KINDS:
        raise ValueError(f"unknown protocol {kind!r}; valid: {sorted(_KINDS)}")
    fresh = placement if fresh is None else fresh
    return list(_KINDS[kind][0](_Ctx(config, stream, placement, fresh, placement.num_slots - stream.num_experts)))


def _streams(kind: str, config: ReplayConfig, tokens_per_step: int) -> tuple[Stream, ...]:
    return make_streams(
        config.source, tokens_per_step, config.num_gpus, config.synthetic, config.max_windows, _KINDS[kind][1]
    )


def _job(kind: str, config: ReplayConfig, tokens_per_step: int, index: int) -> list[dict]:
    """Rows of one (stream, B): every scale × redundancy × drift, every window."""
    stream = _streams(kind, config, tokens_per_step)[index]
    per_window = _KINDS[kind][0]
    rows = []
    for scale in config.scales:
        scaled = stream.scaled(scale, seed=config.seed * 1000 + index)
        for R in config.redundants:
            # Step 1: the fresh placement and, per drift, the corrupted one (from the stream's recording).
            fresh = replay_placement(stream.history, num_gpus=config.num_gpus, redundant=R)
            for drift in config.drifts:
                pl = fresh
                if drift:
                    pl = replay_placement(
                        stream.history,
                        num_gpus=config.num_gpus,
                        redundant=R,
                        drift=drift,
                        seed=config.seed * 1000 + index,
                    )
                # Step 2: the protocol's rows, keyed.
                ctx = _Ctx(config, scaled, pl, fresh, R)
                key = {"stream": stream.label, "B": tokens_per_step, "scale": scale, "redundant": R, "drift": drift}
                rows += [{**key, **r} for r in per_window(ctx)]
    return rows


def _compute(kind: str, config: ReplayConfig, *, workers: int, progress: bool) -> list[dict]:
    jobs = [(kind, config, B, i) for B in config.tokens_per_step for i in range(len(_streams(kind, config, B)))]
    if not jobs:
        raise ValueError(f"{kind}: no stream of {config.source!r} has enough windows at B={config.tokens_per_step}")
    out = run_jobs(_job, jobs, workers=workers, desc=f"replay {kind}", progress=progress)
    return [row for rows in out for row in rows]


def _run(kind: str, config: ReplayConfig, workers: int, cache_dir, progress: bool) -> list[dict]:
    rows, _ = cached(_compute, kind, config, cache_dir=cache_dir, workers=workers, progress=progress)
    return rows


def run_policies(
    config: PolicyConfig, *, workers: int = 2, cache_dir: str | Path | None = CACHE_DIR, progress: bool = True
) -> list[dict]:
    """Per window: makespan (µs) of every policy in ``config.policies``, ``tempo_ms`` and ``static_fresh``.

    ``workers`` (processes; not part of the cache key), ``cache_dir`` (None = no cache) and ``progress`` are the
    same in every ``run_*`` function of the simulators.

    Returns:
      Rows ``{stream, B, scale, redundant, drift, window, <policy>: µs, ..., static_fresh}``, and with tempo among
      the policies ``tempo_ms``, ``tempo_term`` (the piece setting its bottleneck GPU, :func:`bottleneck_term`)
      and ``tempo_acts`` (its mean activations per GPU).
    """
    return _run("policies", config, workers, cache_dir, progress)


def run_information(
    config: InformationConfig, *, workers: int = 2, cache_dir: str | Path | None = CACHE_DIR, progress: bool = True
) -> list[dict]:
    """Per window t ≥ 1: ``static``, ``uniform``, ``exact``, ``stale`` (stale-1), ``frozen`` and ``fresh_<policy>``
    (each of ``config.fresh``) makespans (µs).

    ``exact`` solves window t; ``stale`` applies window t − 1's solution and ``frozen`` window 0's to window
    t's true counts (:func:`.replay.apply_split`); static and uniform need no information.
    """
    return _run("information", config, workers, cache_dir, progress)


def information_tables(
    config: InformationConfig,
    sources: dict[str, dict],
    *,
    workers: int = 2,
    cache_dir: str | Path | None = CACHE_DIR,
    progress: bool = True,
) -> dict[str, list[dict]]:
    """``{label: information_table(run_information(replace(config, **overrides)))}`` per labelled source, e.g.
    ``{"FLAME": {}, "Zipf1.2": {"source": "synthetic", "synthetic": streams}}`` (§5.5's two traces)."""
    return {
        label: information_table(
            run_information(replace(config, **over), workers=workers, cache_dir=cache_dir, progress=progress)
        )
        for label, over in sources.items()
    }


def run_refresh(
    config: RefreshConfig, *, workers: int = 2, cache_dir: str | Path | None = CACHE_DIR, progress: bool = True
) -> list[dict]:
    """Per window: ``"<policy>+<mode>"`` makespans (µs); the placement starts drift-corrupted (``drifts``).

    ``cumW`` rebuilds the EPLB placement at t = W, 2W, … from the counts of windows ``[0, t)``; ``wW`` from
    windows ``[t − W, t)``; ``never`` keeps the corrupted one. Policies solve with exact information.
    """
    return _run("refresh", config, workers, cache_dir, progress)


def run_variants(
    config: VariantConfig, *, workers: int = 2, cache_dir: str | Path | None = CACHE_DIR, progress: bool = True
) -> list[dict]:
    """Per window: ``static`` and every variant's makespan under the full model (µs), plus ``<variant>_ms``."""
    return _run("variants", config, workers, cache_dir, progress)
