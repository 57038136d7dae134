"""Small argument checks shared by the workloads modules (numpy only)."""

from __future__ import annotations

import math
from numbers import Integral, Real

import numpy as np


def check_int(name: str, value: object, *, minimum: int = 1) -> int:
    """Return ``value`` as an ``int`` if it is an integer ``>= minimum``, else raise ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def check_real(
    name: str, value: object, *, minimum: float = -math.inf, strict: bool = False, allow_inf: bool = False
) -> float:
    """Return ``value`` as a ``float`` if it is a real number ``>= minimum`` (``>`` when ``strict``)."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ValueError(f"{name} must be a real number, got {value!r} ({type(value).__name__})")
    v = float(value)
    if math.isnan(v) or (math.isinf(v) and not allow_inf):
        raise ValueError(f"{name} must be finite, got {v}")
    if v < minimum or (strict and v == minimum):
        raise ValueError(f"{name} must be {'>' if strict else '>='} {minimum}, got {v}")
    return v


def check_counts(name: str, counts: object, *, ndims: tuple[int, ...]) -> np.ndarray:
    """Return ``counts`` as a numeric array with ``ndim`` in ``ndims``, all finite and ``>= 0``."""
    arr = np.asarray(counts)
    if arr.dtype == bool or not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)):
        raise ValueError(f"{name} must be a numeric array, got dtype {arr.dtype}")
    if arr.ndim not in ndims:
        want = " or ".join(f"{d}-D" for d in ndims)
        raise ValueError(f"{name} must be {want}, got shape {arr.shape}")
    if np.issubdtype(arr.dtype, np.floating) and not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or infinite entries")
    if arr.size and arr.min() < 0:
        raise ValueError(f"{name} contains negative entries (min {arr.min()})")
    return arr
