"""The fused dispatch + count kernel for Pallas TPU (Mosaic TPU): the same function as `dispatch`'s GPU kernel.

`pallas_kernels.dispatch` holds the rule (docs/algorithms.md §9) and the pure-jnp reference; this file is the TPU
program of it. A TPU kernel cannot gather ``table[e, r]`` with a vector of expert ids, so each block of pairs reads
its rows with one-hot products on the MXU:

    onehot [block, E_pad] (pair i's expert)  @  [E_pad, 128] (the table, sanitised; the slots; "has a replica")

exact at ``Precision.HIGHEST`` (one non-zero term per output; slots < 2**24 are exact in float32). Every table
entry is sanitised *before* the product (non-finite, non-positive or replica-less entries become 0), so a NaN in
one expert's row cannot reach another's pairs. The per-block count row is the one-hot's column sum. From the rows
on, the float operations are the reference's, in the same order, so slots and columns are bit-identical to it.

Layout (TPU tiles are (8, 128)): pairs as ``[P, 1]`` columns in blocks of ``block`` rows; the table, slots and
flags padded to ``[E_pad, 128]`` (E_pad a multiple of 128, R ≤ 128 replica columns) and read whole by every
program; one ``[1, 1, E_pad]`` count row per block, summed outside (no atomics). ``interpret=True`` runs it in
Pallas's TPU interpret mode (`pltpu.InterpretParams`: TPU semantics simulated on CPU).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.dispatch_columns import pick_columns

__all__ = ["LANES", "dispatch_tpu"]

#: The TPU's lane width: the padded width of the replica columns and of the expert axis.
LANES = 128


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _kernel(ids_ref, ok_ref, u_ref, table_ref, slots_ref, has_ref, slot_ref, col_ref, cnt_ref, *, r_cols: int):
    """One block of pairs: choose a replica column per pair and count the block's valid pairs per expert."""
    ok = ok_ref[...] != 0  # [block, 1]
    e = jnp.where(ok, ids_ref[...], 0)
    u = u_ref[...]
    u = jnp.where(u >= 0.0, jnp.minimum(u, 1.0), 0.0)  # NaN or negative -> 0
    block, e_pad = e.shape[0], table_ref.shape[0]
    # Step 1: each pair's row of the (sanitised) table, its slots and its replica flags, by one-hot products.
    onehot = (e == lax.broadcasted_iota(jnp.int32, (block, e_pad), 1)).astype(jnp.float32)
    hp = lax.Precision.HIGHEST
    rows = jnp.dot(onehot, table_ref[...], precision=hp, preferred_element_type=jnp.float32)  # [block, 128]
    phys = jnp.dot(onehot, slots_ref[...], precision=hp, preferred_element_type=jnp.float32)
    has = jnp.dot(onehot, has_ref[...], precision=hp, preferred_element_type=jnp.float32) > 0.5
    # Steps 2-3: the column and slot (`dispatch_columns.pick_columns`, shared with the GPU kernel).
    cols = range(r_cols)
    col, slot = pick_columns(
        [rows[:, r : r + 1] for r in cols],
        [has[:, r : r + 1] for r in cols],
        [phys[:, r : r + 1].astype(jnp.int32) for r in cols],
        u,
    )
    slot_ref[...] = jnp.where(ok, slot, -1)
    col_ref[...] = jnp.where(ok, col, -1)
    # Step 4: this block's count per logical expert (padding masked).
    cnt_ref[...] = jnp.sum(onehot * ok.astype(jnp.float32), axis=0).astype(jnp.int32).reshape(1, 1, e_pad)


@functools.partial(jax.jit, static_argnames=("block", "interpret"))
def dispatch_tpu(ids, ok, u, table, log2phy, *, block: int, interpret: bool):
    """The TPU kernel on flattened pairs.

    Args:
      ids: [P] int logical expert per pair (any value where ``ok`` is False).
      ok: [P] bool, the pairs that route and count.
      u: [P] float position of each pair in [0, 1) (`dispatch`'s modes).
      table: [E, R] float weights over e's replica columns (R ≤ 128).
      log2phy: [E, R] int physical slot of column r of expert e, -1 = none.
      block: pairs per program (a positive multiple of 8).
      interpret: run in Pallas's TPU interpret mode (on CPU).
    Returns:
      (slots [P] int32, cols [P] int32, counts [E] int32), as `dispatch`'s GPU kernel.
    """
    p = ids.shape[0]
    e, r = table.shape
    if r > LANES:
        raise ValueError(f"dispatch_tpu: at most {LANES} replica columns, got R={r}")
    if block < 8 or block % 8:
        raise ValueError(f"dispatch_tpu: block must be a positive multiple of 8, got {block}")
    e_pad = _round_up(max(e, 1), LANES)
    pad = (-p) % block
    nb = (p + pad) // block

    def column(a, dtype):
        return jnp.pad(a.astype(dtype), (0, pad)).reshape(-1, 1)

    l2p = log2phy.astype(jnp.int32)
    x = table.astype(jnp.float32)
    clean = jnp.where((l2p >= 0) & (x > 0.0) & (x < jnp.inf), x, 0.0)  # Step 0: sanitised before any product

    def tile(a):
        return jnp.pad(a.astype(jnp.float32), ((0, e_pad - e), (0, LANES - r)))

    pairs = pl.BlockSpec((block, 1), lambda b: (b, 0))
    whole = pl.BlockSpec((e_pad, LANES), lambda b: (0, 0))
    slots, cols, partial = pl.pallas_call(
        functools.partial(_kernel, r_cols=r),
        out_shape=(
            jax.ShapeDtypeStruct((nb * block, 1), jnp.int32),
            jax.ShapeDtypeStruct((nb * block, 1), jnp.int32),
            jax.ShapeDtypeStruct((nb, 1, e_pad), jnp.int32),
        ),
        grid=(nb,),
        in_specs=[pairs, pairs, pairs, whole, whole, whole],
        out_specs=(pairs, pairs, pl.BlockSpec((1, 1, e_pad), lambda b: (b, 0, 0))),
        interpret=pltpu.InterpretParams() if interpret else False,
        name="tempo_dispatch_tpu",
    )(
        column(ids, jnp.int32),
        column(ok, jnp.int32),
        column(u, jnp.float32),
        tile(clean),
        tile(l2p),
        tile(l2p >= 0),
    )
    return slots[:p, 0], cols[:p, 0], jnp.sum(partial[:, 0, :], axis=0)[:e]
