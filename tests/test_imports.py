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


#: The rooms of ``tempo_jax`` and the rooms each may import besides itself (docs/architecture.md: cli → repro →
#: runtime, sim, lm → metrics → layer → workloads → text; runtime and sim never import each other, sim never imports
#: layer).
ROOMS = {
    "text": set(),
    "workloads": {"text"},
    "layer": {"workloads", "text"},
    "sim": {"workloads", "text"},
    "metrics": {"layer", "workloads", "text"},
    "lm": {"metrics", "layer", "workloads", "text"},
    "runtime": {"lm", "metrics", "layer", "workloads", "text"},
    "hf": {"layer"},
    "repro": {"runtime", "sim", "lm", "metrics", "layer", "workloads", "text"},
    "cli": {"repro", "runtime", "sim", "lm", "metrics", "layer", "hf", "workloads", "text"},
    "__main__": {"cli"},
}


def _room(module: str) -> str:
    return module.split(".")[1] if module.startswith("tempo_jax.") else module.split(".")[0]


def test_every_room_is_named():
    rooms = {_room(n) for n in MODULES if n.startswith("tempo_jax.")}
    assert rooms == set(ROOMS), f"rooms not in ROOMS (add them where they belong): {sorted(rooms ^ set(ROOMS))}"


def test_rooms_import_only_downward():
    up = {
        n: sorted(m for m in inner if m.startswith("tempo_jax.") and _room(m) not in ROOMS[_room(n)] | {_room(n)})
        for n, (inner, _) in GRAPH.items()
        if n.startswith("tempo_jax.")
    }
    assert not {n: u for n, u in up.items() if u}, f"imports ROOMS does not allow: {up}"


def test_simulators_stay_numpy_and_their_paper_rooms_apart():
    sims = {n: GRAPH[n] for n in MODULES if n.startswith("tempo_jax.sim")}
    assert {"tempo_jax.sim.tempo", "tempo_jax.sim.cascade", "tempo_jax.sim.runner"} <= set(sims)
    for n, (inner, top) in sims.items():
        assert not top & {"jax", "jaxlib", "flax", "optax", "pallas_kernels"}, (n, top)
        for room, other in (("tempo", "cascade"), ("cascade", "tempo")):
            if n.startswith(f"tempo_jax.sim.{room}"):
                assert not {m for m in inner if m.startswith(f"tempo_jax.sim.{other}")}, f"{n} imports the {other} room"
    assert not {m for m in sims["tempo_jax.sim.runner"][0] if m.startswith("tempo_jax.sim.")}


def private_imports(name: str, path: Path) -> list[str]:
    """Private names (``_x``) ``name`` takes from another project module: ``from m import _x`` or ``m._x`` on a module
    it imported."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    modules, bad = {}, []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            if base.split(".")[0] not in PACKAGES:
                continue
            for a in node.names:
                if f"{base}.{a.name}" in MODULES:
                    modules[a.asname or a.name] = f"{base}.{a.name}"
                elif a.name.startswith("_") and base != name:
                    bad.append(f"from {base} import {a.name}")
        elif isinstance(node, ast.Import):
            modules.update({a.asname: a.name for a in node.names if a.asname and a.name in MODULES})
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            bad.append(f"{modules[node.value.id]}.{node.attr}")
    return bad


def test_private_imports_are_found(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("from tempo_jax.layer import stages\nfrom solvers.bounds import _x\nstages._y(1)\n")
    assert private_imports("tempo_jax.other", f) == ["from solvers.bounds import _x", "tempo_jax.layer.stages._y"]


def test_no_private_name_imported_across_modules():
    bad = {n: b for n, path in MODULES.items() if (b := private_imports(n, path))}
    assert not bad, f"private names used across modules (make them public where two modules need them): {bad}"


@pytest.mark.parametrize("folder", ["scripts", "notebooks"])
def test_scripts_and_notebooks_use_only_public_names(folder):
    bad = {f.name: b for f in sorted((ROOT / folder).rglob("*.py")) if (b := private_imports(f"{folder}.{f.stem}", f))}
    assert not bad, f"{folder} reach into private names: {bad}"
