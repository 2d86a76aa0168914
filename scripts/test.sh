#!/usr/bin/env bash
# The tests (README's second command): installs everything, then runs the suite, as root
# (a normal user's run re-runs itself with sudo, or says to run it as root).
# Long suites are marked slow and left out; `bash scripts/test.sh -m slow` runs them.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
. "$repo/scripts/need_root.sh"
bash "$repo/scripts/setup.sh"
cd "$repo"
exec .venv/bin/python -m pytest "$@"
