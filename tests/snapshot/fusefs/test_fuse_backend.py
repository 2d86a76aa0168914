"""The fuse backend through the Backend protocol: clone/destroy, a dead daemon restarted by
ensure_clone, frozen and snapshot views, the journal readers, leftovers for gc.
(The shared conformance suite runs it too: tests/snapshot/test_backend_conformance.py.)"""
from __future__ import annotations

import os
import signal
import time

import pytest

from snapshot.backends.fuse import FuseBackend
from snapshot.fusefs import daemon as D
from snapshot.osutil import mounts
from snapshot.store import Store
from tests.conftest import stop_fuse_under

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def ws(tmp_path):
    ok, why = FuseBackend.available(tmp_path)
    if not ok:
        pytest.skip(f"fuse: {why}")
    w = tmp_path / "ws"
    w.mkdir()
    (w / "A").write_bytes(b"a\n")
    (w / "B").write_bytes(b"b\n")
    (w / "dir").mkdir()
    (w / "dir/c").write_bytes(b"c\n")
    b = FuseBackend()
    store = Store(w)
    b.create_store(store)
    made: list[str] = []
    try:
        yield b, store, made
    finally:
        for sb in made:
            b.destroy_clone(store, sb)
        stop_fuse_under(tmp_path, [store.root])


def test_clone_write_destroy(ws):
    b, store, made = ws
    b.snapshot(store, "s1", None)
    made.append("sb1")
    tree = b.clone(store, "s1", "sb1")
    assert D.is_mounted(tree.parent) and (tree / "A").read_bytes() == b"a\n"  # a directory of its host's mount
    (tree / "A").write_bytes(b"changed\n")
    assert (store.workspace / "A").read_bytes() == b"a\n"
    assert (store.sandbox_dir("sb1") / "upper/A").read_bytes() == b"changed\n"
    assert b.daemon_health(store, "sb1") == "ok"
    with b.frozen_view(store, "sb1") as fv:
        (tree / "A").write_bytes(b"after freeze\n")
        assert (fv / "A").read_bytes() == b"changed\n" and (fv / "dir/c").read_bytes() == b"c\n"
        with pytest.raises(OSError):
            (fv / "new").write_bytes(b"x")
    with b.snapshot_view(store, "s1") as sv:
        assert (sv / "A").read_bytes() == b"a\n"
    b.destroy_clone(store, "sb1")
    made.remove("sb1")
    assert not tree.exists() and not store.sandbox_dir("sb1").exists()
    deadline = time.monotonic() + 10  # its host, with nothing left to serve, is retired and unmounts
    while D.is_mounted(tree.parent) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [m for m in mounts() if m.source == D.FSNAME and m.mountpoint.startswith(os.fsencode(store.root))]


def test_read_set_and_changed_paths(ws):
    b, store, made = ws
    b.snapshot(store, "s1", None)
    made.append("sb1")
    tree = b.clone(store, "s1", "sb1")
    (tree / "A").read_bytes()
    (tree / "dir/new").write_bytes(b"n")
    assert b.read_set(store, "sb1") == frozenset({b"A"})
    ch = b.changed_paths(store, "sb1", verify=True)
    assert b"dir/new" in ch.paths and b"B" not in ch.paths


def test_ensure_clone_restarts_a_dead_daemon(ws):
    b, store, made = ws
    b.snapshot(store, "s1", None)
    made.append("sb1")
    tree = b.clone(store, "s1", "sb1", disk_budget=1 << 20)
    (tree / "kept").write_bytes(b"k")
    pid = int((tree.parent.parent / "daemon.pid").read_text())  # its host's
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while b.daemon_health(store, "sb1") != "dead" and time.monotonic() < deadline:
        time.sleep(0.02)
    assert b.daemon_health(store, "sb1") == "dead"
    assert b.ensure_clone(store, "sb1") == tree
    assert b.daemon_health(store, "sb1") == "ok"
    assert (tree / "kept").read_bytes() == b"k"
    with pytest.raises(OSError):  # the budget came back with the restart
        (tree / "big").write_bytes(b"x" * (2 << 20))


def test_leftovers_find_and_remove_an_orphan_mount(ws):
    b, store, made = ws
    b.snapshot(store, "s1", None)
    made.append("sb1")
    tree = b.clone(store, "s1", "sb1")
    found = b.leftovers(store, {"s1"}, set())
    kinds = {(lo.kind, lo.path) for lo in found}
    assert ("mount", tree) in kinds and ("tree", store.sandbox_dir("sb1")) in kinds
    for lo in found:
        b.remove_leftover(store, lo)
    made.remove("sb1")
    assert not tree.exists() and not store.sandbox_dir("sb1").exists()
    assert b.leftovers(store, {"s1"}, set()) == []


def test_a_sandbox_of_an_earlier_petri_moves_into_a_host_when_served_again(ws):
    """An earlier petri's record has no slot (its daemon mounted sandboxes/<id>/tree); with
    that daemon gone, ensure_clone serves it in a host and records the slot."""
    import json

    from snapshot.fusefs import client as C
    b, store, made = ws
    b.snapshot(store, "s1", None)
    made.append("sb1")
    tree = b.clone(store, "s1", "sb1")
    (tree / "kept").write_bytes(b"k")
    record = store.sandbox_dir("sb1") / "mount.json"
    rec = json.loads(record.read_text())
    C.host_request(tree.parent.parent, {"op": "remove", "name": "sb1"})
    del rec["slot"]
    record.write_text(json.dumps(rec))
    assert b.daemon_health(store, "sb1") == "unmounted"  # its old mount point: nothing there
    again = b.ensure_clone(store, "sb1")
    assert again.parent.name == "mnt" and (again / "kept").read_bytes() == b"k"
    assert json.loads(record.read_text())["slot"] is not None and b.daemon_health(store, "sb1") == "ok"
