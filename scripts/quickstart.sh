#!/usr/bin/env bash
# Set up accy, start the daemon on a temporary Unix socket, and run a checked pipeline through it.
# On a machine without a GPU the daemon picks the host (numpy) backend by itself.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/setup.sh
export PATH="$root/.venv/bin:$PATH"

workdir=$(mktemp -d)
socket="$workdir/accyd.sock"
# The daemon's own log goes to a file (named here), so the terminal shows the tables alone.
log=${ACCYD_QUICKSTART_LOG:-$root/accyd-quickstart.log}
export ACCY_TARGET="unix:$socket"
echo "accyd serve on $ACCY_TARGET; its log: $log"
accyd serve --backend auto --listen "$ACCY_TARGET" --cache-dir "$workdir/cache" >"$log" 2>&1 &
daemon=$!
stop() {
  kill -TERM "$daemon" 2>/dev/null || true
  wait "$daemon" 2>/dev/null || true
  rm -rf "$workdir"
}
trap stop EXIT

for _ in $(seq 1 100); do
  if accy status >/dev/null 2>&1; then break; fi
  if ! kill -0 "$daemon" 2>/dev/null; then
    echo "accyd exited early; its log ($log):" >&2
    tail -20 "$log" >&2
    exit 1
  fi
  sleep 0.1
done

accy pipelines
accy run accy.kernel.device_scan --n 1000000 --check --repeat 5
accy run accy.kernel.saxpy --n 1000000 --scalar a=2.5 --check
accy status
echo "the commands live in $root/.venv/bin: 'source .venv/bin/activate' puts accyd and accy on PATH"
