"""A sandbox's environment end to end: one network namespace and one /tmp for every run,
shell, MCP call and service of a sandbox; services that outlive petri; ports published on the
host's loopback; all of it gone at `rm`, expiry, `deinit` and `gc` (also after petri was
killed), and nothing of one sandbox reachable from another or from the host's loopback
unless published.

The project is a real one from PyPI (chardet 5.2.0's sdist with its .venv: tests/helpers/realproj.py,
cached) on a btrfs loop image; its own files are what the server serves. A second set runs
petri as a normal user on the fuse backend. Network traffic stays on loopback: in the
sandboxes' own namespaces, and on the host's for the published port and the host-side
server of the isolation test.
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from orchestrator.sandbox import cgroups
from orchestrator.sandbox.environment import _start_time
from tests.helpers import realproj as R
from tests.conftest import petri

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (btrfs loop image, cgroups, a test user)"),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap not found (bubblewrap)"),
    pytest.mark.skipif(shutil.which("nsenter") is None, reason="nsenter not found (util-linux)"),
]

PY = "/usr/bin/python3"
FETCH = ("import sys, urllib.request\n"
         "try:\n"
         "    print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode(), end='')\n"
         "except OSError as e:\n"
         "    print('REFUSED', e, file=sys.stderr); sys.exit(7)\n")


@pytest.fixture(scope="module")
def downloaded() -> None:
    try:
        R.fetch_all()
    except R.RegistryUnreachable as e:
        pytest.skip(str(e))


@pytest.fixture
def project(btrfs_dir, downloaded):
    """chardet's tree with its .venv as a btrfs workspace; after the test nothing of any of
    its sandboxes may be left: process, mount, cgroup, environment."""
    ws = btrfs_dir / "chardet-5.2.0"
    R.build_workspace(ws)
    r = petri("init", "--convert", "--json", cwd=ws)
    assert r.rc == 0, r
    seen: list[dict] = []
    try:
        yield ws, seen
    finally:
        ids = [s["id"] for s in (petri("ls", "--all", "--json", cwd=ws).json or {}).get("sandboxes", [])]
        for s in ids:
            seen.append(env_state(ws, s))
        petri("deinit", "--force", cwd=ws)
        for st in seen:
            assert_env_gone(st)
        left = [str(d) for _, d in cgroups.list_cgroups("petri") if any(i in str(d) for i in ids)]
        assert left == [], left


def env_state(ws: Path, sb: str) -> dict:
    """What a sandbox's environment is made of now (pids with start times, its mount), and
    its services' supervisors: what must be gone once the sandbox is."""
    st: dict = {"sandbox": sb, "pids": [], "mounts": []}
    try:
        env = json.loads((ws / ".petri" / "env" / f"{sb}.json").read_text())
    except FileNotFoundError:
        env = None
    if env:
        st["pids"].append((env["holder_pid"], env["holder_start"]))
        st["pids"] += [(p["pid"], p["start"]) for p in env["ports"]]
        if env.get("mounted"):
            st["mounts"].append(env["root"])
    d = ws / ".petri" / "services" / sb
    for f in d.glob("*.json") if d.is_dir() else []:
        rec = json.loads(f.read_text())
        if rec.get("supervisor_pid"):
            st["pids"].append((rec["supervisor_pid"], rec["supervisor_start"]))
    return st


def mountpoints() -> set[str]:
    with open("/proc/self/mountinfo") as f:
        return {line.split()[4] for line in f}


def assert_env_gone(st: dict, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while True:
        alive = [pid for pid, start in st["pids"] if start is not None and _start_time(pid) == start]
        mounted = [m for m in st["mounts"] if m in mountpoints()]
        if not alive and not mounted:
            return
        if time.monotonic() > end:
            raise AssertionError(f"{st['sandbox']}: left behind: processes {alive}, mounts {mounted}")
        time.sleep(0.05)


def fetch_in(ws: Path, sb: str, url: str):
    return petri("run", sb, "--", PY, "-c", FETCH, url, cwd=ws)


def wait_served(ws: Path, sb: str, url: str, timeout: float = 30.0):
    end = time.monotonic() + timeout
    while True:
        r = fetch_in(ws, sb, url)
        if r.rc == 0 or time.monotonic() > end:
            return r
        time.sleep(0.3)


def free_host_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def host_get(port: int, path: str = "/") -> bytes:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5).read()


