"""FP8 experts against transformers (issue 55, item 2): the layer loaded from the HF fixtures in float32, bf16 and
FP8 experts (``expert_dtype="fp8_block"``: quantized on load, 128 × 128 blocks; and, where tokamax is installed,
the same FP8 experts through ``gmm_impl="tokamax"``, which takes them as stored), on 8 fake CPU devices, each output
against what transformers 5.24 computed in float32 (`tests/fixtures/hf/<family>/`), and the expert bytes device 0
holds.

    python scripts/fp8_accuracy.py                      # writes results/fp8_accuracy.json
    .venv-latest/bin/python scripts/fp8_accuracy.py --out results/fp8_accuracy_tokamax.json   # + tokamax
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from pallas_kernels import fp8_path, tokamax_backend  # noqa: E402
from tempo_jax.hf import load_moe_layers  # noqa: E402
from tempo_jax.layer import fp8, make_ep_mesh, moe_forward  # noqa: E402
from tempo_jax.layer import tables as dispatch_tables  # noqa: E402
from tempo_jax.layer.params import EXPERT_KEYS  # noqa: E402
from tempo_jax.text import table  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "hf"
FAMILIES = ("deepseek_v3", "glm4_moe", "mixtral", "qwen3_moe")
VARIANTS = {"float32": {}, "bf16": {"dtype": jnp.bfloat16}, "fp8": {"dtype": jnp.bfloat16, "expert_dtype": "fp8_block"}}
if tokamax_backend.available():  # tokamax takes whole blocks: 8 × 8 ones fit these fixtures (H 16, F 8)
    VARIANTS["fp8 8x8"] = {**VARIANTS["fp8"], "fp8_block": (8, 8)}
    VARIANTS["fp8 8x8 tokamax"] = {**VARIANTS["fp8 8x8"], "gmm_impl": "tokamax"}


def _device_bytes(params: dict) -> int:
    """Bytes of the expert arrays (weights and FP8 scales) device 0 holds."""
    dev = jax.devices()[0]
    return sum(
        s.data.nbytes for k in EXPERT_KEYS if k in params for s in params[k].addressable_shards if s.device == dev
    )


def _gemm_path(cfg, params: dict) -> str:
    """How the grouped GEMM ran the experts: their dtype, or FP8 "fp8" (read by the kernel) / "dequantize"."""
    if cfg.expert_dtype is None:
        return jnp.dtype(cfg.dtype).name
    shape, block = params["w_gate"].shape, fp8.layer_block(cfg.fp8_block)
    return fp8_path(cfg.gmm_impl, dtype=cfg.dtype, shape=shape, block=block)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="results/fp8_accuracy.json", help="JSON output")
    args = ap.parse_args()
    mesh = make_ep_mesh(8)
    rows = []
    for fam in FAMILIES:
        z = np.load(ROOT / fam / "block.npz")
        layer = int(z["layer"])
        x, want = jnp.asarray(z["x"], jnp.float32), np.asarray(z["out"], np.float64)
        for label, kw in VARIANTS.items():
            cfg, params, placement = load_moe_layers(ROOT / fam / "hub", layers=[layer], mesh=mesh, **kw)[layer]
            out = moe_forward(
                params,
                x,
                mesh=mesh,
                placement_arrays=dispatch_tables.placement_arrays(placement),
                tables=dispatch_tables.uniform(placement),
                config=cfg,
                key=jax.random.key(0),
            ).out
            got = np.asarray(out, np.float64)
            rel = float(np.abs(got - want).max() / np.abs(want).max())  # max |Δ| / max |out|, as the HF tests
            row = {"family": fam, "experts": label, "rel_error": rel, "expert_bytes_device0": _device_bytes(params)}
            rows.append(row | {"gemm": _gemm_path(cfg, params)})
    print(
        table(
            [[r["family"], r["experts"], r["gemm"], f"{r['rel_error']:.2e}", r["expert_bytes_device0"]] for r in rows],
            ["family", "experts", "GEMM", "max |Δ| / max |out| vs transformers (float32)", "expert bytes on device 0"],
        )
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"rows": rows, "jax": jax.__version__}, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
