"""Hugging Face MoE blocks and checkpoints into the layer (`tempo_jax.hf`).

    block = moe_from_hf(config, state, mesh=mesh)            # one MoE block's tensors → HFBlock(config, params,
                                                             #   placement): physical params, sharded over ep
    layers = load_moe_layers("path/to/checkpoint", mesh=mesh)  # {layer: HFBlock}, each process reading its slots

``config`` is the model's config.json as a dict (``model_type`` included); ``state`` one MoE block's tensors with
keys relative to the block (``gate.weight``, ``experts.0.gate_proj.weight``, …).

- `families`: config.json → `MoEConfig` for each family, and which decoder layers are MoE; the families themselves
  are `catalog` (one entry each), composed from `rules` (what several families share) over `spec` (`Family`,
  `TensorNames`, the config reader).
- `tensors`: where each parameter sits in a block's tensors (both layouts), read lazily per expert.
- `load`: `moe_from_hf`, `load_moe_layers`, the placement an import lays its experts over.
- `quant`: FP8 block-scaled and MXFP4 dequantization, and the safetensors reader that sees those dtypes.
- `export`: `moe_to_hf`, `save_moe_layers` (back to the layout transformers saves).
- `refused`: the MoE model types the layer cannot express, each with the mechanism it lacks (`REFUSED`).
"""

from .export import moe_to_hf, save_moe_layers
from .families import FAMILIES, TrainingNoiseWarning, moe_config_from_hf, moe_layer_ids
from .load import HFBlock, load_moe_layers, moe_from_hf, resolve_placement
from .refused import REFUSED

__all__ = [
    "FAMILIES",
    "HFBlock",
    "REFUSED",
    "TrainingNoiseWarning",
    "load_moe_layers",
    "moe_config_from_hf",
    "moe_from_hf",
    "moe_layer_ids",
    "moe_to_hf",
    "resolve_placement",
    "save_moe_layers",
]
