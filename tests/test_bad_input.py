"""Bad input gets a clear error and nothing is silently wrong (issue 17): one table per surface.

Each row: an id, what to run, the exception type expected and a fragment of its message (the argument, the bad
value or the fix). Wrong types raise `solvers.checks.ArgTypeError`, a ``TypeError`` that is also a ``ValueError``;
the rows ask for ``TypeError`` there. Files are small and written to ``tmp_path``. The CLI rows run ``main(argv)``
in-process and check the exit status (2 usage, 1 runtime) and that stderr is one line without a traceback.
"""

import json
import math
import re
import time
import zipfile

import numpy as np
import pytest

from solvers import PRESETS, CostModel, DispatchProblem, Placement, fit_max_affine, rebalance_experts, solve
from solvers.checks import ArgTypeError
from tempo_jax.cli import build_parser, main
from tempo_jax.runtime.serve_config import ServeConfig
from tempo_jax.sim import PhaseConfig
from tempo_jax.workloads import (
    RoutingTrace,
    load_array,
    load_flame_moe,
    load_harmoeny,
    load_mixtral,
    load_mooncake,
    load_sample,
    load_saved_trace,
    load_switch128,
    sample_topk,
)

COST = PRESETS["dsv3_fp8_offline"]
PL = Placement.full(4, 2)
OK = np.array([600, 30, 30, 30])


def _problem(counts=OK, placement=PL, cost=COST):
    return DispatchProblem(np.asarray(counts), placement, cost)


