"""The MoE layer's per-rank stages (inside `shard_map` over the ``ep`` axis), one function each.

    route → dispatch → pack by destination → exchange → expert FFN → return → combine

`tempo_jax.layer.moe` composes them into the synchronous layer; `tempo_jax.layer.cascade_exec` composes the same stages
into CascadeEP's asynchronous schedule (shifted exchanges per launch group, one expert FFN per group, OEWF).
Every stage takes and returns small NamedTuples of per-rank arrays, so a schedule can say "exchange these
source blocks, then run the expert FFN on those rows" without copying code.

The packed layout is a capacity-padded buffer ``[D, C, W]``: block j holds the rows this rank sends to rank j
(valid rows first), each row's hidden vector followed by its local slot id written as exact small numbers of
the row dtype (so the slot id travels with its row in one collective: 1 lane for 32-bit rows, 2 for 16-bit).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from pallas_kernels import BlockScaled, GmmTiling, dispatch, gmm
from pallas_kernels.ffn_chunked import FfnChunks, ffn_chunked
from pallas_kernels.implementations import GMM

from .exchange import return_blocks, send_blocks
from .experts import ExpertConfig, expert_out_norm, glu
from .routing import RouterConfig, Routing
from .routing import route as route_tokens
from .scopes import scoped

__all__ = [
    "Dispatched",
    "Exchanged",
    "FFN",
    "Packed",
    "PairOrder",
    "Received",
    "Routing",
    "Wire",
    "combine",
    "dispatch_pairs",
    "exchange_rows",
    "expert_ffn",
    "num_slots",
    "merge_by_slot",
    "order_pairs",
    "pack",
    "received",
    "return_rows",
    "route",
    "slot_lanes",
    "split_slots",
    "unpack_rows",
    "unpack_slots",
    "with_slots",
]


class Dispatched(NamedTuple):
    """The dispatch kernel's result: ``slot [T·K]`` int32 physical slot per (token, k) pair (row-major),
    ``counts [E]`` pairs per expert, ``counter [E]`` uint32 updated cumulative counter, ``replica_counts
    [E, R]`` pairs per replica column."""

    slot: jax.Array
    counts: jax.Array
    counter: jax.Array
    replica_counts: jax.Array


class Packed(NamedTuple):
    """Rows packed by destination rank.

    Attributes:
      buffer: ``[D, C, W]`` block j = rows (with slot lanes) for rank j, valid rows first, zeros after.
      counts: ``[D]`` int32 valid rows per block (≤ C; rows past C were dropped).
      wanted: ``[D]`` int32 rows per destination before the capacity cut (drops = wanted − counts).
      order: ``[T·K]`` int32 pair index of each destination-sorted row.
      dest, pos: ``[T·K]`` int32 block and row of each destination-sorted row (pos ≥ C: dropped).
    """

    buffer: jax.Array
    counts: jax.Array
    wanted: jax.Array
    order: jax.Array
    dest: jax.Array
    pos: jax.Array


class Received(NamedTuple):
    """Rows this rank received: ``rows [D, C, H]`` (block s from source s), ``slots [D, C]`` int32 local slot
    (S for padding rows), ``counts [D]`` int32 valid rows per block."""

    rows: jax.Array
    slots: jax.Array
    counts: jax.Array


class Exchanged(NamedTuple):
    """Steps 3–7's result on one rank (`tempo_jax.layer.exchange_ffn`): ``out [T, H]`` float32 each token's
    gate-weighted sum of its pairs' expert outputs (dropped pairs add nothing), ``group_sizes [num_slots]`` int32 rows
    each local slot computed, ``wanted [D]`` / ``sent [D]`` int32 rows per destination before and after the capacity
    cut, ``rounds`` int32 exchanges run (nr; 1 for one exchange or a launch schedule)."""

    out: jax.Array
    group_sizes: jax.Array
    wanted: jax.Array
    sent: jax.Array
    rounds: jax.Array


@dataclasses.dataclass(frozen=True)
class FFN:
    """The routed experts' FFN of one layer call, its settings frozen (hashable: carried through the exchange
    implementations, a static argument of their VJPs): the ``expert`` variant (`ExpertConfig`), the grouped-GEMM
    implementation ``gmm_impl``, Pallas ``interpret`` mode and FP8 activations ``quantize_lhs`` (columns per scale,
    or None). ``ffn(rows, slots, weights)`` is `expert_ffn`."""

    expert: ExpertConfig
    gmm_impl: str
    interpret: bool
    quantize_lhs: int | None = None

    def __call__(
        self, rows: jax.Array, slots: jax.Array, weights: dict, *, presorted: bool = False, runs: int | None = None
    ) -> tuple[jax.Array, jax.Array]:
        """``rows [M, H]`` on local ``slots [M]`` → ``(y [M, H], group_sizes [num_slots])`` (`expert_ffn`)."""
        kw = dict(expert=self.expert, gmm_impl=self.gmm_impl, interpret=self.interpret, quantize_lhs=self.quantize_lhs)
        return expert_ffn(rows, slots, weights, presorted=presorted, runs=runs, **kw)


@dataclasses.dataclass(frozen=True)
class Wire:
    """How one call's rows travel (hashable): the ``ep`` ``axis``, the ``exchange`` implementation (``"padded"``,
    ``"ragged"``, ``"ragged_split"``: `tempo_jax.layer.exchange`), H = ``hidden``, the row ``dtype`` and
    ``top_k`` pairs per row of the layer's ``x`` (K; 1 when each pair has its own row: weights on the input)."""

    axis: str
    exchange: str
    hidden: int
    dtype: Any
    top_k: int


