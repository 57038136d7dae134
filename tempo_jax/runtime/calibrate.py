"""`tempo-jax calibrate --measure`: calibrate the cost model on this backend and check that it ranks policies as
the hardware does (TEMPO §4.1, §5.2, App. B).

1. **Profile.** Sweep (G activated experts per rank, n tokens per expert) through the layer's own per-rank
   expert FFN (`tempo_jax.layer.stages.expert_ffn`: sort by slot, grouped-GEMM SwiGLU, unsort) on the current
   backend. Every cell is compiled and warmed up, then timed once per round for ``repeats`` rounds (calls end
   in ``block_until_ready``); a cell's time is its fastest call, since this machine may be shared and
   interference only ever adds time. Calls rotate the G experts over ``slots`` distinct weight copies (App. B
   rotates weight copies to defeat cache reuse). Rows are padded to the layer's bucket (a power of two, at
   least one CPU chunk) as the layer's capacity-padded exchange buffer is.
2. **Fit.** `solvers.fit_max_affine` (Eq. 1) on the cell times, with `solvers.bootstrap_max_affine` cluster
   bootstrap CIs (clusters = grid cells).
3. **Roofline.** The memory bandwidth measured on the same device (a large streaming reduction) gives the
   weight-streaming bound of b, ``3·H·F·bytes / bandwidth``; a dense matmul gives the compute peak, and with it
   the time of one CPU chunk (`pallas_kernels.GmmTiling.chunk` rows) of the expert FFN. On CPU the layer's
   grouped GEMM runs one dense matmul per chunk of each group, so an expert costs a whole chunk however few
   tokens it has: expect b near the chunk's compute time, far above the streaming bound.
4. **Ranking agreement (§5.2).** For synthetic Zipf batches at several batch sizes, every policy's dispatch
   (solved under the calibrated model) is executed rank by rank through the same expert FFN; the measured
   makespan is the slowest rank. Over every pair of policies whose measured makespans differ by more than the
   noise band (3%), the report counts how often the model orders them the same way.

The CPU profile this produced is committed as ``tempo_jax/data/cpu_profile.csv`` (`load_profile` reads it; the
notebook 01 Fig. 2 can plot its G = 1 rows as measured points beside the model):

    from tempo_jax.runtime.calibrate import load_profile
    prof = load_profile()                 # Profile: G, n, N, t_us arrays + meta (backend, H, F, chunk, ...)
    one = prof.G == 1
    ax.scatter(prof.n[one], prof.t_us[one]); model, _ = prof.fit()

Glossary additions: G experts per rank, n tokens per expert, N = G·n tokens per rank."""

from __future__ import annotations

import dataclasses
import json
import math
import platform
import statistics
import time
import warnings
from pathlib import Path

import numpy as np

from solvers import (
    SWEEP_POLICIES,
    CostModel,
    DispatchProblem,
    Placement,
    UndeterminedFitWarning,
    bootstrap_max_affine,
    fit_max_affine,
    slots_for,
    solve,
)
from solvers.checks import check_int, check_real, plain_scalars, read_text

from ..layer.config import capacity_bucket

__all__ = ["PROFILE_PATH", "MeasureConfig", "Profile", "load_profile", "measure", "ranking_agreement"]

PROFILE_PATH = Path(__file__).resolve().parents[1] / "data" / "cpu_profile.csv"
RANK_POLICIES = SWEEP_POLICIES


