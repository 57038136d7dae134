"""Selective rematerialisation (`tempo_jax.layer.remat`, issue 71): under ``jax.checkpoint`` with `save_exchanges` the
training step's compiled program holds as many collectives as without ``jax.checkpoint``, where saving nothing
repeats the forward's exchanges in the backward — for the dropless rounds, the single worst-case exchange and the
ring — and the loss and gradients are the same."""

import collections
import dataclasses

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
