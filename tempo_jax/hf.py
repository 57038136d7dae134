"""Hugging Face MoE blocks and checkpoints in and out of the layer: ``import tempo_jax.hf`` / ``from tempo_jax.hf import
load_moe_layers``. The code lives in `tempo_jax.layer.hf` (families, tensor layouts, FP8 / MXFP4, export)."""

from .layer import hf as _hf
from .layer.hf import *  # noqa: F403  (the same public names)

__all__ = list(_hf.__all__)
