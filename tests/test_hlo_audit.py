"""What a layer call asks a GPU to do (issue 72, item 2): `scripts/hlo_audit.py` counts the data movement of each
stage of the layer traced as a GPU runs it and lowered for CUDA, and the ragged grouped GEMMs (XLA's and tokamax's:
the GPU paths) no longer rotate the row buffer to the first local group when there is no group offset — a copy of
twice the rows, in and out of each GEMM, that the layer paid three times a forward."""

import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import gmm, gmm_reference

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import hlo_audit  # noqa: E402  (scripts/)


def _row_copies(fn, *args, rows: int) -> int:
    """Concatenations and dynamic slices in ``fn``'s jaxpr whose result has at least ``rows`` rows."""
    found = 0

    def walk(jaxpr):
        nonlocal found
        for eqn in jaxpr.eqns:
            if eqn.primitive.name in ("concatenate", "dynamic_slice"):
                shape = eqn.outvars[0].aval.shape
                found += bool(shape) and shape[0] >= rows
            for sub in hlo_audit._subjaxprs(eqn.params):
                walk(sub)

    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    return found


@pytest.mark.parametrize("direction", ["forward", "gradient"])
def test_the_ragged_gemm_moves_no_rows_without_a_group_offset(direction):
    """``implementation="ragged_dot"`` with no group offset: no concatenation or slice of the row buffer (the
    rotation is skipped); with a traced offset the rotation stays and the result still equals the reference."""
    M, H, F, E = 64, 16, 8, 4
    lhs = jax.random.normal(jax.random.key(0), (M, H))
    rhs = jax.random.normal(jax.random.key(1), (E, H, F))
    sizes = jnp.array([10, 0, 30, 20], jnp.int32)

    def call(offset):
        def f(lhs, rhs):
            out = gmm(lhs, rhs, sizes, group_offset=offset, implementation="ragged_dot")
            loss = lambda a, b: gmm(a, b, sizes, group_offset=offset, implementation="ragged_dot").sum()  # noqa: E731
            return out if direction == "forward" else jax.grad(loss, argnums=(0, 1))(lhs, rhs)

        return f

    assert _row_copies(call(None), lhs, rhs, rows=M) == 0
    assert _row_copies(call(0), lhs, rhs, rows=M) == 0

    def traced(lhs, rhs, off):
        return gmm(lhs, rhs[: E - 1], sizes, group_offset=off, implementation="ragged_dot")

    assert _row_copies(traced, lhs, rhs, jnp.int32(1), rows=M) > 0  # a traced offset: rotated
    got = jax.jit(traced)(lhs, rhs, jnp.int32(1))
    want = gmm_reference(lhs, rhs[: E - 1], sizes, group_offset=1)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    want_all = (
        gmm_reference(lhs, rhs, sizes)
        if direction == "forward"
        else jax.grad(lambda a, b: gmm_reference(a, b, sizes).sum(), argnums=(0, 1))(lhs, rhs)
    )
    for g, w in zip(jax.tree.leaves(jax.jit(call(None))(lhs, rhs)), jax.tree.leaves(want_all), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5)


def test_the_audit_counts_each_stage_of_a_layer_lowered_for_cuda(tmp_path):
    """The script end to end on a small case with XLA's ragged GEMM: every stage that does work is counted, the
    exchange is the ragged one a GPU runs, the expert FFN holds its three grouped GEMMs (and their d lhs and d rhs in
    the backward, written once per copy of the FFN in the program)
    and no row-buffer concatenation is left in it (only the group offsets' [E + 1] vectors, one a GEMM). In a process
    of its own: the audit clears JAX's caches around its GPU trace, which this worker's other tests should not pay."""
    out = tmp_path / "audit.json"
    cmd = [
        sys.executable,
        "scripts/hlo_audit.py",
        "--gmm",
        "ragged_dot",
        "--tokens-per-device",
        "16",
        "--json",
        str(out),
    ]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "moe_ffn" in run.stdout  # the printed tables
    result = json.loads(out.read_text())
    fwd, both = result["forward"], result["forward_and_backward"]
    assert {"moe_route", "moe_dispatch", "moe_pack", "moe_exchange", "moe_ffn", "moe_return", "moe_combine"} <= set(fwd)
    assert fwd["moe_exchange"]["ragged_all_to_all"] == 1 and fwd["moe_return"]["ragged_all_to_all"] == 1
    assert fwd["moe_ffn"]["ragged_dot_general"] == 3 and both["moe_ffn"]["ragged_dot_general"] >= 9  # + d lhs, d rhs
    assert fwd["moe_ffn"].get("concatenate", 0) <= 3  # the offsets vectors: no row buffer rotated
    assert "sort" not in fwd["moe_ffn"]  # the received rows ordered by counting (`stages.merge_by_slot`)
    assert result["forward_custom_calls"].get("ragged_all_to_all") == 2


