"""The small expert-parallel case several test files share, on the 8 fake CPU devices of conftest.py.

E = 12 experts (not divisible by the D = 8 ranks) on 16 slots: 2 per rank, the EPLB placement of a random load
replicating 4 experts; top-2 routing.
"""

import jax
import numpy as np

from solvers import Placement
from tempo_jax.layer import MoEConfig, init_params, make_ep_mesh

D, E = 8, 12


def small_ep_case(params_seed: int, *, hidden: int = 32, ffn: int = 16):
    """``(placement, config, params, mesh)``: params physical and sharded over the ``ep`` axis of ``mesh``, drawn
    from ``jax.random.key(params_seed)``; hidden H and ffn F as given."""
    placement = Placement.from_eplb(np.random.default_rng(0).random(E) * 100 + 1, 16, D)
    config = MoEConfig(hidden=hidden, ffn=ffn, experts=E, top_k=2, slots_per_rank=placement.slots_per_rank)
    mesh = make_ep_mesh(D)
    return placement, config, init_params(jax.random.key(params_seed), config, placement, mesh=mesh), mesh
