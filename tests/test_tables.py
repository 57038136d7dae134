"""tempo_jax.layer.tables: host checks of dispatch weights where tables are built (issue #19: SGLang's dispatch
raises on negative entries; the in-graph kernel reads them as 0, so the host must catch them)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from solvers import PRESETS, Dispatch, DispatchProblem, Placement
from tempo_jax.layer import tables as dispatch_tables

E, D = 6, 4


@pytest.fixture(scope="module")
def placement():
    return Placement.from_eplb(np.arange(E) + 1.0, 8, D)  # 2 slots per rank, 2 experts replicated


def test_builders_give_valid_weights(placement):
    problem = DispatchProblem(np.full((D, E), 5.0), placement, PRESETS["dsv3_fp8_offline"])
    x = np.where(placement.replica_mask, 20.0 / placement.replica_mask.sum(axis=1, keepdims=True), 0.0)
    for tables in (
        dispatch_tables.uniform(placement),
        dispatch_tables.static(placement),
        dispatch_tables.from_dispatch(Dispatch(x, problem)),
        dispatch_tables.from_split(np.stack([x / 2, x / 2]), placement),
        dispatch_tables.perturbed(dispatch_tables.uniform(placement), seed=1),
    ):
        table = np.asarray(tables.table)
        assert table.dtype == np.float32 and table.ndim == 3 and table.shape[1:] == placement.log2phy.shape
        assert np.isfinite(table).all() and (table >= 0).all()
        assert (table[:, placement.log2phy < 0] == 0).all()


@pytest.mark.parametrize(
    ("bad", "match"),
    [(-1.0, r"x\[1, 2\] = -1.0"), (np.nan, r"NaN at dispatch.x\[1, 2\]"), (np.inf, r"finite, got dispatch.x\[1, 2\]")],
)
def test_from_dispatch_and_from_split_reject_bad_shares(placement, bad, match):
    problem = DispatchProblem(np.full((D, E), 5.0), placement, PRESETS["dsv3_fp8_offline"])
    x = np.ones((E, D))
    x[1, 2] = bad
    with pytest.raises(ValueError, match=r"tables.from_dispatch: .*" + match + ".*finite and ≥ 0"):
        dispatch_tables.from_dispatch(Dispatch(x, problem))
    with pytest.raises(ValueError, match=r"tables.from_split: y.* .*\[0, 1, 2\]"):
        dispatch_tables.from_split(x[None], placement)


@pytest.mark.parametrize(
    ("value", "match"), [(-0.5, r"≥ 0 .*table\[0, 3, 1\] = -0.5"), (np.nan, "NaN"), (np.inf, "finite")]
)
@pytest.mark.parametrize("kind", ["numpy", "jax", "list"])
def test_hand_built_tables_are_checked(placement, value, match, kind):
    table = np.array(dispatch_tables.uniform(placement).table)
    table[0, 3, 1] = value
    table = {"numpy": table, "jax": jnp.asarray(table), "list": table.tolist()}[kind]
    with pytest.raises(ValueError, match=r"^Tables: table .*" + match):
        dispatch_tables.Tables(table, placement.log2phy)
    good = dispatch_tables.uniform(placement)
    with pytest.raises(ValueError, match="Tables: table"):
        good._replace(table=table)


def test_checks_never_touch_traced_or_rebuilt_tables(placement):
    """Inside a traced program the kernel's rule applies (negative = 0), so building there is not checked; JAX
    rebuilding the pytree (jit outputs, tree maps, device_put) skips the check too."""
    good = dispatch_tables.uniform(placement)

    @jax.jit
    def negate(t):
        return dispatch_tables.Tables(-t.table, t.log2phy)  # a tracer: not checked here

    out = negate(good)
    assert isinstance(out, dispatch_tables.Tables) and float(out.table.min()) < 0  # the jit output is rebuilt unchecked
    assert isinstance(jax.tree.map(lambda a: -a, good), dispatch_tables.Tables)
    assert isinstance(jax.device_put(good), dispatch_tables.Tables)
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(good)[0]]
    assert paths == [".table", ".log2phy"]
    # bfloat16 and 0/1 masks are fine.
    assert dispatch_tables.Tables(good.table.astype(jnp.bfloat16), good.log2phy).num_groups == 1
    assert dispatch_tables.Tables(np.asarray(good.table) > 0, good.log2phy).table.dtype == bool
