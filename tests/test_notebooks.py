"""The figure notebooks and their recorded numbers.

- Every notebook runs headless at CI size (SMALL=1), writes its figures, and — when it records its numbers
  (`tempo_jax.repro.Recorder`) — a JSON whose tables and claims have the structure of the committed full-size
  JSON (``results/notebooks``) and satisfy the invariants a small run can check (orderings, signs, bounds).
- Every reading cell renders from the committed full-size JSON (every placeholder is a recorded value), types no
  result into its prose, and every claim the committed JSON records holds.
"""

import ast
import json
import math

import pytest

from tempo_jax.repro.report import RESULTS_DIR, load_results, placeholders, render, typed_numbers
from tempo_jax.repro.reproduce import list_notebooks, run_notebook
from tempo_jax.sim import PLACEMENT_POLICIES

NOTEBOOKS = list_notebooks()
COMMITTED = load_results(RESULTS_DIR)
TAU = 0.01


def _recorder_name(path) -> str | None:
    """The notebook name passed to ``Recorder(...)`` in the notebook's source (None if it records nothing)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "Recorder" and node.args:
            return node.args[0].value
    return None


def _reading_templates(path) -> list[str]:
    """The string templates passed to ``<recorder>.reading(...)`` in the notebook's source."""
    return [
        node.args[0].value
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "reading" and node.args
    ]


RECORDING = [p for p in NOTEBOOKS if _recorder_name(p)]


# ------------------------------------------------------------------------------------------------ invariants
def _rows(data, table):
    return data["tables"][table]


def _check_01(d):
    v = d["values"]
    assert (v["toy_uniform"], v["toy_metro"], v["toy_tempo"]) == (105.0, 69.0, 60.0)
    assert v["toy_tempo"] == v["toy_lower_bound"]
    assert all(0 <= t["changed"] <= 1 and t["uniform_extra_tiles"] >= 0 for t in _rows(d, "tiles"))


def _check_02(d):
    for r in _rows(d, "recorded") + _rows(d, "zipf"):
        assert math.isnan(r["mixed"]) or 0 <= r["mixed"] <= 1
    assert d["values"]["zipf12_hot_pairs_b_min"] < d["values"]["zipf12_hot_pairs_first_b_min"]


def _check_03(d):
    v = d["values"]
    assert v["min_gain"] >= -TAU / (1 - TAU) - 1e-12 and v["n_bad"] == 0 and v["worst_ratio"] <= 1 / (1 - TAU) + 1e-9
    assert v["metro_worst"] >= 1.0
    for x in ("dsv3", "qwen3", "dsv2"):
        for r in ("125", "15"):
            assert v[f"max_gain_vs_matching_{x}_{r}"] <= v[f"max_gain_{x}_{r}"] + 1e-12
    for b in _rows(d, "boundary") + _rows(d, "fine"):
        assert b["lo"] <= b["hi"] and b["p1"] <= b["p1_first_draw"] and b["b_ref"] > 0
    for m in _rows(d, "mechanisms"):
        assert m["matching_acts"] <= min(m["metro_acts"], m["tempo_acts"]) + 1e-9
        assert m["gain_matching"] <= m["gain"] + 1e-12


def _check_04(d):
    for key in ("table1_flame", "table1_zipf"):
        for t in _rows(d, key):
            if t["policy"] in ("token_lp", "metro"):  # TEMPO ≤ min(token-LP, METRO)/(1 − τ) per window
                assert t["median"] >= 1 - TAU - 1e-9, t
    assert all(g["gap"] >= 1 - 1 / (1 - TAU) - 1e-9 for g in _rows(d, "oracle_gap"))


def _check_05(d):
    for c in _rows(d, "t2") + _rows(d, "t2d2"):
        if c["variant"] in ("no ensemble", "no repair"):  # both only ever switch to a better candidate
            assert min(c["mean"], c["p95"], c["max"]) >= -1e-9, c
    v = d["values"]
    for s in ("flame", "zipf"):
        for t in _rows(d, f"t8_{s}"):
            if t["variant"] == "+chains":
                assert t["median"] <= v[f"t8_{s}_seed_{t['B']}"] + 1e-9
    assert v["thm2_theorem_holds"] == v["thm2_instances"] > 0  # M(A3) ≤ LB + Δ: the proof's inequality
    assert 0 < v["thm2_tight_low"] <= v["thm2_tight_high"] and 0 <= v["thm2_delta_used"] <= 1 + 1e-9


