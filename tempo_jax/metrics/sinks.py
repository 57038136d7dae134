"""Where step records go (`tempo_jax.metrics.watcher.Watcher`): a JSON-lines file (what `tempo-jax report` draws),
a Prometheus ``/metrics`` endpoint (prometheus-client) and TensorBoard event files (tensorboardX: a maintained
writer that needs neither TensorFlow nor torch; flax's and clu's summary writers import TensorFlow).

A step record: ``{"step", "kind", "time", "step_ms", "layers": [layer_record, …], "runtime": {…} | None,
"replacements": […], "stalls": {what: seconds}, "scalars": {tag: value}}`` (`Watcher` documents the fields).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np

from .specs import METRICS, STALLS

__all__ = ["JsonlSink", "PrometheusSink", "TensorBoardSink", "write_tensorboard"]


class JsonlSink:
    """One JSON object per step record, one per line, flushed as written (``path`` is created anew)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("w")

    def write(self, record: dict) -> None:
        self._file.write(json.dumps(record, default=float) + "\n")
        self._file.flush()

    def close(self, linger_s: float = 0.0) -> None:
        self._file.close()


class _ScrapeSeen:
    """A collector with no samples that notes each scrape (so `PrometheusSink.close` can wait for one)."""

    def __init__(self):
        self.event = threading.Event()

    def describe(self):
        return []

    def collect(self):
        self.event.set()
        return []


class PrometheusSink:
    """The records as Prometheus metrics (`tempo_jax.metrics.specs.METRICS`) in a registry of its own, served at
    ``http://addr:port/metrics`` when ``port`` is given (0: a free port; ``url`` says which).

    Args:
      port: serve ``/metrics`` on this port (None: no server; read `registry` yourself).
      addr: the address to bind (``0.0.0.0`` to be scraped from other hosts).
      per_rank: add the per-rank gauges (``rank`` label: layers × ranks series each).
      per_expert: add the per-expert counters (``expert`` label: layers × experts series).
    """

    def __init__(self, port: int | None = None, *, addr: str = "127.0.0.1", per_rank=False, per_expert=False):
        import prometheus_client as pc

        self.registry = pc.CollectorRegistry()
        kinds = {"counter": pc.Counter, "gauge": pc.Gauge, "histogram": pc.Histogram}
        enabled = {None, *(["per_rank"] if per_rank else []), *(["per_expert"] if per_expert else [])}
        self.m = {}
        for spec in METRICS:
            if spec.option in enabled:
                name = spec.name.removesuffix("_total") if spec.kind == "counter" else spec.name
                kw = {"buckets": _BUCKETS[spec.name]} if spec.kind == "histogram" else {}
                self.m[spec.name] = kinds[spec.kind](name, spec.meaning, spec.labels, registry=self.registry, **kw)
        self._last: dict = {}  # cumulative runtime counters already published
        self._seen = _ScrapeSeen()
        self.registry.register(self._seen)
        self.server, self.url = None, None
        if port is not None:
            try:
                self.server, _ = pc.start_http_server(port, addr=addr, registry=self.registry)
            except OSError as err:
                raise ValueError(
                    f"metrics: cannot serve /metrics on {addr}:{port} ({err.strerror or err}); pick a free port "
                    "(0 picks one) or stop what holds it"
                ) from None
            self.url = f"http://{addr}:{self.server.server_port}/metrics"

    def cardinality(self) -> int:
        """Time series this registry exposes now (every sample line of a scrape)."""
        return sum(len(f.samples) for f in self.registry.collect())

    def write(self, record: dict) -> None:
        m = self.m
        for i, layer in enumerate(record["layers"]):
            for spec in _layer_metrics():
                if spec.name in m:
                    _publish(m[spec.name], spec.kind, str(i), spec.source.value(layer))
        if record.get("runtime"):
            self._runtime(record["runtime"])
        for mv in record.get("replacements", ()):
            m["tempo_dispatch_replacements_total"].labels("applied" if mv["applied"] else "dismissed").inc()
            if mv["applied"]:
                m["tempo_dispatch_replaced_slots_total"].inc(mv["moved_slots"])
                m["tempo_dispatch_replaced_bytes_total"].inc(mv["bytes_moved"])
                m["tempo_dispatch_replacement_seconds"].observe(mv["seconds"])
                after = mv["makespan_after_us"]
                m["tempo_dispatch_replacement_gain_ratio"].set(mv["makespan_before_us"] / after if after else 1.0)
        m["tempo_steps_total"].labels(record["kind"]).inc()
        if record.get("step_ms") is not None:
            m["tempo_step_seconds"].labels(record["kind"]).observe(record["step_ms"] * 1e-3)
        stalls = record.get("stalls", {})
        for what in STALLS:
            m["tempo_stalled"].labels(what).set(float(what in stalls))
            m["tempo_stalled_seconds"].labels(what).set(stalls.get(what, 0.0))

    def _runtime(self, rt: dict) -> None:
        m = self.m
        m["tempo_dispatch_table_version"].set(rt["version"])
        m["tempo_dispatch_table_age_seconds"].set(rt["age_s"])
        m["tempo_dispatch_table_age_windows"].set(rt["age_windows"])
        m["tempo_dispatch_fallback"].set(float(rt["in_fallback"]))
        for ms in rt.get("refresh_ms", ()):
            m["tempo_dispatch_refresh_seconds"].observe(ms * 1e-3)
        outcomes = {"published": rt["windows"]["published"], "empty": rt["windows"]["empty"]}
        outcomes |= rt["windows"]["dropped"]
        for outcome, total in outcomes.items():
            m["tempo_dispatch_windows_total"].labels(outcome).inc(self._delta(("windows", outcome), total))
        m["tempo_dispatch_solver_restarts_total"].inc(self._delta("restarts", rt["restarts"]))

    def _delta(self, key, total: float) -> float:
        """The increase of a cumulative runtime counter since the last record; a counter that went down was
        restarted (a new controller), so all of its new total is new."""
        before, self._last[key] = self._last.get(key, 0), total
        return total - before if total >= before else total

    def close(self, linger_s: float = 0.0) -> None:
        """Stop serving, after one more scrape or ``linger_s`` seconds, whichever comes first (0: at once)."""
        if self.server is None:
            return
        if linger_s > 0:
            self._seen.event.clear()
            try:
                self._seen.event.wait(linger_s)
            except KeyboardInterrupt:  # Ctrl-C ends the wait, not the run
                pass
        self.server.shutdown()
        self.server.server_close()
        self.server = None


