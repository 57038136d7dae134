"""Random malformed input to the public API and the CLI: a result or a clear ValueError / TypeError, nothing else.

Issue 17's property test. Values are drawn from a pool of junk (None, bools, strings, NaN, inf, huge and negative
numbers, ragged and nested lists, arrays of odd dtypes and shapes) mixed with valid ones, so that some draws get
past the first checks. Files are valid small recordings with random damage (truncation, flipped bytes, junk
inserted) or pure random bytes. Sizes stay tiny: the whole file runs in a few seconds.
"""

import contextlib
import io
import json
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from solvers import POLICIES, PRESETS, CostModel, DispatchProblem, Placement, fit_max_affine, solve
from tempo_jax.cli import main
from tempo_jax.workloads import (
    load_flame_moe,
    load_harmoeny,
    load_mixtral,
    load_sample,
    load_saved_trace,
    load_switch128,
)

CLEAR = (ValueError, TypeError)  # ArgTypeError, JSON and Unicode errors are subclasses
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=5),
    st.lists(st.one_of(st.integers(-3, 10), st.floats(allow_nan=True), st.text(max_size=2)), max_size=5),
    st.lists(st.lists(st.integers(-1, 5), max_size=3), max_size=3),  # ragged
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.sampled_from([np.array([]), np.zeros((2, 0)), np.ones((2, 2, 2)), np.array(["a", "b"]), np.array([1 + 2j])]),
    st.sampled_from([np.float32(1.5), np.int64(3), np.bool_(True), np.array(2.0), object()]),
)


def mostly(valid, bad=junk):
    """Three draws in four from ``valid``: enough of the input gets past the first check to reach the next."""
    return st.one_of(valid, valid, valid, bad)


def _expect_result_or_clear_error(fn):
    try:
        out = fn()
    except CLEAR as err:
        assert str(err), f"{type(err).__name__} without a message"
        event(type(err).__name__)
        return None
    event("result")
    return out


# ------------------------------------------------------------------------------------------------- API
@st.composite
def corrupted(draw, valid: dict) -> dict:
    """``valid`` keyword arguments with up to two of them replaced by junk (none in a quarter of the draws)."""
    names = draw(st.lists(st.sampled_from(sorted(valid)), max_size=2, unique=True))
    if draw(st.integers(0, 3)) == 0:
        names = []
    return {**valid, **{n: draw(junk) for n in names}}


@st.composite
def cost_kwargs(draw) -> dict:
    valid = {"b": draw(st.floats(0, 50)), "beta": draw(st.floats(0, 1)), "a": draw(st.floats(0, 100))}
    if draw(st.booleans()):
        valid.update(b2=draw(st.floats(0, 10)), tile=draw(st.sampled_from([1, 64, 128])))
    if draw(st.booleans()):
        valid.update(c2=draw(st.floats(0, 50)), gamma=draw(st.floats(0, 1)))
    return draw(corrupted(valid))


@FUZZ
@given(cost_kwargs())
def test_cost_model(kwargs):
    model = _expect_result_or_clear_error(lambda: CostModel(**kwargs))
    if model is not None:  # whatever was accepted is a usable, in-domain model
        assert all(v is None or v >= 0 for v in (model.a, model.b, model.c, model.beta, model.b2, model.gamma))
        assert np.isfinite(model.makespan(np.ones((3, 2))))
        assert CostModel.from_json(model.to_json()) == model


