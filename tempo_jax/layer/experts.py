"""Expert variants and shared experts of the MoE families the layer expresses.

Routed experts are gated FFNs ``down(act(gate(x), up(x)))`` with ``ExpertConfig.activation``:

- ``"swiglu"``: ``silu(g) · u`` (Mixtral, Qwen2/3-MoE, DeepSeek-V3, GLM).
- ``"swiglu_clamp"``: ``silu(min(g, limit)) · clip(u, −limit, limit)`` (DeepSeek-V4's ``swiglu_limit``).
- ``"gpt_oss"``: ``g = min(g, limit)``, ``u = clip(u, −limit, limit)``, ``(u + 1) · g · sigmoid(alpha·g)``.
- ``"geglu_tanh"``: ``gelu_tanh(g) · u`` (the tanh approximation of GELU: Gemma 4's ``gelu_pytorch_tanh``).
- ``"geglu"``: ``gelu(g) · u`` (the exact, erf GELU).

With ``bias`` every projection has a per-expert bias (gpt-oss): ``b_gate``, ``b_up`` ``[E, F]`` and ``b_down``
``[E, H]``. They are physical-slot arrays like the weights, so they follow each row's expert through the exchange
(the row's local slot id picks them) and work with every grouped-GEMM implementation (added after the GEMM).

Shared experts (`SharedConfig`) run on every token of the rank that holds it, beside the routed ones (no
exchange): ``count`` experts of width ``ffn`` as one SwiGLU of width ``count·ffn`` (DeepSeek, GLM), optionally
scaled per token by ``sigmoid(x · shared_gate)`` (Qwen2-MoE) and by a constant ``scale`` (Cohere2-MoE).
"""

from __future__ import annotations

import dataclasses
from typing import Literal, get_args

import jax
import jax.numpy as jnp

from solvers.checks import plain_scalars

__all__ = ["ACTIVATIONS", "EXPERT_BIASES", "EXPERT_WEIGHTS", "ExpertConfig", "SharedConfig", "glu", "shared_ffn"]

Activation = Literal["swiglu", "swiglu_clamp", "gpt_oss", "geglu_tanh", "geglu"]
ACTIVATIONS: tuple[str, ...] = get_args(Activation)
#: Per-expert parameter arrays: physical ``[P, ...]`` in the layer, logical ``[E, ...]`` at import / export.
EXPERT_WEIGHTS = ("w_gate", "w_up", "w_down")
EXPERT_BIASES = ("b_gate", "b_up", "b_down")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExpertConfig:
    """The routed experts' FFN (see the module).

    Attributes:
      activation: "swiglu", "swiglu_clamp", "gpt_oss", "geglu_tanh" or "geglu".
      bias: gate / up / down biases per expert (gpt-oss).
      alpha: gpt-oss's sigmoid slope (1.702).
      limit: the clamp of "swiglu_clamp" and "gpt_oss" (swiglu_limit; None: no clamp).
    """

    activation: Activation = "swiglu"
    bias: bool = False
    alpha: float = 1.702
    limit: float | None = None

    def __post_init__(self):
        plain_scalars(self)  # np.int64(4) behaves as 4

    def validate(self) -> None:
        w = "ExpertConfig"
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"{w}: unknown activation {self.activation!r}; one of {list(ACTIVATIONS)}")
        if not isinstance(self.bias, bool):
            raise ValueError(f"{w}.bias must be True or False, got {self.bias!r}")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, int | float) or not 0 < self.alpha < 1e30:
            raise ValueError(f"{w}.alpha must be a finite number > 0, got {self.alpha!r}")
        if self.limit is not None and (
            isinstance(self.limit, bool) or not isinstance(self.limit, int | float) or not 0 < self.limit < float("inf")
        ):
            raise ValueError(f"{w}.limit must be None or a finite number > 0, got {self.limit!r}")
        if self.activation in ("swiglu", "geglu_tanh", "geglu") and self.limit is not None:
            raise ValueError(
                f"{w}: activation {self.activation!r} has no clamp; 'swiglu_clamp' and 'gpt_oss' take "
                f"limit={self.limit}"
            )
        if self.activation == "swiglu_clamp" and self.limit is None:
            raise ValueError(
                f"{w}: activation 'swiglu_clamp' without a limit is plain 'swiglu'; give limit= (the "
                "swiglu_limit) or use activation='swiglu'"
            )
        if self.activation != "gpt_oss" and self.alpha != ExpertConfig.alpha:
            raise ValueError(
                f"{w}.alpha={self.alpha} is the sigmoid slope of activation 'gpt_oss' only; "
                f"{self.activation!r} would ignore it (leave alpha out or set activation='gpt_oss')"
            )

    @property
    def keys(self) -> tuple[str, ...]:
        """The per-expert parameter names of this variant."""
        return EXPERT_WEIGHTS + (EXPERT_BIASES if self.bias else ())


