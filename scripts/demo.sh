#!/usr/bin/env bash
# The demo (README's first command): installs everything, then, on a btrfs image it makes
# and loop-mounts itself (so it works on any host filesystem), creates a sample project,
# registers it with petri, snapshots it, forks three sandboxes and changes each, shows them,
# then makes a risky change to live and rolls it back, and races three candidate fixes
# for the sample's bug (then diffs and promotes the winner where those commands exist). Everything it mounted is released
# at the end (PETRI_DEMO_KEEP=1 keeps the image mounted for a look around).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
. "$repo/scripts/need_root.sh"
bash "$repo/scripts/setup.sh"
petri="$repo/.venv/bin/petri"

work=$(mktemp -d /var/tmp/petri-demo.XXXXXX)
loop=""
cleanup() {
  if [ "${PETRI_DEMO_KEEP:-0}" = 1 ]; then echo "kept: $work/mnt ($loop)"; return; fi
  (cd / && "$petri" --workspace "$work/mnt/stats" deinit --force >/dev/null 2>&1) || true
  umount -R "$work/mnt" 2>/dev/null || umount -l "$work/mnt" 2>/dev/null || true
  [ -n "$loop" ] && losetup -d "$loop" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }

step "a 1 GiB btrfs image, loop-mounted at $work/mnt"
truncate -s 1G "$work/btrfs.img"
mkfs.btrfs -q "$work/btrfs.img" >/dev/null 2>&1
loop=$(losetup --find --show "$work/btrfs.img")
mkdir "$work/mnt"
mount "$loop" "$work/mnt"

step "a sample project (with a bug in median()) at $work/mnt/stats"
mkdir "$work/mnt/stats"
bash "$repo/demo/sample_project.sh" "$work/mnt/stats"
cd "$work/mnt/stats"
git init -q && git add -A && git -c user.email=demo@petri -c user.name=demo commit -qm "sample project"
ls -A

step "petri init --convert: make it a subvolume, register it, first snapshot"
"$petri" init --convert
cd "$work/mnt/stats"  # the same path, now a subvolume (the old directory this shell sat in is gone)

step "petri snapshot"
"$petri" snapshot -m "clean checkout"

step "petri fork -n 3 --label try: three sandboxes at once"
"$petri" fork -n 3 --label try --ttl 1h

step "change each sandbox differently (each is a real directory: edit it with anything)"
for i in 1 2 3; do
  path=$("$petri" status "try-$i" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["sandboxes"][0]["path"])')
  echo "# note from sandbox $i" >> "$path/README.md"
  echo "try-$i: $path (.env, .venv and node_modules came along: $(ls -A "$path" | tr '\n' ' '))"
done
echo "live README is untouched:"; tail -1 README.md

step "petri ls"
"$petri" ls

step "a risky change to live: delete the tests, break the package"
rm -rf tests
echo "this is not python" > stats/__init__.py
ls -A; head -1 stats/__init__.py

step "petri rollback to the clean snapshot"
snap=$("$petri" snapshots --json | python3 -c 'import json,sys; print([s["id"] for s in json.load(sys.stdin)["snapshots"] if s["message"]=="clean checkout"][0])')
"$petri" rollback "$snap"
ls -A; python3 -m unittest -q tests.test_stats 2>&1 | tail -1 || true
echo "(the median bug is still there: that is what the race of candidate fixes is for)"

step "petri race: three candidate fixes for median() (one right, one wrong, one that does not parse)"
for f in right wrong does-not-parse; do echo "--- demo/fixes/$f.patch"; sed -n '/^@@/,$p' "$repo/demo/fixes/$f.patch"; done
# Each candidate gets a sandbox of its own; the patch is applied inside it, then the tests run
# in all three at once. Exit 1 would mean no candidate passed.
"$petri" race --check "/usr/bin/python3 -m unittest -q tests.test_stats" \
  --patch "$repo/demo/fixes/right.patch" \
  --patch "$repo/demo/fixes/wrong.patch" \
  --patch "$repo/demo/fixes/does-not-parse.patch"
winner=$("$petri" ls --json | python3 -c 'import json,sys; print([s["id"] for s in json.load(sys.stdin)["sandboxes"] if s["label"] is None][-1])')
echo "the winner's tree: $("$petri" status "$winner" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["sandboxes"][0]["path"])')"
# The check ran in a throwaway fork of the winner's applied state (so what the tests left
# behind is not promoted); its output is recorded as the winner's own run: the apply step
# is run 1, the check run 2.
echo "the winner's check (petri logs $winner --run 2):"
"$petri" logs "$winner" --run 2

if "$petri" diff --help >/dev/null 2>&1; then
  step "petri diff and promote the winner"
  "$petri" diff "$winner"
  "$petri" promote "$winner"
  python3 -m unittest -q tests.test_stats && echo "live passes its tests now"
else
  echo "(petri diff/promote are not in this build yet: the winner stays in its sandbox)"
fi

step "petri rm --all and gc"
"$petri" rm --all
"$petri" gc
echo; echo "demo done."
