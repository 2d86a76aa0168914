"""A published port's relay, and the loopback of a sandbox's network namespace: stdlib only,
run as ``python3 -I -S relay.py relay|lo-up ...`` (no package import).

``relay``: started inside the sandbox's namespace (``nsenter``, by ``environment.publish``),
with a listening socket that petri bound on the host's 127.0.0.1 passed as ``--listen-fd``:
it detaches (a double fork), says ``ok PID`` on ``--ready-fd``, and joins every connection
accepted there to a new connection to 127.0.0.1:``--port`` inside the sandbox, bytes copied
both ways by two threads. It ends when the sandbox's holder does (a pidfd), or by a signal.

``lo-up``: brings ``lo`` up in the namespace it runs in; the holder's shell uses it where
iproute2's ``ip`` is missing.

Caveats: a relay copies with threads (two per connection), enough for a dev server and its
browser, not for thousands of connections; the client's address is not carried into the
sandbox (the server sees 127.0.0.1).
"""
from __future__ import annotations

import fcntl
import os
import select
import signal
import socket
import struct
import sys
import threading

SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1


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
    if argv[:1] == ["lo-up"]:
        loopback_up()  # for the shell holder where iproute2 is missing
    elif argv[:1] == ["relay"]:
        relay(int(args["--listen-fd"]), int(args["--port"]), int(args["--holder-pid"]), int(args["--ready-fd"]))
    else:
        sys.exit("usage: relay.py lo-up | relay --listen-fd N --port P --holder-pid H --ready-fd N")


if __name__ == "__main__":
    main(sys.argv[1:])
