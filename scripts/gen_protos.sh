#!/usr/bin/env bash
# Regenerate the Python protocol modules from protos/: accy.launch.v1 into
# client/accy/protocol/launch/v1/, and the KServe v2 door's (package inference) into
# server/accyd/doors/kserve/protocol/. With --check, regenerate into a temporary folder and fail
# if the committed code differs. This is the one way to regenerate them.
#
# The generated code checks its runtime at import: a _pb2 module refuses a protobuf older than
# the protoc that made it, a _pb2_grpc module a grpcio older than its grpcio-tools. So it is made
# with the grpcio-tools of the oldest grpcio that pyproject.toml admits (TOOLS below), whose
# protoc is no newer than the oldest protobuf admitted, in an environment of its own
# (.protoc-tools/, ignored by git; made again when TOOLS changes): the code then runs on every
# grpcio and protobuf in the ranges. Raise TOOLS with those lower bounds, never past them.
#
# protoc names the modules after the .proto path (accy/launch/v1/, inference/, the proto
# packages); they live under accy.protocol and accyd.doors.kserve.protocol, so the generated
# imports between them are rewritten to match.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
TOOLS="grpcio-tools==1.81.1 grpcio==1.81.1 protobuf==6.33.5 googleapis-common-protos==1.76.0"
tools=${ACCY_PROTOC_TOOLS:-$root/.protoc-tools}
if [[ ! -f $tools/stamp || $(cat "$tools/stamp") != "$TOOLS" ]]; then
  rm -rf "$tools"
  "${PYTHON:-python3}" -m venv "$tools"
  # shellcheck disable=SC2086 # TOOLS is a list of requirements
  "$tools/bin/python" -m pip install --quiet --disable-pip-version-check $TOOLS 2>&1 \
    | grep -v "is ignored: it is neither" || true
  "$tools/bin/python" -c "import grpc_tools.protoc, google.rpc.status_pb2"
  echo "$TOOLS" >"$tools/stamp"
fi
py=$tools/bin/python
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
