"""Names on the stages of a layer call, so a profile (`jax.profiler`, the compiled program's op names) reads as the
layer's steps: every operation a stage emits runs under ``jax.named_scope(<its name>)``.

| scope | the stage |
| --- | --- |
| ``moe_route`` | step 1: the router (`stages.route`) |
| ``moe_plan`` | the in-graph dispatch plan (relief, dynamic copies) |
| ``moe_dispatch`` | step 2: the fused dispatch + count kernel (`stages.dispatch_pairs`) |
| ``moe_tie`` | the replicas' weights tied (their gradients summed in the backward) |
| ``moe_pack`` | step 3: the pairs' rows packed into per-destination blocks |
| ``moe_exchange`` | step 3: the rows sent (block all-to-all, the ring's all-gather, the two-hop's hops) |
| ``moe_ffn`` | steps 4–5: the expert FFN (grouped GEMMs) |
| ``moe_return`` | step 6: the results back to their source (all-to-all, the ring's reduce-scatter) |
| ``moe_combine`` | step 7: each token's pairs weighted by their gates and summed |

A dropless call runs its rounds inside a loop, so a round's stages appear inside the loop's body under the same
names. The ring has no ``moe_pack`` or ``moe_combine`` (it sends whole tokens and adds each pair's weighted result
inside ``moe_ffn``); ``moe_tie`` emits work only where experts have replicas (their gradients' sum, in the backward).
The names are the layer's; `tempo_jax.layer.remat` names the values to save (`checkpoint_name`). `stage_kernels`
reads a compiled program by them: what each stage launches.
"""

from __future__ import annotations

import collections
import functools
import re

import jax

__all__ = ["STAGES", "scoped", "stage_kernels"]

#: Every stage scope of a layer call, in call order.
STAGES = (
    "moe_route",
    "moe_plan",
    "moe_dispatch",
    "moe_tie",
    "moe_pack",
    "moe_exchange",
    "moe_ffn",
    "moe_return",
    "moe_combine",
)


def scoped(name: str):
    """Decorator: run the function under ``jax.named_scope(name)`` (``name`` one of `STAGES`)."""
    if name not in STAGES:
        raise ValueError(f"scoped: {name!r} is not a stage of the layer; one of {list(STAGES)}")

    def wrap(fn):
        @functools.wraps(fn)
        def inner(*args, **kwargs):
            with jax.named_scope(name):
                return fn(*args, **kwargs)

        return inner

    return wrap


_COMPUTATION = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(?:\(.*?\)|\S+)\s+([a-z][a-z0-9\-]*)\((.*)$")
_CALLED = re.compile(r"(?:body|condition|true_computation|false_computation)=%?([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
#: Instructions that launch nothing of their own (and the control flow, whose bodies are read instead).
_FREE = frozenset(
    "parameter constant get-tuple-element tuple bitcast after-all partition-id replica-id opt-barrier "
    "add-dependency while call conditional".split()
)


def stage_kernels(hlo: str) -> dict[str, dict[str, int]]:
    """What each stage of a compiled layer call launches: the optimised HLO text ``hlo``
    (``jax.jit(f).lower(...).compile().as_text()``) → ``{stage: {opcode: count}}`` over the instructions the program
    runs as units of work — fusions, custom calls (the GEMM and sort kernels), collectives, copies, loose gathers
    and scatters — in the entry computation and the bodies of its loops, calls and branches (a fusion counts once,
    not its insides; a loop body once, not once per trip). Each goes to the innermost stage scope (`STAGES`) in its
    ``op_name`` metadata, or ``"(outside)"``. On a GPU each is at least one kernel launch."""
    bodies: dict[str, list[str]] = {}
    entry, current = None, None
    for line in hlo.splitlines():
        m = _COMPUTATION.match(line)
        if m:
            current = m.group(2)
            bodies[current] = []
            entry = current if m.group(1) else entry
        elif line.strip() == "}":
            current = None
        elif current is not None:
            bodies[current].append(line)
    out: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    todo, seen = [entry] if entry else [], set()
    while todo:
        name = todo.pop()
        if name in seen or name not in bodies:
            continue
        seen.add(name)
        for line in bodies[name]:
            m = _INSTRUCTION.search(line)
            if not m:
                continue
            opcode, rest = m.group(1), m.group(2)
            if opcode in ("while", "conditional", "call"):
                todo += _CALLED.findall(rest)
                for group in _BRANCHES.findall(rest):
                    todo += [b.strip().lstrip("%") for b in group.split(",")]
                if opcode == "call":
                    todo += re.findall(r"to_apply=%?([\w.\-]+)", rest)
            if opcode in _FREE:
                continue
            op_name = _OP_NAME.search(rest)
            names = op_name.group(1) if op_name else ""
            stage = next((s for s in reversed(STAGES) if s in names), "(outside)")
            out[stage][opcode] += 1
    return {stage: dict(out[stage]) for stage in (*STAGES, "(outside)") if stage in out}
