#!/usr/bin/env bash
# The prepared GPU run (issues 5, 6, 72), in three steps that each run even when an earlier one failed, inside one
# device call of at most 9 minutes (the step limits sum to 530 s):
#   1. check       correctness of the non-interpret kernels (the Mosaic GPU gmm where jax >= 0.12, the Pallas
#                  Triton gmm, tokamax: values + gradients, group_offset, FP8 weights; dispatch exact) against their
#                  references
#   2. bench_gemm  every grouped GEMM this machine has (Mosaic GPU where jax >= 0.12, tokamax, Pallas Triton where
#                  jax < 0.11, ragged_dot; each missing one a "not run: <reason>" row) vs a dense matmul of the same
#                  FLOPs on DeepSeek-V3 / Qwen3 expert shapes, bf16 and FP8 weights, balanced and skewed; the measured
#                  matmul and copy ceilings; the flat-regime sweep (1-256 rows per group, G = 1, 4, 16, 64: µs a
#                  call, fractions of the ceilings, monotone or not); the expert-FFN cost profile per implementation
#                  (profile.csv: G,N,T,t in µs, the fastest one's, for `tempo-jax calibrate`)
#   3. moe_check   the in-graph plan's time a call (relief, EP8 / EP32, E 256 + 64); the MoE layer per call on one
#                  device for every exchange x gmm pair (+ FP8 experts), each against the dense reference; the same
#                  on every device where there are several; presets; CascadeEP launch schedules + OEWF vs the
#                  synchronous layer, run with XLA's latency-hiding scheduler (needs >= 2 GPUs; not run on one)
# Each step gets a wall-clock limit and, 20 s inside it, a time budget after which its cases say "not run: time
# budget" instead of starting (the JSON is written after every part, so a step cut short keeps what it measured).
# Results: <dest>/{check,bench_gemm,moe_check}.{json,log}, <dest>/profile.csv and <dest>/env.txt (8 files at
# most, what the lent device machine hands back); <dest> is $OUT when set, else results/gpu.
# Afterwards (any machine): python scripts/gpu_report.py <dest>  ->  <dest>/report.md (the issue's goals beside the
# numbers: met / not met / not run), flat.png and profile.png.
#
# Usage (repo root):  bash scripts/gpu_check.sh            on a machine with a CUDA GPU and jax with CUDA
#                     bash scripts/gpu_check.sh --smoke    the same steps on CPU: tiny shapes, interpret mode (the
#                                                          Mosaic GPU kernel in Mosaic GPU's interpret mode where
#                                                          jax >= 0.12, e.g. PY=.venv-latest/bin/python)
# Python: $PY, else .venv/bin/python when it exists, else python3 (the device image's). The repo root goes on
# PYTHONPATH, so nothing needs installing. Exit status: 0 when every step passed, else the number of failures.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
if [[ -z "${PY:-}" ]]; then
  if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# tokamax (the grouped GEMM JAX's GPU ops moved to) is not in the device image: wheels carried in .whl/
# (scripts/tokamax_wheels.sh) go into a scratch folder; without them its rows say "not run".
if ! "$PY" -c 'import tokamax' 2>/dev/null && compgen -G ".whl/tokamax-*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/tempo-site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/tempo-site"
fi
DEST=${OUT:-results/gpu}
mkdir -p "$DEST"
SMOKE=()
LIMIT_CHECK=70 LIMIT_BENCH=320 LIMIT_MOE=140  # seconds: 530 s in all, inside one 9-minute device call
MARGIN=20  # seconds of each limit kept for the cases already running and the JSON: the budget is limit - margin
if [[ "${1:-}" == "--smoke" ]]; then
  SMOKE=(--smoke)
  LIMIT_CHECK=0 LIMIT_BENCH=0 LIMIT_MOE=0  # no wall-clock limits on CPU: how long a smoke run takes is the machine's
  export JAX_PLATFORMS=cpu XLA_FLAGS="--xla_force_host_platform_device_count=8"
else
  unset JAX_PLATFORMS XLA_FLAGS  # the real GPU, not the fake CPU devices of the tests
fi

{
  date -u +"%F %T UTC"
  "$PY" -c 'import sys, jax, jaxlib; print("python", sys.version.split()[0], "| jax", jax.__version__,
    "| jaxlib", jaxlib.__version__, "| backend", jax.default_backend(), "|", jax.devices())'
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm \
    --format=csv,noheader
} 2>&1 | tee "$DEST/env.txt"
if [[ ${#SMOKE[@]} -eq 0 ]] && ! "$PY" -c 'import jax, sys; sys.exit(jax.default_backend() != "gpu")'; then
  echo "no GPU backend here: nothing to check (use --smoke to exercise the steps on CPU)" >&2
  exit 2
fi

declare -A STATUS
step() {  # step NAME LIMIT_S SCRIPT ARGS...: run one step with a time limit (0: none), log it, keep its exit status
  local name=$1 limit=$2 t0=$SECONDS budget=()
  shift 2
  if [[ $limit -gt 0 ]]; then
    echo "=== $name (limit ${limit}s)"
    budget=(--deadline $(($(date +%s) + limit - MARGIN)))  # Unix time: the step's start-up counts too
  else
    echo "=== $name"
  fi
  timeout "$limit" "$PY" "$@" "${budget[@]}" 2>&1 | tee "$DEST/$name.log"
  STATUS[$name]=${PIPESTATUS[0]}
  echo "=== $name: $((SECONDS - t0)) s"
}
step check "$LIMIT_CHECK" scripts/bench_gemm.py --check "${SMOKE[@]}" --out "$DEST/check.json"
step bench_gemm "$LIMIT_BENCH" scripts/bench_gemm.py "${SMOKE[@]}" --out "$DEST/bench_gemm.json" \
  --profile-csv "$DEST/profile.csv"
if [[ ${#SMOKE[@]} -eq 0 ]]; then  # let XLA overlap the per-source rounds with the launch groups' GEMMs
  export XLA_FLAGS="--xla_gpu_enable_latency_hiding_scheduler=true"
fi
step moe_check "$LIMIT_MOE" scripts/gpu_moe_check.py "${SMOKE[@]}" --out "$DEST/moe_check.json"

failed=0
echo "=== summary ($DEST)"
for name in check bench_gemm moe_check; do
  rc=${STATUS[$name]}
  case $rc in 0) verdict=ok ;; 124) verdict="TIMED OUT" ;; *) verdict="FAILED (exit $rc)" ;; esac
  [[ $rc -eq 0 ]] || failed=$((failed + 1))
  printf '  %-10s %s\n' "$name" "$verdict"
done
if [[ -s "$DEST/profile.csv" ]]; then
  "$PY" -m tempo_jax calibrate "$DEST/profile.csv" 2>&1 | tail -n 2 | sed 's/^/  calibrate: /'
fi
exit $failed
