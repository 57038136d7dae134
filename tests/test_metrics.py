"""Expert load you can watch (issue 50): the step record against the layer's own state, a live ``/metrics`` of
`tempo-jax serve` scraped over HTTP and parsed by prometheus-client, TensorBoard event files of training read back
with TensorBoard's own reader, `tempo-jax report`'s pictures, and each stall raising its hand."""

import json
import logging
import socket
import threading
import time
import urllib.request
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx
from prometheus_client.parser import text_string_to_metric_families

from solvers import PRESETS, DispatchProblem, Placement, expected_dispatch, plan_weights, solve
from tempo_jax import MoE, MoEConfig, cli, make_ep_mesh, make_mesh, moe_forward
from tempo_jax.layer import tables as dispatch_tables
from tempo_jax.lm import LMConfig, train
from tempo_jax.metrics import (
    METRICS,
    STALLS,
    STAT_NAMES,
    Capture,
    PrometheusSink,
    StallLimits,
    StallWatch,
    Watcher,
    WatchOptions,
    capture,
    layer_record,
    log,
    markdown_table,
)
from tempo_jax.metrics.report import FIGURES, read_run, render_run

COST = PRESETS["dsv3_fp8_offline"]


def _moe(mesh, experts=8, slots=2):
    cfg = MoEConfig(hidden=16, ffn=16, experts=experts, top_k=2, slots_per_rank=slots)
    D = mesh.shape["ep"]
    placement = Placement.from_eplb(np.arange(experts) + 1.0, D * slots, D)
    return MoE(cfg, placement, mesh=mesh, rngs=nnx.Rngs(params=0, dispatch=1)), placement


@pytest.mark.parametrize("shape", [(8,), (2, 4)], ids=["ep8", "data2xep4"])
def test_the_record_is_the_layers_own_state(shape):
    """Every number of a layer's record against the module's own statistics after a call, on one EP group and on
    two (data × ep): tokens / activated experts per device, pairs per expert, balancedness as mean / max, the live
    makespan = the cost model on the realised load, EPLB-even and the optimum per EP group (the slowest)."""
    mesh = make_ep_mesh(8) if shape == (8,) else make_mesh(data=2, ep=4)
    moe, placement = _moe(mesh)
    x = jax.random.normal(jax.random.key(0), (128, 16))
    moe(x)
    capture(moe)  # the first read of the placement (then cached by identity)
    with jax.transfer_guard_device_to_host("disallow"):
        cap = capture(moe)  # starts the copies; transfers nothing itself
    (stats,) = cap.layers()
    rec = layer_record(stats, COST, policy="tempo")
    toks, acts = np.asarray(moe.stats.get_value().gpu_tokens), np.asarray(moe.stats.get_value().gpu_activations)
    shard = np.asarray(moe.stats.get_value().shard_counts)
    Ng = shape[0] if len(shape) == 2 else 1
    assert stats["groups"] == Ng and shard.shape == (8, 8)
    assert rec["tokens"] == toks.tolist() and rec["activated"] == acts.tolist()
    assert rec["expert_tokens"] == np.asarray(moe.counts.get_value()).sum(0).tolist() == shard.sum(0).tolist()
    assert rec["pairs"] == 128 * 2 == toks.sum()  # every token routed to K = 2 experts, none dropped
    assert rec["drops"] == 0 and rec["invalid_ids"] == 0 and rec["rounds"] >= 1
    assert rec["balancedness"]["tokens"] == pytest.approx(toks.mean() / toks.max())
    times = COST.gpu_times(acts, toks)
    assert rec["balancedness"]["time"] == pytest.approx(times.mean() / times.max())
    assert rec["makespan_us"]["live"] == pytest.approx(times.max())
    groups = shard.reshape(Ng, -1, 8)
    w = plan_weights("uniform", placement)
    eplb = max(COST.makespan(expected_dispatch(w, g, placement)) for g in groups)
    optimum = max(solve(DispatchProblem(g, placement, COST), "tempo").makespan for g in groups)
    assert rec["makespan_us"]["eplb_even"] == pytest.approx(eplb) and rec["makespan_us"]["optimum"] == optimum
    assert optimum <= eplb * (1 + 1e-9)
    # The functional layer's capture (`moe_forward`'s stats) gives the same record.
    res = moe_forward(
        moe.params(),
        x,
        mesh=mesh,
        config=moe.config,
        placement_arrays=dispatch_tables.placement_arrays(placement),
        tables=dispatch_tables.uniform(placement),
        key=jax.random.key(1),
    )
    (fs,) = Capture.from_stats(res.stats, placement, Ng).layers()
    functional = layer_record(fs, COST)
    assert functional["expert_tokens"] == rec["expert_tokens"] and functional["pairs"] == 256


