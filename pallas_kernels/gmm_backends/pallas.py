"""Backend "pallas": the tiled Pallas kernels of `pallas_kernels.gmm_pallas` (Triton lowering on a GPU, interpret
mode on CPU), on operands padded to whole tiles with the group metadata built here."""

from __future__ import annotations

from pallas_kernels.gmm_call import GmmCall, kernel_tiles, pad_to, stages
from pallas_kernels.gmm_metadata import make_group_metadata
from pallas_kernels.gmm_pallas import gmm_pallas, tgmm_pallas

__all__ = ["gmm", "tgmm"]


def gmm(lhs, rhs, group_sizes, group_offset, call: GmmCall, *, transpose_rhs: bool):
    """See `pallas_kernels.gmm_backends`."""
    m, k = lhs.shape
    n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
    tm, tk, tn = kernel_tiles(call.tiling, m, k, n)
    x = pad_to(pad_to(lhs, 0, tm), 1, tk)
    w = pad_to(pad_to(rhs, 1, tn if transpose_rhs else tk), 2, tk if transpose_rhs else tn)
    meta = make_group_metadata(
        group_sizes, m=x.shape[0], tm=tm, group_offset=group_offset, num_local_groups=call.num_local_groups
    )
    out = gmm_pallas(
        x,
        w,
        meta,
        group_offset.reshape(1),
        tiling=(tm, tk, tn),
        transpose_rhs=transpose_rhs,
        interpret=call.interpret,
        num_warps=call.tiling.num_warps,
        num_stages=stages(call.tiling, tm * tk * x.dtype.itemsize + tk * tn * w.dtype.itemsize),
        num_local_groups=call.num_local_groups,
        out_dtype=call.out_dtype,
        precision=call.precision,
    )
    return out[:m, :n]


def tgmm(lhs, grad, group_sizes, group_offset, call: GmmCall, *, out_dtype):
    """See `pallas_kernels.gmm_backends`."""
    m, k = lhs.shape
    n = grad.shape[1]
    tm, tk, tn = kernel_tiles(call.tiling, m, k, n)
    x = pad_to(pad_to(lhs, 0, tm), 1, tk)
    y = pad_to(pad_to(grad, 0, tm), 1, tn)
    meta = make_group_metadata(
        group_sizes, m=x.shape[0], tm=tm, group_offset=group_offset, num_local_groups=call.num_local_groups
    )
    out = tgmm_pallas(
        x,
        y,
        meta,
        group_offset.reshape(1),
        tiling=(tm, tk, tn),
        interpret=call.interpret,
        num_warps=call.tiling.num_warps,
        num_stages=stages(call.tiling, tm * (tk * x.dtype.itemsize + tn * y.dtype.itemsize)),
        num_local_groups=call.num_local_groups,
        out_dtype=out_dtype,
        precision=call.precision,
    )
    return out[:, :k, :n]
