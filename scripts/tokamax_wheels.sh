#!/usr/bin/env bash
# Wheels of tokamax and of what it needs beyond the GPU device image (Python 3.12, jax 0.11 with CUDA, jaxtyping,
# six, absl), downloaded here into .whl/ for a machine that cannot reach PyPI. scripts/gpu_check.sh installs them
# into a scratch folder when tokamax does not import there, so its tokamax rows run (else they say "not run").
# Keep .whl/ out of git (.git/info/exclude) and carry it to the device machine with the working tree.
#
# Usage (repo root, a machine with pip and PyPI):  bash scripts/tokamax_wheels.sh [PYTHON_VERSION, default 3.12]
set -euo pipefail
cd "$(dirname "$0")/.."
PYV=${1:-3.12}
rm -rf .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYV" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
  "tokamax>=0.0.17" einshape pydantic pydantic-core annotated-types typing-inspection qwix immutabledict \
  tensorboardx xprof fire termcolor
du -sh .whl
