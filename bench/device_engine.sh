#!/usr/bin/env bash
# One call on a GPU machine for the native launch engine: build it there (gcc, Python headers),
# its tests and the ring, ticket and CUDA tests through it, then the sharing benchmark with the
# baselines (in-process, own contexts, MPS; each launch synchronized and a sync every 16), the
# engine at 1, 2 and 4 threads and the Python loop. Logs go to $OUT; the tables are printed last.
set -u
source bench/device_env.sh || exit 1

step native 60 $PY -c "import accyd.ring.engine._native as n; print('native engine built', n.LAYOUT['SLOT_SIZE'])"
step tests ${TESTS_TIMEOUT:-240} $PY -m pytest -q -p no:cacheprovider -x tests/engine tests/ring \
  tests/core/test_tickets.py tests/backends/test_cuda_prepared.py tests/hostmem/test_shared_cuda.py \
  ${TESTS_EXTRA:-}
nvidia-smi --query-gpu=name,driver_version,compute_mode --format=csv,noheader > "$OUT/env.txt" 2>&1
step sharing ${SHARING_TIMEOUT:-420} $PY bench/bench_sharing.py --out "$OUT/sharing.json" \
  --engine-threads ${ENGINE_THREADS:-1,2,4} ${SHARING_ARGS:---python-engine}
step ring_cost 120 $PY bench/ring_cost.py --backend cuda --count 20000 --rtt 2000
pgrep -a -x nvidia-cuda-mps-control > "$OUT/mps_left.txt" 2>&1 || echo "none" > "$OUT/mps_left.txt"

echo "==== env"; cat "$OUT/env.txt"
echo "==== steps"; cat "$STEPS/steps.txt"
echo "==== native"; tail -3 "$STEPS/native.log"
echo "==== tests"; grep -E "passed|failed|error" "$STEPS/tests.log" | tail -3
grep -E "^(FAILED|ERROR)" "$STEPS/tests.log" | head -20
echo "==== MPS control daemons still running"; cat "$OUT/mps_left.txt"
echo "==== ring cost (one client, CUDA)"; tail -16 "$STEPS/ring_cost.log"
echo "==== sharing"; tail -75 "$STEPS/sharing.log"
exit 0
