"""Named save points of the layer, for selective rematerialisation: a backward that does not repeat the exchanges.

Wrap a block (or a scanned stack) that holds the layer in ``jax.checkpoint`` with `save_exchanges` and the backward
recomputes the cheap parts of the forward (routing, dispatch, packing) while the values that took a collective to
make, and the expert FFN's hidden activations, are kept::

    block = jax.checkpoint(block, policy=tempo_jax.layer.remat.save_exchanges())
    # or nnx.remat(block, policy=...)

The names (`jax.ad_checkpoint.checkpoint_name` on the values, and on the residuals the layer's own VJPs keep):

- ``DISPATCHED`` ("moe_dispatched"): the rows this rank's experts read — the block exchange's received rows (with
  the FFN's residuals of the dropless rounds' first round) or the ring's all-gathered tokens and pair metadata;
- ``EXPERT_HIDDEN`` ("moe_expert_hidden"): the gate and up projections of the fused CPU FFN
  (`pallas_kernels.ffn_chunked.HIDDEN`);
- ``RETURNED`` ("moe_returned"): the pairs' results back at their source (the return exchange's rows, the ring's
  reduce-scattered output);
- ``ROUNDS`` ("moe_rounds"): the dropless rounds' count (one collective max).

With the policy the compiled training step runs as many collectives as without ``jax.checkpoint``; without it (save
nothing) the backward repeats the forward's exchanges (tests/test_remat.py counts them).
"""

from __future__ import annotations

import jax
from jax.ad_checkpoint import checkpoint_name

from pallas_kernels.ffn_chunked import HIDDEN as EXPERT_HIDDEN

__all__ = ["DISPATCHED", "EXPERT_HIDDEN", "RETURNED", "ROUNDS", "SAVE_NAMES", "name", "save_exchanges"]

DISPATCHED = "moe_dispatched"
RETURNED = "moe_returned"
ROUNDS = "moe_rounds"
#: Every save point of the layer.
SAVE_NAMES = (DISPATCHED, EXPERT_HIDDEN, RETURNED, ROUNDS)


def name(tree, label: str):
    """Every array leaf of ``tree`` (an array, a VJP closure's residuals, …) named ``label``."""
    return jax.tree.map(lambda a: checkpoint_name(a, label), tree)


def save_exchanges():
    """The ``jax.checkpoint`` policy that keeps the layer's save points (`SAVE_NAMES`) and recomputes the rest."""
    return jax.checkpoint_policies.save_only_these_names(*SAVE_NAMES)
