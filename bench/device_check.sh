#!/usr/bin/env bash
# One call on a GPU machine: CUDA tests, the benchmark, compute-sanitizer on the kernels.
# Logs go to $OUT (or ./device-out); a short summary is printed last.
set -u
OUT=${OUT:-device-out}
mkdir -p "$OUT"
export PYTHONPATH=server:client PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)

{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  $PY -c "import sys, numpy, cuda.bindings; print(sys.version.split()[0], 'numpy', numpy.__version__, 'cuda-bindings', cuda.bindings.__version__)"
  $PY -c "import cupy; print('cupy', cupy.__version__)" 2>&1
  echo "sanitizer: ${SAN:-none}"
} > "$OUT/env.txt" 2>&1

start=$SECONDS
timeout 300 $PY -m pytest -q -p no:cacheprovider ${PYTEST_ARGS:-tests/backends/test_cuda.py tests/backends/test_cuda_kernels.py tests/backends/test_cuda_pipelines.py} > "$OUT/pytest.log" 2>&1
pytest_rc=$?; pytest_s=$((SECONDS - start))

start=$SECONDS
timeout 120 $PY bench/bench_core_cuda.py --json "$OUT/bench.json" > "$OUT/bench.log" 2>&1
bench_rc=$?; bench_s=$((SECONDS - start))

san_summary=""
if [ -n "$SAN" ]; then
  for tool in memcheck racecheck initcheck; do
    start=$SECONDS
    timeout 75 "$SAN" --tool "$tool" --error-exitcode 3 $PY bench/sanitize_kernels.py > "$OUT/$tool.log" 2>&1
    rc=$?
    san_summary="$san_summary $tool rc=$rc ($((SECONDS - start))s): $(grep -E 'ERROR SUMMARY|SANITIZE-RUN|RACECHECK SUMMARY' "$OUT/$tool.log" | tr '\n' ' ')
"
  done
fi

echo "==== env"; cat "$OUT/env.txt"
echo "==== pytest rc=$pytest_rc (${pytest_s}s)"; grep -E "passed|failed|error" "$OUT/pytest.log" | tail -3
grep -E "^(FAILED|ERROR)" "$OUT/pytest.log" | head -20
echo "==== sanitizer"; printf "%s" "$san_summary"
echo "==== bench rc=$bench_rc (${bench_s}s)"; tail -20 "$OUT/bench.log"
