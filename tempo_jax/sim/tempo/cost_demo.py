"""The cost model in pictures (TEMPO §1, §2.2, §4.1; Figs. 1–2, Table 6): worked example, profiles, calibration.

Glossary additions: G GPUs, n tokens per expert, N tokens per GPU, nG activated experts per GPU.

- :func:`worked_example`: the Fig. 1b toy (one hot expert of 600 tokens, six cold of 30, two fully
  replicated GPUs, ``t_g = max(15·G_g, 0.1·N_g)``) dispatched three ways: token balancing (every expert split
  evenly: 105 µs), activation balancing (METRO: 69 µs) and makespan-optimal (TEMPO: 60 µs = the lower bound).
- :func:`expert_profile`: time of one expert alone on a GPU vs its tokens (Fig. 2), with n* = b/β.
- :func:`inflection_rows`: n* of the calibrated presets vs Table 6.
- :func:`calibration_demo`: noisy samples of a preset on the paper's grid (G ∈ 1..40 × tokens per expert on
  a log ladder 1..4096) refitted with `solvers.fit_max_affine`.
- :func:`measured_profile`: a measured expert-FFN profile (``G,N,T,t`` CSV, as `scripts/bench_gemm.py
  --profile-csv` writes it) and its max-affine fit, for Fig. 2's measured overlay (:data:`PROFILE_CSVS`).

numpy + solvers only (no jax).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from solvers import PRESETS, CostModel, DispatchProblem, FitReport, Placement, fit_max_affine, solve
from solvers.checks import read_text

__all__ = [
    "PAPER_N_STAR",
    "PROFILE_CSVS",
    "TOY_COST",
    "TOY_TOKENS",
    "Calibration",
    "calibration_demo",
    "expert_profile",
    "inflection_rows",
    "measured_profile",
    "worked_example",
]

#: Fig. 1b: a = c = 0, b = 15 µs per activated expert, β = 0.1 µs per token.
TOY_COST = CostModel(b=15.0, beta=0.1, source="TEMPO Fig. 1b toy")
#: Fig. 1b: one hot expert (600 tokens) and six cold ones (30 each).
TOY_TOKENS = np.array([600, 30, 30, 30, 30, 30, 30])
#: Table 6 n* per preset (µs per expert / µs per token, Testbed A offline grid).
PAPER_N_STAR: dict[str, float] = {
    "qwen3_30b_offline": 161,
    "dsv2_lite_offline": 168,
    "dsv3_fp8_offline": 156,
    "dsv3_bf16_offline": 331,
}
#: The three dispatches of Fig. 1b: label → (policy, paper makespan µs).
TOY_DISPATCHES: dict[str, tuple[str, float]] = {
    "token balancing (even split)": ("uniform", 105.0),
    "activation balancing (METRO)": ("metro", 69.0),
    "makespan-optimal (TEMPO)": ("tempo", 60.0),
}


def worked_example() -> list[dict]:
    """The three Fig. 1b dispatches: per-GPU activations ``G [2]``, tokens ``N [2]``, times ``t [2]``, makespan.

    Returns:
      Rows ``{label, policy, x [7, 2], G, N, t, makespan, paper, lower_bound}``.
    """
    problem = DispatchProblem(TOY_TOKENS, Placement.full(len(TOY_TOKENS), 2), TOY_COST)
    rows = []
    for label, (policy, paper) in TOY_DISPATCHES.items():
        d = solve(problem, policy, tau=0.0) if policy == "tempo" else solve(problem, policy)
        rows.append(
            {
                "label": label,
                "policy": policy,
                "x": d.x,
                "G": d.gpu_activations,
                "N": d.gpu_tokens,
                "t": d.gpu_times,
                "makespan": d.makespan,
                "paper": paper,
                "lower_bound": TOY_COST.lower_bound(TOY_TOKENS, 2),
            }
        )
    return rows


def expert_profile(cost: CostModel, tokens) -> np.ndarray:
    """``[n]`` µs of one expert alone on a GPU (G = 1, N = n, ⌈n/tile⌉ tiles) for ``tokens [n]``.

    The traffic piece, if any, is left out: Fig. 2 profiles the grouped GEMM.
    """
    n = np.asarray(tokens, dtype=np.float64)
    tiles = np.maximum(1.0, np.ceil(n / cost.tile))
    return cost.kernel_only().gpu_times(np.ones_like(n), n, tiles)


def inflection_rows(presets=tuple(PAPER_N_STAR)) -> list[dict]:
    """Per preset: b, β, n* = b/β here and the paper's n* (Table 6)."""
    return [
        {
            "preset": p,
            "b": PRESETS[p].b,
            "beta": PRESETS[p].beta,
            "n_star": PRESETS[p].inflection,
            "paper": PAPER_N_STAR.get(p, float("nan")),
        }
        for p in presets
    ]