def _check_06(d):
    for s in ("flame", "zipf"):
        rows = _rows(d, f"table4_{s}")
        for scale in {t["scale"] for t in rows}:
            m = {t["policy"]: t["median"] for t in rows if t["scale"] == scale}
            assert m["tempo"] <= min(m["token_lp"], m["metro"]) / (1 - TAU) + 1e-9, (s, scale, m)
        for t in _rows(d, f"table3_{s}"):
            assert t["term"] in ("floor", "tokens", "traffic") and t["G"] > 0
            assert t["n_star"] == pytest.approx((16.4 + 2.99 * t["G"] - 25.0) / 0.10)


def _check_07(d):
    for t in _rows(d, "table10"):
        assert t["median"] > 0
        if t["policy"] == "static+never":
            assert t["median"] == pytest.approx(1.0)
    for s in ("flame", "zipf"):
        assert all(t["mean"] > 0 for t in _rows(d, f"info_{s}"))


def _check_08(d):
    for s in _rows(d, "summary"):
        assert s["topology"] <= s["flat"] + 1e-12 and s["makespan_gap"] < 1e-6


def _key(row) -> str:
    """Notebook 09's combo key (``c_r``, ...) of a table row's links and launch."""
    return f"{row['links'][0]}_{row['launch'][0]}"


