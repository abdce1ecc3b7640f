#!/usr/bin/env bash
# One call on a GPU machine for the round's last numbers: the native engine's, ring, ticket,
# KServe and CUDA tests there, the sharing benchmark (baselines, MPS, the engine's default and
# four threads), the first 1 GiB transfer through a fresh segment against an in-process pinned
# copy, and KServe ModelInfer against a raw echo. Logs go to $OUT; tables are printed last.
set -u
source bench/device_env.sh || exit 1

step native 60 $PY -c "import accyd.ring.engine._native as n; print('native engine built', n.LAYOUT['SLOT_SIZE'])"
step tests ${TESTS_TIMEOUT:-150} $PY -m pytest -q -p no:cacheprovider tests/engine tests/ring \
  tests/core/test_tickets.py tests/backends/test_cuda_prepared.py tests/hostmem/test_shared_cuda.py \
  tests/kserve/test_simple_pipeline.py
nvidia-smi --query-gpu=name,driver_version,compute_mode --format=csv,noheader > "$OUT/env.txt" 2>&1
step sharing ${SHARING_TIMEOUT:-240} $PY bench/bench_sharing.py --out "$OUT/sharing.json" \
  --engine-threads ${ENGINE_THREADS:-0,4} ${SHARING_ARGS:---budget 200 --seconds 1.5}
step first_transfer 90 $PY bench/first_transfer.py --backend cuda --size 1G --rounds 2 --warm 4
step kserve 90 $PY bench/kserve_latency.py --backend cuda --model simple --repeat 1000 --rounds 3
pgrep -a -x nvidia-cuda-mps-control > "$OUT/mps_left.txt" 2>&1 || echo "none" > "$OUT/mps_left.txt"

echo "==== env"; cat "$OUT/env.txt"
echo "==== steps"; cat "$STEPS/steps.txt"
echo "==== tests"; grep -E "passed|failed|error" "$STEPS/tests.log" | tail -2
grep -E "^(FAILED|ERROR)" "$STEPS/tests.log" | head -10
echo "==== MPS left"; cat "$OUT/mps_left.txt"
echo "==== first transfer"; tail -14 "$STEPS/first_transfer.log"
echo "==== kserve latency"; tail -10 "$STEPS/kserve.log"
echo "==== sharing"; tail -62 "$STEPS/sharing.log"
exit 0
