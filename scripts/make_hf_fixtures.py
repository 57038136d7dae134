"""Write the Hugging Face test fixtures: tiny random models of every MoE family, saved by transformers itself, and
their MoE block's own outputs and gradients (`tests/fixtures/hf/`). Needs transformers and torch (not project
dependencies: run it in a separate environment), e.g.

    python -m venv /tmp/hfvenv && /tmp/hfvenv/bin/pip install "transformers==5.24.0" torch safetensors
    /tmp/hfvenv/bin/python scripts/make_hf_fixtures.py [family ...]

Per family, in ``tests/fixtures/hf/<family>/``:

- ``hub/``: ``save_pretrained`` as transformers does by default (the per-expert hub layout, sharded into small
  files with ``model.safetensors.index.json``), config.json as transformers writes it;
- ``fused/``: ``save_pretrained(save_original_format=False)`` (transformers ≥ 5's fused in-memory layout), where the
  family has one;
- ``block.npz``: for the first MoE layer, in float64: ``x [T, H]``, ``cot [T, H]``, ``out [T, H]`` = the block's
  forward (transformers' module, eval mode), ``grad_x`` and ``grad/<name>`` = the gradients of ``sum(out · cot)``
  w.r.t. x and every block parameter (in-memory names), and ``layer`` (the decoder layer index); where the router
  reads its own input (Gemma 4: the residual stream, while the experts read a normed copy), also ``router_x``
  and ``grad_router_x``, and the block is the decoder layer's ``router`` and ``experts``; where the block reads each
  token's modality (ERNIE-4.5-VL), ``expert_set [T]`` (its ``moe_mm_token_type_ids``, 1: vision); where it reads
  the router state the previous layer's router handed on (Zaya), ``router_state [T, Rh]`` (drawn N(0, 1)), its
  gradient ``grad_router_state`` and the state the block hands on, ``router_state_out``;
- NLLB-MoE's block is transformers' with its expert loop corrected (`_nllb_experts_corrected`: transformers 5.24
  runs only experts 0 and 1), its meta.json saying so;
- the weights are redrawn N(0, 0.3²) (score biases N(0, 0.1²)) so that routing is far from uniform.

The CI tests (`tests/test_hf_import.py`) read these files with numpy only: the layer loads what transformers wrote and
is compared with what transformers computed.
"""

from __future__ import annotations

import importlib
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import AutoConfig

ROOT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "hf"
T = 24
COMMON = dict(vocab_size=32, num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64, hidden_size=16)

