"""Replicas of one expert on several slots: tied in training, moved when the placement changes.

**Tied gradients** (`tie_replicas`, inside the layer's `shard_map`). Every rank holds only its S slots
``[S, ...]`` of the physical expert arrays. In the backward pass the gradient of each slot whose expert has
several replicas becomes the sum over the expert's replica group, so every replica receives the logical
expert's gradient and the same optimizer update: replicas stay bit-identical for any number of steps. Only the
members of a group exchange, point to point: a `SyncPlan` (from the placement, `sync_plan`, fixed when the step is
traced) lists, per shift k, the most distinct experts a rank shares with the rank k after it; in the backward pass
rank d sends rank d + k the local sum of each expert they share (one row per expert, ``rows`` rows per shift, one
`jax.lax.ppermute`) and adds what rank d − k sent it. A rank's bytes are the rows of the experts it shares with
other ranks — nothing when P = E or when every replica group sits on one rank — never E (``Placement.spread(16, 8,
4)``: 4 rows per rank instead of an all-reduce of 16). Replicas on one rank are summed locally. Each shift's rows
are the most any rank needs, so when replicas are few and scattered over many shifts the permutes would send more
than the all-reduce below: the plan then is the all-reduce (`SyncPlan.all_reduce`, decided from the bytes). The
plan's shapes are static and its contents are data (which slots, which experts, read in-graph from ``phy2log``): a
placement the traced plan does not fit (a re-placement after the step was traced, a restored
state) takes the fallback in-graph (`jax.lax.cond`), one ``psum`` over ``ep`` of a ``[Rb, ...]`` float32 buffer,
Rb = min(E, P − E) ≥ the replicated experts — correct for every placement, with more bytes. Without a plan (a
placement traced without its host copy) the fallback is the exchange. Every collective runs along ``ep``, inside
each EP group, and on each device's tensor / FSDP share of the arrays.

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

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from solvers import Placement

__all__ = [
    "MigrationPlan",
    "MigrationReport",
    "SyncPlan",
    "migrate",
    "plan_migration",
    "sync_plan",
    "tie_buffer_rows",
    "tie_replicas",
]


# ------------------------------------------------------------------------------------------------ tied replicas
def tie_buffer_rows(num_experts: int, num_slots: int) -> int:
    """Rb: rows of the replica-sum buffer, an upper bound on the experts with more than one replica."""
    return max(0, min(num_experts, num_slots - num_experts))


@dataclasses.dataclass(frozen=True)
class SyncPlan:
    """The replicas' gradient exchange of a placement (hashable: part of the compiled program's key).

    Attributes:
      num_ranks: D.  slots_per_rank: S.
      shifts: ``((k, rows), ...)``: rank d sends rank (d + k) mod D ``rows`` rows, the most distinct experts any
        rank shares with the rank k after it; shifts whose ranks share nothing are left out.
      all_reduce: the all-reduce of Rb rows sends fewer bytes per rank (ring: 2·(D − 1)/D·Rb rows) than the
        permutes (Σ rows): replicas few and scattered over many shifts. Then the tie is the all-reduce.
    """

    num_ranks: int
    slots_per_rank: int
    shifts: tuple[tuple[int, int], ...]
    all_reduce: bool = False

    @property
    def rows(self) -> int:
        """Rows every rank sends (and receives) per array: Σ rows over the shifts."""
        return sum(r for _, r in self.shifts)


def _shared_experts(phy2log, num_ranks: int, num_experts: int, xp=np):
    """``[D, D]`` distinct experts ranks a and b both hold (``xp``: numpy on the host, jax.numpy in-graph)."""
    p2l = phy2log.reshape(num_ranks, -1)
    held = xp.zeros((num_ranks, num_experts + 1), xp.int32)
    rows = xp.arange(num_ranks)[:, None]
    if xp is np:
        held[rows, p2l] = 1
    else:
        held = held.at[rows, p2l].set(1)
    held = held[:, :num_experts]
    return held @ held.T


def sync_plan(placement: Placement) -> SyncPlan:
    """`SyncPlan` of ``placement``: for each shift k = 1 … D − 1, the most distinct experts a rank shares with
    rank (d + k) mod D."""
    D, S, E = placement.num_gpus, placement.slots_per_rank, placement.num_experts
    shared = _shared_experts(np.asarray(placement.phy2log), D, E)
    d = np.arange(D)
    shifts = tuple((k, r) for k in range(1, D) if (r := int(shared[d, (d + k) % D].max())))
    ring = 2 * (D - 1) / D * tie_buffer_rows(E, placement.num_slots)  # rows each rank sends in the all-reduce
    return SyncPlan(D, S, shifts, all_reduce=sum(r for _, r in shifts) > ring)


def _sum_over_local(g: jax.Array, mine: jax.Array) -> jax.Array:
    """Each slot's gradient replaced by the sum over this rank's slots of the same expert: ``g [S, ...]``,
    ``mine [S]`` the slots' experts."""
    same = (mine[:, None] == mine[None, :]).astype(jnp.float32)
    return jnp.einsum("st,t...->s...", same, g, precision=jax.lax.Precision.HIGHEST)


