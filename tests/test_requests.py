"""Tests of tempo_jax.workloads.requests: the Mooncake request trace (real file and bundled sample), bad trace
lines, RequestTrace sub-traces and rate scaling, the synthetic request generator."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tempo_jax.workloads import (
    BLOCK_SIZE,
    REQUEST_TRACES,
    RequestTrace,
    build_mooncake_sample,
    load_mooncake,
    load_mooncake_sample,
    load_request_trace,
    synthetic_requests,
)
from tempo_jax.workloads.requests import MOONCAKE_RELPATH, MOONCAKE_SAMPLE_PATH

GOOD = {"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [0, 1]}


@pytest.fixture(scope="module")
def mooncake_file(shared_traces):
    p = shared_traces / MOONCAKE_RELPATH
    if not p.exists():
        if os.environ.get("CI"):
            pytest.fail(f"Mooncake trace not present at {p}")
        pytest.skip(f"Mooncake trace not present at {p}")
    return p


@pytest.fixture(scope="module")
def full(mooncake_file):
    return load_mooncake(mooncake_file)


def _line(**over) -> str:
    return json.dumps({**GOOD, **over})


# ----------------------------------------------------------------------------------------------- imports
def test_import_stays_numpy_only():
    code = (
        "import sys, tempo_jax.workloads.requests; "
        "assert not {'jax', 'tempo_jax.sim'} & set(sys.modules), sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=os.path.dirname(os.path.dirname(__file__)))


# ------------------------------------------------------------------------------------------- real trace
def test_real_trace(full):
    assert len(full) == 12_031
    assert full.input_len.mean() == pytest.approx(12_035.06, abs=0.01)
    assert full.arrival_s[0] == 0 and full.arrival_s[-1] == pytest.approx(3_536.999)
    assert full.rate_rps == pytest.approx(12_030 / 3_536.999)
    assert np.all(np.diff(full.arrival_s) >= 0)
    np.testing.assert_array_equal(full.num_blocks, -(-full.input_len // BLOCK_SIZE))
    np.testing.assert_array_equal(full.blocks(0), np.arange(14))  # first line: 6,758 tokens, ids 0..13
    assert np.all(full.block_ids[full.block_offsets[:-1]] == 0)  # every request opens with the system prompt
    assert full.output_len.min() >= 1 and full.block_ids.size == 288_500
    assert not full.arrival_s.flags.writeable and not full.block_ids.flags.writeable


def test_sample_is_the_head_of_the_real_file(full, mooncake_file):
    raw = MOONCAKE_SAMPLE_PATH.read_bytes()
    assert len(raw) < 200_000
    with open(mooncake_file, "rb") as fh:
        head = b"".join(fh.readline() for _ in range(400))
    assert raw == head
    sample = load_mooncake_sample()
    ref = full.head(400)
    for name in ("arrival_s", "input_len", "output_len", "block_offsets", "block_ids"):
        np.testing.assert_array_equal(getattr(sample, name), getattr(ref, name))
    assert "(sample)" in sample.source


def test_build_sample_and_limit(tmp_path, mooncake_file):
    out = build_mooncake_sample(tmp_path / "s.jsonl", path=mooncake_file, lines=7)
    assert len(load_mooncake(out)) == 7
    assert len(load_mooncake(mooncake_file.parent, limit=5)) == 5  # a folder is accepted too


def test_sample_offline():
    s = load_mooncake_sample()
    assert len(s) == 400 and s.input_len.mean() == pytest.approx(14_276.325)
    assert s.rate_rps == pytest.approx(399 / 141.0)
    assert len(load_mooncake_sample(limit=10)) == 10
    assert len(load_request_trace("mooncake_conversation", sample=True)) == 400
    assert set(REQUEST_TRACES) == {"mooncake_conversation"}
    with pytest.raises(ValueError, match="mooncake_conversation"):
        load_request_trace("agentx")


def test_missing_file_names_path_and_how(tmp_path, monkeypatch):
    monkeypatch.setenv("TEMPO_JAX_TRACES", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="TEMPO_JAX_TRACES") as err:
        load_mooncake()
    assert str(tmp_path / MOONCAKE_RELPATH) in str(err.value)
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_mooncake(tmp_path / "nope.jsonl")


# ----------------------------------------------------------------------------------------- bad lines
BAD_LINES = [
    (b"{not json", "not JSON"),
    (b"[1, 2, 3]", "JSON object"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "hash_ids"}).encode(), r"missing key\(s\) \['hash_ids'\]"),
    (_line(hash_ids=None).encode(), "hash_ids must be a list of integers"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "timestamp"}).encode(), "timestamp"),
    (_line(input_length=-5).encode(), "input_length must be an integer in \\[1,"),
    (_line(input_length=0, hash_ids=[]).encode(), "input_length must be an integer in \\[1,"),
    (_line(input_length=1000.5).encode(), "input_length must be an integer"),
    (_line(input_length=True).encode(), "input_length must be an integer"),
    (_line(output_length=-1).encode(), "output_length"),
    (_line(output_length="7").encode(), "output_length"),
    (_line(hash_ids="0,1").encode(), "hash_ids must be a list of integers"),
    (_line(hash_ids=[0, "a"]).encode(), "hash_ids must be a list of integers"),
    (_line(hash_ids=[0, 1.5]).encode(), "hash_ids must be a list of integers"),
    (_line(hash_ids=[0, 2**64]).encode(), "int64"),
    (_line(hash_ids=[0]).encode(), r"expected ceil\(1000/512\) = 2"),
    (_line(hash_ids=[0, 1, 2]).encode(), "3 hash_ids"),
    (_line(timestamp="5").encode(), "timestamp must be a finite number"),
    (b'{"timestamp": NaN, "input_length": 1000, "output_length": 5, "hash_ids": [0, 1]}', "finite"),
    (_line(timestamp=-1).encode(), "goes backwards"),
    (b"\xff\xfe\x00garbage\x80\x81", "not UTF-8"),
    (
        '{"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [0, 1], "k": "é"}'.encode("latin-1"),
        "UTF-8",
    ),
]


@pytest.mark.parametrize("bad, message", BAD_LINES, ids=[m for _, m in BAD_LINES])
def test_bad_line_names_file_and_line(tmp_path, bad, message):
    f = tmp_path / "trace.jsonl"
    # line 1 good, line 2 blank (skipped but counted), line 3 good, line 4 bad
    f.write_bytes(_line(timestamp=0).encode() + b"\n\n" + _line(timestamp=0).encode() + b"\n" + bad + b"\n")
    with pytest.raises(ValueError, match=message) as err:
        load_mooncake(f)
    assert f"{f}:4:" in str(err.value)


def test_empty_file_and_extra_keys(tmp_path):
    f = tmp_path / "empty.jsonl"
    f.write_text("\n\n")
    with pytest.raises(ValueError, match="no requests"):
        load_mooncake(f)
    f.write_text(_line(session="x") + "\n" + _line(timestamp=1500) + "\n")  # extra keys are ignored
    t = load_mooncake(f)
    np.testing.assert_array_equal(t.arrival_s, [0.0, 1.5])


@given(
    st.lists(
        st.tuples(st.integers(0, 5_000), st.integers(1, 3_000), st.integers(0, 50), st.integers(0, 10**12)),
        min_size=1,
        max_size=20,
    )
)
def test_roundtrip_random_files(tmp_path_factory, rows):
    f = tmp_path_factory.mktemp("rt") / "t.jsonl"
    t_ms = np.cumsum([r[0] for r in rows])
    recs = [
        {"timestamp": int(t), "input_length": i, "output_length": o, "hash_ids": [h + k for k in range(-(-i // 512))]}
        for t, (_, i, o, h) in zip(t_ms, rows, strict=True)
    ]
    f.write_text("".join(json.dumps(r) + "\n" for r in recs))
    tr = load_mooncake(f)
    np.testing.assert_allclose(tr.arrival_s, (t_ms - t_ms[0]) / 1000)
    np.testing.assert_array_equal(tr.input_len, [r["input_length"] for r in recs])
    for i, r in enumerate(recs):
        np.testing.assert_array_equal(tr.blocks(i), r["hash_ids"])


# --------------------------------------------------------------------------------------- RequestTrace
def _tiny() -> RequestTrace:
    return RequestTrace(
        arrival_s=[0.0, 1.0, 1.0, 4.0],
        input_len=[512, 513, 10, 1024],
        output_len=[1, 2, 3, 4],
        block_offsets=[0, 1, 3, 4, 6],
        block_ids=[7, 7, 8, 9, 7, 10],
    )


def test_trace_helpers():
    t = _tiny()
    assert len(t) == 4 and t.total_input_tokens == 2059 and t.duration_s == 4.0 and t.rate_rps == 0.75
    np.testing.assert_array_equal(t.blocks(1), [7, 8])
    np.testing.assert_array_equal(t.blocks(-1), [7, 10])
    with pytest.raises(IndexError):
        t.blocks(4)
    s = t.slice(1, 3)
    np.testing.assert_array_equal(s.block_offsets, [0, 2, 3])
    np.testing.assert_array_equal(s.block_ids, [7, 8, 9])
    np.testing.assert_array_equal(s.arrival_s, [1.0, 1.0])
    assert len(t.head(0)) == 0 and len(t.head(10)) == 4
    w = t.window(1.0, 4.0)
    np.testing.assert_array_equal(w.input_len, [513, 10])
    assert len(t.window(5, 6)) == 0
    with pytest.raises(ValueError, match="rate undefined"):
        _ = t.slice(1, 3).rate_rps
    with pytest.raises(ValueError, match="t1_s"):
        t.window(3, 1)


@pytest.mark.parametrize(
    "over, message",
    [
        ({"block_offsets": [0, 1, 3, 4, 5]}, "block_offsets"),
        ({"block_offsets": [0, 1, 2, 4, 6]}, r"request 1 has 1, needs 2"),
        ({"arrival_s": [0.0, 2.0, 1.0, 4.0]}, "non-decreasing"),
        ({"input_len": [512, 513, 0, 1024], "block_offsets": [0, 1, 3, 3, 5]}, "input_len must be >= 1"),
        ({"output_len": [1, 2, -3, 4]}, "output_len"),
        ({"input_len": [512.0, 513, 10, 1024]}, "integers"),
        ({"output_len": [1, 2, 3]}, r"\[n\], \[n\], \[n\], \[n\+1\]"),
    ],
)
def test_trace_validation(over, message):
    base = {k: getattr(_tiny(), k) for k in ("arrival_s", "input_len", "output_len", "block_offsets", "block_ids")}
    with pytest.raises(ValueError, match=message):
        RequestTrace(**{**base, **over})


@pytest.mark.parametrize("target", [0.5, 3.4011884085915773, 10.0, 123.0])
def test_scale_rate_is_exact(target):
    t = load_mooncake_sample()
    s = t.scale_rate(target)
    assert s.rate_rps == pytest.approx(target, rel=1e-12)
    factor = t.rate_rps / target
    np.testing.assert_allclose(np.diff(s.arrival_s), np.diff(t.arrival_s) * factor, rtol=1e-12, atol=1e-12)
    assert s.arrival_s[0] == t.arrival_s[0]
    np.testing.assert_array_equal(s.input_len, t.input_len)
    np.testing.assert_array_equal(s.block_ids, t.block_ids)
    with pytest.raises(ValueError):
        t.scale_rate(0)
    with pytest.raises(ValueError):
        t.scale_rate(-1.0)


# ------------------------------------------------------------------------------------------ synthetic
def test_synthetic_statistics():
    n, rate, mean = 20_000, 5.0, 12_000.0
    t = synthetic_requests(
        n,
        rate_rps=rate,
        seed=3,
        mean_input=mean,
        min_input=2_048,
        num_families=10,
        prefix_blocks=3,
        shared_fraction=0.4,
    )
    assert len(t) == n and t.arrival_s[0] == 0
    assert t.rate_rps == pytest.approx(rate, rel=0.03)
    gaps = np.diff(t.arrival_s)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.05)  # exponential gaps: CV 1
    assert t.input_len.mean() == pytest.approx(mean, rel=0.05)
    assert t.input_len.min() >= 2_048 and t.input_len.max() <= 131_072
    assert np.median(t.input_len) < 0.75 * t.input_len.mean()  # long right tail (lognormal sigma=1: 0.61)
    first = t.block_ids[t.block_offsets[:-1]]
    shared = first < 30  # family ids are 0..29
    assert shared.mean() == pytest.approx(0.4, abs=0.02)
    for i in np.flatnonzero(shared)[:50]:
        b = t.blocks(i)
        np.testing.assert_array_equal(b[:3], first[i] + np.arange(3))  # whole family chain
        assert first[i] % 3 == 0 and np.all(b[3:] >= 30)
    fresh = t.block_ids[t.block_ids >= 30]
    assert np.unique(fresh).size == fresh.size  # other blocks never repeat


def test_synthetic_short_requests_share_only_full_blocks():
    t = synthetic_requests(
        500,
        rate_rps=1,
        seed=0,
        mean_input=700,
        sigma=1.5,
        min_input=1,
        num_families=1,
        prefix_blocks=4,
        shared_fraction=1.0,
    )
    for i in range(len(t)):
        k = min(4, int(t.input_len[i]) // 512)
        np.testing.assert_array_equal(t.blocks(i)[:k], np.arange(k))
        assert np.all(t.blocks(i)[k:] >= 4)


def test_synthetic_seeded_and_checked():
    a = synthetic_requests(50, rate_rps=2, seed=1)
    b = synthetic_requests(50, rate_rps=2, seed=1)
    c = synthetic_requests(50, rate_rps=2, seed=2)
    np.testing.assert_array_equal(a.input_len, b.input_len)
    np.testing.assert_array_equal(a.block_ids, b.block_ids)
    assert not np.array_equal(a.input_len, c.input_len)
    assert len(synthetic_requests(0, rate_rps=1)) == 0
    for kw, msg in [
        ({"rate_rps": 0}, "rate_rps"),
        ({"rate_rps": -2}, "rate_rps"),
        ({"rate_rps": 1, "shared_fraction": 1.5}, "shared_fraction"),
        ({"rate_rps": 1, "prefix_blocks": [1, 2]}, "prefix_blocks"),
        ({"rate_rps": 1, "num_families": 0}, "num_families"),
        ({"rate_rps": 1, "max_input": 10, "min_input": 20}, "max_input"),
    ]:
        with pytest.raises(ValueError, match=msg):
            synthetic_requests(10, **kw)
    assert math.isclose(synthetic_requests(10, rate_rps=1, num_families=0, shared_fraction=0).block_ids.min(), 0)
