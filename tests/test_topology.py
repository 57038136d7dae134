"""solvers.topology: the same-node-first split of a flat dispatch over source nodes (TEMPO §4.3)."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy.optimize import linprog

from solvers import PRESETS, Dispatch, DispatchProblem, Placement, solve
from solvers.tables import split_tables
from solvers.topology import flat_split, inter_node_tokens, node_counts_from_sources, topology_split


def lp_min_inter_node(x, node_counts, placement):
    """Reference: fewest inter-node tokens of any y [Nn, E, G] ≥ 0 realising x and node_counts (HiGHS)."""
    Nn, E = node_counts.shape
    node = placement.node_of_gpu
    idx = [(m, e, g) for m in range(Nn) for e, g in zip(*np.nonzero(x > 0), strict=True)]
    cost = np.array([float(node[g] != m) for m, e, g in idx])
    if not idx:
        return 0.0
    rows, rhs = {}, []
    for key in [("x", e, g) for e, g in zip(*np.nonzero(x > 0), strict=True)] + [
        ("c", m, e) for m in range(Nn) for e in range(E)
    ]:
        rows[key] = len(rows)
        rhs.append(x[key[1], key[2]] if key[0] == "x" else node_counts[key[1], key[2]])
    A = np.zeros((len(rows), len(idx)))
    for j, (m, e, g) in enumerate(idx):
        A[rows[("x", e, g)], j] = 1.0
        A[rows[("c", m, e)], j] = 1.0
    res = linprog(cost, A_eq=A, b_eq=rhs, bounds=(0, None), method="highs")
    assert res.status == 0, res.message
    return res.fun


def random_instance(rng, placement, max_tokens=200):
    """Random x [E, G] on a random subset of each expert's replicas and node_counts [Nn, E] matching it."""
    E, G, Nn = placement.num_experts, placement.num_gpus, placement.num_nodes
    n = rng.integers(0, max_tokens, E).astype(float)
    n[rng.random(E) < 0.15] = 0.0
    w = rng.random((E, G)) * placement.replica_mask * (rng.random((E, G)) < 0.8)
    w[w.sum(axis=1) == 0] = placement.replica_mask[w.sum(axis=1) == 0]
    x = n[:, None] * w / w.sum(axis=1, keepdims=True)
    node_counts = np.stack([rng.multinomial(int(k), rng.dirichlet(np.full(Nn, 0.7))) for k in n], axis=1)
    return x, node_counts.astype(float)


def check_realises(y, x, node_counts, atol=1e-9):
    assert y.shape == node_counts.shape + (x.shape[1],)
    assert y.min() >= 0
    np.testing.assert_allclose(y.sum(axis=0), x, atol=atol)
    np.testing.assert_allclose(y.sum(axis=2), node_counts, atol=atol)
    assert not np.any((y > 0) & (x[None] <= 0))


def two_node_example():
    # GPUs 0,1 on node 0 and 2,3 on node 1; expert 0 on GPUs 0,1,2; expert 1 on 0,2; expert 2 on 1 and twice on 3.
    pl = Placement.from_phy2log([0, 1, 0, 2, 0, 1, 2, 2], num_gpus=4, gpus_per_node=2)
    x = np.array([[30.0, 10, 20, 0], [10, 0, 30, 0], [0, 5, 0, 15]])
    node_counts = np.array([[50.0, 10, 20], [10, 30, 0]])
    return pl, x, node_counts


def test_hand_checked_two_node_example():
    pl, x, node_counts = two_node_example()
    y = topology_split(x, node_counts, pl)
    # expert 0: node 0 fills its 40 local slots (30 + 10) and ships 10 to GPU 2; node 1 keeps its 10 on GPU 2.
    # expert 1: both nodes fit locally. expert 2: node 0 has 5 local slots, ships 15 to GPU 3.
    expected = np.zeros((2, 3, 4))
    expected[0] = [[30, 10, 10, 0], [10, 0, 0, 0], [0, 5, 0, 15]]
    expected[1] = [[0, 0, 10, 0], [0, 0, 30, 0], [0, 0, 0, 0]]
    np.testing.assert_allclose(y, expected)
    assert inter_node_tokens(y, pl) == pytest.approx(25.0)
    assert inter_node_tokens(flat_split(x, node_counts), pl) == pytest.approx(20 + 10 / 3 + 15 + 15)
    probs = split_tables(y, pl)
    np.testing.assert_allclose(probs[0], [[0.6, 0.2, 0.2], [1, 0, 0], [0.25, 0.375, 0.375]])
    # node 1 sends no expert-2 tokens: it falls back to x's proportions (GPU 3's share split over two replicas).
    np.testing.assert_allclose(probs[1], [[0, 0, 1], [0, 1, 0], [0.25, 0.375, 0.375]])


