"""The one place that touches tokamax (the grouped GEMM `gmm(implementation="tokamax")` runs through).

tokamax is the successor JAX points to for the Pallas Triton backend's GPU ops: its `ragged_dot_general` has
`jax.lax.ragged_dot_general`'s API and chooses among Pallas Mosaic GPU kernels (sm90 / sm100), a Triton path
(with `jax_triton`) and XLA's lowering, the first that supports the device and the operands. It needs Python
>= 3.12 and jax >= 0.11.1, so it is an optional extra (`pip install 'tempo-jax[tokamax]'`), installed in the
`.venv-latest` environment. The module is imported lazily: `available()` says whether it is there and
`ragged_dot_general()` returns tokamax's function or raises an error that says how to get it.

On CPU tokamax runs XLA's `ragged_dot_general` (its Mosaic kernels refuse the device), so the numerics tested
on CPU are XLA's; what tokamax's GPU kernels give is measured by `scripts/gpu_check.sh` (results/gpu/).
"""

from __future__ import annotations

import functools
import importlib

__all__ = ["INSTALL_HINT", "available", "ragged_dot_general"]

INSTALL_HINT = (
    "gmm implementation 'tokamax' needs the tokamax package (Python >= 3.12, jax >= 0.11.1): "
    "pip install 'tempo-jax[tokamax]', or use implementation='pallas', 'ragged_dot' or 'auto'"
)


@functools.cache
def _module():
    try:
        return importlib.import_module("tokamax")
    except ImportError:
        return None


def available() -> bool:
    """True when tokamax imports in this environment."""
    return _module() is not None


def ragged_dot_general():
    """tokamax's `ragged_dot_general` (the signature of `jax.lax.ragged_dot_general`, plus `implementation=`).

    Raises:
      RuntimeError with `INSTALL_HINT` when tokamax is not installed.
    """
    mod = _module()
    if mod is None:
        raise RuntimeError(INSTALL_HINT)
    return mod.ragged_dot_general
