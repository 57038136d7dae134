"""The layer inside someone else's model (issue 36): flax's own recipes, verbatim, with `tempo_jax.MoE` as the FFN
of a small decoder LM of this test's own (embedding, RMSNorm, causal attention, residuals, tied head) on 8 fake
devices — the training step with one compile, scan over layers with stacked init, remat, any token count and
masked variable-length batches, eval mode, an orbax round trip into the same compiled step, and the auxiliary
losses collected over layers and calls."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from compiles import count_compiles
from flax import nnx
from numeric import assert_close

import tempo_jax
from solvers import PRESETS
from tempo_jax.metrics import capture, layer_record

D, E, V, H = 8, 16, 64, 32


@pytest.fixture(scope="module")
def mesh():
    return tempo_jax.make_ep_mesh(D)


def moe_config(**kw):
    return tempo_jax.moe_preset("qwen3_30b_a3b", experts=E, hidden=H, ffn=16, top_k=2, slots_per_rank=4, **kw)


class Block(nnx.Module):
    def __init__(self, mesh, rngs: nnx.Rngs, **moe_kw):
        self.norm1 = nnx.RMSNorm(H, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(num_heads=2, in_features=H, qkv_features=H, decode=False, rngs=rngs)
        self.norm2 = nnx.RMSNorm(H, rngs=rngs)
        placement = tempo_jax.Placement.spread(E, mesh.shape["ep"], 4)
        self.moe = tempo_jax.MoE(moe_config(**moe_kw), placement, mesh=mesh, rngs=rngs)

    def __call__(self, x, mask=None):
        x = x + self.attn(self.norm1(x), mask=nnx.make_causal_mask(x[..., 0]))
        return x + self.moe(self.norm2(x), mask=mask)


class LM(nnx.Module):
    def __init__(self, mesh, rngs: nnx.Rngs, layers: int = 2, **moe_kw):
        self.embed = nnx.Embed(V, H, rngs=rngs)
        self.blocks = nnx.List([Block(mesh, rngs, **moe_kw) for _ in range(layers)])

    def __call__(self, tokens, mask=None):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, mask)
        return self.embed.attend(x)


def _tokens(shape, seed=0):
    return jnp.asarray(np.random.default_rng(seed).integers(0, V, shape), jnp.int32)


def _train_step():
    @nnx.jit(donate_argnums=(0, 1))
    def step(model, optimizer, tokens):
        def loss_fn(model):
            logits = model(tokens[:, :-1])
            ce = optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()
            return ce + 0.01 * tempo_jax.aux_losses(model)["load_balance"]

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    return step


def _train(model, optimizer, steps: int) -> tuple[list[float], list[int]]:
    """``steps`` calls of `_train_step` on one batch: the losses and the compiles of each call."""
    step, tokens = _train_step(), _tokens((4, 17))
    losses, compiles = [], []
    for _ in range(steps):
        with count_compiles() as n:
            losses.append(float(step(model, optimizer, tokens)))
        compiles.append(n[0])
    return losses, compiles


# ------------------------------------------------------------------------------------------------ training
def test_optimizer_jit_donate_compiles_once_and_trains(mesh):
    """flax's training recipe: the model and optimizer made under the mesh (``jax.set_mesh``: every array where
    the jitted step returns it), ``nnx.Optimizer(..., wrt=nnx.Param)``, ``nnx.jit(step, donate_argnums=(0, 1))``:
    one compile for every step, the loss falls."""
    with jax.set_mesh(mesh):
        model = LM(mesh, nnx.Rngs(params=0, dispatch=1))
        optimizer = nnx.Optimizer(model, optax.adamw(3e-3), wrt=nnx.Param)
    losses, compiles = _train(model, optimizer, 6)
    assert compiles[0] >= 1 and compiles[1:] == [0] * 5, compiles
    assert losses[-1] < losses[0]


def test_the_recipes_run_on_a_data_ep_mesh():
    """The same recipes on ``make_mesh(data=2, ep=4)`` (issue 49): the training step compiles once and trains, and
    the scan-over-layers recipe stacks the layers' slot arrays over ``ep`` (each data replica its own tokens)."""
    mesh = tempo_jax.make_mesh(data=2, ep=4)
    with jax.set_mesh(mesh):
        model = LM(mesh, nnx.Rngs(params=0, dispatch=1))
        optimizer = nnx.Optimizer(model, optax.adamw(3e-3), wrt=nnx.Param)
    losses, compiles = _train(model, optimizer, 4)
    assert compiles[1:] == [0, 0, 0] and losses[-1] < losses[0], (compiles, losses)
    assert model.blocks[0].moe.stats.get_value().gpu_tokens.shape == (8,)  # one per device: 2 EP groups × 4 ranks

    @nnx.split_rngs(splits=2)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def create_block(rngs: nnx.Rngs):
        return Block(mesh, rngs, dispatch_mode="quota")

    with jax.set_mesh(mesh):
        blocks = create_block(nnx.Rngs(params=0, dispatch=1))
    w = blocks.moe.w_gate.get_value()
    assert w.shape == (2, 16, H, 16) and w.sharding.spec == jax.sharding.PartitionSpec(None, "ep")

    @nnx.jit
    def forward(blocks, x):
        @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
        def run(x, block):
            return block(x)

        return run(x, blocks)

    assert np.isfinite(np.asarray(forward(blocks, jnp.ones((2, 8, H))))).all()
    # Watching the stack (issue 50): one record per stacked layer, each its own 16 tokens × K pairs, 2 EP groups.
    layers = capture(blocks).layers()
    K = blocks.moe.config.top_k
    assert len(layers) == 2 and all(layer["groups"] == 2 for layer in layers)
    for i, stats in enumerate(layers):
        assert stats["shard_counts"].shape == (8, E) and stats["shard_counts"].sum() == 16 * K
        assert stats["gpu_tokens"].tolist() == np.asarray(blocks.moe.stats.get_value().gpu_tokens[i]).tolist()
        assert layer_record(stats, PRESETS["dsv3_fp8_offline"])["pairs"] == 16 * K


