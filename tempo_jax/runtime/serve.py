"""`tempo-jax serve` / `make serve`: a model serving with live dispatch tables from the runtime.

``model="lm"`` (the default) serves the tiny MoE language model, every MoE layer with its own placement, counter
and live tables from one solver worker (`tempo_jax.runtime.serve_lm`). ``model="layer"`` serves the bare layer:

The bare expert-parallel layer (`moe_forward`, quota mode by default) runs ``steps`` steps on the ``ep`` mesh
(8 fake CPU devices here) with routing replayed from a synthetic drifting stream or a recorded trace
(`tempo_jax.workloads.drifting_stream` / `recorded_stream`). A
`Refresher` snapshots the layer's cumulative uint32 counter every ``period_s`` (or every ``every_steps``
steps) and feeds a `DispatchController` whose solver runs in a worker process; the layer reads
``controller.latest`` at every step. Per step it prints a status line: step time, the modelled makespan
(µs, the cost model on the per-GPU load the layer realised) under the live tables vs what EPLB-even tables
would give on the same counts, the tables' age and the last solve time.

The step time is measured with the worker on and off in the same run: the steps alternate in blocks of
``block`` steps between "on" (the refresher and the worker run) and "off" (no snapshots, no solves; the
tables stay as they are), so load drift of the machine hits both alike. ``kill_worker_at`` SIGKILLs the worker
after that step: the controller keeps the last good tables and restarts it.

After the loop (off the clock) every step is also scored under the static and EPLB-even tables and under an
oracle (tempo solved on that step's own counts, which no online system has). The result: a dict (also
``<out>/serve.json``) and a figure (``<out>/serve.png``): modelled makespan over time per policy with the
publication (refresh) marks, and the step times on vs off.
"""

from __future__ import annotations

import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from solvers import PRESETS, CostModel, DispatchProblem, Placement, expected_dispatch, plan_weights, slots_for, solve

from ..layer import MoEConfig, init_params, moe_forward, moe_reference, plan_migration, to_logical
from ..layer import tables as dispatch_tables
from ..layer.params import EXPERT_KEYS, slot_bytes
from ..layer.replicas import migrate
from ..metrics import Capture, WatchOptions
from ..workloads import RoutingStream, drifting_stream, recorded_stream
from . import serve_shared as shared
from .counters import host_counter
from .serve_config import ServeConfig
from .serve_lm import serve_lm

__all__ = ["ServeConfig", "serve"]


def _stream(cfg: ServeConfig, num_ranks: int) -> RoutingStream:
    if cfg.routing == "recorded":
        return recorded_stream(cfg.trace, tokens_per_rank=cfg.tokens_per_rank, num_ranks=num_ranks)
    return drifting_stream(
        experts=cfg.experts,
        top_k=cfg.top_k,
        skew=cfg.skew,
        drift=cfg.drift,
        kappa=cfg.kappa,
        tokens_per_step=cfg.tokens_per_rank * num_ranks,
        seed=cfg.seed,
    )


# ------------------------------------------------------------------------------------------------ serving
def serve(
    cfg: ServeConfig = ServeConfig(),
    *,
    out_dir: str | Path | None = "results",
    quiet: bool = False,
    figure: bool = True,
    watch: WatchOptions | None = None,
) -> dict:
    """Run the serving loop: the tiny MoE LM (``cfg.model="lm"``, `tempo_jax.runtime.serve_lm.serve_lm`) or the bare
    layer (see the module); returns the report (also written to ``<out_dir>/serve.json``, with one metrics record
    per step in ``<out_dir>/metrics.jsonl``). ``watch``: the run's Prometheus endpoint, TensorBoard folder and
    stall limits (`tempo_jax.metrics.WatchOptions`; docs/runtime.md, "Watching it")."""
    if cfg.model == "lm":
        return serve_lm(cfg, out_dir=out_dir, quiet=quiet, figure=figure, watch=watch)
    return _serve_layer(cfg, out_dir=out_dir, quiet=quiet, figure=figure, watch=watch)


