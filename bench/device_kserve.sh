#!/usr/bin/env bash
# One call on a GPU machine for the KServe v2 door (Ubuntu 24.04, Python 3.12, no network).
# Needs carried: .whl/ (accy's wheels, as every device script) and .whl/kserve/ (made here
# by `bash scripts/kserve_tools.sh --device-wheels .whl/kserve`: tritonclient and its grpc
# and cuda extras, perf_analyzer's wheel; numpy and cuda-bindings may be left out where the
# machine's Python has them, to stay under the carry limit). Steps, each logged to $OUT/NAME.log:
#   kserve_tests  tests/kserve (CUDA's simple pipeline; the door's suites on host daemons)
#   cuda_shm      tritonclient with CUDA shared memory against device_scan, on a CUDA daemon
#                 run with --kserve-cuda-shared-memory
#   perf_*        perf_analyzer against each built-in pipeline on the CUDA daemon
#                 (--shared-memory none, system, cuda), 300 requests at concurrency 8
#   latency_*     bench/kserve_latency.py on CUDA: ModelInfer against a raw echo of the same
#                 bytes, tritonclient and accy's own client (simple; device_scan n=1024)
#   http_latency_* bench/kserve_http_latency.py on CUDA: the HTTP door's infer against a raw
#                 aiohttp echo of the same bytes, and the gRPC door's beside it
# A short table is printed last.
set -u
source bench/device_env.sh || exit 1
tools=/tmp/accy-kserve-tools
rm -rf "$tools" && mkdir -p "$tools/venv/bin" "$tools/bin" "$tools/perf_analyzer"
$PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$tools/site" \
  .whl/kserve/*.whl > "$OUT/kserve_install.log" 2>&1 || { tail "$OUT/kserve_install.log"; exit 1; }
# tritonclient's Python: the same interpreter with its own packages only (protobuf < 7).
cat > "$tools/venv/bin/python" <<SH
#!/bin/sh
PYTHONPATH="$tools/site" exec $(command -v "$PY") "\$@"
SH
$PY - "$tools" <<'PY'
import pathlib, stat, sys, zipfile
tools = pathlib.Path(sys.argv[1])
(wheel,) = pathlib.Path(".whl/kserve").glob("perf_analyzer-*.whl")
target = tools / "perf_analyzer" / "perf_analyzer"
target.write_bytes(zipfile.ZipFile(wheel).read("perf_analyzer/bin/perf_analyzer"))
target.chmod(target.stat().st_mode | stat.S_IXUSR)
PY
printf '#!/bin/sh\nexec %s "$@"\n' "$tools/perf_analyzer/perf_analyzer" > "$tools/bin/perf_analyzer"
chmod +x "$tools/venv/bin/python" "$tools/bin/perf_analyzer"
echo "carried" > "$tools/stamp"
export ACCY_KSERVE_TOOLS=$tools
TRITON=$tools/venv/bin/python
PA=$tools/bin/perf_analyzer

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/env.txt" 2>&1
# KSERVE_TESTS=0 skips the suites (CI runs them on host daemons) when device time is short.
if [[ ${KSERVE_TESTS:-1} != 0 ]]; then
  step kserve_tests 420 $PY -m pytest -q -p no:cacheprovider tests/kserve
fi

sock=/tmp/accy-kserve-cuda.sock port=18931
$PY -m accyd.cli serve --backend cuda --listen "unix:$sock" --listen "127.0.0.1:$port" \
  --insecure --no-supervise --kserve-cuda-shared-memory > "$OUT/daemon.log" 2>&1 &
daemon=$!
for _ in $(seq 300); do [ -S "$sock" ] && break; sleep 0.1; done
sleep 2
step cuda_shm 180 $TRITON tests/kserve/programs/cuda_shm.py -u "127.0.0.1:$port"
for model in simple accy.kernel.saxpy accy.kernel.device_scan accy.kernel.reduce_sum; do
  case $model in
    simple) shapes=() ;;
    accy.kernel.saxpy) shapes=(--shape x:1048576 --shape y:1048576 --request-parameter a:2:int) ;;
    *) shapes=(--shape x:1048576) ;;
  esac
  for memory in none system cuda; do
    step "perf_${model##*.}_$memory" 180 $PA -m "$model" -u "127.0.0.1:$port" -i grpc \
      --request-count 300 --concurrency-range 8 --shared-memory "$memory" \
      --output-shared-memory-size 4194304 "${shapes[@]}"
  done
done
kill "$daemon"; wait "$daemon" 2>/dev/null
step latency_simple 300 $PY bench/kserve_latency.py --backend cuda --model simple \
  --tritonclient "$TRITON" --json "$OUT/latency_simple.json" ${LATENCY_ARGS:-}
step latency_scan 300 $PY bench/kserve_latency.py --backend cuda --model accy.kernel.device_scan \
  --n 1024 --tritonclient "$TRITON" --json "$OUT/latency_scan.json" ${LATENCY_ARGS:-}
step http_latency_simple 300 $PY bench/kserve_http_latency.py --backend cuda --model simple \
  --json "$OUT/http_latency_simple.json" ${LATENCY_ARGS:-}
step http_latency_scan 300 $PY bench/kserve_http_latency.py --backend cuda \
  --model accy.kernel.device_scan --n 1024 --json "$OUT/http_latency_scan.json" ${LATENCY_ARGS:-}

echo "==== env"; cat "$OUT/env.txt"
echo "==== steps"; cat "$OUT/steps.txt"
if [[ -f $OUT/kserve_tests.log ]]; then
  echo "==== kserve tests"; grep -E "passed|failed|error" "$OUT/kserve_tests.log" | tail -2
  grep -E "^(FAILED|ERROR)" "$OUT/kserve_tests.log" | head -10
fi
echo "==== cuda shared memory"; tail -2 "$OUT/cuda_shm.log"
echo "==== perf_analyzer (infer/s, p50 us)"
for log in "$OUT"/perf_*.log; do
  name=$(basename "$log" .log)
  line=$(grep -m1 "Throughput:" "$log" | awk '{print $2}')
  p50=$(grep -m1 "p50 latency:" "$log" | awk '{print $3}')
  printf '%-28s %10s %10s\n' "$name" "${line:-failed}" "${p50:--}"
done
echo "==== ModelInfer latency"; tail -8 "$OUT/latency_simple.log"; tail -8 "$OUT/latency_scan.log"
echo "==== HTTP infer latency"
tail -6 "$OUT/http_latency_simple.log"; tail -6 "$OUT/http_latency_scan.log"
exit 0
