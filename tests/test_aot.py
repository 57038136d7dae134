"""Ahead-of-time plans (`tempo_jax.layer.aot`, `tempo-jax plan`): the layer compiled from shapes on a mesh, what each
device holds against the analytic minimum, and what crosses which axis — nothing allocated."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import pytest

from solvers import Placement
from tempo_jax.cli.main import main
from tempo_jax.cli.plan import devices_needed, plan_for
from tempo_jax.layer import MoEConfig, make_mesh
from tempo_jax.layer.aot import aot_plan

H, F, E, K = 64, 32, 16, 2


def _cfg(**kw) -> MoEConfig:
    return MoEConfig(hidden=H, ffn=F, experts=E, top_k=K, slots_per_rank=3, dtype=jnp.float32, **kw)


def test_a_plan_counts_what_each_device_holds_and_sends():
    """On EP8 in float32: the forward's arguments are exactly the rank's parameters and its token rows; the analytic
    row buffers are D·C·(4H + 3F) elements; the exchange's largest all-to-all is one round's D blocks of C rows of
    H values and a slot lane, all along ``ep``; the training step writes parameters and Adam's moments over the
    donated ones (aliased = outputs) and sends its gradients along ``ep`` only."""
    plan = aot_plan(_cfg(), make_mesh(ep=8), tokens_per_rank=32)
    a, n, D = plan.analytic, 32, 8
    assert plan.forward.arguments == a.weights + n * H * 4
    assert a.row_buffers == D * a.capacity * (4 * H + 3 * F) * 4 and a.capacity == 16  # 2 × 32·2 / 8, rounded to 8
    assert a.moments == 2 * a.weights + 4  # float32 parameters: two float32 moments, and Adam's step count
    sends = [r for r in plan.collectives["forward"] if r["kind"] == "all-to-all"]
    assert sends and all(r["axes"] == ["ep"] for r in sends)
    assert max(r["bytes"] for r in sends) <= 2 * D * a.capacity * (H + 1) * 4  # rows and the slot lane, both ways
    assert plan.train.aliased > 0 and plan.train.outputs >= a.weights + a.moments
    assert plan.train.arguments == a.weights + a.moments + n * H * 4
    assert {tuple(r["axes"]) for r in plan.collectives["train"]} <= {("ep",), ()}
    assert plan.fits(1e9) and not plan.fits(1e3)


def test_a_plan_on_a_data_ep_tensor_mesh_splits_the_rows_width_and_names_each_axis():
    """data × ep × tensor: a tensor axis splits F in the weights and the row buffers; the tensor axis carries the
    one reduction of the layer's output; the data axis only the gradients' sum."""
    cfg = MoEConfig(hidden=H, ffn=F, experts=E, top_k=K, slots_per_rank=9, dtype=jnp.float32, tensor_axis="tensor")
    plan = aot_plan(cfg, make_mesh(data=2, ep=2, tensor=2), tokens_per_rank=32)
    a = plan.analytic
    assert a.row_buffers == 2 * a.capacity * (4 * H + 3 * F // 2) * 4
    assert plan.forward.arguments == a.weights + 32 * H * 4
    axes = {tuple(r["axes"]) for r in plan.collectives["forward"]}
    assert ("tensor",) in axes and not any("data" in ax for ax in axes)
    assert any(r["axes"] == ["data"] and r["kind"] == "all-reduce" for r in plan.collectives["train"])


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"tokens_per_rank": 0}, "tokens_per_rank must be an integer >= 1"),
        ({"tokens_per_rank": 8, "placement": Placement.spread(E, 4, 4)}, "the placement has 16 slots"),
    ],
)
def test_plan_refuses_what_it_cannot_plan(kw, match):
    with pytest.raises(ValueError, match=match):
        aot_plan(_cfg(), make_mesh(ep=8), **kw)
    with pytest.raises(ValueError, match="axis 'ep' is not in the mesh"):
        aot_plan(_cfg(), jax.make_mesh((8,), ("x",)), tokens_per_rank=8)


def test_the_plan_command_compiles_a_real_preset_and_writes_json(tmp_path, capsys):
    """``tempo-jax plan`` on a real-size preset (Qwen3-30B-A3B's layer, forward only, few tokens): the table, the
    analytic line, the collectives and the GPUs it fits, and the same in the JSON; a bad mesh is a usage error."""
    out = tmp_path / "plan.json"
    argv = ["plan", "--preset", "qwen3_30b_a3b", "--mesh", "ep=8", "--tokens-per-rank", "16", "--no-train"]
    assert main([*argv, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "qwen3_30b_a3b on ep=8 (8 devices): E 128, 17 slots per rank" in text and "fits: H100 80 GB" in text
    row = json.loads(out.read_text())
    assert row["slots_per_rank"] == 17 and "train" not in row and row["forward"]["peak"] > row["analytic"]["weights"]
    assert main(["plan", "--preset", "qwen3_30b_a3b", "--mesh", "ep=8,pipe=2"]) == 2
    assert "'pipe=2' is not axis=size" in capsys.readouterr().err
    assert devices_needed(["plan", "--mesh", "data=2,ep=16,tensor=2"]) == 64
    assert devices_needed(["plan", "--mesh=ep=32"]) == 32 and devices_needed(["solve", "--mesh", "ep=4"]) is None


def test_the_plan_command_plans_experts_over_nodes(tmp_path):
    """``--mesh node=2,ep=4``: the experts over nodes × ranks (8 ranks of 17 slots); the flat exchange's collectives
    run over both axes, the two-hop exchange's over ``node`` and ``ep`` apart; serving refuses a node axis."""
    rows = {}
    for how in ("flat", "two_hop"):
        out = tmp_path / f"{how}.json"
        argv = ["plan", "--preset", "qwen3_30b_a3b", "--mesh", "node=2,ep=4", "--tokens-per-rank", "16", "--no-train"]
        assert main([*argv, "--node-exchange", how, "--out", str(out)]) == 0
        rows[how] = json.loads(out.read_text())
    assert rows["flat"]["mesh"] == "node=2×ep=4" and rows["flat"]["slots_per_rank"] == 17
    axes = {how: {tuple(c["axes"]) for c in r["collectives"]["forward"]} for how, r in rows.items()}
    assert ("node", "ep") in axes["flat"] and {("node",), ("ep",)} <= axes["two_hop"], axes
    assert devices_needed(["plan", "--mesh", "node=8,ep=8"]) == 64
    assert make_mesh(node=2, ep=4).axis_names == ("data", "node", "ep", "tensor")
    assert make_mesh(ep=8).axis_names == ("data", "ep", "tensor")  # no node axis unless asked for
    with pytest.raises(ValueError, match="node_exchange='two_hop' crosses nodes"):
        plan_for("qwen3_30b_a3b", "ep=8", 16, train=False, node_exchange="two_hop")
    from tempo_jax.runtime.serve_config import ServeConfig

    with pytest.raises(ValueError, match="a node axis .* is not served yet"):
        ServeConfig(mesh="node=2,ep=4")
