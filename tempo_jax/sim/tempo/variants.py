"""TEMPO variants for the ablations: one registry for Table 2 (components), Table 8 (stages) and Table 9 (terms).

A variant is (objective, tempo options): the solver sees the cost model transformed by the objective and runs
`solvers.solve(..., "tempo", **options)`; every variant is scored under the full model. numpy + solvers only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from solvers import CostModel

__all__ = ["COMPONENTS", "COMPONENT_BASELINES", "OBJECTIVES", "STAGES", "TEMPO_VARIANTS", "TERMS", "variant_problem"]


def _no_floor(cost: CostModel) -> CostModel:
    return dataclasses.replace(cost, a=0.0, b=0.0, b2=None)


#: Objectives a variant may optimise: the full model, without the traffic piece (what the grouped-GEMM
#: calibration fits), without the activation floor (a tokens-only model).
OBJECTIVES: dict[str, Callable[[CostModel], CostModel]] = {
    "full": lambda c: c,
    "no_traffic": CostModel.kernel_only,
    "no_floor": _no_floor,
}

#: name → (objective, tempo options).
TEMPO_VARIANTS: dict[str, tuple[str, dict]] = {
    # Table 2: full TEMPO with one component switched off. The target repair (ours, beyond the paper) runs
    # inside the ensemble step, so "no ensemble" removes both: see COMPONENT_BASELINES.
    "no partial moves": ("full", {"partial_moves": False}),
    "no aug. chains": ("full", {"chains": False}),
    "no ensemble": ("full", {"ensemble": False}),
    "no repair": ("full", {"repair": False}),
    # Table 8: cumulative stages, then seed + local search without chains.
    "seed": ("full", {"chains": False, "local_search": False, "ensemble": False}),
    "+chains": ("full", {"chains": True, "local_search": False, "ensemble": False}),
    "+local": ("full", {"ensemble": False}),
    "+ensemble": ("full", {}),
    "seed+local": ("full", {"chains": False, "ensemble": False}),
    # Table 9: objectives with a cost term deleted.
    "drop_traffic": ("no_traffic", {}),
    "drop_floor": ("no_floor", {}),
}
#: Table 2 rows (the paper's three, then the target repair).
COMPONENTS: tuple[str, ...] = ("no partial moves", "no aug. chains", "no ensemble", "no repair")
#: What each Table 2 row's degradation is measured against (default: full TEMPO). The repair needs the
#: ensemble's candidates, so switching the ensemble off also switches the repair off; measuring "no ensemble"
#: against "no repair" charges it the ensemble alone, and the "no repair" row charges the repair.
COMPONENT_BASELINES: dict[str, str] = {"no ensemble": "no repair"}
#: Table 8 rows.
STAGES: tuple[str, ...] = ("seed", "+chains", "+local", "+ensemble", "seed+local")
#: Table 9 rows (``+ensemble`` is the full objective).
TERMS: tuple[str, ...] = ("+ensemble", "drop_traffic", "drop_floor")


def variant_problem(name: str, cost: CostModel) -> tuple[CostModel, dict]:
    """``(cost model the solver sees, tempo options)`` of variant ``name``."""
    if name not in TEMPO_VARIANTS:
        raise ValueError(f"unknown TEMPO variant {name!r}; valid: {sorted(TEMPO_VARIANTS)}")
    objective, options = TEMPO_VARIANTS[name]
    return OBJECTIVES[objective](cost), dict(options)
