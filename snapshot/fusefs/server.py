"""A per-store fork server ("zygote") for FUSE hosts: pyfuse3, trio and the filesystem
imported once; a host (:mod:`.host`: one process, one mount, many sandboxes) forked from it
when one is needed, and every sandbox placed in a host.

Files in the store directory (``.petri``)::

    fuse.sock   the server's unix socket (mode 0600; peers must have the server's uid)
    fuse.lock   flock: held by a client while it starts a server, and by the server while
                it shuts down and removes its socket and pid file, so two servers never
                race for the socket name and an old server never removes its successor's
                pid file
    fuse.pid    "<pid> <start time>" of the running server
    fuse.log    the server's log (each host logs to its slot's host.log)
    fuse/<k>/   slot k: a host's mount and files (see :mod:`.host`)

Protocol: one JSON line per connection, one JSON line back.
``{"op": "add", "name", "argv": [sandbox args], "host": {"allow_other", "writeback",
"max_tasks"}, "slot": k or null}`` -> ``{"ok": true, "pid", "slot"}`` once the sandbox is
served (by the host itself), or ``{"ok": false, "error": "..."}``; ``{"op": "ping"}`` ->
``{"ok": true, "pid", "hosts": [{"pid", "slot", "load"}]}``; ``{"op": "stop"}``.

Placement: without a slot, a sandbox goes to a new host while there are fewer hosts than
CPUs (so sandboxes busy at once use every core), then to the least loaded host of the same
options with fewer than ``--per-host`` sandboxes (default 32), else to a new host in the
lowest free slot. A slot is free when no host runs there and nothing is mounted there (a
killed host's dead mount keeps its slot for its sandboxes: they come back there, at the
same paths). With a slot (bringing a sandbox back), it goes to that slot's host, started
there if none runs. The request travels to the host over its channel with the client's
connection attached (SCM_RIGHTS); the host serves the sandbox and answers the client
itself. A host reports each sandbox that ended; one with none left is retired.

The server is a plain blocking loop that never runs trio, so a forked host starts with no
event loop, no threads and no wakeup fds of its parent's. It ignores SIGCHLD, so its hosts
never linger as zombies. If it dies, its hosts serve on (and end once empty); the next
server adopts the ones still running (``attach`` on their control sockets).

Lifetime: started on demand by :func:`.client.add` (under ``fuse.lock``; the starter
returns once the socket listens and the pid file is written); exits after ``idle`` seconds
without a request once it has no hosts, on ``stop`` or SIGTERM. Hosts are independent of it.

Caveats: hosts share the server's command line in ``ps`` (their ``comm`` is
``petri-fuse-host``), so pid files carry a start time. A host inherits the server's
environment (that of whichever petri process started it). Unix socket paths are limited to
108 bytes: sockets are reached through ``/proc/self/fd/<dir fd>/<name>``, so /proc must be
mounted.
"""
from __future__ import annotations

import argparse
import array
import contextlib
import fcntl
import json
import logging
import os
import selectors
import signal
import socket
import struct
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..osutil import fork
from .client import LOCK, MAX_REQUEST, PER_HOST, PIDFILE, SOCK, code_stamp, connect_host, free_slot, slots_dir
from .client import SERVER_MODULE as MODULE
# The client's names, where callers have always found them (``S.add``, ``S.stop_server``):
from .client import ServerUnavailable as ServerUnavailable
from .client import add as add
from .client import request as request
from .client import server_pid as server_pid
from .client import stop_server as stop_server
from .proc import redirect_output, set_process_name, start_time
from .host import serve, setup_logging

LOG = "fuse.log"
log = logging.getLogger("petri.fusefs.server")


class _Stop(Exception):
    pass


_STAMP: list | None = None  # code_stamp() when the server imported its modules


@dataclass
class _Host:
    pid: int
    slot: int
    channel: socket.socket
    options: dict = field(default_factory=dict)
    load: int = 0  # sandboxes sent to it that it has not reported ended
    retiring: bool = False


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
        pass  # the client gave up


