"""Where each of the layer's parameters sits in one HF MoE block's tensors, read lazily and per expert.

A `TensorSource` answers a tensor's shape and dtype without reading it, and reads a tensor whole or the rows of
some experts (`MemorySource`: a dict of arrays; `FileSource`: tensors in safetensors shards, read through the
files' own slices, so a process that needs 20 of 128 experts reads those 20). `block_readers` checks every tensor
a family's block needs (present, shape, dtype, nothing left over) before anything is read, and returns one reader
per layer parameter: per-expert ones take the experts to read (``[n]`` → ``[n, ...]`` in the layer's orientation),
the others read whole.

Layouts read: the per-expert checkpoint layout (``experts.{i}.gate_proj / up_proj / down_proj.weight``, Mixtral's
``experts.{i}.w1 / w3 / w2.weight``, torch Linear ``[out, in]``) and transformers ≥ 5's fused in-memory layout
(``experts.gate_up_proj [E, 2F, H]`` gate rows first, ``experts.down_proj [E, H, F]``; gpt-oss:
``experts.gate_up_proj [E, H, 2F]`` with gate / up interleaved, ``experts.down_proj [E, F, H]``, and ``*_bias``).
Router (``gate.weight``, gpt-oss ``router.weight`` / ``router.bias``), the score bias
(``gate.e_score_correction_bias``) and shared experts (``shared_experts.*``; Qwen2-MoE ``shared_expert.*`` with
``shared_expert_gate.weight``) included.

Glossary: H hidden, F expert width, E routed experts, Fs shared width, n experts read.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from ..config import MoEConfig

__all__ = ["FileSource", "MemorySource", "Reader", "TensorSource", "block_readers"]

_QUANTIZED = re.compile(r"(weight_scale_inv|_blocks|_scales|\.scale)$")


class TensorSource:
    """One block's tensors by name (keys relative to the block): shapes and dtypes without reading, and reads."""

    def keys(self) -> list[str]:
        raise NotImplementedError

    def shape(self, key: str) -> tuple[int, ...]:
        raise NotImplementedError

    def dtype(self, key: str) -> str:
        raise NotImplementedError

    def read(self, key: str) -> np.ndarray:
        """The whole tensor, float32."""
        raise NotImplementedError

    def rows(self, key: str, index: int) -> np.ndarray:
        """Row ``index`` of the first axis, float32."""
        return self.read(key)[index]


class MemorySource(TensorSource):
    """Tensors already in memory (numpy, or anything ``np.asarray`` reads: torch CPU tensors, jax arrays)."""

    def __init__(self, state: Mapping):
        self._state = state

    def keys(self) -> list[str]:
        return list(self._state)

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(np.shape(self._state[key]))

    def dtype(self, key: str) -> str:
        return str(np.asarray(self._state[key]).dtype)

    def read(self, key: str) -> np.ndarray:
        return np.asarray(self._state[key]).astype(np.float32)

    def rows(self, key: str, index: int) -> np.ndarray:
        return np.asarray(self._state[key][index]).astype(np.float32)


#: safetensors' dtype names → numpy's (ml_dtypes for bfloat16 and the float8 formats).
_SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
                       "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "U8": "uint8", "I8": "int8"}  # fmt: skip


class FileSource(TensorSource):
    """Tensors of one block in safetensors shards: ``files`` maps each block-relative key to (shard, full name);
    reads go through ``safe_open(...).get_slice`` (one expert's rows of a fused tensor, nothing more)."""

    def __init__(self, files: Mapping[str, tuple[Path, str]]):
        self._files = dict(files)
        self._meta: dict[str, tuple[tuple[int, ...], str]] = {}

    def _slice(self, key: str, fn):
        from safetensors import SafetensorError, safe_open

        shard, name = self._files[key]
        try:
            with safe_open(str(shard), framework="np") as f:
                return fn(f.get_slice(name))
        except (SafetensorError, OSError) as err:
            raise ValueError(f"{shard}: cannot read tensor {name!r}: {err}") from None

    def _info(self, key: str) -> tuple[tuple[int, ...], str]:
        if key not in self._meta:
            self._meta[key] = self._slice(key, lambda s: (tuple(s.get_shape()), str(s.get_dtype())))
        return self._meta[key]

    def keys(self) -> list[str]:
        return list(self._files)

    def shape(self, key: str) -> tuple[int, ...]:
        return self._info(key)[0]

    def dtype(self, key: str) -> str:
        st = self._info(key)[1]
        return _SAFETENSORS_DTYPES.get(st, st.lower())

    def read(self, key: str) -> np.ndarray:
        return self._slice(key, lambda s: np.asarray(s[:]).astype(np.float32))

    def rows(self, key: str, index: int) -> np.ndarray:
        return self._slice(key, lambda s: np.asarray(s[index : index + 1]).astype(np.float32)[0])


#: A parameter's reader: per-expert (``experts [n]`` → ``[n, ...]``) or whole (``None`` → the array).
Reader = Callable[..., np.ndarray]


