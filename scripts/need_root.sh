# Sourced by the scripts README.md starts with (demo.sh, test.sh): they install system
# packages with apt-get and mount loop filesystems, so they run as root. A normal user's
# run becomes root through sudo where there is one (a fresh Debian has none: run as root).
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    echo "$(basename "$0"): needs root (apt-get, loop mounts); re-running with sudo" >&2
    exec sudo -- bash "$0" "$@"
  fi
  echo "$(basename "$0"): needs root (apt-get, loop mounts) and there is no sudo here: run it as root" >&2
  exit 1
fi