def _cpus() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except OSError:
        return max(1, os.cpu_count() or 1)


def _options(msg: dict) -> dict:
    h = msg.get("host") or {}
    return {"allow_other": bool(h.get("allow_other")), "writeback": bool(h.get("writeback")),
            "max_tasks": int(h.get("max_tasks") or 16)}


class _Server:
    def __init__(self, sock: socket.socket, store_fd: int, sock_ino: int, store: Path, per_host: int,
                 spread: int) -> None:
        self.sock = sock
        self.store_fd = store_fd
        self.sock_ino = sock_ino
        self.slots = slots_dir(store)
        self.per_host = max(1, per_host)
        self.spread = max(1, spread)
        self.hosts: dict[int, _Host] = {}  # by channel fd
        self.sel = selectors.DefaultSelector()
        self.sel.register(sock, selectors.EVENT_READ)

    # -- hosts -----------------------------------------------------------------------------
    def _register(self, h: _Host) -> _Host:
        self.hosts[h.channel.fileno()] = h
        self.sel.register(h.channel, selectors.EVENT_READ)
        log.info("host %d in slot %d (%d hosts)", h.pid, h.slot, len(self.hosts))
        return h

    def adopt(self) -> None:
        """Hosts a previous server left running: attached, so they are placed in again."""
        try:
            names = sorted(os.listdir(self.slots))
        except FileNotFoundError:
            return
        for name in names:
            if not name.isdigit():
                continue
            s = connect_host(self.slots / name, timeout=2.0)
            if s is None:
                continue
            try:
                s.send(b'{"op": "attach"}')
                reply = json.loads(s.recv(65536) or b"{}")
            except (OSError, ValueError):
                s.close()
                continue
            if not reply.get("ok"):
                s.close()
                continue
            s.settimeout(None)
            self._register(_Host(int(reply["pid"]), int(name), s, reply.get("host") or {}, int(reply.get("count", 0))))

    def _new_host(self, slot: int, options: dict) -> _Host:
        """Fork a host for ``slot`` and wait until it has mounted (a few ms; raises OSError
        with its error if it could not)."""
        path = self.slots / str(slot)
        path.mkdir(parents=True, exist_ok=True)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        pid = fork()
        if pid == 0:
            code = 1
            try:
                os.setsid()
                for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                    signal.signal(sig, signal.SIG_DFL)  # fusermount3's waitpid needs SIGCHLD back
                # Nothing of the server's may stay open here: a host holding another host's
                # channel would keep it from seeing the server go.
                keep = theirs.fileno()
                os.closerange(3, keep)
                os.closerange(keep + 1, 1 << 20)
                redirect_output(str(path / "host.log"))
                os.chdir("/")
                set_process_name(b"petri-fuse-host")

                setup_logging()

                def ready(error: str | None) -> None:
                    theirs.send(json.dumps({"ready": error is None, "error": error}).encode())

                code = serve(path, channel=theirs, ready=ready, **options)
            except BaseException:  # noqa: BLE001 - a child must never return into the server loop
                with contextlib.suppress(BaseException):
                    log.exception("host failed to start")
            finally:
                os._exit(code)
        theirs.close()
        ours.settimeout(30)
        try:
            msg = json.loads(ours.recv(65536) or b'{"error": "the host died before mounting"}')
        except (OSError, ValueError) as e:
            msg = {"error": f"no word from the host ({e})"}
        if not msg.get("ready"):
            ours.close()
            raise OSError(f"cannot mount slot {slot}: {msg.get('error')}")
        ours.settimeout(None)
        return self._register(_Host(pid, slot, ours, options))

    def _drop(self, h: _Host, why: str) -> None:
        self.hosts.pop(h.channel.fileno(), None)
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(h.channel)
        h.channel.close()
        log.info("host %d (slot %d) %s (%d hosts)", h.pid, h.slot, why, len(self.hosts))

    def _by_slot(self, slot: int) -> _Host | None:
        for h in self.hosts.values():
            if h.slot == slot:
                return h
        return None

    def _wait_gone(self, h: _Host, timeout: float = 10.0) -> None:
        """A retiring host's channel closes when it exits (after its unmount)."""
        h.channel.settimeout(timeout)
        with contextlib.suppress(OSError):
            while h.channel.recv(65536):
                pass
        self._drop(h, "exited")

    def _host_for(self, msg: dict) -> _Host:
        options = _options(msg)
        slot = msg.get("slot")
        if slot is not None:
            slot = int(slot)
            h = self._by_slot(slot)
            if h is not None and h.retiring:
                self._wait_gone(h)
                h = None
            return h if h is not None else self._new_host(slot, options)
        live = [h for h in self.hosts.values() if not h.retiring and h.options == options]
        if len(live) >= self.spread:
            open_ = [h for h in live if h.load < self.per_host]
            if open_:
                return min(open_, key=lambda h: h.load)
        return self._new_host(free_slot(self.slots, {h.slot for h in self.hosts.values()}), options)

    def _place(self, conn: socket.socket, msg: dict) -> None:
        out = json.dumps({"op": "add", "name": msg.get("name"), "argv": msg.get("argv")}).encode()
        for _ in range(3):
            try:
                h = self._host_for(msg)
            except OSError as e:
                _reply(conn, {"ok": False, "daemon": True, "error": str(e)})
                return
            try:
                h.channel.sendmsg([out], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [conn.fileno()]))])
            except OSError as e:
                self._drop(h, f"is gone ({e})")
                continue
            h.load += 1
            log.info("%s -> host %d, slot %d (%d sandboxes)", msg.get("name"), h.pid, h.slot, h.load)
            return
        _reply(conn, {"ok": False, "error": "no host would take the sandbox"})

    def _host_event(self, h: _Host) -> None:
        try:
            msg = h.channel.recv(65536)
        except OSError:
            msg = b""
        if not msg:
            self._drop(h, "exited")
            return
        with contextlib.suppress(ValueError, AttributeError, TypeError):
            h.load -= int(json.loads(msg).get("ended", 0))
        if h.load <= 0 and not h.retiring:
            with contextlib.suppress(OSError):
                h.channel.send(b'{"op": "retire"}')
            h.retiring = True  # kept until it has gone: its slot is not free before

    # -- requests --------------------------------------------------------------------------
    def retire(self) -> None:
        """Unlink the socket name if it is still ours: no new client can reach us."""
        try:
            if os.stat(SOCK, dir_fd=self.store_fd).st_ino == self.sock_ino:
                os.unlink(SOCK, dir_fd=self.store_fd)
        except FileNotFoundError:
            pass

    def _handle(self, conn: socket.socket) -> None:
        conn.settimeout(5)
        if _peer_uid(conn) not in (os.geteuid(),):
            _reply(conn, {"ok": False, "error": "permission denied: not the server's user"})
            return
        msg = json.loads(_read_line(conn) or b"{}")
        op = msg.get("op")
        if op == "ping":
            _reply(conn, {"ok": True, "pid": os.getpid(),
                          "hosts": [{"pid": h.pid, "slot": h.slot, "load": h.load}
                                    for h in self.hosts.values() if not h.retiring]})
        elif op == "stop":
            _reply(conn, {"ok": True, "pid": os.getpid()})
            raise _Stop()
        elif op == "add":
            if msg.get("code") is not None and msg["code"] != _STAMP:
                self.retire()  # before answering: the client's retry must not reach this server again
                _reply(conn, {"ok": False, "stale": True, "error": "the fork server runs older code"})
                raise _Stop()
            argv = msg.get("argv")
            if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv) \
                    or not isinstance(msg.get("name"), str):
                _reply(conn, {"ok": False, "error": "bad add request"})
                return
            self._place(conn, msg)
        else:
            _reply(conn, {"ok": False, "error": f"unknown op {op!r}"})

    def handle(self, conn: socket.socket) -> None:
        with conn:
            try:
                self._handle(conn)
            except (OSError, ValueError) as e:
                log.warning("bad request: %s", e)

    def shutdown(self) -> None:
        """Retire and answer whatever is already queued."""
        self.retire()
        self.sock.setblocking(False)
        while True:
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                break
            conn.setblocking(True)
            try:
                self.handle(conn)
            except _Stop:
                pass

    def close(self) -> None:
        for h in list(self.hosts.values()):
            h.channel.close()  # they see it close, take no more and end with their last sandbox
        self.hosts.clear()
        self.sel.close()

    def serve(self, idle: float) -> None:
        self.sock.setblocking(False)
        last = time.monotonic()
        while True:
            timeout = None if self.hosts else max(0.0, idle - (time.monotonic() - last))
            events = self.sel.select(timeout)
            if not events and not self.hosts and time.monotonic() - last >= idle:
                if self._idle_exit(idle):
                    return
                last = time.monotonic() - idle + 0.05  # a client holds the lock: look again soon
                continue
            for key, _ in events:
                if key.fileobj is self.sock:
                    try:
                        conn, _ = self.sock.accept()
                    except (BlockingIOError, InterruptedError):
                        continue
                    conn.setblocking(True)
                    last = time.monotonic()
                    try:
                        self.handle(conn)
                    except _Stop:
                        log.info("asked to stop")
                        self._locked_shutdown()
                        return
                else:
                    h = self.hosts.get(key.fd)
                    if h is not None:
                        self._host_event(h)
                        if not self.hosts:
                            last = time.monotonic()

    def _idle_exit(self, idle: float) -> bool:
        try:
            lock = os.open(LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600, dir_fd=self.store_fd)
        except OSError as e:
            log.info("store unusable (%s): exiting", e)  # deinit'ed or removed under us
            return True
        try:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False  # a client is starting (or reaching) us right now
            log.info("idle for %.0f s: exiting", idle)
            self.shutdown()
            return True
        finally:
            os.close(lock)

    def _locked_shutdown(self) -> None:
        lock = os.open(LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600, dir_fd=self.store_fd)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self.shutdown()
        finally:
            os.close(lock)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=MODULE)
    p.add_argument("--store", required=True)
    p.add_argument("--idle", type=float, default=60.0)
    p.add_argument("--per-host", type=int, default=PER_HOST)
    p.add_argument("--spread", type=int, default=0, help="hosts to start before any takes a second sandbox")
    p.add_argument("--detach", action="store_true")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    # Everything a host needs, imported once here: this is what the fork saves.
    import pyfuse3  # noqa: F401
    import trio  # noqa: F401

    from . import daemon, host, journal, multi, ops  # noqa: F401

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
        redirect_output(os.path.join(args.store, LOG))
        os.chdir("/")
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format=f"%(asctime)s {os.getpid()} %(levelname)s %(message)s")
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)

    def on_term(signum: int, frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, on_term)
    pidtext = f"{os.getpid()} {start_time(os.getpid())}\n"
    tmp = f"{PIDFILE}.{os.getpid()}.tmp"
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600, dir_fd=store_fd), "w") as f:
        f.write(pidtext)
    os.replace(tmp, PIDFILE, src_dir_fd=store_fd, dst_dir_fd=store_fd)
    if ready_w >= 0:
        os.write(ready_w, b"1")
        os.close(ready_w)
    log.info("fork server for %s listening (idle exit after %.0f s without hosts)", args.store, args.idle)
    server = _Server(sock, store_fd, sock_ino, Path(args.store), args.per_host, args.spread or _cpus())
    server.adopt()
    try:
        server.serve(args.idle)
    finally:
        server.close()
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
