#!/usr/bin/env bash
# One prepared GPU run (issues 5, 6): correctness of the non-interpret Pallas kernels vs their references,
# then the grouped-GEMM benchmark. Results: results/gpu/check.json, results/gpu/bench_gemm.json.
# Usage (repo root, on a machine with a CUDA GPU and jax[cuda12]): bash scripts/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
mkdir -p results/gpu
unset JAX_PLATFORMS XLA_FLAGS  # the real GPU, not the 8 fake CPU devices of the tests
"$PY" -c 'import jax, sys; print(jax.devices()); sys.exit(jax.default_backend() != "gpu")' \
  || { echo "no GPU backend: nothing to check" >&2; exit 2; }
# 1. Correctness first: non-interpret gmm/tgmm (values + gradients, group_offset) and dispatch (exact).
"$PY" scripts/bench_gemm.py --check --out results/gpu/check.json 2>&1 | tee results/gpu/check.log
# 2. Throughput: tiling sweep, DSv3 / Qwen3 expert shapes, per-expert cost profile.
"$PY" scripts/bench_gemm.py --iters 10 --out results/gpu/bench_gemm.json 2>&1 | tee results/gpu/bench_gemm.log
# 3. The MoE layer: ragged_all_to_all exchange and Pallas kernels vs the padded path and the dense reference.
"$PY" scripts/gpu_moe_check.py 2>&1 | tee results/gpu/moe_check.log
echo "done: results/gpu/{check,bench_gemm,moe_check}.json"
