"""One metrics record per MoE layer per step, read from the layer's own state with asynchronous host copies.

`capture(model)` starts a device → host copy (``jax.Array.copy_to_host_async``) of every MoE layer's last-call
statistics and returns at once; `Capture.layers()` turns them into numpy a step later, when the copies have long
landed, so watching a model adds no blocking device sync to a step. `layer_record` turns one layer's arrays into
the numbers the sinks publish (`tempo_jax.metrics.specs.METRICS`).

Shapes use the house letters (docs/architecture.md); n = Ng·D is the number of devices of the layer.

Definitions (docs/runtime.md, "Watching it"):

- tokens of a rank: the rows its experts computed (N_g, token–expert pairs: a token routed to K experts counts K
  times); activated experts of a rank: its experts with pairs (G_g; two slots of one expert on it are one group).
- balancedness (vllm #39178's definition): per layer, mean over ranks / max over ranks, of the tokens (``tokens``)
  and of the cost model's time t_g = max(a + b·G_g, c + β·N_g) (``time``); 1 is perfectly even, 1/n is one rank
  doing everything; 1 when no rank has work.
- modelled makespan (µs): ``live`` = max_g t_g of the load the layer realised with the tables in force;
  ``eplb_even`` = the same counts under EPLB-even tables (each expert's pairs split evenly over its replicas);
  ``optimum`` = the policy solved on this step's own counts (what no online system has), when computed. With Ng
  EP groups each group dispatches its own tokens: a makespan is the slowest group's.
"""

from __future__ import annotations

import dataclasses
import functools
import weakref

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from solvers import CostModel, DispatchProblem, Placement, solve

from ..layer.module import MoE
from ..layer.moe import ShardStats
from .specs import METRICS, REDUCTIONS

__all__ = ["STAT_NAMES", "Capture", "balancedness", "capture", "eplb_share", "layer_record", "moe_layers"]

#: The per-device statistics of a layer's last call that a record reads: the fields of the layer's
#: ``moe.stats`` (`tempo_jax.layer.moe.ShardStats`: each ``[n]`` but ``shard_counts [n, E]``; a stack of layers built
#: with ``nnx.vmap`` adds a leading ``[L]``).
STAT_NAMES = ShardStats._fields


def moe_layers(model) -> list[MoE]:
    """Every `tempo_jax.MoE` inside ``model`` (an nnx module, a MoE itself, or a list of MoE layers), in graph
    order."""
    if isinstance(model, MoE):
        return [model]
    if isinstance(model, list | tuple) and model and all(isinstance(m, MoE) for m in model):
        return list(model)
    found = [node for _, node in nnx.iter_graph(model) if isinstance(node, MoE)]
    if not found:
        raise ValueError(
            f"tempo_jax.metrics: {type(model).__name__} holds no tempo_jax.MoE layer; pass the model whose MoE "
            "layers you want to watch (or a MoE)"
        )
    return found


_PLACEMENTS: dict = {}  # (phy2log bytes, D, E) → Placement: the last few layouts seen
_SHAPES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # MoE → (D, E)


def _placement(phy2log: np.ndarray, D: int, E: int) -> Placement:
    """The placement of a layer's host ``phy2log [P]`` (cached: a layout changes only on re-placement)."""
    key = (phy2log.tobytes(), D, E)
    if key not in _PLACEMENTS:
        if len(_PLACEMENTS) >= 256:
            _PLACEMENTS.clear()
        _PLACEMENTS[key] = Placement.from_phy2log(phy2log, D, None, E)
    return _PLACEMENTS[key]


@dataclasses.dataclass
class Capture:
    """The statistics of every MoE layer after one step, on their way to the host (`capture`)."""

    arrays: list[dict] | _Packed  # per module: name → array (`STAT_NAMES` and "phy2log"), or `_start_copies`' form
    shapes: list[tuple[int, int]]  # per module: (D, E)
    groups: list[int]  # per module: Ng
    stacked: list[bool]  # per module: a stack of layers (a leading [L] on every array)
    host: list[dict] | None = None  # per module: arrays already on the host, joined to ``arrays`` when read

    @classmethod
    def from_stats(cls, stats, placement: Placement, groups: int = 1) -> Capture:
        """The capture of one functional layer call: ``stats`` = `tempo_jax.layer.MoEStats` of `moe_forward`
        over ``placement`` with ``groups`` EP groups (host copies started)."""
        got = _start_copies([ShardStats.of(stats)._asdict()])
        shape = (placement.num_gpus, placement.num_experts)
        return cls(got, [shape], [int(groups)], [False], host=[{"phy2log": np.asarray(placement.phy2log)}])

    def layers(self) -> list[dict]:
        """Per layer (modules in order, a stacked module's layers in order): ``{name: np.ndarray}`` of
        `STAT_NAMES` (``shard_counts [n, E]``, the others ``[n]``), ``placement`` and ``groups`` (Ng)."""
        out = []
        modules = [{**m, **h} for m, h in zip(_host(self.arrays), self.host or [{}] * len(self.shapes), strict=True)]
        for arrays, (D, E), ng, stacked in zip(modules, self.shapes, self.groups, self.stacked, strict=True):
            host = {k: np.asarray(v) for k, v in arrays.items()}
            for one in [{k: v[i] for k, v in host.items()} for i in range(len(host["phy2log"]))] if stacked else [host]:
                phy2log = one.pop("phy2log")
                out.append({**one, "placement": _placement(phy2log, D, E), "groups": ng})
        return out


