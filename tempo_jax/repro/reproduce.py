"""Execute the figure notebooks headless (`tempo-jax reproduce [NAME|all]`, `make notebooks`).

Notebooks are jupytext percent-format ``notebooks/NN_name.py`` files; they are converted in memory and run by
nbclient in a ``python3`` kernel whose working directory is ``notebooks/``. ``small=True`` sets ``SMALL=1``
in the kernel's environment (the CI-sized grids).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["NOTEBOOKS_DIR", "NotebookRun", "list_notebooks", "run_notebook", "reproduce"]

NOTEBOOKS_DIR = Path(__file__).resolve().parents[2] / "notebooks"


@dataclass(frozen=True)
class NotebookRun:
    name: str
    ok: bool
    seconds: float
    error: str = ""


def list_notebooks(directory: Path = NOTEBOOKS_DIR) -> list[Path]:
    """``NN_*.py`` notebooks in ``directory``, in order."""
    if not directory.is_dir():
        raise FileNotFoundError(f"no notebooks folder at {directory} (reproduce runs from a source checkout)")
    return sorted(p for p in directory.glob("[0-9][0-9]_*.py"))


def _resolve(names: list[str], directory: Path) -> list[Path]:
    available = list_notebooks(directory)
    if not names or names == ["all"]:
        return available
    chosen = []
    for name in names:
        hits = [p for p in available if p.stem == name or p.stem.startswith(name) or p.stem[3:] == name]
        if not hits:
            raise ValueError(f"unknown notebook {name!r}; available: {[p.stem for p in available]}")
        chosen += hits
    return chosen


def run_notebook(path: Path, *, small: bool = True, timeout: int | None = None) -> NotebookRun:
    """Execute one notebook; returns whether it ran and, if not, the failing cell's error.

    ``timeout``: seconds one cell may run (default 900 at ``small``, 7,200 at full size, where one cell may serve
    the whole trace over several seeds)."""
    timeout = (900 if small else 7200) if timeout is None else timeout
    import jupytext
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = jupytext.read(path)
    old = os.environ.get("SMALL")
    os.environ["SMALL"] = "1" if small else "0"
    t0 = time.perf_counter()
    try:
        client = NotebookClient(
            nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
        )
        client.execute()
        return NotebookRun(path.stem, True, time.perf_counter() - t0)
    except CellExecutionError as err:
        return NotebookRun(path.stem, False, time.perf_counter() - t0, str(err)[-3000:])
    finally:
        if old is None:
            os.environ.pop("SMALL", None)
        else:
            os.environ["SMALL"] = old


def reproduce(
    names: list[str] | None = None, *, small: bool = False, directory: Path = NOTEBOOKS_DIR
) -> list[NotebookRun]:
    """Run the named notebooks (default all) and print one line each; failures print the cell's error."""
    runs = []
    for path in _resolve(list(names or []), directory):
        run = run_notebook(path, small=small)
        runs.append(run)
        status = "ok  " if run.ok else "FAIL"
        print(f"{status} {run.name}  ({run.seconds:.0f} s{', SMALL' if small else ''})", flush=True)
        if not run.ok:
            print(run.error)
    return runs
