#!/usr/bin/env bash
# One call on a GPU machine for sharing under contention (within about 8 minutes): install
# (bench/device_env.sh), the SM-partition, work-queue and wait-budget tests (the CUDA ones
# run here), the engine and ring suites, then bench/contention.py: 8 and 32 clients waiting
# on the short kernel with the wait budget and without (--no-wait-budget), and the noisy
# neighbour (a victim beside a tenant filling the GPU, unconfined and in a partition).
# Each step has a deadline (step, device_env.sh); logs go to $OUT; the table is printed last.
set -u
source bench/device_env.sh || exit 1

nvidia-smi --query-gpu=name,driver_version,compute_mode --format=csv,noheader > "$OUT/env.txt" 2>&1
step partitions ${PARTITION_TIMEOUT:-100} $PY -m pytest -q -p no:cacheprovider -rs \
  tests/backends/test_cuda_partitions.py tests/backends/test_work_queues.py \
  tests/core/test_partitions.py tests/test_partitions_file.py tests/ring/test_ring_waits.py
step engine_ring ${SUITES_TIMEOUT:-150} $PY -m pytest -q -p no:cacheprovider tests/engine tests/ring
step contention ${CONTENTION_TIMEOUT:-190} $PY bench/contention.py --out "$OUT/contention.json" \
  --budget 150 ${CONTENTION_ARGS:-}

echo "==== env"; cat "$OUT/env.txt"
echo "==== steps (name, exit status, seconds)"; cat "$STEPS/steps.txt"
for name in partitions engine_ring; do
  echo "==== $name"
  grep -E "passed|failed|error|skipped" "$STEPS/$name.log" | tail -2
  grep -E "^(FAILED|ERROR|SKIPPED)" "$STEPS/$name.log" | head -15
done
echo "==== contention"; tail -24 "$STEPS/contention.log"
exit 0
