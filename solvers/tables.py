"""Plan → table weights: the one conversion from a dispatch plan to dispatch-table weights (numpy only).

A dispatch table holds weights ``[Gs, E, R]`` over each expert's replica columns (``log2phy [E, R]``, −1
padded); source rank d of D reads row group ``d · Gs // D`` (Gs = 1: one table for every source; Gs = the
number of nodes: one per source node; Gs = D: one per source rank). The in-graph kernel renormalises each row
at use, so only proportions matter. Every producer of tables goes through `plan_weights`: the controller and
its solver worker, `tempo_jax.layer.tables` (the device-side wrapper), the demo, the benchmarks and the simulators.

Plans and what they become:

  ``"uniform"``          EPLB-even: equal weight on every replica of each expert            → ``[1, E, R]``
  ``"static"``           the static map (`static_map`): each source rank sends each expert
                         to one fixed replica (one-hot rows)                                → ``[D, E, R]``
  ``x [E, D]``           a flat dispatch (tokens of e processed on rank g)                   → ``[1, E, R]``
  ``y [Gs, E, D]``       a per-source-group split (`topology_split` per node, or per rank)   → ``[Gs, E, R]``
  a `Dispatch`           by its policy: ``static`` → the static map, ``uniform`` → uniform,
                         anything else → its flat ``x``

One rule for every plan: a rank's share of expert e is divided evenly among the replicas of e that rank holds;
rows are normalised to sum to 1 over the valid columns and are 0 on −1 columns; a row without tokens falls back
to the flat row (the sum over groups) and, when that is empty too, to uniform over the expert's replicas.

`expected_dispatch` goes the other way: the per-rank loads ``x [E, D]`` that tables produce from per-source
counts (exactly in expectation in the layer's sample mode, within one token per source in its quota mode).
`solve_weights` solves one batch with a policy and converts the plan: what the controller and the worker run.
"""

from __future__ import annotations

import numpy as np

from .checks import check_array, check_choice
from .cost import ACTIVE_EPS
from .placement import Placement, static_map
from .problem import Dispatch, DispatchProblem
from .solve import solve
from .topology import node_counts_from_sources, topology_split
from .topology import node_onehot as node_onehot
from .topology import nonneg_array as topology_array

__all__ = ["PLAN_NAMES", "expected_dispatch", "plan_weights", "solve_weights", "split_tables"]

#: Plans given by name (they need no counts).
PLAN_NAMES = ("uniform", "static")


def _placement(placement, where: str) -> Placement:
    if not isinstance(placement, Placement):
        raise ValueError(f"{where}: placement must be a solvers.Placement, got {type(placement).__name__}")
    return placement


def _column_gpu(placement: Placement) -> tuple[np.ndarray, np.ndarray]:
    """``(valid [E, R] bool, gpu [E, R] int)``: which replica columns exist and the rank each lives on."""
    l2p = placement.log2phy
    valid = l2p >= 0
    return valid, placement.slot_gpu[np.where(valid, l2p, 0)]


