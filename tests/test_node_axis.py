"""Expert parallelism over two mesh axes (issue 75, item 3's first step): ``MoEConfig(node_axis="node")`` splits the
expert slots over ``node × ep`` (D = nodes × ep ranks, rank = node · |ep| + its ep index), and every expert-parallel
collective runs over both axes — the flat exchange a two-hop exchange must equal.

On (2, 4) and (4, 2) node × ep meshes, and with a data axis beside them, the same tokens and logical weights give the
dense reference's output and gradients and the 1-D ep mesh's, under jit; each device holds its own S slots; the
dispatch tables, the in-graph plan and the module work per rank of the flat group."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from numeric import assert_close, assert_trees_close

import tempo_jax
from solvers import PRESETS, CopyCost, Placement
from tempo_jax.layer import MoEConfig, init_logical_params, layer_axes, moe_forward, moe_reference, to_physical
from tempo_jax.layer import tables as dispatch_tables
from tempo_jax.layer.collectives import program_collectives
from tempo_jax.layer.exchange import lowering_for

E, H, F, K, T = 8, 32, 16, 2, 64


def _mesh(shape, names=("node", "ep")):
    return jax.make_mesh(shape, names, axis_types=(jax.sharding.AxisType.Auto,) * len(shape))


def _config(**kw) -> MoEConfig:
    kw.setdefault("slots_per_rank", 2)
    kw.setdefault("top_k", K)
    return MoEConfig(hidden=H, ffn=F, experts=E, **kw)


def _x():
    return jax.random.normal(jax.random.key(1), (T, H))


def _run(mesh, config, placement, x, *, dispatch_tables_=True):
    logical = init_logical_params(jax.random.key(0), config)
    params = to_physical(logical, placement, mesh=mesh, config=config)
    axes = layer_axes(config, mesh)
    x = jax.device_put(x, NamedSharding(mesh, axes.token_spec))
    pa = dispatch_tables.placement_arrays(placement)
    tables = dispatch_tables.uniform(placement) if dispatch_tables_ else None

    def loss(p, x):
        res = moe_forward(p, x, mesh=mesh, placement_arrays=pa, tables=tables, config=config)
        return jnp.sum(res.out**2), res

    (_, res), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params, x)
    return logical, params, res, grads


@pytest.mark.parametrize("shape", [(2, 4), (4, 2)], ids=lambda s: "x".join(map(str, s)))
def test_node_by_ep_equals_the_dense_reference_and_the_flat_mesh(shape):
    D = shape[0] * shape[1]
    placement = Placement.spread(E, D, 2)  # every expert twice: the replicas' gradients are tied across nodes
    config = _config(node_axis="node")
    logical, params, res, grads = _run(_mesh(shape), config, placement, _x())
    assert_close(res.out, moe_reference(logical, _x(), config))
    want = jax.grad(lambda p: jnp.sum(moe_reference(p, _x(), config) ** 2))(logical)
    assert_trees_close(grads, to_physical(want, placement))
    flat = _run(_mesh((D,), ("ep",)), _config(), placement, _x())
    assert_close(res.out, flat[2].out)
    assert_trees_close(grads, flat[3])
    # each device holds its own S slots: rank = node · |ep| + ep index
    S = config.slots_per_rank
    assert {s.data.shape for s in params["w_gate"].addressable_shards} == {(S, H, F)}
    mesh = _mesh(shape)
    for s in params["w_gate"].addressable_shards:
        coords = np.argwhere(mesh.devices == s.device)[0]
        rank = coords[0] * shape[1] + coords[1]
        assert s.index[0] == slice(rank * S, (rank + 1) * S)
    assert res.stats.gpu_tokens.shape == (D,) and int(res.counts.sum()) == T * K


def test_a_data_axis_beside_the_node_and_ep_axes():
    """(data 2, node 2, ep 2): each data replica routes and exchanges only its own tokens over its node × ep group."""
    mesh = _mesh((2, 2, 2), ("data", "node", "ep"))
    placement = Placement.spread(E, 4, 2)
    config = _config(node_axis="node")
    logical, _, res, grads = _run(mesh, config, placement, _x())
    assert layer_axes(config, mesh).batch == ("data",)
    assert_close(res.out, moe_reference(logical, _x(), config))
    want = jax.grad(lambda p: jnp.sum(moe_reference(p, _x(), config) ** 2))(logical)
    assert_trees_close(grads, to_physical(want, placement))


def test_the_in_graph_plan_and_the_ring_run_over_both_axes():
    placement = Placement.spread(E, 8, 2)
    x = _x()
    ingraph = {"dispatch": "ingraph", "dispatch_mode": "quota", "cost": PRESETS["dsv3_fp8_offline"]}
    for kw in (ingraph, {"exchange": "ring"}):
        config = _config(node_axis="node", **kw)
        logical, _, res, _ = _run(_mesh((2, 4)), config, placement, x, dispatch_tables_=kw.get("dispatch") is None)
        assert_close(res.out, moe_reference(logical, x, config))


def test_the_exchange_is_one_collective_over_every_device():
    """The flat exchange: the dispatch all-to-all's groups span both axes (one group of 8 devices), not the nodes."""
    mesh, placement = _mesh((2, 4)), Placement.spread(E, 8, 2)
    config = _config(node_axis="node", exchange="padded", capacity=None)
    params = to_physical(init_logical_params(jax.random.key(0), config), placement, mesh=mesh, config=config)
    pa, tables = dispatch_tables.placement_arrays(placement), dispatch_tables.uniform(placement)
    f = jax.jit(lambda p, x: moe_forward(p, x, mesh=mesh, placement_arrays=pa, tables=tables, config=config).out)
    found = program_collectives(f.lower(params, _x()).compile().as_text(), mesh)
    a2a = [c for c in found if c.kind == "all-to-all"]
    assert a2a and all(c.group == 8 and set(c.axes) == {"node", "ep"} for c in a2a), found


