#!/usr/bin/env bash
# One call on a GPU machine for the device launcher (the device-side scheduler's first
# step into accy, server/accyd/backends/cuda/device_launcher.py): its tests; waited launches
# through accy's rings and client at 1 to 64 clients (bench/device_launcher.py); in the same
# run the prototype with Python clients (bench/device_sched.cu, host way) and bench/scale.py's
# MPS and one-process ceiling at 32 clients. Tables last.
set -u
source bench/device_env.sh || exit 1

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/env.txt" 2>&1
nproc >> "$OUT/env.txt"
s=${SECONDS_EACH:-1.0}
step tests 240 $PY -m pytest -q -p no:cacheprovider -s tests/backends/test_device_launcher.py
step launcher 240 $PY bench/device_launcher.py --clients ${CLIENTS:-1,8,32,64} --seconds "$s"
sched="$OUT/device_sched"
if [ -z "${SKIP_PROTOTYPE:-}" ]; then
  step build_sched 120 nvcc -O2 -arch=sm_90 -rdc=true -o "$sched" bench/device_sched.cu -lcudadevrt
  [ -x "$sched" ] && step sched_python 60 env SCHED_CLIENT=python SCHED_PYTHON="$PY" \
    SCHED_STREAMS=4 "$sched" 8.0 "$s" host 112 8 32
fi
[ -n "${SKIP_SCALE:-}" ] || step scale ${SCALE_TIMEOUT:-200} $PY bench/scale.py \
  --out "$OUT/scale.json" --clients 32 --seconds 0.8 --budget 150 --skip accy
pgrep -a -x nvidia-cuda-mps-control > "$OUT/mps_left.txt" 2>&1 || echo "none" > "$OUT/mps_left.txt"

echo "==== env"; cat "$OUT/env.txt"
echo "==== steps (name, exit status, seconds)"; cat "$STEPS/steps.txt"
echo "==== tests"
grep -E "p50|passed|failed|error|skipped|Error|assert" "$STEPS/tests.log" | tail -25
for name in launcher build_sched sched_python; do
  echo "==== $name"; tail -8 "$STEPS/$name.log" 2>/dev/null
done
echo "==== MPS control daemons still running"; cat "$OUT/mps_left.txt"
echo "==== scale"; grep -E "FAILED|skipped" "$STEPS/scale.log" | head; grep -E "^\| " "$STEPS/scale.log" | head -30
exit 0
