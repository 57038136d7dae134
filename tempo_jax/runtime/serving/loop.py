"""The one serving loop (`serve_loop`) and the runtime around it: a `Served` model's protocol and its `Step`,
starting and stopping the dispatch runtime, the watcher, the serving mesh and one row per step (the entry, `serve`,
is the package's: `tempo_jax.runtime.serving`, above both models).

`serve_loop` drives a `Served` model — ``step`` (run one step on the controller's freshest tables), ``price`` and
``move`` (the slow timescale: a placement proposal priced, then applied), ``line`` (the status line) — with the
runtime around it: the refresher on and off in blocks, a row per step, proposals applied or dismissed, the watcher,
a killed worker."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from ...layer import make_ep_mesh
from ...layer.mesh import make_mesh, parse_mesh
from ...metrics import Watcher, WatchOptions
from ..controller import DispatchController
from ..refresher import Refresher
from ..serve_config import ServeConfig
from . import report

__all__ = ["Served", "Step", "serve_loop", "serving_mesh", "start", "step_row", "stop", "watcher"]


def serving_mesh(cfg: ServeConfig):
    """The mesh a serving run uses: ``cfg.mesh`` (e.g. ``"data=2,ep=4"``, `tempo_jax.layer.make_mesh`) or one ``ep``
    axis over every device. Returns ``(mesh, D, Ng, tensor_axis)``: EP ranks, EP groups (data replicas) and the
    tensor axis's name (None without one)."""
    if cfg.mesh is None:
        mesh = make_ep_mesh()
        return mesh, mesh.shape["ep"], 1, None
    mesh = make_mesh(**parse_mesh(cfg.mesh))
    return mesh, mesh.shape["ep"], mesh.shape["data"], "tensor" if mesh.shape["tensor"] > 1 else None


def watcher(cfg: ServeConfig, watch: WatchOptions | None, out_dir, cost, say) -> Watcher:
    """The serving loop's `tempo_jax.metrics.Watcher`: ``watch``'s sinks, and ``<out_dir>/metrics.jsonl`` (one
    record per step, what `tempo-jax report` draws) unless ``watch`` names another file or ``out_dir`` is None."""
    watch = WatchOptions() if watch is None else watch
    if watch.jsonl is None and out_dir is not None:
        watch = dataclasses.replace(watch, jsonl=str(Path(out_dir) / "metrics.jsonl"))
    return Watcher(watch, cost=cost, policy=cfg.policy, say=say)


def start(
    cfg: ServeConfig, placements, cost, read_counter: Callable[[], object]
) -> tuple[DispatchController, Refresher]:
    """The runtime of a serving loop: a `DispatchController` over ``placements`` with ``cfg``'s policy, solver mode,
    budget, staleness, fallback and re-placement period, fed by a `Refresher` that snapshots ``read_counter()``
    every ``cfg.period_s`` (or ``cfg.every_steps``)."""
    controller = DispatchController(placements, cost, cfg.controller)
    return controller, Refresher(controller, read_counter, period_s=cfg.period_s, every_steps=cfg.every_steps)


def stop(controller, refresher) -> tuple[dict, str, list]:
    """Stop the refresher, then read the controller's ``(metrics, status line, history)`` and close it."""
    refresher.stop()
    metrics, status = controller.metrics(), controller.status_line()
    history = list(controller.history)
    controller.close()
    return metrics, status, history


def step_row(
    step: int, on: bool, step_ms: float, version: int, live, uniform, metrics: dict, first_after_move: bool, **extra
) -> dict:
    """One serving step's row: its time (ms), the table version it ran, the modelled makespans of the live tables
    and of uniform ones (µs; per layer in the LM loop), the controller's table age and last solve time from
    ``metrics`` (`DispatchController.metrics`), whether it is the first step on a new layout, and ``extra``."""
    return dict(
        step=step,
        on=on,
        step_ms=step_ms,
        version=version,
        live_us=live,
        uniform_us=uniform,
        age_s=metrics["age_s"],
        solve_ms=metrics["solve_ms"]["last"],
        first_after_move=first_after_move,
        **extra,
    )


