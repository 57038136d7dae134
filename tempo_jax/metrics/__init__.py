"""Expert load you can watch: one record per MoE layer per step, to Prometheus, TensorBoard and JSON lines, stall
gauges and warnings, and the pictures of a run (docs/runtime.md, "Watching it").

- `record`: `capture` (asynchronous host copies of every MoE layer's last-call statistics), `layer_record`
  (tokens and activated experts per rank, balancedness, modelled makespans, drops, rounds, invalid ids);
- `specs`: `METRICS`, the one table of names, kinds, units, labels and meanings;
- `sinks`: `JsonlSink`, `PrometheusSink` (prometheus-client), `TensorBoardSink` (tensorboardX);
- `stalls`: `StallWatch` (no publication, restart loops, re-placement churn, frozen counters);
- `watcher`: `Watcher` / `WatchOptions` (what a loop calls each step) and `log` (one call into your own writer);
- `report`: `tempo-jax report RUN`'s pictures (expert-load heatmap, balancedness over time, re-placements).

Shapes use the house letters (docs/architecture.md); n = Ng·D is the number of devices of a layer.
"""

from .record import STAT_NAMES, Capture, balancedness, capture, eplb_share, layer_record, moe_layers
from .sinks import JsonlSink, PrometheusSink, TensorBoardSink, write_tensorboard
from .specs import METRICS, REDUCTIONS, STALLS, MetricSpec, Source, markdown_table
from .stalls import StallLimits, StallWatch
from .watcher import Watcher, WatchOptions, log

__all__ = [
    "METRICS",
    "REDUCTIONS",
    "STALLS",
    "STAT_NAMES",
    "Capture",
    "JsonlSink",
    "MetricSpec",
    "PrometheusSink",
    "Source",
    "StallLimits",
    "StallWatch",
    "TensorBoardSink",
    "WatchOptions",
    "Watcher",
    "balancedness",
    "capture",
    "eplb_share",
    "layer_record",
    "log",
    "markdown_table",
    "moe_layers",
    "write_tensorboard",
]
