"""Dynamic copies (issue 52, `solvers.copies`): which experts to copy into spare slots per batch, priced with the
copy's own time, against the exact MILP that chooses copies and splits together."""

import numpy as np
import pytest
from copy_case import random_instance

from solvers import CostModel
from solvers.copies import CopyCost, copies_milp, plan_copies
from solvers.relief import relief

LINEAR = CostModel(a=0.0, b=0.0, c=0.0, beta=1.0)
MIXED = CostModel(a=10.0, b=2.0, c=0.0, beta=0.1)  # n* = 20 tokens per expert
BYTES = 3 * 256 * 128 * 2  # one expert of H 256, F 128 in bf16: 3.9 µs at 50 GB/s


def _instance(seed: int, D: int = 4, E: int = 8, spr: int = 3, tokens: int = 64):
    """`copy_case.random_instance` at this file's sizes."""
    return random_instance(seed, D, E, spr, tokens)


def _check_plan(plan, n, ranks, D, k, cost, cc):
    """Every token placed once, on a holder; copies only where the rank holds no fixed replica, at most k per rank,
    from a fixed holder; the makespan is what the loads give, never above relief's."""
    E = n.shape[0]
    on = np.zeros((E, D))
    ok = ranks >= 0
    np.add.at(on, (np.nonzero(ok)[0], ranks[ok]), plan.x[ok])
    assert (plan.x >= 0).all() and (plan.x[~ok] == 0).all() and (plan.x == np.round(plan.x)).all()
    made = plan.copy_expert >= 0
    assert (made.sum(axis=1) <= k).all()
    for m, j in zip(*np.nonzero(made), strict=True):
        e, src, s = plan.copy_expert[m, j], plan.copy_source[m, j], plan.copy_tokens[m, j]
        assert m not in ranks[e] and src in ranks[e] and s > 0 and s == round(s)
        on[e, m] += s
    assert (plan.copy_tokens[~made] == 0).all() and (plan.copy_source[~made] == -1).all()
    np.testing.assert_array_equal(on.sum(axis=1), n)
    G, N = (on > 0).sum(axis=0), on.sum(axis=0)
    t = np.maximum(cost.a + cost.b * G, cost.c + cost.beta * N) + cc.exposed_us(made.sum(axis=1))
    np.testing.assert_allclose(plan.rank_times, t)
    assert plan.makespan == pytest.approx(t.max())
    assert plan.makespan <= plan.makespan_without + 1e-9


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(("tokens", "k", "link"), [(4, 1, 50.0), (64, 2, 50.0), (1024, 1, 5.0)])
def test_a_plan_places_every_token_once_and_never_loses_to_relief(seed, tokens, k, link):
    n, ranks, D = _instance(seed, tokens=tokens)
    cc = CopyCost(BYTES, link)
    plan = plan_copies(n, ranks, MIXED, D, k, cc)
    _check_plan(plan, n, ranks, D, k, MIXED, cc)


@pytest.mark.parametrize(
    ("copy_us", "overlap_us", "makespan", "copies"),
    [
        (90.0, 0.0, 95.0, 1),  # gain 5 µs on 100: made
        (110.0, 0.0, 100.0, 0),  # the copy costs more than it relieves: refused
        (110.0, 20.0, 95.0, 1),  # 20 µs hidden behind the exchange: exposed 90, made
    ],
)
def test_the_break_even_guard_makes_a_copy_only_when_it_pays(copy_us, overlap_us, makespan, copies):
    """One hot expert (100 tokens, linear time) on rank 0, an idle rank 1 with a spare slot: a copy moves s tokens,
    the pair's time is max(100 − s, s + o), best at (100 + o) / 2 — below 100 only while the copy's exposed time
    o = τ − ω is below 100."""
    n = np.array([100.0, 0.0])
    ranks = np.array([[0], [1]])
    cc = CopyCost(expert_bytes=copy_us * 50.0 * 1e3, link_gbps=50.0, overlap_us=overlap_us)
    assert cc.copy_us == pytest.approx(copy_us)
    plan = plan_copies(n, ranks, LINEAR, 2, 1, cc)
    assert plan.makespan == pytest.approx(makespan) and plan.num_copies == copies
    if copies:
        assert (plan.copy_expert[1, 0], plan.copy_source[1, 0]) == (0, 0)
        assert plan.copy_tokens[1, 0] == 5.0 and plan.x[0, 0] == 95.0


