"""Backend "ragged_dot": `jax.lax.ragged_dot` with its default lowering (`pallas_kernels.gmm_xla.gmm_ragged`)."""

from __future__ import annotations

from pallas_kernels.gmm_call import GmmCall
from pallas_kernels.gmm_xla import gmm_ragged, tgmm_ragged

__all__ = ["gmm", "tgmm"]


def gmm(lhs, rhs, group_sizes, group_offset, call: GmmCall, *, transpose_rhs: bool):
    """See `pallas_kernels.gmm_backends`."""
    common = dict(num_local_groups=call.num_local_groups, out_dtype=call.out_dtype, precision=call.precision)
    return gmm_ragged(lhs, rhs, group_sizes, group_offset, transpose_rhs=transpose_rhs, backend="xla", **common)


def tgmm(lhs, grad, group_sizes, group_offset, call: GmmCall, *, out_dtype):
    """See `pallas_kernels.gmm_backends`."""
    common = dict(num_local_groups=call.num_local_groups, out_dtype=out_dtype, precision=call.precision)
    return tgmm_ragged(lhs, grad, group_sizes, group_offset, backend="xla", **common)