@st.composite
def placement_kwargs(draw) -> dict:
    E, D = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    S = draw(st.integers(-(-E // D), -(-E // D) + 2))
    ids = draw(
        st.permutations(list(range(E)) + draw(st.lists(st.integers(0, E - 1), min_size=D * S - E, max_size=D * S - E)))
    )
    valid = {"phy2log": ids, "num_gpus": D, "num_experts": E, "gpus_per_node": draw(st.sampled_from([None, 1]))}
    return draw(corrupted(valid))


@FUZZ
@given(kw=placement_kwargs(), how=st.sampled_from(["from_phy2log", "init", "full", "from_eplb", "from_dict"]))
def test_placement_constructors(kw, how):
    ids, D, E, gpn = kw["phy2log"], kw["num_gpus"], kw["num_experts"], kw["gpus_per_node"]
    build = {
        "from_phy2log": lambda: Placement.from_phy2log(ids, D, gpn, E),
        "init": lambda: Placement(ids, D, E, gpn),
        "full": lambda: Placement.full(E, D, gpn),
        "from_eplb": lambda: Placement.from_eplb(ids, E, D),  # ids as a load [E'], E as the replica count
        "from_dict": lambda: Placement.from_dict(kw),
    }[how]
    p = _expect_result_or_clear_error(build)
    if p is not None:
        assert p.logcnt.min() >= 1 and p.num_slots % p.num_gpus == 0


OPTIONS = {
    "tempo": {"tau": st.floats(0, 0.5), "max_iters": st.integers(0, 50), "chains": st.booleans()},
    "milp": {"time_limit": st.floats(0.1, 1.0), "backend": st.sampled_from(["cp_sat", "highs"])},
}


@st.composite
def problem_kwargs(draw) -> dict:
    E, Gs = draw(st.integers(1, 5)), draw(st.sampled_from([None, 1, 3]))
    shape = (E,) if Gs is None else (Gs, E)
    counts = draw(st.lists(st.integers(0, 400), min_size=int(np.prod(shape)), max_size=int(np.prod(shape))))
    policy = draw(st.sampled_from(sorted(POLICIES)))
    options = {k: draw(v) for k, v in OPTIONS.get(policy, {}).items() if draw(st.booleans())}
    options = draw(corrupted(options)) if options else {}
    valid = {
        "counts": np.reshape(counts, shape),
        "placement": Placement.full(E, draw(st.integers(1, 3))),
        "cost": PRESETS[draw(st.sampled_from(sorted(PRESETS)))],
        "policy": policy,
    }
    return {**draw(corrupted(valid)), "options": options}


@FUZZ
@given(problem_kwargs())
def test_problem_and_solve(kw):
    def run():
        problem = DispatchProblem(kw["counts"], kw["placement"], kw["cost"])
        return solve(problem, kw["policy"], **kw["options"])

    d = _expect_result_or_clear_error(run)
    if d is not None:
        assert np.all(np.isfinite(d.x)) and d.makespan >= d.lower_bound - 1e-6 * max(1.0, d.makespan)


@st.composite
def fit_kwargs(draw) -> dict:
    n = draw(st.integers(4, 10))
    G = draw(st.lists(st.integers(1, 16), min_size=n, max_size=n))
    N = draw(st.lists(st.integers(1, 4000), min_size=n, max_size=n))
    t = draw(st.lists(st.floats(0.5, 1e4), min_size=n, max_size=n))
    return draw(corrupted({"G": G, "N": N, "t": t, "iters": 20}))


@FUZZ
@given(fit_kwargs())
def test_fit(kw):
    fit = _expect_result_or_clear_error(lambda: fit_max_affine(kw["G"], kw["N"], kw["t"], iters=kw["iters"]))
    if fit is not None:  # random times: the fit is in the domain whatever the data say
        model, report = fit
        assert min(model.a, model.b, model.c, model.beta) >= 0 and np.isfinite(report.mean_rel_error)
        assert all(v < 0 for v in report.outside_domain.values())


# --------------------------------------------------------------------------------------------- loaders
def _flame_text():
    rows = ["layer_id,token_id,expert_0,expert_1,expert_2,expert_3"]
    rows += [f"0,{i},{0.5 if i % 2 else 0},0.25,{0 if i % 2 else 0.5},0" for i in range(6)]
    return "\n".join(rows) + "\n"


def _mixtral_text():
    lines = []
    for layer in range(2):
        for tok in range(3):
            rec = {
                "problem_id": 0,
                "layer": layer,
                "token_idx": tok,
                "experts": [tok, 7 - tok],
                "gating_probs": [0.6, 0.4],
            }
            lines.append(json.dumps(rec))
    return "\n".join(lines) + "\n"


HARMOENY_TEXT = 'iteration,total number of tokens sent,expert distribution\n0,3,"[1, 2, 0]"\n1,3,"[0, 3, 0]"\n'


def _saved_bytes():
    buf = io.BytesIO()
    meta = json.dumps({"model": "toy", "num_experts": 4, "top_k": 1, "notes": ""})
    np.savez(buf, **{"toy__meta": np.array(meta), "toy__ids__0": np.array([[0], [1], [3]])})
    return buf.getvalue()


def _npy_bytes():
    buf = io.BytesIO()
    np.save(buf, np.repeat(np.arange(8), 8).reshape(16, 4) % 128)
    return buf.getvalue()


VALID = {
    "flame": _flame_text().encode(),
    "mixtral": _mixtral_text().encode(),
    "harmoeny": HARMOENY_TEXT.encode(),
    "saved": _saved_bytes(),
    "npy": _npy_bytes(),
}


@st.composite
def damaged(draw, kind):
    data = bytearray(VALID[kind])
    how = draw(st.sampled_from(["truncate", "flip", "insert", "random", "intact"]))
    if how == "random":
        return draw(st.binary(max_size=200))
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if how == "truncate":
            data = data[:at]
        elif how == "flip" and data:
            data[at] = draw(st.integers(0, 255))
        elif how == "insert":
            data[at:at] = draw(st.sampled_from([b"5.5", b"NaN", b"-1", b"x", b",", b"\n", b"\xff\xfe", b'"', b"1e999"]))
    return bytes(data)


def _load(kind: str, data: bytes, root: Path):
    if kind == "flame":
        (root / "layer_2.csv").write_bytes(data)
        return load_flame_moe(root)
    if kind == "mixtral":
        (root / "r.jsonl").write_bytes(data)
        return load_mixtral(root / "r.jsonl")
    if kind == "harmoeny":
        for r in range(2):
            (root / str(r)).mkdir()
            (root / str(r) / "moe_layer-0.csv").write_bytes(data if r else VALID["harmoeny"])
        return load_harmoeny("qwen", root)
    if kind == "saved":
        (root / "t.npz").write_bytes(data)
        return load_saved_trace(root / "t.npz")
    (root / "s.npy").write_bytes(data)
    return load_switch128(root / "s.npy")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_loaders_on_damaged_files(data):
    for kind in VALID:
        blob = data.draw(damaged(kind), label=kind)
        with tempfile.TemporaryDirectory() as tmp:
            try:
                trace = _load(kind, blob, Path(tmp))
            except CLEAR as err:
                assert tmp in str(err), f"{kind}: the error does not name the file: {err}"
                event(f"{kind}: {type(err).__name__}")
            else:
                event(f"{kind}: loaded")
                for layer in trace.layers:  # whatever loaded is a valid trace
                    assert trace.expert_load(layer).min() >= 0


# ----------------------------------------------------------------------------------------- command line
CLI_JUNK = st.one_of(
    st.sampled_from(["0", "-1", "x", "", "1e9", "nan", "[1]", "{}", '{"tau": "x"}', "{tau", "99999"]),
    st.text(alphabet='0123456789,.-{}[]":abcx ', max_size=8),
)
# Option → valid values (file names are relative to the fixture folder); junk is mixed in by `mostly`.
CLI_SOLVE_OPTIONS = {
    "--gpus": ["1", "2", "4"],
    "--placement": ["placement.json", "bad_placement.json", "counts.json"],
    "--replicas": ["4", "8", "80"],
    "--cost": ["dsv3_fp8_offline", "dsv3_b_tile", "proxy_serving_3term"],
    "--cost-json": ["cost.json", "bad_cost.json", "placement.json"],
    "--policy": ["tempo", "metro", "uniform", "llep", "token_lp", "static"],
    "--options": ["{}", '{"tau": 0.0}', '{"max_iters": 5}'],
    "--layer": ["2", "3", "99"],
    "--batch": ["0", "1"],
    "--tokens-per-rank": ["8", "64"],
}
CLI_BATCHES = [
    ["--counts", "counts.json"],
    ["--counts", "counts2d.json"],
    ["--counts", "bad_counts.json"],
    ["--trace", "flame_moe_290m"],
    ["--trace", "mixtral_8x7b"],
]


@st.composite
def cli_argv(draw, root: Path):
    def path(name: str) -> str:
        return str(root / name) if name.endswith((".json", ".csv")) else name

    if draw(st.integers(0, 3)) == 0:
        csv = draw(st.sampled_from(["samples.csv", "bad_samples.csv", "counts.json", "missing.csv"]))
        argv = ["calibrate", path(csv)]
        if draw(st.booleans()):
            argv += ["--iters", draw(mostly(st.sampled_from(["5", "50"]), CLI_JUNK))]
        return argv
    argv = ["solve", *map(path, draw(mostly(st.sampled_from(CLI_BATCHES), st.just([]))))]
    for opt in draw(st.lists(st.sampled_from(sorted(CLI_SOLVE_OPTIONS)), max_size=3, unique=True)):
        argv += [opt, path(draw(mostly(st.sampled_from(CLI_SOLVE_OPTIONS[opt]), CLI_JUNK)))]
    return argv


def _cli_files(root: Path) -> None:
    good = {
        "counts.json": json.dumps({"counts": [60, 3, 3, 3]}),
        "counts2d.json": json.dumps([[5, 0, 1, 2], [1, 1, 1, 1]]),
        "placement.json": json.dumps({"phy2log": [0, 1, 2, 3], "num_gpus": 2}),
        "cost.json": json.dumps({"b": 15, "beta": 0.1}),
        "samples.csv": "G,N,t\n" + "\n".join(f"{g},{n},{max(15 * g, 0.1 * n)}" for g in (1, 2, 4, 8) for n in (8, 800)),
    }
    for i, (name, text) in enumerate(good.items()):
        (root / name).write_text(text)
        raw = bytearray(text.encode())
        raw[len(raw) // 2 :] = b"\xff" if i % 2 else b'5.5,"x'  # one damaged copy of each
        (root / f"bad_{name}").write_bytes(bytes(raw))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_cli_exit_status_and_one_line(data):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _cli_files(root)
        argv = data.draw(cli_argv(root), label="argv")
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
        text = err.getvalue()
        event(f"exit {code}")
        assert code in (0, 2), (argv, code, text)  # 1 would be an unexpected failure on input this small
        assert "Traceback" not in text
        if code:
            lines = text.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("error: "), (argv, text)


@FUZZ
@given(
    layers=st.one_of(st.none(), junk, st.lists(st.integers(0, 12), max_size=3)),
    path=st.one_of(st.none(), junk),
    which=st.sampled_from(["flame", "harmoeny", "mixtral", "switch", "sample", "saved"]),
)
def test_loader_arguments(layers, path, which):
    """Loader arguments of the wrong type are refused, never coerced into other values (a string of digits or a
    list of floats used to load other layers); what loads holds exactly the layers asked for."""
    load = {
        "flame": lambda: load_flame_moe(path, layers),
        "harmoeny": lambda: load_harmoeny(path if isinstance(path, str) else "qwen", include_degenerate=layers),
        "mixtral": lambda: load_mixtral(path),
        "switch": lambda: load_switch128(path),
        "sample": lambda: load_sample(path),
        "saved": lambda: load_saved_trace(path, layers),
    }[which]
    try:
        trace = load()
    except (*CLEAR, FileNotFoundError) as err:
        assert str(err)
        event(f"{which}: {type(err).__name__}")
        return
    event(f"{which}: loaded")
    if which == "flame" and layers is not None:
        assert sorted(trace.layers) == sorted(layers)