def test_a_service_is_reached_by_later_runs_a_shell_mcp_and_the_host_then_rm_ends_it(project):
    ws, seen = project
    sb = petri("fork", "--label", "web", "--json", cwd=ws).json["sandboxes"][0]["id"]
    # A file of the project, changed in the sandbox only: what the server serves is the sandbox's.
    readme = (ws / "README.rst").read_text()
    r = petri("run", "web", "--", "sh", "-c", "echo '# served from the sandbox' >> README.rst", cwd=ws)
    assert r.rc == 0, r
    r = petri("run", "--detach", "--name", "http", "web", "--", ".venv/bin/python", "-m", "http.server", "8000",
              "--bind", "127.0.0.1", cwd=ws)
    assert r.rc == 0, r  # the petri command that started it has ended
    url = "http://127.0.0.1:8000/README.rst"
    got = wait_served(ws, "web", url)
    assert got.rc == 0, got
    assert got.out == readme + "# served from the sandbox\n"

    # /tmp lasts between runs too.
    assert petri("run", "web", "--", "sh", "-c", "echo kept > /tmp/note", cwd=ws).rc == 0
    r = petri("run", "web", "--", "cat", "/tmp/note", cwd=ws)
    assert r.rc == 0 and r.out == "kept\n", r

    # curl, where the host has it (the sandbox sees the host's /usr).
    if shutil.which("curl"):
        r = petri("run", "web", "--", "curl", "-sf", url, cwd=ws)
        assert r.rc == 0 and r.out.endswith("# served from the sandbox\n"), r

    # A shell of the sandbox.
    from tests.helpers.pty_drive import drive
    script = (f"{PY} -c 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1]).read()[-26:])' "
              f"{url}; echo SHELL-DONE\n")
    code, out = drive(["shell", "web"], ws, script.encode(), until=b"SHELL-DONE")
    assert code == 3, out[-800:]
    assert b"# served from the sandbox" in out, out[-800:]

    # An MCP call of the sandbox.
    from tests.helpers.mcp_client import client

    async def mcp_call():
        async with client(ws) as c:
            doc = await c.call("sandbox_run", {"sandbox": "web", "argv": [PY, "-c", FETCH, url]})
            listed = await c.call("sandbox_service_list", {"sandbox": "web"})
            # A service started through MCP: reached by a run, then stopped.
            started = await c.call("sandbox_service_start", {"sandbox": "web", "name": "second", "argv": [
                PY, "-m", "http.server", "8010", "--bind", "127.0.0.1"]})
            second = None
            for _ in range(100):
                second = await c.call("sandbox_run", {"sandbox": "web", "argv": [PY, "-c", FETCH,
                                                                                  "http://127.0.0.1:8010/README.rst"]})
                if second["exit_code"] == 0:
                    break
                await asyncio.sleep(0.3)
            stopped = await c.call("sandbox_service_stop", {"sandbox": "web", "name": "second"})
            return doc, listed, started, second, stopped

    doc, listed, started, second, stopped = asyncio.run(mcp_call())
    assert doc["exit_code"] == 0 and doc["stdout_tail"].endswith("# served from the sandbox\n"), doc.get("setup_error")
    assert [(s["name"], s["state"]) for s in listed["services"]] == [("http", "running")]
    assert started["state"] == "running" and second["exit_code"] == 0, (started, second)
    assert stopped["state"] == "stopped", stopped
    assert fetch_in(ws, "web", "http://127.0.0.1:8010/").rc == 7

    # The host, through a published port.
    host_port = free_host_port()
    r = petri("port", "web", "8000", "--host-port", str(host_port), "--json", cwd=ws)
    assert r.rc == 0 and r.json["host_port"] == host_port, r
    assert host_get(host_port, "/README.rst").decode().endswith("# served from the sandbox\n")
    r = petri("services", "web", "--json", cwd=ws)
    by_name = {s["name"]: s for s in r.json["services"]}
    svc = by_name["http"]
    assert svc["state"] == "running" and svc["ports"] == [8000] and svc["exit_code"] is None, svc
    assert by_name["second"]["state"] == "stopped", by_name
    status = petri("status", "web", "--json", cwd=ws).json["sandboxes"][0]
    assert status["ports"] == [{"port": 8000, "host_port": host_port}], status
    assert sorted(s["name"] for s in status["services"]) == ["http", "second"]

    # rm ends it all: the server, the relay, the namespace's holder, /tmp.
    st = env_state(ws, sb)
    alive = [pid for pid, start in st["pids"] if _start_time(pid) == start]
    assert len(alive) == 3, st  # holder, relay, the running service's supervisor
    assert petri("rm", "web", cwd=ws).rc == 0
    assert_env_gone(st)
    with pytest.raises(OSError):
        host_get(host_port)
    seen.append(st)


