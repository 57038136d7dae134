"""Reliability, round 4 (issues 39 item 8 and 40): CascadeEP's request-trace inputs and options. Each probe finding
has a test that failed before: a trace that lets the cache hit more than was computed, numbers no float or int64
holds, a burst of simultaneous arrivals, options another option makes inert, and a seed count that sizes memory.
"""

import json

import pytest

from tempo_jax.cli import main
from tempo_jax.sim import CascadeConfig
from tempo_jax.sim.cascade import cascade_trace
from tempo_jax.workloads.requests import RequestTrace, load_mooncake


def _line(ts, ilen=512, olen=10, ids=None) -> str:
    ids = [int(ts) + 1] if ids is None else ids
    return json.dumps({"timestamp": ts, "input_length": ilen, "output_length": olen, "hash_ids": ids})


def _write(tmp_path, lines, name="t.jsonl"):
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return p


# ------------------------------------------------------------------------------------------------ lost / wrong
def test_a_prefix_block_repeated_inside_one_request_is_refused(tmp_path):
    """A repeat would let the prefix cache hit more tokens than were ever computed (a request got 2,047 hit tokens
    of 1,024 computed): refused at its line, and by `RequestTrace` itself."""
    p = _write(tmp_path, [_line(0, 1024, ids=[7, 7]), _line(100)])
    with pytest.raises(ValueError, match=r"t\.jsonl:1: hash_id 7 repeats inside one request"):
        load_mooncake(p)
    with pytest.raises(ValueError, match="request 1 repeats prefix block 5"):
        RequestTrace(
            arrival_s=[0.0, 1.0], input_len=[512, 1024], output_len=[1, 1], block_offsets=[0, 1, 3], block_ids=[5, 5, 5]
        )
    ok = RequestTrace(
        arrival_s=[0.0, 1.0], input_len=[512, 1024], output_len=[1, 1], block_offsets=[0, 1, 3], block_ids=[5, 5, 6]
    )
    assert len(ok) == 2  # the same block in two requests is what a prefix cache is for


@pytest.mark.parametrize(
    "raw, fragment",
    [
        (
            '{"timestamp": 0, "input_length": 512, "output_length": 1' + "0" * 30 + ', "hash_ids": [1]}',
            "output_length must be an integer in",
        ),
        (
            '{"timestamp": 1' + "0" * 400 + ', "input_length": 512, "output_length": 1, "hash_ids": [1]}',
            "timestamp must be a finite number of ms within",
        ),
        (
            '{"timestamp": 1e400, "input_length": 512, "output_length": 1, "hash_ids": [1]}',
            "timestamp must be a finite number",
        ),
        (
            '{"timestamp": 0, "input_length": 1' + "0" * 20 + ', "output_length": 1, "hash_ids": [1]}',
            "input_length must be an integer in",
        ),
    ],
)
def test_numbers_no_float_or_int64_holds_are_refused_at_their_line(tmp_path, raw, fragment, capsys):
    """JSON integers are unbounded: 1e30 output tokens or a 400-digit timestamp crashed with OverflowError
    ("internal failure"); now a usage error naming the file, line and key."""
    p = _write(tmp_path, [raw])
    with pytest.raises(ValueError, match=fragment):
        load_mooncake(p)
    assert main(["cascade", "--trace", str(p), "--requests", "1", "--modes", "sync"]) == 2
    err = capsys.readouterr().err
    assert "t.jsonl:1" in err and "internal failure" not in err


# ------------------------------------------------------------------------------------------------ bursts
def test_a_burst_of_simultaneous_arrivals_is_served_and_rates_are_refused_by_name(tmp_path, capsys):
    """``--requests 10`` on a trace whose first 10 arrivals share t = 0 failed with "arrival rate undefined", naming
    no option. The burst is served as recorded; asking to scale its (nonexistent) inter-arrival times names the
    option and the fix."""
    p = _write(tmp_path, [_line(0, ids=[i]) for i in range(10)] + [_line(1000, ids=[99])])
    assert main(["cascade", "--trace", str(p), "--requests", "10", "--modes", "sync"]) == 0
    assert "served as one burst" in capsys.readouterr().out
    for opt in (["--load", "0.5"], ["--rate", "3"]):
        assert main(["cascade", "--trace", str(p), "--requests", "10", "--modes", "sync", *opt]) == 2
        err = capsys.readouterr().err
        assert f"{opt[0]}: the 10 request(s) served" in err and "raise --requests" in err
    with pytest.raises(ValueError, match=r"rate_rps=3: the 10 request\(s\) served of t all arrive at the same"):
        cascade_trace(CascadeConfig(trace=str(p), max_requests=10, rate_rps=3.0))
    spread = cascade_trace(CascadeConfig(trace=str(p), max_requests=11, rate_rps=3.0))
    assert spread.rate_rps == pytest.approx(3.0)  # arrivals that span time still scale


# ------------------------------------------------------------------------------------------------ inert options
@pytest.mark.parametrize(
    "kw, fragment",
    [
        (dict(trace="mooncake_sample", skew=2.0), "skew=2.0 acts only with routing='zipf'"),
        (dict(trace="mooncake_sample", synthetic_requests=50), "synthetic_requests=50 acts only with trace="),
        (dict(trace="mooncake_sample", synthetic_rate_rps=9.0), "synthetic_rate_rps=9.0 acts only with trace="),
    ],
)
def test_options_another_option_makes_inert_are_refused(kw, fragment, capsys):
    with pytest.raises(ValueError, match=fragment):
        CascadeConfig(**kw)
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in kw.items()]
    assert main(["cascade", *flags, "--requests", "20", "--modes", "sync"]) == 2
    assert fragment.split(" acts")[0] in capsys.readouterr().err


def test_the_acting_combinations_still_run():
    cfg = CascadeConfig(trace="synthetic", synthetic_requests=30, synthetic_rate_rps=9.0, routing="zipf", skew=1.0)
    assert len(cascade_trace(cfg)) == 30


def test_a_seed_count_that_sizes_memory_is_a_usage_error(capsys):
    """``--seeds 10^12`` ended in MemoryError ("internal failure"); bounded before any work."""
    assert main(["cascade", "--trace", "mooncake_sample", "--requests", "20", "--seeds", str(10**12)]) == 2
    err = capsys.readouterr().err
    assert "--seeds 1,000,000,000,000 exceeds" in err and "internal failure" not in err
