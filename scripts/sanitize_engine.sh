#!/usr/bin/env bash
# Build the native engine with AddressSanitizer and UndefinedBehaviorSanitizer and run its own
# tests, the ring fuzz suites and the ring door's tests through it; then rebuild it plain.
# Extra arguments go to pytest. Needs gcc (CI has it); skips, saying so, where it is absent.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
python=${PYTHON:-.venv/bin/python}
if ! command -v gcc >/dev/null; then
  echo "== sanitizer build of the engine: skipped, no gcc here"
  exit 0
fi
asan=$(gcc -print-file-name=libasan.so)
ubsan=$(gcc -print-file-name=libubsan.so)
rebuild() { ACCYD_NATIVE="$1" "$python" setup.py -q build_ext --inplace --force >/dev/null; }
trap 'rebuild 1' EXIT
echo "== engine under ASan and UBSan"
rebuild sanitize
# Python itself is not built with ASan: its runtime is preloaded, and leak checks (CPython
# keeps memory to the end by design) are off; any other report fails the run.
LD_PRELOAD="$asan $ubsan" ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ACCYD_ENGINE=native \
  "$python" -m pytest -p no:cacheprovider tests/engine tests/ring/test_ring_core.py \
  tests/ring/test_ring_bound.py tests/fuzz "$@"
echo "== engine under ThreadSanitizer"
# Its threads hand lanes to each other (a crowd): every report fails the run. The ring
# memory a client writes through Python is not instrumented; the engine's side of it is.
tsan=$(gcc -print-file-name=libtsan.so)
rebuild thread
reports=$(mktemp -d)
# TSan ends a process that reported with 66: the reports are shown below either way.
status=0
LD_PRELOAD="$tsan" TSAN_OPTIONS="halt_on_error=0 report_signal_unsafe=0 log_path=$reports/tsan" \
  ACCYD_ENGINE=native "$python" -m pytest -p no:cacheprovider tests/engine \
  tests/ring/test_ring_core.py tests/ring/test_ring_bound.py tests/ring/test_ring_waits.py "$@" \
  || status=$?
if compgen -G "$reports/tsan*" >/dev/null; then
  cat "$reports"/tsan*
  echo "ThreadSanitizer reported the above"
  exit 1
fi
exit "$status"
