#!/usr/bin/env bash
# Installs everything petri needs on a fresh Debian 12 machine (run as root):
# the system packages, a virtualenv in .venv, and petri itself (editable).
set -euo pipefail
cd "$(dirname "$0")/.."
pkgs=(btrfs-progs libbtrfsutil-dev xfsprogs fuse3 libfuse3-dev pkg-config bubblewrap git
      util-linux attr patch python3-venv python3-dev gcc libseccomp2
      fuse-overlayfs   # fuse-overlayfs: only bench/bench_fuse.py compares against it
      openssh-client   # ssh-agent/ssh-add: tests/sandbox/test_sandbox_holes.py's real agent
      iproute2         # ss: the cluster tests check that a local Ray cluster listens on loopback only
      tmux             # tmux: the TUI's real-terminal test
      e2fsprogs        # mkfs.ext4: the suite's temporary files get an ext4 of their own (tests/helpers/suite_tmp.py)
      # tests/vm: a second kernel with pure cgroup v2 in a VM (virtme-ng, from the test extra)
      qemu-system-x86 linux-image-amd64 busybox-static)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# Debian's own interpreter: every user can run it (a pyenv under /root is 0700), which the
# rootless paths need (a normal user's petri starts FUSE daemons with it).
py=${PYTHON:-/usr/bin/python3}
if [ ! -x .venv/bin/python ]; then
  "$py" -m venv .venv
fi
# Reinstall only when pyproject.toml changed since the last install.
stamp=.venv/.petri-installed
if [ ! -f "$stamp" ] || ! cmp -s pyproject.toml "$stamp"; then
  log=$(mktemp)
  if ! { .venv/bin/pip install -q --upgrade pip && .venv/bin/pip install -q -e '.[btrfs,fuse,test,cluster,docs]'; } >"$log" 2>&1; then
    cat "$log" >&2; rm -f "$log"; echo "setup: pip install failed" >&2; exit 1
  fi
  rm -f "$log"
  cp pyproject.toml "$stamp"
fi
# petri's own modules as bytecode now, once: an editable install compiles nothing, and where
# PYTHONDONTWRITEBYTECODE is set (CI machines, containers) every `petri` start would compile
# the ~30 modules it imports again (0.07 s of CPU each time here; ten times that in the tests'
# emulated VM, which reads the same files). Python still checks each file's mtime.
.venv/bin/python -m compileall -q -j 0 orchestrator merge snapshot petri tui bench tests >/dev/null
