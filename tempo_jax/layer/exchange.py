"""Token exchange between expert-parallel ranks, inside `shard_map` over one mesh axis.

Both paths move a capacity-padded block buffer ``[D, C, W]`` (block j = the rows for rank j, valid rows first)
and return, on every rank, the blocks it received: block s holds what source s sent, valid rows first
(``recv_counts[s]`` of them). The reverse call returns results to where the rows came from.

- "padded": `jax.lax.all_to_all` of a capacity-padded ``[D, C, H]`` buffer (works everywhere, XLA:CPU too).
- "ragged": `jax.lax.ragged_all_to_all` (GPU/TPU; not implemented on XLA:CPU). Same result.
- "ragged_split": the same collective with each peer's rows cut into `SPLIT_UPDATES` updates of at most
  ⌈C / SPLIT_UPDATES⌉ rows (XLA runs the updates of one collective concurrently: one update per peer leaves most of
  a GPU's copy engines idle — 2% of NVLink in xla #33386, +60% from splitting in marin #8077). Same result.
- "ring": not a block exchange — the layer's steps 3–7 as all-gather / local FFN / reduce-scatter
  (`tempo_jax.layer.ring`); what moves whole slots beside it (replica gradients, dynamic copies) takes the
  platform's block exchange (`block_exchange`).
- "auto": the layer takes the cheaper of the ring and the platform's block exchange for the call's shapes
  (`exchange_cost`); the block exchange alone is resolved by `EXCHANGE`
  (`pallas_kernels.implementations.ImplementationTable`): ragged on GPU/TPU, padded elsewhere.

The ragged collectives' metadata (`ragged_metadata`) is ``[D·U]`` per array, update i to peer j at ``j·U + i``
(XLA's layout): input offsets into this rank's buffer, sizes, and the offsets where the rows land in the receiver's
buffer (this rank's block there, ``me·C``), which the sender gives.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator
from typing import Literal, get_args

import jax
import jax.numpy as jnp

from pallas_kernels import ImplementationTable, platform

from .scopes import scoped

__all__ = [
    "BANDWIDTH_GBPS",
    "EXCHANGE",
    "CallShape",
    "SPLIT_UPDATES",
    "ExchangeCost",
    "ExchangeImpl",
    "NODE_GBPS",
    "NodeCost",
    "block_exchange",
    "choose_exchange",
    "distinct_nodes",
    "exchange_cost",
    "exchange_platform",
    "lowering_for",
    "node_exchange_cost",
    "ragged_metadata",
    "return_blocks",
    "send_blocks",
]

ExchangeImpl = Literal["auto", "padded", "ragged", "ragged_split", "ring"]

#: Updates per peer of the "ragged_split" exchange (fewer when a block has fewer rows than this).
SPLIT_UPDATES = 8

#: The exchange's implementations: "auto" is the ragged collective on GPU/TPU and the padded one elsewhere.
EXCHANGE = ImplementationTable(
    op="exchange", names=get_args(ExchangeImpl), auto={"gpu": ("ragged",), "tpu": ("ragged",), "default": ("padded",)}
)
"""The exchange's implementations; "auto" here is the platform's block exchange (the layer's "auto" may take the
ring instead, by `exchange_cost`)."""


_LOWERING_FOR: contextvars.ContextVar[str | None] = contextvars.ContextVar("tempo_jax_lowering_for", default=None)


@contextlib.contextmanager
def lowering_for(target: str) -> Iterator[None]:
    """Trace the layer's exchange as for ``target`` ("gpu" or "tpu") on any host.

    Inside the block "auto" takes the target's exchange and the ragged exchanges are not refused on a CPU mesh, so a
    CPU machine can lower (``jax.jit(f).trace(...).lower(lowering_platforms=("cuda",))``) or read the program a GPU
    would run. XLA:CPU cannot execute what is traced here with a ragged exchange. Only the exchange follows the
    target (the grouped GEMM's "auto" follows the default backend). Trace a fresh ``jax.jit`` inside the block: jit
    caches its traces without the target, so a function traced before (or after) is not traced again.
    """
    if target not in ("gpu", "tpu"):
        raise ValueError(f"lowering_for: target must be 'gpu' or 'tpu', got {target!r}")
    token = _LOWERING_FOR.set(target)
    try:
        yield
    finally:
        _LOWERING_FOR.reset(token)


def exchange_platform(mesh: jax.sharding.Mesh | None = None) -> str:
    """The platform the exchange is traced for: `lowering_for`'s target inside one, else the platform of the mesh's
    devices ("cuda" / "rocm" as "gpu"), else the default backend's."""
    target = _LOWERING_FOR.get()
    if target is not None:
        return target
    if mesh is None:
        return platform()
    name = mesh.devices.flat[0].platform
    return "gpu" if name in ("gpu", "cuda", "rocm") else name


def block_exchange(exchange: str) -> str:
    """The block exchange that moves whole rows per (source, destination) beside the resolved ``exchange``: itself,
    or for "ring" the platform's ("padded" on XLA:CPU, "ragged" on GPU/TPU)."""
    return EXCHANGE.resolve("auto", on=exchange_platform()) if exchange == "ring" else exchange


def _concrete(exchange: str) -> str:
    if exchange not in ("padded", "ragged", "ragged_split"):
        raise ValueError(
            f"exchange must be a resolved implementation, 'padded', 'ragged' or 'ragged_split', got {exchange!r}"
        )
    return exchange


@scoped("moe_exchange")
def send_blocks(buf: jax.Array, counts: jax.Array, *, axis: str, exchange: str) -> tuple[jax.Array, jax.Array]:
    """Send block j of ``buf [D, C, W]`` (``counts[j]`` valid rows first) to rank j.

    Returns ``(recv [D, C, W], recv_counts [D])``: block s = what source s sent, valid rows first. "padded" moves
    the whole buffer with `jax.lax.all_to_all`; "ragged" moves only the valid rows (`jax.lax.ragged_all_to_all`);
    the valid rows are the same (the padding rows of "ragged" stay zero).
    """
    exchange = _concrete(exchange)
    counts = counts.astype(jnp.int32)
    recv_counts = jax.lax.all_to_all(counts[:, None], axis, 0, 0, tiled=True)[:, 0]
    if exchange == "padded":
        return jax.lax.all_to_all(buf, axis, 0, 0, tiled=True), recv_counts
    return _ragged(buf, counts, recv_counts, axis, _updates(exchange, buf.shape[1])), recv_counts


@scoped("moe_return")
def return_blocks(y: jax.Array, recv_counts: jax.Array, counts: jax.Array, *, axis: str, exchange: str) -> jax.Array:
    """Inverse of `send_blocks`: ``y [D, C, W]`` (block s = results for source s, ``recv_counts[s]`` rows) back to
    the senders; returns ``[D, C, W]`` with block j = results from rank j for the ``counts[j]`` rows sent there."""
    exchange = _concrete(exchange)
    if exchange == "padded":
        return jax.lax.all_to_all(y, axis, 0, 0, tiled=True)
    return _ragged(y, recv_counts.astype(jnp.int32), counts.astype(jnp.int32), axis, _updates(exchange, y.shape[1]))


def _updates(exchange: str, capacity: int) -> int:
    return min(SPLIT_UPDATES, capacity) if exchange == "ragged_split" else 1


def ragged_metadata(send: jax.Array, recv: jax.Array, me, capacity: int, updates: int = 1):
    """The four metadata arrays of `jax.lax.ragged_all_to_all` for block layout ``[D, C, W]`` on rank ``me``, each
    peer's rows in ``updates`` pieces of at most ⌈C / updates⌉ rows: ``send [D]`` rows to each peer, ``recv [D]``
    rows from each → ``(input_offsets, send_sizes, output_offsets, recv_sizes)``, each ``[D·updates]`` int32."""
    D, C, U = send.shape[0], capacity, updates
    piece = -(-C // U)
    start = jnp.minimum(jnp.arange(U, dtype=jnp.int32) * piece, C - 1)  # in-block start of each piece ([U])
    block = jnp.arange(D, dtype=jnp.int32)[:, None] * C

    def sizes(n):
        return jnp.clip(n.astype(jnp.int32)[:, None] - jnp.arange(U, dtype=jnp.int32)[None, :] * piece, 0, piece)

    in_off = (block + start[None, :]).reshape(-1)
    out_off = jnp.broadcast_to(me * C + start[None, :], (D, U)).astype(jnp.int32).reshape(-1)
    return in_off, sizes(send).reshape(-1), out_off, sizes(recv).reshape(-1)


def _ragged(buf: jax.Array, send: jax.Array, recv: jax.Array, axis: str, updates: int = 1) -> jax.Array:
    """`jax.lax.ragged_all_to_all` of block layout ``[D, C, W]``: block j's first ``send[j]`` rows go to rank j and
    land in its block of this rank (offset me·C), which receives ``recv[s]`` rows from each source s."""
    D, C = buf.shape[0], buf.shape[1]
    me = jax.lax.axis_index(axis)
    flat = buf.reshape((D * C,) + buf.shape[2:])
    in_off, send_sizes, out_off, recv_sizes = ragged_metadata(send, recv, me, C, updates)
    out = jax.lax.ragged_all_to_all(flat, jnp.zeros_like(flat), in_off, send_sizes, out_off, recv_sizes, axis_name=axis)
    return out.reshape(buf.shape)


@dataclasses.dataclass(frozen=True)
class ExchangeCost:
    """What one layer call's steps 3–7 move per rank (`exchange_cost`): ``wire_bytes`` sent over the links (both
    directions' collectives, forward), ``local_bytes`` read and written in the rank's memory around them (packing,
    sorting, gathering, the reduction's sums), and ``us`` their modelled time at ``link_gbps`` / ``memory_gbps``."""

    wire_bytes: float
    local_bytes: float
    us: float


#: Link and memory bandwidth (GB/s) per platform for `exchange_cost`: on XLA:CPU's devices of one process a
#: collective is a copy in memory (the link is the memory); a GPU node's NVLink (DeepEP's 153 GB/s) beside HBM.
BANDWIDTH_GBPS = {"cpu": (10.0, 10.0), "gpu": (150.0, 3000.0), "tpu": (100.0, 1500.0)}


@dataclasses.dataclass(frozen=True)
class CallShape:
    """The shapes one layer call's exchange moves, per rank: T = ``tokens_per_rank`` rows of H = ``hidden`` values of
    ``itemsize`` bytes, K = ``top_k`` pairs each, D = ``num_ranks``, C = ``capacity`` rows per (source, destination)
    block (a round's)."""

    tokens_per_rank: int
    top_k: int
    hidden: int
    num_ranks: int
    capacity: int
    itemsize: int


def exchange_cost(exchange: str, shape: CallShape, platform: str = "cpu") -> ExchangeCost:
    """The modelled cost of ``exchange`` ("padded", "ragged" / "ragged_split" or "ring") for one call's forward on
    one rank of ``shape`` (`CallShape`):

    - block exchanges send each pair's row (H values + the slot lanes) and get its result back: "padded" moves every
      block whole, D·C rows each way; "ragged" only the T·K valid rows. Around them: the pairs sorted and packed,
      the received rows sorted by slot and unsorted, the results unpacked — ~7 passes over a row each.
    - "ring" all-gathers the group's tokens ((D − 1)·T rows in) and reduce-scatters float32 results ((D − 1)·T rows
      out, each summed from D): its own pairs gathered and their results added into a D·T-row buffer that is zeroed
      and summed.

    ``us`` = wire bytes / link + local bytes / memory (`BANDWIDTH_GBPS[platform]`; docs/algorithms.md §15).
    """
    D, T, K, H, C, b = shape.num_ranks, shape.tokens_per_rank, shape.top_k, shape.hidden, shape.capacity, shape.itemsize
    lanes = 1 if b == 4 else 2
    frac = (D - 1) / D  # the share of a collective's buffer that leaves the rank
    if exchange == "ring":
        wire = (D - 1) * T * H * (b + 4) + (D - 1) * T * 2 * K * 4  # tokens in, float32 sums out, (gate, code) in
        local = D * T * H * 4 * 3 + T * K * H * (b + 4 * 2)  # zero, add and reduce the D·T rows; gather, scatter-add
    elif exchange in ("padded", "ragged", "ragged_split"):
        rows = D * C if exchange == "padded" else min(T * K, D * C)
        wire = frac * rows * ((H + lanes) * b + H * b)
        local = T * K * H * b * 4 + rows * H * b * 3  # pack, unpack, combine; sort / unsort at the experts
    else:
        raise ValueError(
            f"exchange_cost: exchange must be 'padded', 'ragged', 'ragged_split' or 'ring', got {exchange!r}"
        )
    link, memory = BANDWIDTH_GBPS.get(platform, BANDWIDTH_GBPS["cpu"])
    return ExchangeCost(float(wire), float(local), wire / (link * 1e3) + local / (memory * 1e3))


def choose_exchange(block: str, shape: CallShape, platform: str) -> str:
    """What ``exchange="auto"`` runs: the platform's block exchange ``block`` or "ring", whichever `exchange_cost`
    prices lower for ``shape`` (ties, and a group of one rank: the block exchange)."""
    if shape.num_ranks < 2:
        return block
    return "ring" if exchange_cost("ring", shape, platform).us < exchange_cost(block, shape, platform).us else block


#: Bandwidth (GB/s) per device of the links between nodes, for `node_exchange_cost`: on a GPU cluster DeepEP's measured
#: RDMA (~50 GB/s per GPU over 400 Gb/s InfiniBand), against NVLink's 150 GB/s inside a node (`BANDWIDTH_GBPS`).
NODE_GBPS = {"cpu": 10.0, "gpu": 50.0, "tpu": 50.0}


@dataclasses.dataclass(frozen=True)
class NodeCost:
    """What one layer call's exchange moves per rank on a ``node × ep`` mesh (`node_exchange_cost`): ``node_bytes``
    over the links between nodes and ``link_bytes`` over the links inside a node (forward, both directions), and
    ``us``, their modelled time at `NODE_GBPS` and `BANDWIDTH_GBPS`'s link (the two at once)."""

    node_bytes: float
    link_bytes: float
    us: float


def distinct_nodes(top_k: int, nodes: int, max_nodes: int = 0) -> float:
    """Expected nodes a token's K pairs reach when each pair picks a node uniformly (K draws over Nn nodes:
    Nn·(1 − (1 − 1/Nn)^K)), at most ``max_nodes`` M when the router is node-limited (`RouterConfig.max_nodes`)."""
    expect = nodes * (1.0 - (1.0 - 1.0 / nodes) ** top_k)
    return min(expect, float(max_nodes)) if max_nodes else expect


def node_exchange_cost(
    node_exchange: str, shape: CallShape, nodes: int, platform: str = "gpu", *, reached: float | None = None
) -> NodeCost:
    """The modelled bytes and time of one call's forward exchange per rank over Nn = ``nodes`` nodes of De = D / Nn
    ranks (``shape``: `CallShape`; only valid rows move, as the ragged exchanges move them), each pair's rank drawn
    uniformly:

    - ``"flat"``: every pair's row (H values + slot lanes) to its rank and its result (H) back; a share
      (D − De) / D of them crosses nodes, (De − 1) / D stays inside this rank's node.
    - ``"two_hop"``: each token's row once to each other node its pairs reach — ``reached`` nodes per token (default
      `distinct_nodes`), (Nn − 1) / Nn of them another node on average — with its K pairs' (ep index, slot, gate),
      12·K bytes, and one partial row (H in the row dtype) back per (token, node); inside every node the received
      pairs go to their ranks ((De − 1) / De of them leave the relay) and come back as in the flat exchange.

    ``us`` = the longer of node bytes / `NODE_GBPS` and link bytes / the link of `BANDWIDTH_GBPS`: the two link
    classes are separate ports that run at once (docs/meshes.md).
    """
    T, K, H, D, b = shape.tokens_per_rank, shape.top_k, shape.hidden, shape.num_ranks, shape.itemsize
    if nodes < 1 or D % nodes:
        raise ValueError(f"node_exchange_cost: nodes={nodes} must divide the {D} ranks")
    De = D // nodes
    lanes = 1 if b == 4 else 2
    pair = (H + lanes) * b + H * b  # a pair's row out and its result back
    if node_exchange == "flat":
        node, link = T * K * (D - De) / D * pair, T * K * (De - 1) / D * pair
    elif node_exchange == "two_hop":
        other = (distinct_nodes(K, nodes) if reached is None else reached) * (nodes - 1) / nodes
        node = T * other * (2 * H * b + 12 * K)
        arrived = T * K  # the pairs every relay forwards inside its node, on average its own tokens' share
        link = arrived * (De - 1) / De * pair
    else:
        raise ValueError(f"node_exchange_cost: node_exchange must be 'flat' or 'two_hop', got {node_exchange!r}")
    node_gbps, link_gbps = (
        NODE_GBPS.get(platform, NODE_GBPS["cpu"]),
        BANDWIDTH_GBPS.get(platform, BANDWIDTH_GBPS["cpu"])[0],
    )
    return NodeCost(float(node), float(link), max(node / (node_gbps * 1e3), link / (link_gbps * 1e3)))
