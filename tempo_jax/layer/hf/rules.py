"""The pieces several families share, each read from the modeling files of the families that use it: config keys
→ routers (`deepseek`, `simple`, `sigmoid_bias`), shared experts (`qwen_shared`, `shared_one`), clamped experts
(`clamped`), which decoder layers are MoE (`qwen_layers`, `layer_types`, `from_layer`, `from_key`), and the
refusals several families share (`swiglu_only`, `clamp_refuse`, `no_mlp_bias`). `tempo_jax.layer.hf.catalog`
composes them per family.
"""

from __future__ import annotations

import dataclasses

from ..experts import ExpertConfig, SharedConfig
from ..routing import RouterConfig
from .spec import Cfg

__all__ = [
    "all_layers",
    "clamp_refuse",
    "clamped",
    "deepseek",
    "from_key",
    "from_layer",
    "layer_types",
    "no_mlp_bias",
    "noise_keys",
    "qwen_layers",
    "qwen_shared",
    "required_layer_types",
    "shared_one",
    "sigmoid_bias",
    "simple",
    "softmax",
    "swiglu_only",
]


def swiglu_only(c: Cfg) -> str | None:
    act = c.config.get("hidden_act", "silu")
    return None if act == "silu" else f"hidden_act {act!r}: the layer's experts are SwiGLU (silu) only"


def qwen_layers(c: Cfg) -> list[int]:
    step = c.positive("decoder_sparse_step", default=1)
    only = set(c.get("mlp_only_layers", default=[], kind=list))
    return [i for i in range(c.num_layers()) if i not in only and (i + 1) % step == 0]


def from_layer(first_dense_default: int):
    return lambda c: list(
        range(min(c.get("first_k_dense_replace", default=first_dense_default), c.num_layers()), c.num_layers())
    )


def all_layers(c: Cfg) -> list[int]:
    return list(range(c.num_layers()))


def softmax(renorm: bool, **kw) -> RouterConfig:
    return RouterConfig(scoring="softmax", renormalize=renorm, **kw)


def simple(E: tuple, F: tuple, renorm, shared=None, **router_kw):
    """A softmax family: E / F keys, renormalisation (a bool, or a (key, default) pair read from the config)."""

    def fields(c: Cfg) -> dict:
        on = renorm if isinstance(renorm, bool) else c.get(renorm[0], default=renorm[1], kind=bool)
        return dict(
            experts=c.get(*E),
            top_k=c.get("num_experts_per_tok"),
            ffn=c.get(*F),
            router=softmax(on, **router_kw),
            shared=shared(c) if shared else None,
        )

    return fields


def qwen_shared(default: int):
    def shared(c: Cfg):
        fs = c.get("shared_expert_intermediate_size", default=default)
        return SharedConfig(count=1, ffn=fs, gated=True) if fs else None

    return shared


def deepseek(
    c: Cfg,
    *,
    scaling: float,
    groups: tuple[int, int],
    renorm_default: bool = True,
    experts: tuple[str, ...] = ("n_routed_experts", "num_local_experts", "num_experts"),
    top_k: tuple[str, ...] = ("num_experts_per_tok",),
    n_shared: tuple[str, ...] = ("n_shared_experts",),
    renorm: tuple[str, ...] = ("norm_topk_prob",),
    n_group: tuple[str, ...] = ("n_group",),
    scaling_key: tuple[str, ...] = ("routed_scaling_factor",),
    shared_default: int = 1,
    shared_ffn: tuple[str, ...] | None = None,
) -> dict:
    """A DeepSeek-V3 block (sigmoid + selection bias, groups, renormalisation + 1e-20, scaling, n_shared × F shared
    experts) under a family's own key spellings and defaults."""
    F = c.get("moe_intermediate_size")
    count = c.get(*n_shared, default=shared_default) if n_shared else 0
    renormalize = c.get(*renorm, default=renorm_default, kind=bool) if renorm else renorm_default
    Fs = c.get(*shared_ffn, default=F) if shared_ffn else F
    router = RouterConfig(
        scoring="sigmoid",
        score_bias=True,
        n_group=c.get(*n_group, default=groups[0]),
        topk_group=c.get("topk_group", default=groups[1]),
        renormalize=renormalize,
        renorm_eps=1e-20 if renormalize else 0.0,
        scaling=float(c.get(*scaling_key, default=scaling, kind=float)),
    )
    return dict(
        experts=c.get(*experts),
        top_k=c.get(*top_k),
        ffn=F,
        router=router,
        shared=SharedConfig(count=count, ffn=Fs) if count else None,
    )