#: family → (config kwargs, decoder layer of the MoE block to record, attribute of the block in the decoder layer)
FAMILIES: dict[str, tuple[dict, int, str]] = {
    "mixtral": (dict(intermediate_size=8, num_local_experts=8, num_experts_per_tok=2, num_hidden_layers=2), 0, "mlp"),
    "qwen2_moe": (
        dict(
            moe_intermediate_size=8,
            intermediate_size=24,
            num_experts=8,
            num_experts_per_tok=2,
            shared_expert_intermediate_size=12,
            norm_topk_prob=False,
            num_hidden_layers=2,
        ),
        0,
        "mlp",
    ),
    "qwen3_moe": (
        dict(
            moe_intermediate_size=8,
            intermediate_size=24,
            num_experts=8,
            num_experts_per_tok=2,
            norm_topk_prob=True,
            num_hidden_layers=2,
            head_dim=8,
        ),
        0,
        "mlp",
    ),
    "deepseek_v3": (
        dict(
            moe_intermediate_size=8,
            intermediate_size=24,
            n_routed_experts=8,
            num_experts_per_tok=3,
            n_group=4,
            topk_group=2,
            n_shared_experts=2,
            routed_scaling_factor=2.5,
            norm_topk_prob=True,
            num_hidden_layers=2,
            first_k_dense_replace=1,
            kv_lora_rank=8,
            q_lora_rank=8,
            qk_rope_head_dim=4,
            qk_nope_head_dim=4,
            v_head_dim=4,
        ),
        1,
        "mlp",
    ),
    "glm4_moe": (
        dict(
            moe_intermediate_size=8,
            intermediate_size=24,
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_group=1,
            topk_group=1,
            n_shared_experts=1,
            routed_scaling_factor=1.5,
            norm_topk_prob=False,
            num_hidden_layers=2,
            first_k_dense_replace=1,
            head_dim=8,
        ),
        1,
        "mlp",
    ),
    "glm_moe_dsa": (
        dict(
            moe_intermediate_size=8,
            intermediate_size=24,
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_shared_experts=1,
            num_hidden_layers=2,
            first_k_dense_replace=1,
            kv_lora_rank=8,
            q_lora_rank=8,
            qk_rope_head_dim=4,
            qk_nope_head_dim=4,
            v_head_dim=4,
            index_head_dim=8,
            index_n_heads=2,
            index_topk=4,
        ),
        1,
        "mlp",
    ),
    "deepseek_v4": (
        dict(
            moe_intermediate_size=8,
            n_routed_experts=8,
            num_experts_per_tok=3,
            n_shared_experts=1,
            routed_scaling_factor=1.5,
            swiglu_limit=1.5,
            num_hidden_layers=3,
            num_hash_layers=1,
            head_dim=16,
            q_lora_rank=8,
            o_groups=2,
            o_lora_rank=8,
            index_n_heads=2,
            index_head_dim=8,
            index_topk=4,
            hc_mult=2,
            sliding_window=4,
            num_key_value_heads=1,
        ),
        1,
        "mlp",
    ),
    "gpt_oss": (
        dict(
            intermediate_size=8,
            num_local_experts=8,
            num_experts_per_tok=2,
            num_hidden_layers=2,
            head_dim=8,
            swiglu_limit=7.0,
        ),
        0,
        "mlp",
    ),
    "olmoe": (
        dict(intermediate_size=8, num_experts=8, num_experts_per_tok=2, norm_topk_prob=False, num_hidden_layers=2),
        0,
        "mlp",
    ),
    "qwen3_next": (
        dict(
            moe_intermediate_size=8,
            intermediate_size=24,
            num_experts=8,
            num_experts_per_tok=2,
            shared_expert_intermediate_size=12,
            norm_topk_prob=True,
            num_hidden_layers=2,
            mlp_only_layers=[0],
            head_dim=8,
            linear_num_key_heads=2,
            linear_num_value_heads=2,
            linear_key_head_dim=8,
            linear_value_head_dim=8,
        ),
        1,
        "mlp",
    ),
    "dbrx": (
        dict(
            d_model=16,
            n_heads=2,
            n_layers=2,
            max_seq_len=64,
            vocab_size=32,
            attn_config={"kv_n_heads": 2, "rope_theta": 10000.0},
            ffn_config={"ffn_hidden_size": 8, "moe_num_experts": 8, "moe_top_k": 2, "ffn_act_fn": {"name": "silu"}},
        ),
        0,
        "ffn",
    ),
    "jamba": (
        dict(
            intermediate_size=8,
            num_experts=8,
            num_experts_per_tok=2,
            num_hidden_layers=2,
            expert_layer_period=2,
            expert_layer_offset=1,
            attn_layer_period=2,
            attn_layer_offset=0,
            use_mamba_kernels=False,
            mamba_d_state=4,
            mamba_d_conv=2,
            mamba_expand=2,
        ),
        1,
        "feed_forward",
    ),
    "minimax": (
        dict(
            intermediate_size=8,
            num_local_experts=8,
            num_experts_per_tok=2,
            num_hidden_layers=2,
            head_dim=8,
            layer_types=["full_attention", "full_attention"],
        ),
        0,
        "mlp",
    ),
    "deepseek_v2": (
        dict(
            moe_intermediate_size=8,
            intermediate_size=24,
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_group=4,
            topk_group=2,
            topk_method="group_limited_greedy",
            n_shared_experts=2,
            routed_scaling_factor=2.0,
            num_hidden_layers=2,
            first_k_dense_replace=1,
            kv_lora_rank=8,
            q_lora_rank=8,
            qk_rope_head_dim=4,
            qk_nope_head_dim=4,
            v_head_dim=4,
        ),
        1,
        "mlp",
    ),
    "dots1": (
        dict(
            moe_intermediate_size=8,
            intermediate_size=24,
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_group=4,
            topk_group=2,
            n_shared_experts=2,
            routed_scaling_factor=2.5,
            norm_topk_prob=True,
            num_hidden_layers=2,
            first_k_dense_replace=1,
            head_dim=8,
        ),
        1,
        "mlp",
    ),
    "ernie4_5_moe": (
        dict(
            intermediate_size=24,
            moe_intermediate_size=8,
            moe_num_experts=8,
            moe_k=2,
            moe_num_shared_experts=2,
            use_bias=False,
            num_hidden_layers=2,
            head_dim=8,
        ),
        1,
        "mlp",
    ),
    "hunyuan_v1_moe": (dict(intermediate_size=8, num_experts=8, moe_topk=2, num_hidden_layers=2, head_dim=8), 0, "mlp"),
    "granitemoe": (
        dict(intermediate_size=8, num_local_experts=8, num_experts_per_tok=2, num_hidden_layers=2),
        0,
        "block_sparse_moe",
    ),
    "granitemoeshared": (
        dict(
            intermediate_size=8,
            num_local_experts=8,
            num_experts_per_tok=2,
            num_hidden_layers=2,
            shared_intermediate_size=12,
        ),
        0,
        "block_sparse_moe",
    ),
    "llama4_text": (
        dict(
            head_dim=8,
            intermediate_size=8,
            intermediate_size_mlp=24,
            num_local_experts=8,
            num_experts_per_tok=1,
            interleave_moe_layer_step=2,
            num_hidden_layers=2,
        ),
        1,
        "feed_forward",
    ),
    "qwen3_vl_moe": (
        dict(
            text_config=dict(
                hidden_size=16,
                moe_intermediate_size=8,
                intermediate_size=24,
                num_experts=8,
                num_experts_per_tok=2,
                num_hidden_layers=2,
                mlp_only_layers=[0],
                num_attention_heads=2,
                num_key_value_heads=2,
                head_dim=8,
                vocab_size=32,
                rope_scaling={"rope_type": "default", "mrope_section": [1, 1, 2]},
            ),
            vision_config=dict(
                depth=1,
                hidden_size=16,
                intermediate_size=16,
                num_heads=2,
                out_hidden_size=16,
                num_position_embeddings=16,
                deepstack_visual_indexes=[0],
            ),
        ),
        1,
        "mlp",
    ),
    "deepseek_v32": (
        dict(
            num_hidden_layers=3,
            n_routed_experts=8,
            num_experts_per_tok=3,
            moe_intermediate_size=8,
            intermediate_size=24,
            n_shared_experts=2,
            n_group=4,
            topk_group=2,
            routed_scaling_factor=2.5,
            norm_topk_prob=True,
            first_k_dense_replace=1,
            q_lora_rank=8,
            kv_lora_rank=8,
            qk_rope_head_dim=4,
            qk_nope_head_dim=4,
            v_head_dim=8,
            index_topk=4,
            index_head_dim=8,
            index_n_heads=2,
        ),
        1,
        "mlp",
    ),
    "glm4_moe_lite": (
        dict(
            num_hidden_layers=3,
            n_routed_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=8,
            intermediate_size=24,
            n_shared_experts=1,
            n_group=2,
            topk_group=1,
            q_lora_rank=8,
            kv_lora_rank=8,
            qk_rope_head_dim=8,
            qk_nope_head_dim=8,
            v_head_dim=8,
        ),
        1,
        "mlp",
    ),
    "kimi_linear": (
        dict(
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            num_hidden_layers=3,
            model_max_length=64,
            num_experts=8,
            num_experts_per_token=3,
            moe_intermediate_size=8,
            intermediate_size=24,
            num_shared_experts=2,
            num_expert_group=4,
            topk_group=2,
            routed_scaling_factor=2.446,
            moe_renormalize=True,
            first_k_dense_replace=1,
            kv_lora_rank=8,
            qk_rope_head_dim=4,
            qk_nope_head_dim=4,
            v_head_dim=8,
            linear_attn_config=dict(head_dim=8, num_heads=2, short_conv_kernel_size=4),
        ),
        1,
        "mlp",
    ),
    "afmoe": (
        dict(
            head_dim=8,
            num_hidden_layers=3,
            num_experts=8,
            num_experts_per_tok=3,
            moe_intermediate_size=8,
            intermediate_size=24,
            num_shared_experts=2,
            num_dense_layers=1,
            route_scale=2.5,
            sliding_window=16,
        ),
        1,
        "mlp",
    ),
    "exaone_moe": (
        dict(
            head_dim=8,
            num_hidden_layers=3,
            num_experts=8,
            num_experts_per_tok=3,
            moe_intermediate_size=8,
            intermediate_size=24,
            num_shared_experts=2,
            first_k_dense_replace=1,
            n_group=4,
            topk_group=2,
            routed_scaling_factor=2.5,
            norm_topk_prob=True,
            sliding_window=16,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
        ),
        1,
        "mlp",
    ),
    "minimax_m2": (
        dict(
            head_dim=8,
            num_hidden_layers=2,
            num_local_experts=8,
            num_experts_per_tok=3,
            intermediate_size=8,
            bos_token_id=1,
            eos_token_id=2,
        ),
        0,
        "mlp",
    ),
    "lfm2_moe": (
        dict(
            num_hidden_layers=3,
            num_experts=8,
            num_experts_per_tok=3,
            moe_intermediate_size=8,
            intermediate_size=24,
            num_dense_layers=1,
            routed_scaling_factor=1.5,
            layer_types=["conv", "full_attention", "conv"],
        ),
        1,
        "feed_forward",
    ),
    "mistral4": (
        dict(
            num_hidden_layers=3,
            n_routed_experts=8,
            num_experts_per_tok=3,
            moe_intermediate_size=8,
            intermediate_size=24,
            n_shared_experts=2,
            first_k_dense_replace=1,
            n_group=4,
            topk_group=2,
            routed_scaling_factor=1.5,
            norm_topk_prob=True,
            q_lora_rank=8,
            kv_lora_rank=8,
            qk_rope_head_dim=4,
            qk_nope_head_dim=4,
            v_head_dim=8,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
        ),
        1,
        "mlp",
    ),
    "mistral_large4": (
        dict(
            text_config=dict(
                vocab_size=32,
                hidden_size=16,
                num_attention_heads=2,
                num_key_value_heads=2,
                num_hidden_layers=3,
                max_position_embeddings=64,
                n_routed_experts=8,
                num_experts_per_tok=3,
                moe_intermediate_size=8,
                intermediate_size=24,
                n_shared_experts=2,
                first_k_dense_replace=1,
                n_group=4,
                topk_group=2,
                routed_scaling_factor=1.5,
                kv_lora_rank=8,
                qk_rope_head_dim=4,
                qk_nope_head_dim=4,
                v_head_dim=8,
                index_topk=4,
                index_head_dim=8,
                index_n_heads=2,
                pad_token_id=0,
                bos_token_id=1,
                eos_token_id=2,
            ),
            vision_config=dict(
                hidden_size=16,
                intermediate_size=16,
                num_hidden_layers=1,
                num_attention_heads=2,
                head_dim=8,
                patch_size=4,
                image_size=16,
            ),
        ),
        1,
        "mlp",
    ),
    "flex_olmo": (
        dict(
            num_hidden_layers=2,
            num_experts=8,
            num_experts_per_tok=3,
            intermediate_size=8,
            norm_topk_prob=True,
            pad_token_id=0,
            eos_token_id=2,
        ),
        0,
        "mlp",
    ),
    "cohere2_moe": (
        dict(
            head_dim=8,
            num_hidden_layers=3,
            num_experts=8,
            num_experts_per_tok=3,
            intermediate_size=8,
            prefix_dense_intermediate_size=24,
            num_shared_experts=2,
            shared_expert_combination_strategy="average",
            expert_selection_fn="softmax",
            first_k_dense_replace=1,
            sliding_window=16,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
        ),
        1,
        "mlp",
    ),
    "solar_open": (
        dict(
            head_dim=8,
            num_hidden_layers=2,
            n_routed_experts=8,
            num_experts_per_tok=3,
            moe_intermediate_size=8,
            n_shared_experts=2,
            n_group=4,
            topk_group=2,
            routed_scaling_factor=2.5,
            norm_topk_prob=True,
        ),
        0,
        "mlp",
    ),
    "laguna": (
        dict(
            head_dim=8,
            num_hidden_layers=3,
            num_experts=8,
            num_experts_per_tok=3,
            moe_intermediate_size=8,
            shared_expert_intermediate_size=8,
            intermediate_size=32,
            moe_routed_scaling_factor=2.5,
        ),
        1,
        "mlp",
    ),
    "lara_mini": (
        dict(
            head_dim=8,
            num_hidden_layers=2,
            num_experts=8,
            num_experts_per_tok=3,
            moe_intermediate_size=8,
            shared_expert_intermediate_size=8,
            linear_key_head_dim=8,
            linear_value_head_dim=8,
            linear_num_key_heads=2,
            linear_num_value_heads=2,
            layer_types=["linear_attention", "full_attention"],
        ),
        0,
        "mlp",
    ),
    "mellum": (
        dict(
            head_dim=8,
            num_hidden_layers=3,
            num_experts=8,
            num_experts_per_tok=3,
            moe_intermediate_size=8,
            intermediate_size=32,
            norm_topk_prob=False,
            mlp_layer_types=["dense", "sparse", "sparse"],
        ),
        1,
        "mlp",
    ),
    "qwen3_5_moe_text": (
        dict(
            head_dim=8,
            num_hidden_layers=2,
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=8,
            shared_expert_intermediate_size=12,
            linear_num_key_heads=2,
            linear_num_value_heads=2,
            linear_key_head_dim=8,
            linear_value_head_dim=8,
        ),
        0,
        "mlp",
    ),
    "mimo_v2_flash": (
        dict(
            head_dim=8,
            v_head_dim=8,
            num_hidden_layers=3,
            n_routed_experts=8,
            num_experts_per_tok=3,
            moe_intermediate_size=8,
            intermediate_size=24,
            n_group=4,
            topk_group=2,
            routed_scaling_factor=1.7,
            norm_topk_prob=True,
        ),
        1,
        "mlp",
    ),
    "hy_v3": (
        dict(
            head_dim=8,
            num_hidden_layers=3,
            num_experts=8,
            num_experts_per_tok=3,
            moe_intermediate_size=8,
            intermediate_size=24,
            num_shared_experts=2,
            router_scaling_factor=2.826,
        ),
        1,
        "mlp",
    ),
    "hy_v4": (
        dict(
            num_hidden_layers=3,
            n_routed_experts=8,
            num_experts_per_tok=3,
            moe_intermediate_size=8,
            intermediate_size=24,
            n_shared_experts=2,
            n_group=4,
            topk_group=2,
            routed_scaling_factor=2.827,
            norm_topk_prob=True,
            swiglu_limit=0.7,
            q_lora_rank=8,
            kv_lora_rank=8,
            qk_nope_head_dim=4,
            qk_rope_head_dim=4,
            v_head_dim=8,
            index_topk=4,
            index_head_dim=8,
            index_n_heads=2,
            hc_mult=2,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
        ),
        1,
        "mlp",
    ),
    "bailing_hybrid": (
        dict(
            head_dim=8,
            num_hidden_layers=3,
            model_max_length=64,
            num_experts=8,
            num_experts_per_token=3,
            moe_intermediate_size=8,
            intermediate_size=24,
            num_shared_experts=2,
            num_expert_group=4,
            topk_group=2,
            routed_scaling_factor=2.5,
            moe_renormalize=True,
            first_k_dense_replace=1,
            kv_lora_rank=8,
            qk_rope_head_dim=4,
            qk_nope_head_dim=4,
            v_head_dim=8,
            layer_group_size=3,
            pad_token_id=0,
            eos_token_id=1,
        ),
        1,
        "mlp",
    ),
    "granitemoehybrid": (
        dict(
            num_hidden_layers=2,
            num_local_experts=8,
            num_experts_per_tok=3,
            intermediate_size=8,
            shared_intermediate_size=12,
            mamba_n_heads=2,
            mamba_d_head=16,
            mamba_d_state=8,
            mamba_chunk_size=8,
            layer_types=["linear_attention", "full_attention"],
            position_embedding_type="rope",
        ),
        0,
        "block_sparse_moe",
    ),
    "granitemoe_swa": (
        dict(
            num_hidden_layers=2,
            num_local_experts=8,
            num_experts_per_tok=3,
            intermediate_size=8,
            shared_intermediate_size=12,
            sliding_window=8,
        ),
        0,
        "block_sparse_moe",
    ),
    "beam": (
        dict(
            head_dim=8,
            num_hidden_layers=3,
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=8,
            intermediate_size=32,
            n_group=4,
            topk_group=2,
            routed_scaling_factor=2.5,
            sliding_window=8,
            mlp_layer_types=["dense", "sparse", "sparse"],
        ),
        1,
        "mlp",
    ),
    "flint": (
        dict(
            head_dim=8,
            num_hidden_layers=3,
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=8,
            shared_expert_intermediate_size=12,
            intermediate_size=32,
            sliding_window=8,
            attn_implementation="eager",
        ),
        2,
        "mlp",
    ),
    "axk2": (
        dict(
            num_hidden_layers=2,
            n_routed_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=8,
            n_shared_experts=1,
            intermediate_size=32,
            routed_scaling_factor=2.5,
            kv_lora_rank=8,
            q_lora_rank=8,
            qk_rope_head_dim=4,
            qk_nope_head_dim=4,
            v_head_dim=8,
            index_topk=8,
            index_head_dim=8,
            index_n_heads=2,
            gated_norm_rank=4,
        ),
        1,
        "mlp",
    ),
    "dots3_note_text": (
        dict(
            num_hidden_layers=3,
            n_routed_experts=8,
            num_experts_per_tok=3,
            moe_intermediate_size=8,
            intermediate_size=24,
            n_shared_experts=2,
            moe_shared_expert_intermediate_size=12,
            n_group=4,
            topk_group=2,
            routed_scaling_factor=2.0,
            norm_topk_prob=True,
            first_k_dense_replace=1,
            q_lora_rank=8,
            kv_lora_rank=8,
            qk_rope_head_dim=4,
            qk_nope_head_dim=4,
            v_head_dim=8,
            head_dim=8,
            index_topk=4,
            index_head_dim=8,
            index_n_heads=2,
            use_sliding_window=False,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
        ),
        1,
        "mlp",
    ),
    "qwen4_exp_text": (
        dict(
            head_dim=8,
            num_hidden_layers=2,
            num_experts=8,
            num_experts_per_tok=3,
            moe_intermediate_size=8,
            shared_expert_intermediate_size=12,
            linear_num_key_heads=2,
            linear_num_value_heads=2,
            linear_key_head_dim=8,
            linear_value_head_dim=8,
            hc_count=2,
            hc_lowrank=4,
            layer_types=["linear_attention", "linear_attention"],
            eos_token_id=2,
        ),
        0,
        "mlp",
    ),
    "aria_text": (
        dict(
            head_dim=8,
            num_hidden_layers=2,
            moe_num_experts=8,
            moe_topk=2,
            intermediate_size=8,
            moe_num_shared_experts=2,
        ),
        1,
        "mlp",
    ),
    "openai_privacy_filter": (
        dict(
            head_dim=8,
            num_hidden_layers=2,
            num_local_experts=8,
            num_experts_per_tok=3,
            intermediate_size=6,
            pad_token_id=0,
            eos_token_id=0,
        ),
        0,
        "mlp",
    ),
    "glm4v_moe": (
        dict(
            text_config=dict(
                vocab_size=32,
                hidden_size=16,
                num_attention_heads=2,
                num_key_value_heads=2,
                head_dim=8,
                num_hidden_layers=3,
                max_position_embeddings=64,
                n_routed_experts=8,
                num_experts_per_tok=3,
                moe_intermediate_size=8,
                intermediate_size=24,
                n_shared_experts=2,
                n_group=4,
                topk_group=2,
                routed_scaling_factor=1.5,
                norm_topk_prob=True,
                first_k_dense_replace=1,
            ),
            vision_config=dict(
                depth=1,
                hidden_size=16,
                intermediate_size=16,
                num_heads=2,
                out_hidden_size=16,
                patch_size=4,
                image_size=16,
            ),
        ),
        1,
        "mlp",
    ),
    "glm5_next": (
        dict(
            text_config=dict(
                vocab_size=32,
                hidden_size=16,
                num_attention_heads=2,
                num_key_value_heads=2,
                num_hidden_layers=4,
                max_position_embeddings=64,
                n_routed_experts=8,
                num_experts_per_tok=3,
                moe_intermediate_size=8,
                intermediate_size=24,
                n_shared_experts=2,
                n_group=4,
                topk_group=2,
                routed_scaling_factor=2.5,
                norm_topk_prob=True,
                swiglu_limit=0.7,
                pad_token_id=0,
                q_lora_rank=8,
                kv_lora_rank=8,
                qk_rope_head_dim=0,
                qk_nope_head_dim=8,
                v_head_dim=8,
                index_topk=16,
                index_head_dim=8,
                index_n_heads=2,
                index_kpool=4,
                hc_mult=2,
                linear_head_dim=8,
                linear_num_heads=2,
                mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
            ),
            vision_config=dict(
                depth=1,
                hidden_size=16,
                intermediate_size=16,
                num_heads=2,
                out_hidden_size=16,
                patch_size=4,
                image_size=16,
                projection_intermediate_size=16,
            ),
        ),
        1,
        "mlp",
    ),
    "deepseek_ocr2": (
        dict(
            text_config=dict(
                vocab_size=32,
                hidden_size=16,
                num_attention_heads=2,
                num_key_value_heads=2,
                num_hidden_layers=3,
                max_position_embeddings=64,
                n_routed_experts=8,
                num_experts_per_tok=3,
                moe_intermediate_size=8,
                intermediate_size=24,
                n_shared_experts=2,
                routed_scaling_factor=1.3,
                topk_method="greedy",
                mlp_layer_types=["dense", "sparse", "sparse"],
            ),
            vision_config=dict(
                sam_config=dict(
                    hidden_size=16,
                    output_channels=8,
                    num_hidden_layers=1,
                    num_attention_heads=2,
                    image_size=32,
                    patch_size=16,
                    window_size=2,
                    global_attn_indexes=[0],
                    downsample_channels=[8, 16],
                ),
                encoder_config=dict(
                    vocab_size=32,
                    hidden_size=16,
                    intermediate_size=16,
                    num_hidden_layers=1,
                    num_attention_heads=2,
                    num_key_value_heads=2,
                ),
            ),
        ),
        1,
        "mlp",
    ),
    "diffusion_gemma": (
        dict(
            text_config=dict(
                vocab_size=32,
                hidden_size=16,
                num_attention_heads=2,
                num_key_value_heads=2,
                head_dim=8,
                global_head_dim=8,
                num_hidden_layers=2,
                max_position_embeddings=64,
                num_experts=8,
                top_k_experts=2,
                moe_intermediate_size=8,
                intermediate_size=32,
                sliding_window=8,
                pad_token_id=0,
                eos_token_id=1,
                bos_token_id=2,
            ),
            vision_config=dict(
                hidden_size=16,
                intermediate_size=16,
                num_hidden_layers=1,
                num_attention_heads=2,
                num_key_value_heads=2,
                head_dim=8,
            ),
            boi_token_id=28,
            eoi_token_id=29,
            image_token_id=30,
        ),
        1,
        "experts",
    ),
    "unlimited_ocr": (
        dict(
            text_config=dict(
                vocab_size=32,
                hidden_size=16,
                num_attention_heads=2,
                num_key_value_heads=2,
                num_hidden_layers=3,
                max_position_embeddings=64,
                n_routed_experts=8,
                num_experts_per_tok=3,
                moe_intermediate_size=8,
                intermediate_size=32,
                n_shared_experts=2,
                routed_scaling_factor=1.5,
                first_k_dense_replace=1,
            ),
            vision_config=dict(
                sam_config=dict(
                    hidden_size=16,
                    num_hidden_layers=1,
                    num_attention_heads=2,
                    image_size=64,
                    patch_size=16,
                    window_size=2,
                    global_attn_indexes=[0],
                    mlp_dim=16,
                    output_channels=8,
                    downsample_channels=[16, 32],
                ),
                encoder_config=dict(
                    hidden_size=16,
                    intermediate_size=16,
                    num_hidden_layers=1,
                    num_attention_heads=2,
                    image_size=32,
                    patch_size=16,
                ),
            ),
            image_token_id=5,
        ),
        1,
        "mlp",
    ),
    "sarvam_moe": (
        dict(
            head_dim=8,
            num_hidden_layers=3,
            n_routed_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=8,
            intermediate_size=24,
            n_shared_experts=1,
            n_group=2,
            topk_group=1,
            first_k_dense_replace=1,
        ),
        1,
        "mlp",
    ),
    "sarvam_mla": (
        dict(
            num_hidden_layers=3,
            n_routed_experts=8,
            num_experts_per_tok=3,
            moe_intermediate_size=8,
            intermediate_size=24,
            n_shared_experts=2,
            n_group=4,
            topk_group=2,
            first_k_dense_replace=1,
            q_lora_rank=8,
            kv_lora_rank=8,
            qk_rope_head_dim=4,
            qk_nope_head_dim=4,
            v_head_dim=8,
        ),
        1,
        "mlp",
    ),
    "gemma4_text": (
        dict(
            intermediate_size=24,
            enable_moe_block=True,
            num_experts=8,
            top_k_experts=2,
            moe_intermediate_size=8,
            num_hidden_layers=2,
            head_dim=8,
            global_head_dim=8,
            vocab_size_per_layer_input=32,
            hidden_size_per_layer_input=4,
        ),
        0,
        "experts",
    ),
    # the selection bias on the raw logits (Kolibri-1), the block output's norm (A.X-K1) and bias (JetMoE)
    "kolibri1": (
        dict(
            num_hidden_layers=2,
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=8,
            shared_expert_intermediate_size=12,
            norm_topk_prob=True,
            head_dim=8,
        ),
        0,
        "mlp",
    ),
    "axk1": (
        dict(
            num_hidden_layers=2,
            n_routed_experts=8,
            num_experts_per_tok=3,
            moe_intermediate_size=8,
            n_shared_experts=1,
            intermediate_size=32,
            n_group=4,
            topk_group=2,
            kv_lora_rank=8,
            q_lora_rank=8,
            qk_rope_head_dim=4,
            qk_nope_head_dim=4,
            v_head_dim=8,
            rms_norm_eps=1e-5,
        ),
        1,
        "mlp",
    ),
    "jetmoe": (
        dict(num_hidden_layers=2, num_local_experts=8, num_experts_per_tok=2, intermediate_size=8, kv_channels=8),
        0,
        "mlp",
    ),
    # Step-3.7: routed and shared experts clamped after the activation at per-layer limits that bite
    "step3p7": (
        dict(
            text_config=dict(
                **COMMON,
                head_dim=8,
                num_hidden_layers=2,
                mlp_layer_types=["dense", "sparse"],
                num_local_experts=8,
                n_routed_experts=8,
                num_experts_per_tok=2,
                moe_intermediate_size=8,
                share_expert_dim=12,
                intermediate_size=24,
                swiglu_limits=[0.0, 1.5],
                swiglu_limits_shared=[0.0, 1.0],
                moe_router_scaling_factor=2.0,
            ),
            vision_config=dict(
                hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28
            ),
        ),
        1,
        "mlp",
    ),
    # MiniMax-M3: routed and shared experts with gpt-oss's activation, clamped at a limit that bites
    "minimax_m3_vl_text": (
        dict(
            head_dim=8,
            num_hidden_layers=2,
            mlp_layer_types=["dense", "sparse"],
            num_local_experts=8,
            num_experts_per_tok=2,
            intermediate_size=8,
            shared_intermediate_size=12,
            dense_intermediate_size=24,
            routed_scaling_factor=2.0,
            swiglu_limit=1.5,
            rotary_dim=4,
            index_n_heads=2,
            index_head_dim=8,
            index_block_size=4,
            index_topk_blocks=2,
        ),
        1,
        "mlp",
    ),
    # Inkling 2: soft caps small enough to bite on the gate's linear factor and the up projection
    "inkling2_text": (
        dict(
            unpadded_vocab_size=32,
            head_dim=8,
            swa_num_attention_heads=2,
            swa_num_key_value_heads=2,
            swa_head_dim=8,
            num_hidden_layers=2,
            n_routed_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=8,
            route_scale=2.0,
            mlp_gate_softcap=0.8,
            mlp_up_softcap=1.5,
            n_layers_per_attn_res_block=1,
            sliding_window_size=8,
            d_rel=4,
            rel_extent=8,
        ),
        0,
        "mlp",
    ),
    # Inkling: two shared experts weighted by the router beside the routed top-2
    "inkling_text": (
        dict(
            head_dim=8,
            swa_num_attention_heads=2,
            swa_num_key_value_heads=2,
            swa_head_dim=8,
            num_hidden_layers=2,
            intermediate_size=32,
            moe_intermediate_size=8,
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_shared_experts=2,
            route_scale=2.0,
            d_rel=4,
            sliding_window_size=8,
        ),
        0,
        "mlp",
    ),
    # LongCat-Flash: four zero-computation (identity) experts beside eight routed ones, chosen often enough
    "longcat_flash": (
        dict(
            num_layers=1,
            ffn_hidden_size=32,
            expert_ffn_hidden_size=8,
            n_routed_experts=8,
            zero_expert_num=4,
            moe_topk=3,
            routed_scaling_factor=2.0,
            q_lora_rank=8,
            kv_lora_rank=8,
            qk_nope_head_dim=4,
            qk_rope_head_dim=4,
            v_head_dim=4,
            head_dim=4,
        ),
        0,
        "mlp",
    ),
    # Nemotron-H: plain relu² experts (no gate projection) and a relu² shared expert, DeepSeek-V3's router
    "nemotron_h": (
        dict(
            layers_block_type=["moe", "full_attention"],
            head_dim=8,
            intermediate_size=32,
            moe_intermediate_size=8,
            moe_shared_expert_intermediate_size=12,
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_group=2,
            topk_group=1,
            routed_scaling_factor=2.5,
            norm_topk_prob=True,
            mamba_num_heads=4,
            mamba_head_dim=4,
            ssm_state_size=4,
            n_groups=1,
            expand=2,
            chunk_size=8,
            moe_latent_size=12,
        ),
        0,
        "mixer",
    ),
    # Switch Transformers: top-1 with a capacity of 3 tokens per expert in the 24-token sequence (tokens drop)
    "switch_transformers": (
        dict(
            d_model=16,
            num_layers=2,
            num_decoder_layers=2,
            num_sparse_encoder_layers=1,
            num_sparse_decoder_layers=1,
            num_heads=2,
            d_kv=8,
            d_ff=8,
            num_experts=8,
            expert_capacity=3,
            router_jitter_noise=0.0,
        ),
        1,
        "layer.1.mlp",
    ),
    # MuSE-Spark: experts at a latent width of 12 behind normed projections, each expert's output normed
    "muse_spark_text": (
        dict(
            num_hidden_layers=2,
            num_key_value_heads=1,
            head_dim=8,
            intermediate_size=32,
            moe_intermediate_size=8,
            moe_hidden_size=12,
            num_local_experts=8,
            num_experts_per_tok=2,
            routed_scaling_factor=1.5,
            sliding_window=8,
        ),
        0,
        "mlp",
    ),
    # a wide sparsemixer window (2 × 0.4 relative) so that its softmax weights are not all 1
    "phimoe": (
        dict(
            intermediate_size=8,
            num_local_experts=8,
            num_experts_per_tok=2,
            num_hidden_layers=2,
            router_jitter_noise=0.4,
            input_jitter_noise=0.0,
        ),
        0,
        "mlp",
    ),
}

