"""Argument checks shared by every package (numpy only): one rule per fact, one message style.

Each check returns the value converted (``int``, ``float``, a float64 or int64 array, a name) or raises an
error naming the function (``where``), the argument, the offending value (with its index) and what is expected:
``ValueError`` for a bad value or shape, `ArgTypeError` for a value of the wrong type. `ArgTypeError` is a
``TypeError`` that is also a ``ValueError``, so callers that catch either keep working. `fmt_ids` shortens long
lists of offending ids; `check_instance` and `check_fields` cover objects and JSON-like records;
`read_text` / `read_json` read a file and name it (and the line) in every error.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping
from numbers import Integral, Real
from pathlib import Path

import numpy as np

__all__ = [
    "ArgTypeError",
    "EXACT_INT_LIMIT",
    "MAX_INPUT_BYTES",
    "check_array",
    "check_choice",
    "check_counter",
    "check_counts",
    "check_fields",
    "check_input_file",
    "check_instance",
    "check_int",
    "check_real",
    "fmt_ids",
    "read_json",
    "read_text",
]

#: Largest input file (bytes) any loader reads: inputs are read whole (the shared recordings are ≤ 10 MB each).
MAX_INPUT_BYTES = 256 * 2**20

# Integers beyond this are not exact in float64; integer arrays are refused above it.
EXACT_INT_LIMIT = float(2**53)


class ArgTypeError(TypeError, ValueError):
    """An argument of the wrong type (a string where a number belongs, None for a placement, …).

    A ``TypeError``; also a ``ValueError`` so that code written against the earlier checks (which raised
    ``ValueError`` for every bad argument) still catches it.
    """


def _kind(value: object) -> str:
    return f"{value!r} ({type(value).__name__})" if len(repr(value)) <= 60 else f"a {type(value).__name__}"


def fmt_ids(ids: Iterable, limit: int = 10) -> str:
    """``[3, 7, …] (+n more)``: the first ``limit`` ids of a list, for error messages."""
    ids = [int(i) for i in ids]
    return str(ids[:limit]) + (f" … (+{len(ids) - limit} more)" if len(ids) > limit else "")


def _prefix(where: str) -> str:
    return f"{where}: " if where else ""


def plain_scalars(obj) -> None:
    """Replace every numpy scalar field of the (frozen) dataclass ``obj`` by the Python number it holds (`int`,
    `float`, `bool`), and a tuple or list field's numpy scalars likewise: a config built with ``np.int64(4)`` then
    behaves exactly as one built with ``4`` (``isinstance(v, int)`` checks, JSON records, hashing). Call it first in
    ``__post_init__``."""
    import dataclasses

    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if isinstance(v, np.generic):
            object.__setattr__(obj, f.name, v.item())
        elif isinstance(v, tuple | list) and any(isinstance(x, np.generic) for x in v):
            object.__setattr__(obj, f.name, type(v)(x.item() if isinstance(x, np.generic) else x for x in v))


def check_int(name: str, value: object, *, minimum: int = 1, where: str = "") -> int:
    """``value`` as an ``int`` if it is an integer ``>= minimum`` (bools are not integers here); `ArgTypeError` for
    a non-integer (``"2"``, ``2.0``), ``ValueError`` below ``minimum``."""
    pre = _prefix(where)
    if isinstance(value, bool | np.bool_) or not isinstance(value, Integral):
        raise ArgTypeError(f"{pre}{name} must be an integer >= {minimum}, got {_kind(value)}")
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
    if isinstance(value, bool | np.bool_) or not isinstance(value, Real):
        raise ArgTypeError(f"{pre}{name} must be a real number, got {_kind(value)}")
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
        err, shown = (ValueError, repr(value)) if isinstance(value, str) else (ArgTypeError, _kind(value))
        raise err(f"{_prefix(where)}unknown {name} {shown}; valid: {', '.join(repr(v) for v in valid)}")
    return value


def check_instance(
    name: str, value: object, cls: type | tuple[type, ...], *, where: str = "", hint: str = ""
) -> object:
    """``value`` if it is an instance of ``cls``, else `ArgTypeError` naming the expected and the given type."""
    if not isinstance(value, cls):
        want = " or ".join(c.__name__ for c in (cls if isinstance(cls, tuple) else (cls,)))
        fix = f"; {hint}" if hint else ""
        raise ArgTypeError(f"{_prefix(where)}{name} must be a {want}, got {_kind(value)}{fix}")
    return value


def check_fields(
    name: str, record: object, required: Iterable[str], optional: Iterable[str] = (), *, where: str = ""
) -> Mapping:
    """``record`` if it is a mapping with every ``required`` key and no key outside ``required + optional``."""
    required, optional = tuple(required), tuple(optional)
    pre = _prefix(where)
    form = "{" + ", ".join([*required, *(f"[{k}]" for k in optional)]) + "}"
    if not isinstance(record, Mapping):
        raise ArgTypeError(f"{pre}{name} must be a mapping {form}, got {_kind(record)}")
    missing = [k for k in required if k not in record]
    if missing:
        raise ValueError(f"{pre}{name} lacks {missing} (has {sorted(map(str, record))}); give {form}")
    unknown = sorted(str(k) for k in record if k not in required and k not in optional)
    if unknown:
        raise ValueError(f"{pre}{name} has unknown field(s) {unknown}; valid: {form}")
    return record


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
      ValueError: naming the argument and the first offending entry (or the shape, or a ragged nesting).
      ArgTypeError: values that are not numbers (strings, None, objects, bools, complex).
    """
    pre, fix = _prefix(where), f" ({hint})" if hint else ""
    try:
        raw = np.asarray(values)
    except (ValueError, TypeError) as err:  # ragged nested lists
        raise ValueError(f"{pre}{name} must be a rectangular numeric array ({err}){fix}") from None
    if raw.dtype == bool or raw.dtype.kind not in "iuf":
        raise ArgTypeError(f"{pre}{name} must be a numeric array, got dtype {raw.dtype}{fix}")
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
        bad = np.abs(arr) >= EXACT_INT_LIMIT
        if bad.any():
            raise ValueError(
                f"{pre}{name} is too large for exact integer arithmetic, got {_at(name, arr, bad)}; "
                "whole numbers must stay below 2^53 ≈ 9.0e15"
            )
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


