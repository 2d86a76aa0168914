"""The egress allow-list without a sandbox: how ``--net allow:...`` is read (and refused), what
an entry matches, and the proxy itself (``orchestrator.sandbox.egress.Proxy``) attacked over
real sockets on the host's loopback: a CONNECT to a denied port, a Host header that names
another destination than the request, a user-info trick in the URL, a name that resolves to
the host's own loopback (DNS rebinding's aim). The sandboxed end to end is
tests/sandbox/test_egress.py."""
from __future__ import annotations

import http.server
import socket
import threading

import pytest

from orchestrator.cli.common import net_allow_argv
from orchestrator.errors import UsageError
from orchestrator.limits import Limits
from orchestrator.sandbox import egress
from orchestrator.sandbox.egress import BadAllowList, Policy, parse_allow, proxy_env, resolve

pytestmark = pytest.mark.unit  # no root, mount, FUSE, cgroup or sandbox: `pytest -m unit`


@pytest.mark.parametrize("text, entries", [
    ("allow:127.0.0.1:8000", ("127.0.0.1:8000",)),
    ("allow:PyPI.org, files.pythonhosted.org:443", ("pypi.org", "files.pythonhosted.org:443")),
    ("allow:example.com.", ("example.com",)),
    ("allow:*.example.com:443,example.com:443", ("*.example.com:443", "example.com:443")),
    ("allow:[::1]:8080,::1", ("[::1]:8080", "[::1]")),
    ("allow:a.b,a.b", ("a.b",)),
])
def test_allow_lists_are_read_and_normalised(text, entries):
    assert parse_allow(text) == entries


@pytest.mark.parametrize("text, says", [
    ("allow:", "needs at least one"),
    ("allow: ", "needs at least one"),
    ("allow:127.0.0.1:99999", "1-65535"),
    ("allow:127.0.0.1:0", "1-65535"),
    ("allow:host:http", "1-65535"),
    ("allow:http://example.com", "no scheme"),
    ("allow:https://example.com:443", "no scheme"),
    ("allow:example.com/path", "without a path"),
    ("allow:user@example.com", "without a path, user"),
    ("allow:a,,b", "an empty entry"),
    ("allow:a,", "an empty entry"),
    ("allow:exa_mple!.com", "not a host name"),
    ("allow:*", "not a host name"),
    ("allow:a.*.com", "not a host name"),
    ("allow:[::1", "IPv6"),
    ("example.com", "use --net"),
])
def test_bad_allow_lists_say_what_is_wrong(text, says):
    with pytest.raises(BadAllowList) as e:
        parse_allow(text)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_limits_take_an_allow_list_and_keep_net_false():
    lim = Limits(net="allow:LocalHost:8000")
    assert lim.net is False and lim.net_allow == ("localhost:8000",)
    d = lim.as_dict()
    assert d["net"] is False and d["net_allow"] == ["localhost:8000"]
    assert Limits.from_dict(d) == lim
    assert Limits.from_dict({"net": True}).net_allow == ()
    assert "net_allow" not in Limits(net=True).as_dict() and "net_allow" not in Limits().as_dict()
    assert Limits(net="allow:a.b").replace(mem_bytes=1 << 20).net_allow == ("a.b",)
    with pytest.raises(UsageError, match="bad --net"):
        Limits(net="allow:")
    with pytest.raises(UsageError, match="exclude each other"):
        Limits(net=True, net_allow=["a.b"])


def test_only_fork_and_races_net_before_the_command_is_rewritten():
    assert net_allow_argv(["fork", "--net", "allow:a:1"]) == ["fork", "--net-allow", "allow:a:1"]
    assert net_allow_argv(["--json", "race", "--net=allow:a:1", "--check", "true"]) == \
        ["--json", "race", "--net-allow=allow:a:1", "--check", "true"]
    assert net_allow_argv(["fork", "--net"]) == ["fork", "--net"]
    assert net_allow_argv(["run", "sb", "--", "x", "--net", "allow:a"]) == ["run", "sb", "--", "x", "--net", "allow:a"]
    assert net_allow_argv(["race", "--cmd", "y", "--", "--net", "allow:a"])[-2:] == ["--net", "allow:a"]


