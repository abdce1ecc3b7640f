#!/usr/bin/env bash
# One call on a GPU machine for the remote launch path (RingStream): the CUDA tests of the ring
# over a stream and of the shared ring, launch rates over TCP through the ring stream and through
# unary Launch calls (ACCY_RING=0) in the same call, then issue 11's sharing benchmark
# (bench/device_sharing.sh). Logs go to $OUT; each step's end is printed, the goals table last.
set -u
source bench/device_env.sh || exit 1

step tests 240 $PY -m pytest -q -p no:cacheprovider tests/ring/test_ring_stream.py \
  tests/ring/test_ring_bound.py tests/hostmem/test_shared_cuda.py
step rate_ring_stream 120 $PY bench/launch_rate.py --backend cuda --count 20000
ACCY_RING=0 step rate_unary 120 $PY bench/launch_rate.py --backend cuda --count 20000
step probe 120 $PY bench/remote_probe.py --backend cuda --iterations 3000
OUT=$OUT/sharing bash bench/device_sharing.sh > "$OUT/sharing.txt" 2>&1

echo "==== steps"; cat "$STEPS/steps.txt"
echo "==== tests"; tail -5 "$STEPS/tests.log"
echo "==== launch rate, ring stream"; tail -5 "$STEPS/rate_ring_stream.log"
echo "==== launch rate, unary Launch calls"; tail -5 "$STEPS/rate_unary.log"
echo "==== remote round trip by leg"; tail -10 "$STEPS/probe.log"
echo "==== sharing"; tail -40 "$OUT/sharing.txt"
exit 0
