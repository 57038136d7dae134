"""Option coverage of the MoE layer (issue 40): every field of `MoEConfig` and of its sub-configs (`RouterConfig`,
`ExpertConfig`, `SharedConfig`) changes the layer's result or is refused in combination, generated from the
dataclasses' fields, so a new field without an entry here fails until someone says what it changes.

What "changes" means follows the central invariant: a field either changes the output (``out``: what the layer
computes, checked on the dense `moe_reference` — one eager pass, no compile — which the layer equals for every
family in tests/test_families.py; ``drops``: the layer drops pairs), or keeps the output and changes where the work
ran (``where``: the statistics — placement, dispatch, schedule, rounds), or keeps both (``same``: an implementation
choice, e.g. the grouped-GEMM kernel). Each run uses one fixed batch and logical parameters with every array random
(biases and the score bias included); layer runs lay them out over the placement the config's ``slots_per_rank``
gives, on 8 fake devices.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numeric import assert_close

from solvers import PRESETS, CopyCost, LaunchSchedule, Placement
from tempo_jax.layer import MoEConfig, fp8, make_mesh, moe_forward, moe_reference, to_physical
from tempo_jax.layer import tables as dispatch_tables
from tempo_jax.layer.cascade_plan import WeightFetch
from tempo_jax.layer.experts import ExpertConfig, LatentConfig, OutputConfig, SharedConfig
from tempo_jax.layer.params import param_shapes
from tempo_jax.layer.routing import RouterConfig

D, E, H, F, T = 8, 16, 16, 8, 256
BASE = dict(hidden=H, ffn=F, experts=E, top_k=2, slots_per_rank=3, capacity_factor=1.0)
COST = PRESETS["proxy_serving_3term"]  # its token pieces make the in-graph plan's rounds matter at this size
INGRAPH = dict(dispatch="ingraph", dispatch_mode="quota", cost=COST)
FREE_COPY = CopyCost(expert_bytes=1.0, link_gbps=1e6)  # a copy that costs nothing: the plan makes every one that helps


def _config(**kw) -> MoEConfig:
    return MoEConfig(**{**BASE, **kw})


def _multi_axis(cfg: MoEConfig) -> bool:
    """The mesh options run on data 2 × ep 2 × tensor 2 (both runs of their entry: the context names batch_axes)."""
    return cfg.batch_axes is not None or cfg.tensor_axis is not None or cfg.fsdp_axis is not None


def _placement(cfg: MoEConfig) -> Placement:  # EPLB from a falling long-run load (hot experts get replicas)
    ranks = 2 if _multi_axis(cfg) else D
    return Placement.from_eplb(np.linspace(8.0, 1.0, cfg.experts), ranks * cfg.slots_per_rank, ranks)


def _mesh(cfg: MoEConfig) -> jax.sharding.Mesh:
    if _multi_axis(cfg):
        return make_mesh(data=2, ep=2, tensor=2)
    if cfg.node_axis is not None:  # the same D ranks as 2 nodes × D/2: the same slots on the same ranks
        auto = (jax.sharding.AxisType.Auto,) * 2
        return jax.make_mesh((2, D // 2), (cfg.node_axis, cfg.axis), axis_types=auto, devices=jax.devices()[:D])
    return jax.make_mesh((D,), (cfg.axis,), axis_types=(jax.sharding.AxisType.Auto,), devices=jax.devices()[:D])


def _fetch() -> tuple[WeightFetch, ...]:  # rank 1 fetches the first expert rank 5 holds (base placement)
    return (WeightFetch(helper=1, donor=5, experts=(int(_placement(_config()).phy2log[5 * 3]),)),)


#: field → (another value, the context both runs share, what the change shows in: "out" / "drops" / "where" / "same",
#: the options the value is refused without, or None when it acts alone).
LAYER = {
    "hidden": (24, {}, "out", None),
    "ffn": (12, {}, "out", None),
    "experts": (8, {}, "out", None),
    "top_k": (3, {}, "out", None),
    "slots_per_rank": (4, {}, "where", None),
    "dtype": (jnp.bfloat16, {}, "out", None),
    "exchange": ("padded", {}, "same", None),  # "auto" is the padded exchange on CPU; "ragged": gpu_check.sh
    "gmm_impl": ("ragged_dot", {}, "same", None),
    "interpret": (True, {}, "same", None),  # the Pallas kernels (dispatch and grouped GEMM) in interpret mode
    "dispatch_mode": ("quota", {}, "where", None),
    "router": (RouterConfig(scoring="sigmoid"), {}, "out", None),
    "expert": (ExpertConfig(activation="gpt_oss"), {}, "out", None),
    "shared": (SharedConfig(count=1, ffn=8), {}, "out", None),
    "output": (OutputConfig(bias=True, norm=True), {}, "out", None),
    "zero_experts": (2, {}, "out", None),  # two zero-computation (identity) experts the router may choose
    "zero_expert_output": ("zero", {"zero_experts": 2}, "out", {"zero_experts": 2}),
    "latent": (LatentConfig(width=12, norm=True), {}, "out", None),  # the experts at width 12 behind projections
    "capacity": (2, {}, "drops", None),  # two rows per block: pairs dropped
    "capacity_factor": (4.0, {}, "where", None),  # fewer, larger rounds
    "axis": ("experts", {}, "same", None),
    "node_axis": ("node", {}, "same", None),  # the slots over node × ep: the flat exchange over both, same result
    # each token once per node, forwarded inside it: the same pairs on the same slots, the same statistics
    "node_exchange": (
        "two_hop",
        {"node_axis": "node", "capacity": None},
        "same",
        {"node_axis": "node", "capacity": None},
    ),
    # the mesh options, on data 2 × ep 2 × tensor 2 (8 slots per rank): tokens split over data change the per-device
    # statistics ([4] → [8] shards); F split over the tensor axis and the weights over data (FSDP) change neither
    "batch_axes": (("data",), {"batch_axes": (), "slots_per_rank": 8}, "where", None),
    "tensor_axis": ("tensor", {"batch_axes": ("data",), "slots_per_rank": 8}, "same", None),
    "fsdp_axis": ("data", {"batch_axes": ("data",), "slots_per_rank": 8}, "same", None),
    "schedule": (LaunchSchedule.stragglers(D, late=(5, 7)), {}, "where", None),
    "fetches": (_fetch(), {}, "where", None),
    # the backward's collective for replicas' gradients: no forward change (test_meshes checks the HLO and gradients)
    "replica_sync": ("exchange", {}, "same", None),
    "dispatch": ("ingraph", {"dispatch_mode": "quota"}, "where", {"cost": COST}),
    "cost": (PRESETS["dsv3_fp8_offline"], INGRAPH, "where", {"dispatch": "ingraph"}),
    "dispatch_rounds": (1, INGRAPH, "where", {"dispatch": "ingraph"}),
    "dynamic_slots": (1, INGRAPH, "where", {"copy_cost": FREE_COPY}),  # copies of the hot experts take pairs
    "copy_cost": (FREE_COPY, INGRAPH, "where", {"dynamic_slots": 1}),
    "expert_dtype": ("fp8_block", {}, "out", None),  # the experts quantized to e4m3 (one scale per weight here)
    "fp8_block": ((4, 4), {"expert_dtype": "fp8_block"}, "out", {"expert_dtype": "fp8_block"}),
    # the rows entering each grouped GEMM quantized to e4m3 per token and block (a scale per 8 columns here)
    "fp8_activations": (True, {"expert_dtype": "fp8_block", "fp8_block": (8, 8)}, "out", {"expert_dtype": "fp8_block"}),
}


def _inputs(cfg: MoEConfig) -> tuple[dict, jax.Array]:
    """Logical parameters with every array random (the score bias too; router arrays float32, the rest in the
    config's dtype) and the batch ``x [T, H]``: numpy draws, so no config compiles an initialiser."""
    rng = np.random.default_rng(1)
    logical = {
        n: jnp.asarray(
            rng.normal(size=shape) / np.sqrt(shape[-2] if len(shape) > 1 else 4),
            jnp.float32 if n.startswith(("router", "score")) else cfg.dtype,
        )
        for n, shape in sorted(
            param_shapes(
                dataclasses.replace(cfg, expert_dtype=None, fp8_block=(128, 128), fp8_activations=False)
            ).items()
        )
    }
    if cfg.expert_dtype == "fp8_block":
        logical = fp8.quantize_params(logical, cfg.fp8_block)
    return logical, jnp.asarray(rng.normal(size=(T, cfg.hidden)), jnp.float32)


_reference = jax.jit(moe_reference, static_argnums=2)


def _output(cfg: MoEConfig) -> np.ndarray:
    """What the config computes: the dense reference's ``out [T, H]`` (float32)."""
    logical, x = _inputs(cfg)
    state = None
    if cfg.router.carried_state:  # the previous layer's router state [T, Rh]
        state = jnp.asarray(np.random.default_rng(2).normal(size=(T, cfg.router.mlp_width)), jnp.float32)
    if cfg.router.max_nodes:  # the experts in order over 4 nodes (the reference needs them concrete: not jitted)
        nodes = np.arange(cfg.experts) // (cfg.experts // 4)
        return np.asarray(moe_reference(logical, x, cfg, router_state=state, expert_nodes=nodes), np.float32)
    return np.asarray(_reference(logical, x, cfg, router_state=state), np.float32)


def _differ(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape != b.shape or not np.allclose(a, b, rtol=1e-3, atol=1e-3)


def _hot_routing(cfg: MoEConfig) -> tuple[np.ndarray, np.ndarray]:
    """Replayed routing ``(ids [T, K], weights [T, K])`` that favours the hot (replicated) experts, so where pairs
    go is a real choice: dispatch tables, in-graph plans and their rounds all act on it."""
    rng = np.random.default_rng(0)
    p = np.linspace(8.0, 1.0, cfg.experts) ** 3
    ids = np.stack([rng.choice(cfg.experts, cfg.top_k, replace=False, p=p / p.sum()) for _ in range(T)])
    return ids.astype(np.int32), np.full(ids.shape, 1.0 / cfg.top_k, np.float32)


def _run(cfg: MoEConfig):
    """``(out [T, H] float32, statistics)`` of one layer call on `_hot_routing` (statistics: `MoEStats`, numpy)."""
    placement, mesh = _placement(cfg), _mesh(cfg)
    logical, x = _inputs(cfg)
    params = to_physical(logical, placement, mesh=mesh, config=cfg)
    pa = dispatch_tables.placement_arrays(placement)
    tables = None if cfg.dispatch == "ingraph" else dispatch_tables.uniform(placement)
    res = moe_forward(
        params,
        x,
        mesh=mesh,
        placement_arrays=pa,
        tables=tables,
        config=cfg,
        key=jax.random.key(4),
        routing=_hot_routing(cfg),
    )
    stats = {k: np.asarray(v) for k, v in res.stats._asdict().items() if k not in ("topk_ids",)}
    return np.asarray(res.out, np.float32), stats


@pytest.fixture(scope="module")
def runs():
    cache = {}

    def run(**kw):
        cfg = _config(**kw)
        if cfg not in cache:
            cache[cfg] = _run(cfg)
        return cache[cfg]

    return run


def _same_stats(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(a[k].shape == b[k].shape and (a[k] == b[k]).all() for k in a)


def test_every_layer_option_has_an_entry():
    assert {f.name for f in dataclasses.fields(MoEConfig)} == set(LAYER), "say what the new option changes"


@pytest.mark.parametrize("name", sorted(LAYER))
def test_each_layer_option_changes_the_result_or_is_refused_without_what_it_needs(name, runs):
    value, context, shows, needs = LAYER[name]
    if needs is not None:
        with pytest.raises(ValueError, match=name):
            _config(**{**{k: v for k, v in context.items() if k not in needs}, name: value})
    changed = {**context, **(needs or {}), name: value}
    if shows == "out":
        assert _differ(_output(_config(**context)), _output(_config(**changed))), name
        return
    out0, st0 = runs(**context)
    out1, st1 = runs(**changed)
    if shows == "drops":
        assert st1["drops"].sum() > 0 == st0["drops"].sum() and _differ(out0, out1), name
        return
    assert_close(out1, out0)  # the central invariant: where the work ran never changes the output
    assert _same_stats(st0, st1) == (shows == "same"), name


# ------------------------------------------------------------------------------------------------ sub-configs
#: RouterConfig / ExpertConfig / SharedConfig field → (another value, the fields of the same sub-config both runs
#: share, the sub-config fields the value is refused without or None). Every one changes the output.
ROUTER = {
    "scoring": ("sqrt_softplus", {}, None),
    "bias": (True, {}, None),
    "score_bias": (True, {}, None),
    "n_group": (4, {"topk_group": 1}, None),
    "topk_group": (3, {"n_group": 4}, None),
    "group_score": ("max", {"n_group": 4, "topk_group": 2}, {"n_group": 4, "topk_group": 2}),
    "renormalize": (False, {}, None),
    "renorm_eps": (0.5, {}, None),
    "scaling": (2.5, {}, None),
    "balance_rate": (0.1, {"score_bias": True}, {"score_bias": True}),  # moves the score bias: see below
    "weight_on": ("input", {}, None),
    "mixer_eps": (0.5, {"scoring": "sparsemixer"}, {"scoring": "sparsemixer"}),
    "input_norm": (True, {}, None),
    "norm_eps": (0.5, {"input_norm": True}, {"input_norm": True}),
    "input_scale": (True, {}, None),
    "input_multiplier": (0.25, {}, None),
    "expert_scale": (True, {}, None),
    "bias_on": ("logits", {"score_bias": True}, {"score_bias": True}),
    # the shared experts weighted by two more router columns (the layer's shared experts given by LAYER_CONTEXT)
    "shared_rows": (2, {"scoring": "sigmoid"}, {"scoring": "sigmoid"}),
    "gain": (True, {}, None),
    # one pair per expert per window instead of a capacity nothing reaches; windows of 2 tokens instead of all T
    "expert_capacity": (1, {"capacity_window": 2, "expert_capacity": 50}, {"capacity_window": 2}),
    "capacity_window": (2, {"expert_capacity": 1, "capacity_window": T}, {"expert_capacity": 1}),
    "expert_sets": (2, {}, None),  # every token (no expert_set given) then chooses among the first half only
    "mlp_width": (8, {}, None),  # the router an MLP of width 8 over the token
    # the previous layer's router state added (`_output` gives one where the router carries it)
    "carried_state": (True, {"mlp_width": 8}, {"mlp_width": 8}),
    "max_nodes": (1, {}, None),  # each token's experts on its best node only (`_output`: the experts over 4 nodes)
}
#: MoEConfig fields both runs of a sub-config entry share, where the option needs them
LAYER_CONTEXT = {
    ("router", "shared_rows"): {"shared": SharedConfig(count=2, ffn=4)},
    ("router", "max_nodes"): {"node_axis": "node"},  # node-limited routing counts the nodes of node_axis
}
EXPERT = {
    "activation": ("gpt_oss", {}, None),
    "bias": (True, {}, None),
    "alpha": (0.5, {"activation": "gpt_oss"}, {"activation": "gpt_oss"}),
    "limit": (0.25, {"activation": "gpt_oss"}, {"activation": "gpt_oss"}),
    "gate_cap": (0.5, {"activation": "swiglu_softcap", "gate_cap": 30.0, "up_cap": 30.0}, {"activation": None}),
    "up_cap": (0.5, {"activation": "swiglu_softcap", "gate_cap": 30.0, "up_cap": 30.0}, {"activation": None}),
    "out_norm_eps": (1e-6, {}, None),  # each expert's output scaled and RMS-normed before its weight
}
SHARED = {
    "count": (2, {}, None),
    "ffn": (4, {}, None),
    "gated": (True, {}, None),
    "limit": (0.25, {}, None),
    "scale": (0.5, {}, None),
    "activation": ("gpt_oss", {}, None),
    "alpha": (0.5, {"activation": "gpt_oss"}, {"activation": "gpt_oss"}),
    "gate_cap": (0.5, {"activation": "swiglu_softcap", "gate_cap": 30.0, "up_cap": 30.0}, {"activation": None}),
    "up_cap": (0.5, {"activation": "swiglu_softcap", "gate_cap": 30.0, "up_cap": 30.0}, {"activation": None}),
}
OUTPUT = {"bias": (True, {}, None), "norm": (True, {}, None), "norm_eps": (0.5, {"norm": True}, {"norm": True})}
LATENT = {
    "width": (8, {"width": 12}, None),
    "norm": (True, {"width": 12}, None),
    "norm_eps": (0.5, {"width": 12, "norm": True}, {"norm": True}),
}
SUB = {
    "router": (RouterConfig, ROUTER),
    "expert": (ExpertConfig, EXPERT),
    "shared": (SharedConfig, SHARED),
    "output": (OutputConfig, OUTPUT),
    "latent": (LatentConfig, LATENT),
}


@pytest.mark.parametrize("sub", sorted(SUB))
def test_every_sub_config_option_has_an_entry(sub):
    kind, table = SUB[sub]
    assert {f.name for f in dataclasses.fields(kind)} == set(table), f"say what the new {kind.__name__} option changes"


@pytest.mark.parametrize(("sub", "name"), [(s, n) for s in sorted(SUB) for n in sorted(SUB[s][1])])
def test_each_sub_config_option_changes_the_output_or_is_refused_without_what_it_needs(sub, name):
    kind, table = SUB[sub]
    value, context, needs = table[name]
    layer = LAYER_CONTEXT.get((sub, name), {})
    if needs is not None:
        with pytest.raises(ValueError, match=name):
            _config(**layer, **{sub: kind(**{**{k: v for k, v in context.items() if k not in needs}, name: value})})
    if name == "balance_rate":
        return  # it acts on the score bias between calls, not on one call's output: test_balance_rate_acts
    before, after = (_output(_config(**layer, **{sub: kind(**kw)})) for kw in (context, {**context, name: value}))
    assert _differ(before, after), f"{sub}.{name}"


def test_balance_rate_acts():
    from flax import nnx

    from tempo_jax import MoE

    cfg = _config(router=RouterConfig(score_bias=True, balance_rate=0.1))
    moe = MoE(cfg, _placement(cfg), mesh=_mesh(cfg), rngs=nnx.Rngs(0))
    before = np.asarray(moe.score_bias[...])
    moe(jax.random.normal(jax.random.key(3), (T, H)))
    assert not np.array_equal(np.asarray(moe.score_bias[...]), before)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"router": RouterConfig(renormalize=False, renorm_eps=1e-6)}, "renorm_eps"),
        ({"router": RouterConfig(group_score="max")}, "group_score"),
        ({"router": RouterConfig(mixer_eps=0.1)}, "mixer_eps"),
        ({"router": RouterConfig(norm_eps=1e-3)}, "norm_eps"),
        ({"expert": ExpertConfig(activation="geglu_tanh", limit=1.0)}, "has no clamp"),
        ({"expert": ExpertConfig(alpha=1.0)}, "alpha"),
        ({"expert": ExpertConfig(activation="swiglu_clamp")}, "without a limit"),
    ],
)
def test_sub_config_options_that_could_not_act_are_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        _config(**kw)
