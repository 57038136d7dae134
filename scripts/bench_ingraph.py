"""In-graph dispatch benchmark (issue 38, `make bench-ingraph`): pairwise relief's quality against tempo, and the
layer's cost with the dispatch inside the step against the same layer with fixed tables.

Quality: modelled makespan of ``relief`` (the numpy twin, identical to the in-graph plan), ``token_lp`` (LPLB-style
token balancing) and ``metro`` (activation balancing) over tempo's, on

  issue     `scripts/bench_solver.py`'s issue grid: EP8, E = 256 + 64 redundant slots, Zipf s ∈ {0.6, 1.2, 2.0} ×
            B ∈ {16, …, 4096} tokens per GPU, DSv3 fp8 offline model;
  scale     its scale grid: EP32 / EP64 × E = 256 (top-8) / 384 (top-6) × 1.25× / 1.5× replication, s ∈ {0.6, 1.2}
            × B ∈ {16, 64, 256, 1024, 4096};
  recorded  batches of the recorded traces at their recorded EP (bench_solver's "real" suite);
  optimum   independent instances against the exact optimum (`solve(..., "milp")`, CP-SAT, proved optimal): EP8
            (E = 32 + 16 slots), EP16 (E = 64 + 32) and EP32 (E = 128 + 64), each placement random (a stale one:
            every expert once, the spare slots to random experts, shuffled) or EPLB, routing Zipf s ∈ {0, 1.2, 2.0}
            or one hot expert (in every token's top-8, the other 7 uniform), 2 / 16 (flat) and 256 / 1024 (linear)
            tokens per rank, 5 seeds: relief's (and tempo's) makespan / the optimum.
  copies    dynamic copies (issue 52, `solvers.plan_copies`) against the MILP that chooses copies and splits
            together (`solvers.copies_milp`, SCIP, proved optimal): EP4 (E = 8) and EP8 (E = 16), 3 slots per rank
            (the spare ones to random experts), Zipf(1.4) top-2 routing, 64 / 512 / 4096 tokens per rank, k = 1 or
            2 dynamic slots, DSv3 experts (44 MB in fp8) over NVLink (450 GB/s) or a 50 GB/s link, 4 seeds: the
            plan's and relief's (no copies) makespan / the optimum, copies made.

Cost: `tempo_jax.MoE` under `nnx.jit` on 8 fake CPU devices, ``dispatch="ingraph"`` against the same layer with
fixed (EPLB-even) tables, 128 and 512 tokens per device, E = 64 and 256 (interleaved calls, median ms); the same
in-graph layer with 2 dynamic slots per rank (DSv3 experts over NVLink priced; issue 52) against in-graph relief
alone, with the copies it made on the last call, their bytes (the layer's slots) and the bytes the padded
all-to-all moves (D·k slots per rank); and the dispatch's own FLOPs and bytes per layer
(`jax.jit(...).lower().compile().cost_analysis()` of `relief.plan` at 0 and 1 rounds, scaled to the rounds run,
since XLA counts a loop body once; every rank runs the same plan; the copy plan's likewise), to project its GPU
cost.

Plan (issue 56, item 3; only when named: ``--suites plan``): `relief.plan` alone on one CPU device at E = 64 and
256, 128 and 512 tokens per device, with a budget of 0, 1, 2, 4 and all rounds (median ms), and the rounds relief
runs on that batch: the fixed cost, the first round (with its hand-off path search) and each further round; one
round stage by stage (`round_stages`: cumulative µs per round, and the stuck round's path search); and the plan with
all its rounds on a Zipf mix (`plan_mix`: s ∈ {0.6, 1.2, 2.0} × 128 / 512 tokens per device × 4 batches, each skew
with its EPLB placement) against issue 72's goal, ≤ 1 ms at E 256. Named alone, the plan suite runs in a process
with one CPU device (the plan needs no mesh); named with others, in their 8-fake-device process, which on this
2-core box made the same plan 15-60% slower.

    python scripts/bench_ingraph.py            # everything (~15 min on 2 cores), results/bench_ingraph.json
    python scripts/bench_ingraph.py --quick    # a smoke-sized run
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import platform
import sys
import time
from pathlib import Path


def _plan_only(argv: list[str]) -> bool:
    """Whether the command line names the plan suite alone: it needs no mesh, so its process keeps one CPU device
    (with 8 fake devices in the process, this 2-core box ran the same plan 15-60% slower: docs/results.md)."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--suites", default="")
    return {s for s in pre.parse_known_args(argv)[0].suites.split(",") if s} == {"plan"}


