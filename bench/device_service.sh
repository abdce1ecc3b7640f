#!/usr/bin/env bash
# One call on a GPU machine for the service: install the carried wheels and accy, then run
# the CUDA tests, the core benchmark, checked CLI runs up to 2^28 through a CUDA daemon,
# the service benchmark and (when present) the fault-recovery benchmark.
# Logs go to $OUT (or ./device-out); a short summary is printed last.
set -u
source bench/device_env.sh || exit 1

step() {  # step NAME TIMEOUT COMMAND...: run, log to $OUT/NAME.log, remember rc and seconds
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  printf '%-14s rc=%-3s %4ss\n' "$name" "$rc" "$((SECONDS - start))" >> "$OUT/steps.txt"
}

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/env.txt" 2>&1
step pytest 240 $PY -m pytest -q -p no:cacheprovider ${PYTEST_ARGS:-tests/backends/test_cuda.py tests/backends/test_cuda_kernels.py tests/backends/test_cuda_pipelines.py}
[ -n "${SKIP_CORE_BENCH:-}" ] || step bench_core 120 $PY bench/bench_core_cuda.py --json "$OUT/bench_core.json"
[ -n "${SKIP_CLI:-}" ] || step cli_check 240 $PY bench/cli_checks.py --backend cuda --sizes 1000000 268435456
step bench_service 420 $PY bench/bench_service.py --backend cuda ${SERVICE_ARGS:-} --json "$OUT/bench_service.json"
if [ -n "${PROFILE:-}" ]; then
  step profile 180 $PY bench/profile_launch.py --backend cuda --count 2000
  ACCYD_LAUNCH_SPIN_SECONDS=0 step profile_nospin 180 $PY bench/profile_launch.py --backend cuda --count 2000
  step launch_path 120 $PY bench/bench_launch_path.py --backend cuda
fi
if [ -f bench/fault_recovery.py ] && [ -z "${SKIP_FAULT:-}" ]; then
  step fault 180 $PY bench/fault_recovery.py --backend cuda --repeat 3 --json "$OUT/fault.json"
fi

echo "==== env"; cat "$OUT/env.txt"
echo "==== steps"; cat "$OUT/steps.txt"
echo "==== pytest"; grep -E "passed|failed|error" "$OUT/pytest.log" | tail -2; grep -E "^(FAILED|ERROR)" "$OUT/pytest.log" | head -10
[ -f "$OUT/bench_core.log" ] && { echo "==== bench_core"; tail -18 "$OUT/bench_core.log"; }
[ -f "$OUT/cli_check.log" ] && { echo "==== cli_check"; tail -8 "$OUT/cli_check.log"; }
echo "==== bench_service"; tail -20 "$OUT/bench_service.log"
[ -f "$OUT/profile.log" ] && { echo "==== profile"; tail -10 "$OUT/profile.log"; }
[ -f "$OUT/profile_nospin.log" ] && { echo "==== profile, no spin"; tail -10 "$OUT/profile_nospin.log"; }
[ -f "$OUT/launch_path.log" ] && { echo "==== launch path"; tail -6 "$OUT/launch_path.log"; }
[ -f "$OUT/fault.log" ] && { echo "==== fault"; tail -12 "$OUT/fault.log"; }
exit 0