#: Zaya: a router MLP over the router state carried from layer 0 (layer 1 records it), one skip class beside 8 experts
FAMILIES["zaya"] = (
    dict(
        num_hidden_layers=2,
        num_key_value_heads=1,
        head_dim=8,
        moe_intermediate_size=8,
        num_experts=8,
        num_experts_per_tok=1,
        router_hidden_size=8,
    ),
    1,
    "mlp",
)
#: NLLB-MoE: top-2 over 8 plain ReLU experts with biases in the encoder's second layer (its sparse layers: every 2nd)
FAMILIES["nllb-moe"] = (
    dict(
        d_model=16,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=8,
        decoder_ffn_dim=12,
        num_experts=8,
        encoder_sparse_step=2,
        decoder_sparse_step=2,
        max_position_embeddings=64,
        vocab_size=32,
        router_bias=True,
    ),
    1,
    "ffn",
)


def _nllb_experts_corrected(self, hidden_states, router_mask, router_probs):
    """transformers 5.24's `NllbMoeExperts.forward` with its expert loop corrected. transformers one-hots the router
    mask, which is one-hot already ([T, E] → [T, E, E]), so only "experts" 0 and 1 ever run: a kept top-1 pair on
    expert 1's weights and the rest on expert 0's, whichever experts were chosen. Here each expert e runs on the
    tokens its combine weight ``router_probs[:, e]`` (the router's, capacity and renormalisation applied) keeps, as
    the NLLB paper's top-2 mixture and fairseq compute; everything else is transformers' code: the router, the
    experts' modules and the eval scaling by 1 − moe_token_dropout."""
    out = torch.zeros_like(hidden_states)
    for e in range(self.num_experts):
        (rows,) = torch.nonzero(router_probs[:, e] > 0, as_tuple=True)
        if rows.numel() == 0:
            continue
        h = self[f"expert_{e}"](hidden_states[rows]) * router_probs[rows, e, None]
        if self.moe_token_dropout > 0 and not self.training:
            h = h * (1 - self.moe_token_dropout)
        out.index_add_(0, rows, h.to(hidden_states.dtype))
    return out


