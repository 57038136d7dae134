"""Model shapes, hardware and the derived per-layer costs of the CascadeEP prefill simulator.

The CascadeEP paper gives model shapes (Table 1) and two calibration facts (Fig. 4: DeepSeek-V4-Flash EP8 on
B200 reaches 90% of peak FFN throughput at θ = 28,672 tokens per EP rank; App. B: attention follows
f = α0 + α1·Q + α2·Π), but no absolute coefficients. Everything here is derived from FLOPs and bytes of the
stated shapes at stated efficiencies, so absolute times are ours; the notebook compares ratios.

Derivations (per MoE layer, one EP rank = one GPU, D ranks, S = E/D experts per rank):

- **Shapes.** Every MoE preset of `tempo_jax.workloads.models` (one source for the layer's presets and the
  simulator). Table 1 gives experts, top-k, expert width F and total / active parameters; H and the MoE layer
  count L come from the models' configs where published (V4-Flash: 43 × 256 × 3 × 4096 × 2048 = 277B of 284B;
  GLM-5.3, assumed to keep GLM-5's block: 75 MoE of 78 layers, 75 × 256 × 3 × 6144 × 2048 = 725B of 753B) and
  from third-party transcriptions otherwise (V4-Pro: 61 × 384 × 3 × 7168 × 3072 = 1.55T of 1.6T).
- **Expert FFN.** A token–expert pair costs 6·H·F FLOPs (three GEMMs). Peak throughput per rank
  ``P = gemm_efficiency × peak_flops / (6·H·F)`` tokens per µs. A grouped FFN kernel over N pairs takes
  ``F(N) = t_fix + N / P``: the fixed part is the non-overlapped cost of streaming the rank's S experts'
  weights (``S·3·H·F`` parameters at ``weight_bytes`` each over HBM) times one factor, calibrated once so
  that V4-Flash on B200 gives θ(ρ = 0.9) = 28,672 (Fig. 4); the same factor serves every model. The curve is
  profiled on 1,024-token steps up to 131,072 tokens (Fig. 4's range) as a `solvers.ThroughputCurve`.
- **Attention** (App. B, Eq. 11). ``α1 = 2·4·H² / (attention_efficiency × peak_flops)`` µs per new token (the
  q/k/v/o projections), ``α2 = 4·H / (attention_efficiency × peak_flops)`` µs per query–key pair (QKᵀ and
  PV), ``α0`` = ``launch_us``. Sparse attention with a per-query key budget ``key_budget`` (DSA-style top-k
  keys; None = dense) enters through Π.
- **Communication.** Dispatch sends each remote token–expert pair's hidden vector in FP8 (H bytes), combine
  returns it in BF16 (2H bytes), over ``link_bytes_per_us`` with ``link_latency_us`` per exchange. OEWF
  fetches full expert weights (3·H·F·``weight_bytes``) at ``fetch_bytes_per_us`` into a buffer of
  ``helper_budget_experts`` experts.
- **Two link classes** (``gpus_per_node``; None: every rank in one NVLink domain, the paper's testbed). Ranks
  ``g // gpus_per_node`` share a node; a transfer between two nodes (a dispatch or combine chunk, an OEWF fetch)
  runs at ``node_link_bytes_per_us`` (the GPU's NIC: 50 GB/s, DeepEP's RDMA figure, beside 600 GB/s NVLink)
  instead of the NVLink figures. A rank's transfers of both classes are charged to its one port pair in sequence
  (`PrefillCosts.port_us`): at D = 64 over 8 nodes the NVLink share is ~1% of a dispatch's port time, so
  overlapping the classes instead would move a transfer by about that much.

numpy + solvers only (no jax).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from solvers import AttentionModel, CostModel, ThroughputCurve, stream_threshold
from solvers.checks import check_choice, check_int, check_real
from tempo_jax.workloads.models import MODEL_SPECS

__all__ = ["HARDWARE", "MODELS", "Hardware", "ModelShape", "PrefillCosts", "prefill_costs"]


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """An MoE model's shape as the simulator needs it.

    Attributes:
      name: preset name.
      layers: L MoE layers.
      experts: E routed experts per layer.
      top_k: K routed experts per token.
      hidden: H.
      expert_dim: F, expert intermediate width.
      weight_bytes: bytes per routed-expert parameter (MXFP4 with one scale per 32 values: 0.53125; FP8 with
        one scale per 128: 1.0078).
      key_budget: per-query key budget of sparse attention (None = dense).
      source: where the numbers come from.
    """

    name: str
    layers: int
    experts: int
    top_k: int
    hidden: int
    expert_dim: int
    weight_bytes: float
    key_budget: int | None = 2048
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        for attr in ("layers", "experts", "top_k", "hidden", "expert_dim"):
            check_int(attr, getattr(self, attr), where="ModelShape")
        if self.top_k > self.experts:
            raise ValueError(f"ModelShape: top_k={self.top_k} exceeds experts={self.experts}")
        check_real("weight_bytes", self.weight_bytes, where="ModelShape", minimum=0.0, strict=True)
        if self.key_budget is not None:
            check_int("key_budget", self.key_budget, where="ModelShape")

    @property
    def expert_params(self) -> int:
        """Parameters of one routed expert (gate, up, down): 3·H·F."""
        return 3 * self.hidden * self.expert_dim


#: Bytes per routed-expert parameter as each model's experts are served: MXFP4 with one scale per 32 values
#: (CascadeEP: V4-Flash, V4-Pro), FP8 with one scale per 128 (GLM-5.3, and the default for the other presets).
_WEIGHT_BYTES = {"deepseek_v4_flash": (0.53125, "MXFP4 experts"), "deepseek_v4_pro": (0.53125, "MXFP4 experts")}
_FP8 = (1.0078125, "FP8 experts")
#: Models with sparse attention (a per-query key budget): V4's CSA / HCA and GLM's DSA.
_SPARSE_ATTENTION = ("deepseek_v4_flash", "deepseek_v4_pro", "glm_5_3")


def _shape(spec) -> ModelShape:
    wb, precision = _WEIGHT_BYTES.get(spec.name, _FP8)
    return ModelShape(
        name=spec.name,
        layers=spec.moe_layers,
        experts=spec.experts,
        top_k=spec.top_k,
        hidden=spec.hidden,
        expert_dim=spec.ffn,
        weight_bytes=wb,
        key_budget=2048 if spec.name in _SPARSE_ATTENTION else None,
        source=f"MoE preset {spec.name} ({spec.total_params} / {spec.active_params}, {precision}): {spec.source}",
    )


#: Every MoE preset (`tempo_jax.workloads.models`: CascadeEP's Table 1 models and the TEMPO ones), by name.
MODELS: dict[str, ModelShape] = {name: _shape(spec) for name, spec in MODEL_SPECS.items()}


@dataclass(frozen=True, kw_only=True)
class Hardware:
    """One GPU of the EP group and its links (numbers are stated assumptions, not measurements).

    Attributes:
      name: preset name.
      peak_flops: dense tensor FLOP/s used for both GEMMs and attention (B200 dense FP8: 4.5e15).
      gemm_efficiency: fraction of peak the expert GEMMs reach at their plateau.
      attention_efficiency: fraction of peak the attention stage reaches.
      hbm_bytes_per_us: HBM bandwidth (B200: 8 TB/s = 8e6 bytes/µs).
      link_bytes_per_us: effective all-to-all bandwidth per rank for dispatch / combine.
      link_latency_us: fixed latency of one dispatch or combine.
      fetch_bytes_per_us: peer-to-peer bandwidth of OEWF's weight copies.
      launch_us: fixed cost of one attention stage (α0).
      helper_budget_experts: OEWF helper weight buffer, in experts (B_h = this × one expert's bytes).
      node_link_bytes_per_us: bandwidth of a transfer between two nodes (the GPU's NIC), dispatch, combine and
        OEWF fetches alike; used only with ``gpus_per_node`` (`PrefillCosts`).
    """

    name: str
    peak_flops: float
    gemm_efficiency: float
    attention_efficiency: float
    hbm_bytes_per_us: float
    link_bytes_per_us: float
    link_latency_us: float
    fetch_bytes_per_us: float
    launch_us: float
    helper_budget_experts: int
    node_link_bytes_per_us: float = 5.0e4

    def __post_init__(self) -> None:
        for attr in (
            "peak_flops",
            "hbm_bytes_per_us",
            "link_bytes_per_us",
            "fetch_bytes_per_us",
            "node_link_bytes_per_us",
        ):
            check_real(attr, getattr(self, attr), where="Hardware", minimum=0.0, strict=True)
        for attr in ("gemm_efficiency", "attention_efficiency"):
            check_real(attr, getattr(self, attr), where="Hardware", minimum=0.0, strict=True, maximum=1.0)
        for attr in ("link_latency_us", "launch_us"):
            check_real(attr, getattr(self, attr), where="Hardware", minimum=0.0)
        check_int("helper_budget_experts", self.helper_budget_experts, where="Hardware", minimum=0)


#: The paper's testbed: 8 B200 GPUs on NVLink (§4.1). Efficiencies and link numbers are our assumptions.
HARDWARE: dict[str, Hardware] = {
    "b200": Hardware(
        name="b200",
        peak_flops=4.5e15,
        gemm_efficiency=0.6,
        attention_efficiency=0.4,
        hbm_bytes_per_us=8.0e6,
        link_bytes_per_us=6.0e5,
        link_latency_us=20.0,
        fetch_bytes_per_us=6.0e5,
        launch_us=30.0,
        helper_budget_experts=8,
        node_link_bytes_per_us=5.0e4,  # one 400 Gb/s NIC per GPU (DeepEP's ~50 GB/s RDMA)
    )
}

# Fig. 4: V4-Flash EP8 on B200 reaches ρ = 0.9 of its peak FFN throughput at θ = 28,672 tokens per rank,
# profiled up to 131,072 tokens (our grid: 1,024-token steps).
_FIG4 = {"model": "deepseek_v4_flash", "hardware": "b200", "ranks": 8, "theta": 28_672, "rho": 0.9}
_GRID = np.unique(np.concatenate([[1, 2, 4, 8, 16, 32, 64, 128, 256, 512], np.arange(1024, 131_072 + 1, 1024)]))


def _peak_tokens_per_us(model: ModelShape, hw: Hardware) -> float:
    return hw.gemm_efficiency * hw.peak_flops / (6.0 * model.hidden * model.expert_dim) / 1e6


def _weight_stream_us(model: ModelShape, hw: Hardware, experts_per_rank: float) -> float:
    return experts_per_rank * model.expert_params * model.weight_bytes / hw.hbm_bytes_per_us


def _fixed_over_stream() -> float:
    """The one calibration factor: t_fix / (weight-streaming time), from Fig. 4's θ.

    With F(N) = (x + N)/P, η(N) = [N/(x + N)] / [N_max/(x + N_max)]; η(θ) = ρ gives
    x = θ·N_max·(1 − ρ) / (ρ·N_max − θ) tokens, i.e. t_fix = x / P.
    """
    model, hw = MODELS[_FIG4["model"]], HARDWARE[_FIG4["hardware"]]
    theta, rho, n_max = _FIG4["theta"], _FIG4["rho"], float(_GRID[-1])
    x = theta * n_max * (1 - rho) / (rho * n_max - theta)
    return (x / _peak_tokens_per_us(model, hw)) / _weight_stream_us(model, hw, model.experts / _FIG4["ranks"])


@dataclass(frozen=True, eq=False)
class PrefillCosts:
    """Per-layer cost model of one (model, hardware, D) deployment (see the module doc for the derivation).

    Attributes:
      model, hardware, num_ranks: what it was derived for (D ranks, one attention replica each).
      curve: the per-rank FFN `ThroughputCurve` F(N).
      attention: the App. B `AttentionModel` (µs).
      dispatch_bytes_per_pair / combine_bytes_per_pair: bytes per remote token–expert pair each way.
      expert_bytes: bytes of one routed expert's weights (OEWF fetches).
      fixed_us, peak_tokens_per_us: the two parameters of F(N) = fixed_us + N / peak_tokens_per_us.
      stream_rho: streamFFN's launch threshold θ as the fraction ρ of peak FFN throughput it reaches (0.9: §3.2).
      gpus_per_node: ranks per node (None: one node — every transfer at the NVLink figures); see the module doc.
    """

    model: ModelShape
    hardware: Hardware
    num_ranks: int
    curve: ThroughputCurve
    attention: AttentionModel
    dispatch_bytes_per_pair: float
    combine_bytes_per_pair: float
    expert_bytes: float
    fixed_us: float
    peak_tokens_per_us: float
    stream_rho: float = 0.9
    gpus_per_node: int | None = None

    @property
    def experts_per_rank(self) -> float:
        return self.model.experts / self.num_ranks

    @cached_property
    def cross_node(self) -> np.ndarray:
        """``[D, D]`` bool: ranks s and d sit on different nodes (all False on one node)."""
        D, g = self.num_ranks, self.gpus_per_node or self.num_ranks
        node = np.arange(D) // g
        return node[:, None] != node[None, :]

    @cached_property
    def link_bw(self) -> np.ndarray:
        """``[D(sender), D(receiver)]`` bytes per µs of a dispatch / combine chunk or a fetch's port time."""
        hw = self.hardware
        return np.where(self.cross_node, hw.node_link_bytes_per_us, hw.link_bytes_per_us)

    @cached_property
    def fetch_bw(self) -> np.ndarray:
        """``[D(helper), D(donor)]`` bytes per µs of an OEWF fetch (`solvers.OEWFState`'s pairwise form)."""
        hw = self.hardware
        return np.where(self.cross_node, hw.node_link_bytes_per_us, hw.fetch_bytes_per_us)

    def port_us(self, total_bytes, cross_bytes) -> np.ndarray:
        """Port time of ``total_bytes [...]`` of which ``cross_bytes [...]`` go to (or come from) other nodes: the
        NVLink share over ``link_bytes_per_us`` and the rest over ``node_link_bytes_per_us``, in sequence (on one
        node ``cross_bytes`` is 0 and this is total / link bandwidth)."""
        hw = self.hardware
        total, cross = np.asarray(total_bytes, dtype=np.float64), np.asarray(cross_bytes, dtype=np.float64)
        return (total - cross) / hw.link_bytes_per_us + cross / hw.node_link_bytes_per_us

    def send_us(self, chunk_bytes) -> np.ndarray:
        """``[..., D]`` port time of each sender's chunks ``chunk_bytes [..., D(sender), D(receiver)]`` (`port_us`)."""
        chunk = np.asarray(chunk_bytes, dtype=np.float64)
        return self.port_us(chunk.sum(axis=-1), (chunk * self.cross_node).sum(axis=-1))

    def dispatch_time_us(self, sent) -> np.ndarray:
        """``[..., D]`` uncontended dispatch time of each source: latency + its remote pairs' bytes over the links
        (`send_us`), 0 when it sends nothing remote; ``sent [..., D(source), D(destination)]`` pairs."""
        D = self.num_ranks
        chunk = np.asarray(sent, dtype=np.float64) * (1.0 - np.eye(D)) * self.dispatch_bytes_per_pair
        remote = chunk.sum(axis=-1)
        return np.where(remote > 0, self.hardware.link_latency_us + self.send_us(chunk), 0.0)

    @cached_property
    def threshold(self) -> int:
        """streamFFN's θ = `solvers.stream_threshold` at ρ = ``stream_rho`` (tokens per rank)."""
        return stream_threshold(self.curve, self.stream_rho)

    @property
    def helper_budget_bytes(self) -> float:
        return self.hardware.helper_budget_experts * self.expert_bytes

    def oewf_budget(self) -> dict:
        """The keyword arguments `solvers.oewf_at_dispatch` takes from a deployment: ``expert_bytes``,
        ``budget_bytes`` (a helper's fetch budget), ``fetch_bytes_per_us`` (``[D, D]`` `fetch_bw` over nodes) and
        the FFN ``curve``."""
        return {
            "expert_bytes": self.expert_bytes,
            "budget_bytes": self.helper_budget_bytes,
            "fetch_bytes_per_us": self.hardware.fetch_bytes_per_us if self.gpus_per_node is None else self.fetch_bw,
            "curve": self.curve,
        }

    def ffn_us(self, tokens) -> np.ndarray:
        """F(N) µs for ``tokens [...]`` (0 for no tokens)."""
        return np.asarray(self.curve.ffn_time(tokens))

    def exchange_us(self, pairs, bytes_per_pair: float) -> np.ndarray:
        """One dispatch or combine of ``pairs [...]`` remote pairs: latency + bytes / link bandwidth (0 if none)."""
        pairs = np.asarray(pairs, dtype=np.float64)
        hw = self.hardware
        return np.where(pairs > 0, hw.link_latency_us + pairs * bytes_per_pair / hw.link_bytes_per_us, 0.0)

    def tempo_cost_model(self) -> CostModel:
        """The same rank as a TEMPO max-affine model (for ``dispatch="tempo"``): b = one expert's weight stream
        time, β = 1/P, a = c = the fixed part (µs)."""
        hw = self.hardware
        b = self.model.expert_params * self.model.weight_bytes / hw.hbm_bytes_per_us
        return CostModel(
            a=self.fixed_us, b=b, c=self.fixed_us, beta=1.0 / self.peak_tokens_per_us, source="prefill_costs"
        )


def prefill_costs(
    model: str | ModelShape = "deepseek_v4_flash",
    hardware: str | Hardware = "b200",
    num_ranks: int = 8,
    gpus_per_node: int | None = None,
) -> PrefillCosts:
    """Derive the per-layer costs of ``model`` on ``num_ranks`` GPUs of ``hardware`` (see the module doc), on nodes
    of ``gpus_per_node`` ranks (None: one node)."""
    fn = "prefill_costs"
    if isinstance(model, str):
        model = MODELS[check_choice("model", model, MODELS, where=fn)]
    if isinstance(hardware, str):
        hardware = HARDWARE[check_choice("hardware", hardware, HARDWARE, where=fn)]
    D = check_int("num_ranks", num_ranks, where=fn)
    if model.experts % D:
        raise ValueError(f"{fn}: {model.experts} experts do not split evenly over num_ranks={D}")
    check_gpus_per_node(gpus_per_node, D, where=fn)
    hw = hardware
    # Step 1: FFN curve F(N) = t_fix + N / P on Fig. 4's grid.
    P = _peak_tokens_per_us(model, hw)
    fixed = _fixed_over_stream() * _weight_stream_us(model, hw, model.experts / D)
    curve = ThroughputCurve.from_profile(_GRID, fixed + _GRID / P, source=f"{model.name} on {hw.name}, D={D}")
    # Step 2: attention coefficients from FLOPs (Eq. 11).
    rate = hw.attention_efficiency * hw.peak_flops / 1e6  # FLOP per µs
    attention = AttentionModel(
        alpha0=hw.launch_us,
        alpha1=8.0 * model.hidden**2 / rate,
        alpha2=4.0 * model.hidden / rate,
        source=f"FLOPs of {model.name} at {hw.attention_efficiency:.0%} of {hw.name} peak",
    )
    # Step 3: bytes on the links.
    return PrefillCosts(
        model=model,
        hardware=hw,
        num_ranks=D,
        curve=curve,
        attention=attention,
        dispatch_bytes_per_pair=float(model.hidden),
        combine_bytes_per_pair=2.0 * model.hidden,
        expert_bytes=float(model.expert_params * model.weight_bytes),
        fixed_us=float(fixed),
        peak_tokens_per_us=float(P),
        gpus_per_node=gpus_per_node,
    )


def check_gpus_per_node(gpus_per_node, num_ranks: int, *, where: str) -> None:
    """ValueError unless ``gpus_per_node`` is None or a positive divisor of ``num_ranks``."""
    if gpus_per_node is None:
        return
    g = check_int("gpus_per_node", gpus_per_node, where=where)
    if num_ranks % g:
        raise ValueError(
            f"{where}: num_ranks={num_ranks} is not a whole number of nodes of gpus_per_node={g}; pick a divisor of"
            f" {num_ranks} (or None: one node)"
        )
