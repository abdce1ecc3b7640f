#!/usr/bin/env bash
# Regenerate the Python protocol modules from protos/: accy.launch.v1 into
# client/accy/protocol/launch/v1/, and the KServe v2 door's (package inference) into
# server/accyd/doors/kserve/protocol/. With --check, regenerate into a temporary folder and fail
# if the committed code differs.
#
# protoc names the modules after the .proto path (accy/launch/v1/, inference/, the proto
# packages); they live under accy.protocol and accyd.doors.kserve.protocol, so the generated
# imports between them are rewritten to match.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# google/rpc/status.proto comes with googleapis-common-protos (a runtime dependency).
common=$("$py" -c 'import pathlib, google.rpc.status_pb2 as m; print(pathlib.Path(m.__file__).parents[2])')

# generate PROTO_DIR PYTHON_PACKAGE DEST: protos/PROTO_DIR/*.proto into DEST, imports rewritten.
generate() {
  local dir=$1 package=$2 dest=$3
  local module=${dir//\//.}
  "$py" -m grpc_tools.protoc -I"$root/protos" -I"$common" \
    --python_out="$work" --pyi_out="$work" --grpc_python_out="$work" \
    "$root"/protos/"$dir"/*.proto
  local generated="$work/$dir"
  sed -i "s/^from ${module//./\\.} import /from $package import /" "$generated"/*.py "$generated"/*.pyi
  if [[ $check == 1 ]]; then
    for f in "$generated"/*.py "$generated"/*.pyi; do
      name=$(basename "$f")
      if ! cmp -s "$f" "$dest/$name"; then
        echo "generated protocol code is stale: $dest/$name differs; run scripts/gen_protos.sh" >&2
        exit 1
      fi
    done
  else
    mkdir -p "$dest"
    cp "$generated"/*.py "$generated"/*.pyi "$dest/"
  fi
}

check=0
[[ "${1:-}" == "--check" ]] && check=1
generate accy/launch/v1 accy.protocol.launch.v1 "$root/client/accy/protocol/launch/v1"
generate inference accyd.doors.kserve.protocol "$root/server/accyd/doors/kserve/protocol"
if [[ $check == 1 ]]; then
  echo "generated protocol code is current"
fi
