"""A sandbox's environment: what lasts between its runs (a network namespace, ``/tmp``,
``/var/tmp``, ``/run``) and the ports published from it. Knows no registry: the caller says
which sandboxes live (``sweep``) and when one ends (``destroy``).

Made at a sandbox's first run (``ensure``), by any petri process:

- a *holder* process (``HOLDER_SH``: ``unshare --net`` a shell, in a session of its own)
  that owns the sandbox's network namespace, loopback up, nothing else in it; when petri
  is not root it also owns the user namespace the network namespace belongs to. It naps
  until the sandbox's lifetime ends, so a sandbox nobody reaps still loses its network then
  (within a nap), and ends by itself when its store was deleted;
- the private directories, bound by every run over ``/tmp``, ``/var/tmp`` and ``/run``
  (``isolation``'s ``shared``): as root one tmpfs, size-capped and ``nosuid,nodev``, at
  ``/run/petri/env/<store key>.<sandbox>`` (``env`` is root's and 0711: no listing; the
  tmpfs is 0700 and belongs to the run's host account, handed over when that changes;
  ``/run/petri`` is a private mount, so mounting there never reaches a running sandbox,
  and a run never sees ``/run/petri``: its ``/run`` is its own); rootless, plain
  directories in the store (``<store>/env/<sandbox>.d``), not size-capped.

Its state is ``<store>/env/<sandbox>.json`` (the holder's pid and start time, where the
directories are, the published ports), written under ``<sandbox>.lock`` (flock): two petri
processes starting the first runs of one sandbox at once make one environment.

A run joins it before bwrap: as root, the thread of petri that forks the run's wrapper joins
the namespace for the fork (``thread_in_netns``: setns moves only the calling thread, and the
child is born there; no exec); rootless, ``cgexec``'s wrapper runs ``nsenter --user=...
--net=/proc/<holder>/ns/... --preserve-credentials`` (a thread cannot join a user
namespace). bwrap then keeps that network namespace (``--share-net``) and unshares
everything else: each run keeps its own pid namespace and cgroup. A sandbox with
``--net`` uses the host's network and joins no namespace; it shares the directories.

Ports (``publish``): petri binds the host's 127.0.0.1:N itself and hands the listening socket
to a relay (``relay.py relay``) started inside the namespace, which connects to the
sandbox's 127.0.0.1:PORT for each client. Why a relay and not pasta: pasta connects the
namespace to the host's network (a tap with outbound routing), which a sandbox without
``--net`` must not have; the relay reaches nothing but the one port, and needs nothing
installed.

Egress (``--net allow:...``): the sandbox's proxy (``egress.py serve``) is made with the
environment (and again at the next run if it died): a detached process on the host's network
whose listening socket petri made inside the namespace (as root a thread joins it for the
``socket()`` call; rootless a helper under ``nsenter`` makes the socket and sends it back),
so the namespace keeps no route out and the proxy is its only way to a listed destination.
Its pid, start time and port are in the state; every run gets ``HTTP_PROXY`` & co for it
(``prepare``).

``destroy`` (``rm``, expiry, ``deinit``) kills the relays, the proxy and the holder and removes the
directories; ``sweep`` does it for every environment whose sandbox is gone (``gc``, also
after petri was killed).

Caveats:
- A process is recognised by pid and start time; between that check and the join (the
  open of ``/proc/<holder>/ns/net``, or ``nsenter``'s) a holder that died (only ``kill``
  does that before its lifetime) and whose pid was reused at once would be joined instead.
- The holder is a child of the petri process that made it until that process ends; a
  long-lived one (the API, MCP) reaps it after it is killed (``subprocess`` reaps abandoned
  children at its next start of a process).
- A ``--system`` sandbox's layer (``system_layer``) is mounted with the environment, below
  its ``/tmp`` tmpfs, and unmounted with it; its upper directories outlive the environment
  (they are the sandbox's) until ``destroy`` or ``sweep``.
- Rootless, ``/tmp`` & co are directories in the store: they count against the store's
  filesystem, not a size cap.
- Rootless, the holder needs util-linux's ``unshare --keep-caps`` (2.36 and later): without
  it, bringing ``lo`` up in the namespace fails (capabilities are dropped at exec) and so does
  the sandbox's first run, saying so.
- The holder naps in 30 s steps: it notices the end of its lifetime or a deleted store up
  to 30 s late (a sandbox's runs end on time by their own deadline).
- Killed processes stay zombies on a machine whose pid 1 does not reap orphans; a zombie
  holds no namespace, port or mount (``_alive`` counts it dead).
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Sequence

if TYPE_CHECKING:
    import socket

from orchestrator.errors import SandboxSetupFailed
from snapshot.osutil import libc
from . import run_view
from orchestrator.errors import PortUnavailable
import orchestrator

HOLDER = Path(__file__).with_name("relay.py")  # relays, and lo up without iproute2
NSENTER = "nsenter"
READY_S = 30.0  # a loaded machine can take seconds to start a shell
# Private directories, by their path inside, and the name of their host directory.
SHARED_DIRS: tuple[tuple[bytes, str], ...] = ((b"/tmp", "tmp"), (b"/var/tmp", "var-tmp"), (b"/run", "run"),
                                               (b"/var/run", "var-run"))
MS_NOSUID, MS_NODEV = 2, 4


@dataclass(frozen=True)
class Env:
    """A sandbox's environment, ready to join."""

    sb_id: str
    holder_pid: int
    own_userns: bool
    dirs: tuple[tuple[bytes, bytes], ...]  # (host directory, path inside)
    proxy_port: int | None = None  # the egress proxy's port on the sandbox's 127.0.0.1 (allow-list)
    # ``--system``: (merged overlay, host path) pairs bound read-write (``system_layer``), and
    # the layer's home for root's (uid 0 commands)
    system: tuple[tuple[bytes, bytes], ...] = ()
    system_home: bytes | None = None

    @property
    def netns(self) -> bytes:
        return b"/proc/%d/ns/net" % self.holder_pid

    def join_argv(self) -> list[bytes]:
        """The ``nsenter`` prefix that puts what follows in the sandbox's network namespace
        (rootless: its user namespace too, which a thread of petri cannot join: see
        ``thread_in_netns``)."""

        ns = b"/proc/%d/ns/" % self.holder_pid
        nsenter = os.fsencode(orchestrator.sandbox.cgexec.tool(NSENTER))
        if self.own_userns:
            return [nsenter, b"--user=" + ns + b"user", b"--net=" + ns + b"net", b"--preserve-credentials",
                    b"--"]
        return [nsenter, b"--net=" + ns + b"net", b"--"]


