"""The one place that touches tokamax (the grouped GEMM `gmm(implementation="tokamax")` runs through).

tokamax is the successor JAX points to for the Pallas Triton backend's GPU ops: its `ragged_dot_general` has
`jax.lax.ragged_dot_general`'s API and chooses among Pallas Mosaic GPU kernels (sm90 / sm100), a Triton path
(with `jax_triton`) and XLA's lowering, the first that supports the device and the operands. It needs Python
>= 3.12 and jax >= 0.11.1, so it is an optional extra (`pip install 'tempo-jax[tokamax]'`), installed in the
`.venv-latest` environment. The module is imported lazily: `available()` says whether it is there and
`ragged_dot_general()` returns tokamax's function or raises an error that says how to get it.

FP8 weights (`pallas_kernels.fp8.BlockScaled`) go in as qwix ``QArray``s (`qarray`): tokamax's sm90 kernel
streams the e4m3 tiles and scales them on chip before its bf16 MMA (it wants one scale per output column and a
K-tile of whole blocks, so the block grid is spread over the output axis), sm100 has FP8 kernels, and its XLA path
dequantizes inside the call. Whether this GPU runs them in a tokamax kernel is asked once per dtype
(`fp8_compiles`): the sm90 kernel converts e4m3 to the activations' dtype on chip, which Mosaic GPU offers for
bfloat16 only with a ptxas of PTX ISA >= 9.2 (float16 always), and tokamax 0.0.17's sm100 kernels take int4 weights,
not e4m3; where it cannot, `gmm` dequantizes first.

On CPU tokamax runs XLA's `ragged_dot_general` (its Mosaic kernels refuse the device), so the numerics tested
on CPU are XLA's; what tokamax's GPU kernels give is measured by `scripts/gpu_check.sh` (results/gpu/).
"""

from __future__ import annotations

import functools
import importlib

import jax
import jax.numpy as jnp

from pallas_kernels.fp8 import FP8_DTYPE, BlockScaled, expand

__all__ = ["INSTALL_HINT", "available", "fp8_compiles", "qarray", "ragged_dot_general"]

INSTALL_HINT = (
    "gmm implementation 'tokamax' needs the tokamax package (Python >= 3.12, jax >= 0.11.1): "
    "pip install 'tempo-jax[tokamax]', or use implementation='pallas', 'ragged_dot' or 'auto'"
)


@functools.cache
def _module():
    try:
        return importlib.import_module("tokamax")
    except ImportError:
        return None


def available() -> bool:
    """True when tokamax imports in this environment."""
    return _module() is not None


def ragged_dot_general():
    """tokamax's `ragged_dot_general` (the signature of `jax.lax.ragged_dot_general`, plus `implementation=`).

    Raises:
      RuntimeError with `INSTALL_HINT` when tokamax is not installed.
    """
    mod = _module()
    if mod is None:
        raise RuntimeError(INSTALL_HINT)
    return mod.ragged_dot_general


def qarray(w: BlockScaled, dtype):
    """A `BlockScaled` weight ``[E, K, N]`` (contracted over K) as the qwix ``QArray`` tokamax takes: the e4m3 values
    as they are and the scales ``[E, K/bK, N]`` in ``dtype`` (each block's factor repeated over its bN output
    columns: tile ``(1, bK, 1)``, the shape tokamax's sm90 kernel accepts). K must be a multiple of bK
    (`pallas_kernels.gmm.fp8_path` dequantizes other shapes before they get here).

    Raises:
      RuntimeError with `INSTALL_HINT` when tokamax (and with it qwix) is not installed.
    """
    ragged_dot_general()  # the install hint when tokamax is missing
    qwix = importlib.import_module("qwix")
    scale = expand(w.scale_inv, w.shape, w.block, axes=(-1,)).astype(dtype)
    return qwix.QArray(qvalue=w.q, scale=scale, qtype=jnp.dtype(FP8_DTYPE))


@functools.cache
def fp8_compiles(dtype, platform: str | None = None) -> bool:
    """Whether tokamax runs its grouped GEMM of ``dtype`` activations with FP8 weights in a kernel of its own on
    ``platform`` (default: JAX's default backend). Off a GPU its XLA path takes them (True). On a GPU a small case
    (128 rows, one 128 × 128 block) is lowered and compiled once per dtype: True only when that works and lowers to
    a tokamax kernel (Mosaic GPU or Triton), not to XLA's ops — tokamax 0.0.17's sm100 kernels take int4 weights
    only and fall back to XLA for e4m3 ones, and Mosaic GPU's e4m3 → bfloat16 conversion (sm90) needs a ptxas of
    PTX ISA >= 9.2. False means the caller dequantizes first (then tokamax's bf16 kernel runs)."""
    platform = platform or jax.default_backend()
    if platform not in ("gpu", "cuda", "rocm"):
        return available()
    if not available():
        return False
    dot = _module().ragged_dot
    w = BlockScaled(jnp.zeros((1, 128, 128), FP8_DTYPE), jnp.ones((1, 1, 1), jnp.float32), (128, 128))
    args = (jax.ShapeDtypeStruct((128, 128), dtype), w, jax.ShapeDtypeStruct((1,), jnp.int32))
    try:
        lowered = jax.jit(lambda x, w, sizes: dot(x, qarray(w, x.dtype), sizes, preferred_element_type=x.dtype)).lower(
            *args
        )
        lowered.compile()
    except Exception:  # noqa: BLE001 (any refusal of the compiler means: dequantize first)
        return False
    text = lowered.as_text()
    return "mosaic_gpu" in text or "triton" in text
