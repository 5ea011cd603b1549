#!/usr/bin/env bash
# Runs the default test suite (what CI runs). Extra arguments go to pytest, e.g.
#   bash scripts/test.sh --run-slow        # also the slow suites
#   bash scripts/test.sh tests/engine -x   # one directory
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ ! -x .venv/bin/python ]]; then
  echo "error: .venv is missing; run 'bash scripts/setup.sh' first" >&2
  exit 2
fi
export HF_HUB_OFFLINE=1
exec .venv/bin/python -m pytest "$@"
