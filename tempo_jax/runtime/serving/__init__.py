"""Serving with live dispatch tables (`tempo-jax serve`): one loop, two served models.

- `serve` (here): the entry — the tiny MoE LM (``model="lm"``) or the bare layer (``model="layer"``).
- `loop`: `serve_loop`, `Served` / `Step`, the runtime started and stopped around it, the serving mesh.
- `pricing`: modelled makespans of a step and a re-placement's price.
- `report`: each model's summary and figure, the report written.
- `layer_model`: the bare expert-parallel layer served (`serve_layer`); `lm_model`: the tiny MoE LM (`serve_lm`,
  and `refresh_time`: the worker's time per refresh for a model of any size).

The options are `tempo_jax.runtime.serve_config.ServeConfig` (the controller's: `ServeConfig.controller`).
"""

from __future__ import annotations

from pathlib import Path

from ...metrics import WatchOptions
from ..serve_config import ServeConfig
from .layer_model import serve_layer
from .lm_model import refresh_time, serve_lm
from .loop import Served, Step, serve_loop

__all__ = ["ServeConfig", "Served", "Step", "refresh_time", "serve", "serve_layer", "serve_loop", "serve_lm"]


def serve(
    cfg: ServeConfig = ServeConfig(),
    *,
    out_dir: str | Path | None = "results",
    quiet: bool = False,
    figure: bool = True,
    watch: WatchOptions | None = None,
) -> dict:
    """Run the serving loop: the tiny MoE LM (``cfg.model="lm"``, `lm_model.serve_lm`) or the bare layer
    (`layer_model.serve_layer`); returns the report (also written to ``<out_dir>/serve.json``, with one metrics
    record per step in ``<out_dir>/metrics.jsonl``). ``watch``: the run's Prometheus endpoint, TensorBoard folder and
    stall limits (`tempo_jax.metrics.WatchOptions`; docs/runtime.md, "Watching it")."""
    if cfg.model == "lm":
        return serve_lm(cfg, out_dir=out_dir, quiet=quiet, figure=figure, watch=watch)
    return serve_layer(cfg, out_dir=out_dir, quiet=quiet, figure=figure, watch=watch)