CLONE_NEWNET = 0x40000000


@contextlib.contextmanager
def thread_in_netns(netns: bytes | None):
    """This thread in the network namespace at ``netns`` for the ``with`` (nothing when None):
    a child forked meanwhile is born in it. setns(2) moves only the calling thread for a
    network namespace, so the rest of petri stays where it is; that is what spares a run the
    ``nsenter`` exec where petri may join the namespace itself (root, the holder's network
    namespace belonging to the host's user namespace)."""
    if netns is None:
        yield
        return

    target = os.open(netns, os.O_RDONLY | os.O_CLOEXEC)
    try:
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    except BaseException:
        os.close(target)
        raise
    try:
        if libc.setns(target, CLONE_NEWNET) != 0:
            import ctypes

            raise SandboxSetupFailed(detail=f"cannot join the sandbox's network: {os.strerror(ctypes.get_errno())}")
        try:
            yield
        finally:
            if libc.setns(home, CLONE_NEWNET) != 0:  # pragma: no cover - our own namespace, as root
                import ctypes

                raise SystemExit(f"petri: cannot return to its own network namespace: "
                                 f"{os.strerror(ctypes.get_errno())}")
    finally:
        os.close(target)
        os.close(home)


def env_dir(store_root: Path) -> Path:
    return store_root / "env"


def _state_path(store_root: Path, sb_id: str) -> Path:
    return env_dir(store_root) / f"{sb_id}.json"


