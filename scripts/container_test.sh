#!/usr/bin/env bash
# Build the image and run docker-compose.yml with podman on a local Debian base: the daemon as
# its non-root user with its health check passing, clients of other users through the socket's
# group, the restart policy after the daemon's process is killed, and a clean stop. Then plays
# deploy/k8s's DaemonSet and client Deployment as pods with `podman kube play` (host backend,
# scripts/kube_pod.py): the init container, the gRPC probes, TLS with a token, and the client
# pod's checked scan through the socket folder.
#
# Installs what it needs (podman, runc, debootstrap, catatonit from apt; podman-compose from
# PyPI). Keeps the base image, the build's layers and the tools between runs, so a second run
# only rebuilds what changed. Where containers cannot run, it says so loudly and exits 0, unless
# ACCY_REQUIRE_CONTAINERS=1. Settings: ACCY_CONTAINER_CACHE (tools and podman settings),
# ACCY_BASE_IMAGE, ACCY_DEBIAN_SUITE, ACCY_DEBIAN_MIRROR.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
cache=${ACCY_CONTAINER_CACHE:-/var/tmp/accy-container-test}
suite=${ACCY_DEBIAN_SUITE:-bookworm}
mirror=${ACCY_DEBIAN_MIRROR:-http://deb.debian.org/debian}
base=${ACCY_BASE_IMAGE:-localhost/accy-base:$suite}
image=localhost/accy:ci
project=accy-ci
daemon=${project}_accyd_1
client=${project}_client_1
volume=${project}_accy-socket
ca=/etc/ssl/certs/ca-certificates.crt
podman_compose_version=1.6.0
stand_in=/var/run/cdi/accy-ci-gpu-stand-in.yaml
log=$(mktemp -d)
kube_played=()
started=$SECONDS

say() { echo "== container test: $*"; }
banner() {
  echo "################################################################################"
  echo "## container test $*"
  echo "################################################################################"
}
skip() {
  banner "SKIPPED: $*"
  if [[ ${ACCY_REQUIRE_CONTAINERS:-0} == 1 ]]; then
    exit 1
  fi
  exit 0
}
fail() {
  banner "FAILED: $*"
  exit 1
}
# podman without the noise of its health-check timers, which need systemd (we run the checks).
quiet() { "$@" 2> >(grep -v 'systemd connection' >&2); }
compose() {
  CUDA_IMAGE=$base ACCY_IMAGE=$image BUILDAH_FORMAT=docker \
    "$cache/venv/bin/podman-compose" -p "$project" --in-pod=false "$@"
}
cleanup() {
  if [[ -x $cache/venv/bin/podman-compose ]] && command -v podman >/dev/null; then
    compose down --volumes >"$log/down.log" 2>&1 || true
  fi
  for yaml in "${kube_played[@]}"; do
    podman kube down "$yaml" >/dev/null 2>&1 || true
  done
  if [[ -f $stand_in && $(head -1 "$stand_in") == "# accy container test" ]]; then
    rm -f "$stand_in"
  fi
  rm -rf "$log"
}

# --- what the machine needs --------------------------------------------------------------
if [[ $(id -u) != 0 ]]; then
  skip "needs root (podman as root with runc; base images made with debootstrap)"
fi
missing=()
for tool in podman runc debootstrap catatonit; do
  command -v "$tool" >/dev/null || missing+=("$tool")
done
if ((${#missing[@]})); then
  say "installing ${missing[*]} from apt"
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends podman runc debootstrap catatonit; } >"$log/apt.log" 2>&1; then
    tail -5 "$log/apt.log"
    skip "could not install podman, runc, debootstrap and catatonit with apt-get"
  fi
fi
trap cleanup EXIT
mkdir -p "$cache"
# runc: crun fails on these machines' cgroup setup. Limits no higher than this shell's: podman's
# defaults (a million open files) need CAP_SYS_RESOURCE, which a sandboxed root may lack.
cat >"$cache/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=$(ulimit -Hn):$(ulimit -Hn)", "nproc=4096:4096"]
[engine]
runtime = "runc"
EOF
export CONTAINERS_CONF=$cache/containers.conf

if ! podman image exists "$base"; then
  say "making the base image $base with debootstrap ($suite)"
  rootfs=$(mktemp -d)
  t0=$SECONDS
  if ! debootstrap --variant=minbase --include=ca-certificates "$suite" "$rootfs" "$mirror" \
    >"$log/debootstrap.log" 2>&1; then
    tail -20 "$log/debootstrap.log"
    rm -rf "$rootfs"
    fail "debootstrap $suite from $mirror"
  fi
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -c . | podman import --quiet - "$base" >/dev/null
  rm -rf "$rootfs"
  say "base image made in $((SECONDS - t0)) s"
else
  say "reusing the base image $base"
fi
if ! quiet podman run --rm --network none "$base" true 2>"$log/probe.log"; then
  cat "$log/probe.log"
  skip "podman cannot run a container on this machine"
fi

if [[ $("$cache/venv/bin/podman-compose" --version 2>/dev/null) != *"$podman_compose_version"* ]]; then
  say "installing podman-compose $podman_compose_version"
  rm -rf "$cache/venv"
  python3 -m venv "$cache/venv"
  "$cache/venv/bin/python" -m pip install --quiet "podman-compose==$podman_compose_version"
fi

# No GPU here: the compose file's reservation (driver nvidia, count 1) becomes podman's CDI
# device nvidia.com/gpu=0; a stand-in spec for it adds an environment variable and no device.
if [[ -f $stand_in && $(head -1 "$stand_in") == "# accy container test" ]]; then
  rm -f "$stand_in" # left by a run that was killed
fi
if ! grep -qs 'kind: *"\?nvidia.com/gpu' /etc/cdi/* /var/run/cdi/*; then
  mkdir -p "$(dirname "$stand_in")"
  cat >"$stand_in" <<'EOF'
# accy container test
cdiVersion: "0.5.0"
kind: nvidia.com/gpu
devices:
  - name: "0"
    containerEdits:
      env: ["ACCY_GPU_STAND_IN=0"]
EOF
fi

# --- build ------------------------------------------------------------------------------
compose down --volumes >"$log/down.log" 2>&1 || true
say "building $image on $base (docker-compose.yml, CUDA_IMAGE=$base)"
t0=$SECONDS
# pip in the build reaches the package index only with the host's CA bundle.
if ! compose "--podman-build-args=-v $ca:$ca:ro --pull=never" build >"$log/build.log" 2>&1; then
  tail -40 "$log/build.log"
  fail "image build"
fi
build_s=$((SECONDS - t0))
cached=$(grep -c 'Using cache' "$log/build.log" || true)
size=$(podman image inspect --format '{{.Size}}' "$image")
say "built in ${build_s} s ($cached cached steps); image size $((size / 1000000)) MB"

# --- the daemon, as written in docker-compose.yml ---------------------------------------
healthy() {
  local deadline=$((SECONDS + 60))
  until quiet podman healthcheck run "$1" >/dev/null 2>&1; do
    if ((SECONDS > deadline)); then
      podman logs "$1" 2>&1 | tail -20
      fail "$1 not healthy after 60 s"
    fi
    sleep 1
  done
}
inspect() { podman inspect --format "$2" "$1"; }
expect() {
  if [[ $2 != "$3" ]]; then
    fail "$1: got '$2', want '$3'"
  fi
  say "ok: $1 ($2)"
}

# podman-compose 1.6 drops `ipc:`; pass the file's `ipc: host` to podman itself, and keep the
# containers out of a pod, whose own IPC namespace would win (--in-pod=false, in compose()).
if ! compose --podman-run-args=--ipc=host up -d accyd >"$log/up.log" 2>&1; then
  cat "$log/up.log"
  fail "podman-compose up accyd"
fi
healthy "$daemon"
expect "daemon health check (accy health)" "$(inspect "$daemon" '{{.State.Health.Status}}')" healthy
pid=$(inspect "$daemon" '{{.State.Pid}}')
expect "daemon process user" "$(ps -o uid= -p "$pid" | tr -d ' ')" 10001
expect "network and restart policy" \
  "$(inspect "$daemon" '{{.HostConfig.NetworkMode}} {{.HostConfig.RestartPolicy.Name}}')" \
  "none unless-stopped"
# podman 4.3's inspect says "shareable" for a host IPC namespace: compare the namespaces.
expect "daemon in the host's IPC and PID namespaces" \
  "$(readlink "/proc/$pid/ns/ipc" "/proc/$pid/ns/pid" | tr '\n' ' ')" \
  "$(readlink /proc/self/ns/ipc /proc/self/ns/pid | tr '\n' ' ')"
if [[ -f $stand_in ]]; then
  grep -q '^ACCY_GPU_STAND_IN=0$' <(tr '\0' '\n' <"/proc/$pid/environ") ||
    fail "the GPU reservation did not reach podman as device nvidia.com/gpu=0"
  say "ok: the GPU reservation reached podman as CDI device nvidia.com/gpu=0 (stand-in, no GPU)"
fi

# --- clients through the socket's group -------------------------------------------------
# Clients as the compose file's: read-only, the socket folder mounted read-only.
run_client() {
  quiet podman run --rm --network none --ipc host --pid host --read-only \
    -v "$volume:/run/accy:ro" "$@"
}
if ! compose --podman-run-args=--ipc=host up -d client >"$log/client.log" 2>&1; then
  cat "$log/client.log"
  fail "podman-compose up client"
fi
status=$(podman wait "$client")
podman logs "$client" 2>&1 | sed 's/^/   client | /'
expect "compose client (user 10002, group 10001): device_scan --n 1000000 --check" "$status" 0
if run_client --user 10003:10003 "$image" accy health --timeout 2 >"$log/outsider.log" 2>&1; then
  cat "$log/outsider.log"
  fail "a client outside the socket's group reached the daemon"
fi
say "ok: a client outside group 10001 is refused: $(grep -m1 -io 'permission denied' "$log/outsider.log" || tail -1 "$log/outsider.log")"
scan=(accy run accy.kernel.device_scan --n 100000 --check)
run_client --user 10003:10003 --group-add 10001 "$image" "${scan[@]}" | sed 's/^/   client | /' ||
  fail "client of user 10003 in group 10001"
say "ok: client of user 10003 in group 10001 ran device_scan --n 100000 --check"

# --- the restart policy -----------------------------------------------------------------
restarts=$(inspect "$daemon" '{{.RestartCount}}')
say "killing the daemon's process (pid $pid on the host) with SIGKILL"
kill -KILL "$pid"
deadline=$((SECONDS + 60))
while [[ $(inspect "$daemon" '{{.RestartCount}} {{.State.Status}}') != "$((restarts + 1)) running" ]]; do
  ((SECONDS < deadline)) || fail "the restart policy did not bring the daemon back in 60 s"
  sleep 0.5
done
healthy "$daemon"
expect "daemon back after the kill, healthy" \
  "$(inspect "$daemon" 'restarts={{.RestartCount}} {{.State.Health.Status}}')" \
  "restarts=$((restarts + 1)) healthy"
run_client --user 10003:10003 --group-add 10001 "$image" "${scan[@]}" >"$log/again.log" 2>&1 ||
  { cat "$log/again.log"; fail "client after the restart"; }
say "ok: client ran device_scan --check again after the restart"

# --- a clean stop -----------------------------------------------------------------------
compose stop >"$log/stop.log" 2>&1 || { cat "$log/stop.log"; fail "podman-compose stop"; }
expect "daemon exit status after stop" "$(inspect "$daemon" '{{.State.Status}} {{.State.ExitCode}}')" \
  "exited 0"
# Exit status 0 already says the server drained (the supervisor exits with its status); the
# log line is looked for as well, and its absence is reported without failing the run.
deadline=$((SECONDS + 5))
until podman logs "$daemon" 2>&1 | grep -q 'accyd stopped'; do
  if ((SECONDS > deadline)); then
    podman logs --tail 15 "$daemon" 2>&1 | sed 's/^/   accyd | /'
    say "WARNING: exit status 0, but no 'accyd stopped' line in the daemon's log"
    break
  fi
  sleep 0.5
done
say "ok: the daemon drained and stopped"

# --- the Kubernetes manifests, played with podman -----------------------------------------
# deploy/k8s's DaemonSet and client Deployment, their pod templates as written but for what
# scripts/kube_pod.py changes (the image, no GPU, host paths and Secrets under $kube), played
# with `podman kube play` as pods on the network it makes. podman runs no gRPC probe (it
# ignores them, and readiness and startup probes altogether): the test runs each one as the
# kubelet would, a grpc.health.v1 Check of the whole server at the pod's address and the
# probe's port, from outside the pod (a container on the same network).
kube=$log/kube
mkdir -p "$kube/node" "$kube/secrets/accyd-tls" "$kube/secrets/accyd-tokens"
kube_play() { # MANIFEST NAME: writes $kube/NAME.yaml and $kube/NAME.probes, plays the pod
  "$cache/venv/bin/python" scripts/kube_pod.py "deploy/k8s/$1" --image "$image" \
    --host-root "$kube/node" --secrets "$kube/secrets" --out "$kube/$2.yaml" >"$kube/$2.probes" ||
    fail "scripts/kube_pod.py deploy/k8s/$1"
  quiet podman kube play "$kube/$2.yaml" >"$log/play-$2.log" 2>&1 ||
    { cat "$log/play-$2.log"; fail "podman kube play deploy/k8s/$1"; }
  kube_played+=("$kube/$2.yaml")
}
pod_network() { # POD: "NETWORK ADDRESS" of the pod on the network kube play made
  inspect "$(podman pod inspect --format '{{.InfraContainerID}}' "$1")" \
    '{{range $name, $net := .NetworkSettings.Networks}}{{$name}} {{$net.IPAddress}}{{end}}'
}
outside() { quiet podman run --rm --network "$network" "$@" </dev/null; } # beside the pods
# The Secrets the DaemonSet mounts (0440, group 10001 as fsGroup makes them): a self-signed
# certificate for the TLS listener and a tokens file with one token.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 90 -subj /CN=accyd \
  -addext subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout "$kube/secrets/accyd-tls/tls.key" \
  -out "$kube/secrets/accyd-tls/tls.crt" >"$log/openssl.log" 2>&1 ||
  { cat "$log/openssl.log"; fail "openssl: the TLS Secret"; }
token=accy_ci$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
printf '[[token]]\ntenant = "ci"\nsha256 = "%s"\nscopes = ["launch"]\n' \
  "$(printf %s "$token" | sha256sum | cut -d' ' -f1)" >"$kube/secrets/accyd-tokens/tokens.toml"
chgrp -R 10001 "$kube/secrets" && chmod 0440 "$kube"/secrets/*/* && chmod 0750 "$kube"/secrets/*

kube_played=()
kube_play daemonset.yaml accyd
kube_daemon=accyd-accyd
read -r network address < <(pod_network accyd)
expect "daemon pod: the init container gave the node's /run/accy to accyd" \
  "$(stat -c '%u:%g %a' "$kube/node/run/accy")" "10001:10001 750"
while read -r kind container port period tries; do
  t0=$SECONDS
  for ((try = 1; ; try++)); do
    outside "$image" accy --target "$address:$port" health --timeout 5 >/dev/null 2>&1 && break
    if ((try >= tries)); then
      podman logs --tail 20 "$kube_daemon" 2>&1 | sed 's/^/   accyd | /'
      fail "$kind of $container (gRPC, port $port) failed $tries times"
    fi
    sleep "$period"
  done
  say "ok: $kind of $container: gRPC health at $address:$port SERVING (try $try, $((SECONDS - t0)) s)"
done <"$kube/accyd.probes"
pid=$(inspect "$kube_daemon" '{{.State.Pid}}')
expect "daemon pod: process user and group" \
  "$(ps -o uid=,gid= -p "$pid" | tr -s ' ' | sed 's/^ //')" "10001 10001"
outside -v "$kube/secrets/accyd-tls:/tls:ro" "$image" accy --target "$address:7447" \
  --tls-ca /tls/tls.crt --tls-server-name localhost --token "$token" status >"$log/tls.log" 2>&1 ||
  { cat "$log/tls.log"; fail "daemon pod: a remote client over TLS with a token"; }
say "ok: daemon pod: a remote client's accy status at $address:7447, TLS (the Secret) and a token"

kube_play client-deployment.yaml client
kube_client=accy-example-client-client
deadline=$((SECONDS + 120))
until podman logs "$kube_client" 2>&1 | grep -Eq '^check [^ ]+ +ok '; do
  if ((SECONDS > deadline)) || [[ $(inspect "$kube_client" '{{.State.Status}}') != running ]]; then
    podman logs "$kube_client" 2>&1 | tail -20 | sed 's/^/   client | /'
    fail "client pod: no checked scan through the socket volume"
  fi
  sleep 1
done
podman logs "$kube_client" 2>&1 | sed 's/^/   client | /'
expect "client pod: the manifest's checked scan loop still running" \
  "$(inspect "$kube_client" '{{.State.Status}} restarts={{.RestartCount}}')" "running restarts=0"
expect "client pod: user, group, and groups (its own and the socket's 10001)" \
  "$(awk '/^(Uid|Gid):/ {printf "%s %s ", $1, $2} /^Groups:/ {$1 = $1; print}' \
    "/proc/$(inspect "$kube_client" '{{.State.Pid}}')/status")" \
  "Uid: 10002 Gid: 10002 Groups: 10001 10002"
for yaml in "${kube_played[@]}"; do
  quiet podman kube down "$yaml" >"$log/kube-down.log" 2>&1 ||
    { cat "$log/kube-down.log"; fail "podman kube down $yaml"; }
done
kube_played=()
say "ok: both pods down"

banner "PASSED in $((SECONDS - started)) s: build ${build_s} s ($cached cached steps), image $((size / 1000000)) MB"
