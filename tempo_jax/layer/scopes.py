"""Names on the stages of a layer call, so a profile (`jax.profiler`, the compiled program's op names) reads as the
layer's steps: every operation a stage emits runs under ``jax.named_scope(<its name>)``.

| scope | the stage |
| --- | --- |
| ``moe_route`` | step 1: the router (`stages.route`) |
| ``moe_plan`` | the in-graph dispatch plan (relief, dynamic copies) |
| ``moe_dispatch`` | step 2: the fused dispatch + count kernel (`stages.dispatch_pairs`) |
| ``moe_tie`` | the replicas' weights tied (their gradients summed in the backward) |
| ``moe_pack`` | step 3: the pairs' rows packed into per-destination blocks |
| ``moe_exchange`` | step 3: the rows sent (block all-to-all, the ring's all-gather, the two-hop's hops) |
| ``moe_ffn`` | steps 4–5: the expert FFN (grouped GEMMs) |
| ``moe_return`` | step 6: the results back to their source (all-to-all, the ring's reduce-scatter) |
| ``moe_combine`` | step 7: each token's pairs weighted by their gates and summed |

A dropless call runs its rounds inside a loop, so a round's stages appear inside the loop's body under the same
names. The ring has no ``moe_pack`` or ``moe_combine`` (it sends whole tokens and adds each pair's weighted result
inside ``moe_ffn``); ``moe_tie`` emits work only where experts have replicas (their gradients' sum, in the backward).
The names are the layer's; `tempo_jax.layer.remat` names the values to save (`checkpoint_name`)."""

from __future__ import annotations

import functools

import jax

__all__ = ["STAGES", "scoped"]

#: Every stage scope of a layer call, in call order.
STAGES = (
    "moe_route",
    "moe_plan",
    "moe_dispatch",
    "moe_tie",
    "moe_pack",
    "moe_exchange",
    "moe_ffn",
    "moe_return",
    "moe_combine",
)


def scoped(name: str):
    """Decorator: run the function under ``jax.named_scope(name)`` (``name`` one of `STAGES`)."""
    if name not in STAGES:
        raise ValueError(f"scoped: {name!r} is not a stage of the layer; one of {list(STAGES)}")

    def wrap(fn):
        @functools.wraps(fn)
        def inner(*args, **kwargs):
            with jax.named_scope(name):
                return fn(*args, **kwargs)

        return inner

    return wrap