def _exchange_rows(plan: SyncPlan, phy2log: jax.Array, axis: str, grads: dict) -> dict:
    """The point-to-point sum (see the module): every array of ``grads {name: [S, ...]}`` float32, summed over
    each slot's replica group."""
    D, S = plan.num_ranks, plan.slots_per_rank
    me = jax.lax.axis_index(axis)
    p2l = phy2log.reshape(D, S)

    def outgoing(src, dst, rows):
        """``(slots [rows], valid [rows])``: src's first slot of each expert dst also holds, in slot order."""
        theirs = p2l[src]
        first = jnp.argmax(theirs[:, None] == theirs[None, :], axis=0) == jnp.arange(S)
        send = first & jnp.any(theirs[:, None] == p2l[dst][None, :], axis=1)
        order = jnp.argsort(~send, stable=True)[:rows]
        return order, jnp.arange(rows) < jnp.sum(send)

    mine = p2l[me]
    local = {k: _sum_over_local(g, mine) for k, g in grads.items()}
    names = list(local)
    widths = [int(np.prod(local[n].shape[1:])) for n in names]
    total = {n: local[n].reshape(S, -1) for n in names}  # [S, width] each
    for k, rows in plan.shifts:
        dst, src = (me + k) % D, (me - k) % D
        slots, valid = outgoing(me, dst, rows)
        their_slots, their_valid = outgoing(src, me, rows)
        experts = jnp.where(their_valid, p2l[src][their_slots], -1)  # the experts of the rows that arrive
        match = (mine[:, None] == experts[None, :]).astype(jnp.float32)  # [S, rows]
        # one buffer per shift: every array's rows side by side, [rows, Σ widths]
        buf = jnp.concatenate([total_rows[slots] for total_rows in (local[n].reshape(S, -1) for n in names)], axis=1)
        buf = jnp.where(valid[:, None], buf, 0)
        with jax.named_scope(f"tie_replicas_shift_{k}"):
            got = jax.lax.ppermute(buf, axis, perm=[(d, (d + k) % D) for d in range(D)])
        add = jnp.einsum("sr,rw->sw", match, got, precision=jax.lax.Precision.HIGHEST)
        for n, piece in zip(names, jnp.split(add, np.cumsum(widths)[:-1], axis=1), strict=True):
            total[n] = total[n] + piece
    return {n: total[n].reshape(local[n].shape) for n in names}


def _fits(plan: SyncPlan, phy2log: jax.Array, num_experts: int) -> jax.Array:
    """Whether ``phy2log``'s placement needs at most the plan's rows on every shift (a bool scalar, the same on
    every rank: computed from the replicated placement)."""
    D = plan.num_ranks
    shared = _shared_experts(phy2log, D, num_experts, xp=jnp)
    d = jnp.arange(D)
    caps = dict(plan.shifts)
    need = jnp.stack([jnp.max(shared[d, (d + k) % D]) for k in range(1, D)]) if D > 1 else jnp.zeros((0,), jnp.int32)
    return jnp.all(need <= jnp.asarray([caps.get(k, 0) for k in range(1, D)], jnp.int32))


