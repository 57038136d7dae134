"""Reproduction tooling: the notebooks' recorded numbers, the rendered result tables, headless notebook runs.

- `report`: `Recorder` (a notebook's numbers as JSON), `render` (placeholders filled from them), result folders.
- `docs`: the reproduced-results tables of ``docs/reproduced.md``, rendered from the committed JSON.
- `reproduce`: `tempo-jax reproduce`, the notebooks executed headless.
"""

from .report import RESULTS_DIR, Recorder, figures_dir, load_results, render, results_dir

__all__ = ["RESULTS_DIR", "Recorder", "figures_dir", "load_results", "render", "results_dir"]