def test_without_spare_slots_or_with_a_slow_link_the_plan_is_relief():
    n, ranks, D = _instance(1, tokens=1024)
    want = relief(n, ranks, MIXED, D)
    for k, link in ((0, 50.0), (2, 1e-3)):
        plan = plan_copies(n, ranks, MIXED, D, k, CopyCost(BYTES, link))
        assert plan.num_copies == 0
        np.testing.assert_array_equal(plan.x, want)
        assert plan.makespan == plan.makespan_without


@pytest.mark.parametrize(
    ("seed", "tokens", "k", "link"),
    [(0, 64, 1, 50.0), (1, 1024, 1, 50.0), (2, 1024, 2, 50.0), (3, 4, 1, 50.0), (2, 64, 2, 50.0), (0, 1024, 1, 5.0)],
)
def test_the_plan_is_near_the_milp_optimum(seed, tokens, k, link):
    """The exact MILP (copies and splits together) bounds the plan from below; on these instances the plan is
    within 15% of it (the 72-instance grid in docs/results.md: mean 1.02, max 1.14)."""
    n, ranks, D = _instance(seed, tokens=tokens)
    cc = CopyCost(BYTES, link)
    plan = plan_copies(n, ranks, MIXED, D, k, cc)
    best = copies_milp(n, ranks, MIXED, D, k, cc, time_limit=300.0)
    assert best["optimal"]
    assert best["makespan"] <= plan.makespan + 1e-6
    assert plan.makespan <= 1.15 * best["makespan"]
    assert all(g not in ranks[e] for e, g in best["copies"])
    np.testing.assert_array_equal(best["x"].sum(axis=1), n)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (dict(dynamic_slots=-1), "dynamic_slots must be >= 0"),
        (dict(n=np.array([1.0, 2.5])), "whole token counts"),
        (dict(n=np.array([1.0, 2.0, 3.0])), "for the same E"),
        (dict(copy_cost=3.9), "copy_cost must be a solvers.CopyCost"),
        (dict(ranks=np.array([[0], [5]])), r"a replica on a rank in \[0, 2\)"),
        (dict(cost=CostModel(b=1.0, beta=1.0, b2=1.0)), "tile term"),
    ],
)
def test_bad_input_is_refused_with_what_to_fix(args, match):
    kw = (
        dict(
            n=np.array([4.0, 2.0]),
            ranks=np.array([[0], [1]]),
            cost=LINEAR,
            num_ranks=2,
            dynamic_slots=1,
            copy_cost=CopyCost(BYTES, 50.0),
        )
        | args
    )
    with pytest.raises(ValueError, match=match):
        plan_copies(**kw)


def test_a_copy_cost_refuses_a_link_without_bandwidth():
    with pytest.raises(ValueError, match="link_gbps"):
        CopyCost(BYTES, 0.0)


