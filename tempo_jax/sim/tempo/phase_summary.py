"""Reductions of phase sweeps and regime maps to the numbers the paper quotes ("paper vs here" tables).

Glossary additions: a column is (preset, ep, replication, skew), a panel is (preset, ep, replication), nc cells.

- :func:`boundary_rows`: per column, the simulated flip band and the analytic B* (TEMPO §3.2 (ii)), the paper's
  formula and the refined one; :func:`scan_rows` the same on a fine-grid :class:`.flipscan.FlipScan`.
- :func:`phase_rows`: TEMPO's min/max gain, METRO's worst excess, token-LP's memory-regime excess (§3.2).
- :func:`scale_rows`: mean/max gain over the batch ladder per EP (§3.3, Fig. 12).
- :func:`regime_rows`: mixed fraction of recorded and Zipf batches (§2.4, Fig. 5).

:func:`phase_values` / :func:`scale_values` reduce a sweep to the flat values notebook 03 records
(`tempo_jax.repro.Recorder`); :func:`phase_rows` / :func:`scale_rows` / :func:`regime_rows` turn them into
``{quantity, paper, here}`` rows. numpy + solvers only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .boundary import flip_band, flip_boundary, flip_boundary_refined, in_band
from .flipscan import FlipScan
from .phase import PhaseResult, column_setup
from .regime_map import RegimeCurve

__all__ = [
    "PAPER",
    "SHORT",
    "boundary_rows",
    "phase_rows",
    "phase_values",
    "regime_rows",
    "scale_rows",
    "scale_stats",
    "scale_values",
    "scan_rows",
]

#: The paper's numbers (docs/algorithms.md §12; TEMPO §2.4, §3.2, §3.3).
PAPER = {
    "columns_agree": "12/12",
    "min_gain": "≥ −0.3%",
    "max_gain": {"dsv3_fp8_offline": "8.5%", "qwen3_30b_offline": "10.2%", "dsv2_lite_offline": "11.8% (1.5×)"},
    "metro_worst": "up to 2.8×",
    "lp_memory": "5–17%",
    "scale_mean_s0": "6–6.5% (EP32–64)",
    "scale_max": "15.5%",
    "scale_mean_s12_ep32": "4.7–5.9%",
    "mixed_real": "92–100% (B 128–512)",
    "mixed_zipf12": "100% (whole ladder)",
    "b512_flat_experts": "47%",
    "b512_linear_tokens": "91%",
}


def _pct(x: float) -> str:
    return "—" if x is None or not math.isfinite(x) else f"{100 * x:.1f}%"


def _column_boundaries(config, preset: str, ep: int, repl: float, skew: float, refined: bool = True) -> dict:
    """The analytic boundaries of one column: the paper's formula fed the first-draw popularity (what the
    sweep used before) and the realised pair shares, and (``refined``) :func:`.boundary.flip_boundary_refined`."""
    routing, placement = column_setup(
        preset, ep, repl, skew, kappa=config.kappa, seed=config.seed, placement_draws=config.placement_draws
    )
    cost = config.cost(preset)
    r = placement.replica_mask.sum(axis=1)
    raw = flip_boundary(routing.popularity, r, cost.inflection, routing.top_k, ep)
    bd = flip_boundary(routing.pair_share, r, cost.inflection, routing.top_k, ep)
    out = {
        "p1_first_draw": float(routing.popularity.max()),
        "p1": float(routing.pair_share.max()),
        "e_eff_per_gpu": bd.e_eff / ep,
        "b_star_first_draw": raw.b_star,
        "b_avg": bd.b_avg,
        "b_hot": bd.b_hot,
        "b_star": bd.b_star,
        "mechanism": bd.mechanism,
    }
    if refined:
        ref = flip_boundary_refined(routing.pair_share, placement, cost, routing.top_k, kappa=config.kappa)
        out |= {"b_ref": ref.b_star, "a_lp": ref.lp_activations, "rho_m": ref.metro_imbalance}
    return out


def boundary_rows(result: PhaseResult, *, refined: bool = True) -> list[dict]:
    """Per column: flip band ``(lo, hi)`` and the analytic boundaries, with agreement.

    The paper's ``B* = min(B*_avg, B*_hot)`` uses the column's pair shares p (each expert's long-run share of
    token–expert pairs, `tempo_jax.workloads.pair_share`; ``b_star_first_draw`` is the same formula fed the
    first-draw popularity instead) and r_e = the number of distinct GPUs holding a replica of e (co-located
    replicas share one activation). ``b_ref`` is the refined boundary (:func:`.boundary.flip_boundary_refined`,
    with ``a_lp`` and ``rho_m`` at it); ``agree`` / ``agree_ref`` / ``agree_first_draw``: inside the band.
    """
    cfg = result.config
    win = result.winner()
    rows = []
    for preset, ep, repl, skew in result.columns():
        # Step 1: the simulated band along B.
        m = result.mask(preset=preset, ep=ep, replication=repl, skew=skew)
        band = flip_band(cfg.tokens_per_gpu, list(win[m]))
        # Step 2: the analytic boundaries from the column's pair shares and placement.
        bd = _column_boundaries(cfg, preset, ep, repl, skew, refined)
        row = {"preset": preset, "ep": ep, "replication": repl, "skew": skew, "winners": "".join(win[m])}
        row |= {"lo": band[0], "hi": band[1], **bd}
        row |= {"agree": in_band(bd["b_star"], band), "agree_first_draw": in_band(bd["b_star_first_draw"], band)}
        if refined:
            row["agree_ref"] = in_band(bd["b_ref"], band)
        rows.append(row)
    return rows


def scan_rows(scan: FlipScan) -> list[dict]:
    """Per column of a fine-grid :class:`.flipscan.FlipScan`: the flip band, the analytic boundaries and the
    measured token-LP activations / METRO imbalance at the band's upper end (the first compute-regime win).

    ``flip`` is the band's geometric midpoint (its lower end when the upper is open); ``err`` / ``err_ref`` the
    boundaries' relative distance ``B*/flip − 1``.
    """
    cfg = scan.config
    win = scan.winner()
    a_lp, rho = scan.lp_activations(), scan.metro_imbalance()
    rows = []
    for preset, ep, repl, skew in scan.columns():
        m = scan.mask(preset=preset, ep=ep, replication=repl, skew=skew)
        lo, hi = flip_band(cfg.tokens_per_gpu, list(win[m]))
        at = int(np.flatnonzero(np.asarray(cfg.tokens_per_gpu) == hi)[0]) if math.isfinite(hi) else -1
        flip = math.sqrt(lo * hi) if lo > 0 and math.isfinite(hi) else (hi if lo == 0 else lo)
        bd = _column_boundaries(cfg, preset, ep, repl, skew)
        row = {"preset": preset, "ep": ep, "replication": repl, "skew": skew, "lo": lo, "hi": hi, "flip": flip}
        row |= bd | {"a_lp_measured": float(a_lp[m][at]), "rho_m_measured": float(rho[m][at])}
        row |= {"agree": in_band(bd["b_star"], (lo, hi)), "agree_ref": in_band(bd["b_ref"], (lo, hi))}
        row |= {"err": bd["b_star"] / flip - 1.0, "err_ref": bd["b_ref"] / flip - 1.0}
        rows.append(row)
    return rows


#: Short names of the phase presets (value keys of the notebooks' JSON).
SHORT = {"dsv3_fp8_offline": "dsv3", "qwen3_30b_offline": "qwen3", "dsv2_lite_offline": "dsv2"}


def _rkey(replication: float) -> str:
    return f"{replication:g}".replace(".", "")  # 1.25 -> "125", 1.5 -> "15"


def _where(cell) -> str:
    return f"EP{cell.ep}, {cell.replication:g}×, s = {cell.skew:g}, B = {cell.tokens_per_gpu}"


def phase_values(result: PhaseResult, bounds: Sequence[dict]) -> dict:
    """The Fig. 6 / §3.2 numbers as flat values (keys of notebook 03's JSON).

    Per preset (short name ``x``, :data:`SHORT`): ``in_band_x`` / ``in_band_first_x`` / ``in_band_ref_x`` of
    ``columns_x`` (the paper's B* with pair shares, with first-draw popularity, the refined B*); per preset and
    replication ``r`` (``125``, ``15``): ``max_gain_x_r`` and ``max_gain_at_x_r`` (cell), ``max_gain_winner_x_r``,
    ``max_gain_vs_matching_x_r`` (the grid's largest gain once the fixed policies include the
    activation-balancing optimum). Pooled: ``min_gain``, ``metro_worst`` (METRO / best fixed) and
    ``metro_worst_at``, ``lp_excess_min`` / ``lp_excess_max`` (token-LP over METRO in M cells), ``cells``,
    ``n_bad`` and ``worst_ratio`` (per-batch TEMPO over every fixed policy).
    """
    gain, gain_m, win = result.gain(), result.gain_vs_matching(), result.winner()
    metro, lp, best = result.mean("metro"), result.mean("token_lp"), result.best_fixed()
    worst = result.worst_ratio()
    v: dict = {}
    for preset in result.config.presets:
        x = SHORT.get(preset, preset)
        sel = [b for b in bounds if b["preset"] == preset]
        v[f"columns_{x}"] = len(sel)
        for key, col in (("in_band", "agree"), ("in_band_first", "agree_first_draw"), ("in_band_ref", "agree_ref")):
            v[f"{key}_{x}"] = int(sum(b[col] for b in sel if col in b))
        for repl in result.config.replications:
            m = np.flatnonzero(result.mask(preset=preset, replication=repl))
            i = int(m[np.argmax(gain[m])])
            r = _rkey(repl)
            v[f"max_gain_{x}_{r}"] = float(gain[i])
            v[f"max_gain_at_{x}_{r}"] = _where(result.cells[i])
            v[f"max_gain_winner_{x}_{r}"] = str(win[i])
            v[f"max_gain_vs_matching_{x}_{r}"] = float(gain_m[m].max())
    ratio = metro / best
    i = int(np.argmax(ratio))
    mem = win == "M"
    lp_excess = lp[mem] / metro[mem] - 1.0 if mem.any() else np.array([math.nan])
    tau = result.config.tau
    v |= {
        "min_gain": float(gain.min()),
        "metro_worst": float(ratio[i]),
        "metro_worst_at": f"{result.cells[i].preset}, {_where(result.cells[i])}",
        "metro_worst_preset": result.cells[i].preset,
        "metro_worst_skew": result.cells[i].skew,
        "lp_excess_min": float(lp_excess.min()),
        "lp_excess_max": float(lp_excess.max()),
        "cells": len(result.cells),
        "n_bad": int((worst > 1 / (1 - tau) + 1e-12).sum()),
        "worst_ratio": float(worst.max()),
        "tau": tau,
    }
    return v


def phase_rows(values: dict, presets: Sequence[str], replications: Sequence[float]) -> list[dict]:
    """Paper vs here for a Fig. 6 sweep, from :func:`phase_values`: rows ``{quantity, paper, here}``."""
    rows = []
    for preset in presets:
        x = SHORT.get(preset, preset)
        here = f"{values[f'in_band_{x}']}/{values[f'columns_{x}']}"
        here += f" (first-draw p: {values[f'in_band_first_{x}']}, refined: {values[f'in_band_ref_{x}']})"
        rows.append({"quantity": f"B* inside flip band, {preset}", "paper": PAPER["columns_agree"], "here": here})
    rows.append(
        {"quantity": "TEMPO min gain (all cells)", "paper": PAPER["min_gain"], "here": _pct(values["min_gain"])}
    )
    for preset in presets:
        x = SHORT.get(preset, preset)
        for repl in replications:
            r = _rkey(repl)
            here = f"{_pct(values[f'max_gain_{x}_{r}'])} ({values[f'max_gain_at_{x}_{r}']}, winner "
            here += f"{values[f'max_gain_winner_{x}_{r}']}); vs activation optimum "
            here += _pct(values[f"max_gain_vs_matching_{x}_{r}"])
            paper = PAPER["max_gain"].get(preset, "—")
            rows.append({"quantity": f"TEMPO max gain, {preset} {repl:g}×", "paper": paper, "here": here})
    rows.append(
        {
            "quantity": "METRO / best fixed, worst cell",
            "paper": PAPER["metro_worst"],
            "here": f"{values['metro_worst']:.2f}× ({values['metro_worst_at']})",
        }
    )
    lp_txt = f"{_pct(values['lp_excess_min'])}–{_pct(values['lp_excess_max'])}"
    rows.append({"quantity": "token-LP excess over METRO in M cells", "paper": PAPER["lp_memory"], "here": lp_txt})
    rows.append(
        {
            "quantity": f"cells where a batch's TEMPO > best fixed/static/(1−τ), τ={values['tau']:g}",
            "paper": "0 (by construction vs token-LP)",
            "here": f"{values['n_bad']}/{values['cells']} (worst {values['worst_ratio']:.4f})",
        }
    )
    return rows


def scale_stats(result: PhaseResult, preset: str, replication: float) -> list[dict]:
    """Per (ep, skew): mean and max gain over the batch ladder, where the max sits, and the same gains against
    the best of the fixed policies and the activation-balancing optimum (``*_vs_matching``)."""
    gain, gain_m = result.gain(), result.gain_vs_matching()
    out = []
    for ep in result.config.eps:
        for skew in result.config.skews:
            m = result.mask(preset=preset, ep=ep, replication=replication, skew=skew)
            g = gain[m]
            j = int(np.argmax(g))
            out.append(
                {
                    "ep": ep,
                    "skew": skew,
                    "mean_gain": float(g.mean()),
                    "max_gain": float(g.max()),
                    "argmax_B": int(np.asarray(result.config.tokens_per_gpu)[j]),
                    "mean_gain_vs_matching": float(gain_m[m].mean()),
                    "max_gain_vs_matching_at_argmax": float(gain_m[m][j]),
                }
            )
    return out


def scale_values(
    result: PhaseResult, comm: PhaseResult | None = None, preset: str = "dsv3_fp8_offline", replication: float = 1.25
) -> dict:
    """The Fig. 12 / §3.3 numbers as flat values (keys of notebook 03's JSON).

    ``scale_mean_s0_ep32`` / ``_ep64`` and ``scale_mean_s12_ep32`` (mean gain over the batch ladder; NaN when
    not run) with ``*_vs_matching`` twins, ``scale_max`` / ``scale_max_at`` / ``scale_max_vs_matching`` (the
    largest gain and what is left of it against the activation-balancing optimum); with ``comm``:
    ``comm_dgain_mean`` / ``comm_dgain_max`` / ``comm_dgain_at`` (comm-aware minus compute-only gain) and
    ``comm_mean_s0_ep32`` / ``_ep64``.
    """
    st = scale_stats(result, preset, replication)

    def pick(ep, skew, key):
        s = next((s for s in st if s["ep"] == ep and s["skew"] == skew), None)
        return math.nan if s is None else s[key]

    v = {}
    for ep, skew, name in ((32, 0.0, "s0_ep32"), (64, 0.0, "s0_ep64"), (32, 1.2, "s12_ep32")):
        v[f"scale_mean_{name}"] = pick(ep, skew, "mean_gain")
        v[f"scale_mean_{name}_vs_matching"] = pick(ep, skew, "mean_gain_vs_matching")
    best = max(st, key=lambda s: s["max_gain"])
    v["scale_max"] = best["max_gain"]
    v["scale_max_at"] = f"EP{best['ep']}, s = {best['skew']:g}, B = {best['argmax_B']}"
    v["scale_max_vs_matching"] = best["max_gain_vs_matching_at_argmax"]
    if comm is not None:
        if comm.cells != result.cells:
            raise ValueError("scale_values: the comm-aware sweep must have the same cells")
        d = comm.gain() - result.gain()
        i = int(np.argmax(np.abs(d)))
        cst = scale_stats(comm, preset, replication)
        v["comm_dgain_mean"] = float(d.mean())
        v["comm_dgain_max"] = float(np.abs(d).max())
        v["comm_dgain_at"] = _where(result.cells[i])
        v["comm_dgain_signed"] = float(d[i])
        v["comm_cells_changed"] = int((np.abs(d) > 0.01).sum())
        v["comm_cells"] = len(d)
        for ep, name in ((32, "s0_ep32"), (64, "s0_ep64")):
            s = next((s for s in cst if s["ep"] == ep and s["skew"] == 0.0), None)
            v[f"comm_mean_{name}"] = math.nan if s is None else s["mean_gain"]
    return v


def scale_rows(values: dict) -> list[dict]:
    """Paper vs here for Fig. 12 from :func:`scale_values`: rows ``{quantity, paper, here}``."""
    rows = []
    for ep in (32, 64):
        here = f"{_pct(values[f'scale_mean_s0_ep{ep}'])} (vs activation optimum "
        here += f"{_pct(values[f'scale_mean_s0_ep{ep}_vs_matching'])})"
        rows.append({"quantity": f"mean gain, s=0, EP{ep}", "paper": PAPER["scale_mean_s0"], "here": here})
    here = f"{_pct(values['scale_mean_s12_ep32'])} (vs activation optimum "
    here += f"{_pct(values['scale_mean_s12_ep32_vs_matching'])})"
    rows.append({"quantity": "mean gain, s=1.2, EP32", "paper": PAPER["scale_mean_s12_ep32"], "here": here})
    here = f"{_pct(values['scale_max'])} ({values['scale_max_at']}; vs activation optimum "
    here += f"{_pct(values['scale_max_vs_matching'])})"
    rows.append({"quantity": "max gain (any EP, s, B)", "paper": PAPER["scale_max"], "here": here})
    if "comm_dgain_max" in values:
        here = f"mean {values['comm_dgain_mean'] * 100:+.2f} p, max |Δ| {values['comm_dgain_max'] * 100:.1f} p "
        here += f"({values['comm_dgain_at']}); {values['comm_cells_changed']}/{values['comm_cells']} cells move > 1 p"
        rows.append({"quantity": "comm-aware (c2 = 25, γ = 0.10) changes the gain by", "paper": "< 1 p", "here": here})
    return rows


def regime_rows(real: Sequence[RegimeCurve], zipf: Sequence[RegimeCurve], decode=(128, 512)) -> list[dict]:
    """Paper vs here for Fig. 5 (rows ``{quantity, paper, here}``): real traces' mixed fraction at decode B, and
    Zipf s=1.2's minimum."""
    rows = []
    for c in real:
        sel = (c.tokens_per_gpu >= decode[0]) & (c.tokens_per_gpu <= decode[1]) & np.isfinite(c.mixed)
        if sel.any():
            lo, hi = float(np.nanmin(c.mixed[sel])), float(np.nanmax(c.mixed[sel]))
            where = f"B {decode[0]}–{decode[1]}"
        else:  # too few recorded tokens for decode B at this rank count: report what the ladder covers
            ok = np.isfinite(c.mixed)
            lo, hi = float(np.nanmin(c.mixed[ok])), float(np.nanmax(c.mixed[ok]))
            where = f"B {int(c.tokens_per_gpu[ok].min())}–{int(c.tokens_per_gpu[ok].max())} only"
        label = f"mixed batches, {c.label} (G={c.num_ranks}, {where})"
        rows.append({"quantity": label, "paper": PAPER["mixed_real"], "here": f"{_pct(lo)}–{_pct(hi)}"})
    at = [(c, int(np.flatnonzero(c.tokens_per_gpu == 512)[0])) for c in real if 512 in c.tokens_per_gpu]
    at = [(c, i) for c, i in at if c.num_batches[i] > 0]
    if at:
        flat = ", ".join(f"{c.label} {_pct(float(c.flat_experts[i]))}" for c, i in at)
        lin = ", ".join(f"{c.label} {_pct(float(c.linear_tokens[i]))}" for c, i in at)
        rows.append({"quantity": "B=512: flat experts / activated", "paper": PAPER["b512_flat_experts"], "here": flat})
        rows.append({"quantity": "B=512: pairs in linear experts", "paper": PAPER["b512_linear_tokens"], "here": lin})
    for c in zipf:
        if c.label == "zipf s=1.2":
            low = _pct(float(np.nanmin(c.mixed)))
            rows.append(
                {"quantity": "mixed batches, Zipf s=1.2, min over ladder", "paper": PAPER["mixed_zipf12"], "here": low}
            )
    return rows
