"""Hugging Face MoE blocks and checkpoints in and out of the layer: ``import tempo_jax.hf`` / ``from tempo_jax.hf import
load_moe_layers``. The code lives in `tempo_jax.layer.hf` (families, tensor layouts, FP8 / MXFP4, export)."""

from .layer.hf import (
    FAMILIES,
    HFBlock,
    TrainingNoiseWarning,
    load_moe_layers,
    moe_config_from_hf,
    moe_from_hf,
    moe_layer_ids,
    moe_to_hf,
    resolve_placement,
    save_moe_layers,
)

__all__ = [
    "FAMILIES",
    "HFBlock",
    "TrainingNoiseWarning",
    "load_moe_layers",
    "moe_config_from_hf",
    "moe_from_hf",
    "moe_layer_ids",
    "moe_to_hf",
    "resolve_placement",
    "save_moe_layers",
]
