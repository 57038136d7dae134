"""The MoE families in the layer, against dense references written from Hugging Face's modeling code
(`tests/hf_reference.py`): routers, shared experts, expert variants, `moe_from_hf` in both layouts,
`load_moe_layers` on a tiny sharded checkpoint, `moe_forward` on 8 fake devices with replicated placements (every
dispatch mode, perturbed tables, a CascadeEP schedule with weight fetches: the output never changes), the `MoE`
module under `nnx.jit`, gradients, bfloat16, and the presets."""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hf_reference import FAMILY_CONFIGS, dims, fused_state, hf_block, hf_state
from safetensors.numpy import save_file

import tempo_jax
from solvers import PRESETS, CopyCost, LaunchSchedule, Placement
from tempo_jax.layer import MoEConfig, init_logical_params, make_ep_mesh, moe_forward, moe_reference
from tempo_jax.layer import tables as dispatch_tables
from tempo_jax.layer.cascade_plan import WeightFetch
from tempo_jax.layer.experts import ExpertConfig, LatentConfig, OutputConfig, SharedConfig
from tempo_jax.layer.hf import load_moe_layers, moe_config_from_hf, moe_from_hf, moe_layer_ids
from tempo_jax.layer.presets import MOE_PRESETS, moe_preset, preset_spec
from tempo_jax.layer.routing import RouterConfig
from tempo_jax.workloads.models import MODEL_SPECS

D, S, T = 8, 2, 64  # ranks, slots per rank (8 experts + 8 replicas), tokens
FAMILIES = list(FAMILY_CONFIGS)


