"""Pallas kernels for MoE expert parallelism (jax only; imports nothing from `solvers` or `tempo_jax`).

- `gmm` / `tgmm`: grouped GEMM mirroring `jax.lax.ragged_dot` (+ `group_offset`; mixed float operand dtypes,
  group sizes of any integer dtype), with a custom VJP;
  Pallas (GPU / interpret), tokamax, megablox (TPU; `gmm_megablox`), CPU-fast XLA and `ragged_dot` implementations;
  `*_reference` in pure jnp.
- `dispatch`: the fused TEMPO dispatch + count kernel (sample and quota modes) with a wrapping uint32 cumulative
  counter; `dispatch_reference`; its Pallas TPU program in `dispatch_tpu`.
- `implementations`: implementation names per op (`GmmImpl`, `DispatchImpl`) and `ImplementationTable.resolve`, the one
  rule that turns "auto" into a concrete implementation on each platform (`GMM`, `DISPATCH`).
- `triton_backend`: the lazily imported Pallas Triton backend (deprecated in JAX 0.11); "auto" uses it only on
  jax < 0.11, else tokamax / `ragged_dot` (grouped GEMM) and the jnp dispatch on GPU.
- `tokamax_backend`: the lazily imported tokamax package (`gmm(implementation="tokamax")`; optional extra).
- `fp8`: block-scaled FP8 weights (`BlockScaled`, DeepSeek's format) as `gmm` operands, `quantize` / `dequantize`;
  `fp8_path` says which implementations read them as FP8 in the kernel (tokamax) and which dequantize first.

Shapes: the house's glossary (docs/architecture.md; E counts the GEMM's groups here).
"""

from pallas_kernels.dispatch import (
    COUNTER_DTYPE,
    DISPATCH_MODES,
    DispatchMode,
    DispatchResult,
    dispatch,
    dispatch_reference,
    occurrence_ranks,
)
from pallas_kernels.fp8 import BlockScaled
from pallas_kernels.gmm import FP8_PATHS, GmmTiling, fp8_path, gmm, gmm_reference, tgmm, tgmm_reference
from pallas_kernels.gmm_metadata import GroupMetadata, make_group_metadata
from pallas_kernels.implementations import DISPATCH, GMM, DispatchImpl, GmmImpl, ImplementationTable, platform

__all__ = [
    "BlockScaled",
    "COUNTER_DTYPE",
    "DISPATCH",
    "DISPATCH_MODES",
    "DispatchImpl",
    "DispatchMode",
    "DispatchResult",
    "FP8_PATHS",
    "GMM",
    "GmmImpl",
    "GmmTiling",
    "GroupMetadata",
    "ImplementationTable",
    "dispatch",
    "dispatch_reference",
    "fp8_path",
    "gmm",
    "gmm_reference",
    "make_group_metadata",
    "occurrence_ranks",
    "platform",
    "tgmm",
    "tgmm_reference",
]
