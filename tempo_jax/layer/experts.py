"""Expert variants and shared experts of the MoE families the layer expresses.

Routed experts are gated FFNs ``down(act(gate(x), up(x)))``, or plain ones ``down(act(up(x)))`` (no gate projection),
by ``ExpertConfig.activation``. Gated:

- ``"swiglu"``: ``silu(g) · u`` (Mixtral, Qwen2/3-MoE, DeepSeek-V3, GLM).
- ``"swiglu_clamp"``: ``silu(min(g, limit)) · clip(u, −limit, limit)`` (DeepSeek-V4's ``swiglu_limit``).
- ``"gpt_oss"``: ``g = min(g, limit)``, ``u = clip(u, −limit, limit)``, ``(u + 1) · g · sigmoid(alpha·g)``.
- ``"geglu_tanh"``: ``gelu_tanh(g) · u`` (the tanh approximation of GELU: Gemma 4's ``gelu_pytorch_tanh``).
- ``"geglu"``: ``gelu(g) · u`` (the exact, erf GELU).
- ``"swiglu_post_clamp"``: ``min(silu(g), limit) · clip(u, −limit, limit)`` (Step-3.5 / 3.7: the clamp after the
  activation, with a per-layer limit).
- ``"swiglu_softcap"``: ``cap(g, gate_cap) · sigmoid(g) · cap(u, up_cap)`` with ``cap(v, c) = c·tanh(v / c)``
  (Inkling 2: the soft caps bound the gate's linear factor and the up projection; the sigmoid sees the raw gate).

Plain (`PLAIN_ACTIVATIONS`; no ``w_gate`` / ``b_gate``): ``"relu"`` (Switch Transformers' T5 experts), ``"relu2"`` =
``relu(u)²`` (Nemotron-H), ``"gelu"``, ``"gelu_tanh"``, ``"silu"``.

With ``bias`` every projection has a per-expert bias (gpt-oss): ``b_gate``, ``b_up`` ``[E, F]`` and ``b_down``
``[E, H]``. They are physical-slot arrays like the weights, so they follow each row's expert through the exchange
(the row's local slot id picks them) and work with every grouped-GEMM implementation (added after the GEMM).

Shared experts (`SharedConfig`) run on every token of the rank that holds it, beside the routed ones (no
exchange): ``count`` experts of width ``ffn`` as one gated FFN of width ``count·ffn`` (DeepSeek, GLM) with one of
the activations above (``SharedConfig.activation``: SwiGLU by default; gpt-oss's for MiniMax-M3, Step's post-clamp),
optionally scaled per token by ``sigmoid(x · shared_gate)`` (Qwen2-MoE) and by a constant ``scale`` (Cohere2-MoE).

The block's output (`OutputConfig`, `block_output`): after routed + shared, optionally a learned bias ``out_bias
[H]`` (JetMoE's ``mlp.bias``), then a learned RMSNorm ``out_norm [H]`` (A.X-K1's ``post_mlp_layernorm``).

Latent experts (`LatentConfig`; MuSE-Spark, Nemotron-H's ``moe_latent_size``): the routed experts run at a width L
≠ H — each token projected ``latent_in [H, L]`` (then, optionally, RMS-normed with ``(1 + latent_norm) [L]``) before
it is sent, the weighted sum of its experts' outputs projected back by ``latent_out [L, H]``; the router and the shared
experts read the token at H. `ExpertConfig.out_norm_eps`: each expert's output ``o [L]`` scaled by ``(1 +
expert_out_scale) [L]`` and RMS-normalised before its weight (MuSE-Spark's per-expert output norm).
"""

from __future__ import annotations

import dataclasses
from typing import Literal, get_args

import jax
import jax.numpy as jnp

from solvers.checks import plain_scalars

__all__ = [
    "ACTIVATIONS",
    "EXPERT_BIASES",
    "EXPERT_WEIGHTS",
    "LATENT_KEYS",
    "OUTPUT_KEYS",
    "PLAIN_ACTIVATIONS",
    "ExpertConfig",
    "LatentConfig",
    "OutputConfig",
    "SharedConfig",
    "block_output",
    "expert_out_norm",
    "glu",
    "latent_back",
    "latent_rows",
    "shared_ffn",
]

