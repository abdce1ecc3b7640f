#!/usr/bin/env bash
# Regenerate the Python protocol modules from protos/ into client/accy/protocol/launch/v1/.
# With --check, regenerate into a temporary folder and fail if the committed code differs.
#
# protoc names the modules after the .proto path (accy/launch/v1/, the proto package); they
# live under accy.protocol, so the one generated import between them is rewritten to match.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-python3}
dest="$root/client/accy/protocol/launch/v1"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# google/rpc/status.proto comes with googleapis-common-protos (a runtime dependency).
common=$("$py" -c 'import pathlib, google.rpc.status_pb2 as m; print(pathlib.Path(m.__file__).parents[2])')
"$py" -m grpc_tools.protoc -I"$root/protos" -I"$common" \
  --python_out="$work" --pyi_out="$work" --grpc_python_out="$work" \
  "$root"/protos/accy/launch/v1/*.proto
generated="$work/accy/launch/v1"
sed -i 's/^from accy\.launch\.v1 import /from accy.protocol.launch.v1 import /' "$generated"/*.py
if [[ "${1:-}" == "--check" ]]; then
  for f in "$generated"/*.py "$generated"/*.pyi; do
    name=$(basename "$f")
    if ! cmp -s "$f" "$dest/$name"; then
      echo "generated protocol code is stale: $name differs; run scripts/gen_protos.sh" >&2
      exit 1
    fi
  done
  echo "generated protocol code is current"
else
  cp "$generated"/*.py "$generated"/*.pyi "$dest/"
fi
