#!/usr/bin/env bash
# One call on a GPU machine: what device_scan's single pass over tiles of 8192 still owes
# the device, and the launch suites it has not met. In order of importance (a call cut off
# by its limit still returns the steps that ran):
#   - device_scan's waited round trip taken apart (bench/scan_round_trip.py: every series
#     on its own daemon, each kernel's in-process graph as the base of what accy adds);
#   - compute-sanitizer's memcheck, racecheck, initcheck and synccheck on every built-in
#     kernel at edge sizes in exact-size buffers (bench/sanitize_kernels.py);
#   - the ring's bound tests (a new scalar value at every launch, start-overs) on CUDA and
#     the device launcher, the prepared-launch suite, the single pass's kernel tests (2^30
#     included), the worker and device-launch end-to-end tests;
#   - what a launch costs when its scalars change, on CUDA (bench/changing_scalars.py).
# Needs carried: .whl/ (bench/device_env.sh). Logs under $OUT; a short summary last.
set -u
source bench/device_env.sh || exit 1
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  nproc
} > "$OUT/env.txt" 2>&1
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
TESTS="$PY -m pytest -q -p no:cacheprovider"
step rtt 110 $PY bench/scan_round_trip.py --out "$OUT/scan.json" --iterations 1000 --budget 95
for tool in memcheck racecheck initcheck synccheck; do
  step "san_$tool" 50 "$SAN" --tool "$tool" --report-api-errors no --error-exitcode 3 \
    $PY bench/sanitize_kernels.py
done
step ring 80 $TESTS tests/ring/test_ring_bound.py
step prepared 70 $TESTS tests/backends/test_cuda_prepared.py
step scalars 60 $PY bench/changing_scalars.py --backend cuda --count 2000
step kernels 120 $TESTS tests/backends/test_cuda_kernels.py -k "single_pass or 2_30"
step workers 80 $TESTS tests/worker_backend/test_cuda_workers.py tests/e2e/test_device_launch.py
echo "==== env"; cat "$OUT/env.txt"
echo "==== steps"; cat "$STEPS/steps.txt"
echo "==== round trip"; tail -14 "$STEPS/rtt.log"
echo "==== engine calls per series (count, µs each)"
$PY - "$OUT/scan.json" <<'PY' 2>&1 | tail -6
import json, sys
report = json.load(open(sys.argv[1]))
for daemon, found in report.get("accy", {}).items():
    for series in ("scan", "tiny"):
        engine = found.get(f"{series}_engine", {})
        calls, ns = engine.get("calls", {}), engine.get("call_ns", {})
        print(daemon, series, {k: (v, round(ns.get(k, 0) / v / 1e3, 2)) for k, v in calls.items() if v})
PY
for tool in memcheck racecheck initcheck synccheck; do
  echo "==== $tool: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|WRONG' "$STEPS/san_$tool.log" | tr '\n' ' ')"
done
for name in ring prepared kernels workers; do
  echo "==== $name"; grep -E "passed|failed|error" "$STEPS/$name.log" | tail -1
  grep -E "^(FAILED|ERROR)" "$STEPS/$name.log" | head -8
done
echo "==== changing scalars"; tail -12 "$STEPS/scalars.log"