def test_a_process_a_run_leaves_running_ends_with_the_run(project):
    """A run keeps its own pid namespace (as documented): `&` does not outlive it; a service does."""
    ws, _ = project
    petri("fork", "--label", "bg", cwd=ws)
    r = petri("run", "bg", "--", "sh", "-c", f"{PY} -m http.server 8001 --bind 127.0.0.1 >/dev/null 2>&1 & "
              "sleep 1", cwd=ws)
    assert r.rc == 0, r
    r = fetch_in(ws, "bg", "http://127.0.0.1:8001/")
    assert r.rc == 7 and "REFUSED" in r.err, r


def test_no_sandbox_reaches_another_or_the_hosts_loopback(project):
    ws, _ = project
    sbs = petri("fork", "-n", "2", "--label", "iso", "--json", cwd=ws).json["sandboxes"]
    a, b = sbs[0]["id"], sbs[1]["id"]
    assert petri("run", "--detach", a, "--", PY, "-m", "http.server", "8002", "--bind", "127.0.0.1", cwd=ws).rc == 0
    assert wait_served(ws, a, "http://127.0.0.1:8002/").rc == 0
    host_port = free_host_port()
    assert petri("port", a, "8002", "--host-port", str(host_port), cwd=ws).rc == 0
    assert host_get(host_port)  # published: the host reaches it
    # b: neither a's server nor a's published port (127.0.0.1 inside b is b's own).
    for url in ("http://127.0.0.1:8002/", f"http://127.0.0.1:{host_port}/"):
        r = fetch_in(ws, b, url)
        assert r.rc == 7 and "REFUSED" in r.err, (url, r)
    # A server on the host's own loopback is reached by neither.
    srv = subprocess.Popen([PY, "-m", "http.server", "0", "--bind", "127.0.0.1"], cwd=ws,
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = srv.stdout.readline()  # "Serving HTTP on 127.0.0.1 port N (...)"
        hp = int(line.split(" port ")[1].split()[0])
        assert host_get(hp)
        for sb in (a, b):
            r = fetch_in(ws, sb, f"http://127.0.0.1:{hp}/")
            assert r.rc == 7 and "REFUSED" in r.err, (sb, r)
    finally:
        srv.kill()
        srv.wait()


def test_restart_on_failure_then_stop(project):
    ws, _ = project
    petri("fork", "--label", "rs", cwd=ws)
    r = petri("--json", "run", "--detach", "--name", "flaky", "--restart", "on-failure", "rs", "--", "sh", "-c",
              "echo run >> /tmp/count; exit 3", cwd=ws)
    assert r.rc == 0, r
    end = time.monotonic() + 20
    svc = None
    while time.monotonic() < end:
        (svc,) = petri("services", "rs", "--json", cwd=ws).json["services"]
        if svc["restarts"] >= 2:
            break
        time.sleep(0.3)
    assert svc["restarts"] >= 2 and svc["exit_code"] in (3, None), svc
    r = petri("stop", "rs", "flaky", "--json", cwd=ws)
    assert r.rc == 0 and r.json["state"] == "stopped", r
    n = int(petri("run", "rs", "--", "sh", "-c", "wc -l < /tmp/count", cwd=ws).out)
    time.sleep(2.5)  # longer than the next back-off: a stopped service is not started again
    assert int(petri("run", "rs", "--", "sh", "-c", "wc -l < /tmp/count", cwd=ws).out) == n
    # A server that is stopped: TERM, and it is gone.
    assert petri("run", "--detach", "--name", "srv", "rs", "--", PY, "-m", "http.server", "8003", "--bind",
                 "127.0.0.1", cwd=ws).rc == 0
    assert wait_served(ws, "rs", "http://127.0.0.1:8003/").rc == 0
    # ls counts the running services (flaky was stopped, srv runs), in JSON and in its SVC column
    (row,) = [d for d in petri("ls", "--json", cwd=ws).json["sandboxes"] if d["label"] == "rs"]
    assert row["services_running"] == 1, row
    head, *rows = petri("ls", cwd=ws).out.splitlines()
    cells = dict(zip(head.split(), next(r for r in rows if " rs " in r).split(), strict=False))
    assert cells["SVC"] == "1", (head, rows)
    r = petri("stop", "rs", "srv", "--json", cwd=ws)
    assert r.rc == 0 and r.json["state"] == "stopped", r
    assert fetch_in(ws, "rs", "http://127.0.0.1:8003/").rc == 7
    (row,) = [d for d in petri("ls", "--json", cwd=ws).json["sandboxes"] if d["label"] == "rs"]
    assert row["services_running"] == 0 and "SVC" not in petri("ls", cwd=ws).out.splitlines()[0], row
    r = petri("logs", "rs", "--service", "srv", cwd=ws)
    assert r.rc == 0 and "GET / HTTP" in r.err, r
    r = petri("stop", "rs", "nope", cwd=ws)
    assert r.rc == 2 and "no service named nope" in r.err, r


def test_the_lifetime_ends_services_and_the_environment(project):
    ws, seen = project
    sb = petri("fork", "--label", "ttl", "--ttl", "4s", "--json", cwd=ws).json["sandboxes"][0]["id"]
    assert petri("run", "--detach", "ttl", "--", "sleep", "600", cwd=ws).rc == 0
    st = env_state(ws, sb)
    assert len(st["pids"]) == 2, st
    time.sleep(5)
    assert petri("ls", "--json", cwd=ws).rc == 0  # any command expires what is overdue
    assert_env_gone(st)
    seen.append(st)


def test_killed_petri_leaves_nothing_once_the_sandbox_is_gone(project):
    ws, seen = project
    sb = petri("fork", "--label", "k9", "--json", cwd=ws).json["sandboxes"][0]["id"]
    assert petri("run", "--detach", "k9", "--", PY, "-m", "http.server", "8004", "--bind", "127.0.0.1",
                 cwd=ws).rc == 0
    assert petri("port", "k9", "8004", "--host-port", str(free_host_port()), cwd=ws).rc == 0
    # A petri killed -9 in the middle of a run...
    p = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "run", "k9", "--", "sleep", "600"], cwd=ws,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(2)
    p.send_signal(signal.SIGKILL)
    p.wait()
    # ... and another killed -9 just after it marked the sandbox destroyed.
    st = env_state(ws, sb)
    r = petri("rm", "k9", cwd=ws, env={"PETRI_FAULT_KILL_AT": "destroy-marked:1"})
    assert r.rc == -signal.SIGKILL, r
    r = petri("gc", "--json", cwd=ws)
    assert r.rc == 0, r
    assert_env_gone(st)
    assert not (ws / ".petri" / "env" / f"{sb}.json").exists()
    seen.append(st)


