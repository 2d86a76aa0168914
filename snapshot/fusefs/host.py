"""A FUSE host: one pyfuse3 process, one mount, many sandboxes (:class:`.multi.MultiFS`: each
sandbox a top-level directory of the mount), so a sandbox costs its filesystem's state, not
an interpreter.

A host owns a slot directory (``<store>/fuse/<k>``)::

    mnt/          the mount: ``mnt/<name>`` is the tree of the sandbox served as <name>
    daemon.pid    the host's pid (and daemon.pid.start: "<pid> <start time>")
    host.sock     its control socket (SOCK_SEQPACKET, mode 0600; peers: its user or root)
    host.log      its log

Requests on the control socket, one JSON packet each, one packet back (to the connection
passed along with the request (SCM_RIGHTS) if there is one: the fork server forwards a
client's connection so that the host answers the client itself):

- ``{"op": "add", "name": N, "argv": [sandbox args]}``: serve a sandbox as ``mnt/<N>``
  (replacing one served under that name) -> ``{"ok": true, "pid"}`` or ``{"ok": false,
  "daemon": true, "error"}``; the sandbox arguments are ``MountSpec.daemon_args`` less the
  mount point;
- ``{"op": "remove", "name": N}`` -> ``{"ok": true, "removed": bool, "left": n}``: the
  others of the host are not touched (``left``: how many it still serves or is adding);
- ``{"op": "ping"}`` -> ``{"ok": true, "pid", "names": [...]}``;
- ``{"op": "attach"}``: this connection is the fork server's from now on (a server that
  started after the host adopts it) -> ``{"ok": true, "pid", "count", "host": {options}}``.

Over the server's connection the host reports ``{"ended": n}`` whenever n sandboxes stop
being served (removed, replaced, or an add that failed), so the server knows its load, and
it takes ``{"op": "retire"}``. It unmounts and exits once it serves nothing and is retired,
or has no server (its connection closed: the server is gone) — a host started on its own
(no server) waits ``LINGER`` seconds for its first sandbox. SIGTERM unmounts and exits.

Caveats: the sandboxes of a host share its fate: killed, its mount answers ENOTCONN until a
new host takes the slot (``ensure_clone`` brings them back). A blocking call in one
sandbox's handler holds up the others of its host for its duration.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import os
import signal
import socket
import struct
import sys
from pathlib import Path
from typing import Any

from ..idmap import IdMap
from .proc import child_detach, start_time
from .journal import Journal
import snapshot

FSNAME = "petri"
MODULE = "snapshot.fusefs.host"
MNT = "mnt"
SOCK = "host.sock"
PIDFILE = "daemon.pid"
LOG = "host.log"
LINGER = 30.0
HOST_NAME = b"petri-fuse-host"
MAX_PACKET = 1 << 20
log = logging.getLogger("petri.fusefs")


@functools.cache
def _parser() -> argparse.ArgumentParser:
    """A sandbox's arguments. Made once per process: building a parser looks up gettext
    catalogues on disk (milliseconds), which a host would otherwise pay for every sandbox."""
    p = argparse.ArgumentParser(prog=MODULE, add_help=False, exit_on_error=False)
    p.add_argument("--lower", action="append", default=[])
    p.add_argument("--upper")
    p.add_argument("--workdir")
    p.add_argument("--journal")
    p.add_argument("--disk-budget", type=int)
    p.add_argument("--entry-timeout", type=float, default=10.0)
    p.add_argument("--attr-timeout", type=float, default=10.0)
    p.add_argument("--negative-timeout", type=float, default=10.0)
    p.add_argument("--keep-cache", choices=("lower", "all", "none"), default="lower")
    p.add_argument("--no-fsync-copyup", dest="fsync_copyup", action="store_false")
    p.add_argument("--idmap")
    return p


def parse_sandbox(argv: list[str]) -> argparse.Namespace:
    args, rest = _parser().parse_known_args(argv)
    if rest:
        raise ValueError(f"unknown sandbox arguments {rest}")
    return args


def _parse_idmap(text: str | None) -> IdMap | None:
    if not text:
        return None
    uid, _, gid = text.partition(":")
    return IdMap(int(uid), int(gid or uid))


def _empty(upper: str | None) -> bool:
    if upper is None:
        return True
    try:
        with os.scandir(upper) as it:
            return next(it, None) is None
    except OSError:
        return True  # CowFS will say what is wrong with it


def _fds(anc: list[tuple[int, int, bytes]]) -> list[int]:
    size = struct.calcsize("i")
    out: list[int] = []
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            n = len(data) // size
            out += list(struct.unpack(f"{n}i", data[:n * size]))
    return out


def bind_control(slot: Path) -> socket.socket:
    """The slot's control socket (through a directory descriptor: socket paths are limited
    to 108 bytes), mode 0600; a stale one left by a dead host is replaced."""
    dfd = os.open(slot, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(SOCK, dir_fd=dfd)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        old = os.umask(0o177)  # born 0600: no moment where others may connect
        try:
            sock.bind(f"/proc/self/fd/{dfd}/{SOCK}")
            sock.listen(64)
        except BaseException:
            sock.close()
            raise
        finally:
            os.umask(old)
        return sock
    finally:
        os.close(dfd)


class Host:
    def __init__(self, slot: Path, *, allow_other: bool, writeback: bool, max_tasks: int,
                 channel: socket.socket | None) -> None:
        self.slot = slot
        self.mnt = slot / MNT
        self.allow_other = allow_other
        self.writeback = writeback
        self.max_tasks = max_tasks
        self.channel_sock = channel
        self.channel: Any = None
        self.retired = False
        self.pending = 0
        self.served_any = False
        self.fs: Any = None
        self.ctl: socket.socket | None = None
        self.ctl_ino = 0
        self.pidtext = ""
        self.stopping = False

    def options(self) -> dict:
        return {"allow_other": self.allow_other, "writeback": self.writeback, "max_tasks": self.max_tasks}

    # -- mount ---------------------------------------------------------------------------
    def mount(self) -> None:
        import pyfuse3


        if snapshot.fusefs.daemon.is_mounted(self.mnt):  # a killed host's: answers ENOTCONN, take it away first
            snapshot.fusefs.daemon.abort_connection(self.mnt)
            snapshot.fusefs.daemon.unmount(self.mnt)
        self.mnt.mkdir(exist_ok=True)
        self.fs = snapshot.fusefs.multi.MultiFS(os.stat(self.mnt), os.fsencode(self.slot), writeback=self.writeback)
        options = set(pyfuse3.default_options)  # default_permissions
        # nosuid,nodev always (fusermount3 adds them for a normal user anyway): a sandbox can
        # plant a setuid file or a device node in its tree.
        options |= {f"fsname={FSNAME}", f"subtype={FSNAME}", "nosuid", "nodev"}
        if self.allow_other:
            options.add("allow_other")
        pyfuse3.init(self.fs, str(self.mnt), options)
        self.ctl = bind_control(self.slot)
        self.ctl_ino = os.lstat(self.slot / SOCK).st_ino
        pid = os.getpid()
        self.pidtext = f"{pid}\n"
        for name, text in ((PIDFILE + ".start", f"{pid} {start_time(pid)}\n"), (PIDFILE, self.pidtext)):
            tmp = self.slot / f"{name}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            with open(fd, "w") as f:
                f.write(text)
            os.replace(tmp, self.slot / name)
        log.info("host %d mounted %s", pid, self.mnt)

    def cleanup(self) -> None:
        """After the loop: unmount, and remove the files that are still ours."""
        import pyfuse3

        try:
            pyfuse3.close(unmount=True)
        except Exception:
            log.exception("unmount failed")
        if self.fs is not None:
            self.fs.close()
        if self.ctl is not None:
            self.ctl.close()
        with contextlib.suppress(OSError):
            if os.lstat(self.slot / SOCK).st_ino == self.ctl_ino:
                os.unlink(self.slot / SOCK)
        with contextlib.suppress(OSError):
            if (self.slot / PIDFILE).read_text() == self.pidtext:
                os.unlink(self.slot / PIDFILE)
                os.unlink(self.slot / (PIDFILE + ".start"))
        log.info("host %d stopped", os.getpid())

    # -- the loop ------------------------------------------------------------------------
    async def run(self) -> None:
        import pyfuse3
        import trio

        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            nursery.start_soon(self._signals)
            nursery.start_soon(self._accept, trio.socket.from_stdlib_socket(self.ctl))
            if self.channel_sock is not None:
                self.channel = trio.socket.from_stdlib_socket(self.channel_sock)
                nursery.start_soon(self._connection, self.channel)
            nursery.start_soon(self._linger)
            await pyfuse3.main(min_tasks=1, max_tasks=self.max_tasks)
            nursery.cancel_scope.cancel()

    def _maybe_exit(self) -> None:
        import pyfuse3

        if self.stopping or (len(self.fs) == 0 and self.pending == 0
                             and (self.retired or (self.channel is None and self.served_any))):
            pyfuse3.terminate()

    async def _linger(self) -> None:
        import trio

        await trio.sleep(LINGER)
        self.served_any = True  # none came: go now if still empty
        self._maybe_exit()

    async def _signals(self) -> None:
        import trio

        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as sigs:
            async for _ in sigs:
                log.info("signal: unmounting %d sandbox(es)", len(self.fs))
                self.stopping = True
                self._maybe_exit()

    async def _accept(self, ctl: Any) -> None:
        import trio

        while True:
            try:
                conn, _ = await ctl.accept()
            except OSError as e:  # e.g. out of descriptors: never a reason to end the host
                log.warning("control socket: %s", e)
                await trio.sleep(0.1)
                continue
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            if struct.unpack("3i", creds)[1] not in (os.geteuid(), 0):
                with contextlib.suppress(OSError):
                    await conn.send(b'{"ok": false, "error": "permission denied"}')
                conn.close()
                continue
            self.nursery.start_soon(self._connection, conn)

    async def _report(self, ended: int) -> None:
        if ended and self.channel is not None:
            with contextlib.suppress(OSError):
                await self.channel.send(json.dumps({"ended": ended}).encode())

    async def _connection(self, conn: Any) -> None:
        """Requests on one connection until it closes; the server's connection may carry
        many (and the connections of the clients it forwards)."""
        try:
            while True:
                try:
                    msg, anc, _, _ = await conn.recvmsg(MAX_PACKET, socket.CMSG_SPACE(4 * struct.calcsize("i")))
                except OSError:
                    break
                fds = _fds(anc)
                if not msg:
                    for fd in fds:
                        os.close(fd)
                    break
                answer_to = socket.socket(fileno=fds.pop(0)) if fds else None
                for fd in fds:
                    os.close(fd)
                try:
                    await self._request(conn, msg, answer_to)
                except Exception:  # one bad request must not take the host's sandboxes with it
                    log.exception("request failed")
                finally:
                    if answer_to is not None:
                        answer_to.close()
        finally:
            if conn is self.channel:
                log.info("the fork server is gone")
                self.channel = None
            conn.close()
            self._maybe_exit()

    async def _request(self, conn: Any, msg: bytes, answer_to: socket.socket | None) -> None:
        try:
            req = json.loads(msg)
            op = req.get("op")
        except (ValueError, AttributeError):
            req, op = {}, None
        out: dict[str, Any]
        if op == "add":
            out = await self._add(req, from_server=conn is self.channel)
        elif op == "remove":
            removed = await self._remove(os.fsencode(str(req.get("name", ""))))
            out = {"ok": True, "removed": removed, "left": len(self.fs) + self.pending}
        elif op == "ping":
            out = {"ok": True, "pid": os.getpid(), "names": sorted(os.fsdecode(n) for n in self.fs.by_name)}
        elif op == "attach":
            if self.channel is not None and self.channel is not conn:
                self.channel.close()  # a server we no longer hear from: the new one takes over
            self.channel = conn
            self.retired = False
            out = {"ok": True, "pid": os.getpid(), "count": len(self.fs), "host": self.options()}
        elif op == "retire":
            self.retired = True
            self._maybe_exit()
            return
        else:
            out = {"ok": False, "error": f"unknown op {op!r}"}
        data = json.dumps(out).encode()
        if answer_to is not None:
            # A forwarded client's own connection (a blocking socket: one short packet).
            try:
                answer_to.settimeout(5)
                answer_to.sendall(data + b"\n") if answer_to.type == socket.SOCK_STREAM else answer_to.send(data)
            except OSError:
                pass  # the client gave up; what it asked for is done all the same
        else:
            with contextlib.suppress(OSError):
                await conn.send(data)

    async def _add(self, req: dict, from_server: bool) -> dict:
        import trio


        self.pending += 1
        name = os.fsencode(str(req.get("name", "")))
        ended = 0
        try:
            argv = req.get("argv")
            if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
                raise ValueError("bad add request")
            a = parse_sandbox(argv)
            base = self.fs.new_base()
            make = functools.partial(
                snapshot.fusefs.ops.CowFS, a.lower, a.upper, a.workdir, journal=Journal(a.journal),
                disk_budget=a.disk_budget,
                entry_timeout=a.entry_timeout, attr_timeout=a.attr_timeout, negative_timeout=a.negative_timeout,
                keep_cache=a.keep_cache, writeback=self.writeback, fsync_copyup=a.fsync_copyup,
                idmap=_parse_idmap(a.idmap), base=base)
            # A new sandbox's filesystem takes well under a millisecond: made here, not in a
            # thread, whose two hand-offs cost more than that on a busy machine. Over a filled
            # upper (walked for the disk budget) it goes to a thread: the others go on meanwhile.
            cow = make() if _empty(a.upper) else await trio.to_thread.run_sync(make)
            old = self.fs.install(name, cow)
            self.served_any = True
            if old is not None:
                ended += 1
                await self.fs.forget_entry(name)
            log.info("serving %s (lowers %s, upper %s)", os.fsdecode(name), a.lower, a.upper)
            return {"ok": True, "pid": os.getpid(), "slot": self.slot.name}
        except Exception as e:
            log.exception("cannot serve %s", os.fsdecode(name))
            if from_server:
                ended += 1
            return {"ok": False, "daemon": True, "error": f"{type(e).__name__}: {e}"}
        finally:
            self.pending -= 1
            await self._report(ended)
            self._maybe_exit()

    async def _remove(self, name: bytes) -> bool:
        if self.fs.remove(name) is None:
            return False
        log.info("removed %s", os.fsdecode(name))
        await self.fs.forget_entry(name)
        await self._report(1)
        self._maybe_exit()
        return True


def setup_logging(debug: bool = False) -> None:
    logging.basicConfig(stream=sys.stderr, level=logging.DEBUG if debug else logging.INFO,
                        format=f"%(asctime)s {os.getpid()} %(levelname)s %(message)s", force=True)


def serve(slot: Path, *, allow_other: bool, writeback: bool, max_tasks: int, channel: socket.socket | None,
          ready: Any = None) -> int:
    """Mount the slot and serve until retired or signalled. ``ready(None)`` once mounted,
    ``ready(error)`` if mounting failed."""
    import trio

    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # a peer gone is an EPIPE, never the host's end
    host = Host(slot, allow_other=allow_other, writeback=writeback, max_tasks=max_tasks, channel=channel)
    try:
        host.mount()
    except BaseException as e:
        log.exception("host failed before mounting")
        if ready is not None:
            ready(f"{type(e).__name__}: {e}")
        return 1
    if ready is not None:
        ready(None)
    os.umask(0)  # modes come from the requests, already masked by the caller's umask
    code = 0
    try:
        trio.run(host.run)
    except BaseException:
        log.exception("host failed")
        code = 1
    finally:
        host.cleanup()
    return code


def main(argv: list[str] | None = None) -> int:
    """A host started as a fresh process (when the fork server cannot be used)."""

    p = argparse.ArgumentParser(prog=MODULE)
    p.add_argument("--slot", required=True)
    p.add_argument("--allow-other", action="store_true")
    p.add_argument("--writeback", action="store_true")
    p.add_argument("--max-tasks", type=int, default=16)
    p.add_argument("--debug", action="store_true")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    slot = Path(args.slot)
    # Detached: the starter waits for the pipe, which says the mount is up (or why not).
    r, w = os.pipe()
    if child_detach(str(slot / LOG)):
        os.close(w)
        msg = os.read(r, 4096)
        sys.stderr.write(msg.decode(errors="replace"))
        return 0 if msg == b"" else 1
    os.close(r)
    setup_logging(args.debug)

    def ready(error: str | None) -> None:
        if error is not None:
            os.write(w, error.encode())
        os.close(w)

    return serve(slot, allow_other=args.allow_other, writeback=args.writeback, max_tasks=args.max_tasks,
                 channel=None, ready=ready)


if __name__ == "__main__":
    sys.exit(main())
