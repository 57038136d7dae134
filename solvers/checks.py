"""Argument checks shared by every package (numpy only): one rule per fact, one message style.

Each check returns the value converted (``int``, ``float`` or a float64/int64 array) or raises ``ValueError``
naming the argument, what was wrong and the valid range. `fmt_ids` shortens long lists of offending ids.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from numbers import Integral, Real

import numpy as np

__all__ = ["check_array", "check_counts", "check_int", "check_real", "fmt_ids"]


def fmt_ids(ids: Iterable, limit: int = 10) -> str:
    """``[3, 7, …] (+n more)``: the first ``limit`` ids of a list, for error messages."""
    ids = [int(i) for i in ids]
    return str(ids[:limit]) + (f" … (+{len(ids) - limit} more)" if len(ids) > limit else "")


def check_int(name: str, value: object, *, minimum: int = 1) -> int:
    """``value`` as an ``int`` if it is an integer ``>= minimum`` (bools are not integers here)."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def check_real(
    name: str, value: object, *, minimum: float = -math.inf, strict: bool = False, allow_inf: bool = False
) -> float:
    """``value`` as a ``float`` if it is a real number ``>= minimum`` (``>`` when ``strict``), finite unless
    ``allow_inf``."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ValueError(f"{name} must be a real number, got {value!r} ({type(value).__name__})")
    v = float(value)
    if math.isnan(v) or (math.isinf(v) and not allow_inf):
        raise ValueError(f"{name} must be finite, got {v}")
    if v < minimum or (strict and v == minimum):
        raise ValueError(f"{name} must be {'>' if strict else '>='} {minimum}, got {v}")
    return v


def check_array(
    name: str,
    values: object,
    *,
    ndims: tuple[int, ...] | None = None,
    nonnegative: bool = True,
    integer: bool = False,
) -> np.ndarray:
    """``values`` as a float64 array: numeric (not bool), ``ndim`` in ``ndims``, finite, ``>= 0`` when
    ``nonnegative`` and integer-valued when ``integer``.

    Raises:
      ValueError: naming ``name`` and the first offending positions.
    """
    arr = np.asarray(values)
    if arr.dtype == bool or arr.dtype.kind not in "iuf":
        raise ValueError(f"{name} must be a numeric array, got dtype {arr.dtype}")
    if ndims is not None and arr.ndim not in ndims:
        want = " or ".join(f"{d}-D" for d in ndims)
        raise ValueError(f"{name} must be {want}, got shape {arr.shape}")
    arr = arr.astype(np.float64)
    bad = ~np.isfinite(arr)
    if bad.any():
        raise ValueError(f"{name} contains NaN or inf at {fmt_ids(np.flatnonzero(bad))} (flat positions)")
    if nonnegative and arr.size and arr.min() < 0:
        raise ValueError(
            f"{name} must be non-negative; negative values (min {arr.min():.6g}) at "
            f"{fmt_ids(np.flatnonzero(arr < 0))} (flat positions)"
        )
    if integer and np.any(arr != np.round(arr)):
        raise ValueError(f"{name} must be integer-valued counts (got fractional values)")
    return arr


def check_counts(name: str, counts: object, *, ndims: tuple[int, ...]) -> np.ndarray:
    """Token counts: a numeric array with ``ndim`` in ``ndims``, finite and ``>= 0``, dtype preserved."""
    arr = np.asarray(counts)
    check_array(name, arr, ndims=ndims)
    return arr
