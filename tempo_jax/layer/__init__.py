"""The functional model: the expert-parallel MoE layer and everything it reads.

- `config`: `MoEConfig`, `make_ep_mesh`, `auto_capacity`, `capacity_bucket`.
- `mesh`: the mesh axes a layer uses (expert, batch, tensor, FSDP: `LayerAxes`), where each parameter lives
  (`param_shardings`) and `make_mesh` (``data × ep × tensor``).
- `params`: the parameters' two layouts — physical ``[P, ...]`` sharded over ``ep`` (the layer's: `init_params`,
  `to_physical`) and logical ``[E, ...]`` (import / export: `init_logical_params`, `to_logical`).
- `replicas`: replicas' gradients tied per group; placement changes that migrate weights (`plan_migration`).
- `stages`: the per-rank stages (route → dispatch → pack → exchange → expert FFN → return → combine).
- `exchange`: the padded and ragged all-to-all of block buffers; `ring`: the ring instead (``exchange="ring"``:
  all-gather, local experts, reduce-scatter).
- `remat`: the layer's named save points (`remat.save_exchanges`: a ``jax.checkpoint`` policy whose backward repeats
  no exchange).
- `tables`: dispatch tables and device placement arrays (trusted builders, validate once).
- `relief`: the in-graph dispatch (``MoEConfig(dispatch="ingraph")``): each batch's tables from its own counts.
- `moe`: `moe_forward` (the `shard_map` core) and `moe_reference` (dense, one device); `reduce_aux` (a scanned stack's
  routing statistics, ``aux_losses="local"``, reduced in one collective).
- `module`: `MoE`, the flax nnx module (bucketed dropless capacity, drop counting).
- `checkpoint`: `restore_target`, the orbax restore target of a model whose layers were re-placed.
- `cascade_exec` (in-graph) and `cascade_plan` (host-side, numpy): CascadeEP launch groups and OEWF fetches.
- `fp8`: FP8 experts in DeepSeek's block-scaled format (``MoEConfig(expert_dtype="fp8_block")``): `fp8.quantize`,
  `fp8.dequantize`, `fp8.quantize_params`.
"""

from . import fp8, remat
from .checkpoint import restore_target
from .config import MoEConfig, auto_capacity, capacity_bucket, make_ep_mesh
from .mesh import LayerAxes, layer_axes, make_mesh, param_shardings
from .module import aux_losses
from .moe import MoEAux, MoEAuxParts, MoEOutput, MoEStats, ShardStats, moe_forward, moe_reference, reduce_aux
from .params import init_logical_params, init_params, to_logical, to_physical
from .replicas import MigrationReport, plan_migration
from .tables import PlacementArrays, Tables, placement_arrays

__all__ = [
    "LayerAxes",
    "MigrationReport",
    "MoEAux",
    "MoEAuxParts",
    "MoEConfig",
    "MoEOutput",
    "MoEStats",
    "PlacementArrays",
    "ShardStats",
    "Tables",
    "auto_capacity",
    "aux_losses",
    "capacity_bucket",
    "fp8",
    "init_logical_params",
    "init_params",
    "layer_axes",
    "make_ep_mesh",
    "make_mesh",
    "moe_forward",
    "moe_reference",
    "param_shardings",
    "placement_arrays",
    "plan_migration",
    "reduce_aux",
    "remat",
    "restore_target",
    "to_logical",
    "to_physical",
]
