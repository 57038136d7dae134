"""tempo-jax: makespan-aware MoE expert dispatch (TEMPO) and asynchronous expert execution (CascadeEP) in JAX.

Public names (imported on first use, so `import tempo_jax.workloads` stays numpy-only):
  MoE, MoEConfig, moe_forward, moe_reference, make_ep_mesh   the expert-parallel layer (`tempo_jax.moe`)
  DispatchController                                        hosts the solver beside the layer
  tables                                                    dispatch tables from solver output
  workloads                                                 routing recordings and synthetic routing
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
    "DispatchController": "tempo_jax.controller",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tempo_jax' has no attribute {name!r}")