def test_the_module_trains_and_replaces_on_a_node_by_ep_mesh():
    """`tempo_jax.MoE` over node × ep: gradients equal the dense reference's, an Adam step under nnx.jit, and
    `set_placement` moving slots across nodes keeps the function."""
    mesh = _mesh((2, 4))
    placement = Placement.spread(E, 8, 2)
    config = _config(node_axis="node")
    moe = tempo_jax.MoE(config, placement, mesh=mesh, rngs=nnx.Rngs(params=0, dispatch=1))
    assert moe.placement.num_gpus == 8
    x = _x()
    logical = jax.tree.map(np.asarray, moe.logical_params())
    want = jax.grad(lambda p: jnp.sum(moe_reference(p, x, config) ** 2))(logical)
    got = nnx.grad(lambda m: jnp.sum(m(x) ** 2))(moe)
    assert_trees_close({k: got[k].get_value() for k in logical}, to_physical(want, placement))
    opt = nnx.Optimizer(moe, optax.adam(1e-2), wrt=nnx.Param)

    @nnx.jit
    def step(moe, opt, x):
        loss, grads = nnx.value_and_grad(lambda m: jnp.sum(m(x) ** 2))(moe)
        opt.update(moe, grads)
        return loss

    step(moe, opt, x)
    before = moe(x)
    rolled = Placement.from_phy2log((placement.phy2log + 1) % E, 8)  # every slot takes another expert
    report = moe.set_placement(rolled, optimizer=opt)
    assert report.moved_slots > 0
    assert_close(moe(x), before)


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"node_axis": "ep"}, "node_axis='ep' is also the axis"),
        ({"node_axis": "t", "tensor_axis": "t"}, "node_axis='t' is also the tensor_axis"),
        ({"node_axis": "node", "batch_axes": ("node",)}, "must not contain the node_axis"),
        ({"node_axis": 3}, "node_axis must be None or a mesh axis name"),
    ],
)
def test_bad_node_axes_are_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        _config(**kw)


def test_a_node_axis_missing_from_the_mesh_is_named():
    config = _config(node_axis="rack")
    placement = Placement.spread(E, 8, 2)
    with pytest.raises(ValueError, match="axis 'rack' is not in the mesh.*MoEConfig.node_axis"):
        _run(_mesh((2, 4)), config, placement, _x())


# ------------------------------------------------------------------------------------------------ two hops
TWO_HOP = {"node_axis": "node", "node_exchange": "two_hop", "capacity": None}


