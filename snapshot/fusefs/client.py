"""The client side of a store's FUSE fork server (:mod:`.server`): reach it over its socket,
start it on demand, ask it to mount, find and stop it.

Kept apart from the server so that :func:`snapshot.fusefs.daemon.start` can ask for a forked
daemon without importing the server, which imports the daemon to run it in its children.
The files and the protocol are described in :mod:`.server`.

Caveats: the socket is reached through ``/proc/self/fd/<dir fd>/fuse.sock`` (socket paths
are limited to 108 bytes), so /proc must be mounted.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Iterator

from .proc import DaemonFailed, _alive, _kill, _wait_gone, child_env, start_time

SERVER_MODULE = "snapshot.fusefs.server"
SOCK = "fuse.sock"
LOCK = "fuse.lock"
PIDFILE = "fuse.pid"
MAX_REQUEST = 1 << 20


class ServerUnavailable(RuntimeError):
    """The fork server could not be started or did not answer; fall back to a fresh daemon."""


def code_stamp() -> list:
    """What the daemon code on disk is (mtimes and sizes of this package's modules): a
    server started before an upgrade must not fork daemons running the old code."""
    here = Path(__file__).resolve().parent
    out = []
    for p in sorted(here.glob("*.py")) + [here.parent / "tree.py"]:
        try:
            st = p.stat()
            out.append([p.name, st.st_mtime_ns, st.st_size])
        except FileNotFoundError:
            out.append([p.name, 0, 0])
    return out


@contextlib.contextmanager
def _dirfd(store: Path) -> Iterator[int]:
    fd = os.open(store, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield fd
    finally:
        os.close(fd)


def _connect(dfd: int, timeout: float) -> socket.socket | None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    s.settimeout(timeout)
    try:
        s.connect(f"/proc/self/fd/{dfd}/{SOCK}")
        return s
    except (FileNotFoundError, ConnectionRefusedError):
        s.close()
        return None
    except OSError:
        s.close()
        raise


def _exchange(s: socket.socket, msg: dict) -> dict:
    s.sendall(json.dumps(msg).encode() + b"\n")
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = s.recv(65536)
        if not chunk:
            raise ServerUnavailable("the fork server closed the connection without an answer")
        buf += chunk
        if len(buf) > MAX_REQUEST:
            raise ServerUnavailable("the fork server's answer is too long")
    return json.loads(buf)


def _spawn(store: Path, idle: float, timeout: float) -> None:
    argv = [sys.executable, "-m", SERVER_MODULE, "--store", str(store), "--idle", str(idle), "--detach"]
    try:
        r = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, env=child_env(), timeout=timeout, close_fds=True)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ServerUnavailable(f"cannot start the fork server: {e}") from None
    if r.returncode != 0:
        raise ServerUnavailable(f"the fork server did not start: {r.stderr.decode(errors='replace')[-500:]}")


def _connect_or_start(store: Path, dfd: int, idle: float, timeout: float) -> socket.socket:
    s = _connect(dfd, timeout)
    if s is not None:
        return s
    lock = os.open(store / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        s = _connect(dfd, timeout)  # another petri may have started one while we waited
        if s is None:
            _spawn(store, idle, timeout)
            s = _connect(dfd, timeout)
        if s is None:
            raise ServerUnavailable("the fork server started but its socket does not answer")
        return s
    finally:
        os.close(lock)


def request(store: Path, msg: dict, *, timeout: float = 15.0, idle: float = 60.0,
            start: bool = True) -> dict:
    """Send one request to ``store``'s fork server (starting it if ``start``)."""
    try:
        with _dirfd(store) as dfd:
            for attempt in range(2):
                s = _connect_or_start(store, dfd, idle, timeout) if start else _connect(dfd, timeout)
                if s is None:
                    raise ServerUnavailable("no fork server is running")
                try:
                    return _exchange(s, msg)
                except ServerUnavailable:
                    # An idle server may have been on its way out; one fresh try.
                    if attempt or not start or msg.get("op") == "mount":
                        raise
                finally:
                    s.close()
    except (OSError, ValueError) as e:
        raise ServerUnavailable(f"fork server: {e}") from None
    raise ServerUnavailable("unreachable")


def mount(store: Path, daemon_args: list[str], *, timeout: float = 15.0, idle: float = 60.0) -> int:
    """Have ``store``'s fork server fork a daemon with ``daemon_args`` (see
    ``MountSpec.daemon_args``); return its pid once mounted. Raises ServerUnavailable when
    the server cannot be used (fall back), DaemonFailed when the daemon failed to mount."""
    msg = {"op": "mount", "argv": daemon_args, "code": code_stamp()}
    reply = request(store, msg, timeout=timeout, idle=idle)
    if reply.get("stale"):  # it runs older code than ours and has exited: start a new one
        reply = request(store, msg, timeout=timeout, idle=idle)
    if reply.get("ok"):
        return int(reply["pid"])
    if reply.get("daemon"):
        raise DaemonFailed(reply.get("error", "the daemon failed"))
    raise ServerUnavailable(reply.get("error", "the fork server refused"))


def server_pid(store: Path) -> int | None:
    """The running server's pid (its pid file checked against its start time)."""
    try:
        pid, started = (store / PIDFILE).read_text().split()
        pid_ = int(pid)
    except (FileNotFoundError, ValueError):
        return None
    return pid_ if str(start_time(pid_)) == started and _alive(pid_) else None


def stop_server(store: Path, timeout: float = 5.0) -> bool:
    """Stop ``store``'s fork server if one runs (its daemons keep running); True if one did."""
    pid = server_pid(store)
    if pid is None:
        return False
    try:
        ok = request(store, {"op": "stop"}, timeout=timeout, start=False).get("ok")
    except ServerUnavailable:
        ok = False
    if not ok:  # e.g. root stopping a user's server, which answers only its own user
        _kill(pid, signal.SIGTERM)
    if not _wait_gone(pid, timeout):
        _kill(pid, signal.SIGKILL)
        _wait_gone(pid, timeout)
    return True