class _ServedLayer:
    """The bare layer as `serve_shared.serve_loop` serves it (`serve_shared.Served`): ``step`` runs one jitted
    `moe_forward` on the replayed routing with the controller's freshest tables (the placement an argument, so a
    re-placement compiles nothing), keeps the counter where the layer returns it and checks the output against the
    dense reference every ``check_every`` steps; ``price`` / ``move`` re-place the experts (`migrate`)."""

    label = "modelled makespan"

    def __init__(self, cfg: ServeConfig, *, mesh, mcfg: MoEConfig, placement: Placement, cost, ids_fn, Ng: int):
        self.cfg, self.mesh, self.mcfg, self.cost, self.ids_fn, self.Ng = cfg, mesh, mcfg, cost, ids_fn, Ng
        D, E, K = mesh.shape["ep"], mcfg.experts, mcfg.top_k
        self.tokens = cfg.tokens_per_rank * D * Ng
        self.gate = jnp.full((self.tokens, K), 1.0 / K, jnp.float32)
        # The counter lives where the layer returns it (sharded over ep): one program for every step. The physical
        # parameters live sharded over ep too, each rank its own slots.
        self.counter = jax.device_put(jnp.zeros((D, E), jnp.uint32), NamedSharding(mesh, P("ep")))
        self.params = init_params(jax.random.key(cfg.seed), mcfg, placement, mesh=mesh)
        self._jitted = jax.jit(self._forward)
        self._place(placement)
        logical = to_logical(self.params, placement)  # the function every placement computes
        self.reference = jax.jit(lambda x, ids: moe_reference(logical, x, mcfg, routing=(ids, self.gate)))
        self.max_diff, self.last_proposal, self.counts = 0.0, -1, None

    def _forward(self, params, phy2log, log2phy, x, ids, table, counter, key):
        pa = dispatch_tables.PlacementArrays(phy2log, log2phy, "serve")
        return moe_forward(
            params,
            x,
            mesh=self.mesh,
            placement_arrays=pa,
            tables=dispatch_tables.keyed(table, pa),
            config=self.mcfg,
            key=key,
            counter=counter,
            routing=(ids, self.gate),
        )

    def _place(self, placement: Placement) -> None:
        self.placement, self.uniform_w = placement, plan_weights("uniform", placement)
        self.arrays = dispatch_tables.placement_arrays(placement)

    def x_of(self, s: int) -> jax.Array:
        """Step ``s``'s activations ``[T, H]`` (seeded)."""
        return jax.random.normal(jax.random.key(self.cfg.seed * 100_003 + s), (self.tokens, self.cfg.hidden))

    def run(self, s: int, table) -> object:
        """One forward of step ``s``'s batch with ``table`` and the current counter (`MoEOutput`)."""
        pa, ids, key = self.arrays, jnp.asarray(self.ids_fn(s)), jax.random.key(s)
        return self._jitted(self.params, pa.phy2log, pa.log2phy, self.x_of(s), ids, table, self.counter, key)

    def step(self, s: int, controller) -> shared.Step:
        tables, version = controller.latest, controller.version
        t_step = time.perf_counter()
        res = self.run(s, tables.table)
        jax.block_until_ready(res.out)
        step_ms = (time.perf_counter() - t_step) * 1e3
        self.counter = res.counter
        stats = Capture.from_stats(res.stats, self.placement, self.Ng)  # its copy starts; the watcher's thread reads it
        D, E = self.mesh.shape["ep"], self.mcfg.experts
        self.counts = np.asarray(res.stats.replica_counts).sum(-1).reshape(self.Ng, D, E)  # each EP group's own
        cost, counts = self.cost, self.counts
        live = float(cost.gpu_times(np.asarray(res.stats.gpu_activations), np.asarray(res.stats.gpu_tokens)).max())
        uniform = shared.group_makespan(
            lambda c, w=self.uniform_w, p=self.placement: cost.makespan(expected_dispatch(w, c, p)), counts
        )
        if self.cfg.check_every and s % self.cfg.check_every == 0:
            ref = self.reference(self.x_of(s), jnp.asarray(self.ids_fn(s)))
            self.max_diff = max(self.max_diff, float(np.abs(np.asarray(res.out) - np.asarray(ref)).max()))
        return shared.Step(step_ms, version, live, uniform, stats, row=dict(counts=counts, placement=self.placement))

    def price(self, proposal: Placement, s: int) -> dict:
        before, after = (
            shared.group_makespan(
                lambda c, p=p: solve(DispatchProblem(c, p, self.cost), self.cfg.policy).makespan, self.counts
            )
            for p in (self.placement, proposal)
        )
        self.plan = plan_migration(self.placement, proposal)
        verdict = shared.priced(
            before,
            after,
            horizon_steps=s - self.last_proposal,  # the next proposal is expected as many steps later
            move=shared.move_us(self.plan.busiest_rows, slot_bytes(self.params), self.cfg.move_gbps),
            margin=self.cfg.move_margin,
        )
        self.last_proposal = s
        return verdict

    def move(self, proposal: Placement, s: int) -> tuple[dict, Placement]:
        record = self._migrate(self.plan, s)
        self._place(proposal)
        return record, proposal

    def _migrate(self, plan, step: int) -> dict:
        """Move the layer's expert arrays by ``plan`` (`plan_migration`; `migrate`: one all-to-all per array)."""
        params = self.params
        keys = [k for k in EXPERT_KEYS if k in params]
        moved, seconds, compile_s = migrate([params[k] for k in keys], plan, mesh=self.mesh)
        self.params = {**params, **dict(zip(keys, moved, strict=True))}
        per_slot = slot_bytes(self.params)
        return {
            "step": step,
            "moved_slots": plan.moved,
            "bytes_moved": plan.transfers * per_slot,
            "wire_bytes": self.mesh.shape["ep"] ** 2 * plan.block * per_slot,
            "seconds": seconds,
            "compile_seconds": compile_s,
            "next_step_ms": None,
        }

    def line(self, s: int, on: bool, step: shared.Step, m: dict) -> str:
        solve_txt = f"{m['solve_ms']['last']:.1f} ms" if m["solve_ms"]["n"] else "-"
        return (
            f"step {s:4d} [{'on ' if on else 'off'}] {step.ms:7.1f} ms | makespan live {step.live:7.1f} µs vs "
            f"uniform {step.uniform:7.1f} µs | v{step.version} age {m['age_s']:.2f} s | solve {solve_txt} | restarts "
            f"{m['restarts']}{' | FALLBACK' if m['in_fallback'] else ''}"
        )


