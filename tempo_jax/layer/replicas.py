"""Replicas of one expert on several slots: tied in training, moved when the placement changes.

**Tied gradients** (`tie_replicas`, inside the layer's `shard_map`). Every rank holds only its S slots
``[S, ...]`` of the physical expert arrays. In the backward pass the gradient of each slot whose expert has
several replicas becomes the sum over the expert's replica group, so every replica receives the logical
expert's gradient and the same optimizer update: replicas stay bit-identical for any number of steps. Replicas on
one rank are summed locally; across ranks, one of two collectives (`REPLICA_SYNC`, chosen per call):

- ``"exchange"``: only the members of a group exchange. Rank d sends every rank j the local sum of each expert the
  two both hold (one row per shared expert), with the layer's block exchange (`tempo_jax.layer.exchange`), and adds
  what it receives. With the ragged exchange (GPU/TPU) a rank sends exactly its shared experts' rows — its bytes grow
  with the replicated slots it holds, never with E (``Placement.spread(16, 8, 4)``: 4 rows per rank, where the
  all-reduce carries 16); the padded exchange (XLA:CPU) moves ``[D, S, ...]`` blocks.
- ``"all_reduce"``: one ``psum`` over ``ep`` of a ``[Rb, ...]`` float32 buffer, Rb = min(E, P − E) ≥ the replicated
  experts (the redundant slots).

``"auto"`` takes the exchange when it is ragged, else whichever sends fewer bytes per rank (the padded blocks'
(D − 1)·S rows against the ring all-reduce's 2·(D − 1)/D·Rb). Both read the replica groups in-graph from
``phy2log`` (no host data: a new placement is new data, not a new program) and serve every placement. At real size
the sum runs in column chunks, one after another, so that one chunk's buffer stays within `TIE_CHUNK_BYTES`
(`tie_chunks`; DeepSeek-V3 on EP64 would otherwise hold 64 redundant experts' float32 gradients, 11.3 GB). Without
redundancy (P = E) nothing is exchanged: expert gradients never leave their rank. Every collective runs along
``ep``, inside each EP group, on each device's tensor / FSDP share of the arrays.

**Migration** (`plan_migration` on the host, `migrate` in-graph). A placement change moves exactly the slots whose
expert is not already on their rank: each such slot's rows come from one rank that held the expert before, in one
``all_to_all`` per array of ``[D, Mb, ...]`` blocks (Mb = the most slots one rank sends another, rounded up to a
power of two so few programs compile); slots whose expert was already on the rank are local copies. Only the K
changed slots of a rank are written, in place (the arrays are donated): the move's memory traffic follows the
slots that change, not S. The same plan moves any array laid out like the weights (Adam's moments), so the
optimizer state follows its weights; on a multi-axis mesh each array keeps its sharding (the move runs along
``ep`` on every device's share, the same in every EP group).

Glossary additions: Rb tied groups' buffer rows, Mb rows per migration block."""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from solvers import Placement

from .exchange import send_blocks
from .scopes import scoped

__all__ = [
    "REPLICA_SYNC",
    "MigrationPlan",
    "MigrationReport",
    "migrate",
    "plan_migration",
    "replica_sync_method",
    "shared_rows",
    "TIE_CHUNK_BYTES",
    "tie_buffer_rows",
    "tie_chunks",
    "tie_replicas",
]

#: How replicas' gradients are summed across ranks (see the module).
REPLICA_SYNC = ("auto", "exchange", "all_reduce")
#: The largest float32 buffer one step of the replicas' gradient sum holds (`tie_chunks`): 256 MiB.
TIE_CHUNK_BYTES = 1 << 28


# ------------------------------------------------------------------------------------------------ tied replicas
def tie_buffer_rows(num_experts: int, num_slots: int) -> int:
    """Rb: rows of the replica-sum buffer, an upper bound on the experts with more than one replica."""
    return max(0, min(num_experts, num_slots - num_experts))


def _held(p2l: jax.Array, num_experts: int) -> jax.Array:
    """``[D, E]`` bool: which experts each rank holds (``p2l [D, S]``)."""
    rows = jnp.arange(p2l.shape[0])[:, None]
    return jnp.zeros((p2l.shape[0], num_experts + 1), bool).at[rows, p2l].set(True)[:, :num_experts]