if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    count = 1 if _plan_only(sys.argv[1:]) else 8  # named, so bench_ep's import adds none
    flag = f"--xla_force_host_platform_device_count={count}"
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}".strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402
from tqdm import tqdm  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_ep import median_ms  # noqa: E402
from bench_solver import ISSUE_B, ISSUE_SKEWS, SCALE_B, SCALE_CONFIGS, SCALE_SKEWS, eplb, real_instances  # noqa: E402

import tempo_jax  # noqa: E402
from solvers import PRESETS, CopyCost, DispatchProblem, Placement, copies_milp, plan_copies, slots_for, solve  # noqa: E402
from solvers.relief import replica_ranks  # noqa: E402
from tempo_jax.layer import MoEConfig, copies, init_params, make_ep_mesh, relief  # noqa: E402
from tempo_jax.text import table  # noqa: E402
from tempo_jax.workloads import SyntheticRouting  # noqa: E402

COST = PRESETS["dsv3_fp8_offline"]
COMPARED = ("relief", "token_lp", "metro")
OPTIMUM_CONFIGS = ((8, 32, 16), (16, 64, 32), (32, 128, 64))  # (D, E, spare slots)
OPTIMUM_B = (2, 16, 256, 1024)
OPTIMUM_ROUTINGS = ("s=0", "s=1.2", "s=2", "hot")  # Zipf exponents, and every token to expert 0 + 7 uniform


# ------------------------------------------------------------------------------------------------ quality
def grid(suite: str, args) -> list[tuple[dict, DispatchProblem]]:
    """The instances of one quality suite, keyed."""
    if suite == "recorded":
        ns = argparse.Namespace(real_layers=args.recorded_layers, batches=args.batches)
        return [(k, p) for k, p in real_instances(ns)]
    if suite == "issue":
        cells = [(8, 256, 8, 1.25, s, B) for s in args.issue_skews for B in args.issue_b]
    else:
        cells = [
            (ep, E, K, rep, s, B)
            for ep, E, K, rep in args.scale_configs
            for s in args.scale_skews
            for B in args.scale_b
        ]
    out = []
    for ep, E, K, rep, s, B in cells:
        routing = SyntheticRouting(num_experts=E, top_k=K, s=s, kappa=math.inf, seed=0)
        placement = eplb(routing.popularity, ep, rep)
        for i in range(args.batches):
            key = dict(suite=suite, ep=ep, E=E, rep=rep, s=s, B=B, batch=i)
            out.append((key, DispatchProblem(routing.batch(B, ep, i), placement, COST)))
    return out


def optimum_instances(seeds: int) -> list[tuple[dict, DispatchProblem]]:
    """The ``optimum`` suite's instances (see the module), keyed."""
    out = []
    for (D, E, spare), placed, routed, B, seed in itertools.product(
        OPTIMUM_CONFIGS, ("random", "eplb"), OPTIMUM_ROUTINGS, OPTIMUM_B, range(seeds)
    ):
        rng = np.random.default_rng(seed)
        hot = routed == "hot"
        routing = SyntheticRouting(num_experts=E, top_k=8, s=0.0 if hot else float(routed[2:]), kappa=50.0, seed=seed)
        if hot:  # expert 0 in every token's top-8, the other 7 uniform
            others = np.argsort(rng.random((B * D, E - 1)), axis=1)[:, :7] + 1
            counts = np.zeros((D, E), np.int64)
            np.add.at(counts, (np.repeat(np.arange(D), B)[:, None], others), 1)
            counts[:, 0] += B
            load = counts.sum(axis=0).astype(np.float64)
        else:
            counts, load = routing.batch(B, D, seed), routing.popularity
        if placed == "random":
            phy2log = np.r_[np.arange(E), rng.integers(0, E, spare)]
            rng.shuffle(phy2log)
            placement = Placement.from_phy2log(phy2log, D, None, E)
        else:
            placement = Placement.from_eplb(load, E + spare, D, spread_idle=True)
        key = dict(suite="optimum", ep=D, E=E, placement=placed, routing=routed, B=B, batch=seed)
        out.append((key, DispatchProblem(counts, placement, COST)))
    return out


COPY_CONFIGS = ((4, 8), (8, 16))  # (D, E), 3 slots per rank
COPY_B = (64, 512, 4096)
COPY_LINKS = {"nvlink": 450.0, "50gbps": 50.0}
EXPERT_BYTES = 3 * 7168 * 2048  # one DSv3 expert in fp8: gate, up, down
DYNAMIC_SLOTS = 2  # the cost suite's layer with copies


