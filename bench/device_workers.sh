#!/usr/bin/env bash
# One call on a one-GPU machine for issue 14: install the carried wheels and accy
# (bench/device_env.sh), then on the GPU: the device worker tests (CUDA ones included) and the
# core's CUDA pipelines, the per-launch cost of a worker against the backend in-process, and
# bench/two_devices.py --one-gpu (two devices, each a worker process, on GPU 0: a real sticky
# fault on device 1 while device 0's clients check their results); with SHARING=1, the sharing
# benchmark with its device in a worker too. Outputs go to $OUT.
set -u
source bench/device_env.sh || exit 1
root=$OUT

nvidia-smi --query-gpu=index,name,driver_version,memory.used --format=csv,noheader \
  > "$OUT/env.txt" 2>&1
step pytest 240 $PY -m pytest -q -p no:cacheprovider tests/worker_backend \
  tests/core/test_device_isolation.py tests/backends/test_cuda_pipelines.py ${PYTEST_ARGS:-}
step overhead 120 $PY bench/worker_overhead.py --backend cuda --json
step two_devices 240 $PY bench/two_devices.py --backend cuda --one-gpu \
  --json "$OUT/two_devices.json" ${TWO_ARGS:-}
if [[ -n "${SHARING:-}" ]]; then  # the sharing benchmark with its device in a worker
  OUT=$root/sharing ACCYD_DEVICE_WORKERS=1 step sharing_workers 240 bash bench/device_sharing.sh
fi
pgrep -af 'accyd' > "$OUT/accyd_left.txt" 2>&1 || echo "none" > "$OUT/accyd_left.txt"
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader \
  >> "$OUT/accyd_left.txt" 2>&1

echo "==== env"; cat "$OUT/env.txt"
echo "==== steps"; cat "$OUT/steps.txt"
echo "==== processes left"; cat "$OUT/accyd_left.txt"
echo "==== pytest"; grep -E "passed|failed|error|FAILED|Error" "$OUT/pytest.log" | tail -15
echo "==== overhead"; tail -25 "$OUT/overhead.log"
echo "==== two_devices"; grep -v '^|' "$OUT/two_devices.log" | tail -8
sed -n '/ backend, device_scan n=/,$p' "$OUT/two_devices.log"
if [[ -n "${SHARING:-}" ]]; then echo "==== sharing, device in a worker"; tail -11 "$OUT/sharing_workers.log"; fi
exit 0
