"""Inter-node traffic of flat vs topology-aware dispatch tables on a multi-node layout (TEMPO §4.3, §5.15).

Glossary additions: G GPUs (EP ranks, one source rank per GPU), B tokens per GPU.

Per batch ``counts [G, E]`` (synthetic Zipf routing, source rank g on GPU g) the per-GPU shares ``x [E, G]``
are solved once (stage 1, default TEMPO); stage 2 turns them into per-source-node tables in two ways:

- flat: every node splits expert e like the global row ``x[e]/n_e`` (`solvers.flat_split`);
- topology-aware: same-node-first transportation (`solvers.topology_split`), fewest inter-node tokens among
  the splits realising exactly x.

Both realise the same x, so per-GPU loads and the modelled makespan are identical (reported as a check); only
the fraction of token–expert pairs that cross nodes changes. The static map (own GPU, else own node, else
spread) is shown for reference: its own x, so its own makespan.

Two EPLB layouts of the same slots: ``hierarchical`` (``num_groups = 8, num_nodes = Nn``: expert groups are
packed per node, so all replicas of an expert share one node and no split can keep a remote source's tokens
local) and ``global`` (one-node EPLB, then ``gpus_per_node`` assigned: replicas spread over nodes).
numpy + solvers only (no jax).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solvers import (
    PRESETS,
    DispatchProblem,
    Placement,
    flat_split,
    inter_node_tokens,
    node_counts_from_sources,
    slots_for,
    solve,
    static_map,
    topology_split,
)
from tempo_jax.workloads import SyntheticRouting, pair_share

from ..runner import stats
from .phase import MODEL_SHAPES

__all__ = ["LAYOUTS", "TopologyConfig", "topology_placement", "topology_replay", "topology_summary"]

LAYOUTS: tuple[str, ...] = ("global", "hierarchical")


@dataclass(frozen=True, kw_only=True)
class TopologyConfig:
    """A 2-node EP16 traffic replay (defaults).

    Attributes:
      preset: cost model and model shape (a key of :data:`.phase.MODEL_SHAPES`).
      num_gpus: G (EP size; one source rank per GPU).
      gpus_per_node: GPUs per node (G / gpus_per_node nodes).
      replication: physical slots / experts (slots = G·⌈replication·E/G⌉).
      num_groups: expert groups of the hierarchical EPLB layout.
      skew: Zipf exponent s of the routing.
      kappa: Dirichlet concentration of batch fluctuation.
      tokens_per_gpu: B tokens per GPU.
      batches: batches per B.
      policy: stage-1 solver.
      placement_draws: Dirichlet draws averaged into the long-run load EPLB sees.
      seed: routing seed.
    """

    preset: str = "dsv3_fp8_offline"
    num_gpus: int = 16
    gpus_per_node: int = 8
    replication: float = 1.25
    num_groups: int = 8
    skew: float = 1.2
    kappa: float = 2000.0
    tokens_per_gpu: tuple[int, ...] = (64, 256, 1024)
    batches: int = 4
    policy: str = "tempo"
    placement_draws: int = 256
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "tokens_per_gpu", tuple(self.tokens_per_gpu))
        if self.preset not in MODEL_SHAPES:
            raise ValueError(f"unknown preset {self.preset!r}; valid: {sorted(MODEL_SHAPES)}")
        if self.num_gpus % self.gpus_per_node or self.batches < 1:
            raise ValueError("num_gpus must be a multiple of gpus_per_node, and batches ≥ 1")

    @property
    def num_nodes(self) -> int:
        return self.num_gpus // self.gpus_per_node


def topology_placement(config: TopologyConfig, layout: str, load) -> Placement:
    """The ``global`` or ``hierarchical`` EPLB placement of ``config``'s slots from a long-run load ``[E]``."""
    E = len(load)
    slots = slots_for(E, config.num_gpus, config.replication)
    if layout == "hierarchical":
        return Placement.from_eplb(
            load, slots, config.num_gpus, num_groups=config.num_groups, num_nodes=config.num_nodes
        )
    if layout == "global":
        flat = Placement.from_eplb(load, slots, config.num_gpus)
        return Placement.from_phy2log(flat.phy2log, config.num_gpus, config.gpus_per_node, E)
    raise ValueError(f"unknown layout {layout!r}; valid: {LAYOUTS}")


