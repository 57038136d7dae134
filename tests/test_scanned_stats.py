"""A scanned stack's routing statistics in one collective (issue 71): ``moe_forward(aux_losses="local")`` returns each
token shard's sufficient statistics (`MoEAuxParts`), and one `reduce_aux` after a ``jax.lax.scan`` over layers gives
every layer's losses and load — equal to each layer's own reduction — with no reduction left inside the loop."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numeric import assert_close

from solvers import Placement
from tempo_jax.layer import MoEAuxParts, MoEConfig, init_params, make_ep_mesh, moe_forward, reduce_aux
from tempo_jax.layer import tables as dispatch_tables

D, E, S, L, H = 8, 16, 2, 3, 32


def _while_bodies(hlo: str) -> dict[str, str]:
    """``{computation name: its text}`` of every computation a ``while`` runs as its body."""
    comps, name, lines = {}, None, []
    for line in hlo.splitlines():  # a computation: an unindented header ending in "{", its instructions, "}"
        head = re.match(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s", line)
        if head and line.rstrip().endswith("{"):
            name, lines = head.group(1), []
        elif line.strip() == "}" and name:
            comps[name] = "\n".join(lines)
            name = None
        elif name:
            lines.append(line)
    bodies = set(re.findall(r"\bwhile\(.*?body=%?([\w.\-]+)", hlo))
    return {n: comps.get(n, "") for n in bodies}


@pytest.fixture(scope="module")
def stack():
    placement = Placement.spread(E, D, S)
    cfg = MoEConfig(hidden=H, ffn=16, experts=E, top_k=2, slots_per_rank=S, dispatch_mode="quota", capacity=None)
    mesh = make_ep_mesh(D)
    layers = [init_params(jax.random.key(i), cfg, placement, mesh=mesh) for i in range(L)]
    stacked = jax.tree.map(lambda *a: jnp.stack(a), *layers)
    return placement, cfg, mesh, layers, stacked


def _scan(stack, aux_losses):
    placement, cfg, mesh, _, _ = stack
    pa, tab = dispatch_tables.placement_arrays(placement), dispatch_tables.uniform(placement)

    def run(stacked, x):
        def body(x, p):
            res = moe_forward(p, x, mesh=mesh, placement_arrays=pa, tables=tab, config=cfg, aux_losses=aux_losses)
            return jnp.tanh(res.out), res.aux

        x, aux = jax.lax.scan(body, x, stacked)
        return x, (reduce_aux(aux, cfg.top_k) if aux_losses == "local" else aux)

    return jax.jit(run)


def test_reduce_aux_after_the_scan_equals_each_layers_own(stack):
    placement, cfg, mesh, layers, stacked = stack
    x = jax.random.normal(jax.random.key(9), (D * 16, H))
    out_local, aux_local = _scan(stack, "local")(stacked, x)
    out_layer, aux_layer = _scan(stack, True)(stacked, x)
    assert_close(out_local, out_layer)
    for field in aux_layer._fields:
        assert getattr(aux_local, field).shape == getattr(aux_layer, field).shape  # [L] and [L, E]
        assert_close(getattr(aux_local, field), getattr(aux_layer, field))
    assert float(aux_local.expert_load.sum()) == L * x.shape[0] * cfg.top_k
    # the parts of one call: per token shard, unreduced
    pa, tab = dispatch_tables.placement_arrays(placement), dispatch_tables.uniform(placement)
    one = moe_forward(layers[0], x, mesh=mesh, placement_arrays=pa, tables=tab, config=cfg, aux_losses="local")
    assert isinstance(one.aux, MoEAuxParts) and one.aux.load.shape == (D, E) and one.aux.tokens.shape == (D,)
    np.testing.assert_array_equal(np.asarray(one.aux.tokens), np.full(D, x.shape[0] // D))


def test_no_statistics_reduction_runs_inside_the_layer_loop(stack):
    """The layer loop's body holds the statistics' all-reduce with ``aux_losses=True`` and none with "local" (the
    one reduction runs after the loop)."""
    _, _, _, _, stacked = stack
    x = jax.random.normal(jax.random.key(9), (D * 16, H))
    for mode, inside in ((True, True), ("local", False)):
        hlo = _scan(stack, mode).lower(stacked, x).compile().as_text()
        bodies = _while_bodies(hlo)
        assert bodies, "the scan lowers to a while loop"
        assert any("all-reduce" in text for text in bodies.values()) == inside, mode
        assert "all-reduce" in hlo


def test_aux_losses_refuses_other_strings(stack):
    placement, cfg, mesh, layers, _ = stack
    pa, tab = dispatch_tables.placement_arrays(placement), dispatch_tables.uniform(placement)
    with pytest.raises(ValueError, match="aux_losses"):
        moe_forward(
            layers[0], jnp.zeros((D, H)), mesh=mesh, placement_arrays=pa, tables=tab, config=cfg, aux_losses="no"
        )
