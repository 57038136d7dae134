"""Numeric assertions shared by the layer tests."""

import numpy as np


def f32_close(a, b, atol=2e-5, rtol=2e-5):
    """The float32 tolerance of the layer tests; finiteness first."""
    a, b = np.asarray(a), np.asarray(b)
    assert np.isfinite(a).all() and np.isfinite(b).all()
    np.testing.assert_allclose(a, b, atol=atol, rtol=rtol)