@scoped("moe_route")
def route(
    x: jax.Array, params: dict, router: RouterConfig, top_k: int, expert_set=None, state=None, nodes=None
) -> Routing:
    """This rank's routing: ``x [T, H]`` through the router of ``router`` (`tempo_jax.layer.routing.route`; each
    token within its ``expert_set [T]`` when the router has sets; a router MLP adds the previous layer's ``state [T,
    Rh]`` where it carries one) → `Routing` (``ids [T, K]``, ``gate [T, K]``, ``probs [T, E]``, ``logits [T, E]``,
    and the router MLP's ``state [T, Rh]``); ``nodes``: each expert's node and the node count, for node-limited
    routing."""
    return route_tokens(x, params, router, top_k, expert_set, state, nodes)


@scoped("moe_dispatch")
def dispatch_pairs(
    routing: Routing,
    table: jax.Array,
    log2phy: jax.Array,
    counter: jax.Array,
    *,
    mode: str,
    uniforms: jax.Array | None,
    interpret: bool,
    valid: jax.Array | None = None,
) -> Dispatched:
    """The fused dispatch + count kernel: a physical slot per (token, k) pair through ``table [E, R]`` over the
    replica columns ``log2phy [E, R]``; ``counter [E]`` cumulative; ``uniforms [T, K]`` for sample mode;
    ``valid [T]`` False for padding rows, whose pairs get slot −1 and count nowhere (nor do ids outside [0, E))."""
    T = routing.ids.shape[0]
    valid = jnp.ones((T,), bool) if valid is None else valid
    res = dispatch(routing.ids, valid, table, log2phy, counter, mode=mode, uniforms=uniforms, interpret=interpret)
    return Dispatched(res.slots.reshape(-1), res.counts, res.counter, res.replica_counts)