def _check_09(d):
    v = d["values"]
    links, launches = {"c": "contention", "f": "fifo", "p": "paper"}, {"r": "reactive", "p": "planned", "l": "layer"}
    combos = {key: (links[key[0]], launches[key[2]]) for key in ("c_r", "c_p", "c_l", "f_r", "p_r", "p_p")}
    for key in combos:  # every link × launch model at the three operating points, intervals around the means
        assert v[f"thr_{key}_sync"] == 1.0
        for point in ("rec", "tail", "90"):
            assert v[f"cut_{key}_{point}_sync"] == 0.0
            for m in ("async", "async_sf", "cascade"):
                assert v[f"cut_{key}_{point}_{m}_lo"] <= v[f"cut_{key}_{point}_{m}"] <= v[f"cut_{key}_{point}_{m}_hi"]
        for m in ("async", "async_sf", "cascade"):
            assert v[f"thr_{key}_{m}_lo"] <= v[f"thr_{key}_{m}"] <= v[f"thr_{key}_{m}_hi"]
        assert 0 <= v[f"fig9_{key}_ge5"] <= v[f"fig9_{key}_ge1"] <= 1 and v[f"fig9_{key}_max"] < 1
        assert 0 <= v[f"dropped_{key}"] <= v[f"moves_{key}"] and 0 <= v[f"longer_share_{key}"] <= 1
        # every accepted move executed, abandoned at commit or dropped at execution; refusals are not moves
        parts = v[f"executed_{key}"] + v[f"abandoned_{key}"] + v[f"dropped_{key}"]
        assert parts == v[f"moves_{key}"] and v[f"refused_{key}"] >= 0
    for key in ("p_r", "p_p"):  # the paper's links commit every move
        assert v[f"dropped_{key}"] == v[f"abandoned_{key}"] == 0 and v[f"executed_{key}"] == v[f"moves_{key}"]
    readings = _rows(d, "commit_readings")  # App. C's two readings, wherever links are not the paper's
    assert {(r["links"], r["launch"], r["commit"]) for r in readings} == {
        (links, launch, c) for links, launch in combos.values() if links != "paper" for c in ("first", "any")
    }
    for r in readings:
        assert r["executed"] + r["abandoned"] + r["dropped"] == r["moves"]
        assert r["commit"] == "first" or r["abandoned"] == 0  # "any" never abandons at commit
        assert r["commit"] == "any" or r["cut_90"] == v[f"cut_{_key(r)}_90_cascade"]  # the default is the grid's
    factors = _rows(d, "fig9_factors")  # one factor at a time, ours first in each
    assert {r["factor"] for r in factors} >= {"imbalance", "links", "budget", "theta", "combine", "commit"}
    ours = [r for r in factors if r["ours"]]
    assert len({(round(r["fig9_ge1"], 12), round(r["oewf_alone"], 12)) for r in ours}) == 1  # the same runs ...
    assert ours[0]["fig9_ge1"] == pytest.approx(v["fig9_c_r_ge1"], abs=1e-12)  # ... as the headline's
    for r in factors:
        assert r["fig9_ge1_lo"] <= r["fig9_ge1"] <= r["fig9_ge1_hi"] and 0 <= r["fig9_ge5"] <= r["fig9_ge1"] <= 1
        assert r["oewf_alone_lo"] <= r["oewf_alone"] <= r["oewf_alone_hi"] and 0 <= r["executed_share"] <= 1
    assert 0 <= v["r_tail"] < 1 and 0 < v["attention_accuracy"] < 1 and 0 < v["ffn_efficiency"] <= 1
    assert 0 < v["fig1_movable_share"] < 1 and v["fig1_cascade_cut"] <= v["fig1_movable_share"]
    assert all(r["lo"] <= r["p95_speedup"] <= r["hi"] for r in _rows(d, "sweep"))
    abl = _rows(d, "ablation")
    assert {(r["links"], r["launch"]) for r in abl} == set(combos.values())
    assert [r["mode"] for r in abl[:4]] == ["sync", "async", "async_sf", "cascade"]
    assert {r["point"] for r in abl} == {"rec", "tail", "90"}
    for links, pre in (("contention", ""), ("paper", "plinks_")):  # every result under both
        models = [r["model"] for r in _rows(d, "models") if r["links"] == links]
        assert models == ["deepseek_v4_flash", "deepseek_v4_pro", "glm_5_3"]
        sizes = [r for r in _rows(d, "sizes") if r["links"] == links]
        assert len(sizes) == (5 if links == "contention" else 4) and sizes[0]["requests"] < sizes[2]["requests"]
        assert {r["placement"] for r in _rows(d, "sweep") if r["links"] == links} == set(PLACEMENT_POLICIES)
        for point in ("rec", "tail", "90"):
            for part in ("early_ffn", "combine_overlap", "oewf"):
                lo, mid, hi = (v[f"{pre}attr_{part}_{point}{s}"] for s in ("_lo", "", "_hi"))
                assert lo <= mid <= hi
        assert v[f"{pre}sparse_cut_lo"] <= v[f"{pre}sparse_cut"] <= v[f"{pre}sparse_cut_hi"]
    assert v["seeds"] >= (2 if d["small"] else 10)
    assert 0 < v["tail_found"] < 1 and v["tail_budget"] >= 1
    # per-seed operating points: the matched R_tail and the loads are means over the seeds, with their spread
    assert v["tail_lo"] <= v["tail_found"] <= v["tail_hi"] and v["capacity_rps_lo"] <= v["capacity_rps_hi"]
    assert v["rec_load_lo"] <= v["rec_load_mean"] <= v["rec_load_hi"] and 0 <= v["rec_overloaded"] <= v["seeds"]
    for point in ("rec", "tail", "90"):
        assert v[f"r_tail_c_r_{point}_lo"] <= v[f"r_tail_c_r_{point}"] <= v[f"r_tail_c_r_{point}_hi"] < 1
    sens = _rows(d, "sensitivity")  # link bandwidth × imbalance
    assert {r["imbalance"] for r in sens} == {"sparse", "matched", "dense"}
    for imb in ("sparse", "matched", "dense"):
        gbps = [r["link_gbps"] for r in sens if r["imbalance"] == imb]
        assert gbps == sorted(gbps) and len(gbps) >= 3
    assert all(0 <= r["fig9_ge1"] <= 1 and 0 < r["r_tail"] < 1 for r in sens)