def _all_reduce_rows(phy2log: jax.Array, axis: str, slots_per_rank: int, num_experts: int, grads: dict) -> dict:
    """The fallback: every replicated expert's gradient summed by one ``psum`` of a ``[Rb, ...]`` buffer."""
    rows = tie_buffer_rows(num_experts, phy2log.shape[0])
    count = jnp.zeros((num_experts,), jnp.int32).at[phy2log].add(1)
    multi = count > 1
    group_of = jnp.where(multi, jnp.cumsum(multi) - 1, rows)[phy2log].astype(jnp.int32)
    me = jax.lax.axis_index(axis)
    groups = jax.lax.dynamic_slice_in_dim(group_of, me * slots_per_rank, slots_per_rank)
    shared = groups < rows

    def one(g):
        buf = jnp.zeros((rows + 1, *g.shape[1:]), jnp.float32).at[groups].add(g)
        with jax.named_scope("tie_replicas_all_reduce"):
            total = jax.lax.psum(buf[:rows], axis)
        total = jnp.concatenate([total, jnp.zeros((1, *g.shape[1:]), jnp.float32)])[groups]
        return jnp.where(shared.reshape(shared.shape + (1,) * (g.ndim - 1)), total, g)

    return {k: one(g) for k, g in grads.items()}


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _tie(weights: dict, phy2log: jax.Array, static: tuple, plan: SyncPlan | None) -> dict:
    return weights


def _tie_fwd(weights, phy2log, static, plan):
    return weights, phy2log


def _tie_bwd(static, plan, phy2log, grads):
    axis, slots_per_rank, num_experts = static
    g32 = {k: g.astype(jnp.float32) for k, g in grads.items()}
    fallback = functools.partial(_all_reduce_rows, phy2log, axis, slots_per_rank, num_experts)
    if plan is None or plan.all_reduce:
        out = fallback(g32)
    else:
        exchange = functools.partial(_exchange_rows, plan, phy2log, axis)
        out = jax.lax.cond(_fits(plan, phy2log, num_experts), exchange, fallback, g32)
    return {k: out[k].astype(g.dtype) for k, g in grads.items()}, None


_tie.defvjp(_tie_fwd, _tie_bwd)


def tie_replicas(
    weights: dict,
    phy2log: jax.Array,
    *,
    axis: str,
    slots_per_rank: int,
    num_experts: int,
    plan: SyncPlan | None = None,
) -> dict:
    """Identity on this rank's expert arrays ``{name: [S, ...]}``; in the backward pass each replicated slot's
    gradient becomes its replica group's sum (see the module). Call inside ``shard_map`` over ``axis``.

    ``phy2log [P]``: logical expert of every physical slot (replicated). ``plan``: the point-to-point exchange
    (`sync_plan` of the placement); None: the all-reduce fallback."""
    if tie_buffer_rows(num_experts, phy2log.shape[0]) == 0:
        return weights  # P = E: no replicas, nothing to tie
    if plan is not None and (plan.num_ranks, plan.slots_per_rank) != (
        phy2log.shape[0] // slots_per_rank,
        slots_per_rank,
    ):
        raise ValueError(
            f"tie_replicas: the SyncPlan is for D={plan.num_ranks}, S={plan.slots_per_rank}; the placement has "
            f"{phy2log.shape[0]} slots of {slots_per_rank} per rank"
        )
    return _tie(weights, phy2log, (axis, slots_per_rank, num_experts), plan)


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
    """

    send: np.ndarray
    dst: np.ndarray
    src: np.ndarray
    moved: int
    local: int
    kept: int
    transfers: int

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
    return MigrationPlan(send, dst, src, moved, local, kept, transfers)


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


def _slot_spec(a, mesh: jax.sharding.Mesh, axis: str) -> P:
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
    arrays: list, plan: MigrationPlan, *, mesh: jax.sharding.Mesh, axis: str = "ep", donate: bool = True
) -> tuple[list, float, float]:
    """Apply ``plan`` to slot-sharded arrays ``[P, ...]`` (weights, biases, optimizer moments): one all-to-all per
    array along ``axis``, the arrays one after another (so the exchange buffers of one array are alive at a time;
    arrays of one shape, dtype and sharding share a compiled program). An array sharded over ``axis`` on its slot
    axis keeps its sharding (tensor / fsdp shares move in place, every EP group alike); any other is put on
    ``P(axis)``. Returns ``(new arrays, seconds, compile_seconds)``; the inputs are donated unless ``donate=False``
    (then copied first)."""
    import time

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