def split_slots(slot: jax.Array, slots_per_rank: int, num_ranks: int) -> tuple[jax.Array, jax.Array]:
    """Physical slot p → ``(rank p // S, local slot p % S)`` (the EPLB layout: rank d holds slots d·S … d·S + S − 1);
    slot −1 (a padding row, an id outside [0, E)) → rank D, which no block holds: the pair is never sent."""
    return jnp.where(slot < 0, num_ranks, slot // slots_per_rank), jnp.where(slot < 0, 0, slot % slots_per_rank)


def merge_rank_replicas(dest: jax.Array, local: jax.Array, phy2log: jax.Array, slots_per_rank: int) -> jax.Array:
    """Each pair's local slot → the first slot of its rank that holds the same expert: a rank holding two replicas
    of an expert computes that expert's pairs as one group of the grouped GEMM, streaming its weights once (the rank
    cost every solver, table and metric prices: G_g counts an expert once per rank, docs/algorithms.md §1).

    Args:
      dest: ``[M]`` destination rank of each pair (D: not sent, left as it is).
      local: ``[M]`` local slot in [0, S) on ``dest``.
      phy2log: ``[P = D·S]`` the expert of every physical slot.
      slots_per_rank: S.

    Returns:
      ``[M]`` local slots, each the lowest slot on ``dest`` holding ``local``'s expert.
    """
    S = slots_per_rank
    experts = phy2log.reshape(-1, S)  # [D, S]
    D = experts.shape[0]
    first = jnp.argmax(experts[:, :, None] == experts[:, None, :], axis=-1).astype(local.dtype)  # [D, S]
    sent = dest < D
    return jnp.where(sent, first[jnp.where(sent, dest, 0), jnp.clip(local, 0, S - 1)], local)


def slot_lanes(slots: jax.Array, dtype) -> jax.Array:
    """``slots [M]`` int32 (0 ≤ slot < 2^16) as exact small numbers of the row ``dtype``: ``[M, 1]`` for 32-bit rows,
    ``[M, 2]`` (slot // 256, slot % 256) for 16-bit rows, whose 8-bit mantissa holds integers up to 256 exactly.

    Values, not bit patterns: small ints bit-cast into a float are denormals, which XLA may flush to zero.
    """
    if jnp.dtype(dtype).itemsize == 4:
        return slots.astype(dtype)[:, None]
    if jnp.dtype(dtype).itemsize == 2:
        return jnp.stack([slots // 256, slots % 256], axis=1).astype(dtype)
    raise ValueError(f"pack: rows of dtype {dtype} are not supported (32- or 16-bit floats)")


def unpack_slots(lanes: jax.Array) -> jax.Array:
    """Inverse of `slot_lanes`: ``[..., lanes]`` of the row dtype → ``[...]`` int32."""
    v = jnp.round(lanes.astype(jnp.float32)).astype(jnp.int32)
    return v[..., 0] if lanes.shape[-1] == 1 else v[..., 0] * 256 + v[..., 1]


class PairOrder(NamedTuple):
    """This rank's pairs sorted by destination (and, `order_pairs(by_slot=True)`, by local slot within it):
    ``order [T·K]`` pair index of each sorted pair, ``start [D]`` first sorted index of block j, ``wanted [D]`` pairs
    for destination j, ``local [T·K]`` local slot of each pair (pair order)."""

    order: jax.Array
    start: jax.Array
    wanted: jax.Array
    local: jax.Array


def order_pairs(dest: jax.Array, local: jax.Array, num_ranks: int, *, by_slot: bool = False) -> PairOrder:
    """`PairOrder` of pairs with destination ranks ``dest [T·K]`` (rank D: never sent) and local slots
    ``local [T·K]``: a stable sort by destination (`pack` and the dropless rounds both start from it); ``by_slot``:
    by destination, then local slot, then pair order — each block arrives sorted by slot, so the receiver orders its
    rows for the grouped GEMM by counting (`merge_by_slot`), not by a sort. Only where nothing is dropped: a capacity
    cut takes each block's first C pairs, which must stay in pair order (else high slots would be cut first)."""
    if by_slot:
        iota = jnp.arange(dest.shape[0], dtype=jnp.int32)
        order = jax.lax.sort((dest.astype(jnp.int32), local.astype(jnp.int32), iota), num_keys=2)[2]
    else:
        order = jnp.argsort(dest, stable=True).astype(jnp.int32)
    wanted = jnp.bincount(dest, length=num_ranks).astype(jnp.int32)
    start = (jnp.cumsum(wanted) - wanted).astype(jnp.int32)
    return PairOrder(order, start, wanted, local.astype(jnp.int32))


def with_slots(rows: jax.Array, slots: jax.Array, dtype) -> jax.Array:
    """The payload that travels: ``rows [..., H]`` in ``dtype`` followed by their local ``slots [...]`` as
    `slot_lanes` → ``[..., W]``."""
    lanes = slot_lanes(slots.reshape(-1).astype(jnp.int32), dtype).reshape(*slots.shape, -1)
    return jnp.concatenate([rows.astype(dtype), lanes], axis=-1)


@scoped("moe_pack")
def pack(
    x: jax.Array,
    dest: jax.Array,
    local: jax.Array,
    *,
    top_k: int,
    num_ranks: int,
    capacity: int,
    dtype,
    by_slot: bool = False,
) -> Packed:
    """Sort this rank's (token, k) pairs by destination rank and pack them, with their local slot ids, into
    ``[D, C, W]``: ``x [T, H]``, ``dest [T·K]`` destination rank and ``local [T·K]`` slot there of each pair
    (row-major over ``[T, K]``); rows past ``capacity`` per block are dropped (counted in ``wanted − counts``).
    ``by_slot``: each block sorted by local slot too (`order_pairs`; only where C drops nothing)."""
    D, C = num_ranks, capacity
    po = order_pairs(dest, local, D, by_slot=by_slot)
    dest_sorted = dest[po.order]
    pos = jnp.arange(dest.shape[0], dtype=jnp.int32) - po.start[dest_sorted]
    payload = with_slots(x.astype(dtype)[po.order // top_k], po.local[po.order], dtype)
    buf = jnp.zeros((D, C, payload.shape[1]), dtype)
    buf = buf.at[jnp.where(pos < C, dest_sorted, D), pos].set(payload, mode="drop")
    return Packed(buf, jnp.minimum(po.wanted, C), po.wanted, po.order, dest_sorted, pos)


def exchange_rows(packed: Packed, *, axis: str, exchange: str, hidden: int, slots_per_rank: int) -> Received:
    """Send block j of ``packed.buffer`` to rank j (`tempo_jax.layer.exchange.send_blocks`: ``"padded"``,
    ``"ragged"`` or ``"ragged_split"``, same result) and split the received payload into rows and local slot ids."""
    recv, recv_counts = send_blocks(packed.buffer, packed.counts, axis=axis, exchange=exchange)
    return received(recv, recv_counts, hidden=hidden, slots_per_rank=slots_per_rank)


def received(recv: jax.Array, recv_counts: jax.Array, *, hidden: int, slots_per_rank: int) -> Received:
    """`Received` from a block buffer ``recv [D, C, W]`` with ``recv_counts [D]`` valid rows per block."""
    C = recv.shape[1]
    valid = jnp.arange(C)[None, :] < recv_counts[:, None]
    # The slot lanes are ids, not activations: no gradient flows through them.
    slots = jnp.where(valid, unpack_slots(jax.lax.stop_gradient(recv[..., hidden:])), slots_per_rank)
    return Received(recv[..., :hidden], slots, recv_counts)


@scoped("moe_ffn")
def expert_ffn(
    rows: jax.Array,
    slots: jax.Array,
    weights: dict,
    *,
    expert: ExpertConfig,
    gmm_impl: str,
    interpret: bool,
    join_parts: bool | None = None,
    quantize_lhs: int | None = None,
    presorted: bool = False,
    runs: int | None = None,
) -> tuple[jax.Array, jax.Array]:
    """The routed experts' FFN of ``rows [M, H]`` on their local ``slots [M]`` (S = padding: output 0) with this rank's
    ``weights``: ``w_gate / w_up [S, H, F]``, ``w_down [S, F, H]`` (arrays, or FP8 `pallas_kernels.BlockScaled` weights
    the GEMM reads in its kernel; + ``b_gate / b_up [S, F]``, ``b_down [S, H]`` when ``expert.bias``): sort by slot,
    grouped GEMMs (gate, up, down), the activation of ``expert`` (`tempo_jax.layer.experts.glu`), unsort.

    Each value may instead be a tuple of parts along the slot axis (``([S, ...], [k, ...])``: the stored slots and
    the dynamic copies, `num_slots` = S + k), passed to `gmm` as parts, so the stored weights are not copied into
    one array: on CPU ("chunked") every part's groups are written into one output buffer; the other
    implementations add one output per part — two ``[M, 2F]`` and two ``[M, H]`` buffers more, so there
    ``join_parts`` (None: whichever moves fewer elements, from the static shapes) may concatenate them first.

    ``quantize_lhs``: FP8 activations, the rows entering each grouped GEMM quantized to e4m3 per this many columns
    (`pallas_kernels.gmm`; ``MoEConfig(fp8_activations=True)``), or None.

    ``presorted``: the rows already come in slot order (padding last), as the ring selects them: no sort, no unsort.

    ``runs``: the rows come as this many equal blocks, each sorted by slot (padding last: `pack(by_slot=True)`'s
    blocks as received): their order for the GEMMs is found by counting (`merge_by_slot`), not by a sort.

    Returns ``(y [M, H], group_sizes [num_slots])``.
    """
    parts = {name: w if isinstance(w, tuple) else (w,) for name, w in weights.items()}
    if join_parts is None:  # concatenating copies every stored element; summing parts touches 2·(2F + H) per row
        stored = sum(p[0].size for p in parts.values())
        width = (2 if "w_gate" in parts else 1) * parts["w_up"][0].shape[2] + rows.shape[1]
        chunked = GMM.resolve(gmm_impl, interpret=interpret) == "chunked"  # one buffer: parts cost nothing
        join_parts = not chunked and stored <= 2 * rows.shape[0] * width
    if join_parts:  # (FP8 weights, `BlockScaled`, concatenate their values and scales alike)
        parts = {name: (jax.tree.map(_join, *p),) if len(p) > 1 else p for name, p in parts.items()}
    S = num_slots(weights)
    if presorted:
        order, position = None, None
        group_sizes = jnp.bincount(slots, length=S + 1)[:S].astype(jnp.int32)
    elif runs:
        order, position, group_sizes = merge_by_slot(slots, runs, S)
    else:
        order = jnp.argsort(slots, stable=True)
        position = jnp.zeros_like(order).at[order].set(jnp.arange(order.shape[0], dtype=order.dtype))
        group_sizes = jnp.bincount(slots, length=S + 1)[:S].astype(jnp.int32)
    # The barriers keep XLA from fusing the row gathers into the GEMM loops (measured 10–25% faster on CPU).
    xs = rows if presorted else jax.lax.optimization_barrier(rows[order])

    fused = None if expert.out_norm_eps is not None else _fused_ffn(parts, gmm_impl, interpret, quantize_lhs)
    if fused is not None:  # CPU: the whole FFN per row chunk, one loop (`pallas_kernels.ffn_chunked`)
        w = {name: p if len(p) > 1 or name.startswith("w_") else p[0] for name, p in parts.items()}
        w.update({b: jnp.concatenate(parts[b], axis=0) for b in ("b_gate", "b_up", "b_down") if b in parts})
        y = ffn_chunked(xs, group_sizes, w, fused.with_activation(_Activation(expert)))
    else:
        y = _three_gemms(
            xs, slots if presorted else slots[order], group_sizes, parts, expert, gmm_impl, interpret, quantize_lhs
        )
    if presorted:
        return y, group_sizes
    y = jax.lax.optimization_barrier(y)
    # Unsort by gathering each row from its sorted position (a gather of rows is cheaper than a scatter of rows).
    return y[position], group_sizes


def merge_by_slot(slots: jax.Array, runs: int, num_slots: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The stable order by slot of ``slots [M]`` that arrive as ``runs`` equal blocks, each sorted by slot (padding,
    slot S = ``num_slots``, last) → ``(order [M], position [M], group_sizes [S])``: the row at each sorted place, the
    sorted place of each row, rows per slot — what ``jnp.argsort(slots, stable=True)``, its inverse and a bincount
    give, from counts alone: row i of block d with slot s goes to (rows of slots < s) + (rows of slot s in blocks
    < d) + (its place in block d's run of s). ``[runs, S + 1]`` counts and an ``[M]`` scatter instead of a sort."""
    M = slots.shape[0]
    if runs < 1 or M % runs:
        raise ValueError(f"merge_by_slot: {M} rows do not split into {runs} equal blocks (runs must divide M)")
    C = M // runs
    s = slots.reshape(runs, C).astype(jnp.int32)
    count = jnp.sum(s[:, :, None] == jnp.arange(num_slots + 1, dtype=jnp.int32), axis=1, dtype=jnp.int32)  # [runs, S+1]
    total = jnp.sum(count, axis=0)
    slot_start = jnp.cumsum(total) - total  # [S + 1]: rows of the slots before
    block_before = jnp.cumsum(count, axis=0) - count  # [runs, S + 1]: slot s's rows in the blocks before
    run_start = jnp.cumsum(count, axis=1) - count  # [runs, S + 1]: where slot s's run begins in each block
    shift = (block_before - run_start).reshape(-1)  # [runs · (S + 1)], read at (block, slot): one flat gather
    d = jnp.arange(runs, dtype=jnp.int32)[:, None] * (num_slots + 1)
    i = jnp.arange(C, dtype=jnp.int32)[None, :]
    position = (slot_start[s] + shift[d + s] + i).reshape(M)
    order = jnp.zeros((M,), jnp.int32).at[position].set(jnp.arange(M, dtype=jnp.int32))
    return order, position, total[:num_slots]


def _three_gemms(xs, slot_sorted, group_sizes, parts: dict, expert, gmm_impl, interpret, quantize_lhs) -> jax.Array:
    """The FFN as three `pallas_kernels.gmm` calls (gate, up, down) around the activation, on sorted rows."""

    def grouped(lhs, name: str):  # the parts side by side along the slots (`gmm` takes them as they are)
        w = parts[name]
        rhs = w if len(w) > 1 else w[0]
        return gmm(lhs, rhs, group_sizes, implementation=gmm_impl, interpret=interpret, quantize_lhs=quantize_lhs)

    # Gate and up as two grouped GEMMs: fusing them into one of width 2F concatenated the stored w_gate and w_up on
    # every call (a copy of two thirds of the expert weights; measured 24% of the forward at E 256, 128 tokens).
    gate, up = (grouped(xs, "w_gate") if expert.gated else None), grouped(xs, "w_up")
    if expert.bias and expert.gated:  # per-row biases: each sorted row's slot picks its expert's (padding: zeros)
        gate = gate + _row_bias(jnp.concatenate(parts["b_gate"], axis=0), slot_sorted)
    if expert.bias:
        up = up + _row_bias(jnp.concatenate(parts["b_up"], axis=0), slot_sorted)
    h = glu(gate, up, expert)
    y = grouped(h, "w_down")
    if expert.bias:
        y = y + _row_bias(jnp.concatenate(parts["b_down"], axis=0), slot_sorted)
    if expert.out_norm_eps is not None:  # each expert's output row normed (its scale is in w_down already)
        y = expert_out_norm(y, expert.out_norm_eps)
    return y


@dataclasses.dataclass(frozen=True)
class _Activation:
    """``(g, u) → h``: the gated activation of ``expert`` (hashable, a static setting of `ffn_chunked`)."""

    expert: ExpertConfig

    def __call__(self, g: jax.Array, u: jax.Array) -> jax.Array:
        return glu(g, u, self.expert)


def _fused_ffn(parts: dict, gmm_impl: str, interpret: bool, quantize_lhs) -> FfnChunks | None:
    """The chunk settings when the FFN runs fused (`pallas_kernels.ffn_chunked`): where the grouped GEMM is XLA:CPU's
    "chunked" path, without FP8 activations or FP8 weights (those keep the three GEMMs that handle them); else None."""
    if GMM.resolve(gmm_impl, interpret=interpret) != "chunked" or quantize_lhs is not None or "w_gate" not in parts:
        return None  # (plain experts, without a gate projection: the two grouped GEMMs)
    if any(isinstance(w, BlockScaled) for p in parts.values() for w in p):
        return None
    t = GmmTiling()
    return FfnChunks(activation=None, chunk=t.chunk, small_chunk=t.small_chunk, min_chunk=t.min_chunk)


def _join(*parts: jax.Array) -> jax.Array:
    return jnp.concatenate(parts, axis=0)


def num_slots(weights: dict) -> int:
    """Local slots of an `expert_ffn` weights dict (the parts of a tuple value summed)."""
    w = weights["w_up"]
    return sum(p.shape[0] for p in w) if isinstance(w, tuple) else w.shape[0]


def _row_bias(bias: jax.Array, slot: jax.Array) -> jax.Array:
    """``bias [S, N]`` of each row's slot ``slot [M]`` (slot S, padding: zeros) → ``[M, N]``."""
    padded = jnp.concatenate([bias, jnp.zeros((1, bias.shape[1]), bias.dtype)], axis=0)
    return padded[slot]


def return_rows(y: jax.Array, received_counts: jax.Array, packed: Packed, *, axis: str, exchange: str) -> jax.Array:
    """Send results ``y [D, C, H]`` (block s = rows from source s) back; returns ``[T·K, H]`` in pair order
    (dropped pairs: zeros)."""
    back = return_blocks(y, received_counts, packed.counts, axis=axis, exchange=exchange)
    return unpack_rows(back, packed)


def unpack_rows(back: jax.Array, packed: Packed) -> jax.Array:
    """Rows ``back [D, C, H]`` (block j = results from rank j, in this rank's packing order) → ``[T·K, H]`` in
    pair order; dropped pairs get zeros."""
    C, D = back.shape[1], back.shape[0]
    keep = (packed.pos < C) & (packed.dest < D)  # pairs past capacity or never sent (rank D): zeros
    rows = back[jnp.where(keep, packed.dest, 0), jnp.where(keep, packed.pos, 0)]
    rows = jnp.where(keep[:, None], rows, 0)
    return jnp.zeros_like(rows).at[packed.order].set(rows)


@scoped("moe_combine")
def combine(y_pairs: jax.Array, gate: jax.Array, out_dtype) -> jax.Array:
    """Weighted sum of each token's K expert outputs: ``y_pairs [T·K, H]``, ``gate [T, K]`` → ``[T, H]``."""
    T, K = gate.shape
    y = y_pairs.reshape(T, K, -1)
    return jnp.einsum("tk,tkh->th", gate.astype(y.dtype), y).astype(out_dtype)