def _check_10(d):
    for q in _rows(d, "quality"):
        assert q["mean"] >= 1.0 - 1e-3 or q["policy"] == "token_lp"  # only token-LP's real shares may beat tempo
        assert q["mean"] <= q["max"] + 1e-12
    for f in _rows(d, "freshness"):
        assert f["exact"] <= f["stale"] + 1e-9 and f["exact"] <= f["frozen"] + 1e-9
        assert f["relief_vs_stale"] == pytest.approx(f["fresh_relief"] / f["stale"])
    for c in _rows(d, "cost"):
        assert c["ratio"] == pytest.approx(c["ingraph_ms"] / c["fixed_ms"]) and c["plan_flops"] > 0
    for o in _rows(d, "optimum"):  # nothing beats the proved optimum
        assert 1.0 - 1e-9 <= o["mean"] <= o["max"] + 1e-12 and 1.0 - 1e-9 <= o["p95"] <= o["max"] + 1e-12


def _check_11(d):
    for s in _rows(d, "summary"):  # the guard never makes the batch slower than no copies
        assert s["dynamic_vs_static"] <= 1 + 1e-9 and s["n"] >= 1
    for m in _rows(d, "optimum"):  # nothing on the same placement with k slots beats the proved optimum
        for q in ("static", "moonep", "dynamic"):
            assert m[f"{q}_over_optimum"] >= 1 - 1e-6, (q, m)
    for g in _rows(d, "map"):
        assert g["dynamic_gain"] >= 1 - 1e-9 and g["llep_gain"] > 0 and g["copies"] >= 0


INVARIANTS = {
    "01_cost_model": _check_01,
    "02_mixed_regimes": _check_02,
    "03_phase_diagram": _check_03,
    "04_proxy_mispricing": _check_04,
    "05_ablation": _check_05,
    "06_policy_landscape": _check_06,
    "07_staleness_and_placement": _check_07,
    "08_topology": _check_08,
    "09_cascade_ep": _check_09,
    "10_ingraph_dispatch": _check_10,
    "11_dynamic_copies": _check_11,
}


# ------------------------------------------------------------------------------------------------ tests
def test_notebooks_exist():
    assert len(NOTEBOOKS) >= 2


def test_every_recording_notebook_has_invariants_and_committed_json():
    for path in RECORDING:
        assert _recorder_name(path) == path.stem, f"{path.name} records under another name"
        assert path.stem in INVARIANTS, f"add the invariants {path.stem} can check at SMALL=1 to INVARIANTS"
        assert path.stem in COMMITTED, f"no committed {RESULTS_DIR / path.stem}.json: run `make notebooks`"


@pytest.mark.one_env
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_small(path, tmp_path, monkeypatch):
    monkeypatch.setenv("TEMPO_FIGURES", str(tmp_path / "figures"))  # never overwrite the committed figures
    monkeypatch.setenv("TEMPO_RESULTS", str(tmp_path / "results"))  # nor the committed full-size JSON
    run = run_notebook(path, small=True, timeout=600)
    assert run.ok, run.error
    assert list((tmp_path / "figures").glob("*.png")), "the notebook wrote no figure"
    if path not in RECORDING:
        return
    small = json.loads((tmp_path / "results" / f"{path.stem}.json").read_text())
    assert small["small"] is True and small["reading"].startswith("**Reading.**")
    full = COMMITTED.get(path.stem)
    if full is not None:  # the same tables with the same columns, the same claims
        assert set(small["tables"]) == set(full["tables"])
        for name, rows in full["tables"].items():
            if rows and small["tables"][name]:
                assert set(small["tables"][name][0]) == set(rows[0]), name
        assert set(small["claims"]) == set(full["claims"])
    INVARIANTS[path.stem](small)


@pytest.mark.parametrize("path", RECORDING, ids=[p.stem for p in RECORDING])
def test_reading_matches_committed_json(path):
    full = COMMITTED.get(path.stem)
    assert full is not None, f"no committed JSON for {path.stem}: run `make notebooks`"
    assert full["small"] is False
    (template,) = _reading_templates(path)
    assert placeholders(template), "a reading cell must quote recorded numbers"
    assert typed_numbers(template) == [], "numbers typed into the reading prose: record and quote them"
    # Every placeholder is a committed value, and the committed reading is this template on those values.
    assert render(template, full["values"]).strip() == full["reading"]
    false = [k for k, ok in full["claims"].items() if not ok]
    assert not false, f"claims the reading relies on do not hold in the committed JSON: {false}"
