"""`tempo-jax serve` on the tiny MoE language model: every MoE layer with its own placement, counter and live
tables, one solver worker refreshing all of them (TEMPO §4.4 refreshes every layer each window).

1. The LM (`tempo_jax.lm.model.TinyMoELM`, optionally trained ``train_steps`` steps on the shipped corpus)
   routes a few warm-up batches of real text; each MoE layer gets an EPLB placement from its own expert load
   (``replication`` physical slots per expert).
2. A serving copy with those placements and the same parameters runs jitted **prefill** steps (``[B, L]`` windows
   of the corpus, causal attention) and **decode** steps (``[T, 1]`` tokens through the attention's KV cache): a
   prefill, then ``decode_steps`` decode steps of T sequences begun at random bytes of the corpus and continued
   by sampling the model (temperature 1, seeded; greedy decoding of an untrained model repeats one byte, which
   no serving batch does), over and over. Both serve ``tokens_per_rank`` tokens on each of the D ranks.
3. A layered `DispatchController` (one worker process solving every window per refresh) is fed by a `Refresher`
   that snapshots cumulative counters ``[phases·L, D, E]``: one per (phase, layer), since prefill and decode
   batches route differently (text windows vs one new byte per sequence) and a table tuned to one phase's load
   hurts the other. Before each step its phase's freshest tables go into every layer (``MoE.set_tables``,
   trusted: no copy back to the host).
4. Two timescales: tables every window, and every ``rebalance_every`` windows a new EPLB placement per layer from
   the load the controller accumulated (`DispatchController.proposal`). Each layer moves the weights of exactly
   the slots that change (`tempo_jax.MoE.set_placement`: one in-graph all-to-all) and the controller continues over
   the new placements — only when the move pays for itself: the modelled makespan of the last prefill batch under
   the old and the new placement (the policy solved on both, every layer), gained on each prefill step until the
   next proposal (as many as since the last one), must exceed ``move_margin`` × the layers' modelled move time
   (`pricing.priced`). Each proposal is reported: applied or not, slots and bytes moved, its time (and its
   compile), the makespans, gain and move, and the first step after it (the jitted steps compile again).
5. Off the clock, each step's per-layer modelled makespan under the live tables (the cost model on the per-rank
   load the layer realised) is scored against EPLB-even tables on the same counts.

`refresh_time` measures the worker's time per refresh for a synthetic model of any size (DeepSeek-V3: 58 MoE
layers × 256 experts + 32 redundant, EP8, 128 tokens per rank): it must fit the 200 ms refresh.

Glossary additions: B sequences per step, Q sequence length (a prefill step computes T = B·Q tokens, a decode
step B)."""

from __future__ import annotations

import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from solvers import PRESETS, CostModel, Placement, expected_dispatch, plan_weights, slots_for
from solvers.worker import WorkerConfig, solve_window

from ...layer.params import EXPERT_KEYS
from ...lm import LMConfig, TinyMoELM, corpus, train
from ...workloads import SyntheticRouting
from ..controller import DispatchController
from ..serve_config import ServeConfig
from . import loop, pricing
from . import report as reporting

__all__ = ["refresh_time", "serve_lm"]


def _windows(cfg: ServeConfig, batch: int, seq_len: int, *, chunked: bool = False):
    """Reproducible ``[batch, seq_len]`` int32 windows of the corpus, one array per call: at random places, or
    (``chunked``) the next chunk of each of ``batch`` long prompts read in order (chunked prefill: a batch's
    prompts persist over steps, as in a serving engine; a prompt that runs off the corpus restarts elsewhere)."""
    data = corpus()
    rng = np.random.default_rng([cfg.seed, 7, int(chunked)])
    cursor = rng.integers(0, data.size - seq_len - 1, batch)

    def draw() -> np.ndarray:
        nonlocal cursor
        if not chunked:
            cursor = rng.integers(0, data.size - seq_len - 1, batch)
        out = np.stack([data[c : c + seq_len] for c in cursor]).astype(np.int32)
        if chunked:
            cursor = cursor + seq_len
            done = cursor > data.size - seq_len - 1
            cursor[done] = rng.integers(0, data.size - seq_len - 1, int(done.sum()))
        return out

    return draw


def _layer_loads(model: TinyMoELM, step, draw, batches: int) -> np.ndarray:
    """``[L, E]`` pairs per expert of every MoE layer over ``batches`` warm-up prefill batches."""
    load = np.zeros((len(model.blocks), model.cfg.experts))
    for _ in range(batches):
        step(model, jnp.asarray(draw()))
        load += np.stack([np.asarray(b.moe.expert_load.get_value()) for b in model.blocks])
    return load