def test_the_bench_suite_copies_where_it_pays_on_dsv3_experts():
    """A CI-sized sample of `scripts/bench_ingraph.py --suites copies` (EP4, one seed; DSv3 experts of 44 MB, whose
    copy takes 98 µs over NVLink and 881 µs at 50 GB/s): at 64 tokens per rank no copy pays and none is made; at
    4096 copies are made and the plan is within 12% of the optimum, while no copies leave up to 2.5× on the table."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    from bench_ingraph import copies_against_optimum, copies_instances

    instances = [i for i in copies_instances(1) if i[0]["ep"] == 4]
    rows = copies_against_optimum(instances, progress=False)
    assert len(rows) == 12
    for r in rows:
        assert 1.0 - 1e-9 <= r["plan_over_optimum"] <= 1.12, r
        assert r["plan"] <= r["relief"] + 1e-9, r
        if r["B"] == 64:
            assert r["copies"] == 0 and r["optimum_copies"] == 0, r
    assert any(r["copies"] > 0 for r in rows if r["B"] == 4096)


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize(("tokens", "k", "link"), [(4, 1, 50.0), (64, 2, 50.0), (1024, 1, 5.0), (1024, 2, 50.0)])
def test_the_jitted_plan_equals_the_numpy_twin(seed, tokens, k, link):
    """`tempo_jax.layer.copies.plan_copies` (jnp, float32, under jit) gives the numpy plan exactly: the same shares,
    copies, sources and copy tokens (the 36-case grid of the other tests: 36 of 36)."""
    import jax
    import jax.numpy as jnp

    from tempo_jax.layer.copies import plan_copies as plan_in_graph

    n, ranks, D = _instance(seed, tokens=tokens)
    cc = CopyCost(BYTES, link)
    want = plan_copies(n, ranks, MIXED, D, k, cc)
    got = jax.jit(lambda n, r: plan_in_graph(n, r, MIXED, D, k, cc))(jnp.asarray(n), jnp.asarray(ranks, jnp.int32))
    for a, b in zip(got, (want.x, want.copy_expert, want.copy_source, want.copy_tokens), strict=True):
        np.testing.assert_array_equal(np.asarray(a), b)


def test_fetch_copies_moves_each_copy_and_returns_its_gradient_to_the_home_slot():
    """8 ranks × 2 slots, 12 experts: each planned copy arrives in its dynamic slot (zeros where none is made) —
    also two copies from one source to one rank, in the reverse of the source's slot order, and an array of another
    dtype beside — and the gradient of a loss on the copies lands on the source slot, once per copy, under jit."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    from tempo_jax.layer.copies import fetch_copies

    D, S, k, E = 8, 2, 2, 12
    phy2log = np.r_[np.arange(E), [0, 0, 1, 5]]  # slots 12–15 replicate experts 0, 0, 1, 5
    logical = np.random.default_rng(0).standard_normal((E, 3, 4)).astype(np.float32)
    w = jnp.asarray(logical[phy2log])  # [P, 3, 4]
    cexp = np.full((D, k), -1)
    csrc = np.full((D, k), -1)
    for m, j, e, src in (
        (1, 0, 0, 6),
        (1, 1, 7, 3),
        (4, 0, 5, 7),
        (0, 0, 11, 5),
        (7, 1, 0, 0),
        (2, 0, 3, 1),
        (2, 1, 2, 1),
    ):
        cexp[m, j], csrc[m, j] = e, src
    mesh = jax.make_mesh((D,), ("ep",), axis_types=(jax.sharding.AxisType.Auto,))

    def per_rank(w, p2l, ce, cs, both=False):
        got = fetch_copies({"w": w, "v": w[:, 0].astype(jnp.bfloat16)}, p2l, ce, cs, axis="ep")
        return (got["w"], got["v"]) if both else got["w"]

    f = jax.shard_map(per_rank, mesh=mesh, in_specs=(P("ep"), P("ep"), P(), P()), out_specs=P("ep"))
    g2 = jax.shard_map(
        lambda *a: per_rank(*a, both=True), mesh=mesh, in_specs=(P("ep"), P("ep"), P(), P()), out_specs=P("ep")
    )
    args = (jnp.asarray(phy2log, jnp.int32), jnp.asarray(cexp, jnp.int32), jnp.asarray(csrc, jnp.int32))
    got, got_v = (np.asarray(a, np.float32) for a in jax.jit(g2)(w, *args))
    got, got_v = got.reshape(D, k, 3, 4), got_v.reshape(D, k, 4)
    for m in range(D):
        for j in range(k):
            want = logical[cexp[m, j]] if cexp[m, j] >= 0 else np.zeros((3, 4))
            np.testing.assert_array_equal(got[m, j], want)
            np.testing.assert_array_equal(got_v[m, j], want[0].astype(jnp.bfloat16).astype(np.float32))
    g = np.random.default_rng(1).standard_normal((D * k, 3, 4)).astype(np.float32)
    dw = np.asarray(jax.jit(jax.grad(lambda w: jnp.sum(f(w, *args) * g)))(w))
    want = np.zeros_like(dw)
    for m in range(D):
        for j in range(k):
            if cexp[m, j] >= 0:  # the source's slot of that expert: the home slot of the copy
                src = csrc[m, j]
                slot = src * S + int(np.flatnonzero(phy2log[src * S : src * S + S] == cexp[m, j])[0])
                want[slot] += g[m * k + j]
    np.testing.assert_allclose(dw, want, rtol=1e-6, atol=1e-6)


