"""`MoEConfig` presets: the MoE blocks of the models both papers serve, at their real dimensions.

    cfg = moe_preset("deepseek_v3", slots_per_rank=40)           # 256 experts + 64 replicas on 8 ranks
    small = moe_preset("gpt_oss_20b", slots_per_rank=4, experts=16, hidden=64, ffn=32)   # same block, smaller

The numbers and their sources live in `tempo_jax.workloads.models.MODEL_SPECS` (one spec per model, each naming
where it comes from: the model's config.json, CascadeEP's Table 1, or — stated — a library default or a third
party). ``experts`` / ``hidden`` / ``ffn`` / ``top_k`` overrides shrink a preset for tests and CPU runs while
keeping its router, expert variant and shared experts (a group-limited router keeps its number of groups).
"""

from __future__ import annotations

import dataclasses

from ..workloads.models import MODEL_SPECS, ModelSpec
from .config import MoEConfig
from .experts import ExpertConfig, SharedConfig
from .routing import RouterConfig

__all__ = ["MOE_PRESETS", "moe_preset", "preset_spec"]

#: Every preset name.
MOE_PRESETS: tuple[str, ...] = tuple(MODEL_SPECS)


def preset_spec(name: str) -> ModelSpec:
    """The `ModelSpec` of preset ``name`` (its dimensions, routing and source)."""
    if name not in MODEL_SPECS:
        raise ValueError(f"unknown MoE preset {name!r}; one of {list(MODEL_SPECS)}")
    return MODEL_SPECS[name]


def moe_preset(
    name: str,
    *,
    slots_per_rank: int,
    experts: int | None = None,
    top_k: int | None = None,
    hidden: int | None = None,
    ffn: int | None = None,
    **overrides,
) -> MoEConfig:
    """The `MoEConfig` of preset ``name`` (`MOE_PRESETS`) with ``slots_per_rank`` slots per rank.

    Args:
      experts, top_k, hidden, ffn: smaller (or other) dimensions; shared experts take ``ffn`` too.
      **overrides: any other `MoEConfig` field (dtype, dispatch_mode, capacity, ...), or a field of the preset's
        `RouterConfig` (``balance_rate``, ``score_bias``, ``scaling``, …) or `ExpertConfig` (``limit``, …) —
        ``moe_preset("deepseek_v3", slots_per_rank=40, balance_rate=1e-3)``.
    """
    spec = preset_spec(name)
    E = spec.experts if experts is None else experts
    F = spec.ffn if ffn is None else ffn
    router_fields = {f.name for f in dataclasses.fields(RouterConfig)}
    expert_fields = {f.name for f in dataclasses.fields(ExpertConfig)} - {"activation"}
    config_fields = {f.name for f in dataclasses.fields(MoEConfig)}
    on_router = {k: overrides.pop(k) for k in list(overrides) if k in router_fields and k not in config_fields}
    on_expert = {k: overrides.pop(k) for k in list(overrides) if k in expert_fields and k not in config_fields}
    if on_router.get("balance_rate") and "score_bias" not in on_router:
        on_router["score_bias"] = True  # aux-free balancing moves the score bias
    router = RouterConfig(**{**spec.router, **on_router})
    if router.n_group > 1 and E % router.n_group:
        raise ValueError(f"moe_preset({name!r}): experts={E} must be a multiple of its {router.n_group} groups")
    shared = None
    if spec.shared is not None:
        width = spec.shared["ffn"] if ffn is None else F
        shared = SharedConfig(count=spec.shared["count"], ffn=width, gated=spec.shared.get("gated", False))
    fields = dict(
        hidden=spec.hidden if hidden is None else hidden,
        ffn=F,
        experts=E,
        top_k=spec.top_k if top_k is None else top_k,
        slots_per_rank=slots_per_rank,
        router=router,
        expert=ExpertConfig(**{**spec.expert, **on_expert}),
        shared=shared,
    )
    unknown = set(overrides) - config_fields
    if unknown:
        raise ValueError(
            f"moe_preset({name!r}): unknown fields {sorted(unknown)}; give MoEConfig, RouterConfig or "
            "ExpertConfig fields"
        )
    return MoEConfig(**{**fields, **overrides})
