"""The official checkpoints' quantized formats, dequantized on load (numpy + ml_dtypes, one tensor at a time), and a
safetensors reader that sees every dtype those files hold.

- **FP8 with block scales** (DeepSeek-V3 / V3.1 / V4, GLM): ``W.weight`` float8_e4m3fn ``[out, in]`` beside
  ``W.weight_scale_inv`` ``[⌈out/b0⌉, ⌈in/b1⌉]`` (b = ``quantization_config.weight_block_size``, 128 × 128): each
  block's values times its scale (float32; ``scale_fmt: ue8m0`` stores the exponent byte s, scale 2^(s − 127)).
- **MXFP4** (gpt-oss experts): ``*_blocks`` uint8 ``[..., G, 16]`` (two e2m1 values per byte, the low nibble first)
  and ``*_scales`` uint8 ``[..., G]`` (E8M0: 2^(s − 127) per group of 32 values) → ``[..., 32·G]``.

`SafetensorsFile` reads a shard's header and maps its tensors (``np.memmap``): shapes and dtypes without reading,
rows without reading the rest, and every dtype of these files (bf16 and the float8 formats through ml_dtypes,
which numpy lacks). A truncated file or a header that points past its end is an error naming the file.

Glossary additions: b0 × b1 scale block, G 32-value groups."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import ml_dtypes
import numpy as np

__all__ = ["FP4_E2M1", "SafetensorsFile", "dequant_fp8", "dequant_mxfp4", "e8m0"]

#: The e2m1 value of each 4-bit code (OCP MX: sign bit, two exponent bits, one mantissa bit).
FP4_E2M1 = np.array(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], np.float32
)

_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": ml_dtypes.bfloat16,
    "F8_E4M3": ml_dtypes.float8_e4m3fn,
    "F8_E5M2": ml_dtypes.float8_e5m2,
    "U8": np.uint8,
    "I8": np.int8,
    "I16": np.int16,
    "I32": np.int32,
    "I64": np.int64,
    "U16": np.uint16,
    "U32": np.uint32,
    "BOOL": np.bool_,
}
if hasattr(ml_dtypes, "float8_e8m0fnu"):
    _DTYPES["F8_E8M0"] = ml_dtypes.float8_e8m0fnu
_NAMES = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
    "uint8": "U8",
    "int8": "I8",
    "int16": "I16",
    "int32": "I32",
    "int64": "I64",
}


def e8m0(scale: np.ndarray) -> np.ndarray:
    """An E8M0 exponent byte (uint8, or ml_dtypes' float8_e8m0fnu) → the float32 scale 2^(s − 127)."""
    s = np.asarray(scale)
    if s.dtype != np.uint8:
        s = s.view(np.uint8)
    return np.ldexp(np.float32(1.0), s.astype(np.int32) - 127).astype(np.float32)


def dequant_fp8(weight: np.ndarray, scale: np.ndarray, block: tuple[int, int] = (128, 128)) -> np.ndarray:
    """``weight [..., out, in]`` (float8) × its block scales ``scale [..., ⌈out/b0⌉, ⌈in/b1⌉]`` (float32, or E8M0
    bytes) → float32 ``[..., out, in]``."""
    w = np.asarray(weight).astype(np.float32)
    s = np.asarray(scale)
    s = e8m0(s) if s.dtype in (np.uint8,) or s.dtype.name.startswith("float8_e8m0") else s.astype(np.float32)
    out, inn = w.shape[-2:]
    b0, b1 = block
    want = (-(-out // b0), -(-inn // b1))
    if s.shape[-2:] != want or s.shape[:-2] != w.shape[:-2]:
        raise ValueError(
            f"FP8 block scales of shape {list(s.shape)} do not cover a weight {list(w.shape)} in "
            f"{b0}×{b1} blocks (expected {list(w.shape[:-2]) + list(want)})"
        )
    full = np.repeat(np.repeat(s, b0, axis=-2), b1, axis=-1)[..., :out, :inn]
    return w * full


def dequant_mxfp4(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """MXFP4 ``blocks [..., G, 16]`` uint8 and ``scales [..., G]`` (E8M0 bytes) → float32 ``[..., 32·G]``: byte j of a
    group holds values 2j (low nibble) and 2j + 1 (high nibble), each times the group's 2^(s − 127)."""
    b = np.asarray(blocks)
    if b.dtype != np.uint8:
        b = b.view(np.uint8)
    if b.shape[-1] != 16 or np.shape(scales) != b.shape[:-1]:
        raise ValueError(
            f"MXFP4 blocks {list(b.shape)} and scales {list(np.shape(scales))}: expected [..., G, 16] and [..., G]"
        )
    vals = np.empty(b.shape[:-1] + (32,), np.float32)
    vals[..., 0::2] = FP4_E2M1[b & 0x0F]
    vals[..., 1::2] = FP4_E2M1[b >> 4]
    vals *= e8m0(scales)[..., None]
    return vals.reshape(b.shape[:-2] + (b.shape[-2] * 32,))


class SafetensorsFile:
    """One ``.safetensors`` shard, read through its header: ``names()``, ``info(name)`` → (shape, dtype name),
    ``array(name)`` → a read-only ``np.memmap`` view (nothing is read until it is indexed)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            size = self.path.stat().st_size
            with open(self.path, "rb") as f:
                head = f.read(8)
                if len(head) < 8:
                    raise ValueError("shorter than a header")
                (n,) = struct.unpack("<Q", head)
                if n > min(size - 8, 100 * 2**20):
                    raise ValueError(f"its header claims {n:,} bytes in a {size:,}-byte file")
                header = json.loads(f.read(n))
        except (OSError, ValueError, UnicodeDecodeError) as err:
            raise ValueError(f"{self.path}: not a readable safetensors file ({err})") from None
        if not isinstance(header, dict):
            raise ValueError(f"{self.path}: not a readable safetensors file (its header is not an object)")
        header.pop("__metadata__", None)
        self._base, self._tensors = 8 + n, {}
        for name, t in header.items():
            try:
                dtype, shape, (a, b) = t["dtype"], tuple(int(x) for x in t["shape"]), t["data_offsets"]
            except (KeyError, TypeError, ValueError):
                raise ValueError(f"{self.path}: tensor {name!r} has a malformed header entry {t!r}") from None
            if dtype not in _DTYPES:
                raise ValueError(f"{self.path}: tensor {name!r} has dtype {dtype}, which is not read here")
            if b - a != int(np.prod(shape, dtype=object)) * np.dtype(_DTYPES[dtype]).itemsize:
                raise ValueError(f"{self.path}: tensor {name!r}: {b - a} bytes for shape {list(shape)} of {dtype}")
            if self._base + b > size:
                raise ValueError(
                    f"{self.path}: truncated: tensor {name!r} ends at byte {self._base + b:,} of a {size:,}-byte file"
                )
            self._tensors[name] = (dtype, shape, a)

    def names(self) -> list[str]:
        return list(self._tensors)

    def info(self, name: str) -> tuple[tuple[int, ...], str]:
        dtype, shape, _ = self._tensors[name]
        return shape, np.dtype(_DTYPES[dtype]).name

    def array(self, name: str) -> np.ndarray:
        dtype, shape, a = self._tensors[name]
        if int(np.prod(shape, dtype=object)) == 0:
            return np.zeros(shape, _DTYPES[dtype])
        return np.memmap(self.path, dtype=_DTYPES[dtype], mode="r", offset=self._base + a, shape=shape)


def dtype_name(array: np.ndarray) -> str:
    """safetensors' name of a numpy dtype (for writing)."""
    return _NAMES[np.asarray(array).dtype.name]