# ---------------------------------------------------------------------------------------- library API
API_CASES = [
    # CostModel: negative, non-finite and non-numeric parameters are refused at construction.
    ("cost_negative_b", lambda: CostModel(b=-10.0, beta=0.01), ValueError, "CostModel.b must be >= 0"),
    ("cost_negative_beta", lambda: CostModel(b=1.0, beta=-0.1), ValueError, "CostModel.beta must be >= 0"),
    ("cost_negative_a", lambda: CostModel(a=-1.0, b=1.0, beta=0.1), ValueError, "CostModel.a must be >= 0"),
    ("cost_b_string", lambda: CostModel(b="1", beta=0.1), TypeError, "CostModel.b must be a real number, got '1'"),
    ("cost_b_none", lambda: CostModel(b=None, beta=0.1), TypeError, "CostModel.b must be a real number, got None"),
    ("cost_b_bool", lambda: CostModel(b=True, beta=0.1), TypeError, "CostModel.b must be a real number"),
    ("cost_b_nan", lambda: CostModel(b=math.nan, beta=0.1), ValueError, "CostModel.b must be a finite number"),
    ("cost_beta_inf", lambda: CostModel(b=1.0, beta=math.inf), ValueError, "CostModel.beta must be a finite"),
    ("cost_gamma_negative", lambda: CostModel(b=1, beta=1, c2=1, gamma=-1), ValueError, "CostModel.gamma"),
    ("cost_c2_alone", lambda: CostModel(b=1, beta=0.1, c2=3.0), ValueError, "both c2 and gamma"),
    ("cost_tile_zero", lambda: CostModel(b=1, beta=1, tile=0), ValueError, "CostModel.tile must be >= 1"),
    ("cost_tile_string", lambda: CostModel(b=1, beta=1, tile="a"), TypeError, "CostModel.tile must be an integer"),
    ("cost_tile_fraction", lambda: CostModel(b=1, beta=1, tile=1.5), TypeError, "got 1.5"),
    ("cost_source_number", lambda: CostModel(b=1, beta=1, source=5), TypeError, "CostModel.source must be a str"),
    ("cost_dict_no_beta", lambda: CostModel.from_dict({"b": 15}), ValueError, "lacks ['beta']"),
    ("cost_dict_unknown", lambda: CostModel.from_dict({"b": 1, "beta": 1, "alpha": 2}), ValueError, "alpha"),
    ("cost_dict_list", lambda: CostModel.from_dict([1]), TypeError, "must be a mapping"),
    ("cost_json_syntax", lambda: CostModel.from_json('{"b": 1,'), ValueError, "invalid JSON at line 1"),
    # Placement: counts checked for type and range; nothing huge is allocated for a bad id.
    (
        "placement_huge_id",
        lambda: Placement.from_phy2log([0, 1, 7_000_000_000, 2], 2),
        ValueError,
        "7000000001 experts but only 4 physical slots",
    ),
    (
        "placement_gpus_string",
        lambda: Placement.from_phy2log([0, 1], "2"),
        TypeError,
        "num_gpus must be an integer >= 1, got '2'",
    ),
    ("placement_gpus_float", lambda: Placement([0, 1], 2.0, 2), TypeError, "num_gpus must be an integer"),
    ("placement_zero_experts", lambda: Placement([0, 1], 2, 0), ValueError, "num_experts must be >= 1"),
    ("placement_zero_gpus", lambda: Placement([0, 1], 0, 2), ValueError, "num_gpus must be >= 1"),
    ("placement_empty", lambda: Placement([], 2, 2), ValueError, "non-empty [P] or [D, S]"),
    ("placement_none_ids", lambda: Placement(None, 2, 2), TypeError, "phy2log must be a numeric array"),
    ("placement_string_ids", lambda: Placement(["a", "b"], 2, 2), TypeError, "integer expert ids"),
    ("placement_ragged_ids", lambda: Placement([[0, 1], [1]], 2, 2), ValueError, "rectangular"),
    ("placement_fraction_id", lambda: Placement.from_phy2log([0.5, 1, 0, 1], 2), ValueError, "phy2log[0] = 0.5"),
    ("placement_1e30_id", lambda: Placement.from_phy2log([1e30, 0], 1), ValueError, "2^53"),
    ("placement_nan_id", lambda: Placement.from_phy2log([np.nan, 0], 1), ValueError, "NaN"),
    ("placement_3d_ids", lambda: Placement(np.zeros((2, 2, 2), int), 2, 1), ValueError, "[P] or [D, S]"),
    ("placement_ragged_layout", lambda: Placement.from_phy2log([0, 1, 2], 2), ValueError, "ragged layout"),
    ("placement_gpn_zero", lambda: Placement([0, 1], 2, 2, gpus_per_node=0), ValueError, "gpus_per_node must be"),
    ("placement_gpn_string", lambda: Placement([0, 1], 2, 2, gpus_per_node="1"), TypeError, "gpus_per_node"),
    ("placement_full_huge", lambda: Placement.full(5000, 5000), ValueError, "exceeds the supported"),
    ("placement_full_string", lambda: Placement.full("3", 2), TypeError, "num_experts must be an integer"),
    ("placement_eplb_string", lambda: Placement.from_eplb([1, 2, 3], "4", 2), TypeError, "num_replicas"),
    ("placement_eplb_huge", lambda: Placement.from_eplb([1, 2], 10**12, 2), ValueError, "exceeds the supported"),
    ("eplb_huge", lambda: rebalance_experts(np.ones((4, 8)), 2**23, 1, 1, 8), ValueError, "exceeds the supported"),
    ("placement_eplb_nan", lambda: Placement.from_eplb([1, np.nan], 4, 2), ValueError, "load contains NaN"),
    ("placement_dict_no_gpus", lambda: Placement.from_dict({"phy2log": [0, 1]}), ValueError, "lacks ['num_gpus']"),
    (
        "placement_dict_typo",
        lambda: Placement.from_dict({"phy2log": [0, 1], "num_gpus": 2, "gpu_per_node": 1}),
        ValueError,
        "unknown field(s) ['gpu_per_node']",
    ),
    ("placement_dict_list", lambda: Placement.from_dict([0, 1]), TypeError, "placement must be a mapping"),
    # DispatchProblem and solve.
    (
        "problem_placement_none",
        lambda: DispatchProblem(OK, None, COST),
        TypeError,
        "DispatchProblem: placement must be a Placement, got None",
    ),
    ("problem_cost_none", lambda: DispatchProblem(OK, PL, None), TypeError, "cost must be a CostModel"),
    ("problem_cost_dict", lambda: DispatchProblem(OK, PL, {"b": 1}), TypeError, "cost must be a CostModel"),
    ("problem_counts_1e18", lambda: _problem([1e18, 1, 1, 1]), ValueError, "below 2^53"),
    ("problem_counts_strings", lambda: _problem(["a", "b", "c", "d"]), TypeError, "tokens must be a numeric array"),
    ("problem_counts_negative", lambda: _problem([1, -2, 3, 4]), ValueError, "tokens must be ≥ 0"),
    ("problem_counts_fraction", lambda: _problem([1.5, 2, 3, 4]), ValueError, "whole numbers"),
    ("problem_counts_scalar", lambda: _problem(5), ValueError, "1-D or 2-D"),
    ("problem_counts_wrong_e", lambda: _problem([1, 2]), ValueError, "placement has 4"),
    ("solve_not_a_problem", lambda: solve(None), TypeError, "solve: problem must be a DispatchProblem"),
    ("solve_policy_number", lambda: solve(_problem(), 3), TypeError, "unknown policy 3; valid policies"),
    ("solve_policy_unknown", lambda: solve(_problem(), "lpt"), ValueError, "unknown policy 'lpt'"),
    ("solve_option_unknown", lambda: solve(_problem(), "tempo", alpha=1), ValueError, "unknown option(s) ['alpha']"),
    ("solve_tau_string", lambda: solve(_problem(), "tempo", tau="x"), TypeError, "option tau of policy 'tempo'"),
    ("solve_tau_range", lambda: solve(_problem(), "tempo", tau=5.0), ValueError, "tau must be in [0, 1)"),
    ("solve_chains_int", lambda: solve(_problem(), "tempo", chains=1), TypeError, "option chains"),
    ("solve_time_limit_string", lambda: solve(_problem(), "milp", time_limit="10"), TypeError, "time_limit"),
    ("solve_backend_unknown", lambda: solve(_problem(), "milp", backend="gurobi"), ValueError, "valid backends"),
    (
        "milp_counts_too_large",
        lambda: solve(_problem([8e15, 1, 5, 7]), "milp"),
        ValueError,
        "too large for an exact model",
    ),
    (
        "milp_states_supported_size",
        lambda: solve(_problem([1e15, 1, 5, 7]), "milp"),
        ValueError,
        "handles batches up to about",
    ),
    # Calibration.
    ("fit_one_sample", lambda: fit_max_affine([1], [2], [3]), ValueError, "need at least 4 samples"),
    ("fit_scalar_samples", lambda: fit_max_affine(1.0, 2.0, 3.0), ValueError, "G must be 1-D"),
    ("fit_iters_string", lambda: fit_max_affine([1] * 4, [1] * 4, [1] * 4, iters="5"), TypeError, "iters"),
    (
        "trace_nan_weights",
        lambda: RoutingTrace("toy", "toy", 4, 1, topk_ids={0: [[1], [2]]}, topk_weights={0: [[0.5], [np.nan]]}),
        ValueError,
        "topk_weights[0] must be finite and >= 0, got nan at token 1",
    ),
    ("fit_zero_time", lambda: fit_max_affine([1, 2, 3, 4], [1, 2, 3, 4], [1, 0, 3, 4]), ValueError, "positive"),
    # Issue 27. EPLB: float32 overflow refused, never an inconsistent layout; sizes that run in seconds.
    (
        "eplb_float32_overflow",
        lambda: rebalance_experts(np.array([[1e39, 1, 1, 1]]), 8, 1, 1, 2),
        ValueError,
        "beyond float32",
    ),
    (
        "eplb_sum_overflow",
        lambda: rebalance_experts(np.array([[3e38, 3e38, 1, 1]]), 8, 1, 1, 2),
        ValueError,
        "sums to 6e+38",
    ),
    (
        "eplb_gpus_float",
        lambda: rebalance_experts(np.ones((1, 4)), 8, 1, 1, 2.0),
        TypeError,
        "rebalance_experts: num_gpus must be an integer >= 1, got 2.0",
    ),
    (
        "eplb_replicas_per_layer",
        lambda: rebalance_experts(np.ones((1, 8)), 2**17, 1, 1, 8),
        ValueError,
        "slots per layer",
    ),
    ("eplb_work", lambda: Placement.from_eplb(np.ones(2**14), 2**16, 64), ValueError, "that run in seconds"),
    # CostModel / DispatchProblem: a model pricing nothing, or times beyond float64 arithmetic.
    ("cost_no_slope", lambda: CostModel(a=5.0, b=0.0, beta=0.0), ValueError, "prices no load"),
    (
        "problem_time_overflow",
        lambda: _problem(cost=CostModel(b=1e308, beta=1e308)),
        ValueError,
        "check the model's units",
    ),
    # Calibration that cannot determine the model.
    (
        "fit_identical_rows",
        lambda: fit_max_affine([4] * 8, [100] * 8, [50] * 8),
        ValueError,
        "cannot determine the model",
    ),
    (
        "fit_one_n",
        lambda: fit_max_affine([1, 2, 3, 4, 5], [9] * 5, [1, 2, 3, 4, 5]),
        ValueError,
        "piece in N undetermined",
    ),
    (
        "fit_nothing_rises",
        lambda: fit_max_affine([1, 2, 4, 8, 16], [10, 20, 40, 80, 160], [9, 8, 7, 6, 5]),
        ValueError,
        "contradict the model",
    ),
    # Sizes checked before any allocation.
    (
        "sample_topk_huge",
        lambda: sample_topk(np.ones(8), 2**27, 1, np.random.default_rng(0)),
        ValueError,
        "exceed the limit of 67,108,864",
    ),
    ("phase_huge_batch", lambda: PhaseConfig(tokens_per_gpu=(10**9,)), ValueError, "lower tokens_per_gpu"),
    ("serve_huge_batch", lambda: ServeConfig(tokens_per_rank=10**9), ValueError, "1 GiB of float32"),
    # Options that would be ignored are refused.
    ("serve_cost_and_json", lambda: ServeConfig(cost="dsv3_b_tile", cost_json="c.json"), ValueError, "not both"),
    (
        "serve_trace_synthetic",
        lambda: ServeConfig(model="layer", trace="mixtral_8x7b"),
        ValueError,
        "only read by model='layer' with routing='recorded'",
    ),
    # MoEConfig: types and dtypes at construction, not deep inside jax.
    ("moe_hidden_fraction", lambda: _moe_config(hidden=8.5), TypeError, "MoEConfig.hidden must be an integer"),
    ("moe_hidden_nan", lambda: _moe_config(hidden=math.nan), TypeError, "got nan"),
    ("moe_dtype_unknown", lambda: _moe_config(dtype="float33"), ValueError, "'float33' is not a dtype"),
    ("moe_dtype_int", lambda: _moe_config(dtype="int32"), ValueError, "floating-point dtype"),
    ("moe_axis_number", lambda: _moe_config(axis=0), TypeError, "MoEConfig.axis must be a str"),
    # Loaders: argument types, never coerced into other values.
    ("flame_layers_string", lambda: load_flame_moe(layers="23"), TypeError, "layers must be a list of layer ids"),
    ("flame_layers_float", lambda: load_flame_moe(layers=[2.0]), TypeError, "layers[] must be an integer"),
    ("flame_layers_repeat", lambda: load_flame_moe(layers=[2, 2]), ValueError, "repeats a layer id"),
    ("flame_path_number", lambda: load_flame_moe(path=5), TypeError, "path must be a str or PathLike"),
    ("harmoeny_model_list", lambda: load_harmoeny(["qwen"]), ValueError, "HarMoEny model ['qwen'] unknown"),
    ("harmoeny_flag_int", lambda: load_harmoeny(include_degenerate=1), TypeError, "include_degenerate must be"),
    ("sample_name_number", lambda: load_sample(3), ValueError, "unknown trace 3"),
    ("saved_path_number", lambda: load_saved_trace(5), TypeError, "load_saved_trace: path must be a str"),
    ("saved_name_number", lambda: load_saved_trace("x.npz", 3), TypeError, "load_saved_trace: name must be"),
    # Input files: devices and pipes are refused before any read.
    ("read_dev_zero", lambda: CostModel.load("/dev/zero"), ValueError, "/dev/zero is not a regular file"),
    ("array_dev_zero", lambda: load_array("/dev/zero", "counts"), ValueError, "not a regular file"),
    ("mooncake_dev_zero", lambda: load_mooncake("/dev/zero"), ValueError, "Mooncake trace /dev/zero is not a regular"),
]


