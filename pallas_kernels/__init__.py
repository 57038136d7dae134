"""Pallas kernels for MoE expert parallelism (jax only; imports nothing from `solvers` or `tempo_jax`).

- `gmm` / `tgmm`: grouped GEMM mirroring `jax.lax.ragged_dot` (+ `group_offset`), with a custom VJP;
  Pallas (GPU / interpret), CPU-fast XLA and `ragged_dot` implementations; `*_reference` in pure jnp.
- `dispatch`: the fused TEMPO dispatch + count kernel (sample and quota modes); `dispatch_reference`;
  `window_counts` recovers per-window counts from wrapping uint32 cumulative counters.
- `triton_backend`: the lazily imported Pallas Triton backend (deprecated in JAX 0.11); without it the
  "auto" implementations fall back to `ragged_dot` / the jnp dispatch on GPU.
"""

from pallas_kernels.dispatch import (
    COUNTER_DTYPE,
    DISPATCH_MODES,
    DispatchResult,
    dispatch,
    dispatch_reference,
    occurrence_ranks,
    window_counts,
)
from pallas_kernels.gmm import IMPLEMENTATIONS, GmmTiling, gmm, gmm_reference, tgmm, tgmm_reference
from pallas_kernels.gmm_metadata import GroupMetadata, make_group_metadata

__all__ = [
    "COUNTER_DTYPE",
    "DISPATCH_MODES",
    "DispatchResult",
    "GmmTiling",
    "GroupMetadata",
    "IMPLEMENTATIONS",
    "dispatch",
    "dispatch_reference",
    "gmm",
    "gmm_reference",
    "make_group_metadata",
    "occurrence_ranks",
    "tgmm",
    "tgmm_reference",
    "window_counts",
]
