"""FP8 experts: DeepSeek's block-scaled format, kept as stored (``MoEConfig(expert_dtype="fp8_block")``).

Each expert weight is float8_e4m3fn beside a float32 ``{name}_scale_inv`` holding one factor per block of the
weight (HF's ``weight_scale_inv``: the value is ``fp8 × scale_inv``). HF stores a weight ``[out, in]`` with scales
``[⌈out/b0⌉, ⌈in/b1⌉]`` for ``weight_block_size = (b0, b1)`` (128 × 128); the layer keeps its own orientation
``[in, out]`` (``w_gate`` / ``w_up`` ``[S, H, F]``, ``w_down`` ``[S, F, H]``), so its scales are the transposed grid
``[S, ⌈in/b1⌉, ⌈out/b0⌉]`` and `layer_block` is ``(b1, b0)``.

The scales are per-slot arrays like the weights (`tempo_jax.layer.params.EXPERT_KEYS`): every re-placement, copy,
OEWF fetch, checkpoint and export moves them with their weights. After any FSDP gather (so the gather moves FP8) the
layer hands this rank's slots to the grouped GEMM by `gemm_weights`: as `BlockScaled` operands where the GEMM reads FP8
in its kernel (``gmm_impl="tokamax"``: its sm90 kernel streams the e4m3 weights and scales them on chip), else
dequantized once to ``MoEConfig.dtype`` — the **dequantize-then-GEMM** path every other implementation runs
(`pallas_kernels.gmm.fp8_path` names which). Stored expert bytes are about half of bf16's (``1 + 4/(b0·b1)`` bytes per
weight). FP8 experts are frozen (a quantized base): their gradients are zero; train in ``MoEConfig.dtype`` and
`quantize` afterwards.

``dequantize`` is the pure-jnp reference; ``quantize`` is DeepSeek's rule (each block's amax maps to e4m3's 448).
"""

from __future__ import annotations

import jax.numpy as jnp

from pallas_kernels.fp8 import E4M3_MAX, FP8_DTYPE, BlockScaled, dequantize, quantize, scale_shape

__all__ = [
    "BlockScaled",
    "E4M3_MAX",
    "FP8_DTYPE",
    "SCALE_KEYS",
    "dequantize",
    "dequantize_weights",
    "gemm_weights",
    "layer_block",
    "quantize",
    "quantize_params",
    "scale_shape",
    "stored_dtypes",
]

#: The block-scale array of each expert weight.
SCALE_KEYS = {"w_gate": "w_gate_scale_inv", "w_up": "w_up_scale_inv", "w_down": "w_down_scale_inv"}


def stored_dtypes(expert_dtype: str | None) -> dict:
    """``{key: dtype}`` of the expert arrays stored in another dtype than ``MoEConfig.dtype`` for
    ``MoEConfig.expert_dtype``: FP8 experts' weights (float8_e4m3fn) and scales (float32); else none."""
    if expert_dtype != "fp8_block":
        return {}
    return {
        **dict.fromkeys(SCALE_KEYS, jnp.dtype(FP8_DTYPE)),
        **dict.fromkeys(SCALE_KEYS.values(), jnp.dtype(jnp.float32)),
    }


def layer_block(fp8_block: tuple[int, int]) -> tuple[int, int]:
    """HF's ``weight_block_size`` ``(b0 out, b1 in)`` → the block of a layer-oriented ``[in, out]`` weight."""
    return int(fp8_block[1]), int(fp8_block[0])


def dequantize_weights(weights: dict, block: tuple[int, int], dtype) -> dict:
    """This rank's expert arrays with each FP8 weight (an array, or a tuple of parts: stored slots, copies, fetches)
    dequantized by its ``{name}_scale_inv`` (same parts) to ``dtype``; the scale keys dropped. A dict without
    scales is returned as it is."""
    return _per_weight(weights, lambda q, s: dequantize(q, s, block, dtype))


def gemm_weights(weights: dict, block: tuple[int, int], dtype, *, in_kernel: bool) -> dict:
    """This rank's expert arrays as the grouped GEMM takes them: with ``in_kernel`` (the implementation reads FP8
    in its kernel: ``pallas_kernels.gmm.fp8_path(...) == "fp8"``) each FP8 weight and its scales become one
    `BlockScaled` per part (``[S, A, B]``), else they are dequantized to ``dtype`` (`dequantize_weights`). The
    scale keys are dropped either way; a dict without scales is returned as it is."""
    if not in_kernel:
        return dequantize_weights(weights, block, dtype)
    return _per_weight(weights, lambda q, s: BlockScaled(q, s, block))


def _per_weight(weights: dict, fn) -> dict:
    """``weights`` with ``fn(q, scale_inv)`` in place of each FP8 weight (per part) and no scale keys."""
    if not any(s in weights for s in SCALE_KEYS.values()):
        return weights
    out = {k: w for k, w in weights.items() if k not in SCALE_KEYS.values()}
    for name, key in SCALE_KEYS.items():
        w, s = weights[name], weights[key]
        out[name] = tuple(fn(a, b) for a, b in zip(w, s, strict=True)) if isinstance(w, tuple) else fn(w, s)
    return out


def quantize_params(params: dict, fp8_block: tuple[int, int] = (128, 128)) -> dict:
    """A parameter dict (physical or logical) with its three expert weights quantized to FP8 and their
    ``{name}_scale_inv`` added: the parameters of ``MoEConfig(expert_dtype="fp8_block", fp8_block=fp8_block)``
    from those of the same config in ``MoEConfig.dtype``. ``fp8_block``: HF's ``(b0 out, b1 in)``."""
    block = layer_block(fp8_block)
    out = dict(params)
    for name, key in SCALE_KEYS.items():
        out[name], out[key] = quantize(params[name], block)
    return out
