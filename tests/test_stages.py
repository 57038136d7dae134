"""The MoE layer's stages (tempo_jax.layer.stages), its capacity policy and its host checks, on 8 fake CPU devices."""

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given
from hypothesis import strategies as st
from jax.sharding import PartitionSpec as P
from numeric import assert_close

from solvers import Placement
from tempo_jax import MoE
from tempo_jax.layer import MoEConfig, init_params, make_ep_mesh, moe_forward, moe_reference, stages
from tempo_jax.layer import tables as dispatch_tables
from tempo_jax.layer.experts import ExpertConfig

D, E, S = 8, 12, 2


@pytest.fixture(scope="module")
def mesh():
    return make_ep_mesh(D)


# ----------------------------------------------------------------------------------------------- stages
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_pack_exchange_return_move_every_row_with_its_slot(mesh, dtype):
    """Each rank sends pair i of its tokens to a random physical slot; the receiver sees the row with the right
    local slot id in the block of its source, and the return brings every row back to its pair."""
    T_loc, K, H = 5, 3, 4
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(D * T_loc, H)), dtype)
    slot = jnp.asarray(rng.integers(0, D * S, size=(D, T_loc * K)), jnp.int32)

    def body(x, slot):
        me = jax.lax.axis_index("ep")
        sl = slot[0]
        packed = stages.pack(x, sl // S, sl % S, top_k=K, num_ranks=D, capacity=T_loc * K, dtype=dtype)
        recv = stages.exchange_rows(packed, axis="ep", exchange="padded", hidden=H, slots_per_rank=S)
        # Tag each received row with its local slot and the receiving rank, then send it back.
        tagged = (
            recv.rows + (recv.slots[..., None] + 10 * me).astype(dtype) * jnp.asarray(recv.slots < S, dtype)[..., None]
        )
        back = stages.return_rows(tagged, recv.counts, packed, axis="ep", exchange="padded")
        return back[None], recv.counts[None], packed.wanted[None]

    f = jax.shard_map(body, mesh=mesh, in_specs=(P("ep"), P("ep")), out_specs=P("ep"), check_vma=False)
    back, recv_counts, wanted = jax.jit(f)(x, slot)
    back = np.asarray(back, np.float32).reshape(D, T_loc * K, H)
    s = np.asarray(slot)
    for d in range(D):
        rows = np.repeat(np.asarray(x[d * T_loc : (d + 1) * T_loc], np.float32), K, axis=0)
        tag = (s[d] % S) + 10 * (s[d] // S)  # the destination's local slot and rank
        np.testing.assert_allclose(back[d], rows + tag[:, None], rtol=1e-2 if dtype == jnp.bfloat16 else 1e-6)
    # Counts: what rank j received from source s = what s wanted to send to j.
    np.testing.assert_array_equal(np.asarray(recv_counts).reshape(D, D).T, np.asarray(wanted).reshape(D, D))


def test_slot_ids_survive_16_bit_rows_exactly():
    ids = jnp.arange(0, 2**16, 257, dtype=jnp.int32)
    for dtype in (jnp.float32, jnp.bfloat16, jnp.float16):
        np.testing.assert_array_equal(stages.unpack_slots(stages.slot_lanes(ids, dtype)), ids)


def test_expert_ffn_skips_padding_rows():
    k = jax.random.split(jax.random.key(0), 4)
    rows = jax.random.normal(k[0], (6, 4))
    w = [jax.random.normal(k[i], s) for i, s in ((1, (2, 4, 3)), (2, (2, 4, 3)), (3, (2, 3, 4)))]
    slots = jnp.array([1, 2, 0, 2, 1, 0], jnp.int32)  # 2 = padding
    weights = dict(zip(("w_gate", "w_up", "w_down"), w, strict=True))
    y, sizes = stages.expert_ffn(rows, slots, weights, expert=ExpertConfig(), gmm_impl="chunked", interpret=False)
    assert sizes.tolist() == [2, 2] and not np.asarray(y)[[1, 3]].any()
    want = jax.nn.silu(rows[0] @ w[0][1]) * (rows[0] @ w[1][1]) @ w[2][1]
    np.testing.assert_allclose(y[0], want, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------------------------- capacity
def _hot_layer(mesh, capacity):
    """A layer whose router sends every token to experts 0 and 1, both held only by rank 0."""
    phy2log = np.array([0, 1] + [2 + (i % (E - 2)) for i in range(D * S - 2)])
    placement = Placement.from_phy2log(phy2log, D, num_experts=E)
    cfg = MoEConfig(hidden=16, ffn=8, experts=E, top_k=2, slots_per_rank=S, capacity=capacity, dispatch_mode="quota")
    moe = MoE(cfg, placement, mesh=mesh, rngs=nnx.Rngs(params=0))
    router = np.full((16, E), -5.0)
    router[:, :2] = 5.0
    moe.router.set_value(jnp.asarray(router, jnp.float32))
    x = jnp.abs(jax.random.normal(jax.random.key(3), (D * 64, 16)))
    return moe, x, cfg


# fast twin: tests/test_dropless.py::test_a_multi_layer_lm_stays_dropless_when_every_token_goes_to_one_rank
@pytest.mark.slow
def test_auto_capacity_stays_dropless_on_an_all_to_one_rank_batch(mesh):
    """Every pair to rank 0: "auto" overflows its C = 32 rows per block (twice the mean block) and takes
    ⌈128 / 32⌉ = 4 rounds — in-graph, so eagerly and under nnx.jit the output equals the worst-case path's
    (capacity=None, one exchange of 128 rows per block)."""
    moe, x, cfg = _hot_layer(mesh, "auto")
    worst, _, _ = _hot_layer(mesh, None)
    y = moe(x)
    np.testing.assert_allclose(y, moe_reference(moe.logical_params(), x, cfg), atol=2e-5, rtol=2e-5)
    assert int(moe.stats.get_value().drops.sum()) == 0 and moe.stats.get_value().rounds.tolist() == [4] * D
    step = nnx.jit(lambda m, x: m(x))
    assert_close(step(moe, x), step(worst, x))  # two programs: four rounds against one worst-case exchange
    assert moe.stats.get_value().rounds.tolist() == [4] * D and int(moe.stats.get_value().drops.sum()) == 0
    # (gradients through the rounds: tests/test_dropless.py)


def test_fixed_capacity_counts_drops_and_warns_once(mesh):
    moe, x, _ = _hot_layer(mesh, 4)
    with pytest.warns(UserWarning, match="pairs were dropped"):
        moe(x)
    first = int(moe.stats.get_value().drops.sum())
    assert first == D * (64 * 2 - 4) and moe.total_drops == first
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        moe(x)  # counted again, not warned again
    assert moe.total_drops == 2 * first


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "big"])
def test_capacity_is_validated_at_the_config(bad):
    with pytest.raises(ValueError, match="capacity"):
        MoEConfig(hidden=4, ffn=4, experts=4, top_k=1, slots_per_rank=1, capacity=bad)


# ----------------------------------------------------------------------------------------------- host checks
@pytest.fixture(scope="module")
def layer(mesh):
    placement = Placement.from_eplb(np.arange(E) + 1.0, D * S, D)
    cfg = MoEConfig(hidden=8, ffn=4, experts=E, top_k=2, slots_per_rank=S)
    params = init_params(jax.random.key(0), cfg, placement, mesh=mesh)
    x = jax.random.normal(jax.random.key(1), (D * 2, 8))
    return placement, cfg, params, x


def _edit(kw, field, index, value):
    pa = kw["placement_arrays"]
    return pa._replace(**{field: getattr(pa, field).at[index].set(value)})


def _other_placement():
    return Placement.from_eplb(np.arange(E)[::-1] + 1.0, D * S, D)


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda k: {**k, "tables": dispatch_tables.uniform(_other_placement())}, "another placement|differs"),
        (lambda k: {**k, "placement_arrays": _edit(k, "log2phy", (0, 0), D * S + 3)}, "another placement|outside"),
        (lambda k: {**k, "placement_arrays": _edit(k, "phy2log", 1, E + 2)}, r"outside \[0, 12\)"),
        (lambda k: {**k, "routing": (jnp.full((D * 2, 2), E, jnp.int32), jnp.ones((D * 2, 2)))}, r"\[0, 12\)"),
        (lambda k: {**k, "x": k["x"][:0]}, "T = 0"),
        (
            lambda k: {
                **k,
                "tables": dispatch_tables.Tables(jnp.zeros((0, E, k["tables"].log2phy.shape[1])), k["tables"].log2phy),
            },
            "Gs ≥ 1|Gs >= 1",
        ),
        (lambda k: {**k, "config": dataclasses.replace(k["config"], axis="tp")}, "axis 'tp' is not in the mesh"),
        (lambda k: {**k, "capacity": -3}, "capacity must be .auto., a positive int"),
    ],
)
def test_moe_forward_checks_before_tracing(mesh, layer, change, match):
    placement, cfg, params, x = layer
    kw = dict(
        x=x,
        mesh=mesh,
        placement_arrays=dispatch_tables.placement_arrays(placement),
        tables=dispatch_tables.uniform(placement),
        config=cfg,
    )
    with pytest.raises(ValueError, match=match):
        moe_forward(params, **change(kw))


