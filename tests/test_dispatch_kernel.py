"""Fused dispatch + count kernel (interpret mode) vs its reference, and the semantics the runtime relies on:
torn rows never route to an invalid replica, padding never routes nor counts, sampling follows the table,
quota mode realises the plan within one token per source, counters wrap safely."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lowering import lower_for_cuda
from scipy import stats

from pallas_kernels import COUNTER_DTYPE, dispatch, dispatch_reference, occurrence_ranks
from tempo_jax.runtime.counters import CounterWindows

T, K, E, R = 37, 3, 5, 4  # 111 pairs -> 4 blocks of 32, the last one padded
BLOCK = 32


def _problem(seed: int, t: int = T, k: int = K, e: int = E, r: int = R):
    """Random problem with zero rows, invalid columns, junk entries (negative, NaN, inf), padding rows."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, e, (t, k)).astype(np.int32)
    valid = rng.random(t) < 0.8
    ids[~valid] = rng.integers(-3, e + 3, (int((~valid).sum()), k))  # garbage in padding rows
    table = (rng.random((e, r)) * (rng.random((e, r)) < 0.7)).astype(np.float32)
    table[rng.integers(e)] = 0.0  # a torn / all-zero row
    junk = rng.random((e, r)) < 0.1
    table[junk] = rng.choice([-1.0, np.nan, np.inf], int(junk.sum()))
    log2phy = rng.permutation(e * r).reshape(e, r).astype(np.int32)
    log2phy[rng.random((e, r)) < 0.3] = -1
    log2phy[rng.integers(e), 0] = 7  # at least one valid replica somewhere
    counter = rng.integers(2**32 - 50, 2**32, e, dtype=np.uint64).astype(np.uint32)  # about to wrap
    uniforms = rng.random((t, k)).astype(np.float32)
    return tuple(map(jnp.asarray, (ids, valid, table, log2phy, counter, uniforms)))


_kernel = jax.jit(
    lambda ids, valid, table, l2p, ctr, u, mode: dispatch(
        ids, valid, table, l2p, ctr, mode=mode, uniforms=u, block=BLOCK, interpret=True
    ),
    static_argnames="mode",
)


@pytest.mark.parametrize("mode", ["sample", "quota"])
@settings(max_examples=15)
@given(seed=st.integers(0, 2**31 - 1))
def test_kernel_matches_reference_exactly(mode, seed):
    ids, valid, table, l2p, ctr, u = _problem(seed)
    got = _kernel(ids, valid, table, l2p, ctr, u, mode=mode)
    want = dispatch_reference(ids, valid, table, l2p, ctr, mode=mode, uniforms=u)
    for name, a, b in zip(got._fields, got, want, strict=True):
        assert a.dtype == b.dtype, name
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)
    assert got.counter.dtype == COUNTER_DTYPE


def _valid_slots(table_l2p):
    return [set(int(p) for p in row if p >= 0) for row in np.asarray(table_l2p)]


@pytest.mark.parametrize("mode", ["sample", "quota"])
@settings(max_examples=10)
@given(seed=st.integers(0, 2**31 - 1), cut=st.integers(0, R))
def test_torn_rows_never_route_to_invalid_replica(mode, seed, cut):
    """Rows torn between two tables (columns [0, cut) new, the rest old) or zeroed stay on valid replicas."""
    ids, valid, old, l2p, ctr, u = _problem(seed)
    _, _, new, new_l2p, _, _ = _problem(seed + 1)
    torn = jnp.concatenate([new[:, :cut], old[:, cut:]], axis=1)  # mass may sit on columns invalid here
    torn = torn.at[jnp.asarray([0, 2])].set(0.0)
    res = _kernel(ids, valid, torn, l2p, ctr, u, mode=mode)
    allowed = _valid_slots(l2p)
    slots, ids_np, valid_np = np.asarray(res.slots), np.asarray(ids), np.asarray(valid)
    for t in range(T):
        for k in range(K):
            if not valid_np[t]:
                assert slots[t, k] == -1
            elif allowed[ids_np[t, k]]:
                assert slots[t, k] in allowed[ids_np[t, k]]
            else:
                assert slots[t, k] == -1  # no replica at all: never invent one
    # Zeroed rows fall back to uniform over valid replicas: with many pairs every one of them is used.
    ids_z = jnp.zeros((400, 1), jnp.int32)
    u_z = jax.random.uniform(jax.random.key(seed), (400, 1))
    lz = jnp.asarray([[3, -1, 9, 4]], jnp.int32)
    rz = dispatch(
        ids_z,
        jnp.ones(400, bool),
        jnp.zeros((1, 4)),
        lz,
        jnp.zeros(1, jnp.uint32),
        mode=mode,
        uniforms=u_z,
        block=128,
        interpret=True,
    )
    assert set(np.unique(np.asarray(rz.slots))) == {3, 9, 4}
    assert np.asarray(rz.replica_counts)[0, 1] == 0