_BUCKETS = {
    "tempo_moe_rank_load_ratio": (0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 3.0, 4.0, float("inf")),
    "tempo_dispatch_refresh_seconds": (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, float("inf")),
    "tempo_dispatch_replacement_seconds": (0.001, 0.01, 0.1, 0.5, 1.0, 5.0, 30.0, float("inf")),
    "tempo_step_seconds": (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, float("inf")),
}


def _layer_metrics() -> list:
    """The per-layer metrics of `METRICS` (read when used): each published from its `Source` in the layer record."""
    return [spec for spec in METRICS if spec.source is not None]


def _publish(metric, kind: str, layer: str, value) -> None:
    """One layer's ``value`` of a prometheus-client ``metric``: a number under the ``layer`` label; a dict's values
    under their keys as the last label (None: not published); a list's elements under their positions, or, for a
    histogram, each observed."""

    def one(child, v):
        if kind == "counter":
            child.inc(v)
        elif kind == "gauge":
            child.set(v)
        else:
            child.observe(v)

    if isinstance(value, dict):
        for key, v in value.items():
            if v is not None:
                one(metric.labels(layer, key), v)
    elif isinstance(value, list):
        for at, v in enumerate(value):
            one(metric.labels(layer) if kind == "histogram" else metric.labels(layer, str(at)), v)
    else:
        one(metric.labels(layer), value)


def write_tensorboard(writer, record: dict) -> None:
    """Write one step record to a TensorBoard ``writer`` (tensorboardX's or torch's ``SummaryWriter``): per layer
    ``moe/layer{i}/…`` scalars and an ``expert_load`` histogram whose bucket e holds expert e's pairs; the
    runtime's ``dispatch/…``, the stalls' ``stall/…`` (seconds) and the record's own ``scalars``."""
    step = int(record["step"])
    for i, layer in enumerate(record["layers"]):
        tag = f"moe/layer{i}"
        for spec in _layer_metrics():
            name, value = spec.source.tensorboard, spec.source.entry(layer)  # the record's own unit
            if name is None:
                continue
            for label, v in value.items() if isinstance(value, dict) else [(None, value)]:
                if v is not None:
                    writer.add_scalar(f"{tag}/{name.format(label)}", v, step)
        load = np.asarray(layer["expert_tokens"], dtype=np.float64)
        ids = np.arange(load.size, dtype=np.float64)
        writer.add_histogram_raw(
            f"{tag}/expert_load",
            min=0.0,
            max=float(load.size),
            num=float(load.sum()),
            sum=float(ids @ load),
            sum_squares=float((ids**2) @ load),
            bucket_limits=(ids + 1.0).tolist(),
            bucket_counts=load.tolist(),
            global_step=step,
        )
    rt = record.get("runtime")
    if rt:
        for key in ("version", "age_s", "age_windows", "restarts"):
            writer.add_scalar(f"dispatch/{key}", rt[key], step)
        writer.add_scalar("dispatch/in_fallback", float(rt["in_fallback"]), step)
    for mv in record.get("replacements", ()):
        if mv["applied"]:
            writer.add_scalar("dispatch/replaced_slots", mv["moved_slots"], step)
            writer.add_scalar("dispatch/replaced_bytes", mv["bytes_moved"], step)
    for what in STALLS:
        writer.add_scalar(f"stall/{what}", record.get("stalls", {}).get(what, 0.0), step)
    if record.get("step_ms") is not None:
        writer.add_scalar(f"step/{record['kind']}_ms", record["step_ms"], step)
    for tag, v in record.get("scalars", {}).items():
        writer.add_scalar(tag, v, step)


class TensorBoardSink:
    """Step records into TensorBoard event files under ``logdir`` (a tensorboardX ``SummaryWriter``), or into a
    ``writer`` of your own."""

    def __init__(self, logdir: str | Path | None = None, *, writer=None):
        if (logdir is None) == (writer is None):
            raise ValueError("TensorBoardSink: give logdir (a folder for event files) or writer, exactly one")
        if writer is None:
            try:  # here, not in the writer's thread at the first event: a file in the way is refused at once
                Path(logdir).mkdir(parents=True, exist_ok=True)
            except OSError as err:
                raise ValueError(
                    f"TensorBoardSink: cannot make the logdir folder {str(logdir)!r} ({err.strerror or err}); give a "
                    "folder path (not a file)"
                ) from None
            from tensorboardX import SummaryWriter

            writer = SummaryWriter(str(logdir))
        self.writer, self._own = writer, logdir is not None

    def write(self, record: dict) -> None:
        write_tensorboard(self.writer, record)

    def close(self, linger_s: float = 0.0) -> None:
        self.writer.flush()
        if self._own:
            self.writer.close()
