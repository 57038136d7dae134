"""Target repair (solvers.target_repair) and the tempo_fast stage that uses it."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy.sparse import csr_array
from scipy.sparse.csgraph import maximum_flow
from test_policies import problems

from solvers import PRESETS, CostModel, Dispatch, DispatchProblem, Placement, solve
from solvers.bounds import forced_lower_bound
from solvers.target_repair import _apply, _route, _Scorer, _transport, target_repair
from tempo_jax.workloads import SyntheticRouting


def _scipy_flow(supply, adj, room) -> int:
    F, G = len(supply), len(room)
    rows, cols, data = [], [], []
    for f, gs in enumerate(adj):
        rows += [F + G] + [f] * len(gs)
        cols += [f] + [F + g for g in gs]
        data += [supply[f]] * (1 + len(gs))
    rows += [F + g for g in range(G)]
    cols += [F + G + 1] * G
    data += list(room)
    graph = csr_array((np.array(data, np.int32), (rows, cols)), shape=(F + G + 2, F + G + 2))
    return int(maximum_flow(graph, F + G, F + G + 1).flow_value)


@given(st.data())
def test_transport_is_a_maximum_flow(data):
    G = data.draw(st.integers(1, 12))
    F = data.draw(st.integers(1, 15))
    supply = data.draw(st.lists(st.integers(1, 500), min_size=F, max_size=F))
    adj = [sorted(data.draw(st.sets(st.integers(0, G - 1), min_size=1, max_size=min(G, 4)))) for _ in range(F)]
    room = data.draw(st.lists(st.integers(0, 800), min_size=G, max_size=G))
    into = _transport(supply, adj, room)
    sent = [sum(row.get(f, 0) for row in into) for f in range(F)]
    assert all(0 <= s <= supply[f] for f, s in enumerate(sent))  # no expert sends more than it has
    assert all(sum(row.values()) <= room[g] for g, row in enumerate(into))  # no GPU over its room
    assert all(f_ in range(F) and g in adj[f_] for g, row in enumerate(into) for f_, v in row.items() if v > 0)
    assert sum(sent) == _scipy_flow(supply, adj, room)  # and nothing more could be routed


@given(problems(), st.data())
def test_scorer_agrees_with_full_routing(problem, data):
    n = np.round(problem.n).astype(np.int64)
    mask = problem.mask.astype(bool)
    flags = data.draw(st.lists(st.booleans(), min_size=mask.size, max_size=mask.size))
    pattern = mask & np.array(flags, dtype=bool).reshape(mask.shape)
    cap = data.draw(st.integers(0, int(n.sum()) + 1))
    pairs = list(zip(*np.nonzero(mask), strict=True))
    edits = [(int(e), int(g), data.draw(st.booleans())) for e, g in data.draw(st.lists(st.sampled_from(pairs)))]
    assert _Scorer(n, pattern, cap).routed(edits) == _route(n, _apply(pattern, edits), cap)[0]


@given(problems(), st.floats(0.7, 1.3))
def test_a_repair_is_a_valid_dispatch_within_the_target(problem, scale):
    problem = DispatchProblem(np.round(problem.n), problem.placement, problem.cost)
    start = solve(problem, "metro").x
    target = forced_lower_bound(problem) * scale
    x = target_repair(problem, start, target)
    if x is not None:
        Dispatch(x, problem, "repair").validate()  # every token placed, on replica GPUs only, none negative
        assert problem.cost.makespan(x) <= target * (1 + 1e-9) + 1e-9
        assert np.allclose(x, np.round(x))  # whole tokens


def test_unreachable_targets_and_unsupported_models_give_none():
    pl = Placement.full(4, 2)
    problem = DispatchProblem(np.array([100, 50, 20, 5]), pl, CostModel(a=5.0, b=15.0, c=3.0, beta=0.1))
    x = solve(problem, "tempo").x
    assert target_repair(problem, x, 1.0) is None  # below a single activation
    tiles = DispatchProblem(problem.n, pl, CostModel(a=5.0, b=15.0, b2=5.0, tile=16, c=3.0, beta=0.1))
    assert target_repair(tiles, x, 1e9) is None  # tile term: the caps depend on the split


def _dsv3_ep8(s: float, batch: int) -> DispatchProblem:
    routing = SyntheticRouting(num_experts=256, top_k=8, s=s, kappa=2000.0, seed=0)
    placement = Placement.from_eplb(routing.popularity + 1e-6, 320, 8)  # 1.25x replicas, EPLB
    return DispatchProblem(routing.batch(512, 8, batch), placement, PRESETS["dsv3_fp8_offline"])


@pytest.mark.parametrize("s, batch", [(0.6, 2), (1.2, 1), (1.2, 2)])
def test_tempo_reaches_the_optimum_where_local_moves_stall(s, batch):
    """DeepSeek-V3, EP8, B=512: the optimum (= the cheap bound, proven by the MILP in bench_solver) moves a hot
    expert off a GPU and re-splits it over GPUs that each shed another expert; the heuristic's moves stop
    3.1-3.2% above it, the repair stage gets there."""
    problem = _dsv3_ep8(s, batch)
    lb = forced_lower_bound(problem)
    without = solve(problem, "tempo", repair=False)
    with_repair = solve(problem, "tempo")
    assert without.makespan > 1.03 * lb
    assert with_repair.makespan == pytest.approx(lb, rel=1e-9)
    assert with_repair.info["stage"].endswith("+repair")
    with_repair.validate()