_HLO = """HloModule jit_f, entry_computation_layout={(f32[8]{0})->f32[8]{0}}

%fused_computation (param_0: f32[8]) -> f32[8] {
  %param_0 = f32[8]{0} parameter(0)
  ROOT %exponential.1 = f32[8]{0} exponential(%param_0), metadata={op_name="jit(f)/moe_ffn/exp"}
}

%body (p: (s32[], f32[8])) -> (s32[], f32[8]) {
  %p = (s32[], f32[8]{0}) parameter(0)
  %gte.0 = s32[] get-tuple-element(%p), index=0
  %gte.1 = f32[8]{0} get-tuple-element(%p), index=1
  %fusion.2 = f32[8]{0} fusion(%gte.1), kind=kLoop, calls=%fused_computation, metadata={op_name="f/moe_ffn/exp"}
  %a2a = f32[8]{0} all-to-all(%fusion.2), replica_groups={{0,1}}, metadata={op_name="f/moe_exchange/all_to_all"}
  ROOT %tuple.1 = (s32[], f32[8]{0}) tuple(%gte.0, %a2a)
}

%cond (p.1: (s32[], f32[8])) -> pred[] {
  %p.1 = (s32[], f32[8]{0}) parameter(0)
  %gte.2 = s32[] get-tuple-element(%p.1), index=0
  %c = s32[] constant(4)
  ROOT %lt = pred[] compare(%gte.2, %c), direction=LT, metadata={op_name="jit(f)/while/cond/lt"}
}

ENTRY %main (x: f32[8]) -> f32[8] {
  %x = f32[8]{0} parameter(0)
  %sort.1 = f32[8]{0} sort(%x), dimensions={0}, to_apply=%cond, metadata={op_name="jit(f)/moe_dispatch/sort"}
  %z = s32[] constant(0)
  %t = (s32[], f32[8]{0}) tuple(%z, %sort.1)
  %while.1 = (s32[], /*index=1*/f32[8]{0}) while(%t), condition=%cond, body=%body, metadata={op_name="f/moe_ffn/while"}
  ROOT %gte.3 = f32[8]{0} get-tuple-element(%while.1), index=1
}
"""


def test_stage_kernels_reads_the_program_a_device_runs():
    """`stage_kernels` on hand-written HLO: the entry and its loop's body and condition are read (a fusion once,
    not its insides; a sort's comparator not at all), tuples, constants and parameters launch nothing, each
    instruction goes to the innermost stage of its op_name; on the layer compiled for this CPU, every stage that
    does work launches something and the FFN's loop bodies are counted."""
    from tempo_jax.layer.scopes import stage_kernels

    got = stage_kernels(_HLO)
    assert got == {
        "moe_dispatch": {"sort": 1},
        "moe_exchange": {"all-to-all": 1},
        "moe_ffn": {"fusion": 1},
        "(outside)": {"compare": 1},
    }
    loss, params, x, _ = hlo_audit.layer_case(16, "chunked")
    layer = stage_kernels(jax.jit(loss).lower(params, x).compile().as_text())
    for stage in ("moe_route", "moe_dispatch", "moe_exchange", "moe_ffn", "moe_return"):
        assert sum(layer[stage].values()) > 0, stage
    assert layer["moe_ffn"]["fusion"] > 3  # the chunked FFN's loop bodies, not only the loops' callers
