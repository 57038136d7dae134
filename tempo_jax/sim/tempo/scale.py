"""The TEMPO step at scale: every dispatch policy on EP64 (8 nodes × 8 GPUs) with two link classes (issue 75).

Glossary additions: G GPUs (EP ranks, one source rank per GPU), B tokens per GPU.

The replays elsewhere price a GPU's received tokens with Eq. 4's single traffic piece ``c2 + γ·N``, as if every
token crossed the same link. Past one node that is not so: a GPU reaches the 7 others of its node over NVLink
(``nvlink_gbps``, 150 GB/s per GPU) and the 56 GPUs of the other nodes through its NIC (``nic_gbps``, 50 GB/s:
one 400 Gb/s NIC per GPU, DeepEP's RDMA figure). The step here is the synchronous EP layer of decode
(DeepEP's normal mode):

    step = dispatch + max_g t_g + combine

- ``t_g`` — the rank's expert time, the preset's kernel model without its traffic piece (`CostModel.kernel_only`:
  Eq. 1 / 2), on the policy's dispatch x (stage 1, `solvers.solve`);
- **dispatch** — latency + the busiest port: for every GPU its NVLink and its NIC, each as sender and as
  receiver, ``rows · H · 1 B / bandwidth`` (FP8 activations). The NVLink and the NIC are separate hardware and run
  at once (a GPU's time is the larger of the two), which is what lets DeepEP's two hops overlap. (The CascadeEP
  simulator charges a rank's two classes to one port in sequence: for its flat exchange at D = 64 the NVLink share
  is ~1% of a port's time; for a two-hop exchange, whose forwarding puts most pairs on NVLink, it is not.)
- **combine** — the same pairs back in BF16 (2 B per value), send and receive ports swapped.

Which GPU a source's pairs reach comes from stage 2 (`solvers.topology_split`, same-node-first, or
`solvers.flat_split`): ``y [Nn, E, G]`` tokens of expert e from node m processed on GPU g; the GPUs of a node
share the node's tokens of e in proportion to their own counts (a GPU's own pairs to itself cross no link).
Both splits realise the same x, so t_g is the same; only the links differ.

**Two exchanges** (``exchanges``): ``"flat"`` — every pair crosses once, from its source GPU to its expert's GPU;
``"two_hop"`` — the layer's `MoEConfig(node_exchange="two_hop")` and DeepEP's internode kernels: a token crosses
the NIC once per remote node holding one of its experts, to the GPU of that node with its own local index, which
forwards its pairs over NVLink (the combine returns one partial row per (token, node)). Which node a pair reaches
is drawn from the batch's tokens (`token_nodes`: each (source node, expert)'s pairs apportioned to the nodes in
y's proportions, in token order), so a token's distinct nodes are counted, not estimated.

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
    POLICIES,
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

__all__ = [
    "EXCHANGES",
    "NIC_GBPS",
    "NVLINK_GBPS",
    "SPLITS",
    "ScaleConfig",
    "link_times",
    "scale_replay",
    "scale_summary",
    "token_nodes",
]

#: Per-GPU bandwidths of the two link classes, GB/s (the layer's `exchange.BANDWIDTH_GBPS["gpu"]` link figure and
#: `exchange.NODE_GBPS["gpu"]`, repeated here: the simulators import no jax; a test keeps them equal).
NVLINK_GBPS = 150.0
NIC_GBPS = 50.0
#: Policies of `solvers.solve` the replay takes (milp is too slow at E 256 × 64 GPUs per batch).
_SOLVED = tuple(p for p in POLICIES if p != "milp")
#: Stage-2 splits of the dispatch over source nodes.
SPLITS: tuple[str, ...] = ("topology", "flat")
#: Exchanges priced: each pair once from its GPU, or each token once per node and forwarded inside it.
EXCHANGES: tuple[str, ...] = ("flat", "two_hop")


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
      exchanges: `EXCHANGES` priced (module doc).
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
    exchanges: tuple[str, ...] = ("flat",)
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
        object.__setattr__(self, "exchanges", tuple(self.exchanges))
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
        for s in self.exchanges:
            check_choice("exchanges", s, EXCHANGES, where=fn)
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


def token_nodes(ids: np.ndarray, y: np.ndarray, node_of_gpu: np.ndarray) -> np.ndarray:
    """``[G, Nn]`` tokens of each source GPU with at least one pair on each node (its own node included).

    Args:
      ids: ``[G, B, K]`` expert ids of every source GPU's tokens.
      y: ``[Nn, E, G]`` stage 2's split (tokens of expert e from node m processed on GPU g).
      node_of_gpu: ``[G]``.

    Each (source node m, expert e)'s pairs, in (GPU, token, slot) order, go to the nodes in y's proportions: the
    first ``round(Σ_{g on node 0} y[m, e, g])`` to node 0, and so on (cumulative rounding, so the counts add up).
    """
    G, B, K = ids.shape
    Nn, E, _ = y.shape
    # Step 1: each pair's key (source node, expert) and its rank among the key's pairs.
    key = (node_of_gpu[:, None, None] * E + ids).ravel()
    order = np.argsort(key, kind="stable")
    sorted_key = key[order]
    first = np.searchsorted(sorted_key, np.arange(Nn * E))
    rank = np.arange(key.size) - first[sorted_key]
    # Step 2: the node each rank falls in (cumulative, rounded node shares of the key's pairs).
    per_node = np.stack([y[:, :, node_of_gpu == n].sum(axis=2) for n in range(Nn)], axis=2)  # [m, e, n]
    bounds = np.rint(np.cumsum(per_node, axis=2)).reshape(Nn * E, Nn)
    pairs_of_key = np.bincount(key, minlength=Nn * E)
    bad = np.flatnonzero(bounds[:, -1] != pairs_of_key)
    if bad.size:  # y must realise the tokens' pairs exactly (stage 2 does): never place a pair by guess
        m, e = divmod(int(bad[0]), E)
        raise ValueError(
            f"token_nodes: y holds {bounds[bad[0], -1]:g} pairs of expert {e} from node {m} but the tokens route "
            f"{pairs_of_key[bad[0]]}; give the split (topology_split / flat_split) of these tokens' counts"
        )
    dest = np.empty(key.size, dtype=np.int64)
    dest[order] = (bounds[sorted_key] <= rank[:, None]).sum(axis=1)
    # Step 3: distinct (token, node) per source GPU.
    token = np.repeat(np.arange(G * B), K)
    pairs = np.unique(token * Nn + dest)
    return np.bincount((pairs // Nn) // B * Nn + pairs % Nn, minlength=G * Nn).reshape(G, Nn).astype(np.float64)


def link_times(
    y: np.ndarray,
    counts: np.ndarray,
    node_of_gpu: np.ndarray,
    config: ScaleConfig,
    *,
    exchange: str = "flat",
    ids: np.ndarray | None = None,
) -> dict:
    """Dispatch and combine times of one split under one exchange, and the rows each link class carries.

    Args:
      y: ``[Nn, E, G]`` tokens of expert e from node m processed on GPU g (stage 2).
      counts: ``[G, E]`` token–expert pairs each source GPU routes.
      node_of_gpu: ``[G]`` node of each GPU (GPU g is local index ``g mod gpus_per_node`` of its node).
      config: bandwidths, latency, H and bytes per value.
      exchange: ``"flat"`` or ``"two_hop"`` (`EXCHANGES`); ids: ``[G, B, K]`` the tokens' expert ids (two_hop).

    Returns:
      ``{dispatch_us, combine_us, nic_rows, nvlink_rows}``: the two exchange phases (µs) and the activation rows
      over the NIC and over NVLink (pairs; under two_hop the NIC carries one row per (token, remote node)).
    """
    Nn, E, G = y.shape
    node_tokens = np.zeros((Nn, E))
    np.add.at(node_tokens, node_of_gpu, counts)
    # Step 1: pairs from source GPU s to GPU g — s holds counts[s, e] / node_tokens[node(s), e] of its node's y.
    share = np.divide(counts, node_tokens[node_of_gpu], out=np.zeros(counts.shape), where=node_tokens[node_of_gpu] > 0)
    flow = np.einsum("se,seg->sg", share, y[node_of_gpu])  # [G(source), G(dest)]
    np.fill_diagonal(flow, 0.0)  # a GPU's pairs to itself cross no link
    cross = node_of_gpu[:, None] != node_of_gpu[None, :]
    nic, nvlink = np.where(cross, flow, 0.0), np.where(cross, 0.0, flow)
    if exchange == "two_hop":
        # Step 2 (two hops): over the NIC one row per (token, remote node) to the GPU of that node with the source's
        # local index; that GPU forwards the pairs over NVLink to their experts' GPUs (none to itself).
        if ids is None:
            raise ValueError("link_times: exchange='two_hop' needs ids [G, B, K] (the tokens' expert ids)")
        gpn = config.gpus_per_node
        per_node = token_nodes(ids, y, node_of_gpu)  # [G, Nn]
        local = np.arange(G) % gpn
        remote = node_of_gpu[:, None] != np.arange(Nn)[None, :]
        hop1 = np.zeros((G, G))
        hop1[np.arange(G)[:, None], np.arange(Nn)[None, :] * gpn + local[:, None]] = np.where(remote, per_node, 0.0)
        via = node_of_gpu[None, :] * gpn + local[:, None]  # [s, g]: s's forwarder on g's node
        hop2 = np.zeros((G, G))
        np.add.at(hop2, (via.ravel(), np.tile(np.arange(G), G)), nic.ravel())
        np.fill_diagonal(hop2, 0.0)  # pairs whose expert sits on the forwarder itself
        nic, nvlink = hop1, nvlink + hop2
    elif exchange != "flat":
        raise ValueError(f"link_times: unknown exchange {exchange!r}; valid: {list(EXCHANGES)}")
    # Step 3: each port's time (NVLink and NIC at once); a phase lasts until its busiest port is done (the combine
    # sends back what the dispatch received: the same ports, swapped, at its own bytes per value).
    nv_bw, nic_bw = config.nvlink_gbps * 1e3, config.nic_gbps * 1e3  # bytes per µs
    per_byte = max(float(nvlink.sum(axis=a).max()) / nv_bw for a in (0, 1))
    per_byte = max(per_byte, *(float(nic.sum(axis=a).max()) / nic_bw for a in (0, 1)))  # busiest port, µs per B

    def phase(bytes_per_value: float) -> float:
        busiest = per_byte * config.hidden * bytes_per_value
        return config.latency_us + busiest if busiest > 0 else 0.0

    return {
        "dispatch_us": phase(config.dispatch_bytes),
        "combine_us": phase(config.combine_bytes),
        "nic_rows": float(nic.sum()),
        "nvlink_rows": float(nvlink.sum()),
    }


def scale_replay(config: ScaleConfig = ScaleConfig(), *, progress: bool = True) -> list[dict]:  # noqa: B008
    """Every policy × split × exchange × (B, batch) of ``config``: the step and its parts.

    Returns:
      Rows ``{B, batch, policy, split, exchange, expert_us, dispatch_us, combine_us, step_us, nic_fraction}`` (µs;
      ``nic_fraction``: rows over the NIC per token–expert pair of the batch).
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
        G = config.num_gpus
        ids = routing.topk_ids(B * G, step).reshape(G, B, K)  # the tokens of `routing.batch(B, G, step)`
        counts = np.bincount((np.arange(G)[:, None, None] * E + ids).ravel(), minlength=G * E).reshape(G, E)
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
                # Step 3: stage 2 and the exchange phases over the two link classes.
                y = topology_split(d, nodes, pl) if split == "topology" else flat_split(d, nodes)
                for exchange in config.exchanges:
                    links = link_times(y, counts.astype(np.float64), pl.node_of_gpu, config, exchange=exchange, ids=ids)
                    rows.append(
                        {
                            "B": B,
                            "batch": step,
                            "policy": policy,
                            "split": split,
                            "exchange": exchange,
                            "expert_us": expert,
                            "dispatch_us": links["dispatch_us"],
                            "combine_us": links["combine_us"],
                            "step_us": links["dispatch_us"] + expert + links["combine_us"],
                            "nic_fraction": links["nic_rows"] / total,
                        }
                    )
    return rows


def scale_summary(rows: list[dict]) -> list[dict]:
    """Per (B, split, exchange, policy): mean step and parts (µs), the exchange's share of the step, the rows over
    the NIC per pair, and the step against TEMPO's on the same batches (``vs_tempo``; absent without a tempo row)."""
    out = []
    cell = ("B", "split", "exchange")
    for key in dict.fromkeys(tuple(r[k] for k in (*cell, "policy")) for r in rows):
        sel = [r for r in rows if tuple(r[k] for k in (*cell, "policy")) == key]
        tempo = {r["batch"]: r for r in rows if tuple(r[k] for k in (*cell, "policy")) == (*key[:3], "tempo")}
        row = dict(zip((*cell, "policy"), key, strict=True))
        for k in ("expert_us", "dispatch_us", "combine_us", "step_us", "nic_fraction"):
            row[k] = stats(r[k] for r in sel)["mean"]
        row["exchange_share"] = stats((r["dispatch_us"] + r["combine_us"]) / r["step_us"] for r in sel)["mean"]
        if tempo:
            row["vs_tempo"] = stats(r["step_us"] / tempo[r["batch"]]["step_us"] for r in sel)["mean"]
        out.append(row)
    return out
