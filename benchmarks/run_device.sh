#!/usr/bin/env bash
# The benchmark run on the GPU machine: makes the 20k-image set in /dev/shm (skipped when present) and runs
# bench_gpu.py, writing $OUT/bench_gpu.json, $OUT/bench_gpu_logs/ and logs. From the repository root, after
# the caller's exports (PYTHONPATH=$PWD:/tmp/site[:/tmp/dali], and LD_LIBRARY_PATH for DALI):
#   benchmarks/run_device.sh [bench_gpu.py options, e.g. --only a,d --seconds 8]
# Environment: OUT (default ./bench_out), DATA (/dev/shm/ingest_bench_20k), N (20000), PYTHON (python3).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/bench_out}
DATA=${DATA:-/dev/shm/ingest_bench_20k}
N=${N:-20000}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
case ":${PYTHONPATH:-}:" in *":$PWD:"*) ;; *) export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" ;; esac
if [ ! -d "$DATA" ]; then
  $PY benchmarks/make_data.py --out "$DATA" --n "$N" --classes 100 --seed 0 --workers "$(nproc)" \
    2>&1 | tee "$OUT/make_data.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || exit 1
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv >"$OUT/nvidia-smi.txt" 2>&1 || true
$PY benchmarks/bench_gpu.py --data "$DATA" --out "$OUT/bench_gpu.json" "$@" 2>&1 | tee "$OUT/bench_gpu.log"
exit "${PIPESTATUS[0]}"
