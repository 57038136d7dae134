"""Group metadata for the grouped GEMM: which groups touch which M-tiles, the row range of every local group and
the CPU chunk schedules, and the one operand-dtype rule of every path (`dot_dtype`).

Rows of `lhs [M, H]` are sorted by group: group g owns rows [offsets[g], offsets[g + 1]). The kernels cut M
into `tm`-row tiles. A tile shared by two (or more) groups is *revisited*: the kernel computes it once per
group that touches it and keeps, for each visit, only that group's rows (a row mask), so every output
element is written exactly once and race-free (no two grid programs own the same output tile).

All functions here are traceable (jnp only, static shapes): group sizes are data, tile counts are not.
Traced group sizes are sanitised rather than checked: negative sizes count as 0 and rows past M are
dropped (`gmm` raises ValueError for concrete bad sizes before it gets here).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

__all__ = [
    "GroupMetadata",
    "make_group_metadata",
    "group_offsets",
    "local_group_rows",
    "chunk_ladder",
    "walk_ladder",
    "ChunkSchedule",
    "make_chunk_schedule",
    "dot_dtype",
    "default_out_dtype",
]


_F32, _BF16, _F16 = jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)


def dot_dtype(a: jax.Array, b: jax.Array, compute_dtype=None) -> jnp.dtype:
    """The dtype both operands of every grouped-GEMM dot are cast to (the dot then accumulates in float32):
    ``compute_dtype`` if given, else their common dtype when they agree and float32 when they differ
    (megablox's ``select_input_dtype``: bf16 × bf16 stays bf16, any mixed pair of float32 / bfloat16 / float16
    computes in float32, which holds every operand exactly). Explicit, so "strict" dtype promotion allows it."""
    if compute_dtype is not None:
        return jnp.dtype(compute_dtype)
    a, b = jnp.dtype(a.dtype), jnp.dtype(b.dtype)
    if a == b:
        return a
    if {a, b} <= {_F32, _BF16, _F16}:
        return _F32
    return jnp.promote_types(a, b)


def default_out_dtype(a, b) -> jnp.dtype:
    """The output dtype of a grouped GEMM without ``preferred_element_type``: the dtype ``jax.lax.ragged_dot``
    returns for these operand dtypes (their common dtype; float32 when either is float32; bfloat16 for
    bfloat16 × float16, where lax's dot rule differs from ``jnp.promote_types``' float32)."""
    a, b = jnp.dtype(a), jnp.dtype(b)
    if a == b:
        return a
    if {a, b} == {_BF16, _F16}:
        return _BF16
    if {a, b} <= {_F32, _BF16, _F16}:
        return _F32
    return jnp.promote_types(a, b)


def group_offsets(group_sizes: jax.Array, m: int) -> jax.Array:
    """Row offsets `[E + 1]` int32 of sorted groups: group g owns rows [offsets[g], offsets[g + 1]).

    `group_sizes [E]` int32; negative sizes count as 0 and offsets are clamped to `m` (rows past M do
    not exist). offsets[0] = 0 and offsets[E] = min(sum(sizes), m).
    """
    sizes = jnp.maximum(group_sizes.astype(jnp.int32), 0)
    ends = jnp.minimum(jnp.cumsum(sizes), m).astype(jnp.int32)
    return jnp.concatenate([jnp.zeros((1,), jnp.int32), ends])


class GroupMetadata(NamedTuple):
    """Per-tile and per-group bookkeeping for the tiled kernels (all int32).

    offsets:        [E + 1]  row where each (global) group starts; see `group_offsets`.
    tile_group_lo:  [tiles]  first active group whose rows intersect M-tile i.
    tile_group_hi:  [tiles]  one past the last such group (lo == hi: the tile has no active rows and is
                             written as zeros). hi - lo - 1 is the number of revisits of tile i.
    group_tile_lo:  [E_loc] first M-tile of local group j (= global group offset + j).
    group_tile_hi:  [E_loc] one past its last M-tile (lo == hi for an empty group).
    num_visits:     []       total (tile, non-empty group) visits = tiles with active rows + revisits; the
                             tile-aware cost model's T_g = sum_e ceil(n_e / tm) is its aligned special case.
    """

    offsets: jax.Array
    tile_group_lo: jax.Array
    tile_group_hi: jax.Array
    group_tile_lo: jax.Array
    group_tile_hi: jax.Array
    num_visits: jax.Array


def make_group_metadata(
    group_sizes: jax.Array, *, m: int, tm: int, group_offset: jax.Array | int = 0, num_local_groups: int
) -> GroupMetadata:
    """Tile metadata for computing groups [group_offset, group_offset + num_local_groups) of `M = m` rows.

    Args:
      group_sizes: [E] int32 rows per (global) group, rows sorted by group.
      m: rows of the (possibly padded) lhs; `tiles = ceil(m / tm)`.
      tm: M-tile height.
      group_offset: first local group (scalar int32, may be traced) — expert parallelism.
      num_local_groups: E_loc, static.
    Returns:
      GroupMetadata (see its docstring for shapes).
    """
    num_groups = group_sizes.shape[0]
    tiles = -(-m // tm)
    offsets = group_offsets(group_sizes, m)
    ends = offsets[1:]  # [E]
    off = jnp.asarray(group_offset, jnp.int32).reshape(())
    # Step 1: the active row range is the span of the local groups.
    row_lo = offsets[off]
    row_hi = offsets[jnp.minimum(off + num_local_groups, num_groups)]
    # Step 2: clip every tile to the active rows; its first and last active row name its groups.
    tile_start = jnp.arange(tiles, dtype=jnp.int32) * tm
    first_row = jnp.maximum(tile_start, row_lo)
    last_row = jnp.minimum(tile_start + tm, row_hi) - 1
    has_rows = first_row <= last_row
    # The group holding row r is the first g with ends[g] > r (empty groups are skipped automatically).
    lo = jnp.searchsorted(ends, first_row, side="right").astype(jnp.int32)
    hi = jnp.searchsorted(ends, last_row, side="right").astype(jnp.int32) + 1
    tile_group_lo = jnp.where(has_rows, lo, 0)
    tile_group_hi = jnp.where(has_rows, hi, 0)
    # Step 3: per local group, the M-tiles it spans (empty groups span none).
    local = off + jnp.arange(num_local_groups, dtype=jnp.int32)
    local = jnp.minimum(local, num_groups - 1)
    g_start = offsets[local]
    g_end = jnp.where(off + jnp.arange(num_local_groups) < num_groups, offsets[local + 1], g_start)
    nonempty = g_end > g_start
    group_tile_lo = jnp.where(nonempty, g_start // tm, 0).astype(jnp.int32)
    group_tile_hi = jnp.where(nonempty, -(-g_end // tm), 0).astype(jnp.int32)
    num_visits = jnp.sum(group_tile_hi - group_tile_lo).astype(jnp.int32)
    return GroupMetadata(offsets, tile_group_lo, tile_group_hi, group_tile_lo, group_tile_hi, num_visits)


def local_group_rows(
    group_sizes: jax.Array, *, m: int, group_offset: jax.Array | int = 0, num_local_groups: int
) -> tuple[jax.Array, jax.Array]:
    """Row range [starts[j], ends[j]) of local group j = global group group_offset + j, both `[E_loc]` int32.

    Local groups past E (a traced offset near the end) are empty (ends == starts); sizes are sanitised as in
    `group_offsets`.
    """
    num_groups = group_sizes.shape[0]
    offsets = group_offsets(group_sizes, m)
    off = jnp.asarray(group_offset, jnp.int32).reshape(())
    j = off + jnp.arange(num_local_groups, dtype=jnp.int32)
    jc = jnp.minimum(j, num_groups - 1)
    starts = offsets[jc]
    ends = jnp.where(j < num_groups, offsets[jc + 1], starts)
    return starts, ends


def chunk_ladder(chunk: int, min_chunk: int, m: int, small_chunk: int | None = None) -> tuple[int, ...]:
    """Chunk sizes of the CPU-fast "ladder" schedule, largest first (static ints, each clipped to M, no repeats):
    `chunk`, then `small_chunk` (default chunk // 2; never above chunk // 2) and its halvings down to the last one
    >= min_chunk. Just (chunk,) when min_chunk > chunk // 2.

    A group of n rows takes chunks of the first size while that many rows remain, then of each next size while
    that many remain, then one masked chunk of the smallest size for the rest: it computes fewer than ladder[-1]
    rows past its end (the fixed schedule: fewer than `chunk`). E.g. (1024, 128, 64, 32): 2457 rows are
    2 x 1024 + 3 x 128 + 1 x 16 masked into 32.
    """
    sizes = [chunk]
    c = chunk // 2 if small_chunk is None else min(small_chunk, chunk // 2)
    while c >= min_chunk:
        sizes.append(c)
        c //= 2
    below = tuple(c for c in sizes if c < m)
    return below if below else (min(sizes[-1], m),)


def walk_ladder(start, end, sizes: tuple[int, ...], full, tail, state):
    """Run rows [start, end) of one group through the ladder ``sizes`` (`chunk_ladder`): ``full(c)`` steps while at
    least c rows remain (for each c in order), then at most one ``tail(c)`` step of the smallest c for the rest. Each
    step maps ``(r0, state) → (r0 + c, state)``; returns the final state (`jax.lax.while_loop`s: traceable)."""
    from jax import lax

    r0 = start
    for c in sizes:
        r0, state = lax.while_loop(lambda s, c=c: s[0] + c <= end, full(c), (r0, state))
    c = sizes[-1]
    return lax.while_loop(lambda s: s[0] < end, tail(c), (r0, state))[1]


class ChunkSchedule(NamedTuple):
    """Row chunks of the fixed CPU schedule (`GmmTiling.schedule="fixed"`): each chunk is <= `chunk` rows of one
    local group.

    chunk_cum:  [E_loc] int32 inclusive cumulative chunk counts per local group.
    starts:     [E_loc] int32 first row of each local group.
    ends:       [E_loc] int32 one past its last row.
    num_chunks: []        int32 total chunks (the loop's trip count; static bound ceil(M/chunk) + E_loc).
    """

    chunk_cum: jax.Array
    starts: jax.Array
    ends: jax.Array
    num_chunks: jax.Array


def make_chunk_schedule(
    group_sizes: jax.Array, *, m: int, chunk: int, group_offset: jax.Array | int = 0, num_local_groups: int
) -> ChunkSchedule:
    """Split every local group into ceil(n_g / chunk) row chunks aligned to the group's first row.

    Chunk t belongs to local group j = searchsorted(chunk_cum, t, "right") and covers rows
    [starts[j] + q * chunk, min(starts[j] + (q + 1) * chunk, ends[j])) with q its index inside the group.
    Shapes as in `ChunkSchedule`; `group_sizes [E]` int32, `group_offset` scalar.
    """
    starts, ends = local_group_rows(group_sizes, m=m, group_offset=group_offset, num_local_groups=num_local_groups)
    chunks = -(-(ends - starts) // chunk)
    chunk_cum = jnp.cumsum(chunks).astype(jnp.int32)
    return ChunkSchedule(chunk_cum, starts, ends, chunk_cum[-1])