def _serve_layer(cfg: ServeConfig, *, out_dir, quiet: bool, figure: bool, watch) -> dict:
    say = lambda *a: print(*a, flush=True)  # noqa: E731
    status = (lambda *a: None) if quiet else say
    # Step 1: routing, placement, layer (Ng EP groups of D ranks: each group serves its own tokens).
    mesh, D, Ng, tensor = shared.serving_mesh(cfg)
    E, K, ids_fn, load = _stream(cfg, D * Ng)
    placement = Placement.from_eplb(load, slots_for(E, D, cfg.replication), D, spread_idle=True)
    cost = CostModel.load(cfg.cost_json) if cfg.cost_json else PRESETS[cfg.cost]
    mcfg = MoEConfig(
        hidden=cfg.hidden,
        ffn=cfg.ffn,
        experts=E,
        top_k=K,
        slots_per_rank=placement.slots_per_rank,
        dispatch_mode=cfg.dispatch_mode,
        tensor_axis=tensor,
    )
    layer = _ServedLayer(cfg, mesh=mesh, mcfg=mcfg, placement=placement, cost=cost, ids_fn=ids_fn, Ng=Ng)
    say(
        f"serve: {cfg.routing} routing, E={E}, top-{K}, {layer.tokens} tokens/step on {mesh.size} "
        f"{jax.default_backend()} devices ({dict(mesh.shape)}), "
        f"{placement.num_slots} slots; policy {cfg.policy} in solver_mode {cfg.solver_mode}; "
        + (f"refresh every {cfg.every_steps} steps" if cfg.every_steps else f"refresh every {cfg.period_s:g} s")
    )
    # Step 2: warm-up (compile) for every table shape the loop can meet.
    t0 = time.perf_counter()
    shapes = {1: dispatch_tables.uniform(placement)}
    if "static" in (cfg.policy, cfg.fallback):
        shapes[D] = dispatch_tables.static(placement)  # per-source tables [D, E, R]: another program
    for tab in shapes.values():
        jax.block_until_ready(layer.run(0, tab.table))
    compile_s = time.perf_counter() - t0
    # Step 3: the runtime. The refresher reads the counter the serving loop last stored (a device array).
    ctl, refresher = shared.start(cfg, placement, cost, lambda: host_counter(layer.counter))
    # Step 4: the loop.
    with shared.watcher(cfg, watch, out_dir, cost, say) as watcher:  # closed (the endpoint lingering) last
        refresher.refresh()  # the counter's baseline
        try:
            rows, moves = shared.serve_loop(cfg, layer, ctl, refresher, watcher, status)
        finally:
            metrics, status_text, _ = shared.stop(ctl, refresher)
        # Step 5: off the clock: every step under static / uniform / oracle tables.
        report = _report(
            cfg, rows, cost, metrics, status_text, refresher, compile_s, D, Ng, E, K, layer.placement.num_slots
        )
        report["replacements"] = moves
        report["max_abs_diff_vs_reference"] = layer.max_diff if cfg.check_every else None
        report["watch"] = watcher.summary()
        say(_summary_text(report))
        shared.write_report(report, out_dir, figure=figure, draw=_figure, say=say)
    return report