def test_the_layer_alone_needs_no_mesh_context(mesh):
    """The layer's own state is created where its program returns it: a jitted forward over a bare `MoE` built
    outside any mesh context compiles once."""
    moe = tempo_jax.MoE(moe_config(), tempo_jax.Placement.spread(E, D, 4), mesh=mesh, rngs=nnx.Rngs(0))
    fwd, x = nnx.jit(lambda m, x: m(x)), jnp.ones((16, H))
    counts = []
    for _ in range(3):
        with count_compiles() as n:
            fwd(moe, x)
        counts.append(n[0])
    assert counts[1:] == [0, 0], counts


def test_scan_over_layers_with_stacked_init_and_remat(mesh):
    """flax's scan-over-layers recipe (``nnx.split_rngs`` + ``nnx.vmap`` stacked init, ``nnx.scan`` forward),
    with ``nnx.remat`` on the block: equal to the same layers run one by one, gradients included."""
    L = 2

    class ScanLM(nnx.Module):
        def __init__(self, rngs: nnx.Rngs):
            self.embed = nnx.Embed(V, H, rngs=rngs)

            @nnx.split_rngs(splits=L)
            @nnx.vmap(in_axes=(0,), out_axes=0)
            def create_block(rngs: nnx.Rngs):
                return Block(mesh, rngs, dispatch_mode="quota")

            self.blocks = create_block(rngs)

        def __call__(self, tokens):
            @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
            @nnx.remat
            def forward(x, block):
                return block(x)

            return self.embed.attend(forward(self.embed(tokens), self.blocks))

    with jax.set_mesh(mesh):
        model = ScanLM(nnx.Rngs(params=0, dispatch=1))
    assert model.blocks.moe.w_gate.get_value().shape == (L, D * 4, H, 16)
    assert model.blocks.moe.rngs.key.get_value().shape == (L,)  # the layer's own stream, stacked with it
    tokens = _tokens((2, 8), seed=1)
    loss = lambda m: jnp.mean(m(tokens) ** 2)  # noqa: E731
    got, grads = nnx.jit(nnx.value_and_grad(loss))(model)
    aux = tempo_jax.aux_losses(model)  # the two scanned calls' losses, summed
    # the same layers one by one (unstacked), without scan or remat
    x = model.embed(tokens)
    each = []
    for i in range(L):
        block = nnx.merge(*jax.tree.map(lambda a, i=i: a[i], nnx.split(model.blocks)))
        x = block(x)
        each.append(block.moe.aux_loss.get_value())
    assert_close(got, jnp.mean(model.embed.attend(x) ** 2))
    assert_close(aux["load_balance"], sum(each))
    assert np.isfinite(np.asarray(grads["blocks"]["moe"]["w_up"].get_value())).all()


