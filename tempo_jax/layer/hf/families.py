"""The MoE families: each one's config.json → `MoEConfig`, which decoder layers are MoE, and where the block's
tensors sit (`Family.names`, read by `tempo_jax.layer.hf.tensors`). Every entry was read from that family's
configuration and modeling files in transformers 5.24 (the config class's ``attribute_map`` and defaults, the
router and expert code line by line) and is tested against transformers' own block (`tests/test_hf_import.py`).

Each family's router, experts and shared experts, its measured error against transformers and what is refused
with which reason are listed in docs/hf.md; each `Family.refuse` says which options of a family the layer does
not express, and why.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Mapping

import jax.numpy as jnp

from ..config import MoEConfig
from ..experts import ExpertConfig, SharedConfig
from ..routing import RouterConfig
from .refused import REFUSED

__all__ = ["FAMILIES", "Family", "TrainingNoiseWarning", "TensorNames", "family", "moe_config_from_hf", "moe_layer_ids"]

#: Largest ``num_hidden_layers`` a config may declare (a typo of 1e9 would otherwise build a billion-entry list).
MAX_LAYERS = 100_000


@dataclasses.dataclass(frozen=True)
class TensorNames:
    """Where one family's MoE-block tensors sit, relative to the block (see `tempo_jax.layer.hf.tensors`).

    Attributes:
      router: the router weight ``[E, H]`` (on-disk name first, then the in-memory one).
      router_bias: the learned router bias ``[E]`` (gpt-oss).
      score_bias: the selection-only score bias (``[E]`` or ``[1, E]``).
      experts: the per-expert names of gate / up / down under ``experts.{e}.`` (torch Linear ``[out, in]``).
      fused: the fused layout's kind: "gate_up" (``experts.gate_up_proj [E, 2F, H]`` gate rows first, or
        ``[E, H, 2F]`` gate columns first when ``transposed``), "interleaved" (gpt-oss: gate / up alternate),
        "input_linear" (Granite), "dbrx" (``experts.mlp.w1 / v1 / w2 [E·F, H]``, w2 the down weight transposed).
      transposed: the fused experts are stored ``[E, H, 2F]`` / ``[E, F, H]`` (decided by shape when both occur).
      hub_fused: transformers saves the "gate_up" experts fused (no per-expert conversion for the family), so the
        export writes them so. fused_names: the hub names of the fused gate_up / down tensors (Aria:
        ``experts.fc1.weight`` / ``experts.fc2.weight``); the in-memory names are read too.
      shared: the shared experts' prefixes (``shared_experts.``, …), gate / up / down names, and the per-token
        shared gate ``[1, H]``; ``shared_fused``: gate and up in one ``input_linear [2Fs, H]`` (Granite).
      router_scale: the router input's learned scale ``[H]`` (Gemma 4's ``router.scale``).
      expert_scale: the learned per-expert weight scale ``[E]`` (Gemma 4's ``router.per_expert_scale``).
    """

    router: tuple[str, ...] = ("gate.weight",)
    router_bias: str | None = None
    router_scale: str | None = None
    expert_scale: str | None = None
    score_bias: tuple[str, ...] = ("gate.e_score_correction_bias",)
    experts: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")
    fused: str = "gate_up"
    transposed: bool | None = False
    hub_fused: bool = False
    fused_names: tuple[str, str] = ("experts.gate_up_proj", "experts.down_proj")
    shared: tuple[str, ...] = ("shared_experts.",)
    shared_names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")
    shared_fused: bool = False
    shared_gate: str = "shared_expert_gate.weight"


@dataclasses.dataclass(frozen=True)
class Family:
    """One model family: ``fields(c)`` → the `MoEConfig` fields (``c`` a `Cfg`), ``layers(c)`` → its MoE decoder
    layers, ``prefixes`` the block's on-disk prefixes (``{}`` the layer index; the first that holds tensors wins),
    ``siblings`` further prefixes of the same MoE unit (Granite's shared MLP), ``names`` its tensors,
    ``refuse(c)`` → why a config cannot be expressed (None: it can), ``noise(c)`` → its training-time noise
    settings that are on (``{key: value}``: the layer computes the eval-mode block, and says so), ``parts`` the
    sub-prefixes under the prefix that belong to the block when it sits directly in the decoder layer beside
    attention and norms (Gemma 4: ``router.``, ``experts.``; empty: everything under the prefix), ``nested`` where
    its MoE keys sit in config.json (a dotted path, or several tried in order; "" the top level), ``twin`` the family
    whose transformers fixture tests the same block under another config layout (`tests/test_hf_coverage.py`)."""

    fields: Callable
    layers: Callable
    prefixes: tuple[str, ...] = ("model.layers.{}.mlp.",)
    siblings: tuple[tuple[str, str], ...] = ()
    names: TensorNames = TensorNames()
    refuse: Callable = lambda c: None  # noqa: E731
    nested: str | tuple[str, ...] | None = None
    twin: str | None = None
    noise: Callable = lambda c: {}  # noqa: E731
    parts: tuple[str, ...] = ()

    def owns(self, key: str) -> bool:
        """Whether ``key`` (relative to the block's prefix) is one of the block's tensors."""
        return not self.parts or key.startswith(self.parts)


class TrainingNoiseWarning(UserWarning):
    """A checkpoint's config turns on training-time noise (router or input jitter) that transformers applies only in
    training mode; the layer computes the eval-mode block, in training too."""


class Cfg:
    """A config.json dict read the way its configuration class reads it: any of a key's spellings (the class's
    ``attribute_map``), its default when absent, the type checked (``where`` names the family in errors)."""

    def __init__(self, config: Mapping, where: str):
        self.config, self.where = config, where

    def get(self, *keys: str, default=..., kind=int):
        for k in keys:
            if k in self.config and self.config[k] is not None:
                return self._typed(k, self.config[k], kind)
        if default is ...:
            raise ValueError(
                f"moe_from_hf: config.json of {self.where!r} lacks {keys[0]!r}"
                + (f" (or {', '.join(map(repr, keys[1:]))})" if len(keys) > 1 else "")
            )
        return default

    def _typed(self, key: str, v, kind):
        if kind is int and (isinstance(v, bool) or not isinstance(v, int)):
            raise ValueError(f"moe_from_hf: config[{key!r}] must be an integer, got {v!r}")
        if kind is float and (isinstance(v, bool) or not isinstance(v, int | float)):
            raise ValueError(f"moe_from_hf: config[{key!r}] must be a number, got {v!r}")
        if kind is bool and not isinstance(v, bool):
            raise ValueError(f"moe_from_hf: config[{key!r}] must be true or false, got {v!r}")
        if kind is list and (
            not isinstance(v, list | tuple) or not all(isinstance(i, int) and not isinstance(i, bool) for i in v)
        ):
            raise ValueError(f"moe_from_hf: config[{key!r}] must be a list of integer layer ids, got {v!r}")
        if kind is int and key.startswith(("num_hidden_layers", "n_layers")) and not 1 <= v <= MAX_LAYERS:
            raise ValueError(f"moe_from_hf: config[{key!r}] = {v} layers; it must lie in [1, {MAX_LAYERS:,}]")
        return v

    def num_layers(self) -> int:
        L = self.get("num_hidden_layers", "n_layers")
        if isinstance(L, int) and not 1 <= L <= MAX_LAYERS:
            raise ValueError(f"moe_from_hf: num_hidden_layers = {L}; it must lie in [1, {MAX_LAYERS:,}]")
        return L

    def positive(self, *keys: str, default=...) -> int:
        v = self.get(*keys, default=default)
        if v < 1:
            raise ValueError(f"moe_from_hf: config[{keys[0]!r}] must be >= 1, got {v}")
        return v


# ----------------------------------------------------------------------------------------------- the families
def _swiglu_only(c: Cfg) -> str | None:
    act = c.config.get("hidden_act", "silu")
    return None if act == "silu" else f"hidden_act {act!r}: the layer's experts are SwiGLU (silu) only"


def _qwen_layers(c: Cfg) -> list[int]:
    step = c.positive("decoder_sparse_step", default=1)
    only = set(c.get("mlp_only_layers", default=[], kind=list))
    return [i for i in range(c.num_layers()) if i not in only and (i + 1) % step == 0]


def _from(first_dense_default: int):
    return lambda c: list(
        range(min(c.get("first_k_dense_replace", default=first_dense_default), c.num_layers()), c.num_layers())
    )


def _all_layers(c: Cfg) -> list[int]:
    return list(range(c.num_layers()))


def _softmax(renorm: bool, **kw) -> RouterConfig:
    return RouterConfig(scoring="softmax", renormalize=renorm, **kw)


def _simple(E: tuple, F: tuple, renorm, shared=None, **router_kw):
    """A softmax family: E / F keys, renormalisation (a bool, or a (key, default) pair read from the config)."""

    def fields(c: Cfg) -> dict:
        on = renorm if isinstance(renorm, bool) else c.get(renorm[0], default=renorm[1], kind=bool)
        return dict(
            experts=c.get(*E),
            top_k=c.get("num_experts_per_tok"),
            ffn=c.get(*F),
            router=_softmax(on, **router_kw),
            shared=shared(c) if shared else None,
        )

    return fields


def _qwen_shared(default: int):
    def shared(c: Cfg):
        fs = c.get("shared_expert_intermediate_size", default=default)
        return SharedConfig(count=1, ffn=fs, gated=True) if fs else None

    return shared


def _deepseek(
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


def _layer_types(first_dense: int, *, key: str | None = "first_k_dense_replace", dense: str = "dense"):
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


def _v4(c: Cfg) -> dict:
    F = c.get("moe_intermediate_size", "intermediate_size")
    limit = float(c.get("swiglu_limit", default=10.0, kind=float))
    router = RouterConfig(
        scoring="sqrt_softplus",
        score_bias=True,
        renormalize=True,
        renorm_eps=1e-20,
        scaling=float(c.get("routed_scaling_factor", default=1.5, kind=float)),
    )
    return dict(
        experts=c.get("n_routed_experts", "num_local_experts"),
        top_k=c.get("num_experts_per_tok"),
        ffn=F,
        router=router,
        expert=ExpertConfig(activation="swiglu_clamp", limit=limit),
        shared=SharedConfig(count=1, ffn=F, limit=limit),
    )


def _v4_layers(c: Cfg) -> list[int]:
    types = c.get("mlp_layer_types", default=None, kind=None)
    if types is None:
        hashed = min(c.get("num_hash_layers", default=3), c.num_layers())
        return list(range(hashed, c.num_layers()))
    return [i for i, t in enumerate(types) if t == "moe"]


def _v4_refuse(c: Cfg) -> str | None:
    scoring = c.config.get("scoring_func", "sqrtsoftplus")
    if scoring != "sqrtsoftplus":
        return f"deepseek_v4 scoring_func {scoring!r}: only 'sqrtsoftplus' is known"
    if c.config.get("expert_dtype") == "fp4":
        return "deepseek_v4 expert_dtype 'fp4' (FP4 experts with per-row UE8M0 scales) is not read; dequantize them"
    return _swiglu_only(c)


def _gpt_oss(c: Cfg) -> dict:
    expert = ExpertConfig(
        activation="gpt_oss",
        bias=True,
        alpha=float(c.get("swiglu_alpha", default=1.702, kind=float)),
        limit=float(c.get("swiglu_limit", default=7.0, kind=float)),
    )
    return dict(
        experts=c.get("num_local_experts", "num_experts"),
        top_k=c.get("num_experts_per_tok", "experts_per_token"),
        ffn=c.get("intermediate_size"),
        router=RouterConfig(scoring="softmax_topk", bias=True, renormalize=False),
        expert=expert,
    )


def _dbrx(c: Cfg) -> dict:
    f = Cfg(c.config.get("ffn_config") or {}, "dbrx ffn_config")
    p = f.config.get("moe_normalize_expert_weights", 1.0)
    return dict(
        hidden=c.get("d_model", "hidden_size"),
        experts=f.get("moe_num_experts", default=4),
        top_k=f.get("moe_top_k", default=1),
        ffn=f.get("ffn_hidden_size", default=3584),
        router=_softmax(p is not None),
    )


def _dbrx_refuse(c: Cfg) -> str | None:
    f = c.config.get("ffn_config") or {}
    p = f.get("moe_normalize_expert_weights", 1.0)
    if p is not None and p != 1:
        return f"dbrx moe_normalize_expert_weights={p}: an L{p} renormalisation (the layer divides by the sum, p = 1)"
    act = (f.get("ffn_act_fn") or {}).get("name", "silu")
    return None if act == "silu" else f"dbrx ffn_act_fn {act!r}: the layer's experts are SwiGLU (silu) only"


def _jamba_layers(c: Cfg) -> list[int]:
    period, offset = c.positive("expert_layer_period", default=2), c.get("expert_layer_offset", default=1)
    if c.get("num_experts", "num_local_experts", default=16) <= 1:
        return []
    return [i for i in range(c.num_layers()) if i % period == offset]


def _v2(c: Cfg) -> dict:
    F = c.get("moe_intermediate_size")
    method = c.config.get("topk_method", "greedy")
    n_group, topk_group = (c.get("n_group"), c.get("topk_group")) if method == "group_limited_greedy" else (1, 1)
    n_shared = c.get("n_shared_experts", default=2)
    router = RouterConfig(
        scoring="softmax",
        renormalize=False,
        n_group=n_group,
        topk_group=topk_group,
        group_score="max" if n_group > 1 else "top2",  # a group scores its best expert (unused without groups)
        scaling=float(c.get("routed_scaling_factor", default=1.0, kind=float)),
    )
    return dict(
        experts=c.get("n_routed_experts", "num_experts"),
        top_k=c.get("num_experts_per_tok"),
        ffn=F,
        router=router,
        shared=SharedConfig(count=n_shared, ffn=F) if n_shared else None,
    )


def _v2_refuse(c: Cfg) -> str | None:
    method = c.config.get("topk_method", "greedy")
    if method not in ("greedy", "group_limited_greedy"):
        return f"deepseek_v2 topk_method {method!r}: transformers implements only greedy and group_limited_greedy"
    if c.config.get("mlp_bias"):
        return "deepseek_v2 mlp_bias=true: the shared experts have biases, which the layer's shared experts lack"
    return _swiglu_only(c)


def _ernie(c: Cfg) -> dict:
    F = c.get("moe_intermediate_size")
    n_shared = c.get("moe_num_shared_experts", default=2)
    return dict(
        experts=c.get("moe_num_experts", "num_experts"),
        top_k=c.get("moe_k", "num_experts_per_tok"),
        ffn=F,
        router=_softmax(True, score_bias=True),
        shared=SharedConfig(count=n_shared, ffn=F) if n_shared else None,
    )


def _ernie_layers(c: Cfg) -> list[int]:
    L = c.num_layers()
    start, end = c.get("moe_layer_start_index", default=1), c.get("moe_layer_end_index", default=-1)
    end = L - 1 if end == -1 else end
    step = c.positive("moe_layer_interval", default=1)
    return [i for i in range(L) if (i + 1) % step == 0 and start <= i <= end]


def _hunyuan(c: Cfg) -> dict:
    F = c.get("intermediate_size")
    k = c.config.get("moe_topk", c.config.get("num_experts_per_tok", 1))
    return dict(
        experts=c.get("num_experts", "num_local_experts"),
        top_k=k,
        ffn=F,
        router=_softmax(True),
        shared=SharedConfig(count=1, ffn=F),
    )


def _granite(shared: bool, shared_default: int = 0):
    def fields(c: Cfg) -> dict:
        fs = c.get("shared_intermediate_size", default=shared_default) if shared else 0
        return dict(
            experts=c.get("num_local_experts"),
            top_k=c.get("num_experts_per_tok"),
            ffn=c.get("intermediate_size"),
            router=RouterConfig(scoring="softmax_topk", renormalize=False),
            shared=SharedConfig(count=1, ffn=fs) if fs else None,
        )

    return fields


def _llama4(c: Cfg) -> dict:
    F = c.get("intermediate_size")
    return dict(
        experts=c.get("num_local_experts"),
        top_k=c.get("num_experts_per_tok", default=1),
        ffn=F,
        router=RouterConfig(scoring="sigmoid", renormalize=False, weight_on="input"),
        shared=SharedConfig(count=1, ffn=F),
    )


def _llama4_layers(c: Cfg) -> list[int]:
    layers = c.get("moe_layers", default=None, kind=list)
    if layers is None:
        step = c.positive("interleave_moe_layer_step", default=1)
        layers = list(range(step - 1, c.num_layers(), step))
    return [i for i in layers if i < c.num_layers()]


def _noise(*keys: str):
    """The training-time noise settings among ``keys`` that are on."""
    return lambda c: {k: c.config[k] for k in keys if c.config.get(k)}


def _phimoe(c: Cfg) -> dict:
    eps = float(c.get("router_jitter_noise", default=0.01, kind=float))
    return dict(
        experts=c.get("num_local_experts", "num_experts"),
        top_k=c.get("num_experts_per_tok"),
        ffn=c.get("intermediate_size"),
        router=RouterConfig(scoring="sparsemixer", renormalize=False, mixer_eps=eps),
    )


def _afmoe(c: Cfg) -> dict:
    F = c.get("moe_intermediate_size")
    count = c.get("num_shared_experts", default=2)
    router = RouterConfig(
        scoring="sigmoid",
        score_bias=True,
        renormalize=True,
        renorm_eps=1e-20,
        scaling=float(c.get("route_scale", default=1.0, kind=float)),
    )
    return dict(
        experts=c.get("num_experts"),
        top_k=c.get("num_experts_per_tok"),
        ffn=F,
        router=router,
        shared=SharedConfig(count=count, ffn=F) if count else None,
    )


def _from_key(key: str, default: int):
    """Every layer from ``config[key]`` (default ``default``) on."""
    return lambda c: list(range(min(c.get(key, default=default), c.num_layers()), c.num_layers()))


def _sigmoid_bias(E: tuple, F: tuple, *, renorm, eps: float, scaling: tuple | None = None, bias=True):
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


def _mistral4(always_renorm: bool):
    """Mistral 4 / Large 4: DeepSeek-V3's block with softmax scores and no selection bias (groups by the sum of
    their two best, renormalised + 1e-20, scaled), n_shared × F shared experts."""

    def fields(c: Cfg) -> dict:
        F = c.get("moe_intermediate_size")
        on = True if always_renorm else c.get("norm_topk_prob", default=True, kind=bool)
        count = c.get("n_shared_experts", default=1)
        n_group = c.get("n_group", default=1)
        router = RouterConfig(
            scoring="softmax",
            n_group=n_group,
            topk_group=c.get("topk_group", default=1) if n_group > 1 else 1,
            renormalize=on,
            renorm_eps=1e-20 if on else 0.0,
            scaling=float(c.get("routed_scaling_factor", default=1.0, kind=float)),
        )
        return dict(
            experts=c.get("n_routed_experts", "num_local_experts", "num_experts"),
            top_k=c.get("num_experts_per_tok"),
            ffn=F,
            router=router,
            shared=SharedConfig(count=count, ffn=F) if count else None,
        )

    return fields


_COHERE_SELECT = ("softmax", "sigmoid")
_COHERE_COMBINE = ("average", "sum")


def _cohere2(c: Cfg) -> dict:
    F = c.get("intermediate_size")
    count = c.get("num_shared_experts", default=0)
    average = count and c.config.get("shared_expert_combination_strategy", "average") == "average"
    f = 0.5 if average else 1.0  # "average": (routed + shared) / 2
    if c.config.get("expert_selection_fn", "softmax") == "softmax":  # softmax over the top-k logits
        router = RouterConfig(scoring="softmax_topk", renormalize=False, scaling=f)
    else:  # sigmoid of the top-k logits (the same choice: sigmoid is monotonic)
        router = RouterConfig(
            scoring="sigmoid", renormalize=c.get("norm_topk_prob", default=True, kind=bool), scaling=f
        )
    return dict(
        experts=c.get("num_experts"),
        top_k=c.get("num_experts_per_tok"),
        ffn=F,
        router=router,
        shared=SharedConfig(count=count, ffn=F, scale=f) if count else None,
    )


def _cohere2_refuse(c: Cfg) -> str | None:
    select = c.config.get("expert_selection_fn", "softmax")
    if select not in _COHERE_SELECT:
        return f"cohere2_moe expert_selection_fn {select!r}: transformers implements only {list(_COHERE_SELECT)}"
    combine = c.config.get("shared_expert_combination_strategy", "average")
    if combine not in _COHERE_COMBINE:
        return (
            f"cohere2_moe shared_expert_combination_strategy {combine!r}: transformers implements only "
            f"{list(_COHERE_COMBINE)}"
        )
    return _swiglu_only(c)


def _shared_one(key: str, default: int, gated: bool = False):
    """One shared expert of width ``config[key]`` (None when 0)."""

    def shared(c: Cfg):
        fs = c.get(key, default=default)
        return SharedConfig(count=1, ffn=fs, gated=gated) if fs else None

    return shared


def _laguna(c: Cfg) -> dict:
    fields = _sigmoid_bias(
        ("num_experts",), ("moe_intermediate_size",), renorm=True, eps=0.0, scaling=("moe_routed_scaling_factor", 1.0)
    )(c)
    return {**fields, "shared": _shared_one("shared_expert_intermediate_size", 512)(c)}


def _laguna_refuse(c: Cfg) -> str | None:
    cap = c.config.get("moe_router_logit_softcapping") or 0
    if cap:
        return f"laguna moe_router_logit_softcapping={cap}: router logit tanh soft-capping (tanh(l / cap) · cap)"
    if c.config.get("moe_apply_router_weight_on_input"):
        return "laguna moe_apply_router_weight_on_input=true: transformers itself does not implement it"
    return _swiglu_only(c)


def _clamped(shared: bool):
    """A DeepSeek-V3 block whose routed experts (and shared ones when ``shared``) clamp at ``swiglu_limit``
    (Hunyuan-V4, GLM-5-Next)."""

    def fields(c: Cfg, **kw) -> dict:
        out = _deepseek(c, **kw)
        limit = float(c.get("swiglu_limit", default=10.0, kind=float))
        out["expert"] = ExpertConfig(activation="swiglu_clamp", limit=limit)
        if shared and out["shared"] is not None:
            out["shared"] = dataclasses.replace(out["shared"], limit=limit)
        return out

    return fields


def _clamp_refuse(c: Cfg) -> str | None:
    limit = c.config.get("swiglu_limit", 10.0)
    if isinstance(limit, int | float) and not isinstance(limit, bool) and limit <= 0:
        return f"swiglu_limit={limit}: transformers clamps at it (a limit <= 0 zeroes the gate); it must be > 0"
    return _swiglu_only(c)


def _no_mlp_bias(c: Cfg) -> str | None:
    if c.config.get("mlp_bias"):
        return "mlp_bias=true: the shared experts have biases, which the layer's shared experts lack"
    return _swiglu_only(c)


def _dots3_layers(c: Cfg) -> list[int]:
    if c.config.get("mlp_layer_types") is not None:
        return _layer_types(1)(c)
    first, freq = c.get("first_k_dense_replace", default=1), c.config.get("moe_layer_freq", 1)
    if isinstance(freq, list):
        return [i for i in range(c.num_layers()) if i >= first and i < len(freq) and freq[i]]
    if isinstance(freq, bool) or not isinstance(freq, int) or freq < 1:
        raise ValueError(f"moe_from_hf: config['moe_layer_freq'] must be a positive integer or a list, got {freq!r}")
    return [i for i in range(c.num_layers()) if i >= first and i % freq == 0]


def _required_layer_types(c: Cfg) -> list[int]:
    if c.config.get("mlp_layer_types") is None:
        raise ValueError("moe_from_hf: config.json lacks 'mlp_layer_types' (transformers requires it for this family)")
    return _layer_types(0)(c)


def _flint_layers(c: Cfg) -> list[int]:
    step = c.positive("decoder_sparse_step", default=1)
    only = c.config.get("mlp_only_layers")
    only = {0, 1} if only is None else set(c.get("mlp_only_layers", kind=list))
    return [i for i in range(c.num_layers()) if i not in only and (i + 1) % step == 0]


def _flint(c: Cfg) -> dict:
    fields = _sigmoid_bias(
        ("num_experts",), ("moe_intermediate_size",), renorm=("norm_topk_prob", True), eps=0.0, bias=False
    )
    return {**fields(c), "shared": _shared_one("shared_expert_intermediate_size", 1024)(c)}


def _granite_hybrid_layers(c: Cfg) -> list[int]:
    return _all_layers(c) if c.get("num_local_experts", default=8) > 0 else []


def _axk2_refuse(c: Cfg) -> str | None:
    if c.config.get("n_group") not in (None, 1):
        return (
            f"axk2 n_group={c.config['n_group']}: transformers fills the dropped groups' scores with 0.0 (not -inf), "
            "so a dropped expert can outrank a kept one whose biased score is negative"
        )
    return _swiglu_only(c)


def _beam_refuse(c: Cfg) -> str | None:
    if "n_group" in c.config and c.config["n_group"] is None:
        return "beam n_group=null: transformers' router cannot run without groups"
    return _swiglu_only(c)


def _aria(c: Cfg) -> dict:
    F = c.get("intermediate_size")
    count = c.get("moe_num_shared_experts", default=2)
    return dict(
        experts=c.get("moe_num_experts"),
        top_k=c.get("moe_topk"),
        ffn=F,
        router=RouterConfig(scoring="softmax_topk", renormalize=False),
        shared=SharedConfig(count=count, ffn=F) if count else None,
    )


def _aria_refuse(c: Cfg) -> str | None:
    if c.config.get("mlp_bias"):
        return "aria mlp_bias=true: the shared experts have biases, which the layer's shared experts lack"
    return _swiglu_only(c)


def _privacy_filter(c: Cfg) -> dict:
    return {**_gpt_oss(c), "experts": c.get("num_local_experts", "num_experts")}


#: hidden_act → the layer's gated expert activation.
_GLU = {"silu": "swiglu", "gelu_pytorch_tanh": "geglu_tanh", "gelu": "geglu"}


def _gemma4(c: Cfg) -> dict:
    H = c.get("hidden_size")
    router = RouterConfig(
        scoring="softmax",
        renormalize=True,
        input_norm=True,
        norm_eps=float(c.get("rms_norm_eps", default=1e-6, kind=float)),
        input_scale=True,
        input_multiplier=H**-0.5,
        expert_scale=True,
    )
    return dict(
        experts=c.get("num_experts"),
        top_k=c.get("top_k_experts"),
        ffn=c.get("moe_intermediate_size"),
        router=router,
        expert=ExpertConfig(activation=_GLU[c.config.get("hidden_activation", "gelu_pytorch_tanh")]),
    )


def _gemma4_refuse(c: Cfg) -> str | None:
    act = c.config.get("hidden_activation", "gelu_pytorch_tanh")
    if act not in _GLU:
        return f"hidden_activation {act!r}: the layer's gated experts use one of {sorted(_GLU)}"
    return None


_MIXTRAL_NAMES = TensorNames(experts=("w1", "w3", "w2"))
_MIXTRAL_PREFIXES = ("model.layers.{}.block_sparse_moe.", "model.layers.{}.mlp.")
_DS = dict(refuse=_swiglu_only)

FAMILIES: dict[str, Family] = {
    "mixtral": Family(
        _simple(("num_local_experts", "num_experts"), ("intermediate_size",), True),
        _all_layers,
        _MIXTRAL_PREFIXES,
        names=_MIXTRAL_NAMES,
        noise=_noise("router_jitter_noise"),
        **_DS,
    ),
    "minimax": Family(
        _simple(("num_local_experts", "num_experts"), ("intermediate_size",), True),
        _all_layers,
        _MIXTRAL_PREFIXES,
        names=_MIXTRAL_NAMES,
        noise=_noise("router_jitter_noise"),
        **_DS,
    ),
    "phimoe": Family(
        _phimoe,
        _all_layers,
        _MIXTRAL_PREFIXES,
        noise=_noise("input_jitter_noise"),
        **_DS,
        names=TensorNames(router=("gate.weight", "router.weight"), experts=("w1", "w3", "w2")),
    ),
    "qwen2_moe": Family(
        _simple(
            ("num_experts", "num_local_experts"),
            ("moe_intermediate_size",),
            ("norm_topk_prob", False),
            shared=_qwen_shared(5632),
        ),
        _qwen_layers,
        names=TensorNames(shared=("shared_expert.",)),
        **_DS,
    ),
    "qwen3_moe": Family(
        _simple(("num_local_experts", "num_experts"), ("moe_intermediate_size",), ("norm_topk_prob", False)),
        _qwen_layers,
        **_DS,
    ),
    "qwen3_next": Family(
        _simple(
            ("num_experts", "num_local_experts"),
            ("moe_intermediate_size",),
            ("norm_topk_prob", True),
            shared=_qwen_shared(512),
        ),
        _qwen_layers,
        names=TensorNames(shared=("shared_expert.",)),
        **_DS,
    ),
    "qwen3_vl_moe": Family(
        _simple(("num_local_experts", "num_experts"), ("moe_intermediate_size",), True),
        _qwen_layers,
        ("model.language_model.layers.{}.mlp.", "model.layers.{}.mlp."),
        names=TensorNames(transposed=None, hub_fused=True),
        nested="text_config",
        **_DS,
    ),
    "olmoe": Family(
        _simple(("num_experts", "num_local_experts"), ("intermediate_size",), ("norm_topk_prob", False)),
        _all_layers,
        **_DS,
    ),
    "deepseek_v3": Family(lambda c: _deepseek(c, scaling=2.5, groups=(8, 4)), _from(3), **_DS),
    "glm4_moe": Family(lambda c: _deepseek(c, scaling=1.0, groups=(1, 1)), _from(1), **_DS),
    "glm_moe_dsa": Family(lambda c: _deepseek(c, scaling=2.5, groups=(1, 1)), _layer_types(3, key=None), **_DS),
    "dots1": Family(lambda c: _deepseek(c, scaling=1.0, groups=(1, 1), renorm_default=False), _from(0), **_DS),
    "deepseek_v4": Family(
        _v4,
        _v4_layers,
        ("model.layers.{}.ffn.", "model.layers.{}.mlp."),
        names=TensorNames(
            experts=("w1", "w3", "w2"),
            score_bias=("gate.bias", "gate.e_score_correction_bias"),
            shared_names=("w1", "w3", "w2"),
        ),
        refuse=_v4_refuse,
    ),
    "gpt_oss": Family(
        _gpt_oss,
        _all_layers,
        names=TensorNames(router=("router.weight",), router_bias="router.bias", fused="interleaved", transposed=True),
    ),
    "dbrx": Family(
        _dbrx,
        lambda c: list(range(c.get("n_layers", "num_hidden_layers"))),
        ("transformer.blocks.{}.ffn.",),
        names=TensorNames(router=("router.layer.weight",), fused="dbrx"),
        refuse=_dbrx_refuse,
        noise=lambda c: {k: v for k, v in (c.config.get("ffn_config") or {}).items() if k == "moe_jitter_eps" and v},
    ),
    "jamba": Family(
        _simple(("num_experts", "num_local_experts"), ("intermediate_size",), False),
        _jamba_layers,
        ("model.layers.{}.feed_forward.",),
        names=TensorNames(router=("router.weight",)),
        **_DS,
    ),
    "deepseek_v2": Family(_v2, _from(0), refuse=_v2_refuse),
    "ernie4_5_moe": Family(
        _ernie,
        _ernie_layers,
        names=TensorNames(
            score_bias=("moe_statics.e_score_correction_bias", "gate.moe_statics.e_score_correction_bias")
        ),
        refuse=lambda c: (
            ("ernie4_5_moe use_bias=true: the shared experts have biases, which the layer's shared experts lack")
            if c.config.get("use_bias")
            else _swiglu_only(c)
        ),
    ),
    "hunyuan_v1_moe": Family(
        _hunyuan, _all_layers, names=TensorNames(router=("gate.wg.weight",), shared=("shared_mlp.",)), **_DS
    ),
    "granitemoe": Family(
        _granite(False),
        _all_layers,
        ("model.layers.{}.block_sparse_moe.",),
        names=TensorNames(router=("router.layer.weight", "router.weight"), fused="input_linear"),
        **_DS,
    ),
    "granitemoeshared": Family(
        _granite(True),
        _all_layers,
        ("model.layers.{}.block_sparse_moe.",),
        siblings=(("model.layers.{}.shared_mlp.", "shared_mlp."),),
        names=TensorNames(
            router=("router.layer.weight", "router.weight"),
            fused="input_linear",
            shared=("shared_mlp.",),
            shared_fused=True,
        ),
        **_DS,
    ),
    "llama4": Family(
        _llama4,
        _llama4_layers,
        ("language_model.model.layers.{}.feed_forward.", "model.layers.{}.feed_forward."),
        names=TensorNames(router=("router.weight",), transposed=True, hub_fused=True, shared=("shared_expert.",)),
        nested="text_config",
        **_DS,
    ),
}
FAMILIES["llama4_text"] = dataclasses.replace(FAMILIES["llama4"], nested=None)
FAMILIES["gemma4"] = Family(
    _gemma4,
    lambda c: list(range(c.num_layers())) if c.get("enable_moe_block", default=False, kind=bool) else [],
    ("model.language_model.layers.{}.", "model.layers.{}."),
    names=TensorNames(
        router=("router.proj.weight",),
        router_scale="router.scale",
        expert_scale="router.per_expert_scale",
        hub_fused=True,
    ),
    refuse=_gemma4_refuse,
    nested="text_config",
    parts=("router.", "experts."),
)
FAMILIES["gemma4_text"] = dataclasses.replace(FAMILIES["gemma4"], nested=None, prefixes=("model.layers.{}.",))
_ML4 = TensorNames(experts=("w1", "w3", "w2"), shared_names=("w1", "w3", "w2"))
FAMILIES.update(
    {
        "qwen3_5_moe": Family(
            _simple(("num_experts",), ("moe_intermediate_size",), True, shared=_qwen_shared(512)),
            _all_layers,
            ("model.language_model.layers.{}.mlp.", "model.layers.{}.mlp."),
            names=TensorNames(shared=("shared_expert.",)),
            nested="text_config",
            **_DS,
        ),
        "deepseek_v32": Family(lambda c: _deepseek(c, scaling=2.5, groups=(8, 4)), _layer_types(3), **_DS),
        "glm4_moe_lite": Family(lambda c: _deepseek(c, scaling=1.8, groups=(1, 1)), _layer_types(1, key=None), **_DS),
        "kimi_linear": Family(
            lambda c: _deepseek(
                c,
                scaling=2.446,
                groups=(1, 1),
                experts=("num_experts", "num_local_experts"),
                top_k=("num_experts_per_token", "num_experts_per_tok"),
                n_shared=("num_shared_experts", "n_shared_experts"),
                renorm=("moe_renormalize", "norm_topk_prob"),
                n_group=("num_expert_group", "n_group"),
            ),
            _layer_types(1),
            ("model.layers.{}.block_sparse_moe.", "model.layers.{}.mlp."),
            names=TensorNames(experts=("w1", "w3", "w2")),
            **_DS,
        ),
        "afmoe": Family(
            _afmoe,
            _from_key("num_dense_layers", 1),
            names=TensorNames(router=("router.gate.weight",), score_bias=("expert_bias",)),
            **_DS,
        ),
        "exaone_moe": Family(
            lambda c: _deepseek(
                c, scaling=2.5, groups=(1, 1), experts=("num_experts",), n_shared=("num_shared_experts",)
            ),
            _layer_types(1),
            names=TensorNames(score_bias=("e_score_correction_bias", "gate.e_score_correction_bias")),
            **_DS,
        ),
        "minimax_m2": Family(
            _sigmoid_bias(("num_local_experts", "num_experts"), ("intermediate_size",), renorm=True, eps=0.0),
            _all_layers,
            _MIXTRAL_PREFIXES,
            names=TensorNames(experts=("w1", "w3", "w2"), score_bias=("e_score_correction_bias",)),
            noise=_noise("router_jitter_noise"),
            **_DS,
        ),
        "lfm2_moe": Family(
            _sigmoid_bias(
                ("num_experts",),
                ("moe_intermediate_size",),
                renorm=("norm_topk_prob", True),
                eps=1e-6,
                scaling=("routed_scaling_factor", 1.0),
                bias=("use_expert_bias", True),
            ),
            _from_key("num_dense_layers", 2),
            ("model.layers.{}.feed_forward.",),
            names=TensorNames(experts=("w1", "w3", "w2"), score_bias=("expert_bias",)),
        ),
        "mistral4": Family(_mistral4(False), _from(0), names=TensorNames(hub_fused=True), **_DS),
        "mistral_large4": Family(
            _mistral4(True),
            _layer_types(1),
            ("layers.{}.", "model.language_model.layers.{}.mlp."),
            names=_ML4,
            nested="text_config",
            parts=("gate.", "experts.", "shared_experts."),
            **_DS,
        ),
        "flex_olmo": dataclasses.replace(FAMILIES["olmoe"]),
        "cohere2_moe": Family(_cohere2, _layer_types(0), refuse=_cohere2_refuse),
        "solar_open": Family(lambda c: _deepseek(c, scaling=1.0, groups=(1, 1)), _all_layers, **_DS),
        "laguna": Family(
            _laguna,
            _layer_types(1, key=None),
            names=TensorNames(
                score_bias=("experts.e_score_correction_bias", "gate.e_score_correction_bias"),
                shared=("shared_expert.", "shared_experts."),
            ),
            refuse=_laguna_refuse,
        ),
        "lara_mini": Family(
            _simple(
                ("num_experts",),
                ("moe_intermediate_size",),
                ("norm_topk_prob", True),
                shared=_shared_one("shared_expert_intermediate_size", 512),
            ),
            _all_layers,
            names=TensorNames(shared=("shared_expert.",), hub_fused=True),
            **_DS,
        ),
        "mellum": Family(
            _simple(("num_local_experts", "num_experts"), ("moe_intermediate_size",), ("norm_topk_prob", True)),
            _layer_types(0, key=None),
            **_DS,
        ),
        "unlimited_ocr": Family(
            _v2,
            _layer_types(1),
            ("model.language_model.layers.{}.mlp.", "model.layers.{}.mlp."),
            refuse=_v2_refuse,
            nested=("text_config", "language_config"),
        ),
    }
)
#: text-only configs of the families above (their config the top-level one, not nested)
for _name, _prefixes in {
    "qwen3_5_moe_text": ("model.layers.{}.mlp.", "model.language_model.layers.{}.mlp."),
    "qwen3_vl_moe_text": ("model.layers.{}.mlp.", "model.language_model.layers.{}.mlp."),
    "mistral_large4_text": ("layers.{}.", "layers.{}.mlp."),
    "unlimited_ocr_text": ("model.layers.{}.mlp.", "model.language_model.layers.{}.mlp."),
}.items():
    FAMILIES[_name] = dataclasses.replace(FAMILIES[_name.removesuffix("_text")], nested=None, prefixes=_prefixes)
_VL_PREFIXES = ("model.language_model.layers.{}.mlp.", "model.layers.{}.mlp.")
_DS_TEXT_LAYOUT = TensorNames()
FAMILIES.update(
    {
        "mimo_v2_flash": Family(
            lambda c: _deepseek(c, scaling=1.0, groups=(1, 1), n_shared=()), _layer_types(1, key=None), **_DS
        ),
        "hy_v3": Family(
            lambda c: _deepseek(
                c,
                scaling=2.826,
                groups=(1, 1),
                experts=("num_experts", "num_local_experts"),
                n_shared=("num_shared_experts",),
                renorm=(),
                scaling_key=("router_scaling_factor",),
            ),
            _layer_types(1, key=None),
            names=TensorNames(
                router=("router.gate.weight", "gate.weight"),
                score_bias=("expert_bias", "e_score_correction_bias"),
                shared=("shared_mlp.", "shared_experts."),
            ),
            refuse=_no_mlp_bias,
        ),
        "hy_v4": Family(
            lambda c: _clamped(False)(c, scaling=2.827, groups=(1, 1)),
            _layer_types(1, key=None),
            names=TensorNames(hub_fused=True, shared_names=("linear_gate", "up_proj", "down_proj")),
            refuse=_clamp_refuse,
        ),
        "glm4v_moe": Family(
            lambda c: _deepseek(c, scaling=1.0, groups=(1, 1)),
            _from(1),
            _VL_PREFIXES,
            nested="text_config",
            **_DS,
        ),
        "glm5_next": Family(
            lambda c: _clamped(True)(c, scaling=2.5, groups=(1, 1)),
            _layer_types(3, key=None),
            _VL_PREFIXES,
            nested=("text_config", ""),
            refuse=_clamp_refuse,
        ),
        "qwen4_exp": Family(
            _simple(("num_experts",), ("moe_intermediate_size",), ("norm_topk_prob", True), shared=_qwen_shared(512)),
            _all_layers,
            _VL_PREFIXES,
            names=TensorNames(shared=("shared_expert.",)),
            nested="text_config",
            **_DS,
        ),
        "bailing_hybrid": Family(
            lambda c: _deepseek(
                c,
                scaling=2.5,
                groups=(8, 4),
                experts=("num_experts", "num_local_experts"),
                top_k=("num_experts_per_token", "num_experts_per_tok"),
                n_shared=("num_shared_experts", "n_shared_experts"),
                renorm=("moe_renormalize", "norm_topk_prob"),
                n_group=("num_expert_group", "n_group"),
            ),
            _layer_types(2),
            names=TensorNames(score_bias=("gate.expert_bias", "gate.e_score_correction_bias")),
            **_DS,
        ),
        "granitemoehybrid": dataclasses.replace(
            FAMILIES["granitemoeshared"], fields=_granite(True, 1024), layers=_granite_hybrid_layers
        ),
        "granitemoe_swa": dataclasses.replace(  # no conversion mapping: its hub files hold the in-memory names
            FAMILIES["granitemoeshared"],
            names=dataclasses.replace(
                FAMILIES["granitemoeshared"].names, router=("router.weight",), fused="gate_up", hub_fused=True
            ),
        ),
        "deepseek_ocr2": Family(
            _v2,
            _required_layer_types,
            ("model.layers.{}.mlp.", "model.language_model.layers.{}.mlp."),
            refuse=_v2_refuse,
            nested="text_config",
        ),
        "dots3_note": Family(
            lambda c: _deepseek(
                c,
                scaling=1.0,
                groups=(1, 1),
                shared_ffn=("shared_experts_intermediate_size", "moe_shared_expert_intermediate_size"),
            ),
            _dots3_layers,
            ("model.layers.{}.mlp.", "model.language_model.layers.{}.mlp."),
            nested=("text_config", ""),
            **_DS,
        ),
        "beam": Family(
            lambda c: _deepseek(c, scaling=2.5, groups=(8, 4), experts=("num_experts",), n_shared=()),
            _layer_types(3, key=None),
            refuse=_beam_refuse,
        ),
        "flint": Family(_flint, _flint_layers, names=TensorNames(shared=("shared_expert.",)), **_DS),
        "axk2": Family(lambda c: _deepseek(c, scaling=2.5, groups=(1, 1)), _layer_types(1), refuse=_axk2_refuse),
        "diffusion_gemma": dataclasses.replace(
            FAMILIES["gemma4"],
            layers=_all_layers,
            prefixes=("model.decoder.layers.{}.", "model.encoder.language_model.layers.{}."),
        ),
    }
)
FAMILIES.update(
    {
        "aria_text": Family(
            _aria,
            _all_layers,
            names=TensorNames(
                router=("router.weight",),
                transposed=True,
                hub_fused=True,
                fused_names=("experts.fc1.weight", "experts.fc2.weight"),
            ),
            refuse=_aria_refuse,
        ),
        "openai_privacy_filter": Family(
            _privacy_filter,
            _all_layers,
            names=TensorNames(router=("router.weight",), router_bias="router.bias", transposed=True, hub_fused=True),
        ),
        # Qwen3-Omni-MoE: the thinker's text model is qwen3_moe's block (renormalised by default), its talker's is
        # qwen2_moe's with every layer MoE; both tested through those families' fixtures (twin)
        "qwen3_omni_moe": Family(
            _simple(("num_experts", "num_local_experts"), ("moe_intermediate_size",), ("norm_topk_prob", True)),
            _qwen_layers,
            ("thinker.model.layers.{}.mlp.", "thinker.model.language_model.layers.{}.mlp."),
            nested="thinker_config.text_config",
            twin="qwen3_moe",
            **_DS,
        ),
        "qwen3_omni_moe_talker_text": Family(
            _simple(
                ("num_experts", "num_local_experts"),
                ("moe_intermediate_size",),
                ("norm_topk_prob", False),
                shared=_qwen_shared(...),
            ),
            _all_layers,
            ("talker.model.layers.{}.mlp.", "model.layers.{}.mlp."),
            names=TensorNames(shared=("shared_expert.",)),
            twin="qwen2_moe",
            **_DS,
        ),
    }
)
FAMILIES["aria"] = dataclasses.replace(
    FAMILIES["aria_text"],
    nested="text_config",
    prefixes=("language_model.model.layers.{}.mlp.", "model.language_model.layers.{}.mlp."),
)
FAMILIES["qwen3_omni_moe_thinker"] = dataclasses.replace(
    FAMILIES["qwen3_omni_moe"],
    nested="text_config",
    prefixes=("model.layers.{}.mlp.", "model.language_model.layers.{}.mlp."),
)
FAMILIES["qwen3_omni_moe_text"] = dataclasses.replace(
    FAMILIES["qwen3_omni_moe"], nested=None, prefixes=("model.layers.{}.mlp.",)
)
#: text-only or multimodal configs of the families above: (family, its twin, where its keys sit, its prefixes)
for _name, _twin, _nested, _prefixes in (
    ("hy_v4_vl", "hy_v4", "text_config", ("model.layers.{}.mlp.", "model.language_model.layers.{}.mlp.")),
    ("hy_v4_vl_text", "hy_v4", None, ("model.layers.{}.mlp.", "model.language_model.layers.{}.mlp.")),
    ("glm4v_moe_text", "glm4v_moe", None, ("model.language_model.layers.{}.mlp.", "model.layers.{}.mlp.")),
    ("glm5_next_text", "glm5_next", None, ("model.language_model.layers.{}.mlp.", "model.layers.{}.mlp.")),
    ("qwen4_exp_text", "qwen4_exp", None, ("model.layers.{}.mlp.", "model.language_model.layers.{}.mlp.")),
    ("deepseek_ocr2_text", "deepseek_ocr2", None, ("model.layers.{}.mlp.", "model.language_model.layers.{}.mlp.")),
    ("dots3_note_text", "dots3_note", None, ("model.layers.{}.mlp.", "model.language_model.layers.{}.mlp.")),
    ("diffusion_gemma_text", "diffusion_gemma", None, ("model.decoder.layers.{}.", "model.layers.{}.")),
):
    FAMILIES[_name] = dataclasses.replace(
        FAMILIES[_twin], nested=_nested, prefixes=_prefixes, twin=_twin if _twin == "hy_v4" else None
    )


def _nested(config: Mapping, path: str):
    """The object at dotted ``path`` of ``config`` ("" is ``config`` itself: a config that may be flat), or None."""
    for key in filter(None, path.split(".")):
        config = config.get(key) if isinstance(config, Mapping) else None
    return config if isinstance(config, Mapping) else None


def family(config) -> tuple[str, Family, Cfg]:
    """``(model_type, Family, Cfg of the MoE keys)`` of a config.json dict (a ValueError naming the families when
    the layer does not express it, and why when it cannot)."""
    if not isinstance(config, Mapping):
        raise ValueError(f"moe_from_hf: config must be the model's config.json as a dict, got {type(config).__name__}")
    mt = config.get("model_type")
    if mt in REFUSED:
        raise ValueError(f"moe_from_hf: the {mt} MoE block cannot be expressed by the layer: {REFUSED[mt]}")
    if mt not in FAMILIES:
        raise ValueError(
            f"moe_from_hf: model_type {mt!r} is not a MoE family the layer expresses; one of {sorted(FAMILIES)}"
        )
    fam = FAMILIES[mt]
    inner = config
    if fam.nested is not None:
        keys = (fam.nested,) if isinstance(fam.nested, str) else fam.nested
        inner = next((v for v in (_nested(config, k) for k in keys) if v is not None), None)
        if inner is None:
            raise ValueError(f"moe_from_hf: config.json of {mt!r} lacks its {' or '.join(map(repr, keys))} object")
    return mt, fam, Cfg(inner, mt)


def moe_config_from_hf(
    config: Mapping, *, slots_per_rank: int, dtype=jnp.float32, layer: int | None = None, **overrides
) -> MoEConfig:
    """The `MoEConfig` of one MoE block of the model ``config`` (a config.json dict), see the module's table;
    ``layer``: the decoder layer, for a family whose top-k is a per-layer list (HunYuan's ``moe_topk``).

    Raises:
      ValueError: unknown ``model_type``, a missing or mistyped key, or a block the layer cannot express.
    """
    mt, fam, c = family(config)
    why = fam.refuse(c)
    if why:
        raise ValueError(f"moe_from_hf: the {mt} block cannot be expressed: {why}")
    for key, value in fam.noise(c).items():
        warnings.warn(
            f"moe_from_hf: {mt} {key}={value} is training-time noise; the layer computes the block as "
            "transformers does in eval mode (without it), in training too",
            TrainingNoiseWarning,
            stacklevel=3,
        )
    fields = {"hidden": c.get("hidden_size", "d_model"), **fam.fields(c)}
    k = fields["top_k"]
    if isinstance(k, list | tuple):
        if layer is None or not 0 <= layer < len(k):
            raise ValueError(f"moe_from_hf: {mt}'s top-k is per layer ({list(k)[:8]}…): give layer= (0 … {len(k) - 1})")
        fields["top_k"] = k[layer]
    if isinstance(fields["top_k"], bool) or not isinstance(fields["top_k"], int):
        raise ValueError(f"moe_from_hf: {mt}'s top-k must be an integer, got {fields['top_k']!r}")
    fields.update(slots_per_rank=slots_per_rank, dtype=dtype)
    try:
        return MoEConfig(**{**fields, **overrides})
    except (TypeError, ValueError) as err:
        raise ValueError(f"moe_from_hf: the {mt} block cannot be expressed: {err}") from None


def moe_layer_ids(config: Mapping) -> list[int]:
    """The decoder layers of ``config`` whose MLP is a routed MoE block (DeepSeek-V4's hash-routed layers are not
    among them: the layer cannot express routing by token id)."""
    _, fam, c = family(config)
    return fam.layers(c)
