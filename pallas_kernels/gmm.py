"""Grouped GEMM `gmm` (mirrors `jax.lax.ragged_dot`) and its transpose `tgmm`, with a `jax.custom_vjp`.

    out = gmm(lhs [M, H], rhs [E_loc, H, F], group_sizes [E] int32, group_offset=o)   # [M, F]

Rows of `lhs` are sorted by group; group g owns rows [sum(sizes[:g]), sum(sizes[:g + 1])). Only groups
[o, o + E_loc) are computed (expert parallelism: `rhs` holds this rank's experts); their rows get
`lhs_row @ rhs[g - o]`, every other row — other ranks' groups and rows past sum(group_sizes) — is zero.
Without `group_offset`, E_loc = E. Letters follow the project glossary: M rows, H contraction width, F output
width, E groups (experts or physical slots; `jax.lax.ragged_dot` calls these m, k, n, g); the down projection
is the same call with H and F swapped.

Implementations (`implementation=`, resolved per platform by `pallas_kernels.implementations.GMM`):
- "pallas": the tiled kernel of `gmm_pallas` (Triton lowering on GPU; `interpret=True` runs it on CPU).
- "chunked": the XLA CPU-fast path of `gmm_xla` (dense matmuls per row chunk of each group; chunk sizes from
  `GmmTiling.chunk` down to `GmmTiling.min_chunk`).
- "ragged_dot": `jax.lax.ragged_dot` with its default lowering.
- "tokamax": tokamax's `ragged_dot_general` (optional extra; `tokamax_backend`): its Mosaic GPU kernels on sm90 /
  sm100 for the forward and d lhs, its XLA path for d rhs (see `gmm_xla._ragged_dot_general`).
- "megablox": megablox's Pallas TPU kernels (`gmm_megablox`; ``interpret=True`` runs them in TPU interpret mode).
- "mosaic": the project's own Pallas Mosaic GPU kernel for sm90 (`gmm_mosaic`: wgmma + TMA, warp-specialised pipeline,
  persistent grid over a work list of group-aligned row tiles, a split-K decode configuration, FP8 weights
  dequantized per tile on chip; jax >= 0.12; ``interpret=True`` runs it in Mosaic GPU's GPU interpret mode on CPU).
  Checked in interpret mode and lowered for sm_90 only: "auto" never picks it.
- "auto" (default): "pallas" when `interpret=True`; on a GPU "tokamax" where installed, else "pallas" while JAX
  ships the Pallas Triton backend undeprecated (jax < 0.11; `triton_backend`), else "ragged_dot"; "chunked" on CPU;
  "megablox" on a TPU (MaxText's default there); "ragged_dot" elsewhere (`implementations.GMM`; the GPU order
  measured on an H200: docs/results.md).
All implementations compute the same function; `gmm_reference` / `tgmm_reference` are the pure-jnp truth.

Dtypes (megablox's compute rule, `jax.lax.ragged_dot`'s output rule): lhs and rhs may be float32, bfloat16 or
float16, alike or not. Both are cast to the *compute dtype* before each dot — their common dtype when they
agree, float32 when they differ (`gmm_metadata.dot_dtype`; exact for every operand) — every dot accumulates in
float32, and the result is cast once to ``preferred_element_type``, by default the dtype `jax.lax.ragged_dot`
returns (`gmm_metadata.default_out_dtype`: the common dtype; float32 when either is float32; bfloat16 for
bfloat16 × float16). ``group_sizes`` may have any integer dtype; it is cast to int32. See `gmm` for the
accumulation order and tolerance of each path. ``rhs`` may also be block-scaled FP8 (`pallas_kernels.fp8.BlockScaled`:
e4m3 values, one float32 scale per block), computed in lhs's dtype: tokamax takes it into its kernel, the others
dequantize it inside the call (`fp8_path`); ``quantize_lhs`` quantizes lhs's rows to e4m3 per block as well.

Gradients: d(lhs) = gmm(grad, rhs^T) (the kernels read rhs transposed in place) and d(rhs) =
tgmm(lhs, grad) — both exactly zero for empty groups and for rows outside the local groups.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels import tokamax_backend
from pallas_kernels.fp8 import BlockScaled, fake_quantize_rows
from pallas_kernels.gmm_call import GmmCall, GmmTiling, as_tiling
from pallas_kernels.gmm_metadata import default_out_dtype, dot_dtype, group_offsets
from pallas_kernels.gmm_mosaic import check_available as _mosaic_check
from pallas_kernels.gmm_vjp import FP8_PATHS, fp8_path, gmm_vjp, tgmm_call
from pallas_kernels.implementations import GMM, GmmImpl

__all__ = ["FP8_PATHS", "GmmTiling", "fp8_path", "gmm", "tgmm", "gmm_reference", "tgmm_reference"]
_FLOATS = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def _resolve(implementation: str, interpret: bool) -> str:
    """The concrete implementation (`implementations.GMM`); "tokamax" is checked here, outside any jit cache, so a
    missing package is named on every call (`tokamax_backend.INSTALL_HINT`)."""
    impl = GMM.resolve(implementation, interpret=interpret)
    if impl == "tokamax":
        tokamax_backend.ragged_dot_general()
    if impl == "mosaic":  # jax >= 0.12 with Mosaic GPU, and a GPU or interpret mode (`gmm_mosaic.MOSAIC_HINT`)
        _mosaic_check(interpret)
    return impl


def _is_concrete(x) -> bool:
    return not isinstance(x, jax.core.Tracer)


def _check_group_sizes(group_sizes, m: int, name: str) -> jax.Array:
    """group_sizes [E] of any integer dtype → int32 [E]; concrete sizes must be >= 0 with sum <= M."""
    traced = isinstance(group_sizes, jax.core.Tracer)
    sizes = group_sizes if traced else np.asarray(group_sizes)
    if sizes.dtype == bool or not np.issubdtype(sizes.dtype, np.integer):
        raise ValueError(
            f"{name}: group_sizes must have an integer dtype (int32, uint32, int64, …), got {sizes.dtype}; "
            f"pass row counts, e.g. group_sizes.astype(jnp.int32)"
        )
    if sizes.ndim != 1 or sizes.shape[0] < 1:
        raise ValueError(f"{name}: group_sizes must be [E] with E >= 1, got shape {sizes.shape}")
    if traced:  # not checkable here: cast as is (see gmm_metadata for how bad traced sizes are sanitised)
        return group_sizes.astype(jnp.int32)
    if (sizes < 0).any():
        raise ValueError(f"{name}: group_sizes must be non-negative, got {sizes.tolist()}")
    total = sum(int(v) for v in sizes.tolist())  # Python ints: no overflow whatever the dtype
    if total > m:
        raise ValueError(f"{name}: sum(group_sizes) = {total} exceeds M = {m} (rows of lhs); the rest is padding")
    if isinstance(group_sizes, jax.Array):
        return group_sizes.astype(jnp.int32)  # stays where it is (device, sharding)
    return jnp.asarray(sizes.astype(np.int32))  # values are in [0, M]: exact


def _check_out_dtype(preferred_element_type, lhs, rhs, name: str) -> jnp.dtype:
    """The output dtype: preferred_element_type, or the dtype jax.lax.ragged_dot would return for lhs and rhs."""
    if preferred_element_type is None:
        return default_out_dtype(lhs.dtype, rhs.dtype)
    out = jnp.dtype(preferred_element_type)
    if out not in _FLOATS:
        raise ValueError(f"{name}: preferred_element_type must be float32, bfloat16 or float16 (or None), got {out}")
    return out


def _may_offset(group_offset) -> bool:
    """Whether ``group_offset`` may be nonzero: False for None or a concrete 0 (the paths that rotate the rows to the
    first local group then skip it: `GmmCall.offset`)."""
    return not (group_offset is None or (_is_concrete(group_offset) and int(np.asarray(group_offset).sum()) == 0))


def _validate(lhs, rhs, group_sizes, group_offset, *, rhs_is_weights: bool, name: str):
    """Shape/dtype/value checks shared by gmm and tgmm; returns (lhs, rhs, group_sizes int32 [E],
    group_offset int32 [])."""
    lhs = jnp.asarray(lhs)
    rhs = rhs if isinstance(rhs, BlockScaled) else jnp.asarray(rhs)
    if lhs.ndim != 2:
        raise ValueError(f"{name}: lhs must be [M, H], got shape {lhs.shape}")
    if rhs_is_weights:
        if rhs.ndim != 3 or rhs.shape[1] != lhs.shape[1]:
            raise ValueError(f"{name}: rhs must be [E, H={lhs.shape[1]}, F], got shape {rhs.shape}")
    elif rhs.ndim != 2 or rhs.shape[0] != lhs.shape[0]:
        raise ValueError(f"{name}: grad must be [M={lhs.shape[0]}, F], got shape {rhs.shape}")
    other = "rhs" if rhs_is_weights else "grad"
    rhs_dtype = lhs.dtype if isinstance(rhs, BlockScaled) else rhs.dtype  # FP8 weights compute in lhs's dtype
    if lhs.dtype not in _FLOATS or rhs_dtype not in _FLOATS:
        raise ValueError(
            f"{name}: lhs and {other} must each be float32, bfloat16 or float16 (they may differ), "
            f"got {lhs.dtype}, {rhs_dtype}"
        )
    group_sizes = _check_group_sizes(group_sizes, lhs.shape[0], name)
    if group_offset is None:
        group_offset = jnp.zeros((), jnp.int32)
    group_offset = jnp.asarray(group_offset)
    if group_offset.size != 1 or not jnp.issubdtype(group_offset.dtype, jnp.integer):
        raise ValueError(f"{name}: group_offset must be one integer (shape () or (1,)), got {group_offset}")
    group_offset = group_offset.reshape(()).astype(jnp.int32)
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
    quantize_lhs: int | None = None,
) -> jax.Array:
    """Grouped GEMM, `jax.lax.ragged_dot` semantics plus `group_offset`; differentiable in lhs and rhs.

    Args:
      lhs: [M, H] rows sorted by group (float32 / bfloat16 / float16).
      rhs: [E_loc, H, F] weights of groups [group_offset, group_offset + E_loc) (float32 / bfloat16 / float16;
        may differ from lhs: then both are cast to float32 per tile or chunk, as megablox does). Or a tuple of
        parts ``([E_1, H, F], [E_2, H, F], …)`` (one dtype), side by side along the groups, E_loc = Σ E_p — the
        same function as their concatenation without copying them into one array ("chunked" writes every
        part's groups into one output buffer; the other implementations add one output per part); the
        gradient is then a tuple of the parts' gradients. Or a block-scaled FP8 weight `BlockScaled` ``(q [E_loc,
        H, F] e4m3, scale_inv [E_loc, ⌈H/bH⌉, ⌈F/bF⌉] float32, block)`` (or parts of them): the function of its
        dequantized value in lhs's dtype, read as FP8 by the kernel where the implementation can (`fp8_path`:
        tokamax), else dequantized inside the call; frozen (its gradient is zero; d lhs flows).
      group_sizes: [E] rows per group, any integer dtype (int32, uint32, int64, …; cast to int32), E >= E_loc;
        sum(group_sizes) <= M, the rest is padding. Checked (>= 0, sum <= M) when concrete.
      preferred_element_type: output dtype, float32 / bfloat16 / float16 (default: what `jax.lax.ragged_dot`
        returns — lhs's dtype when the two agree, float32 when either is float32, bfloat16 for bfloat16 ×
        float16); accumulation is float32 whatever it is (see "Numerics").
      group_offset: first local group (int, [] or [1] int array; may be traced). Default 0.
      tiling: `GmmTiling` or (tm, tk, tn).
      interpret: run the Pallas kernel in interpret mode (CPU tests).
      implementation: "auto" | "pallas" | "chunked" | "ragged_dot" | "tokamax" | "megablox" | "mosaic" (see the
        module docstring).
      precision: passed to the inner dots (e.g. `jax.lax.Precision.HIGHEST`).
      quantize_lhs: None, or FP8 activations: each row of lhs quantized to e4m3 with one scale per this many columns
        (DeepSeek's 1 × 128 tiles: 128; the whole row when narrower; `pallas_kernels.fp8.quantize_rows`), and their
        values multiplied in lhs's dtype by every implementation (`fp8.fake_quantize_rows`): no e4m3 × e4m3 kernel
        is used (tokamax 0.0.17 has none for e4m3 weights: its sm100 FP8-activation kernel takes int4 weights, its
        sm90 one dequantizes FP8 activations). Gradients pass straight through: d lhs and d rhs as if lhs were not
        quantized.
    Returns:
      [M, F] in the output dtype: row r of local group g is lhs[r] @ rhs[g - group_offset]; all other rows are
      zero. Gradients come back in each operand's dtype (d lhs in lhs.dtype, d rhs in rhs.dtype); they are
      computed like the forward from the cotangent (in the output dtype) and the other operand — compute dtype
      of that pair, float32 accumulation — as in megablox (so bfloat16 operands with a float32 output get
      float32 backward dots).
    Raises:
      ValueError on bad shapes, a non-float operand or output dtype, non-integer group sizes, negative or
      oversized concrete group sizes, an out-of-range concrete group_offset, an unknown implementation or a
      bad tiling.

    Numerics (every path: operands cast to the compute dtype, products accumulated in float32, one rounding
    to the output dtype at the end; only the order of the float32 sums over H differs):
      - "chunked": XLA's dense dot per row chunk (the same H sum as a dense matmul of those rows).
      - "pallas": the H sum in tk-wide pieces, added in H order (a dot of tk terms per piece).
      - "ragged_dot": XLA's `ragged_dot` lowering.
      - "tokamax": tokamax's `ragged_dot_general` (its Mosaic GPU kernels on sm90 / sm100; XLA's lowering on CPU).
      - "megablox": the H sum in 128-wide tiles, added in H order (float32 operands: the TPU's float32 matmul).
      - "mosaic": the H sum in 64-wide wgmma steps (16-deep instructions) added in H order per K split, split-K
        partials added in float32 by XLA; float32 operands on TF32 (3×TF32 with ``precision=HIGHEST``).
      - `gmm_reference`: one XLA dot per local group over all rows, masked.
    So the paths agree up to float32 reassociation. Tolerance to expect, against float64 or between any two paths:
    with float32 output |Δ| <= 1e-6 · max|out| (measured on CPU, normal bfloat16 / float32 inputs, 8 groups, F =
    256: max |Δ| vs float64 <= 4.5e-7 · max|out| at H = 128 — 2.3e-5 on outputs up to ~53 — and <= 7.5e-7 · max|out|
    up to H = 4096, for every path; `jax.lax.ragged_dot` at Precision.HIGHEST is itself up to 1.4e-5 from float64
    there). An FP8 weight read by tokamax's kernel is scaled in lhs's dtype (the scale rounded to bfloat16 for bfloat16
    lhs), where `gmm_reference` dequantizes in float32 and rounds once: the two differ by up to one bfloat16 rounding of
    each weight (|Δ| <~ 2^-8 · Σ|x·w|). With bfloat16 / float16 output add one rounding of that dtype, |Δ| <= 2^-8 /
    2^-11 · |out| more: where the float32 sums of two paths straddle a rounding boundary their results differ by one
    unit in the last place (measured: 9–52 of 262,144 bfloat16 outputs differ from the correctly rounded float64
    result). On a GPU, float32 operands with the default ``precision`` run on TF32 tensor cores in the Pallas kernel
    (Triton's rule) and in XLA (~1e-3 relative); pass ``precision=jax.lax.Precision.HIGHEST`` for IEEE float32 (an H200
    gave 1.2e-6 relative for the Pallas kernel and <= 1.1e-4 for tokamax at the default precision:
    results/gpu/check.json).
    """
    parts = _check_parts(rhs)
    offset = _may_offset(group_offset)
    lhs, first, group_sizes, group_offset = _validate(
        lhs, parts[0], group_sizes, group_offset, rhs_is_weights=True, name="gmm"
    )
    out_dtype = _check_out_dtype(preferred_element_type, lhs, lhs if isinstance(first, BlockScaled) else first, "gmm")
    if quantize_lhs is not None and (
        isinstance(quantize_lhs, bool) or not isinstance(quantize_lhs, int) or quantize_lhs < 1
    ):
        raise ValueError(
            f"gmm: quantize_lhs must be None or a positive int (columns per scale, e.g. 128), got {quantize_lhs!r}"
        )
    cfg = GmmCall(
        _resolve(implementation, interpret),
        as_tiling(tiling),
        interpret,
        out_dtype,
        sum(w.shape[0] for w in parts),
        precision,
        quantize_lhs,
        offset,
    )
    rhs = (first, *parts[1:]) if isinstance(rhs, tuple | list) else first
    return gmm_vjp(lhs, rhs, group_sizes, group_offset, cfg)


def _check_parts(rhs) -> tuple:
    """``rhs`` as a tuple of parts ``[E_p, H, F]`` (one array or `BlockScaled`: one part); parts must agree in H, F
    and dtype (all arrays of one dtype, or all `BlockScaled` in one block)."""
    if not isinstance(rhs, tuple | list):
        return (rhs.check("gmm"),) if isinstance(rhs, BlockScaled) else (rhs,)
    parts = tuple(
        w.check(f"gmm: rhs part {i}") if isinstance(w, BlockScaled) else jnp.asarray(w) for i, w in enumerate(rhs)
    )
    if not parts:
        raise ValueError("gmm: rhs is an empty tuple of parts; pass one [E, H, F] array or parts of it")

    def kind(w):
        return f"BlockScaled(block={w.block})" if isinstance(w, BlockScaled) else str(w.dtype)

    for i, w in enumerate(parts):
        if w.ndim != 3 or w.shape[1:] != parts[0].shape[1:] or kind(w) != kind(parts[0]):
            raise ValueError(
                f"gmm: rhs part {i} is {kind(w)}{list(w.shape)} but part 0 is {kind(parts[0])}{list(parts[0].shape)}:"
                " parts of rhs must be [E_p, H, F] arrays of one dtype (or BlockScaled of one block) with the same H"
                " and F"
            )
    return parts


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
      grad: [M, F] same rows (its dtype may differ from lhs: both are then cast to float32).
      group_sizes: [E] rows per group, any integer dtype (as in `gmm`).
      num_local_groups: E_loc (default E - group_offset for a concrete offset, else E).
      Other arguments as in `gmm` (default output dtype: `jax.lax.ragged_dot`'s rule for lhs and grad).
    Returns:
      [E_loc, H, F]; exactly zero for empty groups. Not differentiable (it is itself a gradient). Float32
      accumulation; "pallas" adds tm-row M-tile products in row order, "chunked" adds chunk products in chunk
      order, "ragged_dot" is XLA's `ragged_dot_general`.
    """
    offset = _may_offset(group_offset)
    lhs, grad, group_sizes, group_offset = _validate(
        lhs, grad, group_sizes, group_offset, rhs_is_weights=False, name="tgmm"
    )
    if num_local_groups is None:
        num_local_groups = group_sizes.shape[0] - (int(group_offset) if _is_concrete(group_offset) else 0)
    if num_local_groups < 1:
        raise ValueError(f"tgmm: num_local_groups must be >= 1, got {num_local_groups}")
    out_dtype = _check_out_dtype(preferred_element_type, lhs, grad, "tgmm")
    cfg = GmmCall(
        _resolve(implementation, interpret),
        as_tiling(tiling),
        interpret,
        out_dtype,
        num_local_groups,
        precision,
        offset=offset,
    )
    return tgmm_call(lhs, grad, group_sizes, group_offset, cfg, out_dtype)


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
    quantize_lhs: int | None = None,
) -> jax.Array:
    """Pure-jnp truth for `gmm` (a masked loop over local groups; autodiff gives its gradients).

    lhs [M, H], rhs [E_loc, H, F] (or a `BlockScaled`: dequantized to lhs's dtype, `pallas_kernels.fp8.dequantize`),
    group_sizes [E] (any integer dtype), ``quantize_lhs`` as in `gmm` -> [M, F]. Same dtype rules as `gmm`:
    operands cast to their compute dtype, float32 accumulation, output in preferred_element_type (default:
    `jax.lax.ragged_dot`'s output dtype).
    """
    if isinstance(rhs, BlockScaled):  # FP8: its value, in lhs's dtype
        rhs = rhs.dequantize(lhs.dtype)
    if quantize_lhs is not None:  # FP8 activations: their value, in lhs's dtype (straight-through gradient)
        lhs = fake_quantize_rows(lhs, quantize_lhs)
    out_dtype = jnp.dtype(preferred_element_type or default_out_dtype(lhs.dtype, rhs.dtype))
    cd = dot_dtype(lhs, rhs)
    lhs, rhs = lhs.astype(cd), rhs.astype(cd)
    off = jnp.asarray(0 if group_offset is None else group_offset, jnp.int32).reshape(())
    row_group = _row_groups(jnp.asarray(group_sizes), lhs.shape[0])
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
    """Pure-jnp truth for `tgmm`: lhs [M, H], grad [M, F], group_sizes [E] -> [E_loc, H, F] (dtypes as `gmm`)."""
    out_dtype = jnp.dtype(preferred_element_type or default_out_dtype(lhs.dtype, grad.dtype))
    cd = dot_dtype(lhs, grad)
    lhs, grad = lhs.astype(cd), grad.astype(cd)
    off = jnp.asarray(0 if group_offset is None else group_offset, jnp.int32).reshape(())
    row_group = _row_groups(jnp.asarray(group_sizes), lhs.shape[0])
    outs = []
    for j in range(num_local_groups):
        x = jnp.where((row_group == off + j)[:, None], lhs, 0)
        outs.append(jnp.dot(x.T, grad, preferred_element_type=jnp.float32))
    return jnp.stack(outs).astype(out_dtype)
