"""The TEMPO step at scale (issue 75, item 4): every policy on nodes × GPUs with two link classes."""

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
)

SMALL = ScaleConfig(num_gpus=16, gpus_per_node=4, tokens_per_gpu=(32, 256), batches=1, hidden=64)


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
    # 5 to itself cross nothing). Busiest port: GPU 0 sending 15 pairs of 1,000 B over NVLink (1e5 B/µs) and 15
    # over the NIC (1e4 B/µs), or GPU 2 receiving 20 over the NIC.
    assert out["inter_pairs"] == pytest.approx(20.0) and out["intra_pairs"] == pytest.approx(15.0)
    send0 = 15 * 1000 / 1e5 + 15 * 1000 / 1e4
    recv2 = 20 * 1000 / 1e4
    assert out["dispatch_us"] == pytest.approx(5.0 + max(send0, recv2))
    assert out["combine_us"] == pytest.approx(5.0 + 2 * max(send0, recv2))


def test_every_policy_and_split_is_replayed_and_the_splits_share_the_expert_time():
    rows = scale_replay(SMALL, progress=False)
    assert len(rows) == 2 * len(SMALL.policies) * len(SMALL.splits)
    by = {(r["B"], r["policy"], r["split"]): r for r in rows}
    for B in SMALL.tokens_per_gpu:
        for p in SMALL.policies:
            topo, flat = by[(B, p, "topology")], by[(B, p, "flat")]
            assert topo["expert_us"] == flat["expert_us"]  # stage 2 realises the same x
            assert topo["inter_fraction"] <= flat["inter_fraction"] + 1e-12  # same-node-first: fewest crossings
            assert topo["step_us"] == pytest.approx(topo["dispatch_us"] + topo["expert_us"] + topo["combine_us"])
    summary = scale_summary(rows)
    tempo = [s for s in summary if s["policy"] == "tempo"]
    assert all(s["vs_tempo"] == pytest.approx(1.0) for s in tempo)
    assert all(0.0 < s["exchange_share"] < 1.0 for s in summary)


def test_a_faster_nic_shortens_only_the_exchange():
    slow = scale_replay(SMALL, progress=False)
    fast = scale_replay(ScaleConfig(**{**SMALL.__dict__, "nic_gbps": 150.0}), progress=False)
    for a, b in zip(slow, fast, strict=True):
        assert a["expert_us"] == b["expert_us"] and b["dispatch_us"] < a["dispatch_us"]


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