def _static_split(counts: np.ndarray, placement: Placement) -> np.ndarray:
    """``y [Nn, E, G]`` of the static map: source s sends all its tokens of e to ``static_map[s, e]``."""
    slots = static_map(placement)  # [S, E]
    y = np.zeros((placement.num_nodes, placement.num_experts, placement.num_gpus))
    S, E = counts.shape
    src_node = np.repeat(placement.node_of_gpu[:S], E)
    np.add.at(y, (src_node, np.tile(np.arange(E), S), placement.slot_gpu[slots].ravel()), counts.ravel())
    return y


def topology_replay(config: TopologyConfig = TopologyConfig()) -> list[dict]:  # noqa: B008 (frozen)
    """Inter-node traffic per (layout, B, batch): flat vs topology-aware vs static.

    Returns:
      Rows ``{layout, B, batch, tokens, flat, topology, static}`` (fractions of the batch's token–expert pairs
      that cross nodes) plus ``makespan`` (µs, stage-1 x: the same for flat and topology-aware tables),
      ``makespan_gap`` (max |makespan(Σ_m y) − makespan(x)| over the two splits) and ``static_makespan``.
    """
    E, K = MODEL_SHAPES[config.preset]
    cost = PRESETS[config.preset]
    routing = SyntheticRouting(E, K, config.skew, kappa=config.kappa, seed=config.seed)
    # Step 1: the long-run load EPLB sees, as in the phase sweep: the pair shares of the mean of Dirichlet draws.
    rng = np.random.default_rng([config.seed, 7919])
    mean = rng.dirichlet(config.kappa * routing.popularity, size=max(config.placement_draws, 1)).mean(axis=0)
    load = pair_share(mean, K)
    rows = []
    for layout in LAYOUTS:
        pl = topology_placement(config, layout, load)
        for B in config.tokens_per_gpu:
            for step in range(config.batches):
                # Step 2: stage 1, the per-GPU shares.
                counts = routing.batch(B, config.num_gpus, step)
                d = solve(DispatchProblem(counts, pl, cost), config.policy)
                nodes = node_counts_from_sources(counts, pl)  # [Nn, E]
                # Step 3: stage 2, flat and topology-aware per-node tables; static for reference.
                y_flat, y_topo = flat_split(d, nodes), topology_split(d, nodes, pl)
                y_static = _static_split(counts, pl)
                total = float(counts.sum())
                gap = max(abs(cost.makespan(y.sum(axis=0)) - d.makespan) for y in (y_flat, y_topo))
                rows.append(
                    {
                        "layout": layout,
                        "B": B,
                        "batch": step,
                        "tokens": total,
                        "flat": inter_node_tokens(y_flat, pl) / total,
                        "topology": inter_node_tokens(y_topo, pl) / total,
                        "static": inter_node_tokens(y_static, pl) / total,
                        "makespan": d.makespan,
                        "makespan_gap": gap,
                        "static_makespan": cost.makespan(y_static.sum(axis=0)),
                    }
                )
    return rows


def topology_summary(rows: list[dict]) -> list[dict]:
    """Per (layout, B): mean inter-node fractions (flat, topology, static), the saving, and the makespan gap."""
    out = []
    for layout in dict.fromkeys(r["layout"] for r in rows):
        for B in dict.fromkeys(r["B"] for r in rows):
            sel = [r for r in rows if r["layout"] == layout and r["B"] == B]
            if not sel:
                continue
            flat, topo = stats(r["flat"] for r in sel)["mean"], stats(r["topology"] for r in sel)["mean"]
            out.append(
                {
                    "layout": layout,
                    "B": B,
                    "flat": flat,
                    "topology": topo,
                    "saving": 1.0 - topo / flat if flat > 0 else 0.0,
                    "static": stats(r["static"] for r in sel)["mean"],
                    "makespan_gap": max(r["makespan_gap"] for r in sel),
                    "static_vs_tempo": stats(r["static_makespan"] / r["makespan"] for r in sel)["mean"],
                }
            )
    return out
