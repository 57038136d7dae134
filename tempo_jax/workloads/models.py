"""The MoE blocks of the models the papers serve, as data: shapes and routing from each model's own config.

One `ModelSpec` per model (plain numbers and strings, no jax), read by `tempo_jax.layer.presets` (→ `MoEConfig`)
and by the simulators. Every spec names its source. Where a source is a third party or a library default rather
than the model's published config.json, ``source`` says so.

Routing vocabulary (see `tempo_jax.layer.routing.RouterConfig`): ``scoring`` is "softmax" (over all experts),
"sigmoid", "sqrt_softplus", "softmax_topk" (softmax over the top-k logits only) or "sparsemixer"
(PhiMoE); ``score_bias`` is a
selection-only correction bias (DeepSeek-V3's ``e_score_correction_bias``); ``n_group`` / ``topk_group`` limit
the choice to the best groups; ``renormalize`` / ``renorm_eps`` / ``scaling`` act on the chosen weights.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType

__all__ = ["MODEL_SPECS", "ModelSpec"]


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """One model's MoE block.

    Attributes:
      name: preset name.
      family: the Hugging Face ``model_type`` whose modeling code defines the block.
      hidden: H.
      ffn: F, the routed experts' intermediate width.
      experts: E routed experts per MoE layer.
      top_k: K routed experts per token.
      layers: decoder layers; moe_layers: how many of them are MoE.
      router: `RouterConfig` fields (scoring, bias, score_bias, n_group, topk_group, renormalize, renorm_eps,
        scaling).
      expert: `ExpertConfig` fields (activation, bias, alpha, limit).
      shared: shared experts: ``{"count": n, "ffn": width of one}`` (+ ``"gated": True``), or None.
      total_params, active_params: the model's parameter counts as published (strings, for the record).
      source: where every number comes from.
    """

    name: str
    family: str
    hidden: int
    ffn: int
    experts: int
    top_k: int
    layers: int
    moe_layers: int
    router: dict = field(default_factory=dict)
    expert: dict = field(default_factory=dict)
    shared: dict | None = None
    total_params: str = ""
    active_params: str = ""
    source: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "router", MappingProxyType(dict(self.router)))
        object.__setattr__(self, "expert", MappingProxyType(dict(self.expert)))
        if self.shared is not None:
            object.__setattr__(self, "shared", MappingProxyType(dict(self.shared)))


_DSV3_ROUTER = {"scoring": "sigmoid", "score_bias": True, "renormalize": True, "renorm_eps": 1e-20}
_QWEN_ROUTER = {"scoring": "softmax", "renormalize": True, "renorm_eps": 0.0}
_V4_ROUTER = {"scoring": "sqrt_softplus", "score_bias": True, "renormalize": True, "renorm_eps": 1e-20, "scaling": 1.5}
_V4_EXPERT = {"activation": "swiglu_clamp", "limit": 10.0}
_GPT_OSS_ROUTER = {"scoring": "softmax_topk", "bias": True}
_GPT_OSS_EXPERT = {"activation": "gpt_oss", "bias": True, "alpha": 1.702, "limit": 7.0}

#: The families' presets below: the model's config.json as copied in public repositories (huggingface.co itself was
#: not reachable); their MoE keys are recorded in tests/fixtures/hf_public_configs.json, whose import by
#: `tempo_jax.hf` must give these specs (tests/test_hf_import.py).
_COPIED = " config.json (public copies; MoE keys in tests/fixtures/hf_public_configs.json)"

_SPECS = [
    ModelSpec(
        name="deepseek_v3",
        family="deepseek_v3",
        hidden=7168,
        ffn=2048,
        experts=256,
        top_k=8,
        layers=61,
        moe_layers=58,
        router={**_DSV3_ROUTER, "n_group": 8, "topk_group": 4, "scaling": 2.5},
        shared={"count": 1, "ffn": 2048},
        total_params="671B",
        active_params="37B",
        source="DeepSeek-V3 config.json (deepseek-ai/DeepSeek-V3; inference/configs/config_671B.json agrees): "
        "hidden 7168, moe_intermediate 2048, 256 routed + 1 shared, top-8, n_group 8, topk_group 4, "
        "routed_scaling_factor 2.5, first_k_dense_replace 3 of 61 layers",
    ),
    ModelSpec(
        name="kimi_k2",
        family="deepseek_v3",
        hidden=7168,
        ffn=2048,
        experts=384,
        top_k=8,
        layers=61,
        moe_layers=60,
        router={**_DSV3_ROUTER, "scaling": 2.827},
        shared={"count": 1, "ffn": 2048},
        total_params="1.04T",
        active_params="32B",
        source="Kimi-K2 config.json (moonshotai/Kimi-K2-Instruct, model_type kimi_k2 on DeepSeek-V3's code): hidden "
        "7168, moe_intermediate 2048, 384 routed + 1 shared, top-8, n_group 1, topk_group 1, routed_scaling_factor "
        "2.827, sigmoid with the selection bias, first_k_dense_replace 1 of 61 layers",
    ),
    ModelSpec(
        name="deepseek_v4_flash",
        family="deepseek_v4",
        hidden=4096,
        ffn=2048,
        experts=256,
        top_k=6,
        layers=43,
        moe_layers=43,
        router=_V4_ROUTER,
        expert=_V4_EXPERT,
        shared={"count": 1, "ffn": 2048},
        total_params="284B",
        active_params="13B",
        source="CascadeEP Table 1 (256 routed + 1 shared, top-6, F 2048, 284B / 13B); hidden 4096, 43 layers, "
        "sqrt(softplus) scoring, routed_scaling_factor 1.5, swiglu_limit 10 from transformers' "
        "DeepseekV4Config defaults (checkpoint deepseek-ai/DeepSeek-V4-Flash-Base); the first 3 layers "
        "route by token-id hash, which this layer does not express (their routing must be given)",
    ),
    ModelSpec(
        name="deepseek_v4_pro",
        family="deepseek_v4",
        hidden=7168,
        ffn=3072,
        experts=384,
        top_k=6,
        layers=61,
        moe_layers=61,
        router=_V4_ROUTER,
        expert=_V4_EXPERT,
        shared={"count": 1, "ffn": 3072},
        total_params="1.6T",
        active_params="49B",
        source="CascadeEP Table 1 (384 routed + 1 shared, top-6, F 3072, 1.6T / 49B); hidden 7168 and 61 layers "
        "from third-party transcriptions of its config (unverified); routing as V4-Flash (assumed: "
        "sqrt(softplus), scaling 1.5, swiglu_limit 10)",
    ),
    ModelSpec(
        name="glm_5_3",
        family="glm_moe_dsa",
        hidden=6144,
        ffn=2048,
        experts=256,
        top_k=8,
        layers=78,
        moe_layers=75,
        router={**_DSV3_ROUTER, "scaling": 2.5},
        shared={"count": 1, "ffn": 2048},
        total_params="753B",
        active_params="~40B",
        source="CascadeEP Table 1 (256 routed + 1 shared, top-8, F 2048, 753B / ~40B); hidden 6144, 78 layers "
        "(3 dense), sigmoid routing with score bias, scaling 2.5, one group, from transformers' "
        "GlmMoeDsaConfig defaults (GLM-5); GLM-5.3 assumed to keep GLM-5's block",
    ),
    ModelSpec(
        name="qwen3_30b_a3b",
        family="qwen3_moe",
        hidden=2048,
        ffn=768,
        experts=128,
        top_k=8,
        layers=48,
        moe_layers=48,
        router=_QWEN_ROUTER,
        total_params="30B",
        active_params="3B",
        source="Qwen3-30B-A3B config.json: hidden 2048, moe_intermediate 768, 128 experts, top-8, "
        "norm_topk_prob true, 48 layers",
    ),
    ModelSpec(
        name="qwen3_235b_a22b",
        family="qwen3_moe",
        hidden=4096,
        ffn=1536,
        experts=128,
        top_k=8,
        layers=94,
        moe_layers=94,
        router=_QWEN_ROUTER,
        total_params="235B",
        active_params="22B",
        source="Qwen3-235B-A22B config.json: hidden 4096, moe_intermediate 1536, 128 experts, top-8, "
        "norm_topk_prob true, 94 layers",
    ),
    ModelSpec(
        name="mixtral_8x7b",
        family="mixtral",
        hidden=4096,
        ffn=14336,
        experts=8,
        top_k=2,
        layers=32,
        moe_layers=32,
        router=_QWEN_ROUTER,
        total_params="47B",
        active_params="13B",
        source="Mixtral-8x7B config.json: hidden 4096, intermediate 14336, 8 experts, top-2, 32 layers "
        "(softmax, always renormalised)",
    ),
    ModelSpec(
        name="gpt_oss_20b",
        family="gpt_oss",
        hidden=2880,
        ffn=2880,
        experts=32,
        top_k=4,
        layers=24,
        moe_layers=24,
        router=_GPT_OSS_ROUTER,
        expert=_GPT_OSS_EXPERT,
        total_params="21B",
        active_params="3.6B",
        source="gpt-oss-20b config.json: hidden 2880, intermediate 2880, 32 experts, top-4, swiglu_limit 7, "
        "24 layers; router bias, softmax over the top-4 logits, expert biases, alpha 1.702",
    ),
    ModelSpec(
        name="gpt_oss_120b",
        family="gpt_oss",
        hidden=2880,
        ffn=2880,
        experts=128,
        top_k=4,
        layers=36,
        moe_layers=36,
        router=_GPT_OSS_ROUTER,
        expert=_GPT_OSS_EXPERT,
        total_params="117B",
        active_params="5.1B",
        source="openai/gpt-oss reference ModelConfig defaults for gpt-oss-120b (hidden 2880, intermediate 2880, "
        "128 experts, top-4, 36 layers, swiglu_limit 7)",
    ),
    # the families of `tempo_jax.hf` with public configs (issue 37)
    ModelSpec(
        name="olmoe_1b_7b",
        family="olmoe",
        hidden=2048,
        ffn=1024,
        experts=64,
        top_k=8,
        layers=16,
        moe_layers=16,
        router={"renormalize": False},
        total_params="7B",
        active_params="1B",
        source="allenai/OLMoE-1B-7B-0924" + _COPIED,
    ),
    ModelSpec(
        name="qwen3_next_80b_a3b",
        family="qwen3_next",
        hidden=2048,
        ffn=512,
        experts=512,
        top_k=10,
        layers=48,
        moe_layers=48,
        router={},
        shared={"count": 1, "ffn": 512, "gated": True},
        total_params="80B",
        active_params="3B",
        source="Qwen/Qwen3-Next-80B-A3B-Instruct" + _COPIED,
    ),
    ModelSpec(
        name="qwen3_vl_30b_a3b",
        family="qwen3_vl_moe",
        hidden=2048,
        ffn=768,
        experts=128,
        top_k=8,
        layers=48,
        moe_layers=48,
        router={},
        total_params="30B",
        active_params="3B",
        source="Qwen/Qwen3-VL-30B-A3B-Instruct" + _COPIED,
    ),
    ModelSpec(
        name="dbrx",
        family="dbrx",
        hidden=6144,
        ffn=10752,
        experts=16,
        top_k=4,
        layers=40,
        moe_layers=40,
        router={},
        total_params="132B",
        active_params="36B",
        source="databricks/dbrx-instruct" + _COPIED,
    ),
    ModelSpec(
        name="jamba_v0_1",
        family="jamba",
        hidden=4096,
        ffn=14336,
        experts=16,
        top_k=2,
        layers=32,
        moe_layers=16,
        router={"renormalize": False},
        total_params="52B",
        active_params="12B",
        source="ai21labs/Jamba-v0.1" + _COPIED,
    ),
    ModelSpec(
        name="minimax_text_01",
        family="minimax",
        hidden=6144,
        ffn=9216,
        experts=32,
        top_k=2,
        layers=80,
        moe_layers=80,
        router={},
        total_params="456B",
        active_params="45.9B",
        source="MiniMaxAI/MiniMax-Text-01" + _COPIED,
    ),
    ModelSpec(
        name="deepseek_v2_lite",
        family="deepseek_v2",
        hidden=2048,
        ffn=1408,
        experts=64,
        top_k=6,
        layers=27,
        moe_layers=26,
        router={"renormalize": False},
        shared={"count": 2, "ffn": 1408},
        total_params="16B",
        active_params="2.4B",
        source="deepseek-ai/DeepSeek-V2-Lite" + _COPIED,
    ),
    ModelSpec(
        name="deepseek_v2",
        family="deepseek_v2",
        hidden=5120,
        ffn=1536,
        experts=160,
        top_k=6,
        layers=60,
        moe_layers=59,
        router={"n_group": 8, "topk_group": 3, "renormalize": False, "scaling": 16.0, "group_score": "max"},
        shared={"count": 2, "ffn": 1536},
        total_params="236B",
        active_params="21B",
        source="deepseek-ai/DeepSeek-V2" + _COPIED,
    ),
    ModelSpec(
        name="dots_llm1",
        family="dots1",
        hidden=4096,
        ffn=1408,
        experts=128,
        top_k=6,
        layers=62,
        moe_layers=61,
        router={"scoring": "sigmoid", "score_bias": True, "renorm_eps": 1e-20, "scaling": 2.5},
        shared={"count": 2, "ffn": 1408},
        total_params="142B",
        active_params="14B",
        source="rednote-hilab/dots.llm1.inst" + _COPIED,
    ),
    ModelSpec(
        name="ernie_4_5_21b_a3b",
        family="ernie4_5_moe",
        hidden=2560,
        ffn=1536,
        experts=64,
        top_k=6,
        layers=28,
        moe_layers=27,
        router={"score_bias": True},
        shared={"count": 2, "ffn": 1536},
        total_params="21B",
        active_params="3B",
        source="baidu/ERNIE-4.5-21B-A3B-PT" + _COPIED,
    ),
    ModelSpec(
        name="hunyuan_a13b",
        family="hunyuan_v1_moe",
        hidden=4096,
        ffn=3072,
        experts=64,
        top_k=8,
        layers=32,
        moe_layers=32,
        router={},
        shared={"count": 1, "ffn": 3072},
        total_params="80B",
        active_params="13B",
        source="tencent/Hunyuan-A13B-Instruct" + _COPIED,
    ),
    ModelSpec(
        name="granite_3_0_3b_a800m",
        family="granitemoe",
        hidden=1536,
        ffn=512,
        experts=40,
        top_k=8,
        layers=32,
        moe_layers=32,
        router={"scoring": "softmax_topk", "renormalize": False},
        total_params="3.3B",
        active_params="800M",
        source="ibm-granite/granite-3.0-3b-a800m-instruct model card (no copy of its config.json was found: the "
        "card's numbers under granite-3.1's key names; tests/fixtures/hf_public_configs.json)",
    ),
    ModelSpec(
        name="llama4_scout",
        family="llama4",
        hidden=5120,
        ffn=8192,
        experts=16,
        top_k=1,
        layers=48,
        moe_layers=48,
        router={"scoring": "sigmoid", "renormalize": False, "weight_on": "input"},
        shared={"count": 1, "ffn": 8192},
        total_params="109B",
        active_params="17B",
        source="meta-llama/Llama-4-Scout-17B-16E-Instruct" + _COPIED,
    ),
    ModelSpec(
        name="llama4_maverick",
        family="llama4",
        hidden=5120,
        ffn=8192,
        experts=128,
        top_k=1,
        layers=48,
        moe_layers=24,
        router={"scoring": "sigmoid", "renormalize": False, "weight_on": "input"},
        shared={"count": 1, "ffn": 8192},
        total_params="400B",
        active_params="17B",
        source="meta-llama/Llama-4-Maverick-17B-128E-Instruct" + _COPIED,
    ),
    ModelSpec(
        name="phi_3_5_moe",
        family="phimoe",
        hidden=4096,
        ffn=6400,
        experts=16,
        top_k=2,
        layers=32,
        moe_layers=32,
        router={"scoring": "sparsemixer", "renormalize": False},
        total_params="41.9B",
        active_params="6.6B",
        source="microsoft/Phi-3.5-MoE-instruct" + _COPIED,
    ),
    ModelSpec(
        name="gemma4_26b_a4b",
        family="gemma4",
        hidden=2816,
        ffn=704,
        experts=128,
        top_k=8,
        layers=30,
        moe_layers=30,
        router={
            "scoring": "softmax",
            "renormalize": True,
            "input_norm": True,
            "input_scale": True,
            "input_multiplier": 2816**-0.5,
            "expert_scale": True,
        },
        expert={"activation": "geglu_tanh"},
        total_params="25.2B",
        active_params="3.8B",
        source="google/gemma-4-26B-A4B (text_config)" + _COPIED,
    ),
]

#: Every model's spec, by preset name.
MODEL_SPECS: MappingProxyType = MappingProxyType({s.name: s for s in _SPECS})
