"""The egress allow-list end to end: ``petri fork --net allow:...`` on a btrfs workspace, two
HTTP servers on the host's 127.0.0.1 (A allowed, B not), curl and urllib inside the sandbox,
attacks on the proxy from inside, the ``net.denied`` events and ``petri stats``; bad lists
refused; the proxy gone with its sandbox (``rm``, ``gc`` after petri was killed) and after
``kill -9`` of the proxy itself made again; a real project (chardet's sdist, tests/helpers/realproj.py)
installing a package from an index that only the allow-list lets it reach; and the rootless
path (the proxy's socket made by a helper in the sandbox's user namespace) as a normal user
on fuse.

Network traffic stays on loopback: the host's (the two servers, the index) and the sandboxes'
own namespaces; the only other address named, 192.0.2.1 (TEST-NET-1), is the one a sandbox
must have no route to, so no packet is ever sent to it.
"""
from __future__ import annotations

import http.server
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.sandbox.environment import _start_time
from tests.helpers import realproj as R
from tests.conftest import petri
from tests.helpers.http_servers import Named, serve

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (btrfs loop image, cgroups, a test user)"),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap not found (bubblewrap)"),
    pytest.mark.skipif(shutil.which("nsenter") is None, reason="nsenter not found (util-linux)"),
    pytest.mark.skipif(shutil.which("curl") is None, reason="curl not found"),
]

PY = "/usr/bin/python3"


@pytest.fixture
def servers():
    a, b = serve(Named, "A"), serve(Named, "B")
    yield a, b
    for s in (a, b):
        s.shutdown()
        s.server_close()


def proxies() -> dict[int, int]:
    """Every egress proxy on the machine: pid -> start time."""
    out = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                cmd = open(f"/proc/{d}/cmdline", "rb").read()
            except OSError:
                continue
            if b"egress.py\0serve" in cmd:
                out[int(d)] = _start_time(int(d))
    return out


def env_state(ws: Path, sb: str) -> dict:
    st = json.loads((ws / ".petri" / "env" / f"{sb}.json").read_text())
    return {"proxy": (st["proxy"]["pid"], st["proxy"]["start"]), "holder": (st["holder_pid"], st["holder_start"]),
            "mount": st["root"] if st.get("mounted") else None}


def mountpoints() -> set[str]:
    with open("/proc/self/mountinfo") as f:
        return {line.split()[4] for line in f}


