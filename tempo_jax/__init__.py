"""tempo-jax: makespan-aware MoE expert dispatch (TEMPO) and asynchronous expert execution (CascadeEP) in JAX.

Public names (imported on first use, so `import tempo_jax.workloads` / `tempo_jax.sim` stay numpy-only):
  MoE, MoEConfig                          the expert-parallel layer as a flax nnx module and its configuration
  moe_forward, moe_reference              the functional core (shard_map) and its dense single-device reference
  init_params, materialize, make_ep_mesh  logical parameters, physical replicas, a 1-D ``ep`` mesh
  Tables, PlacementArrays                 what `moe_forward` reads: dispatch tables and the device placement
  placement_arrays, tables                `solvers.Placement` → device arrays; the table builders (module)
  DispatchController                      the dispatch runtime: windows → solver (inline, thread or worker
                                          process) → tables, every fault counted
  Refresher, CounterWindows               counter snapshots → wrap-safe windows → the controller
  workloads, sim                          routing/request workloads and the simulators (modules)

Glossary (every package): T tokens, H hidden, F expert FFN width, E logical experts, K top-k, D EP ranks (GPUs),
S physical slots per rank, P = D·S, R replica columns, Gs source groups of a table; per rank the paper's G_g
activated experts, N_g tokens, T_g tiles. Batch sizes carry their unit (``tokens_per_gpu``, ``tokens_per_step``).
"""

import importlib

__version__ = "0.1.0"

_LAZY = {
    "MoE": "tempo_jax.module",
    "MoEConfig": "tempo_jax.moe",
    "moe_forward": "tempo_jax.moe",
    "moe_reference": "tempo_jax.moe",
    "make_ep_mesh": "tempo_jax.moe",
    "init_params": "tempo_jax.moe",
    "materialize": "tempo_jax.moe",
    "Tables": "tempo_jax.tables",
    "PlacementArrays": "tempo_jax.tables",
    "placement_arrays": "tempo_jax.tables",
    "DispatchController": "tempo_jax.controller",
    "Refresher": "tempo_jax.refresher",
    "CounterWindows": "tempo_jax.refresher",
}
_MODULES = ("tables", "workloads", "sim")

__all__ = sorted([*_LAZY, *_MODULES])


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _MODULES:
        return importlib.import_module(f"tempo_jax.{name}")
    raise AttributeError(f"module 'tempo_jax' has no attribute {name!r}")
