"""The dispatch runtime (TEMPO §4.4): counters → windows → solver (inline, thread or worker process) → tables.

- `counters`: `CounterWindows` (wrap-safe differencing of the layer's uint32 counters), `host_counter`.
- `accumulator`, `publisher`, `backends`: the three parts of `controller.DispatchController`.
- `refresher`: `Refresher`, counter snapshots by period or by step.
- `serving`: `tempo-jax serve`, the serving loop with live tables (`serve_config`: its options;
  `controller_config`: the controller's).
- `calibrate`: `tempo-jax calibrate --measure`, the cost model fitted on this backend.
"""

from .controller import DROP_REASONS, SOLVER_MODES, DispatchController
from .controller_config import ControllerConfig
from .counters import COUNTER_RANGE, CounterWindows, host_counter
from .refresher import Refresher

__all__ = [
    "COUNTER_RANGE",
    "DROP_REASONS",
    "SOLVER_MODES",
    "ControllerConfig",
    "CounterWindows",
    "DispatchController",
    "Refresher",
    "host_counter",
]