Activation = Literal[
    "swiglu",
    "swiglu_clamp",
    "gpt_oss",
    "geglu_tanh",
    "geglu",
    "swiglu_post_clamp",
    "swiglu_softcap",
    "relu",
    "relu2",
    "gelu",
    "gelu_tanh",
    "silu",
]
ACTIVATIONS: tuple[str, ...] = get_args(Activation)
#: Activations of plain experts ``down(act(up(x)))``: no gate projection.
PLAIN_ACTIVATIONS = ("relu", "relu2", "gelu", "gelu_tanh", "silu")
#: Per-expert parameter arrays: physical ``[P, ...]`` in the layer, logical ``[E, ...]`` at import / export.
EXPERT_WEIGHTS = ("w_gate", "w_up", "w_down")
EXPERT_BIASES = ("b_gate", "b_up", "b_down")
#: The block-output parameters (`OutputConfig`), ``[H]`` each, replicated.
OUTPUT_KEYS = ("out_bias", "out_norm")
#: The latent experts' projections and norms (`LatentConfig`, `ExpertConfig.out_norm_eps`), replicated.
LATENT_KEYS = ("latent_in", "latent_norm", "latent_out", "expert_out_scale")


def _positive(v) -> bool:
    return not isinstance(v, bool) and isinstance(v, int | float) and 0 < v < float("inf")