def _moe_config(**kw):
    from tempo_jax.layer import MoEConfig

    return MoEConfig(**{"hidden": 8, "ffn": 4, "experts": 4, "top_k": 2, "slots_per_rank": 1, **kw})


@pytest.mark.parametrize("fn, exc, fragment", [c[1:] for c in API_CASES], ids=[c[0] for c in API_CASES])
def test_api_rejects(fn, exc, fragment):
    with pytest.raises(exc) as err:
        fn()
    assert fragment in str(err.value)


def test_type_errors_are_also_value_errors():
    """ArgTypeError keeps code written against the earlier checks (which raised ValueError) working."""
    with pytest.raises(ValueError):
        Placement.from_phy2log([0, 1], "2")
    assert issubclass(ArgTypeError, TypeError) and issubclass(ArgTypeError, ValueError)


def test_huge_id_fails_fast():
    t0 = time.perf_counter()
    with pytest.raises(ValueError):
        Placement.from_phy2log(np.array([0, 1, 7_000_000_000, 2]), 2)
    with pytest.raises(ValueError, match="MAX_PAIRS"):
        Placement.from_phy2log(np.arange(20_000) % 1000, 20_000)  # 1000 experts × 20,000 ranks > MAX_PAIRS
    assert time.perf_counter() - t0 < 2.0


