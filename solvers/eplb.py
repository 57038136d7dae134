"""NumPy re-implementation of DeepSeek's expert-parallelism load balancer (EPLB).

Same inputs, outputs and results as ``rebalance_experts`` in https://github.com/deepseek-ai/EPLB, without
torch. Shapes: ``L`` layers, ``E`` logical experts, ``P = num_replicas`` physical expert slots.

Hierarchical policy (``num_groups % num_nodes == 0``):

1. pack expert groups onto nodes (balanced packing of group loads, ``num_groups / num_nodes`` per node);
2. inside each node, add redundant replicas one at a time to the expert with the largest load per replica;
3. pack each node's replicas onto its GPUs (balanced packing, ``P / num_gpus`` per GPU).

Otherwise the global policy runs the same steps with one group and one node (whatever ``num_gpus % num_nodes``
is: upstream checks ``num_nodes | num_gpus`` only inside the hierarchical policy).

Arithmetic is float32 like EPLB's ``weight.float()``. Ties go to the lowest index everywhere: descending
sorts are stable, ``argmax``/``argmin`` return the first extremum (as torch's ``max``/Python's ``min`` do).

Ties and upstream: EPLB orders items with ``torch.sort(descending=True)``, which is not stable on CPU above
16 elements, so on tied loads (frequent with integer token counts) upstream's slot order is
implementation-defined. Here ties always go to the lowest index, which is what upstream computes with a
stable sort. Smallest case where the two can differ: 17 experts of equal weight on one GPU
(``rebalance_experts(np.ones((1, 17)), 17, 1, 1, 1)``): here ``phy2log = [0, 1, …, 16]``; upstream packs the
17 tied slots in whatever order its sort returns. Under the global policy only which tied slot lands where can
differ (``logcnt`` and every GPU's load are the same); under the hierarchical one, tied group loads can also send
different groups to a node.
"""

from __future__ import annotations

import numpy as np

from .checks import check_array, check_int

__all__ = [
    "MAX_REPLICAS",
    "MAX_SLOTS",
    "MAX_WORK",
    "balanced_packing",
    "check_size",
    "replicate_experts",
    "rebalance_experts",
]

_F32_MAX = float(np.finfo(np.float32).max)

#: Most physical slots (layers × num_replicas) one call may lay out.
MAX_SLOTS = 2**24
#: Most slots per layer: EPLB places them one at a time (a Python step each, ~40 µs).
MAX_REPLICAS = 2**16
#: Most elementary operations, layers × ((P − E)·E + P·D): replication scans every expert per redundant slot and
#: packing every GPU per slot. At the limits one call takes a few seconds on a 2-core box.
MAX_WORK = 2**29


def check_size(layers: int, experts: int, num_replicas: int, num_gpus: int, *, where: str) -> None:
    """ValueError, before any work, for a layout beyond `MAX_SLOTS`, `MAX_REPLICAS` or `MAX_WORK`."""
    fix = "call it per layer group or with fewer replicas"
    if layers * num_replicas > MAX_SLOTS:  # every slot is walked in Python: refuse before hours of work
        raise ValueError(
            f"{where}: layers × num_replicas = {layers:,} × {num_replicas:,} exceeds the supported "
            f"{MAX_SLOTS:,} slots; {fix}"
        )
    if num_replicas > MAX_REPLICAS:
        raise ValueError(
            f"{where}: num_replicas={num_replicas:,} exceeds the supported {MAX_REPLICAS:,} slots per "
            "layer (EPLB places slots one at a time)"
        )
    work = layers * ((num_replicas - experts) * experts + num_replicas * num_gpus)
    if work > MAX_WORK:
        raise ValueError(
            f"{where}: {layers:,} layer(s) × ((P − E)·E + P·D) with E={experts:,}, "
            f"P={num_replicas:,}, D={num_gpus:,} is {work:.2e} steps, over the {MAX_WORK:.2e} that run "
            f"in seconds; {fix}"
        )


def _as_float(weight: np.ndarray) -> np.ndarray:
    w = np.asarray(weight)
    if w.ndim != 2:
        raise ValueError(f"weight must be 2-D [layers, items], got shape {w.shape}")
    return w if np.issubdtype(w.dtype, np.floating) else w.astype(np.float64)


def _inverse(perm: np.ndarray) -> np.ndarray:
    """Row-wise inverse of a batch of permutations [X, n]."""
    inv = np.empty_like(perm)
    np.put_along_axis(inv, perm, np.broadcast_to(np.arange(perm.shape[1]), perm.shape), axis=1)
    return inv