@dataclasses.dataclass
class Step:
    """One served step as `serve_loop` records it: its time ``ms``, the table ``version`` it ran, the modelled
    makespans under the live tables and uniform ones, ``live`` / ``uniform`` (µs; a list per layer for the LM), what
    the watcher reads (``watched``: the layer's `Capture` or the model) with its extra keywords ``watch``, and the
    step's own fields of its row, ``row``."""

    ms: float
    version: int
    live: Any
    uniform: Any
    watched: Any
    watch: dict = dataclasses.field(default_factory=dict)
    row: dict = dataclasses.field(default_factory=dict)


class Served(Protocol):
    """A model as `serve_loop` serves it: the bare layer (`layer_model`) or the tiny LM (`lm_model`)."""

    #: How a re-placement's modelled makespan is labelled (`move_text`).
    label: str

    def step(self, s: int, controller: DispatchController) -> Step:
        """Run step ``s`` on the controller's freshest tables and add its counts to what the refresher reads."""
        ...

    def price(self, proposal, s: int) -> dict | None:
        """The placement ``proposal`` priced (`priced`) at step ``s``, or None when it cannot be priced yet."""
        ...

    def move(self, proposal, s: int) -> tuple[dict, Any]:
        """Move the experts to ``proposal`` → ``(the move's record, the placements the controller goes on over)``."""
        ...

    def line(self, s: int, on: bool, step: Step, metrics: dict) -> str:
        """Step ``s``'s status line (``metrics``: `DispatchController.metrics` after it)."""
        ...


def serve_loop(cfg: ServeConfig, served: Served, controller, refresher, watcher, status) -> tuple[list, list]:
    """``cfg.steps`` steps of ``served`` → ``(rows, moves)``: the refresher on and off in blocks of ``cfg.block``
    steps (0: always on), one `step_row` per step (with the controller's restarts and fallback), every placement
    proposal priced and then applied (the controller continues over the new placements) or dismissed, the
    ``watcher`` fed, one ``status`` line per step, the solver worker killed after step ``cfg.kill_worker_at``; then
    the runtime settles (an in-flight solve, a restart) and the watcher flushes."""
    rows, moves, on, after_move = [], [], None, None
    for s in range(cfg.steps):
        want_on = cfg.block == 0 or (s // cfg.block) % 2 == 0
        if want_on != on:
            on = want_on
            (refresher.start if on else refresher.stop)()
        step = served.step(s, controller)
        if on:
            refresher.step()
        m = controller.metrics()
        extra = dict(restarts=m["restarts"], fallback=m["in_fallback"], **step.row)
        rows.append(step_row(s, on, step.ms, step.version, step.live, step.uniform, m, after_move is not None, **extra))
        if after_move is not None:  # the first step on the new layout (its jitted step compiles again)
            moves[-1]["next_step_ms"], after_move = step.ms, None
        proposal, moved = controller.proposal, len(moves)
        verdict = None if proposal is None else served.price(proposal, s)
        if verdict is not None:  # the slow timescale: the experts move only if the proposal pays for its move
            if verdict["applied"]:
                record, placements = served.move(proposal, s)
                moves.append(record | verdict)
                controller.set_placement(placements)  # its last windows re-solved over them: fresh tables
                after_move = s
            else:
                moves.append({"step": s, **verdict})
                controller.dismiss_proposal()
            status(report.move_text(moves[-1], served.label))
        watcher.step(
            s,
            step.watched,
            step_ms=step.ms,
            controller=controller,
            controller_metrics=m,
            moves=moves[moved:],
            feeding=on,
            **step.watch,
        )
        status(served.line(s, on, step, m))
        if cfg.kill_worker_at is not None and s == cfg.kill_worker_at:
            status(f"step {s:4d} killed the solver worker (pid {controller.kill_worker()})")
    controller.wait(timeout=120.0, raise_errors=False)
    watcher.flush()
    return rows, moves


# ------------------------------------------------------------------------------------------------ serving
