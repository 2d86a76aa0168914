#!/usr/bin/env bash
# The tests (README's second command): installs everything, then runs the suite.
# Long suites are marked slow and left out; `bash scripts/test.sh -m slow` runs them.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
bash "$repo/scripts/setup.sh"
cd "$repo"
exec .venv/bin/python -m pytest "$@"