#: families whose transformers block is corrected before it is recorded (module class → its corrected forward)
CORRECTED = {"nllb-moe": ("transformers.models.nllb_moe.modeling_nllb_moe", "NllbMoeExperts", _nllb_experts_corrected)}

#: families whose block reads the router state the previous layer's router handed on: the config key of its width
ROUTER_STATE = {"zaya": "router_hidden_size"}


def _zaya_spread(model: torch.nn.Module, g: torch.Generator) -> None:
    """Zaya's router MLP ends in probabilities near 1/9: a wider output projection and a selection bias of their
    scale (the skip class's raised) so that every expert and the skip class are chosen."""
    with torch.no_grad():
        for layer in model.model.layers:
            router = layer.mlp.gate
            router.router_mlp.out_proj.weight.mul_(4.0)
            bias = torch.randn(router.balancing_biases.shape, generator=g, dtype=torch.float64) * 0.02
            bias[-1] += 0.15
            router.balancing_biases.copy_(bias.to(router.balancing_biases.dtype))


#: families whose redrawn weights need a further adjustment so that the fixture exercises their mechanism
SPREAD = {"zaya": _zaya_spread}

#: MiniMax-M3's multimodal model: the same text block, whose hub files keep MiniMax's own names
FAMILIES["minimax_m3_vl"] = (
    dict(
        text_config={**COMMON, **FAMILIES["minimax_m3_vl_text"][0]},
        vision_config=dict(
            hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28
        ),
        projector_hidden_size=16,
    ),
    1,
    "mlp",
)

