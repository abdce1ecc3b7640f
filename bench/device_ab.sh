#!/usr/bin/env bash
# One call on a GPU machine: bench/ab_trees.py between BEFORE (default before-tree/, a copy of
# an older commit carried beside this tree) and this tree, each installed into a folder of
# its own with the carried wheels and its native engine (within about 5 minutes). Logs go to
# $OUT; the table is printed last.
set -u
PY=${PYTHON:-python3}
OUT=${OUT:-device-out}
mkdir -p "$OUT"
install() { # DIR SITE
  rm -rf "$2"
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$2" .whl/*.whl &&
    $PY -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target "$2" "$1" \
      > "$OUT/install-$(basename "$2").log" 2>&1
}
install "./${BEFORE:-before-tree}" /tmp/site-before || { echo "installing before failed"; exit 1; }
install . /tmp/site-after || { echo "installing after failed"; exit 1; }
export PYTHONUNBUFFERED=1 ACCYD_CACHE_DIR=/tmp/accy-cache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for site in /tmp/site-before /tmp/site-after; do
  PYTHONPATH=$site $PY -c "import accyd.ring.engine._native" 2>/dev/null ||
    PYTHONPATH=$site $PY -c "import accyd.engine._native" 2>/dev/null ||
    echo "$site: no native engine"
done
eval "set -- ${AB_ARGS:-}"  # AB_ARGS may quote a variant's several flags
PYTHONPATH=/tmp/site-after:bench timeout -k 10 ${AB_TIMEOUT:-400} $PY bench/ab_trees.py \
  --tree before=/tmp/site-before --tree after=/tmp/site-after --out "$OUT/ab.json" \
  "$@" > "$OUT/ab.log" 2>&1
echo "ab_trees rc=$?"
tail -8 "$OUT/ab.log"
exit 0