def copies_instances(seeds: int) -> list[tuple[dict, np.ndarray, np.ndarray, int]]:
    """The copies suite's instances (see the module): (key, n [E], ranks [E, R], D)."""
    out = []
    for (D, E), B, seed in itertools.product(COPY_CONFIGS, COPY_B, range(seeds)):
        rng = np.random.default_rng(seed)
        phy2log = np.r_[np.arange(E), rng.integers(0, E, 3 * D - E)]
        rng.shuffle(phy2log)
        placement = Placement.from_phy2log(phy2log, D, None, E)
        n = np.bincount(np.minimum(rng.zipf(1.4, 2 * B * D) - 1, E - 1), minlength=E).astype(np.float64)
        out.append((dict(suite="copies", ep=D, E=E, B=B, batch=seed), n, replica_ranks(placement.log2phy, 3), D))
    return out


def copies_against_optimum(instances, progress: bool) -> list[dict]:
    """Per instance and (k, link): the copy plan's and relief's makespan over the MILP optimum, copies made."""
    rows = []
    cells = list(itertools.product(instances, (1, 2), COPY_LINKS.items()))
    for (key, n, ranks, D), k, (link, gbps) in tqdm(cells, desc="copies", disable=not progress):
        cc = CopyCost(EXPERT_BYTES, gbps)
        plan = plan_copies(n, ranks, COST, D, k, cc)
        best = copies_milp(n, ranks, COST, D, k, cc, time_limit=120.0)
        if not best["optimal"]:
            raise RuntimeError(f"copies suite: SCIP did not prove {key} k={k} {link} optimal")
        rows.append(
            dict(
                key,
                k=k,
                link=link,
                copy_us=cc.copy_us,
                optimum=best["makespan"],
                optimum_copies=len(best["copies"]),
                plan=plan.makespan,
                relief=plan.makespan_without,
                copies=plan.num_copies,
                plan_over_optimum=plan.makespan / best["makespan"],
                relief_over_optimum=plan.makespan_without / best["makespan"],
            )
        )
    return rows


def copies_summary(rows: list[dict]) -> dict:
    """Per link and batch size: mean / max of the plan's and relief's makespan over the optimum, copies made."""
    out = {}
    for link, B in itertools.product(COPY_LINKS, COPY_B):
        sel = [r for r in rows if r["link"] == link and r["B"] == B]
        plan = np.array([r["plan_over_optimum"] for r in sel])
        rel = np.array([r["relief_over_optimum"] for r in sel])
        out[f"{link}, B={B}"] = dict(
            n=len(sel),
            plan_mean=float(plan.mean()),
            plan_max=float(plan.max()),
            relief_mean=float(rel.mean()),
            relief_max=float(rel.max()),
            copies=int(sum(r["copies"] for r in sel)),
            optimum_copies=int(sum(r["optimum_copies"] for r in sel)),
        )
    return out


def against_optimum(instances, progress: bool) -> list[dict]:
    """relief's and tempo's makespan over the proved optimum (CP-SAT), per instance."""
    rows = []
    for key, problem in tqdm(instances, desc="optimum", disable=not progress):
        best = solve(problem, "milp", time_limit=30.0)
        if best.info.get("status") != "optimal":
            raise RuntimeError(f"optimum suite: CP-SAT did not prove {key} optimal ({best.info.get('status')})")
        row = dict(key, optimum=best.makespan)
        for policy in ("relief", "tempo"):
            d = solve(problem, policy)
            row[policy], row[f"{policy}_over_optimum"] = d.makespan, d.makespan / best.makespan
        rows.append(row)
    return rows


def optimum_summary(rows: list[dict]) -> dict:
    """Per policy and regime (flat: B ≤ 16; linear: the rest): mean, p95, max of makespan / optimum, instances
    above 1.05."""
    out = {}
    for policy in ("relief", "tempo"):
        for regime, pick in (("flat", lambda r: r["B"] <= 16), ("linear", lambda r: r["B"] > 16)):
            r = np.array([row[f"{policy}_over_optimum"] for row in rows if pick(row)])
            if r.size:
                out[f"{policy} {regime}"] = dict(
                    n=int(r.size),
                    mean=float(r.mean()),
                    p95=float(np.percentile(r, 95)),
                    max=float(r.max()),
                    above_1_05=int((r > 1.05).sum()),
                )
    return out


def quality(instances, progress: bool) -> list[dict]:
    rows = []
    for key, problem in tqdm(instances, desc=instances[0][0]["suite"] if instances else "", disable=not progress):
        tempo = solve(problem, "tempo")
        row = dict(key, tempo=tempo.makespan)
        for policy in COMPARED:
            d = solve(problem, policy)
            row[policy] = d.makespan
            row[f"{policy}_ms"] = 1e3 * d.info["solve_time_s"]
        rows.append(row)
    return rows