def serve_lm(
    cfg: ServeConfig, *, out_dir: str | Path | None = "results", quiet: bool = False, figure: bool = True, watch=None
) -> dict:
    """Serve the tiny MoE LM with live per-layer tables (see the module); returns the report (also
    ``<out_dir>/serve.json``). ``cfg`` is a `tempo_jax.runtime.serve_config.ServeConfig` with ``model="lm"``; ``watch``
    the `tempo_jax.metrics.WatchOptions` of the run's metrics (``<out_dir>/metrics.jsonl`` in any case)."""
    say = lambda *a: print(*a, flush=True)  # noqa: E731
    status = (lambda *a: None) if quiet else say
    mesh, D, Ng, _ = loop.serving_mesh(cfg)  # Ng EP groups (data replicas) of D ranks
    T = cfg.tokens_per_rank * D * Ng
    if T % cfg.seq_len:
        raise ValueError(f"serve: tokens_per_rank × D = {T} is not a multiple of seq_len={cfg.seq_len}")
    lm = LMConfig(
        dim=cfg.hidden,
        layers=cfg.layers,
        ffn=cfg.ffn,
        experts=cfg.experts,
        top_k=cfg.top_k,
        seq_len=cfg.seq_len,
        batch=8,
        dispatch_mode=cfg.dispatch_mode,
        slots_per_rank=-(-cfg.experts // D),
    )
    cost = CostModel.load(cfg.cost_json) if cfg.cost_json else PRESETS[cfg.cost]
    # tree mode: a call returns only the state it changed (counters, statistics), never the weights
    prefill = nnx.jit(lambda m, tokens: m(tokens), graph=False)
    decode = nnx.jit(lambda m, tokens: m(tokens, decode=True), graph=False)
    draw = _windows(cfg, T // cfg.seq_len, cfg.seq_len, chunked=True)
    # Step 1: the LM (trained if asked) and each layer's placement from its own load on warm-up batches.
    t0 = time.perf_counter()
    if cfg.train_steps:
        base = train(lm, steps=cfg.train_steps, seed=cfg.seed, mesh=mesh).model
    else:
        base = TinyMoELM(lm, mesh=mesh, rngs=nnx.Rngs(params=cfg.seed, dispatch=cfg.seed + 1))
    loads = _layer_loads(base, prefill, draw, batches=4)
    slots = slots_for(cfg.experts, D, cfg.replication)
    # Step 2: the serving copy over those placements (another slot count than the trained model's, so built anew):
    # the same weights, the experts laid out from their logical values; later placement changes move them in place.
    placements = [Placement.from_eplb(load + 1e-3, slots, D, spread_idle=True) for load in loads]
    model = TinyMoELM(lm, mesh=mesh, rngs=nnx.Rngs(params=cfg.seed, dispatch=cfg.seed + 1), placements=placements)
    nnx.update(model, nnx.state(base, lambda path, v: isinstance(v, nnx.Param) and path[-1] not in EXPERT_KEYS))
    for block, trained in zip(model.blocks, base.blocks, strict=True):
        block.moe.load_logical(trained.moe.logical_params())
    model.eval()  # serving: no loss work, no aux-free bias updates; the dispatch counters keep counting
    L, B_dec = len(model.blocks), T
    starts = _windows(cfg, B_dec, 1)  # the decode sequences' first bytes, drawn per cycle
    sample = jax.jit(lambda key, logits: jax.random.categorical(key, logits[:, -1]).astype(jnp.int32)[:, None])
    keys = iter(jax.random.split(jax.random.key(cfg.seed + 2), 2 * cfg.decode_steps + 2 * cfg.steps))
    for _ in range(2):  # two warm-up cycles: every (step, input placement) pair the loop meets is compiled
        model.init_cache(B_dec, cfg.decode_steps + 1)
        jax.block_until_ready(prefill(model, jnp.asarray(draw())))
        last = jnp.asarray(starts())
        for _ in range(cfg.decode_steps):
            last = sample(next(keys), decode(model, last))
    jax.block_until_ready(last)
    setup_s = time.perf_counter() - t0
    say(
        f"serve: tiny MoE LM, {L} MoE layers × E={cfg.experts}, top-{cfg.top_k}, {T} tokens/step on {mesh.size} "
        f"{jax.default_backend()} devices ({dict(mesh.shape)}, {slots} slots per layer); prefill "
        f"[{T // cfg.seq_len}, {cfg.seq_len}] "
        f"+ {cfg.decode_steps} decode steps [{B_dec}, 1]; policy {cfg.policy} in solver_mode "
        f"{cfg.solver_mode}"
    )
    # Step 3: the runtime: one controller (one worker) for every (phase, layer): prefill and decode batches route
    # differently (text windows vs one new byte per sequence), so each phase gets its own windows and tables
    # over the layer's one placement. Each step adds its per-source counts to its phase's cumulative counters.
    phases = ("prefill", "decode") if cfg.decode_steps else ("prefill",)
    served = _ServedLM(
        cfg,
        model,
        placements,
        phases,
        cost,
        shape=(Ng, D, B_dec),
        inputs=(draw, starts, keys),
        run=(prefill, decode, sample),
    )
    ctl, refresher = loop.start(cfg, placements * len(phases), cost, lambda: served.counters)
    # Step 4: the loop.
    with loop.watcher(cfg, watch, out_dir, cost, say) as watcher:  # closed (the endpoint lingering) last
        refresher.refresh()  # the counters' baseline
        try:
            rows, moves = loop.serve_loop(cfg, served, ctl, refresher, watcher, status)
        finally:
            metrics, status_text, history = loop.stop(ctl, refresher)
        report = reporting.lm_report(cfg, rows, metrics, status_text, history, refresher, setup_s, D, Ng, L, phases)
        report["replacements"] = moves
        report["watch"] = watcher.summary()
        say(reporting.lm_summary(report))
        reporting.write_report(report, out_dir, figure=figure, draw=reporting.lm_figure, say=say)
    return report


class _ServedLM:
    """The tiny LM as `loop.serve_loop` serves it (`loop.Served`): a prefill, then ``decode_steps``
    decode steps, over and over; before each step its phase's freshest tables go into every layer; its counts join
    the phase's cumulative counters ``[phases·L, D, E]`` (``counters``, what the refresher reads). A proposal is
    priced on the last prefill batch over the prefill steps since the previous one; ``move`` re-places every layer
    (`tempo_jax.MoE.set_placement`)."""

    label = reporting.LAYERS_MEAN

    def __init__(self, cfg: ServeConfig, model, placements, phases, cost, *, shape, inputs, run):
        """``shape``: (Ng EP groups, D ranks, B decode sequences); ``inputs``: the prefill windows', the decode
        sequences' first bytes' and the sampling keys' sources; ``run``: the jitted prefill, decode and sample."""
        self.cfg, self.model, self.phases, self.cost, self.L = cfg, model, phases, cost, len(model.blocks)
        (self.Ng, D, self.B), (self.draw, self.starts, self.keys) = shape, inputs
        self.prefill, self.decode, self.sample = run
        self._place(list(placements))
        self.counters = np.zeros((len(phases) * self.L, D, cfg.experts), np.uint32)  # swapped whole: no torn read
        self.last, self.prefill_counts, self.prefills_since = None, None, 0

    def _place(self, placements: list) -> None:
        self.placements, self.uniform_w = placements, [plan_weights("uniform", p) for p in placements]

    def step(self, s: int, controller) -> loop.Step:
        model, L = self.model, self.L
        kind = "prefill" if s % (self.cfg.decode_steps + 1) == 0 else "decode"
        phase = self.phases.index(kind)
        installed = controller.version  # this phase's freshest tables into every layer (trusted, keyed: no host copy)
        for block, tables in zip(model.blocks, controller.latest[phase * L : (phase + 1) * L], strict=True):
            block.moe.set_tables(tables)
        if kind == "prefill":
            model.init_cache(self.B, self.cfg.decode_steps + 1)
            tokens, self.last = jnp.asarray(self.draw()), jnp.asarray(self.starts())
        else:
            tokens = self.last
        t_step = time.perf_counter()
        logits = (self.prefill if kind == "prefill" else self.decode)(model, tokens)
        jax.block_until_ready(logits)
        step_ms = (time.perf_counter() - t_step) * 1e3
        if kind == "decode":  # each sequence's next byte, sampled
            self.last = self.sample(next(self.keys), logits)
        counts = np.stack([np.asarray(b.moe.counts.get_value()) for b in model.blocks])  # [L, D, E], groups summed
        groups = np.stack(
            [np.asarray(b.moe.stats.get_value().shard_counts).reshape(self.Ng, *counts.shape[1:]) for b in model.blocks]
        )
        new = self.counters.copy()
        new[phase * L : (phase + 1) * L] += counts.astype(np.uint32)  # wraps modulo 2^32 like a device counter
        self.counters = new
        live, uniform = [], []
        for block, placement, uw, c in zip(model.blocks, self.placements, self.uniform_w, groups, strict=True):
            stats = block.moe.stats.get_value()
            acts, toks = np.asarray(stats.gpu_activations), np.asarray(stats.gpu_tokens)
            live.append(float(self.cost.gpu_times(acts, toks).max()))
            uniform.append(
                pricing.group_makespan(lambda g, w=uw, p=placement: self.cost.makespan(expected_dispatch(w, g, p)), c)
            )
        if kind == "prefill":
            self.prefill_counts, self.prefills_since = groups, self.prefills_since + 1
        return loop.Step(step_ms, installed, live, uniform, model, watch=dict(kind=kind), row=dict(kind=kind))

    def price(self, proposal, s: int) -> dict | None:
        if self.prefill_counts is None:  # priced on a prefill batch: none yet
            return None
        L, cfg = self.L, self.cfg
        before, after = (
            pricing.lm_makespan(self.prefill_counts, p, self.cost, cfg.policy) for p in (self.placements, proposal[:L])
        )
        verdict = pricing.priced(
            before,
            after,
            horizon_steps=self.prefills_since,
            move=pricing.lm_move_us(self.model, self.placements, proposal[:L], cfg.move_gbps),
            margin=cfg.move_margin,
            scale=L,  # before / after are means over the L layers
        )
        self.prefills_since = 0
        return verdict

    def move(self, proposal, s: int) -> tuple[dict, tuple]:
        record = _replace(self.model, proposal[: self.L], s)
        self._place(list(proposal[: self.L]))
        return record, tuple(self.placements) * len(self.phases)

    def line(self, s: int, on: bool, step: loop.Step, m: dict) -> str:
        solve = f"{m['solve_ms']['last']:.1f} ms" if m["solve_ms"]["n"] else "-"
        return (
            f"step {s:4d} {step.row['kind']:7s} [{'on ' if on else 'off'}] {step.ms:7.1f} ms | makespan (mean of "
            f"{self.L} layers) live {np.mean(step.live):6.1f} µs vs uniform {np.mean(step.uniform):6.1f} µs | "
            f"v{step.version} age {m['age_s']:.2f} s | refresh {solve}"
        )


def _replace(model, new, step: int) -> dict:
    """Move every layer's experts to the ``new`` placements (`tempo_jax.MoE.set_placement`)."""
    reports = [block.moe.set_placement(p) for block, p in zip(model.blocks, new, strict=True)]
    model.placements = tuple(new)
    return {
        "step": step,
        "moved_slots": sum(r.moved_slots for r in reports),
        "bytes_moved": sum(r.bytes_moved for r in reports),
        "wire_bytes": sum(r.wire_bytes for r in reports),
        "seconds": sum(r.seconds for r in reports),
        "compile_seconds": sum(r.compile_seconds for r in reports),
        "next_step_ms": None,
    }


# ------------------------------------------------------------------------------------------------ refresh time
def refresh_time(
    *,
    layers: int = 58,
    experts: int = 256,
    redundant: int = 32,
    num_ranks: int = 8,
    tokens_per_rank: int = 128,
    top_k: int = 8,
    policy: str = "tempo",
    repeats: int = 10,
    cost: str = "dsv3_fp8_offline",
    solver_mode: str = "process",
    processes: int = 1,
    seed: int = 0,
) -> dict:
    """The worker's time per refresh of a layered controller for a synthetic model: ``layers`` MoE layers of
    ``experts`` experts (+ ``redundant`` replicas, EPLB from each layer's Zipf popularity), ``num_ranks`` ranks,
    one window of ``tokens_per_rank`` tokens per rank per layer, the layers split over ``processes`` solver
    processes. Returns the worker-clock solve times (ms) of ``repeats`` refreshes and the round trips."""
    routings = [
        SyntheticRouting(num_experts=experts, top_k=top_k, s=1.0, kappa=2000.0, seed=seed + layer)
        for layer in range(layers)
    ]
    placements = [Placement.from_eplb(r.popularity, experts + redundant, num_ranks, spread_idle=True) for r in routings]
    windows = [
        np.stack([r.batch(tokens_per_rank, num_ranks, 1000 * rep + 1) for r in routings]) for rep in range(repeats)
    ]
    solve_window(WorkerConfig(tuple(placements), PRESETS[cost], policy), windows[0])  # this process warmed up too
    with DispatchController(
        placements, PRESETS[cost], policy=policy, solver_mode=solver_mode, budget_s=5.0, solver_processes=processes
    ) as ctl:
        for w in windows:
            ctl.observe(w)
            ctl.wait()
        history = list(ctl.history)
    solve = [h["solve_ms"] for h in history]
    return {
        "layers": layers,
        "experts": experts,
        "redundant": redundant,
        "num_ranks": num_ranks,
        "tokens_per_rank": tokens_per_rank,
        "policy": policy,
        "solver_mode": solver_mode,
        "processes": processes,
        "solve_ms": reporting.step_stats(solve),
        "roundtrip_ms": reporting.step_stats([h["roundtrip_ms"] for h in history]),
        "per_layer_ms": float(np.median(solve)) / layers if solve else None,
    }
