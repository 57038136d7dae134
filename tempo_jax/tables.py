"""Dispatch tables: what the in-graph dispatch kernel reads to pick a physical slot per (token, k).

A `Tables` pytree holds ``table [Gs, E, R]`` float32 weights over each expert's replica columns (rows need not
be normalised: the kernel renormalises at use and treats an all-zero row as uniform over valid replicas) and
``log2phy [E, R]`` int32 physical slots (−1 = no replica). ``Gs`` source groups: device d of D uses row group
``d * Gs // D`` (Gs = 1: one table for all; Gs = number of nodes: one per source node; Gs = D: per rank).

Built on the host from `solvers` objects (numpy); consumed in-graph by `tempo_jax.moe_forward`. This module is the
thin device-side wrapper of `solvers.plan_weights`, the one plan → weights conversion (uniform, static, flat
dispatch, per-node or per-rank split): every builder here calls it and makes one host → device copy.

Weights are finite and ≥ 0. The host rejects anything else with a ValueError where tables are built (every
builder here, and a `Tables` made by hand from concrete arrays) and where they are installed (`MoE`,
`MoE.set_tables`), as SGLang's dispatch does. Inside a traced program nothing can be checked: the in-graph
kernel reads a negative entry as 0 (the torn-row rule), and a row left without positive weight falls back
to uniform.
"""

from __future__ import annotations

from numbers import Number
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from solvers import Dispatch, Placement, plan_weights
from solvers.checks import check_array

__all__ = [
    "PlacementArrays",
    "Tables",
    "check_weights",
    "placement_arrays",
    "uniform",
    "static",
    "from_plan",
    "from_weights",
    "from_dispatch",
    "from_split",
    "perturbed",
]


class PlacementArrays(NamedTuple):
    """Device-side placement. phy2log [P] int32; log2phy [E, R] int32 (−1 padded)."""

    phy2log: jnp.ndarray
    log2phy: jnp.ndarray


_WEIGHT_RULE = (
    "dispatch weights must be finite and ≥ 0 (a row is renormalised at use; an all-zero row means uniform over "
    "the expert's replicas); the in-graph kernel would read a negative entry as 0"
)


def check_weights(name: str, values, *, where: str) -> np.ndarray | None:
    """Host check of dispatch weights (any shape): float64 copy of concrete ``values``, or None where nothing
    can be read on the host (a tracer inside a traced program, an array spread over several processes, an
    abstract value). Raises ValueError naming ``where``, ``name`` and the first negative / NaN / inf entry."""
    if isinstance(values, jax.core.Tracer):
        return None
    if isinstance(values, jax.Array):
        if not values.is_fully_addressable:
            return None
        values = np.asarray(values)
    elif not isinstance(values, np.ndarray | list | tuple | Number):
        return None  # e.g. jax.ShapeDtypeStruct, None
    arr = np.asarray(values)
    if arr.dtype == bool or (jnp.issubdtype(arr.dtype, jnp.floating) and arr.dtype.kind != "f"):
        arr = arr.astype(np.float32)  # a 0/1 mask, bfloat16 and other ml_dtypes floats
    try:
        return check_array(name, arr, where=where, nonnegative=True)
    except ValueError as err:
        raise ValueError(f"{err}; {_WEIGHT_RULE}") from None


class _TableFields(NamedTuple):
    table: jnp.ndarray
    log2phy: jnp.ndarray


class Tables(_TableFields):
    """table [Gs, E, R] float32 weights per source group; log2phy [E, R] int32.

    Building one from concrete arrays checks the weights on the host (finite, ≥ 0; ValueError otherwise);
    tracers are not checked (the kernel's rule applies). JAX rebuilding the pytree (jit outputs, tree maps,
    ``device_put``) skips the check, so it never forces a device-to-host copy.
    """

    __slots__ = ()

    def __new__(cls, table, log2phy):
        check_weights("table", table, where="Tables")
        return super().__new__(cls, table, log2phy)

    @classmethod
    def _trusted(cls, table, log2phy) -> Tables:
        """Without the host check: for weights already checked, and for JAX's pytree unflattening."""
        return tuple.__new__(cls, (table, log2phy))

    def _replace(self, **changes) -> Tables:
        return type(self)(**{**self._asdict(), **changes})

    @property
    def num_groups(self) -> int:
        return int(self.table.shape[0])


jax.tree_util.register_pytree_with_keys(
    Tables,
    lambda t: (((jax.tree_util.GetAttrKey("table"), t.table), (jax.tree_util.GetAttrKey("log2phy"), t.log2phy)), None),
    lambda _, children: Tables._trusted(*children),
    flatten_func=lambda t: ((t.table, t.log2phy), None),
)