def test_cost_model_stores_floats():
    m = CostModel(b=np.float32(1.5), beta=1, tile=np.int64(64))
    assert type(m.b) is float and type(m.beta) is float and type(m.tile) is int
    assert json.loads(m.to_json())["b"] == 1.5


def test_fit_outside_domain_is_constrained_and_reported():
    """Times that fall as G rises pull b below 0: the model holds b at 0 and the report says so. When every slope
    would be held at 0 (times fall with G and N alike) no model prices any load: refused, naming the slopes."""
    G = np.array([1, 2, 4, 8, 16, 32, 1, 2, 4, 8.0, 1, 1, 1, 1])
    N = np.concatenate([10 * G[:10], [2000, 4000, 8000, 16000]])
    t = np.concatenate([100 - 2 * G[:10], 0.05 * N[10:]])  # floor samples fall with G; token samples rise with N
    model, report = fit_max_affine(G, N, t)
    assert model.b == 0.0 and model.beta == pytest.approx(0.05) and min(model.a, model.c) >= 0
    assert report.outside_domain["b"] == pytest.approx(-2.0)
    with pytest.raises(ValueError, match=r"contradict the model.*b, beta"):
        fit_max_affine(G[:10], 10 * G[:10], 100 - 2 * G[:10])
    good, rep = fit_max_affine(G, 10 * G, PRESETS["dsv3_a_gemm_refit"].gpu_times(G, 10 * G))
    assert not rep.outside_domain and good.b > 0


def test_fit_with_a_huge_iters_ends_and_matches_the_plain_loop():
    """Random times make the assignment oscillate; a cycle is detected, so iters=10**12 ends at once and equals
    running the loop: adding a multiple of the period to iters gives the same state."""
    rng = np.random.default_rng(1)  # a draw whose assignment oscillates
    G, N, t = rng.integers(1, 17, 8), rng.integers(1, 4000, 8), rng.uniform(0.5, 1e4, 8)
    t0 = time.perf_counter()
    model, report = fit_max_affine(G, N, t, iters=10**12)
    assert time.perf_counter() - t0 < 1.0 and not report.converged and report.iterations == 10**12
    assert hash(report) == hash(report)  # outside_domain (a dict) is left out of the hash
    same, rep = fit_max_affine(G, N, t, iters=10**12 + math.lcm(*range(1, 17)))  # a multiple of short periods
    assert same == model and rep.mean_rel_error == report.mean_rel_error


def test_token_lp_keeps_small_experts_beside_huge_ones():
    d = solve(_problem([1e12, 1, 5, 7]), "token_lp")
    np.testing.assert_allclose(d.x.sum(axis=1), [1e12, 1, 5, 7])


# -------------------------------------------------------------------------------------------- loaders
def _mixtral_line(**kw):
    rec = {"dataset": "humaneval", "problem_id": 0, "layer": 0, "experts": [6, 5], "token_idx": 0}
    rec["gating_probs"] = [0.7, 0.3]
    rec.update(kw)
    return json.dumps(rec)


def _mixtral(tmp_path, bad_line):
    f = tmp_path / "routing.jsonl"
    good = _mixtral_line(token_idx=1)
    f.write_bytes(good.encode() + b"\n" + (bad_line if isinstance(bad_line, bytes) else bad_line.encode()) + b"\n")
    return lambda: load_mixtral(f), f"{f}:2"


FLAME_HEADER = "layer_id,token_id,expert_0,expert_1,expert_2,expert_3"


def _flame(tmp_path, rows, header=FLAME_HEADER):
    folder = tmp_path / "flame"
    folder.mkdir()
    body = rows if isinstance(rows, bytes) else "\n".join([header, *rows]).encode()
    (folder / "layer_2.csv").write_bytes(body)
    return lambda: load_flame_moe(folder), str(folder / "layer_2.csv")


HARMOENY_HEADER = "iteration,total number of tokens sent,expert distribution"


def _harmoeny(tmp_path, rank1_rows):
    folder = tmp_path / "qwen"
    for r, rows in enumerate([['0,3,"[1, 2, 0]"', '1,3,"[0, 3, 0]"'], rank1_rows]):
        (folder / str(r)).mkdir(parents=True)
        body = rows if isinstance(rows, bytes) else "\n".join([HARMOENY_HEADER, *rows]).encode()
        (folder / str(r) / "moe_layer-0.csv").write_bytes(body)
    return lambda: load_harmoeny("qwen", folder), str(folder / "1" / "moe_layer-0.csv")


