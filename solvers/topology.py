"""Topology-aware split (TEMPO §4.3, §5.15): stage 2 of the two-stage multi-node dispatch.

Stage 1 solves the flat dispatch ``x [E, D]`` (tokens of expert e processed on GPU g). Stage 2 decides which
source node's tokens fill which replica: for each expert, a same-node-first transportation rule pairs each
node's tokens with that expert's capacity ``x[e, g]`` on the node's own GPUs before anything crosses the
inter-node network. The result ``y [Nn, E, D]`` realises x exactly, so per-GPU loads (and the modelled
makespan) are those of the flat solution; only the pairing of sources to replicas changes.
`solvers.tables.split_tables` turns y into one dispatch table per source node over each expert's replica columns.

Why it is optimal. Per expert this is a transportation problem with cost 0 on same-node (source node, GPU)
pairs and 1 otherwise, so inter-node tokens = n_e − same-node flow. Any split sends at most
``min(node_counts[m, e], Σ_{g on m} x[e, g])`` same-node tokens from node m (its supply, and the capacity
there), and the rule attains that bound for every m at once, hence inter-node traffic is minimal.

numpy only."""

from __future__ import annotations

import numpy as np

from .checks import check_array
from .placement import Placement

__all__ = [
    "topology_split",
    "flat_split",
    "inter_node_tokens",
    "node_counts_from_sources",
    "node_onehot",
    "nonneg_array",
]

_RTOL = 1e-6


def nonneg_array(name: str, a, ndim: int) -> np.ndarray:
    """float64 copy of ``a`` with ``ndim`` axes, finite and non-negative, or ValueError."""
    a = getattr(a, "x", a) if name == "x" else a  # a solvers.Dispatch is accepted for x
    return check_array(name, a, ndims=(ndim,), nonnegative=True)


def _check_marginals(x: np.ndarray, node_counts: np.ndarray) -> np.ndarray:
    """Check ``node_counts [Nn, E]`` columns sum to x's rows ``[E, D]``; return ``n [E]`` (x's row sums)."""
    if node_counts.shape[1] != x.shape[0]:
        raise ValueError(
            f"node_counts has {node_counts.shape[1]} experts but x has {x.shape[0]}"
            f" (shapes {list(node_counts.shape)}, {list(x.shape)})"
        )
    n = x.sum(axis=1)
    bad = np.flatnonzero(np.abs(node_counts.sum(axis=0) - n) > _RTOL * np.maximum(n, 1.0))
    if bad.size:
        e = int(bad[0])
        raise ValueError(
            f"node_counts column sums differ from x row sums for experts {bad[:10].tolist()}"
            f" (expert {e}: {node_counts[:, e].sum():.6g} vs {n[e]:.6g}); both must count the same tokens"
        )
    return n


def node_onehot(placement: Placement, num_nodes: int) -> np.ndarray:
    """``[Nn, D]`` bool, GPU g lies on node m; ValueError when Nn differs from the placement's node count."""
    if not isinstance(placement, Placement):
        raise ValueError(f"placement must be a solvers.Placement, got {type(placement).__name__}")
    if num_nodes != placement.num_nodes:
        raise ValueError(
            f"got {num_nodes} source nodes but the placement has {placement.num_nodes} "
            f"(gpus_per_node={placement.gpus_per_node}; a placement without gpus_per_node is one node)"
        )
    return placement.node_of_gpu[None, :] == np.arange(num_nodes)[:, None]