#: Inkling's multimodal model: the same text block, whose hub files interleave gate and up rows under model.llm
FAMILIES["inkling_mm_model"] = (
    dict(
        text_config={**COMMON, **FAMILIES["inkling_text"][0]},
        vision_config=dict(
            num_hidden_layers=4, num_attention_heads=2, patch_size=2, temporal_patch_size=2, text_hidden_size=16
        ),
        audio_config=dict(n_mel_bins=4, mel_vocab_size=8, text_hidden_size=16),
    ),
    0,
    "mlp",
)

#: ERNIE-4.5-VL: text and vision experts of different widths, each token routed within its modality's set
_ERNIE_TEXT = dict(
    **COMMON,
    num_hidden_layers=2,
    intermediate_size=32,
    moe_intermediate_size=[8, 4],
    moe_num_experts=8,
    moe_k=2,
    moe_num_shared_experts=2,
    rope_parameters={"rope_type": "default", "rope_theta": 500000.0, "mrope_section": [1, 1, 2]},
)
FAMILIES["ernie4_5_vl_moe_text"] = (_ERNIE_TEXT, 1, "mlp")
FAMILIES["ernie4_5_vl_moe"] = (
    dict(text_config=_ERNIE_TEXT, vision_config=dict(depth=1, hidden_size=16, num_heads=2, intermediate_size=32)),
    1,
    "mlp",
)
#: families whose block reads each token's modality: the token types of the fixture's 24 tokens (1: vision)
TOKEN_TYPES = {name: [0] * 8 + [1] * 10 + [0] * 6 for name in ("ernie4_5_vl_moe_text", "ernie4_5_vl_moe")}


