"""Ahead-of-time plans: whether a layer fits on a mesh, and what it sends — compiled from shapes, nothing allocated.

    mesh = make_mesh(ep=64)                                   # 64 devices (fake CPU devices will do)
    cfg = moe_preset("deepseek_v3", slots_per_rank=5)         # 256 experts + 64 replicas
    plan = aot_plan(cfg, mesh, tokens_per_rank=4096)
    plan.forward.temp_bytes, plan.train.argument_bytes, plan.analytic.row_buffers, plan.collectives

Steps (`aot_plan`):

1. Shapes: the layer's physical parameters (`tempo_jax.layer.params.param_shapes` with P = D·S slots) and the tokens
   ``x [Ng·D·n, H]`` as `jax.ShapeDtypeStruct`s carrying their shardings (`param_shardings`; tokens over the batch
   axes and ``ep``); the placement's tables are the only concrete arrays (``[E, R]``, small).
2. The forward (``moe_forward(...).out``) and one training step (the gradient of ``mean(out²)`` w.r.t. the
   parameters, then Adam — its two float32 moments per parameter — with parameters and moments donated) lowered
   and compiled for the mesh.
3. Per device, from ``compiled.memory_analysis()``: arguments, outputs, temporaries and the bytes outputs alias
   from donated arguments (`Memory`); the peak a device needs is arguments + outputs − aliased + temporaries.
4. The analytic minimum (`Analytic`): the rank's parameters (its S slots, the replicated router and shared
   experts), Adam's moments (optax's: the first in float32, the second in the parameter's dtype), and the row buffers
   one exchange round must hold: D blocks of C rows (C of ``capacity="auto"``:
   `tempo_jax.layer.config.auto_capacity`) sent and received at H, their gate, up and hidden activations at F (F / Tp
   with a tensor axis) and their expert outputs and return at H — ``D·C·(4H + 3F)`` elements of the layer's dtype.
5. The collectives of each program, per mesh axis, with their bytes per device (`program_collectives`).

Glossary additions: row buffers (step 4), peak (step 3).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from solvers import Placement

from . import tables as dispatch_tables
from .collectives import program_collectives
from .config import MoEConfig, auto_capacity
from .mesh import layer_axes, param_shardings
from .moe import moe_forward
from .params import param_dtype, param_shapes

__all__ = ["AotPlan", "Analytic", "Memory", "aot_plan"]


@dataclasses.dataclass(frozen=True)
class Memory:
    """One compiled program's memory per device (bytes, from ``memory_analysis()``): ``arguments``, ``outputs``,
    ``temporaries``, ``aliased`` (outputs written over donated arguments) and ``peak`` = arguments + outputs −
    aliased + temporaries."""

    arguments: int
    outputs: int
    temporaries: int
    aliased: int

    @property
    def peak(self) -> int:
        return self.arguments + self.outputs - self.aliased + self.temporaries

    @classmethod
    def of(cls, compiled) -> Memory:
        m = compiled.memory_analysis()
        return cls(
            int(m.argument_size_in_bytes),
            int(m.output_size_in_bytes),
            int(m.temp_size_in_bytes),
            int(m.alias_size_in_bytes),
        )


@dataclasses.dataclass(frozen=True)
class Analytic:
    """What a device must hold at least (bytes): ``weights`` (its S slots of every expert array, plus the replicated
    router / shared / output parameters), ``moments`` (Adam's two copies of them), ``tokens`` (its x and
    out rows) and ``row_buffers`` (one exchange round: D·C rows sent, received, through the FFN and back; see the
    module), at capacity ``C`` rows per block."""

    weights: int
    moments: int
    tokens: int
    row_buffers: int
    capacity: int


@dataclasses.dataclass(frozen=True)
class AotPlan:
    """`aot_plan`'s result: the mesh (``axes``: name → size), ``tokens_per_rank`` n, the `Memory` of the
    ``forward`` and the ``train`` step (None when not built), the `Analytic` minimum, and per program the
    collectives summed by (kind, mesh axes): ``{"forward" | "train": [{kind, axes, count, bytes, wire_bytes}]}``."""

    axes: dict[str, int]
    tokens_per_rank: int
    forward: Memory
    train: Memory | None
    analytic: Analytic
    collectives: dict[str, list[dict]]

    def fits(self, device_bytes: float, *, train: bool = True) -> bool:
        """Whether the forward (or, with ``train``, the training step) peaks within ``device_bytes`` per device."""
        mem = self.train if train and self.train is not None else self.forward
        return mem.peak <= device_bytes


def _structs(config: MoEConfig, mesh, num_slots: int) -> dict:
    shapes = param_shapes(config, num_slots)
    homes = param_shardings(shapes, mesh, config)
    return {k: jax.ShapeDtypeStruct(shape, param_dtype(k, config), sharding=homes[k]) for k, shape in shapes.items()}


def _bytes_per_device(structs: dict) -> int:
    total = 0
    for s in structs.values():
        shard = s.sharding.shard_shape(s.shape)
        total += int(np.prod(shard)) * jnp.dtype(s.dtype).itemsize
    return total


def _summed(collectives) -> list[dict]:
    """Collectives summed by (kind, axes): how many instructions and their bytes per device."""
    rows: dict[tuple, dict] = {}
    for c in collectives:
        key = (c.kind, c.axes)
        row = rows.setdefault(key, {"kind": c.kind, "axes": list(c.axes), "count": 0, "bytes": 0, "wire_bytes": 0})
        row["count"] += 1
        row["bytes"] += int(c.bytes)
        row["wire_bytes"] += int(c.wire_bytes)
    return sorted(rows.values(), key=lambda r: (r["kind"], r["axes"]))


def aot_plan(
    config: MoEConfig,
    mesh: jax.sharding.Mesh,
    *,
    tokens_per_rank: int,
    placement: Placement | None = None,
    train: bool = True,
) -> AotPlan:
    """Compile the layer's forward (and one Adam training step) for ``mesh`` from shapes alone (see the module).

    Args:
      config: the layer (`moe_preset` for real models); its ``batch_axes`` / ``tensor_axis`` / ``fsdp_axis`` name
        the mesh's other axes.
      mesh: any mesh with ``config.axis`` (fake CPU devices will do: nothing is allocated).
      tokens_per_rank: n, the tokens each of the Ng·D token shards holds.
      placement: the expert placement (default: `Placement.spread` over D ranks × S slots).
      train: also compile the training step.

    Returns:
      `AotPlan` (per device bytes of each program, the analytic minimum, the collectives per axis).

    Raises:
      ValueError: a mesh without the config's axes, tokens_per_rank < 1, a placement of another shape.
    """
    if isinstance(tokens_per_rank, bool) or not isinstance(tokens_per_rank, int) or tokens_per_rank < 1:
        raise ValueError(f"aot_plan: tokens_per_rank must be an integer >= 1, got {tokens_per_rank!r}")
    axes = layer_axes(config, mesh, where="aot_plan")
    D, S = axes.num_ranks, config.slots_per_rank
    if placement is None:
        placement = Placement.spread(config.experts, D, S)
    if placement.num_slots != D * S:
        raise ValueError(f"aot_plan: the placement has {placement.num_slots} slots, the layer D·S = {D}·{S}")
    # Step 1: shapes with their shardings; the tables are concrete.
    params = _structs(config, mesh, D * S)
    T = axes.shards * tokens_per_rank
    x = jax.ShapeDtypeStruct((T, config.hidden), config.dtype, sharding=NamedSharding(mesh, axes.token_spec))
    pa, tables = dispatch_tables.placement_arrays(placement), dispatch_tables.uniform(placement)
    if config.dispatch == "ingraph":
        tables = None

    def forward(p, x):
        return moe_forward(p, x, mesh=mesh, placement_arrays=pa, tables=tables, config=config, aux_losses=False).out

    # Step 2: the forward, and one training step with parameters and moments donated.
    fwd = jax.jit(forward).lower(params, x).compile()
    programs = {"forward": fwd}
    trained = None
    opt = optax.adam(1e-4, mu_dtype=jnp.float32)
    moments = _moments(jax.eval_shape(opt.init, params), params)
    if train:

        def step(p, state, x):
            grads = jax.grad(lambda p: jnp.mean(forward(p, x).astype(jnp.float32) ** 2))(p)
            updates, state = opt.update(grads, state, p)
            return optax.apply_updates(p, updates), state

        trained = jax.jit(step, donate_argnums=(0, 1)).lower(params, moments, x).compile()
        programs["train"] = trained
    # Steps 3–5: memory per device, the analytic minimum, the collectives per axis.
    item = jnp.dtype(config.dtype).itemsize
    C = auto_capacity(config, tokens_per_rank, D)
    H, L = config.hidden, config.expert_width
    F = config.ffn // axes.size(axes.tensor)  # a tensor axis splits every row's F
    analytic = Analytic(
        weights=_bytes_per_device(params),
        moments=_bytes_per_device({str(i): m for i, m in enumerate(jax.tree.leaves(moments))}),
        tokens=2 * tokens_per_rank * H * item,
        row_buffers=D * C * (4 * L + 3 * F) * item,
        capacity=C,
    )
    return AotPlan(
        axes={n: int(mesh.shape[n]) for n in mesh.axis_names},
        tokens_per_rank=tokens_per_rank,
        forward=Memory.of(fwd),
        train=None if trained is None else Memory.of(trained),
        analytic=analytic,
        collectives={name: _summed(program_collectives(c.as_text(), mesh)) for name, c in programs.items()},
    )


def _moments(state, params: dict):
    """Adam's state shapes laid out like the parameters (each moment beside its parameter, float32; the step count
    replicated)."""
    replicated = NamedSharding(next(iter(params.values())).sharding.mesh, P())

    def like(path, leaf):
        key = next((getattr(e, "key", None) for e in reversed(path) if getattr(e, "key", None) in params), None)
        home = params[key].sharding if key is not None and leaf.shape == params[key].shape else replicated
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=home)

    return jax.tree_util.tree_map_with_path(like, state)


def fits_on(plan: AotPlan, gpus: dict[str, float]) -> list[str]:
    """The GPUs (name → bytes per device) the plan's training step (or forward) fits, smallest first."""
    return [name for name, size in sorted(gpus.items(), key=lambda kv: kv[1]) if plan.fits(size)]
