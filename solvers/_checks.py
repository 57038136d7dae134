"""Input checks shared by the CascadeEP planners (attention, throughput, streamffn, oewf).

Every failure is a ``ValueError`` that names the function, the argument, the offending value (with its
index) and what to do instead. numpy only.
"""

from __future__ import annotations

import numpy as np

__all__ = ["as_array", "as_scalar", "choice"]


def _at(arr: np.ndarray, mask: np.ndarray) -> str:
    """``name-free`` description of the first flagged entry: ``[i, j] = value``."""
    flat = int(np.flatnonzero(mask.ravel())[0])
    idx = np.unravel_index(flat, arr.shape) if arr.ndim else ()
    where = "[" + ", ".join(str(int(i)) for i in idx) + "]" if idx else ""
    return f"{where} = {arr.ravel()[flat].item()!r}"


def as_array(
    fn: str,
    name: str,
    value,
    *,
    ndim: int | None = None,
    shape: tuple[int, ...] | None = None,
    integer: bool = False,
    nonneg: bool = False,
    positive: bool = False,
    allow_inf: bool = False,
    hint: str = "",
) -> np.ndarray:
    """Validated copy of ``value`` as float64 (or int64 with ``integer=True``).

    Args:
      fn, name: function and argument names used in the message.
      ndim / shape: required rank / exact shape (``None`` = any).
      integer: values must be integral; returns int64.
      nonneg / positive: sign constraints.
      allow_inf: accept ``+inf`` entries (never NaN); not with ``integer``.
      hint: appended to shape errors (what the argument means).
    """
    fix = f" ({hint})" if hint else ""
    try:
        raw = np.asarray(value)
        arr = raw.astype(np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{fn}: {name} must be numeric, got {value!r}{fix}") from err
    if raw.dtype == bool:
        raise ValueError(f"{fn}: {name} must be numeric, got a boolean array{fix}")
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"{fn}: {name} must be {ndim}-D, got shape {arr.shape}{fix}")
    if shape is not None and arr.shape != tuple(shape):
        raise ValueError(f"{fn}: {name} must have shape {tuple(shape)}, got {arr.shape}{fix}")
    bad = np.isnan(arr)
    if bad.any():
        raise ValueError(f"{fn}: {name} contains NaN at {name}{_at(arr, bad)}; pass finite numbers")
    bad = np.isinf(arr) & ((arr < 0) | (not allow_inf) | integer)
    if bad.any():
        raise ValueError(f"{fn}: {name} must be finite, got {name}{_at(arr, bad)}")
    if positive and (arr <= 0).any():
        raise ValueError(f"{fn}: {name} must be > 0, got {name}{_at(arr, arr <= 0)}")
    if nonneg and (arr < 0).any():
        raise ValueError(f"{fn}: {name} must be ≥ 0, got {name}{_at(arr, arr < 0)}")
    if integer:
        bad = np.abs(arr) >= 2.0**62
        if bad.any():
            raise ValueError(f"{fn}: {name} is too large for int64 arithmetic, got {name}{_at(arr, bad)}")
        bad = arr != np.round(arr)
        if bad.any():
            raise ValueError(f"{fn}: {name} must be whole numbers, got {name}{_at(arr, bad)}")
        # Integer inputs keep full int64 precision; integral floats are rounded exactly.
        return raw.astype(np.int64) if np.issubdtype(raw.dtype, np.integer) else np.round(arr).astype(np.int64)
    return arr


def as_scalar(fn: str, name: str, value, *, lo=None, lo_open=False, hi=None, allow_inf=False) -> float:
    """Validated float in the interval given by ``lo`` (open when ``lo_open``) and ``hi`` (closed)."""
    try:
        v = float(value)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{fn}: {name} must be a number, got {value!r}") from err
    if v != v or (not allow_inf and v in (float("inf"), float("-inf"))):
        raise ValueError(f"{fn}: {name} must be a finite number, got {value!r}")
    too_low = lo is not None and (v <= lo if lo_open else v < lo)
    if too_low or (hi is not None and v > hi):
        left = "(" if lo_open else "["
        raise ValueError(
            f"{fn}: {name} must lie in {left}{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}], got {v!r}"
        )
    return v


def choice(fn: str, name: str, value, valid: tuple[str, ...]) -> str:
    """``value`` if it is one of ``valid``, else a ValueError listing the valid names."""
    if value not in valid:
        raise ValueError(f"{fn}: unknown {name} {value!r}; valid: {', '.join(repr(v) for v in valid)}")
    return value
