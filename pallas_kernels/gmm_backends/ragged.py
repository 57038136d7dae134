"""Backends "ragged_dot" and "tokamax": a ragged dot of `pallas_kernels.gmm_xla` — XLA's `jax.lax.ragged_dot` with its
default lowering (`XLA`), or tokamax's `ragged_dot_general` (`TOKAMAX`, `pallas_kernels.tokamax_backend`: its Mosaic
GPU kernels on sm90 / sm100 for the forward and d lhs, its XLA path for d rhs). Two table rows, one module: they
differ only in the ``backend`` they name."""

from __future__ import annotations

import functools
from types import SimpleNamespace

from pallas_kernels.gmm_call import GmmCall
from pallas_kernels.gmm_xla import gmm_ragged, tgmm_ragged

__all__ = ["TOKAMAX", "XLA", "gmm", "tgmm"]


def gmm(lhs, rhs, group_sizes, group_offset, call: GmmCall, *, transpose_rhs: bool, backend: str):
    """See `pallas_kernels.gmm_backends`; ``backend``: ``"xla"`` or ``"tokamax"`` (`gmm_xla.RAGGED_BACKENDS`)."""
    common = dict(num_local_groups=call.num_local_groups, out_dtype=call.out_dtype, precision=call.precision)
    common["offset"] = call.offset
    return gmm_ragged(lhs, rhs, group_sizes, group_offset, transpose_rhs=transpose_rhs, backend=backend, **common)


def tgmm(lhs, grad, group_sizes, group_offset, call: GmmCall, *, out_dtype, backend: str):
    """See `pallas_kernels.gmm_backends`."""
    common = dict(num_local_groups=call.num_local_groups, out_dtype=out_dtype, precision=call.precision)
    common["offset"] = call.offset
    return tgmm_ragged(lhs, grad, group_sizes, group_offset, backend=backend, **common)


def _row(backend: str) -> SimpleNamespace:
    return SimpleNamespace(gmm=functools.partial(gmm, backend=backend), tgmm=functools.partial(tgmm, backend=backend))


XLA, TOKAMAX = _row("xla"), _row("tokamax")