def _start_time(pid: int) -> int | None:
    """The process's start time (clock ticks since boot), None when it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2:].split()
    if fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


def _alive(pid: int | None, start: int | None) -> bool:
    return bool(pid) and start is not None and _start_time(pid) == start  # type: ignore[arg-type]


@contextlib.contextmanager
def _locked(store_root: Path, sb_id: str):
    d = env_dir(store_root)
    d.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(d / f"{sb_id}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _read(store_root: Path, sb_id: str) -> dict | None:
    try:
        return json.loads(_state_path(store_root, sb_id).read_text())
    except (OSError, ValueError):
        return None


def _write(store_root: Path, sb_id: str, state: dict) -> None:
    path = _state_path(store_root, sb_id)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, path)


def _env_of(sb_id: str, state: dict) -> Env:
    proxy = state.get("proxy") or {}
    return Env(sb_id, state["holder_pid"], state["own_userns"],
               tuple((os.fsencode(src), os.fsencode(dest)) for src, dest in state["dirs"]),
               proxy["port"] if _alive(proxy.get("pid"), proxy.get("start")) else None,
               tuple((os.fsencode(src), os.fsencode(dest)) for src, dest in state.get("system", [])),
               os.fsencode(state["system_home"]) if state.get("system_home") else None)


def current(store_root: Path, sb_id: str) -> Env | None:
    """The sandbox's environment if it exists and its holder lives (no lock, no change)."""
    state = _read(store_root, sb_id)
    if state is None or not _alive(state.get("holder_pid"), state.get("holder_start")):
        return None
    return _env_of(sb_id, state)


def ensure(store_root: Path, sb_id: str, *, host_uid: int, host_gid: int, tmp_bytes: int,
           until: float | None, private: Iterable[bytes], allow: tuple[str, ...] = (),
           proxy: Sequence[str] | None = None, system: bool = False) -> Env:
    """The sandbox's environment, made now if it does not exist (or its holder died).
    ``private``: the host directories a run hides behind a private one (``/run``, ``/var/tmp``,
    ``/var/run`` where it is a directory of its own; ``/tmp`` always). ``allow``: the egress
    allow-list (``egress.parse_allow``'s entries): its proxy is made with the environment, and
    again if it died. ``proxy``: the command that serves it (the caller's: the layer above
    gives its refusals to the event feed); ``egress.py serve`` itself by default, which tells
    no one. ``system``: mount the sandbox's system layer (``system_layer``; root only)."""
    with _locked(store_root, sb_id):
        state = _read(store_root, sb_id)
        if state is not None and _alive(state.get("holder_pid"), state.get("holder_start")) \
                and all(os.path.isdir(src) for src, _ in state["dirs"]):
            if state.get("owner") != [host_uid, host_gid] and os.geteuid() == 0:
                _reown(state, host_uid, host_gid)
                _write(store_root, sb_id, state)
            running = state.get("proxy") or {}
            if allow and not _alive(running.get("pid"), running.get("start")):
                state["proxy"] = _start_proxy(_env_of(sb_id, state), allow, proxy)
                _write(store_root, sb_id, state)
            return _env_of(sb_id, state)
        if state is not None:
            _teardown(store_root, sb_id, state)
        wanted = {b"/tmp", *private}
        state = {"holder_pid": None, "holder_start": None, "own_userns": os.geteuid() != 0, "dirs": [],
                 "root": None, "mounted": False, "ports": []}
        try:
            _make_dirs(store_root, sb_id, state, host_uid, host_gid, tmp_bytes, wanted)
            _write(store_root, sb_id, state)  # what to undo, before the holder exists
            if system:
                _mount_system(store_root, sb_id, state, host_uid, host_gid)
                _write(store_root, sb_id, state)
            pid = _spawn_holder(until, state["own_userns"], _state_path(store_root, sb_id),
                                state["root"] if state["mounted"] else "")
            state["holder_pid"], state["holder_start"] = pid, _start_time(pid)
            _write(store_root, sb_id, state)
            if allow:
                state["proxy"] = _start_proxy(_env_of(sb_id, state), allow, proxy)
                _write(store_root, sb_id, state)
        except BaseException:
            _teardown(store_root, sb_id, state)
            raise
        return _env_of(sb_id, state)


