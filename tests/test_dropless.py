"""The layer as users run it (issue 25): dropless and bounded under jit by default — `capacity="auto"` runs as
many exchange rounds of C rows per block as the largest block needs (`tempo_jax.layer.rounds`) — with outputs and
gradients equal to the worst-case single exchange, under `jax.jit`, `nnx.jit`, `jax.grad`, `nnx.scan` over layers
and in a multi-layer model whose routing sends every token to one rank."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from numeric import assert_close, assert_trees_close

import tempo_jax
from solvers import Placement
from tempo_jax.layer import MoEConfig, init_params, make_ep_mesh, moe_forward, moe_reference, to_logical
from tempo_jax.layer import tables as dispatch_tables
from tempo_jax.lm.model import LMConfig, TinyMoELM, train

D = 8


@pytest.fixture(scope="module")
def mesh():
    return make_ep_mesh(D)


def test_functional_auto_rounds_equal_the_worst_case_under_jit_and_grad(mesh):
    """moe_forward(capacity="auto") with every pair sent to rank 0: 4 rounds of C = 32, nothing dropped; outputs
    and gradients (x and every parameter) equal capacity=None's single exchange."""
    E, S, K = 16, 2, 2
    placement = Placement.from_eplb(np.ones(E), D * S, D)
    cfg = MoEConfig(hidden=16, ffn=8, experts=E, top_k=K, slots_per_rank=S, dispatch_mode="quota")
    pa, tables = dispatch_tables.placement_arrays(placement), dispatch_tables.static(placement)
    params = init_params(jax.random.key(0), cfg, placement, mesh=mesh)
    x = jax.random.normal(jax.random.key(1), (D * 64, 16))
    ids = np.tile(np.asarray(placement.phy2log[:K]), (D * 64, 1)).astype(np.int32)  # rank 0's experts
    routing = (jnp.asarray(ids), jnp.full(ids.shape, 0.5, jnp.float32))

    def run(p, x, capacity):
        config = dataclasses.replace(cfg, capacity=capacity)
        return moe_forward(p, x, mesh=mesh, placement_arrays=pa, tables=tables, config=config, routing=routing)

    auto, worst = (jax.jit(lambda p, x, c=c: run(p, x, c))(params, x) for c in ("auto", None))
    assert auto.stats.rounds.tolist() == [4] * D and worst.stats.rounds.tolist() == [1] * D
    assert int(auto.stats.drops.sum()) == 0 and int(auto.stats.max_block.max()) == 64 * K
    assert_close(auto.out, worst.out)  # two programs (rounds of C rows, one worst-case exchange)
    cot = jax.random.normal(jax.random.key(2), auto.out.shape)
    grads = {
        c: jax.jit(jax.grad(lambda p, x, c=c: jnp.sum(run(p, x, c).out * cot), argnums=(0, 1)))(params, x)
        for c in ("auto", None)
    }
    assert_trees_close(grads["auto"], grads[None])


def _one_rank_lm(mesh, capacity):
    """A 2-layer LM whose rank 0 alone holds experts 0 and 1, and whose routers always choose them (a score bias
    of +100: the choice is biased, the weights are not), so every token's pairs go to rank 0."""
    phy2log = np.array([0, 1] + [2 + (i % 14) for i in range(2 * D - 2)])
    placement = Placement.from_phy2log(phy2log, D, num_experts=16)
    cfg = LMConfig(experts=16, top_k=2, layers=2, balance_rate=1e-12, capacity=capacity, dispatch_mode="quota")
    model = TinyMoELM(cfg, mesh=mesh, rngs=nnx.Rngs(params=0, dispatch=1), placements=[placement] * 2)
    for block in model.blocks:
        block.moe.score_bias.set_value(jnp.asarray(np.r_[100.0, 100.0, np.zeros(14)], jnp.float32))
    return model


