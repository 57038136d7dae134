"""Option coverage (issue 40): every option changes the run or is refused in combination, and a run's JSON records
only the options that acted. Generated from the config dataclasses' fields, so a new field without an entry here
fails until someone says what it changes.
"""

import dataclasses
import json

import pytest

from tempo_jax.cli import main
from tempo_jax.runtime.serve_config import ServeConfig
from tempo_jax.sim import CascadeConfig
from tempo_jax.sim.cascade import run_cascade
from tempo_jax.sim.cascade.costs import HARDWARE

# ------------------------------------------------------------------------------------------------ CascadeConfig
BASE = dict(trace="mooncake_sample", max_requests=12)
SHARED = "shared-prefix trace"  # placeholder: requests sharing 8 prefix blocks (a file the fixture writes)
#: field → (another value, the options it needs to act: refused without them, a setting where it shows). The run is
#: one "cascade" mode serving (its OEWF, launch and pricing rules all act), fingerprinted by its summary.
CASCADE = {
    "model": ("deepseek_v3", {}, {}),
    "num_ranks": (4, {}, {}),
    "trace": ("synthetic", {}, {}),
    "max_requests": (8, {}, {}),
    "rate_rps": (2.0, {}, {}),
    "placement": ("least_loaded", {}, {}),
    "max_batch_tokens": (4096, {}, {}),
    "cache_blocks": (2, {}, {"trace": SHARED}),  # the mooncake sample's first requests barely reuse a prefix
    "routing": ("zipf", {}, {}),
    "skew": (2.0, {"routing": "zipf"}, {}),
    "attention": ("sparse", {}, {}),
    "key_budget": (256, {"attention": "sparse"}, {}),
    "replication": (1.25, {"timeline": "reference"}, {}),
    "dispatch": ("tempo", {"timeline": "reference", "replication": 1.25}, {}),
    "estimates": ("exact", {}, {}),
    "attention_step_noise": (0.3, {}, {}),
    "links": ("paper", {}, {}),
    "launch": ("planned", {}, {}),
    "commit": ("any", {}, {"routing": "zipf", "skew": 1.2}),  # App. C's other reading: moves the first abandons
    "combine_scale": (0.0, {}, {}),
    "link_scale": (0.25, {}, {}),
    "gpus_per_node": (4, {}, {}),  # two nodes of the 8 ranks: a chunk between them crosses the NIC
    "node_link_scale": (4.0, {"gpus_per_node": 4}, {}),
    "helper_budget_experts": (1, {}, {}),
    "stream_rho": (0.8, {}, {}),
    "guard": (True, {"timeline": "reference", "replication": 1.25}, {}),
    "pricing": ("tempo", {"timeline": "reference"}, {"routing": "zipf", "skew": 2.0}),  # admissions differ when skewed
    "synthetic_requests": (20, {"trace": "synthetic"}, {}),
    "synthetic_rate_rps": (20.0, {"trace": "synthetic"}, {}),
    "seed": (1, {}, {}),
    "vary_workload": (False, {}, {"seed": 1}),  # seed 0 serves the trace and recording as they are
}
#: Options that choose an implementation, not a result: the run must come out the same (to float tolerance).
CASCADE_SAME = {"timeline": "reference"}
#: Options with a single valid value today (nothing to change): a second value makes this test ask for an entry.
CASCADE_ONE = {"hardware": HARDWARE}


def _fingerprint(cfg: CascadeConfig) -> dict:
    run = run_cascade(cfg, ("cascade",), workers=1, progress=False, cache_dir=None)["cascade"]
    return {k: v for k, v in run.summary().items() if isinstance(v, int | float)}


def test_every_cascade_option_has_an_entry():
    fields = {f.name for f in dataclasses.fields(CascadeConfig)}
    assert fields == set(CASCADE) | set(CASCADE_SAME) | set(CASCADE_ONE), "say what the new option changes"
    for name, choices in CASCADE_ONE.items():
        assert len(choices) == 1, f"{name} has more than one value now: give it an entry in CASCADE"


@pytest.fixture(scope="module")
def shared_trace(tmp_path_factory) -> str:
    p = tmp_path_factory.mktemp("traces") / "shared.jsonl"
    p.write_text(
        "\n".join(
            json.dumps(
                {"timestamp": 100 * i, "input_length": 512 * 9, "output_length": 1, "hash_ids": [*range(1, 9), 100 + i]}
            )
            for i in range(12)
        )
        + "\n"
    )
    return str(p)


@pytest.mark.parametrize("name", sorted(CASCADE))
def test_each_cascade_option_changes_the_run_or_is_refused_without_what_it_needs(name, shared_trace):
    value, needs, shows = CASCADE[name]
    if needs:  # refused alone (it would be inert) ...
        inert = ("skew", "synthetic_requests", "synthetic_rate_rps", "key_budget", "node_link_scale")
        with pytest.raises(ValueError, match=name if name in inert else "timeline|replication"):
            CascadeConfig(**{**BASE, name: value})
    kw = {**BASE, **needs, **shows}
    kw = {k: shared_trace if v == SHARED else v for k, v in kw.items()}
    base = CascadeConfig(**kw)  # ... and acts with it
    assert _fingerprint(dataclasses.replace(base, **{name: value})) != _fingerprint(base), name