def test_the_default_series_stay_bounded_and_the_options_add_what_they_say():
    """Without per_rank / per_expert the series count does not grow with ranks or experts (vllm #43715: 61 layers ×
    72 ranks); per_rank adds layers × ranks × 2 gauges, per_expert layers × experts counters (× 2 with _created)."""

    def record(D, E, L=3):
        layer = {
            "tokens": [5] * D,
            "activated": [1] * D,
            "expert_tokens": [1] * E,
            "pairs": 5 * D,
            "drops": 0,
            "invalid_ids": 0,
            "rounds": 1,
            "plan_rounds": 0,
            "balancedness": {"tokens": 1.0, "time": 1.0},
            "makespan_us": {"live": 10.0, "eplb_even": 12.0, "optimum": 9.0},
        }
        return {"step": 0, "kind": "step", "step_ms": 1.0, "layers": [layer] * L, "replacements": [], "stalls": {}}

    def series(D, E, **kw):
        sink = PrometheusSink(**kw)
        sink.write(record(D, E))
        return sink.cardinality()

    small, big = series(8, 16), series(72, 256)
    assert small == big
    assert series(72, 256, per_rank=True) - big == 3 * 72 * 2
    assert series(72, 256, per_expert=True) - big == 3 * 256 * 2  # a counter's sample and its _created
    names = {m.name for m in METRICS}
    assert "tempo_moe_tokens_total" in names and all(n.startswith("tempo_") for n in names)
    table = markdown_table()
    assert all(f"`{m.name}`" in table for m in METRICS)
    doc = (Path(__file__).resolve().parents[1] / "docs" / "runtime.md").read_text()
    begin, end = "<!-- metrics table: begin -->\n", "\n<!-- metrics table: end -->"
    assert doc[doc.index(begin) + len(begin) : doc.index(end)] == table, "docs/runtime.md's metric table is stale"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _samples(text: str) -> dict:
    """``{(name, frozenset(labels)): value}`` of a scrape, parsed by prometheus-client's own parser."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


@pytest.mark.one_env
def test_serve_metrics_scraped_live_agree_with_the_layers_counts(tmp_path, capsys):
    """`tempo-jax serve --metrics-port` on a data × ep mesh: /metrics scraped over HTTP while it runs and after its
    last step; tokens equal what every step routes (T tokens × K per layer), the per-rank gauges and histograms the
    last records, the runtime gauges the controller's; serve.json's series count is the scrape's; TensorBoard too."""
    port, steps, T, K = _free_port(), 4, 16 * 8, 2
    argv = ["serve", "--mesh", "data=2,ep=4", "--steps", str(steps), "--tokens-per-rank", "16", "--experts", "8"]
    argv += ["--top-k", str(K), "--hidden", "32", "--ffn", "32", "--every-steps", "1", "--block", "0"]
    argv += ["--decode-steps", "1", "--train-steps", "0", "--solver-mode", "inline", "--rebalance-every", "none"]
    argv += ["--metrics-port", str(port), "--metrics-per-rank", "--metrics-linger-s", "600"]
    argv += ["--logdir", str(tmp_path / "tb"), "--out", str(tmp_path), "--no-figure"]
    result = []
    thread = threading.Thread(target=lambda: result.append(cli.main(argv)))
    thread.start()
    url, last, seen_live = f"http://127.0.0.1:{port}/metrics", None, False
    while thread.is_alive():  # scrape until serve has returned (its endpoint waits for one scrape after the run)
        try:
            last = urllib.request.urlopen(url, timeout=30).read().decode()
        except OSError:
            time.sleep(0.2)
            continue
        got = _samples(last)
        done = sum(v for (n, _), v in got.items() if n == "tempo_steps_total")
        seen_live |= 0 < done < steps
        time.sleep(0.05)
    thread.join()
    assert result == [0] and last is not None
    text = capsys.readouterr().out
    assert f"metrics: Prometheus endpoint at {url}" in text
    got = _samples(last)
    records = read_run(tmp_path)
    assert len(records) == steps
    for layer in range(2):
        lab = ("layer", str(layer))
        assert got[("tempo_moe_tokens_total", frozenset([lab]))] == steps * T * K
        assert sum(r["layers"][layer]["pairs"] for r in records) == steps * T * K
        final = records[-1]["layers"][layer]
        for rank in range(8):
            key = frozenset([lab, ("rank", str(rank))])
            assert got[("tempo_moe_rank_tokens", key)] == final["tokens"][rank]
            assert got[("tempo_moe_rank_active_experts", key)] == final["activated"][rank]
        assert sum(final["tokens"]) == T * K
        assert got[("tempo_moe_rank_load_ratio_count", frozenset([lab]))] == steps * 8
        live = got[("tempo_moe_makespan_seconds", frozenset([lab, ("tables", "live")]))]
        assert live == pytest.approx(final["makespan_us"]["live"] * 1e-6)
    assert got[("tempo_steps_total", frozenset([("kind", "prefill")]))] == steps // 2
    assert got[("tempo_steps_total", frozenset([("kind", "decode")]))] == steps // 2
    rt = records[-1]["runtime"]
    assert got[("tempo_dispatch_table_version", frozenset())] == rt["version"]
    assert got[("tempo_dispatch_windows_total", frozenset([("outcome", "published")]))] == rt["windows"]["published"]
    assert rt["windows"]["published"] >= 1
    rep = json.loads((tmp_path / "serve.json").read_text())
    assert rep["watch"]["series"] == len(got) and rep["watch"]["records"] == steps and rep["watch"]["url"] == url
    events = _events(tmp_path / "tb")
    assert [e.value for e in events.Scalars("moe/layer1/pairs")] == [T * K] * steps