def check_input_file(path: str | os.PathLike, what: str = "file", *, max_bytes: int = MAX_INPUT_BYTES) -> Path:
    """``path`` as a `Path` if it names a regular file of at most ``max_bytes`` bytes: every input file is read
    whole, so devices (``/dev/zero``), pipes and oversized files are refused before any read.

    Raises:
      ArgTypeError: ``path`` is not a str or path-like.
      FileNotFoundError: nothing at ``path``.
      ValueError: a folder, a device or other non-regular file, or a file over ``max_bytes``.
    """
    if not isinstance(path, str | os.PathLike):
        raise ArgTypeError(f"{what} must be a path (str or os.PathLike), got {_kind(path)}")
    p = Path(path).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"{what} {p} does not exist")
    if p.is_dir():
        raise ValueError(f"{what} {p} is a folder; give a file")
    if not p.is_file():
        raise ValueError(f"{what} {p} is not a regular file (a device, pipe or socket); give a file")
    size = p.stat().st_size
    if size > max_bytes:
        raise ValueError(f"{what} {p} is {size / 2**20:,.0f} MiB, over the {max_bytes / 2**20:,.0f} MiB read limit")
    return p


def read_text(path: str | os.PathLike, what: str = "file") -> str:
    """The text of ``path`` (UTF-8). Raises ``FileNotFoundError`` for a missing file and ``ValueError`` for a
    folder, a device, a file over `MAX_INPUT_BYTES`, an unreadable file or bytes that are not UTF-8 text; every
    message names ``what`` and the path (see `check_input_file`)."""
    p = check_input_file(path, what)
    try:
        data = p.read_bytes()
    except OSError as err:
        raise ValueError(f"{what} {p} cannot be read ({err.strerror or err})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise ValueError(f"{what} {p}:{line}: not UTF-8 text (byte {err.start}); is it a binary file?") from None


def read_json(path: str | os.PathLike, what: str = "JSON file") -> object:
    """The parsed JSON of ``path``; syntax errors name the file, line and column (see `read_text`)."""
    text = read_text(path, what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{what} {path}:{err.lineno}:{err.colno}: invalid JSON ({err.msg})") from None


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