def rel_err(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.isfinite(a).all() and np.isfinite(b).all()
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


@pytest.fixture(scope="module")
def mesh():
    return make_ep_mesh(D)


def _placement(E: int, seed: int = 0) -> Placement:
    load = np.random.default_rng(seed).random(E) + 0.1
    return Placement.from_eplb(load, D * S, D)  # every expert has a replica, popular ones two


def _family_placement(config: dict, seed: int = 0) -> Placement:
    return _placement(dims(config)[2], seed)


def _x(H: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(T, H)) * 1.5


def _layer(mesh, cfg, params, placement, x, tables=None, key=0):
    pa = dispatch_tables.placement_arrays(placement)
    tables = dispatch_tables.uniform(placement) if tables is None else tables
    return moe_forward(
        params,
        jnp.asarray(x, jnp.float32),
        mesh=mesh,
        placement_arrays=pa,
        tables=tables,
        config=cfg,
        key=jax.random.key(key),
    )


# ------------------------------------------------------------------------------------------------ import
@pytest.mark.parametrize("family", FAMILIES)
def test_both_layouts_import_to_the_same_params(family):
    config = FAMILY_CONFIGS[family]
    st = hf_state(family, config)
    cfg_a, pa, pl = moe_from_hf(config, st)  # no mesh: one rank holding every expert in order (logical = physical)
    cfg_b, pb, _ = moe_from_hf(config, fused_state(family, config, st))
    assert cfg_a == cfg_b and pa.keys() == pb.keys() and pl.phy2log.tolist() == list(range(cfg_a.experts))
    for k in pa:
        np.testing.assert_array_equal(np.asarray(pa[k]), np.asarray(pb[k]))
    # the layer's own dense reference already equals the HF block on the imported parameters
    x = _x(config["hidden_size"])
    want = hf_block(family, config, st, x)
    assert rel_err(moe_reference(pa, jnp.asarray(x, jnp.float32), cfg_a), want) < 1e-5


# ------------------------------------------------------------------------------------------------ the layer
# Gradients through every family's router and expert are the slow part of the suite: the two that exercise every
# mechanism (group-limited sigmoid with a selection bias and shared experts; gpt-oss biases, clamp and top-k
# softmax) run in `make test`, the rest in `make test-all` (their forwards run fast below, under nnx.jit).
FAST_GRAD_FAMILIES = ("deepseek_v3", "gpt_oss")


@pytest.mark.parametrize(
    "family", [f if f in FAST_GRAD_FAMILIES else pytest.param(f, marks=pytest.mark.slow) for f in FAMILIES]
)
def test_layer_matches_hf_reference_forward_and_gradients(family, mesh):
    """moe_forward on 8 devices (EPLB replicas, sample mode, uniform then perturbed tables) equals the HF block;
    gradients (x and every parameter) equal jax.grad of the HF block's code."""
    config = FAMILY_CONFIGS[family]
    st = hf_state(family, config)
    placement = _family_placement(config)
    cfg, params, _ = moe_from_hf(config, st, placement=placement, mesh=mesh)  # physical, sharded over ep
    x = _x(cfg.hidden)
    want = hf_block(family, config, st, x)
    pa = dispatch_tables.placement_arrays(placement)

    @jax.jit
    def run(params, x, table):
        return moe_forward(
            params,
            x,
            mesh=mesh,
            placement_arrays=pa,
            tables=dispatch_tables.keyed(table, pa),
            config=cfg,
            key=jax.random.key(3),
        ).out

    xj = jnp.asarray(x, jnp.float32)
    uniform = dispatch_tables.uniform(placement)
    out = run(params, xj, uniform.table)
    assert rel_err(out, want) < 1e-5
    perturbed = run(params, xj, dispatch_tables.perturbed(uniform, seed=5).table)
    assert rel_err(perturbed, out) < 1e-5  # the central invariant: tables change where pairs go, not the output
    # gradients of <out, cot> against jax.grad of the HF block (float32), mapped by the same import
    cot = jnp.asarray(np.random.default_rng(9).normal(size=out.shape), jnp.float32)
    g_params, g_x = jax.grad(lambda p, x: jnp.sum(run(p, x, uniform.table) * cot), argnums=(0, 1))(params, xj)
    st32 = {k: jnp.asarray(v, jnp.float32) for k, v in st.items()}
    g_st, g_xref = jax.grad(lambda s, x: jnp.sum(hf_block(family, config, s, x, xp=jnp) * cot), argnums=(0, 1))(
        st32, xj
    )
    assert rel_err(g_x, g_xref) < 1e-5
    # each replica's gradient is its expert's: the HF gradients laid out over the same placement
    g_want = moe_from_hf(config, {k: np.asarray(v) for k, v in g_st.items()}, placement=placement).params
    for k in params:
        if k == "score_bias":
            assert not np.asarray(g_params[k]).any()  # selection only: no gradient
            continue
        assert rel_err(g_params[k], g_want[k]) < 1e-5, k


# qwen2_moe adds the gated shared expert, which runs beside the exchange (no table touches it): make test-all.
# gpt_oss: make test-all too (the fast suite keeps deepseek_v3; tests/test_option_coverage_layer.py checks every
# schedule, fetch and dispatch option keeps the output on the plain layer).
@pytest.mark.parametrize(
    "family",
    ["deepseek_v3", pytest.param("gpt_oss", marks=pytest.mark.slow), pytest.param("qwen2_moe", marks=pytest.mark.slow)],
)
def test_every_mode_table_and_cascade_schedule_keeps_the_output(family, mesh):
    config = FAMILY_CONFIGS[family]
    st = hf_state(family, config, seed=2)
    placement = _family_placement(config, seed=3)
    cfg, params, _ = moe_from_hf(config, st, placement=placement, mesh=mesh)
    x = _x(cfg.hidden, seed=4)
    want = hf_block(family, config, st, x)
    quota = _layer(
        mesh,
        dataclasses.replace(cfg, dispatch_mode="quota"),
        params,
        placement,
        x,
        tables=dispatch_tables.static(placement),
    ).out
    assert rel_err(quota, want) < 1e-5
    # CascadeEP: two launch groups and a weight fetch (biases and the score bias travel with the weights)
    donor = 5
    held = [int(e) for e in placement.phy2log[donor * S : (donor + 1) * S]]
    schedule = LaunchSchedule.stragglers(D, late=(donor, 7))
    cascade = dataclasses.replace(
        cfg, schedule=schedule, fetches=(WeightFetch(helper=1, donor=donor, experts=tuple(held[:1])),)
    )
    out = _layer(mesh, cascade, params, placement, x).out
    assert len(schedule.groups) > 1 and rel_err(out, want) < 1e-5


@pytest.mark.parametrize("family", FAMILIES)
def test_module_under_nnx_jit_matches_hf(family, mesh):
    config = FAMILY_CONFIGS[family]
    st = hf_state(family, config, seed=6)
    cfg, params, placement = moe_from_hf(config, st, placement=_family_placement(config), mesh=mesh)
    moe = tempo_jax.MoE(cfg, placement, mesh=mesh, rngs=nnx.Rngs(params=0, dispatch=1), params=params)
    x = _x(cfg.hidden, seed=7)
    out = nnx.jit(lambda m, x: m(x))(moe, jnp.asarray(x.reshape(4, T // 4, -1), jnp.float32))
    assert rel_err(np.asarray(out).reshape(T, -1), hf_block(family, config, st, x)) < 1e-5
    assert float(moe.aux_loss.get_value()) > 0 and float(moe.z_loss.get_value()) > 0
    assert float(moe.expert_load.get_value().sum()) == T * cfg.top_k


def test_bfloat16_layer_within_tolerance(mesh):
    family = "deepseek_v3"
    config = FAMILY_CONFIGS[family]
    st = hf_state(family, config, seed=8)
    cfg, params, placement = moe_from_hf(config, st, placement=_family_placement(config), dtype=jnp.bfloat16)
    assert params["w_gate"].dtype == jnp.bfloat16 and params["router"].dtype == jnp.float32
    x = _x(cfg.hidden, seed=9)
    out = _layer(mesh, cfg, params, placement, x).out
    # bf16 experts (8-bit mantissa: 2^-8 relative per rounding, a few roundings deep): 3e-2 of the output's scale
    assert rel_err(out, hf_block(family, config, st, x)) < 3e-2


# ------------------------------------------------------------------------------------------------ refusals
def test_import_refuses_what_the_layer_cannot_express():
    config = FAMILY_CONFIGS["mixtral"]
    st = hf_state("mixtral", config)
    with pytest.raises(ValueError, match="model_type 'llama' is not a MoE family"):
        moe_from_hf({**config, "model_type": "llama"}, st)
    with pytest.raises(ValueError, match=r"lacks 'experts.3.w2.weight' \(expected shape \[16, 8\]\)"):
        moe_from_hf(config, {k: v for k, v in st.items() if k != "experts.3.w2.weight"})
    with pytest.raises(ValueError, match=r"state\['gate.weight'\] has shape \[8, 15\], expected \[8, 16\]"):
        moe_from_hf(config, {**st, "gate.weight": st["gate.weight"][:, :15]})
    with pytest.raises(ValueError, match="unexpected tensors .*'experts.0.w1.bias'"):
        moe_from_hf(config, {**st, "experts.0.w1.bias": np.zeros(8)})
    with pytest.raises(ValueError, match="quantized tensors"):
        moe_from_hf(config, {**st, "experts.0.w1.weight_scale_inv": np.ones((1, 1))})
    with pytest.raises(ValueError, match="hidden_act 'gelu'"):
        moe_from_hf({**config, "hidden_act": "gelu"}, st)
    with pytest.raises(ValueError, match=r"config\[\'num_local_experts\'\] must be an integer"):
        moe_config_from_hf({**config, "num_local_experts": 8.0}, slots_per_rank=S)
    ds = FAMILY_CONFIGS["deepseek_v3"]
    with pytest.raises(ValueError, match="cannot be expressed: RouterConfig: n_group=3 does not divide experts=8"):
        moe_config_from_hf({**ds, "n_group": 3}, slots_per_rank=S)
    # DeepSeek-V4's hash-routed first layers are not MoE layers the layer can express
    assert moe_layer_ids(FAMILY_CONFIGS["deepseek_v4"]) == [1, 2]
    assert moe_layer_ids(
        {**FAMILY_CONFIGS["qwen3_moe"], "decoder_sparse_step": 2, "num_hidden_layers": 6, "mlp_only_layers": [3]}
    ) == [1, 5]
    assert moe_layer_ids(FAMILY_CONFIGS["deepseek_v3"]) == [1, 2]


def test_params_are_checked_against_the_config(mesh):
    config = FAMILY_CONFIGS["gpt_oss"]
    cfg, params, placement = moe_from_hf(config, hf_state("gpt_oss", config), placement=_family_placement(config))
    with pytest.raises(ValueError, match=r"params lack b_down \[16, 16\]"):
        _layer(mesh, cfg, {k: v for k, v in params.items() if k != "b_down"}, placement, _x(16))
    with pytest.raises(ValueError, match=r"params \['router_bias'\] are not used by this config"):
        plain = dataclasses.replace(cfg, router=dataclasses.replace(cfg.router, bias=False))
        _layer(mesh, plain, params, placement, _x(16))
    with pytest.raises(ValueError, match=r"params\['w_up'\] has shape"):
        _layer(mesh, cfg, {**params, "w_up": params["w_up"][:, :, :4]}, placement, _x(16))


# ------------------------------------------------------------------------------------------------ checkpoints
def test_load_moe_layers_round_trips_a_sharded_checkpoint(tmp_path):
    family = "qwen2_moe"
    config = {**FAMILY_CONFIGS[family], "num_hidden_layers": 3, "mlp_only_layers": [1]}
    states = {layer: hf_state(family, config, seed=layer) for layer in (0, 2)}
    tensors = {
        f"model.layers.{layer}.mlp.{k}": v.astype(np.float32) for layer, st in states.items() for k, v in st.items()
    }
    tensors["model.embed_tokens.weight"] = np.ones((32, 16), np.float32)  # not an MoE tensor: never read
    tensors["model.layers.1.mlp.gate_proj.weight"] = np.ones((8, 16), np.float32)  # the dense layer
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for fname, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(tmp_path / fname))
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": {k: f for f, keys in shards.items() for k in keys}})
    )
    (tmp_path / "config.json").write_text(json.dumps(config))
    layers = load_moe_layers(tmp_path)
    assert sorted(layers) == [0, 2]
    for layer, (cfg, params, placement) in layers.items():
        want_cfg, want, want_pl = moe_from_hf(config, states[layer])
        assert cfg == want_cfg and placement.phy2log.tolist() == want_pl.phy2log.tolist()
        for k in want:
            np.testing.assert_allclose(np.asarray(params[k]), np.asarray(want[k]), rtol=1e-7, atol=0)
    # with a mesh and a placement: sharded over ep, each device filled from its own slots' experts only
    mesh, pl = make_ep_mesh(D), _placement(8, seed=4)
    sharded = load_moe_layers(tmp_path, mesh=mesh, placement=pl)
    for layer, (cfg, params, placement) in sharded.items():
        want = moe_from_hf(config, states[layer], placement=pl).params
        assert placement is pl and cfg.slots_per_rank == S
        for k in want:
            assert params[k].sharding.spec == (
                jax.sharding.PartitionSpec("ep") if k.startswith("w_") else jax.sharding.PartitionSpec()
            ), k
            np.testing.assert_array_equal(np.asarray(params[k]), np.asarray(want[k]))
    assert sorted(load_moe_layers(tmp_path, layers=[2])) == [2]
    with pytest.raises(ValueError, match=r"layers \[1\] are not MoE layers"):
        load_moe_layers(tmp_path, layers=[1])
    with pytest.raises(ValueError, match="layers must be a list of integer layer ids"):
        load_moe_layers(tmp_path, layers="02")
    with pytest.raises(ValueError, match="is not a folder"):
        load_moe_layers(tmp_path / "config.json")


# ------------------------------------------------------------------------------------------------ presets
def test_presets_have_real_dimensions_and_sources():
    assert set(MOE_PRESETS) >= {
        "deepseek_v3",
        "deepseek_v4_flash",
        "deepseek_v4_pro",
        "glm_5_3",
        "qwen3_30b_a3b",
        "qwen3_235b_a22b",
        "mixtral_8x7b",
        "gpt_oss_20b",
        "gpt_oss_120b",
    }
    v3 = moe_preset("deepseek_v3", slots_per_rank=40)
    assert (v3.hidden, v3.ffn, v3.experts, v3.top_k) == (7168, 2048, 256, 8)
    assert (v3.router.n_group, v3.router.topk_group, v3.router.scaling, v3.shared.width) == (8, 4, 2.5, 2048)
    oss = moe_preset("gpt_oss_120b", slots_per_rank=16)
    assert oss.expert.activation == "gpt_oss" and oss.expert.limit == 7.0 and oss.router.scoring == "softmax_topk"
    assert (moe_preset("glm_5_3", slots_per_rank=32).experts, preset_spec("deepseek_v4_pro").ffn) == (256, 3072)
    for spec in MODEL_SPECS.values():
        assert spec.source and spec.moe_layers <= spec.layers
    small = moe_preset("deepseek_v3", slots_per_rank=2, experts=16, hidden=32, ffn=16)
    assert small.router.n_group == 8 and small.shared.width == 16
    with pytest.raises(ValueError, match="unknown MoE preset 'deepseek'"):
        moe_preset("deepseek", slots_per_rank=2)
    with pytest.raises(ValueError, match="multiple of its 8 groups"):
        moe_preset("deepseek_v3", slots_per_rank=2, experts=12)


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"router": RouterConfig(scoring="tanh")}, "unknown scoring 'tanh'"),
        ({"router": RouterConfig(n_group=3)}, "n_group=3 does not divide experts=8"),
        ({"router": RouterConfig(n_group=4, topk_group=5)}, "topk_group=5 exceeds n_group=4"),
        ({"router": RouterConfig(n_group=4, topk_group=1), "top_k": 3}, "top_k=3 exceeds the 1 kept groups' 2 experts"),
        ({"router": RouterConfig(balance_rate=0.1)}, "set score_bias=True"),
        ({"router": RouterConfig(scaling=0.0)}, "scaling must be > 0"),
        ({"router": RouterConfig(renorm_eps=float("nan"))}, "renorm_eps must be a finite"),
        ({"router": RouterConfig(scoring="softmax_topk", renorm_eps=1e-9)}, "would be ignored"),
        ({"router": RouterConfig(scoring="sparsemixer", score_bias=True)}, "sparsemixer chooses on the raw logits"),
        ({"router": RouterConfig(scoring="sparsemixer", mixer_eps=-0.1)}, "mixer_eps must be a finite number"),
        ({"router": "sigmoid"}, "MoEConfig.router must be a RouterConfig"),
        ({"expert": ExpertConfig(activation="gelu_fast")}, "unknown activation 'gelu_fast'"),
        ({"expert": ExpertConfig(limit=7.0)}, "'swiglu' has no clamp"),
        ({"expert": ExpertConfig(activation="gpt_oss", alpha=-1.0)}, "alpha must be"),
        ({"shared": SharedConfig(count=0, ffn=4)}, "SharedConfig.count must be"),
        ({"shared": 2}, "MoEConfig.shared must be a SharedConfig or None"),
        ({"router": RouterConfig(scoring="sigmoid", shared_rows=2)}, r"give shared=SharedConfig\(count=2"),
        (
            {"router": RouterConfig(scoring="sigmoid", shared_rows=2), "shared": SharedConfig(count=1, ffn=4)},
            "but shared has count=1",
        ),
        (
            {
                "router": RouterConfig(scoring="sigmoid", shared_rows=1),
                "shared": SharedConfig(count=1, ffn=4),
                "tensor_axis": "tensor",
            },
            "use them without tensor_axis",
        ),
        ({"router": RouterConfig(shared_rows=1)}, "needs an elementwise scoring"),
        ({"router": RouterConfig(bias_on="logits")}, "set score_bias=True"),
        ({"expert": ExpertConfig(activation="swiglu_softcap", gate_cap=4.0)}, "needs gate_cap= and up_cap="),
        ({"expert": ExpertConfig(activation="swiglu_post_clamp")}, "without a limit is plain 'swiglu'"),
        ({"shared": SharedConfig(count=1, ffn=4, gate_cap=2.0)}, "soft caps of activation 'swiglu_softcap'"),
        ({"output": OutputConfig(norm_eps=1e-5)}, "with norm=False it would be ignored"),
        ({"output": "norm"}, "MoEConfig.output must be an OutputConfig"),
    ],
)
def test_family_options_are_validated_at_the_config(kw, match):
    base = dict(hidden=16, ffn=8, experts=8, top_k=2, slots_per_rank=2)
    with pytest.raises(ValueError, match=match):
        MoEConfig(**{**base, **kw})


