"""The metrics tempo-jax publishes: one table, read by the Prometheus sink (names, kinds, labels, help texts), the
TensorBoard sink (scalar tags), `tempo_jax.metrics.layer_record` (the entries reduced from a layer's statistics) and
docs/runtime.md's "Watching it" table (a test keeps the two equal).

Names follow Prometheus' conventions: a ``tempo_`` prefix, base units in the name (``_seconds``, ``_bytes``,
``_ratio``), ``_total`` on counters. Labels are bounded by the model: ``layer`` (one per MoE layer), and small fixed
sets (``tables``, ``of``, ``outcome``, ``kind``, ``what``). Per-rank and per-expert series (``rank``, ``expert``)
exist only behind `WatchOptions.per_rank` / ``per_expert``, whose cardinality the sink prints.

A per-layer metric names its `Source`: the layer record's entry it publishes and, when that entry is one of the
layer's statistics (`tempo_jax.layer.moe.ShardStats`) reduced over the token shards, the statistic and the
reduction, so `layer_record` computes it and both sinks publish it from this table alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

__all__ = ["METRICS", "REDUCTIONS", "MetricSpec", "STALLS", "Source", "markdown_table"]

#: What a stall gauge can name (`tempo_jax.metrics.stalls`).
STALLS = ("publication", "restart_loop", "replacement_churn", "counters")

#: How a statistic ``[n, ...]`` (n token shards) becomes a layer record's entry (plain ints and lists: JSON as it
#: stands): summed or the largest over everything, per shard, or summed over the shards per expert.
REDUCTIONS: dict[str, Callable[[np.ndarray], object]] = {
    "sum": lambda v: int(np.sum(v)),
    "max": lambda v: int(np.max(v)),
    "per shard": lambda v: np.asarray(v).astype(int).tolist(),
    "per expert": lambda v: np.asarray(v).sum(0).astype(int).tolist(),
}


@dataclasses.dataclass(frozen=True)
class Source:
    """Where a per-layer metric's value comes from.

    Attributes:
      key: the layer record's entry (`tempo_jax.metrics.layer_record`). A number is the value; a dict fills the
        metric's last label from its keys (None values are not published), a list from its positions (a
        histogram observes every element instead).
      stat: the `ShardStats` field the entry is reduced from (``layer_record`` computes it: a two-file change —
        this table and docs/runtime.md's copy — publishes a new reduction of a statistic); None: ``layer_record``
        computes the entry itself (balancedness, makespans), or ``derive`` does.
      reduce: the `REDUCTIONS` entry applied to ``stat``.
      derive: the value from the whole layer record instead of ``key`` (a ratio of two entries).
      scale: the record's unit → the metric's (µs → s: 1e-6).
      tensorboard: the scalar's tag under ``moe/layer{i}/`` (``{}``: the label taken from a dict's key); None: not
        written to TensorBoard.
      missing: the entry of a record written before the metric existed (None: such a record is refused).
    """

    key: str
    stat: str | None = None
    reduce: str | None = None
    derive: Callable[[dict], object] | None = None
    scale: float = 1.0
    tensorboard: str | None = None
    missing: object = None

    def entry(self, layer: dict):
        """The record's entry ``key`` in its own unit."""
        if self.missing is not None:
            return layer.get(self.key, self.missing)
        return layer[self.key]

    def value(self, layer: dict):
        """The metric's value in ``layer`` (a layer record), scaled."""
        v = self.derive(layer) if self.derive is not None else self.entry(layer)
        if self.scale == 1.0:
            return v
        if isinstance(v, dict):
            return {k: None if x is None else x * self.scale for k, x in v.items()}
        if isinstance(v, list):
            return [x * self.scale for x in v]
        return v * self.scale

    def describe(self) -> str:
        """``statistic, reduction`` for the docs' table (``-`` when the record computes it)."""
        return f"`{self.stat}`, {self.reduce}" if self.stat else "-"


