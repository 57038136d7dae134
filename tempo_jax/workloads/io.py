"""Files of workloads: `RoutingTrace`s saved and loaded as ``.npz`` (the format of the bundled sample and of locally
recorded traces), and `load_array`, a batch of counts (or any array) from a ``.npz`` / ``.npy`` / JSON file.

Layout: for each trace ``name``: ``{name}__meta`` (JSON: model, num_experts, top_k, notes) and per layer either
``{name}__ids__{layer}`` ``[T, K]`` or ``{name}__counts__{layer}`` ``[I, Gs, E]``, stored in the smallest
integer dtype that holds them. Router weights are not kept.
"""

from __future__ import annotations

import json
import os
import zipfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from solvers.checks import MAX_INPUT_BYTES, check_input_file, check_instance, read_json

from .trace import RoutingTrace

__all__ = ["load_array", "load_saved_trace", "save_traces", "saved_trace_names"]


def _compact(a: np.ndarray) -> np.ndarray:
    hi = int(a.max(initial=0))
    for dtype in (np.int8, np.int16, np.int32):
        if hi <= np.iinfo(dtype).max:
            return a.astype(dtype)
    return a.astype(np.int64)


def save_traces(traces: Iterable[RoutingTrace], path: str | os.PathLike) -> Path:
    """Write ``traces`` (distinct names) to one compressed ``.npz`` at ``path``; returns the path."""
    out = Path(path)
    arrays: dict[str, np.ndarray] = {}
    for t in traces:
        if f"{t.name}__meta" in arrays:
            raise ValueError(f"two traces named {t.name!r}; names must be unique within a file")
        meta = {"model": t.model, "num_experts": t.num_experts, "top_k": t.top_k, "notes": t.notes}
        arrays[f"{t.name}__meta"] = np.array(json.dumps(meta))
        for layer in t.layers:
            kind, a = ("ids", t.topk_ids[layer]) if t.per_token else ("counts", t.rank_counts[layer])
            arrays[f"{t.name}__{kind}__{layer}"] = _compact(a)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out, **arrays)
    return out


def _open(p: Path):
    """``np.load`` of a saved-trace file; a file that is not one raises ValueError naming it."""
    if p.is_dir():
        raise ValueError(f"{p} is a folder, not a saved trace file (.npz)")
    check_input_file(p, "saved trace file")
    try:
        z = np.load(p, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise ValueError(f"{p}: not a saved trace file (.npz written by save_traces): {err}") from None
    if not isinstance(z, np.lib.npyio.NpzFile):
        raise ValueError(f"{p}: a single .npy array, not a saved trace file (.npz written by save_traces)")
    return z


def saved_trace_names(path: str | os.PathLike) -> list[str]:
    """Names of the traces stored in ``path``."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"no saved trace file at {p}")
    with _open(p) as z:
        return sorted(k[: -len("__meta")] for k in z.files if k.endswith("__meta"))


def load_saved_trace(path: str | os.PathLike, name: str | None = None) -> RoutingTrace:
    """Read trace ``name`` (default: the only one in the file) back from ``path``.

    Raises:
      FileNotFoundError: no file at ``path``.
      ValueError: naming the file: not a saved-trace ``.npz`` (garbage, truncated), no trace ``name``, or a
        damaged entry.
    """
    check_instance("load_saved_trace: path", path, (str, os.PathLike))
    if name is not None:
        check_instance("load_saved_trace: name", name, str, hint="a trace name, or None for the only one")
    p = Path(path)
    names = saved_trace_names(p)
    if name is None:
        if len(names) != 1:
            raise ValueError(f"{p} holds traces {names}; pass name=")
        name = names[0]
    if name not in names:
        raise ValueError(f"{p} has no trace {name!r}; it holds {names}")
    ids, counts = {}, {}
    try:
        with _open(p) as z:
            meta = json.loads(str(z[f"{name}__meta"]))
            for key in z.files:
                parts = key.split("__")
                if len(parts) == 3 and parts[0] == name:
                    (ids if parts[1] == "ids" else counts)[int(parts[2])] = z[key]
        return RoutingTrace(
            name=name,
            model=meta["model"],
            num_experts=meta["num_experts"],
            top_k=meta["top_k"],
            topk_ids=ids or None,
            rank_counts=counts or None,
            source=str(p),
            notes=meta["notes"],
        )
    except (KeyError, TypeError, ValueError, OSError, EOFError, zipfile.BadZipFile) as err:
        raise ValueError(f"{p}: trace {name!r} is damaged ({type(err).__name__}: {err})") from None


def _check_member_size(p: Path, key: str, option: str) -> None:
    """Refuse a ``.npz`` member whose header declares more than `MAX_INPUT_BYTES` (read from the header alone)."""
    try:
        with zipfile.ZipFile(p) as zf, zf.open(f"{key}.npy") as f:
            version = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _, dtype = read(f)
    except (KeyError, ValueError, OSError, zipfile.BadZipFile) as err:
        raise ValueError(
            f"{option} {p}: array {key!r} has an unreadable header ({type(err).__name__}: {err})"
        ) from None
    nbytes = int(np.prod(shape, dtype=object)) * dtype.itemsize
    if nbytes > MAX_INPUT_BYTES:
        raise ValueError(
            f"{option} {p}: array {key!r} declares shape {list(shape)} of {dtype} ({nbytes:,} bytes), beyond the "
            f"{MAX_INPUT_BYTES:,}-byte input limit (solvers.checks.MAX_INPUT_BYTES)"
        )


def load_array(path, key: str, option: str = "--counts") -> np.ndarray:
    """An array from a file: ``key`` of a ``.npz``, a ``.npy`` array, or a JSON list / ``{key: list}`` (e.g. token
    counts ``[E]`` or ``[D, E]``). Every error is a ValueError naming ``option`` and the file."""
    try:
        p = check_input_file(path, option)
    except FileNotFoundError as err:
        raise ValueError(str(err)) from None
    except ValueError as err:
        raise ValueError(f"{err} (a .json, .npy or .npz file)") from None
    if p.suffix in (".npz", ".npy"):
        try:
            loaded = np.load(p, allow_pickle=False)
        except Exception as err:  # numpy/zipfile raise many types for a damaged file
            raise ValueError(f"{option} {path}: not a readable {p.suffix} file ({type(err).__name__}: {err})") from None
        if isinstance(loaded, np.ndarray):
            return loaded
        with loaded as z:
            if key not in z.files:
                raise ValueError(f"{option} {path} has no array {key!r} (arrays: {z.files})")
            _check_member_size(p, key, option)  # a small zip can declare a huge array: bounded before reading
            return z[key]
    data = read_json(p, option)
    if isinstance(data, dict):
        if key not in data:
            raise ValueError(
                f"{option} {path}: JSON object without a {key!r} key (keys: {sorted(data)}); give "
                f'{{"{key}": [...]}} or a bare list'
            )
        data = data[key]
    try:
        return np.asarray(data)
    except ValueError as err:  # ragged lists
        raise ValueError(f"{option} {path}: {key} is not a rectangular array ({err})") from None