def test_an_entry_matches_the_name_as_written_or_the_address_as_written():
    p = Policy(parse_allow("allow:localhost:8000,127.0.0.2,*.example.com:443"))
    assert p.match("localhost", 8000)[0] and p.match("LOCALHOST.", 8000)[0]
    assert not p.match("localhost", 8001)[0]
    assert not p.match("127.0.0.1", 8000)[0]  # a name's entry never lets the address through
    assert p.match("127.0.0.2", 1)[0] and p.match("127.0.0.2", 65535)[0]  # no port: every port
    assert not p.match("127.0.0.3", 1)[0]
    assert p.match("a.example.com", 443)[0] and p.match("b.a.example.com", 443)[0]
    assert not p.match("example.com", 443)[0] and not p.match("badexample.com", 443)[0]
    assert not p.match("a.example.com", 80)[0]


def test_a_name_resolving_to_a_local_address_is_refused_unless_it_is_localhost():
    addrs, why = resolve("localhost", 80, "name")
    assert why is None and addrs
    name = socket.gethostname()
    try:
        local = [a[4][0] for a in socket.getaddrinfo(name, 80)]
    except OSError:
        pytest.skip(f"this machine's name {name!r} does not resolve")
    if not all(a.startswith("127.") or a == "::1" for a in local):
        pytest.skip(f"{name!r} resolves to {local}, not only to loopback")
    addrs, why = resolve(name, 80, "name")
    assert addrs == [] and "a local address" in why


def test_proxy_env_names_the_proxy_and_keeps_the_sandboxs_loopback_direct():
    env = proxy_env(3128)
    for k in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        assert env[k] == "http://127.0.0.1:3128"
    assert env["NO_PROXY"] == env["no_proxy"] == "localhost,127.0.0.1,::1"


# ---------------------------------------------------------------------------- the proxy, attacked


class Named(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        self.server.seen.append((self.path, self.headers.get("Host")))
        body = f"{self.server.name} {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


@pytest.fixture
def two_servers():
    out = []
    for name in ("A", "B"):
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Named)
        srv.name, srv.seen = name, []
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        out.append(srv)
    yield out
    for srv in out:
        srv.shutdown()
        srv.server_close()


_KEEP: list = []


@pytest.fixture
def proxy(two_servers):
    a, _ = two_servers
    pol = Policy(parse_allow(f"allow:127.0.0.1:{a.server_port},localhost:{a.server_port}"))
    denied: list = []
    px = egress.Proxy(pol, on_denied=lambda method, host, port, reason: denied.append((method, host, port, reason)))
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen()
    r, w = socket.socketpair()  # a stand-in for the holder's pidfd: never readable (serve would _exit)
    _KEEP.append((r, w))  # kept open for the process's life: the serving thread outlives the test
    threading.Thread(target=px.serve, args=(lsock, r.fileno()), daemon=True).start()
    yield lsock.getsockname()[1], denied
    lsock.close()


def ask(port: int, data: bytes, then: bytes | None = None) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        if then is not None:
            got = s.recv(4096)
            assert got.startswith(b"HTTP/1.1 200"), got
            s.sendall(then)
        chunks = []
        while True:
            c = s.recv(65536)
            if not c:
                break
            chunks.append(c)
        return b"".join(chunks)


def test_connect_to_a_denied_port_is_403_and_reported(proxy, two_servers):
    port, denied = proxy
    a, b = two_servers
    got = ask(port, f"CONNECT 127.0.0.1:{b.server_port} HTTP/1.1\r\nHost: 127.0.0.1:{b.server_port}\r\n\r\n".encode())
    assert got.startswith(b"HTTP/1.1 403") and b"not in the allow-list" in got
    assert denied == [("CONNECT", "127.0.0.1", b.server_port, "not in the allow-list")]
    assert b.seen == []


def test_a_tunnel_goes_to_its_connect_target_whatever_its_host_headers_say(proxy, two_servers):
    port, denied = proxy
    a, b = two_servers
    inner = f"GET /x HTTP/1.1\r\nHost: 127.0.0.1:{b.server_port}\r\nConnection: close\r\n\r\n".encode()
    got = ask(port, f"CONNECT 127.0.0.1:{a.server_port} HTTP/1.1\r\nHost: 127.0.0.1:{b.server_port}\r\n\r\n".encode(),
              then=inner)
    assert got.endswith(b"A /x"), got
    assert b.seen == [] and a.seen == [("/x", f"127.0.0.1:{b.server_port}")] and denied == []


