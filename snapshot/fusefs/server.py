"""A per-store fork server ("zygote") for FUSE daemons: pyfuse3 and trio imported once,
one ``fork`` per mount instead of a fresh interpreter (~0.25 s) per sandbox.

Files in the store directory (``.petri``)::

    fuse.sock   the server's unix socket (mode 0600; peers must have the server's uid)
    fuse.lock   flock: held by a client while it starts a server, and by the server while
                it shuts down and removes its socket and pid file, so two servers never
                race for the socket name and an old server never removes its successor's
                pid file
    fuse.pid    "<pid> <start time>" of the running server
    fuse.log    the server's log (each daemon logs to its own sandbox's daemon.log)

Protocol: one JSON line per connection, one JSON line back.
``{"op": "mount", "argv": [daemon args]}`` -> ``{"ok": true, "pid": N}`` once mounted, or
``{"ok": false, "error": "..."}``; ``{"op": "ping"}``; ``{"op": "stop"}``.

The server is a plain blocking accept loop that never runs trio, so a forked child starts
with no event loop, no threads and no wakeup fds of its parent's. The child ``setsid``s,
resets signal dispositions, points its output at the sandbox's log and runs
:func:`snapshot.fusefs.daemon.run`; it answers the client itself (with its own pid, once
``pyfuse3.init`` has mounted) over the connection it inherited, so the server is free to
accept the next request at once. The server ignores SIGCHLD, so its children never linger
as zombies; when it exits they are reparented like any daemon.

Lifetime: started on demand by :func:`.client.mount` (under ``fuse.lock``; the starter returns
once the socket listens and the pid file is written), exits after ``idle`` seconds without a request (unlinking its
socket under ``fuse.lock`` and answering what is already queued first), on ``stop``
or SIGTERM. Running daemons are independent of it.

Caveats: daemons forked here share the server's command line in ``ps`` (their ``comm`` is
``petri-fuse``), so pid files carry a start time (see ``daemon.write_pidfile``). A daemon
inherits the server's environment (that of whichever petri process started it). Unix
socket paths are limited to 108 bytes: the socket is reached through
``/proc/self/fd/<dir fd>/fuse.sock``, so a deep store path is fine but /proc must be mounted.
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import logging
import os
import signal
import socket
import struct
import sys
from typing import Callable

from ..osutil import fork
from . import daemon as D
from .client import LOCK, MAX_REQUEST, PIDFILE, SOCK, code_stamp
from .client import SERVER_MODULE as MODULE
# The client's names, where callers have always found them (``S.mount``, ``S.stop_server``):
from .client import ServerUnavailable as ServerUnavailable
from .client import mount as mount
from .client import request as request
from .client import server_pid as server_pid
from .client import stop_server as stop_server

LOG = "fuse.log"
log = logging.getLogger("petri.fusefs.server")


# -- server side ---------------------------------------------------------------------------
class _Stop(Exception):
    pass


_STAMP: list | None = None  # code_stamp() when the server imported its modules


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def _read_line(conn: socket.socket) -> bytes:
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            break
        buf += chunk
        if len(buf) > MAX_REQUEST:
            raise ValueError("request too long")
    return buf


def _reply(conn: socket.socket, msg: dict) -> None:
    try:
        conn.sendall(json.dumps(msg).encode() + b"\n")
    except OSError:
        pass  # the client gave up; a mounted daemon is found by its pid file


def _child(conn: socket.socket, closing: list[int], argv: list[str]) -> None:
    """In the forked child: become a daemon and serve the mount. Never returns."""
    code = 1
    replied = False
    try:
        os.setsid()
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)  # fusermount3's waitpid needs SIGCHLD back
        for fd in closing:
            with contextlib.suppress(OSError):
                os.close(fd)
        args = D._parse(argv)
        D.redirect_output(args.log)
        os.chdir("/")
        D.set_process_name(b"petri-fuse")

        def ready(error: str | None) -> None:
            nonlocal replied
            replied = True
            _reply(conn, {"ok": True, "pid": os.getpid()} if error is None
                   else {"ok": False, "daemon": True, "error": error})
            conn.close()

        code = D.run(args, ready)
    except BaseException as e:  # noqa: BLE001 - a child must never return into the server loop
        if not replied:
            _reply(conn, {"ok": False, "daemon": True, "error": f"{type(e).__name__}: {e}"})
    finally:
        os._exit(code)


def _handle(conn: socket.socket, closing: list[int], retire: Callable[[], None]) -> None:
    conn.settimeout(5)
    if _peer_uid(conn) not in (os.geteuid(),):
        _reply(conn, {"ok": False, "error": "permission denied: not the server's user"})
        return
    msg = json.loads(_read_line(conn) or b"{}")
    op = msg.get("op")
    if op == "ping":
        _reply(conn, {"ok": True, "pid": os.getpid()})
    elif op == "stop":
        _reply(conn, {"ok": True, "pid": os.getpid()})
        raise _Stop()
    elif op == "mount":
        if msg.get("code") is not None and msg["code"] != _STAMP:
            retire()  # before answering: the client's retry must not reach this server again
            _reply(conn, {"ok": False, "stale": True, "error": "the fork server runs older code"})
            raise _Stop()
        argv = msg.get("argv")
        if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
            _reply(conn, {"ok": False, "error": "bad mount request"})
            return
        conn.settimeout(None)
        pid = fork()
        if pid == 0:
            _child(conn, closing, argv)
        log.info("forked %d for %s", pid, argv[argv.index("--mountpoint") + 1] if "--mountpoint" in argv else "?")
    else:
        _reply(conn, {"ok": False, "error": f"unknown op {op!r}"})


def _serve(sock: socket.socket, store_fd: int, sock_ino: int, idle: float) -> None:
    closing = [sock.fileno(), store_fd]

    def retire() -> None:
        """Unlink the socket name if it is still ours: no new client can reach us."""
        try:
            if os.stat(SOCK, dir_fd=store_fd).st_ino == sock_ino:
                os.unlink(SOCK, dir_fd=store_fd)
        except FileNotFoundError:
            pass

    def handle(conn: socket.socket) -> None:
        with conn:
            try:
                _handle(conn, closing, retire)
            except (OSError, ValueError) as e:
                log.warning("bad request: %s", e)

    def shutdown() -> None:
        """Retire and answer whatever is already queued."""
        retire()
        sock.setblocking(False)
        while True:
            try:
                conn, _ = sock.accept()
            except (BlockingIOError, InterruptedError):
                break
            conn.setblocking(True)
            try:
                handle(conn)
            except _Stop:
                pass

    sock.settimeout(idle)
    while True:
        try:
            conn, _ = sock.accept()
        except socket.timeout:
            try:
                lock = os.open(LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600, dir_fd=store_fd)
            except OSError as e:
                log.info("store unusable (%s): exiting", e)  # deinit'ed or removed under us
                return
            try:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # a client is starting (or reaching) us right now
                log.info("idle for %.0f s: exiting", idle)
                shutdown()
                return
            finally:
                os.close(lock)
        try:
            handle(conn)
        except _Stop:
            log.info("asked to stop")
            lock = os.open(LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600, dir_fd=store_fd)
            try:
                fcntl.flock(lock, fcntl.LOCK_EX)
                shutdown()
            finally:
                os.close(lock)
            return


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=MODULE)
    p.add_argument("--store", required=True)
    p.add_argument("--idle", type=float, default=60.0)
    p.add_argument("--detach", action="store_true")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    # Everything a daemon needs, imported once here: this is what the fork saves.
    import pyfuse3  # noqa: F401
    import trio  # noqa: F401

    from . import journal, ops  # noqa: F401

    global _STAMP
    _STAMP = code_stamp()

    store_fd = os.open(args.store, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(SOCK, dir_fd=store_fd)  # a dead server's; the caller holds fuse.lock
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    old = os.umask(0o177)  # the socket is born 0600: no window where others may connect
    try:
        sock.bind(f"/proc/self/fd/{store_fd}/{SOCK}")
    finally:
        os.umask(old)
    sock.listen(64)
    sock_ino = os.stat(SOCK, dir_fd=store_fd).st_ino
    ready_w = -1
    if args.detach:
        # Listening already: the starter may connect as soon as this parent exits, which it
        # does once the server's pid file is written (or the server died: EOF), so that
        # server_pid() names the server from the moment the starter returns.
        ready_r, ready_w = os.pipe()
        if fork() > 0:
            os.close(ready_w)
            os.read(ready_r, 1)
            os._exit(0)
        os.close(ready_r)
        os.setsid()
        if fork() > 0:
            os._exit(0)
        D.redirect_output(os.path.join(args.store, LOG))
        os.chdir("/")
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format=f"%(asctime)s {os.getpid()} %(levelname)s %(message)s")
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)

    def on_term(signum: int, frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, on_term)
    pidtext = f"{os.getpid()} {D.start_time(os.getpid())}\n"
    tmp = f"{PIDFILE}.{os.getpid()}.tmp"
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600, dir_fd=store_fd), "w") as f:
        f.write(pidtext)
    os.replace(tmp, PIDFILE, src_dir_fd=store_fd, dst_dir_fd=store_fd)
    if ready_w >= 0:
        os.write(ready_w, b"1")
        os.close(ready_w)
    log.info("fork server for %s listening (idle exit after %.0f s)", args.store, args.idle)
    try:
        _serve(sock, store_fd, sock_ino, args.idle)
    finally:
        # Under fuse.lock, which a client holds while it starts a successor: otherwise this
        # check-then-unlink could read our own pid file and then remove the successor's.
        lock = -1
        with contextlib.suppress(OSError):
            lock = os.open(LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600, dir_fd=store_fd)
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            with contextlib.suppress(OSError):
                if os.stat(SOCK, dir_fd=store_fd).st_ino == sock_ino:
                    os.unlink(SOCK, dir_fd=store_fd)
            with contextlib.suppress(OSError):
                with open(os.open(PIDFILE, os.O_RDONLY, dir_fd=store_fd)) as f:
                    if f.read() == pidtext:
                        os.unlink(PIDFILE, dir_fd=store_fd)
        finally:
            if lock >= 0:
                os.close(lock)
        sock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