def test_uniform_fallback_and_dispatch_input():
    pl, x, node_counts = two_node_example()
    x[2], node_counts[:, 2] = 0.0, 0.0
    problem = DispatchProblem(x.sum(axis=1), pl, PRESETS["dsv3_fp8_offline"])
    y = topology_split(Dispatch(x, problem), node_counts, pl)  # a Dispatch is accepted for x
    np.testing.assert_allclose(split_tables(y, pl)[:, 2], np.full((2, 3), 1 / 3))


def _placements():
    rng = np.random.default_rng(0)
    out = [Placement.from_phy2log(rng.permutation(np.arange(24) % 12), num_gpus=8, gpus_per_node=2)]
    load = rng.zipf(1.5, 32).astype(float)
    out.append(Placement.from_eplb(load, 48, 16, num_groups=1, num_nodes=2))  # replicas span both nodes
    out.append(Placement.from_eplb(load, 48, 16, num_groups=8, num_nodes=2))  # hierarchical: per-node
    out.append(Placement.from_eplb(load, 64, 16, num_groups=1, num_nodes=4))
    out.append(Placement.full(6, 8, gpus_per_node=2))
    return out


PLACEMENTS = _placements()


@pytest.mark.parametrize("pi", range(len(PLACEMENTS)))
def test_minimal_inter_node_vs_lp(pi):
    pl = PLACEMENTS[pi]
    assert pl.num_nodes > 1
    rng = np.random.default_rng(pi)
    for _ in range(4):
        x, node_counts = random_instance(rng, pl)
        y = topology_split(x, node_counts, pl)
        check_realises(y, x, node_counts)
        best = lp_min_inter_node(x, node_counts, pl)
        assert inter_node_tokens(y, pl) == pytest.approx(best, abs=1e-6)
        assert inter_node_tokens(y, pl) <= inter_node_tokens(flat_split(x, node_counts), pl) + 1e-9


