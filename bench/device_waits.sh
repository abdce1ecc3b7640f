#!/usr/bin/env bash
# One call on a GPU machine (within about 6 minutes): how waiting clients and the engine share
# the CPUs at 8 and 32 clients. bench/scale.py's accy series and the ceiling, then the waited
# series again on daemons started with other wait and engine flags (WAIT_VARIANTS), each
# with the CPUs it used; perf samples of the daemon where perf exists. Table printed last.
set -u
source bench/device_env.sh || exit 1

{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  echo "kernel $(uname -r), uid $(id -u), cpus $(nproc), perf: $(command -v perf || echo none)"
  echo "perf_event_paranoid $(cat /proc/sys/kernel/perf_event_paranoid 2>/dev/null)"
} > "$OUT/env.txt" 2>&1
variants=${WAIT_VARIANTS:-"t4=--engine-threads 4;spin=--no-wait-budget"}
mkdir -p "$OUT/perf"
step waits ${WAITS_TIMEOUT:-360} $PY bench/scale.py --out "$OUT/waits.json" --clients 8,32 \
  --seconds ${WAITS_SECONDS:-1.0} --skip mps --variants "$variants" --perf-dir "$OUT/perf"
for f in "$OUT"/perf/*.perf; do
  [ -e "$f" ] || continue
  perf report -i "$f" --stdio --no-children --sort comm,dso,sym 2>/dev/null | grep -v "^$" | head -120 > "${f%.perf}.txt"
  rm -f "$f"
done

echo "==== env"; cat "$OUT/env.txt"
echo "==== steps (name, exit status, seconds)"; cat "$STEPS/steps.txt"
echo "==== waits"; grep -E "Error|Traceback|skipped" "$STEPS/waits.log" | head; tail -60 "$STEPS/waits.log"
exit 0
