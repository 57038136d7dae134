"""CascadeEP inside the shard_map layer (tempo_jax.layer.cascade_exec) on 8 fake CPU devices: the central invariant
for launch schedules and OEWF, the dependence structure of the launch groups, no drops."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from ep_case import D, E, small_ep_case  # E = 12 not divisible by the 8 ranks
from numeric import f32_close

from solvers import LaunchSchedule, OEWFState, ThroughputCurve, oewf_at_dispatch, oewf_plan
from tempo_jax.layer import MoEConfig, moe_forward, moe_reference, to_logical
from tempo_jax.layer import tables as dispatch_tables
from tempo_jax.layer.cascade_plan import WeightFetch, fetch_bytes, fetches_from_plan, pair_tokens

TOKENS = D * 16


@pytest.fixture(scope="module")
def setup():
    placement, config, params, mesh = small_ep_case(0)  # 2 slots per rank, 4 experts replicated
    # A shared offset skews the router towards a few experts (skewed routing).
    x = jax.random.normal(jax.random.key(1), (TOKENS, 32)) + 1.5 * jax.random.normal(jax.random.key(2), (1, 32))
    return placement, config, params, x, mesh


def random_schedule(seed: int) -> LaunchSchedule:
    """A random arrival order cut into random consecutive launch groups."""
    rng = np.random.default_rng(seed)
    order = tuple(int(r) for r in rng.permutation(D))
    cuts = sorted(rng.choice(np.arange(1, D), size=rng.integers(0, D), replace=False).tolist())
    groups = tuple(order[a:b] for a, b in zip([0, *cuts], [*cuts, D], strict=True))
    return LaunchSchedule(num_ranks=D, order=order, groups=groups)


def _run(setup, config, tables=None, params=None):
    placement, _, p, x, mesh = setup
    pa = dispatch_tables.placement_arrays(placement)
    tables = tables or dispatch_tables.perturbed(dispatch_tables.uniform(placement), seed=3)
    return moe_forward(
        params or p, x, mesh=mesh, placement_arrays=pa, tables=tables, config=config, key=jax.random.key(5)
    )


# ----------------------------------------------------------------------------------------------- invariant
@pytest.mark.parametrize(
    ("seed", "mode"),
    [
        (0, "sample"),
        pytest.param(0, "quota", marks=pytest.mark.slow),
        pytest.param(1, "sample", marks=pytest.mark.slow),
        pytest.param(1, "quota", marks=pytest.mark.slow),
    ],
)
def test_launch_schedules_compute_the_synchronous_layer(setup, mode, seed):
    placement, config, params, x, _ = setup
    sync_cfg = dataclasses.replace(config, dispatch_mode=mode)
    cas_cfg = dataclasses.replace(sync_cfg, schedule=random_schedule(seed))
    sync, cas = _run(setup, sync_cfg), _run(setup, cas_cfg)
    f32_close(cas.out, sync.out)
    f32_close(cas.out, moe_reference(to_logical(params, placement), x, config))
    np.testing.assert_array_equal(cas.counts, sync.counts)  # the same dispatch decisions
    np.testing.assert_array_equal(cas.stats.gpu_tokens, sync.stats.gpu_tokens)
    assert int(cas.stats.drops.sum()) == 0 and int(cas.stats.gpu_tokens.sum()) == TOKENS * config.top_k


def test_gradients_match_the_synchronous_layer(setup):
    placement, config, params, x, mesh = setup
    pa, tables = dispatch_tables.placement_arrays(placement), dispatch_tables.uniform(placement)

    def loss(p, x, cfg):
        return jnp.sum(moe_forward(p, x, mesh=mesh, placement_arrays=pa, tables=tables, config=cfg).out ** 2)

    cas_cfg = dataclasses.replace(config, schedule=random_schedule(7))
    g_sync = jax.grad(loss, argnums=(0, 1))(params, x, config)
    g_cas = jax.grad(loss, argnums=(0, 1))(params, x, cas_cfg)
    for a, b in zip(jax.tree.leaves(g_cas), jax.tree.leaves(g_sync), strict=True):
        f32_close(a, b, atol=1e-4, rtol=1e-4)


# ----------------------------------------------------------------------------------------------- dependence
def _shard_map_body(jaxpr):
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "shard_map":
            return eqn.params["jaxpr"]
        for v in eqn.params.values():
            sub = getattr(v, "jaxpr", None)
            if sub is not None:
                found = _shard_map_body(sub if hasattr(sub, "eqns") else sub.jaxpr)
                if found is not None:
                    return found
    return None


def _ancestors(body, roots):
    """Every eqn some eqn of ``roots`` transitively reads from."""
    producer = {v: e for e in body.eqns for v in e.outvars}
    seen, todo = set(), list(roots)
    while todo:
        e = todo.pop()
        for v in e.invars:
            p = None if type(v).__name__ == "Literal" else producer.get(v)
            if p is not None and id(p) not in seen:
                seen.add(id(p))
                todo.append(p)
    return [e for e in body.eqns if id(e) in seen]


def test_each_launch_groups_gemm_depends_only_on_its_own_shifts(setup):
    placement, config, params, x, mesh = setup
    sched = LaunchSchedule(num_ranks=D, order=(3, 1, 0, 7, 2, 5, 4, 6), groups=((3, 1), (0, 7, 2), (5,), (4, 6)))
    cfg = dataclasses.replace(config, schedule=sched)
    pa, tables = dispatch_tables.placement_arrays(placement), dispatch_tables.uniform(placement)
    jaxpr = jax.make_jaxpr(lambda p, x: moe_forward(p, x, mesh=mesh, placement_arrays=pa, tables=tables, config=cfg))(
        params, x
    )
    body = _shard_map_body(jaxpr.jaxpr)
    scope = lambda e: str(e.source_info.name_stack)  # noqa: E731
    for g in range(len(sched.groups)):
        gemms = [e for e in body.eqns if e.primitive.name == "custom_vjp_call" and f"cascade_group_{g}" in scope(e)]
        assert len(gemms) == 1  # the group's expert FFN: gate, up and down in one loop on CPU (`ffn_chunked`)
        collectives = [e for e in _ancestors(body, gemms) if e.primitive.name == "ppermute"]
        shifts = {re.search(r"cascade_(shift|return)_(\d+)_(\d+)", scope(e)).groups() for e in collectives}
        assert shifts == {("shift", str(g), str(k)) for k in range(1, D)}, (g, sorted(shifts))


# ----------------------------------------------------------------------------------------------- OEWF
def test_oewf_fetches_keep_the_output_and_send_gradients_once(setup):
    placement, config, params, x, mesh = setup
    S = placement.slots_per_rank
    held = lambda d: tuple(sorted(set(placement.phy2log[d * S : (d + 1) * S].tolist())))  # noqa: E731
    fetches = (WeightFetch(0, 5, held(5)), WeightFetch(2, 5, held(5)[:1]), WeightFetch(1, 6, held(6)))
    sync_cfg = dataclasses.replace(config, dispatch_mode="quota")
    sync = _run(setup, sync_cfg)
    for schedule in ("sync", random_schedule(4)):
        oe = _run(setup, dataclasses.replace(sync_cfg, schedule=schedule, fetches=fetches))
        f32_close(oe.out, sync.out)
        tok, base = np.asarray(oe.stats.gpu_tokens), np.asarray(sync.stats.gpu_tokens)
        assert tok.sum() == base.sum() and int(oe.stats.drops.sum()) == 0  # every pair computed once
        assert tok[5] < base[5] and tok[0] > base[0]  # the donor computes less, the helper more
    pa, tables = dispatch_tables.placement_arrays(placement), dispatch_tables.uniform(placement)

    def loss(p, c):
        return jnp.sum(moe_forward(p, x, mesh=mesh, placement_arrays=pa, tables=tables, config=c).out ** 2)

    g_sync = jax.grad(loss)(params, sync_cfg)
    g_oe = jax.grad(loss)(params, dataclasses.replace(sync_cfg, fetches=fetches))
    for k in g_sync:
        f32_close(g_oe[k], g_sync[k], atol=1e-4, rtol=1e-4)
    assert fetch_bytes(fetches, 32, 16, jnp.float32) == (len(held(5)) + 1 + len(held(6))) * 3 * 32 * 16 * 4


def test_planned_pipeline_from_the_layers_own_routing(setup):
    """pair_tokens → LaunchSchedule + oewf_at_dispatch → fetches_from_plan → the layer: Sync's output."""
    placement, config, *_ = setup
    cfg = dataclasses.replace(config, dispatch_mode="quota")
    first = _run(setup, cfg)
    pairs = pair_tokens(first.stats.replica_counts, placement)
    assert pairs.shape == (D, D, E) and pairs.sum() == TOKENS * config.top_k
    np.testing.assert_array_equal(pairs.sum(axis=(0, 2)), np.asarray(first.stats.gpu_tokens))
    np.testing.assert_array_equal(pairs.sum(axis=(1, 2)), np.full(D, TOKENS // D * config.top_k))
    arrival = np.array([10.0, 12, 11, 13, 14, 200, 220, 15])  # ranks 5 and 6 straggle
    curve = ThroughputCurve(tokens=(1, 1000), time_us=(1.0, 1000.0))  # one token per µs
    plan = oewf_at_dispatch(
        arrival,
        arrival,
        np.zeros(D),
        pairs.sum(axis=(0, 2)),
        pairs,
        expert_bytes=1.0,
        budget_bytes=8.0,
        fetch_bytes_per_us=1.0,
        curve=curve,
    )
    fetches = fetches_from_plan(plan)
    assert fetches and {f.donor for f in fetches} <= {5, 6}
    schedule = LaunchSchedule.from_arrivals(arrival, pairs.sum(axis=2), mode="stream", threshold=pairs.sum() / D)
    out = _run(setup, dataclasses.replace(cfg, schedule=schedule, fetches=fetches))
    f32_close(out.out, first.out)
    assert int(out.stats.drops.sum()) == 0
    # The static planner's plan converts the same way.
    state = OEWFState(
        attention_us=np.where(arrival > 100, arrival, 0.0),
        dispatch_us=np.zeros(D),
        tokens=pairs.sum(axis=(0, 2)),
        pair_tokens=pairs,
        expert_bytes=np.ones(E),
        budget_bytes=8.0,
        fetch_bytes_per_us=1.0,
    )
    static = oewf_plan(state, curve=curve)
    assert static.accepted
    assert [(f.helper, f.donor) for f in fetches_from_plan(static)] == [(r.helper, r.donor) for r in static.accepted]
    with pytest.raises(ValueError, match="replica_counts has shape"):
        pair_tokens(np.zeros((D, E + 1, 2)), placement)


def test_bad_schedules_and_fetches_are_rejected(setup):
    placement, config, params, x, mesh = setup
    with pytest.raises(ValueError, match="schedule"):
        MoEConfig(hidden=4, ffn=4, experts=4, top_k=1, slots_per_rank=1, schedule="async")
    with pytest.raises(ValueError, match="for 4 ranks"):
        _run(setup, dataclasses.replace(config, schedule=LaunchSchedule.sync(4)))
    S = placement.slots_per_rank
    absent = next(e for e in range(E) if e not in placement.phy2log[5 * S : 6 * S])
    with pytest.raises(ValueError, match="holds no replica"):
        _run(setup, dataclasses.replace(config, fetches=(WeightFetch(0, 5, (absent,)),)))
    with pytest.raises(ValueError, match="distinct"):
        WeightFetch(3, 3, (1,))


def test_the_layer_executes_the_schedule_the_simulator_prices(setup):
    """launch='layer' (`tempo_jax.sim.cascade`) prices one partition shared by every rank and OEWF's moves decided
    on the predictions; the layer built from the same predictions executes exactly that: the launch groups read
    back from its program (the sources of each group's ppermutes) are the simulator's kernels on every rank, and
    the tokens each rank computes (its own record) move by the simulator's reassignments."""
    from tempo_jax.sim.cascade import prefill_costs
    from tempo_jax.sim.cascade.reference_timeline import LayerInputs, layer_timeline

    placement, config, params, x, mesh = setup
    cfg = dataclasses.replace(config, dispatch_mode="quota")
    first = _run(setup, cfg)
    pairs = pair_tokens(first.stats.replica_counts, placement).astype(np.float64)
    costs = prefill_costs()
    # Scale the routed pairs to prefill sizes (the schedule and OEWF depend on token counts against θ and F(N));
    # rank 5 straggles, and the others finish attention at staggered times.
    scale = costs.threshold / (2.5 * pairs.sum() / D / D)  # about three sources' mean tokens reach θ
    att = np.array([100.0, 140, 180, 220, 260, 3000, 300, 340])
    disp = costs.exchange_us((scale * pairs.sum(axis=2) * (1 - np.eye(D))).sum(axis=1), costs.dispatch_bytes_per_pair)
    inp = LayerInputs(attention_us=att, dispatch_us=disp, pairs=scale * pairs, oewf=True)
    sim = layer_timeline(inp, costs, "cascade", links="paper", launch="layer")
    ready = att + disp
    schedule = LaunchSchedule.from_arrivals(ready, scale * pairs.sum(axis=2), threshold=float(costs.threshold))
    plan = oewf_at_dispatch(ready, att, disp, scale * pairs.sum(axis=(0, 2)), scale * pairs, **costs.oewf_budget())
    fetches = fetches_from_plan(plan)
    assert len(schedule.groups) > 1 and fetches  # the case has both to check
    run_cfg = dataclasses.replace(cfg, schedule=schedule, fetches=fetches)
    # Step 1: the launch groups, read back from the program: group g's sources are its ppermutes' senders.
    pa, tables = dispatch_tables.placement_arrays(placement), dispatch_tables.uniform(placement)
    jaxpr = jax.make_jaxpr(
        lambda p, x: moe_forward(p, x, mesh=mesh, placement_arrays=pa, tables=tables, config=run_cfg)
    )(params, x)
    body = _shard_map_body(jaxpr.jaxpr)
    scope = lambda e: str(e.source_info.name_stack)  # noqa: E731
    groups = []
    for g in range(len(schedule.groups)):
        perms = [
            e.params["perm"] for e in body.eqns if e.primitive.name == "ppermute" and f"cascade_shift_{g}_" in scope(e)
        ]
        groups.append(tuple(sorted({s for perm in perms for s, _ in perm})))
    helpers = {
        tuple(e.params["perm"]) for e in body.eqns if e.primitive.name == "ppermute" and "oewf_fetch_" in scope(e)
    }
    assert helpers == {((f.donor, f.helper),) for f in fetches}
    # Step 2: the simulator's kernels on every rank follow those groups (a group without tokens there launches none).
    after = pairs.copy()  # the pairs each destination computes once the moves are made
    for f in fetches:
        after[f.helper, f.donor, list(f.experts)] = 0.0
    for d in range(D):
        want = [grp for grp in groups if after[list(grp), d].sum() > 0]
        assert [tuple(sorted(k.sources)) for k in sim.kernels[d]] == want, d
    assert max(len(k) for k in sim.kernels) > 1
    assert [(r.helper, r.donor, tuple(r.experts)) for r in sim.accepted] == [
        (f.helper, f.donor, f.experts) for f in fetches
    ]
    # Step 3: the layer's own record: each reassignment moves the helper's pairs of its experts off the donor.
    out = _run(setup, run_cfg)
    moved = np.zeros(D)
    for f in fetches:
        n = pairs[f.helper, f.donor, list(f.experts)].sum()
        moved[f.helper] += n
        moved[f.donor] -= n
    np.testing.assert_array_equal(np.asarray(out.stats.gpu_tokens), pairs.sum(axis=(0, 2)) + moved)
    f32_close(out.out, first.out)
