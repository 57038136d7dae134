"""Grouped GEMM `gmm` (mirrors `jax.lax.ragged_dot`) and its transpose `tgmm`, with a `jax.custom_vjp`.

    out = gmm(lhs [M, H], rhs [E_loc, H, F], group_sizes [E] int32, group_offset=o)   # [M, F]

Rows of `lhs` are sorted by group; group g owns rows [sum(sizes[:g]), sum(sizes[:g + 1])). Only groups
[o, o + E_loc) are computed (expert parallelism: `rhs` holds this rank's experts); their rows get
`lhs_row @ rhs[g - o]`, every other row — other ranks' groups and rows past sum(group_sizes) — is zero.
Without `group_offset`, E_loc = E. Letters follow the project glossary: M rows, H contraction width, F output
width, E groups (experts or physical slots; `jax.lax.ragged_dot` calls these m, k, n, g); the down projection
is the same call with H and F swapped.

Implementations (`implementation=`, resolved per platform by `pallas_kernels.backends.GMM`):
- "pallas": the tiled kernel of `gmm_pallas` (Triton lowering on GPU; `interpret=True` runs it on CPU).
- "chunked": the XLA CPU-fast path of `gmm_xla` (dense matmuls per row chunk of each group).
- "ragged_dot": `jax.lax.ragged_dot` with its default lowering.
- "auto" (default): "pallas" when `interpret=True` or on GPU (while JAX ships the Pallas Triton backend, see
  `triton_backend`; else "ragged_dot"), "chunked" on CPU, "ragged_dot" elsewhere.
All implementations compute the same function; `gmm_reference` / `tgmm_reference` are the pure-jnp truth.

Gradients: d(lhs) = gmm(grad, rhs^T) (the kernels read rhs transposed in place) and d(rhs) =
tgmm(lhs, grad) — both exactly zero for empty groups and for rows outside the local groups.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.backends import GMM, GmmImpl
from pallas_kernels.gmm_metadata import group_offsets, make_group_metadata
from pallas_kernels.gmm_pallas import gmm_pallas, tgmm_pallas
from pallas_kernels.gmm_xla import gmm_chunked, gmm_ragged, tgmm_chunked, tgmm_ragged

__all__ = ["GmmTiling", "gmm", "tgmm", "gmm_reference", "tgmm_reference"]
_FLOATS = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


@dataclasses.dataclass(frozen=True, kw_only=True)
class GmmTiling:
    """Tile sizes. tm/tk/tn: Pallas tiles along M, H (contraction) and F (output) (powers of two, >= 16 for
    Triton; tk and tn shrink to the next power of two of small H, F). num_warps/num_stages: Triton launch knobs.
    chunk: rows per dense matmul of the CPU-fast path."""

    tm: int = 128
    tk: int = 64
    tn: int = 128
    num_warps: int = 8
    num_stages: int = 3
    chunk: int = 256

    def __post_init__(self):
        for name in ("tm", "tk", "tn"):
            v = getattr(self, name)
            if v < 1 or v & (v - 1):
                raise ValueError(f"GmmTiling.{name} must be a positive power of two, got {v}")
        if self.chunk < 1:
            raise ValueError(f"GmmTiling.chunk must be positive, got {self.chunk}")


def _as_tiling(tiling) -> GmmTiling:
    if isinstance(tiling, GmmTiling):
        return tiling
    if isinstance(tiling, tuple | list) and len(tiling) == 3:
        tm, tk, tn = (int(v) for v in tiling)
        return GmmTiling(tm=tm, tk=tk, tn=tn)
    raise ValueError(f"tiling must be a GmmTiling or a (tm, tk, tn) tuple, got {tiling!r}")


@dataclasses.dataclass(frozen=True)
class _Cfg:
    """Static configuration threaded through the custom_vjp (hashable)."""

    impl: str
    tiling: GmmTiling
    interpret: bool
    out_dtype: jnp.dtype
    num_local_groups: int
    precision: object = None


def _next_pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def _pad_to(x: jax.Array, axis: int, multiple: int) -> jax.Array:
    rem = (-x.shape[axis]) % multiple
    if rem == 0:
        return x
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, rem)
    return jnp.pad(x, pad)


def _kernel_tiles(t: GmmTiling, m: int, k: int, n: int) -> tuple[int, int, int]:
    """Pallas tiles for this problem: tk, tn shrink to the next power of two of small H, F (>= 16)."""
    return t.tm, max(16, min(t.tk, _next_pow2(k))), max(16, min(t.tn, _next_pow2(n)))


def _gmm_impl(lhs, rhs, group_sizes, group_offset, cfg: _Cfg, transpose_rhs: bool):
    """Dispatch one forward grouped GEMM to the chosen implementation; returns [M, F] in cfg.out_dtype."""
    m, k = lhs.shape
    n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
    common = dict(num_local_groups=cfg.num_local_groups, out_dtype=cfg.out_dtype, precision=cfg.precision)
    if cfg.impl == "chunked":
        return gmm_chunked(
            lhs, rhs, group_sizes, group_offset, chunk=cfg.tiling.chunk, transpose_rhs=transpose_rhs, **common
        )
    if cfg.impl == "ragged_dot":
        return gmm_ragged(lhs, rhs, group_sizes, group_offset, transpose_rhs=transpose_rhs, **common)
    tm, tk, tn = _kernel_tiles(cfg.tiling, m, k, n)
    x = _pad_to(_pad_to(lhs, 0, tm), 1, tk)
    w = _pad_to(_pad_to(rhs, 1, tn if transpose_rhs else tk), 2, tk if transpose_rhs else tn)
    meta = make_group_metadata(
        group_sizes, m=x.shape[0], tm=tm, group_offset=group_offset, num_local_groups=cfg.num_local_groups
    )
    out = gmm_pallas(
        x,
        w,
        meta,
        group_offset.reshape(1),
        tiling=(tm, tk, tn),
        transpose_rhs=transpose_rhs,
        interpret=cfg.interpret,
        num_warps=cfg.tiling.num_warps,
        num_stages=cfg.tiling.num_stages,
        **common,
    )
    return out[:m, :n]


def _tgmm_impl(lhs, grad, group_sizes, group_offset, cfg: _Cfg, out_dtype):
    """Dispatch one transposed grouped GEMM; returns [E_loc, H, F] in out_dtype."""
    m, k = lhs.shape
    n = grad.shape[1]
    common = dict(num_local_groups=cfg.num_local_groups, out_dtype=out_dtype, precision=cfg.precision)
    if cfg.impl == "chunked":
        return tgmm_chunked(lhs, grad, group_sizes, group_offset, chunk=cfg.tiling.chunk, **common)
    if cfg.impl == "ragged_dot":
        return tgmm_ragged(lhs, grad, group_sizes, group_offset, **common)
    tm, tk, tn = _kernel_tiles(cfg.tiling, m, k, n)
    x = _pad_to(_pad_to(lhs, 0, tm), 1, tk)
    y = _pad_to(_pad_to(grad, 0, tm), 1, tn)
    meta = make_group_metadata(
        group_sizes, m=x.shape[0], tm=tm, group_offset=group_offset, num_local_groups=cfg.num_local_groups
    )
    out = tgmm_pallas(
        x,
        y,
        meta,
        group_offset.reshape(1),
        tiling=(tm, tk, tn),
        interpret=cfg.interpret,
        num_warps=cfg.tiling.num_warps,
        num_stages=cfg.tiling.num_stages,
        **common,
    )
    return out[:, :k, :n]


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _gmm_vjp(lhs, rhs, group_sizes, group_offset, cfg: _Cfg):
    return _gmm_impl(lhs, rhs, group_sizes, group_offset, cfg, transpose_rhs=False)


def _gmm_fwd(lhs, rhs, group_sizes, group_offset, cfg: _Cfg):
    out = _gmm_impl(lhs, rhs, group_sizes, group_offset, cfg, transpose_rhs=False)
    return out, (lhs, rhs, group_sizes, group_offset)


def _gmm_bwd(cfg: _Cfg, res, g):
    lhs, rhs, group_sizes, group_offset = res
    g = g.astype(lhs.dtype)  # the kernels take one input dtype; accumulation stays float32
    # d(lhs) [M, H] = g [M, F] @ rhs[group]^T; rows outside the local groups get exact zeros.
    dlhs = _gmm_impl(
        g, rhs, group_sizes, group_offset, dataclasses.replace(cfg, out_dtype=lhs.dtype), transpose_rhs=True
    )
    # d(rhs) [E_loc, H, F] = lhs_g^T @ g_g per local group; empty groups give exact zeros.
    drhs = _tgmm_impl(lhs, g, group_sizes, group_offset, cfg, out_dtype=rhs.dtype)
    return dlhs, drhs, None, None


_gmm_vjp.defvjp(_gmm_fwd, _gmm_bwd)


def _is_concrete(x) -> bool:
    return not isinstance(x, jax.core.Tracer)


def _validate(lhs, rhs, group_sizes, group_offset, *, rhs_is_weights: bool, name: str):
    """Shape/dtype/value checks shared by gmm and tgmm; returns (lhs, rhs, group_sizes, group_offset int32 [])."""
    lhs, rhs, group_sizes = jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(group_sizes)
    if lhs.ndim != 2:
        raise ValueError(f"{name}: lhs must be [M, H], got shape {lhs.shape}")
    if rhs_is_weights:
        if rhs.ndim != 3 or rhs.shape[1] != lhs.shape[1]:
            raise ValueError(f"{name}: rhs must be [E, H={lhs.shape[1]}, F], got shape {rhs.shape}")
    elif rhs.ndim != 2 or rhs.shape[0] != lhs.shape[0]:
        raise ValueError(f"{name}: grad must be [M={lhs.shape[0]}, F], got shape {rhs.shape}")
    if lhs.dtype not in _FLOATS or rhs.dtype not in _FLOATS:
        raise ValueError(f"{name}: lhs/rhs must be float32, bfloat16 or float16, got {lhs.dtype}, {rhs.dtype}")
    if lhs.dtype != rhs.dtype:
        raise ValueError(f"{name}: lhs and rhs dtypes differ ({lhs.dtype} vs {rhs.dtype})")
    if group_sizes.ndim != 1 or group_sizes.shape[0] < 1:
        raise ValueError(f"{name}: group_sizes must be [E] with E >= 1, got shape {group_sizes.shape}")
    if group_sizes.dtype != jnp.int32:
        raise ValueError(f"{name}: group_sizes must be int32, got {group_sizes.dtype}")
    if group_offset is None:
        group_offset = jnp.zeros((), jnp.int32)
    group_offset = jnp.asarray(group_offset)
    if group_offset.size != 1 or not jnp.issubdtype(group_offset.dtype, jnp.integer):
        raise ValueError(f"{name}: group_offset must be one integer (shape () or (1,)), got {group_offset}")
    group_offset = group_offset.reshape(()).astype(jnp.int32)
    if _is_concrete(group_sizes):
        sizes = np.asarray(group_sizes)
        if (sizes < 0).any():
            raise ValueError(f"{name}: group_sizes must be non-negative, got {sizes.tolist()}")
        if sizes.sum() > lhs.shape[0]:
            raise ValueError(f"{name}: sum(group_sizes) = {sizes.sum()} exceeds M = {lhs.shape[0]}")
    if _is_concrete(group_offset):
        o = int(group_offset)
        if o < 0 or o > group_sizes.shape[0]:
            raise ValueError(f"{name}: group_offset {o} outside [0, E={group_sizes.shape[0]}]")
    return lhs, rhs, group_sizes, group_offset


def gmm(
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    *,
    preferred_element_type=None,
    group_offset: jax.Array | int | None = None,
    tiling: GmmTiling | tuple[int, int, int] = GmmTiling(),
    interpret: bool = False,
    implementation: GmmImpl = "auto",
    precision=None,
) -> jax.Array:
    """Grouped GEMM, `jax.lax.ragged_dot` semantics plus `group_offset`; differentiable in lhs and rhs.

    Args:
      lhs: [M, H] rows sorted by group (float32 / bfloat16 / float16).
      rhs: [E_loc, H, F] weights of groups [group_offset, group_offset + E_loc), same dtype as lhs.
      group_sizes: [E] int32 rows per group (E >= E_loc); sum(group_sizes) <= M, the rest is padding.
      preferred_element_type: output dtype (default: lhs dtype); accumulation is float32 throughout.
      group_offset: first local group (int, [] or [1] int array; may be traced). Default 0.
      tiling: `GmmTiling` or (tm, tk, tn).
      interpret: run the Pallas kernel in interpret mode (CPU tests).
      implementation: "auto" | "pallas" | "chunked" | "ragged_dot" (see the module docstring).
      precision: passed to the inner dots (e.g. `jax.lax.Precision.HIGHEST`).
    Returns:
      [M, F]: row r of local group g is lhs[r] @ rhs[g - group_offset]; all other rows are zero.
    Raises:
      ValueError on bad shapes or dtypes, negative or oversized concrete group sizes, an out-of-range
      concrete group_offset, an unknown implementation or a bad tiling.
    """
    lhs, rhs, group_sizes, group_offset = _validate(
        lhs, rhs, group_sizes, group_offset, rhs_is_weights=True, name="gmm"
    )
    out_dtype = jnp.dtype(preferred_element_type or lhs.dtype)
    cfg = _Cfg(
        GMM.resolve(implementation, interpret=interpret),
        _as_tiling(tiling),
        interpret,
        out_dtype,
        rhs.shape[0],
        precision,
    )
    return _gmm_vjp(lhs, rhs, group_sizes, group_offset, cfg)


def tgmm(
    lhs: jax.Array,
    grad: jax.Array,
    group_sizes: jax.Array,
    *,
    num_local_groups: int | None = None,
    preferred_element_type=None,
    group_offset: jax.Array | int | None = None,
    tiling: GmmTiling | tuple[int, int, int] = GmmTiling(),
    interpret: bool = False,
    implementation: GmmImpl = "auto",
    precision=None,
) -> jax.Array:
    """Transposed grouped GEMM: out[j] = lhs_j^T @ grad_j for local groups j (the weight gradient of gmm).

    Args:
      lhs: [M, H] rows sorted by group.
      grad: [M, F] same rows, same dtype.
      group_sizes: [E] int32 rows per group.
      num_local_groups: E_loc (default E - group_offset for a concrete offset, else E).
      Other arguments as in `gmm`.
    Returns:
      [E_loc, H, F]; exactly zero for empty groups. Not differentiable (it is itself a gradient).
    """
    lhs, grad, group_sizes, group_offset = _validate(
        lhs, grad, group_sizes, group_offset, rhs_is_weights=False, name="tgmm"
    )
    if num_local_groups is None:
        num_local_groups = group_sizes.shape[0] - (int(group_offset) if _is_concrete(group_offset) else 0)
    if num_local_groups < 1:
        raise ValueError(f"tgmm: num_local_groups must be >= 1, got {num_local_groups}")
    out_dtype = jnp.dtype(preferred_element_type or lhs.dtype)
    cfg = _Cfg(
        GMM.resolve(implementation, interpret=interpret),
        _as_tiling(tiling),
        interpret,
        out_dtype,
        num_local_groups,
        precision,
    )
    return _tgmm_impl(lhs, grad, group_sizes, group_offset, cfg, out_dtype)


def _row_groups(group_sizes: jax.Array, m: int) -> jax.Array:
    """Global group id of every row [M] (E for rows past sum(group_sizes))."""
    ends = group_offsets(group_sizes, m)[1:]
    return jnp.searchsorted(ends, jnp.arange(m), side="right").astype(jnp.int32)


def gmm_reference(
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    *,
    preferred_element_type=None,
    group_offset: jax.Array | int | None = None,
) -> jax.Array:
    """Pure-jnp truth for `gmm` (a masked loop over local groups; autodiff gives its gradients).

    lhs [M, H], rhs [E_loc, H, F], group_sizes [E] int32 -> [M, F].
    """
    out_dtype = jnp.dtype(preferred_element_type or lhs.dtype)
    off = jnp.asarray(0 if group_offset is None else group_offset, jnp.int32).reshape(())
    row_group = _row_groups(group_sizes, lhs.shape[0])
    out = jnp.zeros((lhs.shape[0], rhs.shape[2]), jnp.float32)
    for j in range(rhs.shape[0]):
        y = jnp.dot(lhs, rhs[j], preferred_element_type=jnp.float32)
        out = out + jnp.where((row_group == off + j)[:, None], y, 0.0)
    return out.astype(out_dtype)


def tgmm_reference(
    lhs: jax.Array,
    grad: jax.Array,
    group_sizes: jax.Array,
    *,
    num_local_groups: int,
    preferred_element_type=None,
    group_offset: jax.Array | int | None = None,
) -> jax.Array:
    """Pure-jnp truth for `tgmm`: lhs [M, H], grad [M, F], group_sizes [E] -> [E_loc, H, F]."""
    out_dtype = jnp.dtype(preferred_element_type or lhs.dtype)
    off = jnp.asarray(0 if group_offset is None else group_offset, jnp.int32).reshape(())
    row_group = _row_groups(group_sizes, lhs.shape[0])
    outs = []
    for j in range(num_local_groups):
        x = jnp.where((row_group == off + j)[:, None], lhs, 0)
        outs.append(jnp.dot(x.T, grad, preferred_element_type=jnp.float32))
    return jnp.stack(outs).astype(out_dtype)
