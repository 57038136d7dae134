"""The CascadeEP prefill simulator (CascadeEP §3–4, App. A–D): requests → DEP forward steps → layer timelines.

`run_cascade(config)` serves a request trace (`tempo_jax.workloads.RequestTrace`: the Mooncake trace, its
bundled sample, or a synthetic one) on D data-parallel attention replicas with `serving.simulate_prefill` (request
placement, prefix caches, chunked-prefill batches) and times every forward step with a `StepModel`: for each of
the model's L MoE layers it draws the routing of the step's new tokens, builds the layer's `LayerInputs` and
runs `layer_timeline` in the configured mode. The step lasts the sum of its layers. One run per mode
(`LAYER_MODES`); the runs are cached and spread over worker processes by `tempo_jax.sim.runner`.

Per step the model uses (costs derived in `costs`):

- **Attention** per replica and layer (`attention_truth`): the truth has one set of coefficients per layer class (V4's
  two KV-compression settings), per-sequence work Eq. 11 does not model, and lognormal step-to-step noise σ =
  ``attention_step_noise``; an idle replica runs a dummy batch (α0). With ``estimates="paper"`` the planners see
  `solvers.fit_attention` fitted on a profile of the truth over App. B's grid (their accuracy is an output,
  `CascadeRun.attention_accuracy`); ``"exact"`` gives them the truth.
- **Routing**: each replica's new tokens pick top-K experts; per layer, source s's pairs are a multinomial draw of
  ``K·Q_s`` pairs over the destination ranks with each rank's share of the layer's expert popularity — a recorded
  routing trace's layer loads (recorded experts split evenly into E / E_rec model experts; recorded layers reused
  cyclically) or Zipf(s) with a per-layer permutation. Experts sit ``E/D`` per rank in order. The rank-level counts
  are exactly the multinomial over experts summed per rank (the multinomial's aggregation property); within a
  (source, destination) pair the pairs split over the destination's experts in proportion to their popularity
  (the multinomial's mean, not a draw — OEWF's expert choice reads these shares). With ``replication > 1`` an EPLB
  expert placement per layer holds redundant replicas and the full per-expert multinomial is drawn; ``dispatch``
  (``"uniform"`` = EPLB-even, ``"tempo"``) splits each expert's tokens over them — TEMPO inside each rank's
  expert time, the two papers composed.
- **Token-count estimates** for OEWF and planned launching (App. D): N̂_d = the count rank d received in the
  previous layer (``estimates="paper"``) or the true count (``"exact"``); OEWF is skipped on the first layer.
- **The layer timeline**: ``timeline="fast"`` (default) runs `fast_timeline.step_timeline` over all
  layers of the step at once; ``"reference"`` runs `layer_timeline` layer by layer (the two agree to 1e-9;
  ``guard``, ``pricing="tempo"`` and ``replication > 1`` need the reference).

Modules (each imports only those above it):

- `vocabulary` (the modes, link models, launch modes and their labels).
- `costs` (`prefill_costs`: a deployment's compute and transfer costs), `attention_truth` (the true attention model
  and the planners' fits), `serving` (`simulate_prefill`: requests on D attention replicas → steps).
- `reference_timeline` (`layer_timeline`: one layer, scalar, the reference), `fast_timeline` (`step_timeline`: every
  layer of a step at once, numpy arrays; tested equal).
- `config` (`CascadeConfig`), `workload` (the trace and each seed's draw), `step_model` (`StepModel`: a step's
  layers), `run` (`run_cascade`, `run_cascade_seeds` → `CascadeRun`), `summary` (the notebook's tables, paired
  orderings, attribution), `report` (`cascade_report`: one experiment at an operating point, its tables and JSON:
  what `tempo-jax cascade` prints).

numpy + solvers only (no jax).
"""

from .config import TIMELINES, TRACE_NAMES, CascadeConfig
from .costs import HARDWARE, MODELS, PrefillCosts, prefill_costs
from .fast_timeline import step_timeline
from .reference_timeline import LayerInputs, LayerResult, layer_timeline
from .run import CascadeRun, run_cascade, run_cascade_seeds, serve_mode, step_batches
from .serving import PLACEMENT_POLICIES, PrefillResult, StepBatch, simulate_prefill
from .step_model import StepModel, StepRecord
from .vocabulary import LABELS, LAUNCHES, LAYER_MODES, LINKS
from .workload import cascade_trace, trace_digest, trace_file, workload_draw

__all__ = [
    "HARDWARE",
    "LABELS",
    "LAUNCHES",
    "LAYER_MODES",
    "LINKS",
    "MODELS",
    "PLACEMENT_POLICIES",
    "TIMELINES",
    "TRACE_NAMES",
    "CascadeConfig",
    "CascadeRun",
    "LayerInputs",
    "LayerResult",
    "PrefillCosts",
    "PrefillResult",
    "StepBatch",
    "StepModel",
    "StepRecord",
    "cascade_trace",
    "layer_timeline",
    "prefill_costs",
    "run_cascade",
    "run_cascade_seeds",
    "serve_mode",
    "simulate_prefill",
    "step_batches",
    "step_timeline",
    "trace_digest",
    "trace_file",
    "workload_draw",
]
