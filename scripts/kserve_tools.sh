#!/usr/bin/env bash
# Install the outside clients the KServe door's tests run against, into .kserve-tools/
# (ignored by git; nothing is cached elsewhere):
#   venv/               tritonclient[grpc,http], pinned, in an environment of its own (the tests
#                       run it as an outside client would, in a process of its own)
#   perf_analyzer/      perf_analyzer's binary from its PyPI wheel
#   runtime/            where this system's C library is older than the binary needs (2.38),
#                       a newer Debian's loader and C/C++ runtime, unpacked from its packages
#   bin/perf_analyzer   runs the binary (through that loader where needed) and exits with the
#                       binary's own status (the wheel's wrapper always exits 0)
# Run again, it does nothing unless a pin changed. --check only says whether they are there.
# --device-wheels DIR downloads (does not install) the wheels bench/device_kserve.sh needs on
# a GPU machine without network (CPython 3.12, x86_64): carry DIR there as .whl/kserve/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tools=${ACCY_KSERVE_TOOLS:-$root/.kserve-tools}
TRITONCLIENT=2.73.0
PERF_ANALYZER=2.60.0
RUNTIME_SUITE=trixie
stamp="tritonclient[grpc,http]=$TRITONCLIENT perf_analyzer=$PERF_ANALYZER runtime=$RUNTIME_SUITE"

if [[ "${1:-}" == "--device-wheels" ]]; then
  dir=${2:?--device-wheels DIR}
  platforms=()
  for tag in manylinux_2_38 manylinux_2_34 manylinux_2_28 manylinux_2_27 manylinux_2_24 \
    manylinux_2_17 manylinux2014 manylinux1; do
    platforms+=(--platform "${tag}_x86_64")
  done
  ${PYTHON:-python3} -m pip download --quiet --disable-pip-version-check --only-binary=:all: \
    "${platforms[@]}" --python-version 3.12 --implementation cp -d "$dir" \
    "tritonclient[grpc,http,cuda]==$TRITONCLIENT" "perf-analyzer==$PERF_ANALYZER" 2>&1 \
    | grep -v "is ignored: it is neither" || true
  ls "$dir"
  exit 0
fi
if [[ "${1:-}" == "--check" ]]; then
  [[ -f $tools/stamp && $(cat "$tools/stamp") == "$stamp" ]] && echo "kserve tools: installed" && exit 0
  echo "kserve tools: missing (run scripts/kserve_tools.sh)" && exit 1
fi
if [[ -f $tools/stamp && $(cat "$tools/stamp") == "$stamp" ]]; then
  echo "== kserve tools: current ($stamp)"
  exit 0
fi
echo "== kserve tools: installing $stamp into $tools"
rm -rf "$tools"
mkdir -p "$tools/bin"

python=${PYTHON:-python3}
"$python" -m venv "$tools/venv"
"$tools/venv/bin/python" -m pip install --quiet --disable-pip-version-check \
  "tritonclient[grpc,http]==$TRITONCLIENT" 2>&1 | grep -v "is ignored: it is neither" || true
"$tools/venv/bin/python" -c "import tritonclient.grpc, tritonclient.http, tritonclient.utils.shared_memory"

# The wheel is tagged manylinux_2_38, which pip will not pick on an older system: fetch it
# for that platform by name and take the binary out of it.
"$tools/venv/bin/python" -m pip download --quiet --disable-pip-version-check --no-deps \
  --only-binary=:all: --platform manylinux_2_38_x86_64 -d "$tools/wheels" \
  "perf-analyzer==$PERF_ANALYZER" 2>&1 | grep -v "is ignored: it is neither" || true
"$tools/venv/bin/python" - "$tools" <<'PY'
import pathlib, stat, sys, zipfile
tools = pathlib.Path(sys.argv[1])
(wheel,) = (tools / "wheels").glob("perf_analyzer-*.whl")
target = tools / "perf_analyzer" / "perf_analyzer"
target.parent.mkdir(parents=True)
with zipfile.ZipFile(wheel) as archive:
    target.write_bytes(archive.read("perf_analyzer/bin/perf_analyzer"))
target.chmod(target.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
PY

glibc=$(getconf GNU_LIBC_VERSION | awk '{print $2}')
if [[ $(printf '%s\n' 2.38 "$glibc" | sort -V | head -1) == 2.38 ]]; then
  cat >"$tools/bin/perf_analyzer" <<SH
#!/bin/sh
exec "$tools/perf_analyzer/perf_analyzer" "\$@"
SH
else
  # apt with a private state folder: this system's own package lists are left alone.
  apt=$tools/apt
  mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/debs"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $RUNTIME_SUITE main" \
    >"$apt/sources.list"
  options=(-o "Dir::Etc::SourceList=$apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache" -o Dir::State::Status=/dev/null
    -o APT::Architecture=amd64 -o APT::Sandbox::User=root)
  apt-get "${options[@]}" -qq update
  (cd "$apt/debs" && apt-get "${options[@]}" -qq download libc6 libstdc++6 libgcc-s1)
  for deb in "$apt/debs"/*.deb; do dpkg -x "$deb" "$tools/runtime"; done
  rm -rf "$apt"
  lib=$tools/runtime/usr/lib/x86_64-linux-gnu
  cat >"$tools/bin/perf_analyzer" <<SH
#!/bin/sh
exec "$lib/ld-linux-x86-64.so.2" --library-path "$lib:/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu" \
  "$tools/perf_analyzer/perf_analyzer" "\$@"
SH
fi
chmod +x "$tools/bin/perf_analyzer"
"$tools/bin/perf_analyzer" --version
echo "$stamp" >"$tools/stamp"
echo "== kserve tools: installed"
