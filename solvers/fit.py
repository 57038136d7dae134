"""Black-box calibration: fit a max-affine cost model to logged (G, N, t) samples (TEMPO §4.1, App. B).

Alternating assignment: give each sample to the piece that attains the max under the current parameters,
refit each piece by least squares on its own samples, repeat until the assignment stops changing. The
least squares are weighted by 1/t, so the fit minimises relative error (samples span orders of magnitude
on the paper's log-ladder grid). The traffic piece of Eq. 4 is fitted separately, from all-to-all logs
(TEMPO App. C); this function fits the kernel pieces: Eq. 1, or Eq. 2 when ``tiles`` is given.

Every parameter of the model is a time or a slope and must be ≥ 0 (`CostModel` refuses anything else), so each
least squares is solved under that constraint (non-negative least squares when the plain solution leaves the
domain). Data that pull a parameter below 0 (times falling as G rises, say) are not hidden: the report names
those parameters and their unconstrained values in ``outside_domain``.
"""

from __future__ import annotations

import csv
import io
import math
import warnings
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import nnls

from .checks import check_array, check_int, check_real, read_text
from .cost import CostModel

__all__ = [
    "CSV_COLUMNS",
    "FitReport",
    "UndeterminedFitWarning",
    "bootstrap_max_affine",
    "fit_max_affine",
    "read_samples",
]


class UndeterminedFitWarning(UserWarning):
    """A max-affine fit whose samples leave some parameters undetermined (see ``FitReport.undetermined``)."""


@dataclass(frozen=True)
class FitReport:
    """Quality of a max-affine fit.

    Attributes:
      mean_rel_error: mean of |t̂ − t| / t over all samples.
      samples_per_piece: (floor piece, token piece) sample counts in the final assignment.
      iterations: alternating-assignment iterations run.
      converged: True when the assignment stopped changing before ``iters`` ran out.
      outside_domain: parameters (``a``, ``b``, ``b2``, ``c``, ``beta``) whose unconstrained least-squares value
        on the final assignment is negative, with that value; the model holds them at their bound (0) instead.
        Empty for data the model describes; otherwise the samples contradict the model (e.g. b < 0: times fall
        as more experts are activated) and the fit is only the best one inside the domain.
      undetermined: parameters the samples of their piece cannot determine (their values are arbitrary; a
        `UndeterminedFitWarning` was issued). Empty for a determined fit.
    """

    mean_rel_error: float
    samples_per_piece: tuple[int, int]
    iterations: int
    converged: bool
    outside_domain: dict[str, float] = field(default_factory=dict, hash=False)
    undetermined: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "outside_domain", dict(self.outside_domain))


def _as_samples(name: str, v, n: int | None) -> np.ndarray:
    arr = check_array(name, v, where="fit_max_affine", ndims=(1,), nonnegative=True)
    if n is not None and arr.shape[0] != n:
        raise ValueError(f"fit_max_affine: {name} has {arr.shape[0]} samples but G has {n}; lengths must match")
    return arr


def _weighted_lstsq(X: np.ndarray, t: np.ndarray, nonnegative: bool = True) -> np.ndarray:
    """Least squares of ``X θ ≈ t`` weighted by 1/t; with ``nonnegative`` the best θ ≥ 0 (the plain solution when
    it already is ≥ 0, else non-negative least squares)."""
    w = 1.0 / t
    A, y = X * w[:, None], t * w
    theta, *_ = np.linalg.lstsq(A, y, rcond=None)
    if nonnegative and np.any(theta < 0):
        theta, _ = nnls(A, y)
    return theta


