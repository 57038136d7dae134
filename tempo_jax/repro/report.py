"""Figure and result folders, and the notebooks' recorded numbers.

- :func:`figures_dir`, :func:`results_dir`: where notebooks write figures and their JSON.
- :class:`Recorder`: what a notebook computed, as JSON (``results/notebooks/<notebook>.json`` at full size —
  committed — and a temporary folder at ``SMALL=1``): named ``values`` (numbers or short strings its reading
  text quotes), tidy ``tables`` (lists of dicts: the "paper vs here" rows), and ``claims`` (named booleans the
  reading text relies on). :meth:`Recorder.reading` renders the closing **Reading.** cell from the values, so
  prose never types a number the code computes.
- :func:`render`: ``{key}`` / ``{key:format}`` placeholders filled from recorded values (``{NN/key}`` reads
  notebook ``NN``'s values: the results-page generator, `tempo_jax.repro.docs`).
- :func:`load_results`, :func:`placeholders`, :func:`typed_numbers`: what tests and the results-page generator use.

numpy-free except for converting numpy scalars; no jax (text tables: `tempo_jax.text.table`).
"""

from __future__ import annotations

import json
import math
import os
import re
import string
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..sim.runner import fingerprint

__all__ = [
    "FIGURES_DIR",
    "RESULTS_DIR",
    "Recorder",
    "figures_dir",
    "load_results",
    "placeholders",
    "render",
    "results_dir",
    "typed_numbers",
]

_ROOT = Path(__file__).resolve().parents[2]
#: Where full-size notebook runs write their JSON (committed).
RESULTS_DIR = _ROOT / "results" / "notebooks"
#: Where full-size notebook runs save their figures (committed).
FIGURES_DIR = _ROOT / "notebooks" / "figures"


def figures_dir(small: bool | None = None) -> Path:
    """Where notebooks save figures: ``$TEMPO_FIGURES`` if set, else ``notebooks/figures`` of the checkout for
    full-size runs and ``<tmp>/tempo_jax_figures_small`` for ``SMALL=1`` runs, so a smoke-sized run never overwrites
    the committed full-size figures (as `results_dir` keeps its numbers apart).

    Args:
      small: the run's size (default: the ``SMALL`` environment variable).
    """
    return _run_dir("TEMPO_FIGURES", FIGURES_DIR, "tempo_jax_figures_small", small)


def _small_env() -> bool:
    return os.environ.get("SMALL", "0") == "1"


def _run_dir(variable: str, committed: Path, small_name: str, small: bool | None) -> Path:
    """``$variable`` if set, else ``committed`` for full-size runs and ``<tmp>/small_name`` for ``SMALL=1`` runs;
    made if missing."""
    small = _small_env() if small is None else small
    env = os.environ.get(variable)
    path = Path(env) if env else (Path(tempfile.gettempdir()) / small_name if small else committed)
    path.mkdir(parents=True, exist_ok=True)
    return path


def results_dir(small: bool | None = None) -> Path:
    """Where notebooks write their JSON: ``$TEMPO_RESULTS`` if set, else :data:`RESULTS_DIR` for full-size runs
    and ``<tmp>/tempo_jax_results_small`` for ``SMALL=1`` runs (never the committed folder).

    Args:
      small: the run's size (default: the ``SMALL`` environment variable).
    """
    return _run_dir("TEMPO_RESULTS", RESULTS_DIR, "tempo_jax_results_small", small)


# ------------------------------------------------------------------------------------------------ JSON values
def _plain(v):
    """JSON-ready copy of ``v``: numpy scalars and arrays become Python numbers and lists; tuples lists."""
    if isinstance(v, Mapping):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    if hasattr(v, "tolist"):  # numpy scalar or array
        return _plain(v.tolist())
    if isinstance(v, bool | int | str) or v is None:
        return v
    if isinstance(v, float):
        return float(v)
    raise ValueError(f"cannot record a {type(v).__name__} ({v!r}); record numbers, strings, lists or dicts")


