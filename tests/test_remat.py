"""Selective rematerialisation (`tempo_jax.layer.remat`, issue 71): under ``jax.checkpoint`` with `save_exchanges` the
training step's compiled program holds as many collectives as without ``jax.checkpoint``, where saving nothing
repeats the forward's exchanges in the backward — for the dropless rounds, the single worst-case exchange and the
ring — and the loss and gradients are the same."""

import collections
import dataclasses
import re

import jax
import jax.numpy as jnp
import pytest
from numeric import assert_close, assert_trees_close

from solvers import Placement
from tempo_jax.layer import MoEConfig, init_params, make_ep_mesh, moe_forward, remat
from tempo_jax.layer import tables as dispatch_tables
from tempo_jax.layer.collectives import program_collectives

D, E, S = 8, 16, 2


@pytest.fixture(scope="module")
def case():
    placement = Placement.spread(E, D, S)
    cfg = MoEConfig(hidden=32, ffn=16, experts=E, top_k=2, slots_per_rank=S, dispatch_mode="quota")
    mesh = make_ep_mesh(D)
    return placement, cfg, mesh, init_params(jax.random.key(0), cfg, placement, mesh=mesh)


@pytest.mark.parametrize(
    ("exchange", "capacity"),
    [
        ("padded", "auto"),
        # the single worst-case exchange: its received rows, slots and counts named (fast twins: the other two)
        pytest.param("padded", None, marks=pytest.mark.slow),
        ("ring", "auto"),
    ],
)
def test_save_exchanges_keeps_the_backward_from_repeating_collectives(case, exchange, capacity):
    placement, cfg, mesh, params = case
    cfg = dataclasses.replace(cfg, exchange=exchange, capacity=capacity)
    pa, tab = dispatch_tables.placement_arrays(placement), dispatch_tables.uniform(placement)
    x = jax.random.normal(jax.random.key(1), (D * 32, 32))

    def layer(p, x):
        return moe_forward(p, x, mesh=mesh, placement_arrays=pa, tables=tab, config=cfg).out

    steps = {
        "plain": layer,
        "save nothing": jax.checkpoint(layer),
        "save exchanges": jax.checkpoint(layer, policy=remat.save_exchanges()),
    }
    counts, values = {}, {}
    for label, f in steps.items():
        step = jax.jit(jax.value_and_grad(lambda p, x, f=f: jnp.sum(jnp.tanh(f(p, x)) ** 2), argnums=(0, 1)))
        colls = program_collectives(step.lower(params, x).compile().as_text(), mesh)
        counts[label] = collections.Counter(c.kind for c in colls if c.group > 1)
        values[label] = step(params, x)
    assert counts["save exchanges"] == counts["plain"], counts
    assert sum(counts["save nothing"].values()) > sum(counts["plain"].values()), counts
    for label in ("save nothing", "save exchanges"):
        assert_close(values[label][0], values["plain"][0])
        assert_trees_close(values[label][1], values["plain"][1])


@pytest.mark.parametrize("exchange", ["padded", "ring"])
def test_every_stage_of_a_call_is_named_in_the_compiled_training_step(exchange):
    """`tempo_jax.layer.scopes`: a profile reads as the layer's steps — each stage's operations carry its scope in the
    compiled program's op names (the in-graph plan and the replicas' tie included; the ring has no pack or combine)."""
    from solvers import PRESETS
    from tempo_jax.layer import scopes

    placement = Placement.spread(E, D, 3)  # 24 slots for 16 experts: replicas to tie
    cfg = MoEConfig(
        hidden=32,
        ffn=16,
        experts=E,
        top_k=2,
        slots_per_rank=3,
        dispatch="ingraph",
        dispatch_mode="quota",
        cost=PRESETS["dsv3_fp8_offline"],
        exchange=exchange,
    )
    mesh = make_ep_mesh(D)
    params = init_params(jax.random.key(0), cfg, placement, mesh=mesh)
    pa = dispatch_tables.placement_arrays(placement)
    x = jax.random.normal(jax.random.key(1), (D * 16, 32))

    def loss(p, x):
        return jnp.sum(moe_forward(p, x, mesh=mesh, placement_arrays=pa, tables=None, config=cfg).out ** 2)

    text = jax.jit(jax.grad(loss)).lower(params, x).compile().as_text()
    named = set(re.findall(r'op_name="[^"]*?(moe_[a-z]+)', text))
    missing = {"moe_pack", "moe_combine"} if exchange == "ring" else set()
    assert named >= set(scopes.STAGES) - missing, set(scopes.STAGES) - named
    with pytest.raises(ValueError, match="not a stage of the layer"):
        scopes.scoped("moe_everything")


def test_a_policy_saving_fewer_names_recomputes_what_it_leaves_out(case):
    """docs/model.md's recipe: `save_only_these_names` over a subset of `remat.SAVE_NAMES`. Leaving out
    ``DISPATCHED`` (what the exchange delivered) makes the backward send the rows again: one all-to-all more than
    keeping every name, which runs as many as the step without ``jax.checkpoint``."""
    placement, cfg, mesh, params = case
    pa, tab = dispatch_tables.placement_arrays(placement), dispatch_tables.uniform(placement)
    x = jax.random.normal(jax.random.key(1), (D * 32, 32))

    def layer(p, x):
        return moe_forward(p, x, mesh=mesh, placement_arrays=pa, tables=tab, config=cfg).out

    lean = jax.checkpoint_policies.save_only_these_names(remat.EXPERT_HIDDEN, remat.RETURNED, remat.ROUNDS)
    counts = {}
    for label, policy in (("every name", remat.save_exchanges()), ("no dispatched", lean)):
        f = jax.checkpoint(layer, policy=policy)
        step = jax.jit(jax.grad(lambda p, x, f=f: jnp.sum(f(p, x) ** 2)))
        colls = program_collectives(step.lower(params, x).compile().as_text(), mesh)
        counts[label] = collections.Counter(c.kind for c in colls if c.group > 1)
    assert counts["no dispatched"]["all-to-all"] > counts["every name"]["all-to-all"], counts