def _check_activation(c, w: str) -> None:
    """The activation of an `ExpertConfig` or `SharedConfig` ``c`` and the constants it takes (``w``: its name)."""
    if c.activation not in ACTIVATIONS:
        raise ValueError(f"{w}: unknown activation {c.activation!r}; one of {list(ACTIVATIONS)}")
    if not _positive(c.alpha):
        raise ValueError(f"{w}.alpha must be a finite number > 0, got {c.alpha!r}")
    for name in ("limit", "gate_cap", "up_cap"):
        v = getattr(c, name)
        if v is not None and not _positive(v):
            raise ValueError(f"{w}.{name} must be None or a finite number > 0, got {v!r}")
    clamps = ("swiglu_clamp", "swiglu_post_clamp", "gpt_oss")
    shared_swiglu = isinstance(c, SharedConfig) and c.activation == "swiglu"  # its limit: DeepSeek-V4's clamp
    if c.limit is not None and c.activation not in clamps and not shared_swiglu:
        raise ValueError(f"{w}: activation {c.activation!r} has no clamp; {list(clamps)} take limit={c.limit}")
    if c.activation in ("swiglu_clamp", "swiglu_post_clamp") and c.limit is None:
        raise ValueError(
            f"{w}: activation {c.activation!r} without a limit is plain 'swiglu'; give limit= (the swiglu_limit) or "
            "use activation='swiglu'"
        )
    caps = (c.gate_cap, c.up_cap)
    if c.activation == "swiglu_softcap" and None in caps:
        raise ValueError(f"{w}: activation 'swiglu_softcap' needs gate_cap= and up_cap= (its soft caps), got {caps}")
    if c.activation != "swiglu_softcap" and caps != (None, None):
        raise ValueError(
            f"{w}: gate_cap / up_cap are the soft caps of activation 'swiglu_softcap'; {c.activation!r} would ignore "
            "them (leave them out or set activation='swiglu_softcap')"
        )
    if c.activation != "gpt_oss" and c.alpha != ExpertConfig.alpha:
        raise ValueError(
            f"{w}.alpha={c.alpha} is the sigmoid slope of activation 'gpt_oss' only; {c.activation!r} would ignore it "
            "(leave alpha out or set activation='gpt_oss')"
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExpertConfig:
    """The routed experts' FFN (see the module).

    Attributes:
      activation: one of `ACTIVATIONS` (see the module).
      bias: gate / up / down biases per expert (gpt-oss).
      alpha: gpt-oss's sigmoid slope (1.702).
      limit: the clamp of "swiglu_clamp", "swiglu_post_clamp" and "gpt_oss" (swiglu_limit; None: no clamp).
      gate_cap / up_cap: the soft caps of "swiglu_softcap" (Inkling 2's mlp_gate_softcap / mlp_up_softcap).
      out_norm_eps: each expert's output times ``(1 + expert_out_scale)`` (a learned vector shared by the experts)
        and RMS-normalised with this epsilon before its weight (MuSE-Spark's ``post_expert_norm``); None: off.
    """

    activation: Activation = "swiglu"
    bias: bool = False
    alpha: float = 1.702
    limit: float | None = None
    gate_cap: float | None = None
    up_cap: float | None = None
    out_norm_eps: float | None = None

    def __post_init__(self):
        plain_scalars(self)  # np.int64(4) behaves as 4

    def validate(self) -> None:
        w = "ExpertConfig"
        if not isinstance(self.bias, bool):
            raise ValueError(f"{w}.bias must be True or False, got {self.bias!r}")
        _check_activation(self, w)
        e = self.out_norm_eps
        if e is not None and (isinstance(e, bool) or not isinstance(e, int | float) or not 0 <= e < float("inf")):
            raise ValueError(f"{w}.out_norm_eps must be None or a finite number >= 0, got {e!r}")
        if e is not None and self.bias:
            raise ValueError(f"{w}: out_norm_eps normalises each expert's output; with bias=True it is not defined")

    @property
    def gated(self) -> bool:
        """Whether the experts have a gate projection (``w_gate``): every activation but `PLAIN_ACTIVATIONS`."""
        return self.activation not in PLAIN_ACTIVATIONS

    @property
    def keys(self) -> tuple[str, ...]:
        """The per-expert parameter names of this variant."""
        keys = EXPERT_WEIGHTS + (EXPERT_BIASES if self.bias else ())
        return keys if self.gated else tuple(k for k in keys if k not in ("w_gate", "b_gate"))


@dataclasses.dataclass(frozen=True, kw_only=True)
class SharedConfig:
    """Shared experts, dense over every token (see the module).

    Attributes:
      count: n_shared experts, run as one SwiGLU of width count·ffn.
      ffn: the width of one shared expert.
      gated: scale the shared output per token by sigmoid(x · shared_gate) (Qwen2-MoE).
      activation: the gated activation, one of `ACTIVATIONS` (default SwiGLU; "gpt_oss": MiniMax-M3,
        "swiglu_post_clamp": Step-3.7).
      limit: the activation's clamp; with "swiglu", the gate clamped above and the up projection within ±limit
        before the SwiGLU (DeepSeek-V4's shared expert clamps like its routed ones: "swiglu_clamp"); None: no clamp.
      alpha, gate_cap, up_cap: as `ExpertConfig`'s (gpt-oss's slope; the soft caps of "swiglu_softcap").
      scale: a constant multiplying the shared output (Cohere2-MoE's "average": (routed + shared) / 2 is
        ``RouterConfig.scaling=0.5`` with ``scale=0.5``).
    """

    count: int = 1
    ffn: int = 1
    gated: bool = False
    limit: float | None = None
    scale: float = 1.0
    activation: Activation = "swiglu"
    alpha: float = 1.702
    gate_cap: float | None = None
    up_cap: float | None = None

    def __post_init__(self):
        plain_scalars(self)  # np.int64(4) behaves as 4

    def validate(self) -> None:
        for name in ("count", "ffn"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"SharedConfig.{name} must be an integer >= 1, got {v!r}")
        if not isinstance(self.gated, bool):
            raise ValueError(f"SharedConfig.gated must be True or False, got {self.gated!r}")
        _check_activation(self, "SharedConfig")
        if isinstance(self.scale, bool) or not isinstance(self.scale, int | float) or not 0 < self.scale < float("inf"):
            raise ValueError(f"SharedConfig.scale must be a finite number > 0, got {self.scale!r}")

    @property
    def width(self) -> int:
        return self.count * self.ffn

    @property
    def ffn_config(self) -> ExpertConfig:
        """The shared FFN's activation as an `ExpertConfig` (a "swiglu" with a limit is "swiglu_clamp")."""
        act = "swiglu_clamp" if self.activation == "swiglu" and self.limit is not None else self.activation
        return ExpertConfig(
            activation=act, alpha=self.alpha, limit=self.limit, gate_cap=self.gate_cap, up_cap=self.up_cap
        )


def glu(g: jax.Array | None, u: jax.Array, config: ExpertConfig) -> jax.Array:
    """The activation of ``config`` on gate and up projections ``g, u [M, F]`` (``g`` None for plain experts)."""
    if not config.gated:
        return _plain(u, config.activation)
    if config.activation == "swiglu":
        return jax.nn.silu(g) * u
    if config.activation in ("geglu_tanh", "geglu"):
        return jax.nn.gelu(g, approximate=config.activation == "geglu_tanh") * u
    if config.activation == "swiglu_softcap":  # the sigmoid reads the raw gate, the caps bound the linear factors
        gc, uc = config.gate_cap, config.up_cap
        return gc * jnp.tanh(g / gc) * jax.nn.sigmoid(g) * (uc * jnp.tanh(u / uc))
    if config.activation == "swiglu_post_clamp":
        lim = config.limit
        return jnp.minimum(jax.nn.silu(g), lim) * jnp.clip(u, -lim, lim)
    lim = config.limit
    if lim is not None:
        g, u = jnp.minimum(g, lim), jnp.clip(u, -lim, lim)
    if config.activation == "swiglu_clamp":
        return jax.nn.silu(g) * u
    return (u + 1) * g * jax.nn.sigmoid(config.alpha * g)


def _plain(u: jax.Array, activation: str) -> jax.Array:
    if activation == "relu":
        return jax.nn.relu(u)
    if activation == "relu2":
        return jnp.square(jax.nn.relu(u))
    if activation == "silu":
        return jax.nn.silu(u)
    return jax.nn.gelu(u, approximate=activation == "gelu_tanh")


def shared_ffn(x: jax.Array, params: dict, config: SharedConfig, dtype, weights: jax.Array | None = None) -> jax.Array:
    """Shared experts on ``x [T, H]``: ``shared_w_gate / shared_w_up [H, Fs]``, ``shared_w_down [Fs, H]``, and
    ``shared_gate [H]`` when gated → ``[T, H]`` float32. ``weights [T, count]``: the router's weight of each shared
    expert per token (`tempo_jax.layer.routing.RouterConfig.shared_rows`), scaling its hidden activations (columns
    ``s·ffn … (s+1)·ffn``) before the down projection; None: unweighted."""
    hp = jax.lax.Precision.HIGHEST
    xs = x.astype(dtype)
    g = jnp.dot(xs, params["shared_w_gate"], precision=hp) if config.ffn_config.gated else None
    h = glu(g, jnp.dot(xs, params["shared_w_up"], precision=hp), config.ffn_config)
    if weights is not None:
        h = h * jnp.repeat(weights, config.ffn, axis=1).astype(h.dtype)
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


@dataclasses.dataclass(frozen=True, kw_only=True)
class OutputConfig:
    """What the block does to its output after routed + shared experts (see the module).

    Attributes:
      bias: add a learned ``out_bias [H]`` (JetMoE's ``mlp.bias``).
      norm: then RMS-normalise each row and multiply by a learned ``out_norm [H]`` (A.X-K1's
        ``post_mlp_layernorm``): ``w · y / sqrt(mean(y²) + norm_eps)`` in float32.
      norm_eps: the epsilon of ``norm`` (the family's ``rms_norm_eps``).
    """

    bias: bool = False
    norm: bool = False
    norm_eps: float = 1e-6

    def __post_init__(self):
        plain_scalars(self)

    def validate(self) -> None:
        for name in ("bias", "norm"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"OutputConfig.{name} must be True or False, got {getattr(self, name)!r}")
        e = self.norm_eps
        if isinstance(e, bool) or not isinstance(e, int | float) or not 0 <= e < float("inf"):
            raise ValueError(f"OutputConfig.norm_eps must be a finite number >= 0, got {e!r}")
        if not self.norm and e != OutputConfig.norm_eps:
            raise ValueError(
                f"OutputConfig.norm_eps={e} is the epsilon of the output norm; with norm=False it would be ignored "
                "(leave it out or set norm=True)"
            )

    @property
    def keys(self) -> tuple[str, ...]:
        """The parameters this output needs (``out_bias``, ``out_norm``)."""
        return tuple(k for k, on in zip(OUTPUT_KEYS, (self.bias, self.norm), strict=True) if on)


def block_output(y: jax.Array, params: dict, config: OutputConfig) -> jax.Array:
    """The block's output ``y [T, H]`` (routed + shared) through ``config``: ``+ out_bias``, then the RMSNorm with
    ``out_norm`` → ``[T, H]`` in ``y``'s dtype (float32 inside)."""
    if not (config.bias or config.norm):
        return y
    z = y.astype(jnp.float32)
    if config.bias:
        z = z + params["out_bias"].astype(jnp.float32)
    if config.norm:
        z = z * jax.lax.rsqrt(jnp.mean(z * z, axis=-1, keepdims=True) + config.norm_eps)
        z = z * params["out_norm"].astype(jnp.float32)
    return z.astype(y.dtype)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LatentConfig:
    """The routed experts at a latent width (see the module).

    Attributes:
      width: L, the experts' input and output width.
      norm: RMS-normalise the projected token with ``(1 + latent_norm)`` (MuSE-Spark's ``pre_expert_norm``).
      norm_eps: its epsilon.
    """

    width: int
    norm: bool = False
    norm_eps: float = 1e-6

    def __post_init__(self):
        plain_scalars(self)

    def validate(self) -> None:
        w = "LatentConfig"
        if isinstance(self.width, bool) or not isinstance(self.width, int) or self.width < 1:
            raise ValueError(f"{w}.width must be an integer >= 1, got {self.width!r}")
        if not isinstance(self.norm, bool):
            raise ValueError(f"{w}.norm must be True or False, got {self.norm!r}")
        e = self.norm_eps
        if isinstance(e, bool) or not isinstance(e, int | float) or not 0 <= e < float("inf"):
            raise ValueError(f"{w}.norm_eps must be a finite number >= 0, got {e!r}")
        if not self.norm and e != LatentConfig.norm_eps:
            raise ValueError(f"{w}.norm_eps={e} is the epsilon of norm=True; it would be ignored (leave it out)")


def latent_rows(x: jax.Array, params: dict, config: LatentConfig, dtype) -> jax.Array:
    """Tokens ``x [T, H]`` at the experts' latent width: ``x · latent_in`` (then RMS-normed × ``(1 +
    latent_norm)``) → ``[T, L]`` in ``dtype``."""
    hp = jax.lax.Precision.HIGHEST
    z = jnp.dot(x.astype(jnp.float32), params["latent_in"].astype(jnp.float32), precision=hp)
    if config.norm:
        z = z * jax.lax.rsqrt(jnp.mean(z * z, axis=-1, keepdims=True) + config.norm_eps)
        z = z * (1.0 + params["latent_norm"].astype(jnp.float32))
    return z.astype(dtype)


def latent_back(y: jax.Array, params: dict) -> jax.Array:
    """The weighted sum of a token's experts ``y [T, L]`` back at the hidden width: ``y · latent_out`` → ``[T, H]``
    float32."""
    hp = jax.lax.Precision.HIGHEST
    return jnp.dot(y.astype(jnp.float32), params["latent_out"].astype(jnp.float32), precision=hp)


def expert_out_norm(y: jax.Array, eps: float) -> jax.Array:
    """Each row of experts' outputs ``y [M, L]`` (already times ``1 + expert_out_scale``) RMS-normalised; padding
    rows (zeros) stay zero."""
    z = y.astype(jnp.float32)
    return (z * jax.lax.rsqrt(jnp.mean(z * z, axis=-1, keepdims=True) + eps)).astype(y.dtype)
