#!/usr/bin/env bash
# Run the tests under another Python (default 3.12, what the container image ships) in a venv
# of its own, .venv-pyVERSION. Extra arguments go to pytest. Skips, saying so, where that
# Python is not installed (found on PATH, or among pyenv's versions).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
version=${1:-3.12}
shift || true
python=""
if python$version --version >/dev/null 2>&1; then
  python=python$version
elif command -v pyenv >/dev/null; then
  for candidate in "$(pyenv root)"/versions/"$version"*/bin/python"$version"; do
    [[ -x $candidate ]] && python=$candidate
  done
fi
if [[ -z $python ]]; then
  echo "== pytest on Python $version: skipped, no python$version here"
  exit 0
fi
venv=.venv-py$version
[[ -x $venv/bin/python ]] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet --editable ".[dev]"
echo "== pytest on $("$venv/bin/python" --version)"
"$venv/bin/python" -m pytest "$@"