def test_router_weighted_shared_experts_refuse_replayed_routing():
    """Replayed routing carries the routed experts' weights only: a router that also weights the shared experts
    (Inkling) says so rather than leaving the shared experts unweighted."""
    cfg = MoEConfig(
        hidden=16,
        ffn=8,
        experts=8,
        top_k=2,
        slots_per_rank=1,
        router=RouterConfig(scoring="sigmoid", shared_rows=1, gain=True),
        shared=SharedConfig(count=1, ffn=8),
    )
    params = init_logical_params(jax.random.key(0), cfg)
    x = jnp.ones((4, 16))
    routing = (jnp.zeros((4, 2), jnp.int32), jnp.full((4, 2), 0.5))
    with pytest.raises(ValueError, match="replayed routing does not carry"):
        moe_reference(params, x, cfg, routing=routing)


@pytest.mark.parametrize("output", ["identity", "zero"])
def test_zero_computation_experts_run_nowhere_and_keep_the_output(output):
    """LongCat-Flash's zero-computation experts (ids E … E+Z−1): the layer on 8 devices equals the dense reference
    under every dispatch mode (sampled and quota tables over replicas), their pairs are computed by no rank (the
    ranks' rows are the other pairs), counted as neither invalid nor load, and replayed routing may name them."""
    mesh = make_ep_mesh(8)
    cfg = MoEConfig(
        hidden=16,
        ffn=8,
        experts=8,
        top_k=3,
        slots_per_rank=2,
        zero_experts=4,
        zero_expert_output=output,
        router=RouterConfig(score_bias=True, renormalize=False, scaling=2.0),
    )
    logical = init_logical_params(jax.random.key(0), cfg)
    logical["score_bias"] = logical["score_bias"].at[8:].set(0.05)  # the zero-computation experts chosen often
    x = jax.random.normal(jax.random.key(1), (64, 16))
    want = moe_reference(logical, x, cfg)
    placement = Placement.from_eplb(np.arange(8) + 1.0, 16, 8)
    params = tempo_jax.layer.to_physical(logical, placement, mesh=mesh)
    pa = dispatch_tables.placement_arrays(placement)
    for mode in ("sample", "quota"):
        c = dataclasses.replace(cfg, dispatch_mode=mode)
        res = jax.jit(
            lambda p, x, c=c: moe_forward(
                p, x, mesh=mesh, placement_arrays=pa, tables=dispatch_tables.uniform(placement), config=c
            )
        )(params, x)
        np.testing.assert_allclose(np.asarray(res.out), np.asarray(want), rtol=1e-5, atol=1e-5)
        ids = np.asarray(res.stats.topk_ids)
        on_zero = int((ids >= 8).sum())
        assert on_zero > 10
        assert int(res.stats.gpu_tokens.sum()) == ids.size - on_zero
        assert int(res.stats.invalid_ids.sum()) == 0 and int(res.aux.expert_load.sum()) == ids.size - on_zero
    replay = moe_forward(
        params,
        x,
        mesh=mesh,
        placement_arrays=pa,
        tables=dispatch_tables.uniform(placement),
        config=cfg,
        routing=(jnp.asarray(ids), jnp.full(ids.shape, 0.5)),
    )
    assert int(replay.stats.invalid_ids.sum()) == 0


