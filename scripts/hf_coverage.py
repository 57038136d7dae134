"""Which model types of an installed transformers define a routed-expert (MoE) block, and what the layer does with
each: the coverage table of docs/hf.md.

Two steps, each in its own environment:

    # 1. scan transformers' models/ (any Python with transformers installed; reads source files, imports nothing)
    /tmp/hfvenv/bin/python scripts/hf_coverage.py scan         # → tests/fixtures/hf_coverage.json
    # 2. render the table with the layer's measured errors on the fixtures (the project's .venv)
    .venv/bin/python scripts/hf_coverage.py render             # → docs/hf.md (between its coverage markers)

The scan lists every directory of ``transformers/models/`` whose modeling file assigns ``self.experts`` (a block of
routed experts) and every ``model_type`` its configuration files declare, leaving out the vision / audio / speech
towers' own configs; and the types that have no modeling file but borrow a MoE model's classes through transformers'
auto mapping (Sarvam-MoE is ``Glm4MoeForCausalLM``). Each listed type is then either handled
(`tempo_jax.hf.FAMILIES`: tested against transformers' block on a fixture, or through its twin's) or refused
(`tempo_jax.hf.REFUSED`: the mechanism the layer lacks, named in the error `moe_from_hf` raises).
`tests/test_hf_coverage.py` fails when a listed type is neither.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCAN = ROOT / "tests" / "fixtures" / "hf_coverage.json"
DOC = ROOT / "docs" / "hf.md"
BEGIN, END = "<!-- coverage table: begin -->", "<!-- coverage table: end -->"
#: the fixtures' x is one sequence of this many tokens (Switch Transformers' capacity counts per sequence)
SEQUENCE = 24
#: a modeling file defines routed experts when it assigns them (``self.experts = ...``)
EXPERTS = re.compile(r"^\s+self\.experts\s*=", re.M)
MODEL_TYPE = re.compile(r'^\s+model_type\s*=\s*"([a-z0-9_-]+)"', re.M)
#: config classes of towers that hold no text MoE block (their parent type is listed instead)
TOWER = re.compile(r"_(vision|audio|video|speech)(_model|_encoder|_tower)?$|_encoder$|_code_predictor$")


#: an auto-class mapping entry: ``("model_type", "ClassName")``
AUTO_ENTRY = re.compile(r'^\s+\("([a-z0-9_-]+)", "(\w+)"\)', re.M)


def _borrowed(models: Path, found: dict) -> dict:
    """Model types with no modeling file of their own whose auto classes are a MoE directory's (Sarvam-MoE is
    transformers' Glm4MoeForCausalLM under its own config): ``{directory: {"model_types", "modeling"}}``."""
    owner = {}
    for d in found:
        for f in (models / d).glob("modeling_*.py"):
            for cls in re.findall(r"^class (\w+)\(", f.read_text(encoding="utf-8"), re.M):
                owner.setdefault(cls, f"{d}/{f.name}")
    out = {}
    for mt, cls in AUTO_ENTRY.findall((models / "auto" / "modeling_auto.py").read_text(encoding="utf-8")):
        d = models / mt
        if cls in owner and mt not in found and d.is_dir() and not any(d.glob("modeling_*.py")):
            out.setdefault(mt, {"model_types": [mt], "modeling": [f"{owner[cls]} (auto class {cls})"]})
    return out


def scan(models: Path) -> dict:
    """``{directory: {"model_types": [...], "modeling": [files that assign self.experts]}}`` of ``models``; a
    directory without a modeling file of its own counts through the MoE class its auto mapping names."""
    out = {}
    dirs = {p.name for p in models.iterdir() if p.is_dir()}
    for d in sorted(p for p in models.iterdir() if p.is_dir()):
        hits = sorted(f.name for f in d.glob("modeling_*.py") if EXPERTS.search(f.read_text(encoding="utf-8")))
        if not hits:
            continue
        types = set()
        for f in d.glob("configuration_*.py"):
            types |= set(MODEL_TYPE.findall(f.read_text(encoding="utf-8")))
        # a tower's own config, or another model's config imported for its tower (Mistral Large 4's pixtral)
        types = sorted(t for t in types if not TOWER.search(t) and (t == d.name or t not in dirs))
        out[d.name] = {"model_types": types or [d.name], "modeling": hits}
    return dict(sorted({**out, **_borrowed(models, out)}.items()))


def cmd_scan(args) -> None:
    import transformers  # noqa: PLC0415 (the scanning environment's own)

    models = Path(transformers.__file__).parent / "models"
    found = scan(models)
    SCAN.write_text(
        json.dumps({"transformers": transformers.__version__, "directories": found}, indent=1, sort_keys=True) + "\n"
    )
    n = sum(len(v["model_types"]) for v in found.values())
    print(f"transformers {transformers.__version__}: {len(found)} directories with routed experts, {n} model types")


FIXTURES = ROOT / "tests" / "fixtures" / "hf"


def model_types(data: dict) -> list[str]:
    """Every MoE model type of a scan, sorted."""
    return sorted({t for d in data["directories"].values() for t in d["model_types"]})