def assert_gone(st: dict, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while True:
        alive = [pid for pid, start in (st["proxy"], st["holder"]) if _start_time(pid) == start]
        mounted = st["mount"] in mountpoints() if st["mount"] else False
        if not alive and not mounted:
            return
        assert time.monotonic() < end, f"left behind: processes {alive}, mount {mounted and st['mount']}"
        time.sleep(0.05)


def denied_events(ws: Path) -> list[dict]:
    out = []
    with open(ws / ".petri" / "events.jsonl") as f:
        for ln in f:
            doc = json.loads(ln)
            if doc["event"] == "net.denied":
                out.append(doc)
    return out


@pytest.fixture
def ws(btrfs_dir):
    w = btrfs_dir / "proj"
    w.mkdir()
    (w / "README").write_text("egress\n")
    assert petri("init", "--convert", "--json", cwd=w).rc == 0
    before = set(proxies())
    try:
        yield w
    finally:
        petri("deinit", "--force", cwd=w)
        end = time.monotonic() + 5
        while set(proxies()) - before and time.monotonic() < end:
            time.sleep(0.05)
        assert set(proxies()) - before == set(), "an egress proxy outlived its workspace"


def fork(ws: Path, *args: str) -> str:
    r = petri("fork", *args, "--json", cwd=ws)
    assert r.rc == 0, r
    return r.json["sandboxes"][0]["id"]


CURL = ("code() { curl -s -o /tmp/body -w '%{http_code}' \"$@\"; echo \" $(cat /tmp/body 2>/dev/null)\"; "
        "rm -f /tmp/body; }\n")


def test_one_local_server_is_reached_through_the_proxy_and_another_is_refused(ws, servers):
    a, b = servers
    A, B = a.server_port, b.server_port
    sb = fork(ws, "--net", f"allow:127.0.0.1:{A}")
    script = CURL + f"""
code --noproxy '' http://127.0.0.1:{A}/curl
code --noproxy '' http://127.0.0.1:{B}/curl
code --noproxy '' http://localhost:{A}/curl
NO_PROXY= no_proxy= {PY} -c "import urllib.request as u
print(u.urlopen('http://127.0.0.1:{A}/urllib', timeout=5).read().decode())"
curl -s --noproxy '*' --max-time 5 http://127.0.0.1:{B}/direct; echo "direct-B $?"
{PY} -c "
import errno, socket
s = socket.socket()
try:
    s.connect(('192.0.2.1', 80))
except OSError as e:
    print('direct-out', errno.errorcode[e.errno])
try:
    socket.getaddrinfo('pypi.org', 443)
except socket.gaierror:
    print('no-dns')
"
"""
    r = petri("run", sb, "--", "sh", "-c", script, cwd=ws)
    assert r.rc == 0, r
    lines = r.out.splitlines()
    assert lines[0] == "200 A /curl", r.out
    assert lines[1].startswith("403 petri: 127.0.0.1:" + str(B)) and "not in the allow-list" in lines[1], r.out
    assert lines[2].startswith("403 petri: localhost:"), r.out  # the name is not the address written
    assert lines[3] == "A /urllib", r.out
    assert lines[4] == "direct-B 7", r.out  # the sandbox's own loopback: nothing listens there
    assert lines[5] == "direct-out ENETUNREACH", r.out  # no route out of the namespace at all
    assert lines[6] == "no-dns", r.out  # and no name resolves inside: only the proxy resolves, what is listed
    # strict's "no socket but AF_UNIX" is for a sandbox without network: an allow-list's
    # commands still reach their proxy (and through it A only)
    r = petri("run", "--seccomp", "strict", sb, "--", "sh", "-c", CURL + f"code --noproxy '' http://127.0.0.1:{A}/strict",
              cwd=ws)
    assert r.rc == 0 and r.out == "200 A /strict\n", r
    assert b.seen == [] and sorted(a.seen) == ["/curl", "/strict", "/urllib"]
    ev = denied_events(ws)
    assert [(e["sandbox"], e["host"], e["port"]) for e in ev] == [(sb, "127.0.0.1", B), (sb, "localhost", A)], ev
    assert all(e["via"] == "cli" and e["reason"] for e in ev)
    st = petri("stats", "--json", cwd=ws)
    assert st.rc == 0 and st.json["counts"]["net_denied"] == {"n": 2, "by_sandbox": {sb: 2}}, st
    assert "net_denied: 2" in petri("stats", cwd=ws).out
    # The proxy lives with the sandbox: rm ends it, its namespace and its /tmp.
    state = env_state(ws, sb)
    assert petri("rm", sb, cwd=ws).rc == 0
    assert_gone(state)


def test_a_name_entry_and_the_attacks_on_the_proxy_from_inside(ws, servers):
    a, b = servers
    A, B = a.server_port, b.server_port
    sb = fork(ws, "--net", f"allow:localhost:{A},{os.uname().nodename}:{A}")
    attack = f"""
import os, socket
port = int(os.environ["HTTP_PROXY"].rsplit(":", 1)[1])
def ask(data, then=None):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(data)
    if then is not None:
        first = s.recv(4096)
        if not first.startswith(b"HTTP/1.1 200"):
            return first
        s.sendall(then)
    out = b""
    while True:
        c = s.recv(65536)
        if not c:
            return out
        out += c
def status(b):
    return b.split(b"\\r\\n", 1)[0].decode()
print("connect-denied", status(ask(b"CONNECT localhost:{B} HTTP/1.1\\r\\nHost: localhost:{B}\\r\\n\\r\\n")))
got = ask(b"CONNECT localhost:{A} HTTP/1.1\\r\\nHost: localhost:{B}\\r\\n\\r\\n",
          b"GET /tunnel HTTP/1.1\\r\\nHost: localhost:{B}\\r\\nConnection: close\\r\\n\\r\\n")
print("host-differs", got.rsplit(b"\\r\\n", 1)[-1].decode())
print("plain-host-differs", status(ask(b"GET http://localhost:{A}/p HTTP/1.1\\r\\nHost: localhost:{B}\\r\\n\\r\\n")))
print("rebinding", status(ask(b"CONNECT {os.uname().nodename}:{A} HTTP/1.1\\r\\n\\r\\n")))
print("address-of-name", status(ask(b"CONNECT 127.0.0.1:{A} HTTP/1.1\\r\\n\\r\\n")))
"""
    r = petri("run", sb, "--", PY, "-c", attack, cwd=ws)
    assert r.rc == 0, r
    got = dict(ln.split(" ", 1) for ln in r.out.splitlines())
    assert got["connect-denied"].startswith("HTTP/1.1 403"), r.out
    assert got["host-differs"] == "A /tunnel", r.out  # the tunnel's end is its CONNECT target, only
    assert got["plain-host-differs"].startswith("HTTP/1.1 400"), r.out
    assert got["address-of-name"].startswith("HTTP/1.1 403"), r.out
    resolved = [ln.split()[0] for ln in subprocess.run(["getent", "ahosts", os.uname().nodename], capture_output=True,
                                                          text=True).stdout.splitlines()]
    # a listed name that the host resolves to its own loopback
    if resolved and all(x.startswith("127.") or x == "::1" for x in resolved):
        assert got["rebinding"].startswith("HTTP/1.1 403"), r.out
        assert any("a local address" in e["reason"] for e in denied_events(ws))
    assert b.seen == [] and a.seen == ["/tunnel"]


@pytest.mark.parametrize("bad, says", [
    ("allow:", "needs at least one"),
    ("allow:127.0.0.1:99999", "1-65535"),
    ("allow:http://localhost:8000", "no scheme"),
])
def test_a_bad_allow_list_is_one_line_and_no_sandbox(ws, bad, says):
    r = petri("fork", "--net", bad, cwd=ws)
    assert r.rc == 2 and says in r.err and len(r.err.strip().splitlines()) == 1, r
    assert petri("ls", "--json", cwd=ws).json["sandboxes"] == []


def test_the_proxy_is_made_again_after_kill_9_and_gone_after_a_killed_petri_and_gc(ws, servers):
    a, _ = servers
    sb = fork(ws, "--net", f"allow:127.0.0.1:{a.server_port}", "--label", "k9")
    get = ["curl", "-s", "--noproxy", "", f"http://127.0.0.1:{a.server_port}/k"]
    assert petri("run", "k9", "--", *get, cwd=ws).out == "A /k"
    first = env_state(ws, sb)
    os.kill(first["proxy"][0], signal.SIGKILL)
    r = petri("run", "k9", "--", *get, cwd=ws)
    assert r.rc == 0 and r.out == "A /k", r
    second = env_state(ws, sb)
    assert second["proxy"] != first["proxy"] and second["holder"] == first["holder"]
    # petri killed -9 just after it marked the sandbox destroyed: gc finds what is left
    r = petri("rm", "k9", cwd=ws, env={"PETRI_FAULT_KILL_AT": "destroy-marked:1"})
    assert r.rc == -signal.SIGKILL, r
    assert _start_time(second["proxy"][0]) == second["proxy"][1]  # still there...
    assert petri("gc", "--json", cwd=ws).rc == 0
    assert_gone(second)  # ...until gc
    assert not (ws / ".petri" / "env" / f"{sb}.json").exists()


# ---------------------------------------------------------------------------- a real project


@pytest.fixture(scope="module")
def downloaded():
    try:
        return R.fetch_all()
    except R.RegistryUnreachable as e:
        pytest.skip(str(e))


def test_a_real_project_installs_from_the_one_index_it_may_reach(btrfs_dir, downloaded, servers):
    """chardet's checkout: inside, pip takes iniconfig (which its pytest needs) from a package
    index on the host's loopback that only the allow-list reaches, then the project's own tests
    run on it; the same pip against the other server is refused."""
    _, wheels = downloaded
    index = btrfs_dir / "index"
    for w in wheels:
        name = w.name.split("-")[0]
        (index / "simple" / name).mkdir(parents=True)
        shutil.copy(w, index / "simple" / name / w.name)
        (index / "simple" / name / "index.html").write_text(f'<a href="{w.name}">{w.name}</a>\n')
    handler = lambda *a, **k: http.server.SimpleHTTPRequestHandler(*a, directory=str(index), **k)  # noqa: E731
    idx = serve(handler, "index")
    _, other = servers
    ws = btrfs_dir / "chardet-5.2.0"
    R.build_workspace(ws)
    try:
        assert petri("init", "--convert", "--json", cwd=ws).rc == 0
        sb = fork(ws, "--net", f"allow:127.0.0.1:{idx.server_port}")
        pip = (".venv/bin/python -m pip install -q --disable-pip-version-check --no-deps --index-url"
               " http://127.0.0.1:{}/simple/ iniconfig")
        script = (".venv/bin/python -m pip uninstall -q -y iniconfig && "
                  f"! .venv/bin/python -c 'import iniconfig' 2>/dev/null && "
                  f"{{ {pip.format(other.server_port)} 2>/dev/null; echo other=$?; }} && "
                  f"{pip.format(idx.server_port)} && "
                  ".venv/bin/python -m pytest -q -p no:cacheprovider test.py -k utf-8")
        r = petri("run", sb, "--env", "NO_PROXY=", "--env", "no_proxy=", "--env", "PIP_CONFIG_FILE=/dev/null",
                  "--", "sh", "-c", script, cwd=ws, timeout=600)
        assert r.rc == 0, r
        assert "other=1" in r.out and " passed" in r.out, r.out
        assert other.seen == []
        assert (ws / ".venv" / "lib").exists() and not any(e["sandbox"] != sb for e in denied_events(ws))
        assert any(e["port"] == other.server_port for e in denied_events(ws))
        d = petri("diff", sb, "--stat", "--include-ignored", "--json", cwd=ws)
        assert any("iniconfig" in f["path"] for f in d.json["files"]), d  # the install is the sandbox's
    finally:
        petri("deinit", "--force", cwd=ws)
        idx.shutdown()
        idx.server_close()


# ---------------------------------------------------------------------------- a normal user


def test_as_a_normal_user_on_fuse(user_tmp, unprivileged_user, servers):
    from tests.helpers.loopfs import run_as
    from tests.helpers.rootless import own

    a, b = servers
    user = unprivileged_user
    w = user_tmp / "proj"
    w.mkdir()
    (w / "README").write_text("rootless\n")
    own(user_tmp, user)

    def p(*args):
        return run_as(user, [sys.executable, "-m", "orchestrator.cli", *args], cwd=str(w),
                      env={"PYTHONDONTWRITEBYTECODE": "1"})

    assert p("init").returncode == 0
    try:
        r = p("fork", "--net", f"allow:127.0.0.1:{a.server_port}", "--json")
        assert r.returncode == 0, r.stderr
        sb = json.loads(r.stdout)["sandboxes"][0]["id"]
        r = p("run", sb, "--", "sh", "-c", CURL + f"code --noproxy '' http://127.0.0.1:{a.server_port}/u; "
              f"code --noproxy '' http://127.0.0.1:{b.server_port}/u")
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines()[0] == "200 A /u" and r.stdout.splitlines()[1].startswith("403 "), r.stdout
        st = env_state(w, sb)
        pid = st["proxy"][0]
        assert os.stat(f"/proc/{pid}").st_uid == user.uid  # the user's own proxy
        assert p("rm", sb).returncode == 0
        assert_gone(st)
        assert b.seen == []
    finally:
        p("deinit", "--force")


def test_a_races_candidates_get_the_allow_list(ws, servers):
    a, b = servers
    check = f"curl -sf --noproxy '' http://127.0.0.1:{a.server_port}/race"
    r = petri("race", "--net", f"allow:127.0.0.1:{a.server_port}", "--check", check, "--cmd", "true", "--json",
              cwd=ws, timeout=300)
    assert r.rc == 0 and r.json["winner"], r
    check = f"curl -sf --noproxy '' http://127.0.0.1:{b.server_port}/race"
    r = petri("race", "--net", f"allow:127.0.0.1:{a.server_port}", "--check", check, "--cmd", "true", "--json",
              cwd=ws, timeout=300)
    assert r.rc == 1 and r.json["winner"] is None, r
    assert "/race" in a.seen and b.seen == []


def test_the_api_takes_an_allow_list_in_limits(ws, servers):
    import petri as api

    a, b = servers
    w = api.open(ws)
    with w.fork(limits=api.Limits(net=f"allow:127.0.0.1:{a.server_port}")) as sbs:
        assert w.status(sbs[0]).to_json()["sandboxes"][0]["limits"]["net_allow"] == [f"127.0.0.1:{a.server_port}"]
        r = sbs[0].run(["sh", "-c", CURL + f"code --noproxy '' http://127.0.0.1:{a.server_port}/api; "
                        f"code --noproxy '' http://127.0.0.1:{b.server_port}/api"], timeout=60)
        assert r.exit_code == 0
        out = r.stdout().splitlines()
        assert out[0] == "200 A /api" and out[1].startswith("403 "), out
    assert b.seen == []


def test_the_proxy_ends_with_the_sandboxs_lifetime(ws, servers):
    a, _ = servers
    sb = fork(ws, "--net", f"allow:127.0.0.1:{a.server_port}", "--ttl", "4s")
    assert petri("run", sb, "--", "curl", "-s", "--noproxy", "", f"http://127.0.0.1:{a.server_port}/t",
                 cwd=ws).out == "A /t"
    st = env_state(ws, sb)
    time.sleep(5)
    assert petri("ls", "--json", cwd=ws).rc == 0  # any command expires what is overdue
    assert_gone(st)
