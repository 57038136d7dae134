"""A tiny decoder-only MoE language model on the layer (`tempo_jax.MoE`), and its training loop: what `tempo-jax
serve` serves and the tests train. It uses the layer, so it lives above it (`tempo_jax.layer` never imports it).

- `model`: `LMConfig`, `TinyMoELM`, `corpus` (the shipped byte-level text), `train` → `TrainResult`.
"""

from .model import LMConfig, TinyMoELM, TrainResult, corpus, train

__all__ = ["LMConfig", "TinyMoELM", "TrainResult", "corpus", "train"]