def _make_dirs(store_root: Path, sb_id: str, state: dict, uid: int, gid: int, tmp_bytes: int,
               wanted: set[bytes]) -> None:
    if os.geteuid() == 0:


        run_view._owned_dir(run_view.VIEWS, 0, 0, 0o711)
        run_view.fence_views()  # private first: this mount must not propagate into running sandboxes
        envs = run_view._owned_dir(run_view.VIEWS / "env", 0, 0, 0o711)
        root = envs / f"{run_view.store_key(store_root)}.{sb_id}"
        root.mkdir(mode=0o700, exist_ok=True)
        state["root"] = str(root)
        opts = b"size=%d,mode=0700,uid=%d,gid=%d" % (tmp_bytes, uid, gid)
        if libc.mount(b"tmpfs", os.fsencode(root), b"tmpfs", MS_NOSUID | MS_NODEV, opts) != 0:
            import ctypes

            raise SandboxSetupFailed(detail=f"cannot mount the sandbox's /tmp at {root}: "
                                            f"{os.strerror(ctypes.get_errno())}")
        state["mounted"] = True
    else:
        root = env_dir(store_root) / f"{sb_id}.d"
        root.mkdir(mode=0o700, exist_ok=True)
        state["root"] = str(root)
    for dest, name in SHARED_DIRS:
        if dest not in wanted:
            continue
        d = root / name
        d.mkdir(exist_ok=True)
        os.chmod(d, 0o755 if name in ("run", "var-run") else 0o1777)
        if os.geteuid() == 0 and name in ("run", "var-run"):
            os.chown(d, uid, gid)  # /tmp and /var/tmp: root's and sticky, as on a host
        state["dirs"].append([str(d), os.fsdecode(dest)])
    state["owner"] = [uid, gid]


def _mount_system(store_root: Path, sb_id: str, state: dict, uid: int, gid: int) -> None:

    if not state.get("mounted"):
        raise SandboxSetupFailed(
            detail=orchestrator.sandbox.system_layer.unavailable(store_root) or "the system layer needs root")
    state["system"], state["system_home"] = orchestrator.sandbox.system_layer.mount(store_root, sb_id,
                                                                                    Path(state["root"]), uid, gid)


def _reown(state: dict, uid: int, gid: int) -> None:
    """The sandbox's runs now run as another host account (a ``sudo`` caller, then not):
    hand it everything in the directories, what the previous account wrote and the mount
    points bwrap made there for it (a workspace below ``/var/tmp``), or it could not even
    start. ``/tmp`` and ``/var/tmp`` themselves stay root's and sticky."""
    if os.geteuid() != 0 or state.get("owner") == [uid, gid] or not state.get("root"):
        return
    old = state.get("owner")
    os.chown(state["root"], uid, gid)
    for src, dest in state["dirs"]:
        if dest in ("/run", "/var/run"):
            os.chown(src, uid, gid)
        for top, dirs, files in os.walk(src):
            for name in dirs + files:
                path = os.path.join(top, name)
                with contextlib.suppress(OSError):
                    if old is None or os.lstat(path).st_uid == old[0]:
                        os.chown(path, uid, gid, follow_symlinks=False)
    state["owner"] = [uid, gid]


