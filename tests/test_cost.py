"""solvers.CostModel: evaluation, presets, lower bound and JSON round-trips."""

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from solvers import PRESETS, CostModel, gpu_loads

# Fig. 1b toy: one hot expert (600 tokens), six cold (30 each), 2 GPUs, a = c = 0, b = 15, β = 0.1.
TOY = CostModel(b=15.0, beta=0.1)
TOY_TOKENS = np.array([600.0] + [30.0] * 6)


def test_fig1b_three_dispatches():
    token_balanced = np.tile(TOY_TOKENS[:, None] / 2, (1, 2))
    activation_balanced = np.zeros((7, 2))
    activation_balanced[[0, 1, 2, 3], 0] = TOY_TOKENS[[0, 1, 2, 3]]
    activation_balanced[[4, 5, 6], 1] = TOY_TOKENS[[4, 5, 6]]
    makespan_optimal = np.zeros((7, 2))
    makespan_optimal[0] = 300
    makespan_optimal[[1, 2, 3], 0] = 30
    makespan_optimal[[4, 5, 6], 1] = 30
    assert TOY.makespan(token_balanced) == pytest.approx(105.0)
    assert TOY.makespan(activation_balanced) == pytest.approx(69.0)
    assert TOY.makespan(makespan_optimal) == pytest.approx(60.0)
    assert TOY.lower_bound(TOY_TOKENS, 2) == pytest.approx(60.0)


def test_gpu_loads_counts_tiles_and_ignores_dust():
    x = np.array([[128.0, 129.0], [1e-12, 1.0], [0.0, 300.0]])
    acts, tiles, tokens = gpu_loads(x)
    np.testing.assert_array_equal(acts, [1, 3])
    np.testing.assert_array_equal(tiles, [1, 2 + 1 + 3])
    np.testing.assert_allclose(tokens, [128.0, 430.0], atol=1e-9)


def test_tile_and_traffic_pieces():
    m = PRESETS["dsv3_b_tile"]
    # One expert with 300 tokens on one GPU: 3 tiles.
    t = m.gpu_times(G=1, N=300, T=3)
    expected = max(m.a + m.b + m.b2 * 2, m.c + m.beta * 300, m.c2 + m.gamma * 300)
    assert t == pytest.approx(expected)
    assert m.times(np.array([[300.0]]))[0] == pytest.approx(expected)
    assert m.kernel_only().c2 is None and m.kernel_only().gamma is None


@pytest.mark.parametrize(
    "name, n_star",
    [("qwen3_30b_offline", 161), ("dsv2_lite_offline", 168), ("dsv3_fp8_offline", 156), ("dsv3_bf16_offline", 331)],
)
def test_table6_inflections(name, n_star):
    assert PRESETS[name].inflection == pytest.approx(n_star, rel=0.01)


def test_every_table7_set_present_with_source():
    expected = {
        "dsv3_fp8_offline",
        "qwen3_30b_offline",
        "dsv2_lite_offline",
        "dsv3_bf16_offline",
        "dsv3_a_gemm_refit",
        "dsv3_a_full_pipe",
        "dsv3_a_full_pipe_it2",
        "proxy_serving_3term",
        "dsv3_b_tile",
        "qwen3_235b_b_tile",
    }
    assert expected <= set(PRESETS)
    assert all(m.source for m in PRESETS.values())
    assert PRESETS["dsv3_a_full_pipe"] == CostModel(a=358, b=16.59, c=266, beta=0.358)
    assert PRESETS["qwen3_235b_b_tile"].b2 == 1.23


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_json_round_trip_exact(name, tmp_path):
    m = PRESETS[name]
    again = CostModel.from_json(m.to_json())
    assert again == m and again.source == m.source
    m.save(tmp_path / "m.json")
    assert CostModel.load(tmp_path / "m.json") == m
    assert dataclasses.asdict(again) == dataclasses.asdict(m)


def test_bad_parameters_raise():
    with pytest.raises(ValueError, match="finite"):
        CostModel(b=float("nan"), beta=0.1)
    with pytest.raises(ValueError, match="c2 and gamma"):
        CostModel(b=1, beta=0.1, c2=3.0)
    with pytest.raises(ValueError, match="tile"):
        CostModel(b=1, beta=0.1, tile=0)
    with pytest.raises(ValueError, match="unknown CostModel fields"):
        CostModel.from_dict({"b": 1, "beta": 1, "alpha": 2})
    with pytest.raises(ValueError, match=r"\[E, D\]"):
        TOY.times(np.ones(3))


@given(
    st.lists(st.integers(0, 3000), min_size=1, max_size=24),
    st.integers(1, 6),
    st.sampled_from(sorted(PRESETS)),
    st.randoms(use_true_random=False),
)
def test_lower_bound_below_any_dispatch(tokens, g, name, rnd):
    """The bound holds for arbitrary (random, split) dispatches under every preset."""
    m = PRESETS[name]
    n = np.array(tokens, dtype=float)
    w = np.array([[rnd.random() ** 3 for _ in range(g)] for _ in n]) + 1e-3
    x = n[:, None] * w / w.sum(axis=1, keepdims=True)
    assert m.lower_bound(n, g) <= m.makespan(x) + 1e-9
    assert math.isfinite(m.lower_bound(n, g))