_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class Recorder:
    """The numbers one notebook computed, written to ``<results_dir>/<notebook>.json`` after every change.

    The file holds ``{"notebook", "small", "fingerprint", "seconds", "values", "tables", "claims", "reading"}``
    (``fingerprint``: `tempo_jax.sim.runner.fingerprint` of the code that computed it; ``seconds``: time since the
    recorder was made); the first write of a session replaces what an earlier run left. Keys are identifiers
    (letters, digits, ``_``).

    Args:
      notebook: the notebook's file stem (``"03_phase_diagram"``).
      small: the run's size (default: the ``SMALL`` environment variable).
      directory: the folder (default :func:`results_dir`).
    """

    def __init__(self, notebook: str, *, small: bool | None = None, directory: str | Path | None = None) -> None:
        if not re.match(r"^\d\d_[a-z0-9_]+$", notebook):
            raise ValueError(f"notebook must be a notebook file stem like '03_phase_diagram', got {notebook!r}")
        self.notebook = notebook
        self.small = _small_env() if small is None else bool(small)
        self.path = Path(directory or results_dir(self.small)) / f"{notebook}.json"
        self.values: dict = {}
        self.tables: dict = {}
        self.claims: dict = {}
        self.reading_text = ""
        self._t0 = time.perf_counter()

    # ---------------------------------------------------------------------------------------------- recording
    def _check(self, key: str) -> str:
        if not isinstance(key, str) or not _KEY.match(key):
            raise ValueError(f"record keys must be identifiers (letters, digits, _), got {key!r}")
        return key

    def value(self, key: str, value) -> object:
        """Record one number (or short string) the reading text may quote; returns ``value``."""
        self.values[self._check(key)] = _plain(value)
        self.save()
        return value

    def update(self, **values) -> None:
        """Record several values at once (:meth:`value`)."""
        for k, v in values.items():
            self.values[self._check(k)] = _plain(v)
        self.save()

    def table(self, name: str, rows: Sequence[Mapping]) -> list[dict]:
        """Record a tidy table: a list of dicts with the same keys (a "paper vs here" table). Returns the rows."""
        rows = [dict(r) for r in rows]
        if any(set(r) != set(rows[0]) for r in rows):
            raise ValueError(f"table {name!r}: every row must have the same keys")
        self.tables[self._check(name)] = _plain(rows)
        self.save()
        return rows

    def claim(self, key: str, holds: bool) -> bool:
        """Record a qualitative statement the reading text relies on (checked true on the committed JSON)."""
        self.claims[self._check(key)] = bool(holds)
        self.save()
        return bool(holds)

    def save(self) -> Path:
        """Write the JSON file (also called by every record)."""
        payload = {
            "notebook": self.notebook,
            "small": self.small,
            "fingerprint": fingerprint(),
            "seconds": round(time.perf_counter() - self._t0, 1),
            "values": self.values,
            "tables": self.tables,
            "claims": self.claims,
            "reading": self.reading_text,
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(payload, indent=1, ensure_ascii=False, sort_keys=False) + "\n")
        return self.path

    # ---------------------------------------------------------------------------------------------- reading
    def render(self, template: str) -> str:
        """``template`` with its placeholders filled from this notebook's values (:func:`render`)."""
        return render(template, self.values)

    def reading(self, template: str) -> str:
        """Render the closing **Reading.** text, record it, and show it as Markdown (printed outside Jupyter)."""
        text = self.render(template).strip()
        self.reading_text = text
        self.save()
        try:
            from IPython import get_ipython
            from IPython.display import Markdown, display

            if get_ipython() is None:
                raise ImportError
            display(Markdown(text))
        except ImportError:
            print(text)
        return text


# ------------------------------------------------------------------------------------------------ rendering
class _Formatter(string.Formatter):
    """``{key}`` / ``{key:spec}`` / ``{NN/key:spec}`` from a flat dict (or ``{notebook: values}``); NaN and
    None render as "—", ±inf as "∞"."""

    def __init__(self, values: Mapping) -> None:
        self.values = values

    def get_field(self, field_name, args, kwargs):
        return _lookup(self.values, field_name), field_name

    def format_field(self, value, format_spec):
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "—"
        if isinstance(value, float) and math.isinf(value):
            return "∞" if value > 0 else "−∞"
        return format(value, format_spec)


def _lookup(values: Mapping, field: str):
    if "/" in field:
        nb, key = field.split("/", 1)
        matches = [v for k, v in values.items() if k == nb or k.startswith(f"{nb}_")]
        if len(matches) != 1:
            raise KeyError(f"placeholder {{{field}}}: no (or no unique) notebook {nb!r} in {sorted(values)}")
        values, field = matches[0], key
    if field not in values:
        raise KeyError(f"placeholder {{{field}}} is not a recorded value (recorded: {sorted(values)[:40]}…)")
    return values[field]


def render(template: str, values: Mapping) -> str:
    """Fill ``template``'s placeholders: ``{key}``, ``{key:.1%}`` (any format spec), ``{NN/key:spec}`` when
    ``values`` maps notebook names to their values. Raises ``KeyError`` naming a missing key."""
    return _Formatter(values).format(template)


def placeholders(template: str) -> list[str]:
    """The field names of ``template``'s placeholders, in order."""
    return [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]


_NUMBER = re.compile(r"(?<![\w.§])\d+(?:\.\d+)?\s?%|(?<![\w.§])\d+\.\d+×|(?<![\w.§])\d+\.\d{2,}")
#: Configuration ratios a template may type (replication ratios, token scales), not results.
CONFIG_RATIOS = frozenset({"1.25×", "1.5×", "0.25×", "1.06×"})


def typed_numbers(template: str) -> list[str]:
    """Result-like numbers typed into a template's prose outside placeholders: percentages, decimal ratios
    (``2.0×``; configuration ratios in :data:`CONFIG_RATIOS` excepted) and numbers with two or more decimals
    (``0.43``). Integers (batch sizes, EP sizes, section numbers) and one-decimal knobs (``s = 1.2``) pass."""
    prose = "".join(lit for lit, _, _, _ in string.Formatter().parse(template))
    found = [m.group(0).strip() for m in _NUMBER.finditer(prose)]
    return [x for x in found if x not in CONFIG_RATIOS]


def load_results(directory: str | Path | None = None) -> dict[str, dict]:
    """Every ``<notebook>.json`` in ``directory`` (default :data:`RESULTS_DIR`), by notebook name."""
    folder = Path(directory or RESULTS_DIR)
    return {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("[0-9][0-9]_*.json"))}
