#!/usr/bin/env bash
# Create .venv (if missing) and install accy into it, editable. With --dev, the test tools too.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
python=${PYTHON:-python3}
if [[ ! -x .venv/bin/python ]]; then
  "$python" -m venv .venv
fi
extras=""
if [[ "${1:-}" == "--dev" ]]; then
  extras="[dev]"
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet --editable ".${extras}"
