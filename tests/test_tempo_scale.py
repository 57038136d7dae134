"""The TEMPO step at scale (issue 75, item 4): every policy on nodes × GPUs with two link classes."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from solvers import PRESETS
from tempo_jax.layer import exchange
from tempo_jax.sim.tempo.scale import (
    NIC_GBPS,
    NVLINK_GBPS,
    ScaleConfig,
    link_times,
    scale_replay,
    scale_summary,
    token_nodes,
)

SMALL = ScaleConfig(
    num_gpus=16, gpus_per_node=4, tokens_per_gpu=(32, 256), batches=1, hidden=64, exchanges=("flat", "two_hop")
)


def test_the_link_figures_are_the_layers():
    assert NVLINK_GBPS == exchange.BANDWIDTH_GBPS["gpu"][0] and NIC_GBPS == exchange.NODE_GBPS["gpu"]


def test_link_times_by_hand():
    """Two nodes of two GPUs; node 0's tokens of expert 0 (GPU 0: 30, GPU 1: 10) run on GPU 1 (20) and GPU 2 (20)."""
    cfg = ScaleConfig(num_gpus=4, gpus_per_node=2, hidden=1000, latency_us=5.0, nvlink_gbps=100.0, nic_gbps=10.0)
    y = np.zeros((2, 1, 4))
    y[0, 0, 1] = y[0, 0, 2] = 20.0
    counts = np.array([[30.0], [10.0], [0.0], [0.0]])
    out = link_times(y, counts, np.array([0, 0, 1, 1]), cfg)
    # GPU 0 holds 3/4 of the node's tokens: 15 → GPU 1 (NVLink), 15 → GPU 2 (NIC); GPU 1 sends 5 to GPU 2 (its
    # 5 to itself cross nothing). Busiest port: GPU 2's NIC receiving 20 pairs of 1,000 B at 1e4 B/µs (GPU 0 sends
    # 15 over NVLink at 1e5 B/µs and, at once, 15 over its NIC).
    assert out["nic_rows"] == pytest.approx(20.0) and out["nvlink_rows"] == pytest.approx(15.0)
    assert out["dispatch_us"] == pytest.approx(5.0 + 20 * 1000 / 1e4)
    assert out["combine_us"] == pytest.approx(5.0 + 2 * 20 * 1000 / 1e4)


def test_two_hops_by_hand():
    """Two nodes of two GPUs, one token per GPU, each to experts 0 (on GPU 2) and 1 (on GPU 3). Flat: GPUs 0 and 1
    each send two rows over the NIC. Two hops: each sends one, to node 1's GPU of its own local index, which forwards
    the pair that is not its own over NVLink."""
    cfg = ScaleConfig(num_gpus=4, gpus_per_node=2, hidden=1000, latency_us=5.0, nvlink_gbps=100.0, nic_gbps=10.0)
    y = np.zeros((2, 2, 4))
    y[:, 0, 2] = y[:, 1, 3] = 2.0
    counts = np.ones((4, 2))
    ids = np.tile(np.array([0, 1]), (4, 1, 1))  # [G, B = 1, K = 2]
    node = np.array([0, 0, 1, 1])
    flat = link_times(y, counts, node, cfg)
    assert (flat["nic_rows"], flat["nvlink_rows"]) == (4.0, 2.0)
    assert flat["dispatch_us"] == pytest.approx(5.0 + 2 * 1000 / 1e4)  # GPU 0's NIC sending, GPU 2's receiving
    two = link_times(y, counts, node, cfg, exchange="two_hop", ids=ids)
    assert (two["nic_rows"], two["nvlink_rows"]) == (2.0, 4.0)
    assert two["dispatch_us"] == pytest.approx(5.0 + 1000 / 1e4)  # one row per NIC; NVLink's two rows at once
    assert two["combine_us"] == pytest.approx(5.0 + 2 * 1000 / 1e4)
    with pytest.raises(ValueError, match="needs ids"):
        link_times(y, counts, node, cfg, exchange="two_hop")