# The holder: a shell in the new namespace. It says "ok PID" (or why not) on its stdout, the
# ready pipe (dash redirects only fds 0-9, so the pipe is handed over as stdout), once ``lo`` is
# up: brought up by itself rootless ($6 "ip": iproute2, or relay.py lo-up where it is missing),
# by petri as root ($6 "petri": a thread of petri joins the namespace for one ioctl, which
# spares two execs). It ends when the lifetime is over ($1 seconds, counted in its naps; 0:
# never) or when the sandbox's record ($2) is gone without petri having ended it (the store
# deleted by hand), detaching the /tmp tmpfs ($3) that nothing else would. A shell and
# util-linux, not Python: the first run of a sandbox waits for it.
HOLDER_SH = r"""
left=$1 state=$2 mount=$3 py=$4 holder=$5 lo=$6
exec 2>&1
if [ "$lo" = ip ]; then
  if command -v ip >/dev/null 2>&1; then ip link set lo up || exit 1
  else "$py" -I -S "$holder" lo-up || exit 1
  fi
fi
echo "ok $$"
exec >/dev/null 2>&1
while :; do
  sleep $NAP_S
  if [ ! -e "$state" ]; then
    [ -z "$mount" ] || { umount -l "$mount" && rm -rf "$mount"; }
    exit 0
  fi
  if [ "$left" != 0 ]; then left=$((left - NAP_S)); [ "$left" -gt 0 ] || exit 0; fi
done
"""
NAP_S = 30
HOLDER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _spawn_holder(until: float | None, own_userns: bool, state: Path, mount: str) -> int:
    """Start the holder in a session of its own (its nap is in its process group: ``_kill``)
    and return its pid once the namespace is up. It is a child of this process only until
    this process ends; a long-lived one (the API, MCP) reaps it after it is killed
    (``subprocess``'s own reaping of abandoned children)."""

    r, w = os.pipe2(os.O_CLOEXEC)
    left = 0 if until is None else max(1, int(until - time.time() + 0.999))
    argv = [orchestrator.sandbox.cgexec.tool("unshare"), "--net", *(["--map-current-user",
                                                                     "--keep-caps"] if own_userns else []), "--",
            "/bin/sh", "-c", HOLDER_SH, "petri-holder", str(left), str(state), mount, sys.executable, str(HOLDER),
            "ip" if own_userns else "petri"]
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=w, stderr=w, close_fds=True,
                                start_new_session=True, env={"PATH": HOLDER_PATH, "NAP_S": str(NAP_S)})
    except OSError as e:
        os.close(r)
        raise SandboxSetupFailed(detail=f"cannot start the sandbox's environment: {e.strerror}") from None
    finally:
        os.close(w)
    try:
        got = _read_line(r)
    finally:
        os.close(r)
    words = got.decode(errors="replace").split()
    if words[:1] != ["ok"] or len(words) != 2 or int(words[1]) != proc.pid:
        with contextlib.suppress(OSError):
            proc.kill()
        proc.wait()
        why = got.decode(errors="replace").strip() or "it said nothing"
        raise SandboxSetupFailed(detail=f"the sandbox's environment did not start: {why}")
    if not own_userns:

        try:
            with thread_in_netns(b"/proc/%d/ns/net" % proc.pid):
                orchestrator.sandbox.relay.loopback_up()
        except BaseException:
            _kill(proc.pid, _start_time(proc.pid))
            proc.wait()
            raise
    return proc.pid


def _read_line(r: int) -> bytes:
    """What comes on ``r`` up to its first newline (or its end), within ``READY_S``."""
    import select

    got = b""
    end = time.monotonic() + READY_S
    while b"\n" not in got and time.monotonic() < end:
        if not select.select([r], [], [], max(0.0, end - time.monotonic()))[0]:
            break
        chunk = os.read(r, 256)
        if not chunk:
            break
        got += chunk
    return got


def _spawn_detached(argv: list, r: int, w: int, pass_fds: tuple[int, ...]) -> int:
    """Start ``argv`` (a relay), which detaches itself (a double fork: it is no child of
    ours, so no petri process has to reap it) and says ``ok PID`` on ``w``, or why not."""
    try:
        # cwd /: a process that lives as long as the sandbox must not hold petri's working
        # directory (a workspace on a filesystem someone unmounts, a sandbox's tree) busy.
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                pass_fds=(w, *pass_fds), close_fds=True, start_new_session=True, cwd="/",
                                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    except OSError as e:
        os.close(r)
        os.close(w)
        raise SandboxSetupFailed(detail=f"cannot start the sandbox's environment: {e.strerror}") from None
    os.close(w)
    try:
        got = b""
        end = time.monotonic() + READY_S
        import select

        while time.monotonic() < end:
            ready, _, _ = select.select([r], [], [], max(0.0, end - time.monotonic()))
            if not ready:
                break
            chunk = os.read(r, 256)
            if not chunk:
                break
            got += chunk
        _, err = proc.communicate(timeout=READY_S)  # the detached process holds no end of it
        err = err or b""
    finally:
        os.close(r)
    words = got.decode(errors="replace").split()
    if words[:1] != ["ok"] or len(words) < 2:
        why = got.decode(errors="replace") or err.decode(errors="replace").strip() or "it said nothing"
        raise SandboxSetupFailed(detail=f"the sandbox's environment did not start: {why}")
    return int(words[1])


