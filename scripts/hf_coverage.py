"""Which model types of an installed transformers define a routed-expert (MoE) block, and what the layer does with
each: the coverage table of docs/hf.md.

Two steps, each in its own environment:

    # 1. scan transformers' models/ (any Python with transformers installed; reads source files, imports nothing)
    /tmp/hfvenv/bin/python scripts/hf_coverage.py scan         # → tests/fixtures/hf_coverage.json
    # 2. render the table with the layer's measured errors on the fixtures (the project's .venv)
    .venv/bin/python scripts/hf_coverage.py render             # → docs/hf.md (between its coverage markers)

The scan lists every directory of ``transformers/models/`` whose modeling file assigns ``self.experts`` (a block of
routed experts) and every ``model_type`` its configuration files declare, leaving out the vision / audio / speech
towers' own configs. Each listed type is then either handled (`tempo_jax.hf.FAMILIES`: tested against
transformers' block on a fixture, or an alias of a tested family) or refused (`tempo_jax.hf.REFUSED`: the mechanism
the layer lacks, named in the error `moe_from_hf` raises). `tests/test_hf_coverage.py` fails when a listed type is
neither.
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
#: a modeling file defines routed experts when it assigns them (``self.experts = ...``)
EXPERTS = re.compile(r"^\s+self\.experts\s*=", re.M)
MODEL_TYPE = re.compile(r'^\s+model_type\s*=\s*"([a-z0-9_]+)"', re.M)
#: config classes of towers that hold no text MoE block (their parent type is listed instead)
TOWER = re.compile(r"_(vision|audio|video|speech)(_model|_encoder|_tower)?$|_encoder$|_code_predictor$")


def scan(models: Path) -> dict:
    """``{directory: {"model_types": [...], "modeling": [files that assign self.experts]}}`` of ``models``."""
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
    return out


def cmd_scan(args) -> None:
    import transformers  # noqa: PLC0415 (the scanning environment's own)

    models = Path(transformers.__file__).parent / "models"
    found = scan(models)
    SCAN.write_text(
        json.dumps({"transformers": transformers.__version__, "directories": found}, indent=1, sort_keys=True) + "\n"
    )
    n = sum(len(v["model_types"]) for v in found.values())
    print(f"transformers {transformers.__version__}: {len(found)} directories with routed experts, {n} model types")


def cmd_render(args) -> None:
    sys.path.insert(0, str(ROOT))
    from tempo_jax.layer.hf.coverage import coverage_rows, render_table  # noqa: PLC0415

    data = json.loads(SCAN.read_text())
    rows = coverage_rows(data, measure=not args.no_measure)
    table = render_table(rows, data["transformers"])
    text = DOC.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{DOC} lacks the markers {BEGIN} / {END}")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    DOC.write_text(f"{head}{BEGIN}\n{table}\n{END}{tail}")
    handled = sum(r.status == "handled" for r in rows)
    print(f"{len(rows)} model types: {handled} handled, {len(rows) - handled} refused → {DOC}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("scan", help="scan the installed transformers → tests/fixtures/hf_coverage.json")
    r = sub.add_parser("render", help="render docs/hf.md's coverage table (measures every fixture's error)")
    r.add_argument("--no-measure", action="store_true", help="leave the error column as it was measured last")
    args = ap.parse_args()
    {"scan": cmd_scan, "render": cmd_render}[args.cmd](args)


if __name__ == "__main__":
    main()
