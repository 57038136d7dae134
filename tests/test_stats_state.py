"""One statistics variable per layer (issue 77, item 1): `MoE.stats` holds a `ShardStats` pytree set once a call,
sharded leaf by leaf over the token shards, checkpointed and restored whole; every per-layer metric is one
`METRICS` entry whose `Source` names the statistic and its reduction, so a new one reaches `layer_record`, the
Prometheus sink and TensorBoard from the table alone."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import tempo_jax
from solvers import PRESETS, Placement
from tempo_jax import MoE, MoEConfig, make_ep_mesh, make_mesh
from tempo_jax.layer import ShardStats
from tempo_jax.layer import tables as dispatch_tables
from tempo_jax.layer.module import ShardState
from tempo_jax.metrics import METRICS, REDUCTIONS, MetricSpec, PrometheusSink, Source, capture, layer_record
from tempo_jax.metrics import record as record_module
from tempo_jax.metrics import sinks as sinks_module

COST = PRESETS["dsv3_fp8_offline"]
CFG = MoEConfig(hidden=16, ffn=16, experts=8, top_k=2, slots_per_rank=2)


def _moe(mesh, cfg=CFG, **kw):
    D = mesh.shape["ep"]
    placement = Placement.from_eplb(np.arange(cfg.experts) + 1.0, D * cfg.slots_per_rank, D)
    return MoE(cfg, placement, mesh=mesh, rngs=nnx.Rngs(params=0, dispatch=1), **kw)


@pytest.mark.parametrize("shape", [(8,), (2, 4)], ids=["ep8", "data2xep4"])
def test_the_layer_keeps_its_statistics_in_one_variable_sharded_over_the_token_shards(shape):
    """One `ShardState` holds the `ShardStats` of the last call (set under ``nnx.jit``), each leaf
    leading with the n = Ng·D token shards and sharded over the token axes; its numbers are `ShardStats.of` the
    functional layer's `MoEStats` for the same tokens."""
    mesh = make_ep_mesh(8) if shape == (8,) else make_mesh(data=2, ep=4)
    moe = _moe(mesh)
    (var,) = jax.tree.leaves(nnx.state(moe, ShardState), is_leaf=lambda v: isinstance(v, nnx.Variable))
    assert var is moe.stats and isinstance(moe.stats.get_value(), ShardStats)
    before = moe.stats.get_value()
    assert int(jnp.sum(before.gpu_tokens)) == 0 and before.rounds.tolist() == [1] * 8
    x = jax.random.normal(jax.random.key(0), (64, 16))
    nnx.jit(lambda m, x: m(x))(moe, x)
    stats = moe.stats.get_value()
    tokens = ("data", "ep") if len(shape) == 2 else "ep"
    for name, leaf in stats._asdict().items():
        assert leaf.shape[0] == 8 and leaf.dtype == jnp.int32, name
        assert leaf.sharding.is_equivalent_to(NamedSharding(mesh, P(tokens)), leaf.ndim), name
    assert stats.shard_counts.shape == (8, 8) and int(stats.gpu_tokens.sum()) == 64 * 2
    res = tempo_jax.moe_forward(
        moe.params(),
        x,
        mesh=mesh,
        config=moe.config,
        placement_arrays=dispatch_tables.placement_arrays(moe.placement),
        tables=dispatch_tables.uniform(moe.placement),
        key=jax.random.key(1),
    )
    functional = ShardStats.of(res.stats)  # another dispatch key: where pairs went differs, what was routed not
    for name in ("shard_counts", "drops", "invalid_ids", "rounds"):
        assert np.asarray(getattr(functional, name)).tolist() == np.asarray(getattr(stats, name)).tolist(), name
    assert int(functional.gpu_tokens.sum()) == int(stats.gpu_tokens.sum())