def balanced_packing(weight: np.ndarray, num_packs: int) -> tuple[np.ndarray, np.ndarray]:
    """Greedily pack ``n`` weighted items into ``num_packs`` packs of exactly ``n / num_packs`` items each.

    Args:
        weight: [X, n] item weights (one independent problem per row).
        num_packs: number of packs; must divide ``n``.

    Returns:
        pack_index: [X, n] int64, pack of each item.
        rank_in_pack: [X, n] int64, position of each item inside its pack.
    """
    w = _as_float(weight)
    rows, n = w.shape
    if num_packs <= 0 or n % num_packs:
        raise ValueError(f"cannot pack {n} items into {num_packs} packs of equal item count")
    per_pack = n // num_packs

    # Step 1: one item per pack -> item i goes to pack i (EPLB's shortcut, not the greedy order).
    if per_pack == 1:
        return np.broadcast_to(np.arange(n), (rows, n)).copy(), np.zeros((rows, n), dtype=np.int64)

    # Step 2: visit items heaviest first (stable, so equal weights keep index order).
    order = np.argsort(-w, axis=1, kind="stable")
    pack_index = np.full((rows, n), -1, dtype=np.int64)
    rank_in_pack = np.full((rows, n), -1, dtype=np.int64)
    pack_weight = np.zeros((rows, num_packs), dtype=w.dtype)
    pack_items = np.zeros((rows, num_packs), dtype=np.int64)
    r = np.arange(rows)

    # Step 3: each item joins the lightest pack that still has room (lowest pack index on ties).
    for item in order.T:
        pack = np.argmin(np.where(pack_items < per_pack, pack_weight, np.inf), axis=1)
        pack_index[r, item] = pack
        rank_in_pack[r, item] = pack_items[r, pack]
        pack_weight[r, pack] += w[r, item]
        pack_items[r, pack] += 1
    return pack_index, rank_in_pack


