"""Two timescales in the dispatch runtime (issue 35): every ``rebalance_every`` windows the controller proposes an EPLB
placement from the load it accumulated; `set_placement` hands the new placement back, and the solver (inline,
thread or worker process) continues over it with nothing lost from the books."""

import numpy as np
import pytest
from test_controller import check_accounting

from solvers import PRESETS, Placement
from tempo_jax import DispatchController

D, E = 8, 16
COST = PRESETS["dsv3_fp8_offline"]


def _skewed(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.poisson(np.geomspace(200, 2, E), (D, E))


@pytest.mark.parametrize("mode", ["inline", "process"])
def test_a_proposal_every_n_windows_and_the_solver_follows_the_new_placement(mode):
    old = Placement.spread(E, D, 3)
    with DispatchController(old, COST, solver_mode=mode, rebalance_every=2, spare_worker=False) as ctl:
        seen = np.zeros(E)
        for s in range(3):
            c = _skewed(s)
            seen += c.sum(axis=0)
            ctl.observe(c)
            ctl.wait()
            assert (ctl.proposal is None) == (s < 1), s  # windows 1 and 2 closed: one proposal
        np.testing.assert_array_equal(ctl.expert_load(), seen)
        new = ctl.proposal
        want = Placement.from_eplb(seen - _skewed(2).sum(axis=0), old.num_slots, D, spread_idle=True)
        assert new.phy2log.tolist() == want.phy2log.tolist()  # EPLB over the first two windows' load
        assert (new.logcnt[:2] > 1).all()  # the hot experts got the spare slots
        version = ctl.version
        ctl.set_placement(new)
        assert ctl.proposal is None and ctl.version == version + 1 and not ctl.expert_load().any()
        assert ctl.latest.placement_key == new.key  # the new placement's fallback tables, at once
        ctl.observe(_skewed(5))
        ctl.wait()
        assert ctl.latest.placement_key == new.key and ctl.latest.table.shape[-1] == new.log2phy.shape[1]
        m = ctl.metrics()
        assert m["placements"]["applied"] == 1 and m["windows"]["published"] == 4
        check_accounting(m)


def test_a_solve_in_flight_is_dropped_as_replaced_and_counts_stay_pending():
    old = Placement.spread(E, D, 3)
    with DispatchController(old, COST, solver_mode="thread", window=2) as ctl:
        ctl.inject_fault("hang", 0.5)
        ctl.observe(_skewed(0))  # pending, window open
        ctl.observe(_skewed(1))  # window closed: the solve hangs
        ctl.observe(_skewed(2))  # pending in the next window
        ctl.set_placement(Placement.from_eplb(np.geomspace(9, 1, E), old.num_slots, D))
        m = ctl.metrics()
        assert m["windows"]["dropped"]["replaced"] == 1
        assert m["pairs"]["dropped"]["replaced"] == _skewed(0).sum() + _skewed(1).sum()
        assert m["pairs"]["pending"] == _skewed(2).sum()
        check_accounting(m)
        ctl.wait(timeout=30, raise_errors=False)
        assert ctl.metrics()["late_results"] <= 1  # the abandoned solve's result is ignored


def test_layers_sharing_a_placement_pool_their_load_and_shapes_are_checked():
    a, b = Placement.spread(E, D, 3), Placement.spread(E, D, 2)
    placements = [a, b, a, b]  # two layers × two phases (prefill, decode) sharing each layer's placement
    with DispatchController(placements, COST, rebalance_every=1) as ctl:
        counts = np.stack([_skewed(i) for i in range(4)])
        ctl.observe(counts)
        prop = ctl.proposal
        assert prop[0] is prop[2] and prop[1] is prop[3] and prop[0] is not prop[1]
        pooled = counts[0].sum(axis=0) + counts[2].sum(axis=0)
        want = Placement.from_eplb(pooled, a.num_slots, D, spread_idle=True)
        assert prop[0].phy2log.tolist() == want.phy2log.tolist()
        with pytest.raises(ValueError, match="a sequence of 4 solvers.Placements"):
            ctl.set_placement(prop[0])
        with pytest.raises(ValueError, match="D=4, E=16"):
            ctl.set_placement([Placement.spread(E, 4, 4)] * 4)
        ctl.set_placement(prop)
        assert [t.placement_key for t in ctl.latest] == [p.key for p in prop]
    with pytest.raises(ValueError, match="rebalance_every"):
        DispatchController(a, COST, rebalance_every=0)
