"""Recorded notebook numbers (tempo_jax.repro.Recorder), rendering, the typed-number lint and the results-page block."""

import json
import math

import numpy as np
import pytest

from tempo_jax.repro import docs
from tempo_jax.repro.report import (
    FIGURES_DIR,
    Recorder,
    figures_dir,
    load_results,
    placeholders,
    render,
    results_dir,
    typed_numbers,
)


def test_recorder_writes_json(tmp_path):
    rec = Recorder("03_phase_diagram", small=True, directory=tmp_path)
    rec.value("gain", np.float64(0.1234))
    rec.update(count=np.int64(3), where="EP8, s = 0", inf=math.inf, arr=np.arange(3))
    rec.table("rows", [{"a": 1, "b": np.float32(2.5)}, {"a": 2, "b": 3.0}])
    assert rec.claim("ok", np.bool_(True)) is True
    text = rec.reading("**Reading.** gain {gain:.1%} at {where}; {count} cells, {inf}")
    assert text == "**Reading.** gain 12.3% at EP8, s = 0; 3 cells, ∞"
    data = json.loads((tmp_path / "03_phase_diagram.json").read_text())
    assert data["notebook"] == "03_phase_diagram" and data["small"] is True and len(data["fingerprint"]) == 16
    assert data["values"]["arr"] == [0, 1, 2] and data["tables"]["rows"][0]["b"] == 2.5
    assert data["claims"] == {"ok": True} and data["reading"] == text and data["seconds"] >= 0
    assert load_results(tmp_path)["03_phase_diagram"]["values"]["count"] == 3


def test_recorder_rejects_bad_input(tmp_path):
    with pytest.raises(ValueError, match="notebook"):
        Recorder("phase", directory=tmp_path)
    rec = Recorder("01_cost_model", directory=tmp_path)
    with pytest.raises(ValueError, match="identifiers"):
        rec.value("bad key", 1)
    with pytest.raises(ValueError, match="same keys"):
        rec.table("t", [{"a": 1}, {"b": 2}])
    with pytest.raises(ValueError, match="cannot record"):
        rec.value("obj", object())


def test_render_and_placeholders():
    values = {"x": 0.5, "n": float("nan"), "s": "M"}
    assert render("{x:.0%} {n:.2f} {s} {{literal}}", values) == "50% — M {literal}"
    assert render("{03/x:.2f}", {"03_phase_diagram": values}) == "0.50"
    with pytest.raises(KeyError, match="missing"):
        render("{missing}", values)
    with pytest.raises(KeyError, match="notebook"):
        render("{09/x}", {"03_phase_diagram": values})
    assert placeholders("a {x:.1f} b {03/y} {{c}}") == ["x", "03/y"]


def test_typed_numbers_lint():
    # Results (percentages, decimal ratios, numbers with two decimals) must be placeholders; configuration passes.
    assert typed_numbers("gain 12.3% and 0.43 and 2.0× vs {x:.1%}") == ["12.3%", "0.43", "2.0×"]
    assert typed_numbers("B = 128, EP64, §5.5, s = 1.2, 1.25× and 0.25× replication, Table 2, R = 64") == []


def test_results_dir_small_never_the_committed_folder(monkeypatch, tmp_path):
    monkeypatch.delenv("TEMPO_RESULTS", raising=False)
    assert results_dir(small=True) != results_dir(small=False)
    monkeypatch.setenv("TEMPO_RESULTS", str(tmp_path / "r"))
    assert results_dir(small=False) == tmp_path / "r" and (tmp_path / "r").is_dir()


def test_small_runs_never_overwrite_the_committed_figures(monkeypatch, tmp_path):
    """`tempo-jax reproduce --small` (SMALL=1) once saved its smoke-sized figures over notebooks/figures."""
    monkeypatch.delenv("TEMPO_FIGURES", raising=False)
    monkeypatch.setenv("SMALL", "1")
    assert figures_dir() != FIGURES_DIR and figures_dir(small=False) == FIGURES_DIR
    monkeypatch.setenv("SMALL", "0")
    assert figures_dir() == FIGURES_DIR and figures_dir(small=True) != FIGURES_DIR
    monkeypatch.setenv("TEMPO_FIGURES", str(tmp_path / "f"))
    assert figures_dir(small=True) == tmp_path / "f" and (tmp_path / "f").is_dir()


def test_update_page_block(tmp_path):
    values = {
        "01_cost_model": {"values": {"a": 1.5}, "seconds": 60.0},
        "02_mixed_regimes": {"values": {"b": "x"}, "seconds": 60.0},
    }
    rows = (("paper a", "{01/a:.1f}", "01"), ("paper b", "{02/b}", "02"))
    original = docs.ROWS
    try:
        docs.ROWS = rows
        path = tmp_path / "reproduced.md"
        path.write_text(f"intro\n{docs.BEGIN}\nold\n{docs.END}\ntail\n")
        assert docs.update_page(path, values) is True
        text = path.read_text()
        assert "| paper a | 1.5 | `tempo-jax reproduce 01` |" in text and "\nold\n" not in text
        assert text.startswith("intro\n") and text.endswith("tail\n") and "(2 notebooks)" in text
        assert docs.update_page(path, values) is False  # idempotent
        path.write_text("no block\n")
        with pytest.raises(ValueError, match="generated block"):
            docs.update_page(path, values)
    finally:
        docs.ROWS = original
