"""Every MoE family the layer expresses (`FAMILIES`): each one's config.json → `MoEConfig` fields, which decoder
layers are MoE, and where the block's tensors sit. Every entry was read from that family's configuration and modeling
files in transformers 5.24 (the config class's ``attribute_map`` and defaults, the router and expert code line by
line) and is tested against transformers' own block (`tests/test_hf_import.py`, or through its twin's fixture:
`tests/test_hf_coverage.py`); docs/hf.md's coverage table lists them with their measured errors, and the types
refused with the mechanism they need (`tempo_jax.layer.hf.refused`). Each `Family.refuse` says which options of a
family the layer does not express, and why.
"""

from __future__ import annotations

import dataclasses

from ..experts import ExpertConfig, LatentConfig, OutputConfig, SharedConfig
from ..routing import RouterConfig
from .rules import (
    all_layers,
    clamp_refuse,
    clamped,
    deepseek,
    from_key,
    from_layer,
    layer_types,
    no_mlp_bias,
    noise_keys,
    qwen_layers,
    qwen_shared,
    required_layer_types,
    shared_one,
    sigmoid_bias,
    simple,
    softmax,
    swiglu_only,
)
from .spec import MAX_LAYERS, Cfg, Family, TensorNames

__all__ = ["FAMILIES"]


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
    return swiglu_only(c)


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
        router=softmax(p is not None),
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
    return swiglu_only(c)


