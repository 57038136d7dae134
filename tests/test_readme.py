"""The README's Python examples run as written, and its results table is what the committed JSON renders."""

import re
from pathlib import Path

from tempo_jax.readme import BEGIN, END, results_block

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_blocks_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks
    scope: dict = {}
    for block in blocks:
        exec(compile(block, "README.md", "exec"), scope)  # noqa: S102
    assert scope["d"].makespan == 60.0
    assert scope["y"].shape == (4, 64, 512)
    assert float(abs(scope["out"].out - scope["sync"].out).max()) == 0.0  # CascadeEP keeps the output
    assert scope["schedule"].groups == ((0, 2, 1, 7), (4, 3, 5, 6))
    assert {f.donor for f in scope["cascade"].fetches} == {6} and len(scope["cascade"].fetches) == 6


def test_readme_results_table_is_rendered_from_committed_json():
    text = README.read_text()
    assert BEGIN in text and END in text, "README lost its generated results block"
    committed = text[text.index(BEGIN) : text.index(END) + len(END)]
    assert committed == results_block(), "README's results table is stale: run `python -m tempo_jax reproduce --readme`"
