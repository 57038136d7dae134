"""Simulators on the solvers (numpy + solvers only, no jax): the experiments behind the notebooks, one room per paper.

- `tempo_jax.sim.tempo` — TEMPO: the phase diagram (`PhaseConfig`, `run_phase`, `flip_boundary`; Figs. 6, 12), the
  component ablation (`component_ablation`, Table 2), the regime map (`synthetic_regime_curve`, Fig. 5), the replay
  protocols (`PolicyConfig` / `run_policies`, … Tables 1, 4, 8–10), topology traffic (§4.3), Theorem 2's gap
  (`run_theorem2`) and the cost-model demos.
- `tempo_jax.sim.cascade` — CascadeEP prefill: `CascadeConfig`, `run_cascade` → ``{mode: CascadeRun}`` over
  `LAYER_MODES` (Sync, Async, Async+SF, CascadeEP), `simulate_prefill` (requests on data-parallel attention
  replicas), `layer_timeline` (one layer, the reference) and `step_timeline` (every layer of a step, the fast one).
- `tempo_jax.sim.runner` — what both share: the on-disk cache (`cached`, keyed by `fingerprint()` of the code), worker
  processes with progress (`run_jobs`) and `bootstrap_ci`.

The rooms import nothing of each other. Each experiment is a frozen config and a ``run_*`` function; this package
re-exports the names a notebook needs.
"""

from .cascade import (
    LAYER_MODES,
    PLACEMENT_POLICIES,
    CascadeConfig,
    CascadeRun,
    LayerInputs,
    PrefillResult,
    StepBatch,
    layer_timeline,
    prefill_costs,
    run_cascade,
    run_cascade_seeds,
    simulate_prefill,
    step_timeline,
)
from .tempo.ablation import AblationResult, component_ablation
from .tempo.boundary import Boundary, flip_boundary
from .tempo.cost_demo import calibration_demo, expert_profile, worked_example
from .tempo.phase import MODEL_SHAPES, PHASE_POLICIES, PhaseConfig, PhaseResult, run_phase
from .tempo.protocols import (
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
from .tempo.regime_map import RegimeCurve, synthetic_regime_curve, trace_regime_curve
from .tempo.replay import SyntheticStreams
from .tempo.theorem2 import EpsilonConfig, ProbeConfig, Theorem2Result, run_theorem2, theorem2_table
from .tempo.traffic import TopologyConfig, topology_replay
from .tempo.variants import TEMPO_VARIANTS

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
