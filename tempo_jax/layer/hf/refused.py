"""The MoE model types of transformers 5.24 whose block the layer cannot express, each with the mechanism it lacks.

Read from each type's modeling file (the router, the experts and what the block adds around them); `family` raises
with the reason, and docs/hf.md's coverage table lists them beside the handled ones
(`scripts/hf_coverage.py`, `tests/test_hf_coverage.py`). A type whose block becomes expressible moves to
`tempo_jax.layer.hf.families.FAMILIES` with a fixture of its own.
"""

from __future__ import annotations

__all__ = ["REFUSED"]


#: model_type → the mechanism the layer lacks (the refusal's reason)
REFUSED: dict[str, str] = {
    "vitpose_backbone": "not a routed MoE: the expert is chosen by the dataset_index input, not by a learned router",
}
