"""The layer on a real model's mesh (issue 49): data × expert × tensor axes, FSDP, no work done twice.

On every mesh of the issue — (8,) ep, (2, 4) and (4, 2) data × ep, (4, 2) ep × tensor, (2, 2, 2) data × ep × tensor
— the same tokens and the same logical weights give the dense reference's output and gradients (the central
invariant across mesh shapes); each parameter lives where `tempo_jax.layer.mesh` says; the compiled program moves no
token over a batch axis, reduces over the tensor axis once, and does no more FLOPs per device than the 1-D mesh."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from numeric import assert_close, assert_trees_close

import tempo_jax
from solvers import Placement
from tempo_jax.layer import (
    MoEConfig,
    init_logical_params,
    layer_axes,
    make_mesh,
    moe_forward,
    moe_reference,
    to_physical,
)
from tempo_jax.layer import tables as dispatch_tables
from tempo_jax.layer.collectives import program_collectives
from tempo_jax.layer.exchange import lowering_for
from tempo_jax.layer.experts import ExpertConfig, LatentConfig, OutputConfig, SharedConfig
from tempo_jax.layer.replicas import shared_rows

E, H, F, K, T = 8, 32, 16, 2, 64
#: (data, ep, tensor) of the issue's meshes.
MESHES = [(1, 8, 1), (2, 4, 1), (4, 2, 1), (1, 4, 2), (2, 2, 2)]


def _mesh(shape):
    data, ep, tensor = shape
    return make_mesh(data=data, ep=ep, tensor=tensor)


def _placement(ep: int) -> Placement:
    return Placement.spread(E, ep, 2 * E // ep)  # every expert twice: the replicas' gradients are tied


def _config(shape, **kw) -> MoEConfig:
    data, ep, tensor = shape
    kw.setdefault("slots_per_rank", 2 * E // ep)
    return MoEConfig(
        hidden=H,
        ffn=F,
        experts=E,
        top_k=K,
        expert=ExpertConfig(bias=True),
        shared=SharedConfig(count=1, ffn=8, gated=True),
        tensor_axis="tensor" if tensor > 1 else None,
        **kw,
    )


def _logical(config):
    return init_logical_params(jax.random.key(0), config)


def _x():
    return jax.random.normal(jax.random.key(1), (T, H))


def _loss_fn(mesh, config, placement):
    pa, tables = dispatch_tables.placement_arrays(placement), dispatch_tables.uniform(placement)

    def loss(params, x):
        res = moe_forward(params, x, mesh=mesh, placement_arrays=pa, tables=tables, config=config)
        return jnp.sum(res.out**2), res

    return loss


@pytest.fixture(scope="module")
def reference():
    config = _config((1, 8, 1))
    logical, x = _logical(config), _x()
    out = moe_reference(logical, x, config)
    grads = jax.grad(lambda p: jnp.sum(moe_reference(p, x, config) ** 2))(logical)
    return out, grads


def _collectives(fn, mesh, *args):
    return program_collectives(jax.jit(fn).lower(*args).compile().as_text(), mesh)


@pytest.mark.parametrize("shape", MESHES, ids=lambda s: "x".join(map(str, s)))
def test_outputs_gradients_and_shardings_on_every_mesh(shape, reference):
    """Output and every gradient equal the dense reference under jit; parameters and gradients live where the mesh
    layout says (each device its S slots, its F / Tp share); the output keeps the tokens' sharding."""
    mesh, config = _mesh(shape), _config(shape)
    placement = _placement(shape[1])
    params = to_physical(_logical(config), placement, mesh=mesh, config=config)
    axes = layer_axes(config, mesh)
    for k, v in params.items():
        assert v.sharding.spec == tempo_jax.layer.mesh.param_spec(k, axes), k
    S, Tp = config.slots_per_rank, shape[2]
    assert {s.data.shape for s in params["w_gate"].addressable_shards} == {(S, H, F // Tp)}
    assert {s.data.shape for s in params["w_down"].addressable_shards} == {(S, F // Tp, H)}
    x = jax.device_put(_x(), NamedSharding(mesh, axes.token_spec))
    (_, res), grads = jax.jit(jax.value_and_grad(_loss_fn(mesh, config, placement), has_aux=True))(params, x)
    want_out, want_grads = reference
    assert_close(res.out, want_out)
    assert res.out.sharding.is_equivalent_to(NamedSharding(mesh, axes.token_spec), 2)
    assert res.stats.gpu_tokens.shape == (shape[0] * shape[1],)
    assert res.counts.shape == (shape[1], E) and int(res.counts.sum()) == T * K
    assert_trees_close(grads, to_physical(want_grads, placement))
    for k, g in grads.items():
        assert g.sharding.spec == params[k].sharding.spec, k
    tx = optax.adam(1e-3)  # Adam's moments, and one update, live where their weights live
    updates, state = jax.jit(tx.update)(grads, tx.init(params), params)
    for k in params:
        for moment in (state[0].mu[k], state[0].nu[k], updates[k]):
            assert moment.sharding.is_equivalent_to(params[k].sharding, moment.ndim), k


def test_the_families_block_options_on_a_data_ep_tensor_mesh():
    """Plain relu² experts with biases (no gate projection) at a latent width, a plain shared expert, zero-computation
    experts and the block output's bias and norm (issue 74's options, together) on data 2 × ep 2 × tensor 2 with FSDP
    over data: output and every gradient equal the dense reference under jit; the expert arrays split as the layout
    says."""
    shape = (2, 2, 2)
    mesh = _mesh(shape)
    config = dataclasses.replace(
        _config(shape, fsdp_axis="data"),
        expert=ExpertConfig(activation="relu2", bias=True),
        shared=SharedConfig(count=1, ffn=8, activation="relu2"),
        zero_experts=2,
        zero_expert_output="zero",
        output=OutputConfig(bias=True, norm=True),
        latent=LatentConfig(width=16, norm=True),
    )
    placement = _placement(shape[1])
    logical = _logical(config)
    params = to_physical(logical, placement, mesh=mesh, config=config)
    assert "w_gate" not in params and "b_gate" not in params and "shared_w_gate" not in params
    S = config.slots_per_rank
    assert {s.data.shape for s in params["w_up"].addressable_shards} == {
        (S, 16 // 2, F // 2)
    }  # latent L = 16 over data
    x = jax.device_put(_x(), NamedSharding(mesh, layer_axes(config, mesh).token_spec))
    (_, res), grads = jax.jit(jax.value_and_grad(_loss_fn(mesh, config, placement), has_aux=True))(params, x)
    want = jax.grad(lambda p: jnp.sum(moe_reference(p, _x(), config) ** 2))(logical)
    assert_close(res.out, moe_reference(logical, _x(), config))
    assert_trees_close(grads, to_physical(want, placement))
    on_zero = int((np.asarray(res.stats.topk_ids) >= E).sum())
    assert on_zero > 0 and int(res.counts.sum()) == T * K - on_zero


def test_no_token_crosses_a_batch_axis_and_flops_match_the_1d_mesh():
    """The forward program's collectives over ``data`` carry only counts and losses (no token all-gather); FLOPs
    per device on data × ep meshes ≤ 1.05 × the 1-D mesh's (the issue measured 1.98× before); with a tensor axis the
    output is reduced over it exactly once, a ``[T / (B·D), H]`` all-reduce."""
    flops = {}
    for shape in MESHES:
        mesh, config = _mesh(shape), _config(shape)
        placement = _placement(shape[1])
        params = to_physical(_logical(config), placement, mesh=mesh, config=config)
        fwd = _loss_fn(mesh, config, placement)
        compiled = jax.jit(fwd).lower(params, _x()).compile()
        flops[shape] = compiled.cost_analysis()["flops"]
        colls = [c for c in program_collectives(compiled.as_text(), mesh) if c.group > 1]
        over_data = [c for c in colls if "data" in c.axes]
        # the counts' sum [E] int32, the losses' sums (tokens, mean router probability [E], load [E], z): no token
        assert all(c.kind == "all-reduce" and c.bytes <= 4 * (2 * E + 4) for c in over_data), over_data
        over_tensor = [c for c in colls if "tensor" in c.axes]
        if shape[2] > 1:
            assert len(over_tensor) == 1, over_tensor
            assert over_tensor[0].kind == "all-reduce" and over_tensor[0].axes == ("tensor",)
            assert over_tensor[0].shape == (T // (shape[0] * shape[1]), H)
        else:
            assert not over_tensor
    for shape in [(2, 4, 1), (4, 2, 1)]:
        assert flops[shape] <= 1.05 * flops[(1, 8, 1)], flops


def test_fsdp_gathers_weights_in_and_reduce_scatters_gradients_out():
    """fsdp_axis="data": each device holds H / 2 of its slots' weights; the layer all-gathers them over ``data``
    (weights only), and the gradients come back reduce-scattered over it; outputs and gradients = dense."""
    shape = (2, 2, 2)
    mesh = _mesh(shape)
    config = _config(shape, fsdp_axis="data")
    placement = _placement(2)
    params = to_physical(_logical(config), placement, mesh=mesh, config=config)
    assert params["w_gate"].sharding.spec == P("ep", "data", "tensor")
    assert params["w_down"].sharding.spec == P("ep", "tensor", "data")
    S = config.slots_per_rank
    assert {s.data.shape for s in params["w_up"].addressable_shards} == {(S, H // 2, F // 2)}
    loss = _loss_fn(mesh, config, placement)
    grad_fn = jax.grad(lambda p, x: loss(p, x)[0])
    colls = [c for c in _collectives(grad_fn, mesh, params, _x()) if c.group > 1 and "data" in c.axes]
    gathers = [c for c in colls if c.kind == "all-gather"]
    scatters = [c for c in colls if c.kind == "reduce-scatter"]
    assert gathers and scatters and all(len(c.shape) == 3 for c in gathers + scatters)  # weight arrays only
    (_, res), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params, _x())
    config0 = _config((1, 8, 1))
    assert_close(res.out, moe_reference(_logical(config0), _x(), config0))
    want = jax.grad(lambda p: jnp.sum(moe_reference(p, _x(), config0) ** 2))(_logical(config0))
    assert_trees_close(grads, to_physical(want, placement))
    assert grads["w_gate"].sharding.spec == P("ep", "data", "tensor")


@pytest.mark.parametrize("shape", [(1, 8, 1), (2, 2, 2)], ids=lambda s: "x".join(map(str, s)))
def test_replica_sync_exchanges_only_what_is_replicated(shape):
    """``replica_sync="exchange"``: each rank sends the ranks it shares experts with one row per shared expert (the
    padded block exchange here; ragged on GPU/TPU moves only those rows: 4 per rank for ``Placement.spread(16, 8,
    4)``, where the all-reduce carries all 16). On an EPLB placement, on the 1-D mesh and on data × ep × tensor,
    its gradients equal the all-reduce's and the dense reference's; in the compiled step the tie is one all-to-all
    over ``ep``, or one all-reduce of the Rb redundant rows with ``"all_reduce"``."""
    np.testing.assert_array_equal(shared_rows(Placement.spread(16, 8, 4)), [4] * 8)
    assert shared_rows(Placement.spread(16, 8, 2)).sum() == 0  # P = E: nothing to exchange
    mesh, D = _mesh(shape), shape[1]
    placement = Placement.from_eplb(np.geomspace(20, 1, E), 16, D)  # hot experts replicated, wherever EPLB puts them
    logical = _logical(_config(shape))
    x = _x()
    want = to_physical(jax.grad(lambda p: jnp.sum(moe_reference(p, x, _config(shape)) ** 2))(logical), placement)
    for method, kind in (("exchange", "all-to-all"), ("all_reduce", "all-reduce")):
        config = dataclasses.replace(_config(shape), slots_per_rank=16 // D, replica_sync=method)
        params = to_physical(logical, placement, mesh=mesh, config=config)
        loss = _loss_fn(mesh, config, placement)
        grad_fn = jax.grad(lambda p, x, loss=loss: loss(p, x)[0])
        ties = [c for c in _collectives(grad_fn, mesh, params, x) if "tie_replicas" in c.op_name and c.group > 1]
        assert {(c.kind, c.axes) for c in ties} == {(kind, ("ep",))}, ties
        assert_trees_close(jax.jit(grad_fn)(params, x), want)


@pytest.mark.parametrize("method", ["exchange", "all_reduce"])
def test_replica_sync_in_column_chunks_keeps_the_gradients(method, monkeypatch):
    """At real size the replicas' gradient sum runs in column chunks one after another (`tie_chunks`: each chunk's
    float32 buffer within `TIE_CHUNK_BYTES`; DeepSeek-V3 on EP64 needs 42 chunks of its 64 redundant experts'
    11.3 GB). With a budget of 4 KiB here the tie's collectives run in a loop, each on a chunk of the columns (the
    columns left over after the last whole chunk once more after it), and the gradients equal the dense reference's."""
    from tempo_jax.layer import replicas

    assert (
        replicas.tie_chunks("all_reduce", num_ranks=64, slots_per_rank=5, num_experts=256, width=3 * 7168 * 2048) == 42
    )
    assert replicas.tie_chunks("exchange", num_ranks=8, slots_per_rank=2, num_experts=8, width=100) == 1
    shape = (1, 8, 1)
    mesh = _mesh(shape)
    placement = Placement.from_eplb(np.geomspace(20, 1, E), 16, 8)
    logical, x = _logical(_config(shape)), _x()
    want = to_physical(jax.grad(lambda p: jnp.sum(moe_reference(p, x, _config(shape)) ** 2))(logical), placement)
    monkeypatch.setattr(replicas, "TIE_CHUNK_BYTES", 4096)
    # (a capacity factor of its own: a fresh program, traced with the small budget)
    config = dataclasses.replace(_config(shape), slots_per_rank=2, replica_sync=method, capacity_factor=2.5)
    params = to_physical(logical, placement, mesh=mesh, config=config)
    loss = _loss_fn(mesh, config, placement)
    grad_fn = jax.grad(lambda p, x: loss(p, x)[0])
    ties = [c for c in _collectives(grad_fn, mesh, params, x) if "tie_replicas" in c.op_name and c.group > 1]
    width = 3 * H * F
    assert any("while" in c.op_name for c in ties) and all(c.shape[-1] < width for c in ties), ties
    assert_trees_close(jax.jit(grad_fn)(params, x), want)


def test_replica_sync_lowers_to_one_ragged_exchange_on_gpu():
    """With the ragged exchange (GPU/TPU; lowered here, XLA:CPU cannot run it) ``"auto"`` takes the point-to-point
    sum: the training step has one ragged all-to-all more than with ``"all_reduce"`` (the tokens' exchanges)."""
    mesh = make_mesh(ep=8)
    placement = Placement.spread(16, 8, 4)
    texts = {}
    for method in ("auto", "all_reduce"):
        config = MoEConfig(
            hidden=H,
            ffn=F,
            experts=16,
            top_k=K,
            slots_per_rank=4,
            exchange="ragged",
            capacity=None,
            replica_sync=method,
        )
        params = to_physical(init_logical_params(jax.random.key(0), config), placement, mesh=mesh, config=config)
        loss = _loss_fn(mesh, config, placement)
        with lowering_for("gpu"):
            texts[method] = jax.jit(jax.grad(lambda p, x, loss=loss: loss(p, x)[0])).lower(params, _x()).as_text()
    assert texts["auto"].count("ragged_all_to_all") == texts["all_reduce"].count("ragged_all_to_all") + 1


def test_each_group_dispatches_counts_and_rounds_on_its_own():
    """Data 2 × ep 4, in-graph dispatch and dropless rounds: group 0 gets balanced tokens, group 1 sends every token
    to one expert. Each group balances its own counts (its rounds differ), ``counts`` is the sum of the groups'
    (what a DispatchController observes), the counter adds it, and the output is the dense one."""
    from solvers import PRESETS

    mesh = make_mesh(data=2, ep=4)
    config = MoEConfig(
        hidden=H,
        ffn=F,
        experts=E,
        top_k=1,
        slots_per_rank=4,
        dispatch="ingraph",
        dispatch_mode="quota",
        cost=PRESETS["dsv3_fp8_offline"],
        capacity_factor=1.0,
    )
    placement = _placement(4)
    logical = init_logical_params(jax.random.key(0), config)
    params = to_physical(logical, placement, mesh=mesh, config=config)
    n = 256  # 32 tokens per device: C = 8 rows per block, so group 1's 16-row blocks take two rounds
    ids = np.concatenate([np.arange(n // 2) % E, np.full(n // 2, 3)]).astype(np.int32)[:, None]
    routing = (jnp.asarray(ids), jnp.ones((n, 1), jnp.float32))
    x = jax.random.normal(jax.random.key(1), (n, H))
    pa = dispatch_tables.placement_arrays(placement)
    counter = jnp.full((4, E), 7, jnp.uint32)
    res = jax.jit(
        lambda p, x, c: moe_forward(
            p, x, mesh=mesh, placement_arrays=pa, tables=None, config=config, routing=routing, counter=c
        )
    )(params, x, counter)
    assert_close(res.out, moe_reference(logical, x, config, routing=routing))
    rounds = np.asarray(res.stats.rounds).reshape(2, 4)
    assert (rounds[0] == 1).all() and (rounds[1] > 1).all(), rounds
    per_group = np.asarray(res.stats.replica_counts).sum(-1).reshape(2, 4, E)
    np.testing.assert_array_equal(np.asarray(res.counts), per_group.sum(0))
    np.testing.assert_array_equal(np.asarray(res.counter), 7 + per_group.sum(0))
    assert per_group[1, :, 3].sum() == n // 2 and per_group[0, :, 3].sum() == n // 2 // E
    # group 1 plans, exchanges and rounds exactly as its tokens would alone on a 4-device mesh
    alone_mesh = make_mesh(ep=4, devices=jax.devices()[4:])
    alone = moe_forward(
        to_physical(logical, placement, mesh=alone_mesh, config=config),
        x[n // 2 :],
        mesh=alone_mesh,
        placement_arrays=pa,
        tables=None,
        config=config,
        routing=(routing[0][n // 2 :], routing[1][n // 2 :]),
    )
    got = np.asarray(res.stats.replica_counts).reshape(2, 4, E, -1)[1]
    np.testing.assert_array_equal(got, np.asarray(alone.stats.replica_counts))
    np.testing.assert_array_equal(rounds[1], np.asarray(alone.stats.rounds))


@pytest.mark.parametrize(
    "explicit",
    [False, pytest.param(True, marks=pytest.mark.slow)],  # fast twin of explicit axes: test_moe's explicit mesh
    ids=["auto", "explicit"],
)
def test_module_trains_and_replaces_on_a_data_ep_tensor_mesh(explicit):
    """`tempo_jax.MoE` on (2, 2, 2) with a tensor axis: parameters and Adam's moments sharded by the layout, two
    Adam steps under nnx.jit with dense gradients, `set_placement` with the optimizer keeps every sharding and the
    function, replicas stay identical."""
    mesh = make_mesh(data=2, ep=2, tensor=2, explicit=explicit)
    with jax.set_mesh(mesh):  # JAX asks user code on Explicit axes to run under the mesh
        _train_and_replace(mesh)


def _train_and_replace(mesh):
    config = _config((2, 2, 2))
    placement = Placement.from_phy2log(np.array([0, 1, 2, 3] * 2 + [4, 5, 6, 7] * 2), 2)  # replicas side by side
    moe = tempo_jax.MoE(config, placement, mesh=mesh, rngs=nnx.Rngs(params=0, dispatch=1))
    opt = nnx.Optimizer(moe, optax.adam(1e-2), wrt=nnx.Param)
    axes = layer_axes(config, mesh)

    def specs_hold():
        for path, var in nnx.to_flat_state(nnx.state((moe, opt))):
            name = next((p for p in reversed(path) if isinstance(p, str) and p in moe.param_names), None)
            if name is not None and getattr(var.get_value(), "ndim", 0) > 0:
                want = NamedSharding(mesh, tempo_jax.layer.mesh.param_spec(name, axes))
                assert var.get_value().sharding.is_equivalent_to(want, var.get_value().ndim), path
        assert moe.stats.get_value().gpu_tokens.sharding.is_equivalent_to(NamedSharding(mesh, P(("data", "ep"))), 1)

    specs_hold()
    x = jax.random.normal(jax.random.key(3), (T, H))
    logical = jax.tree.map(np.asarray, moe.logical_params())  # the dense reference on one device
    want = jax.grad(lambda p: jnp.sum(moe_reference(p, x, config) ** 2))(logical)
    got = nnx.grad(lambda m: jnp.sum(m(x) ** 2))(moe)
    assert_trees_close({k: got[k].get_value() for k in logical}, to_physical(want, placement))

    @nnx.jit
    def step(moe, opt, x):
        loss, grads = nnx.value_and_grad(lambda m: jnp.sum(m(x) ** 2))(moe)
        opt.update(moe, grads)
        return loss

    for _ in range(2):
        step(moe, opt, x)
    specs_hold()
    before = moe(x)
    new = _placement(2)  # every expert on both ranks: half the slots cross
    report = moe.set_placement(new, optimizer=opt)
    assert report.moved_slots == 8
    specs_hold()
    assert_close(moe(x), before)
    step(moe, opt, x)  # the step traced over the old placement: its replicas' exchange falls back in-graph
    for k in ("w_gate", "w_down"):
        a = np.asarray(getattr(moe, k).get_value())
        for e in range(E):
            slots = np.flatnonzero(new.phy2log == e)
            assert (a[slots] == a[slots[0]]).all()


def test_cascade_schedule_and_oewf_agree_across_meshes():
    """The central invariant across mesh shapes with CascadeEP: a launch schedule (two groups of sources) and an
    OEWF fetch, in sample-mode dispatch, give the dense output on (8,), (2, 4) and (2, 2, 2) — every EP group runs the
    schedule and the fetch inside itself."""
    from solvers import LaunchSchedule
    from tempo_jax.layer.cascade_plan import WeightFetch

    config0 = _config((1, 8, 1))
    want = moe_reference(_logical(config0), _x(), config0)
    for shape in [(1, 8, 1), (2, 4, 1), (2, 2, 2)]:
        D = shape[1]
        mesh, placement = _mesh(shape), _placement(D)
        order = tuple(reversed(range(D)))
        schedule = LaunchSchedule(num_ranks=D, order=order, groups=(order[: D // 2], order[D // 2 :]))
        donor_expert = int(placement.phy2log[placement.slots_per_rank])  # the first expert rank 1 holds
        fetch = WeightFetch(helper=0, donor=1, experts=(donor_expert,))
        config = dataclasses.replace(_config(shape), schedule=schedule, fetches=(fetch,))
        params = to_physical(_logical(config), placement, mesh=mesh, config=config)
        out = jax.jit(lambda p, x, m=mesh, c=config, pl=placement: _loss_fn(m, c, pl)(p, x)[1].out)(params, _x())
        assert_close(out, want)


def test_mesh_options_are_checked_with_the_fix():
    with pytest.raises(ValueError, match=r"batch_axes must be a tuple of mesh axis names, e\.g\. \('data',\)"):
        MoEConfig(hidden=H, ffn=F, experts=E, top_k=K, slots_per_rank=2, batch_axes="data")
    with pytest.raises(ValueError, match="must not contain the axis 'ep'"):
        MoEConfig(hidden=H, ffn=F, experts=E, top_k=K, slots_per_rank=2, batch_axes=("ep",))
    with pytest.raises(ValueError, match="fsdp_axis='ep' must be a batch axis"):
        MoEConfig(hidden=H, ffn=F, experts=E, top_k=K, slots_per_rank=2, fsdp_axis="ep")
    mesh = make_mesh(data=2, ep=2, tensor=2)
    with pytest.raises(
        ValueError,
        match=r"axis 'tp' is not in the mesh \(axes: \['data', 'ep', 'tensor'\]\); set MoEConfig.tensor_axis",
    ):
        layer_axes(MoEConfig(hidden=H, ffn=F, experts=E, top_k=K, slots_per_rank=8, tensor_axis="tp"), mesh)
    with pytest.raises(ValueError, match="F=15 does not split over the 2 devices of tensor axis 'tensor'"):
        layer_axes(MoEConfig(hidden=H, ffn=15, experts=E, top_k=K, slots_per_rank=8, tensor_axis="tensor"), mesh)
    with pytest.raises(ValueError, match=r"fsdp_axis=.data. must be one of batch_axes \[\]"):
        layer_axes(
            MoEConfig(hidden=H, ffn=F, experts=E, top_k=K, slots_per_rank=8, batch_axes=(), fsdp_axis="data"), mesh
        )
    with pytest.raises(ValueError, match="data × ep × tensor = 2 × 8 × 1 must be"):
        make_mesh(data=2, ep=8)


def test_hf_load_orbax_round_trip_and_the_tiny_lm_on_a_multi_axis_mesh(tmp_path):
    """A Hugging Face block loaded straight onto (2, 2, 2) with a tensor axis (each device reads its slots and keeps
    its F / Tp share) computes what the 1-D load computes; the module's state and Adam's moments survive an orbax
    round trip with every sharding; the tiny LM trains on a data × ep × tensor mesh."""
    import orbax.checkpoint as ocp
    from hf_reference import FAMILY_CONFIGS, hf_state

    from tempo_jax.hf import moe_from_hf
    from tempo_jax.lm import LMConfig, train

    config = {**FAMILY_CONFIGS["qwen3_moe"], "num_hidden_layers": 1}
    state = hf_state("qwen3_moe", config, seed=3)
    mesh = make_mesh(data=2, ep=2, tensor=2)
    block = moe_from_hf(config, state, mesh=mesh, tensor_axis="tensor")
    axes = layer_axes(block.config, mesh)
    for k, v in block.params.items():
        assert v.sharding.is_equivalent_to(NamedSharding(mesh, tempo_jax.layer.mesh.param_spec(k, axes)), v.ndim), k
    flat = moe_from_hf(config, state, mesh=make_mesh(ep=8))
    x = jax.random.normal(jax.random.key(5), (32, block.config.hidden))

    def run(b, m):
        pa, tables = dispatch_tables.placement_arrays(b.placement), dispatch_tables.uniform(b.placement)
        return moe_forward(b.params, x, mesh=m, placement_arrays=pa, tables=tables, config=b.config).out

    assert_close(run(block, mesh), run(flat, make_mesh(ep=8)))
    with jax.set_mesh(mesh):
        moe = tempo_jax.MoE(block.config, block.placement, mesh=mesh, rngs=nnx.Rngs(0), params=block.params)
        opt = nnx.Optimizer(moe, optax.adam(1e-3), wrt=nnx.Param)
    nnx.grad(lambda m: jnp.sum(m(x) ** 2))(moe)
    before = np.asarray(moe(x))
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(tmp_path / "state", nnx.state((moe, opt)))
    checkpointer.wait_until_finished()
    target = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), nnx.state((moe, opt)))
    restored = checkpointer.restore(tmp_path / "state", target)
    w = restored[0]["w_down"].get_value()
    assert w.sharding.spec == P("ep", "tensor") and {s.data.shape[1] for s in w.addressable_shards} == {
        block.config.ffn // 2
    }
    nnx.update((moe, opt), restored)
    assert_close(moe(x), before)
    lm = LMConfig(dim=32, layers=1, heads=2, seq_len=16, batch=4, experts=8, ffn=32, slots_per_rank=4)
    result = train(lm, steps=2, mesh=make_mesh(data=2, ep=2, tensor=2))
    assert np.isfinite(result.losses).all()
    assert result.model.blocks[0].moe.w_gate.get_value().sharding.spec == P("ep", None, "tensor")


def test_an_eager_call_keeps_the_inputs_sharding():
    """Tokens replicated over ``data`` (placed ``P("ep")``): the default batch axes follow them (every data replica
    computes its ``ep`` shard), and the output comes back as ``x`` was placed; tokens placed over data × ep come back
    over data × ep."""
    mesh, config = _mesh((2, 4, 1)), _config((2, 4, 1))
    placement = _placement(4)
    params = to_physical(_logical(config), placement, mesh=mesh, config=config)
    pa, tables = dispatch_tables.placement_arrays(placement), dispatch_tables.uniform(placement)
    for spec, shards in ((P("ep"), 4), (P(("data", "ep")), 8)):
        x = jax.device_put(_x(), NamedSharding(mesh, spec))
        res = moe_forward(params, x, mesh=mesh, placement_arrays=pa, tables=tables, config=config)
        assert res.out.sharding.is_equivalent_to(x.sharding, 2) and res.stats.gpu_tokens.shape == (shards,)
        assert_close(res.out, moe_reference(_logical(config), _x(), config))


@pytest.mark.parametrize(
    "shape",
    # (2, 2, 2) has every axis (data, ep, tensor): the fast twin of the slow meshes, which check the same properties
    [pytest.param((2, 4, 1), marks=pytest.mark.slow), pytest.param((1, 4, 2), marks=pytest.mark.slow), (2, 2, 2)],
    ids=lambda s: "x".join(map(str, s)),
)
def test_dynamic_copies_on_multi_axis_meshes(shape):
    """Dynamic copies (issue 52) on data × ep × tensor meshes: half of the pairs go to expert 3, each EP group copies it
    into its ranks' spare slots (the weights move over the ep axis only, each tensor rank its F share), and the output
    and gradients under jit are the dense reference's, with copies made, with dynamic slots but a link too slow to copy
    (the weight exchange skipped) and (slow meshes) without dynamic slots; copies lower the busiest rank's rows; over a
    data axis the compiled forward with copies sums only counts and losses (no token, no weight)."""
    from solvers import CopyCost, CostModel

    data, ep, _ = shape
    S = E // ep + 1  # expert 3 has one home: rank 0 of 2 (S 5), rank 1 of 4 (S 3)
    mesh, placement = _mesh(shape), Placement.spread(E, ep, S)
    linear = CostModel(a=0.0, b=0.0, c=0.0, beta=1.0)
    base = _config(shape, slots_per_rank=S, dispatch="ingraph", dispatch_mode="quota", cost=linear)
    rng = np.random.default_rng(0)
    ids = np.where(rng.random((T, K)) < 0.5, 3, rng.integers(0, E, (T, K)))
    ids[:, 1] = np.where(ids[:, 1] == ids[:, 0], (ids[:, 0] + 1) % E, ids[:, 1])
    routing = (jnp.asarray(ids, jnp.int32), jax.nn.softmax(jax.random.normal(jax.random.key(3), (T, K)), -1))
    logical, x = _logical(base), _x()
    want = moe_reference(logical, x, base, routing=routing)
    want_grads = jax.grad(lambda p: jnp.sum(moe_reference(p, x, base, routing=routing) ** 2))(logical)
    params = to_physical(logical, placement, mesh=mesh, config=base)
    pa = dispatch_tables.placement_arrays(placement)
    busiest = {}
    # no dynamic slots (the slow meshes only: a too-slow link leaves the same busiest rank, tests/test_copies.py has
    # the guard on the 1-D mesh); a link too slow to copy; copies made
    slow = shape != (2, 2, 2)
    variants = ((0, None), (1, 1e-6), (1, 1e6)) if slow else ((1, 1e-6), (1, 1e6))
    for k, link in variants:
        config = dataclasses.replace(base, dynamic_slots=k, copy_cost=CopyCost(1e3, link) if k else None)

        def loss(p, x, c=config):
            res = moe_forward(p, x, mesh=mesh, placement_arrays=pa, tables=None, config=c, routing=routing)
            return jnp.sum(res.out**2), res

        (_, res), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params, x)
        assert_close(res.out, want)
        assert_trees_close(grads, to_physical(want_grads, placement))
        rows = np.asarray(res.stats.gpu_tokens).reshape(data, ep)
        assert (rows.sum(axis=1) == T * K // data).all()  # every pair once, in its own group
        busiest[link] = rows.max()
        if link != 1e6:
            continue  # without copies, test_no_token_crosses_a_batch_axis_and_flops_match_the_1d_mesh's program
        # no token and no copied weight crosses a batch axis: over data only counts and losses are summed
        fwd = jax.jit(lambda p, x, c=config: loss(p, x, c)[0]).lower(params, x).compile()
        colls = [c for c in program_collectives(fwd.as_text(), mesh) if c.group > 1]
        over_data = [c for c in colls if "data" in c.axes]
        assert all(c.kind == "all-reduce" and c.bytes <= 4 * (2 * E + 4) for c in over_data), over_data
    assert busiest[1e6] < busiest[1e-6] == busiest.get(None, busiest[1e-6]), busiest
