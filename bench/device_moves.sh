#!/usr/bin/env bash
# One call on a GPU machine after a restructuring (within about 7 minutes): install
# (bench/device_env.sh), the launch path's suites on a CUDA daemon (backends with partitions,
# engine, ring, CUDA workers, RingStream calls, KServe's simple pipeline), then the KServe HTTP
# door's latency against a raw aiohttp echo of the same bytes, beside the gRPC door's
# (simple; device_scan n=1024). Logs go to $OUT; the table is printed last.
set -u
source bench/device_env.sh || exit 1

nvidia-smi --query-gpu=name,driver_version,compute_mode --format=csv,noheader > "$OUT/env.txt" 2>&1
step suites ${SUITES_TIMEOUT:-300} $PY -m pytest -q -p no:cacheprovider -rs tests/backends \
  tests/engine tests/ring tests/worker_backend/test_cuda_workers.py \
  tests/launch_service/test_ring_stream_calls.py tests/kserve/test_simple_pipeline.py \
  tests/core/test_partitions.py tests/test_partitions_file.py
step http_latency_simple 100 $PY bench/kserve_http_latency.py --backend cuda --model simple \
  --json "$OUT/http_latency_simple.json" ${LATENCY_ARGS:-}
step http_latency_scan 100 $PY bench/kserve_http_latency.py --backend cuda \
  --model accy.kernel.device_scan --n 1024 --json "$OUT/http_latency_scan.json" ${LATENCY_ARGS:-}

echo "==== env"; cat "$OUT/env.txt"
echo "==== steps (name, exit status, seconds)"; cat "$STEPS/steps.txt"
echo "==== suites"
grep -E "passed|failed|error" "$STEPS/suites.log" | tail -2
grep -E "^(FAILED|ERROR|SKIPPED)" "$STEPS/suites.log" | head -15
for name in http_latency_simple http_latency_scan; do echo "==== $name"; tail -12 "$STEPS/$name.log"; done
exit 0
