"""The copy policies of others (issue 52, `solvers.copy_baselines`): MoonEP-style row equalising into spare slots and
LLEP-style least-loaded spilling, both with unpriced copies whose time is counted afterwards."""

import numpy as np
import pytest
from copy_case import random_instance

from solvers import CopyCost, CostModel, equalise_rows, least_loaded, plan_copies
from solvers.copy_baselines import balance_tokens, even_split

LINEAR = CostModel(a=0.0, b=0.0, c=0.0, beta=1.0)
FLAT = CostModel(a=0.0, b=14.78, c=0.0, beta=0.0945)  # the DSv3 fp8 shape: n* ≈ 156 tokens per expert


def _instance(seed, D=8, E=16, spr=3, tokens=256):
    """`copy_case.random_instance` at this file's sizes."""
    return random_instance(seed, D, E, spr, tokens)


def _check(plan, n, ranks, D, slots):
    held = np.zeros(plan.on.shape, bool)
    held[np.nonzero(ranks >= 0)[0], ranks[ranks >= 0]] = True
    np.testing.assert_array_equal(plan.on.sum(axis=1), n)  # every token once
    assert (plan.on >= 0).all() and (plan.on == np.round(plan.on)).all()
    made = (plan.on > 0) & ~held  # tokens off a fixed replica: on a copy
    assert (made.sum(axis=0) <= plan.copies).all()
    if slots is not None:
        assert (plan.copies <= slots).all()


@pytest.mark.parametrize("seed", range(4))
def test_row_equalising_places_every_token_once_and_evens_rows_within_its_slots(seed):
    n, ranks, D = _instance(seed)
    cc = CopyCost(1e6, 50.0)
    for slots in (0, 1, 3):
        plan = equalise_rows(n, ranks, LINEAR, D, slots, cc)
        _check(plan, n, ranks, D, slots)
    target = np.ceil(n.sum() / D)
    assert plan.copies.sum() > 0 and plan.on.sum(axis=0).max() < even_split(n, ranks, D).sum(axis=0).max()
    # with enough slots the rows end even: the busiest at the ceiling of the mean
    wide = equalise_rows(n, ranks, LINEAR, D, 16, cc)
    _check(wide, n, ranks, D, 16)
    assert wide.on.sum(axis=0).max() == target


def test_least_loaded_spills_only_above_its_threshold_and_counts_the_copies_time():
    n, ranks, D = _instance(0)
    cc = CopyCost(1e6, 50.0)  # 20 µs a copy
    even = even_split(n, ranks, D)
    rows = even.sum(axis=0)
    idle = least_loaded(n, ranks, LINEAR, D, cc, threshold=rows.max() / rows.mean() + 0.01)
    np.testing.assert_array_equal(idle.on, even)  # below the threshold: nothing moves
    assert idle.num_copies == 0
    plan = least_loaded(n, ranks, LINEAR, D, cc)
    _check(plan, n, ranks, D, None)
    t = plan.on.sum(axis=0) + np.maximum(0.0, plan.copies * cc.copy_us)
    np.testing.assert_allclose(plan.rank_times, t)
    assert plan.makespan == pytest.approx(t.max())


def test_where_copies_cost_more_than_they_relieve_the_guard_wins():
    """Flat regime (16 tokens per rank, DSv3 experts over a 50 GB/s link): token balancing copies anyway and loses to
    the dynamic plan, which makes no copy."""
    n, ranks, D = _instance(1, tokens=16)
    cc = CopyCost(3 * 7168 * 2048, 50.0)
    dyn = plan_copies(n, ranks, FLAT, D, 2, cc)
    for plan in (equalise_rows(n, ranks, FLAT, D, 2, cc), least_loaded(n, ranks, FLAT, D, cc)):
        assert plan.num_copies > 0 and plan.makespan > dyn.makespan
    assert dyn.num_copies == 0


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (dict(slots=-1), "slots must be"),
        (dict(slots=None, threshold=0.5), "threshold must be"),
        (dict(slots=1, copy_cost=None), "copy_cost must be a solvers.CopyCost"),
        (dict(slots=1, n=np.array([1.5, 2.0])), "whole token counts"),
    ],
)
def test_bad_input_is_refused_with_what_to_fix(kw, match):
    n, ranks, D = _instance(0)
    args = dict(n=n, ranks=ranks, cost=LINEAR, num_ranks=D, copy_cost=CopyCost(1e3, 50.0)) | kw
    with pytest.raises(ValueError, match=match):
        balance_tokens(**args)
