"""The grouped GEMM's backends as a table (tokamax's ``api.py`` implementations dict): `BACKENDS` maps each name of
`pallas_kernels.implementations.GMM` to a module exposing one signature,

    gmm(lhs [M, H], rhs [E_loc, H, F] (or [E_loc, F, H] with transpose_rhs), group_sizes [E], group_offset [],
        call: GmmCall, *, transpose_rhs: bool) -> [M, F] in call.out_dtype
    tgmm(lhs [M, H], grad [M, F], group_sizes [E], group_offset [], call: GmmCall, *, out_dtype) -> [E_loc, H, F]

with one array ``rhs`` (parts, FP8 operands and the custom VJP are `pallas_kernels.gmm_vjp`'s). A new backend is one
module here and one row of `BACKENDS` (and its name in `implementations.GMM`); a row is a module, or one of a
module's rows where backends differ by one argument (`ragged`: XLA's ragged dot and tokamax's)."""

from __future__ import annotations

from . import chunked, megablox, mosaic, pallas, ragged

__all__ = ["BACKENDS"]

BACKENDS = {
    "pallas": pallas,
    "chunked": chunked,
    "ragged_dot": ragged.XLA,
    "tokamax": ragged.TOKAMAX,
    "megablox": megablox,
    "mosaic": mosaic,
}