@dataclass(frozen=True)
class _Pieces:
    """The two pieces' design matrices over the samples (`fit_max_affine`, step 1): ``floor [n, p]`` (1, G
    [, T − G]) and ``tokens [n, 2]`` (1, N), the times ``t [n]``; ``names`` of the floor piece's parameters."""

    floor: np.ndarray
    tokens: np.ndarray
    t: np.ndarray
    names: tuple[str, ...]

    @property
    def p_floor(self) -> int:
        return self.floor.shape[1]

    def refit(self, floor_mask: np.ndarray, prev: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Per-piece least squares on its samples (a piece with too few keeps ``prev``)."""
        th_f, th_t = prev
        if floor_mask.sum() >= self.p_floor:
            th_f = _weighted_lstsq(self.floor[floor_mask], self.t[floor_mask])
        if (~floor_mask).sum() >= 2:
            th_t = _weighted_lstsq(self.tokens[~floor_mask], self.t[~floor_mask])
        return th_f, th_t

    def predict(self, th: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        return self.floor @ th[0], self.tokens @ th[1]

    def rel_err(self, th) -> float:
        f, k = self.predict(th)
        return float(np.mean(np.abs(np.maximum(f, k) - self.t) / self.t))

    def alternate(self, mask: np.ndarray, iters: int) -> tuple[tuple[np.ndarray, np.ndarray], np.ndarray, int, bool]:
        """Step 3: alternate assignment and per-piece least squares from ``mask`` → ``(θ, mask, iterations,
        converged)``."""
        th = self.refit(mask, (np.zeros(self.p_floor), np.zeros(2)))
        # The state (mask, θ) after each iteration decides the rest; an assignment that oscillates revisits one,
        # and the state after ``iters`` iterations is then known without running them (a huge ``iters`` is cheap).
        seen: dict[bytes, int] = {}
        states: list[tuple] = []
        for it in range(1, iters + 1):
            f, k = self.predict(th)
            new_mask = f >= k
            if np.array_equal(new_mask, mask) and it > 1:
                return th, mask, it, True
            mask = new_mask
            th = self.refit(mask, th)
            key = mask.tobytes() + th[0].tobytes() + th[1].tobytes()
            if key in seen:  # periodic from iteration seen[key] on, with period it - seen[key]
                start = seen[key]
                th, mask = states[start - 1 + (iters - start) % (it - start)]
                return th, mask, iters, False
            seen[key] = it
            states.append((th, mask))
        return th, mask, iters, False

    def undetermined(self, mask: np.ndarray) -> list[str]:
        """Parameters of a piece whose samples do not pin them down (rank-deficient design on the piece)."""
        out = []
        for keep, X, piece in ((mask, self.floor, self.names), (~mask, self.tokens, ("c", "beta"))):
            if np.linalg.matrix_rank(X[keep]) < X.shape[1]:
                out += piece
        return out


def _pieces(G: np.ndarray, N: np.ndarray, t: np.ndarray, T: np.ndarray | None) -> _Pieces:
    """Step 1: the pieces' design matrices; samples that cannot determine a piece under any assignment (identical
    rows, one value of G or of N, tiles collinear with G) are refused."""
    n = G.shape[0]
    X_floor = np.stack([np.ones(n), G] + ([] if T is None else [T - G]), axis=1)
    X_tok = np.stack([np.ones(n), N], axis=1)
    for X, what in ((X_floor, "G" if T is None else "G and tiles − G"), (X_tok, "N")):
        if np.linalg.matrix_rank(X) < X.shape[1]:
            raise ValueError(
                f"fit_max_affine: the samples cannot determine the model: {len(np.unique(G))} distinct G and "
                f"{len(np.unique(N))} distinct N over {n} samples leave the piece in {what} undetermined (identical "
                "or collinear samples); measure at more distinct (G, N) points"
            )
    return _Pieces(X_floor, X_tok, t, ("a", "b") + (() if T is None else ("b2",)))


def _best_start(pieces: _Pieces, ratio: np.ndarray, iters: int) -> tuple:
    """Step 2: multi-start. Samples with few tokens per expert (``ratio [n]`` = N / G) start on the floor piece;
    several split quantiles, each alternated (step 3); a fit that determines every parameter beats one that does
    not, whatever their errors, then the lower error. Returns ``((undetermined, error), θ, mask, iterations,
    converged)``."""
    n, p_floor = ratio.shape[0], pieces.p_floor
    order = np.argsort(ratio, kind="stable")
    best = None
    for q in (0.2, 0.35, 0.5, 0.65, 0.8):
        k = int(np.clip(round(q * n), p_floor, n - 2))
        mask = np.zeros(n, dtype=bool)
        mask[order[:k]] = True
        th, mask, its, conv = pieces.alternate(mask, iters)
        rank = (len(pieces.undetermined(mask)), pieces.rel_err(th))
        if best is None or rank[0] < best[0][0] or (rank[0] == best[0][0] and rank[1] < best[0][1] - 1e-12):
            best = (rank, th, mask, its, conv)
    return best


def _outside_domain(pieces: _Pieces, mask: np.ndarray) -> dict[str, float]:
    """Step 5: parameters the unconstrained fit of the final pieces would put below 0."""
    outside = {}
    t = pieces.t
    for keep, X, piece, k in (
        (mask, pieces.floor, pieces.names, pieces.p_floor),
        (~mask, pieces.tokens, ("c", "beta"), 2),
    ):
        if keep.sum() >= k:
            free = _weighted_lstsq(X[keep], t[keep], nonnegative=False)
            outside.update({nm: float(v) for nm, v in zip(piece, free, strict=True) if v < 0})
    return outside


def fit_max_affine(G, N, t, *, tiles=None, iters: int = 50) -> tuple[CostModel, FitReport]:
    """Fit ``t ≈ max(a + b·G [+ b2·(T − G)], c + β·N)`` by alternating assignment.

    Args:
      G: ``[n]`` activated experts per sample.
      N: ``[n]`` tokens per sample.
      t: ``[n]`` measured times (µs), strictly positive.
      tiles: optional ``[n]`` M-tile counts T per sample; adds the tile term b2 (Eq. 2).
      iters: maximum alternating-assignment iterations (the paper uses 50).

    Returns:
      ``(CostModel, FitReport)``.

    Raises:
      ValueError: negative/NaN inputs, mismatched lengths, non-positive times, fewer samples than
        parameters, or samples that cannot determine the model under any assignment (identical rows, a single
        value of G or N).

    Warns:
      UndeterminedFitWarning: the best fit leaves a piece with samples that do not determine its parameters
        (e.g. every sample in one regime); ``FitReport.undetermined`` names them.

    Every parameter is fitted under ``≥ 0``; see ``FitReport.outside_domain`` for data that disagree.
    """
    # Step 0: validate.
    G = _as_samples("G", G, None)
    n = G.shape[0]
    N = _as_samples("N", N, n)
    t = _as_samples("t", t, n)
    T = None if tiles is None else _as_samples("tiles", tiles, n)
    if np.any(t <= 0):
        raise ValueError("fit_max_affine: times t must be strictly positive (relative-error fit)")
    p_floor = 2 if T is None else 3
    if n < p_floor + 2:
        raise ValueError(f"fit_max_affine: need at least {p_floor + 2} samples for {p_floor + 2} parameters, got {n}")
    iters = check_int("iters", iters, where="fit_max_affine")
    pieces = _pieces(G, N, t, T)  # Step 1
    (_, err), (th_f, th_t), mask, its, conv = _best_start(pieces, N / np.maximum(G, 1.0), iters)  # Steps 2-3
    # Step 4: a piece whose final samples do not pin its parameters down leaves them arbitrary however small the
    # error: said loudly (a warning and ``FitReport.undetermined``), never reported as a plain converged fit.
    lost = tuple(pieces.undetermined(mask))
    if lost:
        warnings.warn(
            f"fit_max_affine: the fit is undetermined: the samples assigned to each piece cannot determine "
            f"{', '.join(lost)} ({int(mask.sum())} floor / {int((~mask).sum())} token samples); those values are "
            "arbitrary. Measure more (G, N) points spanning both the flat regime (few tokens per expert) and the "
            "linear one (many)",
            UndeterminedFitWarning,
            stacklevel=2,
        )
    # Step 5: package, with the parameters the data would put below 0.
    outside = _outside_domain(pieces, mask)
    if th_f[1] == 0 and th_t[1] == 0 and (T is None or th_f[2] == 0):
        free = ", ".join(f"{k} = {v:.3g}" for k, v in outside.items()) or "none"
        raise ValueError(
            "fit_max_affine: the samples contradict the model: every slope (b, beta) fits best at 0 (unconstrained: "
            f"{free}), i.e. times do not rise with G or N, so no model prices any load; check the samples"
        )
    model = CostModel(
        a=float(th_f[0]),
        b=float(th_f[1]),
        b2=None if T is None else float(th_f[2]),
        c=float(th_t[0]),
        beta=float(th_t[1]),
        source="fit_max_affine",
    )
    report = FitReport(
        mean_rel_error=err,
        samples_per_piece=(int(mask.sum()), int((~mask).sum())),
        iterations=its,
        converged=conv,
        outside_domain=outside,
        undetermined=lost,
    )
    return model, report


def bootstrap_max_affine(
    G, N, t, *, clusters=None, tiles=None, replicates: int = 1000, level: float = 0.95, seed: int = 0, iters: int = 50
) -> dict:
    """Cluster bootstrap of `fit_max_affine` (TEMPO App. B, §5.2): confidence intervals, not only point fits.

    Whole clusters of samples (e.g. one cell of the measurement grid, or one run) are drawn with replacement
    ``replicates`` times and the model is refitted on each draw; the intervals are the percentiles of the
    refits. a and b can be nearly collinear when the samples span a narrow range of G: ``corr_ab`` says so.

    Args:
      G, N, t, tiles, iters: as `fit_max_affine`.
      clusters: ``[n]`` cluster id of each sample (default: every sample its own cluster).
      replicates: bootstrap draws. level: two-sided coverage of the intervals. seed: the draws' seed.

    Returns:
      ``{"fit": point-fit parameters, "ci": {name: (lo, hi)}, "corr_ab": float, "replicates": int,
      "failed": int}`` over the names a, b, c, beta, n_star (and b2 with tiles); a draw whose fit fails or is
      undetermined (too few distinct samples on one piece) is counted in ``failed`` and left out.
    """
    replicates = check_int("replicates", replicates, where="bootstrap_max_affine")
    level = check_real("level", level, minimum=0.0, maximum=1.0, strict=True, where="bootstrap_max_affine")
    G = _as_samples("G", G, None)
    n = G.shape[0]
    N, t = _as_samples("N", N, n), _as_samples("t", t, n)
    T = None if tiles is None else _as_samples("tiles", tiles, n)
    cl = np.arange(n) if clusters is None else np.asarray(clusters)
    if cl.shape != (n,):
        raise ValueError(f"bootstrap_max_affine: clusters must be [n] = [{n}], got shape {cl.shape}")
    ids, members = np.unique(cl, return_inverse=True)
    groups = [np.flatnonzero(members == k) for k in range(ids.size)]
    names = ["a", "b", "c", "beta", "n_star"] + ([] if T is None else ["b2"])

    def params(model: CostModel) -> list[float]:
        out = [model.a, model.b, model.c, model.beta, model.inflection]
        return out + ([] if T is None else [model.b2])

    point, _ = fit_max_affine(G, N, t, tiles=T, iters=iters)
    rng = np.random.default_rng(seed)
    draws, failed = [], 0
    for _ in range(replicates):
        idx = np.concatenate([groups[k] for k in rng.integers(0, len(groups), len(groups))])
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UndeterminedFitWarning)  # counted in ``failed`` instead
                model, rep = fit_max_affine(G[idx], N[idx], t[idx], tiles=None if T is None else T[idx], iters=iters)
        except ValueError:
            failed += 1
            continue
        if rep.undetermined:
            failed += 1
            continue
        draws.append(params(model))
    arr = np.asarray(draws, dtype=np.float64).reshape(-1, len(names))
    q = [(1 - level) / 2 * 100, (1 + level) / 2 * 100]
    ci = {
        k: tuple(float(v) for v in np.nanpercentile(arr[:, i], q)) if arr.size else (math.nan, math.nan)
        for i, k in enumerate(names)
    }
    corr = (
        float(np.corrcoef(arr[:, 0], arr[:, 1])[0, 1])
        if arr.shape[0] > 2 and arr[:, :2].std(axis=0).all()
        else math.nan
    )
    return {
        "fit": dict(zip(names, params(point), strict=True)),
        "ci": ci,
        "corr_ab": corr,
        "replicates": replicates,
        "failed": failed,
        "level": level,
    }


# ------------------------------------------------------------------------------------------------ samples
CSV_COLUMNS = {"G": "activated experts", "N": "tokens", "t": "time (µs)", "T": "M-tiles (optional)"}


def read_samples(path) -> dict[str, np.ndarray]:
    """Columns ``G``, ``N``, ``t`` (and ``T`` if present) ``[n]`` float64 of a calibration CSV: a header row naming
    the columns, one sample per row (what `fit_max_affine` takes). Errors name the file and line.

    Raises:
      FileNotFoundError: no such file.
      ValueError: a folder, non-text bytes, a missing column, a short row, a value that is not a finite number
        (t > 0, the others ≥ 0), or fewer rows than the fit has parameters.
    """
    text = read_text(path, "calibrate CSV")
    rows = [(n, row) for n, row in enumerate(csv.reader(io.StringIO(text)), 1) if any(c.strip() for c in row)]
    if not rows:
        raise ValueError(f"{path} is empty; expected a header row G,N,t[,T] and one sample per row")
    header = [c.strip() for c in rows[0][1]]
    missing = [c for c in ("G", "N", "t") if c not in header]
    if missing:
        raise ValueError(f"{path}:{rows[0][0]}: header lacks columns {missing} (has {header}); expected G,N,t[,T]")
    unknown = [c for c in header if c not in CSV_COLUMNS]
    if unknown:  # never ignored: a misspelt "T" would silently drop the tile term
        hint = " (the M-tile column is named T)" if any(c.lower().startswith("tile") for c in unknown) else ""
        raise ValueError(
            f"{path}:{rows[0][0]}: unknown columns {unknown}{hint}; the columns are "
            f"{', '.join(f'{k} ({v})' for k, v in CSV_COLUMNS.items())}"
        )
    wanted = {c: header.index(c) for c in CSV_COLUMNS if c in header}
    values = {c: [] for c in wanted}
    for n, row in rows[1:]:
        if len(row) != len(header):
            raise ValueError(f"{path}:{n}: {len(row)} values, the header has {len(header)} columns; truncated?")
        for c, i in wanted.items():
            try:
                v = float(row[i])
            except ValueError:
                raise ValueError(f"{path}:{n}: column {c} = {row[i].strip()[:40]!r} is not a number") from None
            if not np.isfinite(v) or v < 0 or (c == "t" and v == 0):
                bound = "> 0" if c == "t" else ">= 0"
                raise ValueError(f"{path}:{n}: column {c} ({CSV_COLUMNS[c]}) must be finite and {bound}, got {v}")
            values[c].append(v)
    need = 5 if "T" in wanted else 4  # one row per parameter: a, b[, b2], c, beta
    if len(rows) - 1 < need:
        cols = "G,N,t,T" if "T" in wanted else "G,N,t"
        raise ValueError(f"{path} has {len(rows) - 1} sample row(s); the fit needs at least {need} rows of {cols}")
    return {c: np.array(v) for c, v in values.items()}
