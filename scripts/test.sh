#!/usr/bin/env bash
# The tests (README's second command): installs everything, then runs the suite, as root
# (a normal user's run re-runs itself with sudo, or says to run it as root).
# On several pytest-xdist workers (PETRI_TEST_WORKERS, default 4; 5 loop devices: a btrfs per
# worker, one shared XFS): the tests mostly wait on processes, mounts, fsync, sleeps and the
# test VM (three workers left a quarter of two cores idle, four 22 %), so even two cores run
# four at once (five were slower: 921 s against four's 859 s, bench/RESULTS.md).
# PETRI_TEST_WORKERS=0 runs them in this one process. `bash scripts/test.sh -m unit` runs
# the unit tier alone; long suites are marked slow and left out (`-m slow` runs them).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
. "$repo/scripts/need_root.sh"
bash "$repo/scripts/setup.sh"
cd "$repo"
# pytest rewrites each test module's asserts when it imports it and keeps the result as
# bytecode only where bytecode may be written: under PYTHONDONTWRITEBYTECODE (CI machines)
# every worker, and the test VM's two passes under emulation, rewrote all of them again
# (collection: 7.3 s of CPU a process, 2.2 s from the cache). One collection with bytecode
# allowed fills the cache first; a failing one is reported by the run itself.
env -u PYTHONDONTWRITEBYTECODE .venv/bin/python -m pytest --collect-only -q -p no:cacheprovider tests \
  >/dev/null 2>&1 || true
# --dist loadgroup: tests that share something machine-wide keep to one worker (XDIST_GROUPS
# in tests/conftest.py). Not in pyproject's addopts: the test VM's guest runs pytest without
# plugin autoload, where xdist's options do not exist.
# nice: the test VM (tests/vm, emulated) runs at normal priority above the workers, so its
# two passes end inside their deadline on a two-core machine (tests/vm/harness.py); only a
# little (5): the workers' own timeouts need their share too.
exec nice -n 5 .venv/bin/python -m pytest -n "${PETRI_TEST_WORKERS:-4}" --dist loadgroup "$@"
