"""The functional model: the expert-parallel MoE layer and everything it reads.

- `config`: `MoEConfig`, `make_ep_mesh`, `init_params`, `materialize`, `auto_capacity`, `capacity_bucket`.
- `stages`: the per-rank stages (route → dispatch → pack → exchange → expert FFN → return → combine).
- `exchange`: the padded and ragged all-to-all of block buffers.
- `tables`: dispatch tables and device placement arrays (trusted builders, validate once).
- `moe`: `moe_forward` (the `shard_map` core) and `moe_reference` (dense, one device).
- `module`: `MoE`, the flax nnx module (bucketed dropless capacity, drop counting).
- `cascade_exec` (in-graph) and `cascade_plan` (host-side, numpy): CascadeEP launch groups and OEWF fetches.
- `model`: a tiny MoE language model and its training loop.

Glossary: T tokens, H hidden, F expert FFN width, E logical experts, K top-k, D ranks, S slots per rank,
P = D·S, R replica columns, Gs source groups.
"""

from .config import MoEConfig, auto_capacity, capacity_bucket, init_params, make_ep_mesh, materialize
from .moe import MoEOutput, MoEStats, moe_forward, moe_reference
from .tables import PlacementArrays, Tables, placement_arrays

__all__ = [
    "MoEConfig",
    "MoEOutput",
    "MoEStats",
    "PlacementArrays",
    "Tables",
    "auto_capacity",
    "capacity_bucket",
    "init_params",
    "make_ep_mesh",
    "materialize",
    "moe_forward",
    "moe_reference",
    "placement_arrays",
]