def _normalise(w: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Rows of ``w [Gs, E, R]`` scaled to sum to 1 over valid columns; empty rows → uniform over replicas."""
    w = np.where(valid[None], w, 0.0)
    total = w.sum(axis=2, keepdims=True)
    uniform = np.broadcast_to(valid[None] / np.maximum(valid.sum(axis=1), 1)[None, :, None], w.shape)
    return np.where(total > 0, w / np.where(total > 0, total, 1.0), uniform)


def _split_weights(y: np.ndarray, placement: Placement, name: str, where: str) -> np.ndarray:
    """``y [Gs, E, D]`` token shares → ``[Gs, E, R]`` normalised weights (the one rule)."""
    E, D = placement.num_experts, placement.num_gpus
    if y.shape[1:] != (E, D):
        raise ValueError(f"{where}: {name} must be [Gs, E={E}, D={D}], got shape {y.shape}")
    off = np.argwhere((y > ACTIVE_EPS) & ~placement.replica_mask[None])
    if off.size:
        g, e, d = (int(v) for v in off[0])
        raise ValueError(
            f"{where}: {name} puts {y[g, e, d]:.6g} tokens of expert {e} on rank {d}, a rank without a replica of "
            f"it ({len(off)} such entries); a plan may use only the placement's replica_mask"
        )
    # Step 1: rows without tokens take the flat row, and uniform (one token per replica) when that is empty.
    flat = y.sum(axis=0)
    flat = np.where(flat.sum(axis=1, keepdims=True) > 0, flat, placement.replicas_on_gpu.astype(np.float64))
    y = np.where(y.sum(axis=2, keepdims=True) > 0, y, flat[None])
    # Step 2: each replica column takes its rank's share divided among the replicas that rank holds.
    valid, gpu = _column_gpu(placement)
    per_replica = y / np.maximum(placement.replicas_on_gpu, 1)[None]
    w = np.take_along_axis(per_replica, np.broadcast_to(gpu[None], y.shape[:1] + gpu.shape), axis=2)
    # Step 3: normalise.
    return _normalise(w, valid)


def plan_weights(plan, placement: Placement | None = None, *, source_gpus=None) -> np.ndarray:
    """Dispatch-table weights ``[Gs, E, R]`` (float64, rows sum to 1) that realise ``plan``.

    Args:
      plan: ``"uniform"``, ``"static"``, a flat dispatch ``x [E, D]``, a per-source-group split
        ``y [Gs, E, D]`` (Gs dividing D), or a `solvers.Dispatch` (converted by its policy, see the module).
      placement: the placement the plan lives on (default: a Dispatch's own).
      source_gpus: static map only: ``[Gs]`` rank of each source (default: source s on rank s, Gs = D).

    Raises:
      ValueError: an unknown plan name, a wrong shape, negative / NaN / infinite shares, shares on ranks
        without a replica of the expert, or Gs not dividing D.
    """
    where = "plan_weights"
    if isinstance(plan, Dispatch):
        placement = placement or plan.problem.placement
        if plan.policy in PLAN_NAMES:
            plan = plan.policy
        else:
            plan = plan.x
    placement = _placement(placement, where)
    if isinstance(plan, str):
        check_choice("plan", plan, PLAN_NAMES, where=where)
        valid, _ = _column_gpu(placement)
        if plan == "uniform":
            return _normalise(valid[None].astype(np.float64), valid)
        slots = static_map(placement, source_gpus)  # [Gs, E]
        return (placement.log2phy[None, :, :] == slots[:, :, None]).astype(np.float64)
    y = check_array(
        "plan",
        plan,
        where=where,
        ndims=(2, 3),
        nonnegative=True,
        hint="a flat dispatch [E, D] or a per-source-group split [Gs, E, D]",
    )
    if y.ndim == 2:
        y = y[None]
    Gs, D = y.shape[0], placement.num_gpus
    if Gs < 1 or D % Gs:
        raise ValueError(
            f"{where}: a split needs Gs source groups dividing D = {D} (rank d reads group d·Gs // D), got Gs = {Gs}"
        )
    return _split_weights(y, placement, "plan", where)


def expected_dispatch(weights, counts, placement: Placement) -> np.ndarray:
    """Per-rank loads ``x [E, D]`` that tables with ``weights`` produce from ``counts``.

    Args:
      weights: ``[Gs, E, R]`` (or ``[E, R]``) table weights, ≥ 0; rows are renormalised as the kernel does (an
        all-zero row means uniform over the expert's replicas).
      counts: ``[D, E]`` per-source-rank counts (source d reads group d·Gs // D), or ``[E]`` totals when Gs = 1.
      placement: the placement the tables were built for.

    Returns:
      ``x [E, D]`` float64: rows sum to the counts' per-expert totals, zero off the replica mask.
    """
    where = "expected_dispatch"
    placement = _placement(placement, where)
    E, D = placement.num_experts, placement.num_gpus
    w = check_array("weights", weights, where=where, ndims=(2, 3), nonnegative=True)
    w = w[None] if w.ndim == 2 else w
    if w.shape[1:] != placement.log2phy.shape or D % w.shape[0]:
        raise ValueError(
            f"{where}: weights must be [Gs, E, R] = [Gs | D={D}, {E}, {placement.log2phy.shape[1]}], got {w.shape}"
        )
    c = check_array("counts", counts, where=where, ndims=(1, 2), nonnegative=True)
    if c.ndim == 1:
        if w.shape[0] != 1:
            raise ValueError(f"{where}: per-group weights (Gs = {w.shape[0]}) need per-source counts [D, E]")
        c = c[None]
    elif c.shape[0] != D:
        raise ValueError(f"{where}: counts must be [D={D}, E={E}] per source rank or [E] totals, got {c.shape}")
    if c.shape[1] != E:
        raise ValueError(f"{where}: counts has {c.shape[1]} experts, the placement {E}")
    valid, gpu = _column_gpu(placement)
    w = _normalise(w, valid)
    group = np.arange(c.shape[0]) * w.shape[0] // max(c.shape[0], 1)
    per_col = np.einsum("se,ser->er", c, w[group])  # [E, R] pairs per replica column
    x = np.zeros((E, D))
    np.add.at(x, (np.broadcast_to(np.arange(E)[:, None], gpu.shape)[valid], gpu[valid]), per_col[valid])
    return x


def solve_weights(
    problem: DispatchProblem, policy: str, *, per_node: bool = False, options: dict | None = None
) -> tuple[np.ndarray, Dispatch]:
    """Solve one batch with ``policy`` and convert its plan: ``(weights [Gs, E, R], dispatch)``.

    ``per_node``: split a flat plan over source nodes with the topology-aware rule (`topology_split`; needs
    per-source counts ``[D, E]``); ``static`` is already per source rank and is left as it is.
    """
    d = solve(problem, policy, **(options or {}))
    if per_node and d.policy != "static":
        if problem.per_source is None:
            raise ValueError("solve_weights: per_node needs per-source counts [D, E] in the problem")
        node_counts = node_counts_from_sources(problem.tokens, problem.placement)
        return plan_weights(topology_split(d, node_counts, problem.placement), problem.placement), d
    return plan_weights(d), d


def split_tables(y, placement: Placement) -> np.ndarray:
    """Per-source-node dispatch tables over each expert's replica columns.

    Args:
      y: ``[Nn, E, D]`` split (from `topology_split` or `flat_split`).
      placement: gives the replica columns ``log2phy [E, R]`` (−1 padded) and their GPUs.

    Returns:
      ``probs [Nn, E, R]`` float64; each row sums to 1 over the expert's replicas and is 0 on −1 columns.
      A GPU holding two replicas of e splits its share evenly between them. A row with no tokens from node m
      falls back to the flat row ``Σ_m y[m, e]`` (x's proportions), or to uniform over replicas if that is 0.
    """
    # Step 1: validate.
    y = topology_array("y", y, 3)
    E, D = placement.num_experts, placement.num_gpus
    if y.shape[1:] != (E, D):
        raise ValueError(f"y must be [Nn, E, D] with E = {E}, D = {D}, got shape {y.shape}")
    node_onehot(placement, y.shape[0])
    off = np.flatnonzero(((y > 0) & ~placement.replica_mask[None]).any(axis=(0, 2)))
    if off.size:
        raise ValueError(f"y sends tokens to GPUs without a replica for experts {off[:10].tolist()}")

    # Step 2: the one plan → table conversion (`solvers.tables.plan_weights`): own split, else the flat row,
    # else uniform; a GPU's share divided among its replicas of e; rows normalised.
    return plan_weights(y, placement)
