"""Loaders for the real routing recordings in ``../shared/traces`` and the small bundled sample.

Every loader returns a :class:`~tempo_jax.workloads.trace.RoutingTrace`.

Where the recordings are looked for: the ``path`` argument if given (the recording's own folder or file),
else ``$TEMPO_JAX_TRACES/<relative path>`` if that environment variable is set, else
``<repo root>/../shared/traces/<relative path>`` (located from this file). A missing file raises
``FileNotFoundError`` naming the expected path and both ways to point elsewhere. :func:`load_sample` needs
none of them: it reads ``tempo_jax/data/routing_sample.npz`` (built by :func:`build_sample`).

Format decisions (see :data:`TRACES` for the names):

- ``flame_moe_290m``: ``layer_{2..9}.csv`` = ``layer_id,token_id,expert_0..expert_63`` router softmax
  scores with exactly 6 non-zeros per row. ``topk_ids [2048, 6]`` are the non-zero columns ordered by
  descending score (ties by expert id), ``topk_weights`` their scores (they sum to < 1: softmax over all
  64 experts). The CSV ``layer_id`` column is 0 in every file; layer ids come from the file names.
- ``mixtral_8x7b``: one JSON record per (problem, layer, generated token). Tokens are ordered problem 0
  then problem 1, each by ``token_idx``; ``topk_weights`` = ``gating_probs`` (renormalised over the top-2,
  they sum to 1). Layers hold 334–338 tokens (a few trailing tokens are missing in some layers), so T
  differs per layer and token t of two layers is not always the same token.
- ``harmoeny_switch128`` / ``harmoeny_qwen``: ``<rank>/moe_layer-<L>.csv``, one row per iteration, column
  ``expert distribution`` = JSON list of E counts of the tokens that rank sent to each expert (top-1).
  Loaded as ``rank_counts [I=2, Gs, E]``. In switch-exp128 layers 6–11 are degenerate: 85 tokens per rank
  (one per sequence: the decoder layers only see the decoder start token) on 1–6 experts, against 5,100
  for layers 0–5. They are excluded unless ``include_degenerate=True`` (a layer is degenerate when it
  records fewer tokens per rank than the recording's largest layer).
- ``switch128_npy``: ``int64 [40800, 6]``, one column per switch encoder layer 0–5. The rows are NOT
  tokens: they come in 8 blocks of 5,100 rows (one per rank, 85 sequences × 60) and inside each block
  every column is sorted on its own, so the repeated rows SOURCES.md calls padding are this sort (runs of
  equal ids), not padding, and the token identity across layers is lost. Consecutive chunks of rows
  would each hold one or two experts, so the file is loaded as per-rank counts ``rank_counts [1, 8, 128]``
  (the histogram of each block). These equal iteration 0 of ``harmoeny_switch128`` layers 0–5 exactly.
  No row is dropped: pad positions of short sequences, if any, are routed tokens in both recordings and
  cannot be told apart.

Bad files: every loader names the file (and the line where it can) in its error: ``ValueError`` for a file that
is truncated, not text, not numbers, or breaks the format (non-integer expert ids, NaN or negative scores, ...),
``FileNotFoundError`` for a missing one. Nothing is rounded or dropped silently.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import MappingProxyType

import numpy as np

from solvers.checks import ArgTypeError, check_input_file, check_instance, check_int, read_json, read_text

from .io import load_saved_trace, save_traces
from .trace import RoutingTrace

__all__ = [
    "TRACES",
    "TRACES_ENV",
    "TraceSpec",
    "build_sample",
    "load_flame_moe",
    "load_harmoeny",
    "load_mixtral",
    "load_sample",
    "load_switch128",
    "load_trace",
    "traces_dir",
]

TRACES_ENV = "TEMPO_JAX_TRACES"
SAMPLE_PATH = Path(__file__).resolve().parents[1] / "data" / "routing_sample.npz"
_HARMOENY_MODELS = {"switch-exp128": "harmoeny_switch128", "qwen": "harmoeny_qwen"}
_SWITCH128_RANKS = 8  # HarMoEny world_size of the switch-exp128 run that wrote 128.npy


def traces_dir() -> Path:
    """Root of the shared recordings: ``$TEMPO_JAX_TRACES`` if set, else ``<repo>/../shared/traces``."""
    env = os.environ.get(TRACES_ENV)
    if env:
        return Path(env).expanduser()
    return Path(__file__).resolve().parents[2].parent / "shared" / "traces"


def resolve_trace_path(
    path: str | os.PathLike | None, rel: str, what: str, *, holding: str, fallback: str, in_folder: bool = False
) -> Path:
    """The file or folder of a recording: ``path`` when given (with ``in_folder``, a folder given as ``path`` means
    the file ``rel``'s name inside it), else ``traces_dir() / rel``; a clear FileNotFoundError otherwise that says
    where it looked, how to point at the recording (``holding``: what the traces root holds) and what works without
    it (``fallback``)."""
    if path is not None:
        check_instance(f"{what} path", path, (str, os.PathLike), hint="pass a file or folder path, or None")
        p = Path(path).expanduser()
        if in_folder and p.is_dir():
            p = p / Path(rel).name
        if not p.exists():
            raise FileNotFoundError(f"{what}: {p} does not exist (expected {rel} of the shared traces)")
        return p
    root = traces_dir()
    p = root / rel
    if not p.exists():
        how = f"${TRACES_ENV}={os.environ[TRACES_ENV]}" if os.environ.get(TRACES_ENV) else "the default"
        raise FileNotFoundError(
            f"{what}: expected {p} (traces root {root}, from {how}). Pass path=<that {rel}>, or set "
            f"{TRACES_ENV} to the folder holding {holding}. {fallback}"
        )
    return p


def _resolve(path: str | os.PathLike | None, rel: str, what: str, name: str) -> Path:
    return resolve_trace_path(
        path,
        rel,
        what,
        holding="flame_moe_290m/, mixtral_8x7b/ and harmoeny/",
        fallback=f"load_sample({name!r}) works without the recordings.",
    )


# ---------------------------------------------------------------------------------------------- FLAME-MoE
def load_flame_moe(path: str | os.PathLike | None = None, layers: Iterable[int] | None = None) -> RoutingTrace:
    """FLAME-MoE-290M per-token top-6 routing: ``topk_ids[layer]`` int64 ``[2048, 6]``, E = 64, layers 2–9.

    Args:
        path: folder holding ``layer_<L>.csv`` (default: ``<traces>/flame_moe_290m``).
        layers: subset of layer ids to read (default: all files present).
    """
    folder = _resolve(path, "flame_moe_290m", "FLAME-MoE recording", "flame_moe_290m")
    files = {int(m.group(1)): f for f in folder.glob("layer_*.csv") if (m := re.fullmatch(r"layer_(\d+)\.csv", f.name))}
    if not files:
        raise FileNotFoundError(f"FLAME-MoE recording: no layer_<L>.csv in {folder}")
    if layers is None:
        wanted = sorted(files)
    else:
        if isinstance(layers, str | bytes) or not isinstance(layers, Iterable):
            raise ArgTypeError(f"load_flame_moe: layers must be a list of layer ids (ints), got {layers!r}")
        given = [check_int("layers[]", x, minimum=0, where="load_flame_moe") for x in layers]
        if len(set(given)) != len(given):
            raise ValueError(f"load_flame_moe: layers repeats a layer id: {given}")
        wanted = sorted(given)
        missing = [x for x in wanted if x not in files]
        if missing or not wanted:
            raise ValueError(f"FLAME-MoE layers {missing or wanted} not recorded; available layers: {sorted(files)}")
    ids, weights, E, K = {}, {}, None, None
    for layer in wanted:
        line_no, data = _read_flame_csv(files[layer])
        _check_flame_ids(files[layer], layer, line_no, data[:, 0], data[:, 1])
        order = np.argsort(data[:, 1], kind="stable")  # token order (already 0..T-1 in the recordings)
        scores = data[order, 2:]  # [T, E]
        bad = np.flatnonzero(~np.all(np.isfinite(scores) & (scores >= 0), axis=1))
        if bad.size:
            row = scores[bad[0]]
            col = int(np.flatnonzero(~(np.isfinite(row) & (row >= 0)))[0])
            raise ValueError(
                f"{files[layer]}:{line_no[order[bad[0]]]}: router scores must be finite and >= 0, got "
                f"expert_{col} = {row[col].item()!r}"
            )
        nnz = np.count_nonzero(scores, axis=1)
        if np.any(nnz != nnz[0]):
            odd = int(np.flatnonzero(nnz != nnz[0])[0])
            raise ValueError(
                f"{files[layer]}:{line_no[order[odd]]}: {nnz[odd]} non-zero experts, but the first row has "
                f"{nnz[0]}; every row must have the same K (rows have {sorted(set(nnz.tolist()))})"
            )
        if (E, K) != (None, None) and (E, K) != (scores.shape[1], int(nnz[0])):
            raise ValueError(f"{files[layer]}: E/K differ from the other layers")
        E, K = scores.shape[1], int(nnz[0])
        top = np.argsort(-scores, axis=1, kind="stable")[:, :K]
        ids[layer] = top
        weights[layer] = np.take_along_axis(scores, top, axis=1)
    return RoutingTrace(
        name="flame_moe_290m",
        model="FLAME-MoE-290M",
        num_experts=E,
        top_k=K,
        topk_ids=ids,
        topk_weights=weights,
        source=str(folder),
        notes=(
            "FLAME-MoE-290M (64 routed experts, top-6; the 2 shared experts are not logged), one batch of "
            "2,048 pretraining tokens (32 sequences x 64) per layer. Ids ordered by router score."
        ),
    )


def _check_flame_ids(file: Path, layer: int, line_no: np.ndarray, layer_id: np.ndarray, token_id: np.ndarray) -> None:
    """Every row of a FLAME file carries one ``layer_id`` (0, as the recordings write, or the file's layer) and
    distinct whole ``token_id``s ≥ 0; errors name the file and line."""
    bad = np.flatnonzero((layer_id != layer_id[0]) | ~np.isin(layer_id, (0, layer)))
    if bad.size:
        raise ValueError(
            f"{file}:{line_no[bad[0]]}: layer_id = {layer_id[bad[0]]:g}, but the file is layer {layer} "
            f"(rows must all carry 0, as the recordings do, or {layer})"
        )
    bad = np.flatnonzero((token_id < 0) | (token_id != np.round(token_id)))
    if bad.size:
        raise ValueError(f"{file}:{line_no[bad[0]]}: token_id must be a whole number >= 0, got {token_id[bad[0]]:g}")
    _, first, counts = np.unique(token_id, return_index=True, return_counts=True)
    if (counts > 1).any():
        dup = int(np.flatnonzero(counts > 1)[0])
        again = np.flatnonzero(token_id == token_id[first[dup]])[1]
        raise ValueError(f"{file}:{line_no[again]}: token_id {token_id[again]:g} repeats line {line_no[first[dup]]}")


def _read_flame_csv(file: Path) -> tuple[np.ndarray, np.ndarray]:
    """``(line numbers [T], values [T, 2 + E])`` of a FLAME ``layer_<L>.csv``; errors name the file and line."""
    lines = read_text(file, "FLAME-MoE layer file").splitlines()
    header = lines[0].strip().split(",") if lines else []
    experts = header[2:]
    if header[:2] != ["layer_id", "token_id"] or not experts or experts != [f"expert_{i}" for i in range(len(experts))]:
        raise ValueError(
            f"{file}:1: unexpected header {header[:4]}...; expected layer_id,token_id,expert_0,...,expert_<E-1>"
        )
    rows = [(n, line) for n, line in enumerate(lines[1:], 2) if line.strip()]
    if not rows:
        raise ValueError(f"{file}: no data rows after the header")
    try:
        data = np.loadtxt([line for _, line in rows], delimiter=",", ndmin=2)
    except ValueError as err:  # find the first bad line ourselves: numpy's message names neither file nor line
        for n, line in rows:
            cells = line.split(",")
            if len(cells) != len(header):
                raise ValueError(
                    f"{file}:{n}: {len(cells)} values, expected {len(header)} (layer_id, token_id and "
                    f"{len(experts)} expert scores); truncated?"
                ) from None
            for name, cell in zip(header, cells, strict=True):
                try:
                    float(cell)
                except ValueError:
                    raise ValueError(f"{file}:{n}: {name} = {cell.strip()[:40]!r} is not a number") from None
        raise ValueError(f"{file}: not a numeric CSV ({err})") from None
    return np.array([n for n, _ in rows]), data


# ------------------------------------------------------------------------------------------------ Mixtral
def _whole(value: object) -> int | None:
    """``value`` as an int if it is a JSON integer (or an integer-valued float), else None (bools are not)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _mixtral_record(raw: bytes, where: str, num_experts: int) -> tuple[int, int, int, list[int], list[float]]:
    """``(layer, problem_id, token_idx, experts, gating_probs)`` of one JSONL line, checked."""
    try:
        r = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"{where}: not UTF-8 text; is it a binary file?") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{where}: not a routing record (invalid JSON: {err.msg} at column {err.colno})") from None
    if not isinstance(r, dict):
        raise ValueError(f"{where}: not a routing record (expected a JSON object, got {type(r).__name__})")
    missing = [k for k in ("problem_id", "token_idx", "layer", "experts", "gating_probs") if k not in r]
    if missing:
        raise ValueError(f"{where}: not a routing record (missing {missing})")
    keys = []
    for k in ("layer", "problem_id", "token_idx"):
        v = _whole(r[k])
        if v is None or v < 0:
            raise ValueError(f"{where}: {k} must be an integer >= 0, got {r[k]!r}")
        keys.append(v)
    experts, probs = r["experts"], r["gating_probs"]
    if not isinstance(experts, list) or not experts:
        raise ValueError(f"{where}: experts must be a non-empty list of expert ids, got {experts!r}")
    ids = [_whole(e) for e in experts]
    bad = [e for e, i in zip(experts, ids, strict=True) if i is None or not 0 <= i < num_experts]
    if bad:
        raise ValueError(f"{where}: expert ids must be integers in [0, {num_experts}), got {bad[0]!r}")
    if len(set(ids)) != len(ids):
        raise ValueError(f"{where}: experts repeats an expert id: {experts!r}")
    if not isinstance(probs, list) or len(probs) != len(ids):
        raise ValueError(f"{where}: gating_probs must be a list of {len(ids)} numbers (one per expert), got {probs!r}")
    for v in probs:
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
            raise ValueError(f"{where}: gating_probs must be finite numbers >= 0, got {v!r}")
    return keys[0], keys[1], keys[2], ids, [float(v) for v in probs]


def load_mixtral(path: str | os.PathLike | None = None) -> RoutingTrace:
    """Mixtral-8x7B decode routing on 2 HumanEval problems: ``topk_ids[layer]`` int64 ``[T_layer, 2]``, E = 8.

    Args:
        path: the ``humaneval_2_routing.jsonl`` file (default: ``<traces>/mixtral_8x7b/...``).
    """
    file = _resolve(path, "mixtral_8x7b/humaneval_2_routing.jsonl", "Mixtral recording", "mixtral_8x7b")
    if file.is_dir():
        raise ValueError(f"Mixtral recording: {file} is a folder; pass the humaneval_2_routing.jsonl file")
    check_input_file(file, "Mixtral recording")
    rows: dict[int, list[tuple[int, int, list[int], list[float]]]] = {}
    with open(file, "rb") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            layer, *rec = _mixtral_record(line, f"{file}:{n}", 8)
            rows.setdefault(layer, []).append(tuple(rec))
    if not rows:
        raise ValueError(f"{file}: no routing records")
    ids, weights = {}, {}
    for layer, recs in rows.items():
        recs.sort(key=lambda r: (r[0], r[1]))
        keys = [(r[0], r[1]) for r in recs]
        if len(set(keys)) != len(keys):
            raise ValueError(f"{file}: layer {layer} repeats a (problem_id, token_idx) record")
        try:
            ids[layer] = np.array([r[2] for r in recs], dtype=np.int64)
            weights[layer] = np.array([r[3] for r in recs], dtype=np.float32)
        except ValueError as err:
            raise ValueError(f"{file}: layer {layer} records differ in their number of experts") from err
    ks = {a.shape[1] for a in ids.values()}
    if len(ks) != 1:
        raise ValueError(f"{file}: layers disagree on top-k: {sorted(ks)}")
    lengths = [a.shape[0] for a in ids.values()]
    return RoutingTrace(
        name="mixtral_8x7b",
        model="Mixtral-8x7B-Instruct",
        num_experts=8,
        top_k=ks.pop(),
        topk_ids=ids,
        topk_weights=weights,
        source=str(file),
        notes=(
            "vLLM decode on 2 HumanEval problems; tokens = problem 0 then problem 1 in token_idx order; "
            f"T per layer {min(lengths)}-{max(lengths)} (trailing tokens missing in some layers)."
        ),
    )


# ----------------------------------------------------------------------------------------------- HarMoEny
def _read_rank_csv(file: Path) -> np.ndarray:
    """``[I, E]`` int64 expert counts of one ``<rank>/moe_layer-<L>.csv``; errors name the file and line."""
    reader = csv.DictReader(io.StringIO(read_text(file, "HarMoEny rank file"), newline=""))
    if (
        reader.fieldnames is None
        or "expert distribution" not in reader.fieldnames
        or "iteration" not in reader.fieldnames
    ):
        raise ValueError(f"{file}:1: no 'iteration' and 'expert distribution' columns (header {reader.fieldnames})")
    out = []
    for i, row in enumerate(reader):
        where = f"{file}:{reader.line_num}"
        if None in row.values() or None in row:  # DictReader's marks of missing / extra cells
            raise ValueError(f"{where}: not {len(reader.fieldnames)} columns like the header; truncated?")
        if _int_cell(row["iteration"]) != i:
            raise ValueError(f"{where}: iteration {row['iteration']!r}, expected {i} (iterations 0, 1, ... in order)")
        try:
            dist = json.loads(row["expert distribution"])
        except json.JSONDecodeError as err:
            raise ValueError(f"{where}: expert distribution is not a JSON list ({err.msg})") from None
        counts = [_whole(v) for v in dist] if isinstance(dist, list) else [None]
        if not dist or any(v is None or v < 0 for v in counts):
            raise ValueError(
                f"{where}: expert distribution must be a list of integer counts >= 0, got {str(dist)[:60]}"
            )
        if out and len(counts) != len(out[0]):
            raise ValueError(f"{where}: {len(counts)} experts, but iteration 0 has {len(out[0])}")
        sent = row.get("total number of tokens sent")
        if sent is not None and _int_cell(sent) != sum(counts):
            raise ValueError(f"{where}: iteration {i} sums to {sum(counts)} tokens but reports {sent!r} sent")
        out.append(counts)
    if not out:
        raise ValueError(f"{file}: no iterations after the header")
    return np.array(out, dtype=np.int64)  # [I, E]


def _int_cell(cell: str) -> int | None:
    try:
        return _whole(float(cell))
    except (TypeError, ValueError):
        return None


def load_harmoeny(
    model: str = "switch-exp128", path: str | os.PathLike | None = None, *, include_degenerate: bool = False
) -> RoutingTrace:
    """HarMoEny per-rank top-1 counts: ``rank_counts[layer]`` int64 ``[I=2, Gs, E]``.

    ``"switch-exp128"``: google/switch-base-128, Gs = 8, E = 128, 5,100 tokens per rank, layers 0–5
    (6–11 are degenerate decoder layers with 85 tokens per rank; kept only with ``include_degenerate``).
    ``"qwen"``: Qwen1.5-MoE-A2.7B router taken top-1 (not its native top-4), Gs = 6, E = 60, 8,192 tokens
    per rank, layers 0–23.

    Args:
        model: ``"switch-exp128"`` or ``"qwen"``.
        path: the model folder holding ``<rank>/moe_layer-<L>.csv`` (default
            ``<traces>/harmoeny/raw_trace/<model>``).
        include_degenerate: keep layers recording fewer tokens per rank than the largest layer.
    """
    if not isinstance(model, str) or model not in _HARMOENY_MODELS:
        raise ValueError(f"HarMoEny model {model!r} unknown; choose one of {sorted(_HARMOENY_MODELS)}")
    check_instance("load_harmoeny: include_degenerate", include_degenerate, bool)
    name = _HARMOENY_MODELS[model]
    folder = _resolve(path, f"harmoeny/raw_trace/{model}", f"HarMoEny {model} recording", name)
    ranks = sorted(int(d.name) for d in folder.iterdir() if d.is_dir() and d.name.isdigit())
    if not ranks or ranks != list(range(len(ranks))):
        raise ValueError(f"{folder}: expected rank folders 0..Gs-1, found {ranks}")
    meta = {}
    if (folder / "data.json").exists():
        meta = read_json(folder / "data.json", "HarMoEny metadata")
        if not isinstance(meta, dict):
            raise ValueError(f"{folder / 'data.json'}: expected a JSON object, got {type(meta).__name__}")
    layer_files = [
        int(m.group(1))
        for f in (folder / "0").glob("moe_layer-*.csv")
        if (m := re.fullmatch(r"moe_layer-(\d+)\.csv", f.name))
    ]
    if not layer_files:
        raise FileNotFoundError(f"{folder / '0'}: no moe_layer-<L>.csv files")
    counts = {}
    for layer in sorted(layer_files):
        per_rank = []
        for r in ranks:
            file = folder / str(r) / f"moe_layer-{layer}.csv"
            if not file.exists():
                raise FileNotFoundError(f"{file} missing (rank 0 has layer {layer})")
            per_rank.append(_read_rank_csv(file))
        if len({a.shape for a in per_rank}) != 1:
            raise ValueError(f"{folder}: layer {layer} ranks disagree on iterations/experts")
        counts[layer] = np.stack(per_rank, axis=1)  # [I, Gs, E]
    num_experts = {a.shape[2] for a in counts.values()}
    if len(num_experts) != 1 or ("num_experts" in meta and _whole(meta["num_experts"]) not in num_experts):
        raise ValueError(
            f"{folder}: inconsistent expert counts {sorted(num_experts)} (data.json {meta.get('num_experts')})"
        )
    tokens = {layer: int(a.sum(axis=2).max()) for layer, a in counts.items()}
    degenerate = [layer for layer, t in tokens.items() if t < max(tokens.values())]
    if not include_degenerate:
        counts = {layer: a for layer, a in counts.items() if layer not in degenerate}
    notes = {
        "switch-exp128": "google/switch-base-128 (top-1) on bookcorpus, 8 ranks x 2 iterations x 5,100 tokens "
        "(85 sequences x 60).",
        "qwen": "Qwen1.5-MoE-A2.7B router taken top-1 (not its native top-4; shared expert not logged) on "
        "bookcorpus, 6 ranks x 2 iterations x 8,192 tokens (8 sequences x 1,024).",
    }[model]
    if degenerate:
        state = "kept (include_degenerate=True)" if include_degenerate else "excluded"
        notes += (
            f" Degenerate layers {degenerate} ({min(tokens[x] for x in degenerate)} tokens per rank, decoder "
            f"layers seeing one start token per sequence, 1-6 active experts): {state}."
        )
    return RoutingTrace(
        name=name,
        model=str(meta.get("model_name", model)),
        num_experts=num_experts.pop(),
        top_k=1,
        rank_counts=counts,
        source=str(folder),
        notes=notes,
    )


def load_switch128(path: str | os.PathLike | None = None) -> RoutingTrace:
    """ExFlow/HarMoEny ``128.npy`` (switch-base-128 encoder layers 0–5) as ``rank_counts [1, 8, 128]``.

    The file's rows are not tokens (each column is sorted within each rank's block of 5,100 rows; see the
    module docstring), so only the per-rank histograms are kept; they equal iteration 0 of
    :func:`load_harmoeny` ``("switch-exp128")``.

    Args:
        path: the ``.npy`` file (default ``<traces>/harmoeny/switch128_token_experts.npy``).
    """
    file = _resolve(path, "harmoeny/switch128_token_experts.npy", "switch-128 npy recording", "switch128_npy")
    check_input_file(file, "switch-128 npy recording")
    try:
        a = np.load(file, allow_pickle=False)
    except (OSError, ValueError, EOFError) as err:
        raise ValueError(f"{file}: not a readable .npy array ({err})") from None
    E, Gs = 128, _SWITCH128_RANKS
    if a.ndim != 2 or not np.issubdtype(a.dtype, np.integer) or a.shape[0] % Gs or a.shape[0] == 0:
        raise ValueError(
            f"{file}: expected an integer [T, layers] array with T a multiple of {Gs}, got {a.dtype} {a.shape}"
        )
    if a.min() < 0 or a.max() >= E:
        bad = np.argwhere((a < 0) | (a >= E))[0]
        raise ValueError(f"{file}: expert ids outside [0, {E}): row {bad[0]}, column {bad[1]} holds {a[tuple(bad)]}")
    blocks = a.reshape(Gs, a.shape[0] // Gs, a.shape[1])  # [Gs, T/Gs, L]
    counts = {
        layer: np.stack([np.bincount(blocks[s, :, layer], minlength=E) for s in range(Gs)])[None]
        for layer in range(a.shape[1])
    }
    sorted_blocks = bool(np.all(np.diff(blocks, axis=1) >= 0))
    return RoutingTrace(
        name="switch128_npy",
        model="google/switch-base-128",
        num_experts=E,
        top_k=1,
        rank_counts=counts,
        source=str(file),
        notes=(
            f"{a.shape[0]} rows = {Gs} rank blocks of {a.shape[0] // Gs}; "
            + (
                "each column is sorted within each block, so rows are not tokens: loaded as per-rank counts. "
                if sorted_blocks
                else "loaded as per-rank counts of each block. "
            )
            + "Equals iteration 0 of harmoeny_switch128 layers 0-5."
        ),
    )


# ----------------------------------------------------------------------------------------------- registry
@dataclass(frozen=True)
class TraceSpec:
    """A registered recording: its loader, its path under the traces root, and one line about it."""

    name: str
    loader: Callable[..., RoutingTrace]
    relpath: str
    description: str


TRACES: Mapping[str, TraceSpec] = MappingProxyType(
    {
        "flame_moe_290m": TraceSpec(
            "flame_moe_290m", load_flame_moe, "flame_moe_290m", "FLAME-MoE-290M, E=64 K=6, 2,048 tokens, layers 2-9"
        ),
        "mixtral_8x7b": TraceSpec(
            "mixtral_8x7b",
            load_mixtral,
            "mixtral_8x7b/humaneval_2_routing.jsonl",
            "Mixtral-8x7B decode, E=8 K=2, 334-338 tokens, layers 0-31",
        ),
        "harmoeny_switch128": TraceSpec(
            "harmoeny_switch128",
            partial(load_harmoeny, "switch-exp128"),
            "harmoeny/raw_trace/switch-exp128",
            "switch-base-128 per-rank counts, E=128 K=1, Gs=8, 2 x 5,100 tokens/rank, layers 0-5",
        ),
        "harmoeny_qwen": TraceSpec(
            "harmoeny_qwen",
            partial(load_harmoeny, "qwen"),
            "harmoeny/raw_trace/qwen",
            "Qwen1.5-MoE router top-1 per-rank counts, E=60 K=1, Gs=6, 2 x 8,192 tokens/rank, layers 0-23",
        ),
        "switch128_npy": TraceSpec(
            "switch128_npy",
            load_switch128,
            "harmoeny/switch128_token_experts.npy",
            "switch-base-128 128.npy as per-rank counts, E=128 K=1, Gs=8, 5,100 tokens/rank, layers 0-5",
        ),
    }
)


def _check_name(name: object) -> str:
    if not isinstance(name, str) or name not in TRACES:
        raise ValueError(f"unknown trace {name!r}; registered traces: {sorted(TRACES)}")
    return str(name)


def load_trace(name: str, path: str | os.PathLike | None = None, **kwargs) -> RoutingTrace:
    """Load registered recording ``name`` (a key of :data:`TRACES`); ``kwargs`` go to its loader."""
    return TRACES[_check_name(name)].loader(path=path, **kwargs)


# ------------------------------------------------------------------------------------------------- sample
def build_sample(out: str | os.PathLike | None = None) -> Path:
    """Write the bundled sample (every registered trace, default layers, ids/counts only) to ``out``.

    Ids and counts are stored in the smallest integer dtype in a compressed ``.npz`` (about 0.1 MB); router
    weights are not kept. Default ``out``: ``tempo_jax/data/routing_sample.npz``.
    """
    return save_traces((load_trace(name) for name in TRACES), out if out is not None else SAMPLE_PATH)


def load_sample(name: str = "flame_moe_290m") -> RoutingTrace:
    """The bundled copy of registered trace ``name`` (same ids/counts as the full recording, no weights).

    Works without ``../shared/traces``; the package data file is ``tempo_jax/data/routing_sample.npz``.
    """
    name = _check_name(name)
    if not SAMPLE_PATH.exists():
        raise FileNotFoundError(f"bundled sample {SAMPLE_PATH} missing; rebuild it with build_sample()")
    trace = load_saved_trace(SAMPLE_PATH, name)
    return dataclasses.replace(trace, source=f"{SAMPLE_PATH} (sample)")
