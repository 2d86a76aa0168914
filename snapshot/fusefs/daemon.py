"""One FUSE mount per process (a single sandbox at the mount's root): the daemon's entry point,
and starting/stopping/probing FUSE mounts (also the hosts' of :mod:`.host`).

Entry point (pyfuse3 serves one mount per process)::

    python -m snapshot.fusefs.daemon --lower L1 [--lower L2 ...] [--upper U --workdir W]
        --mountpoint M [--journal DIR] [--disk-budget N] [--log F] [--pidfile P] [--detach]
        [--entry-timeout S] [--attr-timeout S] [--negative-timeout S]
        [--keep-cache lower|all|none] [--writeback] [--no-fsync-copyup] [--max-tasks N]
        [--allow-other]

``--lower`` is given TOP-MOST FIRST. Without ``--upper`` the view is read-only.
``--detach`` double-forks and ``setsid``s so the daemon outlives its starter and is never
its zombie; the starter (``start``) then waits for the mount to appear in
``/proc/self/mountinfo`` and fails fast, quoting the log, if the daemon died first.

Who may use the mount: FUSE lets only the mounting user in unless ``allow_other``. A
normal user's sandbox runs as that same user (bwrap keeps the uid, and FUSE compares the
kernel uid, so the user namespace does not matter): no ``allow_other`` needed, and a normal
user may not ask for it unless ``/etc/fuse.conf`` says ``user_allow_other``. When root
mounts (the runner then drops to the workspace owner), ``allow_other`` is required and root
may always use it: ``start`` adds it for root. ``default_permissions`` is always on, so the
kernel checks modes and owners as on a local filesystem and the daemon never has to.

Stopping: SIGTERM (the daemon unmounts itself); if it does not go, abort its connection
(``/sys/fs/fuse/connections/<dev>/abort`` where fusectl is mounted) and SIGKILL it; if the
mount is still there, ``fusermount3 -u``, then ``-u -z`` (lazy). Killing the daemon closes
``/dev/fuse``, which fails every pending request with ENOTCONN: processes in the sandbox
get errors and never hang.

The backend serves its sandboxes and views several to a process instead (:mod:`.host`, whose
mounts ``stop``, ``health`` and ``daemon_pid`` also handle: a host's slot keeps the same pid
files); this one-mount daemon is for tests and tools that want a filesystem of their own.

Caveats: a fresh process pays the interpreter start and the trio/pyfuse3 imports. A pid file
is trusted if its ``.start`` file matches the process's start time, or else only if
``/proc/<pid>/cmdline`` names this module and the mount point (pid reuse).
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..idmap import IdMap
from ..osutil import Mount, mounts
from .proc import DaemonFailed as DaemonFailed  # part of this module's interface (D.DaemonFailed)
from .proc import _alive, _kill, _wait_gone, child_detach, child_env, start_time
from .journal import Journal
import snapshot

FSNAME = "petri"
MODULE = "snapshot.fusefs.daemon"


# -- mount table ---------------------------------------------------------------------------
def mount_entry(mountpoint: str | os.PathLike | bytes) -> Mount | None:
    """The topmost FUSE mount at ``mountpoint`` (never stats the path: it may be hung)."""
    mp = os.fsencode(os.path.abspath(mountpoint))
    found = None
    for m in mounts():
        if m.mountpoint == mp and m.fstype.startswith("fuse"):
            found = m
    return found


def is_mounted(mountpoint: str | os.PathLike | bytes) -> bool:
    return mount_entry(mountpoint) is not None


# -- processes -----------------------------------------------------------------------------


def _identity_file(pidfile: Path) -> Path:
    return pidfile.with_name(pidfile.name + ".start")


def write_pidfile(pidfile: str | os.PathLike) -> None:
    """``<pidfile>`` holds the pid (what other tools read); ``<pidfile>.start`` holds
    ``<pid> <start time>``, which identifies the process whatever its command line (a host
    forked by the fork server has the server's, which cannot name the mount point)."""
    pid = os.getpid()
    pidfile = Path(pidfile)
    for path, text in ((_identity_file(pidfile), f"{pid} {start_time(pid)}\n"), (pidfile, f"{pid}\n")):
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)


def remove_pidfile(pidfile: str | os.PathLike, pid: int | None = None) -> None:
    """Remove the pid file (and its identity file); with ``pid``, only if it still names it."""
    pidfile = Path(pidfile)
    if pid is not None:
        try:
            if pidfile.read_text().strip() != str(pid):
                return
        except FileNotFoundError:
            pass
    for path in (pidfile, _identity_file(pidfile)):
        try:
            path.unlink()
        except FileNotFoundError:
            pass


