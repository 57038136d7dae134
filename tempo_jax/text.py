"""Plain-text tables for the command line, scripts, simulators and notebooks (the ground floor: no imports).

    print(table([(1, 2.5), (2, float("nan"))], ["B", "ratio"], title="toy"))

Floats print with four significant digits (integers above 10^4 without decimals); NaN prints as "—".
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["table"]


def _cell(v) -> str:
    if isinstance(v, float):
        if v != v:  # NaN
            return "—"
        return f"{v:.4g}" if abs(v) < 1e4 else f"{v:.0f}"
    return str(v)


def table(rows: Sequence[Sequence], headers: Sequence[str], title: str | None = None) -> str:
    """Render ``rows`` (each a sequence of cells) under ``headers`` as an aligned text table."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    line = "  ".join("-" * w for w in widths)
    out = [] if title is None else [title]
    out.append("  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True)))
    out.append(line)
    out += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(out)
