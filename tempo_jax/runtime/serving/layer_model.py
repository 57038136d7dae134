"""`tempo-jax serve --model layer`: the bare expert-parallel layer served with live dispatch tables (`serve_layer`;
the tiny LM is `lm_model`, the loop around both `loop`).

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

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from solvers import PRESETS, CostModel, DispatchProblem, Placement, expected_dispatch, plan_weights, slots_for, solve

from ...layer import MoEConfig, init_params, moe_forward, moe_reference, plan_migration, to_logical
from ...layer import tables as dispatch_tables
from ...layer.params import EXPERT_KEYS, slot_bytes
from ...layer.replicas import migrate
from ...metrics import Capture
from ...workloads import RoutingStream, drifting_stream, recorded_stream
from ..counters import host_counter
from ..serve_config import ServeConfig
from . import loop, pricing
from . import report as reporting

__all__ = ["serve_layer"]


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


class _ServedLayer:
    """The bare layer as `loop.serve_loop` serves it (`loop.Served`): ``step`` runs one jitted
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

    def step(self, s: int, controller) -> loop.Step:
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
        uniform = pricing.group_makespan(
            lambda c, w=self.uniform_w, p=self.placement: cost.makespan(expected_dispatch(w, c, p)), counts
        )
        if self.cfg.check_every and s % self.cfg.check_every == 0:
            ref = self.reference(self.x_of(s), jnp.asarray(self.ids_fn(s)))
            self.max_diff = max(self.max_diff, float(np.abs(np.asarray(res.out) - np.asarray(ref)).max()))
        return loop.Step(step_ms, version, live, uniform, stats, row=dict(counts=counts, placement=self.placement))

    def price(self, proposal: Placement, s: int) -> dict:
        before, after = (
            pricing.group_makespan(
                lambda c, p=p: solve(DispatchProblem(c, p, self.cost), self.cfg.policy).makespan, self.counts
            )
            for p in (self.placement, proposal)
        )
        self.plan = plan_migration(self.placement, proposal)
        verdict = pricing.priced(
            before,
            after,
            horizon_steps=s - self.last_proposal,  # the next proposal is expected as many steps later
            move=pricing.move_us(self.plan.busiest_rows, slot_bytes(self.params), self.cfg.move_gbps),
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

    def line(self, s: int, on: bool, step: loop.Step, m: dict) -> str:
        solve_txt = f"{m['solve_ms']['last']:.1f} ms" if m["solve_ms"]["n"] else "-"
        return (
            f"step {s:4d} [{'on ' if on else 'off'}] {step.ms:7.1f} ms | makespan live {step.live:7.1f} µs vs "
            f"uniform {step.uniform:7.1f} µs | v{step.version} age {m['age_s']:.2f} s | solve {solve_txt} | restarts "
            f"{m['restarts']}{' | FALLBACK' if m['in_fallback'] else ''}"
        )


def serve_layer(cfg: ServeConfig, *, out_dir, quiet: bool, figure: bool, watch) -> dict:
    say = lambda *a: print(*a, flush=True)  # noqa: E731
    status = (lambda *a: None) if quiet else say
    # Step 1: routing, placement, layer (Ng EP groups of D ranks: each group serves its own tokens).
    mesh, D, Ng, tensor = loop.serving_mesh(cfg)
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
    ctl, refresher = loop.start(cfg, placement, cost, lambda: host_counter(layer.counter))
    # Step 4: the loop.
    with loop.watcher(cfg, watch, out_dir, cost, say) as watcher:  # closed (the endpoint lingering) last
        refresher.refresh()  # the counter's baseline
        try:
            rows, moves = loop.serve_loop(cfg, layer, ctl, refresher, watcher, status)
        finally:
            metrics, status_text, _ = loop.stop(ctl, refresher)
        # Step 5: off the clock: every step under static / uniform / oracle tables.
        report = reporting.layer_report(
            cfg, rows, cost, metrics, status_text, refresher, compile_s, D, Ng, E, K, layer.placement.num_slots
        )
        report["replacements"] = moves
        report["max_abs_diff_vs_reference"] = layer.max_diff if cfg.check_every else None
        report["watch"] = watcher.summary()
        say(reporting.layer_summary(report))
        reporting.write_report(report, out_dir, figure=figure, draw=reporting.layer_figure, say=say)
    return report
