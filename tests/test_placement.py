"""solvers.Placement, static maps and drift-K corruption."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from solvers import Placement, drift_corrupt, static_map


def test_derived_views():
    # 4 experts, 6 slots on 2 GPUs: GPU0 = [0, 1, 0], GPU1 = [2, 3, 1]
    p = Placement.from_phy2log([0, 1, 0, 2, 3, 1], num_gpus=2)
    assert p.num_experts == 4 and p.slots_per_rank == 3 and p.num_slots == 6
    np.testing.assert_array_equal(p.logcnt, [2, 2, 1, 1])
    np.testing.assert_array_equal(p.log2phy, [[0, 2], [1, 5], [3, -1], [4, -1]])
    np.testing.assert_array_equal(p.slot_gpu, [0, 0, 0, 1, 1, 1])
    np.testing.assert_array_equal(p.replica_mask, [[1, 0], [1, 1], [0, 1], [0, 1]])
    np.testing.assert_array_equal(p.replicas_on_gpu[0], [2, 0])
    assert not p.is_full
    assert p.replica_gpu_lists[1] == [0, 1]


def test_two_dimensional_layout_and_nodes():
    p = Placement.from_phy2log([[0, 1], [2, 3], [1, 0], [3, 2]], num_gpus=4, gpus_per_node=2)
    np.testing.assert_array_equal(p.node_of_gpu, [0, 0, 1, 1])
    assert p.num_nodes == 2
    assert Placement.from_dict(p.to_dict()).to_dict() == p.to_dict()


def test_full_replication():
    p = Placement.full(5, 3)
    assert p.is_full and p.num_slots == 15
    np.testing.assert_array_equal(p.logcnt, [3] * 5)
    np.testing.assert_array_equal(p.log2phy[2], [2, 7, 12])


@pytest.mark.parametrize(
    "phy2log, kwargs, match",
    [
        ([0, 1, 2], {"num_gpus": 2}, "ragged layout"),
        ([[0, 1], [2, 3]], {"num_gpus": 3}, "ragged layout"),
        ([0, 1, 2, 5], {"num_gpus": 2, "num_experts": 4}, r"slots \[3\] hold experts \[5\]"),
        ([0, -1, 2, 3], {"num_gpus": 2}, "out of range"),
        ([0, 1, 0, 1], {"num_gpus": 2, "num_experts": 4}, r"experts without a replica: \[2, 3\]"),
        ([0, 2, 0, 2], {"num_gpus": 2}, r"without a replica: \[1\]"),
        ([0.5, 1, 0, 1], {"num_gpus": 2}, "integer"),
        ([0, 1, 0, 1], {"num_gpus": 2, "gpus_per_node": 3}, "multiple of gpus_per_node"),
    ],
)
def test_invalid_layouts(phy2log, kwargs, match):
    with pytest.raises(ValueError, match=match):
        Placement.from_phy2log(phy2log, **kwargs)


def test_from_eplb_needs_equal_nodes():
    """rebalance_experts accepts 32 GPUs on 3 nodes with 8 groups (global policy, like upstream EPLB), but a
    Placement's nodes hold equal rank counts: from_eplb says so instead of failing on a derived gpus_per_node."""
    load = np.arange(64) + 1.0
    with pytest.raises(ValueError, match=r"num_nodes \(3\) must divide num_gpus \(32\).*num_nodes=1"):
        Placement.from_eplb(load, 96, 32, num_groups=8, num_nodes=3)
    flat = Placement.from_eplb(load, 96, 32, num_groups=8)
    assert flat.num_nodes == 1 and flat.num_slots == 96


@st.composite
def layouts(draw):
    E = draw(st.integers(1, 12))
    G = draw(st.integers(1, 6))
    spg = draw(st.integers(-(-E // G), -(-E // G) + 3))
    P = G * spg
    extra = draw(st.lists(st.integers(0, E - 1), min_size=P - E, max_size=P - E))
    perm = draw(st.permutations(list(range(E)) + extra))
    return np.array(perm), G, E


@given(layouts())
def test_placement_properties(layout):
    phy2log, G, E = layout
    p = Placement.from_phy2log(phy2log, G)
    assert p.num_experts == E
    assert p.logcnt.sum() == p.num_slots and (p.logcnt >= 1).all()
    # log2phy lists each slot exactly once, under its own expert, ascending, −1 padded.
    listed = p.log2phy[p.log2phy >= 0]
    assert sorted(listed.tolist()) == list(range(p.num_slots))
    for e in range(E):
        row = p.log2phy[e]
        valid = row[: p.logcnt[e]]
        assert (row[p.logcnt[e] :] == -1).all() and (np.diff(valid) > 0).all()
        assert (p.phy2log[valid] == e).all()
    assert (p.replicas_on_gpu.sum(axis=1) == p.logcnt).all()
    assert (p.replicas_on_gpu.sum(axis=0) == p.slots_per_rank).all()


@given(layouts())
def test_static_map_properties(layout):
    phy2log, G, E = layout
    p = Placement.from_phy2log(phy2log, G)
    m = static_map(p)
    assert m.shape == (G, E)
    assert (p.phy2log[m] == np.arange(E)[None, :]).all()  # always a replica of the right expert
    for s in range(G):
        for e in range(E):
            if p.replica_mask[e, s]:
                assert p.slot_gpu[m[s, e]] == s  # own GPU first
    np.testing.assert_array_equal(static_map(p), m)  # deterministic


def test_static_map_prefers_node_then_spreads():
    # 4 GPUs in 2 nodes; expert 0 on GPUs 0 and 2; expert 1 only on GPU 3.
    p = Placement.from_phy2log([0, 2, 4, 1, 0, 3, 1, 5], num_gpus=4, gpus_per_node=2, num_experts=6)
    m = static_map(p)
    assert p.slot_gpu[m[1, 0]] == 0  # GPU1 → same-node replica on GPU0
    assert p.slot_gpu[m[3, 0]] == 2  # GPU3 → same-node replica on GPU2
    assert p.slot_gpu[m[0, 1]] in (1, 3)
    # sources on node 0 have no same-node replica of expert 3 (GPU 2 only): spread over all replicas
    assert p.slot_gpu[m[0, 3]] == 2
    with pytest.raises(ValueError, match="source_gpus"):
        static_map(p, source_gpus=[0, 9])


def test_drift_corrupt_swaps_hot_with_cold():
    w = np.arange(64, dtype=float)[::-1] * 10  # expert 0 hottest
    c = drift_corrupt(w, hot=8, seed=3)
    assert sorted(c.tolist()) == sorted(w.tolist())
    hot = np.arange(8)
    assert (c[hot] < w[7]).all()  # every hot expert now carries a cold expert's load
    assert (c != w).sum() == 16
    np.testing.assert_array_equal(drift_corrupt(w, 8, seed=3), c)
    assert not np.array_equal(drift_corrupt(w, 8, seed=4), c)
    layers = drift_corrupt(np.stack([w, w]), 4, seed=0)
    assert layers.shape == (2, 64)
    with pytest.raises(ValueError, match="2·hot"):
        drift_corrupt(w[:10], 6)
