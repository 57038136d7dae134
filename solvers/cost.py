"""Max-affine expert cost models (TEMPO Eqs. 1, 2, 4) and the paper's calibrated parameter sets.

Per-rank (per-GPU) time, with the paper's G_g activated (expert, replica) pairs, T_g 128-token M-tiles and N_g
tokens on rank g:

    t_g = max(a + b·G_g + b2·(T_g − G_g),  c + β·N_g,  c2 + γ·N_g)

The tile term (b2) and the traffic piece (c2, γ) are optional; without them this is Eq. 1. All times are in
microseconds. Glossary additions: shapes ``[...]`` broadcast. numpy only."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .checks import check_fields, check_instance, check_int, check_real, plain_scalars, read_text

__all__ = ["CostModel", "PRESETS", "gpu_loads"]

# A share below this many tokens counts as "not activated" (float dispatches from LPs carry dust).
ACTIVE_EPS = 1e-9


def gpu_loads(x: np.ndarray, tile: int = 128) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-rank loads (the paper's G_g activations, T_g tiles, N_g tokens) of a dispatch.

    Args:
      x: ``[E, D]`` non-negative token shares (tokens of expert e processed on rank d).
      tile: M-tile height used to count tiles, ``T_g = Σ_e ⌈x[e, g] / tile⌉``.

    Returns:
      ``(acts [D], tiles [D], tokens [D])``: activated pairs (int), tiles (int) and tokens (float) per rank.
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"dispatch x must be [E, D], got shape {x.shape}")
    active = x > ACTIVE_EPS
    acts = active.sum(axis=0)
    tiles = np.where(active, np.maximum(1.0, np.ceil(x / tile - 1e-9)), 0.0).sum(axis=0).astype(np.int64)
    return acts.astype(np.int64), tiles, x.sum(axis=0)


@dataclass(frozen=True, kw_only=True)
class CostModel:
    """Max-affine per-rank cost model, µs (TEMPO Eq. 1; Eq. 2 with ``b2``; Eq. 4 with ``c2, gamma``).

    Attributes:
      a, b: floor piece ``a + b·G`` (b = weight-streaming cost of one more activated replica).
      c, beta: token piece ``c + β·N``.
      b2: optional tile term: each M-tile beyond an expert's first costs ``b2`` (Eq. 2).
      tile: M-tile height (tokens) for the tile term.
      c2, gamma: optional traffic piece ``c2 + γ·N`` (all-to-all cost of received tokens, Eq. 4).
      source: where the numbers come from (not part of equality).

    Raises:
      ValueError: a parameter that is negative, NaN or infinite (each is a time or a slope, µs), ``tile`` < 1,
        only one of ``c2`` / ``gamma``, or no slope at all (b = β = 0 without a tile or traffic term).
      ArgTypeError (a TypeError): a parameter that is not a number (``b="1"``, ``b=None``), a non-integer tile.
    """

    a: float = 0.0
    b: float
    c: float = 0.0
    beta: float
    b2: float | None = None
    tile: int = 128
    c2: float | None = None
    gamma: float | None = None
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        plain_scalars(self)
        # Every parameter is a finite number >= 0 (times and slopes of a max-affine model); stored as a float.
        for name in ("a", "b", "c", "beta", "b2", "c2", "gamma"):
            v = getattr(self, name)
            if v is None and name in ("b2", "c2", "gamma"):
                continue
            v = check_real(f"CostModel.{name}", v, minimum=0.0)
            object.__setattr__(self, name, v)
        if (self.c2 is None) != (self.gamma is None):
            raise ValueError("CostModel: give both c2 and gamma (the traffic piece) or neither")
        object.__setattr__(self, "tile", check_int("CostModel.tile", self.tile))
        if self.b == 0 and self.beta == 0 and not self.b2 and not self.gamma:
            raise ValueError(
                "CostModel prices no load: b = β = 0 (and no tile or traffic slope) gives every dispatch the same "
                "makespan, so nothing can be compared or divided by it; give b > 0 (per activated replica) or β > 0 "
                "(per token)"
            )
        check_instance("CostModel.source", self.source, str)

    # ------------------------------------------------------------------ structure
    @property
    def has_tiles(self) -> bool:
        return self.b2 is not None

    @property
    def inflection(self) -> float:
        """n* = b/β: tokens per expert where one expert's floor equals its token cost (Table 6)."""
        return self.b / self.beta if self.beta > 0 else math.inf

    def kernel_only(self) -> CostModel:
        """The same model without the traffic piece (what the grouped-GEMM calibration fits)."""
        return dataclasses.replace(self, c2=None, gamma=None)

    # ------------------------------------------------------------------ evaluation
    def rank_pieces(self, G, N, T=None, xp=np) -> dict:
        """The pieces of a rank's time, each ``[...]`` (broadcasting): ``floor`` a + b·G (+ b2·(T − G) with a tile
        term), ``tokens`` c + β·N, and ``traffic`` c2 + γ·N with a traffic piece. ``xp``: the array namespace —
        numpy, `jax.numpy` for the in-graph twins, or None for Python scalars (the solvers' inner loops). The one
        place the model's formula is written (every twin prices through it)."""
        floor = self.a + self.b * G
        if self.b2 is not None and T is not None:  # T None: one tile per activated pair, no excess
            floor = floor + self.b2 * (T - G)
        pieces = {"floor": floor, "tokens": self.c + self.beta * N}
        if self.c2 is not None:
            pieces["traffic"] = self.c2 + self.gamma * N
        return pieces

    def rank_times(self, G, N, T=None, xp=np):
        """``max(a + b·G (+ b2·(T − G)), c + β·N [, c2 + γ·N])`` of `rank_pieces`, in ``xp`` (numpy, `jax.numpy`, or
        None for Python scalars); no conversion of the inputs (`gpu_times` is the checked numpy form)."""
        p = self.rank_pieces(G, N, T, xp)
        if xp is None:
            return max(p.values())
        t = xp.maximum(p["floor"], p["tokens"])
        return xp.maximum(t, p["traffic"]) if "traffic" in p else t

    def gpu_times(self, G, N, T=None) -> np.ndarray:
        """Per-rank times from per-rank loads (broadcasting; the arguments keep the paper's names).

        Args:
          G: G_g, activated (expert, replica) pairs per rank, ``[...]``.
          N: N_g, tokens per rank, ``[...]``.
          T: T_g, M-tiles per rank, ``[...]`` (needed only when the model has a tile term; defaults to G,
             i.e. one tile per activated pair).

        Returns:
          ``[...]`` float64 times in µs.
        """
        G = np.asarray(G, dtype=np.float64)
        N = np.asarray(N, dtype=np.float64)
        if self.b2 is not None:
            T = G if T is None else np.asarray(T, dtype=np.float64)
        return self.rank_times(G, N, T)

    def times(self, x: np.ndarray) -> np.ndarray:
        """Per-rank times ``[D]`` of a dispatch ``x [E, D]``."""
        acts, tiles, toks = gpu_loads(x, self.tile)
        return self.gpu_times(acts, toks, tiles)

    def makespan(self, x: np.ndarray) -> float:
        """Model makespan ``max_g t_g`` of a dispatch ``x [E, D]``."""
        return float(self.times(x).max(initial=0.0))

    def lower_bound(self, tokens: np.ndarray, placement) -> float:
        """Full-replication lower bound on the optimal makespan (TEMPO §3.1).

        ``LB = max(a + b·⌈E_live/D⌉ (+ tile excess), c + β·N/D, c2 + γ·N/D)``. Splitting only adds
        activations and tiles, so every dispatch carries at least E_live activations, Σ_e ⌈n_e/tile⌉ tiles
        and N tokens. The bound stays valid under restricted replication (restriction only raises the
        optimum) but is then loose; `solvers.Dispatch.lower_bound` uses the semi-matching bound there.

        Args:
          tokens: ``[E]`` tokens per logical expert (or ``[Gs, E]`` per source group; summed over sources).
          placement: a `solvers.Placement` or the number of ranks D.
        """
        n = np.asarray(tokens, dtype=np.float64)
        if n.ndim == 2:
            n = n.sum(axis=0)
        D = int(getattr(placement, "num_gpus", placement))
        live = n > ACTIVE_EPS
        e_live = int(live.sum())
        total = float(n.sum())
        if e_live == 0:
            return 0.0
        act = self.b * math.ceil(e_live / D)
        if self.b2 is not None and self.b >= self.b2:
            min_tiles = float(np.ceil(n[live] / self.tile - 1e-9).sum())
            act = max(act, ((self.b - self.b2) * e_live + self.b2 * min_tiles) / D)
        lb = max(self.a + act, self.c + self.beta * total / D)
        if self.c2 is not None:
            lb = max(lb, self.c2 + self.gamma * total / D)
        return float(lb)

    # ------------------------------------------------------------------ persistence
    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> CostModel:
        """Inverse of `to_dict`; ``b`` and ``beta`` are required, unknown fields are refused."""
        fields = [f.name for f in dataclasses.fields(cls)]
        if isinstance(d, Mapping):
            unknown = sorted(str(k) for k in d if k not in fields)
            if unknown:  # the historical message
                raise ValueError(f"unknown CostModel fields {unknown}; valid: {sorted(fields)}")
        check_fields(
            "cost model", d, ("b", "beta"), [f for f in fields if f not in ("b", "beta")], where="CostModel.from_dict"
        )
        return cls(**d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> CostModel:
        """Parse a JSON object (see `from_dict`); a syntax error says where."""
        check_instance("text", text, (str, bytes), where="CostModel.from_json")
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            msg = f"CostModel.from_json: invalid JSON at line {err.lineno} column {err.colno} ({err.msg})"
            raise ValueError(msg) from None
        return cls.from_dict(data)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n")

    @classmethod
    def load(cls, path: str | Path) -> CostModel:
        """Read a `save`d model; errors name the file."""
        text = read_text(path, "cost model file")
        try:
            return cls.from_json(text)
        except ValueError as err:  # ArgTypeError included
            raise type(err)(f"cost model file {path}: {err}") from None


_T6 = "TEMPO Table 6 (Testbed A, fp8 masked grouped GEMM, offline kernel grid; a = c = 0)"
_T7 = "TEMPO Table 7"

#: Every parameter set of TEMPO Tables 6 and 7, by name (µs per expert / per token).
PRESETS: dict[str, CostModel] = {
    "qwen3_30b_offline": CostModel(b=1.74, beta=0.0108, source=f"{_T6}: Qwen3-30B shape, n*≈161"),
    "dsv2_lite_offline": CostModel(b=2.99, beta=0.0179, source=f"{_T6}: DSv2-Lite shape, n*≈168"),
    "dsv3_fp8_offline": CostModel(b=14.78, beta=0.0945, source=f"{_T6}: DSv3 shape, n*≈156"),
    "dsv3_bf16_offline": CostModel(b=45.29, beta=0.1370, source=f"{_T6}: DSv3 shape, bf16 loop, n*≈331"),
    "dsv3_a_gemm_refit": CostModel(
        a=116.0, b=12.99, c=176.0, beta=0.0851, source=f"{_T7}: DSv3, Testbed A, EP8 microbenchmark refit, GEMM"
    ),
    "dsv3_a_full_pipe": CostModel(
        a=358.0, b=16.59, c=266.0, beta=0.358, source=f"{_T7}: DSv3, Testbed A, mb refit, full pipeline"
    ),
    "dsv3_a_full_pipe_it2": CostModel(
        a=488.0, b=5.93, c=294.0, beta=0.356, source=f"{_T7}: DSv3, Testbed A, refit iteration 2, full pipeline"
    ),
    "proxy_serving_3term": CostModel(
        a=16.4,
        b=2.99,
        c=15.6,
        beta=0.0179,
        c2=25.0,
        gamma=0.10,
        source=f"{_T7}: proxy (DSv2-Lite), Testbed A, serving 3-term (Eq. 4)",
    ),
    "dsv3_b_tile": CostModel(
        a=37.1,
        b=8.32,
        b2=2.65,
        c=23.4,
        beta=0.0336,
        c2=25.0,
        gamma=0.10,
        source=f"{_T7}: DSv3, Testbed B, tile-aware (Eq. 2) + traffic",
    ),
    "qwen3_235b_b_tile": CostModel(
        a=34.9,
        b=3.95,
        b2=1.23,
        c=34.8,
        beta=0.0154,
        c2=25.0,
        gamma=0.10,
        source=f"{_T7}: Qwen3-235B, Testbed B, tile-aware (Eq. 2) + traffic",
    ),
}
