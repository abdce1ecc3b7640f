#!/usr/bin/env bash
# One call on a GPU machine for issue 11's sharing benchmark: install the carried wheels and
# accy (bench/device_env.sh), then run bench/bench_sharing.py (baselines, MPS and the accy
# series, about a minute; it skips what is left past its budget). The JSON, the log and the
# MPS state go to $OUT (or ./device-out); the log's end, with the goals table last, is printed.
set -u
source bench/device_env.sh || exit 1

nvidia-smi --query-gpu=name,driver_version,compute_mode --format=csv,noheader > "$OUT/env.txt" 2>&1
start=$SECONDS
timeout -k 10 "${SHARING_TIMEOUT:-500}" $PY bench/bench_sharing.py --out "$OUT/sharing.json" \
  ${SHARING_ARGS:-} > "$OUT/sharing.log" 2>&1
rc=$?
echo "bench_sharing rc=$rc $((SECONDS - start))s" > "$OUT/steps.txt"
# An MPS control daemon left behind would serve the next run: say so if one still runs.
pgrep -a -x nvidia-cuda-mps-control > "$OUT/mps_left.txt" 2>&1 || echo "none" > "$OUT/mps_left.txt"

echo "==== env"; cat "$OUT/env.txt"
echo "==== steps"; cat "$OUT/steps.txt"
echo "==== MPS control daemons still running"; cat "$OUT/mps_left.txt"
echo "==== bench_sharing"; tail -60 "$OUT/sharing.log"
exit 0
