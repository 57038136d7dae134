"""tempo-jax: makespan-aware MoE expert dispatch (TEMPO) and asynchronous expert execution (CascadeEP) in JAX.

The rooms (imports point down only: cli → repro → runtime → lm → metrics → layer → workloads → text; sim →
workloads):

  layer/      the functional model: `MoEConfig`, `moe_forward`, `MoE`, stages, exchange, tables, CascadeEP execution
  lm/         a tiny MoE language model on the layer and its training loop
  metrics/    expert load you can watch: step records → Prometheus, TensorBoard, JSON lines; stalls; report PNGs
  runtime/    the dispatch runtime: `DispatchController`, counters, `Refresher`, the serve loop, calibration
  sim/        numpy simulators, one room per paper: tempo/ (phase diagram, replays), cascade/ (CascadeEP prefill)
  workloads/  routing recordings, request traces, synthetic streams
  repro/      notebook `Recorder`, the rendered result tables, `reproduce`
  cli/        the `tempo-jax` command line and the demo
  text.py     text tables

Public names (imported on first use, so `import tempo_jax.workloads` / `tempo_jax.sim` stay numpy-only):
  MoE, MoEConfig                          the expert-parallel layer as a flax nnx module and its configuration
  moe_forward, moe_reference              the functional core (shard_map) and its dense single-device reference
  init_params, make_ep_mesh               physical parameters (each rank its own slots), a 1-D ``ep`` mesh
  make_mesh                               a ``data × ep × tensor`` mesh (`tempo_jax.layer.mesh`)
  to_physical, to_logical                 the two parameter layouts: physical [P, ...] (the layer's), logical
                                          [E, ...] (import / export, `moe_reference`)
  Placement                               `solvers.Placement`: which slot holds which expert
  Tables, PlacementArrays                 what `moe_forward` reads: dispatch tables and the device placement
  placement_arrays                        `solvers.Placement` → device arrays (the table builders:
                                          `tempo_jax.layer.tables`)
  DispatchController                      the dispatch runtime: windows → solver (inline, thread or worker
                                          process) → tables, every fault counted
  Refresher, CounterWindows               counter snapshots → wrap-safe windows → the controller
  hf                                      Hugging Face MoE blocks and checkpoints into the layer
                                          (`tempo_jax.layer.hf`: moe_from_hf, load_moe_layers)
  moe_preset                              `MoEConfig` presets of the papers' models (`tempo_jax.layer.presets`)
  aux_losses                              the MoE layers' load-balancing and z losses of a model, summed over
                                          layers and calls (read them in the loss function)
  restore_target                          the orbax restore target of a model whose MoE layers were re-placed

Shapes and letters: the one glossary of docs/architecture.md, for every package. Batch sizes carry their unit
(``tokens_per_gpu``, ``tokens_per_step``)."""

import importlib

__version__ = "0.1.0"

_LAZY = {
    "MoE": "tempo_jax.layer.module",
    "MoEConfig": "tempo_jax.layer.config",
    "moe_forward": "tempo_jax.layer.moe",
    "moe_reference": "tempo_jax.layer.moe",
    "make_ep_mesh": "tempo_jax.layer.config",
    "make_mesh": "tempo_jax.layer.mesh",
    "init_params": "tempo_jax.layer.params",
    "init_logical_params": "tempo_jax.layer.params",
    "to_physical": "tempo_jax.layer.params",
    "to_logical": "tempo_jax.layer.params",
    "Placement": "solvers",
    "Tables": "tempo_jax.layer.tables",
    "PlacementArrays": "tempo_jax.layer.tables",
    "placement_arrays": "tempo_jax.layer.tables",
    "DispatchController": "tempo_jax.runtime.controller",
    "Refresher": "tempo_jax.runtime.refresher",
    "CounterWindows": "tempo_jax.runtime.counters",
    "moe_preset": "tempo_jax.layer.presets",
    "aux_losses": "tempo_jax.layer.module",
    "restore_target": "tempo_jax.layer.checkpoint",
}
_MODULES = {
    name: f"tempo_jax.{name}" for name in ("cli", "layer", "metrics", "repro", "runtime", "sim", "text", "workloads")
}
_MODULES["hf"] = "tempo_jax.hf"

__all__ = sorted([*_LAZY, *_MODULES])


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _MODULES:
        return importlib.import_module(_MODULES[name])
    raise AttributeError(f"module 'tempo_jax' has no attribute {name!r}")