def topology_split(x, node_counts, placement: Placement) -> np.ndarray:
    """Same-node-first split of the flat dispatch over source nodes.

    Args:
      x: ``[E, D]`` flat dispatch (tokens of e processed on g), zero off the replica mask; or a `Dispatch`.
      node_counts: ``[Nn, E]`` tokens of e originating on node m; column sums equal x's row sums (1e-6
        relative; they are rescaled to match exactly).
      placement: the placement x was solved on (``node_of_gpu`` gives the topology).

    Returns:
      ``y [Nn, E, D]`` float64 with ``Σ_m y = x``, ``Σ_g y = node_counts``, ``y ≥ 0``, y > 0 only where x > 0,
      and the fewest inter-node tokens of any such split. Same-node tokens are spread over the node's GPUs in
      proportion to ``x[e, g]``; the remainder is shipped in proportion to each GPU's remaining capacity.

    Raises:
      ValueError: bad shapes, negative / NaN entries, x on GPUs without a replica, mismatched marginals, or
        a node count that differs from the placement's.
    """
    # Step 1: validate; rescale node_counts so its column sums equal x's row sums exactly.
    x = nonneg_array("x", x, 2)
    counts = nonneg_array("node_counts", node_counts, 2)
    if x.shape != placement.replica_mask.shape:
        raise ValueError(f"x must be [E, D] = {list(placement.replica_mask.shape)}, got {list(x.shape)}")
    off = np.flatnonzero(((x > 0) & ~placement.replica_mask).any(axis=1))
    if off.size:
        raise ValueError(f"x puts tokens on GPUs without a replica for experts {off[:10].tolist()}")
    n = _check_marginals(x, counts)
    onehot = node_onehot(placement, counts.shape[0])  # [Nn, D]
    total = counts.sum(axis=0)
    counts = counts * np.divide(n, total, out=np.zeros_like(n), where=total > 0)

    # Step 2: same-node capacity cap[m, e] = Σ_{g on m} x[e, g]; node m keeps s = min(supply, capacity).
    cap = onehot.astype(np.float64) @ x.T  # [Nn, E]
    kept = np.minimum(counts, cap)
    frac = np.divide(kept, cap, out=np.zeros_like(cap), where=cap > 0)  # share of the node's capacity used
    y_local = onehot[:, None, :] * frac[:, :, None] * x[None, :, :]  # ∝ x[e, g] over the node's GPUs

    # Step 3: leftover supply and capacity. A node with leftover supply used all its own capacity
    # (frac = 1), so its GPUs have no leftover capacity and every shipped token crosses nodes.
    supply = counts - kept  # [Nn, E]
    room = x * (1.0 - frac[placement.node_of_gpu].T)  # [E, D]: frac of each GPU's node, gathered per GPU
    room_e = room.sum(axis=1)

    # Step 4: ship each node's leftover to the other nodes' leftover capacity, proportionally.
    share = np.divide(room, room_e[:, None], out=np.zeros_like(room), where=room_e[:, None] > 0)
    return y_local + supply[:, :, None] * share[None, :, :]


def flat_split(x, node_counts) -> np.ndarray:
    """The flat table every node uses: ``y[m, e, g] = node_counts[m, e] · x[e, g] / n_e`` (``[Nn, E, D]``).

    Args:
      x: ``[E, D]`` flat dispatch (or a `Dispatch`); node_counts: ``[Nn, E]`` with column sums = x's row sums.
    """
    # Step 1: validate.
    x = nonneg_array("x", x, 2)
    counts = nonneg_array("node_counts", node_counts, 2)
    n = _check_marginals(x, counts)
    # Step 2: every source node splits each expert like the flat row x[e] / n_e.
    row = np.divide(x, n[:, None], out=np.zeros_like(x), where=n[:, None] > 0)
    return counts[:, :, None] * row[None, :, :]


def inter_node_tokens(y, placement: Placement) -> float:
    """Tokens of ``y [Nn, E, D]`` sent from source node m to a GPU on another node."""
    y = nonneg_array("y", y, 3)
    if y.shape[2] != placement.num_gpus:
        raise ValueError(f"y must be [Nn, E, D] with D = {placement.num_gpus}, got shape {y.shape}")
    onehot = node_onehot(placement, y.shape[0])
    return float(y.sum() - np.einsum("meg,mg->", y, onehot.astype(np.float64)))


def node_counts_from_sources(counts, placement: Placement, source_gpus=None) -> np.ndarray:
    """Aggregate per-source-rank counts ``[Gs, E]`` into per-source-node counts ``[Nn, E]``.

    Args:
      counts: ``[Gs, E]`` token–expert pairs originating on each source rank.
      placement: gives each GPU's node.
      source_gpus: ``[Gs]`` rank of each source (default: source s on rank s, which needs Gs = D).
    """
    # Step 1: validate.
    counts = nonneg_array("counts", counts, 2)
    Gs, D = counts.shape[0], placement.num_gpus
    if counts.shape[1] != placement.num_experts:
        raise ValueError(f"counts must be [Gs, E] with E = {placement.num_experts}, got shape {counts.shape}")
    if source_gpus is None:
        if Gs != D:
            raise ValueError(f"counts has {Gs} source rows but the placement has {D} GPUs; pass source_gpus")
        source_gpus = np.arange(D)
    src = np.asarray(source_gpus)
    if src.shape != (Gs,) or src.dtype.kind not in "iu" or np.any((src < 0) | (src >= D)):
        raise ValueError(f"source_gpus must be [Gs] = [{Gs}] GPU ids in 0..{D - 1}, got {source_gpus!r}")
    # Step 2: sum the rows of each node's sources.
    out = np.zeros((placement.num_nodes, counts.shape[1]))
    np.add.at(out, placement.node_of_gpu[src], counts)
    return out