def test_plain_jax_transforms_are_refused_with_the_nnx_name(mesh):
    """``jax.grad`` / ``jax.checkpoint`` written around a model (the module closed over) would have the layer update
    its counters and RNG stream from inside a trace that cannot see them: refused, naming the flax transforms."""
    model = LM(mesh, nnx.Rngs(params=0, dispatch=1), layers=1)
    tokens = _tokens((2, 8))
    x = model.embed(tokens)

    def loss(x):
        return jnp.mean(model.blocks[0](x) ** 2)

    for transform in (jax.grad, jax.checkpoint):
        with pytest.raises(ValueError, match=r"nnx\.grad.*nnx\.remat"):
            transform(loss)(x)
    g = nnx.jit(nnx.grad(lambda m: jnp.mean(m(tokens) ** 2)))(model)  # the flax transforms work
    assert np.isfinite(np.asarray(g["blocks"][0]["moe"]["router"].get_value())).all()


# ------------------------------------------------------------------------------------------------ token counts
@pytest.mark.parametrize("shape", [(1, 1, H), (3, 5, H), (1, 7, H)])
def test_any_token_count(mesh, shape):
    """T = 1 (a decode step of batch 1), 15 and 7 tokens on 8 ranks: padded inside, equal to the dense reference,
    nothing counted for the padding."""
    moe = tempo_jax.MoE(moe_config(), tempo_jax.Placement.spread(E, D, 4), mesh=mesh, rngs=nnx.Rngs(0, dispatch=1))
    x = jax.random.normal(jax.random.key(3), shape)
    y = nnx.jit(lambda m, x: m(x))(moe, x)
    T = int(np.prod(shape[:-1]))
    assert y.shape == shape
    want = tempo_jax.moe_reference(moe.logical_params(), x.reshape(T, H), moe.config).reshape(shape)
    assert_close(y, want)
    assert int(moe.counts.get_value().sum()) == T * 2 == float(moe.expert_load.get_value().sum())
    assert int(moe.counter.get_value().sum()) == T * 2 and int(moe.stats.get_value().gpu_tokens.sum()) == T * 2


def test_masked_variable_length_batch_equals_the_unpadded_computation(mesh):
    """Three sequences of 5, 3 and 4 tokens padded to 5 with ``mask=``: the real rows, counts, load, losses and the
    aux-free bias update equal those of the 12 real tokens alone."""
    lengths = np.array([5, 3, 4])
    mask = jnp.asarray(np.arange(5)[None, :] < lengths[:, None])
    cfg_kw = dict(balance_rate=1e-3)
    a = tempo_jax.MoE(moe_config(**cfg_kw), tempo_jax.Placement.spread(E, D, 4), mesh=mesh, rngs=nnx.Rngs(0))
    b = tempo_jax.MoE(moe_config(**cfg_kw), tempo_jax.Placement.spread(E, D, 4), mesh=mesh, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(4), (3, 5, H))
    padded = a(x, mask=mask)
    real = b(x[np.asarray(mask)])  # [12, H]
    assert_close(padded[np.asarray(mask)], real)
    for name in ("expert_load", "aux_loss", "z_loss", "score_bias"):
        assert_close(getattr(a, name).get_value(), getattr(b, name).get_value())
    assert int(a.counts.get_value().sum()) == int(b.counts.get_value().sum()) == 12 * 2
    assert int(a.counter.get_value().sum()) == 12 * 2 and int(a.stats.get_value().drops.sum()) == 0
    with pytest.raises(ValueError, match=r"mask must be bool with x's leading shape \[3, 5\]"):
        a(x, mask=mask[:, :4])
    # the same through the whole model: the auxiliary losses of a masked batch are those of its real tokens
    lm = LM(mesh, nnx.Rngs(params=0, dispatch=1), layers=1)
    tokens = _tokens((3, 5), seed=2)
    lm(tokens, mask)
    masked = tempo_jax.aux_losses(lm)["load_balance"]
    lm(tokens, None)
    unmasked = tempo_jax.aux_losses(lm)["load_balance"]
    assert not np.isclose(float(masked), float(unmasked))  # the mask did change what was counted


