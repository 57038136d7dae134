"""Option coverage (issue 73) of the mesh helpers (`make_mesh`, `make_ep_mesh`), the metrics watcher (`WatchOptions`,
`Watcher`), `report` (`render_run`, ``tempo-jax report``) and ``serve``'s metrics options: generated from the
signatures, the dataclass fields and the parser's metrics group, so a new option without an entry here fails until
someone says what it changes and what it refuses.

Each entry: ``(another value, what shows it acted, a bad value or combination, the refusal's message)``; a value
that names a path is a function of the run's folder.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from solvers import PRESETS, Placement
from tempo_jax import MoE, MoEConfig
from tempo_jax.cli import main
from tempo_jax.cli import serve as serve_cli
from tempo_jax.cli.main import build_parser
from tempo_jax.layer import make_ep_mesh, make_mesh
from tempo_jax.metrics import StallLimits, Watcher, WatchOptions
from tempo_jax.metrics.report import FIGURES, render_run

AUTO, EXPLICIT = jax.sharding.AxisType.Auto, jax.sharding.AxisType.Explicit


def _devices():
    return jax.devices()


# -------------------------------------------------------------------------------------------- the mesh helpers
MAKE_MESH = {
    "data": ({"data": 2}, lambda m: m.shape["data"] == 2, {"data": 0}, "data must be a positive int"),
    "ep": ({"ep": 4}, lambda m: m.shape["ep"] == 4, {"ep": 16}, "no larger than the 8 devices"),
    # a node axis before ep (the experts over nodes × ranks: MoEConfig(node_axis="node")); none unless asked for
    "node": ({"node": 2}, lambda m: "node" in m.axis_names, {"node": 3}, "does not divide the 8 devices"),
    "tensor": ({"tensor": 2}, lambda m: m.shape["tensor"] == 2, {"tensor": 3}, "does not divide the 8 devices"),
    "devices": (
        {"devices": lambda: _devices()[::-1]},
        lambda m: m.devices.flat[0] == _devices()[-1],
        {"devices": lambda: [_devices()[0]] * 2},
        "is listed twice",
    ),
    "explicit": ({"explicit": True}, lambda m: m.axis_types[0] == EXPLICIT, {"explicit": 1}, "True or False"),
}
MAKE_EP_MESH = {
    "num_devices": ((4,), lambda m: m.shape["ep"] == 4, (0,), "num_devices must be a positive int"),
    "axis": ((8, "x"), lambda m: m.axis_names == ("x",), (8, ""), "axis must be a non-empty axis name"),
}


def _kw(kw: dict) -> dict:
    return {k: v() if callable(v) else v for k, v in kw.items()}


def test_every_mesh_helper_option_has_an_entry():
    assert set(inspect.signature(make_mesh).parameters) == set(MAKE_MESH), "say what the new make_mesh option does"
    assert set(inspect.signature(make_ep_mesh).parameters) == set(MAKE_EP_MESH), "and make_ep_mesh's"


@pytest.mark.parametrize("name", sorted(MAKE_MESH))
def test_each_make_mesh_option_acts_and_refuses_a_bad_value(name):
    good, acted, bad, match = MAKE_MESH[name]
    assert not acted(make_mesh()) and acted(make_mesh(**_kw(good)))
    with pytest.raises(ValueError, match=match):
        make_mesh(**_kw(bad))


@pytest.mark.parametrize("name", sorted(MAKE_EP_MESH))
def test_each_make_ep_mesh_option_acts_and_refuses_a_bad_value(name):
    good, acted, bad, match = MAKE_EP_MESH[name]
    assert not acted(make_ep_mesh()) and acted(make_ep_mesh(*good))
    with pytest.raises(ValueError, match=match):
        make_ep_mesh(*bad)


# -------------------------------------------------------------------------------------------- the watcher
@pytest.fixture(scope="module")
def model():
    cfg = MoEConfig(hidden=8, ffn=8, experts=8, top_k=2, slots_per_rank=2)
    placement = Placement.from_eplb(np.arange(8) + 1.0, 16, 8)
    moe = MoE(cfg, placement, mesh=make_ep_mesh(8), rngs=nnx.Rngs(params=0, dispatch=1))
    x = jax.random.normal(jax.random.key(0), (64, 8)) * jnp.linspace(0.2, 3.0, 8)  # skewed routing
    return moe, x


def _watch(model, tmp_path, options: dict | None = None, **watcher) -> dict:
    """Two watched steps (the second with every token masked: no pairs) → what came out: the records, the summary,
    the announcements, the event files."""
    moe, x = model
    said: list[str] = []
    tmp_path.mkdir(parents=True, exist_ok=True)
    opts = WatchOptions(**{"jsonl": str(tmp_path / "m.jsonl"), **(options or {})})
    w = Watcher(opts, say=watcher.pop("say", said.append), **watcher)
    for s, mask in enumerate((None, jnp.zeros((x.shape[0],), bool))):
        moe(x, mask=mask)
        w.step(s, moe)
    w.close()
    records = [json.loads(line) for line in open(opts.jsonl).read().splitlines()]
    events = sorted(p.name for p in (tmp_path / "tb").glob("*")) if (tmp_path / "tb").exists() else []
    files = sorted(p.name for p in tmp_path.glob("*.jsonl"))
    return {"records": records, "summary": w.summary(), "said": said, "events": events, "files": files}


WATCH = {
    "port": (dict(port=0), lambda r: r["summary"]["url"] is not None, dict(port=-1), "port must be"),
    "addr": (
        dict(port=0, addr="localhost"),
        lambda r: "localhost" in (r["summary"]["url"] or ""),
        dict(addr="0.0.0.0"),
        "addr='0.0.0.0' is where /metrics is served; set port too",
    ),
    "per_rank": (
        dict(port=0, per_rank=True),
        lambda r: any("per_rank" in s for s in r["said"]),
        dict(per_rank=True),
        "set port too",
    ),
    "per_expert": (
        dict(port=0, per_expert=True),
        lambda r: any("per_expert" in s for s in r["said"]),
        dict(per_expert=True),
        "set port too",
    ),
    "linger_s": (
        dict(port=0, linger_s=0.01),
        lambda r: any("stays up until one more scrape" in s for s in r["said"]),
        dict(linger_s=1.0),
        "set port too",
    ),
    "logdir": (
        lambda d: dict(logdir=str(d / "tb")),
        lambda r: bool(r["events"]),
        dict(logdir=""),
        "logdir='' is not a path",
    ),
    "jsonl": (
        lambda d: dict(jsonl=str(d / "other.jsonl")),
        lambda r: r["files"] == ["other.jsonl"],
        dict(jsonl=""),
        "jsonl='' is not a path",
    ),
    "optimum_every": (
        dict(optimum_every=1),
        lambda r: r["records"][1]["layers"][0]["makespan_us"]["optimum"] is not None,
        dict(optimum_every=-1),
        "optimum_every",
    ),
    "stalls": (
        dict(stalls=StallLimits(frozen_steps=1)),
        lambda r: bool(r["summary"]["stall_events"]),
        dict(stalls={"frozen_steps": 1}),
        "stalls must be a StallLimits",
    ),
}
#: Watcher's own arguments (beside ``options``): the keyword, its value, what shows it acted, a bad value.
WATCHER = {
    "options": None,  # every WATCH entry
    "cost": (PRESETS["proxy_serving_3term"], lambda r, base: _live(r) != _live(base), {"a": 1}, "cost must be"),
    "policy": ("uniform", lambda r, base: _optimum(r) > _optimum(base), "nope", "unknown policy 'nope'"),
    "say": (None, None, "print", "say must be a callable"),  # acted: every announcement above went through it
}


def _live(r):
    return r["records"][0]["layers"][0]["makespan_us"]["live"]


def _optimum(r):
    return r["records"][0]["layers"][0]["makespan_us"]["optimum"]


def test_every_watch_option_has_an_entry():
    assert {f.name for f in dataclasses.fields(WatchOptions)} == set(WATCH), "say what the new WatchOptions field does"
    assert set(inspect.signature(Watcher).parameters) == set(WATCHER), "say what the new Watcher argument does"


@pytest.mark.parametrize("name", sorted(WATCH))
def test_each_watch_option_acts_and_refuses_what_it_cannot_use(name, model, tmp_path):
    good, acted, bad, match = WATCH[name]
    good = good(tmp_path / "run") if callable(good) else good  # a path inside the run's folder
    base = _watch(model, tmp_path / "base")
    assert not acted(base) and acted(_watch(model, tmp_path / "run", good))
    with pytest.raises((ValueError, TypeError), match=match):
        WatchOptions(**bad)


@pytest.mark.parametrize("name", ["cost", "policy", "say"])
def test_each_watcher_argument_acts_and_refuses_what_it_cannot_use(name, model, tmp_path):
    value, acted, bad, match = WATCHER[name]
    if acted is not None:
        base = _watch(model, tmp_path / "base", dict(optimum_every=1))
        assert acted(_watch(model, tmp_path / "run", dict(optimum_every=1), **{name: value}), base)
    with pytest.raises((ValueError, TypeError), match=match):
        Watcher(WatchOptions(), **{name: bad})


# -------------------------------------------------------------------------------------------- report
def _run_folder(model, tmp_path):
    _watch(model, tmp_path, dict(jsonl=str(tmp_path / "metrics.jsonl")))
    return tmp_path


def test_report_options_act_and_refuse_what_they_cannot_use(model, tmp_path, capsys):
    """`render_run(run, out)` and ``tempo-jax report RUN --out``: ``out`` moves the pictures; a file in its place,
    a missing run and an empty --out are refused."""
    assert set(inspect.signature(render_run).parameters) == {"run", "out"}, "say what the new report option does"
    run = _run_folder(model, tmp_path / "run")
    beside = render_run(run)["figures"]
    assert {p.rsplit("/", 1)[0] for p in beside} == {str(run)}
    elsewhere = render_run(run, tmp_path / "pngs")["figures"]
    assert sorted(p.rsplit("/", 1)[1] for p in elsewhere) == sorted(FIGURES)
    assert all(p.startswith(str(tmp_path / "pngs")) for p in elsewhere)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="cannot make the folder"):
        render_run(run, tmp_path / "file" / "pngs")
    with pytest.raises(ValueError, match="does not exist"):
        render_run(tmp_path / "nowhere")
    cli = _subcommand("report")
    assert {a.dest for a in cli._actions} - {"help", "debug"} == {"run", "out"}
    assert main(["report", str(run), "--out", str(tmp_path / "cli")]) == 0
    assert sorted(p.name for p in (tmp_path / "cli").glob("*.png")) == sorted(FIGURES)
    assert main(["report", str(run), "--out", ""]) == 2
    assert "--out is empty" in capsys.readouterr().err


# -------------------------------------------------------------------------------------------- serve's metrics options
def _subcommand(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def _metrics_group() -> set[str]:
    group = next(g for g in _subcommand("serve")._action_groups if (g.title or "").startswith("metrics"))
    return {a.option_strings[0] for a in group._group_actions}


#: option → (its value on the command line, the WatchOptions field and value it must give, a bad command line
#: (beside --out), the refusal's message).
SERVE = {
    "--metrics-port": (["--metrics-port", "0"], ("port", 0), ["--metrics-port", "70000"], "not a TCP port"),
    "--metrics-addr": (
        ["--metrics-port", "0", "--metrics-addr", "0.0.0.0"],
        ("addr", "0.0.0.0"),
        ["--metrics-addr", "0.0.0.0"],
        "set port too",
    ),
    "--metrics-per-rank": (
        ["--metrics-port", "0", "--metrics-per-rank"],
        ("per_rank", True),
        ["--metrics-per-rank"],
        "set port too",
    ),
    "--metrics-per-expert": (
        ["--metrics-port", "0", "--metrics-per-expert"],
        ("per_expert", True),
        ["--metrics-per-expert"],
        "set port too",
    ),
    "--metrics-linger-s": (
        ["--metrics-port", "0", "--metrics-linger-s", "2"],
        ("linger_s", 2.0),
        ["--metrics-port", "0", "--metrics-linger-s", "-1"],
        "linger_s",
    ),
    "--logdir": (["--logdir", "TB"], ("logdir", "TB"), ["--logdir", ""], "--logdir is empty"),
}


def test_every_serve_metrics_option_has_an_entry():
    assert _metrics_group() == set(SERVE), "say what the new serve metrics option does"


@pytest.mark.parametrize("option", sorted(SERVE))
def test_each_serve_metrics_option_reaches_the_watcher_or_is_refused(option, tmp_path, monkeypatch, capsys):
    got = []
    monkeypatch.setattr(serve_cli, "serve", lambda cfg, **kw: got.append(kw["watch"]))
    good, (field, value), bad, match = SERVE[option]
    good = [str(tmp_path / "tb") if a == "TB" else a for a in good]
    value = str(tmp_path / "tb") if value == "TB" else value
    assert main(["serve", "--out", str(tmp_path / "out"), *good]) == 0
    assert getattr(got[0], field) == value and getattr(WatchOptions(), field) != value
    assert main(["serve", "--out", str(tmp_path / "out"), *bad]) == 2
    assert match in capsys.readouterr().err