def daemon_pid(pidfile: Path, mountpoint: Path) -> int | None:
    """The daemon's pid if the pid file names a live daemon serving ``mountpoint``: its
    identity file matches the process's start time (pid reuse), or, for a daemon started
    as a fresh process, its command line names this module and the mount point."""
    try:
        pid = int(pidfile.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    try:
        ident = _identity_file(pidfile).read_text().split()
        if len(ident) == 2 and int(ident[0]) == pid:
            return pid if str(start_time(pid)) == ident[1] and _alive(pid) else None
    except (FileNotFoundError, ValueError):
        pass
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (FileNotFoundError, ProcessLookupError):
        return None
    if MODULE.encode() not in cmd or os.fsencode(os.path.abspath(mountpoint)) not in cmd:
        return None
    return pid if _alive(pid) else None


@dataclass(frozen=True)
class CacheOptions:
    entry_timeout: float = 10.0
    attr_timeout: float = 10.0
    negative_timeout: float = 10.0
    keep_cache: str = "lower"       # lower | all | none
    writeback: bool = False         # ignored when a disk budget is set
    max_tasks: int = 16
    fsync_copyup: bool = True       # durability of copy-ups (see fusefs.ops)

    def argv(self) -> list[str]:
        out = ["--entry-timeout", str(self.entry_timeout), "--attr-timeout", str(self.attr_timeout),
               "--negative-timeout", str(self.negative_timeout), "--keep-cache", self.keep_cache,
               "--max-tasks", str(self.max_tasks)]
        return out + (["--writeback"] if self.writeback else []) + ([] if self.fsync_copyup else ["--no-fsync-copyup"])


@dataclass(frozen=True)
class MountSpec:
    lowers: tuple[Path, ...]        # top-most first
    mountpoint: Path
    upper: Path | None = None
    workdir: Path | None = None
    journal: Path | None = None
    log: Path | None = None
    pidfile: Path | None = None
    disk_budget: int | None = None
    cache: CacheOptions = field(default_factory=CacheOptions)
    allow_other: bool | None = None  # None: only when root
    idmap: IdMap | None = None  # on-disk root shown as this account and back (root-owned workspace)

    def argv(self) -> list[str]:
        """The fresh-process command line."""
        return [sys.executable, "-P", "-m", MODULE] + self.daemon_args()

    def sandbox_args(self) -> list[str]:
        """What a host (:mod:`.host`) is sent to serve this as one of its sandboxes: the
        filesystem's own arguments (the mount point, log, pid file and mount options are
        the host's)."""
        a: list[str] = []
        for low in self.lowers:
            a += ["--lower", str(low)]
        if self.upper is not None:
            a += ["--upper", str(self.upper), "--workdir", str(self.workdir)]
        if self.journal is not None:
            a += ["--journal", str(self.journal)]
        if self.disk_budget is not None:
            a += ["--disk-budget", str(self.disk_budget)]
        if self.idmap is not None:
            a += ["--idmap", f"{self.idmap.uid}:{self.idmap.gid}"]
        c = self.cache
        a += ["--entry-timeout", str(c.entry_timeout), "--attr-timeout", str(c.attr_timeout),
              "--negative-timeout", str(c.negative_timeout), "--keep-cache", c.keep_cache]
        return a + ([] if c.fsync_copyup else ["--no-fsync-copyup"])

    def host_options(self) -> dict:
        """The mount's options, which every sandbox of a host shares (hosts differ by them)."""
        return {"allow_other": self.allow_other if self.allow_other is not None else os.geteuid() == 0,
                "writeback": bool(self.cache.writeback and self.disk_budget is None),
                "max_tasks": self.cache.max_tasks}

    def daemon_args(self) -> list[str]:
        """The daemon's own arguments (what the fork server is sent)."""
        a = ["--mountpoint", str(os.path.abspath(self.mountpoint))]
        for low in self.lowers:
            a += ["--lower", str(low)]
        if self.upper is not None:
            a += ["--upper", str(self.upper), "--workdir", str(self.workdir)]
        if self.journal is not None:
            a += ["--journal", str(self.journal)]
        if self.log is not None:
            a += ["--log", str(self.log)]
        if self.pidfile is not None:
            a += ["--pidfile", str(self.pidfile)]
        if self.disk_budget is not None:
            a += ["--disk-budget", str(self.disk_budget)]
        allow = self.allow_other if self.allow_other is not None else os.geteuid() == 0
        if allow:
            a.append("--allow-other")
        if self.idmap is not None:
            a += ["--idmap", f"{self.idmap.uid}:{self.idmap.gid}"]
        return a + self.cache.argv()


def _log_tail(log: Path | None, n: int = 2000) -> str:
    if log is None:
        return ""
    try:
        return log.read_bytes()[-n:].decode("utf-8", "replace")
    except FileNotFoundError:
        return ""


def start(spec: MountSpec, timeout: float = 15.0) -> int:
    """Start a detached daemon for ``spec`` (a fresh interpreter) and wait for its mount;
    return its pid."""
    if spec.pidfile is None:
        raise ValueError("a detached daemon needs a pid file")
    remove_pidfile(spec.pidfile)
    if is_mounted(spec.mountpoint):
        raise DaemonFailed(f"{spec.mountpoint} is already mounted")
    env = child_env()
    proc = subprocess.run(spec.argv() + ["--detach"], stdin=subprocess.DEVNULL,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                          timeout=timeout, close_fds=True)
    if proc.returncode != 0:
        raise DaemonFailed(f"daemon did not start: {proc.stderr.decode(errors='replace')}")
    deadline = time.monotonic() + timeout
    pid = None
    delay = 0.002
    while time.monotonic() < deadline:
        if pid is None:
            try:
                pid = int(spec.pidfile.read_text().strip())
            except (FileNotFoundError, ValueError):
                pass
        if is_mounted(spec.mountpoint) and pid is not None:
            return pid
        if pid is not None and not _alive(pid):
            raise DaemonFailed(f"daemon died before mounting {spec.mountpoint}:\n{_log_tail(spec.log)}")
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
    if pid is not None:
        _kill(pid)
    raise DaemonFailed(f"timed out waiting for {spec.mountpoint} to mount:\n{_log_tail(spec.log)}")


def abort_connection(mountpoint: str | os.PathLike) -> bool:
    """Abort the kernel side of a FUSE mount (fails all its requests); False if fusectl is
    not mounted or the mount is gone."""
    m = mount_entry(mountpoint)
    if m is None:
        return False
    path = Path("/sys/fs/fuse/connections") / str(m.connection) / "abort"
    try:
        path.write_text("1")
        return True
    except OSError:
        return False


def unmount(mountpoint: str | os.PathLike) -> None:
    """fusermount3 -u, then a lazy unmount; never stats the mount point."""
    mp = str(os.path.abspath(mountpoint))
    for args in (["-u", "-q"], ["-u", "-z", "-q"]):
        if not is_mounted(mp):
            return
        subprocess.run(["fusermount3", *args, mp], stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=10)
    if is_mounted(mp) and os.geteuid() == 0:
        subprocess.run(["umount", "-l", mp], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=10)


def stop(mountpoint: Path, pidfile: Path | None, timeout: float = 5.0) -> None:
    """Stop the daemon serving ``mountpoint`` and make sure nothing stays mounted."""
    pid = daemon_pid(pidfile, mountpoint) if pidfile is not None else None
    if pid is not None:
        _kill(pid, signal.SIGTERM)
        if not _wait_gone(pid, timeout):
            abort_connection(mountpoint)
            _kill(pid, signal.SIGKILL)
            _wait_gone(pid, timeout)
    if is_mounted(mountpoint):
        abort_connection(mountpoint)
        unmount(mountpoint)
    if pidfile is not None:
        remove_pidfile(pidfile)


def probe(mountpoint: Path, timeout: float = 2.0) -> bool:
    """True if the mount answers a stat within ``timeout`` (in a child process: a hung
    FUSE request must not take this process with it; FUSE waits are killable)."""
    try:
        r = subprocess.run(["stat", "-c", "%i", str(mountpoint)], stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False
    return r.returncode == 0


def health(mountpoint: Path, pidfile: Path | None, timeout: float = 2.0) -> str:
    """``ok`` | ``dead`` (mounted, daemon gone) | ``hung`` (daemon alive, mount does not
    answer) | ``unmounted`` (no mount; daemon may be alive)."""
    mounted = is_mounted(mountpoint)
    pid = daemon_pid(pidfile, mountpoint) if pidfile is not None else None
    if not mounted:
        return "unmounted"
    if pid is None:
        return "dead"
    return "ok" if probe(mountpoint, timeout) else "hung"


# -- the daemon itself -----------------------------------------------------------------------
def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=MODULE)
    p.add_argument("--lower", action="append", default=[], help="lower layer, top-most first")
    p.add_argument("--upper")
    p.add_argument("--workdir")
    p.add_argument("--mountpoint", required=True)
    p.add_argument("--journal")
    p.add_argument("--disk-budget", type=int)
    p.add_argument("--log")
    p.add_argument("--pidfile")
    p.add_argument("--detach", action="store_true")
    p.add_argument("--entry-timeout", type=float, default=10.0)
    p.add_argument("--attr-timeout", type=float, default=10.0)
    p.add_argument("--negative-timeout", type=float, default=10.0)
    p.add_argument("--keep-cache", choices=("lower", "all", "none"), default="lower")
    p.add_argument("--writeback", action="store_true")
    p.add_argument("--no-fsync-copyup", dest="fsync_copyup", action="store_false")
    p.add_argument("--max-tasks", type=int, default=16)
    p.add_argument("--allow-other", action="store_true")
    p.add_argument("--idmap", help="UID:GID: show on-disk root as this account (and back)")
    p.add_argument("--debug", action="store_true")
    return p.parse_args(argv)


def _detach(log: str | None) -> None:
    if child_detach(log):
        os._exit(0)


def _parse_idmap(text: str | None) -> IdMap | None:
    if not text:
        return None
    uid, _, gid = text.partition(":")
    return IdMap(int(uid), int(gid or uid))


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    if args.detach:
        _detach(args.log)
    elif args.log:
        fd = os.open(args.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(fd, 2)
    return run(args)


def run(args: argparse.Namespace, ready: Callable[[str | None], None] | None = None) -> int:
    """Mount and serve until unmounted or signalled. ``ready(None)`` is called once the mount
    is up, ``ready(message)`` if the daemon fails before that (the fork server's reply)."""
    logging.basicConfig(stream=sys.stderr, level=logging.DEBUG if args.debug else logging.INFO,
                        format=f"%(asctime)s {os.getpid()} %(levelname)s %(message)s", force=True)
    log = logging.getLogger("petri.fusefs")
    try:
        if args.pidfile:
            write_pidfile(args.pidfile)
        os.umask(0)  # modes come from the requests, already masked by the caller's umask

        import pyfuse3
        import trio


        fs = snapshot.fusefs.ops.CowFS(args.lower, args.upper, args.workdir, journal=Journal(args.journal),
                                       disk_budget=args.disk_budget, entry_timeout=args.entry_timeout,
                                       attr_timeout=args.attr_timeout, negative_timeout=args.negative_timeout,
                   keep_cache=args.keep_cache, writeback=args.writeback, fsync_copyup=args.fsync_copyup,
                                       idmap=_parse_idmap(args.idmap))
        options = set(pyfuse3.default_options)  # default_permissions
        # nosuid,nodev always (fusermount3 adds them for a normal user anyway): a sandbox can
        # plant a setuid file or a device node in its tree.
        options |= {f"fsname={FSNAME}", f"subtype={FSNAME}", "nosuid", "nodev"}
        if args.allow_other:
            options.add("allow_other")
        if not args.upper:
            options.add("ro")
        pyfuse3.init(fs, args.mountpoint, options)
    except BaseException as e:
        log.exception("daemon failed before mounting")
        if args.pidfile:
            remove_pidfile(args.pidfile, os.getpid())
        if ready is not None:
            ready(f"{type(e).__name__}: {e}")
        return 1
    log.info("mounted %s (lowers %s, upper %s)", args.mountpoint, args.lower, args.upper)
    if ready is not None:
        ready(None)

    async def serve() -> None:
        async with trio.open_nursery() as nursery:
            async def on_signal() -> None:
                with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as sigs:
                    async for _ in sigs:
                        log.info("signal: unmounting")
                        pyfuse3.terminate()
                        return
            nursery.start_soon(on_signal)
            await pyfuse3.main(min_tasks=1, max_tasks=args.max_tasks)
            nursery.cancel_scope.cancel()

    ok = False
    try:
        trio.run(serve)
        ok = True
    except BaseException:
        log.exception("daemon failed")
    finally:
        try:
            pyfuse3.close(unmount=True)
        except Exception:
            log.exception("unmount failed")
        fs.close()
        if args.pidfile:
            remove_pidfile(args.pidfile, os.getpid())
        log.info("stopped")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
