#!/usr/bin/env bash
# One call on the two-GPU machine (nvidia-h200-x2) for issue 14: install the carried wheels and
# accy (bench/device_env.sh), then run bench/two_devices.py on CUDA: device_scan at 2^26 from 16
# client processes on GPU 0 alone and spread over GPUs 0 and 1, then a fault injected on GPU 1
# while GPU 0's clients keep checking results (a few minutes at most; every wait has a deadline).
# The JSON and the log go to $OUT (or ./device-out); the run's end, its table last, is printed.
set -u
source bench/device_env.sh || exit 1

nvidia-smi --query-gpu=index,name,driver_version,memory.used --format=csv,noheader \
  > "$OUT/env.txt" 2>&1
start=$SECONDS
timeout -k 10 "${TWO_TIMEOUT:-540}" $PY bench/two_devices.py --backend cuda \
  --json "$OUT/two_devices.json" ${TWO_ARGS:-} > "$OUT/two_devices.log" 2>&1
rc=$?
echo "two_devices rc=$rc $((SECONDS - start))s" > "$OUT/steps.txt"
# Daemons or device workers left behind would hold the GPUs: say so if any still runs.
pgrep -af 'accyd' > "$OUT/accyd_left.txt" 2>&1 || echo "none" > "$OUT/accyd_left.txt"
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader \
  >> "$OUT/accyd_left.txt" 2>&1

echo "==== env"; cat "$OUT/env.txt"
echo "==== steps"; cat "$OUT/steps.txt"
echo "==== accyd processes and GPU processes left"; cat "$OUT/accyd_left.txt"
echo "==== two_devices (progress, then the table)"
grep -v '^|' "$OUT/two_devices.log" | tail -30
echo
sed -n '/ backend, device_scan n=/,$p' "$OUT/two_devices.log"
exit 0
