"""Dense references of the Hugging Face MoE blocks, written from transformers' modeling code (independent of the
layer): tiny random configs, their tensors in HF's own names and layouts, and each block's forward.

`hf_block(family, config, state, x, xp)` reads the per-expert checkpoint layout (gpt-oss: its fused layout) in
torch ``Linear [out, in]`` orientation and follows the modeling files line by line:

- deepseek_v3 / glm4_moe / glm_moe_dsa (`DeepseekV3MoE.route_tokens_to_experts`, transformers ≥ 5): fp32 logits,
  sigmoid, ``+ e_score_correction_bias`` for the choice only, group score = sum of the top-2, ``topk_group``
  groups kept (others −inf), top-k, weights gathered from the unbiased sigmoid, ``/ (sum + 1e-20)`` when
  ``norm_topk_prob``, ``× routed_scaling_factor``; shared experts added unweighted.
- deepseek_v4 (`DeepseekV4TopKRouter`): sqrt(softplus), bias for the choice, always renormalised (+1e-20),
  × routed_scaling_factor; routed and shared experts clamp gate above and up to ±swiglu_limit. Its checkpoint
  names: ``w1`` / ``w3`` / ``w2`` (experts and shared experts), the selection bias ``gate.bias``.
- qwen2_moe / qwen3_moe (`Qwen2MoeSparseMoeBlock`): softmax over all experts, top-k, renormalised when
  ``norm_topk_prob``; Qwen2's shared expert scaled by sigmoid(x · shared_expert_gate).
- mixtral (`MixtralSparseMoeBlock`): softmax, top-k, always renormalised; w1 gate, w3 up, w2 down.
- gpt_oss (`GptOssTopKRouter`, `GptOssExperts`): logits with bias, top-k of the logits, softmax over those k;
  ``gate_up = x @ gate_up_proj[e] + bias``, gate = even columns, up = odd, gate clamped above at the limit, up to
  ±limit, ``(up + 1) · gate · sigmoid(1.702 · gate) @ down_proj[e] + bias``.

``xp`` is numpy (float64 forward references) or jax.numpy (the same code differentiated by ``jax.grad``).
"""

from __future__ import annotations

import numpy as np

FAMILY_CONFIGS = {
    "deepseek_v3": dict(
        model_type="deepseek_v3",
        hidden_size=16,
        moe_intermediate_size=8,
        n_routed_experts=8,
        num_experts_per_tok=3,
        n_group=4,
        topk_group=2,
        n_shared_experts=2,
        routed_scaling_factor=2.5,
        norm_topk_prob=True,
        num_hidden_layers=3,
        first_k_dense_replace=1,
        hidden_act="silu",
    ),
    "glm4_moe": dict(
        model_type="glm4_moe",
        hidden_size=16,
        moe_intermediate_size=8,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        n_shared_experts=1,
        routed_scaling_factor=1.5,
        norm_topk_prob=False,
        num_hidden_layers=2,
        first_k_dense_replace=1,
        hidden_act="silu",
    ),
    "deepseek_v4": dict(
        model_type="deepseek_v4",
        hidden_size=16,
        moe_intermediate_size=8,
        n_routed_experts=8,
        num_experts_per_tok=3,
        n_shared_experts=1,
        routed_scaling_factor=1.5,
        scoring_func="sqrtsoftplus",
        swiglu_limit=1.5,
        num_hidden_layers=3,
        num_hash_layers=1,
    ),
    "qwen2_moe": dict(
        model_type="qwen2_moe",
        hidden_size=16,
        moe_intermediate_size=8,
        num_experts=8,
        num_experts_per_tok=2,
        shared_expert_intermediate_size=12,
        norm_topk_prob=False,
        num_hidden_layers=2,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        hidden_act="silu",
    ),
    "qwen3_moe": dict(
        model_type="qwen3_moe",
        hidden_size=16,
        moe_intermediate_size=8,
        num_experts=8,
        num_experts_per_tok=3,
        norm_topk_prob=True,
        num_hidden_layers=2,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        hidden_act="silu",
    ),
    "mixtral": dict(
        model_type="mixtral",
        hidden_size=16,
        intermediate_size=8,
        num_local_experts=8,
        num_experts_per_tok=2,
        num_hidden_layers=2,
        hidden_act="silu",
    ),
    "gpt_oss": dict(
        model_type="gpt_oss",
        hidden_size=16,
        intermediate_size=8,
        num_local_experts=8,
        num_experts_per_tok=3,
        swiglu_limit=1.0,
        num_hidden_layers=2,
    ),
}


