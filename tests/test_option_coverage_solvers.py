"""Option coverage of the solvers and TEMPO's simulators (issue 40): every field of `TempoOptions`, `PhaseConfig`
and the replay configs (`PolicyConfig`, `InformationConfig`, `RefreshConfig`, `VariantConfig`), and every option of
the ``solve``, ``phase`` and ``calibrate`` commands, changes the run or is refused in combination. Generated from
the dataclasses' fields and the parsers' options, so a new one without an entry here fails until someone says what
it changes. numpy only (no layer is compiled): seconds.
"""

import argparse
import dataclasses
import json
import sys

import numpy as np
import pytest

import solvers.tempo_fast as tempo_fast
from solvers import solve
from solvers.tempo_fast import TempoOptions
from tempo_jax.cli import main
from tempo_jax.cli.main import build_parser
from tempo_jax.sim.tempo.phase import PhaseConfig, run_phase
from tempo_jax.sim.tempo.protocols import (
    InformationConfig,
    PolicyConfig,
    RefreshConfig,
    ReplayConfig,
    VariantConfig,
    run_information,
    run_policies,
    run_refresh,
    run_variants,
)
from tempo_jax.sim.tempo.replay import SyntheticStreams

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from test_target_repair import _dsv3_ep8  # noqa: E402  (DeepSeek-V3, EP8, B = 512: every stage of tempo runs)


def _changes(fingerprint, base: dict, name: str, value, context: dict | None = None) -> bool:
    context = context or {}
    return fingerprint(**{**base, **context}) != fingerprint(**{**base, **context, name: value})


# ------------------------------------------------------------------------------------------------ TempoOptions
#: field → (another value, the options both runs share). On the DeepSeek-V3 EP8 batch every stage runs (seed,
#: chains, local search, level partition, level search, repair), so each option changes the dispatch, what `info`
#: reports, or the arguments a stage is called with.
TEMPO = {
    "tile_aware": (True, {}),
    "chains": (False, {}),
    "chain_depth": (2, {}),
    "local_search": (False, {}),
    "partial_moves": (False, {}),
    "ensemble": (False, {}),
    "tau": (0.5, {}),
    "max_iters": (1, {}),
    "repair": (False, {"level_search": False}),
    "repair_flows": (1, {"level_search": False}),
    "split_seed": (False, {}),
    "level_search": (False, {}),
    "level_work": (0.5, {}),
    "stop_gap": (0.5, {}),
    "time_budget_ms": (0.0, {}),
}
STAGES = ("chains", "local_search", "level_partition", "level_search", "target_repair")


@pytest.fixture(scope="module")
def tempo_fingerprint():
    problem = _dsv3_ep8(1.2, 1)
    calls: list = []
    scalars = (int, float, bool, str, type(None))

    def spy(name):
        stage = getattr(tempo_fast, name)

        def recorded(*args, **kw):
            calls.append(
                (
                    name,
                    tuple(a for a in args if isinstance(a, scalars)),
                    tuple(sorted((k, v) for k, v in kw.items() if isinstance(v, scalars))),
                )
            )
            return stage(*args, **kw)

        return recorded

    with pytest.MonkeyPatch.context() as mp:
        for name in STAGES:
            mp.setattr(tempo_fast, name, spy(name))

        def fingerprint(**opts):
            calls.clear()
            d = solve(problem, "tempo", **opts)
            info = tuple(
                sorted(
                    (k, v)
                    for k, v in d.info.items()
                    if k not in ("elapsed_ms", "solve_time_s") and isinstance(v, scalars)
                )
            )
            return d.x.round(6).tobytes(), info, tuple(calls)

        yield fingerprint


def test_every_tempo_option_has_an_entry():
    assert {f.name for f in dataclasses.fields(TempoOptions)} == set(TEMPO), "say what the new option changes"


@pytest.mark.parametrize("name", sorted(TEMPO))
def test_each_tempo_option_changes_the_solve(name, tempo_fingerprint):
    value, context = TEMPO[name]
    assert _changes(tempo_fingerprint, {}, name, value, context), name


# ------------------------------------------------------------------------------------------------ PhaseConfig
PHASE_BASE = dict(
    presets=("dsv2_lite_offline",),
    eps=(8,),
    replications=(1.25,),
    skews=(1.2,),
    tokens_per_gpu=(64,),
    batches=1,
    placement_draws=4,
)
#: field → (another value, the options both runs share, the options it is refused without or None).
PHASE = {
    "presets": (("qwen3_30b_offline",), {}, None),
    "eps": ((4,), {}, None),
    "replications": ((1.5,), {}, None),
    "skews": ((0.3,), {}, None),
    "tokens_per_gpu": ((256,), {}, None),
    "kappa": (20.0, {}, None),
    "batches": (2, {}, None),
    "seed": (1, {}, None),
    "placement_draws": (0, {}, None),
    "comm_slope": (0.5, {}, None),
    "comm_floor": (40.0, {"comm_slope": 0.5}, {"comm_slope": 0.5}),
    "tau": (0.9, {"presets": ("dsv3_fp8_offline",), "tokens_per_gpu": (512,)}, None),  # where the ensemble acts
}


