"""Replicas of one expert on several slots: tied in training, moved when the placement changes.

**Tied gradients** (`tie_replicas`, inside the layer's `shard_map`). Every rank holds only its S slots
``[S, ...]`` of the physical expert arrays. In the backward pass the gradient of each slot whose expert has
several replicas becomes the sum over the expert's replica group, so every replica receives the logical
expert's gradient and the same optimizer update: replicas stay bit-identical for any number of steps. Only the
groups exchange: one ``psum`` (all-reduce over ``ep``) of a ``[Rb, ...]`` float32 buffer, Rb = min(E, P − E) ≥ the
number of replicated experts — its bytes grow with the redundant slots, never with E. Without redundancy
(P = E) nothing is exchanged: expert gradients never leave their rank. The groups are computed in-graph from
``phy2log`` (no host data, so a new placement is new data, not a new program).

**Migration** (`plan_migration` on the host, `migrate` in-graph). A placement change moves exactly the slots whose
expert is not already on their rank: each such slot's rows come from one rank that held the expert before, in one
``all_to_all`` per array of ``[D, Mb, ...]`` blocks (Mb = the most slots one rank sends another, rounded up to a
power of two so few programs compile); slots whose expert was already on the rank are local copies. Only the K
changed slots of a rank are written, in place (the arrays are donated): the move's memory traffic follows the
slots that change, not S. The same plan moves any array laid out like the weights (Adam's moments), so the
optimizer state follows its weights.

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

__all__ = ["MigrationPlan", "MigrationReport", "migrate", "plan_migration", "tie_buffer_rows", "tie_replicas"]


# ------------------------------------------------------------------------------------------------ tied replicas
def tie_buffer_rows(num_experts: int, num_slots: int) -> int:
    """Rb: rows of the replica-sum buffer, an upper bound on the experts with more than one replica."""
    return max(0, min(num_experts, num_slots - num_experts))


def _slot_groups(phy2log: jax.Array, num_experts: int, rows: int) -> jax.Array:
    """``[P]`` replica group of each slot in ``[0, rows)``; ``rows`` for an expert with a single replica."""
    count = jnp.zeros((num_experts,), jnp.int32).at[phy2log].add(1)
    multi = count > 1
    group = jnp.where(multi, jnp.cumsum(multi) - 1, rows)
    return group[phy2log].astype(jnp.int32)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _tie(weights: dict, groups: jax.Array, axis: str, rows: int) -> dict:
    return weights


def _tie_fwd(weights, groups, axis, rows):
    return weights, groups


def _tie_bwd(axis, rows, groups, grads):
    shared = groups < rows

    def one(g):
        buf = jnp.zeros((rows + 1, *g.shape[1:]), jnp.float32).at[groups].add(g.astype(jnp.float32))
        total = jax.lax.psum(buf[:rows], axis)  # the one collective: replica groups only
        total = jnp.concatenate([total, jnp.zeros((1, *g.shape[1:]), jnp.float32)])[groups]
        keep = shared.reshape(shared.shape + (1,) * (g.ndim - 1))
        return jnp.where(keep, total.astype(g.dtype), g)

    return jax.tree.map(one, grads), None


_tie.defvjp(_tie_fwd, _tie_bwd)


def tie_replicas(weights: dict, phy2log: jax.Array, *, axis: str, slots_per_rank: int, num_experts: int) -> dict:
    """Identity on this rank's expert arrays ``{name: [S, ...]}``; in the backward pass each replicated slot's
    gradient becomes its replica group's sum (see the module). Call inside ``shard_map`` over ``axis``.

    ``phy2log [P]``: logical expert of every physical slot (replicated)."""
    rows = tie_buffer_rows(num_experts, phy2log.shape[0])
    if rows == 0:
        return weights
    me = jax.lax.axis_index(axis)
    groups = jax.lax.dynamic_slice_in_dim(_slot_groups(phy2log, num_experts, rows), me * slots_per_rank, slots_per_rank)
    return _tie(weights, groups, axis, rows)


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
def _migrator(mesh: jax.sharding.Mesh, axis: str, block: int, n: int):
    """The jitted migration of ``n`` slot-sharded arrays with blocks of ``block`` rows."""

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

    spec = P(axis)
    f = jax.shard_map(body, mesh=mesh, in_specs=(spec,) * (3 + n), out_specs=(spec,) * n, check_vma=False)
    sharded = NamedSharding(mesh, spec)
    return jax.jit(f, out_shardings=(sharded,) * n, donate_argnums=tuple(range(3, 3 + n)))


def migrate(
    arrays: list, plan: MigrationPlan, *, mesh: jax.sharding.Mesh, axis: str = "ep", donate: bool = True
) -> tuple[list, float, float]:
    """Apply ``plan`` to slot-sharded arrays ``[P, ...]`` (weights, biases, optimizer moments): one all-to-all per
    array, the arrays one after another (so the exchange buffers of one array are alive at a time; arrays of one
    shape and dtype share a compiled program). Returns ``(new arrays, seconds, compile_seconds)``; the inputs are
    donated unless ``donate=False`` (then copied first)."""
    import time

    sharded = NamedSharding(mesh, P(axis))
    arrays = [jax.device_put(a, sharded) for a in arrays]
    if not donate:
        arrays = [jnp.copy(a) for a in arrays]
    jax.block_until_ready(arrays)  # the move's clock starts when its inputs exist
    if plan.dst.shape[1] == 0:  # nothing changes
        return arrays, 0.0, 0.0
    send, dst, src = (jax.device_put(a, sharded) for a in (plan.send, plan.dst, plan.src))
    fn = _migrator(mesh, axis, plan.block, 1)
    compiled, compile_s, seconds, out = {}, 0.0, 0.0, []
    for a in arrays:
        kind = (a.shape, a.dtype)
        if kind not in compiled:
            t0 = time.perf_counter()
            compiled[kind] = fn.lower(send, dst, src, a).compile()
            compile_s += time.perf_counter() - t0
        t0 = time.perf_counter()
        out.append(jax.block_until_ready(compiled[kind](send, dst, src, a))[0])
        seconds += time.perf_counter() - t0
    return out, seconds, compile_s