@pytest.mark.slow  # fast twin: test_stages.test_auto_capacity_stays_dropless_on_an_all_to_one_rank_batch
def test_a_multi_layer_lm_stays_dropless_when_every_token_goes_to_one_rank(mesh):
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 256, (8, 64)), jnp.int32)
    auto, worst = _one_rank_lm(mesh, "auto"), _one_rank_lm(mesh, None)
    step = nnx.jit(lambda m, t: m(t))
    assert_close(step(auto, tokens), step(worst, tokens))  # two programs: rounds against one exchange
    for block in auto.blocks:  # 64 tokens per rank × 2 pairs to rank 0 = 128 rows per block; C = 32: 4 rounds
        assert (
            block.moe.stats.get_value().rounds.tolist() == [4] * D and int(block.moe.stats.get_value().drops.sum()) == 0
        )
        assert int(block.moe.counts.get_value()[:, :2].sum()) == 8 * 64 * 2

    def loss(m):
        return optax.softmax_cross_entropy_with_integer_labels(m(tokens[:, :-1]), tokens[:, 1:]).mean()

    grad = nnx.jit(lambda m: nnx.value_and_grad(loss)(m))
    (la, ga), (lw, gw) = grad(auto), grad(worst)
    assert_close(la, lw)
    assert_trees_close(nnx.state(ga, nnx.Param), nnx.state(gw, nnx.Param))


def test_nnx_scan_over_layers_with_the_default_capacity(mesh):
    E, L = 16, 3
    placement = Placement.from_eplb(np.ones(E), 2 * D, D)
    cfg = MoEConfig(hidden=16, ffn=8, experts=E, top_k=2, slots_per_rank=2, dispatch_mode="quota")

    @nnx.vmap(in_axes=0, out_axes=0)
    def make(key):
        return tempo_jax.MoE(cfg, placement, mesh=mesh, rngs=nnx.Rngs(params=key))

    stack = make(jax.random.split(jax.random.key(0), L))

    @nnx.jit
    def forward(stack, x):
        @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
        def body(x, layer):
            return x + layer(x)

        return body(x, stack)

    x = jax.random.normal(jax.random.key(1), (D * 8, 16))
    y = forward(stack, x)
    want = x
    params = stack.params()
    for layer in range(L):
        one = to_logical(jax.tree.map(lambda p, i=layer: p[i], params), placement)  # every layer's placement
        want = want + moe_reference(one, want, cfg)
    assert_close(y, want)
    assert stack.stats.get_value().rounds.shape == (L, D)


@pytest.mark.slow  # fast twin: test_functional_auto_rounds_equal_the_worst_case_under_jit_and_grad
def test_tiny_lm_trains_with_the_same_losses_as_the_worst_case_path(mesh):
    base = LMConfig(layers=1, seq_len=32)
    auto = train(base, steps=3, mesh=mesh)
    worst = train(dataclasses.replace(base, capacity=None), steps=3, mesh=mesh)
    assert_close(auto.losses, worst.losses)


def test_rounds_differentiate_with_weights_stored_in_another_dtype(mesh):
    """float32 weights with a bfloat16 exchange (`MoEConfig.dtype`): the rounds' VJP takes the results' cotangents
    in the dtype they travel in (it raised a VJP type error before), and equals the single exchange's gradients."""
    E, S, K = 16, 2, 2
    placement = Placement.from_eplb(np.arange(1, E + 1, dtype=float), D * S, D)
    cfg = MoEConfig(hidden=16, ffn=8, experts=E, top_k=K, slots_per_rank=S, dispatch_mode="quota")
    pa, tables = dispatch_tables.placement_arrays(placement), dispatch_tables.uniform(placement)
    params = init_params(jax.random.key(0), cfg, placement, mesh=mesh)  # float32
    x = jax.random.normal(jax.random.key(1), (D * 16, 16))

    def loss(p, x, capacity):
        config = dataclasses.replace(cfg, capacity=capacity, dtype=jnp.bfloat16)
        out = moe_forward(p, x, mesh=mesh, placement_arrays=pa, tables=tables, config=config).out
        return jnp.sum(out.astype(jnp.float32) ** 2)

    grads = {c: jax.jit(jax.grad(lambda p, x, c=c: loss(p, x, c), argnums=(0, 1)))(params, x) for c in ("auto", None)}
    assert jax.tree.map(lambda g: g.dtype, grads["auto"]) == jax.tree.map(lambda g: g.dtype, (params, x))
    assert_trees_close(grads["auto"], grads[None], dtype=jnp.bfloat16)