def _kill(pid: int | None, start: int | None) -> int:
    """SIGKILL the process (and, where it leads one, its process group: the holder's nap
    is a child of its own); wait until it is gone."""
    if not _alive(pid, start):
        return 0
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if os.getpgid(pid) == pid:  # type: ignore[arg-type]
            os.killpg(pid, signal.SIGKILL)  # type: ignore[arg-type]
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)  # type: ignore[arg-type]
    end = time.monotonic() + 2.0
    while _alive(pid, start) and time.monotonic() < end:
        time.sleep(0.002)
    return 1


def _teardown(store_root: Path, sb_id: str, state: dict) -> tuple[int, int]:
    """Relays, holder, directories, state: (processes killed, mounts removed)."""
    killed = sum(_kill(p.get("pid"), p.get("start")) for p in state.get("ports", []))
    proxy = state.get("proxy") or {}
    killed += _kill(proxy.get("pid"), proxy.get("start"))
    killed += _kill(state.get("holder_pid"), state.get("holder_start"))
    mounts = 0
    root = state.get("root")
    if state.get("system"):

        mounts += orchestrator.sandbox.system_layer.unmount(state["system"], state.get("system_home"))
    if root:
        if state.get("mounted"):

            if libc.umount2(os.fsencode(root), 2) == 0:  # MNT_DETACH: a straggler's open file must not keep it
                mounts = 1
        shutil.rmtree(root, ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        _state_path(store_root, sb_id).unlink()
    return killed, mounts


def destroy(store_root: Path, sb_id: str) -> tuple[int, int]:
    """End the sandbox's environment (its runs are gone already) and delete its system
    layer: (processes, mounts)."""

    if not _state_path(store_root, sb_id).exists():
        orchestrator.sandbox.system_layer.remove(store_root, sb_id)
        return 0, 0
    with _locked(store_root, sb_id):
        state = _read(store_root, sb_id)
        out = _teardown(store_root, sb_id, state) if state is not None else (0, 0)
        orchestrator.sandbox.system_layer.remove(store_root, sb_id)
    with contextlib.suppress(FileNotFoundError):
        (env_dir(store_root) / f"{sb_id}.lock").unlink()
    return out


def sweep(store_root: Path, keep: Iterable[str]) -> tuple[int, int]:
    """``destroy`` every environment whose sandbox is not in ``keep``: (processes, mounts)."""
    keep = set(keep)
    killed = mounts = 0
    try:
        names = os.listdir(env_dir(store_root))
    except FileNotFoundError:
        return 0, 0
    for name in names:
        if name.endswith(".json") and name[:-5] not in keep:
            k, m = destroy(store_root, name[:-5])
            killed, mounts = killed + k, mounts + m

    orchestrator.sandbox.system_layer.sweep(store_root, keep)  # layers of sandboxes that are gone, unmounted above
    return killed, mounts


# ------------------------------------------------------------------------------ egress

EGRESS = Path(__file__).with_name("egress.py")


def _listener_inside(env: Env) -> "socket.socket":
    """A TCP socket listening on the sandbox's 127.0.0.1 (any free port), made in its network
    namespace, for a process that stays on the host's: as root a thread of petri joins the
    namespace for the socket() call; rootless (its user namespace is not ours to join from a
    thread) a helper under ``nsenter`` makes it and sends it back (SCM_RIGHTS)."""
    import socket

    if not env.own_userns:
        with thread_in_netns(env.netns):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind(("127.0.0.1", 0))
            s.listen(128)
        except BaseException:
            s.close()
            raise
        return s
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with theirs:
            argv = [*env.join_argv(), sys.executable, "-I", "-S", str(EGRESS), "listen", "--send-fd",
                    str(theirs.fileno())]
            try:
                done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, pass_fds=(theirs.fileno(),), timeout=READY_S,
                                      env={"PATH": HOLDER_PATH})
            except (OSError, subprocess.TimeoutExpired) as e:
                raise SandboxSetupFailed(detail=f"cannot make the sandbox's egress proxy: {e}") from None
        ours.settimeout(1.0)
        try:
            _, fds, _, _ = socket.recv_fds(ours, 16, 1)
        except OSError:
            fds = []
        if not fds:
            why = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["it said nothing"]
            raise SandboxSetupFailed(detail=f"cannot make the sandbox's egress proxy: {why[0]}")
        return socket.socket(fileno=fds[0])
    finally:
        ours.close()


