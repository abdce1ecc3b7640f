#!/usr/bin/env bash
# Regenerate the Python protocol modules from protos/ into client/accy/launch/v1/.
# With --check, regenerate into a temporary folder and fail if the committed code differs.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-python3}
out="$root/client"
if [[ "${1:-}" == "--check" ]]; then
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi
# google/rpc/status.proto comes with googleapis-common-protos (a runtime dependency).
common=$("$py" -c 'import pathlib, google.rpc.status_pb2 as m; print(pathlib.Path(m.__file__).parents[2])')
"$py" -m grpc_tools.protoc -I"$root/protos" -I"$common" \
  --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" \
  "$root"/protos/accy/launch/v1/*.proto
if [[ "${1:-}" == "--check" ]]; then
  for f in "$out"/accy/launch/v1/*.py "$out"/accy/launch/v1/*.pyi; do
    name=$(basename "$f")
    if ! cmp -s "$f" "$root/client/accy/launch/v1/$name"; then
      echo "generated protocol code is stale: $name differs; run scripts/gen_protos.sh" >&2
      exit 1
    fi
  done
  echo "generated protocol code is current"
fi
