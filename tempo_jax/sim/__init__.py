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

from . import cascade as _cascade
from . import tempo as _tempo
from .cascade import *  # noqa: F403  (the CascadeEP room's public names)
from .tempo import *  # noqa: F403  (the TEMPO room's public names)

__all__ = [*_tempo.__all__, *_cascade.__all__]