@pytest.mark.parametrize(
    "shape, capacity", [((2, 4), None), ((4, 2), None), ((2, 4), "auto")], ids=["2x4-worst", "4x2-worst", "2x4-rounds"]
)
def test_two_hops_equal_the_flat_exchange_and_the_dense_reference(shape, capacity):
    """Output and every gradient of the two-hop exchange equal the flat exchange's over the same mesh and the dense
    reference, under jit (replicas on both nodes: the tied gradients cross nodes too); hop 2 in one worst-case
    exchange (capacity None) or in dropless rounds (capacity "auto": C2 = Nn·C, here several rounds)."""
    D = shape[0] * shape[1]
    placement = Placement.spread(E, D, 2)
    x = _x()
    kw = {**TWO_HOP, "capacity": capacity}
    if capacity == "auto":  # 128 tokens per rank in rounds of C2 = 2 · 8 rows per block: hop 2 needs several
        kw["capacity_factor"] = 0.25
        x = jax.random.normal(jax.random.key(5), (1024, H))
    logical, _, res, grads = _run(_mesh(shape), _config(**kw), placement, x)
    _, _, flat, flat_grads = _run(_mesh(shape), _config(node_axis="node", capacity=None), placement, x)
    if capacity == "auto":
        assert int(np.max(res.stats.rounds)) > 1, res.stats.rounds
    assert_close(res.out, flat.out)
    assert_trees_close(grads, flat_grads)
    assert_close(res.out, moe_reference(logical, x, _config(**TWO_HOP)))
    np.testing.assert_array_equal(res.stats.gpu_tokens, flat.stats.gpu_tokens)  # the same pairs on the same ranks
    assert int(res.stats.drops.sum()) == 0


def test_two_hops_with_a_data_axis_the_module_and_bf16():
    mesh = _mesh((2, 2, 2), ("data", "node", "ep"))
    placement = Placement.spread(E, 4, 2)
    x = _x()
    logical, _, res, _ = _run(mesh, _config(**TWO_HOP), placement, x)
    assert_close(res.out, moe_reference(logical, x, _config(**TWO_HOP)))
    moe = tempo_jax.MoE(
        _config(**TWO_HOP, dtype=jnp.bfloat16),
        Placement.spread(E, 8, 2),
        mesh=_mesh((2, 4)),
        rngs=nnx.Rngs(params=0, dispatch=1),
    )
    want = moe_reference(jax.tree.map(np.asarray, moe.logical_params()), x, moe.config)
    np.testing.assert_allclose(np.asarray(moe(x), np.float32), np.asarray(want, np.float32), atol=0.05, rtol=0.05)


def test_node_rows_send_each_token_once_per_distinct_node():
    from tempo_jax.layer.two_hop import node_rows

    # D = 8 ranks in 2 nodes of 4; K = 3; rank 8: never sent
    dest = jnp.array([0, 1, 2, 0, 5, 8, 8, 8, 8, 7, 6, 5], jnp.int32)  # 4 tokens
    need, pos = node_rows(dest, 3, 8, 4)
    np.testing.assert_array_equal(need, [[True, False], [True, True], [False, False], [False, True]])
    np.testing.assert_array_equal(np.where(need, pos, -1), [[0, -1], [1, 0], [-1, -1], [-1, 1]])


def test_two_hops_send_fewer_bytes_over_the_node_axis():
    """The compiled program: hop 1's collectives over ``node`` carry one row per (token, node) — T rows of H per
    peer node, and the partial rows back — where the flat exchange over both axes sends K rows per token
    (its worst-case blocks of T·K rows to every rank)."""
    mesh, placement = _mesh((2, 4)), Placement.spread(E, 8, 2)

    def collectives(config):
        params = to_physical(init_logical_params(jax.random.key(0), config), placement, mesh=mesh, config=config)
        pa, tables = dispatch_tables.placement_arrays(placement), dispatch_tables.uniform(placement)
        f = jax.jit(lambda p, x: moe_forward(p, x, mesh=mesh, placement_arrays=pa, tables=tables, config=config).out)
        return program_collectives(f.lower(params, _x()).compile().as_text(), mesh)

    two = collectives(_config(**TWO_HOP, exchange="padded"))
    flat = collectives(_config(node_axis="node", capacity=None, exchange="padded"))
    over_node = sum(c.wire_bytes for c in two if c.kind == "all-to-all" and set(c.axes) == {"node"})
    flat_bytes = sum(c.wire_bytes for c in flat if c.kind == "all-to-all" and "node" in c.axes)
    Tl = T // 8  # tokens per rank
    row = H * 4  # float32 rows (the test's dtype)
    # hop 1: T rows of H (+ int32 / float32 metadata) to the other node, the partial rows back
    assert over_node <= 2 * Tl * (row + 3 * K * 4) + 64, (over_node, two)
    flat_cross = flat_bytes * 4 / 7  # of the flat exchange's 7 peers, 4 sit on the other node
    assert K * over_node < flat_cross, (flat_cross, over_node)
    assert any(c.kind == "all-to-all" and set(c.axes) == {"ep"} for c in two)  # hop 2 stays inside the node


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"node_exchange": "two_hop", "capacity": None}, "set node_axis"),
        ({**TWO_HOP, "exchange": "ring"}, "exchange='ring' gathers every token"),
        ({**TWO_HOP, "capacity": 2}, "capacity=2 would drop pairs"),
        ({"node_axis": "node", "node_exchange": "hops"}, "node_exchange must be 'flat' or 'two_hop'"),
    ],
)
def test_bad_two_hop_settings_are_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        _config(**kw)