@jax.jit
def _own(arrays):
    """``arrays`` (a pytree) in fresh buffers, each kept where it is (elementwise: no collective, no resharding), so
    a step that donates the layer's state (``nnx.jit(donate_argnums=…)``) cannot delete what a capture still has to
    read. An op, not an identity: jit would hand an input back as its output."""
    return jax.tree.map(lambda a: a + jnp.zeros((), a.dtype), arrays)


@functools.lru_cache(maxsize=32)
def _packer(mesh, specs: tuple):
    """A jitted `shard_map` that concatenates each device's local blocks of its arguments (``specs``: their
    partition specs on ``mesh``) into one int32 vector per device: no collective, one array for the host to read."""

    def body(*xs):
        return jnp.concatenate([jnp.ravel(x).astype(jnp.int32) for x in xs])

    out = P(tuple(mesh.axis_names))  # device blocks in mesh.devices' row-major order
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=out, check_vma=False))


@functools.lru_cache(maxsize=64)
def _layout(shapes: tuple, shardings: tuple) -> tuple:
    """Per leaf ``(shape, dtype, [index of its local block on each device, in mesh order], local shape, size)``."""
    mesh = shardings[0].mesh
    out = []
    for (shape, dtype), sharding in zip(shapes, shardings, strict=True):
        where = sharding.devices_indices_map(shape)
        index = [where[d] for d in mesh.devices.flat]
        local = tuple(len(range(*sl.indices(n))) for sl, n in zip(index[0], shape, strict=True))
        out.append((shape, dtype, index, local, int(np.prod(local))))
    return tuple(out)


class _Packed:
    """Every array of a pytree on one mesh as one device array (`_packer`; a buffer of its own, so a donating
    step cannot delete it), its host copy started; `numpy` rebuilds the pytree on the host."""

    def __init__(self, arrays):
        leaves, self.treedef = jax.tree.flatten(arrays)
        shardings = tuple(leaf.sharding for leaf in leaves)
        self.layout = _layout(tuple((leaf.shape, leaf.dtype) for leaf in leaves), shardings)
        self.devices = shardings[0].mesh.devices.size
        self.array = _packer(shardings[0].mesh, tuple(sh.spec for sh in shardings))(*leaves)
        if next(iter(self.array.devices())).platform != "cpu":
            self.array.copy_to_host_async()

    def numpy(self):
        flat = np.asarray(self.array).reshape(self.devices, -1)
        out, start = [], 0
        for shape, dtype, index, local, size in self.layout:
            full = np.empty(shape, dtype)
            for d, ix in enumerate(index):
                full[ix] = flat[d, start : start + size].reshape(local)
            out.append(full)
            start += size
        return jax.tree.unflatten(self.treedef, out)


def _start_copies(arrays):
    """The pytree ``arrays`` on its way to the host in buffers of its own: one `_Packed` array when every leaf is
    sharded over one mesh, else `_own`'s copies (their host copies started; arrays in host memory, as on CPU
    devices, need none). `_host` reads either."""
    leaves = jax.tree.leaves(arrays)
    shardings = [leaf.sharding for leaf in leaves]
    if all(isinstance(sh, NamedSharding) for sh in shardings) and len({sh.mesh for sh in shardings}) == 1:
        return _Packed(arrays)
    owned = _own(arrays)
    for leaf in jax.tree.leaves(owned):
        if next(iter(leaf.devices())).platform != "cpu":
            leaf.copy_to_host_async()
    return owned


def _host(captured):
    """The numpy pytree of what `_start_copies` returned (numpy input passes through)."""
    if isinstance(captured, _Packed):
        return captured.numpy()
    return jax.tree.map(np.asarray, captured)