def _phase(**kw) -> bytes:
    return run_phase(PhaseConfig(**kw), workers=1, cache_dir=None, progress=False).makespan.round(9).tobytes()


def test_every_phase_option_has_an_entry():
    assert {f.name for f in dataclasses.fields(PhaseConfig)} == set(PHASE), "say what the new option changes"


@pytest.mark.parametrize("name", sorted(PHASE))
def test_each_phase_option_changes_the_sweep_or_is_refused_without_what_it_needs(name):
    value, context, needs = PHASE[name]
    if needs is not None:
        with pytest.raises(ValueError, match=name):
            PhaseConfig(**{**PHASE_BASE, name: value})
    assert _changes(_phase, PHASE_BASE, name, value, context), name


# ------------------------------------------------------------------------------------------------ replay configs
REPLAY_BASE = dict(
    source="synthetic", synthetic=SyntheticStreams(streams=1, windows=4), tokens_per_step=(256,), max_windows=3
)
#: `ReplayConfig` field → (another value, the options both runs share, the options it is refused without or None);
#: run through `run_policies` (the other protocols share these fields and how they are read).
REPLAY = {
    "source": ("flame_moe_290m", {"synthetic": SyntheticStreams()}, None),
    "synthetic": (SyntheticStreams(streams=1, windows=4, skew=0.3), {}, {"source": "synthetic"}),
    "tokens_per_step": ((1024,), {}, None),
    "scales": ((4.0,), {}, None),
    "redundants": ((16,), {}, None),
    "drifts": ((0,), {}, None),
    "num_gpus": (16, {}, None),
    "preset": ("dsv3_fp8_offline", {}, None),
    "max_windows": (2, {}, None),
    "tau": (0.6, {"tokens_per_step": (64,)}, None),
    "chain_depth": (2, {"preset": "dsv3_b_tile", "tokens_per_step": (1024,)}, None),
    "seed": (1, {}, None),
}
#: Each protocol's own fields → (another value, the options both runs share).
PROTOCOLS = {
    PolicyConfig: (run_policies, {"policies": (("static", "token_lp"), {})}),
    InformationConfig: (run_information, {"policy": ("token_lp", {}), "fresh": (("token_lp",), {})}),
    RefreshConfig: (run_refresh, {"modes": (("never", "cum1"), {}), "policies": (("static", "token_lp"), {})}),
    VariantConfig: (run_variants, {"variants": (("seed", "+chains"), {})}),
}


def _rows(run, kind, **kw) -> str:
    rows = run(kind(**kw), workers=1, cache_dir=None, progress=False)
    return json.dumps(rows, sort_keys=True, default=float)


def test_every_replay_option_has_an_entry():
    assert {f.name for f in dataclasses.fields(ReplayConfig)} == set(REPLAY), "say what the new option changes"
    for kind, (_, own) in PROTOCOLS.items():
        fields = {f.name for f in dataclasses.fields(kind)} - set(REPLAY)
        assert fields == set(own), f"say what the new {kind.__name__} option changes"


@pytest.mark.parametrize("name", sorted(REPLAY))
def test_each_replay_option_changes_the_rows_or_is_refused_without_what_it_needs(name):
    value, context, needs = REPLAY[name]
    if needs is not None:
        with pytest.raises(ValueError, match=name):
            PolicyConfig(
                **{
                    **REPLAY_BASE,
                    **{k: v for k, v in context.items() if k not in needs},
                    "source": "flame_moe_290m",
                    name: value,
                }
            )
    base = {**REPLAY_BASE, "policies": ("static", "tempo")}
    assert _changes(lambda **kw: _rows(run_policies, PolicyConfig, **kw), base, name, value, context), name


@pytest.mark.parametrize(
    ("kind", "name"),
    [(k, n) for k in PROTOCOLS for n in sorted(PROTOCOLS[k][1])],
    ids=lambda v: getattr(v, "__name__", v),
)
def test_each_protocol_option_changes_the_rows(kind, name):
    run, own = PROTOCOLS[kind]
    value, context = own[name]
    assert _changes(lambda **kw: _rows(run, kind, **kw), REPLAY_BASE, name, value, context), f"{kind.__name__}.{name}"


# ------------------------------------------------------------------------------------------------ the CLI
def _options(command: str) -> set[str]:
    """The long option strings of one sub-command (help excluded)."""
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    return {
        max(a.option_strings, key=len)
        for a in sub._actions
        if a.option_strings and not isinstance(a, argparse._HelpAction)
    } | {a.dest for a in sub._actions if not a.option_strings}


