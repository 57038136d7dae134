"""The MoE layer's configuration: `MoEConfig`, `make_ep_mesh`, `auto_capacity` (C of the default dropless rounds)
and `capacity_bucket` (a block size rounded up to a power of two). The parameters and their two layouts (logical
``[E, ...]``, physical ``[P, ...]`` sharded over ``ep``) are `tempo_jax.layer.params`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels import DISPATCH_MODES, GMM, DispatchMode, GmmImpl
from solvers import CopyCost, CostModel, LaunchSchedule
from solvers.checks import check_instance, check_int, plain_scalars
from solvers.relief import ROUNDS, check_relief_cost

from .cascade_plan import WeightFetch
from .exchange import EXCHANGE, ExchangeImpl
from .experts import ExpertConfig, LatentConfig, OutputConfig, SharedConfig
from .replicas import REPLICA_SYNC
from .routing import RouterConfig

__all__ = ["EXPERT_DTYPES", "MAX_DISPATCH_ROUNDS", "MoEConfig", "auto_capacity", "capacity_bucket", "make_ep_mesh"]

#: `MoEConfig.expert_dtype` values: the experts in ``dtype``, or block-scaled FP8 (`tempo_jax.layer.fp8`).
EXPERT_DTYPES = (None, "fp8_block")
#: The most in-graph plan rounds a config may ask for (the round counter is int32; plans converge in a few rounds).
MAX_DISPATCH_ROUNDS = 1 << 20


@dataclasses.dataclass(frozen=True, kw_only=True)
class MoEConfig:
    """Static configuration of the MoE layer.

    Attributes:
      hidden: H.  ffn: F (per expert).  experts: E.  top_k: K.
      slots_per_rank: S physical expert slots per rank (P = D·S must match the placement).
      dtype: activation/weight dtype for the expert FFN (router runs in float32).
      exchange: "padded", "ragged" or "ragged_split" (block all-to-alls; the last sends each peer's rows in several
        updates), "ring" (all-gather the tokens, each rank its own pairs, reduce-scatter: `tempo_jax.layer.ring`), or
        "auto": the platform's block exchange (ragged on GPU/TPU, padded on CPU) or the ring, whichever
        `tempo_jax.layer.exchange.exchange_cost` prices lower for the call's shapes (`ExchangeImpl`).
      gmm_impl: `pallas_kernels.gmm` implementation (`GmmImpl`: "auto", "pallas", "chunked", "ragged_dot", "tokamax",
        "megablox", "mosaic").
      interpret: run Pallas kernels in interpret mode (CPU tests).
      dispatch_mode: "sample" (paper: each pair draws its replica from the table) or "quota" (deterministic).
      dispatch: where the dispatch tables come from: "tables" (given to each call: `moe_forward(tables=...)`,
        `MoE.set_tables`, a `DispatchController`) or "ingraph" (each call computes its own from the batch's counts,
        pairwise relief under ``cost``; needs ``dispatch_mode="quota"``; `tempo_jax.layer.relief`).
      cost: the `solvers.CostModel` the in-graph dispatch minimises (Eq. 1 or Eq. 4; no tile term).
      dispatch_rounds: rounds of pairwise relief per call (in-graph dispatch).
      dynamic_slots: k spare slots per rank that receive, each call, copies of the experts the in-graph plan chooses
        (`tempo_jax.layer.copies`; issue 52): made only when the cost model says the copy pays (the break-even
        guard). Needs ``dispatch="ingraph"`` and ``copy_cost``. 0: none.
      copy_cost: the `solvers.CopyCost` of one copy (expert bytes, link GB/s, the time hidden behind the exchange).
      expert_dtype: None (the expert weights in ``dtype``) or ``"fp8_block"``: DeepSeek's block-scaled FP8 kept as
        stored — float8_e4m3fn weights beside float32 ``{name}_scale_inv`` per block, taken by the grouped GEMM as
        they are where it reads FP8 (``gmm_impl="tokamax"``), else dequantized on each rank to ``dtype``
        (`tempo_jax.layer.fp8`, `pallas_kernels.fp8_path`); frozen (zero gradients).
      fp8_block: HF's ``quantization_config.weight_block_size`` ``(b0, b1)``: each scale covers b0 rows of a
        weight's outputs × b1 columns of its inputs (DeepSeek: 128 × 128).
      fp8_activations: with FP8 experts, also quantize the rows entering each grouped GEMM to e4m3, one scale per
        token and b1 columns (DeepSeek's 1 × 128 activation tiles; `pallas_kernels.gmm`'s ``quantize_lhs``): the
        numerics of an e4m3 × e4m3 GEMM, multiplied in ``dtype`` (no FP8 × FP8 kernel takes e4m3 weights in
        tokamax 0.0.17); gradients pass straight through. Default False.
      router: the `RouterConfig` (scoring, biases, group-limited choice, renormalisation, scaling; default:
        softmax top-k, renormalised, as Mixtral).
      expert: the `ExpertConfig` of the routed experts (activation, biases, clamp; default plain SwiGLU).
      shared: a `SharedConfig` for shared experts beside the routed ones (None: none).
      output: the `OutputConfig` of the block's output after routed + shared (a learned bias, a learned RMSNorm;
        default: neither).
      zero_experts: Z zero-computation experts beside the E routed ones (LongCat-Flash): the router scores E + Z,
        a token may choose ids E … E+Z−1 like any other, and such a pair runs no FFN and crosses no link — its
        output is the token itself (``zero_expert_output="identity"``: ``w · x``) or nothing (``"zero"``). Their
        pairs count nowhere in the dispatch (tables, counts, plan, statistics: the cost model prices them at zero).
      zero_expert_output: "identity" (LongCat-Flash) or "zero" (a skip expert).
      latent: a `LatentConfig`: the routed experts at width L (tokens projected before they are sent and back after
        the weighted sum; MuSE-Spark, Nemotron-H's moe_latent_size); None: at H.
      capacity: rows per (source, destination) block of the exchange: ``"auto"`` (default) = dropless in rounds of
        C = capacity_factor × the mean block rows (`auto_capacity`; `tempo_jax.layer.rounds`: as many rounds as the
        largest block needs, memory bounded by C, one compile); None = the dropless worst case T/D·K in one
        exchange; a positive int = that many, pairs beyond it dropped (counted in ``MoEOutput.stats.drops``).
        ``moe_forward(capacity=...)`` overrides it per call. A CascadeEP schedule uses the worst case for "auto".
      capacity_factor: C of ``"auto"`` in mean blocks (rounds of a batch whose blocks all fit: 1).
      axis: name of the expert-parallel mesh axis (D ranks; `tempo_jax.layer.mesh`).
      node_axis: a second mesh axis the expert slots are also split over, slower than ``axis`` (the nodes of a
        multi-node deployment: D = nodes × ``axis`` ranks, rank = node · |axis| + its ``axis`` index); None: the
        slots over ``axis`` alone. Every expert-parallel collective then runs over both (`expert_axes`).
      node_exchange: how rows cross the nodes with ``node_axis``: ``"flat"`` (default: one exchange over both axes, a
        token to another node once per expert it chose there) or ``"two_hop"`` (each token once per node that holds
        one of its experts, forwarded inside the node, the node's partial sums combined before they return:
        `tempo_jax.layer.two_hop`; dropless: ``capacity`` "auto" or None). The output is the same.
      batch_axes: the mesh axes the tokens are also split over (data parallelism: each coordinate is one EP group
        that routes, exchanges and computes only its own tokens; expert weights replicated over them, gradients
        summed). None (default): the axes the tokens are sharded over when their sharding can be seen (a placed
        array; an Explicit mesh), else every mesh axis of size > 1 but ``axis`` and ``tensor_axis``
        (`tempo_jax.layer.mesh.layer_axes`; `tempo_jax.MoE` resolves it once, at construction); () keeps the tokens
        replicated over every other axis.
      tensor_axis: a mesh axis that splits every expert's F (and the shared experts' Fs) across its devices
        (expert tensor parallelism; the output is reduced over it once per call). None: no tensor parallelism.
      fsdp_axis: one of the batch axes over which the expert weights are additionally split along H, gathered
        in the layer per call and their gradients reduce-scattered (FSDP). None: replicated over the batch axes.
      schedule: ``"sync"`` (one all-to-all) or a `solvers.LaunchSchedule` (CascadeEP: per-source exchange
        rounds, one grouped GEMM per launch group; `tempo_jax.layer.cascade_exec`). The output is the same.
      fetches: OEWF `WeightFetch`es (helper computes its own tokens of the donor's experts with fetched weights).
      replica_sync: how training sums the gradients of an expert's replicas across ranks
        (`tempo_jax.layer.replicas`): ``"exchange"`` (each rank sends the ranks it shares experts with their rows:
        point to point with the ragged exchange), ``"all_reduce"`` (one all-reduce of the redundant slots), or
        ``"auto"`` (the exchange when ragged, else whichever sends fewer bytes). The gradients are the same.
    """

    hidden: int
    ffn: int
    experts: int
    top_k: int
    slots_per_rank: int
    dtype: Any = jnp.float32
    exchange: ExchangeImpl = "auto"
    gmm_impl: GmmImpl = "auto"
    interpret: bool = False
    dispatch_mode: DispatchMode = "sample"
    router: RouterConfig = RouterConfig()
    expert: ExpertConfig = ExpertConfig()
    shared: SharedConfig | None = None
    output: OutputConfig = OutputConfig()
    zero_experts: int = 0
    zero_expert_output: str = "identity"
    latent: LatentConfig | None = None
    capacity: int | str | None = "auto"
    capacity_factor: float = 2.0
    axis: str = "ep"
    node_axis: str | None = None
    node_exchange: str = "flat"
    batch_axes: tuple[str, ...] | None = None
    tensor_axis: str | None = None
    fsdp_axis: str | None = None
    schedule: str | LaunchSchedule = "sync"
    fetches: tuple[WeightFetch, ...] = ()
    replica_sync: str = "auto"
    dispatch: str = "tables"
    cost: CostModel | None = None
    dispatch_rounds: int = ROUNDS
    dynamic_slots: int = 0
    copy_cost: CopyCost | None = None
    expert_dtype: str | None = None
    fp8_block: tuple[int, int] = (128, 128)
    fp8_activations: bool = False

    @property
    def fp8_activation_block(self) -> int | None:
        """Columns per activation scale when ``fp8_activations`` (the weights' input block b1), else None."""
        return self.fp8_block[1] if self.fp8_activations else None

    def __post_init__(self):
        plain_scalars(self)
        for name in ("hidden", "ffn", "experts", "top_k", "slots_per_rank"):
            check_int(f"MoEConfig.{name}", getattr(self, name))
        try:
            dtype = jnp.dtype(self.dtype)
        except TypeError:
            raise ValueError(
                f"MoEConfig.dtype {self.dtype!r} is not a dtype; use e.g. jnp.float32 or jnp.bfloat16"
            ) from None
        if not jnp.issubdtype(dtype, jnp.floating):
            raise ValueError(f"MoEConfig.dtype must be a floating-point dtype (float32, bfloat16, ...), got {dtype}")
        check_instance("MoEConfig.axis", self.axis, str)
        self._check_axes()
        check_instance("MoEConfig.interpret", self.interpret, bool)
        if self.slots_per_rank >= 2**16:
            raise ValueError(
                f"MoEConfig.slots_per_rank must be < 65536 (slot ids travel in 16 bits), got {self.slots_per_rank}"
            )
        check_int("MoEConfig.zero_experts", self.zero_experts, minimum=0)
        if self.top_k > self.experts + self.zero_experts:
            raise ValueError(
                f"MoEConfig.top_k={self.top_k} exceeds experts={self.experts}"
                + (f" + zero_experts={self.zero_experts}" if self.zero_experts else "")
            )
        if self.dispatch_mode not in DISPATCH_MODES:
            raise ValueError(
                f"MoEConfig.dispatch_mode must be one of {list(DISPATCH_MODES)}, got {self.dispatch_mode!r}"
            )
        self._check_dispatch()
        EXCHANGE.validate(self.exchange)
        if self.replica_sync not in REPLICA_SYNC:
            raise ValueError(f"MoEConfig.replica_sync must be one of {list(REPLICA_SYNC)}, got {self.replica_sync!r}")
        GMM.validate(self.gmm_impl)
        for name, kind in (("router", RouterConfig), ("expert", ExpertConfig), ("output", OutputConfig)):
            if not isinstance(getattr(self, name), kind):
                article = "an" if kind.__name__[0] in "AEIOU" else "a"
                raise ValueError(f"MoEConfig.{name} must be {article} {kind.__name__}, got {getattr(self, name)!r}")
        self.router.validate(self.routed_choices, self.top_k)
        self._check_zero_experts()
        self._check_latent()
        self.expert.validate()
        self.output.validate()
        if self.shared is not None:
            if not isinstance(self.shared, SharedConfig):
                raise ValueError(f"MoEConfig.shared must be a SharedConfig or None, got {self.shared!r}")
            self.shared.validate()
        self._check_routed_shared()
        if not (self.schedule == "sync" or isinstance(self.schedule, LaunchSchedule)):
            raise ValueError(f"MoEConfig.schedule must be 'sync' or a solvers.LaunchSchedule, got {self.schedule!r}")
        if self.exchange == "ring" and self.schedule != "sync":
            raise ValueError(
                "MoEConfig: exchange='ring' gathers every token at once, a CascadeEP launch schedule sends each "
                "source's rows when it is ready; use exchange='auto' (or a block exchange) with a schedule"
            )
        self._check_node_exchange()
        object.__setattr__(self, "fetches", tuple(self.fetches))
        if not all(isinstance(f, WeightFetch) for f in self.fetches):
            raise ValueError("MoEConfig.fetches must be tempo_jax.layer.cascade_plan.WeightFetch values")
        c = self.capacity
        if not (c is None or c == "auto" or (isinstance(c, int | np.integer) and not isinstance(c, bool) and c >= 1)):
            raise ValueError(
                f"MoEConfig.capacity must be 'auto' (dropless rounds), None (dropless worst case) or a positive int "
                f"(rows per block; the rest dropped), got {c!r}"
            )
        f = self.capacity_factor
        if isinstance(f, bool) or not isinstance(f, int | float) or not 0 < f < float("inf"):
            raise ValueError(f"MoEConfig.capacity_factor must be a finite number > 0, got {f!r}")
        self._check_fp8()

    @property
    def routed_choices(self) -> int:
        """The router's columns: the E experts and the Z zero-computation ones (ids E … E+Z−1)."""
        return self.experts + self.zero_experts

    @property
    def expert_width(self) -> int:
        """The routed experts' input and output width: L with a `LatentConfig`, else H."""
        return self.hidden if self.latent is None else self.latent.width

    def _check_latent(self) -> None:
        w = "MoEConfig"
        if self.latent is not None:
            if not isinstance(self.latent, LatentConfig):
                raise ValueError(f"{w}.latent must be a LatentConfig or None, got {self.latent!r}")
            self.latent.validate()
            if self.zero_experts and self.zero_expert_output == "identity":
                raise ValueError(f"{w}: identity zero-computation experts with latent experts are not defined")
            if self.router.weight_on != "output":
                raise ValueError(f"{w}: latent experts need weight_on='output' (the weight applies at width L)")
        if self.expert.out_norm_eps is not None:
            if self.tensor_axis is not None:
                raise ValueError(
                    f"{w}: expert.out_norm_eps normalises each expert's whole output row, which tensor_axis splits "
                    "into partial sums; use it without tensor_axis"
                )
            if self.expert_dtype is not None:
                raise ValueError(f"{w}: expert.out_norm_eps scales w_down per call; FP8 experts keep it as stored")

    def _check_zero_experts(self) -> None:
        w = "MoEConfig"
        if self.zero_expert_output not in ("identity", "zero"):
            raise ValueError(f"{w}.zero_expert_output must be 'identity' or 'zero', got {self.zero_expert_output!r}")
        if not self.zero_experts:
            if self.zero_expert_output != MoEConfig.zero_expert_output:
                raise ValueError(f"{w}.zero_expert_output is the output of zero_experts; set zero_experts > 0")
            return
        if self.router.weight_on != "output":
            raise ValueError(f"{w}: zero_experts output w·x (or nothing); weight_on='input' is not defined with them")
        if self.router.expert_scale:
            raise ValueError(
                f"{w}: router.expert_scale holds one scale per routed expert; zero_experts have none (use one)"
            )
        if self.router.balance_rate:
            raise ValueError(
                f"{w}: router.balance_rate moves the selection bias by each expert's load; zero_experts' pairs are "
                "counted nowhere, so their bias would drift (use one of them)"
            )

    def _check_routed_shared(self) -> None:
        rows = self.router.shared_rows
        if not rows:
            return
        count = None if self.shared is None else self.shared.count
        if count != rows:
            raise ValueError(
                f"MoEConfig: router.shared_rows={rows} weights {rows} shared experts, but shared has "
                f"{'none' if count is None else f'count={count}'}; give shared=SharedConfig(count={rows}, ffn=...)"
            )
        if self.tensor_axis is not None:
            raise ValueError(
                "MoEConfig: router-weighted shared experts (router.shared_rows) scale each shared expert's whole "
                "hidden width, which tensor_axis splits; use them without tensor_axis"
            )

    def _check_fp8(self) -> None:
        w = "MoEConfig"
        if self.expert_dtype not in EXPERT_DTYPES:
            raise ValueError(
                f"{w}.expert_dtype must be None (the experts in MoEConfig.dtype) or 'fp8_block' (DeepSeek's "
                f"block-scaled FP8, kept as stored), got {self.expert_dtype!r}"
            )
        if not isinstance(self.fp8_activations, bool | np.bool_):
            raise ValueError(f"{w}.fp8_activations must be True or False, got {self.fp8_activations!r}")
        if self.fp8_activations and self.expert_dtype != "fp8_block":
            raise ValueError(
                f"{w}.fp8_activations quantizes the activations beside FP8 experts: it needs expert_dtype='fp8_block'"
            )
        b = self.fp8_block
        if not (
            isinstance(b, tuple | list)
            and len(b) == 2
            and all(isinstance(v, int | np.integer) and not isinstance(v, bool) and v >= 1 for v in b)
        ):
            raise ValueError(
                f"{w}.fp8_block must be two positive ints (HF's weight_block_size: rows of out, columns of in per "
                f"scale), got {b!r}"
            )
        object.__setattr__(self, "fp8_block", (int(b[0]), int(b[1])))
        if self.expert_dtype is None and self.fp8_block != (128, 128):
            raise ValueError(
                f"{w}.fp8_block={self.fp8_block} is the block of FP8 experts; it needs expert_dtype='fp8_block' "
                "(refusing to ignore it)"
            )
        if self.expert_dtype == "fp8_block" and not self.expert.gated:
            raise ValueError(
                f"{w}: FP8 experts (expert_dtype='fp8_block') are gated here; plain experts (activation "
                f"{self.expert.activation!r}) keep their weights in MoEConfig.dtype"
            )
        if self.expert_dtype == "fp8_block" and jnp.dtype(self.dtype).itemsize < 2:
            raise ValueError(f"{w}.dtype {jnp.dtype(self.dtype)} is what FP8 experts compute in: use bf16 or f32")

    @property
    def expert_axes(self) -> str | tuple[str, str]:
        """The mesh axes the expert slots are split over, as a collective's axis name: ``axis``, or ``(node_axis,
        axis)`` (rank = node · |axis| + the ``axis`` index)."""
        return self.axis if self.node_axis is None else (self.node_axis, self.axis)

    def ranks_on(self, mesh) -> int:
        """D on ``mesh``: the product of the `expert_axes` sizes (ValueError naming a missing axis)."""
        axes = (self.expert_axes,) if isinstance(self.expert_axes, str) else self.expert_axes
        missing = [a for a in axes if a not in mesh.shape]
        if missing:
            field = "axis" if missing[0] == self.axis else "node_axis"
            raise ValueError(
                f"axis {missing[0]!r} is not in the mesh (axes: {list(mesh.shape)}); set MoEConfig.{field} to one of "
                "them or build the mesh with tempo_jax.make_mesh(...)"
            )
        return math.prod(int(mesh.shape[a]) for a in axes)

    def _check_node_exchange(self) -> None:
        w = "MoEConfig"
        if self.router.max_nodes and self.node_axis is None:
            raise ValueError(
                f"{w}: RouterConfig(max_nodes={self.router.max_nodes}) limits each token to the best nodes of "
                "node_axis; set node_axis (a node × ep mesh) or leave max_nodes out"
            )
        if self.node_exchange not in ("flat", "two_hop"):
            raise ValueError(f"{w}.node_exchange must be 'flat' or 'two_hop', got {self.node_exchange!r}")
        if self.node_exchange == "flat":
            return
        if self.node_axis is None:
            raise ValueError(
                f"{w}: node_exchange='two_hop' crosses the nodes of node_axis; set node_axis (a node × ep mesh) or "
                "leave node_exchange out"
            )
        if self.exchange == "ring":
            raise ValueError(
                f"{w}: node_exchange='two_hop' is a block exchange per hop; exchange='ring' gathers every token "
                "instead: use exchange='auto' (or a block exchange) with it"
            )
        if self.schedule != "sync":
            raise ValueError(
                f"{w}: node_exchange='two_hop' runs one exchange per hop; a CascadeEP launch schedule sends each "
                "source's rows when they are ready: use node_exchange='flat' with a schedule"
            )
        if self.capacity not in (None, "auto"):
            raise ValueError(
                f"{w}: node_exchange='two_hop' is dropless (a token once per node, its pairs in rounds inside the "
                f"node); capacity={self.capacity!r} would drop pairs: use 'auto' or None"
            )

    def _check_axes(self) -> None:
        w = "MoEConfig"
        b = self.batch_axes
        if b is not None:
            if isinstance(b, str):
                raise ValueError(
                    f"{w}.batch_axes must be a tuple of mesh axis names, e.g. ({b!r},); got the string {b!r}"
                )
            if not isinstance(b, tuple | list) or not all(isinstance(a, str) for a in b):
                raise ValueError(f"{w}.batch_axes must be None or a tuple of mesh axis names, got {b!r}")
            if len(set(b)) != len(b):
                raise ValueError(f"{w}.batch_axes names an axis twice: {list(b)}")
            object.__setattr__(self, "batch_axes", tuple(b))
        for name in ("node_axis", "tensor_axis", "fsdp_axis"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, str):
                raise ValueError(f"{w}.{name} must be None or a mesh axis name, got {v!r}")
        named = {"axis": self.axis, "node_axis": self.node_axis, "tensor_axis": self.tensor_axis}
        for field, v in named.items():
            if v is not None and b is not None and v in b:
                raise ValueError(f"{w}.batch_axes {list(b)} must not contain the {field} {v!r}")
        if self.tensor_axis is not None and self.tensor_axis == self.axis:
            raise ValueError(f"{w}: tensor_axis and axis are both {self.axis!r}; the two need different mesh axes")
        if self.node_axis is not None and self.node_axis in (self.axis, self.tensor_axis):
            other = "axis" if self.node_axis == self.axis else "tensor_axis"
            raise ValueError(
                f"{w}: node_axis={self.node_axis!r} is also the {other}; the nodes need a mesh axis of their own"
            )
        if self.fsdp_axis is not None:
            if self.fsdp_axis in (self.axis, self.node_axis, self.tensor_axis):
                raise ValueError(
                    f"{w}.fsdp_axis={self.fsdp_axis!r} must be a batch axis, not the expert or tensor axis"
                )
            if b is not None and self.fsdp_axis not in b:
                raise ValueError(f"{w}.fsdp_axis={self.fsdp_axis!r} must be one of batch_axes {list(b)}")

    def _check_dispatch(self) -> None:
        w = "MoEConfig"
        if self.dispatch not in ("tables", "ingraph"):
            raise ValueError(f"{w}.dispatch must be 'tables' or 'ingraph', got {self.dispatch!r}")
        check_int(f"{w}.dispatch_rounds", self.dispatch_rounds)
        if self.dispatch_rounds > MAX_DISPATCH_ROUNDS:
            raise ValueError(
                f"{w}.dispatch_rounds={self.dispatch_rounds:,} exceeds {MAX_DISPATCH_ROUNDS:,} (the plan's round "
                f"counter is int32, and the plan converges in a few rounds: the default is {ROUNDS})"
            )
        check_int(f"{w}.dynamic_slots", self.dynamic_slots, minimum=0)
        if self.dynamic_slots and (self.dispatch != "ingraph" or not isinstance(self.copy_cost, CopyCost)):
            raise ValueError(
                f"{w}: dynamic_slots={self.dynamic_slots} are filled by the in-graph plan, priced by a copy's cost: "
                "set dispatch='ingraph' and copy_cost=solvers.CopyCost(expert_bytes, link_gbps, overlap_us)"
            )
        if self.copy_cost is not None and not self.dynamic_slots:
            raise ValueError(f"{w}: copy_cost is used only with dynamic_slots > 0; set dynamic_slots or leave it out")
        if self.dynamic_slots and self.router.max_nodes:
            raise ValueError(
                f"{w}: dynamic_slots copy hot experts to any rank, which would put an expert on a node its tokens' "
                f"node limit (RouterConfig.max_nodes={self.router.max_nodes}) did not count; use one of them"
            )
        if self.dynamic_slots and self.fetches:
            raise ValueError(
                f"{w}: dynamic_slots and CascadeEP's OEWF fetches both add local slots after the stored ones; use one "
                "of them (a launch schedule combines with dynamic_slots)"
            )
        if self.dispatch == "tables":
            if self.cost is not None or self.dispatch_rounds != ROUNDS:
                raise ValueError(
                    f"{w}: cost and dispatch_rounds are used only by dispatch='ingraph' (with "
                    "dispatch='tables' the tables come from outside the step); set dispatch='ingraph' "
                    "or leave them out"
                )
            return
        if self.cost is None:
            raise ValueError(
                f"{w}: dispatch='ingraph' minimises a cost model's makespan: give cost=solvers.CostModel"
                "(...) (e.g. solvers.PRESETS['dsv3_fp8_offline'])"
            )
        check_relief_cost(self.cost, where=f"{w}.cost")
        if self.dispatch_mode != "quota":
            raise ValueError(
                f"{w}: dispatch='ingraph' realises its plan token for token in dispatch_mode='quota'; "
                f"set dispatch_mode='quota' (got {self.dispatch_mode!r})"
            )


def capacity_bucket(rows: int, *, floor: int = 16, cap: int | None = None) -> int:
    """The compiled capacity for a block of ``rows`` rows: the next power of two, at least ``floor``, at most
    ``cap`` (the dropless worst case); calibration's padded buffers use it."""
    bucket = max(floor, 1 << max(0, math.ceil(math.log2(max(rows, 1)))))
    return bucket if cap is None else min(cap, bucket)


def auto_capacity(config: MoEConfig, tokens_per_rank: int, num_ranks: int) -> int:
    """C of ``capacity="auto"``: ``capacity_factor`` × the mean block ``tokens_per_rank·K / D`` rows, rounded up
    to a multiple of 8 and at most the worst case ``tokens_per_rank·K``. A static function of the shapes (one
    compile per batch shape, as any jitted step), not a power-of-two bucket: memory follows C linearly."""
    worst = tokens_per_rank * config.top_k
    rows = math.ceil(config.capacity_factor * worst / num_ranks)
    return min(worst, max(8, -(-rows // 8) * 8))


def make_ep_mesh(num_devices: int | None = None, axis: str = "ep") -> jax.sharding.Mesh:
    """A 1-D mesh over the first ``num_devices`` devices (default None: all) with an Auto ``ep`` axis.

    Raises:
      ValueError: ``num_devices`` not a positive int, or more than the devices there are."""
    have = len(jax.devices())
    n = have if num_devices is None else num_devices
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or not 1 <= n <= have:
        raise ValueError(
            f"make_ep_mesh: num_devices must be a positive int no larger than the {have} devices (None: all of "
            f"them), got {num_devices!r}"
        )
    n = int(n)
    if not isinstance(axis, str) or not axis:
        raise ValueError(f"make_ep_mesh: axis must be a non-empty axis name (MoEConfig.axis, e.g. 'ep'), got {axis!r}")
    return jax.make_mesh((n,), (axis,), axis_types=(jax.sharding.AxisType.Auto,), devices=jax.devices()[:n])
