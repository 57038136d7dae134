"""The families' config.json → `MoEConfig` and which decoder layers are MoE (`moe_config_from_hf`,
`moe_layer_ids`); the tensors are `tempo_jax.layer.hf.tensors`.

Families (``model_type``) and how they map (the math of each is `tempo_jax.layer.routing` /
`tempo_jax.layer.experts`):

- deepseek_v3, glm4_moe, glm_moe_dsa: sigmoid scores + score bias, groups (n_group, topk_group), norm_topk_prob
  with ε 1e-20, × routed_scaling_factor; SwiGLU experts; n_shared_experts × moe_intermediate_size shared.
- deepseek_v4: sqrt(softplus) + score bias, always renormalised (ε 1e-20), × routed_scaling_factor; SwiGLU clamped
  at swiglu_limit; n_shared_experts shared.

| model_type | router | experts | shared |
| --- | --- | --- | --- |
| qwen2_moe | softmax, norm_topk_prob | SwiGLU | shared_expert_intermediate_size, sigmoid-gated |
| qwen3_moe | softmax, norm_topk_prob | SwiGLU | none |
| mixtral | softmax, always renormalised | SwiGLU (w1 gate, w3 up, w2 down) | none |
| gpt_oss | router bias, softmax over the top-k logits | biases, clamp at swiglu_limit, (up + 1)·g·σ(1.702·g) | none |

Where HF's two layouts differ (DeepSeek-V3's group mask: 0.0 in transformers 4.x, −inf in ≥ 5 and DeepSeek's
own code) this follows −inf. A config the layer cannot express is refused with a ValueError that says why:
DeepSeek-V4's hash-routed layers (their experts come from the token id), quantized tensors (FP8 block scales,
MXFP4 blocks: dequantize first), another activation than silu. Missing, misshapen or unexpected tensors are
refused naming the key and the shape expected. No download happens here: give a local folder.

Glossary: H hidden, F expert width, E routed experts, K top-k, Fs shared width.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax.numpy as jnp

from ..config import MoEConfig
from ..experts import ExpertConfig, SharedConfig
from ..routing import RouterConfig

__all__ = ["FAMILIES", "family", "moe_config_from_hf", "moe_layer_ids"]

#: Every ``model_type`` the layer expresses.
FAMILIES = ("deepseek_v3", "glm4_moe", "glm_moe_dsa", "deepseek_v4", "qwen2_moe", "qwen3_moe", "mixtral", "gpt_oss")
_DEEPSEEK_LIKE = ("deepseek_v3", "glm4_moe", "glm_moe_dsa")


def family(config) -> str:
    """``config['model_type']`` when the layer expresses it (a ValueError naming the families otherwise)."""
    if not isinstance(config, Mapping):
        raise ValueError(f"moe_from_hf: config must be the model's config.json as a dict, got {type(config).__name__}")
    mt = config.get("model_type")
    if mt not in FAMILIES:
        raise ValueError(f"moe_from_hf: model_type {mt!r} is not a MoE family the layer expresses; one of {FAMILIES}")
    return mt


def _get(config: Mapping, key: str, default=None, *, kind=int):
    if key not in config:
        if default is None:
            raise ValueError(f"moe_from_hf: config.json of {config.get('model_type')!r} lacks {key!r}")
        return default
    v = config[key]
    if kind is int and (isinstance(v, bool) or not isinstance(v, int)):
        raise ValueError(f"moe_from_hf: config[{key!r}] must be an integer, got {v!r}")
    if kind is float and (isinstance(v, bool) or not isinstance(v, int | float)):
        raise ValueError(f"moe_from_hf: config[{key!r}] must be a number, got {v!r}")
    if kind is bool and not isinstance(v, bool):
        raise ValueError(f"moe_from_hf: config[{key!r}] must be true or false, got {v!r}")
    return v


def moe_config_from_hf(config: Mapping, *, slots_per_rank: int, dtype=jnp.float32, **overrides) -> MoEConfig:
    """The `MoEConfig` of one MoE block of the model ``config`` (a config.json dict), see the module's table.

    Raises:
      ValueError: unknown ``model_type``, a missing or mistyped key, or a block the layer cannot express.
    """
    fam = family(config)
    act = config.get("hidden_act", "silu")
    if act != "silu" and fam != "gpt_oss":
        raise ValueError(f"moe_from_hf: hidden_act {act!r}: the layer's experts are SwiGLU (silu) only")
    H = _get(config, "hidden_size")
    shared = None
    expert = ExpertConfig()
    if fam in _DEEPSEEK_LIKE or fam == "deepseek_v4":
        E, K, F = (
            _get(config, "n_routed_experts"),
            _get(config, "num_experts_per_tok"),
            _get(config, "moe_intermediate_size"),
        )
        n_shared = _get(config, "n_shared_experts", 0)
        if n_shared:
            shared = SharedConfig(count=n_shared, ffn=F)
        scaling = float(_get(config, "routed_scaling_factor", 1.0, kind=float))
        if fam == "deepseek_v4":
            scoring = config.get("scoring_func", "sqrtsoftplus")
            if scoring != "sqrtsoftplus":
                raise ValueError(f"moe_from_hf: deepseek_v4 scoring_func {scoring!r}: only 'sqrtsoftplus' is known")
            router = RouterConfig(scoring="sqrt_softplus", score_bias=True, renormalize=True, renorm_eps=1e-20,
                                  scaling=scaling)  # fmt: skip
            limit = config.get("swiglu_limit")
            if limit is not None:
                expert = ExpertConfig(activation="swiglu_clamp", limit=float(limit))
        else:
            router = RouterConfig(scoring="sigmoid", score_bias=True, n_group=_get(config, "n_group", 1),
                                  topk_group=_get(config, "topk_group", 1),
                                  renormalize=_get(config, "norm_topk_prob", True, kind=bool), renorm_eps=1e-20,
                                  scaling=scaling)  # fmt: skip
    elif fam in ("qwen2_moe", "qwen3_moe"):
        E, K, F = (
            _get(config, "num_experts"),
            _get(config, "num_experts_per_tok"),
            _get(config, "moe_intermediate_size"),
        )
        router = RouterConfig(scoring="softmax", renormalize=_get(config, "norm_topk_prob", False, kind=bool))
        fs = _get(config, "shared_expert_intermediate_size", 0) if fam == "qwen2_moe" else 0
        if fs:
            shared = SharedConfig(count=1, ffn=fs, gated=True)
    elif fam == "mixtral":
        E, K, F = (
            _get(config, "num_local_experts"),
            _get(config, "num_experts_per_tok"),
            _get(config, "intermediate_size"),
        )
        router = RouterConfig(scoring="softmax", renormalize=True)
    else:  # gpt_oss
        E, F = _get(config, "num_local_experts"), _get(config, "intermediate_size")
        K = _get(config, "num_experts_per_tok", config.get("experts_per_token"))
        router = RouterConfig(scoring="softmax_topk", bias=True, renormalize=False)
        expert = ExpertConfig(activation="gpt_oss", bias=True, alpha=1.702,
                              limit=float(_get(config, "swiglu_limit", 7.0, kind=float)))  # fmt: skip
    fields = dict(hidden=H, ffn=F, experts=E, top_k=K, slots_per_rank=slots_per_rank, dtype=dtype, router=router,
                  expert=expert, shared=shared)  # fmt: skip
    try:
        return MoEConfig(**{**fields, **overrides})
    except (TypeError, ValueError) as err:
        raise ValueError(f"moe_from_hf: the {fam} block cannot be expressed: {err}") from None


def moe_layer_ids(config: Mapping) -> list[int]:
    """The decoder layers of ``config`` whose MLP is a routed MoE block (DeepSeek-V4's hash-routed layers are not
    among them: the layer cannot express routing by token id)."""
    fam = family(config)
    L = _get(config, "num_hidden_layers")
    if fam in ("deepseek_v3", "glm4_moe"):
        first = _get(config, "first_k_dense_replace", 0)
        return list(range(first, L))
    if fam in ("glm_moe_dsa", "deepseek_v4"):
        types = config.get("mlp_layer_types")
        if types is None:
            hashed = _get(config, "num_hash_layers", 0) if fam == "deepseek_v4" else 0
            dense = 0 if fam == "deepseek_v4" else _get(config, "first_k_dense_replace", 3)
            return list(range(max(hashed, dense), L))
        return [i for i, t in enumerate(types) if t in ("sparse", "moe")]
    if fam in ("qwen2_moe", "qwen3_moe"):
        step, only = _get(config, "decoder_sparse_step", 1), config.get("mlp_only_layers") or []
        return [i for i in range(L) if i not in only and (i + 1) % step == 0]
    return list(range(L))