def test_deinit_force_ends_a_running_service(project):
    ws, seen = project
    sb = petri("fork", "--label", "di", "--json", cwd=ws).json["sandboxes"][0]["id"]
    assert petri("run", "--detach", "di", "--", "sleep", "600", cwd=ws).rc == 0
    st = env_state(ws, sb)
    assert petri("deinit", "--force", cwd=ws).rc == 0
    assert_env_gone(st)
    assert petri("init", "--json", cwd=ws).rc == 0  # for the fixture's own deinit


# ---------------------------------------------------------------------------- a normal user


def test_as_a_normal_user_on_fuse(user_tmp, unprivileged_user):
    from tests.helpers.loopfs import run_as
    from tests.helpers.rootless import own

    user = unprivileged_user
    ws = user_tmp / "proj"
    ws.mkdir()
    (ws / "index.html").write_text("hello from the sandbox\n")
    own(user_tmp, user)

    def p(*args):
        return run_as(user, [sys.executable, "-m", "orchestrator.cli", *args], cwd=str(ws),
                      env={"PYTHONDONTWRITEBYTECODE": "1"})

    assert p("init").returncode == 0
    try:
        sb = json.loads(p("fork", "--label", "u", "--json").stdout)["sandboxes"][0]["id"]
        r = p("run", "--detach", "u", "--", PY, "-m", "http.server", "8005", "--bind", "127.0.0.1")
        assert r.returncode == 0, r.stderr
        end = time.monotonic() + 30
        while True:
            r = p("run", "u", "--", PY, "-c", FETCH, "http://127.0.0.1:8005/index.html")
            if r.returncode == 0 or time.monotonic() > end:
                break
            time.sleep(0.3)
        assert r.returncode == 0 and r.stdout == "hello from the sandbox\n", r.stderr
        host_port = free_host_port()
        r = p("port", "u", "8005", "--host-port", str(host_port))
        assert r.returncode == 0, r.stderr
        assert host_get(host_port, "/index.html") == b"hello from the sandbox\n"
        st = env_state(ws, sb)
        assert len(st["pids"]) == 3 and st["mounts"] == [], st  # rootless: /tmp is a store directory
        assert p("rm", "u").returncode == 0
        assert_env_gone(st)
        with pytest.raises(OSError):
            host_get(host_port)
    finally:
        p("deinit", "--force")