class _Checked:
    """Records every key a block uses while checking its shape and dtype (nothing is read)."""

    def __init__(self, src: TensorSource):
        self.src, self.used, self.keys = src, set(), set(src.keys())

    def need(self, key: str, shape: tuple[int, ...]) -> str:
        if key not in self.keys:
            raise ValueError(f"moe_from_hf: state lacks {key!r} (expected shape {list(shape)})")
        got = self.src.shape(key)
        if tuple(got) != tuple(shape):
            raise ValueError(f"moe_from_hf: state[{key!r}] has shape {list(got)}, expected {list(shape)}")
        dt = self.src.dtype(key)
        if dt not in ("float64", "float32", "float16", "bfloat16"):
            raise ValueError(f"moe_from_hf: state[{key!r}] has dtype {dt}: a quantized or integer tensor; "
                             "dequantize the checkpoint to bf16 / fp32 first")  # fmt: skip
        self.used.add(key)
        return key


def block_readers(cfg: MoEConfig, fam: str, src: TensorSource) -> dict[str, tuple[bool, Reader]]:
    """``{param: (per_expert, reader)}`` for every parameter of ``cfg`` from the block's tensors in ``src``
    (see the module), after checking every tensor the block needs and that nothing is left over.

    Raises:
      ValueError: quantized tensors, a missing, misshapen, non-float or unexpected tensor (naming the key).
    """
    quantized = sorted(k for k in src.keys() if _QUANTIZED.search(k))
    if quantized:
        raise ValueError(f"moe_from_hf: quantized tensors {quantized[:4]} (FP8 / MXFP4): dequantize the checkpoint "
                         "to bf16 / fp32 first")  # fmt: skip
    H, F, E = cfg.hidden, cfg.ffn, cfg.experts
    c = _Checked(src)
    out: dict[str, tuple[bool, Reader]] = {}

    def whole(name, key, shape, fn=lambda a: a):
        k = c.need(key, shape)
        out[name] = (False, lambda: fn(src.read(k)))

    def stacked(name, fn):
        out[name] = (True, lambda experts: np.stack([fn(int(e)) for e in experts]))

    # Step 1: the router and its biases.
    whole("router", f"{'router' if fam == 'gpt_oss' else 'gate'}.weight", (E, H), lambda a: a.T)
    if cfg.router.bias:
        whole("router_bias", "router.bias", (E,))
    if cfg.router.score_bias:
        whole("score_bias", "gate.e_score_correction_bias", (E,))
    # Step 2: the routed experts, fused or per expert.
    if fam == "gpt_oss":
        gu, down = c.need("experts.gate_up_proj", (E, H, 2 * F)), c.need("experts.down_proj", (E, F, H))
        gub, db = c.need("experts.gate_up_proj_bias", (E, 2 * F)), c.need("experts.down_proj_bias", (E, H))
        stacked("w_gate", lambda e: src.rows(gu, e)[:, 0::2])
        stacked("w_up", lambda e: src.rows(gu, e)[:, 1::2])
        stacked("w_down", lambda e: src.rows(down, e))
        stacked("b_gate", lambda e: src.rows(gub, e)[0::2])
        stacked("b_up", lambda e: src.rows(gub, e)[1::2])
        stacked("b_down", lambda e: src.rows(db, e))
    elif "experts.gate_up_proj" in c.keys:
        gu, down = c.need("experts.gate_up_proj", (E, 2 * F, H)), c.need("experts.down_proj", (E, H, F))
        stacked("w_gate", lambda e: src.rows(gu, e)[:F].T)
        stacked("w_up", lambda e: src.rows(gu, e)[F:].T)
        stacked("w_down", lambda e: src.rows(down, e).T)
    else:
        g, u, d = ("w1", "w3", "w2") if fam == "mixtral" else ("gate_proj", "up_proj", "down_proj")
        for name, proj, shape in (("w_gate", g, (F, H)), ("w_up", u, (F, H)), ("w_down", d, (H, F))):
            keys = [c.need(f"experts.{i}.{proj}.weight", shape) for i in range(E)]
            stacked(name, lambda e, keys=keys: src.read(keys[e]).T)
    # Step 3: shared experts.
    if cfg.shared is not None:
        Fs, prefix = cfg.shared.width, "shared_expert" if fam == "qwen2_moe" else "shared_experts"
        whole("shared_w_gate", f"{prefix}.gate_proj.weight", (Fs, H), lambda a: a.T)
        whole("shared_w_up", f"{prefix}.up_proj.weight", (Fs, H), lambda a: a.T)
        whole("shared_w_down", f"{prefix}.down_proj.weight", (H, Fs), lambda a: a.T)
        if cfg.shared.gated:
            whole("shared_gate", "shared_expert_gate.weight", (1, H), lambda a: a[0])
    # Step 4: nothing left over.
    extra = sorted(c.keys - c.used)
    if extra:
        more = " …" if len(extra) > 8 else ""
        raise ValueError(f"moe_from_hf: unexpected tensors for a {fam} MoE block: {extra[:8]}{more}; give only "
                         "the block's tensors (keys relative to it)")  # fmt: skip
    return out
