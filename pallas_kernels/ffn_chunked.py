"""The routed experts' whole FFN on XLA:CPU in one loop over row chunks: gate, up, activation and down per chunk.

    ffn_chunked(x [M, H], group_sizes [E], w_gate [E, H, F], w_up [E, H, F], w_down [E, F, H],
                activation=(g, u) -> h, b_gate / b_up [E, F], b_down [E, H]) -> y [M, H]

Rows of ``x`` are sorted by group (group e owns rows [offsets[e], offsets[e + 1]), the rows past the last group
give zeros). Three `gmm` calls (gate, up, down) would each walk the groups in their own loops and write an ``[M, F]``
or ``[M, H]`` buffer that the next reads back, with the activation run over every row of the buffer, padding rows
included; here each chunk of c rows of one group goes through all of it while it is in cache:

    g = x_c @ w_gate[e] (+ b_gate[e]),  u = x_c @ w_up[e] (+ b_up[e]),  y_c = activation(g, u) @ w_down[e] (+ b_down[e])

Chunks follow the CPU ladder of `gmm` ("chunked", `gmm_metadata.chunk_ladder` / `walk_ladder`: the largest chunk
while that many rows remain, then each smaller size, one masked chunk of the smallest for the rest), so a group
computes fewer than ``min_chunk`` rows past its end. Measured at 8 fake devices on 2 cores (1,024 rows of one expert
per device, H 256, F 512): the three-`gmm` FFN ran at 0.73 of three dense matmuls of the real rows, this loop at 0.97.

Weights may be tuples of parts along the groups (``(stored [S, ...], copies [k, ...])``, as `gmm` takes them): each
part's groups are walked with its own arrays, nothing is concatenated. Biases (optional, all three or none) are
whole ``[E, ...]`` arrays (small).

Dtypes: both operands of every dot in `gmm_metadata.dot_dtype` of (x, weight), float32 accumulation, the
activation in float32; ``y`` in `gmm_metadata.default_out_dtype` of (x, w_down).

Gradients (`jax.custom_vjp`): the forward keeps ``g`` and ``u`` of every computed row (float32 ``[M, F]`` each, the
residuals three `gmm` calls would keep, minus their outputs); the backward walks the same chunks once:
dh = dy_c @ w_downᵀ, (dg, du) = the activation's VJP, dx_c = dg @ w_gateᵀ + du @ w_upᵀ, and each group's weight and
bias gradients summed in float32 over its chunks (masked rows contribute zeros), written once per group.
`ffn_reference` is the pure-jnp truth (three `gmm_reference` calls; autodiff gives its gradients).

Glossary additions: c rows of a chunk.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax
from jax.ad_checkpoint import checkpoint_name

from pallas_kernels.gmm_metadata import chunk_ladder, default_out_dtype, dot_dtype, local_group_rows, walk_ladder

__all__ = ["HIDDEN", "FfnChunks", "ffn_chunked", "ffn_reference"]

#: The `jax.ad_checkpoint.checkpoint_name` of the residuals ``g`` and ``u`` (a remat policy that saves it keeps them).
HIDDEN = "moe_expert_hidden"

_KEYS = ("w_gate", "w_up", "w_down")
_BIASES = ("b_gate", "b_up", "b_down")


@dataclasses.dataclass(frozen=True)
class FfnChunks:
    """Static settings of `ffn_chunked` (hashable): the ``activation`` ``(g, u) → h`` (elementwise, float32; a
    hashable callable), the chunk ladder (``chunk``, ``small_chunk``, ``min_chunk``: `gmm.GmmTiling`'s defaults)."""

    activation: Callable | None
    chunk: int = 1024
    small_chunk: int = 128
    min_chunk: int = 32

    def with_activation(self, activation: Callable) -> FfnChunks:
        """These chunk settings with ``activation``."""
        return dataclasses.replace(self, activation=activation)


def ffn_chunked(x: jax.Array, group_sizes: jax.Array, weights: dict, settings: FfnChunks) -> jax.Array:
    """The grouped expert FFN of sorted rows ``x [M, H]`` (see the module).

    Args:
      x: ``[M, H]`` rows sorted by group. group_sizes: ``[E]`` int rows per group (Σ ≤ M; rows past them: zeros).
      weights: ``w_gate`` / ``w_up [E, H, F]``, ``w_down [E, F, H]`` (each an array or a tuple of parts along E),
        and optionally ``b_gate`` / ``b_up [E, F]``, ``b_down [E, H]`` (arrays).
      settings: `FfnChunks`.

    Returns:
      ``[M, H]`` in `gmm_metadata.default_out_dtype` of (x, w_down).
    """
    w = {k: weights[k] if isinstance(weights[k], tuple) else (weights[k],) for k in _KEYS}
    b = {k: weights[k] for k in _BIASES if k in weights} or None
    if b is not None and set(b) != set(_BIASES):
        raise ValueError(f"ffn_chunked: give all of {list(_BIASES)} or none, got {sorted(b)}")
    return _ffn(x, w, b, group_sizes.astype(jnp.int32), settings)


def ffn_reference(x: jax.Array, group_sizes: jax.Array, weights: dict, activation: Callable) -> jax.Array:
    """Pure-jnp truth of `ffn_chunked` (three `gmm_reference` calls, per-row biases); same dtype rules."""
    from pallas_kernels.gmm import gmm_reference

    def whole(k):
        v = weights[k]
        return jnp.concatenate(v, axis=0) if isinstance(v, tuple) else v

    gs = jnp.asarray(group_sizes)
    f32 = jnp.float32
    g = gmm_reference(x, whole("w_gate"), gs, preferred_element_type=f32)
    u = gmm_reference(x, whole("w_up"), gs, preferred_element_type=f32)
    if "b_gate" in weights:
        row = _row_groups(gs, x.shape[0])
        g, u = g + _take(weights["b_gate"], row), u + _take(weights["b_up"], row)
    wd = whole("w_down")
    cd = dot_dtype(x, wd)
    y = gmm_reference(activation(g, u).astype(cd), wd, gs, preferred_element_type=f32)
    if "b_down" in weights:
        y = y + _take(weights["b_down"], _row_groups(gs, x.shape[0]))
    return y.astype(default_out_dtype(x.dtype, wd.dtype))


def _row_groups(gs, m):
    ends = jnp.cumsum(gs)
    return jnp.searchsorted(ends, jnp.arange(m), side="right")


def _take(bias, row):
    """Each row's group's bias (rows past the groups: zeros)."""
    padded = jnp.concatenate([bias.astype(jnp.float32), jnp.zeros((1, bias.shape[1]), jnp.float32)])
    return padded[jnp.minimum(row, bias.shape[0])]


def _parts(w: dict):
    """``[(first group, (w_gate, w_up, w_down))]`` of each part."""
    out, off = [], 0
    for parts in zip(*(w[k] for k in _KEYS), strict=True):
        out.append((off, parts))
        off += parts[0].shape[0]
    return out


def _chunk_forward(xc, w3, bias, cd, act):
    """One chunk: ``(y [c, H], g [c, F], u [c, F])`` float32."""
    wg, wu, wd = w3
    x = xc.astype(cd)
    g = jnp.dot(x, wg.astype(cd), preferred_element_type=jnp.float32)
    u = jnp.dot(x, wu.astype(cd), preferred_element_type=jnp.float32)
    if bias is not None:
        g, u = g + bias[0], u + bias[1]
    y = jnp.dot(act(g, u).astype(cd), wd.astype(cd), preferred_element_type=jnp.float32)
    if bias is not None:
        y = y + bias[2]
    return y, g, u


def _group_bias(b, j):
    return None if b is None else tuple(b[k][j].astype(jnp.float32) for k in _BIASES)


def _forward(x, w, b, gs, st: FfnChunks, keep: bool):
    """Every group's chunks → ``y [M, H]`` (out dtype) and, when ``keep``, ``g``, ``u`` ``[M, F]`` float32."""
    m = x.shape[0]
    F, H = w["w_gate"][0].shape[2], w["w_down"][0].shape[2]
    out_dtype = default_out_dtype(x.dtype, w["w_down"][0].dtype)
    cd = dot_dtype(x, w["w_gate"][0])
    sizes = chunk_ladder(st.chunk, st.min_chunk, m, st.small_chunk)
    bufs = (jnp.zeros((m, H), out_dtype),) + ((jnp.zeros((m, F), jnp.float32),) * 2 if keep else ())

    def write(bufs, vals, at, keep_rows=None):
        """``vals`` (y, g, u) into ``bufs`` at row ``at`` (``keep_rows``: only those rows; the rest as they were)."""
        new = []
        for buf, v in zip(bufs, vals, strict=False):
            v = v.astype(buf.dtype)
            if keep_rows is not None:
                v = jnp.where(keep_rows, v, lax.dynamic_slice_in_dim(buf, at, v.shape[0], axis=0))
            new.append(lax.dynamic_update_slice_in_dim(buf, v, at, axis=0))
        return tuple(new)

    for first, w3 in _parts(w):
        starts, ends = local_group_rows(gs, m=m, group_offset=first, num_local_groups=w3[0].shape[0])

        def group(j, bufs, w3=w3, first=first, ends=ends, starts=starts):
            wj, bias, end = tuple(a[j] for a in w3), _group_bias(b, first + j), ends[j]

            def full(c):  # a chunk inside the group: a plain write
                def step(s):
                    r0, bufs = s
                    vals = _chunk_forward(lax.dynamic_slice_in_dim(x, r0, c, axis=0), wj, bias, cd, st.activation)
                    return r0 + c, write(bufs, vals, r0)

                return step

            def tail(c):  # the last rows, masked; the window shifted back if it would pass M
                def step(s):
                    r0, bufs = s
                    w0 = jnp.minimum(r0, m - c)
                    rows = w0 + jnp.arange(c, dtype=jnp.int32)[:, None]
                    vals = _chunk_forward(lax.dynamic_slice_in_dim(x, w0, c, axis=0), wj, bias, cd, st.activation)
                    return r0 + c, write(bufs, vals, w0, (rows >= r0) & (rows < end))

                return step

            return walk_ladder(starts[j], end, sizes, full, tail, bufs)

        bufs = lax.fori_loop(0, w3[0].shape[0], group, bufs)
    return bufs


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _ffn(x, w, b, gs, st):
    return _forward(x, w, b, gs, st, keep=False)[0]


def _ffn_fwd(x, w, b, gs, st):
    y, g, u = _forward(x, w, b, gs, st, keep=True)
    return y, (x, w, b, gs, checkpoint_name(g, HIDDEN), checkpoint_name(u, HIDDEN))


def _ffn_bwd(st: FfnChunks, res, dy):
    x, w, b, gs, g_all, u_all = res
    m, H = x.shape
    dy = dy.astype(jnp.float32)
    cd = dot_dtype(x, w["w_gate"][0])
    sizes = chunk_ladder(st.chunk, st.min_chunk, m, st.small_chunk)
    t = (((0,), (0,)), ((), ()))  # contract the rows: aᵀ @ b

    def chunk_grads(at, c, wj, keep_rows):
        """Gradients of rows [at, at + c) (``keep_rows``: the rows of this group) → dx_c and the weights' sums."""
        sl = lambda a: lax.dynamic_slice_in_dim(a, at, c, axis=0)  # noqa: E731
        xc, dyc, gc, uc = sl(x).astype(cd), sl(dy), sl(g_all), sl(u_all)
        if keep_rows is not None:
            xc, dyc = jnp.where(keep_rows, xc, 0), jnp.where(keep_rows, dyc, 0)
            gc, uc = jnp.where(keep_rows, gc, 0), jnp.where(keep_rows, uc, 0)
        wg, wu, wd = (a.astype(cd) for a in wj)
        h, act_vjp = jax.vjp(st.activation, gc, uc)
        dwd = lax.dot_general(h.astype(cd), dyc.astype(cd), t, preferred_element_type=jnp.float32)
        dg, du = act_vjp(jnp.dot(dyc.astype(cd), wd.T, preferred_element_type=jnp.float32))
        dg, du = dg.astype(cd), du.astype(cd)
        dwg = lax.dot_general(xc, dg, t, preferred_element_type=jnp.float32)
        dwu = lax.dot_general(xc, du, t, preferred_element_type=jnp.float32)
        dxc = jnp.dot(dg, wg.T, preferred_element_type=jnp.float32) + jnp.dot(
            du, wu.T, preferred_element_type=jnp.float32
        )
        sums = (dwg, dwu, dwd)
        if b is not None:
            f32 = jnp.float32
            sums += (jnp.sum(dg.astype(f32), 0), jnp.sum(du.astype(f32), 0), jnp.sum(dyc, 0))
        return dxc, sums

    dx = jnp.zeros((m, H), jnp.float32)
    dw = {k: [] for k in _KEYS}
    db = None if b is None else {k: jnp.zeros(b[k].shape, jnp.float32) for k in _BIASES}
    for first, w3 in _parts(w):
        E_p = w3[0].shape[0]
        starts, ends = local_group_rows(gs, m=m, group_offset=first, num_local_groups=E_p)
        acc0 = tuple(jnp.zeros((E_p,) + a.shape[1:], jnp.float32) for a in w3)
        bacc0 = () if b is None else tuple(jnp.zeros((E_p,) + b[k].shape[1:], jnp.float32) for k in _BIASES)

        def group(j, state, w3=w3, starts=starts, ends=ends):
            dx, accs = state
            wj, end = tuple(a[j] for a in w3), ends[j]
            zero = tuple(jnp.zeros(a.shape[1:], jnp.float32) for a in accs)

            def full(c):
                def step(s):
                    r0, (dx, sums) = s
                    dxc, part = chunk_grads(r0, c, wj, None)
                    dx = lax.dynamic_update_slice_in_dim(dx, dxc, r0, axis=0)
                    return r0 + c, (dx, tuple(a + p for a, p in zip(sums, part, strict=True)))

                return step

            def tail(c):
                def step(s):
                    r0, (dx, sums) = s
                    w0 = jnp.minimum(r0, m - c)
                    rows = w0 + jnp.arange(c, dtype=jnp.int32)[:, None]
                    keep = (rows >= r0) & (rows < end)
                    dxc, part = chunk_grads(w0, c, wj, keep)
                    old = lax.dynamic_slice_in_dim(dx, w0, c, axis=0)
                    dx = lax.dynamic_update_slice_in_dim(dx, jnp.where(keep, dxc, old), w0, axis=0)
                    return r0 + c, (dx, tuple(a + p for a, p in zip(sums, part, strict=True)))

                return step

            dx, sums = walk_ladder(starts[j], end, sizes, full, tail, (dx, zero))
            return dx, tuple(lax.dynamic_update_index_in_dim(a, s, j, axis=0) for a, s in zip(accs, sums, strict=True))

        dx, accs = lax.fori_loop(0, E_p, group, (dx, acc0 + bacc0))
        for k, a, wk in zip(_KEYS, accs[:3], w3, strict=True):
            dw[k].append(a.astype(wk.dtype))
        if b is not None:
            for k, a in zip(_BIASES, accs[3:], strict=True):
                db[k] = lax.dynamic_update_slice_in_dim(db[k], a, first, axis=0)
    dw = {k: tuple(v) for k, v in dw.items()}
    if db is not None:
        db = {k: v.astype(b[k].dtype) for k, v in db.items()}
    return dx.astype(x.dtype), dw, db, None


_ffn.defvjp(_ffn_fwd, _ffn_bwd)
