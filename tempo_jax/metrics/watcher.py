"""`Watcher`: one step record per step of a serving or training loop, to JSON lines, Prometheus and TensorBoard;
`log`: the same record into a TensorBoard writer of your own, in one call.

    watch = Watcher(WatchOptions(port=9464, logdir="runs/a", jsonl="runs/a/metrics.jsonl"), cost=PRESETS[...])
    for s in range(steps):
        logits = step(model, batch)
        watch.step(s, model, kind="prefill", step_ms=..., controller=ctl, moves=moves_of_this_step)
    watch.close()

`Watcher.step` starts the host copies of the step's statistics (`tempo_jax.metrics.record.capture`), snapshots the
controller's counters, and hands both to the watcher's writer thread, which turns them into the step's record and
writes the sinks: the loop never waits on the device, nor on a sink, for its metrics (`flush` waits for the writer;
`close` flushes, then closes the sinks). A record (JSON-ready):

- ``step``, ``kind``, ``time`` (unix seconds), ``step_ms``;
- ``layers``: one `tempo_jax.metrics.record.layer_record` per MoE layer (tokens and activated experts per rank,
  pairs per expert, drops, invalid ids, rounds, balancedness, modelled makespans live / EPLB-even / optimum);
- ``runtime``: the controller's version, table age (seconds and windows), windows by outcome, restarts, fallback,
  and the solve times of the refreshes published since the last record (None without a controller);
- ``replacements``: the step's re-placement records (applied or dismissed, slots, bytes, seconds, makespans);
- ``stalls``: ``{what: seconds}`` of the stalls that hold (`tempo_jax.metrics.stalls`), ``scalars``: the caller's.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import threading
import time

from solvers import PRESETS, CostModel
from solvers.checks import check_instance, check_int, check_real
from solvers.solve import check_policy

from .record import Capture, capture, eplb_share, layer_record, moe_layers
from .sinks import JsonlSink, PrometheusSink, TensorBoardSink, write_tensorboard
from .stalls import StallLimits, StallWatch

__all__ = ["WatchOptions", "Watcher", "log"]

logger = logging.getLogger("tempo_jax.metrics")

DEFAULT_COST = "dsv3_fp8_offline"
WRITE_INTERVAL_S = 0.25  # how often the writer thread wakes to write the records queued up since
BACKLOG = 256  # steps the writer may fall behind before the loop waits for it (nothing is dropped)


@dataclasses.dataclass(frozen=True, kw_only=True)
class WatchOptions:
    """What a `Watcher` publishes and where.

    Attributes:
      port: serve Prometheus ``/metrics`` on this port (0: a free one; None: no endpoint).
      addr: the endpoint's address (``0.0.0.0`` to be scraped from other hosts).
      per_rank: per-rank gauges (``rank`` label; the cardinality is printed).
      per_expert: per-expert counters (``expert`` label).
      linger_s: at `Watcher.close`, keep ``/metrics`` up until one more scrape or this many seconds.
      logdir: write TensorBoard event files here (None: none).
      jsonl: write one JSON line per step here (what `tempo-jax report` draws; None: none).
      optimum_every: solve the policy on a step's own counts every this many steps (the ``optimum`` makespan:
        about a millisecond per layer; 0: never).
      stalls: when the stall gauges and warnings fire.
    """

    port: int | None = None
    addr: str = "127.0.0.1"
    per_rank: bool = False
    per_expert: bool = False
    linger_s: float = 0.0
    logdir: str | None = None
    jsonl: str | None = None
    optimum_every: int = 8
    stalls: StallLimits = StallLimits()

    def __post_init__(self):
        w = "WatchOptions"
        if self.port is not None:
            check_int("port", self.port, minimum=0, where=w)
            if self.port > 65535:
                raise ValueError(f"{w}: port={self.port} is not a TCP port (0–65535; 0 picks a free one)")
        check_real("linger_s", self.linger_s, minimum=0.0, where=w)
        check_int("optimum_every", self.optimum_every, minimum=0, where=w)
        for name in ("logdir", "jsonl"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, str | os.PathLike) and str(value).strip()):
                raise ValueError(f"{w}: {name}={value!r} is not a path; give one, or None for no {name}")
        check_instance("stalls", self.stalls, StallLimits, where=w, hint="tempo_jax.metrics.StallLimits(...)")
        if not isinstance(self.addr, str) or not self.addr.strip():
            raise ValueError(f"{w}: addr={self.addr!r} is not an address (e.g. '127.0.0.1', '0.0.0.0')")
        if self.addr != "127.0.0.1" and self.port is None:
            raise ValueError(f"{w}: addr={self.addr!r} is where /metrics is served; set port too")
        if (self.per_rank or self.per_expert) and self.port is None:
            raise ValueError(f"{w}: per_rank / per_expert label Prometheus series; set port too")
        if self.linger_s and self.port is None:
            raise ValueError(f"{w}: linger_s={self.linger_s} keeps /metrics up after the run; set port too")

    @property
    def active(self) -> bool:
        """Whether anything is published."""
        return self.port is not None or self.logdir is not None or self.jsonl is not None


class Watcher:
    """Step records of a loop into the sinks `WatchOptions` asks for; stall gauges and warnings.

    Args:
      options: what to publish.
      cost: the cost model of modelled times (default: the ``dsv3_fp8_offline`` preset).
      policy: the policy whose ``optimum`` is solved every ``options.optimum_every`` steps.
      say: where the endpoint's URL and cardinality are announced (a print-like callable).
    """

    def __init__(self, options: WatchOptions, *, cost: CostModel | None = None, policy: str = "tempo", say=print):
        w = "Watcher"
        check_instance("options", options, WatchOptions, where=w, hint="tempo_jax.metrics.WatchOptions(...)")
        if cost is not None:
            check_instance(
                "cost", cost, CostModel, where=w, hint=f"a solvers.CostModel, e.g. PRESETS[{DEFAULT_COST!r}]"
            )
        check_policy(policy)  # the optimum's policy: refused here, not at the step whose record would solve it
        if not callable(say):
            raise TypeError(f"{w}: say must be a callable taking one message (e.g. print), got {type(say).__name__}")
        self.options, self.policy = options, policy
        self.cost = PRESETS[DEFAULT_COST] if cost is None else cost
        self.stalls = StallWatch(options.stalls)
        self.sinks = []
        self.prometheus = None
        # What can be refused (a port in use, a logdir that is a file) opens before the JSON lines file, which is
        # written anew: a refused start never truncates an earlier run's metrics.jsonl.
        try:
            if options.port is not None:
                self.prometheus = PrometheusSink(
                    options.port, addr=options.addr, per_rank=options.per_rank, per_expert=options.per_expert
                )
                self.sinks.append(self.prometheus)
            if options.logdir is not None:
                self.sinks.append(TensorBoardSink(options.logdir))
            if options.jsonl is not None:
                self.sinks.append(JsonlSink(options.jsonl))
        except BaseException:
            for sink in self.sinks:
                sink.close()
            raise
        self._say = say
        if self.prometheus is not None:
            say(f"metrics: Prometheus endpoint at {self.url}")
        self._shares: dict = {}
        self._seen_refreshes = 0
        self._layers = (None, None)  # (the model last watched, its MoE layers): its graph is walked once
        self._queue: queue.Queue = queue.Queue(maxsize=BACKLOG)
        self._warned_backlog = False
        self._error: BaseException | None = None
        self._wake = threading.Event()
        self._writer = threading.Thread(target=self._write_loop, name="tempo-jax metrics", daemon=True)
        self._writer.start()
        self.records = 0
        self.writer_cpu_s = 0.0  # CPU seconds the writer thread spent on records and sinks
        self.records_lost = 0  # steps whose record failed, or came while a failure was not yet raised

    @property
    def url(self) -> str | None:
        """The Prometheus endpoint (None without one)."""
        return None if self.prometheus is None else self.prometheus.url

    def step(
        self,
        step: int,
        source,
        *,
        kind: str = "step",
        step_ms: float | None = None,
        controller=None,
        controller_metrics: dict | None = None,
        moves=(),
        feeding: bool = True,
        scalars: dict | None = None,
    ) -> None:
        """Watch one step: start the host copies of ``source``'s statistics and record the previous step.

        Args:
          step: the step's index.
          source: a model holding `tempo_jax.MoE` layers, or a `tempo_jax.metrics.record.Capture` (the functional
            layer: `Capture.from_stats`).
          kind: the step's kind (``prefill``, ``decode``, ``train``, …): a label.
          step_ms: the step's wall time.
          controller: the `DispatchController` feeding the layers (None: no runtime).
          controller_metrics: ``controller.metrics()`` of this step, when the loop already read it.
          moves: the step's re-placement records.
          feeding: whether the controller was fed this step (a loop pausing its refresher passes False).
          scalars: more scalars for this step (e.g. ``{"train/loss": …}``).
        """
        self._raise()
        if not isinstance(source, Capture):
            if source is not self._layers[0]:
                self._layers = (source, moe_layers(source))
            source = capture(self._layers[1])
        runtime = None if controller is None else self._runtime(controller, controller_metrics)
        meta = dict(
            step=step,
            kind=kind,
            time=time.time(),
            step_ms=step_ms,
            runtime=runtime,
            replacements=list(moves),
            feeding=feeding,
            scalars=dict(scalars or {}),
        )
        if self._queue.full() and not self._warned_backlog:
            self._warned_backlog = True
            logger.warning(
                "the metrics writer is %d steps behind; the loop now waits for it (nothing is "
                "dropped). Fewer sinks, or a larger WatchOptions.optimum_every (0: no optimum), lighten it.",
                BACKLOG,
            )
        if self._queue.full():
            self._wake.set()
        self._queue.put((source, meta))

    def _write_loop(self) -> None:
        """The writer thread: records from captures, into the sinks, in step order. It runs at the lowest CPU
        priority where the OS allows it per thread (Linux), so the step's own threads win a busy host's cores, and
        wakes every `WRITE_INTERVAL_S` to write what queued up (or at once for `flush`): the loop's thread then
        meets it holding the GIL a few times a second, not after every step."""
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except (AttributeError, OSError) as err:  # not Linux, or not allowed: the writer runs at normal priority
            logger.info("metrics writer thread keeps the normal CPU priority (%s)", err)
        while True:
            if self._queue.empty():
                self._wake.wait(WRITE_INTERVAL_S)
                self._wake.clear()
            item = self._queue.get()
            try:
                if item is None:
                    return
                if self._error is None:
                    t0 = time.thread_time()
                    self._emit(*item)
                    self.writer_cpu_s += time.thread_time() - t0
                else:  # after a failure, until the loop's thread hears of it: counted, and said in the error
                    self.records_lost += 1
            except BaseException as err:  # re-raised in the loop's thread at its next call
                self._error = err
                self.records_lost += 1
            finally:
                self._queue.task_done()

    def _raise(self) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            raise RuntimeError(
                f"tempo_jax.metrics.Watcher: writing a record failed: {err!r}; {self.records_lost} step(s) in all "
                "were not recorded (Watcher.records_lost). Later steps are recorded again."
            ) from err

    def _runtime(self, controller, m: dict | None) -> dict:
        m = controller.metrics() if m is None else m
        history = controller.history
        published = m["windows"]["published"]
        fresh = history[-(published - self._seen_refreshes) :] if published > self._seen_refreshes else []
        self._seen_refreshes = published
        keep = ("version", "age_s", "age_windows", "restarts", "in_fallback", "fallbacks", "windows", "pairs")
        return {k: m[k] for k in keep} | {"refresh_ms": [h["solve_ms"] for h in fresh]}

    def _share(self, placement):
        key = placement.key
        if key not in self._shares:  # the last 16 placements' EPLB-even shares
            self._shares = {key: eplb_share(placement), **dict(list(self._shares.items())[:15])}
        return self._shares[key]

    def _emit(self, cap: Capture, meta: dict) -> None:
        every = self.options.optimum_every
        policy = self.policy if every and meta["step"] % every == 0 else None
        layers = [layer_record(s, self.cost, policy=policy, share=self._share(s["placement"])) for s in cap.layers()]
        feeding = meta.pop("feeding")
        self.stalls.update(
            meta["step"],
            pairs=sum(layer["pairs"] for layer in layers),
            runtime=meta["runtime"],
            moves=meta["replacements"],
            feeding=feeding,
        )
        gauges = self.stalls.gauges()
        record = {**meta, "layers": layers, "stalls": {w: gauges[w] for w in self.stalls.active}}
        for sink in self.sinks:
            sink.write(record)
        self.records += 1
        if self.records == 1 and self.prometheus is not None:
            opts = [o for o in ("per_rank", "per_expert") if getattr(self.options, o)]
            self._say(
                f"metrics: {self.prometheus.cardinality()} series at {self.url} "
                f"({', '.join(opts) if opts else 'bounded: per-layer labels only; per_rank / per_expert add more'})"
            )

    def flush(self) -> None:
        """Wait until every step handed over so far is recorded and written (re-raises a writer's error)."""
        self._wake.set()
        self._queue.join()
        self._raise()

    def summary(self) -> dict:
        """What was published: records, files, the endpoint and its series, and the stall events."""
        return {
            "records": self.records,
            "records_lost": self.records_lost,
            "jsonl": self.options.jsonl,
            "logdir": self.options.logdir,
            "url": self.url,
            "series": None if self.prometheus is None else self.prometheus.cardinality(),
            "stall_events": [{"event": e, "what": w, "step": s} for e, w, s in self.stalls.events],
        }

    def close(self, *, linger: bool = True) -> None:
        """Record the last step, then close the sinks (the endpoint after one more scrape or ``linger_s``; at once
        with ``linger=False``)."""
        if self._writer.is_alive():
            self._queue.put(None)
            self._wake.set()
            self._writer.join()
        if linger and self.prometheus is not None and self.options.linger_s:
            self._say(
                f"metrics: {self.url} stays up until one more scrape (at most {self.options.linger_s:g} s; Ctrl-C "
                "ends the wait)"
            )
        for sink in self.sinks:
            sink.close(self.options.linger_s if sink is self.prometheus and linger else 0.0)
        self.sinks = []
        self._raise()

    def __enter__(self) -> Watcher:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.close(linger=exc_type is None)


def log(writer, model, step: int, *, cost: CostModel | None = None, scalars: dict | None = None) -> dict:
    """Write ``model``'s MoE statistics of its last call to a TensorBoard ``writer`` (tensorboardX's or torch's
    ``SummaryWriter``) at ``step``: per layer balancedness, modelled makespans (live, EPLB-even), pairs, drops,
    invalid ids, rounds and the expert-load histogram, plus ``scalars``. One call after your own train step;
    returns the record written (`Watcher`'s format, no runtime)."""
    cost = PRESETS[DEFAULT_COST] if cost is None else cost
    layers = [layer_record(s, cost) for s in capture(model).layers()]
    record = {"step": int(step), "kind": "train", "layers": layers, "scalars": dict(scalars or {})}
    write_tensorboard(writer, record)
    return record