def test_two_hops_lower_to_ragged_exchanges_on_gpu():
    """With the ragged exchange (GPU/TPU; lowered here, XLA:CPU cannot run it) every hop is a ragged all-to-all:
    hop 1's three (rows, their pairs' ids, gates) and its return, hop 2 and its return — rows move, padding does
    not."""
    mesh, placement = _mesh((2, 4)), Placement.spread(E, 8, 2)
    config = _config(**TWO_HOP, exchange="ragged")
    params = to_physical(init_logical_params(jax.random.key(0), config), placement, mesh=mesh, config=config)
    pa, tables = dispatch_tables.placement_arrays(placement), dispatch_tables.uniform(placement)
    f = jax.jit(lambda p, x: moe_forward(p, x, mesh=mesh, placement_arrays=pa, tables=tables, config=config).out)
    with lowering_for("gpu"):
        text = f.lower(params, _x()).as_text()
    assert text.count("ragged_all_to_all") == 6, text.count("ragged_all_to_all")


# ------------------------------------------------------------------------------------------------ node-limited routing
def test_node_limited_routing_is_group_limited_routing_on_contiguous_nodes():
    """DeepSeek-V3's node limit, M = 2 of 4 nodes with K = 4 (a node scores its best two): on experts laid out in
    order (node = e // (E / 4)) it is transformers' group-limited choice with n_group 4, topk_group 2."""
    from tempo_jax.layer.routing import RouterConfig, route

    E16, K4 = 16, 4
    params = {"router": jax.random.normal(jax.random.key(2), (H, E16)), "score_bias": jnp.linspace(-0.1, 0.1, E16)}
    x = jax.random.normal(jax.random.key(3), (32, H))
    nodes = (jnp.arange(E16) // 4, 4)
    a = route(x, params, RouterConfig(scoring="sigmoid", score_bias=True, max_nodes=2), K4, nodes=nodes)
    b = route(x, params, RouterConfig(scoring="sigmoid", score_bias=True, n_group=4, topk_group=2), K4)
    np.testing.assert_array_equal(np.sort(a.ids, axis=1), np.sort(b.ids, axis=1))
    np.testing.assert_allclose(np.sort(a.gate, axis=1), np.sort(b.gate, axis=1), rtol=1e-6)
    unlimited = route(x, params, RouterConfig(scoring="sigmoid", score_bias=True), K4)
    assert (np.asarray(jnp.arange(E16) // 4)[np.asarray(unlimited.ids)].max(1) > 0).any()  # the limit binds
    with pytest.raises(ValueError, match="give nodes="):
        route(x, params, RouterConfig(max_nodes=2), K4)


def _node_placement():
    """8 experts, one slot each on 8 ranks in 4 nodes of 2, shuffled: expert e's node is where the shuffle put it."""
    return Placement.from_phy2log(np.array([5, 2, 7, 0, 3, 6, 1, 4]), 8)


@pytest.mark.parametrize("node_exchange", ["flat", "two_hop"])
def test_node_limited_routing_in_the_layer(node_exchange):
    """max_nodes = 2 of 4 nodes: the layer equals the dense reference given the placement's expert nodes (values and
    gradients), and every token's experts sit on at most two nodes."""
    from tempo_jax.layer.routing import RouterConfig, expert_nodes, route

    placement = _node_placement()
    kw = {"capacity": None} if node_exchange == "two_hop" else {}
    config = _config(
        node_axis="node", node_exchange=node_exchange, slots_per_rank=1, top_k=3, router=RouterConfig(max_nodes=2), **kw
    )
    nodes = expert_nodes(placement.phy2log, E, 4)
    np.testing.assert_array_equal(nodes, np.argsort(placement.phy2log) // 2)
    x = _x()
    logical, _, res, grads = _run(_mesh((4, 2)), config, placement, x)
    assert_close(res.out, moe_reference(logical, x, config, expert_nodes=nodes))
    want = jax.grad(lambda p: jnp.sum(moe_reference(p, x, config, expert_nodes=nodes) ** 2))(logical)
    assert_trees_close(grads, to_physical(want, placement))
    ids = np.asarray(route(x, logical, config.router, 3, nodes=(nodes, 4)).ids)
    assert max(len(set(nodes[row])) for row in ids) == 2


def test_node_limited_routing_refuses_what_it_cannot_count():
    from tempo_jax.layer.routing import RouterConfig

    with pytest.raises(ValueError, match="set node_axis"):
        _config(router=RouterConfig(max_nodes=2))
    with pytest.raises(ValueError, match="max_nodes=2 limits the choice"):
        _config(node_axis="node", router=RouterConfig(max_nodes=2, n_group=2, topk_group=1))
    with pytest.raises(ValueError, match="dynamic_slots copy hot experts to any rank"):
        _config(
            node_axis="node",
            router=RouterConfig(max_nodes=1),
            dispatch="ingraph",
            dispatch_mode="quota",
            cost=PRESETS["dsv3_fp8_offline"],
            dynamic_slots=1,
            copy_cost=CopyCost(1e6, 100.0, 0.0),
        )
    config = _config(node_axis="node", router=RouterConfig(max_nodes=1))
    with pytest.raises(ValueError, match="expert 0 has slots on nodes 0 and 1"):  # replicas on both nodes
        _run(_mesh((2, 4)), config, Placement.spread(E, 8, 2), _x())


# ---------------------------------------------------------------------------------------- pricing two link classes
def test_node_exchange_cost_prices_the_two_link_classes():
    """DeepSeek-V3's shapes on EP64 = 8 nodes × 8 (bf16, 4,096 tokens per rank): the two-hop exchange sends each token
    to a node once (5.25 of 8 nodes reached on average: 4.6 others) where the flat exchange sends 7 of every 8 pairs
    across, so fewer bytes cross the slow links and more the fast ones; node-limited routing (M = 4) fewer still."""
    from tempo_jax.layer.exchange import CallShape, distinct_nodes, node_exchange_cost

    shape = CallShape(4096, 8, 7168, 64, 4096 * 8, 2)
    flat, two = (node_exchange_cost(e, shape, 8) for e in ("flat", "two_hop"))
    assert two.node_bytes < 0.7 * flat.node_bytes and two.link_bytes > flat.link_bytes
    assert two.us < flat.us  # bound by the node links (50 GB/s) in both
    capped = node_exchange_cost("two_hop", shape, 8, reached=distinct_nodes(8, 8, 4))
    assert capped.node_bytes == pytest.approx(two.node_bytes * 4 / distinct_nodes(8, 8))
    assert node_exchange_cost("flat", shape, 1).node_bytes == 0  # one node: nothing crosses
    with pytest.raises(ValueError, match="nodes=3 must divide the 64 ranks"):
        node_exchange_cost("flat", shape, 3)
    with pytest.raises(ValueError, match="node_exchange must be 'flat' or 'two_hop'"):
        node_exchange_cost("ring", shape, 8)


def test_distinct_nodes_is_what_drawn_pairs_reach():
    """The model's expected nodes per token against `node_rows` on K = 8 uniform pairs over 64 ranks in 8 nodes."""
    from tempo_jax.layer.exchange import distinct_nodes
    from tempo_jax.layer.two_hop import node_rows

    dest = np.random.default_rng(0).integers(0, 64, size=20000 * 8)
    need, _ = node_rows(jnp.asarray(dest, jnp.int32), 8, 64, 8)
    assert float(np.asarray(need).sum(1).mean()) == pytest.approx(distinct_nodes(8, 8), rel=0.01)