@dataclasses.dataclass(frozen=True, kw_only=True)
class MeasureConfig:
    """One calibration run (command: ``tempo-jax calibrate --measure``; hardware: the current jax backend).

    Attributes:
      hidden, ffn: the expert FFN's H and F (float32).
      groups: G values (activated experts per rank). tokens: n values (tokens per expert, a log ladder).
      slots: distinct expert weight copies the sweep rotates through. repeats: rounds of timed calls per cell
        (every cell once per round; a cell's time is its fastest call: the machine may be shared).
      bootstrap: bootstrap replicates of the fit. noise_band: relative makespan difference below which a pair
        of policies counts as tied (§5.2: 3%).
      rank_experts, rank_ranks, rank_top_k, rank_tokens, rank_seeds, rank_skew: the ranking batches (E, D, K,
        tokens per rank, seeds, Zipf s) and rank_repeats timed calls per rank.
    """

    hidden: int = 256
    ffn: int = 256
    groups: tuple[int, ...] = (1, 2, 4, 8)
    tokens: tuple[int, ...] = (1, 4, 16, 64, 128, 256, 384, 512, 1024)
    slots: int = 48
    repeats: int = 11
    bootstrap: int = 1000
    noise_band: float = 0.03
    rank_experts: int = 32
    rank_ranks: int = 8
    rank_top_k: int = 4
    rank_tokens: tuple[int, ...] = (32, 128, 512)
    rank_seeds: tuple[int, ...] = (0, 1)
    rank_skew: float = 1.0
    rank_repeats: int = 11
    seed: int = 0

    def __post_init__(self):
        plain_scalars(self)
        w = "MeasureConfig"
        for name in (
            "hidden",
            "ffn",
            "slots",
            "repeats",
            "bootstrap",
            "rank_experts",
            "rank_ranks",
            "rank_top_k",
            "rank_repeats",
        ):
            check_int(name, getattr(self, name), where=w)
        for name in ("groups", "tokens", "rank_tokens"):
            for v in getattr(self, name):
                check_int(name, v, where=w)
        if max(self.groups) > self.slots:
            raise ValueError(f"{w}: slots={self.slots} must be ≥ the largest G = {max(self.groups)}")
        check_real("noise_band", self.noise_band, minimum=0.0, maximum=1.0, where=w)

    @classmethod
    def quick(cls) -> MeasureConfig:
        """A CI-sized run (seconds): small shapes, few cells, few bootstrap draws."""
        return cls(
            hidden=64,
            ffn=64,
            groups=(1, 2, 4),
            tokens=(1, 16, 2048, 8192),
            slots=8,
            repeats=3,
            bootstrap=50,
            rank_experts=16,
            rank_tokens=(16, 128),
            rank_seeds=(0,),
            rank_repeats=2,
        )


# -------------------------------------------------------------------------------------------- profile data
@dataclasses.dataclass(frozen=True)
class Profile:
    """A measured expert-FFN profile: per cell ``G``, ``n``, ``N = G·n``, ``T`` (CPU chunks), ``t_us`` (the fastest
    of the cell's calls), ``t_median_us`` and ``t_max_us``; ``meta`` says backend, shapes, command, date."""

    G: np.ndarray
    n: np.ndarray
    N: np.ndarray
    T: np.ndarray
    t_us: np.ndarray
    t_median_us: np.ndarray
    t_max_us: np.ndarray
    meta: dict

    def fit(self) -> tuple[CostModel, object]:
        """Eq. 1 fitted to the cell times (`solvers.fit_max_affine`)."""
        return fit_max_affine(self.G, self.N, self.t_us)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = [f"# {k}: {v}" for k, v in self.meta.items()] + ["G,n,N,T,t_us,t_median_us,t_max_us"]
        cols = (self.G, self.n, self.N, self.T, self.t_us, self.t_median_us, self.t_max_us)
        lines += [f"{g},{n},{N},{T},{t:.3f},{lo:.3f},{hi:.3f}" for g, n, N, T, t, lo, hi in zip(*cols, strict=True)]
        path.write_text("\n".join(lines) + "\n")
        return path


def load_profile(path: str | Path | None = None) -> Profile:
    """Read a profile CSV written by `measure` (default: the committed CPU profile, ``PROFILE_PATH``)."""
    path = Path(path) if path is not None else PROFILE_PATH
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist; write one with `tempo-jax calibrate --measure`")
    meta, rows = {}, []
    for line in read_text(path, "profile CSV").splitlines():
        if line.startswith("#"):
            key, _, value = line[1:].partition(":")
            meta[key.strip()] = value.strip()
        elif line and not line.startswith("G,"):
            rows.append([float(v) for v in line.split(",")])
    a = np.asarray(rows, dtype=np.float64).reshape(-1, 7)
    ints = [a[:, i].astype(np.int64) for i in range(4)]
    return Profile(*ints, a[:, 4], a[:, 5], a[:, 6], meta)


# -------------------------------------------------------------------------------------------- measurement
def _timer(fn, *args, repeats: int) -> list[float]:
    import jax

    jax.block_until_ready(fn(*args))  # compile + warm-up
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        out.append((time.perf_counter() - t0) * 1e6)
    return out


