"""The metrics tempo-jax publishes: one table, read by the Prometheus sink (names, kinds, labels, help texts), the
TensorBoard sink (scalar tags) and docs/runtime.md's "Watching it" table (a test keeps the two equal).

Names follow Prometheus' conventions: a ``tempo_`` prefix, base units in the name (``_seconds``, ``_bytes``,
``_ratio``), ``_total`` on counters. Labels are bounded by the model: ``layer`` (one per MoE layer), and small fixed
sets (``tables``, ``of``, ``outcome``, ``kind``, ``what``). Per-rank and per-expert series (``rank``, ``expert``)
exist only behind `WatchOptions.per_rank` / ``per_expert``, whose cardinality the sink prints.
"""

from __future__ import annotations

import dataclasses

__all__ = ["METRICS", "MetricSpec", "STALLS", "markdown_table"]

#: What a stall gauge can name (`tempo_jax.metrics.stalls`).
STALLS = ("publication", "restart_loop", "replacement_churn", "counters")


@dataclasses.dataclass(frozen=True)
class MetricSpec:
    """One metric: its Prometheus name, kind (``counter``, ``gauge``, ``histogram``), unit, label names, meaning,
    and the option that enables it (None: always on)."""

    name: str
    kind: str
    unit: str
    labels: tuple[str, ...]
    meaning: str
    option: str | None = None


_M = MetricSpec
METRICS = (
    # per MoE layer (the layer's own statistics of the step)
    _M(
        "tempo_moe_tokens_total",
        "counter",
        "pairs",
        ("layer",),
        "token–expert pairs the layer's experts computed (a token routed to K experts counts K times)",
    ),
    _M(
        "tempo_moe_dropped_total",
        "counter",
        "pairs",
        ("layer",),
        "pairs dropped over a fixed capacity (0 with the default dropless rounds)",
    ),
    _M(
        "tempo_moe_invalid_ids_total",
        "counter",
        "pairs",
        ("layer",),
        "routed expert ids outside [0, E) (replayed routing under jit): computed by no expert",
    ),
    _M(
        "tempo_moe_balancedness_ratio",
        "gauge",
        "ratio",
        ("layer", "of"),
        "mean / max over ranks of the step's tokens (of=tokens) or modelled time (of=time); 1 = even",
    ),
    _M(
        "tempo_moe_makespan_seconds",
        "gauge",
        "seconds",
        ("layer", "tables"),
        "modelled makespan of the step: tables in force (live), EPLB-even, the policy solved on the step (optimum)",
    ),
    _M(
        "tempo_moe_dispatch_gain_ratio",
        "gauge",
        "ratio",
        ("layer",),
        "EPLB-even makespan / live makespan of the step (> 1: the live tables gain)",
    ),
    _M("tempo_moe_dropless_rounds", "gauge", "rounds", ("layer",), "exchange rounds of the step (1 = one round)"),
    _M(
        "tempo_moe_plan_rounds",
        "gauge",
        "rounds",
        ("layer",),
        "improvement rounds the in-graph plan ran this step (dispatch='ingraph'; 0 with tables)",
    ),
    _M(
        "tempo_moe_copies",
        "gauge",
        "experts",
        ("layer",),
        "experts copied into the ranks' dynamic slots this step, all ranks (dynamic_slots; 0 otherwise)",
    ),
    _M(
        "tempo_moe_rank_load_ratio",
        "histogram",
        "ratio",
        ("layer",),
        "each rank's tokens / the mean over ranks, one observation per rank per step (bounded: no rank label)",
    ),
    _M("tempo_moe_rank_tokens", "gauge", "pairs", ("layer", "rank"), "the step's tokens of one rank (N_g)", "per_rank"),
    _M(
        "tempo_moe_rank_active_experts",
        "gauge",
        "experts",
        ("layer", "rank"),
        "the step's experts with pairs on one rank (G_g)",
        "per_rank",
    ),
    _M(
        "tempo_moe_expert_tokens_total",
        "counter",
        "pairs",
        ("layer", "expert"),
        "pairs routed to one expert",
        "per_expert",
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
    """The metric table of docs/runtime.md: name, kind, unit, labels, meaning."""
    rows = ["| name | kind | unit | labels | meaning |", "| --- | --- | --- | --- | --- |"]
    for m in METRICS:
        labels = ", ".join(f"`{x}`" for x in m.labels) or "-"
        note = f" (only with `{m.option}`)" if m.option else ""
        rows.append(f"| `{m.name}` | {m.kind} | {m.unit} | {labels} | {m.meaning}{note} |")
    return "\n".join(rows)