def dims(config: dict) -> tuple[int, int, int, int]:
    """(H, F, E, K) of a tiny config."""
    H = config["hidden_size"]
    F = config.get("moe_intermediate_size", config.get("intermediate_size"))
    E = config.get("n_routed_experts", config.get("num_experts", config.get("num_local_experts")))
    return H, F, E, config["num_experts_per_tok"]


def hf_state(family: str, config: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """Random tensors of one MoE block in HF's checkpoint layout (gpt-oss: its only, fused, layout)."""
    rng = np.random.default_rng(seed)
    H, F, E, _ = dims(config)
    w = lambda *shape: rng.normal(size=shape) * shape[-1] ** -0.5  # noqa: E731
    st: dict[str, np.ndarray] = {}
    if family == "gpt_oss":
        st["router.weight"], st["router.bias"] = w(E, H), rng.normal(size=E) * 0.5
        st["experts.gate_up_proj"] = rng.normal(size=(E, H, 2 * F)) * H**-0.5 * 2.0
        st["experts.gate_up_proj_bias"] = rng.normal(size=(E, 2 * F)) * 0.3
        st["experts.down_proj"] = rng.normal(size=(E, F, H)) * F**-0.5
        st["experts.down_proj_bias"] = rng.normal(size=(E, H)) * 0.3
        return st
    st["gate.weight"] = w(E, H) * 2.0
    if family in ("deepseek_v3", "glm4_moe", "deepseek_v4"):
        st[_score_bias(family)] = rng.normal(size=E) * 0.3
    names = _names(family)
    for i in range(E):
        st[f"experts.{i}.{names[0]}.weight"] = w(F, H) * 2.0
        st[f"experts.{i}.{names[1]}.weight"] = w(F, H) * 2.0
        st[f"experts.{i}.{names[2]}.weight"] = w(H, F)
    if family in ("deepseek_v3", "glm4_moe", "deepseek_v4") and config.get("n_shared_experts"):
        Fs = config["n_shared_experts"] * F
        st[f"shared_experts.{names[0]}.weight"], st[f"shared_experts.{names[1]}.weight"] = w(Fs, H), w(Fs, H)
        st[f"shared_experts.{names[2]}.weight"] = w(H, Fs)
    if family == "qwen2_moe":
        Fs = config["shared_expert_intermediate_size"]
        st["shared_expert.gate_proj.weight"], st["shared_expert.up_proj.weight"] = w(Fs, H), w(Fs, H)
        st["shared_expert.down_proj.weight"] = w(H, Fs)
        st["shared_expert_gate.weight"] = w(1, H)
    return st


def fused_state(family: str, config: dict, state: dict) -> dict[str, np.ndarray]:
    """transformers ≥ 5's in-memory layout of a per-expert state (its conversion: stack, then concat gate | up)."""
    if family == "gpt_oss":
        return dict(state)
    _, _, E, _ = dims(config)
    g, u, d = _names(family)
    out = {k: v for k, v in state.items() if not k.startswith("experts.")}
    if family == "deepseek_v4":  # the in-memory names of its selection bias and shared expert
        out["gate.e_score_correction_bias"] = out.pop("gate.bias")
        for new, old in zip(("gate_proj", "up_proj", "down_proj"), (g, u, d), strict=True):
            out[f"shared_experts.{new}.weight"] = out.pop(f"shared_experts.{old}.weight")
    out["experts.gate_up_proj"] = np.stack(
        [np.concatenate([state[f"experts.{i}.{g}.weight"], state[f"experts.{i}.{u}.weight"]], axis=0) for i in range(E)]
    )  # [E, 2F, H]
    out["experts.down_proj"] = np.stack([state[f"experts.{i}.{d}.weight"] for i in range(E)])  # [E, H, F]
    return out


def _names(family: str) -> tuple[str, str, str]:
    """The checkpoint's (gate, up, down) expert names."""
    return ("w1", "w3", "w2") if family in ("mixtral", "deepseek_v4") else ("gate_proj", "up_proj", "down_proj")


def _score_bias(family: str) -> str:
    return "gate.bias" if family == "deepseek_v4" else "gate.e_score_correction_bias"


def _topk(xp, scores, k):
    return xp.argsort(-scores, axis=-1)[:, :k]


def hf_block(family: str, config: dict, st: dict, x, xp=np):
    """The HF block's output ``[T, H]`` for ``x [T, H]`` (see the module)."""
    sig = lambda z: 1.0 / (1.0 + xp.exp(-z))  # noqa: E731
    silu = lambda z: z * sig(z)  # noqa: E731
    lin = lambda a, w: a @ w.T  # noqa: E731  (torch Linear: weight [out, in])
    T = x.shape[0]
    _, F, E, K = dims(config)
    # Step 1: the router.
    if family == "gpt_oss":
        logits = lin(x, st["router.weight"]) + st["router.bias"]
        ids = _topk(xp, logits, K)
        v = xp.take_along_axis(logits, ids, axis=1)
        w = xp.exp(v - v.max(axis=1, keepdims=True))
        w = w / w.sum(axis=1, keepdims=True)
    elif family in ("deepseek_v3", "glm4_moe", "deepseek_v4"):
        logits = lin(x, st["gate.weight"])
        s = xp.sqrt(xp.log1p(xp.exp(logits))) if family == "deepseek_v4" else sig(logits)
        c = s + st[_score_bias(family)]
        ng, tg = config.get("n_group", 1), config.get("topk_group", 1)
        if family != "deepseek_v4" and ng > 1:
            grouped = c.reshape(T, ng, E // ng)
            group_scores = xp.sort(grouped, axis=-1)[..., -2:].sum(axis=-1)
            kept = _topk(xp, group_scores, tg)  # [T, tg]
            mask = (xp.arange(ng)[None, :, None] == kept[:, None, :]).any(axis=-1)  # [T, ng]
            c = xp.where(xp.repeat(mask, E // ng, axis=1), c, -xp.inf)
        ids = _topk(xp, c, K)
        w = xp.take_along_axis(s, ids, axis=1)
        if family == "deepseek_v4" or config.get("norm_topk_prob"):
            w = w / (w.sum(axis=1, keepdims=True) + 1e-20)
        w = w * config["routed_scaling_factor"]
    else:
        logits = lin(x, st["gate.weight"])
        p = xp.exp(logits - logits.max(axis=1, keepdims=True))
        p = p / p.sum(axis=1, keepdims=True)
        ids = _topk(xp, p, K)
        w = xp.take_along_axis(p, ids, axis=1)
        if family == "mixtral" or config.get("norm_topk_prob"):
            w = w / w.sum(axis=1, keepdims=True)
    # Step 2: every expert on every token, then the top-k weighted sum.
    outs = []
    for e in range(E):
        if family == "gpt_oss":
            gu = x @ st["experts.gate_up_proj"][e] + st["experts.gate_up_proj_bias"][e]
            g, u = gu[:, 0::2], gu[:, 1::2]
            lim = config["swiglu_limit"]
            g, u = xp.minimum(g, lim), xp.clip(u, -lim, lim)
            o = ((u + 1) * (g * sig(1.702 * g))) @ st["experts.down_proj"][e] + st["experts.down_proj_bias"][e]
        else:
            names = _names(family)
            g = lin(x, st[f"experts.{e}.{names[0]}.weight"])
            u = lin(x, st[f"experts.{e}.{names[1]}.weight"])
            if family == "deepseek_v4":
                lim = config["swiglu_limit"]
                g, u = xp.minimum(g, lim), xp.clip(u, -lim, lim)
            o = lin(silu(g) * u, st[f"experts.{e}.{names[2]}.weight"])
        outs.append(o)
    y_all = xp.stack(outs, axis=1)  # [T, E, H]
    picked = xp.take_along_axis(y_all, ids[:, :, None], axis=1)  # [T, K, H]
    out = (w[:, :, None] * picked).sum(axis=1)
    # Step 3: shared experts.
    g, u, d = _names(family)
    if f"shared_experts.{g}.weight" in st:
        sh = lambda n: st[f"shared_experts.{n}.weight"]  # noqa: E731
        sg, su = lin(x, sh(g)), lin(x, sh(u))
        if family == "deepseek_v4":
            lim = config["swiglu_limit"]
            sg, su = xp.minimum(sg, lim), xp.clip(su, -lim, lim)
        out = out + lin(silu(sg) * su, sh(d))
    if "shared_expert.gate_proj.weight" in st:
        sh = lambda n: st[f"shared_expert.{n}.weight"]  # noqa: E731
        shared = lin(silu(lin(x, sh("gate_proj"))) * lin(x, sh("up_proj")), sh("down_proj"))
        out = out + sig(lin(x, st["shared_expert_gate.weight"])) * shared
    return out
