#!/usr/bin/env bash
# The suite's pytest command line, in one place (scripts/test.sh and bench/suite_cpu.py call
# it; the environment must be set up: scripts/setup.sh). Usage:
#   bash scripts/pytest.sh warm         fill pytest's assertion-rewrite cache
#   bash scripts/pytest.sh run ARGS...  run the suite on the workers
set -euo pipefail
cd "$(dirname "$0")/.."
py=.venv/bin/python
case "${1:-}" in
warm)
  # pytest rewrites each test module's asserts when it imports it and keeps the result as
  # bytecode only where bytecode may be written: under PYTHONDONTWRITEBYTECODE (CI machines)
  # every worker, and the test VM's two passes under emulation, rewrote all of them again
  # (collection: 7.3 s of CPU a process, 2.2 s from the cache). Collections with bytecode
  # allowed fill the cache first, in two halves at once (two cores: 5.2 s against 8.0 s as
  # one collection); a failing one is reported by the run itself.
  dirs=(tests/*/)
  half=$(( (${#dirs[@]} + 1) / 2 ))
  env -u PYTHONDONTWRITEBYTECODE "$py" -m pytest --collect-only -q -p no:cacheprovider "${dirs[@]:0:$half}" \
    >/dev/null 2>&1 &
  env -u PYTHONDONTWRITEBYTECODE "$py" -m pytest --collect-only -q -p no:cacheprovider "${dirs[@]:$half}" \
    >/dev/null 2>&1 || true
  wait || true
  ;;
run)
  shift
  # --dist loadgroup: tests that share something machine-wide keep to one worker (XDIST_GROUPS
  # in tests/conftest.py). Not in pyproject's addopts: the test VM's guest runs pytest without
  # plugin autoload, where xdist's options do not exist.
  # nice: the test VM (tests/vm, emulated) runs at normal priority above the workers, so its
  # two passes end inside their deadline on a two-core machine (tests/vm/harness.py); only a
  # little (5): the workers' own timeouts need their share too.
  # suite_tmp: the tests' temporary files (TMPDIR) on a journaled ext4 of the run's own, made
  # and removed around it (tests/helpers/suite_tmp.py: on an ext4 without a journal, as this
  # project's CI machines' root is, creating files gets slower with every file deleted).
  exec "$py" -m tests.helpers.suite_tmp -- nice -n 5 "$py" -m pytest -n "${PETRI_TEST_WORKERS:-4}" --dist loadgroup "$@"
  ;;
*)
  echo "usage: bash scripts/pytest.sh warm | run [PYTEST ARGS...]" >&2
  exit 2
  ;;
esac
