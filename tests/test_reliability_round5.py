"""Reliability, round 5 (issue 54): the surfaces wave 4 added — physical layouts, re-placement, export, in-graph
dispatch, the CascadeEP runs — lose nothing and refuse what they cannot do. Each test failed before its fix (the
item numbers are the issue's)."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import tempo_jax
from solvers import PRESETS, Placement
from tempo_jax.cli import main
from tempo_jax.hf import load_moe_layers
from tempo_jax.layer import MoEConfig, make_ep_mesh, moe_reference, to_logical, to_physical
from tempo_jax.layer import tables as dispatch_tables
from tempo_jax.layer.params import init_logical_params
from tempo_jax.sim.cascade.config import CascadeConfig
from tempo_jax.sim.cascade.run import run_cascade_seeds

HF = Path(__file__).resolve().parent / "fixtures" / "hf"
CFG = MoEConfig(hidden=8, ffn=4, experts=8, top_k=2, slots_per_rank=2)


@pytest.fixture(scope="module")
def logical():
    return init_logical_params(jax.random.key(0), CFG)


# ---------------------------------------------------------------------------- 1, 8, 14: physical ↔ logical layouts
@pytest.mark.parametrize(
    ("placement", "match"),
    [
        (Placement.spread(16, 8, 2), "the placement is for 16 experts, the parameters hold 8"),  # 1: slots 8-15 NaN
        (Placement.spread(4, 8, 2), "the placement is for 4 experts, the parameters hold 8"),  # 8: experts 4-7 lost
        (np.r_[np.arange(15), -1], "phy2log holds expert ids < 0"),  # 1: −1 wrapped to expert 7
        (np.r_[np.arange(8), np.arange(8) + 1], "phy2log names expert 8 but the parameters hold 8"),  # 1: a NaN row
        (np.arange(16) % 4, r"experts \[4, 5, 6, 7\] have no slot in the placement; they would be lost"),  # 8
        (np.zeros((2, 8), np.int32), r"placement must be a solvers.Placement or its phy2log \[P\]"),
    ],
)
def test_to_physical_refuses_a_placement_for_other_experts(logical, placement, match):
    with pytest.raises(ValueError, match=match):
        to_physical(logical, placement)


def test_to_logical_refuses_a_placement_the_parameters_were_not_laid_out_over(logical):
    physical = to_physical(logical, Placement.spread(8, 8, 2))  # P = 16
    with pytest.raises(ValueError, match="the parameters hold 16 slots but the placement lays out 8"):
        to_logical(physical, Placement.spread(8, 8, 1))
    with pytest.raises(ValueError, match="the router scores 8 experts, the placement lays out 16"):
        to_logical(physical, Placement.spread(16, 8, 2))  # P = 16 too: [16, ...] experts for an 8-expert router
    with pytest.raises(ValueError, match="phy2log holds expert ids < 0"):  # 14: was "experts [] have no slot"
        to_logical(physical, np.r_[np.arange(15) % 8, -1])
    back = to_logical(physical, Placement.spread(8, 8, 2))
    for k in logical:
        np.testing.assert_array_equal(np.asarray(back[k]), np.asarray(logical[k]), err_msg=k)


def test_moe_reference_refuses_physical_parameters(logical):
    """6: physical params went through the dense reference silently (output 3.66 off)."""
    physical = to_physical(logical, Placement.spread(8, 8, 2))
    x = jnp.ones((4, CFG.hidden))
    with pytest.raises(ValueError, match=r"takes the logical layout \[E, ...\]; convert physical parameters"):
        moe_reference(physical, x, CFG)
    assert moe_reference(logical, x, CFG).shape == (4, CFG.hidden)


# ---------------------------------------------------------------------------- 4, 5, 22: CascadeEP options
@pytest.mark.parametrize("field", ["guard", "vary_workload"])
def test_cascade_flags_refuse_strings(field):
    """4: ``guard="False"`` turned the option on (a truthy string)."""
    with pytest.raises(ValueError, match=rf"CascadeConfig: {field} must be a bool, got 'False' \(str\)"):
        CascadeConfig(trace="synthetic", **{field: "False"})


@pytest.mark.parametrize(
    ("modes", "seeds", "match"),
    [
        (("sync",), (0.5,), "seed must be an integer >= 0"),  # 5: key 0.5 held seed 0's run
        (("sync",), (1, 1), r"seeds \[1, 1\] repeat a seed"),
        (("sync", "sync"), (0,), r"modes \['sync'\] are given twice"),  # 22
    ],
)
def test_cascade_seeds_refuse_what_would_mislabel_a_run(modes, seeds, match):
    with pytest.raises(ValueError, match=match):
        run_cascade_seeds(CascadeConfig(trace="synthetic"), modes, seeds=seeds, progress=False)


def test_cascade_cli_refuses_a_mode_twice(capsys):
    """22: ``--modes sync,sync`` ran and printed "Sync − Sync ≈"."""
    assert main(["cascade", "--modes", "sync,sync", "--trace", "synthetic", "--seeds", "1"]) == 2
    assert "given twice" in capsys.readouterr().err


# ---------------------------------------------------------------------------- 13, 19: the in-graph dispatch
def test_dispatch_rounds_beyond_the_int32_counter_are_refused():
    """13: ``dispatch_rounds=2**31`` was accepted; the first call raised JAX's OverflowError."""
    with pytest.raises(ValueError, match="dispatch_rounds=2,147,483,648 exceeds"):
        MoEConfig(
            hidden=8,
            ffn=4,
            experts=8,
            top_k=2,
            slots_per_rank=1,
            dispatch="ingraph",
            dispatch_mode="quota",
            cost=PRESETS["dsv3_fp8_offline"],
            dispatch_rounds=2**31,
        )


