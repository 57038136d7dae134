"""Expert parallelism in memory (`scripts/bench_ep.py --ep-memory`, or run alone): a real model's MoE layer held
the way the layer holds it — each rank its S slots — against the way it was held before (every rank every expert).

For a preset at its real dimensions (default ``qwen3_30b_a3b``: H 2048, F 768, E 128, top-8, bf16, EP8, 20 slots
per rank), each layout runs in a fresh process, phase after phase: **construct** (the `MoE` module), one **jitted
forward** (128 tokens per device), one **Adam step** (``nnx.Optimizer`` + ``nnx.jit``, state donated). After each
phase the process reports the expert bytes device 0 holds (weights, and Adam's moments after the step; summed over
its addressable shards) and its peak RSS (``ru_maxrss``: all 8 fake devices share this process's memory).

- ``sharded`` (the layer): physical ``[P, ...]`` expert arrays sharded over ``ep``; the moments follow.
- ``replicated`` (before issue 35): logical ``[E, ...]`` arrays replicated on every device, the slots gathered inside
  every forward. Its Adam step is not run when its moments cannot fit this machine: the bytes it would need are
  reported instead (E × slot bytes × (1 + 2 × 4 / itemsize) per device).

Re-placement at the same preset: a placement that moves 10% and 50% of the slots to other ranks; bytes moved and the
in-graph move's time (`tempo_jax.MoE.set_placement`, compile separate), for the weights alone and with Adam's
moments.

    python scripts/bench_ep_memory.py                   # both layouts, all phases, and the re-placements
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402

from solvers import Placement  # noqa: E402
from tempo_jax.layer import make_ep_mesh, moe_forward, to_physical  # noqa: E402
from tempo_jax.layer import tables as dispatch_tables  # noqa: E402
from tempo_jax.layer.module import MoE  # noqa: E402
from tempo_jax.layer.params import EXPERT_KEYS, init_logical_params  # noqa: E402
from tempo_jax.layer.presets import moe_preset  # noqa: E402

GB = 1e9


def _rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GB


def _device0_bytes(arrays) -> int:
    """Bytes of ``arrays`` held on device 0 (its addressable shards)."""
    dev = jax.devices()[0]
    return sum(s.data.nbytes for a in arrays for s in a.addressable_shards if s.device == dev)


def _setup(preset: str, slots: int):
    D = jax.device_count()
    cfg = moe_preset(preset, slots_per_rank=slots, dtype=jnp.bfloat16, dispatch_mode="quota")
    load = np.random.default_rng(0).zipf(1.6, cfg.experts).astype(float)
    placement = Placement.from_eplb(load, D * slots, D, spread_idle=True)
    return cfg, placement, make_ep_mesh(D), D


def child(layout: str, preset: str, slots: int, tokens_per_device: int, ram_gb: float) -> None:
    """Run the phases of one layout (see the module); prints one JSON line per phase."""
    cfg, placement, mesh, D = _setup(preset, slots)
    x = jax.random.normal(jax.random.key(1), (tokens_per_device * D, cfg.hidden), jnp.float32)
    pa, tables = dispatch_tables.placement_arrays(placement), dispatch_tables.uniform(placement)
    slot = 3 * cfg.hidden * cfg.ffn * jnp.dtype(cfg.dtype).itemsize

    def say(phase, **kw):
        print(json.dumps({"layout": layout, "phase": phase, "rss_gb": _rss_gb(), **kw}), flush=True)

    t0 = time.perf_counter()
    if layout == "sharded":
        moe = MoE(cfg, placement, mesh=mesh, rngs=nnx.Rngs(params=0, dispatch=1))
        experts = lambda: [getattr(moe, k).get_value() for k in moe.param_names if k in EXPERT_KEYS]  # noqa: E731
        jax.block_until_ready(nnx.state(moe))
        say("construct", expert_bytes_device0=_device0_bytes(experts()), seconds=time.perf_counter() - t0)
        fwd = nnx.jit(lambda m, x: m(x))
        t0 = time.perf_counter()
        jax.block_until_ready(fwd(moe, x))
        say("forward", expert_bytes_device0=_device0_bytes(experts()), seconds=time.perf_counter() - t0)
        opt = nnx.Optimizer(moe, optax.adam(1e-4), wrt=nnx.Param)

        @nnx.jit(donate_argnums=(0, 1))
        def step(m, o, x):
            loss, grads = nnx.value_and_grad(lambda m: jnp.mean(m(x).astype(jnp.float32) ** 2))(m)
            o.update(m, grads)
            return loss

        t0 = time.perf_counter()
        jax.block_until_ready(step(moe, opt, x))
        moments = [
            v.get_value()
            for _, v in nnx.iter_graph(opt)
            if isinstance(v, nnx.Variable) and v.get_metadata().get("slot_layout") == moe.slot_layout
        ]
        say("adam step", expert_bytes_device0=_device0_bytes(experts() + moments), seconds=time.perf_counter() - t0)
        return
    # replicated: logical arrays on every device, slots gathered in every forward (the layout before issue 35)
    logical = init_logical_params(jax.random.key(0), cfg)
    home = {k: jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()) for k in logical}
    logical = jax.block_until_ready(jax.tree.map(lambda a, s: jax.device_put(a, s), logical, home))
    say(
        "construct",
        expert_bytes_device0=_device0_bytes([logical[k] for k in logical if k in EXPERT_KEYS]),
        seconds=time.perf_counter() - t0,
    )

    @jax.jit
    def fwd(logical, x):
        return moe_forward(
            to_physical(logical, placement), x, mesh=mesh, placement_arrays=pa, tables=tables, config=cfg
        ).out

    t0 = time.perf_counter()
    jax.block_until_ready(fwd(logical, x))
    say(
        "forward",
        expert_bytes_device0=_device0_bytes([logical[k] for k in logical if k in EXPERT_KEYS]),
        seconds=time.perf_counter() - t0,
    )
    need = cfg.experts * slot * (1 + 2 * 4 / jnp.dtype(cfg.dtype).itemsize)  # weights + two float32 moments
    if need * D / GB > 0.8 * ram_gb:
        say(
            "adam step",
            expert_bytes_device0=int(need),
            seconds=None,
            skipped=f"needs {need * D / GB:.0f} GB for {D} devices > {ram_gb:.0f} GB of this machine",
        )


def layouts(preset: str = "qwen3_30b_a3b", slots: int = 20, tokens_per_device: int = 128) -> list[dict]:
    """Both layouts, each phase in a fresh process (`child`); returns one record per (layout, phase)."""
    ram_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GB
    out = []
    for layout in ("replicated", "sharded"):
        cmd = [sys.executable, __file__, "--child", layout, preset, str(slots), str(tokens_per_device), str(ram_gb)]
        r = subprocess.run(cmd, capture_output=True, text=True, check=False)
        recs = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
        if r.returncode != 0:
            recs.append({"layout": layout, "phase": "error", "error": r.stderr[-800:]})
        for rec in recs:
            print(
                f"  {layout:10s} {rec['phase']:9s} device-0 expert bytes "
                f"{rec.get('expert_bytes_device0', 0) / GB:.3f} GB, peak RSS {rec.get('rss_gb', 0):.2f} GB"
                + (f" ({rec['skipped']})" if "skipped" in rec else ""),
                flush=True,
            )
        out += recs
    return out


def _moved(placement: Placement, fraction: float, seed: int) -> Placement:
    """A placement with about ``fraction`` of the slots holding an expert their rank did not hold: slots of two
    ranks swapped pairwise (each swap moves two slots), never an expert onto a rank that already holds it."""
    rng = np.random.default_rng(seed)
    D, S = placement.num_gpus, placement.slots_per_rank
    first = placement.phy2log.reshape(D, S)
    p2l = first.copy()
    target, moved = round(fraction * D * S), 0
    while moved + 2 <= target:
        a, b = rng.choice(D, 2, replace=False)
        i, j = rng.integers(S), rng.integers(S)
        ea, eb = p2l[a, i], p2l[b, j]
        if ea == eb or (p2l[a] == eb).any() or (p2l[b] == ea).any():
            continue
        if p2l[a, i] != first[a, i] or p2l[b, j] != first[b, j]:
            continue  # each slot moves once
        p2l[a, i], p2l[b, j] = eb, ea
        moved += 2
    return Placement.from_phy2log(p2l.reshape(-1), D, num_experts=placement.num_experts)


def replacements(preset: str = "qwen3_30b_a3b", slots: int = 20, fractions=(0.1, 0.5)) -> list[dict]:
    """Bytes moved and time of `MoE.set_placement` at the preset, weights alone and with Adam's moments."""
    cfg, placement, mesh, D = _setup(preset, slots)
    moe = MoE(cfg, placement, mesh=mesh, rngs=nnx.Rngs(params=0, dispatch=1))
    opt = nnx.Optimizer(moe, optax.adam(1e-4), wrt=nnx.Param)
    out, current = [], placement
    for fraction in fractions:
        for with_opt in (False, True):
            new = _moved(current, fraction, seed=int(fraction * 100) + with_opt)
            rep = moe.set_placement(new, optimizer=opt if with_opt else None)
            rec = {"fraction": fraction, "with_adam": with_opt, "slots": D * slots, **rep.as_dict()}
            out.append(rec)
            print(
                f"  re-place {fraction:.0%} of {D * slots} slots{' + Adam moments' if with_opt else ''}: "
                f"{rep.moved_slots} moved, {rep.bytes_moved / GB:.3f} GB ({rep.wire_bytes / GB:.3f} GB padded "
                f"all-to-all buffers) in {rep.seconds * 1e3:.0f} ms (compile {rep.compile_seconds:.2f} s)",
                flush=True,
            )
            current = new
    return out


def run(preset: str = "qwen3_30b_a3b", slots: int = 20) -> dict:
    """Both measurements, each in fresh processes (the re-placements too: this process stays small)."""
    out = {"preset": preset, "slots_per_rank": slots, "layouts": layouts(preset, slots)}
    r = subprocess.run(
        [sys.executable, __file__, "--replacements", preset, str(slots)], capture_output=True, text=True, check=False
    )
    print("\n".join(line for line in r.stdout.splitlines() if line.startswith("  ")), flush=True)
    last = [line for line in r.stdout.splitlines() if line.startswith("[")]
    out["replacements"] = json.loads(last[-1]) if r.returncode == 0 and last else {"error": r.stderr[-800:]}
    return out


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6]))
    elif len(sys.argv) > 1 and sys.argv[1] == "--replacements":
        print(json.dumps(replacements(sys.argv[2], int(sys.argv[3]))))
    else:
        print(json.dumps(run(), indent=1))