@pytest.fixture(scope="module")
def skewed_layer():
    """The 8-rank layer of tests/ep_case.py (12 experts, 2 slots per rank) on replayed routing that sends 70% of
    the pairs to expert 3: without copies one rank computes 509 of the 1,024 pairs."""
    import jax
    import jax.numpy as jnp
    from ep_case import E, small_ep_case

    placement, config, params, mesh = small_ep_case(1)
    T = 8 * 64
    rng = np.random.default_rng(0)
    ids = np.where(rng.random((T, 2)) < 0.7, 3, rng.integers(0, E, (T, 2)))
    ids[:, 1] = np.where(ids[:, 1] == ids[:, 0], (ids[:, 0] + 1) % E, ids[:, 1])
    routing = (jnp.asarray(ids, jnp.int32), jax.nn.softmax(jax.random.normal(jax.random.key(3), (T, 2)), -1))
    x = jax.random.normal(jax.random.key(2), (T, 32))
    return placement, config, params, mesh, x, routing


def _layer(skewed_layer, k, link):
    import dataclasses

    placement, config, params, mesh, x, routing = skewed_layer
    from tempo_jax.layer import tables as dispatch_tables

    cfg = dataclasses.replace(
        config,
        dispatch="ingraph",
        dispatch_mode="quota",
        cost=LINEAR,
        dynamic_slots=k,
        copy_cost=CopyCost(1e3, link) if k else None,
    )
    pa = dispatch_tables.placement_arrays(placement)

    def f(p, x):
        from tempo_jax.layer import moe_forward

        return moe_forward(p, x, mesh=mesh, placement_arrays=pa, tables=None, config=cfg, routing=routing)

    return cfg, f


@pytest.mark.one_env
def test_the_layer_with_dynamic_slots_equals_the_dense_moe_and_copies_only_when_they_pay(skewed_layer):
    """Copies made (a free link: the hot expert spreads over every rank), none (a link too slow: the same as no
    dynamic slots), and no dynamic slots: the output is the dense MoE's in each (the central invariant), every pair
    is computed once, and only the copies move where the work runs."""
    import jax
    from numeric import assert_close

    from tempo_jax.layer import moe_reference, to_logical

    placement, config, params, mesh, x, routing = skewed_layer
    runs = {}
    for label, k, link in (("copies", 1, 1e6), ("slow link", 1, 1e-6), ("none", 0, None)):
        cfg, f = _layer(skewed_layer, k, link)
        res = jax.jit(f)(params, x)
        assert_close(res.out, moe_reference(to_logical(params, placement), x, cfg, routing=routing))
        tokens = np.asarray(res.stats.gpu_tokens)
        assert tokens.sum() == x.shape[0] * 2, label  # every pair computed once
        runs[label] = tokens
    np.testing.assert_array_equal(runs["slow link"], runs["none"])
    assert runs["none"].max() == 509 and runs["copies"].max() <= 140  # the hot rank's 509 pairs spread