def summary(rows: list[dict]) -> dict:
    """Per compared policy: its makespan / tempo's, mean, p95, max (and how often it is within 1.001×)."""
    out = {}
    for p in COMPARED:
        r = np.array([row[p] / row["tempo"] for row in rows])
        out[p] = dict(
            n=len(r),
            mean=float(r.mean()),
            p95=float(np.percentile(r, 95)),
            max=float(r.max()),
            at_tempo=float(np.mean(r <= 1.001)),
        )
    return out


# ------------------------------------------------------------------------------------------------ cost
def cost(experts: int, tokens: int, repeats: int, rounds: int, with_copies: bool = True) -> dict:
    """The layer with in-graph dispatch against fixed tables, at ``tokens`` per device (8 devices, EP8); with
    ``with_copies`` (the copies suite asked for too) also with dynamic copies, and the copy plan's work."""
    D, H, F, K = 8, 256, 128, 8
    S = slots_for(experts, D, 1.25) // D
    mesh = make_ep_mesh(D)
    routing = SyntheticRouting(num_experts=experts, top_k=K, s=1.2, kappa=math.inf, seed=0)
    pl = Placement.from_eplb(routing.popularity, D * S, D, spread_idle=True)
    base = MoEConfig(hidden=H, ffn=F, experts=experts, top_k=K, slots_per_rank=S, dispatch_mode="quota")
    fresh = dataclasses.replace(base, dispatch="ingraph", cost=COST, dispatch_rounds=rounds)
    copy_cost = CopyCost(EXPERT_BYTES, COPY_LINKS["nvlink"])
    dyn = dataclasses.replace(fresh, dynamic_slots=DYNAMIC_SLOTS, copy_cost=copy_cost)
    params = init_params(jax.random.key(0), base, pl, mesh=mesh)
    rng = np.random.default_rng(tokens)
    x = jax.random.normal(jax.random.key(tokens), (tokens * D, H)) + jnp.asarray(rng.normal(size=(1, H)))
    layers = {
        name: tempo_jax.MoE(cfg, pl, mesh=mesh, rngs=nnx.Rngs(0), params=params)
        for name, cfg in (("fixed tables", base), ("in-graph", fresh), ("copies", dyn))
        if with_copies or name != "copies"
    }
    step = nnx.jit(lambda m, x: m(x))
    fns = {name: (lambda m=m: step(m, x)) for name, m in layers.items()}
    for f in fns.values():  # compile, then one warm call
        jax.block_until_ready(f())
        jax.block_until_ready(f())
    ms = median_ms(fns, repeats)
    # The dispatch's own work (every rank runs the same plan on the all-gathered [D, E] counts).
    counts = jnp.asarray(routing.batch(tokens * D, D, 0), jnp.int32)
    log2phy = jnp.asarray(pl.log2phy)

    def analysis(r: int) -> dict:
        f = jax.jit(lambda c, l2p: relief.plan(c, l2p, slots_per_rank=S, num_ranks=D, cost=COST, rounds=r))
        ca = f.lower(counts, log2phy).compile().cost_analysis()
        ca = ca[0] if isinstance(ca, list | tuple) else ca
        return {k: float(ca.get(k, math.nan)) for k in ("flops", "bytes accessed")}

    # XLA's cost analysis counts a loop body once: the plan's work is at most (no rounds) + rounds × (one round)
    # (the rounds stop early once no move is accepted).
    once, none = analysis(1), analysis(0)
    work = {k: none[k] + rounds * (once[k] - none[k]) for k in once}
    plan = jax.jit(lambda c, l2p: relief.plan(c, l2p, slots_per_rank=S, num_ranks=D, cost=COST, rounds=rounds))
    jax.block_until_ready(plan(counts, log2phy))
    plan_ms = median_ms({"plan": lambda: plan(counts, log2phy)}, repeats)["plan"]
    row = dict(
        experts=experts,
        slots_per_rank=S,
        tokens_per_device=tokens,
        rounds=rounds,
        fixed_ms=ms["fixed tables"],
        ingraph_ms=ms["in-graph"],
        ratio=ms["in-graph"] / ms["fixed tables"],
        plan_ms_cpu=plan_ms,
        plan_flops=work["flops"],
        plan_bytes=work["bytes accessed"],
        round_flops=once["flops"] - none["flops"],
        round_bytes=once["bytes accessed"] - none["bytes accessed"],
        move_candidates=_move_candidates(pl, D, S),
    )
    if with_copies:
        # The copy plan's work: relief's, plus at most (rounds + D·k) copy rounds, each what a plan with copies at one
        # round costs beyond relief at one round (an upper bound: it counts step 3 once per round).
        ranks = relief.replica_ranks(log2phy, S)
        n = jnp.sum(counts, axis=0)

        def copy_analysis() -> dict:
            f = jax.jit(lambda n, r: copies.plan_copies(n, r, COST, D, DYNAMIC_SLOTS, copy_cost, 1, num_slots=D * S))
            ca = f.lower(n, ranks).compile().cost_analysis()
            ca = ca[0] if isinstance(ca, list | tuple) else ca
            return {k: float(ca.get(k, math.nan)) for k in ("flops", "bytes accessed")}

        extra = {k: v - once[k] for k, v in copy_analysis().items()}
        copy_work = {k: work[k] + (rounds + D * DYNAMIC_SLOTS) * extra[k] for k in work}
        made = layers["copies"].stats.get_value().copies  # the last call's copies per rank
        slot_bytes = sum(int(np.prod(w.shape[1:])) * w.dtype.itemsize for k, w in params.items() if k != "router")
        row.update(
            dynamic_slots=DYNAMIC_SLOTS,
            copies_ms=ms["copies"],
            copies_ratio=ms["copies"] / ms["in-graph"],
            copies_made=int(np.sum(made)),
            copied_bytes=int(np.sum(made)) * slot_bytes,
            moved_bytes=D * D * DYNAMIC_SLOTS * slot_bytes,
            copy_plan_flops=copy_work["flops"],
            copy_plan_bytes=copy_work["bytes accessed"],
        )
    print(
        f"  E={experts} B={tokens}/device: fixed {row['fixed_ms']:.1f} ms, in-graph {row['ingraph_ms']:.1f} ms "
        f"({row['ratio']:.2f}×); plan alone {plan_ms:.1f} ms, {row['plan_flops'] / 1e6:.1f} MFLOP, "
        f"{row['plan_bytes'] / 1e6:.1f} MB"
        + (
            f"; copies k={DYNAMIC_SLOTS} {row['copies_ms']:.1f} ms ({row['copies_ratio']:.2f}× in-graph), "
            f"{row['copies_made']} copies"
            if with_copies
            else ""
        ),
        flush=True,
    )
    return row


