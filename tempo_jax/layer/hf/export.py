"""The layer back to Hugging Face: a block's tensors in the layout transformers itself saves (`moe_to_hf`), and a
folder of every MoE layer's tensors for a checkpoint (`save_moe_layers`), so a model fine-tuned here loads into
transformers again. The inverse of `tempo_jax.layer.hf.tensors`: ``load → export → load`` is the identity, and an
export of what transformers wrote equals its tensors (`tests/test_hf_import.py`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import jax
import numpy as np

from ..config import MoEConfig
from ..params import check_params
from .families import family

__all__ = ["moe_to_hf", "save_moe_layers"]


def _np(a) -> np.ndarray:
    return np.asarray(jax.device_get(a)).astype(np.float32)


def moe_to_hf(config: Mapping, cfg: MoEConfig, logical: dict) -> dict[str, np.ndarray]:
    """One MoE block's *logical* parameters (`tempo_jax.layer.to_logical`, `MoE.logical_params`) → its tensors in
    the layout transformers saves for ``config``'s family, keys relative to the block (``gate.weight``,
    ``experts.0.gate_proj.weight``, …), float32 numpy.

    Raises:
      ValueError: a family the layer does not express, or parameters that do not match ``cfg``.
    """
    mt, fam, _ = family(config)
    check_params(logical, cfg, num_slots=None, where="moe_to_hf")
    n = fam.names
    p = {k: _np(v) for k, v in logical.items()}
    E, F = cfg.experts, cfg.ffn
    out: dict[str, np.ndarray] = {n.router[0]: p["router"].T}
    if cfg.router.bias:
        out[n.router_bias] = p["router_bias"]
    if cfg.router.input_scale:
        out[n.router_scale] = p["router_scale"]
    if cfg.router.expert_scale:
        out[n.expert_scale] = p["expert_scale"]
    if cfg.router.score_bias:
        out[n.score_bias[0]] = p["score_bias"][None] if mt == "ernie4_5_moe" else p["score_bias"]
    # the routed experts, in the family's saved layout
    g, u, d = p["w_gate"], p["w_up"], p["w_down"]  # [E, H, F], [E, H, F], [E, F, H]
    if n.fused == "interleaved":  # gpt-oss
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
        else:
            out.update({gu: np.concatenate([g, u], axis=2).transpose(0, 2, 1), dn: d.transpose(0, 2, 1)})
        if cfg.expert.bias:  # gate first
            out.update({f"{gu}_bias": np.concatenate([p["b_gate"], p["b_up"]], axis=1), f"{dn}_bias": p["b_down"]})
    else:  # per expert, torch Linear [out, in]
        gn, un, dn = n.experts
        for e in range(E):
            out[f"experts.{e}.{gn}.weight"] = g[e].T
            out[f"experts.{e}.{un}.weight"] = u[e].T
            out[f"experts.{e}.{dn}.weight"] = d[e].T
    if cfg.shared is not None:
        prefix = n.shared[0]
        sg, su, sd = p["shared_w_gate"], p["shared_w_up"], p["shared_w_down"]  # [H, Fs], [H, Fs], [Fs, H]
        if n.shared_fused:
            out[f"{prefix}input_linear.weight"] = np.concatenate([sg, su], axis=1).T
            out[f"{prefix}output_linear.weight"] = sd.T
        else:
            gn, un, dn = n.shared_names
            out.update({f"{prefix}{gn}.weight": sg.T, f"{prefix}{un}.weight": su.T, f"{prefix}{dn}.weight": sd.T})
        if cfg.shared.gated:
            out[n.shared_gate] = p["shared_gate"][None]
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


def save_moe_layers(folder, config: Mapping, blocks: Mapping[int, tuple[MoEConfig, dict]]) -> Path:
    """Write ``{layer: (MoEConfig, logical params)}`` as ``moe.safetensors`` under ``folder`` with full tensor names
    (``model.layers.{i}.mlp.…``, the family's prefix) and a ``model.safetensors.index.json`` naming the file, plus
    the model's ``config.json``: a checkpoint folder `load_moe_layers` (and transformers, merged with the rest of
    the model's tensors) reads. Returns the file written."""
    from safetensors.numpy import save_file

    mt, fam, _ = family(config)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, np.ndarray] = {}
    for layer, (cfg, logical) in blocks.items():
        prefix = fam.prefixes[0].format(layer)
        siblings = {inside: outside.format(layer) for outside, inside in fam.siblings}
        for key, value in moe_to_hf(config, cfg, logical).items():
            inside = next((s for s in siblings if key.startswith(s)), None)
            name = siblings[inside] + key[len(inside) :] if inside else prefix + key
            tensors[name] = value
    path = folder / "moe.safetensors"
    save_file(tensors, str(path))
    index = {
        "metadata": {"written_by": "tempo_jax.hf.save_moe_layers"},
        "weight_map": dict.fromkeys(tensors, path.name),
    }
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    (folder / "config.json").write_text(json.dumps(dict(config), indent=1))
    return path
