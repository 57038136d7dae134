"""The import structure (docs/architecture.md): ``solvers`` ← ``tempo_jax`` → ``pallas_kernels``, no cycle anywhere.

Every ``import`` statement of the three packages is read from the source — the ones inside functions (lazy imports)
included — and resolved to the module it loads: ``from pkg import name`` is an edge to ``pkg.name`` when that is a
module and to ``pkg`` (its ``__init__``) otherwise.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("solvers", "pallas_kernels", "tempo_jax")
#: What each ground floor may not import (the top-level names).
FORBIDDEN = {
    "solvers": {"jax", "jaxlib", "flax", "optax", "tempo_jax", "pallas_kernels"},  # runs in the worker process
    "pallas_kernels": {"tempo_jax", "solvers", "flax"},
}


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for f in (ROOT / pkg).rglob("*.py"):
            parts = f.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> tuple[set[str], set[str]]:
    """(project modules ``name`` imports, top-level names of everything it imports)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    inner, top = set(), set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for t in targets:
            top.add(t.split(".")[0])
            while t and t not in MODULES:  # `import tempo_jax.layer.moe` loads that module; names resolve upward
                t = t.rpartition(".")[0]
            if t and t != name:
                inner.add(t)
    return inner, top


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def test_every_package_is_read():
    assert {n.split(".")[0] for n in MODULES} == set(PACKAGES) and len(MODULES) > 50


@pytest.mark.parametrize("floor", sorted(FORBIDDEN))
def test_ground_floors_import_nothing_above_them(floor):
    bad = {n: sorted(top & FORBIDDEN[floor]) for n, (_, top) in GRAPH.items() if n.split(".")[0] == floor}
    assert not {n: b for n, b in bad.items() if b}, f"{floor} imports what docs/architecture.md keeps out of it: {bad}"


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (``{module: modules it imports}``) as ``[a, b, …, a]``, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for name in sorted(graph):
        if name not in state and (found := visit(name)):
            return found
    return None


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_imports_are_resolved_to_modules():
    inner = GRAPH["tempo_jax.layer.moe"][0]  # relative, absolute and function-level imports
    assert {"tempo_jax.layer.config", "solvers"} <= inner and "pallas_kernels" in {m.split(".")[0] for m in inner}


def test_no_import_cycle_lazy_imports_included():
    cycle = find_cycle({name: inner for name, (inner, _) in GRAPH.items()})
    assert cycle is None, f"import cycle: {' → '.join(cycle)}"