@dataclasses.dataclass(frozen=True, kw_only=True)
class SharedConfig:
    """Shared experts, dense over every token (see the module).

    Attributes:
      count: n_shared experts, run as one SwiGLU of width count·ffn.
      ffn: the width of one shared expert.
      gated: scale the shared output per token by sigmoid(x · shared_gate) (Qwen2-MoE).
      limit: clamp the gate above and the up projection within ±limit before the SwiGLU (DeepSeek-V4's shared
        expert clamps like its routed ones); None: no clamp.
      scale: a constant multiplying the shared output (Cohere2-MoE's "average": (routed + shared) / 2 is
        ``RouterConfig.scaling=0.5`` with ``scale=0.5``).
    """

    count: int = 1
    ffn: int = 1
    gated: bool = False
    limit: float | None = None
    scale: float = 1.0

    def __post_init__(self):
        plain_scalars(self)  # np.int64(4) behaves as 4

    def validate(self) -> None:
        for name in ("count", "ffn"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"SharedConfig.{name} must be an integer >= 1, got {v!r}")
        if not isinstance(self.gated, bool):
            raise ValueError(f"SharedConfig.gated must be True or False, got {self.gated!r}")
        if self.limit is not None and (
            isinstance(self.limit, bool) or not isinstance(self.limit, int | float) or not 0 < self.limit < float("inf")
        ):
            raise ValueError(f"SharedConfig.limit must be None or a finite number > 0, got {self.limit!r}")
        if isinstance(self.scale, bool) or not isinstance(self.scale, int | float) or not 0 < self.scale < float("inf"):
            raise ValueError(f"SharedConfig.scale must be a finite number > 0, got {self.scale!r}")

    @property
    def width(self) -> int:
        return self.count * self.ffn


def glu(g: jax.Array, u: jax.Array, config: ExpertConfig) -> jax.Array:
    """The gated activation of ``config`` on gate and up projections ``g, u [M, F]``."""
    if config.activation == "swiglu":
        return jax.nn.silu(g) * u
    if config.activation in ("geglu_tanh", "geglu"):
        return jax.nn.gelu(g, approximate=config.activation == "geglu_tanh") * u
    lim = config.limit
    if lim is not None:
        g, u = jnp.minimum(g, lim), jnp.clip(u, -lim, lim)
    if config.activation == "swiglu_clamp":
        return jax.nn.silu(g) * u
    return (u + 1) * g * jax.nn.sigmoid(config.alpha * g)


def shared_ffn(x: jax.Array, params: dict, config: SharedConfig, dtype) -> jax.Array:
    """Shared experts on ``x [T, H]``: ``shared_w_gate / shared_w_up [H, Fs]``, ``shared_w_down [Fs, H]``, and
    ``shared_gate [H]`` when gated → ``[T, H]`` float32."""
    hp = jax.lax.Precision.HIGHEST
    xs = x.astype(dtype)
    g, u = jnp.dot(xs, params["shared_w_gate"], precision=hp), jnp.dot(xs, params["shared_w_up"], precision=hp)
    if config.limit is not None:
        g, u = jnp.minimum(g, config.limit), jnp.clip(u, -config.limit, config.limit)
    h = jax.nn.silu(g) * u
    y = jnp.dot(h, params["shared_w_down"], precision=hp, preferred_element_type=jnp.float32)
    if config.scale != 1.0:
        y = y * config.scale
    if config.gated:
        y = (
            y
            * jax.nn.sigmoid(jnp.dot(x.astype(jnp.float32), params["shared_gate"].astype(jnp.float32), precision=hp))[
                :, None
            ]
        )
    return y
