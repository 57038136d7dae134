"""Every figure notebook runs headless at CI size (SMALL=1) and writes its figures."""

import pytest

from tempo_jax.reproduce import list_notebooks, run_notebook

NOTEBOOKS = list_notebooks()


def test_notebooks_exist():
    assert len(NOTEBOOKS) >= 2


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_small(path, tmp_path, monkeypatch):
    monkeypatch.setenv("TEMPO_FIGURES", str(tmp_path))  # never overwrite the committed full-size figures
    run = run_notebook(path, small=True, timeout=600)
    assert run.ok, run.error
    assert list(tmp_path.glob("*.png")), "the notebook wrote no figure"
