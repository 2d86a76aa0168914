"""The per-store fork server and its hosts (snapshot/fusefs/server.py, host.py) with real
mounts: sandboxes are directories of hosts' mounts, hosts forked by the server, several
sandboxes per host and a host per CPU first; it serves concurrent clones, exits when idle
once no host is left, is stopped by destroy_store and gc, falls back to a host of its own
when it cannot be used, reports a host's mount failure, and pid files survive pid reuse.
Failures stay where they happen: removing one sandbox leaves its host serving the others; a
killed host takes only its own sandboxes (brought back at the same paths by ensure_clone); a
killed server takes none, and the next one adopts its hosts; gc after either leaves no mount
and no process."""
from __future__ import annotations

import json
import os
import signal
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from snapshot.backends.fuse import FuseBackend, FuseMountFailed
from snapshot.fusefs import client as C
from snapshot.fusefs import daemon as D
from snapshot.fusefs import server as S
from snapshot.store import Store
from tests.conftest import stop_fuse_under

pytestmark = pytest.mark.timeout(120)


def _cmdline(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes()


def _wait(pred, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


@pytest.fixture
def ws(tmp_path):
    ok, why = FuseBackend.available(tmp_path)
    if not ok:
        pytest.skip(f"fuse: {why}")
    w = tmp_path / "ws"
    w.mkdir()
    (w / "A").write_bytes(b"a\n")
    store = Store(w)
    backends: list[FuseBackend] = []

    def make(**kw) -> FuseBackend:
        # A loaded machine (the suite's workers beside the test VM) may take the default 15 s
        # to start the server or a host, and then petri rightly serves the sandbox from a host
        # of its own: these tests are about the server, so they give it time.
        kw.setdefault("start_timeout", 60.0)
        b = FuseBackend(**kw)
        backends.append(b)
        return b

    FuseBackend().create_store(store)
    FuseBackend().snapshot(store, "s1", None)
    try:
        yield make, store
    finally:
        stop_fuse_under(tmp_path, [store.root])


def _tree(b: FuseBackend, store: Store, sb: str) -> Path:
    return b._tree(store, sb, b._record(store, sb))


def _slot(b: FuseBackend, store: Store, sb: str) -> Path:
    return _tree(b, store, sb).parent.parent


def _pid(b: FuseBackend, store: Store, sb: str) -> int:
    pid = C.host_pid(_slot(b, store, sb))
    assert pid is not None
    return pid


def _hosts(store: Store) -> dict[int, int]:
    """The server's hosts: pid -> sandboxes."""
    reply = S.request(store.root, {"op": "ping"}, start=False)
    return {h["pid"]: h["load"] for h in reply["hosts"]}


def _cpus() -> int:
    return len(os.sched_getaffinity(0))


def test_clones_are_served_by_hosts_forked_by_the_server_and_destroy_store_stops_them(ws):
    make, store = ws
    b = make()
    tree = b.clone(store, "s1", "sb1")
    assert tree == store.root / "fuse" / "0" / "mnt" / "sb1"  # a directory of its host's mount
    assert (tree / "A").read_bytes() == b"a\n"
    assert D.is_mounted(tree.parent) and not D.is_mounted(tree)
    server = S.server_pid(store.root)
    assert server is not None
    pid = _pid(b, store, "sb1")
    assert b"snapshot.fusefs.server" in _cmdline(pid) and pid != server
    assert Path(f"/proc/{pid}/comm").read_text().strip() == "petri-fuse-host"
    assert os.getsid(pid) == pid  # its own session: a signal to the server's group misses it
    ctl = os.lstat(_slot(b, store, "sb1") / "host.sock")  # the host's control socket
    assert stat.S_ISSOCK(ctl.st_mode) and stat.S_IMODE(ctl.st_mode) == 0o600
    sock = os.lstat(store.root / S.SOCK)
    assert stat.S_ISSOCK(sock.st_mode) and stat.S_IMODE(sock.st_mode) == 0o600
    assert b.daemon_health(store, "sb1") == "ok" and b.ensure_clone(store, "sb1") == tree
    # a second clone reuses the same server
    tree2 = b.clone(store, "s1", "sb2")
    assert S.server_pid(store.root) == server and b"snapshot.fusefs.server" in _cmdline(_pid(b, store, "sb2"))
    pids = {pid, _pid(b, store, "sb2")}
    b.destroy_store(store)
    assert not D.is_mounted(tree.parent) and not D.is_mounted(tree2.parent) and not store.root.exists()
    assert not D._alive(server) and _wait(lambda: not any(D._alive(p) for p in pids))


def test_concurrent_clones(ws):
    make, store = ws
    b = make()
    errors: list[BaseException] = []

    def go(i: int) -> None:
        try:
            b.clone(store, "s1", f"sb{i}")
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    server = S.server_pid(store.root)
    for i in range(6):
        assert (_tree(b, store, f"sb{i}") / "A").read_bytes() == b"a\n"
        assert b"snapshot.fusefs.server" in _cmdline(_pid(b, store, f"sb{i}"))
    assert server is not None and sum(_hosts(store).values()) == 6
    for i in range(6):
        b.destroy_clone(store, f"sb{i}")


def test_idle_server_exits_once_its_hosts_are_gone(ws):
    make, store = ws
    b = make(server_idle=0.5)
    tree = b.clone(store, "s1", "sb1")
    server = S.server_pid(store.root)
    host = _pid(b, store, "sb1")
    assert server is not None
    time.sleep(1.5)  # idle, but a host still serves a sandbox: new ones go to it
    assert D._alive(server) and S.server_pid(store.root) == server
    (tree / "A").write_bytes(b"still served\n")
    b.destroy_clone(store, "sb1")
    assert _wait(lambda: not D._alive(host))  # retired with its last sandbox
    assert not D.is_mounted(tree.parent)
    assert _wait(lambda: not D._alive(server))
    assert not (store.root / S.SOCK).exists() and not (store.root / S.PIDFILE).exists()
    # the next clone starts a new server
    b.clone(store, "s1", "sb2")
    assert S.server_pid(store.root) not in (None, server)
    b.destroy_clone(store, "sb2")


def test_a_killed_server_leaves_a_stale_socket_and_the_next_adopts_its_hosts(ws):
    make, store = ws
    b = make()
    b.clone(store, "s1", "sb1")
    host = _pid(b, store, "sb1")
    server = S.server_pid(store.root)
    os.kill(server, signal.SIGKILL)
    assert _wait(lambda: not D._alive(server))
    assert (store.root / S.SOCK).exists()  # nobody unlinked it
    assert b.daemon_health(store, "sb1") == "ok"  # a host never depended on the server
    b.clone(store, "s1", "sb2")
    new = S.server_pid(store.root)
    assert new not in (None, server) and b"snapshot.fusefs.server" in _cmdline(_pid(b, store, "sb2"))
    assert _hosts(store).get(host) == 1  # adopted, with the sandbox it serves
    b.destroy_clone(store, "sb1")
    assert _wait(lambda: _hosts(store).get(host) is None)  # and retired by the new server
    b.destroy_clone(store, "sb2")


def test_gc_stops_the_server_once_no_sandbox_is_left(ws):
    make, store = ws
    b = make()
    b.clone(store, "s1", "sb1")
    server = S.server_pid(store.root)
    assert b.reap_processes(store, {"sb1"}) == 0 and D._alive(server)
    b.destroy_clone(store, "sb1")
    assert b.leftovers(store, {"s1"}, set()) == []  # a server is no leftover on disk
    assert b.reap_processes(store, set()) == 1
    assert not D._alive(server) and S.server_pid(store.root) is None
    assert not (store.root / S.SOCK).exists()
    assert b.reap_processes(store, set()) == 0


def test_unusable_server_falls_back_to_a_host_of_its_own(ws):
    make, store = ws
    (store.root / S.SOCK).mkdir()  # the server cannot bind its socket here
    b = make()
    tree = b.clone(store, "s1", "sb1")
    pid = _pid(b, store, "sb1")
    assert b"snapshot.fusefs.host" in _cmdline(pid) and b"snapshot.fusefs.server" not in _cmdline(pid)
    assert (tree / "A").read_bytes() == b"a\n"
    tree2 = b.clone(store, "s1", "sb2")
    assert tree2.parent != tree.parent  # each its own host: nobody places them together
    b.destroy_clone(store, "sb1")
    assert _wait(lambda: not D._alive(pid)) and not D.is_mounted(tree.parent)  # it ends with its sandbox
    b.destroy_clone(store, "sb2")


def test_a_host_that_cannot_mount_is_reported_and_nothing_is_left(ws):
    make, store = ws
    slot = store.root / "fuse" / "0"
    slot.mkdir(parents=True)
    (slot / "mnt").write_bytes(b"not a directory")
    b = make()
    with pytest.raises(FuseMountFailed) as e:
        b.clone(store, "s1", "sb1")
    assert "slot 0" in str(e.value)
    assert S.server_pid(store.root) is not None  # the server itself is fine
    assert not store.sandbox_dir("sb1").exists()
    assert "host failed before mounting" in (slot / "host.log").read_text()


def test_host_pid_file_identity_survives_pid_reuse(ws):
    make, store = ws
    b = make()
    b.clone(store, "s1", "sb1")
    slot = _slot(b, store, "sb1")
    pid = _pid(b, store, "sb1")
    ident = slot / "daemon.pid.start"
    real = ident.read_text()
    ident.write_text(f"{pid} 1\n")  # same pid, another process's start time
    assert C.host_pid(slot) is None
    ident.write_text(real)
    assert C.host_pid(slot) == pid
    b.destroy_clone(store, "sb1")


def _clone_with(pkg: Path, store: Store, sb: str) -> None:
    """Clone ``sb`` from a petri whose ``snapshot`` package is the copy under ``pkg`` (the
    server it starts runs that copy too: its child_env puts the copy first)."""
    code = ("import sys; from pathlib import Path; from snapshot.backends.fuse import FuseBackend; "
            "from snapshot.store import Store; "
            "FuseBackend(start_timeout=60.0).clone(Store(Path(sys.argv[1])), 's1', sys.argv[2])")
    env = {**os.environ, "PYTHONPATH": str(pkg)}
    r = subprocess.run([sys.executable, "-P", "-c", code, str(store.workspace), sb], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


def test_a_server_running_older_code_is_replaced(ws, tmp_path):
    # The "upgrade" is made to a copy of the package: touching the checkout's own files would
    # make every fork server that other tests run at the same time refuse their clients.
    make, store = ws
    pkg = tmp_path / "pkg"
    shutil.copytree(Path(S.__file__).parents[2] / "snapshot", pkg / "snapshot",
                    ignore=shutil.ignore_patterns("__pycache__"))
    _clone_with(pkg, store, "sb1")
    old = S.server_pid(store.root)
    assert old is not None and str(pkg).encode() in Path(f"/proc/{old}/environ").read_bytes()
    module = pkg / "snapshot" / "fusefs" / "journal.py"
    st = module.stat()
    os.utime(module, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # "upgraded" on disk
    _clone_with(pkg, store, "sb2")
    new = S.server_pid(store.root)
    assert _wait(lambda: not D._alive(old)) and new not in (None, old)
    b = make()
    assert b"snapshot.fusefs.server" in _cmdline(_pid(b, store, "sb2"))
    b.destroy_clone(store, "sb1")
    b.destroy_clone(store, "sb2")


def test_sandboxes_share_hosts_a_host_per_cpu_first(ws):
    make, store = ws
    b = make(server_per_host=2)
    n = _cpus() * 2 + 1
    for i in range(n):
        b.clone(store, "s1", f"sb{i}")
    pids = [_pid(b, store, f"sb{i}") for i in range(n)]
    assert len(set(pids[:_cpus()])) == _cpus()  # the first ones each get a host: every core serves
    hosts = _hosts(store)
    assert sorted(hosts) == sorted(set(pids)) and len(hosts) == _cpus() + 1
    assert sorted(hosts.values()) == sorted(pids.count(p) for p in hosts) and max(hosts.values()) == 2
    for i in range(n):
        assert (_tree(b, store, f"sb{i}") / "A").read_bytes() == b"a\n"
    for i in range(n):
        b.destroy_clone(store, f"sb{i}")
    assert _wait(lambda: not any(D._alive(p) for p in pids)) and _wait(lambda: _hosts(store) == {})
    assert not [m for m in D.mounts() if m.mountpoint.startswith(os.fsencode(store.root))]


def _two_on_one_host(b: FuseBackend, store: Store) -> tuple[str, str]:
    """Clone until two sandboxes share a host; returns their ids."""
    seen: dict[int, str] = {}
    for i in range(_cpus() + 2):
        b.clone(store, "s1", f"sb{i}")
        pid = _pid(b, store, f"sb{i}")
        if pid in seen:
            return seen[pid], f"sb{i}"
        seen[pid] = f"sb{i}"
    raise AssertionError("no two sandboxes on one host")


def test_removing_one_sandbox_leaves_its_host_serving_the_others(ws):
    make, store = ws
    b = make()
    one, other = _two_on_one_host(b, store)
    host = _pid(b, store, one)
    t_one, t_other = _tree(b, store, one), _tree(b, store, other)
    (t_one / "mine").write_bytes(b"1")
    with open(t_other / "A", "rb") as kept_open:  # the other's open file goes on working
        b.destroy_clone(store, one)
        assert not t_one.exists() and not store.sandbox_dir(one).exists()
        assert D._alive(host) and b.daemon_health(store, other) == "ok"
        assert kept_open.read() == b"a\n"
    (t_other / "new").write_bytes(b"n")
    assert (t_other / "new").read_bytes() == b"n" and sorted(os.listdir(t_other.parent)) == [other]


def test_a_killed_host_takes_only_its_own_sandboxes_and_they_come_back_at_their_paths(ws):
    make, store = ws
    b = make()
    one, other = _two_on_one_host(b, store)
    (_tree(b, store, other) / "kept").write_bytes(b"k")
    victim = _pid(b, store, one)
    ids = [f"sb{i}" for i in range(_cpus() + 2) if store.sandbox_dir(f"sb{i}").exists()]
    elsewhere = [sb for sb in ids if _pid(b, store, sb) != victim]
    trees = {sb: _tree(b, store, sb) for sb in ids}
    os.kill(victim, signal.SIGKILL)
    assert _wait(lambda: not D._alive(victim))
    assert b.daemon_health(store, one) == "dead" and b.daemon_health(store, other) == "dead"
    assert elsewhere and all(b.daemon_health(store, sb) == "ok" for sb in elsewhere)
    assert _wait(lambda: victim not in _hosts(store))  # the server saw it go
    assert b.ensure_clone(store, one) == trees[one]  # a new host in the same slot...
    assert b.daemon_health(store, one) == "ok" and _pid(b, store, one) != victim
    assert b.daemon_health(store, other) == "ok"  # ...serves all of the slot's sandboxes again
    assert (trees[other] / "kept").read_bytes() == b"k" and b.ensure_clone(store, other) == trees[other]
    assert {sb: _tree(b, store, sb) for sb in ids} == trees


def test_a_host_outlives_its_server(ws):
    make, store = ws
    b = make()
    one, other = _two_on_one_host(b, store)
    host = _pid(b, store, one)
    server = S.server_pid(store.root)
    os.kill(server, signal.SIGKILL)
    assert _wait(lambda: not D._alive(server))
    b.destroy_clone(store, one)  # the host would report the sandbox ended to a server that is gone
    assert D._alive(host) and b.daemon_health(store, other) == "ok"
    assert (_tree(b, store, other) / "A").read_bytes() == b"a\n"
    slot = _slot(b, store, other)
    b.destroy_clone(store, other)
    assert _wait(lambda: not D._alive(host))  # its last sandbox gone and no server: it ends
    assert not D.is_mounted(slot / "mnt")


def test_a_client_gone_before_its_answer_does_not_take_the_host_down(ws, tmp_path):
    make, store = ws
    b = make()
    ids = [f"sb{i}" for i in range(_cpus() + 1)]
    for sb in ids:
        b.clone(store, "s1", sb)
    hosts = {_pid(b, store, sb) for sb in ids}
    lower = tmp_path / "raw-lower"
    lower.mkdir()
    spec = D.MountSpec(lowers=(lower,), mountpoint=lower)
    msg = {"op": "add", "name": "raw", "argv": spec.sandbox_args(), "host": spec.host_options(),
           "code": S.code_stamp()}
    with socket.socket(socket.AF_UNIX) as s:  # ask, and hang up before the answer comes
        s.connect(str(store.root / S.SOCK))
        s.sendall(json.dumps(msg).encode() + b"\n")
    assert _wait(lambda: any((store.root / "fuse" / str(k) / "mnt" / "raw").exists() for k in range(4)))
    time.sleep(0.5)  # the host has answered into the closed connection by now
    assert all(D._alive(h) for h in hosts)  # EPIPE, not SIGPIPE: no host died of it
    assert all(b.daemon_health(store, sb) == "ok" for sb in ids)
    found = b.leftovers(store, {"s1"}, set(ids))  # served, yet no sandbox's: gc's to remove
    assert [lo.path.name for lo in found if lo.kind == "mount"] == ["raw"]
    b.remove_leftover(store, found[0])
    assert not found[0].path.exists() and all(b.daemon_health(store, sb) == "ok" for sb in ids)


def test_gc_after_a_killed_server_or_host_leaves_no_mount_and_no_process(ws):
    make, store = ws
    b = make()
    one, other = _two_on_one_host(b, store)
    ids = [f"sb{i}" for i in range(_cpus() + 2) if store.sandbox_dir(f"sb{i}").exists()]
    hosts = {_pid(b, store, sb) for sb in ids}
    victim = _pid(b, store, one)
    served_by = {sb: _pid(b, store, sb) for sb in ids}
    os.kill(victim, signal.SIGKILL)
    server = S.server_pid(store.root)
    os.kill(server, signal.SIGKILL)
    assert _wait(lambda: not D._alive(server) and not D._alive(victim))
    for sb in ids:
        assert b.daemon_health(store, sb) == ("dead" if served_by[sb] == victim else "ok"), sb
    # the registry forgets them all (as expiry does), then gc: nothing of ours is left
    found = b.leftovers(store, {"s1"}, set())
    assert {lo.kind for lo in found} == {"mount", "tree"}
    for lo in found:
        b.remove_leftover(store, lo)
    b.reap_processes(store, set())
    assert b.leftovers(store, {"s1"}, set()) == []
    assert _wait(lambda: not any(D._alive(p) for p in hosts))
    assert not [m for m in D.mounts() if m.mountpoint.startswith(os.fsencode(store.root))]


def test_a_project_with_its_own_snapshot_package_does_not_shadow_petris(ws, tmp_path, monkeypatch):
    # petri runs from inside the user's project: a top-level ``snapshot`` (or ``orchestrator``)
    # package there must not be what the server and its hosts import (python -P).
    make, store = ws
    proj = tmp_path / "proj"
    (proj / "snapshot").mkdir(parents=True)
    (proj / "snapshot" / "__init__.py").write_text("raise SystemExit('the project\\'s snapshot package')\n")
    monkeypatch.chdir(proj)
    b = make()
    tree = b.clone(store, "s1", "sb1")
    assert (tree / "A").read_bytes() == b"a\n" and S.server_pid(store.root) is not None
    b2 = make(fork_server=False)
    tree2 = b2.clone(store, "s1", "sb2")  # a host of its own, started the same way
    assert (tree2 / "A").read_bytes() == b"a\n"
    b.destroy_clone(store, "sb1")
    b2.destroy_clone(store, "sb2")