def _move_candidates(pl: Placement, D: int, S: int) -> int:
    """K = D·W, the static number of candidate moves relief prices each round (`relief.Rows`) for this placement's
    shapes."""
    ranks = relief.replica_ranks(jnp.asarray(pl.log2phy), S, D)
    return int(relief.move_rows(ranks, relief.columns(ranks, D, D * S), D * S).a.size)


def plan_rounds(experts: int, tokens: int, repeats: int) -> dict:
    """`relief.plan` alone on one CPU device at several round budgets, and the rounds relief runs (`cost`'s batch)."""
    D = 8
    S = slots_for(experts, D, 1.25) // D
    routing = SyntheticRouting(num_experts=experts, top_k=8, s=1.2, kappa=math.inf, seed=0)
    pl = Placement.from_eplb(routing.popularity, D * S, D, spread_idle=True)
    counts = jnp.asarray(routing.batch(tokens * D, D, 0), jnp.int32)
    log2phy = jnp.asarray(pl.log2phy)
    ranks = relief.replica_ranks(log2phy, S)
    n = jnp.sum(counts, axis=0)
    fns = {}
    for budget in (0, 1, 2, 4, relief.ROUNDS):
        f = jax.jit(
            lambda c, l, b=budget: relief.plan(
                c, l, slots_per_rank=S, num_ranks=D, cost=COST, rounds=b, with_rounds=True
            )
        )
        ran = f(counts, log2phy)[2]  # compiles; with the full budget, the rounds relief runs on this batch
        fns[budget] = lambda f=f: f(counts, log2phy)
    ms = median_ms(fns, max(repeats, 30))
    stages = round_stages(n, ranks, D, S, max(repeats, 30))
    return dict(experts=experts, tokens_per_device=tokens, rounds_run=int(ran), ms_by_budget=ms, round_us=stages)


#: The plan suite's Zipf mix: routing skews, tokens per device and batches of each.
MIX_SKEWS, MIX_TOKENS, MIX_BATCHES = (0.6, 1.2, 2.0), (128, 512), 4
#: Issue 72's goal for the plan on CPU (E 256 + 64 slots, EP8), ms.
PLAN_GOAL_MS = 1.0


