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
bash scripts/pytest.sh warm
exec bash scripts/pytest.sh run "$@"
