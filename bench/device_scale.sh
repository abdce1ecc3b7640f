#!/usr/bin/env bash
# One call on a GPU machine for the scale series (within about 7 minutes): install
# (bench/device_env.sh), then bench/scale.py: 1, 8, 16 and 32 client processes, waited and a
# wait every 16, short and long kernels, through accy and under MPS, beside bench/ceiling.c's
# one-process ceiling and several ceilings under MPS. Logs go to $OUT; the table is printed last.
set -u
source bench/device_env.sh || exit 1

nvidia-smi --query-gpu=name,driver_version,compute_mode --format=csv,noheader > "$OUT/env.txt" 2>&1
step scale ${SCALE_TIMEOUT:-420} $PY bench/scale.py --out "$OUT/scale.json" ${SCALE_ARGS:-}
pgrep -a -x nvidia-cuda-mps-control > "$OUT/mps_left.txt" 2>&1 || echo "none" > "$OUT/mps_left.txt"

echo "==== env"; cat "$OUT/env.txt"
echo "==== steps (name, exit status, seconds)"; cat "$STEPS/steps.txt"
echo "==== MPS control daemons still running"; cat "$OUT/mps_left.txt"
echo "==== scale"; grep -E "FAILED|skipped" "$STEPS/scale.log" | head; tail -62 "$STEPS/scale.log"
exit 0
