#!/usr/bin/env bash
# Set up, then run every check CI runs: lint, types, generated code, container files, tests.
# Extra arguments go to pytest (for example: scripts/test.sh -k scan).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/setup.sh --dev
export PATH="$root/.venv/bin:$PATH"
echo "== ruff"
ruff check server client tests bench
ruff format --check server client tests bench
echo "== mypy --strict"
mypy
echo "== generated protocol code"
PYTHON=.venv/bin/python bash scripts/gen_protos.sh --check
if [[ -f scripts/lint_containers.sh ]]; then
  echo "== container files"
  bash scripts/lint_containers.sh
fi
# tritonclient and perf_analyzer, which the KServe door's tests run against (.kserve-tools/).
bash scripts/kserve_tools.sh
echo "== pytest"
status=0
python -m pytest "$@" || status=$?
# The attack and chaos tests time how promptly the daemon answers under load they make
# themselves; other tests' load must not count, so they run after, in a process of their own.
echo "== pytest: timed under attack, alone"
alone=0
python -m pytest -m alone "$@" || alone=$?
# 5 from the second run: nothing selected (extra arguments chose only other tests).
[[ $alone -eq 5 ]] && alone=0
(( status != 0 )) && exit "$status"
exit "$alone"
