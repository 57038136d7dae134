"""The `tempo-jax` command line (also `python -m tempo_jax`): `main`, one module per command group.

- `demo` (`make demo`, with `demo_cascade`), `solve` (solve, calibrate), `sim` (phase, cascade), `serve`,
  `repro` (reproduce, bench); `args`: errors, value types, output files, options generated from configs.
"""

from .main import build_parser, main

__all__ = ["build_parser", "main"]