def test_an_ingraph_layer_refuses_tables_it_would_never_read():
    """19: ``MoE(<ingraph config>, tables=...)`` accepted tables (``set_tables`` refused the same)."""
    cost = PRESETS["dsv3_fp8_offline"]
    kw = dict(hidden=8, ffn=4, experts=8, top_k=2, slots_per_rank=1, dispatch_mode="quota", cost=cost)
    cfg = MoEConfig(dispatch="ingraph", **kw)
    pl = Placement.spread(8, 8, 1)
    with pytest.raises(ValueError, match="MoE: this layer computes each call's tables in the step"):
        tempo_jax.MoE(cfg, pl, mesh=make_ep_mesh(8), rngs=nnx.Rngs(0), tables=dispatch_tables.uniform(pl))


# ---------------------------------------------------------------------------- 20: import
def test_a_placement_for_a_layer_that_is_not_loaded_is_refused():
    """20: ``placement={0: pl, 1: pl, 7: pl}`` on a 2-layer model ignored layer 7."""
    pl = Placement.spread(8, 8, 1)
    with pytest.raises(ValueError, match=r"names layers \[7\] that are not loaded \(the MoE layers loaded: \[0, 1\]\)"):
        load_moe_layers(HF / "mixtral" / "hub", placement={0: pl, 1: pl, 7: pl})


# ---------------------------------------------------------------------------- 2, 9, 15: re-placement
def test_migrate_refuses_arrays_of_another_slot_count():
    """2: a 32-slot array was rearranged by a 16-slot plan."""
    from tempo_jax.layer.replicas import migrate, plan_migration

    old = Placement.spread(8, 8, 2)
    new = Placement.from_eplb(np.arange(8) + 1.0, 16, 8)
    with pytest.raises(ValueError, match=r"arrays\[0\] has shape \[32, 3\], but the plan rearranges 16 slots"):
        migrate([jnp.zeros((32, 3))], plan_migration(old, new), mesh=make_ep_mesh(8))
    with pytest.raises(ValueError, match="the plan is for 8 ranks, the mesh's 'ep' axis has 4 ranks"):
        migrate([jnp.zeros((16, 3))], plan_migration(old, new), mesh=make_ep_mesh(4))


def test_set_placement_never_consumes_the_callers_arrays(logical):
    """9: ``MoE(params=p)`` kept the caller's arrays and the move deleted them ("Array has been deleted")."""
    mesh, old = make_ep_mesh(8), Placement.spread(8, 8, 2)
    new = Placement.from_eplb(np.arange(8) + 1.0, 16, 8)
    params = to_physical(logical, old, mesh=mesh)
    before = {k: np.asarray(v) for k, v in params.items()}
    x = jax.random.normal(jax.random.key(1), (16, CFG.hidden))
    moe = tempo_jax.MoE(CFG, old, mesh=mesh, rngs=nnx.Rngs(0), params=params)
    out = moe(x)
    moe.set_placement(new)
    moe.set_placement(old)  # the layer's own arrays now: moved in place
    for k, v in params.items():
        np.testing.assert_array_equal(np.asarray(v), before[k], err_msg=k)  # alive and unchanged
    again = tempo_jax.MoE(CFG, old, mesh=mesh, rngs=nnx.Rngs(0), params=params)
    np.testing.assert_allclose(np.asarray(again(x)), np.asarray(out), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(moe(x)), np.asarray(out), rtol=1e-5, atol=1e-5)


