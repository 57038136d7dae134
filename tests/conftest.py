"""Test set-up: fake 8 CPU devices before jax is imported anywhere (expert parallelism on one host), and compile
with XLA's backend optimisation level 0 unless XLA_FLAGS names one.

The suite's time is mostly XLA:CPU compiling small programs; level 0 skips LLVM's optimisation passes (the HLO
passes, and so the collectives the tests inspect, are the same) and cuts the time of a compile-bound test file by
about 30%. Where XLA still offers them (jaxlib 0.10), fusions are emitted by its older loop emitters
(``--xla_cpu_use_fusion_emitters=false``, probed once in a child process, since XLA aborts on a flag it does not
know): the same programs again, compiled in about 28% less time (tests/test_copies.py + test_flax_recipes.py 116 s →
84 s). Outputs of the tested programs agree with the optimised build to the dtype's tolerance (tests/numeric.py),
as outputs of any two programs must. Subprocesses the tests start inherit the flags.

Compiled programs are shared across the tests of one run: JAX's persistent compilation cache in a directory made
for the run (the xdist workers and the subprocesses the tests start inherit it through the environment), removed
when the run ends. Many tests build the same layer on the same shapes in new closures; the cache (keyed by the
program, the compile options and the jax version) compiles each once per run. Every run starts cold.
"""

import os
import shutil
import subprocess
import sys
import tempfile

# XLA:CPU's older loop emitters for fusions (jaxlib 0.10; the flag is gone by 0.12, where it is not passed).
_FUSION_EMITTERS_OFF = "--xla_cpu_use_fusion_emitters=false"

_FLAGS = os.environ.get("XLA_FLAGS", "")
if "--xla_force_host_platform_device_count=8" not in _FLAGS:
    _FLAGS += " --xla_force_host_platform_device_count=8"
if "--xla_backend_optimization_level" not in _FLAGS:
    _FLAGS += " --xla_backend_optimization_level=0"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
_OWN_CACHE = "TEMPO_JAX_TEST_XLA_CACHE" not in os.environ  # True in the process that starts the run


def _accepted(flag: str) -> bool:
    """Whether this jaxlib's XLA takes ``flag`` (an unknown XLA flag aborts the process, so ask a child)."""
    probe = "import jax, jax.numpy as jnp; jax.jit(lambda v: v + 1)(jnp.zeros(2)).block_until_ready()"
    env = dict(os.environ, XLA_FLAGS=f"{_FLAGS} {flag}".strip())
    try:
        return subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, timeout=120).returncode == 0
    except subprocess.TimeoutExpired:
        return False


if _OWN_CACHE and "xla_cpu_use_fusion_emitters" not in _FLAGS and _accepted(_FUSION_EMITTERS_OFF):
    _FLAGS += f" {_FUSION_EMITTERS_OFF}"
os.environ["XLA_FLAGS"] = _FLAGS.strip()
if _OWN_CACHE:
    os.environ["TEMPO_JAX_TEST_XLA_CACHE"] = tempfile.mkdtemp(prefix="tempo-jax-xla-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = os.environ["TEMPO_JAX_TEST_XLA_CACHE"]
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"

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


# ---------------------------------------------------------------------------------------------------------------
# The `tokamax` marker: tests of `gmm(implementation="tokamax")` need the optional tokamax package (Python >= 3.12,
# jax >= 0.11.1), which `make test-latest`'s environment installs with the dev extra. Elsewhere they are
# deselected, by marker, and the summary says how many and where they run; an environment that could install
# tokamax but lacks it is an error, not a quiet deselection.


def _tokamax_installable() -> bool:
    import sys

    import jax

    return sys.version_info >= (3, 12) and tuple(int(p) for p in jax.__version__.split(".")[:3]) >= (0, 11, 1)


def pytest_collection_modifyitems(config, items):
    from pallas_kernels import tokamax_backend

    if tokamax_backend.available():
        return
    if _tokamax_installable():
        raise pytest.UsageError(
            "tokamax is not installed in this environment (Python >= 3.12, jax >= 0.11.1), so the tokamax-marked "
            "tests cannot run: reinstall the dev extra (`make clean VENV=.venv-latest && make test-latest`)"
        )
    left = [item for item in items if item.get_closest_marker("tokamax")]
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = [item for item in items if not item.get_closest_marker("tokamax")]
        config._tokamax_deselected = len(left)


def pytest_terminal_summary(terminalreporter, config):
    from pallas_kernels import tokamax_backend

    if tokamax_backend.available():
        return
    n = getattr(config, "_tokamax_deselected", None)  # None under xdist: the workers deselect, not this process
    if n is None and not config.getoption("numprocesses", None):
        return  # no tokamax-marked test was collected
    what = "the tokamax-marked tests" if n is None else f"{n} tokamax-marked tests"
    terminalreporter.write_line(
        f"deselected {what}: tokamax needs Python >= 3.12 and jax >= 0.11.1; `make test-latest` runs them"
    )


def pytest_unconfigure(config):
    if not _OWN_CACHE:
        return
    path = os.environ.pop("TEMPO_JAX_TEST_XLA_CACHE")
    try:  # the run's compiled programs go with it
        shutil.rmtree(path)
    except OSError as err:  # said, never silent: the directory is left in the temp dir
        import warnings

        warnings.warn(f"could not remove this run's XLA compilation cache {path}: {err}", stacklevel=1)