#: command → its base argv and, per option, (argv that adds it, what shows it: "out" = stdout or the written
#: files change, "refused" = refused without the option named by the third element, which then makes it act).
SOLVE_BASE = ["solve", "--trace", "flame_moe_290m", "--policy", "token_lp"]
CLI = {
    "solve": (
        SOLVE_BASE,
        {
            "--counts": (["--counts", "{counts}"], "out"),  # replaces --trace (exactly one of them)
            "--trace": (["--trace", "olmoe_1b_7b"], "out"),
            "--layer": (["--layer", "3"], "out"),
            "--batch": (["--batch", "1"], "out"),
            "--tokens-per-rank": (["--tokens-per-rank", "32"], "out"),
            "--gpus": (["--gpus", "4"], "out"),
            "--placement": (["--placement", "{placement}"], "out"),
            "--replicas": (["--replicas", "80"], "out"),
            "--cost": (["--cost", "qwen3_30b_offline"], "out"),
            "--cost-json": (["--cost-json", "{cost}"], "out"),
            "--policy": (["--policy", "metro"], "out"),
            "--options": (["--policy", "tempo", "--options", '{{"max_iters": 0, "chains": false}}'], "out"),
            "--out": (["--out", "{out}"], "out"),
            "--debug": (["--gpus", "0", "--debug"], "out"),  # an error's traceback
        },
    ),
    "phase": (
        ["phase", "--skews", "1.2", "--tokens-per-gpu", "64", "--batches", "1", "--workers", "1"],
        {
            "--preset": (["--preset", "dsv2_lite_offline"], "out"),
            "--ep": (["--ep", "4"], "out"),
            "--replication": (["--replication", "1.5"], "out"),
            "--skews": (["--skews", "0.3"], "out"),
            "--tokens-per-gpu": (["--tokens-per-gpu", "16"], "out"),
            "--batches": (["--batches", "2"], "out"),
            "--workers": (["--workers", "2"], "same"),  # the numbers do not depend on it
            "--debug": (["--ep", "0", "--debug"], "out"),
        },
    ),
    "calibrate": (
        ["calibrate", "{csv}"],
        {
            "csv": (["{csv_tiles}"], "out"),
            "--iters": (["--iters", "1"], "out"),
            "--out": (["--out", "{out}"], "out"),
            "--measure": (["--measure"], "refused", None),  # profiles this backend: no CSV (test_calibrate runs it)
            "--quick": (["--quick"], "refused", "--measure"),
            "--bootstrap": (["--bootstrap", "5"], "refused", "--measure"),
            "--profile-csv": (["--profile-csv", "{out}"], "refused", "--measure"),
            "--report": (["--report", "{out}"], "refused", "--measure"),
            "--debug": (["--iters", "0", "--debug"], "out"),
        },
    ),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("cli")
    rng = np.random.default_rng(0)
    (d / "counts.json").write_text(json.dumps(rng.integers(0, 60, (8, 64)).tolist()))
    pl = {"phy2log": [e % 64 for e in range(72)], "num_gpus": 8}
    (d / "placement.json").write_text(json.dumps(pl))
    (d / "cost.json").write_text(json.dumps({"a": 5.0, "b": 20.0, "c": 1.0, "beta": 0.5}))
    G, N = rng.integers(1, 32, 40), rng.integers(1, 4000, 40)
    t = np.maximum(10 + 14 * G, 3 + 0.09 * N)
    tiles = G + N // 128
    (d / "s.csv").write_text("G,N,t\n" + "\n".join(f"{g},{n},{x}" for g, n, x in zip(G, N, t, strict=True)))
    (d / "st.csv").write_text(
        "G,N,T,t\n" + "\n".join(f"{g},{n},{k},{x + 2 * (k - g)}" for g, n, k, x in zip(G, N, tiles, t, strict=True))
    )
    return {
        "counts": d / "counts.json",
        "placement": d / "placement.json",
        "cost": d / "cost.json",
        "csv": d / "s.csv",
        "csv_tiles": d / "st.csv",
        "out": d / "out.json",
    }


def _cli(argv: list[str], files: dict, capsys) -> tuple[int, str, str]:
    out = files["out"]
    out.unlink(missing_ok=True)
    rc = main([a.format(**files) for a in argv])
    got = capsys.readouterr()
    written = out.read_text() if out.exists() else ""
    err = got.err if "Traceback" in got.err else got.err.split("\n")[0]  # the error line, or with --debug the trace
    return rc, got.out.replace(str(out), "OUT"), written + err


@pytest.mark.parametrize("command", sorted(CLI))
def test_every_cli_option_has_an_entry(command):
    assert _options(command) == set(CLI[command][1]), f"say what the new {command} option changes"


@pytest.mark.parametrize(("command", "option"), [(c, o) for c in sorted(CLI) for o in sorted(CLI[c][1])])
def test_each_cli_option_changes_the_output_or_is_refused_without_what_it_needs(command, option, files, capsys):
    base, table = CLI[command]
    argv, shows, *needs = table[option]
    replaced = {"--counts": ("--trace", "flame_moe_290m"), "csv": ("{csv}",)}.get(option, ())  # one source or other
    before = _cli(base, files, capsys)
    after = _cli([a for a in base if a not in replaced] + argv, files, capsys)
    if shows == "same":
        assert before == after, option
        return
    if shows == "refused":
        assert after[0] == 2 and option in after[2], (option, after)
        return
    assert before[0] == 0 and before != after, (option, after)
