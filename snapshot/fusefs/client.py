"""The client side of a store's FUSE fork server (:mod:`.server`) and of its hosts
(:mod:`.host`): reach the server over its socket, start it on demand, have it serve a
sandbox in a host, find and stop it; talk to a host directly (remove a sandbox, ping); the
slots hosts live in.

Kept apart from the server so that the backend and the daemon need not import the server,
which imports the host to run it in its children. The files and the protocols are
described in :mod:`.server` and :mod:`.host`.

Caveats: sockets are reached through ``/proc/self/fd/<dir fd>/<name>`` (socket paths are
limited to 108 bytes), so /proc must be mounted.
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
import snapshot

SERVER_MODULE = "snapshot.fusefs.server"
SOCK = "fuse.sock"
LOCK = "fuse.lock"
PIDFILE = "fuse.pid"
MAX_REQUEST = 1 << 20
PER_HOST = 32  # sandboxes a host takes before another is started (see .server)
SLOTS = "fuse"  # <store>/fuse/<k>: the hosts' slots
HOST_SOCK = "host.sock"
HOST_PIDFILE = "daemon.pid"


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


def _spawn(store: Path, idle: float, timeout: float, per_host: int) -> None:
    argv = [sys.executable, "-P", "-m", SERVER_MODULE, "--store", str(store), "--idle", str(idle),
            "--per-host", str(per_host), "--detach"]
    try:
        r = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, env=child_env(), timeout=timeout, close_fds=True)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ServerUnavailable(f"cannot start the fork server: {e}") from None
    if r.returncode != 0:
        raise ServerUnavailable(f"the fork server did not start: {r.stderr.decode(errors='replace')[-500:]}")


def _connect_or_start(store: Path, dfd: int, idle: float, timeout: float, per_host: int) -> socket.socket:
    s = _connect(dfd, timeout)
    if s is not None:
        return s
    lock = os.open(store / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        s = _connect(dfd, timeout)  # another petri may have started one while we waited
        if s is None:
            _spawn(store, idle, timeout, per_host)
            s = _connect(dfd, timeout)
        if s is None:
            raise ServerUnavailable("the fork server started but its socket does not answer")
        return s
    finally:
        os.close(lock)


def request(store: Path, msg: dict, *, timeout: float = 15.0, idle: float = 60.0,
            start: bool = True, per_host: int = PER_HOST) -> dict:
    """Send one request to ``store``'s fork server (starting it if ``start``)."""
    try:
        with _dirfd(store) as dfd:
            for attempt in range(2):
                s = _connect_or_start(store, dfd, idle, timeout, per_host) if start else _connect(dfd, timeout)
                if s is None:
                    raise ServerUnavailable("no fork server is running")
                try:
                    return _exchange(s, msg)
                except ServerUnavailable:
                    # An idle server may have been on its way out; one fresh try.
                    if attempt or not start or msg.get("op") == "add":
                        raise
                finally:
                    s.close()
    except (OSError, ValueError) as e:
        raise ServerUnavailable(f"fork server: {e}") from None
    raise ServerUnavailable("unreachable")


def add(store: Path, name: str, sandbox_args: list[str], host: dict, *, slot: int | None = None,
        timeout: float = 15.0, idle: float = 60.0, per_host: int = PER_HOST) -> tuple[int, int]:
    """Have ``store``'s fork server serve a sandbox as ``name`` in one of its hosts (in
    ``slot``'s if given); returns (the host's pid, its slot) once served. Raises
    ServerUnavailable when the server cannot be used (fall back), DaemonFailed when the host
    could not serve it."""
    msg = {"op": "add", "name": name, "argv": sandbox_args, "host": host, "slot": slot, "code": code_stamp()}
    reply = request(store, msg, timeout=timeout, idle=idle, per_host=per_host)
    if reply.get("stale"):  # it runs older code than ours and has exited: start a new one
        reply = request(store, msg, timeout=timeout, idle=idle, per_host=per_host)
    if reply.get("ok"):
        return int(reply["pid"]), int(reply["slot"])
    if reply.get("daemon"):
        raise DaemonFailed(reply.get("error", "the host failed"))
    raise ServerUnavailable(reply.get("error", "the fork server refused"))


# -- slots and hosts ---------------------------------------------------------------------------
def slots_dir(store: Path) -> Path:
    return store / SLOTS


def host_pid(slot: Path) -> int | None:
    """The pid of the host serving ``slot`` (its pid file checked against its start time)."""
    try:
        pid = int((slot / HOST_PIDFILE).read_text().strip())
        ident = (slot / (HOST_PIDFILE + ".start")).read_text().split()
    except (FileNotFoundError, ValueError):
        return None
    if len(ident) != 2 or int(ident[0]) != pid or str(start_time(pid)) != ident[1] or not _alive(pid):
        return None
    return pid


def free_slot(slots: Path, taken: set[int]) -> int:
    """The lowest slot number not in ``taken`` where no host runs and nothing is mounted (a
    killed host's dead mount keeps its slot for the sandboxes that come back there)."""

    mounted = {m.mountpoint for m in snapshot.osutil.mounts()}
    k = 0
    while True:
        if k not in taken:
            slot = slots / str(k)
            if host_pid(slot) is None and os.fsencode(os.path.abspath(slot / "mnt")) not in mounted:
                return k
        k += 1


def connect_host(slot: Path, timeout: float = 5.0) -> socket.socket | None:
    """A connection to ``slot``'s host (SOCK_SEQPACKET), or None if none listens there."""
    try:
        dfd = os.open(slot, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    s.settimeout(timeout)
    try:
        s.connect(f"/proc/self/fd/{dfd}/{HOST_SOCK}")
        return s
    except OSError:
        s.close()
        return None
    finally:
        os.close(dfd)


def host_request(slot: Path, msg: dict, timeout: float = 15.0) -> dict | None:
    """One request to ``slot``'s host; None if no host answers there."""
    s = connect_host(slot, timeout)
    if s is None:
        return None
    try:
        s.send(json.dumps(msg).encode())
        data = s.recv(MAX_REQUEST)
        return json.loads(data) if data else None
    except (OSError, ValueError):
        return None
    finally:
        s.close()


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
