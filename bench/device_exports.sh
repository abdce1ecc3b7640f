#!/usr/bin/env bash
# One call on a one-GPU machine after changes to CUDA buffers and exports: the CUDA tests of
# the backend, shared memory, exports (CuPy and PyTorch through DLPack, workers off and on)
# and device workers; then the time from a launch to a result's first use in CuPy, exported
# against copied (workers off and on), and where a shared-memory copy's time goes.
# Outputs go to $OUT/<part>.
set -u
source bench/device_env.sh || exit 1
root=$OUT
step pytest 300 $PY -m pytest -q -p no:cacheprovider -x tests/hostmem/test_exports_cuda.py \
  tests/hostmem/test_shared_cuda.py tests/backends/test_cuda.py tests/worker_backend/test_cuda_workers.py
step first_use 150 $PY bench/export_first_use.py --sizes 4M,64M,1G --repeat 7
step first_use_workers 150 $PY bench/export_first_use.py --sizes 64M,1G --repeat 7 \
  --device-workers on
step copy_cost 120 $PY bench/copy_cost.py --backend cuda --repeat 21

echo "==== steps"; cat "$root/steps.txt"
echo "==== pytest"; grep -E "passed|failed|FAILED|Error|error" "$root/pytest.log" | tail -15
for name in first_use first_use_workers copy_cost; do
  echo "==== $name"; tail -14 "$root/$name.log"
done
exit 0
