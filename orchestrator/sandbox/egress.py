"""The egress allow-list: ``--net allow:HOST[:PORT],...`` lets a sandbox reach only those
destinations, through an HTTP(S) proxy petri owns (the way Codex's network proxy and
Anthropic's sandbox-runtime do it). Stdlib only: the proxy runs as
``python3 -I -S egress.py serve ...``; the layer above starts it through its own script
(``orchestrator/egress_feed.py``), which gives each refusal to the event feed: this module
imports nothing of petri's.

The sandbox keeps its own network namespace, loopback only (``environment``): no route out,
no DNS. The proxy is a process on the host's network (so it reaches what the host reaches)
whose listening socket was made *inside* the sandbox's namespace (a socket belongs to the
namespace it was created in, wherever its owner lives): at 127.0.0.1:PORT inside, where
every run finds it through ``HTTP_PROXY``, ``HTTPS_PROXY``, ``ALL_PROXY`` (and the
lower-case names). ``NO_PROXY`` is the sandbox's own loopback (``localhost,127.0.0.1,::1``):
a server the sandbox runs itself is reached directly, as without the allow-list.

The proxy takes ``CONNECT host:port`` (https, and any TCP a client tunnels) and plain HTTP
requests in absolute form (``GET http://host:port/path``, one request per connection: the
proxy forwards it with ``Connection: close``). It decides on the request's target alone:
- an entry matches the name as written (case and a trailing dot aside), or ``*.NAME`` any
  name below NAME; an IP literal only an IP literal entry (``allow:example.com`` never lets
  a client name example.com's address itself); an entry without a port allows every port;
- the proxy resolves an allowed name itself, on the host, and connects to the address it
  resolved (the sandbox can resolve nothing and chooses no address). A name that resolves to
  an address that is not global (loopback, private, link-local: the host's own services,
  what DNS rebinding aims at) is refused unless the entry is ``localhost`` or the address
  itself, written as an IP literal;
- a plain request whose ``Host`` header names another destination than its target is
  refused (400, and a ``net.denied`` naming the header's host): no server behind an allowed
  name is handed a request meant for another.
Anything refused gets ``403`` with a one-line body naming the destination and why, and is a
``net.denied`` event (``sandbox``, ``host``, ``port``, ``reason``), which ``petri stats`` counts.

Lifetime: made with the sandbox's environment (``environment.ensure``), recorded in its state
(pid, start time, port); it ends with the sandbox's holder (a pidfd on it), and ``destroy``
(``rm``, expiry, ``deinit``) and ``sweep`` (``gc``, after petri was killed) kill it.

Caveats (what the proxy cannot stop or see):
- Only clients that use a proxy are served: one that ignores the variables gets no route
  (``Network is unreachable``), never a way around the list. A raw socket, UDP or ICMP has
  nowhere to go but the sandbox's own loopback.
- Inside a CONNECT tunnel the bytes are the client's (TLS as a rule): the proxy sees only
  the destination, never the request, so it cannot filter paths or methods there, and a
  tunnel to an allowed host can carry anything that host accepts.
- Everything on the sandbox's loopback is reachable by every process of the sandbox,
  the proxy's port included: that is the point; the host's loopback only through the list.
- A name's resolution is the host's (``/etc/hosts``, its DNS) at the moment of the request;
  an allowed name is trusted to mean what the host's resolver says, within the rule above.
- The proxy runs as the petri account that made the environment (root as root); it copies
  bytes with two threads per connection: enough for package installs and API calls, not
  for thousands of connections.
- Plain HTTP is one request per connection (keep-alive is turned off through the proxy).
"""
from __future__ import annotations

import ipaddress
import os
import select
import signal
import socket
import sys
import threading
from typing import Callable

READ_HEAD = 64 << 10  # the longest request head the proxy reads
HEAD_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 10.0
PREFIX = "allow:"
NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-._")
LOCAL_NAMES = frozenset({"localhost"})


class BadAllowList(ValueError):
    """What is wrong with an allow-list, as one line."""


# ------------------------------------------------------------------ the list (pure)

def _norm_host(host: str) -> str:
    host = host.strip().lower()
    return host[:-1] if host.endswith(".") and len(host) > 1 else host


