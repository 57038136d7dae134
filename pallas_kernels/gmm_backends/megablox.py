"""Backend "megablox": megablox's Pallas TPU kernels (`pallas_kernels.gmm_megablox`; TPU interpret mode on CPU)."""

from __future__ import annotations

from pallas_kernels.gmm_call import GmmCall
from pallas_kernels.gmm_megablox import gmm_megablox, tgmm_megablox
from pallas_kernels.gmm_metadata import dot_dtype

__all__ = ["gmm", "tgmm"]


def gmm(lhs, rhs, group_sizes, group_offset, call: GmmCall, *, transpose_rhs: bool):
    """See `pallas_kernels.gmm_backends`."""
    return gmm_megablox(
        lhs,
        rhs,
        group_sizes,
        group_offset,
        transpose_rhs=transpose_rhs,
        out_dtype=call.out_dtype,
        compute_dtype=dot_dtype(lhs, rhs),
        interpret=call.interpret,
    )


def tgmm(lhs, grad, group_sizes, group_offset, call: GmmCall, *, out_dtype):
    """See `pallas_kernels.gmm_backends`."""
    return tgmm_megablox(
        lhs,
        grad,
        group_sizes,
        group_offset,
        num_local_groups=call.num_local_groups,
        out_dtype=out_dtype,
        compute_dtype=dot_dtype(lhs, grad),
        interpret=call.interpret,
    )
