#!/usr/bin/env bash
# One call on a GPU machine for device launch through the daemon (accyd serve --device-launch
# always, and crowd):
# bench/scale.py's client processes, each waiting for every launch, against the same daemon
# without it and MPS at the same counts, in one run. Tables last. CLIENTS, SECONDS_EACH and
# BUDGET change the run's size; SKIP (default ceiling) the baselines left out, VARIANT_WAYS
# (default waited) the device variants' series (waited,every16 for both), VARIANT_CLIENTS
# their client counts (default: the smallest and largest of 8 or more).
set -u
source bench/device_env.sh || exit 1

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/env.txt" 2>&1
nproc >> "$OUT/env.txt"
step scale ${SCALE_TIMEOUT:-560} $PY bench/scale.py --out "$OUT/scale.json" \
  --clients "${CLIENTS:-1,8,32}" --seconds "${SECONDS_EACH:-0.8}" --budget "${BUDGET:-400}" \
  --skip "${SKIP-ceiling}" --variant-ways "${VARIANT_WAYS:-waited}" \
  --variant-clients "${VARIANT_CLIENTS:-}" \
  --variants "always=--device-launch always;crowd=--device-launch crowd"
pgrep -a -x nvidia-cuda-mps-control > "$OUT/mps_left.txt" 2>&1 || echo "none" > "$OUT/mps_left.txt"

echo "==== env"; cat "$OUT/env.txt"
echo "==== steps (name, exit status, seconds)"; cat "$STEPS/steps.txt"
echo "==== MPS control daemons still running"; cat "$OUT/mps_left.txt"
echo "==== scale"; grep -E "FAILED|skipped|Error" "$STEPS/scale.log" | head; grep -E "^\| |^kernels" "$STEPS/scale.log" | head -60
exit 0