def _gemma4_block(block, x, router_x):
    """Gemma 4's MoE unit in its decoder layer: the router on the residual stream, the experts on their input."""
    _, weights, index = block["router"](router_x)
    return block["experts"](x, index, weights)


#: families whose router reads another input than the experts: the block's forward on (x, router_x)
ROUTER_INPUT = {"gemma4_text": _gemma4_block, "diffusion_gemma": _gemma4_block}


def _redraw(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "pre_expert_norm" in name or "post_expert_norm" in name:  # norms used as (1 + w): w around 0
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype) * 0.3)
                continue
            if "mlp.post_mlp_layernorm" in name or "gate.global_scale" in name:  # norms, gains: around 1
                p.copy_(1 + torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype) * 0.3)
                continue
            if "norm" in name or "layernorm" in name:
                continue
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype) * 0.3)
        for name, b in model.named_buffers():
            if "e_score_correction_bias" in name or ("gate.bias" in name and b.dtype.is_floating_point):
                b.copy_(torch.randn(b.shape, generator=g, dtype=torch.float64).to(b.dtype) * 0.1)


#: families built by their own class (not AutoModelForCausalLM), and where their decoder layers sit
BUILD = {
    "qwen3_vl_moe": ("Qwen3VLMoeForConditionalGeneration", "model.language_model.layers"),
    "mistral_large4": ("MistralLarge4ForConditionalGeneration", "model.language_model.layers"),
    "mistral4": ("Mistral4ForCausalLM", "model.layers"),
    "dbrx": ("AutoModelForCausalLM", "transformer.blocks"),
    "openai_privacy_filter": ("AutoModelForTokenClassification", "model.layers"),
    "glm4v_moe": ("Glm4vMoeForConditionalGeneration", "model.language_model.layers"),
    "glm5_next": ("Glm5NextForConditionalGeneration", "model.language_model.layers"),
    "deepseek_ocr2": ("DeepseekOcr2ForConditionalGeneration", "model.language_model.layers"),
    "diffusion_gemma": ("DiffusionGemmaForBlockDiffusion", "model.decoder.layers"),
    "unlimited_ocr": ("AutoModelForImageTextToText", "model.language_model.layers"),
    "step3p7": ("Step3p7ForConditionalGeneration", "model.language_model.layers"),
    "minimax_m3_vl": ("AutoModelForImageTextToText", "model.language_model.layers"),
    "inkling_mm_model": ("InklingForConditionalGeneration", "model.language_model.layers"),
    "switch_transformers": ("SwitchTransformersForConditionalGeneration", "encoder.block"),
    "ernie4_5_vl_moe_text": ("Ernie4_5_VLMoeTextModel", "layers"),
    "muse_spark_text": ("AutoModel", "layers"),
    "ernie4_5_vl_moe": ("Ernie4_5_VLMoeForConditionalGeneration", "model.language_model.layers"),
    "nllb-moe": ("NllbMoeForConditionalGeneration", "model.encoder.layers"),
}
#: families whose router computes in float32 whatever its input (``hidden_states.float()``): the router's attribute
ROUTER_FP32 = {"inkling2_text": "gate"}
#: families whose shared MLP sits beside the block on the decoder layer (one MoE unit)
SIBLING_SHARED = ("granitemoeshared", "granitemoehybrid", "granitemoe_swa")