class _ExpertFFN:
    """The layer's per-rank expert FFN on ``slots`` weight copies, jitted per padded row count."""

    def __init__(self, cfg: MeasureConfig):
        import jax
        import jax.numpy as jnp

        from pallas_kernels import GmmTiling

        from ..layer.experts import ExpertConfig
        from ..layer.stages import expert_ffn

        self.jax, self.jnp, self.cfg = jax, jnp, cfg
        self.chunk = GmmTiling().chunk
        k = jax.random.split(jax.random.key(cfg.seed), 3)
        S, H, F = cfg.slots, cfg.hidden, cfg.ffn
        self.w = (
            jax.random.normal(k[0], (S, H, F)) * H**-0.5,
            jax.random.normal(k[1], (S, H, F)) * H**-0.5,
            jax.random.normal(k[2], (S, F, H)) * F**-0.5,
        )

        def ffn(rows, slots, wg, wu, wd):
            weights = {"w_gate": wg, "w_up": wu, "w_down": wd}
            return expert_ffn(rows, slots, weights, expert=ExpertConfig(), gmm_impl="auto", interpret=False)[0]

        self.fn = jax.jit(ffn)
        self._x: dict[int, object] = {}

    def prepare(self, sizes, offset: int = 0):
        """Compile and warm up the FFN over groups of ``sizes`` tokens (one per activated expert); returns a
        function timing one call (µs). Successive calls rotate the groups over four sets of weight slots."""
        jax, jnp = self.jax, self.jnp
        sizes = np.asarray(sizes, dtype=np.int64)
        sizes = sizes[sizes > 0]
        M = capacity_bucket(int(sizes.sum()), floor=self.chunk)  # rows of the layer's padded buffer
        if M not in self._x:
            self._x[M] = jax.random.normal(jax.random.key(M), (M, self.cfg.hidden))
        x, S = self._x[M], self.cfg.slots
        layouts = []
        for r in range(4):
            ids = np.full(M, S, np.int32)  # padding rows: slot S (no expert), as in the layer's padded buffer
            ids[: sizes.sum()] = np.repeat((offset + r * sizes.size + np.arange(sizes.size)) % S, sizes)
            layouts.append(jnp.asarray(ids))
        jax.block_until_ready(self.fn(x, layouts[0], *self.w))  # compile + warm-up
        calls = [0]

        def once() -> float:
            calls[0] += 1
            ids = layouts[calls[0] % len(layouts)]
            t0 = time.perf_counter()
            jax.block_until_ready(self.fn(x, ids, *self.w))
            return (time.perf_counter() - t0) * 1e6

        return once


def _rounds(jobs: list, repeats: int) -> list[list[float]]:
    """Time every job once per round, ``repeats`` rounds: interference from a shared machine hits every job
    alike instead of whichever was being timed when it struck."""
    out = [[] for _ in jobs]
    for _ in range(repeats):
        for k, job in enumerate(jobs):
            out[k].append(job())
    return out


def _bandwidth_and_peak(cfg: MeasureConfig) -> dict:
    """Streaming-read bandwidth (GB/s) over a 256 MiB buffer and dense float32 matmul peak (GFLOP/s)."""
    import jax
    import jax.numpy as jnp

    buf = jnp.ones((64 * 2**20,), jnp.float32)  # 256 MiB: past the caches
    read = _timer(jax.jit(jnp.sum), buf, repeats=5)
    bw = buf.nbytes / (min(read) * 1e-6) / 1e9
    m = 1024
    a = jnp.ones((m, m), jnp.float32)
    mm = _timer(jax.jit(lambda x: x @ x), a, repeats=5)
    peak = 2 * m**3 / (min(mm) * 1e-6) / 1e9
    del buf
    return {"bandwidth_GBps": bw, "matmul_GFLOPs": peak}


def measure_profile(cfg: MeasureConfig, ffn: _ExpertFFN | None = None, progress=None) -> Profile:
    """Time every (G, n) cell of ``cfg`` through the layer's expert FFN (see the module)."""
    import jax

    ffn = ffn or _ExpertFFN(cfg)
    cells = [(G, n) for G in cfg.groups for n in cfg.tokens]
    jobs = [ffn.prepare(np.full(G, n), offset=k) for k, (G, n) in enumerate(cells)]
    times = _rounds(jobs, cfg.repeats)
    rows = []
    for (G, n), ts in zip(cells, times, strict=True):
        rows.append((G, n, G * n, G * math.ceil(n / ffn.chunk), min(ts), statistics.median(ts), max(ts)))
        if progress:
            progress(f"  G={G:3d} n={n:5d}: {min(ts):10.1f} µs (median {statistics.median(ts):.1f})")
    a = np.asarray(rows, dtype=np.float64)
    meta = {
        "backend": jax.default_backend(),
        "device": str(jax.devices()[0].device_kind),
        "machine": platform.processor() or platform.machine(),
        "hidden": cfg.hidden,
        "ffn": cfg.ffn,
        "dtype": "float32",
        "chunk": ffn.chunk,
        "slots": cfg.slots,
        "repeats": cfg.repeats,
        "date": time.strftime("%Y-%m-%d"),
        "command": "tempo-jax calibrate --measure",
        "t_us": "fastest of `repeats` calls (µs) of tempo_jax.layer.stages.expert_ffn (gmm auto) over G groups "
        "of n rows; cells timed round-robin (the machine is shared)",
    }
    return Profile(*(a[:, i].astype(np.int64) for i in range(4)), a[:, 4], a[:, 5], a[:, 6], meta)


