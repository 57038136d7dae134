"""Expert placement: which rank holds which replica (EPLB layout), slot budgets, static maps, drift corruption.

Layout (deepseek-ai/EPLB): ``phy2log [P]`` names the logical expert held by physical slot p, and slot p
lives on rank ``p // S`` (S = P / D slots per rank). Everything else (``log2phy``, ``logcnt``, the replica mask)
is derived. numpy only."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from .checks import check_array, check_fields, check_int, check_real, fmt_ids
from .eplb import check_size as check_eplb_size
from .eplb import rebalance_experts

__all__ = ["IDLE_LOAD", "MAX_PAIRS", "Placement", "slots_for", "static_map", "drift_corrupt"]

#: Load added to every expert by ``Placement.from_eplb(..., spread_idle=True)``.
IDLE_LOAD = 1e-9

#: Largest E·D (experts × ranks) a Placement accepts: its ``[E, D]`` tables would otherwise take gigabytes
#: (2^24 pairs, e.g. 4,096 experts on 4,096 ranks, is 128 MiB of int64 per table).
MAX_PAIRS = 2**24


def slots_for(num_experts: int, num_gpus: int, replication: float) -> int:
    """Physical slots for a replication ratio: ``D·⌈replication·E/D⌉`` (at least one slot per expert).

    The one rule every driver uses (phase sweeps, the demo, the benchmarks): every rank gets the same slot count
    S = ⌈replication·E/D⌉, so the realised ratio P/E can exceed ``replication`` when D does not divide it.
    """
    E = check_int("num_experts", num_experts, where="slots_for")
    D = check_int("num_gpus", num_gpus, where="slots_for")
    r = check_real("replication", replication, minimum=1.0, where="slots_for")
    per_rank = max(math.ceil(r * E / D - 1e-9), math.ceil(E / D))
    return per_rank * D


@dataclass(frozen=True, eq=False)
class Placement:
    """Replicas of E logical experts in P physical slots on D ranks.

    Build it with `from_phy2log`, `full` or `from_eplb`; the constructor itself validates the same way.

    Attributes:
      phy2log: ``[P]`` int64, logical expert of each physical slot.
      num_gpus: D; slot p lives on rank ``p // slots_per_rank``.
      num_experts: E.
      gpus_per_node: ranks per node (None = one node).
      slots_per_rank: S = P / D.
      log2phy: ``[E, R]`` int64 physical slots of each expert, ascending, −1 padded (R = max replicas).
      logcnt: ``[E]`` int64 replica count of each expert.
      slot_gpu: ``[P]`` int64 rank of each slot.
      replica_mask: ``[E, D]`` bool, expert e has at least one replica on rank d.
      replicas_on_gpu: ``[E, D]`` int64 replicas of e on d (EPLB may put two on one rank).

    Raises:
      ValueError: non-integer or out-of-range slot ids, a ragged layout (P not divisible by D), experts without a
        replica, num_gpus not divisible by gpus_per_node, counts < 1, E·D above `MAX_PAIRS`.
      ArgTypeError (a TypeError): a count that is not an integer (``num_gpus="2"``, ``2.0``), non-numeric ids.
    """

    phy2log: np.ndarray
    num_gpus: int
    num_experts: int
    gpus_per_node: int | None = None
    slots_per_rank: int = field(init=False)
    log2phy: np.ndarray = field(init=False)
    logcnt: np.ndarray = field(init=False)
    slot_gpu: np.ndarray = field(init=False)
    replica_mask: np.ndarray = field(init=False)
    replicas_on_gpu: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        # Step 0: validate (one path for every constructor).
        p2l, D, E = _validated(self.phy2log, self.num_gpus, self.num_experts, self.gpus_per_node)
        object.__setattr__(self, "phy2log", p2l)
        object.__setattr__(self, "num_gpus", D)
        object.__setattr__(self, "num_experts", E)
        P = p2l.shape[0]
        # Step 1: derive slot → rank and replica counts.
        S = P // D
        slot_gpu = np.arange(P, dtype=np.int64) // S
        logcnt = np.bincount(p2l, minlength=E).astype(np.int64)
        on_rank = np.zeros((E, D), dtype=np.int64)
        np.add.at(on_rank, (p2l, slot_gpu), 1)
        # Step 2: log2phy, ascending slot order per expert, −1 padded.
        r_max = int(logcnt.max(initial=1))
        log2phy = np.full((E, r_max), -1, dtype=np.int64)
        order = np.argsort(p2l, kind="stable")
        starts = np.concatenate([[0], np.cumsum(logcnt)[:-1]])
        rank = np.arange(P) - starts[p2l[order]]
        log2phy[p2l[order], rank] = order
        for name, val in (
            ("slots_per_rank", S),
            ("log2phy", log2phy),
            ("logcnt", logcnt),
            ("slot_gpu", slot_gpu),
            ("replica_mask", on_rank > 0),
            ("replicas_on_gpu", on_rank),
        ):
            if isinstance(val, np.ndarray):
                val.setflags(write=False)
            object.__setattr__(self, name, val)
        p2l.setflags(write=False)

    @cached_property
    def key(self) -> str:
        """Identity of this layout (16 hex digits of a hash of ``phy2log``, D, E and the node size): equal for equal
        layouts. Tables built from a placement carry it, so the layer compares layouts without reading arrays."""
        h = hashlib.sha256(self.phy2log.tobytes())
        h.update(f"{self.num_gpus},{self.num_experts},{self.gpus_per_node}".encode())
        return h.hexdigest()[:16]

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_phy2log(
        cls, phy2log, num_gpus: int, gpus_per_node: int | None = None, num_experts: int | None = None
    ) -> Placement:
        """Build from an EPLB ``phy2log`` of shape ``[P]`` (or ``[D, S]``); ``num_experts`` defaults to
        ``max(phy2log) + 1``.

        Raises:
          ValueError: see the class docstring.
        """
        arr = _ids(phy2log)
        if num_experts is None and arr.size:
            # at least 1; a huge id is caught by the range checks (E > P), before anything of size E exists
            num_experts = max(int(arr.max()) + 1, 1)
        return cls(arr, num_gpus, num_experts, gpus_per_node)

    @classmethod
    def full(cls, num_experts: int, num_gpus: int, gpus_per_node: int | None = None) -> Placement:
        """Full replication: every rank holds one replica of every expert (P = E·D)."""
        E = _positive("num_experts", num_experts, "Placement.full")
        D = _positive("num_gpus", num_gpus, "Placement.full")
        _check_pairs(E, D, "Placement.full")
        return cls.from_phy2log(np.tile(np.arange(E), D), D, gpus_per_node, E)

    @classmethod
    def spread(
        cls, num_experts: int, num_gpus: int, slots_per_rank: int, gpus_per_node: int | None = None
    ) -> Placement:
        """Slot p holds expert ``p mod E`` (P = D·S ≥ E): every expert once, the spare slots replicate experts
        0, 1, … in turn, and two replicas of one expert sit ``E`` slots apart, so on different ranks whenever
        S ≤ E. The even layout with no load to go by (an import, a fresh model)."""
        E = _positive("num_experts", num_experts, "Placement.spread")
        D = _positive("num_gpus", num_gpus, "Placement.spread")
        S = _positive("slots_per_rank", slots_per_rank, "Placement.spread")
        _check_pairs(E, D, "Placement.spread")
        if D * S < E:
            raise ValueError(
                f"Placement.spread: {D} ranks × {S} slots = {D * S} slots cannot hold {E} experts; "
                f"use slots_per_rank ≥ ⌈E / D⌉ = {-(-E // D)}"
            )
        return cls.from_phy2log(np.arange(D * S) % E, D, gpus_per_node, E)

    @classmethod
    def from_eplb(
        cls,
        load,
        num_replicas: int,
        num_gpus: int,
        *,
        num_groups: int = 1,
        num_nodes: int = 1,
        spread_idle: bool = False,
    ) -> Placement:
        """EPLB placement of ``num_replicas`` slots from a long-run per-expert load ``[E]``.

        ``spread_idle``: add a vanishing load (`IDLE_LOAD` = 1e-9) to every expert first, so experts with no
        recorded load share the spare replicas instead of EPLB stacking them all on expert 0 (what a window of
        counts with zeros needs; a long-run average has no zeros).
        """
        where = "Placement.from_eplb"
        load = check_array("load", load, ndims=(1,), nonnegative=True, where=where)
        num_replicas = _positive("num_replicas", num_replicas, where)
        num_gpus = _positive("num_gpus", num_gpus, where)
        num_groups = _positive("num_groups", num_groups, where)
        num_nodes = _positive("num_nodes", num_nodes, where)
        _check_pairs(load.shape[0], num_gpus, where)
        if num_replicas >= load.shape[0]:  # (fewer is refused by rebalance_experts, naming the rule)
            check_eplb_size(1, load.shape[0], num_replicas, num_gpus, where=where)  # before any work
        if num_nodes > 1 and num_gpus % num_nodes:
            # rebalance_experts accepts this (global policy, as upstream); a Placement needs equal nodes.
            raise ValueError(
                f"Placement.from_eplb: num_nodes ({num_nodes}) must divide num_gpus ({num_gpus}) so every node holds "
                f"the same number of ranks; pass num_nodes=1 for a flat layout"
            )
        if spread_idle:
            load = load + IDLE_LOAD
        phy2log, _, _ = rebalance_experts(load[None, :], num_replicas, num_groups, num_nodes, num_gpus)
        gpn = num_gpus // num_nodes if num_nodes > 1 else None
        return cls.from_phy2log(phy2log[0], num_gpus, gpn, load.shape[0])

    # ------------------------------------------------------------------ derived views
    @property
    def num_slots(self) -> int:
        return int(self.phy2log.shape[0])

    @property
    def is_full(self) -> bool:
        """True when every expert has a replica on every rank."""
        return bool(self.replica_mask.all())

    @property
    def node_of_gpu(self) -> np.ndarray:
        """``[D]`` node index of each rank (all zeros without ``gpus_per_node``)."""
        gpn = self.gpus_per_node or self.num_gpus
        return np.arange(self.num_gpus) // gpn

    @property
    def num_nodes(self) -> int:
        return int(self.node_of_gpu.max()) + 1

    @cached_property
    def replica_gpu_lists(self) -> list[list[int]]:
        """Ranks holding each expert, as plain lists (computed once; hot loops of the solvers read it)."""
        return [np.flatnonzero(row).tolist() for row in self.replica_mask]

    @cached_property
    def sole_gpu(self) -> np.ndarray:
        """``[E]`` int64: the rank holding every replica of the expert, or −1 when replicas span ranks."""
        single = self.replica_mask.sum(axis=1) == 1
        return np.where(single, self.replica_mask.argmax(axis=1), -1)

    def to_dict(self) -> dict:
        return {
            "phy2log": self.phy2log.tolist(),
            "num_gpus": self.num_gpus,
            "num_experts": self.num_experts,
            "gpus_per_node": self.gpus_per_node,
        }

    @classmethod
    def from_dict(cls, d: dict) -> Placement:
        """Inverse of `to_dict`: ``{phy2log, num_gpus[, gpus_per_node, num_experts]}``; other keys are refused."""
        check_fields(
            "placement", d, ("phy2log", "num_gpus"), ("gpus_per_node", "num_experts"), where="Placement.from_dict"
        )
        return cls.from_phy2log(d["phy2log"], d["num_gpus"], d.get("gpus_per_node"), d.get("num_experts"))

    def __repr__(self) -> str:
        return (
            f"Placement(E={self.num_experts}, D={self.num_gpus}, P={self.num_slots}, "
            f"replicas/expert={self.num_slots / self.num_experts:.2f}, nodes={self.num_nodes})"
        )


def _positive(name: str, value, where: str = "") -> int:
    return check_int(name, value, where=where)


def _check_pairs(E: int, D: int, where: str = "Placement") -> None:
    if E * D > MAX_PAIRS:
        gib = E * D * 8 / 2**30
        raise ValueError(
            f"{where}: {E} experts × {D} ranks = {E * D:,} expert-rank pairs exceeds the supported {MAX_PAIRS:,} "
            f"(MAX_PAIRS; the [E, D] tables alone would take {gib:.1f} GiB); check the expert ids and counts"
        )


def _ids(phy2log) -> np.ndarray:
    """``phy2log`` as an int64 array (integer-valued floats are accepted)."""
    return check_array("phy2log", phy2log, integer=True, hint="integer expert ids, [P] or [D, S]")


def _validated(phy2log, num_gpus, num_experts, gpus_per_node) -> tuple[np.ndarray, int, int]:
    """Checked ``(phy2log [P] int64 copy, D, E)`` of a layout; see `Placement` for what is rejected."""
    D = _positive("num_gpus", num_gpus, "Placement")
    if num_experts is None:
        raise ValueError("num_experts is required (use Placement.from_phy2log to infer it from phy2log)")
    E = _positive("num_experts", num_experts, "Placement")
    gpn = None if gpus_per_node is None else _positive("gpus_per_node", gpus_per_node, "Placement")
    arr = _ids(phy2log)
    if arr.ndim == 2:
        if arr.shape[0] != D:
            raise ValueError(f"ragged layout: phy2log has {arr.shape[0]} rank rows but num_gpus={D}")
        arr = arr.reshape(-1)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"phy2log must be a non-empty [P] or [D, S] array, got shape {np.shape(phy2log)}")
    P = arr.shape[0]
    if P % D:
        raise ValueError(
            f"ragged layout: {P} physical slots do not split evenly over {D} GPUs "
            f"(EPLB puts P / num_gpus slots on every GPU)"
        )
    bad = np.flatnonzero((arr < 0) | (arr >= E))
    if bad.size:
        raise ValueError(
            f"slot ids out of range: slots {fmt_ids(bad)} hold experts {fmt_ids(arr[bad])} (valid: 0..{E - 1})"
        )
    if E > P:
        raise ValueError(f"{E} experts but only {P} physical slots: every expert needs ≥ 1 slot")
    _check_pairs(E, D)
    missing = np.flatnonzero(np.bincount(arr, minlength=E) == 0)
    if missing.size:
        raise ValueError(f"experts without a replica: {fmt_ids(missing)}; every expert needs ≥ 1 physical slot")
    if gpn is not None and D % gpn:
        raise ValueError(f"num_gpus={D} is not a multiple of gpus_per_node={gpus_per_node}")
    return arr.copy(), D, E


def static_map(placement: Placement, source_gpus=None) -> np.ndarray:
    """Fixed logical → physical map per source rank (the `static` policy).

    Each source sends each expert to one replica: the one on its own rank if any, else one on its node,
    else one spread fairly over all replicas by source index (source s takes candidate ``s mod k``).

    Args:
      placement: the placement.
      source_gpus: ``[Gs]`` rank of each source (default: source s on rank s, Gs = D).

    Returns:
      ``[Gs, E]`` int64 physical slot chosen by each source for each expert.
    """
    src = np.arange(placement.num_gpus) if source_gpus is None else np.asarray(source_gpus, dtype=np.int64)
    if src.ndim != 1 or np.any((src < 0) | (src >= placement.num_gpus)):
        raise ValueError(f"source_gpus must be [Gs] rank ids in 0..{placement.num_gpus - 1}, got {source_gpus!r}")
    node = placement.node_of_gpu
    Gs = src.shape[0]
    rank = np.arange(Gs)
    out = np.empty((Gs, placement.num_experts), dtype=np.int64)
    for e in range(placement.num_experts):
        slots = placement.log2phy[e, : placement.logcnt[e]]
        gpus = placement.slot_gpu[slots]
        own = gpus[None, :] == src[:, None]  # [Gs, r]
        near = node[gpus][None, :] == node[src][:, None]
        # Step 1: own rank, else Step 2: own node, else Step 3: every replica; source i takes candidate i mod k.
        cand = np.where(own.any(axis=1, keepdims=True), own, np.where(near.any(axis=1, keepdims=True), near, True))
        k = rank % cand.sum(axis=1)
        out[:, e] = slots[np.argmax(np.cumsum(cand, axis=1) > k[:, None], axis=1)]
    return out


def drift_corrupt(weight, hot: int, seed: int = 0) -> np.ndarray:
    """Drift corruption (TEMPO §5.5, the paper's "drift-K"): swap each row's ``hot`` hottest experts' loads with
    ``hot`` random cold ones.

    Args:
      weight: ``[E]`` or ``[L, E]`` long-run expert loads.
      hot: number of hot experts to swap (the paper's K = 8/16/32; not the top-k K); needs 2·hot ≤ E.
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
    if hot < 0 or 2 * hot > E:
        raise ValueError(f"drift hot={hot} needs 0 ≤ 2·hot ≤ E={E}")
    rng = np.random.default_rng(seed)
    for row in w:
        top = np.argsort(-row, kind="stable")[:hot]
        cold_pool = np.setdiff1d(np.arange(E), top)
        cold = rng.choice(cold_pool, size=hot, replace=False)
        row[top], row[cold] = row[cold].copy(), row[top].copy()
    return w[0] if squeeze else w