def plan_mix(experts: int, repeats: int, skews=MIX_SKEWS, tokens=MIX_TOKENS, batches: int = MIX_BATCHES) -> list[dict]:
    """`relief.plan` with its full round budget on a Zipf mix at ``experts`` E (EP8, 1.25× slots, each skew's EPLB
    placement): one row per (skew, tokens per device, batch) with the rounds relief ran and the median ms of
    ``repeats`` calls (all of a skew's batches interleaved)."""
    return [row for s in skews for row in _mix_skew(experts, s, tokens, batches, repeats)]


def _mix_skew(experts: int, s: float, tokens, batches: int, repeats: int) -> list[dict]:
    """`plan_mix`'s rows of one skew ``s``."""
    D = 8
    S = slots_for(experts, D, 1.25) // D
    routing = SyntheticRouting(num_experts=experts, top_k=8, s=s, kappa=math.inf, seed=0)
    log2phy = jnp.asarray(Placement.from_eplb(routing.popularity, D * S, D, spread_idle=True).log2phy)
    f = jax.jit(lambda c, l: relief.plan(c, l, slots_per_rank=S, num_ranks=D, cost=COST, with_rounds=True))
    batch = {(b, i): jnp.asarray(routing.batch(b * D, D, i), jnp.int32) for b in tokens for i in range(batches)}
    ran = {k: int(f(c, log2phy)[2]) for k, c in batch.items()}  # compiles once; a warm call each
    ms = median_ms({k: (lambda c=c: f(c, log2phy)) for k, c in batch.items()}, repeats)
    return [dict(skew=s, tokens_per_device=b, batch=i, rounds_run=ran[(b, i)], ms=ms[(b, i)]) for b, i in batch]


def round_stages(n, ranks, D: int, S: int, repeats: int, iterations: int = 64) -> dict:
    """Where one improvement round goes (`relief.round_stages`: its stages cumulatively, and the stuck round's path
    search), each run alone ``iterations`` times in a `fori_loop` on the first round's plans (both starts side by side,
    as in the plan): µs per iteration = (t(iterations) − t(0)) / iterations, medians of ``repeats`` calls."""
    starts, bodies = relief.round_stages(n, ranks, COST, D, num_slots=D * S)
    out = {}
    for name, body in bodies.items():
        ms = {}
        for it in (0, iterations):  # the same x every iteration (0 × a float the stage computed: never folded)
            step = lambda i, x, body=body: x + 0.0 * body(x)  # noqa: E731
            f = jax.jit(lambda x, it=it, step=step: jax.lax.fori_loop(0, it, step, x))
            jax.block_until_ready(f(starts))
            ms[it] = median_ms({"f": lambda f=f: f(starts)}, repeats)["f"]
        out[name] = (ms[iterations] - ms[0]) / iterations * 1e3
    return out


# ------------------------------------------------------------------------------------------------ main
#: The suites that compare policies' modelled makespans with tempo's (`grid` → `quality`).
QUALITY_SUITES = ("issue", "scale", "recorded")
#: Every suite `--suites` takes.
SUITES = (*QUALITY_SUITES, "optimum", "copies", "cost", "plan")


