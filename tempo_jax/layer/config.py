"""The MoE layer's configuration and parameters: `MoEConfig`, `make_ep_mesh`, `init_params`, `materialize`,
and `capacity_bucket` (the one rule that rounds a block size up to a compiled capacity).

Glossary: H hidden, F expert FFN width, E logical experts, K top-k, D ranks on the ``ep`` axis, S physical slots
per rank, P = D·S physical slots.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels import DISPATCH_MODES, GMM, DispatchMode, GmmImpl
from solvers import LaunchSchedule

from .cascade_plan import WeightFetch
from .exchange import EXCHANGE, ExchangeImpl

__all__ = ["MoEConfig", "capacity_bucket", "init_params", "make_ep_mesh", "materialize"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class MoEConfig:
    """Static configuration of the MoE layer.

    Attributes:
      hidden: H.  ffn: F (per expert).  experts: E.  top_k: K.
      slots_per_rank: S physical expert slots per rank (P = D·S must match the placement).
      dtype: activation/weight dtype for the expert FFN (router runs in float32).
      exchange: "auto" (ragged on GPU/TPU, padded on CPU), "padded" or "ragged" (`ExchangeImpl`).
      gmm_impl: `pallas_kernels.gmm` implementation (`GmmImpl`: "auto", "pallas", "chunked", "ragged_dot").
      interpret: run Pallas kernels in interpret mode (CPU tests).
      dispatch_mode: "sample" (paper: each pair draws its replica from the table) or "quota" (deterministic).
      renormalize: renormalise the top-k gate weights to sum to 1.
      capacity: rows per (source, destination) block: None = the dropless worst case T/D·K; a positive int =
        that many (pairs beyond it are dropped, counted in ``MoEOutput.stats.drops``); ``"auto"`` = the `MoE`
        module's bucketed capacity with a dropless re-run (see `tempo_jax.layer.module`); `moe_forward` itself
        needs an int or None (``capacity=`` overrides per call).
      axis: name of the expert-parallel mesh axis.
      schedule: ``"sync"`` (one all-to-all) or a `solvers.LaunchSchedule` (CascadeEP: per-source exchange
        rounds, one grouped GEMM per launch group; `tempo_jax.layer.cascade_exec`). The output is the same.
      fetches: OEWF `WeightFetch`es (helper computes its own tokens of the donor's experts with fetched weights).
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
    renormalize: bool = True
    capacity: int | str | None = None
    axis: str = "ep"
    schedule: str | LaunchSchedule = "sync"
    fetches: tuple[WeightFetch, ...] = ()

    def __post_init__(self):
        for name in ("hidden", "ffn", "experts", "top_k", "slots_per_rank"):
            if getattr(self, name) < 1:
                raise ValueError(f"MoEConfig.{name} must be ≥ 1, got {getattr(self, name)}")
        if self.slots_per_rank >= 2**16:
            raise ValueError(f"MoEConfig.slots_per_rank must be < 65536 (slot ids travel in 16 bits), got "
                             f"{self.slots_per_rank}")  # fmt: skip
        if self.top_k > self.experts:
            raise ValueError(f"MoEConfig.top_k={self.top_k} exceeds experts={self.experts}")
        if self.dispatch_mode not in DISPATCH_MODES:
            raise ValueError(f"MoEConfig.dispatch_mode must be one of {list(DISPATCH_MODES)}, got "
                             f"{self.dispatch_mode!r}")  # fmt: skip
        EXCHANGE.validate(self.exchange)
        GMM.validate(self.gmm_impl)
        if not (self.schedule == "sync" or isinstance(self.schedule, LaunchSchedule)):
            raise ValueError(f"MoEConfig.schedule must be 'sync' or a solvers.LaunchSchedule, got {self.schedule!r}")
        object.__setattr__(self, "fetches", tuple(self.fetches))
        if not all(isinstance(f, WeightFetch) for f in self.fetches):
            raise ValueError("MoEConfig.fetches must be tempo_jax.layer.cascade_plan.WeightFetch values")
        c = self.capacity
        if not (c is None or c == "auto" or (isinstance(c, int | np.integer) and not isinstance(c, bool) and c >= 1)):
            raise ValueError(
                f"MoEConfig.capacity must be None (dropless worst case), a positive int (rows per block) or "
                f"'auto' (bucketed, dropless), got {c!r}"
            )


def capacity_bucket(rows: int, *, floor: int = 16, cap: int | None = None) -> int:
    """The compiled capacity for a block of ``rows`` rows: the next power of two, at least ``floor``, at most
    ``cap`` (the dropless worst case). One rule for the module's buckets, calibration and the benchmarks."""
    bucket = max(floor, 1 << max(0, math.ceil(math.log2(max(rows, 1)))))
    return bucket if cap is None else min(cap, bucket)


def make_ep_mesh(num_devices: int | None = None, axis: str = "ep") -> jax.sharding.Mesh:
    """A 1-D mesh over the first ``num_devices`` devices (default all) with an Auto ``ep`` axis."""
    n = num_devices or len(jax.devices())
    return jax.make_mesh((n,), (axis,), axis_types=(jax.sharding.AxisType.Auto,), devices=jax.devices()[:n])


def init_params(key: jax.Array, config: MoEConfig) -> dict:
    """Logical parameters: router [H, E] float32, w_gate/w_up [E, H, F], w_down [E, F, H] (config.dtype)."""
    k = jax.random.split(key, 4)
    H, F, E = config.hidden, config.ffn, config.experts
    scale_in, scale_out = H**-0.5, F**-0.5
    return {
        "router": jax.random.normal(k[0], (H, E), jnp.float32) * scale_in,
        "w_gate": (jax.random.normal(k[1], (E, H, F)) * scale_in).astype(config.dtype),
        "w_up": (jax.random.normal(k[2], (E, H, F)) * scale_in).astype(config.dtype),
        "w_down": (jax.random.normal(k[3], (E, F, H)) * scale_out).astype(config.dtype),
    }


def materialize(params: dict, phy2log: jax.Array) -> dict:
    """Physical expert weights ``[P, ...]`` gathered from logical ``[E, ...]`` (gradients of replicas flow back
    to the logical parameters through the gather)."""
    return {name: jnp.take(params[name], phy2log, axis=0) for name in ("w_gate", "w_up", "w_down")}