def test_padding_neither_routes_nor_counts():
    ids, valid, table, l2p, ctr, u = _problem(5)
    res = _kernel(ids, valid, table, l2p, ctr, u, mode="sample")
    expected = np.bincount(np.asarray(ids)[np.asarray(valid)].ravel(), minlength=E)
    np.testing.assert_array_equal(np.asarray(res.counts), expected)
    windows = CounterWindows()
    windows.diff(np.asarray(ctr)[None])  # baseline (one source row)
    np.testing.assert_array_equal(windows.diff(np.asarray(res.counter)[None])[0], expected[None])
    assert (np.asarray(res.slots)[~np.asarray(valid)] == -1).all()
    assert int(res.replica_counts.sum()) <= int(expected.sum())
    # All padding: nothing routes, the counter does not move, whatever the padding rows hold.
    none = _kernel(ids, jnp.zeros(T, bool), table, l2p, ctr, u, mode="sample")
    assert (np.asarray(none.slots) == -1).all() and (np.asarray(none.counter) == np.asarray(ctr)).all()
    assert int(none.replica_counts.sum()) == 0


def test_sampling_frequencies_match_table_chi_square():
    t, e = 3000, 3
    table = jnp.asarray([[0.1, 0.2, 0.3, 0.4], [5.0, 0.0, 5.0, 1.0], [1.0, 1.0, 1.0, 9.0]], jnp.float32)
    l2p = jnp.asarray([[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, -1]], jnp.int32)  # expert 2 loses column 3
    ids = jax.random.randint(jax.random.key(0), (t, 2), 0, e, jnp.int32)
    u = jax.random.uniform(jax.random.key(1), (t, 2))
    res = dispatch(ids, jnp.ones(t, bool), table, l2p, jnp.zeros(e, jnp.uint32), uniforms=u, block=256, interpret=True)
    counts = np.asarray(res.replica_counts)
    for ex in range(e):
        w = np.where(np.asarray(l2p[ex]) >= 0, np.asarray(table[ex], np.float64), 0.0)
        keep = w > 0
        assert counts[ex, ~keep].sum() == 0
        expected = counts[ex].sum() * w[keep] / w.sum()
        assert stats.chisquare(counts[ex, keep], expected).pvalue > 1e-3, (ex, counts[ex], expected)


@settings(max_examples=15)
@given(seed=st.integers(0, 2**31 - 1))
def test_quota_mode_realises_plan_within_one_token(seed):
    ids, valid, table, l2p, ctr, u = _problem(seed)
    res = _kernel(ids, valid, table, l2p, ctr, u, mode="quota")
    counts, rc = np.asarray(res.counts), np.asarray(res.replica_counts)
    tab, phys = np.asarray(table), np.asarray(l2p)
    for ex in range(E):
        has = phys[ex] >= 0
        if not has.any():
            assert rc[ex].sum() == 0
            continue
        w = np.where(has & np.isfinite(tab[ex]) & (tab[ex] > 0), tab[ex], 0.0)
        w = has.astype(float) if w.sum() <= 0 else w  # torn row: uniform over valid replicas
        plan = counts[ex] * w / w.sum()
        assert rc[ex].sum() == counts[ex]
        assert np.all(np.abs(rc[ex] - plan) <= 1 + 1e-4), (ex, rc[ex], plan)


def test_occurrence_ranks_row_major_per_expert():
    ids, valid, *_ = _problem(11)
    ranks, totals = occurrence_ranks(ids, valid, E)
    ids_np, valid_np = np.asarray(ids), np.asarray(valid)
    seen = np.zeros(E, int)
    for t in range(T):
        for k in range(K):
            if valid_np[t]:
                assert ranks[t, k] == seen[ids_np[t, k]]
                seen[ids_np[t, k]] += 1
    np.testing.assert_array_equal(np.asarray(totals), seen)


@pytest.mark.parametrize(
    "change, match",
    [
        ({"mode": "random"}, "unknown mode"),
        ({"uniforms": None}, "needs uniforms"),
        ({"counter": jnp.zeros(E, jnp.int32)}, "uint32"),
        ({"valid": jnp.ones(T, jnp.int32)}, "bool"),
        ({"log2phy": jnp.zeros((E, R + 1), jnp.int32)}, "log2phy"),
        ({"topk_ids": jnp.full((T, K), E, jnp.int32)}, r"\[0, E"),
        ({"block": 48}, "power of two"),
        ({"implementation": "cuda"}, "unknown implementation"),
    ],
)
def test_dispatch_rejects_bad_input(change, match):
    ids, valid, table, l2p, ctr, u = _problem(0)
    kwargs = dict(topk_ids=ids, valid=valid, table=table, log2phy=l2p, counter=ctr, uniforms=u) | change
    with pytest.raises(ValueError, match=match):
        dispatch(**kwargs)


def test_kernel_lowers_to_triton_for_gpu():
    """Lower for CUDA without a GPU: the kernel takes the Triton backend and passes its lowering checks."""
    ids, valid, table, l2p, ctr, u = _problem(0)

    def run(ids, u):
        return dispatch(ids, valid, table, l2p, ctr, uniforms=u, implementation="pallas").slots

    text = lower_for_cuda(run, ids, u)
    assert text.count("@__gpu$xla.gpu.triton(") == 1