def _first_slots(slots: jax.Array) -> jax.Array:
    """``[..., S]`` bool: the first slot of each expert among ``slots [..., S]`` (its row stands for the expert)."""
    same = slots[..., :, None] == slots[..., None, :]  # [..., S, S]
    return jnp.argmax(same, axis=-2) == jnp.arange(slots.shape[-1])


def _outgoing(src_slots: jax.Array, dst_holds: jax.Array) -> tuple[jax.Array, jax.Array]:
    """What a source sends each destination: ``(slots [D, S], counts [D])``, in slot order, its first slot of every
    expert the destination holds. ``src_slots [S]`` the source's experts, ``dst_holds [D, E]``."""
    send = _first_slots(src_slots)[None, :] & dst_holds[:, src_slots]  # [D, S]
    return jnp.argsort(~send, axis=1, stable=True), jnp.sum(send, axis=1).astype(jnp.int32)


def _sum_over_local(g: jax.Array, mine: jax.Array) -> jax.Array:
    """``g [S, W]`` with each row replaced by the sum over this rank's rows of the same expert (``mine [S]``)."""
    same = (mine[:, None] == mine[None, :]).astype(jnp.float32)
    return jnp.einsum("st,tw->sw", same, g, precision=jax.lax.Precision.HIGHEST)


def _exchange_sum(g: jax.Array, phy2log: jax.Array, *, axis: str, num_experts: int, exchange: str) -> jax.Array:
    """The ``"exchange"`` sum of ``g [S, W]`` float32 (every array of the rank side by side): local sums per expert,
    then one block exchange in which each rank sends every other rank its rows of the experts both hold."""
    S = g.shape[0]
    D = phy2log.shape[0] // S
    me = jax.lax.axis_index(axis)
    p2l = phy2log.reshape(D, S)
    mine = p2l[me]
    held = _held(p2l, num_experts) & (jnp.arange(D) != me)[:, None]  # no block to myself
    local = _sum_over_local(g, mine)
    # Step 1: block j = my first rows of the experts rank j holds, valid rows first.
    order, counts = _outgoing(mine, held)
    valid = jnp.arange(S)[None, :] < counts[:, None]
    buf = jnp.where(valid[..., None], local[order], 0)  # [D, S, W]
    # Step 2: the exchange; block s holds what rank s sent: its first rows of the experts I hold, in its slot order.
    with jax.named_scope("tie_replicas_exchange"):
        recv, recv_counts = send_blocks(buf, counts, axis=axis, exchange=exchange)
    mine_held = _held(mine[None, :], num_experts)[0]  # [E]
    their = jax.vmap(lambda slots: _outgoing(slots, mine_held[None, :])[0][0])(p2l)  # [D, S] their sent slots
    got = jnp.arange(S)[None, :] < recv_counts[:, None]
    experts = jnp.where(got, jnp.take_along_axis(p2l, their, axis=1), -1)  # [D, S] expert of each received row
    match = (mine[:, None] == experts.reshape(1, -1)).astype(jnp.float32)  # [S, D·S]
    return local + jnp.einsum("sr,rw->sw", match, recv.reshape(D * S, -1), precision=jax.lax.Precision.HIGHEST)


def _all_reduce_sum(g: jax.Array, phy2log: jax.Array, *, axis: str, num_experts: int) -> jax.Array:
    """The ``"all_reduce"`` sum of ``g [S, W]``: every replicated expert's rows summed by one ``psum`` of
    ``[Rb, W]``."""
    S = g.shape[0]
    rows = tie_buffer_rows(num_experts, phy2log.shape[0])
    count = jnp.zeros((num_experts,), jnp.int32).at[phy2log].add(1)
    multi = count > 1
    group_of = jnp.where(multi, jnp.cumsum(multi) - 1, rows)[phy2log].astype(jnp.int32)
    groups = jax.lax.dynamic_slice_in_dim(group_of, jax.lax.axis_index(axis) * S, S)
    buf = jnp.zeros((rows + 1, g.shape[1]), jnp.float32).at[groups].add(g)
    with jax.named_scope("tie_replicas_all_reduce"):
        total = jax.lax.psum(buf[:rows], axis)
    total = jnp.concatenate([total, jnp.zeros((1, g.shape[1]), jnp.float32)])[groups]
    return jnp.where((groups < rows)[:, None], total, g)


