"""Dispatch tables: what the in-graph dispatch kernel reads to pick a physical slot per (token, k).

A `Tables` pytree holds ``table [Gs, E, R]`` float32 weights over each expert's replica columns (rows need not
be normalised: the kernel renormalises at use and treats an all-zero row as uniform over valid replicas) and
``log2phy [E, R]`` int32 physical slots (−1 = no replica). ``Gs`` source groups: device d of D uses row group
``d * Gs // D`` (Gs = 1: one table for all; Gs = number of nodes: one per source node; Gs = D: per rank).

Built on the host from `solvers` objects (numpy); consumed in-graph by `tempo_jax.moe_forward`. This module is the
thin device-side wrapper of `solvers.plan_weights`, the one plan → weights conversion (uniform, static, flat
dispatch, per-node or per-rank split): every builder here calls it and makes one host → device copy.

**Validate once.** Every builder checks the weights on the host and returns a *trusted* `Tables` that carries its
placement's identity (``placement_key`` = `solvers.Placement.key`); `placement_arrays` does the same for the
device placement. The layer compares these keys (static Python strings, no device → host copy) instead of the
arrays, and never re-checks a trusted value. A `Tables` or `PlacementArrays` made by hand has no key: its weights
are checked when it is built from concrete arrays, and `moe_forward` / `MoE.set_tables` check it against the
placement by value (once per call of theirs).

Weights are finite and ≥ 0. The host rejects anything else with a ValueError where tables are built and where
they are installed (`MoE.set_tables`), as SGLang's dispatch does. Inside a traced program nothing can be
checked: the in-graph kernel reads a negative entry as 0 (the torn-row rule), and a row left without positive
weight falls back to uniform.
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
    "check_placement_arrays",
    "check_tables",
    "check_weights",
    "placement_arrays",
    "uniform",
    "static",
    "from_plan",
    "from_weights",
    "from_dispatch",
    "from_split",
    "keyed",
    "perturbed",
]


class _PAFields(NamedTuple):
    phy2log: jnp.ndarray
    log2phy: jnp.ndarray


class PlacementArrays(_PAFields):
    """Device-side placement: ``phy2log [P]`` int32, ``log2phy [E, R]`` int32 (−1 padded), and ``placement_key``
    (the `solvers.Placement.key` it was built from; None when made by hand). `placement_arrays` builds it."""

    def __new__(cls, phy2log, log2phy, placement_key: str | None = None):
        obj = super().__new__(cls, phy2log, log2phy)
        obj.placement_key = placement_key
        return obj

    def __reduce__(self):
        return (PlacementArrays, (self.phy2log, self.log2phy, self.placement_key))

    def _replace(self, **changes) -> PlacementArrays:
        """A copy with some arrays replaced: no longer the keyed placement, so it is checked by value."""
        return PlacementArrays(**{**self._asdict(), **changes})


jax.tree_util.register_pytree_with_keys(
    PlacementArrays,
    lambda a: (
        ((jax.tree_util.GetAttrKey("phy2log"), a.phy2log), (jax.tree_util.GetAttrKey("log2phy"), a.log2phy)),
        a.placement_key,
    ),
    lambda key, children: PlacementArrays(*children, placement_key=key),
    flatten_func=lambda a: ((a.phy2log, a.log2phy), a.placement_key),
)


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
    """table [Gs, E, R] float32 weights per source group; log2phy [E, R] int32; ``placement_key`` (see the module).

    Building one by hand from concrete arrays checks the weights on the host (finite, ≥ 0; ValueError otherwise);
    tracers are not checked (the kernel's rule applies). The builders of this module return trusted tables (checked
    once, keyed by their placement); JAX rebuilding the pytree (jit outputs, tree maps, ``device_put``) keeps the
    key and skips the check, so it never forces a device-to-host copy.
    """

    def __new__(cls, table, log2phy):
        check_weights("table", table, where="Tables")
        return cls._trusted(table, log2phy)

    @classmethod
    def _trusted(cls, table, log2phy, placement_key: str | None = None) -> Tables:
        """Without the host check: for weights already checked, and for JAX's pytree unflattening."""
        obj = tuple.__new__(cls, (table, log2phy))
        obj.placement_key = placement_key
        return obj

    def __reduce__(self):
        return (Tables._trusted, (self.table, self.log2phy, self.placement_key))

    def _replace(self, **changes) -> Tables:
        return type(self)(**{**self._asdict(), **changes})

    @property
    def num_groups(self) -> int:
        return int(self.table.shape[0])


jax.tree_util.register_pytree_with_keys(
    Tables,
    lambda t: (
        ((jax.tree_util.GetAttrKey("table"), t.table), (jax.tree_util.GetAttrKey("log2phy"), t.log2phy)),
        t.placement_key,
    ),
    lambda key, children: Tables._trusted(*children, placement_key=key),
    flatten_func=lambda t: ((t.table, t.log2phy), t.placement_key),
)


def _concrete(*arrays) -> bool:
    return not any(isinstance(a, jax.core.Tracer) for a in arrays)