@dataclasses.dataclass(frozen=True)
class MetricSpec:
    """One metric: its Prometheus name, kind (``counter``, ``gauge``, ``histogram``), unit, label names, meaning,
    the option that enables it (None: always on) and, for a per-layer metric, its `Source` (None: the dispatch
    runtime's and the loop's, written from the step record by name)."""

    name: str
    kind: str
    unit: str
    labels: tuple[str, ...]
    meaning: str
    option: str | None = None
    source: Source | None = None

    def __post_init__(self):
        if self.source is not None and self.source.stat is not None and self.source.reduce not in REDUCTIONS:
            raise ValueError(f"MetricSpec {self.name}: reduce must be one of {sorted(REDUCTIONS)}")


def _gain(layer: dict) -> float:
    """EPLB-even makespan / live makespan (1 when nothing ran)."""
    live = layer["makespan_us"]["live"]
    return layer["makespan_us"]["eplb_even"] / live if live else 1.0


def _rank_load(layer: dict) -> list:
    """Each rank's tokens / the mean over ranks (no observation when no rank has tokens)."""
    toks = np.asarray(layer["tokens"], dtype=np.float64)
    return [float(r) for r in toks / toks.mean()] if toks.mean() > 0 else []


_M = MetricSpec
METRICS = (
    # per MoE layer (the layer's own statistics of the step)
    _M(
        "tempo_moe_tokens_total",
        "counter",
        "pairs",
        ("layer",),
        "token–expert pairs the layer's experts computed (a token routed to K experts counts K times)",
        source=Source("pairs", "shard_counts", "sum", tensorboard="pairs"),
    ),
    _M(
        "tempo_moe_dropped_total",
        "counter",
        "pairs",
        ("layer",),
        "pairs dropped over a fixed capacity (0 with the default dropless rounds)",
        source=Source("drops", "drops", "sum", tensorboard="drops"),
    ),
    _M(
        "tempo_moe_invalid_ids_total",
        "counter",
        "pairs",
        ("layer",),
        "routed expert ids outside [0, E) (replayed routing under jit): computed by no expert",
        source=Source("invalid_ids", "invalid_ids", "sum", tensorboard="invalid_ids"),
    ),
    _M(
        "tempo_moe_balancedness_ratio",
        "gauge",
        "ratio",
        ("layer", "of"),
        "mean / max over ranks of the step's tokens (of=tokens) or modelled time (of=time); 1 = even",
        source=Source("balancedness", tensorboard="balancedness_{}"),
    ),
    _M(
        "tempo_moe_makespan_seconds",
        "gauge",
        "seconds",
        ("layer", "tables"),
        "modelled makespan of the step: tables in force (live), EPLB-even, the policy solved on the step (optimum)",
        source=Source("makespan_us", scale=1e-6, tensorboard="makespan_{}_us"),
    ),
    _M(
        "tempo_moe_dispatch_gain_ratio",
        "gauge",
        "ratio",
        ("layer",),
        "EPLB-even makespan / live makespan of the step (> 1: the live tables gain)",
        source=Source("makespan_us", derive=_gain),
    ),
    _M(
        "tempo_moe_dropless_rounds",
        "gauge",
        "rounds",
        ("layer",),
        "exchange rounds of the step (1 = one round)",
        source=Source("rounds", "rounds", "max", tensorboard="rounds"),
    ),
    _M(
        "tempo_moe_plan_rounds",
        "gauge",
        "rounds",
        ("layer",),
        "improvement rounds the in-graph plan ran this step (dispatch='ingraph'; 0 with tables)",
        source=Source("plan_rounds", "plan_rounds", "max", tensorboard="plan_rounds"),
    ),
    _M(
        "tempo_moe_copies",
        "gauge",
        "experts",
        ("layer",),
        "experts copied into the ranks' dynamic slots this step, all ranks (dynamic_slots; 0 otherwise)",
        source=Source("copies", "copies", "sum", tensorboard="copies", missing=0),
    ),
    _M(
        "tempo_moe_rank_load_ratio",
        "histogram",
        "ratio",
        ("layer",),
        "each rank's tokens / the mean over ranks, one observation per rank per step (bounded: no rank label)",
        source=Source("tokens", derive=_rank_load),
    ),
    _M(
        "tempo_moe_rank_tokens",
        "gauge",
        "pairs",
        ("layer", "rank"),
        "the step's tokens of one rank (N_g)",
        "per_rank",
        Source("tokens", "gpu_tokens", "per shard"),
    ),
    _M(
        "tempo_moe_rank_active_experts",
        "gauge",
        "experts",
        ("layer", "rank"),
        "the step's experts with pairs on one rank (G_g)",
        "per_rank",
        Source("activated", "gpu_activations", "per shard"),
    ),
    _M(
        "tempo_moe_expert_tokens_total",
        "counter",
        "pairs",
        ("layer", "expert"),
        "pairs routed to one expert",
        "per_expert",
        Source("expert_tokens", "shard_counts", "per expert"),
    ),
    # the dispatch runtime (one controller)
    _M("tempo_dispatch_table_version", "gauge", "version", (), "version of the tables in force"),
    _M("tempo_dispatch_table_age_seconds", "gauge", "seconds", (), "age of the data behind the tables in force"),
    _M(
        "tempo_dispatch_table_age_windows",
        "gauge",
        "windows",
        (),
        "windows closed since the window behind the tables in force",
    ),
    _M("tempo_dispatch_refresh_seconds", "histogram", "seconds", (), "solve time of each published refresh (worker)"),
    _M(
        "tempo_dispatch_windows_total",
        "counter",
        "windows",
        ("outcome",),
        "closed windows by outcome: published, empty, or the drop reason (busy, over_budget, error, …)",
    ),
    _M("tempo_dispatch_solver_restarts_total", "counter", "restarts", (), "solver worker restarts"),
    _M("tempo_dispatch_fallback", "gauge", "bool", (), "1 while the stale-table fallback is published"),
    _M(
        "tempo_dispatch_replacements_total",
        "counter",
        "re-placements",
        ("outcome",),
        "placement proposals, applied or dismissed",
    ),
    _M("tempo_dispatch_replaced_slots_total", "counter", "slots", (), "slots whose expert moved"),
    _M("tempo_dispatch_replaced_bytes_total", "counter", "bytes", (), "expert bytes moved by re-placements"),
    _M("tempo_dispatch_replacement_seconds", "histogram", "seconds", (), "time of each applied re-placement"),
    _M(
        "tempo_dispatch_replacement_gain_ratio",
        "gauge",
        "ratio",
        (),
        "modelled makespan before / after the last applied re-placement",
    ),
    # the loop
    _M("tempo_steps_total", "counter", "steps", ("kind",), "steps watched (kind: prefill, decode, train, step)"),
    _M("tempo_step_seconds", "histogram", "seconds", ("kind",), "wall time of each step"),
    _M("tempo_stalled", "gauge", "bool", ("what",), "1 while a stall holds (what: " + ", ".join(STALLS) + ")"),
    _M("tempo_stalled_seconds", "gauge", "seconds", ("what",), "how long the stall has held (0: none)"),
)


def markdown_table() -> str:
    """The metric table of docs/runtime.md: name, kind, unit, labels, source, meaning."""
    rows = [
        "| name | kind | unit | labels | from (statistic, reduction) | meaning |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for m in METRICS:
        labels = ", ".join(f"`{x}`" for x in m.labels) or "-"
        note = f" (only with `{m.option}`)" if m.option else ""
        source = m.source.describe() if m.source else "-"
        rows.append(f"| `{m.name}` | {m.kind} | {m.unit} | {labels} | {source} | {m.meaning}{note} |")
    return "\n".join(rows)
