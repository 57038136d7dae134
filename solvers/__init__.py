"""tempo-jax solvers: cost models, calibration, placement and dispatch policies (numpy/scipy/ortools; no jax).

This package must stay importable in a light numpy-only worker process (TEMPO §4.4).
"""

from .cost import PRESETS, CostModel, gpu_loads
from .eplb import rebalance_experts
from .fit import FitReport, fit_max_affine
from .placement import Placement, drift_corrupt, static_map
from .policies import semi_matching, semi_matching_value
from .problem import Dispatch, DispatchProblem
from .solve import POLICIES, solve
from .topology import flat_split, inter_node_tokens, node_counts_from_sources, split_tables, topology_split

__all__ = [
    "POLICIES",
    "PRESETS",
    "CostModel",
    "Dispatch",
    "DispatchProblem",
    "FitReport",
    "flat_split",
    "inter_node_tokens",
    "node_counts_from_sources",
    "split_tables",
    "topology_split",
    "Placement",
    "drift_corrupt",
    "fit_max_affine",
    "gpu_loads",
    "rebalance_experts",
    "semi_matching",
    "semi_matching_value",
    "solve",
    "static_map",
]