@dataclass(frozen=True)
class Calibration:
    """Outcome of :func:`calibration_demo`.

    Attributes:
      true: the preset the samples were drawn from.
      fitted: the recovered model.
      report: fit quality.
      G, N, t: ``[n]`` samples (activated experts, tokens per GPU, noisy µs).
    """

    true: CostModel
    fitted: CostModel
    report: FitReport
    G: np.ndarray
    N: np.ndarray
    t: np.ndarray

    def rows(self) -> list[dict]:
        """Per parameter (a, b, c, β, n*): true, fitted, relative error."""
        out = []
        for name in ("a", "b", "c", "beta", "inflection"):
            tv, fv = float(getattr(self.true, name)), float(getattr(self.fitted, name))
            rel = abs(fv - tv) / abs(tv) if tv else float("nan")
            out.append({"param": "n*" if name == "inflection" else name, "true": tv, "fitted": fv, "rel_error": rel})
        return out


def calibration_demo(preset: str = "dsv3_a_gemm_refit", *, noise: float = 0.05, seed: int = 0) -> Calibration:
    """Sample ``preset`` on the paper's calibration grid with multiplicative noise and refit it.

    Grid: G ∈ 1..40 activated experts × tokens per expert on a log ladder 1, 2, 4, …, 4096 (N = G·n);
    ``t = model(G, N)·(1 + noise·ε)``, ε ~ N(0, 1) clipped to ±3. The traffic piece is not sampled
    (calibration fits the kernel pieces; TEMPO App. C fits traffic separately).
    """
    true = PRESETS[preset].kernel_only()
    rng = np.random.default_rng(seed)
    # Step 1: the grid.
    g, n = np.meshgrid(np.arange(1, 41), 2.0 ** np.arange(13), indexing="ij")
    G, N = g.ravel().astype(np.float64), (g * n).ravel()
    # Step 2: noisy measurements.
    t = true.gpu_times(G, N) * (1.0 + noise * np.clip(rng.standard_normal(G.size), -3, 3))
    # Step 3: alternating-assignment fit.
    fitted, report = fit_max_affine(G, N, t)
    return Calibration(true, fitted, report, G, N, t)


_ROOT = Path(__file__).resolve().parents[3]
#: Measured expert-FFN profiles Fig. 2 overlays when present: label → CSV (either format `measured_profile` reads).
PROFILE_CSVS: dict[str, Path] = {
    "GPU (scripts/gpu_check.sh)": _ROOT / "results" / "gpu" / "profile.csv",
    "this CPU (tempo-jax calibrate --measure)": _ROOT / "tempo_jax" / "data" / "cpu_profile.csv",
}


def measured_profile(path: str | Path) -> dict | None:
    """A measured expert-FFN profile and its max-affine fit, or None when ``path`` does not exist.

    Args:
      path: CSV with header ``G,N,T,t`` (activated experts, tokens, tiles, µs per call; `scripts/bench_gemm.py`)
        or the ``# key: value`` commented ``G,n,N,T,t_us,...`` profile `tempo-jax calibrate --measure` writes.

    Returns:
      ``{"G", "N", "t" [n], "per_expert_tokens" [n] = N/G, "fitted": CostModel, "report": FitReport}``.
    """
    path = Path(path)
    if not path.exists():
        return None
    rows = [line for line in read_text(path, "profile CSV").splitlines() if line.strip() and not line.startswith("#")]
    data = np.genfromtxt(rows, delimiter=",", names=True)
    names = data.dtype.names or ()
    t_col = "t" if "t" in names else "t_us"
    if any(c not in names for c in ("G", "N", t_col)) or data.size < 4:
        raise ValueError(
            f"{path}: need columns G,N,t (or t_us) and at least 4 rows (has {list(names)}, {data.size} rows)"
        )
    G, N, t = (np.atleast_1d(data[c]).astype(np.float64) for c in ("G", "N", t_col))
    fitted, report = fit_max_affine(G, N, t)
    return {"G": G, "N": N, "t": t, "per_expert_tokens": N / G, "fitted": fitted, "report": report}
