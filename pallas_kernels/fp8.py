"""Block-scaled FP8 operands of the grouped GEMM: DeepSeek's format (e4m3 values, one float32 factor per block).

    w = BlockScaled(q [E, A, B] float8_e4m3fn, scale_inv [E, ⌈A/bA⌉, ⌈B/bB⌉] float32, block=(bA, bB))
    w.dequantize(jnp.bfloat16)        # [E, A, B]: q × scale_inv of its block, in float32, then cast
    gmm(x, w, group_sizes)            # the same function as gmm(x, w.dequantize(x.dtype), group_sizes)

The value of element (a, b) is ``q[a, b] · scale_inv[a // bA, b // bB]`` (HF's ``weight_scale_inv``); partial blocks
at the edges are allowed. `quantize` is DeepSeek's rule: each block's amax is stored as e4m3's largest finite value
(448), so ``scale_inv = amax / 448`` (an all-zero block gets 1). `dequantize` is the pure-jnp reference every GEMM
path is compared with; which paths read the FP8 values in the kernel and which dequantize first is
`pallas_kernels.gmm.fp8_path`.

jax only; imports nothing from `solvers` or `tempo_jax` (`tempo_jax.layer.fp8` builds the layer's FP8 experts on it).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

__all__ = [
    "BlockScaled",
    "E4M3_MAX",
    "FP8_DTYPE",
    "dequantize",
    "fake_quantize_rows",
    "quantize",
    "quantize_rows",
    "row_block",
    "scale_shape",
]

FP8_DTYPE = jnp.dtype(jnp.float8_e4m3fn)
#: The largest finite float8_e4m3fn: a block's amax is stored as this.
E4M3_MAX = 448.0


def scale_shape(shape: tuple[int, ...], block: tuple[int, int]) -> tuple[int, ...]:
    """The scale grid of a weight ``[..., A, B]`` in ``block = (bA, bB)`` blocks: ``[..., ⌈A/bA⌉, ⌈B/bB⌉]``."""
    *lead, A, B = shape
    return (*lead, -(-A // block[0]), -(-B // block[1]))


def expand(scale: jax.Array, shape: tuple[int, ...], block: tuple[int, int], axes=(-2, -1)) -> jax.Array:
    """``scale [..., a, b]`` repeated over its blocks along ``axes`` (of the last two) to the weight's extent there
    (cropped where a block is partial): ``axes=(-2, -1)`` gives ``[..., A, B]``, ``(-1,)`` gives ``[..., a, B]``."""
    out = scale
    for ax in axes:
        n = shape[ax]
        out = jax.lax.slice_in_dim(jnp.repeat(out, block[ax], axis=ax), 0, n, axis=out.ndim + ax)
    return out


def dequantize(q: jax.Array, scale_inv: jax.Array, block: tuple[int, int], dtype) -> jax.Array:
    """``q [..., A, B]`` (float8) × ``scale_inv [..., ⌈A/bA⌉, ⌈B/bB⌉]`` (float32) → ``dtype [..., A, B]``; the
    product is taken in float32, then cast. Frozen: no gradient flows to ``q`` or ``scale_inv``."""
    q, scale_inv = jax.lax.stop_gradient(q), jax.lax.stop_gradient(scale_inv)
    full = expand(scale_inv.astype(jnp.float32), q.shape, block)
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
    q = (w.astype(jnp.float32) / expand(scale_inv, w.shape, block)).astype(FP8_DTYPE)
    return q, scale_inv


def row_block(width: int, block: int) -> int:
    """The columns one activation scale covers for rows ``width`` wide: ``block``, or the whole row when it is
    narrower (so the scales always tile the row exactly)."""
    return min(int(block), int(width))


def quantize_rows(x: jax.Array, block: int) -> tuple[jax.Array, jax.Array]:
    """Activations ``x [M, K]`` → ``(q float8_e4m3fn [M, K], scale_inv float32 [M, ⌈K/b⌉])``, one scale per row and
    ``b = row_block(K, block)`` columns (DeepSeek's 1 × 128 activation tiles; `quantize`'s rule)."""
    return quantize(x, (1, row_block(x.shape[-1], block)))


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def fake_quantize_rows(x: jax.Array, block: int) -> jax.Array:
    """``x [M, K]`` through `quantize_rows` and back, in ``x.dtype``: the values an FP8 × FP8 GEMM multiplies, for
    implementations that multiply in ``x.dtype``. The gradient passes straight through (as if not quantized)."""
    q, s = quantize_rows(x, block)
    return dequantize(q, s, (1, row_block(x.shape[-1], block)), x.dtype)


fake_quantize_rows.defvjp(lambda x, block: (fake_quantize_rows(x, block), None), lambda block, _, g: (g,))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class BlockScaled:
    """A block-scaled FP8 weight ``[E, A, B]`` as the grouped GEMM takes it (a pytree: ``q`` and ``scale_inv`` are its
    leaves, ``block`` is static).

    Attributes:
      q: ``[E, A, B]`` float8_e4m3fn values.
      scale_inv: ``[E, ⌈A/bA⌉, ⌈B/bB⌉]`` float32, one factor per block (the value is ``q × scale_inv``).
      block: ``(bA, bB)``, the rows and columns one factor covers.
    """

    q: jax.Array
    scale_inv: jax.Array
    block: tuple[int, int] = dataclasses.field(metadata=dict(static=True))

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.q.shape)

    @property
    def ndim(self) -> int:
        return len(self.q.shape)

    @property
    def size(self) -> int:
        return int(self.q.size)

    @property
    def mT(self) -> BlockScaled:  # noqa: N802 (jax.Array's name)
        """The transposed weight ``[E, B, A]`` (values, scales and block swapped)."""
        return BlockScaled(jnp.swapaxes(self.q, -1, -2), jnp.swapaxes(self.scale_inv, -1, -2), self.block[::-1])

    def dequantize(self, dtype) -> jax.Array:
        """``[E, A, B]`` in ``dtype`` (`dequantize`)."""
        return dequantize(self.q, self.scale_inv, self.block, dtype)

    def check(self, where: str) -> BlockScaled:
        """This weight if its parts agree (dtypes, the scale grid of ``block``), else ValueError naming ``where``."""
        q, s = self.q, self.scale_inv
        block = tuple(int(b) for b in self.block) if len(self.block) == 2 else ()
        if len(block) != 2 or min(block) < 1:
            raise ValueError(f"{where}: BlockScaled.block must be two positive ints (bA, bB), got {self.block}")
        if q.ndim != 3 or jnp.dtype(q.dtype) != FP8_DTYPE:
            raise ValueError(f"{where}: BlockScaled.q must be [E, A, B] float8_e4m3fn, got {q.dtype}{list(q.shape)}")
        want = scale_shape(q.shape, block)
        if tuple(s.shape) != want or jnp.dtype(s.dtype) != jnp.float32:
            raise ValueError(
                f"{where}: BlockScaled.scale_inv must be float32{list(want)} (one factor per {block[0]}×{block[1]} "
                f"block of q {list(q.shape)}), got {s.dtype}{list(s.shape)}"
            )
        return BlockScaled(q, s, block)