def test_expert_sets_route_each_token_within_its_own_set():
    """ERNIE-4.5-VL's modality-split experts as `RouterConfig(expert_sets=2)`: each token's pairs land in its own
    set (a selection bias favouring the other set changes nothing), the layer on 8 devices — and the `MoE` module —
    equal the dense reference given the same ``expert_set``, and a bad ``expert_set`` is refused with the fix."""
    mesh = make_ep_mesh(8)
    cfg = MoEConfig(
        hidden=16,
        ffn=8,
        experts=8,
        top_k=2,
        slots_per_rank=1,
        router=RouterConfig(score_bias=True, expert_sets=2),
    )
    logical = init_logical_params(jax.random.key(0), cfg)
    logical["score_bias"] = logical["score_bias"].at[4:].set(5.0)  # the second set looks best to everyone
    x = jax.random.normal(jax.random.key(1), (32, 16))
    sets = jnp.asarray(np.arange(32) % 3 == 0, jnp.int32)
    want = moe_reference(logical, x, cfg, expert_set=sets)
    placement = Placement.from_eplb(np.ones(8), 8, 8)
    params = tempo_jax.layer.to_physical(logical, placement, mesh=mesh)
    pa, tables = dispatch_tables.placement_arrays(placement), dispatch_tables.uniform(placement)
    res = jax.jit(
        lambda p, x, s: moe_forward(p, x, mesh=mesh, placement_arrays=pa, tables=tables, config=cfg, expert_set=s)
    )(params, x, sets)
    np.testing.assert_allclose(np.asarray(res.out), np.asarray(want), rtol=1e-5, atol=1e-5)
    assert (np.asarray(res.stats.topk_ids) // 4 == np.asarray(sets)[:, None]).all()
    moe = tempo_jax.MoE(cfg, mesh=mesh, placement=placement, rngs=nnx.Rngs(0))
    for k, v in params.items():
        getattr(moe, k).set_value(v)
    np.testing.assert_allclose(np.asarray(moe(x, expert_set=sets)), np.asarray(want), rtol=1e-5, atol=1e-5)
    run = dict(mesh=mesh, placement_arrays=pa, tables=tables, config=cfg)
    with pytest.raises(ValueError, match=r"expert_set values must lie in \[0, 2\)"):
        moe_forward(params, x, expert_set=sets + 1, **run)
    with pytest.raises(ValueError, match="must be an integer"):
        moe_forward(params, x, expert_set=sets[:5], **run)
    with pytest.raises(ValueError, match="expert_sets is 1"):
        moe_forward(params, x, expert_set=sets, **{**run, "config": dataclasses.replace(cfg, router=RouterConfig())})


@pytest.mark.parametrize("path", ["ring", "cascade", "ingraph_copies"])
def test_latent_and_zero_computation_experts_keep_the_output_on_every_exchange_path(path):
    """The new block options that change what is sent (latent experts: L-wide rows; each expert's output normed;
    zero-computation experts: pairs sent nowhere) through the ring, a CascadeEP launch schedule and the in-graph plan
    with dynamic copies, on 8 devices under jit: output and the latent parameters' gradients = the dense reference."""
    mesh = make_ep_mesh(8)
    cfg = MoEConfig(
        hidden=16,
        ffn=8,
        experts=8,
        top_k=2,
        slots_per_rank=2,
        latent=LatentConfig(width=12, norm=True),
        expert=ExpertConfig(out_norm_eps=1e-6),
        zero_experts=2,
        zero_expert_output="zero",
        router=RouterConfig(scoring="sigmoid", score_bias=True),
        shared=SharedConfig(count=1, ffn=8),
    )
    options = {
        "ring": dict(exchange="ring"),
        "cascade": dict(schedule=LaunchSchedule.stragglers(8, late=(5, 7))),
        "ingraph_copies": dict(
            dispatch="ingraph",
            dispatch_mode="quota",
            cost=PRESETS["dsv3_fp8_offline"],
            dynamic_slots=1,
            copy_cost=CopyCost(expert_bytes=1.0, link_gbps=1e6),
        ),
    }[path]
    c = dataclasses.replace(cfg, **options)
    keys = iter(jax.random.split(jax.random.key(7), 4))
    logical = {
        k: v + 0.3 * jax.random.normal(next(keys), v.shape)
        if k in ("latent_norm", "expert_out_scale", "score_bias")
        else v
        for k, v in init_logical_params(jax.random.key(0), cfg).items()
    }
    x = jax.random.normal(jax.random.key(1), (64, 16))
    placement = Placement.from_eplb(np.arange(8) + 1.0, 16, 8)
    params = tempo_jax.layer.to_physical(logical, placement, mesh=mesh)
    tables = None if c.dispatch == "ingraph" else dispatch_tables.uniform(placement)
    pa = dispatch_tables.placement_arrays(placement)

    def out(p):
        return moe_forward(p, x, mesh=mesh, placement_arrays=pa, tables=tables, config=c).out

    np.testing.assert_allclose(np.asarray(jax.jit(out)(params)), np.asarray(moe_reference(logical, x, cfg)), atol=2e-6)
    got = jax.jit(jax.grad(lambda p: jnp.sum(out(p) ** 2)))(params)
    want = jax.grad(lambda p: jnp.sum(moe_reference(p, x, cfg) ** 2))(logical)
    for k in ("latent_in", "latent_norm", "latent_out", "expert_out_scale"):
        np.testing.assert_allclose(np.asarray(got[k]), np.asarray(want[k]), rtol=1e-4, atol=1e-4, err_msg=k)


def _zaya_like(carried: bool) -> MoEConfig:
    return MoEConfig(
        hidden=16,
        ffn=8,
        experts=8,
        top_k=2,
        slots_per_rank=2,
        zero_experts=1,
        zero_expert_output="zero",
        router=RouterConfig(score_bias=True, renormalize=False, mlp_width=8, carried_state=carried, norm_eps=1e-5),
    )


def test_a_router_state_carried_through_two_modules_equals_the_reference_chain():
    """A router MLP carrying its state between layers (Zaya), as a model runs it: two `MoE` modules under
    ``nnx.jit`` on 8 devices, layer 0 handing its router state to layer 1 (``MoE`` returns ``(y, router_state)``),
    equal the dense reference chain (`route`'s state in between); the state changes layer 1's output; and a state the
    router would not read, of another shape, or beside replayed routing is refused."""
    mesh = make_ep_mesh(D)
    placement = Placement.from_eplb(np.arange(8) + 1.0, 16, 8)
    first = tempo_jax.MoE(_zaya_like(False), placement, mesh=mesh, rngs=nnx.Rngs(0))
    second = tempo_jax.MoE(_zaya_like(True), placement, mesh=mesh, rngs=nnx.Rngs(1))
    x = jax.random.normal(jax.random.key(2), (2, 32, 16))

    @nnx.jit
    def chain(a, b, x):
        y0, s0 = a(x)
        y1, s1 = b(x + y0, router_state=s0)
        return y1, s1

    y1, s1 = chain(first, second, x)
    tokens = x.reshape(-1, 16)
    p0, p1 = first.logical_params(), second.logical_params()
    s0 = tempo_jax.layer.routing.route(tokens, p0, first.config.router, 2).state
    y0 = moe_reference(p0, tokens, first.config)
    want = moe_reference(p1, tokens + y0, second.config, router_state=s0)
    np.testing.assert_allclose(np.asarray(y1).reshape(-1, 16), np.asarray(want), atol=2e-6)
    want_s = tempo_jax.layer.routing.route(tokens + y0, p1, second.config.router, 2, state=s0).state
    np.testing.assert_allclose(np.asarray(s1).reshape(-1, 8), np.asarray(want_s), atol=2e-6)
    assert rel_err(moe_reference(p1, tokens + y0, second.config), want) > 1e-2  # the state is read
    pa, tables = dispatch_tables.placement_arrays(placement), dispatch_tables.uniform(placement)
    run = dict(mesh=mesh, placement_arrays=pa, tables=tables)
    with pytest.raises(ValueError, match="carried_state=True"):
        moe_forward(first.params(), tokens, config=first.config, router_state=s0, **run)
    with pytest.raises(ValueError, match=r"router_state must be a floating-point \[T=64, Rh=8\]"):
        moe_forward(second.params(), tokens, config=second.config, router_state=s0[:, :4], **run)
    with pytest.raises(ValueError, match="routing= replaces the router"):
        routing = (jnp.zeros((64, 2), jnp.int32), jnp.ones((64, 2)))
        moe_forward(second.params(), tokens, config=second.config, router_state=s0, routing=routing, **run)
    with pytest.raises(ValueError, match="needs mlp_width > 0"):
        RouterConfig(carried_state=True).validate(8, 2)


def test_a_router_mlp_runs_on_each_rank_for_its_own_tokens_only():
    """The router MLP (Zaya) adds, per device of the compiled 8-device layer (`cost_analysis`), about the FLOPs of
    its own T / 8 tokens' MLP — not all T tokens' (measured 1.12×: the MLP's matmuls plus its norm and GELUs)."""
    mesh = make_ep_mesh(D)
    placement = Placement.spread(8, D, 2)
    pa, tables = dispatch_tables.placement_arrays(placement), dispatch_tables.uniform(placement)
    n, H, Rh = 512, 64, 256

    def flops(router):
        cfg = MoEConfig(hidden=H, ffn=32, experts=8, top_k=1, slots_per_rank=2, router=router)
        p = tempo_jax.layer.init_params(jax.random.key(0), cfg, placement, mesh=mesh)
        f = jax.jit(
            lambda p, x: (
                moe_forward(p, x, mesh=mesh, placement_arrays=pa, tables=tables, config=cfg, aux_losses=False).out
            )
        )
        return f.lower(p, jnp.ones((n, H))).compile().cost_analysis()["flops"]

    extra = flops(RouterConfig(mlp_width=Rh)) - flops(RouterConfig())
    own = 2 * (n // D) * (H * Rh + 2 * Rh * Rh + Rh * 8 - H * 8)  # the MLP's matmuls on this device's tokens
    assert 1.0 <= extra / own < 1.5, extra / own
