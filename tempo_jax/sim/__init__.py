"""Simulators on the solvers (numpy + solvers only, no jax).

- :mod:`.phase` — phase-diagram sweep: :class:`PhaseConfig`, :func:`run_phase` -> :class:`PhaseResult` (Figs. 6, 12).
- :mod:`.boundary` — analytic flip boundary B* (:func:`flip_boundary`) and the simulated flip band.
- :mod:`.regimes` — mixed-regime fraction vs batch size, synthetic and recorded (Fig. 5).
- :mod:`.summary` — "paper vs here" reductions.
- :mod:`.replay` — replay streams (recorded / drifting synthetic), replay placements, :func:`apply_split`.
- :mod:`.protocols` — replay protocols: policies (Tables 1, 4), information regimes (§5.5), refresh (Table 10),
  TEMPO variants (Tables 8, 9); :mod:`.replay_summary` reduces them to the paper's tables.
- :mod:`.ablation` — component ablation over the phase grid (Table 2).
- :mod:`.traffic` — inter-node traffic of flat vs topology-aware tables (§4.3, §5.15).
- :mod:`.cost_demo` — Fig. 1 worked example, Fig. 2 profiles, Table 6 n*, calibration demo.
"""

from .ablation import COMPONENTS, AblationResult, component_ablation
from .boundary import Boundary, effective_experts, flip_band, flip_boundary, in_band
from .cost_demo import calibration_demo, expert_profile, worked_example
from .phase import MODEL_SHAPES, POLICIES, Cell, PhaseConfig, PhaseResult, column_setup, run_phase
from .protocols import (
    STAGES,
    TERMS,
    VARIANTS,
    InformationConfig,
    PolicyConfig,
    RefreshConfig,
    ReplayConfig,
    VariantConfig,
    replay_stream,
    run_information,
    run_policies,
    run_refresh,
    run_variants,
)
from .regimes import RegimeCurve, regime_curve, synthetic_regime_curve, trace_regime_curve
from .replay import (
    Stream,
    SyntheticStreams,
    apply_split,
    make_streams,
    replay_placement,
    synthetic_stream,
    trace_streams,
)
from .traffic import TopologyConfig, topology_replay, topology_summary

__all__ = [
    "COMPONENTS",
    "MODEL_SHAPES",
    "POLICIES",
    "STAGES",
    "TERMS",
    "VARIANTS",
    "AblationResult",
    "Boundary",
    "Cell",
    "InformationConfig",
    "PhaseConfig",
    "PhaseResult",
    "PolicyConfig",
    "RefreshConfig",
    "RegimeCurve",
    "ReplayConfig",
    "Stream",
    "SyntheticStreams",
    "TopologyConfig",
    "VariantConfig",
    "apply_split",
    "calibration_demo",
    "column_setup",
    "component_ablation",
    "effective_experts",
    "expert_profile",
    "flip_band",
    "flip_boundary",
    "in_band",
    "make_streams",
    "regime_curve",
    "replay_placement",
    "replay_stream",
    "run_information",
    "run_phase",
    "run_policies",
    "run_refresh",
    "run_variants",
    "synthetic_regime_curve",
    "synthetic_stream",
    "topology_replay",
    "topology_summary",
    "trace_regime_curve",
    "trace_streams",
    "worked_example",
]
