"""Expert parallelism in memory and communication (issue 35): each rank holds only its own slots of the expert
weights and of Adam's moments; replicas stay bit-identical through training (their gradients are summed within
replica groups, never all-reduced over every expert); a placement change migrates exactly the slots that change
and keeps the layer's function; the optimizer's moments move with their weights."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from compiles import count_compiles
from flax import nnx
from jax.sharding import PartitionSpec as P
from numeric import assert_close, assert_trees_close

import tempo_jax
from solvers import LaunchSchedule, Placement
from tempo_jax.layer import (
    MoEConfig,
    init_logical_params,
    init_params,
    make_ep_mesh,
    moe_forward,
    moe_reference,
    plan_migration,
    to_logical,
    to_physical,
)
from tempo_jax.layer import tables as dispatch_tables
from tempo_jax.layer.cascade_plan import WeightFetch
from tempo_jax.layer.params import EXPERT_KEYS
from tempo_jax.layer.replicas import migrate

D, E, H, F = 8, 12, 32, 16
TOKENS = D * 16


@pytest.fixture(scope="module")
def mesh():
    return make_ep_mesh(D)


def _placement(seed: int) -> Placement:
    return Placement.from_eplb(np.random.default_rng(seed).random(E) * 100 + 1, 2 * D, D)  # 4 experts replicated


def _config(**kw) -> MoEConfig:
    return MoEConfig(hidden=H, ffn=F, experts=E, top_k=2, slots_per_rank=2, **kw)


def _x(seed: int = 2):
    return jax.random.normal(jax.random.key(seed), (TOKENS, H))


def _identical_replicas(array, placement: Placement) -> bool:
    a = np.asarray(array)
    return all(
        (a[np.flatnonzero(placement.phy2log == e)] == a[np.flatnonzero(placement.phy2log == e)[0]]).all()
        for e in range(placement.num_experts)
    )


# ------------------------------------------------------------------------------------------------ storage
def test_each_rank_holds_only_its_slots_of_weights_and_adam_moments(mesh):
    placement = _placement(0)
    moe = tempo_jax.MoE(_config(), placement, mesh=mesh, rngs=nnx.Rngs(params=0, dispatch=1))
    opt = nnx.Optimizer(moe, optax.adam(1e-2), wrt=nnx.Param)
    seen = 0
    for path, var in nnx.to_flat_state(nnx.state((moe, opt))):
        name, value = path[-1], var.get_value()
        if name in EXPERT_KEYS:
            seen += 1
            assert value.shape[0] == D * 2 and value.sharding.spec == P("ep"), path
            # one rank's shard is its S = 2 slots: the bytes a device holds are S × slot bytes
            assert {s.data.shape[0] for s in value.addressable_shards} == {2}, path
        elif name == "router":
            assert value.sharding.spec == P(), path
    assert seen == 3 * 3  # w_gate, w_up, w_down and their two Adam moments


def test_init_params_and_to_physical_lay_out_identical_replicas(mesh):
    placement = _placement(1)
    logical = init_logical_params(jax.random.key(3), _config())
    params = init_params(jax.random.key(3), _config(), placement, mesh=mesh)
    for k in EXPERT_KEYS[:3]:
        assert params[k].sharding.spec == P("ep") and _identical_replicas(params[k], placement)
        # the sharded init is another program than the eager draw: equal to the dtype's tolerance
        assert_close(params[k], np.asarray(logical[k])[placement.phy2log])
    back = to_logical(params, placement)  # data movement only: exact
    for k in params:
        np.testing.assert_array_equal(np.asarray(to_physical(back, placement)[k]), np.asarray(params[k]))
    with pytest.raises(ValueError, match=r"logical layout \[E=12, \.\.\.\]; the layer takes the physical layout"):
        moe_forward(
            logical,
            _x(),
            mesh=mesh,
            placement_arrays=dispatch_tables.placement_arrays(placement),
            tables=dispatch_tables.uniform(placement),
            config=_config(),
        )


# ------------------------------------------------------------------------------------------------ training
def test_replicas_stay_bit_identical_over_20_adam_steps_with_dense_gradients(mesh):
    """The first step's gradients equal the dense reference's logical gradients laid out per slot (each replica
    gets its expert's whole gradient: the replica group's sum); after 20 Adam steps under nnx.jit every replica of
    every expert is bit-identical to its siblings, weights and moments."""
    placement = _placement(2)
    moe = tempo_jax.MoE(_config(), placement, mesh=mesh, rngs=nnx.Rngs(params=0, dispatch=1))
    x = _x(4)
    logical = moe.logical_params()
    want = jax.grad(lambda p: jnp.sum(moe_reference(p, x, moe.config) ** 2))(logical)
    got = nnx.grad(lambda m: jnp.sum(m(x) ** 2))(moe)
    assert_trees_close({k: got[k].get_value() for k in logical}, to_physical(want, placement))
    opt = nnx.Optimizer(moe, optax.adam(1e-2), wrt=nnx.Param)

    @nnx.jit
    def step(m, o, x):
        loss, grads = nnx.value_and_grad(lambda m: jnp.sum(m(x) ** 2))(m)
        o.update(m, grads)
        return loss

    losses = [float(step(moe, opt, x)) for _ in range(20)]
    assert losses[-1] < losses[0]
    for path, var in nnx.to_flat_state(nnx.state((moe, opt))):
        if path[-1] in EXPERT_KEYS:
            assert _identical_replicas(var.get_value(), placement), path


def _training_hlo(moe) -> str:
    opt = nnx.Optimizer(moe, optax.adam(1e-3), wrt=nnx.Param)
    graph, state = nnx.split((moe, opt))
    x = _x()

    def step(state, x):
        m, o = nnx.merge(graph, state)
        loss, grads = nnx.value_and_grad(lambda m: jnp.sum(m(x) ** 2))(m)
        o.update(m, grads)
        return loss, nnx.state((m, o))

    return jax.jit(step).lower(state, x).compile().as_text()


def all_reduce_shapes(hlo: str) -> list[tuple[int, ...]]:
    """Every array shape an all-reduce of the compiled program reduces (the tuple of a combined one, each)."""
    shapes = []
    for line in hlo.splitlines():
        m = re.match(r"\s*(?:ROOT )?%\S+ = (.*?) all-reduce(?:-start)?\(", line)
        if m:
            shapes += [tuple(int(d) for d in dims.split(",") if d) for dims in re.findall(r"\w+\[([\d,]*)\]", m[1])]
    return shapes


@pytest.mark.parametrize("redundant", [True, pytest.param(False, marks=pytest.mark.slow)])  # fast twin: True
def test_no_expert_sized_all_reduce_in_the_compiled_training_step(mesh, redundant):
    """The training step's all-reduces: the router's data-parallel gradient [H, E], scalars and [E] statistics,
    and — with redundant slots only — the replica groups' sum [R, 3·H·F] (the three arrays' rows side by side) with
    R = P − E = 4 < E rows. No expert weight's gradient of E (or P) rows is ever all-reduced; without redundancy no
    expert-shaped all-reduce at all."""
    placement = _placement(3) if redundant else Placement.spread(D, D, 1)  # P = E = 8: one expert per rank
    cfg = _config() if redundant else dataclasses.replace(_config(), experts=D, slots_per_rank=1)
    moe = tempo_jax.MoE(cfg, placement, mesh=mesh, rngs=nnx.Rngs(params=0, dispatch=1))
    shapes = all_reduce_shapes(_training_hlo(moe))
    assert (H, cfg.experts) in shapes  # the router's gradient: data-parallel, replicated
    expert_shaped = [s for s in shapes if s[-2:] in ((H, F), (F, H)) or s[-1:] == (3 * H * F,)]
    if redundant:
        assert expert_shaped and all(s[0] == 2 * D - E for s in expert_shaped), expert_shaped
    else:
        assert not expert_shaped, expert_shaped
    assert not [s for s in shapes if len(s) >= 3 and s[0] >= cfg.experts], shapes


# ------------------------------------------------------------------------------------------------ re-placement
def test_set_placement_moves_only_changed_slots_and_keeps_the_function(mesh):
    old, new = _placement(4), _placement(5)
    moe = tempo_jax.MoE(_config(dispatch_mode="quota"), old, mesh=mesh, rngs=nnx.Rngs(params=0, dispatch=1))
    opt = nnx.Optimizer(moe, optax.adam(1e-2), wrt=nnx.Param)

    @nnx.jit
    def step(m, o, x):
        _, grads = nnx.value_and_grad(lambda m: jnp.sum(m(x) ** 2))(m)
        o.update(m, grads)

    x = _x(6)
    step(moe, opt, x)  # non-zero moments to move
    step(moe, opt, x)  # (the optimizer's step counter now lives on the mesh too: the program for what follows)
    before = moe(x)
    logical = moe.logical_params()
    mu_before = {k: to_logical({k: opt.opt_state[0].mu[k].get_value()}, old)[k] for k in EXPERT_KEYS[:3]}
    plan = plan_migration(old, new)
    report = moe.set_placement(new, optimizer=opt)
    # exactly the slots whose expert its rank did not hold cross ranks; bytes = rows sent × bytes per slot
    o2, n2 = old.phy2log.reshape(D, 2), new.phy2log.reshape(D, 2)
    crossing = sum(int(not (o2[d] == n2[d, j]).any()) for d in range(D) for j in range(2))
    assert report.moved_slots == plan.moved == crossing > 0
    slot = 3 * H * F * 4 * 3  # w_gate, w_up, w_down: float32 weights and two float32 moments
    assert report.slot_bytes == slot and report.bytes_moved == plan.transfers * slot
    assert report.moved_slots + report.local_slots + report.kept_slots == D * 2
    assert moe.placement is new
    assert_close(moe(x), before)  # the same function over the new layout
    for k, v in to_logical(moe.params(), new).items():
        np.testing.assert_array_equal(np.asarray(v), np.asarray(logical[k]))  # weights moved bit for bit
    for k in EXPERT_KEYS[:3]:
        mu = opt.opt_state[0].mu[k].get_value()
        assert mu.sharding.spec == P("ep") and _identical_replicas(mu, new)
        np.testing.assert_array_equal(np.asarray(to_logical({k: mu}, new)[k]), np.asarray(mu_before[k]))
    with count_compiles() as n:
        step(moe, opt, x)  # training continues on the new layout, replicas identical …
    assert n[0] == (0 if new.log2phy.shape == old.log2phy.shape else 1)  # … in the same compiled step
    assert _identical_replicas(moe.w_up.get_value(), new)


def test_functional_migration_and_its_plan_on_edge_cases(mesh):
    old = _placement(6)
    same = plan_migration(old, old)
    assert (same.moved, same.local, same.kept, same.block) == (0, 0, 16, 0)
    swapped = Placement.from_phy2log(old.phy2log.reshape(D, 2)[:, ::-1].reshape(-1), D, num_experts=E)
    local = plan_migration(old, swapped)  # each rank keeps its experts in other slots: nothing crosses
    assert local.moved == 0 and local.local + local.kept == 16
    params = init_params(jax.random.key(0), _config(), old, mesh=mesh)
    new = _placement(7)
    arrays, _, _ = migrate([params[k] for k in EXPERT_KEYS[:3]], plan_migration(old, new), mesh=mesh, donate=False)
    for k, a in zip(EXPERT_KEYS[:3], arrays, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(to_logical(params, old)[k])[new.phy2log])
    with pytest.raises(ValueError, match="keeps D, S and E"):
        plan_migration(old, Placement.spread(E, 4, 4))


# ------------------------------------------------------------------------------------------------ invariant
@pytest.mark.parametrize("path", ["sync", "rounds", "cascade"])
def test_output_does_not_depend_on_the_placement(mesh, path):
    """The same logical layer laid out over two placements: equal outputs under jit, synchronously, in dropless
    rounds (every pair to one rank) and under a CascadeEP schedule with an OEWF fetch."""
    logical = init_logical_params(jax.random.key(9), _config())
    x = _x(10)
    outs = []
    for seed in (11, 12):
        placement = _placement(seed)
        cfg = _config(dispatch_mode="quota")
        routing = None
        if path == "rounds":
            cfg = dataclasses.replace(cfg, capacity="auto")
            ids = np.tile(np.asarray(_placement(11).phy2log[:2]), (TOKENS, 1)).astype(np.int32)  # one rank's experts
            routing = (jnp.asarray(ids), jnp.full(ids.shape, 0.5, jnp.float32))
        if path == "cascade":
            donor = 5
            cfg = dataclasses.replace(
                cfg,
                schedule=LaunchSchedule.stragglers(D, late=(donor, 7)),
                fetches=(WeightFetch(helper=1, donor=donor, experts=(int(placement.phy2log[donor * 2]),)),),
            )
        params = to_physical(logical, placement, mesh=mesh)
        pa = dispatch_tables.placement_arrays(placement)
        run = jax.jit(
            lambda p, x, pa=pa, cfg=cfg, placement=placement, routing=routing: moe_forward(
                p,
                x,
                mesh=mesh,
                placement_arrays=pa,
                tables=dispatch_tables.uniform(placement),
                config=cfg,
                routing=routing,
            )
        )
        res = run(params, x)
        if path == "rounds":
            assert int(res.stats.rounds.max()) > 1
        outs.append(res.out)
    assert_close(outs[0], outs[1])


def test_tiny_lm_output_and_gradients_do_not_depend_on_the_placement(mesh):
    from tempo_jax.lm.model import LMConfig, TinyMoELM

    cfg = LMConfig(layers=1, experts=E, slots_per_rank=2, dispatch_mode="quota")
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 256, (4, 32)), jnp.int32)
    a = TinyMoELM(cfg, mesh=mesh, rngs=nnx.Rngs(params=0, dispatch=1), placements=[_placement(13)])
    b = TinyMoELM(cfg, mesh=mesh, rngs=nnx.Rngs(params=0, dispatch=1), placements=[_placement(14)])
    b.blocks[0].moe.set_placement(_placement(13))  # the same weights, moved to a's layout … and back
    b.blocks[0].moe.set_placement(_placement(14))
    loss = lambda m: jnp.mean(m(tokens) ** 2)  # noqa: E731
    la, ga = nnx.value_and_grad(loss)(a)
    lb, gb = nnx.value_and_grad(loss)(b)
    assert_close(la, lb)
    ga_moe, gb_moe = ga["blocks"][0]["moe"], gb["blocks"][0]["moe"]
    assert_trees_close(
        to_logical({k: ga_moe[k].get_value() for k in EXPERT_KEYS[:3]}, _placement(13)),
        to_logical({k: gb_moe[k].get_value() for k in EXPERT_KEYS[:3]}, _placement(14)),
    )