def replica_sync_method(method: str, exchange: str, *, num_ranks: int, slots_per_rank: int, num_experts: int) -> str:
    """The collective ``method`` (`REPLICA_SYNC`) resolves to with the ``exchange`` implementation (see the
    module)."""
    if method != "auto":
        return method
    if exchange in ("ragged", "ragged_split"):
        return "exchange"
    D, S = num_ranks, slots_per_rank
    ring = 2 * (D - 1) / D * tie_buffer_rows(num_experts, D * S)
    return "exchange" if (D - 1) * S < ring else "all_reduce"


def shared_rows(placement: Placement) -> np.ndarray:
    """``[D]``: rows each rank sends in the ``"exchange"`` sum with the ragged exchange (one per expert it shares
    with each other rank): what a GPU/TPU moves per array, in slots."""
    D, E = placement.num_gpus, placement.num_experts
    p2l = np.asarray(placement.phy2log).reshape(D, -1)
    held = np.zeros((D, E), bool)
    held[np.arange(D)[:, None], p2l] = True
    shared = held.astype(np.int64) @ held.T.astype(np.int64)
    return shared.sum(axis=1) - np.diag(shared)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _tie(weights: dict, phy2log: jax.Array, static: tuple) -> dict:
    return weights


def _tie_fwd(weights, phy2log, static):
    return weights, phy2log