def test_set_placement_takes_a_stateless_optimizer(logical):
    """15: ``optimizer=nnx.Optimizer(moe, optax.sgd(0.1))`` was refused as another model's optimizer."""
    import optax

    mesh, old = make_ep_mesh(8), Placement.spread(8, 8, 2)
    moe = tempo_jax.MoE(CFG, old, mesh=mesh, rngs=nnx.Rngs(0))
    sgd = nnx.Optimizer(moe, optax.sgd(0.1), wrt=nnx.Param)
    report = moe.set_placement(Placement.from_eplb(np.arange(8) + 1.0, 16, 8), optimizer=sgd)
    assert report.moved_slots > 0
    other = tempo_jax.MoE(CFG, old, mesh=mesh, rngs=nnx.Rngs(1))
    adam = nnx.Optimizer(other, optax.adam(0.1), wrt=nnx.Param)
    with pytest.raises(ValueError, match="holds per-parameter state, but none of this layer's expert arrays"):
        moe.set_placement(old, optimizer=adam)


def test_set_placement_refuses_to_leave_a_live_optimizers_moments_behind(logical):
    """3: without ``optimizer=``, Adam's moments stayed in the old slot layout: after 3 steps replicas of one expert
    differed by 0.049 and the output was 0.25 off the dense reference."""
    import optax

    mesh, old = make_ep_mesh(8), Placement.spread(8, 8, 2)
    new = Placement.from_eplb(np.arange(8) + 1.0, 16, 8)
    moe = tempo_jax.MoE(CFG, old, mesh=mesh, rngs=nnx.Rngs(0))
    adam = nnx.Optimizer(moe, optax.adam(0.1), wrt=nnx.Param)
    x = jax.random.normal(jax.random.key(1), (16, CFG.hidden))
    adam.update(moe, nnx.grad(lambda m: jnp.sum(m(x) ** 2))(moe))
    with pytest.raises(ValueError, match=r"an nnx.Optimizer holds moments of this layer's expert arrays.*optimizer="):
        moe.set_placement(new)
    assert moe.placement.key == old.key  # refused before anything moved
    assert moe.set_placement(new, optimizer=adam).moved_slots > 0
    del adam  # dropped: nothing is left behind any more
    assert moe.set_placement(old).moved_slots > 0


# ---------------------------------------------------------------------------- 7, 16: the placement with the weights
def _replaced(logical):
    """A layer re-placed from an even placement (R = 2) to one where expert 7 has 3 replicas (R = 3)."""
    mesh, old = make_ep_mesh(8), Placement.spread(8, 8, 2)
    new = Placement.from_eplb(np.arange(8) + 1.0, 16, 8)
    assert new.log2phy.shape[1] > old.log2phy.shape[1]  # the move widens log2phy and the table
    moe = tempo_jax.MoE(CFG, old, mesh=mesh, rngs=nnx.Rngs(0), params=to_physical(logical, old, mesh=mesh))
    moe.set_placement(new)
    return moe, mesh, old


def test_weights_restored_without_their_placement_are_refused(logical):
    """7: ``nnx.state(moe, nnx.Param)`` of a re-placed layer into a fresh one was read under the fresh layout:
    output 3.0 off. Now refused (eagerly and under nnx.jit); the whole state restores the layer exactly."""
    moe, mesh, old = _replaced(logical)
    x = jax.random.normal(jax.random.key(1), (16, CFG.hidden))
    want = np.asarray(moe(x))
    weights_only = tempo_jax.MoE(CFG, old, mesh=mesh, rngs=nnx.Rngs(1))
    nnx.update(weights_only, nnx.state(moe, nnx.Param))
    for call in (weights_only, nnx.jit(lambda m, t: m(t)).__get__(weights_only)):
        with pytest.raises(ValueError, match=r"laid out over another placement than this layer's.*whole nnx.state"):
            call(x)
    with pytest.raises(ValueError, match="laid out over another placement"):
        weights_only.set_placement(old)  # nor moved or exported as if they were this layout's
    whole = tempo_jax.MoE(CFG, old, mesh=mesh, rngs=nnx.Rngs(1))
    nnx.update(whole, nnx.state(moe))
    np.testing.assert_allclose(np.asarray(whole(x)), want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(nnx.jit(lambda m, t: m(t))(whole, x)), want, rtol=1e-6, atol=1e-6)
    weights_only.load_logical(moe.logical_params())  # the layout-free way in
    np.testing.assert_allclose(np.asarray(weights_only(x)), want, rtol=1e-5, atol=1e-5)