def ranking_agreement(model: CostModel, cfg: MeasureConfig, ffn: _ExpertFFN | None = None, progress=None) -> dict:
    """TEMPO §5.2: does ``model`` order the policies as the measured per-rank expert compute does?

    A pair is decided when its measured makespans differ by more than ``cfg.noise_band``; it agrees when the
    model orders it the same way (a model tie on a decided pair counts as a disagreement, ``model_ties``).
    Every policy's dispatch of each batch (solved under ``model``) runs rank by rank through the expert FFN
    (every rank of every dispatch timed once per round, ``rank_repeats`` rounds; a rank's time is its fastest
    call); the measured makespan is the slowest rank's.
    """
    from ..workloads import SyntheticRouting

    ffn = ffn or _ExpertFFN(cfg)
    E, D, K = cfg.rank_experts, cfg.rank_ranks, cfg.rank_top_k
    routing = SyntheticRouting(num_experts=E, top_k=K, s=cfg.rank_skew, seed=cfg.seed)
    placement = Placement.from_eplb(routing.popularity, slots_for(E, D, 1.5), D)
    if placement.slots_per_rank > cfg.slots:
        raise ValueError(f"ranking: {placement.slots_per_rank} slots per rank exceed the {cfg.slots} weight copies")
    # Step 1: every batch's dispatch per policy, under the model.
    batches, jobs, where = [], [], []
    for B in cfg.rank_tokens:
        for seed in cfg.rank_seeds:
            problem = DispatchProblem(routing.batch(B, D, seed), placement, model)
            row = {"tokens_per_rank": B, "seed": seed, "policies": {}}
            for policy in RANK_POLICIES:
                x = np.round(solve(problem, policy).x)
                row["policies"][policy] = {"model_us": model.makespan(x), "rank_us": [0.0] * D}
                for g in np.flatnonzero(x.sum(axis=0) > 0):
                    jobs.append(ffn.prepare(x[:, g], offset=len(jobs)))
                    where.append((len(batches), policy, int(g)))
            batches.append(row)
    # Step 2: time every rank of every dispatch, round-robin; a rank's time is its fastest call.
    for (b, policy, g), ts in zip(where, _rounds(jobs, cfg.rank_repeats), strict=True):
        batches[b]["policies"][policy]["rank_us"][g] = min(ts)
    # Step 3: pairwise agreement outside the noise band.
    agree, total, ties, model_ties = 0, 0, 0, 0
    for row in batches:
        pol = row["policies"]
        for v in pol.values():
            v["measured_us"] = max(v["rank_us"])
        names = list(pol)
        for i, p in enumerate(names):
            for q in names[i + 1 :]:
                mp, mq = pol[p]["measured_us"], pol[q]["measured_us"]
                if abs(mp - mq) <= cfg.noise_band * min(mp, mq):
                    ties += 1
                    continue
                dp, dq = pol[p]["model_us"], pol[q]["model_us"]
                total += 1
                model_ties += int(dp == dq)  # the model cannot tell them apart: counted as a disagreement
                agree += int((mp < mq) == (dp < dq) and dp != dq)
        if progress:
            progress(
                f"  ranking B={row['tokens_per_rank']} seed={row['seed']} (model/measured µs): "
                + ", ".join(f"{p} {v['model_us']:.0f}/{v['measured_us']:.0f}" for p, v in pol.items())
            )
    return {
        "agree": agree,
        "pairs": total,
        "ties": ties,
        "model_ties": model_ties,
        "agreement": agree / total if total else math.nan,
        "noise_band": cfg.noise_band,
        "batches": batches,
        "placement": placement.to_dict(),
    }


