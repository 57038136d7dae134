"""Token exchange between expert-parallel ranks, inside `shard_map` over one mesh axis.

Both paths move a capacity-padded block buffer ``[D, C, W]`` (block j = the rows for rank j, valid rows first)
and return, on every rank, the blocks it received: block s holds what source s sent, valid rows first
(``recv_counts[s]`` of them). The reverse call returns results to where the rows came from.

- "padded": `jax.lax.all_to_all` of a capacity-padded ``[D, C, H]`` buffer (works everywhere, XLA:CPU too).
- "ragged": `jax.lax.ragged_all_to_all` (GPU/TPU; not implemented on XLA:CPU). Same result.
- "auto": resolved by `EXCHANGE` (`pallas_kernels.implementations.ImplementationTable`): ragged on GPU/TPU, padded
  elsewhere.
"""

from __future__ import annotations

from typing import Literal, get_args

import jax
import jax.numpy as jnp

from pallas_kernels import ImplementationTable

__all__ = ["EXCHANGE", "ExchangeImpl", "return_blocks", "send_blocks"]

ExchangeImpl = Literal["auto", "padded", "ragged"]

#: The exchange's implementations: "auto" is the ragged collective on GPU/TPU and the padded one elsewhere.
EXCHANGE = ImplementationTable(
    op="exchange", names=get_args(ExchangeImpl), auto={"gpu": ("ragged",), "tpu": ("ragged",), "default": ("padded",)}
)


def _concrete(impl: str) -> str:
    if impl not in ("padded", "ragged"):
        raise ValueError(f"exchange: impl must be a resolved implementation, 'padded' or 'ragged', got {impl!r}")
    return impl


def send_blocks(buf: jax.Array, counts: jax.Array, *, axis: str, impl: str) -> tuple[jax.Array, jax.Array]:
    """Send block j of ``buf [D, C, W]`` (``counts[j]`` valid rows first) to rank j.

    Returns ``(recv [D, C, W], recv_counts [D])``: block s = what source s sent, valid rows first. "padded" moves
    the whole buffer with `jax.lax.all_to_all`; "ragged" moves only the valid rows (`jax.lax.ragged_all_to_all`);
    the valid rows are the same (the padding rows of "ragged" stay zero).
    """
    impl = _concrete(impl)
    counts = counts.astype(jnp.int32)
    recv_counts = jax.lax.all_to_all(counts[:, None], axis, 0, 0, tiled=True)[:, 0]
    if impl == "padded":
        return jax.lax.all_to_all(buf, axis, 0, 0, tiled=True), recv_counts
    return _ragged(buf, counts, recv_counts, axis), recv_counts


def return_blocks(y: jax.Array, recv_counts: jax.Array, counts: jax.Array, *, axis: str, impl: str) -> jax.Array:
    """Inverse of `send_blocks`: ``y [D, C, W]`` (block s = results for source s, ``recv_counts[s]`` rows) back to
    the senders; returns ``[D, C, W]`` with block j = results from rank j for the ``counts[j]`` rows sent there."""
    impl = _concrete(impl)
    if impl == "padded":
        return jax.lax.all_to_all(y, axis, 0, 0, tiled=True)
    return _ragged(y, recv_counts.astype(jnp.int32), counts.astype(jnp.int32), axis)


def _ragged(buf: jax.Array, send: jax.Array, recv: jax.Array, axis: str) -> jax.Array:
    """`jax.lax.ragged_all_to_all` of block layout ``[D, C, W]``: block j's first ``send[j]`` rows go to rank j and
    land in its block of this rank (offset me·C), which receives ``recv[s]`` rows from each source s."""
    D, C = buf.shape[0], buf.shape[1]
    me = jax.lax.axis_index(axis)
    flat = buf.reshape((D * C,) + buf.shape[2:])
    in_off = jnp.arange(D, dtype=jnp.int32) * C
    out_off = jnp.full((D,), me * C, jnp.int32)
    out = jax.lax.ragged_all_to_all(flat, jnp.zeros_like(flat), in_off, send, out_off, recv, axis_name=axis)
    return out.reshape(buf.shape)
