"""solvers.fit_max_affine: recovers every preset from noisy synthetic calibration grids."""

import numpy as np
import pytest

from solvers import PRESETS, CostModel, bootstrap_max_affine, fit_max_affine


def _grid(model: CostModel, noise: float, seed: int):
    """The paper's grid: G in 1..40 × tokens per expert 1..4096 (log ladder), multiplicative noise."""
    ladder = np.unique(np.round(np.logspace(0, np.log10(4096), 25)).astype(int))
    G, n = (a.ravel() for a in np.meshgrid(np.arange(1, 41), ladder, indexing="ij"))
    N = G * n
    T = G * np.ceil(n / model.tile)
    rng = np.random.default_rng(seed)
    t = model.gpu_times(G, N, T) * (1.0 + noise * rng.standard_normal(G.size))
    return G, N, T, t


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_recovers_preset(name):
    true = PRESETS[name].kernel_only()  # the traffic pair is fitted from all-to-all logs, not here
    G, N, T, t = _grid(true, noise=0.02, seed=1)
    fit, report = fit_max_affine(G, N, t, tiles=T if true.has_tiles else None)
    scale_floor, scale_tok = true.b, true.beta * 1000  # absolute scales for intercepts that are 0
    assert fit.b == pytest.approx(true.b, rel=0.03)
    assert fit.beta == pytest.approx(true.beta, rel=0.03)
    assert abs(fit.a - true.a) <= 0.03 * max(abs(true.a), scale_floor)
    assert abs(fit.c - true.c) <= 0.05 * max(abs(true.c), scale_tok)
    if true.has_tiles:
        assert fit.b2 == pytest.approx(true.b2, rel=0.05)
    assert fit.inflection == pytest.approx(true.inflection, rel=0.05)
    assert report.mean_rel_error < 0.03
    assert sum(report.samples_per_piece) == G.size
    assert min(report.samples_per_piece) > 0


def test_noiseless_fit_is_exact_and_converges():
    true = CostModel(a=10.0, b=5.0, c=20.0, beta=0.05)
    G, N, _, t = _grid(true, noise=0.0, seed=0)
    fit, report = fit_max_affine(G, N, t)
    for f in ("a", "b", "c", "beta"):
        assert getattr(fit, f) == pytest.approx(getattr(true, f), rel=1e-6, abs=1e-6)
    assert report.converged and report.mean_rel_error < 1e-9


@pytest.mark.parametrize(
    "G, N, t, match",
    [
        ([1, 2, 3, 4], [1, 2, 3], [1, 2, 3, 4], "lengths must match"),
        ([1, 2, 3, -4], [1, 2, 3, 4], [1, 2, 3, 4], "non-negative"),
        ([1, 2, 3, 4], [1, 2, np.nan, 4], [1, 2, 3, 4], "NaN"),
        ([1, 2, 3], [1, 2, 3], [1, 2, 3], "at least 4 samples"),
        ([1, 2, 3, 4], [1, 2, 3, 4], [1, 0, 3, 4], "strictly positive"),
        ([[1, 2], [3, 4]], [1, 2, 3, 4], [1, 2, 3, 4], "1-D"),
    ],
)
def test_bad_input(G, N, t, match):
    with pytest.raises(ValueError, match=match):
        fit_max_affine(G, N, t)


def test_tiles_need_five_samples():
    with pytest.raises(ValueError, match="at least 5"):
        fit_max_affine([1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4], tiles=[1, 2, 3, 4])


def test_cluster_bootstrap_intervals():
    """CIs cover the truth on a wide grid; on a narrow G range a and b are collinear (TEMPO §5.2: corr ≈ −1) and
    b's interval is much wider."""
    true = CostModel(a=100.0, b=15.0, c=20.0, beta=0.1)
    G, N, _, t = _grid(true, noise=0.03, seed=2)
    cells = np.arange(G.size) // 5  # clusters of five neighbouring grid cells
    wide = bootstrap_max_affine(G, N, t, clusters=cells, replicates=60, seed=0)
    for k in ("a", "b", "c", "beta"):
        lo, hi = wide["ci"][k]
        assert lo <= getattr(true, k) <= hi, (k, lo, hi)
    assert wide["fit"]["b"] == pytest.approx(15.0, rel=0.03) and wide["failed"] == 0
    narrow = (G >= 9) & (G <= 20)
    tight = bootstrap_max_affine(G[narrow], N[narrow], t[narrow], replicates=60, seed=0)
    width = lambda r: r["ci"]["b"][1] - r["ci"]["b"][0]  # noqa: E731
    assert width(tight) > 2 * width(wide) and tight["corr_ab"] < -0.9
    with pytest.raises(ValueError, match=r"clusters must be \[n\]"):
        bootstrap_max_affine(G, N, t, clusters=cells[:-1], replicates=2)