def _npy(tmp_path, data: bytes):
    f = tmp_path / "switch.npy"
    f.write_bytes(data)
    return lambda: load_switch128(f), str(f)


def _saved(tmp_path, data: bytes):
    f = tmp_path / "traces.npz"
    f.write_bytes(data)
    return lambda: load_saved_trace(f), str(f)


def _truncated_zip(tmp_path):
    f = tmp_path / "whole.npz"
    np.savez(f, a=np.arange(1000))
    return f.read_bytes()[:200]


LOADER_CASES = [
    ("mixtral_fraction_id", lambda p: _mixtral(p, _mixtral_line(experts=[5.5, 1])), "expert ids must be integers"),
    ("mixtral_id_out_of_range", lambda p: _mixtral(p, _mixtral_line(experts=[9, 1])), "in [0, 8), got 9"),
    ("mixtral_bool_id", lambda p: _mixtral(p, _mixtral_line(experts=[True, 1])), "got True"),
    ("mixtral_nan_prob", lambda p: _mixtral(p, _mixtral_line(gating_probs=[math.nan, 0.3])), "finite numbers"),
    ("mixtral_negative_prob", lambda p: _mixtral(p, _mixtral_line(gating_probs=[-0.1, 0.3])), "got -0.1"),
    ("mixtral_prob_count", lambda p: _mixtral(p, _mixtral_line(gating_probs=[1.0])), "list of 2 numbers"),
    ("mixtral_repeat", lambda p: _mixtral(p, _mixtral_line(experts=[3, 3])), "repeats an expert id"),
    ("mixtral_fraction_token", lambda p: _mixtral(p, _mixtral_line(token_idx=2.5)), "token_idx must be an integer"),
    ("mixtral_truncated", lambda p: _mixtral(p, _mixtral_line()[:40]), "invalid JSON"),
    ("mixtral_not_object", lambda p: _mixtral(p, "[1, 2]"), "expected a JSON object"),
    ("mixtral_missing_key", lambda p: _mixtral(p, json.dumps({"layer": 0})), "missing ["),
    ("mixtral_binary", lambda p: _mixtral(p, b"\x89PNG\x00\xff\xfe garbage"), "not UTF-8 text"),
    ("flame_truncated_row", lambda p: _flame(p, ["0,0,0.5,0,0,0", "0,1,0.5"]), ":3: 3 values, expected 6"),
    ("flame_non_numeric", lambda p: _flame(p, ["0,0,0.5,0,0,0", "0,1,abc,0,0,0.4"]), ":3: expert_0 = 'abc'"),
    ("flame_nan_score", lambda p: _flame(p, ["0,0,0.5,0,0,0", "0,1,nan,0,0.2,0"]), ":3: router scores"),
    ("flame_negative_score", lambda p: _flame(p, ["0,0,0.5,0,0,0", "0,1,-1,0,0,0"]), "expert_0 = -1.0"),
    ("flame_uneven_k", lambda p: _flame(p, ["0,0,0.5,0,0,0", "0,1,0.5,0.1,0,0"]), ":3: 2 non-zero experts"),
    ("flame_header_only", lambda p: _flame(p, []), "no data rows"),
    ("flame_other_layer_id", lambda p: _flame(p, ["0,0,0.5,0,0,0", "5,1,0.5,0,0,0"]), ":3: layer_id = 5"),
    ("flame_mixed_layer_id", lambda p: _flame(p, ["2,0,0.5,0,0,0", "0,1,0.5,0,0,0"]), ":3: layer_id = 0"),
    ("flame_fraction_token", lambda p: _flame(p, ["0,0,0.5,0,0,0", "0,1.5,0.5,0,0,0"]), ":3: token_id must be"),
    ("flame_negative_token", lambda p: _flame(p, ["0,-1,0.5,0,0,0"]), ":2: token_id must be a whole number"),
    ("flame_repeat_token", lambda p: _flame(p, ["0,0,0.5,0,0,0", "0,0,0,0.5,0,0"]), ":3: token_id 0 repeats line 2"),
    ("flame_bad_header", lambda p: _flame(p, ["0,0,1,0"], header="a,b,c,d"), ":1: unexpected header"),
    ("flame_binary", lambda p: _flame(p, b"\x00\xff\xfe\x89 binary"), "not UTF-8 text"),
    ("harmoeny_fraction", lambda p: _harmoeny(p, ['0,3,"[1.5, 1.5, 0]"']), ":2: expert distribution must be"),
    ("harmoeny_negative", lambda p: _harmoeny(p, ['0,3,"[4, -1, 0]"']), "integer counts >= 0"),
    ("harmoeny_not_json", lambda p: _harmoeny(p, ['0,3,"[1, 2,"']), ":2: expert distribution is not a JSON list"),
    ("harmoeny_truncated", lambda p: _harmoeny(p, ['0,3,"[1, 2, 0]"', "1,3"]), ":3: not 3 columns"),
    ("harmoeny_iteration", lambda p: _harmoeny(p, ['x,3,"[1, 2, 0]"']), "iteration 'x', expected 0"),
    ("harmoeny_sum", lambda p: _harmoeny(p, ['0,4,"[1, 2, 0]"']), "sums to 3 tokens but reports '4'"),
    ("harmoeny_lengths", lambda p: _harmoeny(p, ['0,3,"[1, 2, 0]"', '1,3,"[3, 0]"']), ":3: 2 experts"),
    ("harmoeny_binary", lambda p: _harmoeny(p, b"\xff\xfe\x00garbage"), "not UTF-8 text"),
    ("npy_garbage", lambda p: _npy(p, b"\x00\x01garbage" * 10), "not a readable .npy array"),
    ("npy_truncated", lambda p: _npy(p, b"\x93NUMPY\x01\x00v\x00{'descr': '<i8', "), "not a readable .npy"),
    ("saved_garbage", lambda p: _saved(p, b"\x00\x01garbage" * 10), "not a saved trace file"),
    ("saved_truncated", lambda p: _saved(p, _truncated_zip(p)), "not a saved trace file"),
]


