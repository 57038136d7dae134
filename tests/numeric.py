"""The suite's one tolerance helper per dtype.

Rule: outputs of *different* programs (another dispatch table, schedule, capacity, exchange, kernel, process or jax
release) agree to their dtype's tolerance, never bit for bit: float reassociation differs between them. Exact
equality is kept for integers (counts, ids, slots) and for the same compiled program run twice.
"""

import jax
import jax.numpy as jnp
import numpy as np

# Relative to the largest expected magnitude; float32 accumulation everywhere, so bfloat16 inputs get bf16's 2^-7.
TOL = {jnp.dtype(jnp.float32): 2e-5, jnp.dtype(jnp.bfloat16): 2e-2, jnp.dtype(jnp.float64): 1e-12}


def tolerance(dtype) -> float:
    """The relative tolerance of ``dtype`` (float32, bfloat16 or float64)."""
    return TOL[jnp.dtype(dtype)]


def assert_close(actual, expected, dtype=jnp.float32, scale=None):
    """Finite first, then equal within ``dtype``'s tolerance: ``rtol = atol / scale = tol``.

    ``scale`` defaults to the largest ``|expected|``: an element far below the array's magnitude is round-off.
    """
    actual, expected = np.asarray(actual).astype(np.float64), np.asarray(expected).astype(np.float64)
    assert np.isfinite(actual).all(), "non-finite values in the result"
    assert np.isfinite(expected).all(), "non-finite values in the reference"
    tol = tolerance(dtype)
    big = np.abs(expected).max() if expected.size else 0.0
    np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol * (big if scale is None else scale))


def assert_trees_close(actual, expected, dtype=jnp.float32):
    """Leaf by leaf, to the tolerance of the largest value anywhere in ``expected`` (a tiny leaf is round-off)."""
    la, lb = jax.tree.leaves(actual), jax.tree.leaves(expected)
    assert len(la) == len(lb), f"{len(la)} leaves against {len(lb)}"
    scale = max((float(np.abs(np.asarray(x)).max()) for x in lb if np.size(x)), default=0.0)
    for a, b in zip(la, lb, strict=True):
        assert_close(a, b, dtype, scale=scale)


def f32_close(a, b, atol=2e-5, rtol=2e-5):
    """The float32 tolerance of the layer tests with explicit bounds; finiteness first."""
    a, b = np.asarray(a), np.asarray(b)
    assert np.isfinite(a).all() and np.isfinite(b).all()
    np.testing.assert_allclose(a, b, atol=atol, rtol=rtol)