def check_placement_arrays(pa: PlacementArrays, num_experts: int, num_slots: int, *, where: str) -> None:
    """Host check of hand-made placement arrays (a keyed `placement_arrays` result is trusted and skipped):
    ``phy2log [P]`` ids in ``[0, E)``, ``log2phy [E, R]`` slots in ``[-1, P)``, every expert with a replica, and
    the two consistent. Only concrete arrays are read (one device → host copy each)."""
    if pa.placement_key is not None or not _concrete(pa.phy2log, pa.log2phy):
        return
    p2l, l2p = np.asarray(pa.phy2log), np.asarray(pa.log2phy)
    E, P = num_experts, num_slots
    if p2l.min() < 0 or p2l.max() >= E:
        bad = np.flatnonzero((p2l < 0) | (p2l >= E))
        raise ValueError(f"{where}: phy2log slots {bad[:10].tolist()} hold expert ids outside [0, {E})")
    if l2p.min() < -1 or l2p.max() >= P:
        raise ValueError(f"{where}: log2phy holds slots outside [-1, P = {P}): min {l2p.min()}, max {l2p.max()}")
    orphan = np.flatnonzero((l2p < 0).all(axis=1))
    if orphan.size:
        raise ValueError(f"{where}: experts {orphan[:10].tolist()} have no replica in log2phy; every expert needs one")
    if not np.array_equal(p2l[l2p[l2p >= 0]], np.nonzero(l2p >= 0)[0]):
        raise ValueError(f"{where}: log2phy and phy2log disagree: a replica column points at a slot of another expert")


def check_tables(tables: Tables, pa: PlacementArrays, *, where: str) -> None:
    """Do ``tables`` fit the placement ``pa``? Shapes always (static); the placement by key when both are keyed
    (no array is read), else by value when concrete; the weights of a hand-made (unkeyed) table when concrete.

    Raises:
      ValueError: a table that is not ``[Gs ≥ 1, E, R]`` over the placement's replica columns, tables of another
        placement, or (hand-made tables) negative / NaN / infinite weights.
    """
    if not isinstance(tables, Tables):
        raise ValueError(
            f"{where}: tables must be a tempo_jax.layer.tables.Tables (build one with uniform, static, "
            f"from_plan, from_weights, from_split), got {type(tables).__name__}"
        )
    shape, l2p_shape = tuple(jnp.shape(tables.table)), tuple(jnp.shape(pa.log2phy))
    if len(shape) != 3 or shape[0] < 1 or shape[1:] != l2p_shape or tuple(jnp.shape(tables.log2phy)) != l2p_shape:
        raise ValueError(
            f"{where}: table must be [Gs, E, R] = [Gs >= 1, {l2p_shape[0]}, {l2p_shape[1]}] with log2phy "
            f"{list(l2p_shape)} (this placement's), got table {list(shape)}, log2phy "
            f"{list(jnp.shape(tables.log2phy))}; build tables from this placement (tempo_jax.layer.tables: uniform, "
            "static, from_plan, from_split)"
        )
    keys = (tables.placement_key, pa.placement_key)
    if None not in keys:
        if keys[0] != keys[1]:
            raise ValueError(
                f"{where}: tables were built for another placement (a different placement key: "
                f"{keys[0]}, this placement has {keys[1]}); build them from this placement"
            )
        return
    if _concrete(tables.log2phy, pa.log2phy) and not np.array_equal(np.asarray(tables.log2phy), np.asarray(pa.log2phy)):
        raise ValueError(
            f"{where}: tables.log2phy differs from the placement's log2phy: tables built for another placement"
        )
    if tables.placement_key is None:
        check_weights("table", tables.table, where=where)


def placement_arrays(placement: Placement) -> PlacementArrays:
    """Device arrays of a `solvers.Placement`: ``phy2log [P]`` and ``log2phy [E, R]`` int32."""
    return PlacementArrays(
        jnp.asarray(placement.phy2log, jnp.int32),
        jnp.asarray(placement.log2phy, jnp.int32),
        placement_key=placement.key,
    )


def keyed(table, pa: PlacementArrays) -> Tables:
    """``table [Gs, E, R]`` as `Tables` over the placement arrays ``pa``, keyed by their placement, without a host
    check: for a table that is a traced argument of a jitted step, or whose weights were checked where they were
    built (``DispatchController.latest.table``, a builder's ``.table``)."""
    return Tables._trusted(table, pa.log2phy, pa.placement_key)


def _tables(weights: np.ndarray, placement: Placement, where: str) -> Tables:
    """Checked float32 weights → `Tables` with one host → device copy of each array."""
    w = np.asarray(weights, dtype=np.float32)
    if w.ndim == 2:
        w = w[None]
    check_weights("table", w, where=where)
    return Tables._trusted(jnp.asarray(w), jnp.asarray(placement.log2phy, jnp.int32), placement.key)


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
        raise ValueError(
            f"tables.from_weights: weights must be [Gs, E, R] = [Gs, {placement.num_experts}, "
            f"{placement.log2phy.shape[1]}], got {w.shape}"
        )
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
    # random ** 3 on valid columns: ≥ 0
    return Tables._trusted(jnp.asarray(w, jnp.float32), tables.log2phy, tables.placement_key)
