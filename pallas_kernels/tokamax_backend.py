"""The one place that touches tokamax (the grouped GEMM `gmm(implementation="tokamax")` runs through).

tokamax is the successor JAX points to for the Pallas Triton backend's GPU ops: its `ragged_dot_general` has
`jax.lax.ragged_dot_general`'s API and chooses among Pallas Mosaic GPU kernels (sm90 / sm100), a Triton path
(with `jax_triton`) and XLA's lowering, the first that supports the device and the operands. It needs Python
>= 3.12 and jax >= 0.11.1, so it is an optional extra (`pip install 'tempo-jax[tokamax]'`), installed in the
`.venv-latest` environment. The module is imported lazily: `available()` says whether it is there and
`ragged_dot_general()` returns tokamax's function or raises an error that says how to get it.

FP8 weights (`pallas_kernels.fp8.BlockScaled`) go in as qwix ``QArray``s (`qarray`): tokamax's sm90 kernel
streams the e4m3 tiles and scales them on chip before its bf16 MMA (it wants one scale per output column and a
K-tile of whole blocks, so the block grid is spread over the output axis); its XLA path dequantizes inside the call.
Whether this GPU runs them in a tokamax kernel is asked once per dtype (`fp8_refusal`, a refusal warned once): the sm90
kernel converts e4m3 to the activations' dtype on chip, which Mosaic GPU offers for bfloat16 only with a ptxas of PTX
ISA >= 9.2 (float16 always), and tokamax 0.0.17's sm100 kernels take int4 weights, not e4m3; where it cannot, `gmm`
dequantizes first.

On CPU tokamax runs XLA's `ragged_dot_general` (its Mosaic kernels refuse the device), so the numerics tested
on CPU are XLA's; what tokamax's GPU kernels give is measured by `scripts/gpu_check.sh` (results/gpu/).
"""

from __future__ import annotations

import functools
import importlib
import warnings

import jax
import jax.numpy as jnp

from pallas_kernels.fp8 import FP8_DTYPE, BlockScaled, expand

__all__ = ["INSTALL_HINT", "available", "fp8_compiles", "fp8_refusal", "qarray", "ragged_dot_general"]

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


def fp8_compiles(dtype, platform: str | None = None) -> bool:
    """Whether tokamax runs its grouped GEMM of ``dtype`` activations with FP8 weights in a kernel of its own on
    ``platform`` (default: JAX's default backend): `fp8_refusal` is None. False means the caller dequantizes first
    (then tokamax's bf16 kernel runs); the reason was warned once and `fp8_refusal` returns it."""
    return fp8_refusal(dtype, platform) is None


@functools.cache
def fp8_refusal(dtype, platform: str | None = None) -> str | None:
    """Why tokamax does not run FP8 weights against ``dtype`` activations in a kernel of its own on ``platform``, or
    None when it does. Off a GPU its XLA path takes them (None where tokamax is installed). On a GPU a small case
    (128 rows, one 128 × 128 block) is lowered and compiled once per process and dtype: a compiler error (Mosaic GPU's
    e4m3 → bfloat16 conversion on sm90 needs a ptxas of PTX ISA >= 9.2) or a lowering to XLA's ops instead of a
    tokamax kernel (tokamax 0.0.17's sm100 kernels take int4 weights, not e4m3) is the reason, returned and warned
    (RuntimeWarning, once: `gmm` then dequantizes FP8 weights before tokamax's bf16 kernel)."""
    platform = platform or jax.default_backend()
    if not available():
        return INSTALL_HINT
    if platform not in ("gpu", "cuda", "rocm"):
        return None
    dot = _module().ragged_dot
    w = BlockScaled(jnp.zeros((1, 128, 128), FP8_DTYPE), jnp.ones((1, 1, 1), jnp.float32), (128, 128))
    args = (jax.ShapeDtypeStruct((128, 128), dtype), w, jax.ShapeDtypeStruct((1,), jnp.int32))
    try:
        lowered = jax.jit(lambda x, w, sizes: dot(x, qarray(w, x.dtype), sizes, preferred_element_type=x.dtype)).lower(
            *args
        )
        lowered.compile()
        text = lowered.as_text()
        reason = None if ("mosaic_gpu" in text or "triton" in text) else "it lowers to XLA's ops, not a tokamax kernel"
    except Exception as e:  # noqa: BLE001 (any refusal of the compiler: named in the warning, then dequantize first)
        reason = f"{type(e).__name__}: {str(e)[:300]}"
    if reason is not None:
        warnings.warn(
            f"tokamax does not run FP8 weights against {jnp.dtype(dtype).name} activations in its own kernel on this "
            f"{platform} ({reason}); gmm dequantizes them before tokamax's bf16 kernel",
            RuntimeWarning,
            stacklevel=2,
        )
    return reason
