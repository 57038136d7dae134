"""`tempo-jax report RUN`: the pictures an engineer looks at first, from a watched run's ``metrics.jsonl``.

- ``load_heatmap.png``: layer × expert, each expert's pairs over the run / the layer's mean per expert (1 = even);
- ``balancedness.png``: per layer, mean / max over ranks of the step's tokens (solid) and modelled time (dashed);
- ``replacements.png``: the modelled makespan (live and EPLB-even, mean of layers) over steps, with every
  re-placement marked (slots moved, modelled gain) and the stalls shaded.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

__all__ = ["FIGURES", "read_run", "render_run"]

FIGURES = ("load_heatmap.png", "balancedness.png", "replacements.png")


def read_run(run: str | Path) -> list[dict]:
    """The step records of a run: ``run`` is a folder holding ``metrics.jsonl`` (a serve ``--out`` folder, a
    training ``logdir``) or the file itself. Raises ValueError naming the file and line of anything unreadable."""
    path = Path(run)
    if path.is_dir():
        path = path / "metrics.jsonl"
    if not path.is_file():
        raise ValueError(
            f"report: {path} does not exist; give a run folder holding metrics.jsonl (tempo-jax serve --out DIR, "
            "tempo_jax.lm.train(logdir=DIR)) or the file"
        )
    records = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"report: {path}:{i} is not JSON ({err.msg}); was the run cut off mid-line?") from None
        if not isinstance(rec, dict) or not isinstance(rec.get("layers"), list) or "step" not in rec:
            raise ValueError(
                f"report: {path}:{i} is not a step record (no 'step' and 'layers'); is it a metrics.jsonl?"
            )
        _check_layers(rec["layers"], f"{path}:{i}")
        records.append((i, rec))
    if not records:
        raise ValueError(f"report: {path} holds no step records; the run recorded nothing")
    widths = {len(r["layers"]) for _, r in records}
    if len(widths) != 1 or 0 in widths:
        raise ValueError(f"report: {path}: the records disagree on the number of MoE layers ({sorted(widths)})")
    first, rec0 = records[0]
    for i, rec in records[1:]:
        for j, (a, b) in enumerate(zip(rec0["layers"], rec["layers"], strict=True)):
            if len(a["expert_tokens"]) != len(b["expert_tokens"]):
                raise ValueError(
                    f"report: {path}:{i}: layer {j} has {len(b['expert_tokens'])} experts, {len(a['expert_tokens'])} "
                    f"at line {first}; one report draws one run (records of one model)"
                )
    return [rec for _, rec in records]


#: What the report reads of each layer of a record: field → the keys it must hold (None: a list of numbers).
LAYER_FIELDS = {"expert_tokens": None, "balancedness": ("tokens", "time"), "makespan_us": ("live", "eplb_even")}


def _check_layers(layers: list, where: str) -> None:
    """ValueError naming ``where`` (file:line), the layer and the field a record's layer lacks."""
    for j, layer in enumerate(layers):
        for field, keys in LAYER_FIELDS.items():
            value = layer.get(field) if isinstance(layer, dict) else None
            ok = isinstance(value, list) if keys is None else isinstance(value, dict) and all(k in value for k in keys)
            if not ok:
                want = "a list of numbers" if keys is None else "{" + ", ".join(map(repr, keys)) + "}"
                raise ValueError(
                    f"report: {where}: layer {j} has no {field!r} ({want}); was the record written by "
                    "tempo_jax.metrics (serve --out, train logdir)?"
                )


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def load_matrix(records: list[dict]) -> np.ndarray:
    """``[L, E]`` each expert's pairs over the run / its layer's mean per expert (1 = even load)."""
    load = np.sum([[layer["expert_tokens"] for layer in r["layers"]] for r in records], axis=0, dtype=np.float64)
    mean = load.mean(axis=1, keepdims=True)
    return np.divide(load, mean, out=np.ones_like(load), where=mean > 0)