def _parse(argv) -> tuple[argparse.Namespace, list[str], list[tuple[int, int]]]:
    """The command line: the arguments (with the quality grids, ``--quick``'s overrides applied), the suites named,
    and the cost and plan suites' (experts, tokens per device) cells."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a smoke-sized run")
    ap.add_argument(
        "--suites",
        default="issue,scale,recorded,optimum,copies,cost",
        help=f"comma-separated, of: {','.join(SUITES)} (plan only when named)",
    )
    ap.add_argument("--optimum-seeds", type=int, default=5, help="seeds per optimum-suite cell")
    ap.add_argument("--copies-seeds", type=int, default=4, help="seeds per copies-suite cell")
    ap.add_argument("--batches", type=int, default=2, help="batches per grid cell")
    ap.add_argument("--recorded-layers", type=int, default=2, help="layers per recorded trace")
    ap.add_argument("--repeats", type=int, default=15, help="timed calls per layer variant")
    ap.add_argument("--rounds", type=int, default=relief.ROUNDS, help="relief rounds in the layer")
    ap.add_argument("--out", default="results/bench_ingraph.json")
    args = ap.parse_args(argv)
    suites = list(dict.fromkeys(s for s in args.suites.split(",") if s))  # each once, in the order named
    unknown = set(suites) - set(SUITES)
    if unknown:
        ap.error(f"--suites: unknown {sorted(unknown)}; valid: {', '.join(SUITES)}")
    args.issue_skews, args.issue_b = ISSUE_SKEWS, ISSUE_B
    args.scale_configs, args.scale_skews, args.scale_b = SCALE_CONFIGS, SCALE_SKEWS, SCALE_B
    cost_cells = [(e, b) for e in (64, 256) for b in (128, 512)]
    args.plan_mix = dict(skews=MIX_SKEWS, tokens=MIX_TOKENS, batches=MIX_BATCHES)
    if args.quick:
        args.issue_skews, args.issue_b, args.batches, args.recorded_layers = (1.2,), (64, 1024), 1, 1
        args.scale_configs, args.scale_skews, args.scale_b = SCALE_CONFIGS[:1], (1.2,), (256,)
        args.repeats, cost_cells, args.optimum_seeds, args.copies_seeds = 3, [(64, 128)], 1, 1
        args.plan_mix = dict(skews=(1.2,), tokens=(128,), batches=1)
    return args, suites, cost_cells


def _optimum_suite(args) -> dict:
    """The optimum suite: runs it, prints makespan / optimum per policy and regime, returns its JSON entry."""
    rows = against_optimum(optimum_instances(args.optimum_seeds), progress=True)
    summ = optimum_summary(rows)
    cells = [
        [k, v["n"], f"{v['mean']:.4f}", f"{v['p95']:.4f}", f"{v['max']:.4f}", v["above_1_05"]] for k, v in summ.items()
    ]
    print(table(cells, ["policy, regime", "instances", "mean", "p95", "max", "> 1.05×"], "makespan / optimum"))
    return dict(summary=summ, rows=rows, goal=1.05)


def _copies_suite(args) -> dict:
    """The copies suite: runs it, prints the plan's and relief's makespan / the MILP optimum per link and batch size,
    returns its JSON entry."""
    rows = copies_against_optimum(copies_instances(args.copies_seeds), progress=True)
    summ = copies_summary(rows)
    cells = [
        [
            k,
            v["n"],
            f"{v['plan_mean']:.4f}",
            f"{v['plan_max']:.4f}",
            f"{v['relief_mean']:.4f}",
            f"{v['relief_max']:.4f}",
            v["copies"],
            v["optimum_copies"],
        ]
        for k, v in summ.items()
    ]
    heads = ["link, tokens/rank", "n", "plan mean", "plan max", "no-copy mean", "no-copy max", "copies", "MILP's"]
    print(table(cells, heads, "dynamic copies: makespan / the MILP optimum (copies and splits together)"))
    return dict(summary=summ, rows=rows)


def _quality_suite(suite: str, args) -> dict:
    """One quality suite (``grid``'s): runs it, prints each compared policy's makespan / tempo's, returns its JSON
    entry."""
    rows = quality(grid(suite, args), progress=True)
    summ = summary(rows)
    cells = [
        [p, s["n"], f"{s['mean']:.4f}", f"{s['p95']:.4f}", f"{s['max']:.4f}", f"{100 * s['at_tempo']:.0f}%"]
        for p, s in summ.items()
    ]
    heads = ["policy", "instances", "mean", "p95", "max", "≤ 1.001×"]
    print(table(cells, heads, f"{suite}: modelled makespan / tempo's"))
    return dict(summary=summ, rows=rows)


def _plan_suite(args, cost_cells: list[tuple[int, int]]) -> dict:
    """The plan suite (`plan_rounds` per cell): runs it, prints the plan's time per round budget and one round stage
    by stage, returns its JSON entry."""
    rows = [plan_rounds(e, b, args.repeats) for e, b in cost_cells]
    budgets = list(rows[0]["ms_by_budget"])
    print(
        table(
            [
                [
                    r["experts"],
                    r["tokens_per_device"],
                    r["rounds_run"],
                    *(f"{v:.2f}" for v in r["ms_by_budget"].values()),
                ]
                for r in rows
            ],
            ["E", "tokens/device", "rounds run", *[f"ms, ≤ {b} rounds" for b in budgets]],
            f"the in-graph plan alone, {len(jax.devices())} CPU device(s) in the process (median)",
        )
    )
    stage_names = list(rows[0]["round_us"])
    print(
        table(
            [[r["experts"], r["tokens_per_device"], *(f"{v:.0f}" for v in r["round_us"].values())] for r in rows],
            ["E", "tokens/device", *stage_names],
            "one improvement round, stage by stage (cumulative µs per round, both starts; median)",
        )
    )
    mix = {e: plan_mix(e, max(args.repeats, 30), **args.plan_mix) for e in sorted({e for e, _ in cost_cells})}
    summary = {}
    for e, mrows in mix.items():
        ms = np.array([r["ms"] for r in mrows])
        rounds = [r["rounds_run"] for r in mrows]
        summary[e] = dict(
            batches=len(mrows),
            median_ms=float(np.median(ms)),
            max_ms=float(ms.max()),
            within_goal=float(np.mean(ms <= PLAN_GOAL_MS)),
            rounds=[min(rounds), max(rounds)],
        )
    print(
        table(
            [
                [
                    e,
                    v["batches"],
                    f"{v['rounds'][0]}-{v['rounds'][1]}",
                    f"{v['median_ms']:.2f}",
                    f"{v['max_ms']:.2f}",
                    f"{100 * v['within_goal']:.0f}%",
                ]
                for e, v in summary.items()
            ],
            ["E", "batches", "rounds run", "median ms", "max ms", f"≤ {PLAN_GOAL_MS:g} ms"],
            f"the plan on a Zipf mix (s {', '.join(map(str, args.plan_mix['skews']))} × "
            f"{', '.join(map(str, args.plan_mix['tokens']))} tokens/device × {args.plan_mix['batches']} batches; "
            f"{len(jax.devices())} CPU device(s) in the process; median of each batch's calls)",
        )
    )
    return dict(rows=rows, mix=mix, mix_summary=summary, goal_ms=PLAN_GOAL_MS, devices=len(jax.devices()))


def _cost_suite(args, cost_cells: list[tuple[int, int]], with_copies: bool) -> dict:
    """The cost suite (`cost` per cell; the layer with dynamic copies too when ``with_copies``): runs it, prints the
    layer's time against fixed tables and the dispatch's work, returns its JSON entry."""
    print("cost: nnx.jit layer, 8 fake CPU devices, in-graph against fixed tables (interleaved, median)")
    rows = [cost(e, b, args.repeats, args.rounds, with_copies) for e, b in cost_cells]
    entry = dict(rows=rows, ratio_max=max(r["ratio"] for r in rows), goal=1.10)
    if with_copies:
        entry.update(copies_ratio_max=max(r["copies_ratio"] for r in rows), copies_goal=1.15)
    cells = [
        [
            r["experts"],
            r["tokens_per_device"],
            f"{r['fixed_ms']:.1f}",
            f"{r['ingraph_ms']:.1f}",
            f"{r['ratio']:.2f}×",
            f"{r['plan_flops'] / 1e6:.1f}",
            f"{r['plan_bytes'] / 1e6:.1f}",
            r["move_candidates"],
        ]
        + (
            [
                f"{r['copies_ms']:.1f}",
                f"{r['copies_ratio']:.2f}×",
                r["copies_made"],
                f"{r['copied_bytes'] / 1e6:.2f} / {r['moved_bytes'] / 1e6:.1f}",
                f"{r['copy_plan_flops'] / 1e6:.1f} / {r['copy_plan_bytes'] / 1e6:.1f}",
            ]
            if with_copies
            else []
        )
        for r in rows
    ]
    heads = [
        "E",
        "tokens/device",
        "fixed ms",
        "in-graph ms",
        "ratio (goal ≤ 1.10×)",
        "plan MFLOP (≤)",
        "plan MB (≤)",
        "K moves",
    ]
    if with_copies:
        heads += [
            f"copies (k={DYNAMIC_SLOTS}) ms",
            "/ in-graph (goal ≤ 1.15×)",
            "copies made",
            "MB copied / moved",
            "copy plan MFLOP / MB (≤)",
        ]
    print(table(cells, heads, "cost of the in-graph dispatch"))
    return entry


def main(argv=None) -> int:
    args, suites, cost_cells = _parse(argv)
    t0 = time.time()
    results: dict = dict(
        machine=dict(platform=platform.platform(), cpus=os.cpu_count(), jax=jax.__version__, loadavg=os.getloadavg()),
        args=vars(args) | {"scale_configs": None},
        suites={},
    )
    # In this order: optimum, copies, the quality suites in the order named, plan, cost.
    if "optimum" in suites:
        results["suites"]["optimum"] = _optimum_suite(args)
    if "copies" in suites:
        results["suites"]["copies"] = _copies_suite(args)
    for suite in [s for s in suites if s in QUALITY_SUITES]:
        results["suites"][suite] = _quality_suite(suite, args)
    if "plan" in suites:
        results["suites"]["plan"] = _plan_suite(args, cost_cells)
    if "cost" in suites:
        # the layer with dynamic copies belongs to the copies suite's subject
        results["suites"]["cost"] = _cost_suite(args, cost_cells, with_copies="copies" in suites)
    results["wall_s"] = time.time() - t0
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1, default=float))
    print(f"\nwrote {out} in {results['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