def test_the_statistics_checkpoint_and_restore_whole_and_stack_over_layers(tmp_path):
    """orbax saves the pytree leaf by leaf; `restore_target` rebuilds it (the checkpoint's paths under
    ``stats/value/<field>``) and a fresh model gets the saved numbers back; layers stacked by ``nnx.vmap`` hold
    ``[L, n, ...]`` leaves, scanned calls writing each layer's row."""
    import orbax.checkpoint as ocp

    mesh = make_ep_mesh(8)
    moe = _moe(mesh)
    x = jax.random.normal(jax.random.key(0), (64, 16))
    w = np.asarray(moe.router.get_value()).copy()
    w[:, 3] += 3.0  # a skewed call: the numbers differ from a fresh layer's
    moe.router.set_value(jax.device_put(w, moe.router.get_value().sharding))
    moe(x)
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(tmp_path / "state", nnx.state(moe))
    checkpointer.wait_until_finished()
    stored = checkpointer.metadata(tmp_path / "state")
    assert set(stored.item_metadata.tree["stats"]["value"]) == set(ShardStats._fields)
    fresh = _moe(mesh)
    target = tempo_jax.restore_target(nnx.state(fresh), stored)
    nnx.update(fresh, checkpointer.restore(tmp_path / "state", target))
    for got, want in zip(fresh.stats.get_value(), moe.stats.get_value(), strict=True):
        assert np.asarray(got).tolist() == np.asarray(want).tolist()
        assert got.sharding.is_equivalent_to(want.sharding, got.ndim)
    assert int(np.max(fresh.stats.get_value().gpu_tokens)) > 64 * 2 // 8  # the skewed call's, not zeros

    @nnx.vmap(in_axes=0, out_axes=0)
    def make(key):
        return MoE(CFG, moe.placement, mesh=mesh, rngs=nnx.Rngs(params=key))

    stack = make(jax.random.split(jax.random.key(0), 3))

    @nnx.scan(in_axes=(0, nnx.Carry), out_axes=nnx.Carry)
    def run(layer, h):
        return layer(h)

    run(stack, x)
    stats = stack.stats.get_value()
    assert stats.shard_counts.shape == (3, 8, 8) and stats.gpu_tokens.shape == (3, 8)
    assert np.asarray(stats.gpu_tokens).sum(-1).tolist() == [64 * 2] * 3
    layers = capture(stack).layers()
    assert [rec["gpu_tokens"].tolist() for rec in layers] == np.asarray(stats.gpu_tokens).tolist()


def test_a_new_metric_of_a_statistic_is_one_table_entry(monkeypatch):
    """A `MetricSpec` with a `Source` (statistic + reduction), added to `METRICS` and nothing else: `layer_record`
    computes its entry, the Prometheus sink serves it and TensorBoard writes it."""
    spec = MetricSpec(
        "tempo_moe_busiest_rank_drops",
        "gauge",
        "pairs",
        ("layer",),
        "the most pairs one source dropped this step",
        source=Source("busiest_drops", "drops", "max", tensorboard="busiest_drops"),
    )
    extended = (*METRICS, spec)
    monkeypatch.setattr(record_module, "METRICS", extended)
    monkeypatch.setattr(sinks_module, "METRICS", extended)
    moe = _moe(make_ep_mesh(8), MoEConfig(hidden=16, ffn=16, experts=8, top_k=2, slots_per_rank=2, capacity=8))
    w = np.zeros((16, 8), np.float32)
    w[:, 3] = 5.0  # every token's first choice is expert 3: its blocks overflow the fixed capacity
    moe.router.set_value(jax.device_put(w, moe.router.get_value().sharding))
    with pytest.warns(UserWarning, match="dropped"):
        moe(jax.random.normal(jax.random.key(0), (256, 16)) + 1.0)
    drops = np.asarray(moe.stats.get_value().drops)
    (stats,) = capture(moe).layers()
    rec = layer_record(stats, COST)
    assert rec["busiest_drops"] == int(drops.max()) > 0 and rec["drops"] == int(drops.sum())
    sink = PrometheusSink()
    sink.write({"step": 0, "kind": "step", "layers": [rec], "stalls": {}})
    samples = {s.name: s.value for f in sink.registry.collect() for s in f.samples}
    assert samples["tempo_moe_busiest_rank_drops"] == drops.max()

    class Writer:
        scalars: dict = {}

        def add_scalar(self, tag, value, step):
            self.scalars[tag] = value

        def add_histogram_raw(self, *args, **kw):
            pass

    writer = Writer()
    sinks_module.write_tensorboard(writer, {"step": 0, "kind": "step", "layers": [rec]})
    assert writer.scalars["moe/layer0/busiest_drops"] == drops.max()
    assert writer.scalars["moe/layer0/makespan_live_us"] == rec["makespan_us"]["live"]  # the record's unit: µs


def test_every_source_names_a_statistic_the_layer_keeps_and_a_known_reduction():
    """The table's sources read `ShardStats` fields with `REDUCTIONS`; a spec naming another reduction is refused
    when written; a record from before a metric existed is refused unless its source says what it was."""
    for m in METRICS:
        if m.source is not None and m.source.stat is not None:
            assert m.source.stat in ShardStats._fields and m.source.reduce in REDUCTIONS, m.name
    with pytest.raises(ValueError, match="reduce must be one of"):
        MetricSpec("tempo_x", "gauge", "pairs", ("layer",), "x", source=Source("x", "drops", "median"))
    copies = next(m.source for m in METRICS if m.name == "tempo_moe_copies")
    assert copies.value({}) == 0  # records written before dynamic copies: none
    with pytest.raises(KeyError):
        next(m.source for m in METRICS if m.name == "tempo_moe_dropped_total").value({})
