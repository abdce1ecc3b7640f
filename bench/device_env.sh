# Sourced on a GPU machine: install the carried wheels (.whl/) and accy into /tmp/accy-site
# (again each time: a machine may be fresh or still hold an older accy), then export the
# paths that run it. Sets PY and STEPS and defines step (below). Usage: source bench/device_env.sh
PY=${PYTHON:-python3}
site=/tmp/accy-site
OUT=${OUT:-device-out}
mkdir -p "$OUT"
$PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl
if ! $PY -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade \
    --target "$site" . > "$OUT/install.log" 2>&1; then
  echo "installing accy failed"
  tail -20 "$OUT/install.log"
  return 1
fi
export PYTHONPATH="$site:server:client" PYTHONUNBUFFERED=1 PATH="$site/bin:$PATH"
export ACCYD_CACHE_DIR=/tmp/accy-cache
STEPS=$OUT
# step NAME SECONDS COMMAND...: run it with a deadline, its output to $STEPS/NAME.log and its
# exit status and seconds to $STEPS/steps.txt. STEPS is fixed here, so a step run with another
# OUT (a nested device script) still logs beside the others.
: > "$STEPS/steps.txt"
step() {
  local name=$1 limit=$2 start=$SECONDS
  shift 2
  timeout -k 10 "$limit" "$@" > "$STEPS/$name.log" 2>&1
  echo "$name rc=$? $((SECONDS - start))s" >> "$STEPS/steps.txt"
}
