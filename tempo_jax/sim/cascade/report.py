"""One CascadeEP experiment as `tempo-jax cascade` runs it: the operating point resolved (a rate, a load of Sync's
capacity, or one burst), every mode served on each seed, the per-seed summary with its confidence intervals, the
paired orderings of neighbouring modes, OEWF's layer cuts — a `CascadeReport` that prints its tables and writes its
JSON.

numpy + solvers only (no jax)."""

from __future__ import annotations

import dataclasses

from ...text import table
from .config import CascadeConfig
from .run import CascadeRun, run_cascade_seeds
from .summary import SEED_FIGURES, capacity_rps, oewf_rows, paired_difference, seed_summary
from .vocabulary import LABELS, LAYER_MODES
from .workload import cascade_trace

__all__ = ["DEFAULT_LOAD", "MAX_SEEDS", "CascadeReport", "cascade_report"]

#: The load (fraction of Sync's capacity) served when neither a rate nor a load is given.
DEFAULT_LOAD = 0.9
#: Most seeds one report runs (each seed serves the trace once per mode).
MAX_SEEDS = 10_000


@dataclasses.dataclass(frozen=True)
class CascadeReport:
    """What `cascade_report` ran and found.

    Attributes:
      config: the experiment as served (``rate_rps`` resolved; None: one burst).
      modes: the modes, in the order given; seeds: the seeds served.
      capacity_rps: Sync's capacity on the trace when a load set the rate, else None.
      summary: `seed_summary` per mode (value and 95% CI of each `SEED_FIGURES` figure, and per seed).
      first: the first seed's `CascadeRun` per mode (R_tail, ALB, OEWF counters).
      paired: ``{"a-b": paired_difference}`` of neighbouring modes' mean TTFT (with two or more seeds).
      oewf: `oewf_rows` of the first seed's CascadeEP run (None without it).
    """

    config: CascadeConfig
    modes: tuple[str, ...]
    seeds: tuple[int, ...]
    capacity_rps: float | None
    summary: dict
    first: dict[str, CascadeRun]
    paired: dict
    oewf: dict | None

    def tables(self) -> str:
        """The per-mode table, the paired differences (two or more seeds) and OEWF's line, as printed."""
        rows = []
        for mode, r in self.first.items():
            s, f = r.summary(), self.summary[mode]
            rows.append(
                [
                    LABELS[mode],
                    _ci(f["throughput_tps"], 1e-3, 1),
                    _ci(f["ttft_mean_s"], 1, 3),
                    _ci(f["ttft_p95_s"], 1, 3),
                    f"{100 * s['tail_ratio']:.1f}%",
                    f"{s['alb']:.2f}",
                    s["oewf_moves"],
                    s["oewf_longer_layers"],
                ]
            )
        cfg, base = self.config, next(iter(self.first.values())).prefill
        served_at = "one burst" if cfg.rate_rps is None else f"{cfg.rate_rps:.2f} req/s"
        title = (
            f"{cfg.model}, {cfg.placement}, links={cfg.links}, launch={cfg.launch}, {base.num_requests} requests at "
            f"{served_at}, {len(self.seeds)} seed(s) (mean [95% CI]; R_tail … of seed {self.seeds[0]})"
        )
        heads = ["mode", "ktok/s", "TTFT avg s", "p95 s", "R_tail", "ALB", "OEWF moves", "OEWF longer layers"]
        out = [table(rows, heads, title)]
        if self.paired:
            out.append(
                table(
                    [
                        [
                            f"{LABELS[a]} − {LABELS[b]}",
                            f"{1e3 * p['value']:+.2f}",
                            f"[{1e3 * p['ci95'][0]:+.2f}, {1e3 * p['ci95'][1]:+.2f}]",
                            f"{p['wins']}/{p['n']}",
                            f"{p['sign_p']:.3f}",
                            p["order"],
                        ]
                        for (a, b), p in ((k.split("-"), p) for k, p in self.paired.items())
                    ],
                    ["pair", "ΔTTFT avg ms", "paired 95% CI", "seeds a > b", "sign test p", "claimed"],
                    "paired per-seed differences (an order is claimed only where the CI excludes 0 and p < 0.05)",
                )
            )
        if self.oewf is not None:
            o, n = self.oewf, self.first["cascade"].oewf_outcomes
            out.append(
                f"OEWF: cuts ≥ 1% of the layer in {100 * o['ge_1pct']:.1f}% of layer forwards, ≥ 5% in "
                f"{100 * o['ge_5pct']:.1f}%, max {100 * o['max']:.2f}%; {n['moves']} moves accepted: {n['executed']} "
                f"executed, {n['abandoned']} abandoned at commit, {n['dropped']} dropped at execution; {n['refused']} "
                "helper decisions refused before a fetch"
            )
        return "\n".join(out)

    def payload(self) -> dict:
        """The JSON `tempo-jax cascade --out` writes: the acting config, seeds, each mode's figures (value, 95% CI)
        and the paired differences."""
        return {
            "config": self.config.acting(),
            "seeds": list(self.seeds),
            "modes": {
                m: {k: {"value": self.summary[m][k]["value"], "ci95": self.summary[m][k]["ci95"]} for k in SEED_FIGURES}
                for m in self.modes
            },
            "paired_ttft_mean_s": self.paired,
        }


