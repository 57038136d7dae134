"""Simulators on the solvers (numpy + solvers only, no jax): the experiments behind the notebooks.

Each experiment is a frozen config and a ``run_*`` function (cached on disk, worker processes with progress,
both through `tempo_jax.sim.runner`); the tables the notebooks print are reduced by `tempo_jax.sim.summary`
(phase diagram, regimes) and `tempo_jax.sim.replay_summary` (replay protocols).

- Phase diagram (Figs. 6, 12): `PhaseConfig`, `run_phase` → `PhaseResult`; `flip_boundary` (analytic B*).
- Component ablation (Table 2): `component_ablation`; TEMPO variants in `TEMPO_VARIANTS`.
- Mixed regimes (Fig. 5): `synthetic_regime_curve`, `trace_regime_curve`.
- Replay protocols (Tables 1, 4, 8–10; §5.5): `PolicyConfig` / `run_policies`, `InformationConfig` /
  `run_information`, `RefreshConfig` / `run_refresh`, `VariantConfig` / `run_variants`; `SyntheticStreams`.
- Topology traffic (§4.3): `TopologyConfig`, `topology_replay`.
- Theorem 2 (§3.1, App. A.4): `EpsilonConfig`, `ProbeConfig`, `run_theorem2` → `Theorem2Result`,
  `theorem2_table` (A3's additive gap ε and its tightness; ``python -m tempo_jax.sim.theorem2``).
- Cost-model demos (Fig. 1b, Fig. 2, calibration): `worked_example`, `expert_profile`, `calibration_demo`.
- CascadeEP request level: `simulate_prefill` (placement over DP attention replicas with prefix caches, chunked-prefill
  batches, lockstep steps, TTFT) → `PrefillResult`; `StepBatch` is what a step-time model receives.
- CascadeEP prefill (Figs. 1, 6–9): `CascadeConfig`, `run_cascade` → ``{mode: CascadeRun}`` over `LAYER_MODES`
  (Sync, Async, Async+SF, CascadeEP), `run_cascade_seeds` over seeds; `prefill_costs` derives a deployment's costs;
  `layer_timeline` one layer (the scalar reference), `step_timeline` every layer of a step (the fast one).

Glossary: D ranks (GPUs), E experts, K top-k; batch sizes carry their unit (``tokens_per_gpu`` in the phase
diagram, ``tokens_per_step`` across the EP group in the replays).
"""

from .ablation import AblationResult, component_ablation
from .boundary import Boundary, flip_boundary
from .cascade import CascadeConfig, CascadeRun, run_cascade, run_cascade_seeds
from .cascade_fast import step_timeline
from .cascade_layer import LAYER_MODES, LayerInputs, layer_timeline
from .cost_demo import calibration_demo, expert_profile, worked_example
from .phase import MODEL_SHAPES, PHASE_POLICIES, PhaseConfig, PhaseResult, run_phase
from .prefill import prefill_costs
from .protocols import (
    InformationConfig,
    PolicyConfig,
    RefreshConfig,
    ReplayConfig,
    VariantConfig,
    run_information,
    run_policies,
    run_refresh,
    run_variants,
)
from .regimes import RegimeCurve, synthetic_regime_curve, trace_regime_curve
from .replay import SyntheticStreams
from .requests import PLACEMENT_POLICIES, PrefillResult, StepBatch, simulate_prefill
from .theorem2 import EpsilonConfig, ProbeConfig, Theorem2Result, run_theorem2, theorem2_table
from .traffic import TopologyConfig, topology_replay
from .variants import TEMPO_VARIANTS

__all__ = [
    "LAYER_MODES",
    "MODEL_SHAPES",
    "PHASE_POLICIES",
    "PLACEMENT_POLICIES",
    "TEMPO_VARIANTS",
    "AblationResult",
    "Boundary",
    "CascadeConfig",
    "CascadeRun",
    "EpsilonConfig",
    "InformationConfig",
    "LayerInputs",
    "PhaseConfig",
    "PhaseResult",
    "PolicyConfig",
    "ProbeConfig",
    "RefreshConfig",
    "RegimeCurve",
    "ReplayConfig",
    "PrefillResult",
    "StepBatch",
    "SyntheticStreams",
    "Theorem2Result",
    "TopologyConfig",
    "VariantConfig",
    "calibration_demo",
    "component_ablation",
    "expert_profile",
    "flip_boundary",
    "layer_timeline",
    "step_timeline",
    "prefill_costs",
    "run_cascade",
    "run_cascade_seeds",
    "run_information",
    "run_phase",
    "run_policies",
    "run_refresh",
    "run_theorem2",
    "run_variants",
    "simulate_prefill",
    "synthetic_regime_curve",
    "theorem2_table",
    "topology_replay",
    "trace_regime_curve",
    "worked_example",
]
