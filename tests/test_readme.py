"""The README's Python examples run as written, and its results table is what the committed JSON renders."""

import re
from pathlib import Path

from tempo_jax.readme import BLOCKS, results_block

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


def test_readme_results_tables_are_rendered_from_committed_json():
    text = README.read_text()
    for k, (begin, end, _) in enumerate(BLOCKS):
        assert begin in text and end in text, f"README lost its generated results block {begin!r}"
        committed = text[text.index(begin) : text.index(end) + len(end)]
        assert committed == results_block(block=k), (
            "README's results table is stale: run `python -m tempo_jax reproduce --readme`"
        )
