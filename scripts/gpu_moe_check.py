"""GPU check of the MoE layer: the ragged_all_to_all exchange and the Pallas kernels against the padded/XLA
path and the dense reference, on every visible GPU. Writes results/gpu/moe_check.json. (Part of gpu_check.sh.)"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from solvers import Placement
from tempo_jax import tables as T
from tempo_jax.moe import MoEConfig, init_params, make_ep_mesh, moe_forward, moe_reference


def main() -> int:
    D = jax.device_count()
    E = 16
    placement = Placement.from_eplb(np.arange(E) + 1.0, 4 * D if 4 * D >= E else E, D)
    S = placement.slots_per_gpu
    x = jax.random.normal(jax.random.key(2), (D * 256, 128))
    mesh = make_ep_mesh(D)
    pa, tables = T.placement_arrays(placement), T.perturbed(T.uniform(placement), seed=1)
    out = {}
    for exchange in ("padded", "ragged"):
        for gmm_impl in ("ragged_dot", "pallas"):
            cfg = MoEConfig(hidden=128, ffn=64, experts=E, top_k=2, slots_per_device=S, exchange=exchange,
                            gmm_impl=gmm_impl)  # fmt: skip
            params = init_params(jax.random.key(1), cfg)
            y, _, aux = jax.jit(lambda p, x, c=cfg: moe_forward(p, x, mesh=mesh, placement_arrays=pa, tables=tables,
                                                                  config=c))(params, x)  # fmt: skip
            ref = moe_reference(params, x, cfg)
            err = float(jnp.abs(y - ref).max())
            out[f"{exchange}/{gmm_impl}"] = dict(max_abs_err=err, drops=int(aux["drops"].sum()))
            print(f"{exchange:7s} {gmm_impl:10s} max |y − dense| = {err:.2e}", flush=True)
    Path("results/gpu").mkdir(parents=True, exist_ok=True)
    Path("results/gpu/moe_check.json").write_text(json.dumps(dict(devices=D, results=out), indent=1))
    ok = all(v["max_abs_err"] < 2e-2 and v["drops"] == 0 for v in out.values())  # TF32 dots on GPU
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
