"""Test set-up: fake 8 CPU devices before jax is imported anywhere (expert parallelism on one host), and compile
with XLA's backend optimisation level 0 unless XLA_FLAGS names one.

The suite's time is mostly XLA:CPU compiling small programs; level 0 skips LLVM's optimisation passes (the HLO
passes, and so the collectives the tests inspect, are the same) and cuts the time of a compile-bound test file by
about 30%. Outputs of the tested programs agree with the optimised build to the dtype's tolerance (tests/numeric.py),
as outputs of any two programs must. Subprocesses the tests start inherit both flags.
"""

import os

_FLAGS = os.environ.get("XLA_FLAGS", "")
if "--xla_force_host_platform_device_count=8" not in _FLAGS:
    _FLAGS += " --xla_force_host_platform_device_count=8"
if "--xla_backend_optimization_level" not in _FLAGS:
    _FLAGS += " --xla_backend_optimization_level=0"
os.environ["XLA_FLAGS"] = _FLAGS.strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "ci", max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
settings.load_profile("ci")

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    """Path of ../shared/traces (the full recordings; present in CI beside the clone)."""
    return SHARED / "traces"
