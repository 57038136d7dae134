"""Token exchange between expert-parallel ranks, inside `shard_map` over one mesh axis.

Both paths move rows that are already sorted by destination rank and return, on every rank, the rows it
received laid out as ``[D, C, H]``: block s holds what source s sent, valid rows first (``recv_counts[s]`` of
them), zeros after. The reverse call returns each rank's rows to where they came from.

- "padded": `jax.lax.all_to_all` of a capacity-padded ``[D, C, H]`` buffer (works everywhere, XLA:CPU too).
- "ragged": `jax.lax.ragged_all_to_all` (GPU/TPU; not implemented on XLA:CPU). Same result.
- "auto": resolved by `EXCHANGE` (`pallas_kernels.backends.ImplementationTable`): ragged on GPU/TPU, padded
  elsewhere.

Glossary: D ranks on the axis, C rows per (source, destination) block, H features.
"""

from __future__ import annotations

from typing import Literal, get_args

import jax
import jax.numpy as jnp

from pallas_kernels import ImplementationTable

__all__ = ["EXCHANGE", "ExchangeImpl", "exchange", "exchange_back"]

ExchangeImpl = Literal["auto", "padded", "ragged"]

#: The exchange's implementations: "auto" is the ragged collective on GPU/TPU and the padded one elsewhere.
EXCHANGE = ImplementationTable(
    op="exchange",
    names=get_args(ExchangeImpl),
    auto={"gpu": ("ragged",), "tpu": ("ragged",), "default": ("padded",)},
)


def _concrete(impl: str) -> str:
    if impl not in ("padded", "ragged"):
        raise ValueError(f"exchange: impl must be a resolved implementation, 'padded' or 'ragged', got {impl!r}")
    return impl


def _slots(dest: jax.Array, counts: jax.Array, capacity: int):
    """Position of each dest-sorted row inside its destination block; rows past ``capacity`` are dropped."""
    start = jnp.cumsum(counts) - counts
    pos = jnp.arange(dest.shape[0], dtype=jnp.int32) - start[dest].astype(jnp.int32)
    return pos, pos < capacity


def exchange(rows: jax.Array, dest: jax.Array, counts: jax.Array, *, axis: str, capacity: int, impl: str):
    """Send dest-sorted ``rows [M, H]`` (``dest [M]`` ascending, ``counts [D]`` rows per destination).

    Returns ``(recv [D, C, H], recv_counts [D])``; block s of ``recv`` is what source s sent to this rank.
    Rows beyond ``capacity`` per destination are dropped (never in dropless mode, where C ≥ M).
    """
    D = counts.shape[0]
    impl = _concrete(impl)
    counts = jnp.minimum(counts, capacity).astype(jnp.int32)
    recv_counts = jax.lax.all_to_all(counts[:, None], axis, 0, 0, tiled=True)[:, 0]
    if impl == "padded":
        pos, keep = _slots(dest, counts, capacity)
        buf = jnp.zeros((D, capacity) + rows.shape[1:], rows.dtype)
        buf = buf.at[jnp.where(keep, dest, D), pos].set(rows, mode="drop")
        return jax.lax.all_to_all(buf, axis, 0, 0, tiled=True), recv_counts
    # Ragged: rows land in the receiver's block of this source, at offset s·C.
    me = jax.lax.axis_index(axis)
    in_off = (jnp.cumsum(counts) - counts).astype(jnp.int32)
    out = jnp.zeros((D * capacity,) + rows.shape[1:], rows.dtype)
    out_off = jnp.full((D,), me * capacity, jnp.int32)
    padded_rows = jnp.concatenate(
        [rows, jnp.zeros((max(D * capacity - rows.shape[0], 0),) + rows.shape[1:], rows.dtype)]
    )
    recv = jax.lax.ragged_all_to_all(padded_rows, out, in_off, counts, out_off, recv_counts, axis_name=axis)
    return recv.reshape((D, capacity) + rows.shape[1:]), recv_counts


def exchange_back(
    recv: jax.Array, recv_counts: jax.Array, dest: jax.Array, counts: jax.Array, *, axis: str, capacity: int, impl: str
) -> jax.Array:
    """Inverse of `exchange`: ``recv [D, C, H]`` (results per source block) back to the senders, returned as
    ``[M, H]`` rows in the senders' original dest-sorted order (dropped rows come back as zeros)."""
    D = counts.shape[0]
    impl = _concrete(impl)
    counts = jnp.minimum(counts, capacity).astype(jnp.int32)
    pos, keep = _slots(dest, counts, capacity)
    if impl == "padded":
        back = jax.lax.all_to_all(recv, axis, 0, 0, tiled=True)  # [D, C, H], block j = from destination j
    else:
        me = jax.lax.axis_index(axis)
        flat = recv.reshape((D * capacity,) + recv.shape[2:])
        in_off = jnp.arange(D, dtype=jnp.int32) * capacity
        out = jnp.zeros_like(flat)
        out_off = jnp.full((D,), me * capacity, jnp.int32)
        back = jax.lax.ragged_all_to_all(flat, out, in_off, recv_counts, out_off, counts, axis_name=axis)
        back = back.reshape(recv.shape)
    rows = back[jnp.where(keep, dest, 0), jnp.where(keep, pos, 0)]
    return jnp.where(keep[:, None], rows, 0)
