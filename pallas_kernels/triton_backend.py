"""The one place that touches the Pallas Triton backend.

JAX 0.11 deprecated the Triton backend of Pallas and will remove it in a later release; jax 0.12.0.1 still ships
it and warns when a kernel lowers through it (DeprecationWarning "jax-pallas-triton"). The kernels here are
written for it, so the module is imported lazily (no import-time warning, and `pallas_kernels` keeps working
on a JAX without it): `available()` says whether it is there, `compiler_params` builds the launch knobs, and
the "auto" implementations use the Pallas kernels on a GPU only when it is available — otherwise
`jax.lax.ragged_dot` (grouped GEMM) and the jnp reference (dispatch), which compute the same function.
Interpret mode (CPU tests) never needs it.
"""

from __future__ import annotations

import functools
import importlib

import jax

__all__ = ["available", "compiler_params", "deprecated"]


@functools.cache
def _module():
    try:
        mod = importlib.import_module("jax.experimental.pallas.triton")
    except ImportError:
        return None
    return mod if hasattr(mod, "CompilerParams") else None


def available() -> bool:
    """True when this JAX still ships the Pallas Triton backend (`jax.experimental.pallas.triton`)."""
    return _module() is not None


def deprecated() -> bool:
    """True on a JAX that deprecated the backend (0.11 and later): "auto" then never picks it."""
    return tuple(int(p) for p in jax.__version__.split(".")[:2]) >= (0, 11)


def compiler_params(num_warps: int, num_stages: int, interpret: bool):
    """Triton launch parameters for a non-interpret `pallas_call` (None in interpret mode).

    Raises:
      RuntimeError when the backend is gone from this JAX: pick implementation="ragged_dot" (gmm) or "xla"
      (dispatch), run with interpret=True, or install a JAX that still has it (0.10 to 0.12).
    """
    if interpret:
        return None
    mod = _module()
    if mod is None:
        raise RuntimeError(
            "this JAX has no Pallas Triton backend (jax.experimental.pallas.triton), which the pallas_kernels "
            "kernels lower through on GPU: use implementation='ragged_dot' for gmm or 'xla' for dispatch "
            "(or 'auto', which does so by itself), interpret=True, or a JAX that still ships it (0.10 to 0.12)"
        )
    return mod.CompilerParams(num_warps=num_warps, num_stages=num_stages)
