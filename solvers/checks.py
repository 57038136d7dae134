"""Argument checks shared by every package (numpy only): one rule per fact, one message style.

Each check returns the value converted (``int``, ``float``, a float64 or int64 array, a name) or raises
``ValueError`` naming the function (``where``), the argument, the offending value (with its index) and what is
expected. `fmt_ids` shortens long lists of offending ids.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from numbers import Integral, Real

import numpy as np

__all__ = ["check_array", "check_choice", "check_counter", "check_counts", "check_int", "check_real", "fmt_ids"]

# Integers beyond this are not exact in float64; integer arrays are refused above it.
_EXACT_INT = float(2**53)


def fmt_ids(ids: Iterable, limit: int = 10) -> str:
    """``[3, 7, …] (+n more)``: the first ``limit`` ids of a list, for error messages."""
    ids = [int(i) for i in ids]
    return str(ids[:limit]) + (f" … (+{len(ids) - limit} more)" if len(ids) > limit else "")


def _prefix(where: str) -> str:
    return f"{where}: " if where else ""


def check_int(name: str, value: object, *, minimum: int = 1, where: str = "") -> int:
    """``value`` as an ``int`` if it is an integer ``>= minimum`` (bools are not integers here)."""
    pre = _prefix(where)
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise ValueError(f"{pre}{name} must be an integer >= {minimum}, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{pre}{name} must be >= {minimum}, got {value}")
    return int(value)


def check_real(
    name: str,
    value: object,
    *,
    minimum: float = -math.inf,
    maximum: float = math.inf,
    strict: bool = False,
    allow_inf: bool = False,
    where: str = "",
) -> float:
    """``value`` as a ``float`` if it is a real number in ``[minimum, maximum]`` (``(minimum, maximum]`` when
    ``strict``), finite unless ``allow_inf``."""
    pre = _prefix(where)
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ValueError(f"{pre}{name} must be a real number, got {value!r} ({type(value).__name__})")
    v = float(value)
    if math.isnan(v) or (math.isinf(v) and not allow_inf):
        raise ValueError(f"{pre}{name} must be a finite number, got {v}")
    low = v <= minimum if strict else v < minimum
    if low or v > maximum:
        if math.isinf(maximum):
            raise ValueError(f"{pre}{name} must be {'>' if strict else '>='} {minimum}, got {v}")
        left = "(" if strict else "["
        raise ValueError(f"{pre}{name} must lie in {left}{minimum}, {maximum}], got {v}")
    return v


def check_choice(name: str, value: object, valid: Iterable[str], *, where: str = "") -> str:
    """``value`` if it is one of ``valid``, else ValueError listing them."""
    valid = tuple(valid)
    if not isinstance(value, str) or value not in valid:
        raise ValueError(f"{_prefix(where)}unknown {name} {value!r}; valid: {', '.join(repr(v) for v in valid)}")
    return value


def _at(name: str, arr: np.ndarray, mask: np.ndarray) -> str:
    """``name[i, j] = value`` of the first flagged entry."""
    flat = int(np.flatnonzero(mask.ravel())[0])
    idx = np.unravel_index(flat, arr.shape) if arr.ndim else ()
    where = "[" + ", ".join(str(int(i)) for i in idx) + "]" if idx else ""
    return f"{name}{where} = {arr.ravel()[flat].item()!r}"


def check_array(
    name: str,
    values: object,
    *,
    where: str = "",
    ndims: tuple[int, ...] | None = None,
    shape: tuple[int, ...] | None = None,
    nonnegative: bool = False,
    positive: bool = False,
    integer: bool = False,
    allow_inf: bool = False,
    hint: str = "",
) -> np.ndarray:
    """``values`` as a checked float64 array (int64 with ``integer=True``).

    Args:
      name: the argument's name; ``where``: the function's (both appear in the message).
      ndims / shape: allowed numbers of axes / the exact shape (None = any).
      nonnegative / positive: sign constraints (≥ 0 / > 0).
      integer: values must be whole numbers (|v| < 2^53); the result is int64.
      allow_inf: accept ``+inf`` entries (never NaN or −inf; not with ``integer``).
      hint: appended to shape errors (what the argument holds).

    Raises:
      ValueError: naming the argument and the first offending entry.
    """
    pre, fix = _prefix(where), f" ({hint})" if hint else ""
    raw = np.asarray(values)
    if raw.dtype == bool or raw.dtype.kind not in "iuf":
        raise ValueError(f"{pre}{name} must be a numeric array, got dtype {raw.dtype}{fix}")
    arr = raw.astype(np.float64)
    if ndims is not None and arr.ndim not in ndims:
        want = " or ".join(f"{d}-D" for d in ndims)
        raise ValueError(f"{pre}{name} must be {want}, got shape {arr.shape}{fix}")
    if shape is not None and arr.shape != tuple(shape):
        raise ValueError(f"{pre}{name} must have shape {tuple(shape)}, got {arr.shape}{fix}")
    bad = np.isnan(arr)
    if bad.any():
        raise ValueError(f"{pre}{name} contains NaN at {_at(name, arr, bad)}; pass finite numbers")
    bad = np.isinf(arr) & ((arr < 0) | (not allow_inf) | integer)
    if bad.any():
        raise ValueError(f"{pre}{name} must be finite, got {_at(name, arr, bad)}")
    if positive and (arr <= 0).any():
        raise ValueError(f"{pre}{name} must be > 0, got {_at(name, arr, arr <= 0)}")
    if nonnegative and (arr < 0).any():
        raise ValueError(f"{pre}{name} must be ≥ 0 (non-negative), got {_at(name, arr, arr < 0)}")
    if integer:
        bad = np.abs(arr) >= _EXACT_INT
        if bad.any():
            raise ValueError(f"{pre}{name} is too large for exact integer arithmetic, got {_at(name, arr, bad)}")
        bad = arr != np.round(arr)
        if bad.any():
            raise ValueError(f"{pre}{name} must be whole numbers (integer-valued), got {_at(name, arr, bad)}")
        return arr.astype(np.int64)
    return arr


def check_counts(name: str, counts: object, *, ndims: tuple[int, ...]) -> np.ndarray:
    """Token counts: a numeric array with ``ndim`` in ``ndims``, finite and ``>= 0``, dtype preserved."""
    arr = np.asarray(counts)
    check_array(name, arr, ndims=ndims, nonnegative=True)
    return arr


def check_counter(name: str, values: object, *, where: str = "", shape: tuple[int, ...] | None = None) -> np.ndarray:
    """A cumulative pair counter as uint32 (it wraps modulo 2^32): a uint32 array, or integers in [0, 2^32).

    Floats, bools, negative entries and entries ≥ 2^32 are refused (an int64 counter past 2^32 would be silently
    truncated, a float one has lost its low bits), naming the first offending entry.
    """
    pre = _prefix(where)
    arr = np.asarray(values)
    if arr.dtype == bool or arr.dtype.kind not in "iu":
        raise ValueError(
            f"{pre}{name} must be an unsigned 32-bit counter (uint32, wrapping modulo 2^32), got dtype {arr.dtype}; "
            "pass the layer's cumulative counter as it is"
        )
    if shape is not None and arr.shape != tuple(shape):
        raise ValueError(f"{pre}{name} must have shape {tuple(shape)}, got {arr.shape}")
    if arr.dtype != np.uint32:
        bad = (arr < 0) | (arr.astype(np.float64) >= 2.0**32)
        if bad.any():
            raise ValueError(f"{pre}{name} must hold counts in [0, 2^32) (a uint32 counter), got {_at(name, arr, bad)}")
    return arr.astype(np.uint32)
