"""The replica-column rule both dispatch kernels run on one block of pairs (docs/algorithms.md §9), given each
pair's R replica columns as lists of per-column arrays: the GPU kernel gathers them from the table, the TPU kernel
reads them with one-hot products (`pallas_kernels.dispatch`, `pallas_kernels.dispatch_tpu`). The pure-jnp reference
(`dispatch_reference`) computes the same float operations in the same order, vectorised over R."""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["pick_columns"]


def pick_columns(weights: list, has: list, phys: list, u: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Each pair's replica column and slot.

    Args:
      weights: R arrays [block...] float32, column r's sanitised weight (0 where not positive, not finite or
        without a replica).
      has: R arrays [block...] bool, column r has a replica.
      phys: R arrays [block...] int32, column r's physical slot.
      u: [block...] float32 position of each pair, clamped to [0, 1].
    Returns:
      (col, slot) [block...] int32: the first column whose running sum exceeds u · total (clamped to the last
      positive column; a zero total — a torn row — counts every replica as 1); -1 where no column is positive.
    """
    # Step 1: the total; a zero total (torn row) falls back to uniform over the replicas.
    total = jnp.zeros(u.shape, jnp.float32)
    nrep = jnp.zeros(u.shape, jnp.float32)
    for x, h in zip(weights, has, strict=True):  # sequential sums: the reference's float operations
        total = total + x
        nrep = nrep + h.astype(jnp.float32)
    torn = total <= 0.0
    w = [jnp.where(torn, h.astype(jnp.float32), x) for h, x in zip(has, weights, strict=True)]
    total = jnp.where(torn, nrep, total)
    # Step 2: the first column whose running sum exceeds u * total (clamped to the last positive column).
    target = u * total
    run = jnp.zeros(u.shape, jnp.float32)
    idx = jnp.zeros(u.shape, jnp.int32)
    last = jnp.full(u.shape, -1, jnp.int32)
    for r, x in enumerate(w):
        run = run + x
        idx = idx + (run <= target).astype(jnp.int32)
        last = jnp.where(x > 0.0, r, last)
    col = jnp.minimum(idx, last)
    # Step 3: the chosen column's slot.
    slot = jnp.full(u.shape, -1, jnp.int32)
    for r, p in enumerate(phys):
        slot = jnp.where(col == r, p, slot)
    return col, slot