def test_token_nodes_count_each_tokens_distinct_nodes():
    """With every expert on one GPU a pair's node is its expert's: count distinct nodes per token directly."""
    rng = np.random.default_rng(0)
    G, gpn, E, B, K = 8, 2, 16, 5, 4
    node = np.arange(G) // gpn
    home = rng.integers(0, G, E)  # expert e lives on GPU home[e]
    ids = np.stack([[rng.choice(E, K, replace=False) for _ in range(B)] for _ in range(G)])
    y = np.zeros((G // gpn, E, G))
    for s in range(G):
        for e in ids[s].ravel():
            y[node[s], e, home[e]] += 1.0
    want = np.zeros((G, G // gpn))
    for s in range(G):
        for t in range(B):
            for n in set(node[home[ids[s, t]]]):
                want[s, n] += 1
    np.testing.assert_array_equal(token_nodes(ids, y, node), want)
    with pytest.raises(ValueError, match="y holds .* pairs of expert"):
        token_nodes(ids, y * 0.5, node)  # a split of other counts is refused, never apportioned by guess


def test_every_policy_and_split_is_replayed_and_the_splits_share_the_expert_time():
    rows = scale_replay(SMALL, progress=False)
    assert len(rows) == 2 * len(SMALL.policies) * len(SMALL.splits) * 2
    by = {(r["B"], r["policy"], r["split"], r["exchange"]): r for r in rows}
    for B in SMALL.tokens_per_gpu:
        for p in SMALL.policies:
            two = by[(B, p, "topology", "two_hop")]
            topo, flat = by[(B, p, "topology", "flat")], by[(B, p, "flat", "flat")]
            assert two["nic_fraction"] < topo["nic_fraction"]  # a token crosses once per node, not per pair
            assert topo["expert_us"] == pytest.approx(flat["expert_us"], rel=1e-12)  # stage 2 realises the same x
            assert topo["nic_fraction"] <= flat["nic_fraction"] + 1e-12  # same-node-first: fewest crossings
            assert topo["step_us"] == pytest.approx(topo["dispatch_us"] + topo["expert_us"] + topo["combine_us"])
    summary = scale_summary(rows)
    tempo = [s for s in summary if s["policy"] == "tempo"]
    assert all(s["vs_tempo"] == pytest.approx(1.0) for s in tempo)
    assert all(0.0 < s["exchange_share"] < 1.0 for s in summary)


def test_a_faster_nic_shortens_only_the_exchange():
    slow = scale_replay(SMALL, progress=False)
    fast = scale_replay(ScaleConfig(**{**SMALL.__dict__, "nic_gbps": 150.0}), progress=False)
    for a, b in zip(slow, fast, strict=True):
        assert a["expert_us"] == pytest.approx(b["expert_us"], rel=1e-12) and b["dispatch_us"] <= a["dispatch_us"]
    assert sum(b["dispatch_us"] for b in fast) < sum(a["dispatch_us"] for a in slow)


def test_tempo_priced_with_the_links_cuts_the_step_where_the_exchange_dominates():
    """Few tokens per GPU: TEMPO on the kernel model packs tokens onto few replicas (the flat regime), and the busiest
    port pays; on Eq. 4 with the links' traffic piece it spreads them and the step shrinks."""
    cfg = ScaleConfig(num_gpus=16, gpus_per_node=4, tokens_per_gpu=(16,), batches=2, policies=("tempo", "tempo_links"))
    gamma = cfg.traffic_model(PRESETS[cfg.preset]).gamma
    f = 12 / 15  # a uniformly spread pair crosses nodes 12 times in 15
    assert gamma == pytest.approx(7168 * 3 * (f / 5e4 + (1 - f) / 1.5e5))
    rows = {(r["batch"], r["policy"]): r for r in scale_replay(cfg, progress=False) if r["split"] == "topology"}
    for b in range(2):
        assert rows[(b, "tempo_links")]["step_us"] < rows[(b, "tempo")]["step_us"]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_gpus": 12, "gpus_per_node": 8}, "not a whole number of nodes"),
        ({"policies": ("tempo", "milp")}, "policies"),
        ({"splits": ("nearest",)}, "splits"),
        ({"nic_gbps": 0.0}, "nic_gbps"),
        ({"preset": "nope"}, "preset"),
    ],
)
def test_scale_config_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ScaleConfig(**kwargs)


def test_the_scale_script_writes_both_parts(tmp_path):
    """`scripts/scale_sim.py` on a tiny run: both simulators, both link settings, the JSON and the figure."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))
    import scale_sim

    out, fig = tmp_path / "s.json", tmp_path / "s.png"
    argv = ["--tokens-per-gpu", "16", "--batches", "1", "--trace", "mooncake_sample", "--requests", "16"]
    assert (
        scale_sim.main(
            [*argv, "--seeds", "1", "--workers", "1", "--no-progress", "--out", str(out), "--figure", str(fig)]
        )
        == 0
    )
    result = json.loads(out.read_text())
    assert set(result["tempo"]) == set(result["cascade"]) == {"8 nodes × 8", "one domain"}
    nodes = result["tempo"]["8 nodes × 8"]["summary"]
    assert {r["exchange"] for r in nodes} == {"flat", "two_hop"} and fig.stat().st_size > 0
    assert result["cascade"]["8 nodes × 8"]["config"]["gpus_per_node"] == 8
