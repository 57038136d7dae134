"""Gemma 4's MoE against Google's own JAX library (`gemma.gm.nn.gemma4._moe.MoE`, fixture written by
`scripts/make_gemma_fixture.py`), and the router input / per-expert scale surfaces it brought to the layer.

transformers' `Gemma4TextRouter` / `Gemma4TextExperts` are compared in `tests/test_hf_import.py` (fixture
``gemma4_text``); this file holds the second, independent implementation, and the layer's own API around the router
input: the nnx module, ``moe_forward`` on 8 devices, under ``jit``, gradients, and bad input.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import tempo_jax
from solvers import Placement
from tempo_jax.layer import tables as dispatch_tables
from tempo_jax.layer.config import make_ep_mesh
from tempo_jax.layer.moe import moe_forward, moe_reference
from tempo_jax.layer.params import to_physical

Z = np.load(Path(__file__).resolve().parent / "fixtures" / "gemma" / "moe.npz")
H, E, F = Z["param/router_scale"].shape[0], Z["param/per_expert_scale"].shape[0], Z["param/linear"].shape[1]
GEMMA4_TEXT = {
    "model_type": "gemma4_text",
    "hidden_size": H,
    "num_hidden_layers": 1,
    "enable_moe_block": True,
    "num_experts": E,
    "top_k_experts": int(Z["top_k"]),
    "moe_intermediate_size": F,
    "hidden_activation": "gelu_pytorch_tanh",
}


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def _logical(p: dict) -> dict:
    """The gemma library's parameters (its own layout) → the layer's logical parameters."""
    g = p["gating_einsum"]  # [E, 2, F, H]: gate, then up
    return {
        "router": p["router_logits"],  # [H, E]
        "router_scale": p["router_scale"],
        "expert_scale": p["per_expert_scale"],
        "w_gate": g[:, 0].transpose(0, 2, 1),  # [E, H, F]
        "w_up": g[:, 1].transpose(0, 2, 1),
        "w_down": p["linear"],  # [E, F, H]
    }


def _gemma_params() -> dict:
    return {k[6:]: jnp.asarray(Z[k], jnp.float32) for k in Z.files if k.startswith("param/")}


CFG = tempo_jax.hf.moe_config_from_hf(GEMMA4_TEXT, slots_per_rank=2, interpret=True, gmm_impl="chunked")


def test_the_layer_equals_the_gemma_library_forward_and_gradients():
    """The layer's dense reference on the library's weights: its output, and the gradients of sum(out · cot) w.r.t.
    both inputs and every parameter (mapped back to the library's layout), within float32 of the library's."""
    x, rx, cot = (jnp.asarray(Z[k], jnp.float32) for k in ("x", "router_x", "cot"))

    def loss(p, x, rx):
        return jnp.sum(moe_reference(_logical(p), x, CFG, router_x=rx) * cot)

    out = moe_reference(_logical(_gemma_params()), x, CFG, router_x=rx)
    assert _rel(out, Z["out"]) < 1e-5
    gp, gx, grx = jax.grad(loss, argnums=(0, 1, 2))(_gemma_params(), x, rx)
    assert _rel(gx, Z["grad_x"]) < 1e-5 and _rel(grx, Z["grad_router_x"]) < 1e-5
    for k, v in gp.items():
        assert _rel(v, Z[f"grad/{k}"]) < 1e-5, k


def test_the_expert_parallel_layer_on_8_devices_equals_the_gemma_library_under_jit():
    """``moe_forward`` with ``router_x`` on 8 ranks over a placement with replicas, under ``jit``: the library's
    output and input gradients; the output does not depend on the dispatch table."""
    mesh = make_ep_mesh(8)
    placement = Placement.from_eplb(np.arange(E) + 1.0, 16, 8)
    params = to_physical(_logical(_gemma_params()), placement, mesh=mesh)
    pa = dispatch_tables.placement_arrays(placement)
    x, rx, cot = (jnp.asarray(Z[k], jnp.float32) for k in ("x", "router_x", "cot"))

    @jax.jit
    def run(x, rx, table):
        return moe_forward(params, x, mesh=mesh, placement_arrays=pa, tables=table, config=CFG, router_x=rx).out

    out = run(x, rx, dispatch_tables.uniform(placement))
    assert _rel(out, Z["out"]) < 1e-5
    valid = np.asarray(placement.log2phy) >= 0  # [E, R]: an expert's replica columns
    weights = np.random.default_rng(0).uniform(0.1, 1.0, valid.shape) * valid
    skewed = dispatch_tables.from_weights(weights[None] / weights.sum(-1, keepdims=True)[None], placement)
    np.testing.assert_allclose(run(x, rx, skewed), out, rtol=1e-5, atol=1e-5)
    gx, grx = jax.jit(jax.grad(lambda x, rx: jnp.sum(run(x, rx, dispatch_tables.uniform(placement)) * cot), (0, 1)))(
        x, rx
    )
    assert _rel(gx, Z["grad_x"]) < 1e-5 and _rel(grx, Z["grad_router_x"]) < 1e-5


def test_the_nnx_module_takes_the_router_input_and_trains_the_per_expert_scale():
    """``MoE(x, router_x=...)`` with leading batch axes equals the library; ``nnx.grad`` reaches ``expert_scale``
    and ``router_scale`` (trainable, exported back by ``moe_to_hf`` as ``router.per_expert_scale`` / ``scale``)."""
    mesh = make_ep_mesh(8)
    placement = Placement.spread(E, 8, 2)
    moe = tempo_jax.MoE(
        CFG, placement, mesh=mesh, rngs=nnx.Rngs(0), params=to_physical(_logical(_gemma_params()), placement)
    )
    x, rx = (jnp.asarray(Z[k], jnp.float32).reshape(2, -1, H) for k in ("x", "router_x"))
    assert _rel(moe(x, router_x=rx).reshape(-1, H), Z["out"]) < 1e-5
    cot = jnp.asarray(Z["cot"], jnp.float32).reshape(2, -1, H)
    grads = nnx.grad(lambda m: jnp.sum(m(x, router_x=rx) * cot))(moe)
    assert _rel(grads.expert_scale.get_value(), Z["grad/per_expert_scale"]) < 1e-5
    assert _rel(grads.router_scale.get_value(), Z["grad/router_scale"]) < 1e-5
    exported = tempo_jax.hf.moe_to_hf(GEMMA4_TEXT, CFG, moe.logical_params())
    np.testing.assert_array_equal(exported["router.per_expert_scale"], Z["param/per_expert_scale"].astype(np.float32))
    np.testing.assert_array_equal(exported["router.scale"], Z["param/router_scale"].astype(np.float32))


def test_a_router_input_of_another_shape_or_beside_replayed_routing_is_refused():
    mesh = make_ep_mesh(8)
    placement = Placement.spread(E, 8, 2)
    params = to_physical(_logical(_gemma_params()), placement)
    kw = dict(mesh=mesh, placement_arrays=dispatch_tables.placement_arrays(placement), config=CFG)
    kw["tables"] = dispatch_tables.uniform(placement)
    x = jnp.ones((8, H))
    with pytest.raises(ValueError, match=r"router_x \(the router's own input\) must be a floating-point \[T=8, H=16\]"):
        moe_forward(params, x, router_x=jnp.ones((4, H)), **kw)
    with pytest.raises(ValueError, match="routing= replaces the router, so router_x"):
        routing = (jnp.zeros((8, 2), jnp.int32), jnp.ones((8, 2)))
        moe_forward(params, x, router_x=x, routing=routing, **kw)
    moe = tempo_jax.MoE(CFG, placement, mesh=mesh, rngs=nnx.Rngs(0), params=params)
    with pytest.raises(ValueError, match=r"MoE: router_x \(the router's own input\) must have x's shape"):
        moe(jnp.ones((2, 4, H)), router_x=jnp.ones((8, H)))


def test_the_router_input_on_a_data_ep_tensor_mesh_adds_no_collective_and_no_flops_beyond_the_router():
    """On data 2 × ep 2 × tensor 2, ``router_x`` is split like x: the output equals the library's (and its
    gradient w.r.t. ``router_x``), the weights stay on their own ranks, and the compiled program has exactly the
    collectives of the same call without it (the router input adds no exchange) and its FLOPs up to the router's
    input transform."""
    from tempo_jax.layer.collectives import program_collectives
    from tempo_jax.layer.mesh import make_mesh, param_shardings

    mesh = make_mesh(data=2, ep=2, tensor=2)
    cfg = dataclasses.replace(CFG, slots_per_rank=4, batch_axes=("data",), tensor_axis="tensor")
    placement = Placement.spread(E, 2, 4)
    params = to_physical(_logical(_gemma_params()), placement, mesh=mesh, config=cfg)
    homes = param_shardings(params, mesh, cfg)
    assert all(params[k].sharding.is_equivalent_to(homes[k], params[k].ndim) for k in params)
    pa = dispatch_tables.placement_arrays(placement)
    x, rx, cot = (jnp.asarray(Z[k], jnp.float32) for k in ("x", "router_x", "cot"))

    def run(x, rx):
        kw = dict(mesh=mesh, placement_arrays=pa, tables=dispatch_tables.uniform(placement), config=cfg)
        return moe_forward(params, x, router_x=rx, **kw).out

    assert _rel(jax.jit(run)(x, rx), Z["out"]) < 1e-5
    grx = jax.jit(jax.grad(lambda rx: jnp.sum(run(x, rx) * cot)))(rx)
    assert _rel(grx, Z["grad_router_x"]) < 1e-5
    with_rx = jax.jit(run).lower(x, rx).compile()
    without = jax.jit(lambda x: run(x, None)).lower(x).compile()

    def kinds(compiled):
        return sorted((c.kind, c.axes, c.shape) for c in program_collectives(compiled.as_text(), mesh) if c.group > 1)

    assert kinds(with_rx) == kinds(without)
    extra = with_rx.cost_analysis()["flops"] - without.cost_analysis()["flops"]
    assert extra <= 8 * x.shape[0] * H  # the norm, scale and multiplier of this device's router inputs