# ---------------------------------------------------------------------------- host variables, secrets


def test_env_pass_and_secrets_reach_the_command_and_nothing_else(project, tmp_path):
    ws, seen = project
    token = "tok-" + os.urandom(12).hex()
    from_env = "env-" + os.urandom(12).hex()
    (tmp_path / "token").write_text(token + "\n")
    (ws / ".petri" / "config.toml").write_text('env_pass = ["CI"]\n')
    env = {"CI": "1", "PETRI_TEST_PASSED": "yes", "PETRI_TEST_NOT": "no", "MY_TOKEN": from_env}
    r = petri("fork", "--label", "sec", "--json", "--env-pass", "PETRI_TEST_P*", "--secret",
              f"TOKEN=@{tmp_path / 'token'}", "--secret", "FROM_ENV=env:MY_TOKEN", cwd=ws, env=env)
    assert r.rc == 0, r
    sb = r.json["sandboxes"][0]["id"]
    script = ("echo CI=$CI P=$PETRI_TEST_PASSED N=${PETRI_TEST_NOT:-unset} M=${MY_TOKEN:-unset}; "
              "stat -c '%a %U' /run/secrets/TOKEN; cat /run/secrets/TOKEN; cat /run/secrets/FROM_ENV; echo; "
              "cat /proc/1/cmdline; echo; "
              "echo written > tree-file")
    r = petri("run", "sec", "--", "sh", "-c", script, cwd=ws, env=env)
    assert r.rc == 0, r
    lines = r.out.splitlines()
    assert lines[0] == "CI=1 P=yes N=unset M=unset", lines
    assert lines[1].startswith("400 "), lines  # readable by the command only
    assert lines[2] == "***" and lines[3] == "***", lines  # the values reached it; the saved output masks them
    assert token not in r.out and from_env not in r.out
    # A service sees them too, and its log is masked as well.
    assert petri("run", "--detach", "--name", "leak", "sec", "--", "sh", "-c",
                 "cat /run/secrets/TOKEN; sleep 600", cwd=ws).rc == 0
    time.sleep(1.5)
    svc = petri("logs", "sec", "--service", "leak", cwd=ws)
    assert svc.out.strip() == "***", svc
    # Never stored: not in the registry, the audit trail, the events, the logs, the tree, a diff.
    store = ws / ".petri"
    for f in [store / "registry.db", store / "events.jsonl", *store.glob("logs/**/*"), *Path(
            petri("status", "sec", "--json", cwd=ws).json["sandboxes"][0]["path"]).rglob("*")]:
        if f.is_file():
            data = f.read_bytes()
            assert token.encode() not in data and from_env.encode() not in data, f
    for cmd in (["log", "--json"], ["diff", "sec"], ["status", "sec", "--json"], ["logs", "sec", "--json"]):
        r = petri(*cmd, cwd=ws)
        assert r.rc == 0 and token not in r.out and from_env not in r.out, (cmd, r)
    # Nor in a promotion: what reaches the workspace is the tree's change, never a secret.
    r = petri("promote", "sec", cwd=ws)
    assert r.rc == 1 and "service leak is running" in r.err, r  # a service is a running command
    assert petri("stop", "sec", "leak", cwd=ws).rc == 0
    r = petri("promote", "sec", "--json", cwd=ws)
    assert r.rc == 0 and "tree-file" in r.json["applied"], r
    assert (ws / "tree-file").read_text() == "written\n"
    for f in ws.rglob("*"):
        if f.is_file() and ".petri" not in f.parts and ".venv" not in f.parts:
            data = f.read_bytes()
            assert token.encode() not in data and from_env.encode() not in data, f
    # Nor on any command line of the host while a run holds the secret.
    p = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "run", "sec", "--", "sleep", "5"], cwd=ws,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(2)
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                assert token.encode() not in cmdline and from_env.encode() not in cmdline, pid
    finally:
        p.wait()
    st = env_state(ws, sb)
    assert petri("rm", "sec", cwd=ws).rc == 0
    assert not (store / "secrets" / sb).exists()
    assert_env_gone(st)
    seen.append(st)
    # A bad reference is refused whole, and makes nothing.
    r = petri("fork", "--secret", "X=plain-value", cwd=ws)
    assert r.rc == 2 and "never the secret itself" in r.err, r
    r = petri("fork", "--secret", "X=env:PETRI_TEST_UNSET_VAR", cwd=ws)
    assert r.rc == 2 and "is not set" in r.err, r