def _build(family: str):
    kw, layer, attr = FAMILIES[family]
    if family == "dbrx" or "text_config" in kw:
        cfg = AutoConfig.for_model(family, **kw)
    else:
        cfg = AutoConfig.for_model(family, **{**COMMON, **kw})
    cfg._experts_implementation = "eager"  # the per-expert loop: float64 capable (grouped_mm is not)
    if hasattr(cfg, "text_config"):
        cfg.text_config._experts_implementation = "eager"
    torch.manual_seed(0)
    cls, path = BUILD.get(family, ("AutoModelForCausalLM", "model.layers"))
    build = getattr(transformers, cls)
    if cls.startswith("Auto"):
        model = build.from_config(cfg, dtype=torch.float32)
    else:
        model = build._from_config(cfg, dtype=torch.float32)
    model.eval()
    return model, _layers(_layers(model, path)[layer], attr), layer


def _layers(model, path: str):
    """The module of ``model`` at dotted ``path`` (a number indexes a module list: ``layer.1.mlp``)."""
    for part in path.split("."):
        model = model[int(part)] if part.isdigit() else getattr(model, part)
    return model


def make(family: str) -> None:
    if family in CORRECTED:
        module, cls, forward = CORRECTED[family]
        getattr(importlib.import_module(module), cls).forward = forward
    model, block, layer = _build(family)
    _redraw(model, seed=sum(map(ord, family)))
    if family in SPREAD:
        SPREAD[family](model, torch.Generator().manual_seed(2))
    out = ROOT / family
    shutil.rmtree(out, ignore_errors=True)
    model.save_pretrained(out / "hub", max_shard_size="24KB")  # the default: the per-expert hub layout, sharded
    model.save_pretrained(out / "fused", save_original_format=False)
    if not any((out / "fused").glob("*.safetensors")):
        shutil.rmtree(out / "fused")
    # The block's own forward and gradients, in float64 (a router that casts its input to float32 on purpose stays
    # float32: Inkling 2's).
    block = block.to(torch.float64)
    if family in ROUTER_FP32:
        getattr(block, ROUTER_FP32[family]).to(torch.float32)
    g = torch.Generator().manual_seed(1)
    text = getattr(model.config, "text_config", model.config)
    H = model.config.d_model if family == "dbrx" else text.hidden_size
    x = (torch.randn(1, T, H, generator=g, dtype=torch.float64) * 1.5).requires_grad_(True)
    cot = torch.randn(1, T, H, generator=g, dtype=torch.float64)
    router_x = router_state = None
    if family in ROUTER_INPUT:  # the router reads its own input (Gemma 4: the residual stream)
        router_x = (torch.randn(1, T, H, generator=g, dtype=torch.float64) * 3.0).requires_grad_(True)
        decoder = _layers(model, BUILD.get(family, ("", "model.layers"))[1])[layer].to(torch.float64)
        block = torch.nn.ModuleDict({"router": decoder.router, "experts": decoder.experts})
        res = ROUTER_INPUT[family](block, x[0], router_x[0])
    elif family in ROUTER_STATE:  # the previous layer's router state, an input of the block (and of the gradients)
        width = getattr(text, ROUTER_STATE[family])
        router_state = torch.randn(1, T, width, generator=g, dtype=torch.float64).requires_grad_(True)
        res = block(x, router_state)
    elif family in TOKEN_TYPES:  # the block routes each token within its modality's experts
        res = block(x, moe_mm_token_type_ids=torch.tensor([TOKEN_TYPES[family]]))
    else:
        res = block(x)
    y = (res[0] if isinstance(res, tuple) else res).reshape(x.shape)  # Llama-4's block returns [T, H]
    if family in SIBLING_SHARED:  # its shared MLP sits beside the block, on the decoder layer: one MoE unit
        shared = model.model.layers[layer].shared_mlp.to(torch.float64)
        y = y + shared(x)
        block = torch.nn.ModuleDict({"block_sparse_moe": block, "shared_mlp": shared})
    (y * cot).sum().backward()
    arrays = {
        "x": x[0].detach().numpy(),
        "cot": cot[0].numpy(),
        "out": y[0].detach().numpy(),
        "grad_x": x.grad[0].numpy(),
        "layer": np.array(layer),
    }
    if router_x is not None:
        arrays.update(router_x=router_x[0].detach().numpy(), grad_router_x=router_x.grad[0].numpy())
    if router_state is not None:  # the state in, its gradient, and the state the block hands on
        arrays.update(router_state=router_state[0].detach().numpy(), grad_router_state=router_state.grad[0].numpy())
        arrays["router_state_out"] = res[1][0].detach().numpy()
    if family in TOKEN_TYPES:
        arrays["expert_set"] = np.array(TOKEN_TYPES[family], np.int32)
    for name, p in block.named_parameters():
        if p.grad is not None:
            arrays[f"grad/{name}"] = p.grad.numpy()
        arrays[f"param/{name}"] = p.detach().numpy()
    for name, b in block.named_buffers():
        arrays[f"buffer/{name}"] = b.numpy()
    np.savez_compressed(out / "block.npz", **arrays)
    (out / "meta.json").write_text(
        json.dumps(
            {
                "transformers": transformers.__version__,
                "torch": torch.__version__,
                "family": family,
                "layer": layer,
                "tokens": T,
                **({"corrected": CORRECTED[family][1] + ".forward"} if family in CORRECTED else {}),
            },
            indent=1,
        )
    )
    print(f"{family}: layer {layer}, |out| {float(y.abs().max()):.3f}, {len(arrays)} arrays", flush=True)


if __name__ == "__main__":
    for fam in sys.argv[1:] or list(FAMILIES):
        try:
            make(fam)
        except Exception as err:  # report and go on with the others
            print(f"{fam}: FAILED {type(err).__name__}: {err}", flush=True)
