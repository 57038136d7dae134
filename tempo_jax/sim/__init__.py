"""Simulators on the solvers (numpy + solvers only, no jax).

- :mod:`.phase` — phase-diagram sweep: :class:`PhaseConfig`, :func:`run_phase` -> :class:`PhaseResult` (Figs. 6, 12).
- :mod:`.boundary` — analytic flip boundary B* (:func:`flip_boundary`) and the simulated flip band.
- :mod:`.regimes` — mixed-regime fraction vs batch size, synthetic and recorded (Fig. 5).
- :mod:`.summary` — "paper vs here" reductions.
"""

from .boundary import Boundary, effective_experts, flip_band, flip_boundary, in_band
from .phase import MODEL_SHAPES, POLICIES, Cell, PhaseConfig, PhaseResult, column_setup, run_phase
from .regimes import RegimeCurve, regime_curve, synthetic_regime_curve, trace_regime_curve

__all__ = [
    "MODEL_SHAPES",
    "POLICIES",
    "Boundary",
    "Cell",
    "PhaseConfig",
    "PhaseResult",
    "RegimeCurve",
    "column_setup",
    "effective_experts",
    "flip_band",
    "flip_boundary",
    "in_band",
    "regime_curve",
    "run_phase",
    "synthetic_regime_curve",
    "trace_regime_curve",
]