def _start_proxy(env: Env, allow: tuple[str, ...], proxy: Sequence[str] | None) -> dict:
    """Start the sandbox's egress proxy (``proxy`` + ``serve ...``, by default ``egress.py
    serve``: detached, on the host's network, listening inside the sandbox's); its state entry."""
    lsock = _listener_inside(env)
    try:
        r, w = os.pipe2(os.O_CLOEXEC)
        fd = lsock.fileno()
        argv = [*(proxy or (sys.executable, "-I", "-S", str(EGRESS))), "serve", "--listen-fd", str(fd),
                "--holder-pid", str(env.holder_pid), "--ready-fd", str(w), "--allow", ",".join(allow)]
        pid = _spawn_detached(argv, r, w, (fd,))
        port = lsock.getsockname()[1]
    finally:
        lsock.close()  # the proxy has its copy
    return {"pid": pid, "start": _start_time(pid), "port": port, "allow": list(allow)}


def proxy(store_root: Path, sb_id: str) -> dict | None:
    """The sandbox's egress proxy if it lives: ``{"pid", "port", "allow"}``."""
    p = (_read(store_root, sb_id) or {}).get("proxy") or {}
    if not _alive(p.get("pid"), p.get("start")):
        return None
    return {"pid": p["pid"], "port": p["port"], "allow": p.get("allow", [])}


# ------------------------------------------------------------------------------ ports

def _bind_host(host_port: int | None, port: int) -> "socket.socket":
    """A listening socket on the host's 127.0.0.1: ``host_port``, else ``port`` when free,
    else any free port."""
    import socket

    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        try:
            s.bind(("127.0.0.1", port if host_port is None else host_port))
        except OSError as e:
            if host_port is not None:

                raise PortUnavailable(port=host_port, why=e.strerror or str(e)) from None
            s.bind(("127.0.0.1", 0))
        s.listen(128)
    except BaseException:
        s.close()
        raise
    return s


def publish(store_root: Path, sb_id: str, port: int, host_port: int | None = None) -> int:
    """Forward the host's 127.0.0.1:``host_port`` to the sandbox's 127.0.0.1:``port`` until the
    sandbox ends (its environment must exist: ``ensure``); the host port used. Publishing a
    port again returns the relay that serves it."""
    with _locked(store_root, sb_id):
        state = _read(store_root, sb_id)
        if state is None or not _alive(state.get("holder_pid"), state.get("holder_start")):
            raise SandboxSetupFailed(detail=f"{sb_id} has no environment to publish a port from")
        ports = [p for p in state["ports"] if _alive(p.get("pid"), p.get("start"))]
        for p in ports:
            if p["port"] == port and (host_port is None or p["host_port"] == host_port):
                return p["host_port"]
        env = _env_of(sb_id, state)
        lsock = _bind_host(host_port, port)
        try:
            r, w = os.pipe2(os.O_CLOEXEC)
            fd = lsock.fileno()
            argv = [*env.join_argv(), os.fsencode(sys.executable), b"-I", b"-S", os.fsencode(HOLDER), b"relay",
                    b"--listen-fd", b"%d" % fd, b"--port", b"%d" % port, b"--holder-pid", b"%d" % env.holder_pid,
                    b"--ready-fd", b"%d" % w]
            pid = _spawn_detached(argv, r, w, (fd,))
            used = lsock.getsockname()[1]
        finally:
            lsock.close()  # the relay has its copy
        ports.append({"port": port, "host_port": used, "pid": pid, "start": _start_time(pid)})
        state["ports"] = ports
        _write(store_root, sb_id, state)
        return used


def ports(store_root: Path, sb_id: str) -> list[dict]:
    """The sandbox's published ports whose relay lives: ``{"port", "host_port"}``."""
    state = _read(store_root, sb_id) or {}
    return [{"port": p["port"], "host_port": p["host_port"]} for p in state.get("ports", [])
            if _alive(p.get("pid"), p.get("start"))]
