#!/bin/bash
# Runs inside the VM that tests/vm/harness.py boots, as the guest's root. Usage:
#   guest.sh OUT REPO
# OUT is a host directory shared read-write: it holds root.tests and user.tests (the pytest
# selections, one argument a line) and receives guest.log, the junit files, the exit codes
# and what the passes left behind. The guest is a pure cgroup v2 machine; this script makes
# what a real one would have:
# - /tmp and /var/tmp on ext4 (the guest's own /tmp is an overlay, which refuses idmapped
#   mounts; ext4 is what the host has there), on a loop device of the guest's own kernel;
# - a normal user with a delegated cgroup subtree, as systemd's user@UID.service
#   (Delegate=yes) gives one: the directory and its cgroup.procs, cgroup.threads and
#   cgroup.subtree_control owned by the user, its processes in a leaf (init.scope).
# Then it runs root.tests as root and user.tests as that user from inside the subtree.
# Exit: 0 when every step ran (the passes' own results are in OUT), 90-99 when the guest
# could not be set up.
set -u
exec >"$1/guest.log" 2>&1
host_out=$1
repo=$2
say() { echo "== [$(cut -d' ' -f1 /proc/uptime)s] $*"; }
say "guest up: $(uname -r), $(nproc) cpus, $(grep MemTotal /proc/meminfo | tr -s ' ')"

# Everything of ours lives in a tmpfs of its own (in guest memory, gone with the VM). OUT
# sits under the /tmp or /var/tmp about to be covered: reach it through a bind mount.
v=/run/petri-vm
mkdir -p $v && mount -t tmpfs -o size=1536m,mode=755 tmpfs $v || exit 90
mkdir $v/out && mount --bind "$1" $v/out || exit 90
out=$v/out

# The host's files again, with caching: the root virtme-ng mounts has none, and every
# Python start reads hundreds of files (a cold `import trio` took 18 s, cached 3 s). The
# host does not change them while the VM runs. /usr read-only; the repository below.
mkdir $v/host && mount -t 9p -o trans=virtio,version=9p2000.L,cache=loose,msize=524288,ro petri-hostfs $v/host \
  || exit 91
mount --bind $v/host/usr /usr || exit 91

export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8
export PYTHONDONTWRITEBYTECODE=1 CI=${CI:-}
# Only the plugins the selections use: autoloading all of them (hypothesis, textual's
# snapshots, pytest-trio) costs a minute of imports under emulation.
export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
py=$repo/.venv/bin/python
pytest_args=(-p pytest_timeout -p no:cacheprovider -q -rfEs --durations=0 --durations-min=0.5)
pass_timeout=${PASS_TIMEOUT:-900}
# A wedged guest must not outlive its purpose even if the host side was SIGKILLed: power
# off after both passes' deadlines and some.
( sleep $((2 * pass_timeout + 240)); echo o >/proc/sysrq-trigger ) &
watchdog=$!

# Modules come from the host's /lib/modules (the kernel package installs them there).
for m in loop ext4 btrfs xfs overlay fuse; do
  grep -qw "$m" /proc/filesystems 2>/dev/null || modprobe "$m" || say "modprobe $m failed"
done

truncate -s 8G $v/scratch.img && mkfs.ext4 -q $v/scratch.img && mount -o loop $v/scratch.img /tmp || exit 92
chmod 1777 /tmp && mkdir -m 1777 /tmp/.var-tmp && mount --bind /tmp/.var-tmp /var/tmp || exit 92
# Now (a clone may live under the /tmp or /var/tmp just covered): the repository at its own
# path, from the cached host files, with an overlay so nothing the tests write reaches the host.
mkdir -p "$repo" $v/repo-upper $v/repo-work \
  && mount -t overlay -o "lowerdir=$v/host$repo,upperdir=$v/repo-upper,workdir=$v/repo-work" overlay "$repo" \
  || exit 92
say "set up: /tmp on $(findmnt -n -o SOURCE,FSTYPE /tmp | tail -n 1)"

