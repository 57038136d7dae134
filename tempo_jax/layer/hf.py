"""Hugging Face MoE blocks and checkpoints into the layer (`tempo_jax.hf`).

    cfg, params = moe_from_hf(config, state, slots_per_rank=4)         # one MoE block's tensors
    layers = load_moe_layers("path/to/checkpoint", slots_per_rank=4)   # {layer: (MoEConfig, params)}

``config`` is the model's config.json as a dict (``model_type`` included); ``state`` one MoE block's tensors with
keys relative to the block (``gate.weight``, ``experts.0.gate_proj.weight``, …). Both layouts a user meets are
read: the per-expert checkpoint layout (``experts.{i}.gate_proj / up_proj / down_proj.weight``, Mixtral's
``experts.{i}.w1 / w3 / w2.weight``, torch Linear ``[out, in]``) and transformers ≥ 5's fused in-memory layout
(``experts.gate_up_proj [E, 2F, H]`` gate rows first, ``experts.down_proj [E, H, F]``; gpt-oss:
``experts.gate_up_proj [E, H, 2F]`` with gate / up interleaved, ``experts.down_proj [E, F, H]``, and ``*_bias``).
Router (``gate.weight``, gpt-oss ``router.weight`` / ``router.bias``), the score bias
(``gate.e_score_correction_bias``) and shared experts (``shared_experts.*``; Qwen2-MoE ``shared_expert.*`` with
``shared_expert_gate.weight``) included.

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

import re
from collections.abc import Mapping
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from solvers.checks import read_json

from .config import MoEConfig, param_shapes
from .experts import ExpertConfig, SharedConfig
from .routing import RouterConfig

__all__ = ["FAMILIES", "load_moe_layers", "moe_config_from_hf", "moe_from_hf", "moe_layer_ids"]

#: Every ``model_type`` the layer expresses.
FAMILIES = ("deepseek_v3", "glm4_moe", "glm_moe_dsa", "deepseek_v4", "qwen2_moe", "qwen3_moe", "mixtral", "gpt_oss")
_DEEPSEEK_LIKE = ("deepseek_v3", "glm4_moe", "glm_moe_dsa")


def _family(config) -> str:
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
    fam = _family(config)
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
    fam = _family(config)
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


# ------------------------------------------------------------------------------------------------ tensors
_QUANTIZED = re.compile(r"(weight_scale_inv|_blocks|_scales|\.scale)$")


def _take(state: Mapping, key: str, shape: tuple[int, ...], used: set) -> np.ndarray:
    if key not in state:
        raise ValueError(f"moe_from_hf: state lacks {key!r} (expected shape {list(shape)})")
    arr = np.asarray(state[key])
    if tuple(arr.shape) != tuple(shape):
        raise ValueError(f"moe_from_hf: state[{key!r}] has shape {list(arr.shape)}, expected {list(shape)}")
    if arr.dtype.kind != "f" and str(arr.dtype) not in ("bfloat16",):
        raise ValueError(f"moe_from_hf: state[{key!r}] has dtype {arr.dtype}: a quantized or integer tensor; "
                         "dequantize the checkpoint to bf16 / fp32 first")  # fmt: skip
    used.add(key)
    return arr.astype(np.float32)


def _experts_per_expert(state, E, H, F, names, used):
    """Stack ``experts.{i}.{gate,up,down}`` torch Linear weights into [E, H, F] / [E, H, F] / [E, F, H]."""
    g, u, d = names
    w_gate = np.stack([_take(state, f"experts.{i}.{g}.weight", (F, H), used).T for i in range(E)])
    w_up = np.stack([_take(state, f"experts.{i}.{u}.weight", (F, H), used).T for i in range(E)])
    w_down = np.stack([_take(state, f"experts.{i}.{d}.weight", (H, F), used).T for i in range(E)])
    return w_gate, w_up, w_down


def moe_from_hf(config: Mapping, state: Mapping, *, slots_per_rank: int, dtype=jnp.float32,
                **overrides) -> tuple[MoEConfig, dict]:  # fmt: skip
    """One HF MoE block → ``(MoEConfig, params)`` for `moe_forward` / `tempo_jax.MoE` (see the module).

    Args:
      config: the model's config.json as a dict.
      state: the block's tensors (numpy or anything ``np.asarray`` reads), keys relative to the block.
      slots_per_rank: S of the layer's placement.
      dtype: the experts' dtype in the layer (the router stays float32).
      **overrides: other `MoEConfig` fields (dispatch_mode, capacity, …).

    Raises:
      ValueError: see the module (unknown model_type, missing / misshapen / unexpected / quantized tensors, a
        config the layer cannot express).
    """
    cfg = moe_config_from_hf(config, slots_per_rank=slots_per_rank, dtype=dtype, **overrides)
    fam = config["model_type"]
    if not isinstance(state, Mapping):
        raise ValueError(f"moe_from_hf: state must be a mapping of tensor names to arrays, got {type(state).__name__}")
    quantized = sorted(k for k in state if _QUANTIZED.search(k))
    if quantized:
        raise ValueError(f"moe_from_hf: quantized tensors {quantized[:4]} (FP8 / MXFP4): dequantize the checkpoint "
                         "to bf16 / fp32 first")  # fmt: skip
    H, F, E = cfg.hidden, cfg.ffn, cfg.experts
    used: set = set()
    params: dict = {}
    # Step 1: the router and its biases.
    gate_name = "router" if fam == "gpt_oss" else "gate"
    params["router"] = _take(state, f"{gate_name}.weight", (E, H), used).T
    if cfg.router.bias:
        params["router_bias"] = _take(state, "router.bias", (E,), used)
    if cfg.router.score_bias:
        params["score_bias"] = _take(state, "gate.e_score_correction_bias", (E,), used)
    # Step 2: the routed experts, fused or per expert.
    if fam == "gpt_oss":
        gu = _take(state, "experts.gate_up_proj", (E, H, 2 * F), used)
        params["w_gate"], params["w_up"] = gu[..., 0::2], gu[..., 1::2]
        params["w_down"] = _take(state, "experts.down_proj", (E, F, H), used)
        gub = _take(state, "experts.gate_up_proj_bias", (E, 2 * F), used)
        params["b_gate"], params["b_up"] = gub[:, 0::2], gub[:, 1::2]
        params["b_down"] = _take(state, "experts.down_proj_bias", (E, H), used)
    elif "experts.gate_up_proj" in state:
        gu = _take(state, "experts.gate_up_proj", (E, 2 * F, H), used)
        params["w_gate"], params["w_up"] = gu[:, :F].transpose(0, 2, 1), gu[:, F:].transpose(0, 2, 1)
        params["w_down"] = _take(state, "experts.down_proj", (E, H, F), used).transpose(0, 2, 1)
    else:
        names = ("w1", "w3", "w2") if fam == "mixtral" else ("gate_proj", "up_proj", "down_proj")
        params["w_gate"], params["w_up"], params["w_down"] = _experts_per_expert(state, E, H, F, names, used)
    # Step 3: shared experts.
    if cfg.shared is not None:
        Fs, prefix = cfg.shared.width, "shared_expert" if fam == "qwen2_moe" else "shared_experts"
        params["shared_w_gate"] = _take(state, f"{prefix}.gate_proj.weight", (Fs, H), used).T
        params["shared_w_up"] = _take(state, f"{prefix}.up_proj.weight", (Fs, H), used).T
        params["shared_w_down"] = _take(state, f"{prefix}.down_proj.weight", (H, Fs), used).T
        if cfg.shared.gated:
            params["shared_gate"] = _take(state, "shared_expert_gate.weight", (1, H), used)[0]
    # Step 4: nothing left over, every parameter where the layer wants it.
    extra = sorted(set(state) - used)
    if extra:
        more = " …" if len(extra) > 8 else ""
        raise ValueError(f"moe_from_hf: unexpected tensors for a {fam} MoE block: {extra[:8]}{more}; give only "
                         "the block's tensors (keys relative to it)")  # fmt: skip
    shapes = param_shapes(cfg)
    out = {}
    for name, value in params.items():
        kind = jnp.float32 if name.startswith("router") or name == "score_bias" else dtype
        out[name] = jnp.asarray(np.ascontiguousarray(value).reshape(shapes[name]), kind)
    return cfg, out


# ----------------------------------------------------------------------------------------------- checkpoints
_BLOCK_PREFIXES = ("model.layers.{}.mlp.", "model.layers.{}.block_sparse_moe.")


def _weight_map(folder: Path) -> dict[str, Path]:
    """tensor name → shard file, from ``model.safetensors.index.json`` or the headers of ``*.safetensors``."""
    from safetensors import safe_open

    index = folder / "model.safetensors.index.json"
    if index.exists():
        data = read_json(index, "safetensors index")
        wm = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(wm, dict):
            raise ValueError(f"{index}: expected a JSON object with a 'weight_map' of tensor name → shard file")
        files = {name: folder / f for name, f in wm.items()}
        missing = sorted({str(p) for p in files.values() if not p.exists()})
        if missing:
            raise ValueError(f"{index}: shard files {missing[:3]} do not exist")
        return files
    shards = sorted(folder.glob("*.safetensors"))
    if not shards:
        raise ValueError(f"{folder}: no *.safetensors files (and no model.safetensors.index.json)")
    out: dict[str, Path] = {}
    for shard in shards:
        with safe_open(str(shard), framework="np") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open has keys(), not iteration
                out[name] = shard
    return out


def load_moe_layers(path, *, slots_per_rank: int, dtype=jnp.float32, layers=None,
                    **overrides) -> dict[int, tuple[MoEConfig, dict]]:  # fmt: skip
    """Every MoE layer of a local checkpoint folder (``config.json`` + ``*.safetensors``, sharded with
    ``model.safetensors.index.json`` or not) as ``{layer: (MoEConfig, params)}``, reading only the MoE blocks'
    tensors (nothing else is materialised).

    Args:
      path: the folder.
      slots_per_rank, dtype, overrides: as `moe_from_hf`.
      layers: a subset of `moe_layer_ids` (default all).

    Raises:
      ValueError: no config.json, a layer that is not MoE, a block without tensors, or what `moe_from_hf` raises.
    """
    from safetensors import safe_open

    folder = Path(path)
    if not folder.is_dir():
        raise ValueError(f"load_moe_layers: {folder} is not a folder (a local checkpoint: config.json + *.safetensors)")
    config = read_json(folder / "config.json", "config.json")
    ids = moe_layer_ids(config)
    if layers is not None:
        if isinstance(layers, int | str) or not all(isinstance(i, int) and not isinstance(i, bool) for i in layers):
            raise ValueError(f"load_moe_layers: layers must be a list of integer layer ids, got {layers!r}")
        bad = sorted(set(layers) - set(ids))
        if bad:
            raise ValueError(f"load_moe_layers: layers {bad} are not MoE layers of this model (MoE layers: {ids})")
        ids = list(layers)
    files = _weight_map(folder)
    out = {}
    for layer in ids:
        prefix = next((p.format(layer) for p in _BLOCK_PREFIXES if any(k.startswith(p.format(layer)) for k in files)),
                      None)  # fmt: skip
        if prefix is None:
            raise ValueError(f"load_moe_layers: {folder} holds no tensors of MoE layer {layer} "
                             f"({_BLOCK_PREFIXES[0].format(layer)}*)")  # fmt: skip
        names = [k for k in files if k.startswith(prefix)]
        state = {}
        for shard in sorted({files[k] for k in names}):
            with safe_open(str(shard), framework="np") as f:
                for k in names:
                    if files[k] == shard:
                        state[k[len(prefix) :]] = f.get_tensor(k)
        try:
            out[layer] = moe_from_hf(config, state, slots_per_rank=slots_per_rank, dtype=dtype, **overrides)
        except ValueError as err:
            raise ValueError(f"load_moe_layers: layer {layer}: {err}") from None
    return out