# ------------------------------------------------------------------------------------------------ eval mode
def test_eval_mode_moves_no_bias_and_computes_no_losses_but_keeps_counting(mesh):
    model = LM(mesh, nnx.Rngs(params=0, dispatch=1), layers=1, balance_rate=1e-2)
    moe, tokens = model.blocks[0].moe, _tokens((2, 8))
    model(tokens)
    tempo_jax.aux_losses(model)
    bias, counted = np.asarray(moe.score_bias.get_value()), int(moe.counter.get_value().sum())
    model.eval()
    y = nnx.jit(lambda m, t: m(t))(model, tokens)
    np.testing.assert_array_equal(moe.score_bias.get_value(), bias)  # no aux-free update
    aux = tempo_jax.aux_losses(model)
    assert float(aux["load_balance"]) == 0.0 and float(aux["z"]) == 0.0  # no loss work
    assert int(moe.counter.get_value().sum()) == counted + 16 * 2  # the dispatch counters keep counting
    assert float(moe.expert_load.get_value().sum()) == 16 * 2
    view = nnx.view(model, deterministic=False)  # flax's view: training behaviour again, same arrays
    assert_close(nnx.jit(lambda m, t: m(t))(view, tokens), y)
    assert not np.array_equal(moe.score_bias.get_value(), bias)
    model.train()
    assert moe.deterministic is False


# ------------------------------------------------------------------------------------------------ checkpoints
def test_orbax_round_trip_keeps_shardings_and_the_compiled_step(mesh, tmp_path):
    with jax.set_mesh(mesh):
        model = LM(mesh, nnx.Rngs(params=0, dispatch=1))
        optimizer = nnx.Optimizer(model, optax.adamw(3e-3), wrt=nnx.Param)
    step, tokens = _train_step(), _tokens((4, 17))
    step(model, optimizer, tokens)
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(tmp_path / "state", nnx.state((model, optimizer)))
    checkpointer.wait_until_finished()
    after = float(step(model, optimizer, tokens))
    # restore into the model at hand: its state (shapes, dtypes, shardings) is the target
    target = tempo_jax.restore_target(nnx.state((model, optimizer)), checkpointer.metadata(tmp_path / "state"))
    restored = checkpointer.restore(tmp_path / "state", target)
    w = restored[0]["blocks"][0]["moe"]["w_gate"].get_value()
    assert w.sharding.spec == jax.sharding.PartitionSpec("ep") and w.shape == (D * 4, H, 16)
    nnx.update((model, optimizer), restored)
    with count_compiles() as n:
        again = float(step(model, optimizer, tokens))
    assert n[0] == 0 and again == pytest.approx(after, rel=1e-6)  # the same step, from the same state


# ------------------------------------------------------------------------------------------------ small things
def test_presets_take_router_fields_and_placement_is_public():
    cfg = tempo_jax.moe_preset("deepseek_v3", slots_per_rank=2, experts=16, hidden=32, ffn=16, balance_rate=1e-3)
    assert cfg.router.balance_rate == 1e-3 and cfg.router.score_bias and cfg.router.n_group == 8
    assert dataclasses.replace(cfg).router == cfg.router
    with pytest.raises(ValueError, match=r"unknown fields \['warp'\]"):
        tempo_jax.moe_preset("deepseek_v3", slots_per_rank=2, experts=16, warp=1)
    from solvers import Placement

    assert tempo_jax.Placement is Placement
    spread = Placement.spread(16, 8, 4)  # the docs' even layout: the two replicas of an expert on two ranks
    assert all(len(set(spread.slot_gpu[spread.log2phy[e, :2]])) == 2 for e in range(16))