def test_expert_without_a_replica_in_log2phy_is_caught(mesh, layer):
    placement, cfg, params, x = layer
    pa = dispatch_tables.placement_arrays(placement)
    l2p = pa.log2phy.at[3].set(-1)
    tables = dispatch_tables.Tables(jnp.ones(l2p.shape)[None], l2p)
    with pytest.raises(ValueError, match="no replica"):
        moe_forward(params, x, mesh=mesh, placement_arrays=pa._replace(log2phy=l2p), tables=tables, config=cfg)


def test_set_tables_rejects_a_wrong_shape_at_once(mesh, layer):
    placement, cfg, _, _ = layer
    moe = MoE(cfg, placement, mesh=mesh, rngs=nnx.Rngs(params=0))
    good = dispatch_tables.uniform(placement)
    with pytest.raises(ValueError, match="table must be"):
        moe.set_tables(dispatch_tables.Tables(good.table[:, :-1], good.log2phy))


@given(
    runs=st.integers(1, 6),
    per_run=st.integers(1, 24),
    slots=st.integers(1, 7),
    seed=st.integers(0, 2**16),
)
def test_merging_runs_sorted_by_slot_equals_a_stable_sort(runs, per_run, slots, seed):
    """`stages.merge_by_slot` (the receiver's order for the grouped GEMM when each block arrives sorted by slot,
    padding last) equals ``jnp.argsort(slots, stable=True)``, its inverse and the bincount, exactly — empty and full
    blocks, missing slots and all-padding included; `order_pairs(by_slot=True)` packs blocks that way (destination,
    then slot, then pair order)."""
    rng = np.random.default_rng(seed)
    blocks = []
    for _ in range(runs):
        n = int(rng.integers(0, per_run + 1))
        blocks.append(np.r_[np.sort(rng.integers(0, slots, n)), np.full(per_run - n, slots)])
    s = jnp.asarray(np.concatenate(blocks), jnp.int32)
    order, position, sizes = jax.jit(lambda s: stages.merge_by_slot(s, runs, slots))(s)
    want = np.argsort(np.asarray(s), kind="stable")
    np.testing.assert_array_equal(np.asarray(order), want)
    np.testing.assert_array_equal(np.asarray(position)[want], np.arange(s.shape[0]))
    np.testing.assert_array_equal(np.asarray(sizes), np.bincount(np.asarray(s), minlength=slots + 1)[:slots])
    dest = rng.integers(0, 4, 40)
    local = rng.integers(0, slots, 40)
    po = stages.order_pairs(jnp.asarray(dest), jnp.asarray(local), 3, by_slot=True)
    np.testing.assert_array_equal(np.asarray(po.order), np.lexsort((np.arange(40), local, dest)))