def test_implementation_options_keep_the_result():
    base = CascadeConfig(**BASE)
    for name, value in CASCADE_SAME.items():
        a, b = _fingerprint(base), _fingerprint(dataclasses.replace(base, **{name: value}))
        assert a.keys() == b.keys() and all(b[k] == pytest.approx(a[k], rel=1e-9, abs=1e-12) for k in a), name


def test_cascade_out_records_only_the_options_that_acted(tmp_path):
    out = tmp_path / "c.json"
    assert (
        main(["cascade", "--trace", "mooncake_sample", "--requests", "12", "--modes", "sync", "--out", str(out)]) == 0
    )
    recorded = json.loads(out.read_text())["config"]
    inert = {"skew", "synthetic_requests", "synthetic_rate_rps", "key_budget", "node_link_scale"}
    assert not inert & set(recorded)  # recorded routing, dense attention, one node
    assert recorded["trace"] == "mooncake_sample" and recorded["max_requests"] == 12
    zipf = CascadeConfig(
        trace="synthetic", routing="zipf", skew=1.5, synthetic_requests=9, attention="sparse", key_budget=512
    ).acting()
    assert zipf["skew"] == 1.5 and zipf["key_budget"] == 512
    assert set(zipf) == set(CASCADE) - {"node_link_scale"} | {"timeline", "hardware"}
    assert CascadeConfig(num_ranks=16, gpus_per_node=8).acting()["node_link_scale"] == 1.0


# ------------------------------------------------------------------------------------------------ ServeConfig
#: field → (another value, the options it needs to act: refused without them); ``{}``: it acts alone. A serve run
#: compiles a model, so here each option's refusal and its presence in the recorded config are checked, not a run.
SERVE = {
    "model": ("layer", {}),
    "steps": (5, {}),
    "tokens_per_rank": (64, {}),
    "routing": ("recorded", {"model": "layer"}),
    "trace": ("flame_moe_290m", {"model": "layer", "routing": "recorded"}),
    "experts": (32, {}),
    "top_k": (2, {}),
    "skew": (0.5, {"model": "layer"}),
    "drift": (0.5, {"model": "layer"}),
    "kappa": (50.0, {"model": "layer"}),
    "hidden": (64, {}),
    "ffn": (64, {}),
    "layers": (3, {}),
    "seq_len": (8, {}),
    "decode_steps": (1, {}),
    "train_steps": (1, {}),
    "replication": (1.25, {}),
    "dispatch_mode": ("sample", {}),
    "policy": ("token_lp", {}),
    "cost": ("qwen3_30b_offline", {}),
    "cost_json": ("cost.json", {}),
    "solver_mode": ("inline", {}),
    "period_s": (0.5, {}),
    "every_steps": (2, {}),
    "budget_s": (0.5, {}),
    "staleness_s": (1.0, {}),
    "fallback": ("static", {}),
    "kill_worker_at": (3, {}),
    "rebalance_every": (None, {}),
    "move_gbps": (400.0, {}),
    "move_margin": (3.0, {}),
    "block": (5, {}),
    "check_every": (5, {"model": "layer"}),
    "seed": (1, {}),
    "mesh": ("data=2,ep=4", {}),
}


def test_every_serve_option_has_an_entry():
    assert {f.name for f in dataclasses.fields(ServeConfig)} == set(SERVE), "say what the new option changes"


@pytest.mark.parametrize("name", sorted(SERVE))
def test_each_serve_option_is_refused_without_what_it_needs_and_recorded_only_where_it_acts(name):
    value, needs = SERVE[name]
    if needs:
        with pytest.raises(ValueError, match=name):
            ServeConfig(**{name: value})
    cfg = ServeConfig(**needs, **{name: value})
    assert cfg.acting()[name] == getattr(cfg, name)  # it acts, so serve.json records it
    inert = ServeConfig(**needs).acting()
    if name in ("period_s", "fallback", "cost", "cost_json"):
        return  # recorded or not by another option's value (below)
    assert name in inert or getattr(ServeConfig(**needs), name) == ServeConfig().__getattribute__(name)


def test_serve_records_neither_the_other_models_options_nor_the_inert_ones():
    lm = ServeConfig().acting()
    assert not {"skew", "drift", "kappa", "check_every", "routing"} & set(lm) and "layers" in lm
    layer = ServeConfig(model="layer", routing="recorded").acting()
    assert not {"layers", "seq_len", "experts", "top_k", "skew"} & set(layer) and layer["trace"] == "flame_moe_290m"
    assert "period_s" not in ServeConfig(every_steps=2).acting() and "period_s" in ServeConfig().acting()
    assert "fallback" not in ServeConfig(staleness_s=None).acting()
    assert "move_gbps" not in ServeConfig(rebalance_every=None).acting() and "move_margin" in ServeConfig().acting()
    with pytest.raises(ValueError, match="move_margin=3.0 price re-placements"):
        ServeConfig(rebalance_every=None, move_margin=3.0)
    assert "cost_json" not in ServeConfig().acting() and "cost" not in ServeConfig(cost_json="c.json").acting()