def placement_arrays(placement: Placement) -> PlacementArrays:
    """Device arrays of a `solvers.Placement`: ``phy2log [P]`` and ``log2phy [E, R]`` int32."""
    return PlacementArrays(jnp.asarray(placement.phy2log, jnp.int32), jnp.asarray(placement.log2phy, jnp.int32))


def _tables(weights: np.ndarray, placement: Placement, where: str) -> Tables:
    """Checked float32 weights → `Tables` with one host → device copy of each array."""
    w = np.asarray(weights, dtype=np.float32)
    if w.ndim == 2:
        w = w[None]
    check_weights("table", w, where=where)
    return Tables._trusted(jnp.asarray(w), jnp.asarray(placement.log2phy, jnp.int32))


def from_plan(plan, placement: Placement | None = None, *, source_gpus=None) -> Tables:
    """Tables realising any plan (`solvers.plan_weights`): ``"uniform"``, ``"static"``, a flat dispatch
    ``x [E, D]``, a split ``y [Gs, E, D]`` or a `solvers.Dispatch` (by its policy: static → the per-source static
    map, uniform → uniform, else its flat x). ``[Gs, E, R]``.

    Raises:
      ValueError: see `solvers.plan_weights` (bad shapes, negative / NaN shares, shares off the replicas).
    """
    if isinstance(plan, Dispatch):
        placement = placement or plan.problem.placement
        check_weights("dispatch.x", plan.x, where="tables.from_plan")
    return _tables(plan_weights(plan, placement, source_gpus=source_gpus), placement, "tables.from_plan")


def from_weights(weights, placement: Placement) -> Tables:
    """Tables from weights ``[Gs, E, R]`` (e.g. published by the solver worker), checked and copied once."""
    w = np.asarray(weights)
    if w.ndim != 3 or w.shape[1:] != placement.log2phy.shape or w.shape[0] < 1:
        raise ValueError(f"tables.from_weights: weights must be [Gs, E, R] = [Gs, {placement.num_experts}, "
                         f"{placement.log2phy.shape[1]}], got {w.shape}")  # fmt: skip
    return _tables(w, placement, "tables.from_weights")


def uniform(placement: Placement) -> Tables:
    """EPLB-even: equal weight on every replica of each expert. ``[1, E, R]``."""
    return _tables(plan_weights("uniform", placement), placement, "tables.uniform")


def static(placement: Placement, source_gpus=None) -> Tables:
    """The static map (`solvers.static_map`): each source rank sends each expert to one replica. ``[Gs, E, R]``."""
    return _tables(plan_weights("static", placement, source_gpus=source_gpus), placement, "tables.static")


def from_dispatch(dispatch: Dispatch, placement: Placement | None = None) -> Tables:
    """One table for every source from a flat solver dispatch ``x [E, D]``, whatever its policy: weight of replica
    column r of expert e = x[e, rank(r)] / n_e (split evenly when a rank holds two replicas of e). ``[1, E, R]``.
    `from_plan` converts by policy instead (the static policy's per-source map).

    The same numbers are probabilities in the layer's sample mode and quota fractions in its quota mode.

    Raises:
      ValueError: a negative, NaN or infinite entry of ``dispatch.x``.
    """
    placement = placement or dispatch.problem.placement
    x = check_weights("dispatch.x", dispatch.x, where="tables.from_dispatch")
    return _tables(plan_weights(x, placement), placement, "tables.from_dispatch")


def from_split(y: np.ndarray, placement: Placement) -> Tables:
    """Per-source-group tables from a split ``y [Gs, E, D]`` (e.g. `solvers.topology` per source node).

    Raises:
      ValueError: a wrong shape, or a negative, NaN or infinite entry of ``y``.
    """
    y = np.asarray(y, dtype=np.float64)
    if y.ndim != 3 or y.shape[1:] != (placement.num_experts, placement.num_gpus):
        raise ValueError(f"split must be [Gs, E={placement.num_experts}, D={placement.num_gpus}], got {y.shape}")
    check_weights("y", y, where="tables.from_split")
    return _tables(plan_weights(y, placement), placement, "tables.from_split")


def perturbed(tables: Tables, seed: int = 0, zero_fraction: float = 0.2) -> Tables:
    """Random weights on the same valid columns (some rows all zero = torn): for invariance tests."""
    rng = np.random.default_rng(seed)
    t = np.asarray(tables.table)
    valid = np.asarray(tables.log2phy)[None] >= 0
    w = np.where(valid, rng.random(t.shape) ** 3, 0.0)
    w[rng.random(t.shape[:2]) < zero_fraction] = 0.0
    return Tables._trusted(jnp.asarray(w, jnp.float32), tables.log2phy)  # random ** 3 on valid columns: ≥ 0