# Accounts: written directly, as useradd fails on virtme-ng's /etc overlay ("failure while
# writing changes to /etc/shadow"). petri-test is the one tests/helpers/loopfs.py would create.
add_user() {  # name uid home
  getent passwd "$1" >/dev/null && return 0
  echo "$1:x:$2:$2::$3:/bin/sh" >>/etc/passwd && echo "$1:x:$2:" >>/etc/group
}
add_user petri-test 2901 /nonexistent || exit 93

run_pass() {  # name, then the command prefix that runs Python as the pass's user
  local name=$1; shift
  mapfile -t sel <"$out/$name.tests"
  say "$name pass ($(id -un "${uid:-0}")): cgroups $("$@" "$py" -c \
    'from orchestrator.sandbox import cgroups; s = cgroups.detect(); print(s.mode, "|", s.reason)' 2>&1)"
  local t0=$SECONDS
  # The guest's own deadline: a wedged pass must not keep the VM up (the host kills it too).
  timeout -s KILL "$pass_timeout" "$@" "$py" -m pytest "${pytest_args[@]}" --junitxml="/tmp/$name.xml" "${sel[@]}"
  echo $? >"$out/$name.rc"
  cp "/tmp/$name.xml" "$out/$name.xml" 2>/dev/null
  say "$name pass: exit $(cat "$out/$name.rc") in $((SECONDS - t0)) s"
}

cd "$repo" || exit 93
if [ -s "$out/root.tests" ]; then
  run_pass root env HOME=/root
fi

if [ -s "$out/user.tests" ]; then
  user=petri-vm uid=2902
  add_user $user $uid /tmp/$user && mkdir -m 700 /tmp/$user && chown $uid:$uid /tmp/$user || exit 94
  cg=/sys/fs/cgroup
  svc=$cg/user.slice/user-$uid.slice/user@$uid.service
  mkdir -p "$svc" || exit 95
  for d in "$cg" "$cg/user.slice" "$cg/user.slice/user-$uid.slice"; do
    echo "+memory +pids +cpu" >"$d/cgroup.subtree_control" || exit 95
  done
  chown $uid:$uid "$svc" "$svc/cgroup.procs" "$svc/cgroup.threads" "$svc/cgroup.subtree_control" || exit 95
  mkdir "$svc/init.scope" && chown -R $uid:$uid "$svc/init.scope" || exit 95
  say "user $user ($uid): delegated $svc, controllers: $(cat "$svc/cgroup.controllers")"
  # The pass runs in a subshell moved into the user's leaf first, as a login session is.
  (
    echo "$BASHPID" >"$svc/init.scope/cgroup.procs" || exit 96
    run_pass user setpriv --reuid=$uid --regid=$uid --init-groups env HOME=/tmp/$user USER=$user
  ) || exit 96
fi

if [ -s "$out/root.tests" ]; then
  say "kernel features"
  quick=--no-backends
  [ -e "$out/features.full" ] && quick=
  timeout -s KILL 900 env HOME=/root "$py" -m tests.vm.kernel_features $quick >"$out/features.txt"
fi

# What the passes left behind: every test removes its cgroups, mounts and loop devices.
{
  find /sys/fs/cgroup -mindepth 1 -type d -name 'petri*' 2>/dev/null
  # Not counted: ours, the repository, and /run/petri itself (the views' private mount,
  # made once per boot by design: orchestrator/sandbox/run_view.py); what is below it is.
  findmnt -rn -o TARGET | grep -E 'petri' | grep -v -e "^$v" -e "^$host_out" | grep -v -x -F -e "$repo" -e /run/petri \
    || true
  losetup -n -O NAME,BACK-FILE | grep -v "$v/scratch.img" || true
} >"$out/leftovers"
say "leftovers: $(wc -l <"$out/leftovers") lines; $(grep MemAvailable /proc/meminfo | tr -s ' ')"
echo done >"$out/finished"
kill $watchdog 2>/dev/null
exit 0