def capture(model) -> Capture:
    """Start copying every MoE layer's last-call statistics (`STAT_NAMES`) to the host; returns at once.

    Call it right after a step; read `Capture.layers` later (e.g. after the next step, or on another thread): the
    copies then cost the step nothing. ``model``: an nnx module holding `tempo_jax.MoE` layers, one MoE, or a list
    of them (`moe_layers`: walking a model's graph every step costs milliseconds, a list nothing)."""
    layers = moe_layers(model)
    modules = [{**moe.stats.get_value()._asdict(), "phy2log": moe.phy2log.get_value()} for moe in layers]
    out = Capture(_start_copies(modules), [], [], [])
    for moe, got in zip(layers, modules, strict=True):
        tokens = got["gpu_tokens"]
        if moe not in _SHAPES:  # the layer's D and E (static)
            _SHAPES[moe] = (moe.config.ranks_on(moe.mesh), moe.config.experts)
        D, E = _SHAPES[moe]
        out.shapes.append((D, E))
        out.groups.append(tokens.shape[-1] // D)
        out.stacked.append(tokens.ndim > 1)
    return out


def balancedness(v) -> float:
    """mean / max of ``v [n]`` (≥ 0): 1 when even (or all zero), 1/n when one entry holds everything."""
    v = np.asarray(v, dtype=np.float64)
    top = float(v.max(initial=0.0))
    return float(v.mean() / top) if top > 0 else 1.0


def eplb_share(placement: Placement) -> np.ndarray:
    """``[E, D]`` the share of expert e's pairs that EPLB-even tables send to rank d (its replicas on d / all its
    replicas): the loads of EPLB-even tables are ``counts.sum(0)[:, None] · share`` (= `solvers.expected_dispatch`
    of ``plan_weights("uniform", placement)``, without building tables)."""
    E, D = placement.num_experts, placement.num_gpus
    on = np.zeros((E, D))
    np.add.at(on, (placement.phy2log, np.arange(placement.num_slots) // placement.slots_per_rank), 1.0)
    return on / on.sum(1, keepdims=True)


def layer_record(stats: dict, cost: CostModel, *, policy: str | None = None, share=None) -> dict:
    """One layer's metrics from its host statistics (`Capture.layers`' entries).

    Args:
      stats: ``shard_counts [n, E]``, ``gpu_tokens [n]``, ``gpu_activations [n]``, ``drops [n]``, ``rounds [n]``,
        ``invalid_ids [n]``, ``plan_rounds [n]``, ``copies [n]`` (absent: none), ``placement`` and ``groups``
        (Ng; n = Ng·D).
      cost: the cost model of the times and makespans.
      policy: also solve this policy on the step's counts (``makespan_us["optimum"]``; None: not computed).
      share: `eplb_share` of the placement, when the caller keeps it (else computed).

    Returns:
      ``{"tokens" [n], "activated" [n], "expert_tokens" [E], "pairs", "drops", "invalid_ids", "rounds", "plan_rounds",
      "copies" (dynamic copies received, all ranks), "balancedness": {"tokens", "time"}, "makespan_us": {"live",
      "eplb_even", "optimum"}}`` (lists and floats: JSON as it stands).
    """
    placement, ng = stats["placement"], int(stats["groups"])
    counts = np.asarray(stats["shard_counts"], dtype=np.float64)
    toks = np.asarray(stats["gpu_tokens"], dtype=np.float64)
    acts = np.asarray(stats["gpu_activations"], dtype=np.float64)
    times = cost.gpu_times(acts, toks)
    per_group = counts.reshape(ng, -1, counts.shape[-1])  # [Ng, D, E]: each EP group dispatches its own
    share = eplb_share(placement) if share is None else share
    eplb = max(cost.makespan(c.sum(0)[:, None] * share) for c in per_group)
    optimum = None
    if policy is not None:
        optimum = max(solve(DispatchProblem(c, placement, cost), policy).makespan for c in per_group)
    reduced = {  # every entry a metric reduces from one statistic (`METRICS`' sources)
        s.key: REDUCTIONS[s.reduce](np.asarray(stats.get(s.stat, 0)))
        for s in (m.source for m in METRICS if m.source is not None and m.source.stat is not None)
    }
    return {
        **reduced,
        "balancedness": {"tokens": balancedness(toks), "time": balancedness(times)},
        "makespan_us": {"live": float(times.max(initial=0.0)), "eplb_even": float(eplb), "optimum": optimum},
    }