@pytest.mark.parametrize("build, fragment", [c[1:] for c in LOADER_CASES], ids=[c[0] for c in LOADER_CASES])
def test_loaders_name_the_file(tmp_path, build, fragment):
    load, where = build(tmp_path)
    with pytest.raises(ValueError) as err:
        load()
    assert where in str(err.value) and fragment in str(err.value)


def test_saved_trace_with_a_damaged_entry(tmp_path):
    f = tmp_path / "t.npz"
    with zipfile.ZipFile(f, "w") as z:  # a meta entry that is not JSON
        with z.open("toy__meta.npy", "w") as fh:
            np.lib.format.write_array(fh, np.array("{not json"))
    with pytest.raises(ValueError, match=rf"{f}: trace 'toy' is damaged"):
        load_saved_trace(f)


# ------------------------------------------------------------------------------------------ command line
@pytest.fixture
def files(tmp_path):
    """Small input files for the CLI rows, by name."""
    G = np.array([1, 2, 4, 8, 16, 32, 1, 2, 4, 8.0])
    f = {
        "counts": json.dumps({"counts": [600, 30, 30, 30]}),
        "counts_nokey": json.dumps({"count": [1, 2]}),
        "counts_scalar": "5",
        "counts_syntax": '{"counts": [1, 2,,]}',
        "counts_fraction": "[1.5, 2]",
        "counts_ragged": "[[1, 2], [3]]",
        "counts_strings": '["a", "b"]',
        "placement": json.dumps({"phy2log": [0, 1, 2, 3], "num_gpus": 2}),
        "placement_nogpus": json.dumps({"phy2log": [0, 1, 2, 3]}),
        "placement_list": "[0, 1, 2, 3]",
        "placement_gpus_string": json.dumps({"phy2log": [0, 1, 2, 3], "num_gpus": "2"}),
        "cost_nobeta": json.dumps({"b": 15}),
        "cost_negative": json.dumps({"b": -15, "beta": 0.1}),
        "cost_string": json.dumps({"b": "15", "beta": 0.1}),
        "one_row": "G,N,t\n1,2,3\n",
        "non_numeric": "G,N,t\n1,2,3\n1,x,3\n4,5,6\n7,8,9\n",
        "short_row": "G,N,t\n1,2,3\n1,2\n",
        "no_t": "G,N\n1,2\n",
        "falling": "G,N,t\n"
        + "\n".join(f"{g:g},{10 * g:g},{100 - 2 * g:g}" for g in G)
        + "".join(f"\n1,{n},{0.05 * n:g}" for n in (2000, 4000, 8000, 16000)),  # token samples: beta > 0
        "file": "x",
        "counts_empty": "[]",
        "identical": "G,N,t\n" + "4,100,50\n" * 8,
        "cost_huge": json.dumps({"b": 1e308, "beta": 1e308}),
        "cost_flat": json.dumps({"a": 5, "b": 0, "beta": 0}),
        "good": "G,N,t\n"
        + "\n".join(f"{g:g},{n:g},{max(20 + 5 * g, 0.05 * n):g}" for g in (1, 2, 4, 8) for n in (10, 1000, 8000)),
    }
    csv = ("one_row", "non_numeric", "short_row", "no_t", "falling", "good", "identical")
    paths = {}
    for name, text in f.items():
        paths[name] = tmp_path / (name + (".csv" if name in csv else ".json"))
        paths[name].write_text(text)
    paths["binary"] = tmp_path / "binary.json"
    paths["binary"].write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe")
    paths["npy_garbage"] = tmp_path / "garbage.npy"
    paths["npy_garbage"].write_bytes(b"not an npy file")
    paths["dir"] = tmp_path
    paths["missing"] = tmp_path / "missing.json"
    paths["tmp"] = tmp_path
    return paths


def _solve(*extra):
    return ["solve", "--counts", "{counts}", *extra]


