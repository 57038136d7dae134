"""Where each of the layer's parameters sits in one HF MoE block's tensors, read lazily, per expert, dequantized.

A `TensorSource` answers a tensor's shape and dtype without reading it and reads a tensor whole or one row of its
first axis (`MemorySource`: a dict of arrays; `FileSource`: tensors in safetensors shards through their memory
maps, so a process that needs 20 of 128 experts reads those 20). Both dequantize on read: an FP8 weight with its
``*_scale_inv`` block scales, and gpt-oss's MXFP4 ``*_blocks`` / ``*_scales`` (`tempo_jax.layer.hf.quant`), one
tensor (or one expert) at a time in float32.

`block_readers` checks every tensor a family's block needs (present, shape, a float or quantized dtype, nothing
left over) before anything is read, and returns one reader per layer parameter: per-expert ones take the experts to
read (``[n]`` → ``[n, ...]`` in the layer's orientation), the others read whole. The layouts (`TensorNames`):

- per expert (the hub layout transformers saves by default): ``experts.{e}.{gate,up,down}.weight``, torch Linear
  ``[out, in]`` (Mixtral / MiniMax / DeepSeek-V4: w1 gate, w3 up, w2 down);
- fused "gate_up" (transformers ≥ 5 in memory): ``experts.gate_up_proj [E, 2F, H]`` gate rows first and
  ``experts.down_proj [E, H, F]``, or transposed ``[E, H, 2F]`` / ``[E, F, H]`` (Qwen3-VL-MoE's hub files,
  Llama-4, Aria's ``experts.fc1`` / ``fc2``), told apart by the down projection's shape; with biases
  ``*_bias [E, 2F]`` / ``[E, H]``, gate first (OpenAI's privacy filter);
- "interleaved" (gpt-oss): ``[E, H, 2F]`` with gate / up alternating, ``*_bias``; or MXFP4 ``*_blocks`` /
  ``*_scales`` ``[E, 2F, H/32, 16]`` / ``[E, H, F/32, 16]``;
- "input_linear" (Granite): ``input_linear.weight [E, 2F, H]`` (gate rows first), ``output_linear.weight [E, H, F]``;
- "dbrx": ``experts.mlp.w1 / v1 / w2 [E·F, H]`` (w1 gate, v1 up, w2 the down weight transposed).

With ``MoEConfig(expert_dtype="fp8_block")`` the routed experts stay FP8 (`tempo_jax.layer.fp8`): per-expert FP8
weights are read as stored with their ``*_scale_inv`` (transposed to the layer's orientation; the checkpoint's
blocks must be ``MoEConfig.fp8_block``), any other expert weights are quantized on read.

Glossary additions: n experts read."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from .. import fp8
from ..config import MoEConfig
from .quant import SafetensorsFile, dequant_fp8, dequant_mxfp4, e8m0
from .spec import TensorNames

__all__ = ["FileSource", "MemorySource", "Reader", "TensorSource", "block_readers"]

_FLOATS = ("float64", "float32", "float16", "bfloat16")
_QUANT = ("float8_e4m3fn", "float8_e5m2", "uint8", "float8_e8m0fnu")  # MXFP4 blocks / scales (E8M0 as bytes or F8_E8M0)


class TensorSource:
    """One block's tensors by name (keys relative to the block): shapes and dtypes without reading, and reads
    (float32; an FP8 weight beside its ``_scale_inv`` comes back dequantized)."""

    block: tuple[int, int] = (128, 128)

    def keys(self) -> list[str]:
        raise NotImplementedError

    def shape(self, key: str) -> tuple[int, ...]:
        raise NotImplementedError

    def dtype(self, key: str) -> str:
        raise NotImplementedError

    def _raw(self, key: str, index: int | None) -> np.ndarray:
        raise NotImplementedError

    def read(self, key: str, index: int | None = None) -> np.ndarray:
        """The tensor (or row ``index`` of its first axis), float32, dequantized when it is FP8 with block scales."""
        raw = self._raw(key, index)
        if self.dtype(key).startswith("float8") and f"{key}_scale_inv" in self._keyset():
            return dequant_fp8(raw, self._raw(f"{key}_scale_inv", index), self.block)
        return np.asarray(raw).astype(np.float32)

    def _keyset(self) -> set[str]:
        if not hasattr(self, "_keys_cache"):
            self._keys_cache = set(self.keys())
        return self._keys_cache


class MemorySource(TensorSource):
    """Tensors already in memory (numpy, ml_dtypes' bf16 / float8, or anything ``np.asarray`` reads)."""

    def __init__(self, state: Mapping, block: tuple[int, int] = (128, 128)):
        self._state, self.block = state, block

    def keys(self) -> list[str]:
        return list(self._state)

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(np.shape(self._state[key]))

    def dtype(self, key: str) -> str:
        return np.asarray(self._state[key]).dtype.name

    def _raw(self, key: str, index: int | None) -> np.ndarray:
        a = self._state[key]
        return np.asarray(a if index is None else a[index])


class FileSource(TensorSource):
    """Tensors of one block in safetensors shards: ``files`` maps each block-relative key to (shard, full name)."""

    def __init__(
        self, files: Mapping[str, tuple[Path, str]], block: tuple[int, int] = (128, 128), opened: dict | None = None
    ):
        self._files, self.block = dict(files), block
        self._open: dict[Path, SafetensorsFile] = {} if opened is None else opened

    def _shard(self, key: str) -> tuple[SafetensorsFile, str]:
        path, name = self._files[key]
        if path not in self._open:
            self._open[path] = SafetensorsFile(path)
        f = self._open[path]
        if name not in f._tensors:
            raise ValueError(f"{path}: has no tensor {name!r}, but the checkpoint's index names this file for it")
        return f, name

    def keys(self) -> list[str]:
        return list(self._files)

    def shape(self, key: str) -> tuple[int, ...]:
        f, name = self._shard(key)
        return f.info(name)[0]

    def dtype(self, key: str) -> str:
        f, name = self._shard(key)
        return f.info(name)[1]

    def _raw(self, key: str, index: int | None) -> np.ndarray:
        f, name = self._shard(key)
        a = f.array(name)
        return np.array(a if index is None else a[index])


#: A parameter's reader: per-expert (``experts [n]`` → ``[n, ...]``) or whole (``()`` → the array).
Reader = Callable[..., np.ndarray]


class _Checked:
    """Records every key a block uses while checking its shape and dtype (nothing is read)."""

    def __init__(self, src: TensorSource):
        self.src, self.used, self.keys = src, set(), set(src.keys())

    def need(self, key: str, shape: tuple[int, ...] | None, *, quantized: bool = False) -> str:
        if key not in self.keys:
            expected = f" (expected shape {list(shape)})" if shape else ""
            raise ValueError(f"moe_from_hf: state lacks {key!r}{expected}")
        got = self.src.shape(key)
        dt = self.src.dtype(key)
        scale = f"{key}_scale_inv"
        if dt.startswith("float8") and scale in self.keys:
            self.used.add(scale)  # FP8 with block scales: dequantized on read
            (b0, b1), grid = self.src.block, self.src.shape(scale)
            want = (*got[:-2], -(-got[-2] // b0), -(-got[-1] // b1)) if len(got) >= 2 else None
            if want is None or tuple(grid) != want:
                raise ValueError(
                    f"moe_from_hf: state[{scale!r}] has shape {list(grid)}; the FP8 weight {key!r} {list(got)} in "
                    f"{b0}×{b1} blocks (quantization_config.weight_block_size) needs {list(want or ())}"
                )
        elif dt not in _FLOATS and not (quantized and dt in _QUANT):
            raise ValueError(
                f"moe_from_hf: state[{key!r}] has dtype {dt}: an integer or quantized tensor without "
                "the scales that would dequantize it"
            )
        if shape is not None and tuple(got) != tuple(shape):
            raise ValueError(f"moe_from_hf: state[{key!r}] has shape {list(got)}, expected {list(shape)}")
        self.used.add(key)
        return key

    def first(self, candidates: tuple[str, ...]) -> str | None:
        return next((k for k in candidates if k in self.keys), None)


def block_readers(cfg: MoEConfig, names: TensorNames, src: TensorSource, where: str) -> dict[str, tuple[bool, Reader]]:
    """``{param: (per_expert, reader)}`` for every parameter of ``cfg`` from the block's tensors in ``src`` (see the
    module), after checking every tensor the block needs and that nothing is left over.

    Raises:
      ValueError: a missing, misshapen, integer or unexpected tensor (naming the key), quantized tensors without
        their scales.
    """
    c = _Checked(src)
    out: dict[str, tuple[bool, Reader]] = {}

    def whole(name, key, shape, fn=lambda a: a):
        k = c.need(key, shape)
        out[name] = (False, lambda: fn(src.read(k)))

    def stacked(name, fn):
        out[name] = (True, lambda experts: np.stack([fn(int(e)) for e in experts]))

    if names.expert_sets is not None:  # Steps 1–2 set by set (ERNIE-4.5-VL), the other router options refused
        _expert_sets(cfg, names, c, src, out, stacked)
    else:
        _router(cfg, names, c, whole)
        # Step 2: the routed experts, in whichever layout the block holds (FP8 experts: as stored, or quantized).
        _experts(cfg, names, c, src, stacked, where)
    if cfg.expert_dtype == "fp8_block":
        _quantized(cfg, out)
    _shared_and_rest(cfg, names, c, src, out, whole, where)
    return out


def _zero_rows(cfg: MoEConfig, names: TensorNames) -> int:
    """Rows the experts' gate / up tensors hold for the zero-computation experts (never read: LongCat-Flash)."""
    return cfg.zero_experts if names.zero_expert_rows else 0


def _router(cfg: MoEConfig, names: TensorNames, c: _Checked, whole) -> None:
    """Step 1: the router, its bias and the selection-only score bias."""
    H, E = cfg.hidden, cfg.experts
    router = c.first(names.router) or names.router[0]
    N = cfg.routed_choices  # the zero-computation experts' rows follow the routed ones (LongCat-Flash)
    rows = cfg.router.shared_rows  # and the shared experts' after those (Inkling)
    Rh = cfg.router.mlp_width  # a router MLP (Zaya): the router is its output projection [N, Rh]
    whole("router", router, (N + rows, Rh or H), lambda a: a[:N].T)
    if Rh:
        proj, proj_bias, carry, norm, fc1, fc1_bias, fc2, fc2_bias = names.router_mlp
        whole("router_in", proj, (Rh, H), lambda a: a.T)
        whole("router_in_bias", proj_bias, (Rh,))
        if cfg.router.carried_state:
            whole("router_carry", carry, (Rh,))
        whole("router_norm", norm, (Rh,))
        for name, w, b in (("router_fc1", fc1, fc1_bias), ("router_fc2", fc2, fc2_bias)):
            whole(name, w, (Rh, Rh), lambda a: a.T)
            whole(f"{name}_bias", b, (Rh,))
    if rows:
        whole("router_shared", router, (N + rows, H), lambda a: a[N:].T)
    if cfg.router.gain:
        whole("router_gain", names.router_gain, (1,))
    if cfg.router.bias:
        whole("router_bias", names.router_bias, (N,))
    if cfg.router.input_scale:
        whole("router_scale", names.router_scale, (H,))
    if cfg.router.expert_scale:
        whole("expert_scale", names.expert_scale, (E,))
    if cfg.router.score_bias:
        key = c.first(names.score_bias) or names.score_bias[0]
        shape = c.src.shape(key) if key in c.keys else (N,)
        if tuple(shape) not in ((N,), (1, N)):
            raise ValueError(f"moe_from_hf: state[{key!r}] has shape {list(shape)}, expected [{N}] or [1, {N}]")
        whole("score_bias", key, tuple(shape), lambda a: a.reshape(N))


def _expert_sets(cfg: MoEConfig, names: TensorNames, c: _Checked, src: TensorSource, out: dict, stacked) -> None:
    """Steps 1–2 for experts in sets (`TensorNames.expert_sets`): each set's router, selection bias and experts,
    set after set; a narrower set's experts zero-padded to F (zero columns of gate / up and rows of down add
    nothing, and their gradients stay zero)."""
    H, E, F = cfg.hidden, cfg.experts, cfg.ffn
    sets = names.expert_sets
    Es = E // len(sets)

    def joined(name, keys, fn):
        out[name] = (False, lambda: np.concatenate([fn(src.read(k)) for k in keys], axis=-1))

    def pad(a: np.ndarray, axis: int) -> np.ndarray:  # zero-pad axis to F
        width = [(0, 0)] * a.ndim
        width[axis] = (0, F - a.shape[axis])
        return np.pad(a, width)

    if f"{sets[0]}gate.weight" in c.keys:  # the in-memory layout: one sub-block per set
        joined("router", [c.need(f"{p}gate.weight", (Es, H)) for p in sets], lambda a: a.T)
        bias = [c.need(f"{p}gate.moe_statics.e_score_correction_bias", (1, Es)) for p in sets]
        joined("score_bias", bias, lambda a: a.reshape(Es))
        gate_up, down = [], []
        for p in sets:
            Fs = c.src.shape(f"{p}experts.down_proj")[-1] if f"{p}experts.down_proj" in c.keys else F
            if Fs > F:
                raise ValueError(f"moe_from_hf: {p}experts are {Fs} wide, wider than the layer's F = {F}")
            gate_up.append((c.need(f"{p}experts.gate_up_proj", (Es, 2 * Fs, H)), Fs))
            down.append(c.need(f"{p}experts.down_proj", (Es, H, Fs)))

        def expert(e, part):
            (gk, Fs), dk = gate_up[e // Es], down[e // Es]
            if part == "down":
                return pad(src.read(dk, e % Es).T, 0)
            gu = src.read(gk, e % Es)
            return pad((gu[:Fs] if part == "gate" else gu[Fs:]).T, 1)

    else:  # the hub: per-set routers transposed, the biases stacked, the experts per expert set after set
        routers = list(names.router[: len(sets)])
        joined("router", [c.need(k, (H, Es)) for k in routers], lambda a: a)
        key = c.need(names.score_bias[0], (len(sets), Es))
        out["score_bias"] = (False, lambda: src.read(key).reshape(E))
        g, u, d = names.experts
        keys = {}
        for e in range(E):
            Fs = c.src.shape(f"experts.{e}.{g}.weight")[0] if f"experts.{e}.{g}.weight" in c.keys else F
            keys[e] = [c.need(f"experts.{e}.{n}.weight", s) for n, s in ((g, (Fs, H)), (u, (Fs, H)), (d, (H, Fs)))]

        def expert(e, part):
            gk, uk, dk = keys[e]
            return pad(src.read(dk).T, 0) if part == "down" else pad(src.read(gk if part == "gate" else uk).T, 1)

    stacked("w_gate", lambda e: expert(e, "gate"))
    stacked("w_up", lambda e: expert(e, "up"))
    stacked("w_down", lambda e: expert(e, "down"))


def _shared_and_rest(cfg: MoEConfig, names: TensorNames, c: _Checked, src: TensorSource, out, whole, where) -> None:
    """Step 3 (the shared experts), step 4 (the latent projections, the block output's bias and norm) and step 5
    (nothing left over)."""
    H = cfg.hidden
    # Step 3: shared experts.
    if cfg.shared is not None:
        Fs = cfg.shared.width
        prefix = next((p for p in names.shared if any(k.startswith(p) for k in c.keys)), names.shared[0])
        S, Fe = cfg.shared.count, cfg.shared.ffn
        if names.shared_interleaved and f"{prefix}{names.shared_interleaved[0]}" in c.keys:  # rows alternating
            gu, dn = (f"{prefix}{n}" for n in names.shared_interleaved)
            whole("shared_w_gate", gu, (S, 2 * Fe, H), lambda a: a[:, 0::2].reshape(S * Fe, H).T)
            whole("shared_w_up", gu, (S, 2 * Fe, H), lambda a: a[:, 1::2].reshape(S * Fe, H).T)
            whole("shared_w_down", dn, (S, H, Fe), lambda a: a.transpose(0, 2, 1).reshape(S * Fe, H))
        elif names.shared_stacked:  # [S, Fe, H] / [S, H, Fe]: expert s's columns s·Fe … (s+1)·Fe of the layer's
            g, u, d = (f"{prefix}{n}" for n in names.shared_stacked)
            whole("shared_w_gate", g, (S, Fe, H), lambda a: a.reshape(S * Fe, H).T)
            whole("shared_w_up", u, (S, Fe, H), lambda a: a.reshape(S * Fe, H).T)
            whole("shared_w_down", d, (S, H, Fe), lambda a: a.transpose(0, 2, 1).reshape(S * Fe, H))
        elif f"{prefix}gate_up_proj.weight" in c.keys:  # gate and up in one Linear, gate rows first (MiniMax-M3)
            whole("shared_w_gate", f"{prefix}gate_up_proj.weight", (2 * Fs, H), lambda a: a[:Fs].T)
            whole("shared_w_up", f"{prefix}gate_up_proj.weight", (2 * Fs, H), lambda a: a[Fs:].T)
            whole("shared_w_down", f"{prefix}down_proj.weight", (H, Fs), lambda a: a.T)
        elif names.shared_fused:
            whole("shared_w_gate", f"{prefix}input_linear.weight", (2 * Fs, H), lambda a: a[:Fs].T)
            whole("shared_w_up", f"{prefix}input_linear.weight", (2 * Fs, H), lambda a: a[Fs:].T)
            whole("shared_w_down", f"{prefix}output_linear.weight", (H, Fs), lambda a: a.T)
        else:
            g, u, d = names.shared_names
            gated = cfg.shared.ffn_config.gated
            probe, memory = (g, "gate_proj") if gated else (u, "up_proj")
            if f"{prefix}{probe}.weight" not in c.keys and f"{prefix}{memory}.weight" in c.keys:
                g, u, d = "gate_proj", "up_proj", "down_proj"  # the in-memory names (a fused save)
            if gated:  # (plain shared experts: up / down only)
                whole("shared_w_gate", f"{prefix}{g}.weight", (Fs, H), lambda a: a.T)
            whole("shared_w_up", f"{prefix}{u}.weight", (Fs, H), lambda a: a.T)
            whole("shared_w_down", f"{prefix}{d}.weight", (H, Fs), lambda a: a.T)
        if cfg.shared.gated:
            whole("shared_gate", names.shared_gate, (1, H), lambda a: a[0])
    # Step 4: the latent experts' projections and norms, the block output's bias and norm.
    if cfg.latent is not None:
        L, (k_in, k_norm, k_out, _) = cfg.latent.width, names.latent
        whole("latent_in", k_in, (L, H), lambda a: a.T)
        whole("latent_out", k_out, (H, L), lambda a: a.T)
        if cfg.latent.norm:
            whole("latent_norm", k_norm, (L,))
    if cfg.expert.out_norm_eps is not None:
        whole("expert_out_scale", names.latent[3], (cfg.expert_width,))
    if cfg.output.bias:
        whole("out_bias", names.output_bias, (H,))
    if cfg.output.norm:
        whole("out_norm", names.output_norm, (H,))
    # Step 5: nothing left over.
    extra = sorted(c.keys - c.used)
    if extra:
        more = " …" if len(extra) > 8 else ""
        scales = [k for k in extra if k.endswith(("_scale_inv", "_scales", "_blocks"))]
        hint = ""
        if scales:
            hint = (
                f" ({scales[:3]} are quantized tensors' scales or blocks beside weights that are not FP8 / "
                "MXFP4: give the checkpoint's own quantized weights with them, or dequantized weights without "
                "them)"
            )
        raise ValueError(
            f"moe_from_hf: unexpected tensors for a {where} MoE block: {extra[:8]}{more}{hint}; give "
            "only the block's tensors (keys relative to it)"
        )


def _stored_fp8(cfg: MoEConfig, src: TensorSource, name: str, keys: list[str], stacked) -> None:
    """Readers of one FP8 expert weight kept as stored: its ``[out, in]`` values and ``*_scale_inv`` grid, both
    transposed to the layer's ``[in, out]``."""
    stored = {src.dtype(k) for k in keys}
    if stored != {"float8_e4m3fn"}:
        raise ValueError(
            f"moe_from_hf: {keys[0]!r} is stored as {sorted(stored)}; FP8 experts keep e4m3 (DeepSeek's format) as "
            "stored: load without expert_dtype='fp8_block' to dequantize it"
        )
    if tuple(src.block) != tuple(cfg.fp8_block):
        raise ValueError(
            f"moe_from_hf: the checkpoint's FP8 experts are in {src.block[0]}×{src.block[1]} blocks "
            f"(quantization_config.weight_block_size) but MoEConfig.fp8_block is {cfg.fp8_block}; leave fp8_block "
            "unset to keep the checkpoint's blocks"
        )

    def scale(e, keys=keys):
        s = np.asarray(src._raw(f"{keys[e]}_scale_inv", None))
        return (e8m0(s) if s.dtype == np.uint8 or s.dtype.name.startswith("float8_e8m0") else s).astype(np.float32).T

    stacked(name, lambda e, keys=keys: np.asarray(src._raw(keys[e], None)).astype(fp8.FP8_DTYPE).T)
    stacked(fp8.SCALE_KEYS[name], scale)


def _quantized(cfg: MoEConfig, out: dict) -> None:
    """FP8 experts from weights that are not stored so (bf16 / f32, or another format): each expert weight's reader
    quantized on read (`fp8.quantize`, ``MoEConfig.fp8_block``), its scales beside it."""
    block = fp8.layer_block(cfg.fp8_block)
    for name, key in fp8.SCALE_KEYS.items():
        if key in out:  # kept as stored
            continue
        read = out[name][1]

        def part(i, read=read):
            return lambda experts: np.asarray(fp8.quantize(read(experts), block)[i])

        out[name], out[key] = (True, part(0)), (True, part(1))


def _bias_key(weight_key: str) -> str:
    """The bias beside a torch Linear's weight: ``….weight`` → ``….bias``."""
    return weight_key.removesuffix("weight") + "bias"


def _experts(cfg: MoEConfig, names: TensorNames, c: _Checked, src: TensorSource, stacked, where: str) -> None:
    """The routed experts' readers (see the module's layouts; their width H is the latent L where the block has one)."""
    H, F, E = cfg.expert_width, cfg.ffn, cfg.experts
    g, u, d = names.experts
    if not cfg.expert.gated:  # plain experts: up / down only, per expert or stacked [E, F, H] / [E, H, F]
        _, u, d = names.experts
        if names.expert_key.format(e=0, p=u) in c.keys or f"experts.{u}" not in c.keys:
            for n, p, shape in (("w_up", u, (F, H)), ("w_down", d, (H, F))):
                keys = [c.need(names.expert_key.format(e=i, p=p), shape) for i in range(E)]
                stacked(n, lambda e, keys=keys: src.read(keys[e]).T)
                if cfg.expert.bias:  # each Linear's bias beside its weight (NLLB-MoE's fc1 / fc2)
                    biases = [c.need(_bias_key(k), shape[:1]) for k in keys]
                    stacked(f"b_{n[2:]}", lambda e, biases=biases: src.read(biases[e]))
        else:
            uk, dk = c.need(f"experts.{u}", (E, F, H)), c.need(f"experts.{d}", (E, H, F))
            stacked("w_up", lambda e: src.read(uk, e).T)
            stacked("w_down", lambda e: src.read(dk, e).T)
        return
    stacked_here = names.stacked_names is not None and names.stacked_names[0] in c.keys
    if f"experts.0.{g}.weight" in c.keys or (not (_fused_present(c, names) or stacked_here) and names.fused != "dbrx"):
        for e in range(E, E + _zero_rows(cfg, names)):  # transformers stores gate / up rows it never reads for them
            for p in (g, u):
                c.need(f"experts.{e}.{p}.weight", (F, H))
        per = {
            n: [c.need(f"experts.{i}.{p}.weight", s) for i in range(E)]
            for n, p, s in (("w_gate", g, (F, H)), ("w_up", u, (F, H)), ("w_down", d, (H, F)))
        }
        for n, keys in per.items():
            if cfg.expert_dtype == "fp8_block" and f"{keys[0]}_scale_inv" in c.keys:
                _stored_fp8(cfg, src, n, keys, stacked)
            else:
                stacked(n, lambda e, keys=keys: src.read(keys[e]).T)
        return
    if names.stacked_names is not None and names.stacked_names[0] in c.keys:  # three stacked tensors (Step-3.7)
        gk, uk, dk = (c.need(k, s) for k, s in zip(names.stacked_names, ((E, F, H), (E, F, H), (E, H, F)), strict=True))
        stacked("w_gate", lambda e: src.read(gk, e).T)
        stacked("w_up", lambda e: src.read(uk, e).T)
        stacked("w_down", lambda e: src.read(dk, e).T)
        return
    if names.fused == "dbrx":
        w1, v1, w2 = (c.need(f"experts.mlp.{n}", (E * F, H)) for n in ("w1", "v1", "w2"))
        stacked("w_gate", lambda e: src.read(w1)[e * F : (e + 1) * F].T)
        stacked("w_up", lambda e: src.read(v1)[e * F : (e + 1) * F].T)
        stacked("w_down", lambda e: src.read(w2)[e * F : (e + 1) * F])
        return
    if names.fused == "input_linear" and "input_linear.weight" in c.keys:
        gu, dn = c.need("input_linear.weight", (E, 2 * F, H)), c.need("output_linear.weight", (E, H, F))
        stacked("w_gate", lambda e: src.read(gu, e)[:F].T)
        stacked("w_up", lambda e: src.read(gu, e)[F:].T)
        stacked("w_down", lambda e: src.read(dn, e).T)
        return
    if names.fused == "interleaved":
        if "experts.gate_up_proj_blocks" in c.keys:  # MXFP4 (gpt-oss's official files)
            blk = [
                c.need(f"experts.{n}", s, quantized=True)
                for n, s in (
                    ("gate_up_proj_blocks", (E, 2 * F, H // 32, 16)),
                    ("gate_up_proj_scales", (E, 2 * F, H // 32)),
                    ("down_proj_blocks", (E, H, F // 32, 16)),
                    ("down_proj_scales", (E, H, F // 32)),
                )
            ]
            gu = lambda e: dequant_mxfp4(src._raw(blk[0], e), src._raw(blk[1], e)).T  # noqa: E731  [H, 2F]
            dn = lambda e: dequant_mxfp4(src._raw(blk[2], e), src._raw(blk[3], e)).T  # noqa: E731  [F, H]
        else:
            gk, dk = c.need("experts.gate_up_proj", (E, H, 2 * F)), c.need("experts.down_proj", (E, F, H))
            gu, dn = (lambda e: src.read(gk, e)), (lambda e: src.read(dk, e))
        stacked("w_gate", lambda e: gu(e)[:, 0::2])
        stacked("w_up", lambda e: gu(e)[:, 1::2])
        stacked("w_down", dn)
        gb, db = c.need("experts.gate_up_proj_bias", (E, 2 * F)), c.need("experts.down_proj_bias", (E, H))
        stacked("b_gate", lambda e: src.read(gb, e)[0::2])
        stacked("b_up", lambda e: src.read(gb, e)[1::2])
        stacked("b_down", lambda e: src.read(db, e))
        return
    # "gate_up": [E, 2F, H] / [E, H, F], or transposed [E, H, 2F] / [E, F, H] (told apart by the down projection),
    # under the family's hub names (Aria's experts.fc1 / fc2) or the in-memory ones; biases [E, 2F] gate first
    hub_gu, hub_dn = names.fused_names
    gu_key, dn_key = (hub_gu, hub_dn) if hub_dn in c.keys else ("experts.gate_up_proj", "experts.down_proj")
    down = c.src.shape(dn_key) if dn_key in c.keys else (E, H, F)
    transposed = names.transposed if names.transposed is not None else tuple(down) == (E, F, H)
    interleaved = names.fused_interleaved and gu_key == hub_gu  # the hub's alternating rows (Inkling 2)
    if transposed:
        gk, dk = c.need(gu_key, (E, H, 2 * F)), c.need(dn_key, (E, F, H))
        stacked("w_gate", lambda e: src.read(gk, e)[:, :F])
        stacked("w_up", lambda e: src.read(gk, e)[:, F:])
        stacked("w_down", lambda e: src.read(dk, e))
    else:  # (LongCat-Flash's fused gate_up also holds rows for its zero-computation experts, never read)
        gk, dk = c.need(gu_key, (E + _zero_rows(cfg, names), 2 * F, H)), c.need(dn_key, (E, H, F))
        gate, up = (slice(0, None, 2), slice(1, None, 2)) if interleaved else (slice(None, F), slice(F, None))
        stacked("w_gate", lambda e: src.read(gk, e)[gate].T)
        stacked("w_up", lambda e: src.read(gk, e)[up].T)
        stacked("w_down", lambda e: src.read(dk, e).T)
    if cfg.expert.bias:  # concatenated, gate first (OpenAI's privacy filter)
        gb, db = c.need(f"{gu_key}_bias", (E, 2 * F)), c.need(f"{dn_key}_bias", (E, H))
        stacked("b_gate", lambda e: src.read(gb, e)[:F])
        stacked("b_up", lambda e: src.read(gb, e)[F:])
        stacked("b_down", lambda e: src.read(db, e))


def _fused_present(c: _Checked, names: TensorNames) -> bool:
    return names.fused_names[0] in c.keys or any(
        re.match(r"(experts\.(gate_up_proj|mlp\.)|input_linear)", k) for k in c.keys
    )