def _ci(fig: dict, scale: float, digits: int) -> str:
    """``value [lo, hi]`` of a seed figure (`seed_summary`), scaled."""
    lo, hi = fig["ci95"]
    return f"{fig['value'] * scale:.{digits}f} [{lo * scale:.{digits}f}, {hi * scale:.{digits}f}]"


#: How `cascade_report`'s errors name its options unless the caller says otherwise (the CLI names its flags).
OPTION_NAMES = {"seeds": "seeds", "rate": "rate", "load": "load", "max_requests": "max_requests"}


def _rate(config: CascadeConfig, load: float | None, run_kw: dict, names: dict) -> tuple[float | None, float | None]:
    """``(rate, Sync capacity)``: the rate given, ``load`` (default `DEFAULT_LOAD`) × Sync's capacity, or None for a
    trace whose requests all arrive at once (one burst: nothing to scale)."""
    if config.rate_rps is not None and load is not None:
        raise ValueError(
            f"{names['rate']} {config.rate_rps:g} and {names['load']} {load:g} exclude each other: the load sets the "
            "rate as a fraction of Sync capacity; give one"
        )
    served = cascade_trace(dataclasses.replace(config, rate_rps=None))
    if served.duration_s <= 0:
        given = names["rate"] if config.rate_rps is not None else names["load"] if load is not None else None
        if given:
            raise ValueError(
                f"{given}: the {len(served)} request(s) served of {served.name} all arrive at t = 0 s, so there are no "
                f"inter-arrival times to scale; drop {given} to serve them as one burst, or raise "
                f"{names['max_requests']}"
            )
        return None, None
    if config.rate_rps is not None:
        return config.rate_rps, None
    _, cap = capacity_rps(config, **run_kw)
    return (DEFAULT_LOAD if load is None else load) * cap, cap


def cascade_report(
    config: CascadeConfig,
    modes=LAYER_MODES,
    *,
    seeds: int = 1,
    load: float | None = None,
    workers: int | None = None,
    backend: str | None = None,
    progress: bool = True,
    option_names: dict | None = None,
) -> CascadeReport:
    """Serve ``modes`` on ``seeds`` consecutive seeds from ``config.seed`` at one operating point.

    Args:
      config: the experiment; its ``rate_rps`` is the rate (requests/s) unless ``load`` is given.
      modes: `LAYER_MODES` to run, each once, in this order (paired differences compare neighbours).
      seeds: how many seeds (1 … `MAX_SEEDS`).
      load: serve at this fraction of Sync's capacity on the trace (default `DEFAULT_LOAD` when ``config`` has no
        rate); a trace whose requests all arrive at once is served as one burst.
      workers, backend, progress: the job runner's (`run_cascade_seeds`).
      option_names: how the errors name ``seeds``, ``rate``, ``load`` and ``max_requests`` (`OPTION_NAMES`; the
        command line passes its flags).

    Returns:
      `CascadeReport`.

    Raises:
      ValueError: unknown or repeated modes, a seed count out of range, a rate and a load together, or a rate /
        load for a trace without inter-arrival times.
    """
    modes = tuple(modes)
    bad = [m for m in modes if m not in LAYER_MODES]
    if bad or not modes:
        raise ValueError(f"modes: unknown mode(s) {bad or modes}; use a subset of {list(LAYER_MODES)}")
    twice = sorted({m for m in modes if modes.count(m) > 1})
    if twice:
        raise ValueError(f"modes: {twice} given twice; name each mode once")
    names = {**OPTION_NAMES, **(option_names or {})}
    if not 1 <= seeds <= MAX_SEEDS:
        over = f" exceeds {MAX_SEEDS:,}," if seeds > MAX_SEEDS else ""
        raise ValueError(
            f"{names['seeds']} {seeds:,}{over} is outside 1 … {MAX_SEEDS:,} (each seed is a whole serving run per mode)"
        )
    # Step 1: the operating point (checked before any run).
    run_kw = dict(workers=workers, progress=progress, backend=backend)
    rate, cap = _rate(config, load, run_kw, names)
    config = dataclasses.replace(config, rate_rps=rate)
    # Step 2: every mode on every seed; the summary and the paired orderings.
    seed_ids = tuple(range(config.seed, config.seed + seeds))
    by_seed = run_cascade_seeds(config, modes, seeds=seed_ids, **run_kw)
    summary = seed_summary(by_seed)
    per_seed = {m: summary[m]["ttft_mean_s"]["per_seed"] for m in modes}
    pairs = zip(modes, modes[1:], strict=False) if seeds > 1 else ()
    paired = {f"{a}-{b}": paired_difference(per_seed[a], per_seed[b]) for a, b in pairs}
    first = by_seed[seed_ids[0]]
    oewf = oewf_rows(first["cascade"]) if "cascade" in first else None
    return CascadeReport(config, modes, seed_ids, cap, summary, first, paired, oewf)