def _ernie(c: Cfg) -> dict:
    F = c.get("moe_intermediate_size")
    n_shared = c.get("moe_num_shared_experts", default=2)
    return dict(
        experts=c.get("moe_num_experts", "num_experts"),
        top_k=c.get("moe_k", "num_experts_per_tok"),
        ffn=F,
        router=softmax(True, score_bias=True),
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
        router=softmax(True),
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
    return swiglu_only(c)


def _laguna(c: Cfg) -> dict:
    fields = sigmoid_bias(
        ("num_experts",), ("moe_intermediate_size",), renorm=True, eps=0.0, scaling=("moe_routed_scaling_factor", 1.0)
    )(c)
    return {**fields, "shared": shared_one("shared_expert_intermediate_size", 512)(c)}


def _laguna_refuse(c: Cfg) -> str | None:
    cap = c.config.get("moe_router_logit_softcapping") or 0
    if cap:
        return f"laguna moe_router_logit_softcapping={cap}: router logit tanh soft-capping (tanh(l / cap) · cap)"
    if c.config.get("moe_apply_router_weight_on_input"):
        return "laguna moe_apply_router_weight_on_input=true: transformers itself does not implement it"
    return swiglu_only(c)


def _dots3_layers(c: Cfg) -> list[int]:
    if c.config.get("mlp_layer_types") is not None:
        return layer_types(1)(c)
    first, freq = c.get("first_k_dense_replace", default=1), c.config.get("moe_layer_freq", 1)
    if isinstance(freq, list):
        return [i for i in range(c.num_layers()) if i >= first and i < len(freq) and freq[i]]
    if isinstance(freq, bool) or not isinstance(freq, int) or freq < 1:
        raise ValueError(f"moe_from_hf: config['moe_layer_freq'] must be a positive integer or a list, got {freq!r}")
    return [i for i in range(c.num_layers()) if i >= first and i % freq == 0]


def _flint_layers(c: Cfg) -> list[int]:
    step = c.positive("decoder_sparse_step", default=1)
    only = c.config.get("mlp_only_layers")
    only = {0, 1} if only is None else set(c.get("mlp_only_layers", kind=list))
    return [i for i in range(c.num_layers()) if i not in only and (i + 1) % step == 0]


def _flint(c: Cfg) -> dict:
    fields = sigmoid_bias(
        ("num_experts",), ("moe_intermediate_size",), renorm=("norm_topk_prob", True), eps=0.0, bias=False
    )
    return {**fields(c), "shared": shared_one("shared_expert_intermediate_size", 1024)(c)}


def _granite_hybrid_layers(c: Cfg) -> list[int]:
    return all_layers(c) if c.get("num_local_experts", default=8) > 0 else []


def _axk2_refuse(c: Cfg) -> str | None:
    if c.config.get("n_group") not in (None, 1):
        return (
            f"axk2 n_group={c.config['n_group']}: transformers fills the dropped groups' scores with 0.0 (not -inf), "
            "so a dropped expert can outrank a kept one whose biased score is negative"
        )
    return swiglu_only(c)


def _beam_refuse(c: Cfg) -> str | None:
    if "n_group" in c.config and c.config["n_group"] is None:
        return "beam n_group=null: transformers' router cannot run without groups"
    return swiglu_only(c)


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
    return swiglu_only(c)


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
_DS = dict(refuse=swiglu_only)

#: Kimi-Linear's and Bailing's config.json spell the DeepSeek-V3 keys by their configs' ``attribute_map`` targets
_MAPPED_KEYS = dict(
    experts=("num_experts", "num_local_experts"),
    top_k=("num_experts_per_token", "num_experts_per_tok"),
    n_shared=("num_shared_experts", "n_shared_experts"),
    renorm=("moe_renormalize", "norm_topk_prob"),
    n_group=("num_expert_group", "n_group"),
)
FAMILIES: dict[str, Family] = {
    "mixtral": Family(
        simple(("num_local_experts", "num_experts"), ("intermediate_size",), True),
        all_layers,
        _MIXTRAL_PREFIXES,
        names=_MIXTRAL_NAMES,
        noise=noise_keys("router_jitter_noise"),
        **_DS,
    ),
    "minimax": Family(
        simple(("num_local_experts", "num_experts"), ("intermediate_size",), True),
        all_layers,
        _MIXTRAL_PREFIXES,
        names=_MIXTRAL_NAMES,
        noise=noise_keys("router_jitter_noise"),
        **_DS,
    ),
    "phimoe": Family(
        _phimoe,
        all_layers,
        _MIXTRAL_PREFIXES,
        noise=noise_keys("input_jitter_noise"),
        **_DS,
        names=TensorNames(router=("gate.weight", "router.weight"), experts=("w1", "w3", "w2")),
    ),
    "qwen2_moe": Family(
        simple(
            ("num_experts", "num_local_experts"),
            ("moe_intermediate_size",),
            ("norm_topk_prob", False),
            shared=qwen_shared(5632),
        ),
        qwen_layers,
        names=TensorNames(shared=("shared_expert.",)),
        **_DS,
    ),
    "qwen3_moe": Family(
        simple(("num_local_experts", "num_experts"), ("moe_intermediate_size",), ("norm_topk_prob", False)),
        qwen_layers,
        **_DS,
    ),
    "qwen3_next": Family(
        simple(
            ("num_experts", "num_local_experts"),
            ("moe_intermediate_size",),
            ("norm_topk_prob", True),
            shared=qwen_shared(512),
        ),
        qwen_layers,
        names=TensorNames(shared=("shared_expert.",)),
        **_DS,
    ),
    "qwen3_vl_moe": Family(
        simple(("num_local_experts", "num_experts"), ("moe_intermediate_size",), True),
        qwen_layers,
        ("model.language_model.layers.{}.mlp.", "model.layers.{}.mlp."),
        names=TensorNames(transposed=None, hub_fused=True),
        nested="text_config",
        **_DS,
    ),
    "olmoe": Family(
        simple(("num_experts", "num_local_experts"), ("intermediate_size",), ("norm_topk_prob", False)),
        all_layers,
        **_DS,
    ),
    "deepseek_v3": Family(lambda c: deepseek(c, scaling=2.5, groups=(8, 4)), from_layer(3), **_DS),
    "glm4_moe": Family(lambda c: deepseek(c, scaling=1.0, groups=(1, 1)), from_layer(1), **_DS),
    "glm_moe_dsa": Family(lambda c: deepseek(c, scaling=2.5, groups=(1, 1)), layer_types(3, key=None), **_DS),
    "dots1": Family(lambda c: deepseek(c, scaling=1.0, groups=(1, 1), renorm_default=False), from_layer(0), **_DS),
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
        all_layers,
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
        simple(("num_experts", "num_local_experts"), ("intermediate_size",), False),
        _jamba_layers,
        ("model.layers.{}.feed_forward.",),
        names=TensorNames(router=("router.weight",)),
        **_DS,
    ),
    "deepseek_v2": Family(_v2, from_layer(0), refuse=_v2_refuse),
    "ernie4_5_moe": Family(
        _ernie,
        _ernie_layers,
        names=TensorNames(
            score_bias=("moe_statics.e_score_correction_bias", "gate.moe_statics.e_score_correction_bias")
        ),
        refuse=lambda c: (
            ("ernie4_5_moe use_bias=true: the shared experts have biases, which the layer's shared experts lack")
            if c.config.get("use_bias")
            else swiglu_only(c)
        ),
    ),
    "hunyuan_v1_moe": Family(
        _hunyuan, all_layers, names=TensorNames(router=("gate.wg.weight",), shared=("shared_mlp.",)), **_DS
    ),
    "granitemoe": Family(
        _granite(False),
        all_layers,
        ("model.layers.{}.block_sparse_moe.",),
        names=TensorNames(router=("router.layer.weight", "router.weight"), fused="input_linear"),
        **_DS,
    ),
    "granitemoeshared": Family(
        _granite(True),
        all_layers,
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
            simple(("num_experts",), ("moe_intermediate_size",), True, shared=qwen_shared(512)),
            all_layers,
            ("model.language_model.layers.{}.mlp.", "model.layers.{}.mlp."),
            names=TensorNames(shared=("shared_expert.",)),
            nested="text_config",
            **_DS,
        ),
        "deepseek_v32": Family(lambda c: deepseek(c, scaling=2.5, groups=(8, 4)), layer_types(3), **_DS),
        "glm4_moe_lite": Family(lambda c: deepseek(c, scaling=1.8, groups=(1, 1)), layer_types(1, key=None), **_DS),
        "kimi_linear": Family(
            lambda c: deepseek(
                c,
                scaling=2.446,
                groups=(1, 1),
                **_MAPPED_KEYS,
            ),
            layer_types(1),
            ("model.layers.{}.block_sparse_moe.", "model.layers.{}.mlp."),
            names=TensorNames(experts=("w1", "w3", "w2")),
            **_DS,
        ),
        "afmoe": Family(
            _afmoe,
            from_key("num_dense_layers", 1),
            names=TensorNames(router=("router.gate.weight",), score_bias=("expert_bias",)),
            **_DS,
        ),
        "exaone_moe": Family(
            lambda c: deepseek(
                c, scaling=2.5, groups=(1, 1), experts=("num_experts",), n_shared=("num_shared_experts",)
            ),
            layer_types(1),
            names=TensorNames(score_bias=("e_score_correction_bias", "gate.e_score_correction_bias")),
            **_DS,
        ),
        "minimax_m2": Family(
            sigmoid_bias(("num_local_experts", "num_experts"), ("intermediate_size",), renorm=True, eps=0.0),
            all_layers,
            _MIXTRAL_PREFIXES,
            names=TensorNames(experts=("w1", "w3", "w2"), score_bias=("e_score_correction_bias",)),
            noise=noise_keys("router_jitter_noise"),
            **_DS,
        ),
        "lfm2_moe": Family(
            sigmoid_bias(
                ("num_experts",),
                ("moe_intermediate_size",),
                renorm=("norm_topk_prob", True),
                eps=1e-6,
                scaling=("routed_scaling_factor", 1.0),
                bias=("use_expert_bias", True),
            ),
            from_key("num_dense_layers", 2),
            ("model.layers.{}.feed_forward.",),
            names=TensorNames(experts=("w1", "w3", "w2"), score_bias=("expert_bias",)),
        ),
        "mistral4": Family(_mistral4(False), from_layer(0), names=TensorNames(hub_fused=True), **_DS),
        "mistral_large4": Family(
            _mistral4(True),
            layer_types(1),
            ("layers.{}.", "model.language_model.layers.{}.mlp."),
            names=_ML4,
            nested="text_config",
            parts=("gate.", "experts.", "shared_experts."),
            **_DS,
        ),
        "flex_olmo": dataclasses.replace(FAMILIES["olmoe"]),
        "cohere2_moe": Family(_cohere2, layer_types(0), refuse=_cohere2_refuse),
        "solar_open": Family(lambda c: deepseek(c, scaling=1.0, groups=(1, 1)), all_layers, **_DS),
        "laguna": Family(
            _laguna,
            layer_types(1, key=None),
            names=TensorNames(
                score_bias=("experts.e_score_correction_bias", "gate.e_score_correction_bias"),
                shared=("shared_expert.", "shared_experts."),
            ),
            refuse=_laguna_refuse,
        ),
        "lara_mini": Family(
            simple(
                ("num_experts",),
                ("moe_intermediate_size",),
                ("norm_topk_prob", True),
                shared=shared_one("shared_expert_intermediate_size", 512),
            ),
            all_layers,
            names=TensorNames(shared=("shared_expert.",), hub_fused=True),
            **_DS,
        ),
        "mellum": Family(
            simple(("num_local_experts", "num_experts"), ("moe_intermediate_size",), ("norm_topk_prob", True)),
            layer_types(0, key=None),
            **_DS,
        ),
        "unlimited_ocr": Family(
            _v2,
            layer_types(1),
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
FAMILIES.update(
    {
        "mimo_v2_flash": Family(
            lambda c: deepseek(c, scaling=1.0, groups=(1, 1), n_shared=()), layer_types(1, key=None), **_DS
        ),
        "hy_v3": Family(
            lambda c: deepseek(
                c,
                scaling=2.826,
                groups=(1, 1),
                experts=("num_experts", "num_local_experts"),
                n_shared=("num_shared_experts",),
                renorm=(),
                scaling_key=("router_scaling_factor",),
            ),
            layer_types(1, key=None),
            names=TensorNames(
                router=("router.gate.weight", "gate.weight"),
                score_bias=("expert_bias", "e_score_correction_bias"),
                shared=("shared_mlp.", "shared_experts."),
            ),
            refuse=no_mlp_bias,
        ),
        "hy_v4": Family(
            lambda c: clamped(False)(c, scaling=2.827, groups=(1, 1)),
            layer_types(1, key=None),
            names=TensorNames(hub_fused=True, shared_names=("linear_gate", "up_proj", "down_proj")),
            refuse=clamp_refuse,
        ),
        "glm4v_moe": Family(
            lambda c: deepseek(c, scaling=1.0, groups=(1, 1)),
            from_layer(1),
            _VL_PREFIXES,
            nested="text_config",
            **_DS,
        ),
        "glm5_next": Family(
            lambda c: clamped(True)(c, scaling=2.5, groups=(1, 1)),
            layer_types(3, key=None),
            _VL_PREFIXES,
            nested=("text_config", ""),
            refuse=clamp_refuse,
        ),
        "qwen4_exp": Family(
            simple(("num_experts",), ("moe_intermediate_size",), ("norm_topk_prob", True), shared=qwen_shared(512)),
            all_layers,
            _VL_PREFIXES,
            names=TensorNames(shared=("shared_expert.",)),
            nested="text_config",
            **_DS,
        ),
        "bailing_hybrid": Family(
            lambda c: deepseek(
                c,
                scaling=2.5,
                groups=(8, 4),
                **_MAPPED_KEYS,
            ),
            layer_types(2),
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
            required_layer_types,
            ("model.layers.{}.mlp.", "model.language_model.layers.{}.mlp."),
            refuse=_v2_refuse,
            nested="text_config",
        ),
        "dots3_note": Family(
            lambda c: deepseek(
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
            lambda c: deepseek(c, scaling=2.5, groups=(8, 4), experts=("num_experts",), n_shared=()),
            layer_types(3, key=None),
            refuse=_beam_refuse,
        ),
        "flint": Family(_flint, _flint_layers, names=TensorNames(shared=("shared_expert.",)), **_DS),
        "axk2": Family(lambda c: deepseek(c, scaling=2.5, groups=(1, 1)), layer_types(1), refuse=_axk2_refuse),
        "diffusion_gemma": dataclasses.replace(
            FAMILIES["gemma4"],
            layers=all_layers,
            prefixes=("model.decoder.layers.{}.", "model.encoder.language_model.layers.{}."),
        ),
    }
)
FAMILIES.update(
    {
        "aria_text": Family(
            _aria,
            all_layers,
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
            all_layers,
            names=TensorNames(router=("router.weight",), router_bias="router.bias", transposed=True, hub_fused=True),
        ),
        # Qwen3-Omni-MoE: the thinker's text model is qwen3_moe's block (renormalised by default), its talker's is
        # qwen2_moe's with every layer MoE; both tested through those families' fixtures (twin)
        "qwen3_omni_moe": Family(
            simple(("num_experts", "num_local_experts"), ("moe_intermediate_size",), ("norm_topk_prob", True)),
            qwen_layers,
            ("thinker.model.layers.{}.mlp.", "thinker.model.language_model.layers.{}.mlp."),
            nested="thinker_config.text_config",
            twin="qwen3_moe",
            **_DS,
        ),
        "qwen3_omni_moe_talker_text": Family(
            simple(
                ("num_experts", "num_local_experts"),
                ("moe_intermediate_size",),
                ("norm_topk_prob", False),
                shared=qwen_shared(...),
            ),
            all_layers,
            ("talker.model.layers.{}.mlp.", "model.layers.{}.mlp."),
            names=TensorNames(shared=("shared_expert.",)),
            twin="qwen2_moe",
            **_DS,
        ),
    }
)
FAMILIES.update(
    {
        # Sarvam's configs over transformers' GLM-4.5 / DeepSeek-V3 classes (no modeling file of their own)
        "sarvam_moe": Family(
            lambda c: deepseek(
                c,
                scaling=2.5,
                groups=(1, 1),
                n_shared=("n_shared_experts", "num_shared_experts"),
            ),
            from_layer(1),
            names=TensorNames(score_bias=("gate.expert_bias", "gate.e_score_correction_bias")),
            refuse=swiglu_only,
        ),
        "sarvam_mla": Family(
            lambda c: deepseek(c, scaling=2.5, groups=(1, 1), n_shared=("n_shared_experts", "num_shared_experts")),
            from_layer(1),
            refuse=swiglu_only,
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


def _kolibri1(c: Cfg) -> dict:
    """Kolibri-1: sigmoid weights of the raw logits, chosen on ``logits + e_score_correction_bias`` (the bias on the
    logits, not on the sigmoid scores), renormalised without an epsilon; one shared SwiGLU expert."""
    renorm = c.get("norm_topk_prob", default=False, kind=bool)
    router = RouterConfig(scoring="sigmoid", score_bias=True, bias_on="logits", renormalize=renorm)
    fs = c.get("shared_expert_intermediate_size", default=512)
    return dict(
        experts=c.get("num_experts", "num_local_experts"),
        top_k=c.get("num_experts_per_tok"),
        ffn=c.get("moe_intermediate_size"),
        router=router,
        shared=SharedConfig(count=1, ffn=fs) if fs else None,
    )


def _axk1(c: Cfg) -> dict:
    """A.X-K1: DeepSeek-V3's block, then a learned RMSNorm of its output (``post_mlp_layernorm``)."""
    eps = float(c.get("rms_norm_eps", default=1e-6, kind=float))
    return {**deepseek(c, scaling=2.5, groups=(8, 4)), "output": OutputConfig(norm=True, norm_eps=eps)}


def _jetmoe(c: Cfg) -> dict:
    """JetMoE's MLP mixture: softmax over the top-k logits, fused gate / up ``input_linear``, a learned output bias.
    (Its attention experts, the mixture of attention heads, belong to the attention, not to this block.)"""
    return dict(
        experts=c.get("num_local_experts", "num_experts"),
        top_k=c.get("num_experts_per_tok"),
        ffn=c.get("intermediate_size"),
        router=RouterConfig(scoring="softmax_topk", renormalize=False),
        output=OutputConfig(bias=True),
    )


def _act_only(key: str):
    """The refusal of a family whose activation sits at ``key`` (SwiGLU only)."""
    return lambda c: (
        None
        if c.config.get(key, "silu") == "silu"
        else (f"{key} {c.config[key]!r}: the layer's experts are SwiGLU (silu) only")
    )


FAMILIES.update(
    {
        # the hub files keep the selection bias at the decoder layer (moe.router.expert_bias)
        "kolibri1": Family(
            _kolibri1,
            all_layers,
            siblings=(("model.layers.{}.moe.router.", "moe.router."),),
            names=TensorNames(score_bias=("moe.router.expert_bias", "gate.e_score_correction_bias")),
            **_DS,
        ),
        "axk1": Family(
            _axk1,
            layer_types(1),
            siblings=(("model.layers.{}.post_mlp_layernorm.", "post_mlp_layernorm."),),
            **_DS,
        ),
        "jetmoe": Family(
            _jetmoe,
            all_layers,
            names=TensorNames(router=("router.layer.weight",), fused="input_linear"),
            refuse=_act_only("activation_function"),
        ),
    }
)


def _step_limit(c: Cfg, key: str) -> float | None:
    """Step-3.7's clamp of this layer from the per-layer list ``key`` (a 0 / null entry, or no list: no clamp)."""
    v = c.per_layer(key, "SwiGLU clamp")
    if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or v < 0):
        raise ValueError(f"moe_from_hf: config[{key!r}][{c.layer}] must be a number >= 0 (0: no clamp), got {v!r}")
    return float(v) if v else None


def _step3p7(c: Cfg) -> dict:
    """Step-3.5 / 3.7: a sigmoid router with a selection bias, renormalised, × moe_router_scaling_factor; SwiGLU
    experts and one shared expert, each clamped after the activation at its own per-layer limit (``swiglu_limits``,
    ``swiglu_limits_shared``)."""
    routed, shared = _step_limit(c, "swiglu_limits"), _step_limit(c, "swiglu_limits_shared")
    scaling = float(c.get("moe_router_scaling_factor", default=1.0, kind=float))
    return dict(
        experts=c.get("n_routed_experts", "num_local_experts", "moe_num_experts", default=288),
        top_k=c.get("num_experts_per_tok", "moe_top_k"),
        ffn=c.get("moe_intermediate_size"),
        router=RouterConfig(scoring="sigmoid", score_bias=True, renormalize=True, scaling=scaling),
        expert=ExpertConfig(activation="swiglu_post_clamp", limit=routed) if routed else ExpertConfig(),
        shared=SharedConfig(
            count=1,
            ffn=c.get("share_expert_dim", "share_expert_dims", default=1280),
            **(dict(activation="swiglu_post_clamp", limit=shared) if shared else {}),
        ),
    )


def _step3p7_layers(c: Cfg) -> list[int]:
    """``mlp_layer_types`` ("sparse"), else the legacy ``moe_layers_enum``, else every layer from the fourth on."""
    if c.config.get("mlp_layer_types") is None and c.config.get("moe_layers_enum") is not None:
        items = c.config["moe_layers_enum"]
        items = items.split(",") if isinstance(items, str) else items
        try:
            moe = {int(i) for i in items if str(i).strip()}
        except (TypeError, ValueError):
            raise ValueError(f"moe_from_hf: config['moe_layers_enum'] must list layer ids, got {items!r}") from None
        return [i for i in range(c.num_layers()) if i in moe]
    return layer_types(3, key=None)(c)


# Step's hub files keep the block at the decoder layer (moe.*, share_expert.*; the experts as three stacked
# tensors); transformers' in-memory layout (a fused save) puts it under mlp.
FAMILIES["step3p7"] = Family(
    _step3p7,
    _step3p7_layers,
    ("model.language_model.layers.{}.mlp.", "model.layers.{}.mlp.", "model.layers.{}."),
    names=TensorNames(
        router=("moe.gate.weight", "gate.weight"),
        score_bias=("moe.router_bias", "gate.e_score_correction_bias"),
        stacked_names=("moe.gate_proj.weight", "moe.up_proj.weight", "moe.down_proj.weight"),
        shared=("share_expert.", "shared_experts."),
    ),
    refuse=no_mlp_bias,
    nested="text_config",
    parts=("moe.", "share_expert.", "gate.", "experts.", "shared_experts."),
)
FAMILIES["step3p5"] = dataclasses.replace(FAMILIES["step3p7"], nested=None, twin="step3p7")


def _minimax_m3(c: Cfg) -> dict:
    """MiniMax-M3: a sigmoid router with a selection bias, renormalised, × routed_scaling_factor; routed and shared
    experts with gpt-oss's activation (gate / up not interleaved) at swiglu_limit / swiglu_alpha."""
    limit = float(c.get("swiglu_limit", default=7.0, kind=float))
    alpha = float(c.get("swiglu_alpha", default=1.702, kind=float))
    act = dict(activation="gpt_oss", limit=limit, alpha=alpha)
    scaling = float(c.get("routed_scaling_factor", default=2.0, kind=float))
    return dict(
        experts=c.get("num_local_experts", "num_experts"),
        top_k=c.get("num_experts_per_tok"),
        ffn=c.get("intermediate_size"),
        router=RouterConfig(scoring="sigmoid", score_bias=True, renormalize=True, scaling=scaling),
        expert=ExpertConfig(**act),
        shared=SharedConfig(count=1, ffn=c.get("shared_intermediate_size", default=3072), **act),
    )


def _minimax_m3_layers(c: Cfg) -> list[int]:
    """``mlp_layer_types`` ("sparse"), else the legacy ``moe_layer_freq`` flags, else every layer."""
    freq = c.config.get("moe_layer_freq")
    if c.config.get("mlp_layer_types") is None and isinstance(freq, list | tuple):
        if len(freq) != c.num_layers():
            raise ValueError(f"moe_from_hf: config['moe_layer_freq'] must list one flag per layer, got {freq!r}")
        return [i for i, f in enumerate(freq) if f]
    return layer_types(0, key=None)(c)


def _minimax_m3_refuse(c: Cfg) -> str | None:
    limit = c.config.get("swiglu_limit", 7.0)
    if isinstance(limit, int | float) and not isinstance(limit, bool) and limit <= 0:
        return f"swiglu_limit={limit}: transformers clamps at it (a limit <= 0 zeroes the gate); it must be > 0"
    return None


# the text model saves transformers' in-memory layout (fused experts, a fused shared gate_up); the multimodal model's
# hub files keep MiniMax's own names (block_sparse_moe, experts.{e}.w1 / w3 / w2)
FAMILIES["minimax_m3_vl_text"] = Family(
    _minimax_m3,
    _minimax_m3_layers,
    ("model.layers.{}.mlp.", "model.language_model.layers.{}.mlp."),
    names=TensorNames(hub_fused=True, shared_gate_up=True),
    refuse=_minimax_m3_refuse,
)
FAMILIES["minimax_m3_vl"] = Family(
    _minimax_m3,
    _minimax_m3_layers,
    ("language_model.model.layers.{}.block_sparse_moe.", "model.language_model.layers.{}.mlp."),
    names=TensorNames(
        experts=("w1", "w3", "w2"), score_bias=("e_score_correction_bias", "gate.e_score_correction_bias")
    ),
    refuse=_minimax_m3_refuse,
    nested="text_config",
)


def _inkling2(c: Cfg) -> dict:
    """Inkling 2: a sigmoid router with a selection bias, renormalised (+1e-20), × route_scale; soft-capped SwiGLU
    experts (``mlp_gate_softcap`` / ``mlp_up_softcap``), no shared experts."""
    defaults = (("gate_softcap", 4.0), ("up_softcap", 25.0))
    caps = {k: float(c.get(f"mlp_{k}", default=d, kind=float)) for k, d in defaults}
    router = RouterConfig(
        scoring="sigmoid",
        score_bias=True,
        renormalize=True,
        renorm_eps=1e-20,
        scaling=float(c.get("route_scale", "routed_scaling_factor", default=8.0, kind=float)),
    )
    return dict(
        experts=c.get("n_routed_experts", "num_local_experts"),
        top_k=c.get("num_experts_per_tok"),
        ffn=c.get("moe_intermediate_size", "intermediate_size"),
        router=router,
        expert=ExpertConfig(activation="swiglu_softcap", gate_cap=caps["gate_softcap"], up_cap=caps["up_softcap"]),
    )


def _inkling2_refuse(c: Cfg) -> str | None:
    scoring = c.config.get("scoring_func", "sigmoid")
    if scoring != "sigmoid":
        return f"scoring_func {scoring!r}: the layer reads Inkling 2's router as sigmoid scores"
    for key in ("mlp_gate_softcap", "mlp_up_softcap"):
        v = c.config.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or v <= 0):
            return f"{key}={v!r}: a soft cap c·tanh(x / c) needs c > 0"
    return None


# the hub files keep the text model under model.llm (transformers renames it on load), the experts fused as
# w13_weight [E, 2F, H] (gate and up rows alternating) / w2_weight and the selection bias as gate.bias
_INKLING2_NAMES = TensorNames(
    score_bias=("gate.bias", "gate.e_score_correction_bias"),
    hub_fused=True,
    fused_names=("experts.w13_weight", "experts.w2_weight"),
    fused_interleaved=True,
)
FAMILIES["inkling2_text"] = Family(
    _inkling2,
    all_layers,
    ("model.llm.layers.{}.mlp.", "model.layers.{}.mlp."),
    names=_INKLING2_NAMES,
    refuse=_inkling2_refuse,
)
FAMILIES["inkling2"] = dataclasses.replace(
    FAMILIES["inkling2_text"],
    prefixes=("model.llm.layers.{}.mlp.", "model.language_model.layers.{}.mlp."),
    nested="text_config",
    twin="inkling2_text",
)
# Inkling 2 Loop: the same block; its looped layers run several passes with the same weights (one MoE block per
# physical layer, which is what its files hold and what `moe_layer_ids` lists)
FAMILIES["inkling2_loop_text"] = dataclasses.replace(FAMILIES["inkling2_text"], twin="inkling2_text")
FAMILIES["inkling2_loop"] = dataclasses.replace(FAMILIES["inkling2"], twin="inkling2_text")


def _inkling(c: Cfg) -> dict:
    """Inkling: sigmoid scores; the top-k routed (chosen with the selection bias) and the n_shared_experts shared
    experts' scores (extra router rows) renormalised together, × route_scale × a learned global_scale; the shared
    experts' weights scale their hidden activations."""
    S = c.get("n_shared_experts", default=2)
    F = c.config["intermediate_size"] if "dense_intermediate_size" in c.config else c.get("moe_intermediate_size")
    if isinstance(F, bool) or not isinstance(F, int):
        raise ValueError(f"moe_from_hf: inkling's expert width must be an integer, got {F!r}")
    router = RouterConfig(
        scoring="sigmoid",
        score_bias=True,
        renormalize=True,
        scaling=float(c.get("route_scale", "routed_scaling_factor", default=8.0, kind=float)),
        shared_rows=S,
        gain=True,
    )
    return dict(
        experts=c.get("n_routed_experts", "num_local_experts"),
        top_k=c.get("num_experts_per_tok"),
        ffn=F,
        router=router,
        shared=SharedConfig(count=S, ffn=F) if S else None,
    )


def _inkling_layers(c: Cfg) -> list[int]:
    """``mlp_layer_types`` ("sparse"), else the legacy ``dense_mlp_idx`` first layers dense."""
    if c.config.get("mlp_layer_types") is None and c.config.get("dense_mlp_idx") is not None:
        return list(range(min(c.get("dense_mlp_idx"), c.num_layers()), c.num_layers()))
    return layer_types(0, key=None)(c)


def _inkling_refuse(c: Cfg) -> str | None:
    if not c.config.get("n_shared_experts", 2):
        return "n_shared_experts=0: Inkling's router normalises over its shared experts; without them it is untested"
    return swiglu_only(c)


_INKLING_NAMES = TensorNames(
    router_gain="gate.global_scale",
    hub_fused=True,
    shared_stacked=("gate_proj", "up_proj", "down_proj"),
)
FAMILIES["inkling_text"] = Family(
    _inkling, _inkling_layers, ("model.layers.{}.mlp.",), names=_INKLING_NAMES, refuse=_inkling_refuse
)
# the multimodal model's hub files: the text model under model.llm, experts and shared experts as row-interleaved
# w13 tensors, the selection bias as gate.bias (transformers renames and de-interleaves on load)
FAMILIES["inkling_mm_model"] = Family(
    _inkling,
    _inkling_layers,
    ("model.llm.layers.{}.mlp.", "model.language_model.layers.{}.mlp."),
    names=dataclasses.replace(
        _INKLING_NAMES,
        score_bias=("gate.bias", "gate.e_score_correction_bias"),
        fused_names=("experts.w13_weight", "experts.w2_weight"),
        fused_interleaved=True,
        shared_interleaved=("shared_w13_weight", "shared_w2_weight"),
    ),
    refuse=_inkling_refuse,
    nested="text_config",
)


def _longcat(c: Cfg) -> dict:
    """LongCat-Flash: softmax over the E routed and Z zero-computation (identity) experts, chosen with the selection
    bias, not renormalised, × routed_scaling_factor; SwiGLU experts."""
    return dict(
        experts=c.get("n_routed_experts", "num_local_experts"),
        zero_experts=c.get("zero_expert_num", default=0),
        top_k=c.get("moe_topk", "num_experts_per_tok"),
        ffn=c.get("expert_ffn_hidden_size", "moe_intermediate_size"),
        router=RouterConfig(
            scoring="softmax",
            score_bias=True,
            renormalize=False,
            scaling=float(c.get("routed_scaling_factor", default=6.0, kind=float)),
        ),
    )


def _longcat_layers(c: Cfg) -> list[int]:
    """Every decoder layer (``num_layers``; each holds two attention sublayers and one MoE)."""
    n = c.get("num_layers", default=None)
    if n is None:  # num_hidden_layers is its property 2 · num_layers
        n = c.num_layers() // 2
    if not 1 <= n <= MAX_LAYERS:
        raise ValueError(f"moe_from_hf: config['num_layers'] = {n}; it must lie in [1, {MAX_LAYERS:,}]")
    return list(range(n))


def _longcat_refuse(c: Cfg) -> str | None:
    if c.config.get("router_bias"):
        return (
            "router_bias=true: transformers 5.24 gives the router a bias (router.classifier.bias) that its forward "
            "never adds; refusing to guess which of the two a checkpoint means"
        )
    return swiglu_only(c)


FAMILIES["longcat_flash"] = Family(
    _longcat,
    _longcat_layers,
    names=TensorNames(
        router=("router.classifier.weight",), score_bias=("router.e_score_correction_bias",), zero_expert_rows=True
    ),
    refuse=_longcat_refuse,
)


#: transformers' activation names (ACT2FN) → the layer's plain activations
_PLAIN = {
    "relu": "relu",
    "relu2": "relu2",
    "silu": "silu",
    "swish": "silu",
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
}


def _plain_refuse(key: str, default: str):
    def refuse(c: Cfg) -> str | None:
        act = c.config.get(key, default)
        if act not in _PLAIN:
            return f"{key} {act!r}: the layer's plain experts take {sorted(_PLAIN)}"
        return None

    return refuse


def _nemotron_h(c: Cfg) -> dict:
    """Nemotron-H: DeepSeek-V3's router (sigmoid, selection bias, groups, renormalised + 1e-20, scaling); plain
    experts down(act(up(x))) (relu² by default) and one plain shared expert of its own width."""
    act = _PLAIN[c.config.get("mlp_hidden_act", "relu2")]
    fields = deepseek(c, scaling=1.0, groups=(1, 1), experts=("n_routed_experts", "num_local_experts"), n_shared=())
    fs = c.get("moe_shared_expert_intermediate_size", default=7688)
    latent = c.get("moe_latent_size", default=None)
    return {
        **fields,
        "expert": ExpertConfig(activation=act),
        "shared": SharedConfig(count=1, ffn=fs, activation=act),
        "latent": LatentConfig(width=latent) if latent else None,
    }


def _nemotron_h_layers(c: Cfg) -> list[int]:
    """The "moe" entries of ``layers_block_type`` (``layer_types``), or the "E"s of the legacy
    ``hybrid_override_pattern``."""
    types = c.config.get("layers_block_type", c.config.get("layer_types"))
    if types is None and isinstance(c.config.get("hybrid_override_pattern"), str):
        return [i for i, t in enumerate(c.config["hybrid_override_pattern"]) if t == "E"]
    if not isinstance(types, list | tuple):
        raise ValueError(f"moe_from_hf: nemotron_h's config.json lacks 'layers_block_type' (a list), got {types!r}")
    return [i for i, t in enumerate(types) if t == "moe"]


def _nemotron_h_refuse(c: Cfg) -> str | None:
    if c.config.get("mlp_bias"):
        return (
            "mlp_bias=true: the shared expert and the latent projections have biases, which the layer's shared "
            "experts and latent projections lack"
        )
    return _plain_refuse("mlp_hidden_act", "relu2")(c)


FAMILIES["nemotron_h"] = Family(
    _nemotron_h,
    _nemotron_h_layers,
    ("backbone.layers.{}.mixer.", "model.layers.{}.mixer."),
    names=TensorNames(latent=("fc1_latent_proj.weight", None, "fc2_latent_proj.weight", None)),
    refuse=_nemotron_h_refuse,
)


def _switch(c: Cfg) -> dict:
    """Switch Transformers: softmax router (with its bias when router_bias), top-1, not renormalised; plain experts
    (T5's wi / wo, ReLU by default); at most ``expert_capacity`` tokens per expert per sequence, claimed in position
    order — a token past it gets no expert (the layer's output 0, the model's residual passes it through)."""
    if c.sequence is None:
        raise ValueError(
            f"moe_from_hf: switch_transformers routes at most expert_capacity={c.config.get('expert_capacity', 64)} "
            "tokens to an expert per sequence: give sequence_length= (the tokens per sequence of your batches; the "
            "layer's tokens are such sequences one after another) to moe_config_from_hf / moe_from_hf / "
            "load_moe_layers"
        )
    router = RouterConfig(
        scoring="softmax",
        bias=c.get("router_bias", default=False, kind=bool),
        renormalize=False,
        expert_capacity=c.positive("expert_capacity", default=64),
        capacity_window=c.sequence,
    )
    return dict(
        experts=c.get("num_experts"),
        top_k=1,
        ffn=c.get("d_ff"),
        router=router,
        expert=ExpertConfig(activation=_PLAIN[c.config.get("dense_act_fn", "relu")]),
    )


def _switch_sparse(c: Cfg, layers: str, sparse: str) -> list[int]:
    """The sparse blocks of one stack: every ``num_layers // num_sparse``-th from the second (``i % step == 1``, or
    every block when the step is 1), as transformers builds them."""
    n, k = c.positive(layers, default=12), c.get(sparse, default=3)
    step = n // k if k > 0 else n
    return [i for i in range(n) if step == 1 or i % step == 1]


def _switch_layers(c: Cfg) -> list[int]:
    """The encoder's sparse blocks (ids 0 … num_layers − 1), then the decoder's (num_layers + j)."""
    n = c.positive("num_layers", default=12)
    decoder = _switch_sparse(c, "num_decoder_layers", "num_sparse_decoder_layers")
    return _switch_sparse(c, "num_layers", "num_sparse_encoder_layers") + [n + j for j in decoder]


def _switch_locate(c: Cfg, layer: int) -> tuple[str, ...]:
    n = c.positive("num_layers", default=12)
    return (f"encoder.block.{layer}.layer.1.mlp.",) if layer < n else (f"decoder.block.{layer - n}.layer.2.mlp.",)


def _float32_router(c: Cfg) -> str | None:
    """Why a ``router_dtype`` other than float32 is refused (Switch, NLLB-MoE), or None."""
    if c.config.get("router_dtype", "float32") != "float32":
        return f"router_dtype {c.config['router_dtype']!r}: the layer's router computes in float32"
    return None


def _switch_refuse(c: Cfg) -> str | None:
    return _float32_router(c) or _plain_refuse("dense_act_fn", "relu")(c)


FAMILIES["switch_transformers"] = Family(
    _switch,
    _switch_layers,
    ("encoder.block.{}.layer.1.mlp.",),
    names=TensorNames(
        router=("router.classifier.weight",),
        router_bias="router.classifier.bias",
        experts=("wi", "wi", "wo"),
        expert_key="experts.expert_{e}.{p}.weight",
    ),
    refuse=_switch_refuse,
    noise=noise_keys("router_jitter_noise"),
    locate=_switch_locate,
)


def _ernie_vl(c: Cfg) -> dict:
    """ERNIE-4.5-VL: text and vision tokens route to their own E_s experts (two sets: `RouterConfig.expert_sets`),
    softmax over the set with the selection bias, renormalised (transformers clamps the sum at moe_norm_min, which
    only a sum below 1e-12 would meet); the vision experts' width may differ (moe_intermediate_size [text, vision]:
    the layer's F is the wider, the narrower set zero-padded); shared experts n_shared × the text width."""
    widths = c.config.get("moe_intermediate_size")
    widths = [widths, widths] if isinstance(widths, int) and not isinstance(widths, bool) else widths
    if not (isinstance(widths, list | tuple) and len(widths) == 2 and all(isinstance(w, int) for w in widths)):
        raise ValueError(f"moe_from_hf: ernie's moe_intermediate_size must be [text, vision] widths, got {widths!r}")
    Es = c.get("moe_num_experts", "num_experts")
    n_shared = c.get("moe_num_shared_experts", default=2)
    router = RouterConfig(scoring="softmax", score_bias=True, renormalize=True, expert_sets=2)
    return dict(
        experts=2 * Es,
        top_k=c.get("moe_k", "num_experts_per_tok"),
        ffn=max(widths),
        router=router,
        shared=SharedConfig(count=n_shared, ffn=widths[0]) if n_shared else None,
    )


def _ernie_vl_refuse(c: Cfg) -> str | None:
    if c.config.get("use_bias"):
        return "use_bias=true: the shared experts have biases, which the layer's shared experts lack"
    return swiglu_only(c)


_ERNIE_SETS = ("text_moe.", "vision_moe.")
FAMILIES["ernie4_5_vl_moe_text"] = Family(
    _ernie_vl,
    layer_types(1, key=None),
    ("layers.{}.mlp.", "model.layers.{}.mlp."),
    names=TensorNames(expert_sets=_ERNIE_SETS, hub_fused=True),
    refuse=_ernie_vl_refuse,
)
# the multimodal model's hub files: the routers transposed (gate.weight, gate.weight_1), the selection biases
# stacked, the experts per expert (text 0 … E_s − 1, vision after them)
FAMILIES["ernie4_5_vl_moe"] = Family(
    _ernie_vl,
    layer_types(1, key=None),
    ("model.layers.{}.mlp.", "model.language_model.layers.{}.mlp."),
    names=TensorNames(
        router=("gate.weight", "gate.weight_1"),
        score_bias=("moe_statics.e_score_correction_bias",),
        expert_sets=_ERNIE_SETS,
    ),
    refuse=_ernie_vl_refuse,
    nested="text_config",
)


def _muse_spark(c: Cfg) -> dict:
    """MuSE-Spark: a sigmoid router on the token × output_multiplier (the logits scaled: the router has no bias)
    with a selection bias, renormalised (+1e-15), × routed_scaling_factor; SwiGLU experts at moe_hidden_size behind a
    projection and a (1 + w) RMSNorm, each expert's output scaled (1 + w) and RMS-normed before its weight, the sum
    projected back."""
    router = RouterConfig(
        scoring="sigmoid",
        score_bias=True,
        renormalize=True,
        renorm_eps=1e-15,
        scaling=float(c.get("routed_scaling_factor", default=1.0, kind=float)),
        input_multiplier=float(c.get("output_multiplier", default=0.1767766952966369, kind=float)),
    )
    eps = float(c.get("rms_norm_eps", default=1e-5, kind=float))
    return dict(
        experts=c.get("num_local_experts", "num_experts"),
        top_k=c.get("num_experts_per_tok"),
        ffn=c.get("moe_intermediate_size"),
        router=router,
        expert=ExpertConfig(out_norm_eps=float(c.get("post_norm_eps", default=1e-8, kind=float))),
        latent=LatentConfig(width=c.get("moe_hidden_size"), norm=True, norm_eps=eps),
    )


_MUSE = Family(
    _muse_spark,
    layer_types(0, key=None),
    ("layers.{}.mlp.", "model.layers.{}.mlp."),
    names=TensorNames(
        hub_fused=True,
        latent=(
            "pre_expert_proj.weight",
            "pre_expert_norm.weight",
            "post_expert_proj.weight",
            "experts.post_expert_norm.weight",
        ),
    ),
    **_DS,
)
FAMILIES["muse_spark_text"] = _MUSE
FAMILIES["muse_spark"] = dataclasses.replace(
    _MUSE,
    prefixes=("model.language_model.layers.{}.mlp.", "language_model.layers.{}.mlp."),
    nested="text_config",
    twin="muse_spark_text",
)


def _zaya(c: Cfg) -> dict:
    """Zaya: a router MLP over the router state carried from the previous layer (RouterConfig.mlp_width,
    carried_state after the first layer), softmax over the E experts and one skip class (a zero-computation expert
    whose output is zero), chosen with the selection bias ``balancing_biases``, weights not renormalised; SwiGLU
    experts."""
    if c.layer is None:
        raise ValueError(
            "moe_from_hf: Zaya's router is per layer (the first layer's carries no state from a previous layer, the "
            "others' do): give layer= (0 … num_hidden_layers - 1)"
        )
    return dict(
        experts=c.get("num_experts"),
        zero_experts=1,
        zero_expert_output="zero",
        top_k=c.get("num_experts_per_tok", default=1),
        ffn=c.get("moe_intermediate_size"),
        router=RouterConfig(
            scoring="softmax",
            score_bias=True,
            renormalize=False,
            mlp_width=c.positive("router_hidden_size", default=256),
            carried_state=c.layer != 0,
            norm_eps=float(c.get("rms_norm_eps", default=1e-5, kind=float)),
        ),
    )


FAMILIES["zaya"] = Family(
    _zaya,
    lambda c: list(range(c.num_layers())),
    names=TensorNames(
        router=("gate.router_mlp.out_proj.weight",),
        score_bias=("gate.balancing_biases",),
        hub_fused=True,
        router_mlp=(
            "gate.down_proj.weight",
            "gate.down_proj.bias",
            "gate.router_states_scale",
            "gate.router_mlp.norm.weight",
            "gate.router_mlp.fc1.weight",
            "gate.router_mlp.fc1.bias",
            "gate.router_mlp.fc2.weight",
            "gate.router_mlp.fc2.bias",
        ),
    ),
    refuse=swiglu_only,
)


def _nllb_encoder_layers(c: Cfg) -> int:
    return c.positive("encoder_layers", "num_hidden_layers", default=12)


def _nllb(c: Cfg) -> dict:
    """NLLB-MoE in eval: softmax router (its bias when router_bias), top-2 renormalised, every expert's output ×
    (1 − moe_token_dropout); plain experts with biases (fc2(act(fc1 x)), ReLU by default), the encoder's and the
    decoder's of their own widths. Its eval capacity ⌈moe_eval_capacity_token_fraction · tokens⌉ is every token at
    the default fraction 1 (nothing drops: `_nllb_refuse` refuses less)."""
    if c.layer is None:
        raise ValueError(
            "moe_from_hf: NLLB-MoE's expert width is per layer (encoder_ffn_dim in the encoder, decoder_ffn_dim in "
            f"the decoder): give layer= (encoder MoE layers from 0, the decoder's from {_nllb_encoder_layers(c)})"
        )
    dropout = float(c.get("moe_token_dropout", default=0.2, kind=float))
    if not 0 <= dropout < 1:
        raise ValueError(f"moe_from_hf: config['moe_token_dropout'] must lie in [0, 1), got {dropout}")
    encoder = c.layer < _nllb_encoder_layers(c)
    return dict(
        experts=c.get("num_experts"),
        top_k=2,
        ffn=c.positive("encoder_ffn_dim" if encoder else "decoder_ffn_dim", default=4096),
        router=RouterConfig(
            scoring="softmax", bias=c.get("router_bias", default=False, kind=bool), scaling=1.0 - dropout
        ),
        expert=ExpertConfig(activation=_PLAIN[c.config.get("activation_function", "relu")], bias=True),
    )


def _nllb_layers(c: Cfg) -> list[int]:
    """The sparse layers of each stack — layer i when (i + 1) % sparse_step == 0 (none with step 0) — the encoder's
    numbered from 0, the decoder's after them (encoder_layers + j)."""

    def sparse(layers: str, step: str, default: int) -> list[int]:
        n, k = c.positive(layers, default=default), c.get(step, default=4)
        return [i for i in range(n) if k > 0 and (i + 1) % k == 0]

    n = _nllb_encoder_layers(c)
    decoder = sparse("decoder_layers", "decoder_sparse_step", 12)
    return sparse("encoder_layers", "encoder_sparse_step", 12) + [n + j for j in decoder]


def _nllb_locate(c: Cfg, layer: int) -> tuple[str, ...]:
    n = _nllb_encoder_layers(c)
    return (f"model.encoder.layers.{layer}.ffn.",) if layer < n else (f"model.decoder.layers.{layer - n}.ffn.",)


def _nllb_refuse(c: Cfg) -> str | None:
    policy = c.config.get("second_expert_policy", "all")
    if policy != "all":
        return (
            f"second_expert_policy {policy!r}: transformers draws the second expert at random (Gumbel noise or a coin "
            "per token), in eval too; the layer's routing is deterministic ('all')"
        )
    fraction = c.config.get("moe_eval_capacity_token_fraction", 1.0)
    if not isinstance(fraction, int | float) or fraction < 1:
        return (
            f"moe_eval_capacity_token_fraction {fraction!r}: an eval capacity below every token drops pairs counted "
            "over the whole call (every top-1 claim before any top-2), which the layer's per-sequence capacity "
            "does not express; 1 (the default) drops none"
        )
    return _float32_router(c) or _plain_refuse("activation_function", "relu")(c)


FAMILIES["nllb-moe"] = Family(
    _nllb,
    _nllb_layers,
    ("model.encoder.layers.{}.ffn.",),
    names=TensorNames(
        router=("router.classifier.weight",),
        router_bias="router.classifier.bias",
        experts=("fc1", "fc1", "fc2"),
        expert_key="experts.expert_{e}.{p}.weight",
    ),
    refuse=_nllb_refuse,
    noise=noise_keys("moe_token_dropout"),
    locate=_nllb_locate,
)
