#!/usr/bin/env bash
# One call on a one-GPU machine after launch-path changes: the CUDA tests of device workers and
# shared memory (workers off and on), shared-memory transfer rates with workers off and on,
# the sharing benchmark in-process and with the device in a worker (each with its same-run
# baselines), the ring's per-side cost, and remote launch rates. Outputs go to $OUT/<part>.
set -u
source bench/device_env.sh || exit 1
root=$OUT
tests="tests/worker_backend/test_cuda_workers.py tests/hostmem/test_shared_cuda.py"
step pytest 150 $PY -m pytest -q -p no:cacheprovider $tests
ACCYD_DEVICE_WORKERS=1 step pytest_workers 90 $PY -m pytest -q -p no:cacheprovider \
  tests/hostmem/test_shared_cuda.py
step shm_off 90 $PY bench/shm_transfer.py --backend cuda --repeat 3 --device-workers off
step shm_on 90 $PY bench/shm_transfer.py --backend cuda --repeat 3 --device-workers on
step launch_rate 60 $PY bench/launch_rate.py --backend cuda --count 20000
step ring_cost 90 $PY bench/ring_cost.py --backend cuda --json "$root/ring_cost.json"
OUT=$root/inproc step sharing 240 bash bench/device_sharing.sh
OUT=$root/workers ACCYD_DEVICE_WORKERS=1 step sharing_workers 240 bash bench/device_sharing.sh

echo "==== steps"; cat "$root/steps.txt"
for name in pytest pytest_workers; do
  echo "==== $name"; grep -E "passed|failed|FAILED|Error" "$root/$name.log" | tail -6
done
for name in shm_off shm_on launch_rate; do echo "==== $name"; tail -12 "$root/$name.log"; done
echo "==== ring_cost"; tail -30 "$root/ring_cost.log"
for name in sharing sharing_workers; do echo "==== $name"; tail -32 "$root/$name.log"; done
exit 0
