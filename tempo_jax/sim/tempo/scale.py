"""The TEMPO step at scale: every dispatch policy on EP64 (8 nodes × 8 GPUs) with two link classes (issue 75).

Glossary additions: G GPUs (EP ranks, one source rank per GPU), Nn nodes, B tokens per GPU, H hidden size.

The replays elsewhere price a GPU's received tokens with Eq. 4's single traffic piece ``c2 + γ·N``, as if every
token crossed the same link. Past one node that is not so: a GPU reaches the 7 others of its node over NVLink
(``nvlink_gbps``, 150 GB/s per GPU) and the 56 GPUs of the other nodes through its NIC (``nic_gbps``, 50 GB/s:
one 400 Gb/s NIC per GPU, DeepEP's RDMA figure). The step here is the synchronous EP layer of decode
(DeepEP's normal mode):

    step = dispatch + max_g t_g + combine

- ``t_g`` — the rank's expert time, the preset's kernel model without its traffic piece (`CostModel.kernel_only`:
  Eq. 1 / 2), on the policy's dispatch x (stage 1, `solvers.solve`);
- **dispatch** — latency + the busiest port: for every GPU its send port (its own tokens' pairs to other GPUs)
  and its receive port (pairs from other GPUs), each ``intra pairs · H · 1 B / NVLink + inter pairs · H · 1 B /
  NIC`` (FP8 activations; the two classes in sequence on the one port, as in the CascadeEP simulator);
- **combine** — the same pairs back in BF16 (2 B per value), send and receive ports swapped.

Which GPU a source's pairs reach comes from stage 2 (`solvers.topology_split`, same-node-first, or
`solvers.flat_split`): ``y [Nn, E, G]`` tokens of expert e from node m processed on GPU g; the GPUs of a node
share the node's tokens of e in proportion to their own counts (a GPU's own pairs to itself cross no link).
Both splits realise the same x, so t_g is the same; only the links differ.

**TEMPO priced with the links** (policy ``"tempo_links"``): TEMPO solved on Eq. 4 — the kernel model plus the
traffic piece ``c2 + γ·N_g`` with ``c2`` the two phases' latency and ``γ`` one received pair's port time both ways,
``H·(dispatch_bytes + combine_bytes)·(f/NIC + (1 − f)/NVLink)``, f = (G − gpus_per_node)/(G − 1) the share of a
uniformly spread pair that crosses nodes (`ScaleConfig.traffic_model`). Its t_g is still priced on the kernel model.

numpy + solvers only (no jax).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
from tqdm.auto import tqdm

from solvers import (
    PRESETS,
    CostModel,
    DispatchProblem,
    flat_split,
    gpu_loads,
    node_counts_from_sources,
    solve,
    topology_split,
)
from solvers.checks import check_choice, check_int, check_real
from tempo_jax.workloads import SyntheticRouting, pair_share

from ..runner import stats
from .phase import MODEL_SHAPES
from .traffic import LAYOUTS, TopologyConfig, topology_placement

__all__ = ["NIC_GBPS", "NVLINK_GBPS", "SPLITS", "ScaleConfig", "link_times", "scale_replay", "scale_summary"]

#: Per-GPU bandwidths of the two link classes, GB/s (the layer's `exchange.BANDWIDTH_GBPS["gpu"]` link figure and
#: `exchange.NODE_GBPS["gpu"]`, repeated here: the simulators import no jax; a test keeps them equal).
NVLINK_GBPS = 150.0
NIC_GBPS = 50.0
#: Policies of `solvers.solve` the replay takes (milp is too slow at E 256 × 64 GPUs per batch).
_SOLVED = ("static", "uniform", "token_lp", "metro", "llep", "tempo", "relief")
#: Stage-2 splits of the dispatch over source nodes.
SPLITS: tuple[str, ...] = ("topology", "flat")


@dataclass(frozen=True, kw_only=True)
class ScaleConfig:
    """An EP64 step replay (defaults: DeepSeek-V3's shape and FP8 kernel model, 8 nodes of 8 H800-class GPUs).

    Attributes:
      preset: cost model and model shape (a key of `.phase.MODEL_SHAPES`).
      num_gpus: G; gpus_per_node: GPUs per node (G / gpus_per_node nodes).
      replication: physical slots / experts; layout: the EPLB layout over nodes (`.traffic.LAYOUTS`).
      skew, kappa: Zipf exponent of the routing and Dirichlet concentration of batch fluctuation.
      tokens_per_gpu: B values; batches: batches per B.
      policies: names of `solvers.solve` compared, and ``"tempo_links"`` (TEMPO on Eq. 4 with the links' traffic
        piece, `traffic_model`).
      splits: stage-2 splits (`SPLITS`).
      hidden: H (DeepSeek-V3: 7,168).
      dispatch_bytes, combine_bytes: bytes per activation value each way (FP8 out, BF16 back).
      nvlink_gbps, nic_gbps: per-GPU bandwidth inside a node and between nodes (GB/s).
      latency_us: fixed cost of one dispatch or combine.
      seed: routing seed.
    """

    preset: str = "dsv3_fp8_offline"
    num_gpus: int = 64
    gpus_per_node: int = 8
    replication: float = 1.25
    layout: str = "global"
    skew: float = 1.2
    kappa: float = 2000.0
    tokens_per_gpu: tuple[int, ...] = (128, 512, 2048)
    batches: int = 3
    policies: tuple[str, ...] = ("static", "uniform", "token_lp", "metro", "tempo", "tempo_links")
    splits: tuple[str, ...] = SPLITS
    hidden: int = 7168
    dispatch_bytes: float = 1.0
    combine_bytes: float = 2.0
    nvlink_gbps: float = NVLINK_GBPS
    nic_gbps: float = NIC_GBPS
    latency_us: float = 10.0
    seed: int = 0

    def __post_init__(self) -> None:
        fn = "ScaleConfig"
        object.__setattr__(self, "tokens_per_gpu", tuple(self.tokens_per_gpu))
        object.__setattr__(self, "policies", tuple(self.policies))
        object.__setattr__(self, "splits", tuple(self.splits))
        check_choice("preset", self.preset, MODEL_SHAPES, where=fn)
        check_choice("layout", self.layout, LAYOUTS, where=fn)
        for name in ("num_gpus", "gpus_per_node", "batches", "hidden"):
            check_int(name, getattr(self, name), where=fn)
        if self.num_gpus % self.gpus_per_node:
            raise ValueError(
                f"{fn}: num_gpus={self.num_gpus} is not a whole number of nodes of gpus_per_node={self.gpus_per_node}"
            )
        for B in self.tokens_per_gpu:
            check_int("tokens_per_gpu", B, where=fn)
        for p in self.policies:
            check_choice("policies", p, (*_SOLVED, "tempo_links"), where=fn)
        for s in self.splits:
            check_choice("splits", s, SPLITS, where=fn)
        for name in ("dispatch_bytes", "combine_bytes", "nvlink_gbps", "nic_gbps"):
            check_real(name, getattr(self, name), where=fn, minimum=0.0, strict=True)
        check_real("latency_us", self.latency_us, where=fn, minimum=0.0)
        check_real("replication", self.replication, where=fn, minimum=1.0)

    def traffic_model(self, kernel: CostModel) -> CostModel:
        """``kernel`` with Eq. 4's traffic piece priced from the links (module doc, "TEMPO priced with the links")."""
        G, g = self.num_gpus, self.gpus_per_node
        f = (G - g) / (G - 1) if G > 1 else 0.0
        per_byte = f / (self.nic_gbps * 1e3) + (1.0 - f) / (self.nvlink_gbps * 1e3)  # µs per byte
        gamma = self.hidden * (self.dispatch_bytes + self.combine_bytes) * per_byte
        return dataclasses.replace(kernel, c2=2.0 * self.latency_us, gamma=gamma, source="kernel + the links' traffic")

    def topology(self) -> TopologyConfig:
        """The same layout as a `.traffic.TopologyConfig` (its placement builder)."""
        return TopologyConfig(
            preset=self.preset,
            num_gpus=self.num_gpus,
            gpus_per_node=self.gpus_per_node,
            replication=self.replication,
            skew=self.skew,
            kappa=self.kappa,
            seed=self.seed,
        )


def link_times(y: np.ndarray, counts: np.ndarray, node_of_gpu: np.ndarray, config: ScaleConfig) -> dict:
    """Dispatch and combine times of one split and the pairs that cross nodes.

    Args:
      y: ``[Nn, E, G]`` tokens of expert e from node m processed on GPU g (stage 2).
      counts: ``[G, E]`` token–expert pairs each source GPU routes.
      node_of_gpu: ``[G]`` node of each GPU.
      config: bandwidths, latency, H and bytes per value.

    Returns:
      ``{dispatch_us, combine_us, inter_pairs, intra_pairs}``: the two exchange phases (µs) and the pairs over
      the NIC and over NVLink.
    """
    Nn, E, G = y.shape
    node_tokens = np.zeros((Nn, E))
    np.add.at(node_tokens, node_of_gpu, counts)
    # Step 1: pairs from source GPU s to GPU g — s holds counts[s, e] / node_tokens[node(s), e] of its node's y.
    share = np.divide(counts, node_tokens[node_of_gpu], out=np.zeros(counts.shape), where=node_tokens[node_of_gpu] > 0)
    flow = np.einsum("se,seg->sg", share, y[node_of_gpu])  # [G(source), G(dest)]
    np.fill_diagonal(flow, 0.0)  # a GPU's pairs to itself cross no link
    cross = node_of_gpu[:, None] != node_of_gpu[None, :]
    inter, intra = np.where(cross, flow, 0.0), np.where(cross, 0.0, flow)
    # Step 2: each port's time, the classes in sequence; a phase lasts until its busiest port is done (the combine
    # sends back what the dispatch received: the same ports, swapped, at its own bytes per value).
    nv, nic = config.nvlink_gbps * 1e3, config.nic_gbps * 1e3  # bytes per µs
    port_pairs = [(intra.sum(axis=axis), inter.sum(axis=axis)) for axis in (1, 0)]  # as sender, as receiver

    def phase(bytes_per_value: float) -> float:
        per_pair = config.hidden * bytes_per_value
        busiest = max(float((a * per_pair / nv + b * per_pair / nic).max()) for a, b in port_pairs)
        return config.latency_us + busiest if busiest > 0 else 0.0

    return {
        "dispatch_us": phase(config.dispatch_bytes),
        "combine_us": phase(config.combine_bytes),
        "inter_pairs": float(inter.sum()),
        "intra_pairs": float(intra.sum()),
    }


def scale_replay(config: ScaleConfig = ScaleConfig(), *, progress: bool = True) -> list[dict]:  # noqa: B008
    """Every policy × split × (B, batch) of ``config``: the step and its parts.

    Returns:
      Rows ``{B, batch, policy, split, expert_us, dispatch_us, combine_us, step_us, inter_fraction}`` (µs; the
      fraction of the batch's token–expert pairs that cross nodes).
    """
    E, K = MODEL_SHAPES[config.preset]
    kernel = PRESETS[config.preset].kernel_only()
    routing = SyntheticRouting(E, K, config.skew, kappa=config.kappa, seed=config.seed)
    # Step 1: the long-run load EPLB sees (as the topology replay) and the placement over nodes.
    rng = np.random.default_rng([config.seed, 7919])
    load = pair_share(rng.dirichlet(config.kappa * routing.popularity, size=256).mean(axis=0), K)
    pl = topology_placement(config.topology(), config.layout, load)
    rows = []
    cells = [(B, step) for B in config.tokens_per_gpu for step in range(config.batches)]
    for B, step in tqdm(cells, desc="EP scale replay", disable=not progress):
        counts = routing.batch(B, config.num_gpus, step)
        nodes = node_counts_from_sources(counts, pl)
        total = float(counts.sum())
        for policy in config.policies:
            # Step 2: stage 1 (x) and the ranks' expert times.
            if policy == "tempo_links":
                d = solve(DispatchProblem(counts, pl, config.traffic_model(kernel)), "tempo")
            else:
                d = solve(DispatchProblem(counts, pl, kernel), policy)
            acts, tiles, tokens = gpu_loads(d.x)
            expert = float(kernel.gpu_times(acts, tokens, tiles).max())
            for split in config.splits:
                # Step 3: stage 2 and the two exchange phases over the two link classes.
                y = topology_split(d, nodes, pl) if split == "topology" else flat_split(d, nodes)
                links = link_times(y, counts.astype(np.float64), pl.node_of_gpu, config)
                rows.append(
                    {
                        "B": B,
                        "batch": step,
                        "policy": policy,
                        "split": split,
                        "expert_us": expert,
                        "dispatch_us": links["dispatch_us"],
                        "combine_us": links["combine_us"],
                        "step_us": links["dispatch_us"] + expert + links["combine_us"],
                        "inter_fraction": links["inter_pairs"] / total,
                    }
                )
    return rows


def scale_summary(rows: list[dict]) -> list[dict]:
    """Per (B, split, policy): mean step and parts (µs), the exchange's share of the step, the inter-node
    fraction, and the step against TEMPO's on the same batches (``vs_tempo``; absent without a tempo row)."""
    out = []
    keys = dict.fromkeys((r["B"], r["split"], r["policy"]) for r in rows)
    for B, split, policy in keys:
        sel = [r for r in rows if (r["B"], r["split"], r["policy"]) == (B, split, policy)]
        tempo = {r["batch"]: r for r in rows if (r["B"], r["split"], r["policy"]) == (B, split, "tempo")}
        row = {"B": B, "split": split, "policy": policy}
        for k in ("expert_us", "dispatch_us", "combine_us", "step_us", "inter_fraction"):
            row[k] = stats(r[k] for r in sel)["mean"]
        row["exchange_share"] = stats((r["dispatch_us"] + r["combine_us"]) / r["step_us"] for r in sel)["mean"]
        if tempo:
            row["vs_tempo"] = stats(r["step_us"] / tempo[r["batch"]]["step_us"] for r in sel)["mean"]
        out.append(row)
    return out