def _ip(host: str) -> "ipaddress.IPv4Address | ipaddress.IPv6Address | None":
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def split_host_port(text: str, *, need_port: bool) -> tuple[str, int | None]:
    """``host``, ``host:port``, ``[v6]:port`` or a bare IPv6 literal -> (host, port)."""
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise BadAllowList(f"{text!r}: an IPv6 address is written [ADDRESS]:PORT")
        host, rest = text[1:end], text[end + 1:]
        if rest and not rest.startswith(":"):
            raise BadAllowList(f"{text!r}: what follows ] must be :PORT")
        port_text = rest[1:] if rest else None
    elif text.count(":") > 1:
        host, port_text = text, None  # a bare IPv6 literal
    else:
        host, sep, port_text = text.partition(":")
        if not sep:
            port_text = None
    port = None
    if port_text is not None:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise BadAllowList(f"{text!r}: the port must be 1-65535")
        port = int(port_text)
    elif need_port:
        raise BadAllowList(f"{text!r}: a port is needed")
    if not host:
        raise BadAllowList(f"{text!r}: no host")
    return host, port


def parse_allow(text: str) -> tuple[str, ...]:
    """``allow:HOST[:PORT],...`` -> its entries, normalised (``host`` or ``host:port``,
    ``[v6]:port``); one clear error (``BadAllowList``) for anything else."""
    if not text.startswith(PREFIX):
        raise BadAllowList(f"{text!r}: use --net (the host's network) or --net allow:HOST[:PORT],...")
    body = text[len(PREFIX):]
    if not body.strip():
        raise BadAllowList("allow: needs at least one HOST[:PORT]")
    out: list[str] = []
    for raw in body.split(","):
        item = raw.strip()
        if not item:
            raise BadAllowList(f"{text!r}: an empty entry (two commas, or one at an end)")
        if "://" in item:
            raise BadAllowList(f"{item!r}: no scheme: write HOST[:PORT] (a proxy serves http and https alike)")
        if any(c in item for c in "/?#@ \t"):
            raise BadAllowList(f"{item!r}: a destination is HOST[:PORT], without a path, user or spaces")
        host, port = split_host_port(item, need_port=False)
        ip = _ip(host)
        if ip is not None:
            host = f"[{ip}]" if ip.version == 6 else str(ip)
        else:
            host = _norm_host(host)
            name = host[2:] if host.startswith("*.") else host
            if not name or not set(name) <= NAME_CHARS or ".." in name or name.startswith((".", "-")) \
                    or "*" in name or len(name) > 253:
                raise BadAllowList(f"{item!r}: not a host name or an IP address")
        entry = host if port is None else f"{host}:{port}"
        if entry not in out:
            out.append(entry)
    return tuple(out)


class Policy:
    """The allow-list, as the proxy reads it."""

    def __init__(self, entries: tuple[str, ...] | list[str]) -> None:
        self.entries = tuple(entries)
        self.rules: list[tuple[str, object, int | None]] = []  # (kind, host or ip, port)
        for e in entries:
            host, port = split_host_port(e, need_port=False)
            ip = _ip(host)
            if ip is not None:
                self.rules.append(("ip", ip, port))
            elif host.startswith("*."):
                self.rules.append(("below", host[2:], port))
            else:
                self.rules.append(("name", host, port))

    def match(self, host: str, port: int) -> tuple[bool, str | None]:
        """(allowed, the matching entry's kind or a reason)."""
        ip = _ip(host)
        name = _norm_host(host)
        for kind, value, p in self.rules:
            if p is not None and p != port:
                continue
            if kind == "ip" and ip is not None and value == ip:
                return True, "ip"
            if kind == "name" and ip is None and value == name:
                return True, "name"
            if kind == "below" and ip is None and name.endswith("." + str(value)):
                return True, "name"
        return False, "not in the allow-list"


