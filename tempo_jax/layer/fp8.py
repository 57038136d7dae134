"""FP8 experts: DeepSeek's block-scaled format, kept as stored (``MoEConfig(expert_dtype="fp8_block")``).

Each expert weight is float8_e4m3fn beside a float32 ``{name}_scale_inv`` holding one factor per block of the
weight (HF's ``weight_scale_inv``: the value is ``fp8 × scale_inv``). HF stores a weight ``[out, in]`` with scales
``[⌈out/b0⌉, ⌈in/b1⌉]`` for ``weight_block_size = (b0, b1)`` (128 × 128); the layer keeps its own orientation
``[in, out]`` (``w_gate`` / ``w_up`` ``[S, H, F]``, ``w_down`` ``[S, F, H]``), so its scales are the transposed grid
``[S, ⌈in/b1⌉, ⌈out/b0⌉]`` and `layer_block` is ``(b1, b0)``.

The scales are per-slot arrays like the weights (`tempo_jax.layer.params.EXPERT_KEYS`): every re-placement, copy,
OEWF fetch, checkpoint and export moves them with their weights. The layer dequantizes this rank's slots (after any
FSDP gather, so the gather moves FP8) to ``MoEConfig.dtype`` and runs the grouped GEMM there — the
**dequantize-then-GEMM** path, the one every implementation has; an FP8 GEMM (tokamax's FP8 kernels on sm90+) is
not wired yet. Stored expert bytes are about half of bf16's (``1 + 4/(b0·b1)`` bytes per weight). FP8 experts are
frozen (a quantized base): their gradients are zero; train in ``MoEConfig.dtype`` and `quantize` afterwards.

``dequantize`` is the pure-jnp reference; ``quantize`` is DeepSeek's rule (each block's amax maps to e4m3's 448).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = [
    "E4M3_MAX",
    "FP8_DTYPE",
    "SCALE_KEYS",
    "dequantize",
    "dequantize_weights",
    "layer_block",
    "quantize",
    "quantize_params",
    "scale_shape",
    "stored_dtypes",
]

FP8_DTYPE = jnp.float8_e4m3fn
#: The largest finite float8_e4m3fn: a block's amax is stored as this.
E4M3_MAX = 448.0
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


def scale_shape(shape: tuple[int, ...], block: tuple[int, int]) -> tuple[int, ...]:
    """The scale grid of a weight ``[..., A, B]`` in ``block = (bA, bB)`` blocks: ``[..., ⌈A/bA⌉, ⌈B/bB⌉]``."""
    *lead, A, B = shape
    return (*lead, -(-A // block[0]), -(-B // block[1]))


def _expand(scale: jax.Array, shape: tuple[int, ...], block: tuple[int, int]) -> jax.Array:
    """``scale [..., a, b]`` repeated to the weight's ``[..., A, B]`` (cropped where a block is partial)."""
    A, B = shape[-2:]
    full = jnp.repeat(jnp.repeat(scale, block[0], axis=-2), block[1], axis=-1)
    return full[..., :A, :B]


def dequantize(q: jax.Array, scale_inv: jax.Array, block: tuple[int, int], dtype) -> jax.Array:
    """``q [..., A, B]`` (float8) × ``scale_inv [..., ⌈A/bA⌉, ⌈B/bB⌉]`` (float32) → ``dtype [..., A, B]``; the
    product is taken in float32, then cast. Frozen: no gradient flows to ``q`` or ``scale_inv``."""
    q, scale_inv = jax.lax.stop_gradient(q), jax.lax.stop_gradient(scale_inv)
    full = _expand(scale_inv.astype(jnp.float32), q.shape, block)
    return (q.astype(jnp.float32) * full).astype(dtype)


def quantize(w: jax.Array, block: tuple[int, int]) -> tuple[jax.Array, jax.Array]:
    """``w [..., A, B]`` → ``(q float8_e4m3fn [..., A, B], scale_inv float32 [..., ⌈A/bA⌉, ⌈B/bB⌉])`` with each
    block's amax stored as `E4M3_MAX` (an all-zero block gets scale 1)."""
    A, B = w.shape[-2:]
    a, b = scale_shape(w.shape, block)[-2:]
    pad = [(0, 0)] * (w.ndim - 2) + [(0, a * block[0] - A), (0, b * block[1] - B)]
    blocks = jnp.pad(w.astype(jnp.float32), pad).reshape(*w.shape[:-2], a, block[0], b, block[1])
    amax = jnp.max(jnp.abs(blocks), axis=(-3, -1))
    scale_inv = jnp.where(amax > 0, amax / E4M3_MAX, 1.0).astype(jnp.float32)
    q = (w.astype(jnp.float32) / _expand(scale_inv, w.shape, block)).astype(FP8_DTYPE)
    return q, scale_inv


def dequantize_weights(weights: dict, block: tuple[int, int], dtype) -> dict:
    """This rank's expert arrays with each FP8 weight (an array, or a tuple of parts: stored slots, copies, fetches)
    dequantized by its ``{name}_scale_inv`` (same parts) to ``dtype``; the scale keys dropped. A dict without
    scales is returned as it is."""
    if not any(s in weights for s in SCALE_KEYS.values()):
        return weights
    out = {k: w for k, w in weights.items() if k not in SCALE_KEYS.values()}
    for name, key in SCALE_KEYS.items():
        w, s = weights[name], weights[key]
        if isinstance(w, tuple):
            out[name] = tuple(dequantize(a, b, block, dtype) for a, b in zip(w, s, strict=True))
        else:
            out[name] = dequantize(w, s, block, dtype)
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