def measure(
    cfg: MeasureConfig = MeasureConfig(),
    *,
    profile_csv: str | Path | None = None,
    out_json: str | Path | None = None,
    progress=print,
) -> dict:
    """Profile, fit with CIs, roofline and ranking agreement (the module's steps 1–4); returns the report."""
    say = progress or (lambda *a: None)
    t0 = time.perf_counter()
    ffn = _ExpertFFN(cfg)
    roof = _bandwidth_and_peak(cfg)
    say(
        f"calibrate --measure: expert FFN H={cfg.hidden} F={cfg.ffn} float32, chunk {ffn.chunk}; "
        f"read bandwidth {roof['bandwidth_GBps']:.1f} GB/s, matmul {roof['matmul_GFLOPs']:.0f} GFLOP/s"
    )
    # Step 1: profile.
    prof = measure_profile(cfg, ffn, progress=say)
    # Step 2: fit with cluster-bootstrap CIs (one cluster per grid cell).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndeterminedFitWarning)  # said below, in the run's own words
        model, rep = prof.fit()
    if rep.undetermined:
        say(
            f"WARNING: the fit is undetermined: the profile cannot determine {', '.join(rep.undetermined)} (their "
            "values are arbitrary); measure a wider grid (more tokens per expert), not --quick"
        )
    model = dataclasses.replace(model, source=f"tempo-jax calibrate --measure ({prof.meta['backend']})")
    boot = bootstrap_max_affine(prof.G, prof.N, prof.t_us, replicates=cfg.bootstrap, seed=cfg.seed)
    # Step 3: roofline readings of b.
    weight_bytes = 3 * cfg.hidden * cfg.ffn * 4
    b_stream = weight_bytes / (roof["bandwidth_GBps"] * 1e3)  # µs
    chunk_us = 2 * 3 * ffn.chunk * cfg.hidden * cfg.ffn / (roof["matmul_GFLOPs"] * 1e3)
    # Step 4: ranking agreement under the calibrated model.
    ranking = ranking_agreement(model, cfg, ffn, progress=say)
    report = {
        "config": dataclasses.asdict(cfg),
        "meta": prof.meta,
        "model": model.to_dict(),
        "fit": {
            "mean_rel_error": rep.mean_rel_error,
            "samples_per_piece": rep.samples_per_piece,
            "converged": rep.converged,
            "undetermined": list(rep.undetermined),
            "n_star": model.inflection,
        },
        "bootstrap": boot,
        "roofline": {
            **roof,
            "weight_bytes_per_expert": weight_bytes,
            "b_streaming_bound_us": b_stream,
            "b_over_streaming_bound": model.b / b_stream,
            "chunk_compute_us": chunk_us,
            "b_over_chunk_compute": model.b / chunk_us,
        },
        "ranking": ranking,
        "seconds": time.perf_counter() - t0,
    }
    ci = boot["ci"]
    say(
        f"fit (Eq. 1): a={model.a:.1f} [{ci['a'][0]:.1f}, {ci['a'][1]:.1f}] b={model.b:.1f} [{ci['b'][0]:.1f}, "
        f"{ci['b'][1]:.1f}] c={model.c:.1f} [{ci['c'][0]:.1f}, {ci['c'][1]:.1f}] β={model.beta:.4f} "
        f"[{ci['beta'][0]:.4f}, {ci['beta'][1]:.4f}] µs; n*={model.inflection:.0f} [{ci['n_star'][0]:.0f}, "
        f"{ci['n_star'][1]:.0f}]; mean rel. error {rep.mean_rel_error:.1%}; corr(a, b) {boot['corr_ab']:.2f}; "
        f"{cfg.bootstrap} cluster-bootstrap draws, 95% CIs"
    )
    say(
        f"b vs roofline: weight streaming {weight_bytes / 1e6:.2f} MB / {roof['bandwidth_GBps']:.1f} GB/s = "
        f"{b_stream:.1f} µs (b is {model.b / b_stream:.1f}×); one {ffn.chunk}-row chunk of the FFN at the matmul "
        f"peak = {chunk_us:.1f} µs (b is {model.b / chunk_us:.2f}×)"
    )
    say(
        f"ranking agreement (§5.2): {ranking['agree']}/{ranking['pairs']} policy pairs outside the "
        f"{cfg.noise_band:.0%} noise band ({ranking['agreement']:.0%}; {ranking['model_ties']} of the misses are "
        f"model ties); {ranking['ties']} pairs within the band"
    )
    if profile_csv is not None:
        say(f"wrote {prof.save(profile_csv)}")
    if out_json is not None:
        out = Path(out_json)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1, default=float))
        say(f"wrote {out}")
    return report