def render_run(run: str | Path, out: str | Path | None = None) -> dict:
    """Draw `FIGURES` from ``run``'s records into ``out`` (default: beside ``metrics.jsonl``); returns
    ``{"figures": [paths], "summary": {...}}`` (per layer mean balancedness, hottest expert, re-placements)."""
    records = read_run(run)
    folder = Path(out) if out is not None else (Path(run) if Path(run).is_dir() else Path(run).parent)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(
            f"report: cannot make the folder {str(folder)!r} for the PNGs ({err.strerror or err})"
        ) from None
    plt = _pyplot()
    steps = np.array([r["step"] for r in records])
    L = len(records[0]["layers"])
    paths = [folder / name for name in FIGURES]
    # Step 1: the layer × expert load heatmap.
    rel = load_matrix(records)
    fig, ax = plt.subplots(figsize=(max(6.0, min(2 + 0.12 * rel.shape[1], 16)), max(2.5, 1.2 + 0.35 * L)))
    top = max(float(rel.max()), 2.0)
    from matplotlib.colors import TwoSlopeNorm

    norm = TwoSlopeNorm(vcenter=1.0, vmin=0.0, vmax=top)  # white = even, red = hot, blue = cold
    im = ax.imshow(rel, aspect="auto", cmap="RdBu_r", norm=norm, interpolation="nearest")
    fig.colorbar(im, ax=ax, label="pairs / layer mean (1 = even)")
    ax.set_yticks(range(L))
    if rel.shape[1] <= 32:
        ax.set_xticks(range(rel.shape[1]))
    ax.set_xlabel("expert")
    ax.set_ylabel("MoE layer")
    ax.set_title(f"expert load over {len(records)} steps (steps {steps[0]}–{steps[-1]})")
    fig.tight_layout()
    fig.savefig(paths[0], dpi=110)
    plt.close(fig)
    # Step 2: balancedness per layer over steps.
    bal = {
        of: np.array([[layer["balancedness"][of] for layer in r["layers"]] for r in records])
        for of in ("tokens", "time")
    }
    fig, ax = plt.subplots(figsize=(10, 4))
    for i in range(L):
        (line,) = ax.plot(steps, bal["tokens"][:, i], "-", lw=1, label=f"layer {i} tokens")
        ax.plot(steps, bal["time"][:, i], "--", lw=1, color=line.get_color(), label=f"layer {i} time")
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("step")
    ax.set_ylabel("balancedness (mean / max over ranks)")
    ax.legend(fontsize=7, ncol=max(1, min(L, 4)))
    fig.tight_layout()
    fig.savefig(paths[1], dpi=110)
    plt.close(fig)
    # Step 3: the re-placement timeline over the modelled makespans, stalls shaded.
    mk = {
        t: np.array([np.mean([layer["makespan_us"][t] for layer in r["layers"]]) for r in records])
        for t in ("live", "eplb_even")
    }
    moves = [(r["step"], mv) for r in records for mv in r.get("replacements", [])]
    fig, ax = plt.subplots(figsize=(10, 4))
    ax.plot(steps, mk["live"], "-", label="live tables")
    ax.plot(steps, mk["eplb_even"], "--", label="EPLB-even")
    for k, (s, mv) in enumerate(moves):
        applied = mv["applied"]
        ax.axvline(
            s,
            color="C3" if applied else "0.6",
            ls=":" if applied else "-.",
            lw=1.2,
            label=("re-placed" if applied else "proposal dismissed") if k < 2 else None,
        )
        if applied:
            gain = mv["makespan_before_us"] / max(mv["makespan_after_us"], 1e-12)
            ax.annotate(f"{mv['moved_slots']} slots\n×{gain:.2f}", (s, ax.get_ylim()[1]), fontsize=7, va="top")
    stalled = np.array([bool(r.get("stalls")) for r in records])
    for k, s in enumerate(steps[stalled]):
        ax.axvspan(s - 0.5, s + 0.5, color="C1", alpha=0.15, lw=0, label="stalled" if k == 0 else None)
    ax.set_xlabel("step")
    ax.set_ylabel("modelled makespan (µs), mean of layers")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(paths[2], dpi=110)
    plt.close(fig)
    hot = rel.argmax(axis=1)
    summary = {
        "steps": len(records),
        "layers": L,
        "balancedness_tokens_mean": bal["tokens"].mean(axis=0).tolist(),
        "balancedness_time_mean": bal["time"].mean(axis=0).tolist(),
        "hottest_expert": hot.tolist(),
        "hottest_over_mean": rel[np.arange(L), hot].tolist(),
        "replacements": sum(mv["applied"] for _, mv in moves),
        "dismissed": sum(not mv["applied"] for _, mv in moves),
        "stalled_steps": int(stalled.sum()),
    }
    return {"figures": [str(p) for p in paths], "summary": summary}
