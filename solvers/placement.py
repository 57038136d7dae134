"""Expert placement: which GPU holds which replica (EPLB layout), static maps and drift corruption.

Layout (deepseek-ai/EPLB): ``phy2log [P]`` names the logical expert held by physical slot p, and slot p
lives on GPU ``p // (P / num_gpus)``. Everything else (``log2phy``, ``logcnt``, the replica mask) is derived.
numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

__all__ = ["Placement", "static_map", "drift_corrupt"]


def _fmt(ids, limit: int = 10) -> str:
    ids = [int(i) for i in ids]
    more = f" … (+{len(ids) - limit} more)" if len(ids) > limit else ""
    return str(ids[:limit]) + more


@dataclass(frozen=True, eq=False)
class Placement:
    """Replicas of E logical experts in P physical slots on G GPUs.

    Attributes:
      phy2log: ``[P]`` int64, logical expert of each physical slot.
      num_gpus: G; slot p lives on GPU ``p // slots_per_gpu``.
      num_experts: E.
      gpus_per_node: GPUs per node (None = one node).
      slots_per_gpu: P / G.
      log2phy: ``[E, R_max]`` int64 physical slots of each expert, ascending, −1 padded.
      logcnt: ``[E]`` int64 replica count of each expert.
      slot_gpu: ``[P]`` int64 GPU of each slot.
      replica_mask: ``[E, G]`` bool, expert e has at least one replica on GPU g.
      replicas_on_gpu: ``[E, G]`` int64 replicas of e on g (EPLB may put two on one GPU).
    """

    phy2log: np.ndarray
    num_gpus: int
    num_experts: int
    gpus_per_node: int | None = None
    slots_per_gpu: int = field(init=False)
    log2phy: np.ndarray = field(init=False)
    logcnt: np.ndarray = field(init=False)
    slot_gpu: np.ndarray = field(init=False)
    replica_mask: np.ndarray = field(init=False)
    replicas_on_gpu: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        p2l, G, E = self.phy2log, self.num_gpus, self.num_experts
        P = p2l.shape[0]
        # Step 1: derive slot → GPU and replica counts.
        spg = P // G
        slot_gpu = np.arange(P, dtype=np.int64) // spg
        logcnt = np.bincount(p2l, minlength=E).astype(np.int64)
        on_gpu = np.zeros((E, G), dtype=np.int64)
        np.add.at(on_gpu, (p2l, slot_gpu), 1)
        # Step 2: log2phy, ascending slot order per expert, −1 padded.
        r_max = int(logcnt.max(initial=1))
        log2phy = np.full((E, r_max), -1, dtype=np.int64)
        order = np.argsort(p2l, kind="stable")
        starts = np.concatenate([[0], np.cumsum(logcnt)[:-1]])
        rank = np.arange(P) - starts[p2l[order]]
        log2phy[p2l[order], rank] = order
        for name, val in (
            ("slots_per_gpu", spg),
            ("log2phy", log2phy),
            ("logcnt", logcnt),
            ("slot_gpu", slot_gpu),
            ("replica_mask", on_gpu > 0),
            ("replicas_on_gpu", on_gpu),
        ):
            if isinstance(val, np.ndarray):
                val.setflags(write=False)
            object.__setattr__(self, name, val)
        p2l.setflags(write=False)

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_phy2log(
        cls, phy2log, num_gpus: int, gpus_per_node: int | None = None, num_experts: int | None = None
    ) -> Placement:
        """Build from an EPLB ``phy2log`` of shape ``[P]`` (or ``[G, slots]``).

        Raises:
          ValueError: slot ids out of range, a ragged layout (P not divisible by num_gpus, or a 2-D layout
            whose rows are not num_gpus), experts without a replica (when ``num_experts`` is given), or
            num_gpus not divisible by gpus_per_node.
        """
        arr = np.asarray(phy2log)
        if arr.dtype.kind not in "iu":
            if arr.dtype.kind == "f" and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
                arr = arr.astype(np.int64)
            else:
                raise ValueError(f"phy2log must hold integer expert ids, got dtype {arr.dtype}")
        if num_gpus < 1:
            raise ValueError(f"num_gpus must be ≥ 1, got {num_gpus}")
        if arr.ndim == 2:
            if arr.shape[0] != num_gpus:
                raise ValueError(f"ragged layout: phy2log has {arr.shape[0]} GPU rows but num_gpus={num_gpus}")
            arr = arr.reshape(-1)
        if arr.ndim != 1 or arr.size == 0:
            raise ValueError(f"phy2log must be a non-empty [P] or [G, slots] array, got shape {np.shape(phy2log)}")
        P = arr.shape[0]
        if P % num_gpus:
            raise ValueError(
                f"ragged layout: {P} physical slots do not split evenly over {num_gpus} GPUs "
                f"(EPLB puts P / num_gpus slots on every GPU)"
            )
        bad = np.flatnonzero(arr < 0)
        if num_experts is not None:
            bad = np.flatnonzero((arr < 0) | (arr >= num_experts))
        if bad.size:
            raise ValueError(
                f"slot ids out of range: slots {_fmt(bad)} hold experts {_fmt(arr[bad])}"
                + ("" if num_experts is None else f" (valid: 0..{num_experts - 1})")
            )
        E = int(arr.max()) + 1 if num_experts is None else int(num_experts)
        missing = np.setdiff1d(np.arange(E), arr)
        if missing.size:
            raise ValueError(f"experts without a replica: {_fmt(missing)}; every expert needs ≥ 1 physical slot")
        if gpus_per_node is not None and (gpus_per_node < 1 or num_gpus % gpus_per_node):
            raise ValueError(f"num_gpus={num_gpus} is not a multiple of gpus_per_node={gpus_per_node}")
        return cls(arr.astype(np.int64).copy(), int(num_gpus), E, gpus_per_node)

    @classmethod
    def full(cls, num_experts: int, num_gpus: int, gpus_per_node: int | None = None) -> Placement:
        """Full replication: every GPU holds one replica of every expert (P = E·G)."""
        if num_experts < 1:
            raise ValueError(f"num_experts must be ≥ 1, got {num_experts}")
        return cls.from_phy2log(np.tile(np.arange(num_experts), num_gpus), num_gpus, gpus_per_node, num_experts)

    @classmethod
    def from_eplb(
        cls,
        load,
        num_replicas: int,
        num_gpus: int,
        *,
        num_groups: int = 1,
        num_nodes: int = 1,
    ) -> Placement:
        """EPLB placement of ``num_replicas`` slots from a long-run per-expert load ``[E]``."""
        from .eplb import rebalance_experts

        load = np.asarray(load, dtype=np.float64)
        if load.ndim != 1:
            raise ValueError(f"load must be [E], got shape {load.shape}")
        phy2log, _, _ = rebalance_experts(load[None, :], num_replicas, num_groups, num_nodes, num_gpus)
        gpn = num_gpus // num_nodes if num_nodes > 1 else None
        return cls.from_phy2log(phy2log[0], num_gpus, gpn, load.shape[0])

    # ------------------------------------------------------------------ derived views
    @property
    def num_slots(self) -> int:
        return int(self.phy2log.shape[0])

    @property
    def is_full(self) -> bool:
        """True when every expert has a replica on every GPU."""
        return bool(self.replica_mask.all())

    @property
    def node_of_gpu(self) -> np.ndarray:
        """``[G]`` node index of each GPU (all zeros without ``gpus_per_node``)."""
        gpn = self.gpus_per_node or self.num_gpus
        return np.arange(self.num_gpus) // gpn

    @property
    def num_nodes(self) -> int:
        return int(self.node_of_gpu.max()) + 1

    @cached_property
    def replica_gpu_lists(self) -> list[list[int]]:
        """GPUs holding each expert, as plain lists (computed once; hot loops of the solvers read it)."""
        return [np.flatnonzero(row).tolist() for row in self.replica_mask]

    @cached_property
    def sole_gpu(self) -> np.ndarray:
        """``[E]`` int64: the GPU holding every replica of the expert, or −1 when replicas span GPUs."""
        single = self.replica_mask.sum(axis=1) == 1
        return np.where(single, self.replica_mask.argmax(axis=1), -1)

    def replica_gpus(self, expert: int) -> np.ndarray:
        """GPUs holding a replica of ``expert`` (ascending, unique)."""
        return np.flatnonzero(self.replica_mask[expert])

    def to_dict(self) -> dict:
        return {
            "phy2log": self.phy2log.tolist(),
            "num_gpus": self.num_gpus,
            "num_experts": self.num_experts,
            "gpus_per_node": self.gpus_per_node,
        }

    @classmethod
    def from_dict(cls, d: dict) -> Placement:
        return cls.from_phy2log(d["phy2log"], d["num_gpus"], d.get("gpus_per_node"), d.get("num_experts"))

    def __repr__(self) -> str:
        return (
            f"Placement(E={self.num_experts}, G={self.num_gpus}, P={self.num_slots}, "
            f"replicas/expert={self.num_slots / self.num_experts:.2f}, nodes={self.num_nodes})"
        )


def static_map(placement: Placement, source_gpus=None) -> np.ndarray:
    """Fixed logical → physical map per source rank (the `static` policy).

    Each source sends each expert to one replica: the one on its own GPU if any, else one on its node,
    else one spread fairly over all replicas by source rank (source s takes candidate ``s mod k``).

    Args:
      placement: the placement.
      source_gpus: ``[S]`` GPU of each source rank (default: source s on GPU s, S = G).

    Returns:
      ``[S, E]`` int64 physical slot chosen by each source for each expert.
    """
    src = np.arange(placement.num_gpus) if source_gpus is None else np.asarray(source_gpus, dtype=np.int64)
    if src.ndim != 1 or np.any((src < 0) | (src >= placement.num_gpus)):
        raise ValueError(f"source_gpus must be [S] GPU ids in 0..{placement.num_gpus - 1}, got {source_gpus!r}")
    node = placement.node_of_gpu
    S = src.shape[0]
    rank = np.arange(S)
    out = np.empty((S, placement.num_experts), dtype=np.int64)
    for e in range(placement.num_experts):
        slots = placement.log2phy[e, : placement.logcnt[e]]
        gpus = placement.slot_gpu[slots]
        own = gpus[None, :] == src[:, None]  # [S, r]
        near = node[gpus][None, :] == node[src][:, None]
        # Step 1: own GPU, else Step 2: own node, else Step 3: every replica; source i takes candidate i mod k.
        cand = np.where(own.any(axis=1, keepdims=True), own, np.where(near.any(axis=1, keepdims=True), near, True))
        k = rank % cand.sum(axis=1)
        out[:, e] = slots[np.argmax(np.cumsum(cand, axis=1) > k[:, None], axis=1)]
    return out


def drift_corrupt(weight, k: int, seed: int = 0) -> np.ndarray:
    """Drift-K corruption (TEMPO §5.5): swap each row's top-K hot experts' loads with K random cold ones.

    Args:
      weight: ``[E]`` or ``[L, E]`` long-run expert loads.
      k: number of hot experts to swap (K = 8/16/32 in the paper); needs 2K ≤ E.
      seed: RNG seed (the cold partners are drawn without replacement from the non-hot experts).

    Returns:
      A corrupted copy with the same shape; the multiset of loads per row is unchanged.
    """
    w = np.array(weight, dtype=np.float64, copy=True)
    squeeze = w.ndim == 1
    w = np.atleast_2d(w)
    if w.ndim != 2:
        raise ValueError(f"weight must be [E] or [L, E], got shape {np.shape(weight)}")
    E = w.shape[1]
    if k < 0 or 2 * k > E:
        raise ValueError(f"drift K={k} needs 0 ≤ 2K ≤ E={E}")
    rng = np.random.default_rng(seed)
    for row in w:
        hot = np.argsort(-row, kind="stable")[:k]
        cold_pool = np.setdiff1d(np.arange(E), hot)
        cold = rng.choice(cold_pool, size=k, replace=False)
        row[hot], row[cold] = row[cold].copy(), row[hot].copy()
    return w[0] if squeeze else w
