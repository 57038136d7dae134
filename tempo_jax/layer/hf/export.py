"""The layer back to Hugging Face: a block's tensors in the layout transformers itself saves (`moe_to_hf`), and a
folder of every MoE layer's tensors for a checkpoint (`save_moe_layers`), so a model fine-tuned here loads into
transformers again. The inverse of `tempo_jax.layer.hf.tensors`: ``load → export → load`` is the identity, and an
export of what transformers wrote equals its tensors (`tests/test_hf_import.py`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from solvers.checks import read_json

from ..config import MoEConfig
from ..fp8 import SCALE_KEYS, dequantize_weights, layer_block
from ..params import check_params
from .families import family, moe_config_from_hf, moe_layer_ids
from .load import fp8_block
from .quant import SafetensorsFile

__all__ = ["moe_to_hf", "save_moe_layers"]


def _np(a) -> np.ndarray:
    return np.asarray(jax.device_get(a)).astype(np.float32)


#: The `MoEConfig` fields that make a block what config.json says it is.
_BLOCK_FIELDS = ("hidden", "ffn", "experts", "top_k", "router", "expert", "shared", "output", "zero_experts", "latent")


def check_block(config: Mapping, cfg: MoEConfig, *, layer: int | None, where: str) -> None:
    """``cfg`` is the block ``config`` describes (at decoder ``layer`` when given): the same dimensions, router
    (aux-free ``balance_rate`` aside: a training setting), experts and shared experts, so that the tensors written
    load back into the same block."""
    kw = dict(slots_per_rank=cfg.slots_per_rank, dtype=cfg.dtype, sequence_length=cfg.router.capacity_window)
    try:
        candidates = [moe_config_from_hf(config, **kw, layer=layer)]
    except ValueError as err:
        if layer is not None or "is per layer" not in str(err):
            raise ValueError(f"{where}: {err}") from None
        # a family whose top-k or constants are per layer, no layer given: the block must be one of its MoE layers'
        top_k = {"top_k": cfg.top_k} if "top-k is per layer" in str(err) else {}
        candidates = [moe_config_from_hf(config, **kw, layer=i, **top_k) for i in moe_layer_ids(config)]
    wrong = []
    for want in candidates:
        have = dataclasses.replace(cfg, router=dataclasses.replace(cfg.router, balance_rate=want.router.balance_rate))
        wrong = [f for f in _BLOCK_FIELDS if getattr(have, f) != getattr(want, f)]
        if not wrong:
            break
    if wrong:
        shown = "; ".join(
            f"{f}: config.json says {getattr(want, f)!r}, the block has {getattr(have, f)!r}" for f in wrong
        )
        raise ValueError(
            f"{where}: the block is not the one config.json describes ({shown}); transformers would load the tensors "
            "into another block — export with the config.json of the model the block belongs to"
        )


def moe_to_hf(config: Mapping, cfg: MoEConfig, logical: dict, *, layer: int | None = None) -> dict[str, np.ndarray]:
    """One MoE block's *logical* parameters (`tempo_jax.layer.to_logical`, `MoE.logical_params`) → its tensors in
    the layout transformers saves for ``config``'s family, keys relative to the block (``gate.weight``,
    ``experts.0.gate_proj.weight``, …), float32 numpy — FP8 experts (``expert_dtype="fp8_block"``) of a family saved
    per expert as stored (float8_e4m3fn ``[out, in]`` beside ``*.weight_scale_inv``, DeepSeek's format), of a fused
    layout dequantized. ``layer``: its decoder layer (a family whose top-k is per layer needs it to check ``cfg``).

    Raises:
      ValueError: a family the layer does not express, a ``cfg`` that is not the block ``config`` describes
        (`check_block`), or parameters that do not match ``cfg``.
    """
    mt, fam, _ = family(config)
    check_block(config, cfg, layer=layer, where="moe_to_hf")
    check_params(logical, cfg, num_slots=None, where="moe_to_hf")
    n = fam.names
    per_expert = n.fused not in ("interleaved", "dbrx", "input_linear") and not n.hub_fused and not n.stacked_names
    stored = None  # FP8 experts in the per-expert layout: written as stored, beside their block scales
    if cfg.expert_dtype == "fp8_block" and per_expert:
        stored = {k: np.asarray(jax.device_get(logical[k])) for k in (*SCALE_KEYS, *SCALE_KEYS.values())}
    p = {k: _np(v) for k, v in dequantize_weights(logical, layer_block(cfg.fp8_block), jnp.float32).items()}
    E, F = cfg.experts, cfg.ffn
    out: dict[str, np.ndarray] = {n.router[0]: p["router"].T}
    if cfg.router.shared_rows:  # the shared experts' rows after the routed ones (Inkling)
        out[n.router[0]] = np.concatenate([p["router"], p["router_shared"]], axis=1).T
    if cfg.router.mlp_width:  # a router MLP (Zaya): torch Linear [out, in]
        proj, proj_bias, carry, norm, fc1, fc1_bias, fc2, fc2_bias = n.router_mlp
        out.update({proj: p["router_in"].T, proj_bias: p["router_in_bias"], norm: p["router_norm"]})
        out.update({fc1: p["router_fc1"].T, fc1_bias: p["router_fc1_bias"]})
        out.update({fc2: p["router_fc2"].T, fc2_bias: p["router_fc2_bias"]})
        if cfg.router.carried_state:
            out[carry] = p["router_carry"]
    if cfg.router.gain:
        out[n.router_gain] = p["router_gain"]
    if cfg.router.bias:
        out[n.router_bias] = p["router_bias"]
    if cfg.router.input_scale:
        out[n.router_scale] = p["router_scale"]
    if cfg.router.expert_scale:
        out[n.expert_scale] = p["expert_scale"]
    if cfg.router.score_bias:
        out[n.score_bias[0]] = p["score_bias"][None] if mt == "ernie4_5_moe" else p["score_bias"]
    # the routed experts, in the family's saved layout
    g, u, d = p.get("w_gate"), p["w_up"], p["w_down"]  # [E, H, F], [E, H, F], [E, F, H]
    if n.expert_sets is not None:  # experts in sets (ERNIE-4.5-VL): the routers, biases and experts set by set
        out = _expert_sets(n, p, _set_widths(config, len(n.expert_sets)))
    elif not cfg.expert.gated:  # plain experts: up / down per expert, torch Linear [out, in]
        for e in range(E):
            up, down = (n.expert_key.format(e=e, p=part) for part in n.experts[1:])
            out[up], out[down] = u[e].T, d[e].T
            if cfg.expert.bias:  # beside each weight (NLLB-MoE's fc1 / fc2)
                out[up.removesuffix("weight") + "bias"] = p["b_up"][e]
                out[down.removesuffix("weight") + "bias"] = p["b_down"][e]
    elif n.fused == "interleaved":  # gpt-oss
        gu = np.empty((E, g.shape[1], 2 * F), np.float32)
        gu[..., 0::2], gu[..., 1::2] = g, u
        gub = np.empty((E, 2 * F), np.float32)
        gub[:, 0::2], gub[:, 1::2] = p["b_gate"], p["b_up"]
        out.update(
            {
                "experts.gate_up_proj": gu,
                "experts.down_proj": d,
                "experts.gate_up_proj_bias": gub,
                "experts.down_proj_bias": p["b_down"],
            }
        )
    elif n.stacked_names is not None:  # three stacked tensors, torch Linear [E, out, in] (Step-3.7's hub files)
        out.update({k: w.transpose(0, 2, 1) for k, w in zip(n.stacked_names, (g, u, d), strict=True)})
    elif n.fused == "dbrx":
        out.update(
            {
                "experts.mlp.w1": g.transpose(0, 2, 1).reshape(E * F, -1),
                "experts.mlp.v1": u.transpose(0, 2, 1).reshape(E * F, -1),
                "experts.mlp.w2": d.reshape(E * F, -1),
            }
        )
    elif n.fused == "input_linear":
        out.update(
            {
                "input_linear.weight": np.concatenate([g, u], axis=2).transpose(0, 2, 1),
                "output_linear.weight": d.transpose(0, 2, 1),
            }
        )
    elif n.hub_fused:  # fused as transformers writes it: [E, 2F, H] / [E, H, F], or transposed [E, H, 2F] / [E, F, H]
        gu, dn = n.fused_names
        if n.transposed:
            out.update({gu: np.concatenate([g, u], axis=2), dn: d})
        elif cfg.zero_experts and n.zero_expert_rows:  # gate / up rows for the zero-computation experts: zeros
            gate_up = np.concatenate([g, u], axis=2).transpose(0, 2, 1)
            pad = np.zeros((cfg.zero_experts, *gate_up.shape[1:]), np.float32)
            out.update({gu: np.concatenate([gate_up, pad]), dn: d.transpose(0, 2, 1)})
        elif n.fused_interleaved:  # gate and up rows alternating (Inkling 2's w13_weight)
            gate_up = np.stack([g, u], axis=3).reshape(E, g.shape[1], 2 * F)
            out.update({gu: gate_up.transpose(0, 2, 1), dn: d.transpose(0, 2, 1)})
        else:
            out.update({gu: np.concatenate([g, u], axis=2).transpose(0, 2, 1), dn: d.transpose(0, 2, 1)})
        if cfg.expert.bias:  # gate first
            out.update({f"{gu}_bias": np.concatenate([p["b_gate"], p["b_up"]], axis=1), f"{dn}_bias": p["b_down"]})
    else:  # per expert, torch Linear [out, in]
        for e in range(E):
            for name, hf, w in zip(SCALE_KEYS, n.experts, (g, u, d), strict=True):
                key = f"experts.{e}.{hf}.weight"
                if stored is None:
                    out[key] = w[e].T
                else:
                    out[key], out[f"{key}_scale_inv"] = stored[name][e].T, stored[SCALE_KEYS[name]][e].T
        for e in range(E, E + cfg.zero_experts * n.zero_expert_rows):  # gate / up loaded and never read: zeros
            out.update({f"experts.{e}.{hf}.weight": np.zeros((F, g.shape[1]), np.float32) for hf in n.experts[:2]})
    if cfg.shared is not None:
        prefix = n.shared[0]
        sg, su, sd = p.get("shared_w_gate"), p["shared_w_up"], p["shared_w_down"]  # [H, Fs], [H, Fs], [Fs, H]
        S, Fe = cfg.shared.count, cfg.shared.ffn
        stack = lambda w: w.T.reshape(S, Fe, -1)  # noqa: E731  [H, S·Fe] → [S, Fe, H]
        if n.shared_interleaved:
            gu = np.stack([stack(sg), stack(su)], axis=2).reshape(S, 2 * Fe, -1)
            out[f"{prefix}{n.shared_interleaved[0]}"] = gu
            out[f"{prefix}{n.shared_interleaved[1]}"] = stack(sd.T).transpose(0, 2, 1)
        elif n.shared_stacked:
            gn, un, dn = n.shared_stacked
            out.update({f"{prefix}{gn}": stack(sg), f"{prefix}{un}": stack(su)})
            out[f"{prefix}{dn}"] = sd.reshape(S, Fe, -1).transpose(0, 2, 1)
        elif n.shared_fused:
            out[f"{prefix}input_linear.weight"] = np.concatenate([sg, su], axis=1).T
            out[f"{prefix}output_linear.weight"] = sd.T
        elif n.shared_gate_up:
            out[f"{prefix}gate_up_proj.weight"] = np.concatenate([sg, su], axis=1).T
            out[f"{prefix}down_proj.weight"] = sd.T
        else:
            gn, un, dn = n.shared_names
            out.update({f"{prefix}{un}.weight": su.T, f"{prefix}{dn}.weight": sd.T})
            if sg is not None:
                out[f"{prefix}{gn}.weight"] = sg.T
        if cfg.shared.gated:
            out[n.shared_gate] = p["shared_gate"][None]
    if cfg.latent is not None:
        out[n.latent[0]], out[n.latent[2]] = p["latent_in"].T, p["latent_out"].T
        if cfg.latent.norm:
            out[n.latent[1]] = p["latent_norm"]
    if cfg.expert.out_norm_eps is not None:
        out[n.latent[3]] = p["expert_out_scale"]
    if cfg.output.bias:
        out[n.output_bias] = p["out_bias"]
    if cfg.output.norm:
        out[n.output_norm] = p["out_norm"]
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


def _set_widths(config: Mapping, sets: int) -> list[int]:
    """Each expert set's width from config.json (ERNIE-4.5-VL's ``moe_intermediate_size`` [text, vision])."""
    widths = family(config)[2].config.get("moe_intermediate_size")
    return [widths] * sets if isinstance(widths, int) else list(widths)


def _expert_sets(n, p: dict, widths: list[int]) -> dict[str, np.ndarray]:
    """The routers, selection biases and experts of a block with expert sets, each set at its own width (the
    layer's zero padding cut off): per set under its sub-block in the in-memory layout (``hub_fused``), else as the
    hub files hold them (routers transposed, biases stacked, experts per expert set after set)."""
    sets, router, bias = n.expert_sets, p["router"], p["score_bias"]
    Es = router.shape[1] // len(sets)
    out: dict[str, np.ndarray] = {}
    for i, prefix in enumerate(sets):
        part, Fs = slice(i * Es, (i + 1) * Es), widths[i]
        g, u, d = p["w_gate"][part, :, :Fs], p["w_up"][part, :, :Fs], p["w_down"][part, :Fs]
        if n.hub_fused:
            out[f"{prefix}gate.weight"] = router[:, part].T
            out[f"{prefix}gate.moe_statics.e_score_correction_bias"] = bias[part][None]
            out[f"{prefix}experts.gate_up_proj"] = np.concatenate([g, u], axis=2).transpose(0, 2, 1)
            out[f"{prefix}experts.down_proj"] = d.transpose(0, 2, 1)
            continue
        out[n.router[i]] = router[:, part]
        gn, un, dn = n.experts
        for j in range(Es):
            e = i * Es + j
            out.update({f"experts.{e}.{gn}.weight": g[j].T, f"experts.{e}.{un}.weight": u[j].T})
            out[f"experts.{e}.{dn}.weight"] = d[j].T
    if not n.hub_fused:
        out[n.score_bias[0]] = bias.reshape(len(sets), Es)
    return out


def save_moe_layers(folder, config: Mapping, blocks: Mapping[int, tuple[MoEConfig, dict]]) -> Path:
    """Write ``{layer: (MoEConfig, logical params)}`` as ``moe.safetensors`` under ``folder`` with full tensor names
    (``model.layers.{i}.mlp.…``, the family's prefix) and a ``model.safetensors.index.json`` naming the file, plus
    the model's ``config.json``: a checkpoint folder `load_moe_layers` (and transformers, merged with the rest of
    the model's tensors) reads. Returns the file written.

    Into a folder that already holds a checkpoint (its own index and config.json), the blocks are written beside
    it: the index keeps every tensor it names and points the blocks' names at ``moe.safetensors``, and config.json
    is kept as it is (it must describe the same model).

    Raises:
      ValueError: a layer that is not a MoE layer of ``config``, a block ``config`` does not describe
        (`check_block`), a folder whose config.json is another model's, or a ``moe.safetensors`` there that this
        function did not write.
    """
    from safetensors.numpy import save_file

    mt, fam, cfg_keys = family(config)
    ids = moe_layer_ids(config)
    bad = sorted(set(blocks) - set(ids), key=str)
    if bad:
        raise ValueError(
            f"save_moe_layers: layers {bad} are not MoE layers of this config.json (its MoE layers: {ids}); "
            "reloading would not find them"
        )
    for layer, (cfg, _) in blocks.items():
        check_block(config, cfg, layer=layer, where=f"save_moe_layers: layer {layer}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    index_path, config_path, path = (
        folder / "model.safetensors.index.json",
        folder / "config.json",
        folder / "moe.safetensors",
    )
    index = _existing_index(index_path)
    meta = index.get("metadata") or {}
    foreign = bool(index) and meta.get("written_by") != WRITER  # a checkpoint's own index: merged into, kept
    if path.exists() and (not index or (foreign and meta.get("moe_layers_by") != WRITER)):
        raise ValueError(f"save_moe_layers: {path} exists and was not written by save_moe_layers; give another folder")
    if foreign and config_path.exists():
        kept = read_json(config_path, "config.json")
        if not isinstance(kept, Mapping) or kept.get("model_type") != config.get("model_type"):
            raise ValueError(
                f"save_moe_layers: {config_path} is another model's config.json (model_type "
                f"{kept.get('model_type') if isinstance(kept, Mapping) else kept!r}, not {mt!r}); give another folder"
            )
    tensors: dict[str, np.ndarray] = {}
    for layer, (cfg, logical) in blocks.items():
        prefix = fam.prefixes_at(cfg_keys, layer)[0]
        siblings = {inside: outside.format(layer) for outside, inside in fam.siblings}
        for key, value in moe_to_hf(config, cfg, logical, layer=layer).items():
            inside = next((s for s in siblings if key.startswith(s)), None)
            name = siblings[inside] + key[len(inside) :] if inside else prefix + key
            tensors[name] = value
    save_file(tensors, str(path))
    if foreign:  # keep every tensor the checkpoint names; the blocks' names now point at moe.safetensors
        weight_map = {**index.get("weight_map", {}), **dict.fromkeys(tensors, path.name)}
        metadata = {**meta, "moe_layers_by": WRITER}
    else:
        weight_map, metadata = dict.fromkeys(tensors, path.name), {"written_by": WRITER}
    index_path.write_text(json.dumps({"metadata": metadata, "weight_map": weight_map}, indent=1))
    if not (foreign and config_path.exists()):
        config_path.write_text(json.dumps(_with_fp8(config, blocks), indent=1))
    return path


def _with_fp8(config: Mapping, blocks: Mapping) -> dict:
    """``config`` as written beside the blocks: with DeepSeek's ``quantization_config`` when FP8 experts are saved
    as stored and it has none (so loaders find their block size).

    Raises:
      ValueError: FP8 blocks whose block size is not the one ``config`` states, or that disagree."""
    sizes = {cfg.fp8_block for cfg, _ in blocks.values() if cfg.expert_dtype == "fp8_block"}
    out = dict(config)
    if not sizes:
        return out
    stated = fp8_block(config) if config.get("quantization_config") else None
    if len(sizes) > 1 or (stated is not None and stated not in sizes):
        raise ValueError(
            f"save_moe_layers: FP8 experts in {sorted(sizes)} blocks, config.json's quantization_config says "
            f"{stated}: one checkpoint has one weight_block_size; re-quantize the blocks to it (fp8.quantize_params)"
        )
    if stated is None:
        (b,) = sizes
        out["quantization_config"] = {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "activation_scheme": "dynamic",
            "weight_block_size": list(b),
        }
    return out


#: The ``written_by`` of the indexes `save_moe_layers` writes.
WRITER = "tempo_jax.hf.save_moe_layers"


def _existing_index(path: Path) -> dict:
    """The safetensors index already in the folder: its own, or — for a checkpoint of unindexed
    ``*.safetensors`` files — one built from their headers (``{}`` when the folder holds no checkpoint)."""
    if not path.exists():
        shards = sorted(p for p in path.parent.glob("*.safetensors") if p.name != "moe.safetensors")
        names = {name: shard.name for shard in shards for name in SafetensorsFile(shard).names()}
        return {"metadata": {}, "weight_map": names} if names else {}
    data = read_json(path, "safetensors index")
    if not isinstance(data, dict) or not isinstance(data.get("weight_map", {}), dict):
        raise ValueError(f"save_moe_layers: {path} is not a safetensors index (a JSON object with a 'weight_map')")
    return data
