"""What a compiled program communicates: every collective of its HLO, the mesh axes it runs along, and its bytes.

    compiled = jax.jit(step).lower(params, x).compile()
    for c in program_collectives(compiled.as_text(), mesh):
        print(c.kind, c.axes, c.bytes, c.wire_bytes)

Each collective instruction of the optimised HLO becomes one `Collective`: its kind (``all-gather``,
``all-reduce``, ``reduce-scatter``, ``all-to-all``, ``collective-permute``), the mesh axes its device groups span
(read from ``replica_groups`` / ``source_target_pairs`` against the mesh's device grid), the bytes of the whole
buffer it acts on per device (``bytes``: an all-gather's gathered result, a reduce-scatter's input, an all-reduce's
or permute's operand, an all-to-all's send buffer) and the bytes a device sends on a ring / pairwise schedule
(``wire_bytes``: (n − 1)/n of ``bytes`` for all-gather, reduce-scatter and all-to-all over n devices, 2(n − 1)/n for
an all-reduce, all of it for a permute). An instruction inside a loop (the dropless rounds) is listed once.
The tests and ``scripts/bench_ep.py --meshes`` read the layer's communication from it.
"""

from __future__ import annotations

import dataclasses
import re

import jax
import numpy as np

__all__ = ["Collective", "program_collectives"]

_KINDS = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")
_LINE = re.compile(
    r"=\s*(?P<result>\(?[^=]*?\)?)\s+(?P<kind>" + "|".join(_KINDS) + r")(?:-start)?\((?P<operands>[^)]*)\)(?P<attrs>.*)"
)
_SHAPE = re.compile(r"\b(?P<dtype>pred|[sufbc]\w*?\d+)\[(?P<dims>[\d,]*)\]")
_BITS = {"pred": 8}


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective of a compiled program (see the module): ``kind``, ``axes`` (mesh axes its groups span; ()
    for a group of one device), ``group`` (devices per group), ``bytes`` and ``wire_bytes`` per device, ``dtype`` and
    ``shape`` of its (first) result, and ``op_name`` (the JAX op it came from, from the HLO metadata)."""

    kind: str
    axes: tuple[str, ...]
    group: int
    bytes: int
    wire_bytes: int
    dtype: str
    shape: tuple[int, ...]
    op_name: str


def _itemsize(dtype: str) -> int:
    if dtype in _BITS:
        return _BITS[dtype] // 8
    return max(1, int(re.sub(r"\D", "", dtype) or 8) // 8)


def _groups(attrs: str, num_devices: int) -> list[list[int]]:
    """Device groups of an instruction: explicit ``{{0,1},{2,3}}``, the iota form ``[G,n]<=[dims]T(perm)``, the
    mesh form ``mesh['axis_0'=4,'axis_1'=2] {'axis_0'}``, or ``source_target_pairs`` (each pair a group)."""
    m = re.search(r"source_target_pairs=\{(.*?)\}\}", attrs)
    if m:
        return [[int(v) for v in p.split(",")] for p in re.findall(r"\{(\d+,\d+)", m.group(1) + "}")]
    m = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", attrs)
    if m:  # the mesh form: mesh['axis_0'=4,'axis_1'=2] {'axis_0'}: device ids in row-major order over those axes
        dims = re.findall(r"'([^']+)'=(\d+)", m.group(1))
        names, sizes = [d for d, _ in dims], [int(v) for _, v in dims]
        over = [names.index(a) for a in re.findall(r"'([^']+)'", m.group(2))]
        rest = [k for k in range(len(names)) if k not in over]
        ids = np.arange(int(np.prod(sizes))).reshape(sizes).transpose(rest + over)
        return ids.reshape(-1, int(np.prod([sizes[k] for k in over]))).tolist()
    m = re.search(r"replica_groups=\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", attrs)
    if m:
        g, n = int(m.group(1)), int(m.group(2))
        dims = [int(v) for v in m.group(3).split(",")]
        ids = np.arange(int(np.prod(dims))).reshape(dims)
        if m.group(4):
            ids = ids.transpose([int(v) for v in m.group(4).split(",")])
        return ids.reshape(g, n).tolist()
    m = re.search(r"replica_groups=\{((?:\{[\d,]*\},?)*)\}", attrs)
    if m and m.group(1).strip():
        return [[int(v) for v in grp.split(",") if v] for grp in re.findall(r"\{([\d,]*)\}", m.group(1))]
    return [list(range(num_devices))]


def _axes_of(groups: list[list[int]], mesh: jax.sharding.Mesh) -> tuple[str, ...]:
    """The mesh axes along which the devices of the first multi-device group differ."""
    where = {d.id: idx for idx, d in np.ndenumerate(mesh.devices)}
    for grp in groups:
        coords = np.array([where[i] for i in grp if i in where])
        if len(coords) > 1:
            return tuple(n for k, n in enumerate(mesh.axis_names) if len(set(coords[:, k])) > 1)
    return ()


def program_collectives(hlo_text: str, mesh: jax.sharding.Mesh) -> list[Collective]:
    """Every collective of an optimised HLO module (``compiled.as_text()``) on ``mesh`` (see the module)."""
    out = []
    num_devices = mesh.devices.size
    for line in hlo_text.splitlines():
        line = re.sub(r"/\*.*?\*/", "", line)  # long tuples carry /*index=5*/ comments
        m = _LINE.search(line)
        if not m or "-done" in line.split("=")[1].split("(")[0]:
            continue
        kind = m.group("kind")
        shapes = [
            (s.group("dtype"), tuple(int(v) for v in s.group("dims").split(",") if v))
            for s in _SHAPE.finditer(m.group("result"))
        ]
        shapes = [(d, s) for d, s in shapes if d != "token"]
        if not shapes:
            continue
        groups = _groups(m.group("attrs"), num_devices)
        n = max(len(g) for g in groups)
        result = sum(int(np.prod(s)) * _itemsize(d) for d, s in shapes)
        if kind == "all-gather" and m.group("result").startswith("("):  # an async start: (operand, result)
            result = int(np.prod(shapes[-1][1])) * _itemsize(shapes[-1][0])
        full = result * n if kind == "reduce-scatter" else result
        if kind == "collective-permute":
            n, wire = 2, full
        elif kind == "all-reduce":
            wire = 2 * full * (n - 1) // n
        else:
            wire = full * (n - 1) // n
        op = re.search(r'op_name="([^"]*)"', m.group("attrs"))
        out.append(
            Collective(
                kind,
                _axes_of(groups, mesh),
                n if kind != "collective-permute" else 2,
                full,
                wire,
                shapes[0][0],
                shapes[0][1],
                op.group(1) if op else "",
            )
        )
    return out
