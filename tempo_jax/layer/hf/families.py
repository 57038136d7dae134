"""The MoE families by config.json: `family` (which one, and its MoE keys read as transformers reads them),
`moe_config_from_hf` (its `MoEConfig`, or a ValueError naming what the layer cannot express) and `moe_layer_ids`
(its MoE decoder layers). The families are `tempo_jax.layer.hf.catalog`, built from `tempo_jax.layer.hf.rules` and
`tempo_jax.layer.hf.spec`; the model types refused outright are `tempo_jax.layer.hf.refused`.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping

import jax.numpy as jnp

from ..config import MoEConfig
from .catalog import FAMILIES
from .refused import REFUSED
from .spec import Cfg, Family, TensorNames, TrainingNoiseWarning

__all__ = ["FAMILIES", "Family", "TrainingNoiseWarning", "TensorNames", "family", "moe_config_from_hf", "moe_layer_ids"]


def _nested(config: Mapping, path: str):
    """The object at dotted ``path`` of ``config`` ("" is ``config`` itself: a config that may be flat), or None."""
    for key in filter(None, path.split(".")):
        config = config.get(key) if isinstance(config, Mapping) else None
    return config if isinstance(config, Mapping) else None


def family(config) -> tuple[str, Family, Cfg]:
    """``(model_type, Family, Cfg of the MoE keys)`` of a config.json dict (a ValueError naming the families when
    the layer does not express it, and why when it cannot)."""
    if not isinstance(config, Mapping):
        raise ValueError(f"moe_from_hf: config must be the model's config.json as a dict, got {type(config).__name__}")
    mt = config.get("model_type")
    if mt in REFUSED:
        raise ValueError(f"moe_from_hf: the {mt} MoE block cannot be expressed by the layer: {REFUSED[mt]}")
    if mt not in FAMILIES:
        raise ValueError(
            f"moe_from_hf: model_type {mt!r} is not a MoE family the layer expresses; one of {sorted(FAMILIES)}"
        )
    fam = FAMILIES[mt]
    inner = config
    if fam.nested is not None:
        keys = (fam.nested,) if isinstance(fam.nested, str) else fam.nested
        inner = next((v for v in (_nested(config, k) for k in keys) if v is not None), None)
        if inner is None:
            raise ValueError(f"moe_from_hf: config.json of {mt!r} lacks its {' or '.join(map(repr, keys))} object")
    return mt, fam, Cfg(inner, mt)


def moe_config_from_hf(
    config: Mapping,
    *,
    slots_per_rank: int,
    dtype=jnp.float32,
    layer: int | None = None,
    sequence_length: int | None = None,
    **overrides,
) -> MoEConfig:
    """The `MoEConfig` of one MoE block of the model ``config`` (a config.json dict), see the module's table;
    ``layer``: the decoder layer, for a family whose top-k or constants are per layer (HunYuan's ``moe_topk``,
    Step-3.7's ``swiglu_limits``); ``sequence_length``: the tokens per sequence of the batches the layer will see,
    for a family whose routing counts per sequence (Switch Transformers' expert capacity: the layer's tokens are
    sequences of this length one after another).

    Raises:
      ValueError: unknown ``model_type``, a missing or mistyped key, or a block the layer cannot express.
    """
    mt, fam, c = family(config)
    c.layer, c.sequence = layer, sequence_length
    why = fam.refuse(c)
    if why:
        raise ValueError(f"moe_from_hf: the {mt} block cannot be expressed: {why}")
    for key, value in fam.noise(c).items():
        warnings.warn(
            f"moe_from_hf: {mt} {key}={value} is training-time noise; the layer computes the block as "
            "transformers does in eval mode, in training too",
            TrainingNoiseWarning,
            stacklevel=3,
        )
    fields = {"hidden": c.get("hidden_size", "d_model"), **fam.fields(c)}
    k = fields["top_k"]
    if isinstance(k, list | tuple):
        if layer is None or not 0 <= layer < len(k):
            raise ValueError(f"moe_from_hf: {mt}'s top-k is per layer ({list(k)[:8]}…): give layer= (0 … {len(k) - 1})")
        fields["top_k"] = k[layer]
    if isinstance(fields["top_k"], bool) or not isinstance(fields["top_k"], int):
        raise ValueError(f"moe_from_hf: {mt}'s top-k must be an integer, got {fields['top_k']!r}")
    fields.update(slots_per_rank=slots_per_rank, dtype=dtype)
    try:
        return MoEConfig(**{**fields, **overrides})
    except (TypeError, ValueError) as err:
        raise ValueError(f"moe_from_hf: the {mt} block cannot be expressed: {err}") from None


def moe_layer_ids(config: Mapping) -> list[int]:
    """The decoder layers of ``config`` whose MLP is a routed MoE block (DeepSeek-V4's hash-routed layers are not
    among them: the layer cannot express routing by token id)."""
    _, fam, c = family(config)
    return fam.layers(c)
