"""The per-store fork server for FUSE daemons (snapshot/fusefs/server.py) with real mounts:
clones are forked from it, it serves concurrent clones, exits when idle (its daemons live
on), is stopped by destroy_store and gc, falls back to a fresh daemon when it cannot be
used, reports a daemon's mount failure, and pid files survive pid reuse."""
from __future__ import annotations

import os
import signal
import stat
import threading
import time
from pathlib import Path

import pytest

from snapshot.backends.fuse import FuseBackend
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
        b = FuseBackend(**kw)
        backends.append(b)
        return b

    FuseBackend().create_store(store)
    FuseBackend().snapshot(store, "s1", None)
    try:
        yield make, store
    finally:
        stop_fuse_under(tmp_path, [store.root])


def _pid(store: Store, sb: str) -> int:
    pid = D.daemon_pid(store.sandbox_dir(sb) / "daemon.pid", store.sandbox_tree(sb))
    assert pid is not None
    return pid


def test_clones_are_forked_by_the_server_and_destroy_store_stops_it(ws):
    make, store = ws
    b = make()
    tree = b.clone(store, "s1", "sb1")
    assert (tree / "A").read_bytes() == b"a\n"
    server = S.server_pid(store.root)
    assert server is not None
    pid = _pid(store, "sb1")
    assert b"snapshot.fusefs.server" in _cmdline(pid) and pid != server
    assert Path(f"/proc/{pid}/comm").read_text().strip() == "petri-fuse"
    assert os.getsid(pid) == pid  # its own session: a signal to the server's group misses it
    sock = os.lstat(store.root / S.SOCK)
    assert stat.S_ISSOCK(sock.st_mode) and stat.S_IMODE(sock.st_mode) == 0o600
    assert b.daemon_health(store, "sb1") == "ok"
    # a second clone reuses the same server
    b.clone(store, "s1", "sb2")
    assert S.server_pid(store.root) == server and b"snapshot.fusefs.server" in _cmdline(_pid(store, "sb2"))
    b.destroy_store(store)
    assert not D.is_mounted(tree) and not store.root.exists()
    assert not D._alive(server) and not D._alive(pid)


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
        assert (store.sandbox_tree(f"sb{i}") / "A").read_bytes() == b"a\n"
        assert b"snapshot.fusefs.server" in _cmdline(_pid(store, f"sb{i}"))
    assert len({p.name for p in store.root.glob("fuse.pid")}) == 1 and server is not None
    for i in range(6):
        b.destroy_clone(store, f"sb{i}")


def test_idle_server_exits_and_its_daemons_live_on(ws):
    make, store = ws
    b = make(server_idle=0.5)
    tree = b.clone(store, "s1", "sb1")
    server = S.server_pid(store.root)
    assert server is not None
    assert _wait(lambda: not D._alive(server))
    assert not (store.root / S.SOCK).exists() and not (store.root / S.PIDFILE).exists()
    (tree / "A").write_bytes(b"still served\n")
    assert b.daemon_health(store, "sb1") == "ok"
    # the next clone starts a new server
    b.clone(store, "s1", "sb2")
    assert S.server_pid(store.root) not in (None, server)
    b.destroy_clone(store, "sb1")
    b.destroy_clone(store, "sb2")


def test_a_killed_server_leaves_a_stale_socket_that_the_next_clone_replaces(ws):
    make, store = ws
    b = make()
    b.clone(store, "s1", "sb1")
    server = S.server_pid(store.root)
    os.kill(server, signal.SIGKILL)
    assert _wait(lambda: not D._alive(server))
    assert (store.root / S.SOCK).exists()  # nobody unlinked it
    b.clone(store, "s1", "sb2")
    new = S.server_pid(store.root)
    assert new not in (None, server) and b"snapshot.fusefs.server" in _cmdline(_pid(store, "sb2"))
    assert b.daemon_health(store, "sb1") == "ok"  # the first daemon never depended on the server
    b.destroy_clone(store, "sb1")
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


def test_unusable_server_falls_back_to_a_fresh_daemon(ws):
    make, store = ws
    (store.root / S.SOCK).mkdir()  # the server cannot bind its socket here
    b = make()
    tree = b.clone(store, "s1", "sb1")
    pid = _pid(store, "sb1")
    assert b"snapshot.fusefs.daemon" in _cmdline(pid) and b"snapshot.fusefs.server" not in _cmdline(pid)
    assert (tree / "A").read_bytes() == b"a\n"
    b.destroy_clone(store, "sb1")


def test_a_daemon_that_cannot_mount_is_reported_not_retried(ws, tmp_path):
    make, store = ws
    spec = D.MountSpec(lowers=(tmp_path / "ws",), mountpoint=tmp_path / "no-such-dir",
                       log=tmp_path / "d.log", pidfile=tmp_path / "d.pid")
    with pytest.raises(D.DaemonFailed):
        D.start(spec, timeout=10, server=store.root)
    assert S.server_pid(store.root) is not None  # the server itself is fine
    assert (tmp_path / "d.log").read_text().count("daemon failed before mounting") == 1  # no second try
    assert not (tmp_path / "d.pid").exists()


def test_pid_file_identity_survives_pid_reuse(ws, tmp_path):
    make, store = ws
    b = make()
    b.clone(store, "s1", "sb1")
    pidfile = store.sandbox_dir("sb1") / "daemon.pid"
    pid = _pid(store, "sb1")
    ident = pidfile.with_name("daemon.pid.start")
    real = ident.read_text()
    ident.write_text(f"{pid} 1\n")  # same pid, another process's start time
    assert D.daemon_pid(pidfile, store.sandbox_tree("sb1")) is None
    ident.write_text(real)
    assert D.daemon_pid(pidfile, store.sandbox_tree("sb1")) == pid
    b.destroy_clone(store, "sb1")


def test_a_server_running_older_code_is_replaced(ws):
    make, store = ws
    b = make()
    b.clone(store, "s1", "sb1")
    old = S.server_pid(store.root)
    module = Path(S.__file__).with_name("journal.py")
    st = module.stat()
    os.utime(module, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # "upgraded" on disk
    try:
        b.clone(store, "s1", "sb2")
        new = S.server_pid(store.root)
        assert _wait(lambda: not D._alive(old)) and new not in (None, old)
        assert b"snapshot.fusefs.server" in _cmdline(_pid(store, "sb2"))
    finally:
        os.utime(module, ns=(st.st_atime_ns, st.st_mtime_ns))
    b.destroy_clone(store, "sb1")
    b.destroy_clone(store, "sb2")
