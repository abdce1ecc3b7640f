#!/usr/bin/env bash
# One call on a GPU machine comparing two trees on the sharing benchmark (within about 8
# minutes): BEFORE (default before-tree/, a copy of an older commit carried beside this tree)
# and this tree, each installed fresh (bench/device_env.sh) and running its own
# bench/bench_sharing.py (baselines, MPS, the accy series) one after the other; then the accy
# series' numbers side by side. With ENGINE_THREADS="8 16", this tree's scale series at 32
# clients again on daemons with that many engine threads. Logs go to $OUT/<tree>/.
set -u
root=$PWD
before=${BEFORE:-before-tree}
out=${OUT:-device-out}
mkdir -p "$out"
: > "$out/trees.txt"
run_tree() { # NAME DIR
  (
    cd "$2" || exit 1
    [ -e .whl ] || ln -s "$root/.whl" .whl
    rm -rf /tmp/accy-site
    export OUT="$out/$1"
    source bench/device_env.sh || exit 1
    start=$SECONDS
    timeout -k 10 ${SHARING_TIMEOUT:-260} $PY bench/bench_sharing.py --out "$OUT/sharing.json" \
      ${SHARING_ARGS:---seconds 1 --budget 150} > "$OUT/sharing.log" 2>&1
    echo "$1 rc=$? $((SECONDS - start))s $(git -C "$root" rev-parse --short HEAD 2>/dev/null)" >> "$out/trees.txt"
  )
}
run_tree before "$before"
run_tree after .
for threads in ${ENGINE_THREADS:-}; do
  (
    export OUT="$out/threads$threads"
    source bench/device_env.sh > /dev/null || exit 1
    timeout -k 10 120 $PY bench/scale.py --clients 32 --seconds 1 --skip mps,ceiling \
      --daemon-args "--engine-threads $threads" > "$OUT/scale.log" 2>&1
  )
done

echo "==== trees (name, exit status, seconds)"; cat "$out/trees.txt"
python3 - "$out" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
def load(name):
    try:
        return json.loads((out / name / "sharing.json").read_text())
    except Exception as error:
        return {"error": str(error)}
b, a = load("before"), load("after")
print(f"{'accy series':<34} {'before':>12} {'after':>12} {'after/before':>13}")
for key, found in a.get("accy", {}).items():
    old = b.get("accy", {}).get(key, {})
    for field, unit in (("per_second", "k/s"), ("launch", "p50 us")):
        new_v, old_v = found.get(field), old.get(field)
        if isinstance(new_v, dict):
            new_v, old_v = new_v.get("p50_us"), (old_v or {}).get("p50_us")
        if isinstance(new_v, (int, float)) and isinstance(old_v, (int, float)):
            print(f"{key + ' ' + unit:<34} {old_v:>12,.1f} {new_v:>12,.1f} {new_v / old_v:>13.2f}")
PY
for name in before after; do echo "==== $name goals"; tail -16 "$out/$name/sharing.log"; done
for threads in ${ENGINE_THREADS:-}; do echo "==== engine threads $threads"; grep "^| 32 |" "$out/threads$threads/scale.log"; done
exit 0
