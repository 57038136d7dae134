"""Random dynamic-copy instances shared by tests/test_copies.py and tests/test_copy_baselines.py."""

import numpy as np

from solvers.relief import replica_ranks


def random_instance(seed: int, D: int, E: int, spr: int, tokens: int):
    """``(n [E], ranks [E, R], D)``: a random placement of ``spr`` slots per rank on D ranks (every expert at least
    once, the spare slots random) and Zipf(1.4) top-2 counts of ``tokens`` per rank."""
    rng = np.random.default_rng(seed)
    slots = np.concatenate([np.arange(E), rng.integers(0, E, D * spr - E)])
    rng.shuffle(slots)
    l2p = -np.ones((E, np.bincount(slots, minlength=E).max()), np.int64)
    fill = np.zeros(E, np.int64)
    for p, e in enumerate(slots):
        l2p[e, fill[e]] = p
        fill[e] += 1
    n = np.bincount(np.minimum(rng.zipf(1.4, tokens * D * 2) - 1, E - 1), minlength=E).astype(np.float64)
    return n, replica_ranks(l2p, spr), D