@st.composite
def instances(draw):
    nodes = draw(st.integers(1, 4))
    gpn = draw(st.integers(1, 3))
    G = nodes * gpn
    E = draw(st.integers(1, 8))
    spg = draw(st.integers(-(-E // G), -(-E // G) + 2))
    seed = draw(st.integers(0, 2**31))
    rng = np.random.default_rng(seed)
    phy2log = np.concatenate([np.arange(E), rng.integers(0, E, G * spg - E)])
    pl = Placement.from_phy2log(rng.permutation(phy2log), G, gpn if nodes > 1 else None, E)
    return (pl, *random_instance(rng, pl, max_tokens=50))


@given(instances())
def test_properties_against_lp(inst):
    pl, x, node_counts = inst
    y = topology_split(x, node_counts, pl)
    check_realises(y, x, node_counts)
    assert inter_node_tokens(y, pl) == pytest.approx(lp_min_inter_node(x, node_counts, pl), abs=1e-6)
    assert inter_node_tokens(y, pl) <= inter_node_tokens(flat_split(x, node_counts), pl) + 1e-9
    check_realises(flat_split(x, node_counts), x, node_counts)
    for split in (y, flat_split(x, node_counts)):
        probs = split_tables(split, pl)
        np.testing.assert_allclose(probs.sum(axis=2), 1.0)
        assert probs.min() >= 0 and np.all(probs[:, pl.log2phy < 0] == 0)


@pytest.mark.parametrize("groups", [1, 8])
def test_loads_and_makespan_identical_to_flat(groups):
    pl = Placement.from_eplb(
        np.random.default_rng(1).zipf(1.3, 64).astype(float), 80, 16, num_groups=groups, num_nodes=2
    )
    rng = np.random.default_rng(groups)
    counts = rng.poisson(rng.zipf(1.3, 64).clip(max=50) * 2.0, size=(16, 64))
    problem = DispatchProblem(counts, pl, PRESETS["dsv3_fp8_offline"])
    flat = solve(problem, "tempo")
    node_counts = node_counts_from_sources(counts, pl)
    y = topology_split(flat, node_counts, pl)
    check_realises(y, flat.x, node_counts, atol=1e-8)
    split = Dispatch(y.sum(axis=0), problem, "topology").validate()
    np.testing.assert_allclose(split.gpu_tokens, flat.gpu_tokens)
    np.testing.assert_array_equal(split.gpu_activations, flat.gpu_activations)
    np.testing.assert_array_equal(split.gpu_tiles, flat.gpu_tiles)
    assert split.makespan == pytest.approx(flat.makespan, rel=1e-12)
    assert inter_node_tokens(y, pl) <= inter_node_tokens(flat_split(flat, node_counts), pl) + 1e-9


def test_node_counts_from_sources():
    pl = Placement.full(3, 4, gpus_per_node=2)
    counts = np.arange(12).reshape(4, 3)
    np.testing.assert_array_equal(node_counts_from_sources(counts, pl), [[3, 5, 7], [15, 17, 19]])
    np.testing.assert_array_equal(node_counts_from_sources(counts[:2], pl, source_gpus=[3, 0]), [[3, 4, 5], [0, 1, 2]])
    np.testing.assert_array_equal(node_counts_from_sources(counts, Placement.full(3, 4)), [[18, 22, 26]])


def test_single_node_placement_keeps_everything_local():
    pl = Placement.from_phy2log([0, 1, 0, 1], num_gpus=2)  # no gpus_per_node: one node
    x = np.array([[3.0, 1], [0, 4]])
    y = topology_split(x, [[4.0, 4]], pl)
    np.testing.assert_allclose(y[0], x)
    assert inter_node_tokens(y, pl) == 0.0


@pytest.mark.parametrize(
    "fn, args, match",
    [
        ("split", (np.ones((3, 3)), None), r"x must be \[E, D\]"),
        ("split", (np.ones(4), None), "x must be 2-D"),
        ("split", (None, np.ones((2, 3, 1))), "node_counts must be 2-D"),
        ("split", (None, np.array([[50.0, 10, 20], [10, 30, -1]])), "non-negative"),
        ("split", (None, np.array([[50.0, 10, np.nan], [10, 30, 0]])), "NaN"),
        ("split", (None, np.array([[50.0, 10, 20], [10, 31, 0]])), r"column sums differ .* \[1\]"),
        ("split", (None, np.ones((2, 4))), "4 experts but x has 3"),
        ("split", (None, np.array([[60.0, 40, 20]])), "1 source nodes but the placement has 2"),
        ("split", (np.array([[30.0, 10, 20, 0], [10, 0, 30, 0], [0, 5, 1, 14]]), None), "without a replica .*\\[2\\]"),
        ("split", (np.full((3, 4), True), None), "numeric"),
        ("tables", (np.ones((2, 3, 5)),), r"y must be \[Nn, E, D\]"),
        ("tables", (np.ones((3, 3, 4)),), "3 source nodes"),
        ("tables", (np.ones((2, 3, 4)),), "without a replica"),
        ("inter", (np.ones((2, 3, 5)),), r"y must be \[Nn, E, D\]"),
        ("sources", (np.ones((3, 3)),), "pass source_gpus"),
        ("sources", (np.ones((2, 3)), [0, 4]), "source_gpus"),
        ("sources", (np.ones((2, 2)),), r"counts must be \[Gs, E\]"),
    ],
)
def test_errors(fn, args, match):
    pl, x, node_counts = two_node_example()
    if fn == "split":
        xx, nc = args
        call = lambda: topology_split(x if xx is None else xx, node_counts if nc is None else nc, pl)  # noqa: E731
    elif fn == "tables":
        call = lambda: split_tables(args[0], pl)  # noqa: E731
    elif fn == "inter":
        call = lambda: inter_node_tokens(args[0], pl)  # noqa: E731
    else:
        call = lambda: node_counts_from_sources(*args[:1], pl, *args[1:])  # noqa: E731
    with pytest.raises(ValueError, match=match):
        call()


def test_flat_split_errors():
    _, x, node_counts = two_node_example()
    with pytest.raises(ValueError, match="column sums differ"):
        flat_split(x, node_counts + 1)
    with pytest.raises(ValueError, match="non-negative"):
        flat_split(-x, node_counts)
