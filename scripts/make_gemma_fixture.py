"""Write the Gemma 4 fixture of Google's own JAX library, ``gemma`` (`tests/fixtures/gemma/moe.npz`): its MoE module
(``gemma.gm.nn.gemma4._moe.MoE``) run on fixed weights, with its outputs and gradients, so that both test
environments compare the layer with it without installing it.

The library's Gemma 4 code is not on PyPI (its newest release there, 3.3.0, predates Gemma 4, and the full package
pulls TensorFlow and Kauldron), so the script runs the MoE module from a source tree of google-deepmind/gemma
(``--gemma-src``, a clone or export holding ``gemma/gm/nn/gemma4/_moe.py`` and ``_layers.py``), imported as the
package's own modules, in any Python with jax and flax:

    python -m venv /tmp/gemmavenv && /tmp/gemmavenv/bin/pip install jax flax
    /tmp/gemmavenv/bin/python scripts/make_gemma_fixture.py --gemma-src /path/to/gemma [--commit SHA]

``moe.npz`` (float64 weights; the module routes in float32, as it does on device): ``x [T, H]`` (the experts'
input), ``router_x [T, H]`` (the un-normalised input its router reads), ``cot [T, H]``, ``out`` = the module's
output, ``grad_x``, ``grad_router_x`` and ``grad/<param>`` = the gradients of ``sum(out · cot)``, and
``param/<name>`` the module's parameters in its own layout: ``router_logits [H, E]``, ``gating_einsum
[E, 2, F, H]`` (gate, then up), ``linear [E, F, H]``, ``router_scale [H]``, ``per_expert_scale [E]``;
``meta.json`` records the source commit and versions.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import types
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "gemma"
H, F, E, K, T = 16, 8, 8, 2, 24


def _load_moe(src: Path):
    """``gemma.gm.nn.gemma4._moe`` from ``src``, importing only it and its ``_layers`` (not the package's heavy
    ``__init__`` chain)."""
    base = src / "gemma" / "gm" / "nn" / "gemma4"
    for name in ("gemma", "gemma.gm", "gemma.gm.nn", "gemma.gm.nn.gemma4"):
        pkg = types.ModuleType(name)
        pkg.__path__ = []  # a namespace: the two modules below are its only members
        sys.modules[name] = pkg
    mods = {}
    for name in ("_layers", "_moe"):
        spec = importlib.util.spec_from_file_location(f"gemma.gm.nn.gemma4.{name}", base / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        setattr(sys.modules["gemma.gm.nn.gemma4"], name, mod)
        spec.loader.exec_module(mod)
        mods[name] = mod
    return mods["_moe"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gemma-src", type=Path, required=True, help="a source tree of google-deepmind/gemma")
    ap.add_argument("--commit", default="", help="the source tree's commit, recorded in meta.json")
    args = ap.parse_args()

    import flax  # noqa: PLC0415
    import jax  # noqa: PLC0415

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp  # noqa: PLC0415

    moe_mod = _load_moe(args.gemma_src)
    moe = moe_mod.MoE(features=H, hidden_dim=F, num_experts=E, num_experts_per_datapoint=K)
    rng = np.random.default_rng(4)
    x = rng.normal(size=(1, T, H)) * 1.5
    router_x = rng.normal(size=(1, T, H)) * 3.0
    cot = rng.normal(size=(1, T, H))
    params = {
        "router_logits": {"w": rng.normal(size=(H, E)) * 0.6},
        "gating_einsum": {"w": rng.normal(size=(E, 2, F, H)) * 0.3},
        "linear": {"w": rng.normal(size=(E, F, H)) * 0.3},
        "router_scale": rng.normal(size=(H,)) * 0.5 + 1.0,
        "per_expert_scale": rng.normal(size=(E,)) * 0.3 + 1.0,
    }
    # the module's own init: the parameter tree it expects, which the fixed weights must match
    shapes = jax.tree.map(jnp.shape, moe.init(jax.random.key(0), jnp.asarray(x), jnp.asarray(router_x))["params"])
    mine = jax.tree.map(jnp.shape, params)
    if shapes != mine:
        raise SystemExit(f"the module's parameters {shapes} differ from the fixture's {mine}")

    def loss(p, x, rx):
        out = moe.apply({"params": p}, x, rx)
        return jnp.sum(out * cot), out

    p = jax.tree.map(jnp.asarray, params)
    (_, out), (gp, gx, grx) = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(
        p, jnp.asarray(x), jnp.asarray(router_x)
    )
    flat = lambda tree: {k: np.asarray(v["w"] if isinstance(v, dict) else v) for k, v in tree.items()}  # noqa: E731
    arrays = {
        "x": x[0],
        "router_x": router_x[0],
        "cot": cot[0],
        "out": np.asarray(out)[0],
        "grad_x": np.asarray(gx)[0],
        "grad_router_x": np.asarray(grx)[0],
        "top_k": np.array(K),
        **{f"param/{k}": v for k, v in flat(params).items()},
        **{f"grad/{k}": v for k, v in flat(gp).items()},
    }
    OUT.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT / "moe.npz", **arrays)
    meta = {
        "library": "google-deepmind/gemma",
        "module": "gemma.gm.nn.gemma4._moe.MoE",
        "commit": args.commit,
        "jax": jax.__version__,
        "flax": flax.__version__,
        "shape": {"H": H, "F": F, "E": E, "K": K, "T": T},
    }
    (OUT / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"gemma MoE: |out| {np.abs(arrays['out']).max():.3f}, {len(arrays)} arrays → {OUT}")


if __name__ == "__main__":
    main()