def test_a_checkpoint_written_after_a_widening_move_restores_into_a_fresh_model(logical, tmp_path):
    """16: the documented orbax recipe failed ("Requested shape (8, 2) … stored (8, 4)") when set_placement widened
    log2phy; `restore_target` takes those shapes from the checkpoint and names anything else that disagrees."""
    import optax
    import orbax.checkpoint as ocp

    moe, mesh, old = _replaced(logical)
    with jax.set_mesh(mesh):
        adam = nnx.Optimizer(moe, optax.adam(0.1), wrt=nnx.Param)
    x = jax.random.normal(jax.random.key(1), (16, CFG.hidden))
    step = nnx.jit(lambda m, o, t: o.update(m, nnx.grad(lambda m: jnp.sum(m(t) ** 2))(m)))
    step(moe, adam, x)
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(tmp_path / "state", nnx.state((moe, adam)))
    checkpointer.wait_until_finished()
    step(moe, adam, x)
    want = np.asarray(moe(x))
    fresh = tempo_jax.MoE(CFG, old, mesh=mesh, rngs=nnx.Rngs(1))
    with jax.set_mesh(mesh):
        fresh_adam = nnx.Optimizer(fresh, optax.adam(0.1), wrt=nnx.Param)
    state = nnx.state((fresh, fresh_adam))
    old_recipe = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), state)
    with pytest.raises(ValueError):  # orbax: "Requested shape ... stored ..."
        checkpointer.restore(tmp_path / "state", old_recipe)
    target = tempo_jax.restore_target(state, checkpointer.metadata(tmp_path / "state"))
    nnx.update((fresh, fresh_adam), checkpointer.restore(tmp_path / "state", target))
    assert fresh.placement.key == moe.placement.key
    step(fresh, fresh_adam, x)  # the moments came back with the weights: the same next step
    np.testing.assert_allclose(np.asarray(fresh(x)), want, rtol=1e-5, atol=1e-5)
    other = tempo_jax.MoE(
        MoEConfig(hidden=8, ffn=8, experts=8, top_k=2, slots_per_rank=2), old, mesh=mesh, rngs=nnx.Rngs(1)
    )
    with jax.set_mesh(mesh):
        state = nnx.state((other, nnx.Optimizer(other, optax.adam(0.1), wrt=nnx.Param)))
    with pytest.raises(ValueError, match=r"0/w_down is stored as \[16, 4, 8\], the model holds \[16, 8, 8\]"):
        tempo_jax.restore_target(state, checkpointer.metadata(tmp_path / "state"))
    with pytest.raises(ValueError, match="the checkpoint holds no array for aux_loss"):
        tempo_jax.restore_target(nnx.state(fresh), checkpointer.metadata(tmp_path / "state"))


# ---------------------------------------------------------------------------- 12: the controller's proposals
def test_a_controller_refuses_a_placement_its_proposals_cannot_lay_out():
    """12: 65,544 slots passed the constructor; every window's EPLB proposal then raised."""
    from tempo_jax.runtime import DispatchController

    with pytest.raises(ValueError, match=r"rebalance_every=...\): num_replicas=65,544 exceeds the supported 65,536"):
        DispatchController(Placement.spread(8, 8, 8193), PRESETS["dsv3_fp8_offline"], rebalance_every=1)


# ---------------------------------------------------------------------------- 10, 11: export
def _mixtral():
    import json

    layer = 0
    cfg, params, placement = load_moe_layers(HF / "mixtral" / "hub", layers=[layer])[layer]
    config = json.loads((HF / "mixtral" / "hub" / "config.json").read_text())
    return config, cfg, to_logical(params, placement), placement