def tested_through(mt: str) -> str | None:
    """The fixture a handled type is tested through: its own, or its twin's (`Family.twin`, or its text /
    multimodal counterpart: the same block under a nested or flat config; `tests/test_hf_coverage.py` reads it
    under both)."""
    from tempo_jax.layer.hf import FAMILIES  # noqa: PLC0415

    twin = FAMILIES[mt].twin if mt in FAMILIES else None
    for name in (mt, twin, f"{mt}_text", mt.removesuffix("_text")):
        if name is None:
            continue
        if (FIXTURES / name / "block.npz").exists():
            return name
    return None


def _activation(name: str, limit, gate_cap, up_cap) -> str:
    """An expert activation in words (its clamp or soft caps with it)."""
    words = {
        "swiglu": "SwiGLU",
        "swiglu_clamp": "SwiGLU",
        "geglu_tanh": "GeGLU (tanh)",
        "geglu": "GeGLU",
        "gpt_oss": "gpt-oss",
        "swiglu_post_clamp": "SwiGLU",
        "swiglu_softcap": "SwiGLU",
        "relu": "plain ReLU",
        "relu2": "plain ReLU²",
        "gelu": "plain GELU",
        "gelu_tanh": "plain GELU (tanh)",
        "silu": "plain SiLU",
    }[name]
    if name == "swiglu_post_clamp":
        return f"{words} clamped after the activation at {limit:g}"
    if name == "swiglu_softcap":
        return f"{words} soft-capped at {gate_cap:g} / {up_cap:g}"
    return words + (f" clamped at {limit:g}" if limit is not None else "")


def describe(cfg) -> tuple[str, str, str]:
    """(router, experts, shared experts) of a `MoEConfig`, in words."""
    r = cfg.router
    words = {"softmax_topk": "softmax over the top-k logits", "sqrt_softplus": "sqrt(softplus)"}
    router = [words.get(r.scoring, r.scoring)]
    if r.input_norm:
        router.insert(0, "own RMS-normed, scaled input")
    elif r.input_multiplier != 1:
        router.insert(0, f"input × {r.input_multiplier:.3g}")
    if r.mlp_width:
        carried = ", adds the previous layer's router state" if r.carried_state else ""
        router.insert(0, f"router MLP (width {r.mlp_width}{carried})")
    if r.bias:
        router.append("router bias")
    if r.score_bias:
        router.append("selection bias" + (" on the logits" if r.bias_on == "logits" else ""))
    if r.n_group > 1:
        router.append(f"groups {r.n_group} / {r.topk_group} ({r.group_score})")
    if r.renormalize:
        router.append("renormalised" + (f" (+{r.renorm_eps:g})" if r.renorm_eps else ""))
    if r.expert_scale:
        router.append("× per-expert scale")
    if r.shared_rows:
        router.append(f"{r.shared_rows} shared-expert rows normalised with the top-k")
    if r.gain:
        router.append("× learned gain")
    if r.expert_sets > 1:
        router.append(f"{r.expert_sets} expert sets, each token within its own")
    if r.expert_capacity is not None:
        router.append(f"at most {r.expert_capacity} tokens per expert per sequence")
    if r.scaling != 1:
        router.append(f"× {r.scaling:g}")
    if r.weight_on == "input":
        router.append("weights the expert's input")
    e = cfg.expert
    experts = _activation(e.activation, e.limit, e.gate_cap, e.up_cap)
    if e.bias:
        experts += ", biases"
    if cfg.latent is not None:
        experts += f" at latent width {cfg.latent.width}" + (" (normed)" if cfg.latent.norm else "")
    if cfg.expert.out_norm_eps is not None:
        experts += ", outputs RMS-normed"
    if cfg.zero_experts:
        experts += f" + {cfg.zero_experts} zero-computation ({cfg.zero_expert_output})"
    out = cfg.output
    experts += "; block output + bias" if out.bias else ""
    experts += "; block output RMS-normed" if out.norm else ""
    sh = cfg.shared
    shared = "—"
    if sh is not None:
        shared = f"{sh.count} × {sh.ffn}" + (", sigmoid-gated" if sh.gated else "")
        shared += ", router-weighted" if r.shared_rows else ""
        if sh.activation != "swiglu" or sh.limit is not None:
            shared += ", " + _activation(sh.activation, sh.limit, sh.gate_cap, sh.up_cap)
        shared += f", × {sh.scale:g}" if sh.scale != 1 else ""
    return ", ".join(router), experts, shared