def resolve(host: str, port: int, kind: str) -> tuple[list[tuple], str | None]:
    """The addresses to connect to (getaddrinfo's tuples), or a reason to refuse."""
    ip = _ip(host)
    if ip is not None:
        fam = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
        return [(fam, (str(ip), port))], None
    try:
        infos = socket.getaddrinfo(_norm_host(host), port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    except OSError as e:
        return [], f"does not resolve on the host ({e.strerror or e})"
    addrs = [(fam, sa[:2]) for fam, _, _, _, sa in infos]
    if _norm_host(host) not in LOCAL_NAMES:
        for _, sa in addrs:
            a = ipaddress.ip_address(sa[0].split("%")[0])
            if not a.is_global:
                return [], (f"resolves to {a}, a local address (allow it as an IP literal to mean it;"
                            f" a name may not lead to the host's own or private network)")
    return addrs, None


# ------------------------------------------------------------------ the proxy (a process)

Denied = Callable[[str, str, "int | None", str], None]  # (method, host, port, why)


class Proxy:
    def __init__(self, policy: Policy, *, on_denied: Denied | None = None) -> None:
        self.policy, self.on_denied = policy, on_denied
        self._emit_lock = threading.Lock()

    def denied(self, method: str, host: str, port: int | None, reason: str) -> None:
        if self.on_denied is None:
            return
        with self._emit_lock:  # one writer at a time (each connection has its thread)
            try:
                self.on_denied(method, host, port, reason)
            except Exception:  # noqa: BLE001 - the refusal stands whether or not the feed took it
                pass

    def serve(self, lsock: socket.socket, holder_pidfd: int) -> None:
        poller = select.poll()
        poller.register(lsock.fileno(), select.POLLIN)
        poller.register(holder_pidfd, select.POLLIN)
        while True:
            for fd, _ in poller.poll():
                if fd == holder_pidfd:
                    os._exit(0)
                try:
                    conn, _ = lsock.accept()
                except OSError:
                    continue
                threading.Thread(target=self.handle, args=(conn,), daemon=True).start()

    def handle(self, conn: socket.socket) -> None:
        try:
            self._handle(conn)
        except Exception:  # noqa: BLE001 - one client's trouble ends its connection, not the proxy
            pass
        finally:
            try:
                conn.close()
            except OSError:
                pass

    def _reply(self, conn: socket.socket, status: str, body: str) -> None:
        data = body.encode() + b"\n"
        try:
            conn.sendall(b"HTTP/1.1 %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\n"
                         b"Connection: close\r\n\r\n%s" % (status.encode(), len(data), data))
        except OSError:
            pass

    def _handle(self, conn: socket.socket) -> None:
        conn.settimeout(HEAD_TIMEOUT_S)
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = conn.recv(8192)
            if not chunk:
                return
            buf += chunk
            if len(buf) > READ_HEAD:
                return self._reply(conn, "431 Request Header Fields Too Large", "petri: request head too long")
        head, _, rest = buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return self._reply(conn, "400 Bad Request", "petri: not an HTTP request")
        method, target, version = parts
        headers = []
        for ln in lines[1:]:
            k, sep, v = ln.partition(":")
            if not sep or not k or k != k.strip():
                return self._reply(conn, "400 Bad Request", "petri: a malformed header line")
            headers.append((k, v.strip()))
        if method == "CONNECT":
            try:
                host, port = split_host_port(target, need_port=True)
            except BadAllowList:
                return self._reply(conn, "400 Bad Request", f"petri: CONNECT needs HOST:PORT, not {target!r}")
            path = None
        else:
            if not target.lower().startswith("http://"):
                why = ("petri: https goes through CONNECT" if target.lower().startswith("https://")
                       else "petri: this is the sandbox's egress proxy: requests name an http:// URL or use CONNECT")
                return self._reply(conn, "400 Bad Request", why)
            rest_of = target[7:]
            authority, slash, tail = rest_of.partition("/")
            authority = authority.rpartition("@")[2]
            try:
                host, port = split_host_port(authority, need_port=False)
            except BadAllowList:
                return self._reply(conn, "400 Bad Request", f"petri: a bad URL {target!r}")
            port = 80 if port is None else port
            path = "/" + tail if slash else "/"
            for k, v in headers:
                if k.lower() == "host" and not self._same(v, host, port):
                    try:
                        hh, hp = split_host_port(v.strip(), need_port=False)
                    except BadAllowList:
                        hh, hp = v, None
                    self.denied(method, hh, 80 if hp is None else hp,
                                f"the Host header names another destination than {host}:{port}")
                    return self._reply(conn, "400 Bad Request",
                                       f"petri: the Host header ({v}) names another destination than the request"
                                       f" ({host}:{port})")
        ok, why = self.policy.match(host, port)
        addrs: list[tuple] = []
        if ok:
            addrs, refuse = resolve(host, port, why or "")
            if refuse:
                ok, why = False, refuse
        if not ok:
            self.denied(method, host, port, why or "refused")
            return self._reply(conn, "403 Forbidden",
                               f"petri: {host}:{port} {why}: this sandbox may reach only "
                               f"{', '.join(self.policy.entries)}")
        up = self._connect(addrs)
        if isinstance(up, str):
            return self._reply(conn, "502 Bad Gateway", f"petri: cannot connect to {host}:{port}: {up}")
        conn.settimeout(None)
        with up:
            if method == "CONNECT":
                conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                if rest:
                    up.sendall(rest)
            else:
                keep = [(k, v) for k, v in headers if k.lower() not in
                        ("proxy-connection", "proxy-authorization", "connection", "keep-alive")]
                out = [f"{method} {path} {version}", *(f"{k}: {v}" for k, v in keep), "Connection: close", "", ""]
                up.sendall("\r\n".join(out).encode("latin-1") + rest)
            t = threading.Thread(target=_pump, args=(up, conn), daemon=True)
            t.start()
            _pump(conn, up)
            t.join()

    @staticmethod
    def _same(header: str, host: str, port: int) -> bool:
        try:
            h, p = split_host_port(header.strip(), need_port=False)
        except BadAllowList:
            return False
        ha, hb = _ip(h), _ip(host)
        same_host = (ha == hb) if ha is not None or hb is not None else _norm_host(h) == _norm_host(host)
        return same_host and (80 if p is None else p) == port

    @staticmethod
    def _connect(addrs: list[tuple]) -> "socket.socket | str":
        why = "no address"
        for fam, sa in addrs:
            s = socket.socket(fam, socket.SOCK_STREAM)
            s.settimeout(CONNECT_TIMEOUT_S)
            try:
                s.connect(sa)
                s.settimeout(None)
                return s
            except OSError as e:
                why = e.strerror or str(e)
                s.close()
        return why


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


def proxy_env(port: int) -> dict[str, str]:
    """What every run of an allow-list sandbox gets (its ``--env`` may override)."""
    url = f"http://127.0.0.1:{port}"
    env = {}
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        env[name] = env[name.lower()] = url
    env["NO_PROXY"] = env["no_proxy"] = "localhost,127.0.0.1,::1"
    return env


# ------------------------------------------------------------------ the proxy's command line

def listen_in_netns(send_fd: int) -> None:
    """``listen``: run inside the sandbox's namespace (``nsenter``): a TCP socket on its
    127.0.0.1, any free port, listening, sent back over the unix socket ``send_fd``."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen(128)
    chan = socket.socket(fileno=send_fd)
    socket.send_fds(chan, [b"ok"], [s.fileno()])


def serve(args: dict[str, str], on_denied: Denied | None = None) -> None:
    policy = Policy([e for e in args["--allow"].split(",") if e])
    ready = int(args["--ready-fd"])
    if os.fork():  # detach: the caller's wait returns, and no petri process has to reap the proxy
        os._exit(0)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    lsock = socket.socket(fileno=int(args["--listen-fd"]))
    lsock.setblocking(True)
    try:
        pidfd = os.pidfd_open(int(args["--holder-pid"]))
    except OSError as e:
        os.write(ready, f"error the sandbox's holder is gone: {e}".encode())
        return
    os.write(ready, b"ok %d" % os.getpid())
    os.close(ready)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    Proxy(policy, on_denied=on_denied).serve(lsock, pidfd)


def main(argv: list[str]) -> None:
    args = dict(zip(argv[1::2], argv[2::2], strict=False))
    if argv[:1] == ["listen"]:
        listen_in_netns(int(args["--send-fd"]))
    elif argv[:1] == ["serve"]:
        serve(args)
    else:
        sys.exit("usage: egress.py listen --send-fd N | serve --listen-fd N --holder-pid H --ready-fd N"
                 " --allow E,...")


if __name__ == "__main__":
    main(sys.argv[1:])