@pytest.mark.parametrize("layout", ["hub", "fused"])  # an indexed, sharded checkpoint and a single unindexed file
def test_save_moe_layers_into_a_checkpoint_keeps_its_own_files(layout, tmp_path):
    """10: saving into the original checkpoint folder overwrote its index (the embeddings no longer indexed) and
    its config.json (``vocab_size`` lost)."""
    import json
    import shutil

    from tempo_jax.hf import save_moe_layers
    from tempo_jax.layer.hf.quant import SafetensorsFile

    config, cfg, logical, _ = _mixtral()
    folder = tmp_path / "ckpt"
    shutil.copytree(HF / "mixtral" / layout, folder)
    before = {n: s.name for s in folder.glob("*.safetensors") for n in SafetensorsFile(s).names()}
    config_text = (folder / "config.json").read_text()
    tuned = {k: (v * 2 if k == "w_up" else v) for k, v in logical.items()}
    save_moe_layers(folder, config, {0: (cfg, tuned)})
    weight_map = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    assert set(before) <= set(weight_map)  # every tensor of the checkpoint still indexed
    assert weight_map["model.embed_tokens.weight"] == before["model.embed_tokens.weight"]
    assert (folder / "config.json").read_text() == config_text
    again = load_moe_layers(folder, layers=[0])[0]
    np.testing.assert_array_equal(np.asarray(to_logical(again.params, again.placement)["w_up"]), tuned["w_up"])
    save_moe_layers(folder, config, {0: (cfg, logical)})  # a second save replaces the first, keeps the rest
    assert set(before) <= set(json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"])


def test_save_moe_layers_refuses_blocks_config_json_cannot_describe(tmp_path):
    """11: layer 5 of a 2-layer model (reloading returned [0, 1]), E = 4 blocks under an E = 8 config, and
    ``moe_to_hf`` of a block whose renormalisation disagrees with ``norm_topk_prob``."""
    import dataclasses

    from tempo_jax.hf import moe_to_hf, save_moe_layers

    config, cfg, logical, _ = _mixtral()
    with pytest.raises(
        ValueError, match=r"layers \[5\] are not MoE layers of this config.json \(its MoE layers: \[0, 1\]\)"
    ):
        save_moe_layers(tmp_path / "a", config, {5: (cfg, logical)})
    small = dataclasses.replace(cfg, experts=4)
    with pytest.raises(ValueError, match="experts: config.json says 8, the block has 4"):
        save_moe_layers(tmp_path / "b", config, {0: (small, logical)})
    flipped = dataclasses.replace(cfg, router=dataclasses.replace(cfg.router, renormalize=False))
    with pytest.raises(ValueError, match="moe_to_hf: the block is not the one config.json describes"):
        moe_to_hf(config, flipped, logical)


def test_a_sparse_key_budget_beyond_any_context_is_refused_up_front():
    """18: ``key_budget=10**30`` failed late inside ``attention_features`` ("dtype object")."""
    with pytest.raises(ValueError, match="key_budget=1,000,000,000,000,000,000,000,000,000,000 exceeds"):
        CascadeConfig(trace="synthetic", attention="sparse", key_budget=10**30)


def test_reproduce_honours_small_from_the_environment(monkeypatch, capsys):
    """23: ``SMALL=1 tempo-jax reproduce`` ran every notebook at full size (the command set SMALL from its own
    ``--small``) and rewrote the committed results."""
    import tempo_jax.cli.repro as repro

    seen = []
    monkeypatch.setattr(repro, "reproduce", lambda names, *, small: seen.append(small) or [])
    monkeypatch.setenv("SMALL", "1")
    assert main(["reproduce", "01"]) == 0
    assert seen == [True] and "SMALL=1 in the environment" in capsys.readouterr().out
    monkeypatch.setenv("SMALL", "yes")
    assert main(["reproduce", "01"]) == 2
    assert "set it to 1" in capsys.readouterr().err


# ---------------------------------------------------------------------------- 6: the derivative through to_physical
def test_differentiating_through_to_physical_is_true_or_refused(logical):
    """6: ``jax.grad`` through ``to_physical`` gave experts with 2 replicas exactly 2× the dense gradient. Without
    replicas (a permutation of the experts) it is the true derivative; with replicas it is refused by name."""
    mesh = make_ep_mesh(8)
    x = jax.random.normal(jax.random.key(2), (16, CFG.hidden))

    def loss(p, placement):
        out = tempo_jax.moe_forward(
            to_physical(p, placement),
            x,
            mesh=mesh,
            placement_arrays=dispatch_tables.placement_arrays(placement),
            tables=dispatch_tables.uniform(placement),
            config=cfg,
        ).out
        return jnp.sum(out**2)

    cfg = MoEConfig(hidden=8, ffn=4, experts=8, top_k=2, slots_per_rank=1)
    permuted = Placement.from_phy2log(np.array([3, 1, 4, 0, 6, 2, 7, 5]), 8, None, 8)
    want = jax.grad(lambda p: jnp.sum(moe_reference(p, x, cfg) ** 2))(logical)
    got = jax.grad(loss)(logical, permuted)
    for k in want:
        np.testing.assert_allclose(np.asarray(got[k]), np.asarray(want[k]), rtol=2e-5, atol=2e-6, err_msg=k)
    cfg = CFG  # two slots per rank: experts replicated
    replicated = Placement.from_eplb(np.arange(8) + 1.0, 16, 8)
    with pytest.raises(ValueError, match="to_physical: differentiating through it with replicas would count"):
        jax.grad(loss)(logical, replicated)


# ---------------------------------------------------------------------------- the agreement check
def _agreement_cases():
    """Every argument of the physical-layout functions that must agree with another (E, P, D, S, the layer count,
    the dtype), given a value that disagrees: (call, what the refusal names)."""
    from tempo_jax.hf import save_moe_layers
    from tempo_jax.layer.replicas import migrate, plan_migration

    lg = init_logical_params(jax.random.key(0), CFG)
    pl, mesh = Placement.spread(8, 8, 2), make_ep_mesh(8)
    wider = Placement.from_eplb(np.arange(8) + 1.0, 16, 8)
    bf16 = MoEConfig(hidden=8, ffn=4, experts=8, top_k=2, slots_per_rank=2, dtype=jnp.bfloat16)

    def moe(cfg=CFG, placement=pl, **kw):
        return tempo_jax.MoE(cfg, placement, mesh=mesh, rngs=nnx.Rngs(0), **kw)

    def save(layers):
        config, cfg, logical, _ = _mixtral()
        return save_moe_layers(Path(__import__("tempfile").mkdtemp()), config, {i: (cfg, logical) for i in layers})

    return {
        "to_physical: E": (lambda: to_physical(lg, Placement.spread(12, 8, 2)), "placement is for 12 experts"),
        "to_physical: D": (lambda: to_physical(lg, Placement.spread(8, 4, 2), mesh=mesh), "spans 4 ranks"),
        "to_logical: P": (lambda: to_logical(to_physical(lg, pl), Placement.spread(8, 8, 3)), "hold 16 slots"),
        "to_logical: E": (lambda: to_logical(to_physical(lg, pl), Placement.spread(16, 8, 2)), "scores 8 experts"),
        "plan_migration: S": (lambda: plan_migration(pl, Placement.spread(8, 8, 3)), "keeps D, S and E"),
        "plan_migration: D": (lambda: plan_migration(pl, Placement.spread(8, 4, 4)), "keeps D, S and E"),
        "plan_migration: E": (lambda: plan_migration(pl, Placement.spread(16, 8, 2)), "keeps D, S and E"),
        "migrate: P": (lambda: migrate([jnp.zeros((24, 2))], plan_migration(pl, wider), mesh=mesh), "16 slots"),
        "migrate: D": (
            lambda: migrate([jnp.zeros((16, 2))], plan_migration(pl, wider), mesh=make_ep_mesh(4)),
            "8 ranks",
        ),
        "MoE: S": (lambda: moe(placement=Placement.spread(8, 8, 3)), "the mesh needs 8 ranks × 2 slots"),
        "MoE: E": (lambda: moe(placement=Placement.spread(16, 8, 2)), "placement has 16 experts"),
        "MoE: params P": (lambda: moe(params=to_physical(lg, Placement.spread(8, 8, 3))), r"the config needs \[16"),
        "MoE: params dtype": (lambda: moe(bf16, params=to_physical(lg, pl)), "config's dtype is bfloat16"),
        "set_placement: S": (lambda: moe().set_placement(Placement.spread(8, 8, 3)), "keeps D, S and E"),
        "set_placement: E": (lambda: moe().set_placement(Placement.spread(16, 8, 2)), "keeps D, S and E"),
        "save_moe_layers: layers": (lambda: save([0, 5]), r"layers \[5\] are not MoE layers"),
    }


AGREEMENT = _agreement_cases()


@pytest.mark.parametrize("name", sorted(AGREEMENT))
def test_every_layout_argument_that_disagrees_is_refused(name):
    call, match = AGREEMENT[name]
    with pytest.raises(ValueError, match=match):
        call()


# ---------------------------------------------------------------------------- 21: a move pays for itself, keeps tables
def test_set_placement_publishes_the_last_window_solved_over_the_new_placement():
    """The controller's freshest data survive a re-placement: the last closed window is solved again over the new
    placement and published at once (before: the new placement's fallback tables, until the next window)."""
    from solvers.worker import solve_window

    D, E = 8, 16
    old, new = Placement.spread(E, D, 3), Placement.from_eplb(np.geomspace(200, 2, E), 24, D, spread_idle=True)
    counts = np.random.default_rng(0).poisson(np.geomspace(200, 2, E), (D, E))
    with tempo_jax.DispatchController(old, PRESETS["dsv3_fp8_offline"], solver_mode="inline") as ctl:
        ctl.observe(counts)
        published = ctl.metrics()["windows"]["published"]
        ctl.set_placement(new)
        want = dispatch_tables.from_weights(solve_window(ctl.config, counts)[0], new)
        np.testing.assert_allclose(ctl.latest.table, want.table, atol=1e-6)
        assert not np.allclose(ctl.latest.table, dispatch_tables.uniform(new).table)  # not the fallback
        m = ctl.metrics()
        assert m["windows"]["published"] == published and not m["in_fallback"]  # a re-solve is not a window


def test_a_failed_re_solve_after_a_placement_is_counted_and_the_fallback_serves(monkeypatch):
    """The re-solve of set_placement never fails quietly: counted, in last_error and an event."""
    from tempo_jax.runtime import controller as controller_module

    D, E = 8, 16
    old, new = Placement.spread(E, D, 3), Placement.from_eplb(np.geomspace(200, 2, E), 24, D, spread_idle=True)
    with tempo_jax.DispatchController(old, PRESETS["dsv3_fp8_offline"], solver_mode="inline") as ctl:
        ctl.observe(np.random.default_rng(0).poisson(np.geomspace(200, 2, E), (D, E)))

        def fails(*a, **k):
            raise RuntimeError("injected")

        monkeypatch.setattr(controller_module, "solve_window", fails)
        ctl.set_placement(new)
        np.testing.assert_array_equal(ctl.latest.table, dispatch_tables.uniform(new).table)  # the fallback
        m = ctl.metrics()
        assert m["placements"]["resolve_failed"] == 1 and "RuntimeError: injected" in m["last_error"]
        assert any(kind == "error" and "re-solving the last window failed" in msg for _, kind, msg in ctl.events)


def test_serve_moves_only_when_the_gain_pays_for_the_move_and_the_policy_serves(tmp_path, capsys):
    """The issue's run: a proposal every step. Before: every proposal at an equal makespan moved 70-89 slots and
    the fallback tables of the new placement replaced each window's solve, so the live makespan was the EPLB-even
    one on every step."""
    argv = ["serve", "--model", "layer", "--routing", "recorded", "--every-steps", "1", "--rebalance-every", "1"]
    argv += ["--steps", "5", "--block", "0", "--solver-mode", "inline", "--out", str(tmp_path), "--no-figure"]
    argv += ["--budget-s", "600", "--staleness-s", "600"]  # no solve is dropped or aged out on a slow machine
    assert main(argv) == 0
    rep = __import__("json").loads((tmp_path / "serve.json").read_text())
    assert all(r["live_us"] < r["uniform_us"] for r in rep["steps"][1:])  # the policy's tables serve
    moves = rep["replacements"]
    assert len(moves) == 5  # a proposal every step, each priced
    for mv in moves:
        assert mv["applied"] == (mv["gain_us"] > mv["margin"] * mv["move_us"]) and mv["move_us"] > 0
        if mv["makespan_after_us"] >= mv["makespan_before_us"]:
            assert not mv["applied"]  # an equal makespan never pays
    assert "≤ 2 × move" in capsys.readouterr().out