def test_a_plain_request_whose_host_header_names_another_destination_is_refused(proxy, two_servers):
    port, denied = proxy
    a, b = two_servers
    got = ask(port, f"GET http://127.0.0.1:{a.server_port}/ HTTP/1.1\r\nHost: 127.0.0.1:{b.server_port}\r\n\r\n"
              .encode())
    assert got.startswith(b"HTTP/1.1 400") and b"Host header" in got
    assert a.seen == [] and b.seen == []
    assert denied == [("GET", "127.0.0.1", b.server_port,
                       f"the Host header names another destination than 127.0.0.1:{a.server_port}")]
    got = ask(port, f"GET http://127.0.0.1:{a.server_port}/ok HTTP/1.1\r\nHost: 127.0.0.1:{a.server_port}\r\n\r\n"
              .encode())
    assert got.startswith(b"HTTP/1.0 200") and got.endswith(b"A /ok")  # http.server speaks 1.0


def test_user_info_origin_form_and_https_urls_do_not_get_through(proxy, two_servers):
    port, denied = proxy
    a, b = two_servers
    got = ask(port, f"GET http://127.0.0.1:{a.server_port}@127.0.0.1:{b.server_port}/ HTTP/1.1\r\n\r\n".encode())
    assert got.startswith(b"HTTP/1.1 403"), got  # the host is what follows the @
    got = ask(port, f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{a.server_port}\r\n\r\n".encode())
    assert got.startswith(b"HTTP/1.1 400") and b"egress proxy" in got
    got = ask(port, f"GET https://127.0.0.1:{a.server_port}/ HTTP/1.1\r\n\r\n".encode())
    assert got.startswith(b"HTTP/1.1 400") and b"CONNECT" in got
    assert a.seen == [] and b.seen == []
    assert [d[1:3] for d in denied] == [("127.0.0.1", b.server_port)]


def test_the_address_of_an_allowed_name_and_a_name_for_an_allowed_address_are_refused(proxy, two_servers):
    port, denied = proxy
    a, _ = two_servers
    # localhost:A is listed and so is 127.0.0.1:A; this machine's own name, resolving to loopback, is not
    name = socket.gethostname()
    got = ask(port, f"CONNECT {name}:{a.server_port} HTTP/1.1\r\n\r\n".encode())
    assert got.startswith(b"HTTP/1.1 403"), got
    got = ask(port, f"CONNECT localhost:{a.server_port} HTTP/1.1\r\n\r\n".encode(),
              then=b"GET /l HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert got.endswith(b"A /l")


def test_the_mcp_fork_tool_takes_an_allow_list_or_a_boolean():
    from orchestrator.mcp.tools import BY_NAME, _limits

    assert _limits({"net": "allow:pypi.org:443"}).net_allow == ("pypi.org:443",)
    assert _limits({"net": True}).net is True and _limits({}).net is False
    with pytest.raises(UsageError, match="no scheme"):
        _limits({"net": "allow:https://pypi.org"})
    assert BY_NAME["sandbox_fork"].args["net"]["type"] == ["boolean", "string"]


def test_the_config_file_takes_an_allow_list_and_flags_override_it(tmp_path):
    from orchestrator.config import parse_config
    from orchestrator.errors import ConfigError

    path = tmp_path / "config.toml"
    cfg = parse_config(b'[limits]\nnet = "allow:PyPI.org:443, files.pythonhosted.org:443"\n', path)
    lim = cfg.apply_defaults(Limits())
    assert lim.net is False and lim.net_allow == ("pypi.org:443", "files.pythonhosted.org:443")
    assert cfg.apply_defaults(Limits(net=True)) == Limits(net=True)  # --net wins
    assert cfg.apply_defaults(Limits(net="allow:a.b")).net_allow == ("a.b",)  # so does the command's list
    assert parse_config(b"[limits]\nnet = true\n", path).apply_defaults(Limits()).net is True
    with pytest.raises(ConfigError, match="limits.net.*1-65535"):
        parse_config(b'[limits]\nnet = "allow:pypi.org:0"\n', path)
    with pytest.raises(ConfigError, match="limits.net"):
        parse_config(b'[limits]\nnet = "yes"\n', path)
