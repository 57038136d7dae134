"""The README and docs/ pages: their Python examples run as written, the results tables are what the committed
JSON renders, and the README's layout table names the rooms of the tree."""

import ast
import json
import re
from pathlib import Path

import numpy as np
import pytest
from hf_reference import FAMILY_CONFIGS, hf_state
from numeric import assert_close
from safetensors.numpy import save_file

from tempo_jax.repro.docs import BLOCKS, PAGE, results_block

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]


def _python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), re.S)


def test_readme_is_short():
    assert len(README.read_text().splitlines()) <= 200, "README.md is the five-minute read; move detail to docs/"


def _tiny_deepseek_v3_checkpoint(folder: Path) -> Path:
    """A DeepSeek-V3-architecture checkpoint with tiny dimensions (the docs' `checkpoint`)."""
    config = FAMILY_CONFIGS["deepseek_v3"]
    tensors = {
        f"model.layers.{layer}.mlp.{k}": v.astype("float32")
        for layer in range(config["first_k_dense_replace"], config["num_hidden_layers"])
        for k, v in hf_state("deepseek_v3", config, seed=layer).items()
    }
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.one_env
@pytest.mark.parametrize("path", [p for p in PAGES if _python_blocks(p)], ids=lambda p: p.name)
def test_python_blocks_run(path, tmp_path):
    scope: dict = {"checkpoint": _tiny_deepseek_v3_checkpoint(tmp_path)}
    for block in _python_blocks(path):
        exec(compile(block, str(path.name), "exec"), scope)  # noqa: S102
    if path.name == "README.md":
        assert scope["d"].makespan == 60.0 and scope["y"].shape == (4, 64, 512)
    if path.name == "model.md":
        losses = scope["losses"]
        assert len(losses) == 6 and losses[5] < losses[4] < losses[0]  # trains, and on from the restored state
        real = int(np.asarray(scope["mask"])[:, :-1].sum())  # the metrics record counts real tokens, K = 2 each
        assert all(layer["pairs"] == 2 * real for layer in scope["record"]["layers"])
    if path.name == "solvers.md":
        assert scope["d"].makespan == 60.0
    if path.name == "hf.md":
        assert scope["y"].shape == (64, 16) and sorted(scope["layers"]) == [1, 2]
    if path.name == "meshes.md":
        outs = list(scope["outs"].values())
        assert len(outs) == 3 and all(np.isfinite(scope["losses"]))
        for out in outs[1:]:
            assert_close(out, outs[0])  # the same function on (8,), (2, 4) and (4, 2) ep × tensor
    if path.name == "layer.md":
        assert_close(scope["out"].out, scope["sync"].out)  # CascadeEP keeps the output (another program: to tolerance)
        assert scope["schedule"].groups == ((0, 2, 1, 7), (4, 3, 5, 6))
        assert {f.donor for f in scope["cascade"].fetches} == {6} and len(scope["cascade"].fetches) == 6


def test_results_tables_are_rendered_from_committed_json():
    text = PAGE.read_text()
    for k, (begin, end, _) in enumerate(BLOCKS):
        assert begin in text and end in text, f"{PAGE.name} lost its generated results block {begin!r}"
        committed = text[text.index(begin) : text.index(end) + len(end)]
        assert committed == results_block(block=k), (
            f"{PAGE.name}'s results table is stale: run `python -m tempo_jax reproduce --docs`"
        )


def test_readme_layout_table_matches_the_tree():
    text = README.read_text()
    table = text[text.index("## Layout") : text.index("## Glossary")]
    named = set(re.findall(r"^\| `([^`]+)` \|", table, re.M))
    rooms = {
        f"{p.name}/"
        for p in ROOT.iterdir()
        if p.is_dir()
        and not p.name.startswith(".")
        and p.name in {"solvers", "pallas_kernels", "scripts", "notebooks", "docs", "tests"}
    }
    rooms |= {f"tempo_jax/{p.name}/" for p in (ROOT / "tempo_jax").iterdir() if (p / "__init__.py").exists()}
    rooms |= {f"tempo_jax/{p.name}" for p in (ROOT / "tempo_jax").glob("*.py") if not p.name.startswith("__")}
    assert named == rooms, f"README layout table vs the tree: missing {rooms - named}, stale {named - rooms}"
    for path in (p for p in named if p.startswith("tempo_jax/") and p.endswith("/")):  # modules a room row names
        row = next(line for line in table.splitlines() if line.startswith(f"| `{path}` |")).split("|")[2]
        modules = set(re.findall(r"`([a-z_][a-z0-9_]*)`", re.sub(r"\([^)]*\)", "", row)))
        for module in modules:
            found = (ROOT / path / f"{module}.py").exists() or (ROOT / path / module / "__init__.py").exists()
            assert found, f"README layout: {path} has no module {module!r}"
        # The rows that list their modules list them all.
        if path in ("tempo_jax/layer/", "tempo_jax/runtime/", "tempo_jax/sim/"):
            present = {p.stem for p in (ROOT / path).glob("*.py") if not p.name.startswith("__")}
            present |= {p.parent.name for p in (ROOT / path).glob("*/__init__.py")}  # sub-packages
            assert present <= modules, f"README layout: the {path} row leaves out {sorted(present - modules)}"


def test_links_resolve():
    """Every relative link of the README and docs/ resolves, inside the repo (a user's clone has no ../shared)."""
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.name} links to missing {target}"
            assert (page.parent / target).resolve().is_relative_to(ROOT), f"{page.name} links outside: {target}"


def _house_letters() -> set[str]:
    """The letters of docs/architecture.md's glossary table (first and third columns)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    table = text[text.index("## Glossary") :].split("\n\n")[2]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()[2:]]
    return {row[i] for row in rows for i in (0, 2)}


def _glossary_symbols(doc: str) -> list[str] | None:
    """The symbols a ``Glossary additions: a …, b …`` paragraph defines (None: the paragraph has another form)."""
    para = " ".join(doc[doc.index("Glossary") :].split("\n\n")[0].split())
    if not para.startswith("Glossary additions: "):
        return None
    body, depth, items, cur = para[len("Glossary additions: ") :], 0, [], ""
    for i, ch in enumerate(body):
        depth += ch in "([{"
        depth -= ch in ")]}"
        if depth == 0 and ch == "." and (i + 1 == len(body) or body[i + 1] == " "):
            break
        if depth == 0 and ch in ",;":
            items, cur = items + [cur], ""
        else:
            cur += ch
    return [item.split()[0] for item in items + [cur] if item.strip()]


def test_one_glossary_modules_list_only_their_additions():
    house = _house_letters()
    assert {"T", "D", "E", "K", "R", "C", "G_g", "Nn"} <= house, house
    bad = {}
    for pkg in ("solvers", "pallas_kernels", "tempo_jax"):
        for f in sorted((ROOT / pkg).rglob("*.py")):
            doc = ast.get_docstring(ast.parse(f.read_text())) or ""
            if "Glossary" not in doc:
                continue
            symbols = _glossary_symbols(doc)
            if symbols is None or set(symbols) & house:
                bad[str(f.relative_to(ROOT))] = symbols
    assert not bad, f"module glossaries that restate or reuse the house's letters (docs/architecture.md): {bad}"


def test_glossary_symbols_are_read():
    assert _glossary_symbols("x\n\nGlossary additions: nb batches, s Zipf skew (a; b), B tokens. numpy.") == [
        "nb",
        "s",
        "B",
    ]
    assert _glossary_symbols("Glossary: T tokens.") is None