def measure(name: str) -> tuple[float, float]:
    """The layer's largest relative error against transformers' block on fixture ``name``: forward (over every saved
    layout) and gradients (input and every parameter), as `tests/test_hf_import.py` computes them."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    from tempo_jax.layer.hf import load_moe_layers  # noqa: PLC0415
    from tempo_jax.layer.hf.families import family  # noqa: PLC0415
    from tempo_jax.layer.hf.tensors import MemorySource, block_readers  # noqa: PLC0415
    from tempo_jax.layer.moe import moe_reference  # noqa: PLC0415
    from tempo_jax.layer.params import to_logical  # noqa: PLC0415

    def rel(a, b):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))

    z = np.load(FIXTURES / name / "block.npz")
    layer = int(z["layer"])
    rx = jnp.asarray(z["router_x"], jnp.float32) if "router_x" in z.files else None
    sets = {"expert_set": jnp.asarray(z["expert_set"])} if "expert_set" in z.files else {}
    if "router_state" in z.files:  # the previous layer's router state (Zaya)
        sets["router_state"] = jnp.asarray(z["router_state"], jnp.float32)
    x, cot = jnp.asarray(z["x"], jnp.float32), jnp.asarray(z["cot"], jnp.float32)
    fwd = 0.0
    for layout in ("hub", "fused"):
        if (FIXTURES / name / layout).exists():
            blocks = load_moe_layers(FIXTURES / name / layout, layers=[layer], sequence_length=SEQUENCE)
            cfg, params, placement = blocks[layer]
            logical = to_logical(params, placement)
            fwd = max(fwd, rel(moe_reference(logical, x, cfg, router_x=rx, **sets), z["out"]))
    cfg, params, placement = load_moe_layers(FIXTURES / name / "hub", layers=[layer], sequence_length=SEQUENCE)[layer]
    logical = to_logical(params, placement)
    gp, gx = jax.grad(lambda p, x: jnp.sum(moe_reference(p, x, cfg, router_x=rx, **sets) * cot), argnums=(0, 1))(
        logical, x
    )
    state = {k[5:]: z[k] for k in z.files if k.startswith("grad/")}
    state |= {k[7:]: np.zeros_like(z[k]) for k in z.files if k.startswith("buffer/")}
    state |= {k[6:]: np.zeros_like(z[k]) for k in z.files if k.startswith("param/") and "grad/" + k[6:] not in z}
    state = {k.removeprefix("block_sparse_moe."): v for k, v in state.items()}
    mt, fam, _ = family(json.loads((FIXTURES / name / "hub" / "config.json").read_text()))
    readers = block_readers(cfg, fam.names, MemorySource(state), mt)
    want = {k: (read(np.arange(cfg.experts)) if per else read()) for k, (per, read) in readers.items()}
    scale = max(float(np.abs(v).max()) for v in want.values())
    grad = rel(gx, z["grad_x"])
    for k, v in want.items():
        if k != "score_bias":
            grad = max(grad, float(np.abs(np.asarray(gp[k], np.float64) - v).max()) / scale)
    return fwd, grad


def render_table(data: dict, errors: dict[str, tuple[float, float]]) -> str:
    """docs/hf.md's coverage table: every scanned model type, handled (router, experts, shared experts, the
    transformers version its fixture was written with, its errors) or refused (the mechanism)."""
    from tempo_jax.layer.hf import FAMILIES, REFUSED, load_moe_layers  # noqa: PLC0415

    lines = [
        "| model_type | status | router | experts | shared experts | reference | forward / gradient error |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for mt in model_types(data):
        if mt in FAMILIES:
            name = tested_through(mt)
            if name is None:
                raise SystemExit(f"{mt}: handled but no fixture tests it")
            meta = json.loads((FIXTURES / name / "meta.json").read_text())
            layer = int(meta["layer"])
            cfg = load_moe_layers(FIXTURES / name / "hub", layers=[layer], sequence_length=SEQUENCE)[layer].config
            router, experts, shared = describe(cfg)
            ref = f"transformers {meta['transformers']}" + ("" if name == mt else f", as `{name}`")
            if "corrected" in meta:  # recorded with one transformers bug corrected (scripts/make_hf_fixtures.py)
                ref += f" with `{meta['corrected']}` corrected"
            fwd, grad = errors[name]
            lines.append(f"| `{mt}` | handled | {router} | {experts} | {shared} | {ref} | {fwd:.1e} / {grad:.1e} |")
        elif mt in REFUSED:
            lines.append(f"| `{mt}` | refused | {REFUSED[mt]} | | | | |")
        else:
            raise SystemExit(f"{mt}: neither handled (FAMILIES) nor refused (REFUSED)")
    return "\n".join(lines)


def cmd_render(args) -> None:
    sys.path.insert(0, str(ROOT))
    data = json.loads(SCAN.read_text())
    names = sorted({n for n in map(tested_through, model_types(data)) if n})
    errors = {n: measure(n) for n in names}
    table = render_table(data, errors)
    text = DOC.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{DOC} lacks the markers {BEGIN} / {END}")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    DOC.write_text(f"{head}{BEGIN}\n{table}\n{END}{tail}")
    handled = table.count("| handled |")
    print(f"{len(model_types(data))} model types: {handled} handled, {table.count('| refused |')} refused → {DOC}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("scan", help="scan the installed transformers → tests/fixtures/hf_coverage.json")
    sub.add_parser("render", help="render docs/hf.md's coverage table (measures every fixture's error)")
    args = ap.parse_args()
    {"scan": cmd_scan, "render": cmd_render}[args.cmd](args)


if __name__ == "__main__":
    main()
