"""Backend "mosaic": the project's own Pallas Mosaic GPU kernel for sm90 (`pallas_kernels.gmm_mosaic`; GPU interpret
mode on CPU, jax >= 0.12); d rhs through XLA's grouped contraction (`gmm_mosaic.tgmm_mosaic`)."""

from __future__ import annotations

from pallas_kernels.gmm_call import GmmCall
from pallas_kernels.gmm_mosaic import gmm_mosaic, tgmm_mosaic

__all__ = ["gmm", "tgmm"]


def gmm(lhs, rhs, group_sizes, group_offset, call: GmmCall, *, transpose_rhs: bool):
    """See `pallas_kernels.gmm_backends`."""
    return gmm_mosaic(
        lhs,
        rhs,
        group_sizes,
        group_offset,
        transpose_rhs=transpose_rhs,
        preferred_element_type=call.out_dtype,
        precision=call.precision,
        interpret=call.interpret,
    )


def tgmm(lhs, grad, group_sizes, group_offset, call: GmmCall, *, out_dtype):
    """See `pallas_kernels.gmm_backends`."""
    return tgmm_mosaic(
        lhs,
        grad,
        group_sizes,
        group_offset,
        num_local_groups=call.num_local_groups,
        out_dtype=out_dtype,
        precision=call.precision,
    )
