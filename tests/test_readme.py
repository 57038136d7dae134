"""The README's Python examples run as written."""

import re
from pathlib import Path

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