def tie_chunks(method: str, *, num_ranks: int, slots_per_rank: int, num_experts: int, width: int) -> int:
    """How many column chunks the replicas' gradient sum runs in, one after another: enough that each chunk's
    collective buffer — ``[Rb, w]`` for ``"all_reduce"``, ``[D, S, w]`` for ``"exchange"``, float32 — stays within
    `TIE_CHUNK_BYTES` (at real size the whole width would not: DeepSeek-V3 on EP64, 64 redundant experts × 176 MB)."""
    D, S = num_ranks, slots_per_rank
    rows = tie_buffer_rows(num_experts, D * S) if method == "all_reduce" else D * S
    return max(1, min(width, -(-rows * width * 4 // TIE_CHUNK_BYTES)))


def _tie_bwd(static, phy2log, grads):
    axis, num_experts, method, exchange = static
    names = list(grads)
    S = grads[names[0]].shape[0]
    widths = [int(np.prod(grads[n].shape[1:])) for n in names]
    g = jnp.concatenate([grads[n].reshape(S, -1).astype(jnp.float32) for n in names], axis=1)  # [S, Σ widths]
    if method == "exchange":
        sum_over = functools.partial(_exchange_sum, axis=axis, num_experts=num_experts, exchange=exchange)
    else:
        sum_over = functools.partial(_all_reduce_sum, axis=axis, num_experts=num_experts)
    W = g.shape[1]
    n = tie_chunks(method, num_ranks=phy2log.shape[0] // S, slots_per_rank=S, num_experts=num_experts, width=W)
    if n == 1:
        total = sum_over(g, phy2log)
    else:  # column chunks in sequence, each summed and written back over its own columns: one chunk's buffer at a time
        w = -(-W // n)
        full = W // w

        def chunk(i, g):
            cols = sum_over(jax.lax.dynamic_slice_in_dim(g, i * w, w, axis=1), phy2log)
            return jax.lax.dynamic_update_slice_in_dim(g, cols, i * w, axis=1)

        total = jax.lax.fori_loop(0, full, chunk, g)
        if full * w < W:  # the remaining columns, narrower than a chunk
            total = total.at[:, full * w :].set(sum_over(total[:, full * w :], phy2log))
    pieces = jnp.split(total, np.cumsum(widths)[:-1], axis=1)
    return {n: p.reshape(grads[n].shape).astype(grads[n].dtype) for n, p in zip(names, pieces, strict=True)}, None


_tie.defvjp(_tie_fwd, _tie_bwd)


@scoped("moe_tie")
def tie_replicas(
    weights: dict,
    phy2log: jax.Array,
    *,
    axis: str,
    slots_per_rank: int,
    num_experts: int,
    exchange: str = "padded",
    method: str = "auto",
) -> dict:
    """Identity on this rank's expert arrays ``{name: [S, ...]}``; in the backward pass each replicated slot's
    gradient becomes its replica group's sum (see the module). Call inside ``shard_map`` over ``axis``.

    ``phy2log [P]``: logical expert of every physical slot (replicated). ``exchange``: the exchange implementation
    (``"padded"`` / ``"ragged"``); ``method``: one of `REPLICA_SYNC`."""
    if method not in REPLICA_SYNC:
        raise ValueError(f"tie_replicas: method must be one of {list(REPLICA_SYNC)}, got {method!r}")
    if tie_buffer_rows(num_experts, phy2log.shape[0]) == 0:
        return weights  # P = E: no replicas, nothing to tie
    D = phy2log.shape[0] // slots_per_rank
    resolved = replica_sync_method(
        method, exchange, num_ranks=D, slots_per_rank=slots_per_rank, num_experts=num_experts
    )
    return _tie(weights, phy2log, (axis, num_experts, resolved, exchange))


# ------------------------------------------------------------------------------------------------ migration
@dataclasses.dataclass(frozen=True)
class MigrationPlan:
    """How to turn arrays laid out over ``old``'s slots into arrays over ``new``'s.

    Attributes:
      send: ``[D, D, Mb]`` int32: on source rank s, the local slot whose rows go to rank d at position m (0 where
        unused).
      dst: ``[D, K]`` int32: on rank d, the local slots that change (K = the most changed slots of a rank, rounded
        up to a power of two; the pads repeat a rank's first pair, or rewrite slot 0 with itself).
      src: ``[D, K]`` int32: where each changed slot's rows come from: ``< S`` a local slot of the old layout, else
        position ``src − S = s·Mb + m`` of the rows received from rank s.
      moved: new slots whose rows cross ranks; local: slots filled from another local slot; kept: slots unchanged.
      transfers: rows sent (≤ moved: two new replicas of one expert on one rank share a transfer).
      slots: P = D·S, the slot count of the arrays the plan rearranges (`migrate` refuses others).
      rank_rows: ``[D]`` rows each rank sends or receives across ranks, whichever is more (its link's share of the
        move: `busiest_rows`).
    """

    send: np.ndarray
    dst: np.ndarray
    src: np.ndarray
    moved: int
    local: int
    kept: int
    transfers: int
    slots: int
    rank_rows: np.ndarray

    @property
    def busiest_rows(self) -> int:
        """Rows over the busiest rank's link (sent or received): what bounds the move's time."""
        return int(self.rank_rows.max(initial=0))

    @property
    def block(self) -> int:
        """Mb: rows per (source, destination) block of the all-to-all (0: nothing crosses ranks)."""
        return int(self.send.shape[2])


@dataclasses.dataclass(frozen=True)
class MigrationReport:
    """What a placement change did: slots moved across ranks, filled locally and kept; ``bytes_moved`` = rows sent
    (`MigrationPlan.transfers`) × ``slot_bytes``, the bytes of one slot of every migrated array (weights, and the
    optimizer moments when given); ``wire_bytes`` the all-to-all's padded buffers (D·D·Mb rows); ``seconds`` the
    in-graph step (compile excluded: ``compile_seconds``)."""

    moved_slots: int
    local_slots: int
    kept_slots: int
    slot_bytes: int
    bytes_moved: int
    wire_bytes: int
    seconds: float
    compile_seconds: float

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def plan_migration(old: Placement, new: Placement) -> MigrationPlan:
    """The cheapest move from ``old`` to ``new`` (same D, S and E): a slot whose expert its rank already holds is
    kept or copied locally; every other slot fetches its expert from the old holder that sends least so far."""
    # Step 1: same shapes.
    if not isinstance(old, Placement) or not isinstance(new, Placement):
        raise ValueError("plan_migration: old and new must be solvers.Placement values")
    if (old.num_gpus, old.slots_per_rank, old.num_experts) != (new.num_gpus, new.slots_per_rank, new.num_experts):
        raise ValueError(
            f"plan_migration: a placement change keeps D, S and E; old has D={old.num_gpus}, S={old.slots_per_rank}, "
            f"E={old.num_experts}, new has D={new.num_gpus}, S={new.slots_per_rank}, E={new.num_experts}"
        )
    D, S = old.num_gpus, old.slots_per_rank
    old_p2l = np.asarray(old.phy2log).reshape(D, S)
    new_p2l = np.asarray(new.phy2log).reshape(D, S)
    holders = [np.flatnonzero((old_p2l == e).any(axis=1)) for e in range(old.num_experts)]
    # Step 2: each new slot: kept, a local copy, or a fetch from the least-busy old holder (one per (s, d, e)).
    take = np.zeros((D, S), np.int64)
    sends: dict[tuple[int, int], list[int]] = {}
    sent_at: dict[tuple[int, int, int], int] = {}
    busy = np.zeros(D, np.int64)
    local = kept = 0
    pending = []
    for d in range(D):
        for j in range(S):
            e = new_p2l[d, j]
            if old_p2l[d, j] == e:
                take[d, j], kept = j, kept + 1
            elif (old_p2l[d] == e).any():
                take[d, j], local = int(np.flatnonzero(old_p2l[d] == e)[0]), local + 1
            else:
                pending.append((d, j, e))
    fetched = []  # (d, j, source rank, position in its block)
    for d, j, e in pending:
        src = int(holders[e][np.argmin(busy[holders[e]])])
        key = (src, d, int(e))
        if key not in sent_at:  # two new replicas of e on d share one transfer
            lst = sends.setdefault((src, d), [])
            sent_at[key] = len(lst)
            lst.append(int(np.flatnonzero(old_p2l[src] == e)[0]))
            busy[src] += 1
        fetched.append((d, j, src, sent_at[key]))
    moved = len(fetched)
    # Step 3: blocks of Mb rows (a power of two), and where each fetched slot's rows land in the pool.
    widest = max((len(v) for v in sends.values()), default=0)
    M = 0 if widest == 0 else 1 << (widest - 1).bit_length()
    send = np.zeros((D, D, M), np.int32)
    for (s, d), lst in sends.items():
        send[s, d, : len(lst)] = lst
    for d, j, src, m in fetched:
        take[d, j] = S + src * M + m
    transfers = sum(len(v) for v in sends.values())
    received = np.zeros(D, np.int64)
    for (_, d), lst in sends.items():
        received[d] += len(lst)
    # Step 4: per rank, only the slots that change: (destination slot, source) pairs, padded to K.
    changed = take != np.arange(S)[None, :]
    widest = int(changed.sum(axis=1).max())
    K = 0 if widest == 0 else 1 << (widest - 1).bit_length()
    dst, src = np.zeros((D, K), np.int32), np.zeros((D, K), np.int32)
    for d in range(D):
        cols = np.flatnonzero(changed[d])
        if cols.size == 0:  # nothing changes on d: rewrite slot 0 with itself
            continue
        pad = K - cols.size  # pads repeat the first pair (writing a row twice is harmless)
        dst[d] = np.r_[cols, np.full(pad, cols[0])]
        src[d] = np.r_[take[d, cols], np.full(pad, take[d, cols[0]])]
    return MigrationPlan(send, dst, src, moved, local, kept, transfers, D * S, np.maximum(busy, received))


@functools.lru_cache(maxsize=32)
def _migrator(mesh: jax.sharding.Mesh, axis: str, block: int, spec: P):
    """The jitted migration of one slot-sharded array laid out as ``spec`` (``axis`` first) with blocks of
    ``block`` rows."""

    def rows_of(a, index):
        """``a[index]`` row by row (a loop of dynamic slices: XLA:CPU's gather and scatter go element by element)."""
        return jax.lax.map(lambda i: jax.lax.dynamic_index_in_dim(a, i, keepdims=False), index)

    def body(send, dst, src, *arrays):
        dst, src = dst[0], src[0]  # [K] changed local slots and where their rows come from
        out = []
        for a in arrays:
            S = a.shape[0]
            rows = rows_of(a, jnp.minimum(src, S - 1))  # [K, ...] every source read before anything is written
            if block:
                buf = rows_of(a, send[0].reshape(-1)).reshape(-1, block, *a.shape[1:])  # [D, M, ...] to each rank
                recv = jax.lax.all_to_all(buf, axis, 0, 0, tiled=True).reshape(-1, *a.shape[1:])  # from rank s
                got = rows_of(recv, jnp.clip(src - S, 0, recv.shape[0] - 1))
                rows = jnp.where((src < S).reshape((-1,) + (1,) * (a.ndim - 1)), rows, got)

            def write(k, acc, rows=rows):  # in place: the input is donated (pads repeat the first pair)
                return jax.lax.dynamic_update_index_in_dim(acc, rows[k], dst[k], 0)

            out.append(jax.lax.fori_loop(0, dst.shape[0], write, a))
        return tuple(out)

    plan_spec = P(axis)
    f = jax.shard_map(body, mesh=mesh, in_specs=(plan_spec,) * 3 + (spec,), out_specs=(spec,), check_vma=False)
    return jax.jit(f, out_shardings=(NamedSharding(mesh, spec),), donate_argnums=(3,))


def _slot_spec(a, mesh: jax.sharding.Mesh, axis: str | tuple[str, ...]) -> P:
    """The spec an array keeps through a migration: its own when it is sharded over ``axis`` on its slot axis (a
    tensor / fsdp share stays where it is), else ``P(axis)``."""
    sharding = getattr(a, "sharding", None)
    if (
        isinstance(sharding, NamedSharding)
        and sharding.mesh == mesh
        and len(sharding.spec)
        and sharding.spec[0] == axis
    ):
        return sharding.spec
    return P(axis)


def migrate(
    arrays: list,
    plan: MigrationPlan,
    *,
    mesh: jax.sharding.Mesh,
    axis: str | tuple[str, ...] = "ep",
    donate: bool = True,
) -> tuple[list, float, float]:
    """Apply ``plan`` to slot-sharded arrays ``[P, ...]`` (weights, biases, optimizer moments): one all-to-all per
    array along ``axis``, the arrays one after another (so the exchange buffers of one array are alive at a time;
    arrays of one shape, dtype and sharding share a compiled program). An array sharded over ``axis`` on its slot
    axis keeps its sharding (tensor / fsdp shares move in place, every EP group alike); any other is put on
    ``P(axis)``. Returns ``(new arrays, seconds, compile_seconds)``; the inputs are donated unless ``donate=False``
    (then copied first)."""
    import time

    D = plan.send.shape[0]
    names = (axis,) if isinstance(axis, str) else tuple(axis)  # (node, ep) with MoEConfig.node_axis
    have = math.prod(mesh.shape[n] for n in names) if all(n in mesh.shape for n in names) else "no"
    if have != D:
        raise ValueError(f"migrate: the plan is for {D} ranks, the mesh's {axis!r} axis has {have} ranks")
    for i, a in enumerate(arrays):
        if jnp.ndim(a) == 0 or jnp.shape(a)[0] != plan.slots:
            raise ValueError(
                f"migrate: arrays[{i}] has shape {list(jnp.shape(a))}, but the plan rearranges {plan.slots} slots "
                "(the leading axis); give the arrays laid out over the plan's old placement"
            )
    specs = [_slot_spec(a, mesh, axis) for a in arrays]
    arrays = [jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(arrays, specs, strict=True)]
    if not donate:
        arrays = [jnp.copy(a) for a in arrays]
    jax.block_until_ready(arrays)  # the move's clock starts when its inputs exist
    if plan.dst.shape[1] == 0:  # nothing changes
        return arrays, 0.0, 0.0
    send, dst, src = (jax.device_put(a, NamedSharding(mesh, P(axis))) for a in (plan.send, plan.dst, plan.src))
    compiled, compile_s, seconds, out = {}, 0.0, 0.0, []
    for a, spec in zip(arrays, specs, strict=True):
        kind = (a.shape, a.dtype, spec)
        if kind not in compiled:
            t0 = time.perf_counter()
            compiled[kind] = _migrator(mesh, axis, plan.block, spec).lower(send, dst, src, a).compile()
            compile_s += time.perf_counter() - t0
        t0 = time.perf_counter()
        out.append(jax.block_until_ready(compiled[kind](send, dst, src, a))[0])
        seconds += time.perf_counter() - t0
    return out, seconds, compile_s