def test_the_layer_with_copies_has_the_dense_gradients(skewed_layer):
    """Two dynamic slots per rank, copies made: the gradients of the copies are summed into their home slots, so
    every replica's gradient is its expert's, as in the dense MoE."""
    import jax
    import jax.numpy as jnp
    from numeric import f32_close

    from tempo_jax.layer import moe_reference, to_logical, to_physical

    placement, config, params, mesh, x, routing = skewed_layer
    cfg, f = _layer(skewed_layer, 2, 1e6)
    gp, gx = jax.jit(jax.grad(lambda p, x: jnp.sum(f(p, x).out ** 2), argnums=(0, 1)))(params, x)
    ref = jax.grad(lambda p, x: jnp.sum(moe_reference(p, x, cfg, routing=routing) ** 2), argnums=(0, 1))
    rp, rx = ref(to_logical(params, placement), x)
    f32_close(gx, rx, atol=1e-4, rtol=1e-4)
    rp = to_physical(rp, placement)
    for name in params:
        f32_close(gp[name], rp[name], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (dict(dynamic_slots=1, copy_cost=CopyCost(1e3, 50.0)), "set dispatch='ingraph'"),
        (dict(dispatch="ingraph", dispatch_mode="quota", cost=LINEAR, dynamic_slots=1), "copy_cost=solvers.CopyCost"),
        (dict(dispatch="ingraph", dispatch_mode="quota", cost=LINEAR, copy_cost=CopyCost(1e3, 50.0)), "only with"),
        (dict(dispatch="ingraph", dispatch_mode="quota", cost=LINEAR, dynamic_slots=-1), "dynamic_slots must be"),
    ],
)
def test_dynamic_slots_are_refused_without_what_they_need(kw, match):
    from tempo_jax.layer import MoEConfig

    with pytest.raises(ValueError, match=match):
        MoEConfig(hidden=8, ffn=4, experts=4, top_k=2, slots_per_rank=2, **kw)


@pytest.mark.one_env
def test_the_flax_module_with_dynamic_slots_serves_and_trains(skewed_layer):
    """`tempo_jax.MoE` with dynamic slots under `nnx.jit`: the same output as without them, and an Adam step runs
    and every stored array moves, keeping its shape (the copies live only inside the step)."""
    import dataclasses

    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx
    from numeric import assert_close

    import tempo_jax

    placement, config, params, mesh, x, _ = skewed_layer
    base = dataclasses.replace(config, dispatch="ingraph", dispatch_mode="quota", cost=LINEAR)
    dyn = dataclasses.replace(base, dynamic_slots=1, copy_cost=CopyCost(1e3, 1e6))
    m, r = (tempo_jax.MoE(c, placement, mesh=mesh, rngs=nnx.Rngs(0), params=params) for c in (dyn, base))
    step = nnx.jit(lambda m, x: m(x))
    assert_close(step(m, x * 3), step(r, x * 3))
    opt = nnx.Optimizer(m, optax.adam(1e-3), wrt=nnx.Param)

    @nnx.jit
    def train(m, opt, x):
        loss, g = nnx.value_and_grad(lambda m: jnp.sum(m(x) ** 2))(m)
        opt.update(m, g)
        return loss

    before = jax.tree.map(np.asarray, nnx.state(m, nnx.Param))
    assert np.isfinite(float(train(m, opt, x)))
    after = jax.tree.map(np.asarray, nnx.state(m, nnx.Param))
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after), strict=True):
        assert a.shape == b.shape and np.isfinite(b).all() and not np.array_equal(a, b)  # the stored slots only