CLI_CASES = [
    # (id, argv with {file} placeholders, exit status, stderr fragment)
    ("counts_without_key", ["solve", "--counts", "{counts_nokey}"], 2, "JSON object without a 'counts' key"),
    ("counts_scalar", ["solve", "--counts", "{counts_scalar}"], 2, "counts must be 1-D or 2-D"),
    ("counts_directory", ["solve", "--counts", "{dir}"], 2, "is a folder"),
    ("counts_syntax", ["solve", "--counts", "{counts_syntax}"], 2, "counts_syntax.json:1:18: invalid JSON"),
    ("counts_fraction", ["solve", "--counts", "{counts_fraction}"], 2, "whole numbers"),
    ("counts_ragged", ["solve", "--counts", "{counts_ragged}"], 2, "rectangular"),
    ("counts_strings", ["solve", "--counts", "{counts_strings}"], 2, "numeric array"),
    ("counts_binary", ["solve", "--counts", "{binary}"], 2, "binary.json:1: not UTF-8 text"),
    ("counts_missing", ["solve", "--counts", "{missing}"], 2, "missing.json does not exist"),
    ("counts_bad_npy", ["solve", "--counts", "{npy_garbage}"], 2, "not a readable .npy file"),
    ("placement_missing", _solve("--placement", "{missing}"), 2, "--placement {missing} does not exist"),
    ("placement_without_gpus", _solve("--placement", "{placement_nogpus}"), 2, "lacks ['num_gpus']"),
    ("placement_list", _solve("--placement", "{placement_list}"), 2, "expected a JSON object"),
    ("placement_gpus_string", _solve("--placement", "{placement_gpus_string}"), 2, "num_gpus must be an integer"),
    ("placement_syntax", _solve("--placement", "{counts_syntax}"), 2, "counts_syntax.json:1:18"),
    ("cost_without_beta", _solve("--cost-json", "{cost_nobeta}"), 2, "lacks ['beta']"),
    ("cost_negative", _solve("--cost-json", "{cost_negative}"), 2, "CostModel.b must be >= 0"),
    ("cost_string", _solve("--cost-json", "{cost_string}"), 2, "CostModel.b must be a real number"),
    ("cost_unknown_preset", _solve("--cost", "nope"), 2, "invalid choice: 'nope'"),
    ("cost_and_cost_json", _solve("--cost", "dsv3_b_tile", "--cost-json", "{cost_nobeta}"), 2, "not allowed with"),
    ("options_list", _solve("--options", "[1]"), 2, "--options must be a JSON object"),
    ("options_tau_string", _solve("--options", '{"tau": "x"}'), 2, "option tau of policy 'tempo' must be float"),
    ("options_syntax", _solve("--options", "{tau"), 2, "--options: invalid JSON"),
    ("options_unknown", _solve("--options", '{"alpha": 1}'), 2, "unknown option(s) ['alpha']"),
    ("policy_unknown", _solve("--policy", "nope"), 2, "unknown policy 'nope'"),
    ("trace_and_counts", _solve("--trace", "flame_moe_290m"), 2, "not allowed with argument --counts"),
    ("neither_counts_nor_trace", ["solve"], 2, "one of the arguments --counts --trace is required"),
    ("gpus_and_placement", _solve("--gpus", "2", "--placement", "{placement}"), 2, "--gpus and --placement exclude"),
    ("replicas_and_placement", _solve("--replicas", "8", "--placement", "{placement}"), 2, "--replicas and --place"),
    ("trace_options_with_counts", _solve("--layer", "3", "--batch", "1"), 2, "--layer, --batch: only with --trace"),
    ("gpus_zero", _solve("--gpus", "0"), 2, "argument --gpus: must be >= 1, got 0"),
    ("gpus_word", _solve("--gpus", "two"), 2, "argument --gpus: must be an integer >= 1, got 'two'"),
    ("replicas_too_few", _solve("--replicas", "2", "--gpus", "2"), 2, "num_replicas (2) must be >="),
    ("trace_unknown", ["solve", "--trace", "nope"], 2, "unknown trace 'nope'; registered traces"),
    ("trace_layer", ["solve", "--trace", "flame_moe_290m", "--layer", "99"], 2, "available layers: [2, 3"),
    ("trace_ranks", ["solve", "--trace", "harmoeny_qwen"], 2, "use num_ranks=6 (num_ranks is --gpus"),
    ("out_under_a_file", _solve("--out", "{file}/d.json"), 2, "cannot create its folder"),
    ("out_is_a_folder", _solve("--out", "{dir}"), 2, "is a folder; give a file name"),
    ("calibrate_one_row", ["calibrate", "{one_row}"], 2, "has 1 sample row(s); the fit needs at least 4"),
    ("calibrate_non_numeric", ["calibrate", "{non_numeric}"], 2, "non_numeric.csv:3: column N = 'x'"),
    ("calibrate_short_row", ["calibrate", "{short_row}"], 2, "short_row.csv:3: 2 values"),
    ("calibrate_no_t", ["calibrate", "{no_t}"], 2, "header lacks columns ['t']"),
    ("calibrate_missing", ["calibrate", "{missing}"], 2, "does not exist"),
    ("calibrate_binary", ["calibrate", "{binary}"], 2, "not UTF-8 text"),
    ("calibrate_iters", ["calibrate", "{one_row}", "--iters", "0"], 2, "argument --iters: must be >= 1"),
    ("phase_skews", ["phase", "--skews", "0,a"], 2, "argument --skews: must be comma-separated numbers"),
    ("phase_preset", ["phase", "--preset", "nope"], 2, "argument --preset: invalid choice"),
    ("phase_negative_batch", ["phase", "--tokens-per-gpu", "16,-4"], 2, "values must be finite and >= 1"),
    ("cascade_rate", ["cascade", "--rate", "-1"], 2, "CascadeConfig: rate_rps must be > 0.0, got -1.0"),
    ("demo_out_is_a_file", ["demo", "--out", "{file}"], 2, "is a file; give a folder"),
    # Issue 27: outputs checked before the work, naming the option.
    ("out_empty", _solve("--out", ""), 2, "--out is empty"),
    ("out_dev_full", _solve("--out", "/dev/full"), 2, "--out /dev/full: /dev/full is on a kernel file system"),
    ("out_under_proc", _solve("--out", "/proc/tempo.json"), 2, "is on a kernel file system"),
    ("out_under_sys", _solve("--out", "/sys/tempo.json"), 2, "is on a kernel file system"),
    ("serve_out_is_a_file", ["serve", "--out", "{file}"], 2, "--out {file} is a file; give a folder"),
    ("calibrate_out_dev_full", ["calibrate", "{good}", "--out", "/dev/full"], 2, "--out /dev/full"),
    ("demo_out_under_proc", ["demo", "--out", "/proc/demo"], 2, "kernel file system"),
    # Options that would be ignored.
    (
        "serve_cost_and_cost_json",
        ["serve", "--cost", "dsv3_b_tile", "--cost-json", "{cost_nobeta}"],
        2,
        "give cost (a preset) or cost_json (a file), not both",
    ),
    ("serve_trace_synthetic", ["serve", "--trace", "mixtral_8x7b"], 2, "only read by model='layer'"),
    (
        "serve_lm_ignores_skew",
        ["serve", "--skew", "2", "--kappa", "inf"],
        2,
        "skew=2.0, kappa=inf only apply to model='layer'; model='lm' would ignore them",
    ),
    (
        "serve_layer_ignores_train_steps",
        ["serve", "--model", "layer", "--train-steps", "5"],
        2,
        "train_steps=5 only applies to model='lm'",
    ),
    ("calibrate_csv_quick", ["calibrate", "{good}", "--quick"], 2, "--quick: only with --measure"),
    ("calibrate_csv_bootstrap", ["calibrate", "{good}", "--bootstrap", "10"], 2, "--bootstrap: only with --measure"),
    ("calibrate_csv_report", ["calibrate", "{good}", "--report", "{missing}"], 2, "--report: only with --measure"),
    ("calibrate_csv_profile", ["calibrate", "{good}", "--profile-csv", "{missing}"], 2, "only with --measure"),
    ("calibrate_quick_bootstrap", ["calibrate", "--measure", "--quick", "--bootstrap", "5"], 2, "drop --bootstrap"),
    # Inputs: empty, unbounded, unit errors, sizes.
    ("counts_empty", ["solve", "--counts", "{counts_empty}"], 2, "--counts {counts_empty}: no counts"),
    ("counts_dev_zero", ["solve", "--counts", "/dev/zero"], 2, "--counts /dev/zero is not a regular file"),
    ("cost_huge", _solve("--cost-json", "{cost_huge}"), 2, "check the model's units"),
    ("cost_flat", _solve("--cost-json", "{cost_flat}"), 2, "prices no load"),
    ("calibrate_identical", ["calibrate", "{identical}"], 2, "cannot determine the model"),
    ("phase_huge_batch", ["phase", "--tokens-per-gpu", "1000000000"], 2, "exceed the limit of 67,108,864"),
    ("serve_huge_batch", ["serve", "--tokens-per-rank", "1000000000"], 2, "1 GiB of float32"),
    ("cascade_rate_and_load", ["cascade", "--rate", "2", "--load", "0.5"], 2, "--rate 2 and --load 0.5 exclude"),
    ("cascade_tempo_one_replica", ["cascade", "--dispatch", "tempo"], 2, "dispatch='tempo' needs replication > 1"),
    ("cascade_huge", ["cascade", "--synthetic-requests", "1000000000"], 2, "exceeds the supported 1,000,000"),
    ("unknown_command", ["frob"], 2, "invalid choice: 'frob'"),
]


