"""The ring exchange (`MoEConfig(exchange="ring")`, issue 71): every token all-gathered over ``ep``, each rank's own
pairs through its experts, the weighted results reduce-scattered back — the same function as the block exchanges.

Equal to the padded exchange (outputs, gradients, drops, rows per rank) dropless and at a fixed capacity, in several
local rounds, on a data × ep × tensor mesh with FSDP, with dynamic copies and with Llama-4's input-weighted pairs;
its compiled program moves tokens only by its gather and reduce-scatter (no all-to-all), and no rank computes a
pair twice."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numeric import assert_close, assert_trees_close

from solvers import PRESETS, CopyCost, Placement
from tempo_jax.layer import MoEConfig, init_params, make_ep_mesh, make_mesh, moe_forward, moe_reference, to_logical
from tempo_jax.layer import tables as dispatch_tables
from tempo_jax.layer.collectives import program_collectives
from tempo_jax.layer.exchange import CallShape, choose_exchange, exchange_cost
from tempo_jax.layer.experts import ExpertConfig, SharedConfig
from tempo_jax.layer.routing import RouterConfig

D, E, S, H, F, K = 8, 16, 4, 32, 16, 2


@pytest.fixture(scope="module")
def case():
    placement = Placement.spread(E, D, S)  # every expert twice
    cfg = MoEConfig(hidden=H, ffn=F, experts=E, top_k=K, slots_per_rank=S, dispatch_mode="quota")
    mesh = make_ep_mesh(D)
    params = init_params(jax.random.key(0), cfg, placement, mesh=mesh)
    return placement, cfg, mesh, params


def _run(case, exchange, x, capacity=None, routing=None, **kw):
    placement, cfg, mesh, params = case
    cfg = dataclasses.replace(cfg, exchange=exchange, **kw)
    pa, tab = dispatch_tables.placement_arrays(placement), dispatch_tables.uniform(placement)

    def f(p, x):
        return moe_forward(
            p, x, mesh=mesh, placement_arrays=pa, tables=tab, config=cfg, capacity=capacity, routing=routing
        )

    return f


def _skewed(T):
    """Every token to experts 0 and 1 (two ranks hold them): blocks of T/D·K rows, several rounds at auto C."""
    ids = np.zeros((T, K), np.int32)
    ids[:, 1] = 1
    return jnp.asarray(ids), jnp.full((T, K), 0.5, jnp.float32)


@pytest.mark.parametrize(
    "capacity",
    [pytest.param(None, marks=pytest.mark.slow), "auto", 6],  # worst case: one round, as "auto" here (fast twin)
    ids=["worst", "auto", "fixed6"],
)
def test_ring_equals_the_padded_exchange_under_jit_and_grad(case, capacity):
    """Outputs, every gradient, drops, rows per rank and per slot: the ring's equal the padded exchange's, dropless
    (worst case, rounds) and at a fixed capacity that drops pairs (the same pairs: the source's order per block)."""
    x = jax.random.normal(jax.random.key(1), (D * 32, H))
    runs = {ex: _run(case, ex, x, capacity) for ex in ("padded", "ring")}
    res = {ex: jax.jit(f)(case[3], x) for ex, f in runs.items()}
    assert_close(res["ring"].out, res["padded"].out)
    for field in ("drops", "gpu_tokens", "slot_tokens", "max_block", "gpu_activations"):
        np.testing.assert_array_equal(getattr(res["ring"].stats, field), getattr(res["padded"].stats, field), field)
    if capacity == 6:
        assert int(res["ring"].stats.drops.sum()) > 0
    else:  # dropless, and every pair computed exactly once across the ranks
        assert int(res["ring"].stats.gpu_tokens.sum()) == x.shape[0] * K
    cot = jax.random.normal(jax.random.key(2), x.shape)
    grads = {
        ex: jax.jit(jax.grad(lambda p, x, f=f: jnp.sum(f(p, x).out * cot), argnums=(0, 1)))(case[3], x)
        for ex, f in runs.items()
    }
    assert_trees_close(grads["ring"], grads["padded"])


def test_ring_rounds_are_local_and_dropless_on_a_skewed_batch(case):
    """Every pair to two ranks: those run several local rounds of D·C rows, the others one; the output and gradients
    equal the dense reference's."""
    placement, cfg, mesh, params = case
    T = D * 32
    x = jax.random.normal(jax.random.key(3), (T, H))
    routing = _skewed(T)
    f = _run(case, "ring", x, "auto", routing=routing)
    res = jax.jit(f)(params, x)
    rounds = res.stats.rounds.tolist()
    assert max(rounds) > 1 and min(rounds) == 1 and int(res.stats.drops.sum()) == 0
    logical = to_logical(params, placement)
    assert_close(res.out, moe_reference(logical, x, cfg, routing=routing))
    g = jax.jit(jax.grad(lambda p: jnp.sum(f(p, x).out ** 2)))(params)
    g_ref = jax.grad(lambda p: jnp.sum(moe_reference(p, x, cfg, routing=routing) ** 2))(logical)
    assert_trees_close(to_logical(g, placement), g_ref)


def test_the_ring_program_gathers_and_reduce_scatters_and_sends_no_all_to_all(case):
    """The compiled forward's token traffic over ``ep``: all-gathers ([T/D, H] rows in, [T/D, 2K] pair metadata)
    and one reduce-scatter of [T, H] float32 results; no all-to-all (the exchange's counts and blocks are gone)."""
    placement, cfg, mesh, params = case
    x = jax.random.normal(jax.random.key(1), (D * 32, H))
    f = _run(case, "ring", x, "auto")
    colls = program_collectives(jax.jit(f).lower(params, x).compile().as_text(), mesh)
    kinds = sorted(c.kind for c in colls if c.group > 1)
    assert "all-to-all" not in kinds, kinds
    assert kinds.count("reduce-scatter") == 1 and kinds.count("all-gather") == 2, kinds


def test_ring_on_a_data_ep_tensor_mesh_with_fsdp_equals_the_reference():
    """(2, 2, 2) data × ep × tensor with the expert weights FSDP-sharded over data, biased experts and a gated shared
    expert: the ring's output and gradients equal the dense reference's (each EP group gathers only its own tokens)."""
    mesh = make_mesh(data=2, ep=2, tensor=2)
    placement = Placement.spread(8, 2, 8)
    cfg = MoEConfig(
        hidden=H,
        ffn=F,
        experts=8,
        top_k=K,
        slots_per_rank=8,
        expert=ExpertConfig(bias=True),
        shared=SharedConfig(count=1, ffn=8, gated=True),
        tensor_axis="tensor",
        fsdp_axis="data",
        batch_axes=("data",),
        exchange="ring",
    )
    params = init_params(jax.random.key(0), cfg, placement, mesh=mesh)
    x = jax.random.normal(jax.random.key(1), (64, H))
    pa, tab = dispatch_tables.placement_arrays(placement), dispatch_tables.uniform(placement)

    def loss(p, x):
        return jnp.sum(moe_forward(p, x, mesh=mesh, placement_arrays=pa, tables=tab, config=cfg).out ** 2)

    logical = to_logical(params, placement)
    plain = dataclasses.replace(cfg, tensor_axis=None, fsdp_axis=None, batch_axes=None)
    assert_close(
        moe_forward(params, x, mesh=mesh, placement_arrays=pa, tables=tab, config=cfg).out,
        moe_reference(logical, x, plain),
    )
    g = jax.jit(jax.grad(loss))(params, x)
    g_ref = jax.grad(lambda p: jnp.sum(moe_reference(p, x, plain) ** 2))(logical)
    assert_trees_close(to_logical(g, placement), g_ref)


def test_ring_with_dynamic_copies_and_input_weighted_pairs(case):
    """The in-graph plan with one dynamic copy slot per rank on a skewed batch (copies are made: extra local slots, a
    second weight part) and Llama-4's router weights on the expert input (one row per pair): ring equals padded."""
    placement, base, mesh, params = case
    T = D * 32
    x = jax.random.normal(jax.random.key(4), (T, H))
    pa = dispatch_tables.placement_arrays(placement)
    copies = dict(
        dispatch="ingraph", cost=PRESETS["dsv3_fp8_offline"], dynamic_slots=1, copy_cost=CopyCost(0.0, 1.0, 0.0)
    )
    outs = []
    for ex in ("padded", "ring"):
        c = dataclasses.replace(base, exchange=ex, **copies)
        f = jax.jit(
            lambda p, x, c=c: moe_forward(
                p, x, mesh=mesh, placement_arrays=pa, tables=None, config=c, routing=_skewed(T)
            )
        )
        outs.append(f(params, x))
    assert int(outs[1].stats.copies.sum()) > 0
    assert_close(outs[1].out, outs[0].out)
    np.testing.assert_array_equal(outs[1].stats.slot_tokens, outs[0].stats.slot_tokens)
    llama = dict(router=RouterConfig(scoring="sigmoid", weight_on="input", renormalize=False))
    outs = [jax.jit(_run(case, ex, x, "auto", **llama))(params, x) for ex in ("padded", "ring")]
    assert_close(outs[1].out, outs[0].out)
    logical = to_logical(params, placement)
    assert_close(outs[1].out, moe_reference(logical, x, dataclasses.replace(base, **llama)))


def test_ring_is_refused_with_a_launch_schedule():
    from solvers import LaunchSchedule

    with pytest.raises(ValueError, match="ring"):
        MoEConfig(
            hidden=H,
            ffn=F,
            experts=E,
            top_k=K,
            slots_per_rank=S,
            exchange="ring",
            schedule=LaunchSchedule.stragglers(D, late=(5,)),
        )


@pytest.mark.parametrize(
    ("D", "K", "platform", "want"),
    [
        (8, 2, "cpu", "padded"),  # measured: padded 70 / ring 76 ms (docs/results.md, the exchange table)
        (8, 8, "cpu", "ring"),  # 301 / 215 ms
        (2, 2, "cpu", "ring"),  # 30.4 / 29.5 ms
        (4, 8, "cpu", "ring"),  # 157 / 118 ms
        (8, 2, "gpu", "ragged"),  # NVLink: the ragged exchange sends only the valid rows
        (8, 8, "gpu", "ragged"),
    ],
)
def test_exchange_auto_takes_the_cheaper_by_the_cost_model(D, K, platform, want):
    """`choose_exchange` on the bench's shapes (T 512 per rank, H 256, float32 on CPU, bf16 on GPU, C = 2 × the mean
    block): the ring where top-k is large against the group or the group is small, the block exchange elsewhere; the
    model's bytes grow with what each moves (the ring's with D·T, the padded exchange's with D·C, the ragged's with
    T·K)."""
    T, H = 512, 256
    C = -(-2 * T * K // D) // 8 * 8
    block = "ragged" if platform == "gpu" else "padded"
    shape = CallShape(T, K, H, D, C, itemsize=2 if platform == "gpu" else 4)
    assert choose_exchange(block, shape, platform) == want
    ring, padded, ragged = (exchange_cost(e, shape, platform) for e in ("ring", "padded", "ragged"))
    assert ragged.wire_bytes <= padded.wire_bytes and ring.wire_bytes > 0
    assert exchange_cost("ring", dataclasses.replace(shape, num_ranks=2 * D), platform).wire_bytes > ring.wire_bytes
    assert choose_exchange(block, dataclasses.replace(shape, num_ranks=1), platform) == block
    with pytest.raises(ValueError, match="exchange"):
        exchange_cost("auto", shape, platform)


def test_the_layers_auto_exchange_follows_the_rule():
    """128 tokens per rank, top-2: on 2 ranks the layer's default exchange is the ring (no all-to-all in its program),
    on 8 the padded all-to-all; the same output either way. (At a few tokens per rank the padded blocks' minimum of 8
    rows makes the ring the cheaper on 8 ranks too.)"""
    progs = {}
    for D in (2, 8):
        mesh = make_ep_mesh(D)
        placement = Placement.spread(E, D, E // D)
        cfg = MoEConfig(hidden=H, ffn=F, experts=E, top_k=K, slots_per_rank=E // D)
        params = init_params(jax.random.key(0), cfg, placement, mesh=mesh)
        pa, tab = dispatch_tables.placement_arrays(placement), dispatch_tables.uniform(placement)
        x = jax.random.normal(jax.random.key(1), (128 * D, H))
        f = jax.jit(
            lambda p, x, mesh=mesh, cfg=cfg, pa=pa, tab=tab: (
                moe_forward(p, x, mesh=mesh, placement_arrays=pa, tables=tab, config=cfg).out
            )
        )
        kinds = {c.kind for c in program_collectives(f.lower(params, x).compile().as_text(), mesh) if c.group > 1}
        progs[D] = kinds
        assert_close(f(params, x), moe_reference(to_logical(params, placement), x, cfg))
    assert "all-to-all" not in progs[2] and "reduce-scatter" in progs[2], progs
    assert "all-to-all" in progs[8] and "reduce-scatter" not in progs[8], progs
