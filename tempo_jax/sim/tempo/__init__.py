"""The TEMPO simulators (TEMPO §2–5, App. A): expert time under the two-regime cost model, per batch and over streams.

Modules (each imports only `tempo_jax.sim.runner`, the solvers and the ones above it):

- `phase` (`PhaseConfig`, `run_phase`: the phase diagram's cells, Figs. 6, 12), `boundary` (the analytic flip batch
  B*), `flipscan` (the flip on a fine grid), `diagnose` (one cell's dispatches side by side).
- `variants` (`TEMPO_VARIANTS`: TEMPO's stages switched off one by one), `ablation` (`component_ablation`, Table 2).
- `regime_map` (Fig. 5: the share of mixed batches against tokens per GPU), `phase_summary` (the phase diagram's and
  the regime map's "paper vs here" rows).
- `replay` (streams of batches and the placements a policy refreshes), `protocols` (Tables 1, 4, 8–10, §5.5: the
  replay protocols' configs and runs), `replay_summary` (their tables).
- `traffic` (§4.3: per-link bytes on a topology), `tiles` (the GEMM tile study), `theorem2` (§3.1, App. A.4: the
  additive gap ε), `cost_demo` (Fig. 1b, Fig. 2, calibration).

numpy + solvers only (no jax).
"""

from .ablation import AblationResult, component_ablation
from .boundary import Boundary, flip_boundary
from .cost_demo import calibration_demo, expert_profile, worked_example
from .phase import MODEL_SHAPES, PHASE_POLICIES, PhaseConfig, PhaseResult, run_phase
from .protocols import (
    InformationConfig,
    PolicyConfig,
    RefreshConfig,
    ReplayConfig,
    VariantConfig,
    information_tables,
    run_information,
    run_policies,
    run_refresh,
    run_variants,
)
from .regime_map import RegimeCurve, synthetic_regime_curve, trace_regime_curve
from .replay import SyntheticStreams
from .theorem2 import EpsilonConfig, ProbeConfig, Theorem2Result, run_theorem2, theorem2_table
from .traffic import TopologyConfig, topology_replay
from .variants import TEMPO_VARIANTS

__all__ = [
    "MODEL_SHAPES",
    "PHASE_POLICIES",
    "TEMPO_VARIANTS",
    "AblationResult",
    "Boundary",
    "EpsilonConfig",
    "InformationConfig",
    "PhaseConfig",
    "PhaseResult",
    "PolicyConfig",
    "ProbeConfig",
    "RefreshConfig",
    "RegimeCurve",
    "ReplayConfig",
    "SyntheticStreams",
    "Theorem2Result",
    "TopologyConfig",
    "VariantConfig",
    "calibration_demo",
    "component_ablation",
    "expert_profile",
    "flip_boundary",
    "information_tables",
    "run_information",
    "run_phase",
    "run_policies",
    "run_refresh",
    "run_theorem2",
    "run_variants",
    "synthetic_regime_curve",
    "theorem2_table",
    "topology_replay",
    "trace_regime_curve",
    "worked_example",
]