def _fill(text, files):
    """``{name}`` → the path of file ``name`` (other braces, as in JSON options, stay)."""
    return re.sub(r"\{(\w+)\}", lambda m: str(files[m.group(1)]) if m.group(1) in files else m.group(0), text)


@pytest.mark.parametrize("argv, code, fragment", [c[1:] for c in CLI_CASES], ids=[c[0] for c in CLI_CASES])
def test_cli_rejects(files, capsys, argv, code, fragment):
    argv = [_fill(a, files) for a in argv]
    assert main(argv) == code
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    assert _fill(fragment, files) in lines[0]
    assert "makespan" not in out  # usage errors stop before the work


def test_cli_debug_prints_the_traceback(files, capsys):
    assert main(["--debug", "solve", "--counts", str(files["counts_nokey"])]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith("error: --counts")
    assert main(["solve", "--counts", str(files["counts_nokey"]), "--debug"]) == 2
    assert "Traceback" in capsys.readouterr().err


def test_cli_runtime_failure_is_one_line_exit_1(files, capsys, monkeypatch):
    from tempo_jax.cli import solve as solve_command

    def broken(*args, **kwargs):
        raise RuntimeError("solver crashed\nwith details")

    monkeypatch.setattr(solve_command, "solve", broken)
    assert main(["solve", "--counts", str(files["counts"])]) == 1
    err = capsys.readouterr().err
    assert (
        err.strip() == "error: RuntimeError: solver crashed with details (internal failure; rerun with --debug "
        "for the traceback)"
    )


def test_cli_out_creates_missing_folders_before_the_work(files, capsys):
    out = files["tmp"] / "new" / "sub" / "d.json"
    assert main(["solve", "--counts", str(files["counts"]), "--gpus", "2", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["policy"] == "tempo"
    assert capsys.readouterr().err == ""


def test_calibrate_outside_domain_warns_and_writes_the_constrained_fit(files, capsys):
    """The chosen rule: a fit outside the domain is reported (warning on stderr, exit 0) and the model written is
    the best fit with every parameter >= 0."""
    out = files["tmp"] / "fit" / "m.json"
    assert main(["calibrate", str(files["falling"]), "--out", str(out)]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning: ") and "b = -2" in err[0] and "holds b" in err[0]
    fitted = CostModel.load(out)
    assert fitted.b == 0.0 and min(fitted.a, fitted.c, fitted.beta) >= 0


def test_every_option_has_help_and_lists_names(capsys):
    parser = build_parser()
    sub = next(a for a in parser._actions if a.choices and "solve" in a.choices)
    for name, p in sub.choices.items():
        for action in p._actions:
            assert action.help, f"{name} {action.option_strings or action.dest} has no --help text"
    with pytest.raises(SystemExit):
        main(["solve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name in ["tempo", "milp", "round_robin", "dsv3_fp8_offline", "qwen3_235b_b_tile", "flame_moe_290m"]:
        assert name in text
