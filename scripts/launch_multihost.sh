#!/usr/bin/env bash
# Launch the multi-process MoE check on this machine: NUM_PROCS processes × DEVICES_PER_PROC CPU devices,
# talking through gloo on 127.0.0.1. On a real cluster run scripts/multihost_moe.py once per host with the
# same --coordinator HOST:PORT, --num-processes N and that host's --process-id (GPUs are found by JAX).
#
#   scripts/launch_multihost.sh [NUM_PROCS=2] [DEVICES_PER_PROC=4] [OUT=results/multihost.npz] [MODE=sample] [ARGS...]
# (ARGS go to every process, e.g. --checkpoint DIR)
set -euo pipefail
cd "$(dirname "$0")/.."
NP=${1:-2}
DPP=${2:-4}
OUT=${3:-results/multihost.npz}
MODE=${4:-sample}
shift $(( $# < 4 ? $# : 4 ))
PY=${PYTHON:-.venv/bin/python}
PORT=${PORT:-$(( 20000 + RANDOM % 20000 ))}
mkdir -p "$(dirname "$OUT")"
pids=()
for ((i = 0; i < NP; i++)); do
  JAX_PLATFORMS=cpu XLA_FLAGS="--xla_force_host_platform_device_count=${DPP}" \
    "$PY" scripts/multihost_moe.py --out "$OUT" --coordinator "127.0.0.1:${PORT}" \
    --num-processes "$NP" --process-id "$i" --dispatch-mode "$MODE" "$@" &
  pids+=($!)
done
rc=0
for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
exit $rc
