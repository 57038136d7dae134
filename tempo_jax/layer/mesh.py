"""The meshes the layer runs on: which mesh axis does what, and where every parameter lives.

A layer call runs one `jax.shard_map` over every axis it names (`LayerAxes`):

- the **expert axis** (`MoEConfig.axis`, ``ep``, size D): physical expert slots are split over it (each rank its
  S slots) and every exchange of the layer runs along it;
- the **batch axes** (`MoEConfig.batch_axes`, e.g. ``data``; product of their sizes Ng): the tokens are split over
  them too, so the Ng·D token shards hold different tokens. Each batch coordinate is one *EP group*: D devices that
  route, count, exchange and compute their own tokens, with every collective of the layer inside the group (the
  all-to-all's replica groups are the EP groups). Expert weights are replicated over the batch axes; their
  gradients are summed over them (data parallelism);
- the **tensor axis** (`MoEConfig.tensor_axis`, size Tp): every expert's F columns are split over it (``w_gate`` /
  ``w_up`` columns, ``w_down`` rows, ``b_gate`` / ``b_up``), and so are the shared experts' Fs; the tokens are
  replicated over it; each device computes its F / Tp share of every row, and the layer's output is reduced over
  the axis once (a ``psum`` of the combined ``[T/(Ng·D), H]`` output);
- the **FSDP axis** (`MoEConfig.fsdp_axis`, one of the batch axes, size Fp): expert weights are additionally split
  over it along H, gathered inside the layer per call (an all-gather over the axis) and their gradients
  reduce-scattered back (the all-gather's transpose).

Every other mesh axis sees the layer replicated. `make_mesh` builds the usual ``data × ep × tensor`` mesh.

| parameter | spec (``ep``, fsdp ``f``, tensor ``t``) |
| --- | --- |
| ``w_gate``, ``w_up`` ``[P, H, F]`` | ``P(ep, f, t)`` |
| ``w_down`` ``[P, F, H]`` | ``P(ep, t, f)`` |
| ``b_gate``, ``b_up`` ``[P, F]`` | ``P(ep, t)`` |
| ``b_down`` ``[P, H]`` | ``P(ep)`` (added once, on tensor rank 0) |
| ``shared_w_gate``, ``shared_w_up`` ``[H, Fs]`` / ``shared_w_down`` ``[Fs, H]`` | ``P(None, t)`` / ``P(t, None)`` |
| ``router``, ``router_bias``, ``score_bias``, ``shared_gate``, ``out_bias``, ``out_norm`` | ``P()`` (replicated) |

The letters Ng (EP groups), Tp (tensor-axis size) and Fp (FSDP-axis size) are the house glossary's
(docs/architecture.md).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from .config import MoEConfig

__all__ = [
    "MESH_AXES",
    "LayerAxes",
    "layer_axes",
    "make_mesh",
    "onto_mesh",
    "param_shardings",
    "param_spec",
    "parse_mesh",
    "token_axes",
]


@dataclasses.dataclass(frozen=True)
class LayerAxes:
    """The mesh axes of one layer on one mesh (hashable: part of the compiled program's key).

    Attributes:
      ep: the expert-parallel axis (D ranks), or ``(node, ep)`` with ``MoEConfig.node_axis`` (D = their product; a
        collective's axis name either way).  batch: the batch axes, in mesh order (Ng = product of their sizes).
      tensor: the tensor axis or None.  fsdp: the FSDP axis (one of ``batch``) or None.
      sizes: ``{axis: size}`` of the mesh.
    """

    ep: str | tuple[str, ...]
    batch: tuple[str, ...]
    tensor: str | None
    fsdp: str | None
    sizes: tuple[tuple[str, int], ...]

    def size(self, name: str | tuple[str, ...] | None) -> int:
        """The size of axis ``name`` (1 for None; the product for a tuple of axes)."""
        if name is None:
            return 1
        return math.prod(dict(self.sizes)[n] for n in ((name,) if isinstance(name, str) else name))

    @property
    def num_ranks(self) -> int:
        """D: ranks of one EP group."""
        return self.size(self.ep)

    @property
    def groups(self) -> int:
        """Ng: EP groups (token shards per expert rank)."""
        return math.prod(self.size(a) for a in self.batch)

    @property
    def tokens(self) -> tuple[str, ...]:
        """The axes the tokens are split over, slowest first: the batch axes, then ``ep`` (Ng·D shards)."""
        return (*self.batch, *((self.ep,) if isinstance(self.ep, str) else self.ep))

    @property
    def token_spec(self) -> P:
        """The spec of a ``[T, ...]`` token array: ``P(("data", "ep"))``, or ``P("ep")`` without batch axes."""
        return P(self.tokens if len(self.tokens) > 1 else self.ep)

    @property
    def shards(self) -> int:
        """Ng·D: token shards."""
        return self.groups * self.num_ranks

    @property
    def named(self) -> tuple[str, ...]:
        """Every axis the layer's `shard_map` is manual over."""
        return (*self.tokens, *((self.tensor,) if self.tensor else ()))


def layer_axes(
    config: MoEConfig, mesh: jax.sharding.Mesh, *, tokens: tuple[str, ...] | None = None, where: str = "moe_forward"
) -> LayerAxes:
    """`LayerAxes` of ``config`` on ``mesh``: the axes checked against the mesh, the batch axes resolved and the
    shapes that must divide (F by Tp, Fs by Tp, H by Fp). Raises ValueError naming the axis and the fix.

    ``config.batch_axes=None`` resolves to the mesh axes the tokens are sharded over (``tokens``: the axes of their
    first dimension's sharding, when it can be seen), else to every mesh axis of size > 1 but the expert and tensor
    axes; the fsdp axis is always one of them."""
    names = tuple(mesh.axis_names)
    sizes = tuple((n, int(mesh.shape[n])) for n in names)

    def need(name, field):
        if name not in names:
            raise ValueError(
                f"{where}: axis {name!r} is not in the mesh (axes: {list(names)}); set MoEConfig.{field} to one of "
                "them or build the mesh with tempo_jax.make_mesh(data=..., ep=..., tensor=...)"
            )

    need(config.axis, "axis")
    if config.node_axis is not None:
        need(config.node_axis, "node_axis")
    expert = (config.axis,) if config.node_axis is None else (config.node_axis, config.axis)
    tensor, fsdp = config.tensor_axis, config.fsdp_axis
    if tensor is not None:
        need(tensor, "tensor_axis")
    if config.batch_axes is None:
        if tokens is None:
            batch = tuple(n for n in names if n not in (*expert, tensor) and mesh.shape[n] > 1)
        else:
            batch = tuple(n for n in names if n in tokens and n not in (*expert, tensor))
        if fsdp is not None and fsdp not in batch:
            batch = tuple(n for n in names if n in (*batch, fsdp))
    else:
        for a in config.batch_axes:
            need(a, "batch_axes")
        batch = tuple(n for n in names if n in config.batch_axes)  # mesh order: the tokens' shard order
    if fsdp is not None:
        need(fsdp, "fsdp_axis")
        if fsdp not in batch:
            raise ValueError(
                f"{where}: MoEConfig.fsdp_axis={fsdp!r} must be one of the batch axes {list(batch)} (the devices "
                "along it hold different tokens and share the expert weights, which FSDP splits among them)"
            )
    axes = LayerAxes(config.expert_axes, batch, tensor, fsdp, sizes)
    Tp, Fp = axes.size(tensor), axes.size(fsdp)
    if config.ffn % Tp:
        raise ValueError(
            f"{where}: the expert width F={config.ffn} does not split over the {Tp} devices of tensor axis "
            f"{tensor!r}; use a tensor axis whose size divides F"
        )
    if config.shared is not None and config.shared.width % Tp:
        raise ValueError(
            f"{where}: the shared experts' width Fs={config.shared.width} does not split over the {Tp} devices of "
            f"tensor axis {tensor!r}"
        )
    if config.expert_width % Fp:
        raise ValueError(
            f"{where}: the experts' width {config.expert_width} (H, or the latent L) does not split over the {Fp} "
            f"devices of fsdp axis {fsdp!r} (FSDP shards the expert weights along it)"
        )
    if config.expert_dtype == "fp8_block":  # a device's share of a weight must hold whole scale blocks
        for n, size, dim, axis in ((Tp, config.ffn, "F", tensor), (Fp, config.hidden, "H", fsdp)):
            if n > 1 and any((size // n) % b for b in config.fp8_block):
                raise ValueError(
                    f"{where}: FP8 experts split {dim}={size} over the {n} devices of axis {axis!r} into "
                    f"{size // n} columns, not whole {config.fp8_block[0]}×{config.fp8_block[1]} scale blocks "
                    "(MoEConfig.fp8_block); use a smaller axis or a block that divides them"
                )
    return axes


def token_axes(x, mesh: jax.sharding.Mesh) -> tuple[str, ...] | None:
    """The mesh axes ``x``'s first dimension is sharded over, when its sharding can be seen (a concrete array on
    ``mesh``, or a traced one on an Explicit mesh); None otherwise (an unplaced array, Auto axes under ``jit``)."""
    try:
        sharding = jax.typeof(x).sharding if isinstance(x, jax.core.Tracer) else getattr(x, "sharding", None)
    except Exception:  # noqa: BLE001 (an abstract value without a sharding)
        return None
    if not isinstance(sharding, NamedSharding) or tuple(sharding.mesh.axis_names) != tuple(mesh.axis_names):
        return None
    if isinstance(x, jax.core.Tracer) and not any(
        t == jax.sharding.AxisType.Explicit for t in sharding.mesh.axis_types
    ):
        return None
    first = sharding.spec[0] if len(sharding.spec) else None
    return () if first is None else ((first,) if isinstance(first, str) else tuple(first))


def onto_mesh(value, mesh: jax.sharding.Mesh, axis: str | None = None):
    """``value`` as it is, or — a concrete array committed to other devices than ``mesh``'s (``jax.device_put(x,
    jax.devices()[3])``, another layout's parameters) — copied onto the mesh, split over ``axis`` along its first
    dimension (None: replicated), so one program can read it beside the layer's arrays."""
    if not isinstance(value, jax.Array) or isinstance(value, jax.core.Tracer) or not value.committed:
        return value
    if value.sharding.device_set == set(mesh.devices.flat):
        return value
    return jax.device_put(value, NamedSharding(mesh, P(axis) if axis else P()))


def param_spec(name: str, axes: LayerAxes, *, stacked: int = 0) -> P:
    """Where parameter ``name`` lives (the module's table); ``stacked`` leading axes in front (layers stacked by
    ``nnx.vmap`` / ``nnx.scan``) stay unsharded."""
    ep, t, f = axes.ep, axes.tensor, axes.fsdp
    spec = {
        "w_gate": (ep, f, t),
        "w_up": (ep, f, t),
        "w_down": (ep, t, f),
        "w_gate_scale_inv": (ep, f, t),  # FP8 block scales: split like their weights
        "w_up_scale_inv": (ep, f, t),
        "w_down_scale_inv": (ep, t, f),
        "b_gate": (ep, t),
        "b_up": (ep, t),
        "b_down": (ep,),
        "shared_w_gate": (None, t),
        "shared_w_up": (None, t),
        "shared_w_down": (t, None),
    }.get(name, ())
    while spec and spec[-1] is None:  # P("ep", None, None) and P("ep") are one sharding; keep the short form
        spec = spec[:-1]
    return P(*([None] * stacked), *spec) if spec else P()


def param_shardings(params, mesh: jax.sharding.Mesh, config: MoEConfig | str = "ep") -> dict:
    """``{name: NamedSharding}`` of every parameter of ``params`` (any dict with the layer's keys, arrays or
    shapes): the module's table for ``config``'s axes on ``mesh``. ``config`` may be just the expert axis's name
    (a 1-D layout: expert arrays ``P(axis)``, everything else replicated)."""
    if isinstance(config, str):
        axes = LayerAxes(config, (), None, None, tuple((n, int(mesh.shape[n])) for n in mesh.axis_names))
    else:
        axes = layer_axes(config, mesh, where="param_shardings")
    return {k: NamedSharding(mesh, param_spec(k, axes)) for k in params}


def make_mesh(
    *, data: int = 1, node: int = 1, ep: int | None = None, tensor: int = 1, devices=None, explicit: bool = False
) -> jax.sharding.Mesh:
    """A ``(data, ep, tensor)`` mesh — ``(data, node, ep, tensor)`` with ``node`` > 1 — over ``devices`` (default:
    every device, ordered by process, then id), ``data`` slowest: on several hosts the data axis runs across them and
    ``ep`` / ``tensor`` inside each (how multi-node EP is deployed when the links between nodes are slow; with
    ``node``, the nodes' axis comes before ``ep`` and the experts span both). ``ep`` defaults to the devices left
    over. Axes are Auto (the compiler propagates shardings through the rest of the model) unless ``explicit`` (JAX's
    explicit-sharding mode: run your code under ``jax.set_mesh(mesh)``); the layer works with both.

    Use it with ``MoEConfig(axis="ep", tensor_axis="tensor" if tensor > 1 else None)``, and ``node_axis="node"``
    when ``node`` > 1 (the expert slots over nodes × ep; docs/meshes.md); the batch axes default to ``("data",)``
    when data > 1.

    Raises:
      ValueError: a size that is not a positive int, data × ep × tensor larger than the devices (or, with ``ep``
        left out, not dividing them), ``explicit`` not a bool, or a device named twice in ``devices``.
    """
    if not isinstance(explicit, bool | np.bool_):  # "False" is a true string: a typo would flip the mode silently
        raise ValueError(f"make_mesh: explicit must be True or False, got {explicit!r}")
    if devices is None:
        devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    devices = _distinct_devices(devices, "make_mesh")
    for name, v in (("data", data), ("node", node), ("tensor", tensor)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"make_mesh: {name} must be a positive int, got {v!r}")
    if ep is None:
        if len(devices) % (data * node * tensor):
            sizes = (
                f"data × tensor = {data} × {tensor}"
                if node == 1
                else f"data × node × tensor = {data} × {node} × {tensor}"
            )
            raise ValueError(f"make_mesh: {sizes} does not divide the {len(devices)} devices; give ep=")
        ep = len(devices) // (data * node * tensor)
    n = data * node * tensor * ep if isinstance(ep, int) else 0
    if isinstance(ep, bool) or not isinstance(ep, int) or ep < 1 or n > len(devices):
        sizes = f"data × ep × tensor = {data} × {ep} × {tensor}"
        if node > 1:
            sizes = f"data × node × ep × tensor = {data} × {node} × {ep} × {tensor}"
        raise ValueError(
            f"make_mesh: {sizes} must be a product of positive ints no larger than the {len(devices)} devices"
        )
    kind = jax.sharding.AxisType.Explicit if explicit else jax.sharding.AxisType.Auto
    shape, names = (
        ((data, node, ep, tensor), ("data", "node", "ep", "tensor"))
        if node > 1
        else ((data, ep, tensor), ("data", "ep", "tensor"))
    )
    grid = np.asarray(devices[:n], dtype=object).reshape(shape)
    return jax.sharding.Mesh(grid, names, axis_types=(kind,) * len(names))


def _distinct_devices(devices, where: str) -> list:
    """``devices`` as a list, refused (ValueError naming the device and its positions) when one appears twice: a
    mesh places one shard per position, and a device holding two would fail inside the first call."""
    devices = list(devices)
    seen: dict = {}
    for i, dev in enumerate(devices):
        if dev in seen:
            raise ValueError(
                f"{where}: device {dev} is listed twice (positions {seen[dev]} and {i}); a mesh needs distinct "
                "devices, one per position"
            )
        seen[dev] = i
    return devices


#: The axes `parse_mesh` accepts, as `make_mesh` names them.
MESH_AXES = ("data", "node", "ep", "tensor")


def parse_mesh(text: str) -> dict[str, int]:
    """``"data=2,ep=4"`` → ``{"data": 2, "node": 1, "ep": 4, "tensor": 1}`` (`make_mesh`'s keywords; ep may be left
    out: the devices left over). Raises ValueError naming the bad part and the accepted form."""
    form = "axis=size pairs joined by commas, axes data / node / ep / tensor, e.g. 'data=2,ep=4' or 'node=8,ep=8'"
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"mesh: expected {form}; got {text!r}")
    out: dict[str, int] = {}
    for part in text.split(","):
        name, _, size = part.strip().partition("=")
        if name not in MESH_AXES or not size.strip().isdigit() or int(size) < 1:
            raise ValueError(f"mesh: {part.strip()!r} is not axis=size with a positive size; expected {form}")
        if name in out:
            raise ValueError(f"mesh: axis {name!r} given twice in {text!r}")
        out[name] = int(size)
    return {"data": out.get("data", 1), "node": out.get("node", 1), "ep": out.get("ep"), "tensor": out.get("tensor", 1)}