def test_expert_ffn_over_weight_parts_equals_one_array():
    """`stages.expert_ffn` with each weight as parts along the slot axis (the stored slots and the copies, so the
    stored ones are never concatenated): the same rows, group sizes and gradients as one concatenated array, with
    biases, padding rows and an empty copy slot."""
    import jax
    import jax.numpy as jnp
    from numeric import f32_close

    from tempo_jax.layer.experts import ExpertConfig
    from tempo_jax.layer.stages import expert_ffn

    S, k, H, F, M = 3, 2, 8, 4, 40
    keys = iter(jax.random.split(jax.random.key(0), 8))
    shapes = {"w_gate": (H, F), "w_up": (H, F), "w_down": (F, H), "b_gate": (F,), "b_up": (F,), "b_down": (H,)}
    whole = {n: jax.random.normal(next(keys), (S + k, *sh)) for n, sh in shapes.items()}
    rows = jax.random.normal(next(keys), (M, H))
    slots = jnp.asarray(np.random.default_rng(0).choice([0, 1, 2, 3, S + k], M), jnp.int32)  # slot 4 empty
    kw = dict(expert=ExpertConfig(bias=True), gmm_impl="auto", interpret=False)

    def run(w, split, join=None):
        w = {n: (a[:S], a[S:]) for n, a in w.items()} if split else w
        y, gs = expert_ffn(rows, slots, w, join_parts=join, **kw)
        return jnp.sum(y**2), (y, gs)

    (_, (y1, g1)), d1 = jax.jit(jax.value_and_grad(lambda w: run(w, False), has_aux=True))(whole)
    for join in (False, True, None):  # summed parts, joined first, and the choice from the shapes
        (_, (y2, g2)), d2 = jax.jit(jax.value_and_grad(lambda w, j=join: run(w, True, j), has_aux=True))(whole)
        f32_close(y2, y1, atol=1e-5, rtol=1e-5)
        np.testing.assert_array_equal(g2, g1)
        for n in whole:
            f32_close(d2[n], d1[n], atol=1e-4, rtol=1e-5)
    assert g1.shape == (S + k,) and g1[4] == 0


@pytest.mark.one_env
def test_dynamic_copies_under_a_cascade_launch_schedule(skewed_layer):
    """Dynamic copies with a CascadeEP launch schedule (two groups of sources, per-source exchanges): the dense
    output and gradients under jit, the copies made; with OEWF fetches the combination is refused by name."""
    import dataclasses

    import jax
    import jax.numpy as jnp
    from numeric import assert_close, f32_close

    from solvers import LaunchSchedule
    from tempo_jax.layer import moe_forward, moe_reference, to_logical, to_physical
    from tempo_jax.layer import tables as dispatch_tables
    from tempo_jax.layer.cascade_plan import WeightFetch

    placement, config, params, mesh, x, routing = skewed_layer
    cfg, _ = _layer(skewed_layer, 1, 1e6)
    order = tuple(reversed(range(8)))
    cfg = dataclasses.replace(cfg, schedule=LaunchSchedule(num_ranks=8, order=order, groups=(order[:4], order[4:])))

    pa = dispatch_tables.placement_arrays(placement)

    def f(p, x):
        return moe_forward(p, x, mesh=mesh, placement_arrays=pa, tables=None, config=cfg, routing=routing)

    res = jax.jit(f)(params, x)
    assert_close(res.out, moe_reference(to_logical(params, placement), x, cfg, routing=routing))
    assert int(res.stats.copies.sum()) > 0 and int(res.stats.gpu_tokens.max()) < 509
    gp = jax.jit(jax.grad(lambda p: jnp.sum(f(p, x).out ** 2)))(params)
    rp = jax.grad(lambda p: jnp.sum(moe_reference(p, x, cfg, routing=routing) ** 2))(to_logical(params, placement))
    rp = to_physical(rp, placement)
    for name in params:
        f32_close(gp[name], rp[name], atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="use one of them"):
        dataclasses.replace(cfg, schedule="sync", fetches=(WeightFetch(0, 1, (2,)),))