def _report(cfg, rows, cost, metrics, status, refresher, compile_s, D, Ng, E, K, slots) -> dict:
    per_step = []
    for r in rows:
        counts, placement = r.pop("counts"), r.pop("placement")
        static_w = plan_weights("static", placement)
        static = shared.group_makespan(
            lambda c, w=static_w, p=placement: cost.makespan(expected_dispatch(w, c, p)), counts
        )
        oracle = shared.group_makespan(
            lambda c, p=placement: solve(DispatchProblem(c, p, cost), cfg.policy).makespan, counts
        )
        per_step.append({**r, "static_us": static, "oracle_us": oracle})
    kept = [r for r in per_step if not r["first_after_move"]]  # the first step after a move compiles
    step_ms = np.array([r["step_ms"] for r in kept])
    is_on = np.array([r["on"] for r in kept], dtype=bool)
    times = {"on": shared.step_stats(step_ms[is_on]), "off": shared.step_stats(step_ms[~is_on])}
    if times["on"] and times["off"]:
        times["on_over_off"] = times["on"]["median"] / times["off"]["median"]
    mean = {k: float(np.mean([r[k] for r in per_step])) for k in ("live_us", "uniform_us", "static_us", "oracle_us")}
    publishes = shared.publish_steps(per_step)
    return {
        "config": cfg.acting(),
        "shape": {"D": D, "Ng": Ng, "E": E, "K": K, "slots": slots},
        "compile_s": compile_s,
        "step_ms": times,
        "makespan_mean_us": mean,
        "live_over_uniform": mean["live_us"] / mean["uniform_us"],
        "live_over_oracle": mean["live_us"] / mean["oracle_us"],
        "publish_steps": publishes,
        "metrics": metrics,
        "status": status,
        "refresher": refresher.metrics(),
        "steps": per_step,
    }


def _summary_text(rep: dict) -> str:
    t, m, mk = rep["step_ms"], rep["metrics"], rep["makespan_mean_us"]
    lines = ["", "serve: final report", "  " + rep["status"]]
    if rep.get("max_abs_diff_vs_reference") is not None:
        lines.append(f"  layer output vs the dense reference: max |Δ| = {rep['max_abs_diff_vs_reference']:.2e}")
    if t["on"] and t["off"]:
        lines.append(
            f"  step time, median (p90): worker on {t['on']['median']:.1f} ({t['on']['p90']:.1f}) ms over "
            f"{t['on']['n']} steps, off {t['off']['median']:.1f} ({t['off']['p90']:.1f}) ms over "
            f"{t['off']['n']} steps: on/off = {t['on_over_off']:.3f}"
        )
    elif t["on"]:
        lines.append(f"  step time, median (p90): {t['on']['median']:.1f} ({t['on']['p90']:.1f}) ms")
    lines.append(
        f"  modelled makespan, mean over steps (µs): live {mk['live_us']:.1f}, EPLB-even "
        f"{mk['uniform_us']:.1f}, static {mk['static_us']:.1f}, oracle {mk['oracle_us']:.1f} (live/uniform "
        f"{rep['live_over_uniform']:.3f}, live/oracle {rep['live_over_oracle']:.3f})"
    )
    s = m["solve_ms"]
    if s["n"]:
        lines.append(
            f"  solve (worker clock): p50 {s['p50']:.2f} ms, p95 {s['p95']:.2f} ms, max {s['max']:.2f} ms "
            f"over {s['n']} solves; round trip p50 {m['roundtrip_ms']['p50']:.2f} ms"
        )
    for mv in rep.get("replacements", []):
        lines.append("  " + shared.move_text(mv))
    more = " …" if len(rep["publish_steps"]) > 20 else ""
    lines.append(
        f"  publications at steps {rep['publish_steps'][:20]}{more}; restarts {m['restarts']}, fallbacks "
        f"{m['fallbacks']}, compile {rep['compile_s']:.1f} s"
    )
    return "\n".join(lines)


def _figure(rep: dict, path: Path) -> None:
    steps = rep["steps"]
    fig, ax, bx, s = shared.figure_axes(rep)
    for key, label, style in (
        ("live_us", f"live ({rep['config']['policy']}, worker)", "-"),
        ("uniform_us", "EPLB-even", "--"),
        ("static_us", "static", ":"),
        ("oracle_us", "oracle (solved on the step itself)", "-."),
    ):
        ax.plot(s, [r[key] for r in steps], style, label=label)
    kill = rep["config"]["kill_worker_at"]
    if kill is not None:
        ax.axvline(kill, color="C3", lw=1.5, label="worker killed")
    for i, mv in enumerate(m for m in rep.get("replacements", []) if m["applied"]):
        ax.axvline(mv["step"], color="C4", lw=1.2, ls=":", label="experts re-placed" if i == 0 else None)
    ax.set_ylabel("modelled makespan (µs)")
    ax.legend(fontsize=8, ncol=3)
    shape = rep["shape"]
    ax.set_title(
        f"tempo-jax serve: {rep['config']['routing']} routing, E={shape['E']}, top-{shape['K']}, "
        f"EP{shape['D']}, {rep['config'].get('cost_json') or rep['config'].get('cost')}"
    )
    ms = np.array([r["step_ms"] for r in steps])
    on = np.array([r["on"] for r in steps])
    bx.scatter(s[on], ms[on], s=10, label="worker on")
    bx.scatter(s[~on], ms[~on], s=10, marker="x", label="worker off")
    shared.save_figure(fig, bx, path)