def _events(logdir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    return acc


def test_training_writes_tensorboard_and_a_report(tmp_path, capsys):
    """`tempo_jax.lm.train(logdir=)`: TensorBoard's reader finds the loss of every step and each layer's expert-load
    histogram equal to the layer's own counts of the last step; `tempo_jax.metrics.log` does the same for a user's
    writer in one call; `tempo-jax report LOGDIR` draws the three pictures."""
    from tensorboardX import SummaryWriter

    lm = LMConfig(dim=32, layers=2, heads=2, seq_len=16, batch=4, experts=8, ffn=32, slots_per_rank=2)
    result = train(lm, steps=3, logdir=str(tmp_path))
    events = _events(tmp_path)
    assert [e.value for e in events.Scalars("train/loss")] == pytest.approx(result.losses.tolist(), rel=1e-6)
    assert [e.step for e in events.Scalars("train/loss")] == [0, 1, 2]
    for i, block in enumerate(result.model.blocks):
        own = np.asarray(block.moe.stats.get_value().shard_counts).sum(0)
        hist = events.Histograms(f"moe/layer{i}/expert_load")[-1]
        assert hist.step == 2 and hist.histogram_value.bucket == own.tolist()
        toks = np.asarray(block.moe.stats.get_value().gpu_tokens)
        bal = events.Scalars(f"moe/layer{i}/balancedness_tokens")[-1].value
        assert bal == pytest.approx(toks.mean() / toks.max(), rel=1e-6)
    # One call into a writer of one's own.
    with SummaryWriter(str(tmp_path / "mine")) as writer:
        rec = log(writer, result.model, 7, scalars={"my/loss": 1.5})
    mine = _events(tmp_path / "mine")
    assert mine.Scalars("my/loss")[0].step == 7
    own = np.asarray(result.model.blocks[1].moe.stats.get_value().shard_counts).sum(0)
    assert (
        mine.Histograms("moe/layer1/expert_load")[0].histogram_value.bucket
        == own.tolist()
        == rec["layers"][1]["expert_tokens"]
    )
    assert cli.main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "3 steps × 2 MoE layers" in out
    for name in FIGURES:
        assert (tmp_path / name).stat().st_size > 5_000


def test_report_refuses_what_it_cannot_read(tmp_path, capsys):
    with pytest.raises(ValueError, match="does not exist; give a run folder holding metrics.jsonl"):
        read_run(tmp_path / "nowhere")
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "layers": []}\n{"step": 1, "lay')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2 is not JSON .*cut off mid-line"):
        read_run(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"a": 1}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:1 is not a step record"):
        render_run(tmp_path)
    (tmp_path / "metrics.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="holds no step records"):
        read_run(tmp_path)
    assert cli.main(["report", str(tmp_path / "nowhere")]) == 2
    assert "error: report:" in capsys.readouterr().err


def test_watch_options_refuse_what_would_not_act():
    with pytest.raises(ValueError, match="port=70000 is not a TCP port"):
        WatchOptions(port=70000)
    with pytest.raises(ValueError, match="per_rank / per_expert label Prometheus series; set port too"):
        WatchOptions(per_rank=True)
    with pytest.raises(ValueError, match="linger_s=5 keeps /metrics up after the run; set port too"):
        WatchOptions(linger_s=5)
    with pytest.raises(ValueError, match="optimum_every"):
        WatchOptions(optimum_every=-1)
    with pytest.raises(ValueError, match="frozen_steps"):
        StallLimits(frozen_steps=0)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        with pytest.raises(ValueError, match=r"cannot serve /metrics on 127.0.0.1:\d+ .*pick a free port"):
            PrometheusSink(held.getsockname()[1])


# ------------------------------------------------------------------------------------------------ stalls
class _Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def _runtime(closed=0, empty=0, published=0, restarts=0, pairs_in=0.0):
    return {
        "windows": {"closed": closed, "empty": empty, "published": published},
        "restarts": restarts,
        "pairs": {"in": pairs_in},
    }


def _watch(**limits):
    clock = _Clock()
    return StallWatch(StallLimits(**limits), clock=clock), clock


def test_stall_no_publication(caplog):
    """Windows with tokens keep closing, none is published: the gauge rises, a warning names it and since when;
    empty windows do not count; a publication ends it."""
    watch, clock = _watch(publication_windows=3)
    caplog.set_level(logging.INFO, "tempo_jax.runtime")
    watch.update(0, pairs=10, runtime=_runtime(closed=1, published=1, pairs_in=10))
    for s in range(1, 4):
        clock.t += 1.0
        active = watch.update(s, pairs=10, runtime=_runtime(closed=1 + s, empty=s - 1, published=1, pairs_in=10 + s))
        assert not active  # empty windows: nothing to publish
    for s in range(4, 8):
        clock.t += 1.0
        active = watch.update(s, pairs=10, runtime=_runtime(closed=s + 3, empty=2, published=1, pairs_in=10 + s))
    assert (
        active["publication"]["since_step"] == 0
        and "7 windows closed, none published" in active["publication"]["detail"]
    )
    assert watch.gauges()["publication"] == pytest.approx(7.0)
    assert any("stalled: publication since step 0" in r.getMessage() for r in caplog.records)
    watch.update(8, pairs=10, runtime=_runtime(closed=12, empty=2, published=2, pairs_in=30))
    assert "publication" not in watch.active and ("end", "publication", 8) in watch.events


def test_stall_restart_loop(caplog):
    watch, clock = _watch(restarts=3, restart_window_s=60.0)
    for s, restarts in enumerate([0, 1, 1, 2, 3]):
        clock.t += 5.0
        active = watch.update(s, pairs=10, runtime=_runtime(published=s, closed=s, restarts=restarts, pairs_in=s))
    assert (
        active["restart_loop"]["since_step"] == 1
        and "3 solver restarts within 60 s" in active["restart_loop"]["detail"]
    )
    assert any("stalled: restart_loop" in r.getMessage() for r in caplog.records)
    clock.t += 61.0
    assert "restart_loop" not in watch.update(
        5, pairs=10, runtime=_runtime(published=5, closed=5, restarts=3, pairs_in=5)
    )


def test_stall_replacement_churn(caplog):
    """Re-placements that keep moving slots for (almost) no modelled gain; a gainful one ends it."""
    watch, _ = _watch(churn_moves=3, min_gain=0.01)

    def move(before, after):
        return {"applied": True, "moved_slots": 12, "makespan_before_us": before, "makespan_after_us": after}

    for s in range(3):
        active = watch.update(s, pairs=10, moves=[move(100.0, 99.9)])
    assert active["replacement_churn"]["since_step"] == 0 and "+0.1%" in active["replacement_churn"]["detail"]
    assert any("stalled: replacement_churn" in r.getMessage() for r in caplog.records)
    assert "replacement_churn" not in watch.update(3, pairs=10, moves=[move(100.0, 80.0)])


def test_stall_counters_stop_moving(caplog):
    """Steps that count no pairs, or a fed runtime whose accepted pairs stop moving."""
    watch, _ = _watch(frozen_steps=3)
    for s in range(3):
        active = watch.update(s, pairs=0)
    assert active["counters"]["since_step"] == 0 and "no pairs counted for 3 steps" in active["counters"]["detail"]
    assert "counters" not in watch.update(3, pairs=5)
    watch, _ = _watch(frozen_steps=3)
    for s in range(4):
        active = watch.update(s, pairs=5, runtime=_runtime(published=1, closed=1, pairs_in=40.0))
    assert "the runtime's accepted pairs did not move" in active["counters"]["detail"]
    assert any("stalled: counters" in r.getMessage() for r in caplog.records)
    watch, _ = _watch(frozen_steps=3)
    for s in range(4):  # a paused refresher is not a stall
        active = watch.update(s, pairs=5, runtime=_runtime(published=1, closed=1, pairs_in=40.0), feeding=False)
    assert not active


def test_stalls_reach_the_gauges():
    sink = PrometheusSink()
    rec = {"step": 0, "kind": "step", "layers": [], "stalls": {"publication": 12.5}}
    sink.write(rec)
    got = {(s.name, s.labels.get("what")): s.value for f in sink.registry.collect() for s in f.samples}
    assert got[("tempo_stalled", "publication")] == 1 and got[("tempo_stalled_seconds", "publication")] == 12.5
    assert all(got[("tempo_stalled", w)] == 0 for w in STALLS if w != "publication")


def test_a_donating_step_cannot_pull_the_records_from_under_the_watcher(tmp_path):
    """A jitted step that donates the layer's state deletes last step's statistics arrays; the watcher's capture
    holds buffers of its own, so every record still reads its own step (written by the watcher's thread)."""
    moe, _ = _moe(make_ep_mesh(8))
    step = nnx.jit(lambda m, x: m(x), donate_argnums=0)
    xs = [jax.random.normal(jax.random.key(i), (64 * (i + 1), 16)) for i in range(3)]
    with Watcher(WatchOptions(jsonl=str(tmp_path / "metrics.jsonl"))) as watcher:
        for s, x in enumerate(xs):
            step(moe, x)
            watcher.step(s, moe)
            tokens = np.asarray(moe.stats.get_value().gpu_tokens).tolist()
            watcher.flush()
            assert read_run(tmp_path)[-1]["layers"][0]["tokens"] == tokens
    assert [r["layers"][0]["pairs"] for r in read_run(tmp_path)] == [128, 256, 384]
    cap = capture(moe)
    before = np.asarray(moe.stats.get_value().gpu_tokens).tolist()
    step(moe, xs[0])  # donates (deletes) the arrays the layer held
    assert cap.layers()[0]["gpu_tokens"].tolist() == before and sum(before) == 384


def test_the_in_graph_plan_reports_its_rounds():
    """``dispatch="ingraph"``: the record carries the improvement rounds the in-graph plan ran (every rank the same,
    at least one, at most ``dispatch_rounds``), the Prometheus gauge shows it; with tables it is 0."""
    mesh = make_ep_mesh(8)
    placement = Placement.from_eplb(np.arange(8) + 1.0, 16, 8)
    x = jax.random.normal(jax.random.key(0), (256, 16))
    got = {}
    for dispatch in ("tables", "ingraph"):
        cfg = MoEConfig(
            hidden=16,
            ffn=16,
            experts=8,
            top_k=2,
            slots_per_rank=2,
            dispatch_mode="quota",
            **({"dispatch": "ingraph", "cost": COST} if dispatch == "ingraph" else {}),
        )
        moe = MoE(cfg, placement, mesh=mesh, rngs=nnx.Rngs(params=0, dispatch=1))
        nnx.jit(lambda m, x: m(x))(moe, x)  # the plan's rounds leave a jitted step as layer state
        rounds = np.asarray(moe.stats.get_value().plan_rounds)
        (stats,) = capture(moe).layers()
        got[dispatch] = layer_record(stats, COST)["plan_rounds"]
        assert len(set(rounds.tolist())) == 1 and got[dispatch] == rounds[0]
        if dispatch == "ingraph":
            assert 1 <= got[dispatch] <= cfg.dispatch_rounds
    assert got["tables"] == 0
    sink = PrometheusSink()
    layer = layer_record(stats, COST)
    sink.write({"step": 0, "kind": "step", "layers": [layer], "stalls": {}})
    samples = {s.name: s.value for f in sink.registry.collect() for s in f.samples}
    assert samples["tempo_moe_plan_rounds"] == got["ingraph"]


def test_dynamic_copies_are_reported_per_rank_and_exported():
    """``dynamic_slots``: a router that sends most pairs to expert 3 (one home) makes the in-graph plan copy it;
    ``moe.copies`` holds what each rank received, the record sums them and the Prometheus gauge shows the sum
    without dynamic slots it is 0."""
    from solvers import CopyCost, CostModel

    mesh = make_ep_mesh(8)
    placement = Placement.from_eplb(np.ones(8), 16, 8)
    linear = CostModel(a=0.0, b=0.0, c=0.0, beta=1.0)
    x = jax.random.normal(jax.random.key(0), (512, 16))
    got = {}
    for k in (0, 1):
        cfg = MoEConfig(
            hidden=16,
            ffn=16,
            experts=8,
            top_k=2,
            slots_per_rank=2,
            dispatch="ingraph",
            dispatch_mode="quota",
            cost=linear,
            dynamic_slots=k,
            copy_cost=CopyCost(1e3, 1e6) if k else None,
        )
        moe = MoE(cfg, placement, mesh=mesh, rngs=nnx.Rngs(params=0, dispatch=1))
        w = np.zeros((16, 8), np.float32)
        w[:, 3] = 5.0  # every token's first choice: expert 3
        moe.router.set_value(jax.device_put(w, moe.router.get_value().sharding))
        nnx.jit(lambda m, x: m(x))(moe, x + 1.0)
        per_rank = np.asarray(moe.stats.get_value().copies)
        (stats,) = capture(moe).layers()
        got[k] = layer_record(stats, COST)
        assert got[k]["copies"] == per_rank.sum() and (per_rank <= k).all()
    assert got[0]["copies"] == 0 and got[1]["copies"] >= 4, got[1]["copies"]
    sink = PrometheusSink()
    sink.write({"step": 0, "kind": "step", "layers": [got[1]], "stalls": {}})
    samples = {s.name: s.value for f in sink.registry.collect() for s in f.samples}
    assert samples["tempo_moe_copies"] == got[1]["copies"]


def test_a_runtime_that_never_publishes_raises_its_hand(caplog):
    """End to end: a real controller whose every solve misses its budget publishes nothing; the watcher fed by it
    raises the ``publication`` gauge on its /metrics registry and logs what stalled and since when."""
    from tempo_jax.runtime import DispatchController

    placement = Placement.from_eplb(np.arange(8) + 1.0, 16, 8)
    counts = np.full((8, 8), 4, np.int32)  # [D, E] every step
    stats = {
        "shard_counts": counts,
        "gpu_tokens": np.full(8, 32),
        "gpu_activations": np.full(8, 2),
        "drops": np.zeros(8),
        "rounds": np.ones(8),
        "invalid_ids": np.zeros(8),
        "plan_rounds": np.zeros(8),
        "phy2log": placement.phy2log,
    }
    limits = StallLimits(publication_windows=4)
    ctl = DispatchController(placement, COST, policy="tempo", solver_mode="inline", budget_s=1e-9)
    with ctl, Watcher(WatchOptions(port=0, stalls=limits), say=lambda *a: None) as watcher:
        for s in range(8):
            ctl.observe(counts)
            watcher.step(s, Capture([stats], [(8, 8)], [1], [False]), controller=ctl)
        watcher.flush()
        m = ctl.metrics()
        assert m["windows"]["published"] == 0 and m["windows"]["dropped"]["over_budget"] == 8
        got = {
            (s.name, s.labels.get("what")): s.value for f in watcher.prometheus.registry.collect() for s in f.samples
        }
    assert got[("tempo_stalled", "publication")] == 1 and got[("tempo_stalled_seconds", "publication")] > 0
    assert got[("tempo_stalled", "restart_loop")] == 0
    assert any("stalled: publication since step 0" in r.getMessage() for r in caplog.records)
    assert ("begin", "publication", 3) in watcher.stalls.events


def test_the_capture_copy_moves_nothing_between_devices():
    """The packing program of a capture has no collective (one on XLA:CPU in flight with many others deadlocked its
    rendezvous); arrays that are not on one mesh take the plain copy, read back equal."""
    from tempo_jax.layer.collectives import program_collectives
    from tempo_jax.metrics.record import _host, _Packed, _packer, _start_copies

    for mesh in (make_ep_mesh(8), make_mesh(data=2, ep=4)):
        moe, _ = _moe(mesh)
        moe(jax.random.normal(jax.random.key(0), (64, 16)))
        cap = capture(moe)
        assert isinstance(cap.arrays, _Packed)
        leaves = jax.tree.leaves(cap.arrays.treedef.unflatten([0] * cap.arrays.treedef.num_leaves))
        assert len(leaves) == len(STAT_NAMES) + 1  # the statistics and phy2log of the one layer
        arrays = [{**moe.stats.get_value()._asdict(), "phy2log": moe.phy2log.get_value()}]
        specs = tuple(a.sharding.spec for a in jax.tree.leaves(arrays))
        hlo = _packer(mesh, specs).lower(*jax.tree.leaves(arrays)).compile().as_text()
        assert program_collectives(hlo, mesh) == []
    plain = {"a": jax.numpy.arange(6).reshape(2, 3), "b": jax.device_put(jax.numpy.ones(4), jax.devices()[3])}
    got = _start_copies(plain)
    assert not isinstance(got, _Packed)
    back = _host(got)
    assert back["a"].tolist() == [[0, 1, 2], [3, 4, 5]] and back["b"].tolist() == [1.0] * 4


def test_a_failing_sink_is_raised_and_its_lost_steps_counted(tmp_path):
    """A sink that fails: the loop hears of it at its next call, with how many steps were not recorded; later steps
    are recorded again. A runtime counter that goes down (a new controller) counts its new total, not zero."""

    class Flaky:
        def __init__(self):
            self.steps = []

        def write(self, record):
            if record["step"] == 1:
                raise OSError("disk full")
            self.steps.append(record["step"])

        def close(self, linger_s=0.0):
            pass

    moe, _ = _moe(make_ep_mesh(8))
    moe(jax.random.normal(jax.random.key(0), (64, 16)))
    watcher = Watcher(WatchOptions())
    flaky = Flaky()
    watcher.sinks.append(flaky)
    watcher.step(0, moe)
    watcher.step(1, moe)
    with pytest.raises(RuntimeError, match=r"disk full.*1 step\(s\) in all were not recorded"):
        watcher.flush()
    watcher.step(2, moe)
    watcher.close()
    assert flaky.steps == [0, 2] and watcher.records_lost == 1 and watcher.summary()["records_lost"] == 1
    sink = PrometheusSink()
    for restarts in (3, 5, 2, 4):  # the third record comes from a new controller
        runtime = {
            "version": 1,
            "age_s": 0.1,
            "age_windows": 0,
            "in_fallback": False,
            "restarts": restarts,
            "windows": {"published": 1, "empty": 0, "dropped": {"busy": 0}},
        }
        sink.write({"step": 0, "kind": "step", "layers": [], "runtime": runtime, "stalls": {}})
    samples = {s.name: s.value for f in sink.registry.collect() for s in f.samples}
    assert samples["tempo_dispatch_solver_restarts_total"] == 3 + 2 + 2 + 2
