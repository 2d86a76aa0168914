"""The processes that keep a sandbox's environment alive between its runs: stdlib only, run as
``python3 -I -S holder.py hold|relay ...`` (no package import: it starts in ~15 ms).

``hold``: the sandbox's *holder*. It unshares a network namespace (and, when petri is not
root, the user namespace that owns it, mapping petri's uid and gid to themselves), brings
its loopback up, says ``ok PID`` on ``--ready-fd`` and then sleeps until ``--until`` (the
sandbox's lifetime, epoch seconds; 0: until killed), or until its record (``--state``)
is gone without petri having ended it (the store was deleted by hand): then it also
detaches the sandbox's ``/tmp`` tmpfs (``--mount``), which nothing else would. Each run, shell, check and service of
the sandbox joins that namespace (``nsenter`` in ``cgexec``'s wrapper, before bwrap: see
``environment``), so a server one run started is reached by the next at 127.0.0.1. The
holder has no other job: a SIGTERM or SIGKILL ends it, and the namespace goes with its last
member.

``relay``: a published port. Started inside the sandbox's namespace (``nsenter``), with a
listening socket that petri bound on the host's 127.0.0.1 passed as ``--listen-fd``: every
connection accepted there is joined to a new connection to 127.0.0.1:``--port`` inside the
sandbox, bytes copied both ways by two threads. It ends when its holder does (a pidfd), or
by a signal.

Caveats: a relay copies with threads (two per connection), enough for a dev server and its
browser, not for thousands of connections; the client's address is not carried into the
sandbox (the server sees 127.0.0.1).
"""
from __future__ import annotations

import ctypes
import fcntl
import os
import select
import signal
import socket
import struct
import sys
import threading
import time

CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1


def _unshare(flags: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(flags) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"unshare: {os.strerror(e)}")


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def loopback_up() -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        ifr = struct.pack("16sH", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(s, SIOCGIFFLAGS, ifr))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH", b"lo", flags | IFF_UP))
    finally:
        s.close()


def detach() -> None:
    """Fork; the parent exits (the caller's wait returns), the child is nobody's child and
    lets go of the caller's stdio (which the caller reads to its end)."""
    if os.fork():
        os._exit(0)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)


WATCH_S = 2.0


def _orphaned(state: str) -> bool:
    """The sandbox's record is gone without petri ending this holder: its store was deleted
    (a workspace removed by hand, a test's temporary directory)."""
    return bool(state) and not os.path.exists(state)


def _release(mount: str) -> None:
    if mount:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.umount2(mount.encode(), 2)  # MNT_DETACH
        try:
            for name in os.listdir(mount):
                os.rmdir(os.path.join(mount, name))
            os.rmdir(mount)
        except OSError:
            pass


def hold(ready_fd: int, until: float, own_userns: bool, state: str = "", mount: str = "") -> None:
    uid, gid = os.getuid(), os.getgid()
    detach()
    try:
        if own_userns:
            _unshare(CLONE_NEWUSER | CLONE_NEWNET)
            _write("/proc/self/setgroups", "deny")
            _write("/proc/self/uid_map", f"{uid} {uid} 1")
            _write("/proc/self/gid_map", f"{gid} {gid} 1")
        else:
            _unshare(CLONE_NEWNET)
        loopback_up()
    except OSError as e:
        os.write(ready_fd, f"error {e}".encode())
        sys.exit(1)
    os.write(ready_fd, b"ok %d" % os.getpid())
    os.close(ready_fd)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    while True:
        left = until - time.time() if until else WATCH_S
        if left <= 0:
            return
        time.sleep(min(left, WATCH_S))
        if _orphaned(state):
            _release(mount)  # nobody else knows of it any more
            return


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            data = src.recv(1 << 16)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    for s, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
        try:
            s.shutdown(how)
        except OSError:
            pass


def _serve(conn: socket.socket, port: int) -> None:
    try:
        inner = socket.create_connection(("127.0.0.1", port), timeout=10)
        inner.settimeout(None)
    except OSError:
        conn.close()  # nothing listens in the sandbox: the client sees the connection closed
        return
    t = threading.Thread(target=_pump, args=(inner, conn), daemon=True)
    t.start()
    _pump(conn, inner)
    t.join()
    conn.close()
    inner.close()


def relay(listen_fd: int, port: int, holder_pid: int, ready_fd: int) -> None:
    detach()
    lsock = socket.socket(fileno=listen_fd)
    lsock.setblocking(True)
    try:
        pidfd = os.pidfd_open(holder_pid)
    except OSError as e:
        os.write(ready_fd, f"error the sandbox's holder is gone: {e}".encode())
        return
    os.write(ready_fd, b"ok %d" % os.getpid())
    os.close(ready_fd)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    poller = select.poll()
    poller.register(lsock.fileno(), select.POLLIN)
    poller.register(pidfd, select.POLLIN)
    while True:
        for fd, _ in poller.poll():
            if fd == pidfd:
                os._exit(0)
            try:
                conn, _ = lsock.accept()
            except OSError:
                continue
            threading.Thread(target=_serve, args=(conn, port), daemon=True).start()


def main(argv: list[str]) -> None:
    args = dict(zip(argv[1::2], argv[2::2], strict=False))
    if argv[:1] == ["hold"]:
        hold(int(args["--ready-fd"]), float(args.get("--until", "0")), args.get("--own-userns") == "1",
             args.get("--state", ""), args.get("--mount", ""))
    elif argv[:1] == ["relay"]:
        relay(int(args["--listen-fd"]), int(args["--port"]), int(args["--holder-pid"]), int(args["--ready-fd"]))
    else:
        sys.exit("usage: holder.py hold --ready-fd N [--until T] [--own-userns 1] | "
                 "relay --listen-fd N --port P --holder-pid H --ready-fd N")


if __name__ == "__main__":
    main(sys.argv[1:])