def layer_types(first_dense: int, *, key: str | None = "first_k_dense_replace", dense: str = "dense"):
    """The MoE layers of a config listing ``mlp_layer_types`` (every entry but ``dense``: "sparse" / "moe"), or when
    it does not, every layer from ``first_dense`` (read from ``key`` when the config has it) on."""

    def layers(c: Cfg) -> list[int]:
        types = c.get("mlp_layer_types", default=None, kind=None)
        if types is not None:
            if not isinstance(types, list | tuple) or len(types) != c.num_layers():
                raise ValueError(
                    f"moe_from_hf: config['mlp_layer_types'] must list one entry per layer "
                    f"({c.num_layers()}), got {types!r}"
                )
            return [i for i, t in enumerate(types) if t != dense]
        first = c.get(key, default=first_dense) if key else first_dense
        return list(range(min(first, c.num_layers()), c.num_layers()))

    return layers


def noise_keys(*keys: str):
    """The training-time noise settings among ``keys`` that are on."""
    return lambda c: {k: c.config[k] for k in keys if c.config.get(k)}


def from_key(key: str, default: int):
    """Every layer from ``config[key]`` (default ``default``) on."""
    return lambda c: list(range(min(c.get(key, default=default), c.num_layers()), c.num_layers()))


def sigmoid_bias(E: tuple, F: tuple, *, renorm, eps: float, scaling: tuple | None = None, bias=True):
    """A sigmoid router with a selection-only bias (``bias``: a bool, or a (key, default) pair turning it on),
    renormalised (a bool, or a (key, default) pair) with ``eps``, times the scaling at ``scaling`` (a (key, default)
    pair)."""

    def fields(c: Cfg) -> dict:
        on = renorm if isinstance(renorm, bool) else c.get(renorm[0], default=renorm[1], kind=bool)
        biased = bias if isinstance(bias, bool) else c.get(bias[0], default=bias[1], kind=bool)
        scale = 1.0 if scaling is None else float(c.get(scaling[0], default=scaling[1], kind=float))
        router = RouterConfig(
            scoring="sigmoid", score_bias=biased, renormalize=on, renorm_eps=eps if on else 0.0, scaling=scale
        )
        return dict(experts=c.get(*E), top_k=c.get("num_experts_per_tok"), ffn=c.get(*F), router=router)

    return fields


def shared_one(key: str, default: int, gated: bool = False):
    """One shared expert of width ``config[key]`` (None when 0)."""

    def shared(c: Cfg):
        fs = c.get(key, default=default)
        return SharedConfig(count=1, ffn=fs, gated=gated) if fs else None

    return shared


def clamped(shared: bool):
    """A DeepSeek-V3 block whose routed experts (and shared ones when ``shared``) clamp at ``swiglu_limit``
    (Hunyuan-V4, GLM-5-Next)."""

    def fields(c: Cfg, **kw) -> dict:
        out = deepseek(c, **kw)
        limit = float(c.get("swiglu_limit", default=10.0, kind=float))
        out["expert"] = ExpertConfig(activation="swiglu_clamp", limit=limit)
        if shared and out["shared"] is not None:
            out["shared"] = dataclasses.replace(out["shared"], limit=limit)
        return out

    return fields


def clamp_refuse(c: Cfg) -> str | None:
    limit = c.config.get("swiglu_limit", 10.0)
    if isinstance(limit, int | float) and not isinstance(limit, bool) and limit <= 0:
        return f"swiglu_limit={limit}: transformers clamps at it (a limit <= 0 zeroes the gate); it must be > 0"
    return swiglu_only(c)


def no_mlp_bias(c: Cfg) -> str | None:
    if c.config.get("mlp_bias"):
        return "mlp_bias=true: the shared experts have biases, which the layer's shared experts lack"
    return swiglu_only(c)


def required_layer_types(c: Cfg) -> list[int]:
    if c.config.get("mlp_layer_types") is None:
        raise ValueError("moe_from_hf: config.json lacks 'mlp_layer_types' (transformers requires it for this family)")
    return layer_types(0)(c)
