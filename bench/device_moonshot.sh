#!/usr/bin/env bash
# One call on a GPU machine for the moonshot's device-side candidate (within about 6
# minutes): install (bench/device_env.sh); whether the daemon's own toolchain builds a
# device scheduler and whether device launches keep an SM partition
# (bench/device_sched_toolchain.py); build bench/device_sched.cu and run it at 1 to 64
# clients, each way a scheduler hands over ("forget": it relaunches itself; "host": four
# instances the host relaunches), short and long kernels, and beside a tenant whose kernels
# run 500 us, and with Python clients (bench/_sched_client.py); the engine and ring suites;
# then bench/scale.py's MPS and one-process ceiling at 32 clients (SCALE_ARGS adds accy's
# series back), the same run's baselines. Tables last.
set -u
source bench/device_env.sh || exit 1

nvidia-smi --query-gpu=name,driver_version,compute_mode --format=csv,noheader > "$OUT/env.txt" 2>&1
nproc >> "$OUT/env.txt"
sched="$OUT/device_sched"
step toolchain 120 $PY bench/device_sched_toolchain.py
step build_sched 120 nvcc -O2 -arch=sm_90 -rdc=true -o "$sched" bench/device_sched.cu -lcudadevrt
if [ -x "$sched" ]; then
  s=${SCHED_SECONDS:-1.0}
  step sched_forget 90 "$sched" 8.0 "$s" forget 112 1 8 16 32 64
  step sched_host 60 env SCHED_STREAMS=4 "$sched" 8.0 "$s" host 112 8 32 64
  step sched_long 60 "$sched" 46.5 "$s" forget 112 8 32
  step sched_long_host 40 env SCHED_STREAMS=4 "$sched" 46.5 "$s" host 112 32
  step sched_slow 40 env SCHED_SLOW_US=500 "$sched" 8.0 "$s" forget 112 32
  step sched_slow_host 40 env SCHED_SLOW_US=500 SCHED_STREAMS=4 "$sched" 8.0 "$s" host 112 32
  step sched_python 60 env SCHED_CLIENT=python SCHED_PYTHON="$PY" SCHED_STREAMS=4 \
    "$sched" 8.0 "$s" host 112 8 32 64
fi
[ -n "${SKIP_SUITES:-}" ] || step engine_ring ${SUITES_TIMEOUT:-150} $PY -m pytest -q -p no:cacheprovider tests/engine tests/ring
step scale ${SCALE_TIMEOUT:-200} $PY bench/scale.py --out "$OUT/scale.json" --clients 32 \
  --seconds 0.8 --budget 150 ${SCALE_ARGS:---skip accy}
pgrep -a -x nvidia-cuda-mps-control > "$OUT/mps_left.txt" 2>&1 || echo "none" > "$OUT/mps_left.txt"

echo "==== env"; cat "$OUT/env.txt"
echo "==== steps (name, exit status, seconds)"; cat "$STEPS/steps.txt"
for name in toolchain build_sched sched_forget sched_host sched_long sched_long_host sched_slow sched_slow_host sched_python; do
  echo "==== $name"; tail -8 "$STEPS/$name.log" 2>/dev/null
done
echo "==== engine_ring"
grep -E "passed|failed|error|skipped" "$STEPS/engine_ring.log" 2>/dev/null | tail -2
grep -E "^(FAILED|ERROR)" "$STEPS/engine_ring.log" 2>/dev/null | head -15
echo "==== MPS control daemons still running"; cat "$OUT/mps_left.txt"
echo "==== scale"; grep -E "FAILED|skipped" "$STEPS/scale.log" | head; grep -E "^\| " "$STEPS/scale.log" | head -30
exit 0
