"""The CascadeEP simulator over several nodes (issue 75, item 4): two link classes — NVLink inside a node, the NIC
between nodes — in the costs, both timelines and OEWF's fetches; one node stays as it was."""

import dataclasses

import numpy as np
import pytest
from test_cascade_fast import _assert_same
from test_cascade_planner import LINEAR, three_rank_state

from solvers import oewf_plan
from tempo_jax.sim.cascade import CascadeConfig, StepModel, run_cascade
from tempo_jax.sim.cascade.costs import prefill_costs
from tempo_jax.sim.cascade.reference_timeline import LayerInputs, layer_timeline
from tempo_jax.sim.cascade.serving import StepBatch
from tempo_jax.sim.cascade.vocabulary import LAYER_MODES


def _batches(seed: int, D: int) -> tuple[StepBatch, ...]:
    rng = np.random.default_rng(seed)
    out = []
    for d in range(D):
        m = int(rng.integers(0, 3))
        q, P = rng.integers(1, 4000, m), rng.integers(0, 20_000, m)
        out.append(StepBatch(replica=d, request_ids=np.arange(m), q=q, P=P, I=P + q))
    return tuple(out)


def test_costs_over_nodes_price_each_link_class():
    one, two = prefill_costs(num_ranks=16), prefill_costs(num_ranks=16, gpus_per_node=8)
    hw = two.hardware
    assert not one.cross_node.any() and two.cross_node[0, 8] and not two.cross_node[0, 7]
    assert two.link_bw[0, 8] == hw.node_link_bytes_per_us and two.link_bw[0, 1] == hw.link_bytes_per_us
    assert two.fetch_bw[3, 12] == hw.node_link_bytes_per_us and two.fetch_bw[3, 4] == hw.fetch_bytes_per_us
    sent = np.zeros((16, 16))
    sent[0, 1], sent[0, 9] = 1000.0, 3000.0  # 1,000 pairs inside node 0, 3,000 to node 1
    bpp = two.dispatch_bytes_per_pair
    want = hw.link_latency_us + 1000 * bpp / hw.link_bytes_per_us + 3000 * bpp / hw.node_link_bytes_per_us
    assert two.dispatch_time_us(sent)[0] == pytest.approx(want)
    assert one.dispatch_time_us(sent)[0] == pytest.approx(hw.link_latency_us + 4000 * bpp / hw.link_bytes_per_us)
    assert two.dispatch_time_us(sent)[1] == 0.0  # nothing remote
    with pytest.raises(ValueError, match="not a whole number of nodes of gpus_per_node=3"):
        prefill_costs(num_ranks=16, gpus_per_node=3)


def test_a_chunk_between_nodes_holds_both_ports_at_the_nic_bandwidth():
    costs = prefill_costs(num_ranks=16, gpus_per_node=8)
    hw = costs.hardware
    pairs = np.zeros((16, 16, 256))
    pairs[1, 0, 0] = pairs[9, 0, 0] = 20_000.0  # rank 1 (node 0) and rank 9 (node 1) each send to rank 0
    sent = pairs.sum(axis=2)
    inp = LayerInputs(
        attention_us=np.full(16, 1000.0), dispatch_us=costs.dispatch_time_us(sent), pairs=pairs, oewf=False
    )
    r = layer_timeline(inp, costs, "sync", links="contention")
    near = 20_000.0 * costs.dispatch_bytes_per_pair / hw.link_bytes_per_us
    far = 20_000.0 * costs.dispatch_bytes_per_pair / hw.node_link_bytes_per_us
    assert r.arrival_us[1, 0] == pytest.approx(1000.0 + hw.link_latency_us + near)
    assert r.arrival_us[9, 0] == pytest.approx(1000.0 + hw.link_latency_us + near + far)  # queued behind rank 1
    flat = layer_timeline(inp, prefill_costs(num_ranks=16), "sync", links="contention")
    assert r.end_us > flat.end_us


def test_oewf_fetches_price_the_donors_link():
    """``OEWFState(fetch_bytes_per_us=[D, D])`` reads (helper, donor): a donor across the NIC makes the weights
    later, and the moves gain less."""
    near = oewf_plan(three_rank_state(), curve=LINEAR)
    bw = np.full((3, 3), 250.0)
    bw[:, 2] = 25.0  # every helper reaches donor 2 over a link ten times slower
    far = oewf_plan(three_rank_state(fetch_bytes_per_us=bw), curve=LINEAR)
    assert near.accepted[0].ready_us == 9.0
    assert all(a.ready_us >= 5.0 + 1000 / 25.0 for a in far.accepted)
    assert far.layer_after_us > near.layer_after_us
    with pytest.raises(ValueError, match=r"or \(3, 3\) per \(helper, donor\)"):
        three_rank_state(fetch_bytes_per_us=np.ones((3, 2)))
    with pytest.raises(ValueError, match=r"budget_bytes must be a scalar or shape \(3,\), got \(3, 3\)"):
        three_rank_state(budget_bytes=np.ones((3, 3)))


@pytest.mark.parametrize("links, launch", [("contention", "reactive"), ("fifo", "planned"), ("paper", "reactive")])
def test_fast_timeline_equals_the_reference_over_nodes(links, launch):
    cfg = CascadeConfig(
        trace="mooncake_sample", num_ranks=16, gpus_per_node=4, links=links, launch=launch, routing="zipf", skew=1.2
    )
    moves = 0
    for seed in range(3):
        for mode in LAYER_MODES:
            fast, ref = StepModel(cfg, mode), StepModel(dataclasses.replace(cfg, timeline="reference"), mode)
            fast.steps = ref.steps = seed
            a, b = fast(_batches(seed, 16))[1], ref(_batches(seed, 16))[1]
            _assert_same(a, b)
            moves += a.oewf_moves
    assert moves > 0


def test_one_node_is_the_single_domain_and_nodes_slow_the_step():
    base = CascadeConfig(trace="mooncake_sample", max_requests=24, num_ranks=16)
    runs = {
        g: run_cascade(dataclasses.replace(base, gpus_per_node=g), ("sync",), workers=1, cache_dir=None)["sync"]
        for g in (None, 16, 8)
    }
    np.testing.assert_allclose(runs[None].layer_us, runs[16].layer_us, rtol=1e-9)  # one node of 16 is no nodes
    assert runs[8].prefill.ttft_mean_s > runs[None].prefill.ttft_mean_s
    faster = run_cascade(
        dataclasses.replace(base, gpus_per_node=8, node_link_scale=4.0), ("sync",), workers=1, cache_dir=None
    )["sync"]
    assert runs[None].prefill.ttft_mean_s < faster.prefill.ttft_mean_s < runs[8].prefill.ttft_mean_s


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_ranks": 16, "gpus_per_node": 3}, "num_ranks=16 is not a whole number of nodes of gpus_per_node=3"),
        ({"num_ranks": 16, "gpus_per_node": 0}, "gpus_per_node"),
        ({"node_link_scale": 2.0}, "node_link_scale=2.0 scales the links between nodes"),
        ({"gpus_per_node": 8, "node_link_scale": 0.0}, "node_link_scale"),
    ],
)
def test_node_options_are_checked(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CascadeConfig(trace="mooncake_sample", **kwargs)
