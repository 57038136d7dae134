"""tempo-jax solvers: cost models, calibration, placement, dispatch policies and CascadeEP planning (no jax).

This package must stay importable in a light numpy-only worker process (TEMPO §4.4).

Shapes and letters: the one glossary of docs/architecture.md, for every package.

Modules, bottom up (imports point down only): `checks` (argument checks), `cost` (max-affine models, presets),
`eplb` → `placement` (layouts, slot budgets), `limits` (token LP by HiGHS and by max-flow, semi-matching) →
`bounds` (cheap, certified and LP bounds) → `problem` (`DispatchProblem`, `Dispatch`) → `policies`,
`target_repair`, `level_search` (exact search at one activation level, CP-SAT) → `tempo_moves` (stages 1–3 on a
dense state) → `tempo_fast` (`TempoOptions`, anytime budget), `milp` → `solve`; `relief` (pairwise relief) →
`copies` (per-batch dynamic copies into spare slots and their exact MILP) → `copy_baselines` (MoonEP- and
LLEP-style token balancing with unpriced copies); beside them `fit` (calibration)
and `topology` (per-node split); `tables` (the one plan → table-weights conversion, used by every producer of
dispatch tables) and `worker` (the numpy-only solver process of TEMPO §4.4). CascadeEP planning: `attention`
(App. B attention-time model), `throughput` (FFN throughput curve, streamFFN threshold), `streamffn` (launch
groups and the rank-uniform `LaunchSchedule`), `oewf` (Algorithm 1 and the Eq. 6 admission test).
"""

from . import oewf as _oewf
from .attention import (
    AttentionFitReport,
    AttentionModel,
    attention_features,
    attention_features_unchecked,
    fit_attention,
)
from .bounds import certified_lower_bound
from .copies import CopyCost, CopyPlan, copies_milp, plan_copies
from .copy_baselines import TokenPlan, equalise_rows, least_loaded
from .cost import PRESETS, CostModel, gpu_loads
from .eplb import rebalance_experts
from .fit import FitReport, UndeterminedFitWarning, bootstrap_max_affine, fit_max_affine, read_samples
from .limits import TokenFlow, semi_matching, semi_matching_value, token_flow
from .oewf import *  # noqa: F403  (Algorithm 1 and the Eq. 6 admission test: oewf.__all__)
from .placement import Placement, drift_corrupt, slots_for, static_map
from .problem import Dispatch, DispatchProblem
from .solve import POLICIES, SWEEP_POLICIES, solve
from .streamffn import LAUNCH_MODES, ExchangeShift, LaunchGroup, LaunchSchedule, launch_groups
from .tables import PLAN_NAMES, expected_dispatch, plan_weights, solve_weights, split_tables
from .tempo_fast import TempoOptions
from .throughput import DEFAULT_TOKEN_LADDER, ThroughputCurve, stream_threshold
from .topology import flat_split, inter_node_tokens, node_counts_from_sources, topology_split

__all__ = [
    "PLAN_NAMES",
    "POLICIES",
    "PRESETS",
    "SWEEP_POLICIES",
    "CopyCost",
    "CopyPlan",
    "CostModel",
    "Dispatch",
    "DispatchProblem",
    "FitReport",
    "UndeterminedFitWarning",
    "Placement",
    "bootstrap_max_affine",
    "TempoOptions",
    "TokenFlow",
    "TokenPlan",
    "certified_lower_bound",
    "copies_milp",
    "drift_corrupt",
    "equalise_rows",
    "expected_dispatch",
    "fit_max_affine",
    "read_samples",
    "flat_split",
    "gpu_loads",
    "inter_node_tokens",
    "least_loaded",
    "node_counts_from_sources",
    "plan_copies",
    "plan_weights",
    "rebalance_experts",
    "semi_matching",
    "semi_matching_value",
    "slots_for",
    "solve",
    "solve_weights",
    "split_tables",
    "static_map",
    "token_flow",
    "topology_split",
    # CascadeEP planning (attention model, streamFFN, OEWF)
    "AttentionFitReport",
    "AttentionModel",
    "attention_features",
    "attention_features_unchecked",
    "fit_attention",
    "DEFAULT_TOKEN_LADDER",
    "ThroughputCurve",
    "stream_threshold",
    "LAUNCH_MODES",
    "ExchangeShift",
    "LaunchGroup",
    "LaunchSchedule",
    "launch_groups",
    *_oewf.__all__,
]
