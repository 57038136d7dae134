"""Backend "chunked": the XLA CPU-fast path of `pallas_kernels.gmm_xla` (dense matmuls per row chunk of each local
group; the chunk schedule from the call's `GmmTiling`: `gmm_call.chunks`)."""

from __future__ import annotations

from pallas_kernels.gmm_call import GmmCall, chunks
from pallas_kernels.gmm_xla import gmm_chunked, tgmm_chunked

__all__ = ["gmm", "tgmm"]


def gmm(lhs, rhs, group_sizes, group_offset, call: GmmCall, *, transpose_rhs: bool, init=None):
    """See `pallas_kernels.gmm_backends`; ``init``: an ``[M, F]`` buffer other parts' groups were written into."""
    return gmm_chunked(
        lhs,
        rhs,
        group_sizes,
        group_offset,
        transpose_rhs=transpose_rhs,
        init=init,
        **chunks(call),
        num_local_groups=call.num_local_groups,
        out_dtype=call.out_dtype,
        precision=call.precision,
    )


def tgmm(lhs, grad, group_sizes, group_offset, call: GmmCall, *, out_dtype):
    """See `pallas_kernels.gmm_backends`."""
    return tgmm_chunked(
        lhs,
        grad,
        group_sizes,
        group_offset,
        **chunks(call, tgmm_rows=lhs.shape[0]),
        num_local_groups=call.num_local_groups,
        out_dtype=out_dtype,
        precision=call.precision,
    )