def replicate_experts(weight: np.ndarray, num_phy: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Replicate ``n`` logical experts into ``num_phy`` physical ones, minimising the max load per replica.

    Args:
        weight: [X, n] load of each logical expert.
        num_phy: number of physical experts, ``>= n``.

    Returns:
        phy2log: [X, num_phy] int64, logical expert of each physical expert.
        rank: [X, num_phy] int64, replica rank of each physical expert within its logical expert.
        logcnt: [X, n] int64, number of replicas of each logical expert.
    """
    w = _as_float(weight)
    rows, n = w.shape
    if num_phy < n:
        raise ValueError(f"num_phy ({num_phy}) must be >= the number of logical experts ({n})")

    # Step 1: every logical expert gets one replica, physical expert i < n is logical expert i.
    phy2log = np.zeros((rows, num_phy), dtype=np.int64)
    phy2log[:, :n] = np.arange(n)
    rank = np.zeros((rows, num_phy), dtype=np.int64)
    logcnt = np.ones((rows, n), dtype=np.int64)
    r = np.arange(rows)

    # Step 2: each redundant slot goes to the expert with the largest load per replica (first on ties).
    for slot in range(n, num_phy):
        best = np.argmax(w / logcnt.astype(w.dtype), axis=1)
        phy2log[:, slot] = best
        rank[:, slot] = logcnt[r, best]
        logcnt[r, best] += 1
    return phy2log, rank, logcnt


def _rebalance_hierarchical(
    w: np.ndarray, num_phy: int, num_groups: int, num_nodes: int, num_gpus: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """EPLB's hierarchical policy on float32 weights [L, E]; returns (phy2log, phyrank, logcnt)."""
    layers, num_log = w.shape
    group_size = num_log // num_groups
    groups_per_node = num_groups // num_nodes
    log_per_node = num_log // num_nodes
    phy_per_gpu = num_phy // num_gpus

    # Step 1: pack groups onto nodes; "mlog" numbers experts node by node (node-major, group-contiguous).
    group_load = w.reshape(layers, num_groups, group_size).sum(axis=-1)
    group_pack, group_rank = balanced_packing(group_load, num_nodes)
    group_start = (group_pack * groups_per_node + group_rank) * group_size
    log2mlog = (group_start[:, :, None] + np.arange(group_size)).reshape(layers, num_log)
    mlog2log = _inverse(log2mlog)

    # Step 2: replicate experts inside each node; rows become (layer, node) pairs.
    mlog_load = np.take_along_axis(w, mlog2log, axis=1).reshape(layers * num_nodes, log_per_node)
    phy2mlog, phyrank, mlogcnt = replicate_experts(mlog_load, num_phy // num_nodes)

    # Step 3: pack each node's replicas onto its GPUs, phy_per_gpu slots each.
    phy_load = np.take_along_axis(mlog_load / mlogcnt.astype(w.dtype), phy2mlog, axis=1)
    gpu, gpu_rank = balanced_packing(phy_load, num_gpus // num_nodes)
    pphy2phy = _inverse(gpu * phy_per_gpu + gpu_rank)

    # Step 4: map the final slot order back to global logical expert ids.
    pphy2mlog = np.take_along_axis(phy2mlog, pphy2phy, axis=1).reshape(layers, num_nodes, -1)
    pphy2mlog = (pphy2mlog + (np.arange(num_nodes) * log_per_node)[:, None]).reshape(layers, num_phy)
    pphy2log = np.take_along_axis(mlog2log, pphy2mlog, axis=1)
    pphyrank = np.take_along_axis(phyrank, pphy2phy, axis=1).reshape(layers, num_phy)
    logcnt = np.take_along_axis(mlogcnt.reshape(layers, num_log), log2mlog, axis=1)
    return pphy2log, pphyrank, logcnt


def rebalance_experts(
    weight: np.ndarray, num_replicas: int, num_groups: int, num_nodes: int, num_gpus: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Expert-parallelism load balancer (EPLB), numpy edition.

    Args:
        weight: [L, E] load statistics of each logical expert (finite, non-negative).
        num_replicas: P, number of physical expert slots; multiple of ``num_gpus``, ``>= E``.
        num_groups: number of expert groups (must divide E when the hierarchical policy is used).
        num_nodes: number of server nodes. The hierarchical policy is used when ``num_groups % num_nodes == 0``
            (then ``num_nodes`` must divide ``num_gpus``), otherwise the global one (a single group and node,
            any ``num_gpus``), exactly as upstream decides.
        num_gpus: number of GPUs.

    Returns:
        phy2log: [L, P] int64, logical expert in each slot; slot ``s`` is on GPU ``s // (P / num_gpus)``.
        log2phy: [L, E, X] int64 with X = ``logcnt.max()`` over all layers (upstream's shape): slots of each
            logical expert by replica rank, padded with -1.
        logcnt: [L, E] int64, number of replicas of each logical expert.

    Raises:
        ValueError: a weight that is not a finite, non-negative [L, E] array with L, E >= 1, or arguments
            upstream's assertions reject (each message names the argument and the rule).

    Ties go to the lowest index (see the module docstring): equal to upstream run with a stable sort, while
    upstream's own CPU sort orders tied items arbitrarily above 16 of them.
    """
    w = check_array("weight [layers, experts]", weight, ndims=(2,), nonnegative=True)
    layers, num_log = w.shape
    if num_log == 0 or layers == 0:
        raise ValueError(f"weight must have at least one layer and one expert, got shape {w.shape}")
    args = {"num_replicas": num_replicas, "num_groups": num_groups, "num_nodes": num_nodes, "num_gpus": num_gpus}
    num_replicas, num_groups, num_nodes, num_gpus = (
        check_int(name, v, where="rebalance_experts") for name, v in args.items()
    )
    row_sums = w.sum(axis=1)
    if (row_sums > _F32_MAX).any():  # EPLB sums loads in float32: an overflow to inf would corrupt the packing
        layer = int(np.argmax(row_sums > _F32_MAX))
        raise ValueError(
            f"rebalance_experts: weight[{layer}] sums to {row_sums[layer]:.3g}, beyond float32's {_F32_MAX:.3g} "
            "(EPLB computes in float32); scale the weights down (the layout depends only on their ratios)"
        )
    if num_replicas < num_log:
        raise ValueError(f"num_replicas ({num_replicas}) must be >= the number of experts ({num_log})")
    if num_replicas % num_gpus:
        raise ValueError(f"num_replicas ({num_replicas}) must be divisible by num_gpus ({num_gpus})")
    check_size(layers, num_log, num_replicas, num_gpus, where="rebalance_experts")

    # Step 1: choose the policy as upstream does; the global one is the hierarchical one with a single group and
    # node, so only the hierarchical policy needs num_nodes | num_gpus and num_groups | E.
    if num_groups % num_nodes:
        num_groups, num_nodes = 1, 1
    else:
        if num_log % num_groups:
            raise ValueError(
                f"number of experts ({num_log}) must be divisible by num_groups ({num_groups}) for the hierarchical "
                f"policy (num_groups % num_nodes == 0)"
            )
        if num_gpus % num_nodes:
            raise ValueError(
                f"num_gpus ({num_gpus}) must be divisible by num_nodes ({num_nodes}) for the hierarchical policy "
                f"(num_groups={num_groups} is a multiple of num_nodes); upstream asserts the same"
            )

    # Step 2: place the replicas (float32, as EPLB computes on weight.float()).
    phy2log, phyrank, logcnt = _rebalance_hierarchical(
        w.astype(np.float32), num_replicas, num_groups, num_nodes, num_gpus
    )

    counted = np.stack([np.bincount(row, minlength=num_log) for row in phy2log])
    if not np.array_equal(counted, logcnt) or (logcnt < 1).any():  # never hand out an inconsistent layout
        raise RuntimeError("rebalance_experts produced an inconsistent layout (a bug: please report the weights)")

    # Step 3: invert into log2phy, one row of max(logcnt) entries per expert (upstream's width), -1 padded.
    max_replicas = int(logcnt.max())
    log2phy = np.full((layers, num_log * max_replicas), -1, dtype=np.int64)
    slots = np.broadcast_to(np.arange(num_replicas), (layers, num_replicas))
    np.put_along_axis(log2phy, phy2log * max_replicas + phyrank, slots, axis=1)
    return phy2log, log2phy.reshape(layers, num_log, max_replicas), logcnt
