"""The zfs backend: its pure parsers everywhere, the real thing where ZFS exists (a pool on
a sparse file made here); elsewhere those tests skip with ``available()``'s own reason."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from snapshot.backend import Backend
from snapshot.backends import zfs as Z
from snapshot.errors import SnapshotError
from snapshot.store import Store

# -- pure parts ------------------------------------------------------------------------------

MOUNTINFO = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
90 22 0:50 / /tank/ws rw,relatime shared:40 - zfs tank/ws rw,xattr,noacl
91 90 0:51 / /tank/ws/.petri rw,relatime shared:41 - zfs tank/ws/petri-store rw,xattr,noacl
92 22 0:52 / /srv/with\\040space rw shared:42 - zfs tank/sp\\040ace rw
93 22 0:53 / /tank/over rw shared:43 - zfs tank/over rw
94 22 0:54 / /tank/over rw shared:44 - tmpfs tmpfs rw
"""


def test_dataset_from_mountinfo():
    assert Z.dataset_from_mountinfo(MOUNTINFO, "/tank/ws") == "tank/ws"
    assert Z.dataset_from_mountinfo(MOUNTINFO, "/tank/ws/.petri") == "tank/ws/petri-store"
    assert Z.dataset_from_mountinfo(MOUNTINFO, "/srv/with space") == "tank/sp ace"
    assert Z.dataset_from_mountinfo(MOUNTINFO, "/") is None  # ext4
    assert Z.dataset_from_mountinfo(MOUNTINFO, "/tank/ws/sub") is None  # not a mountpoint
    assert Z.dataset_from_mountinfo(MOUNTINFO, "/tank/over") is None  # covered by tmpfs


def test_parse_list():
    out = "tank\t/tank\ntank/ws\t/tank/ws\ntank/legacy\tlegacy\n"
    assert Z.parse_list(out) == [("tank", "/tank"), ("tank/ws", "/tank/ws"), ("tank/legacy", "legacy")]


def test_unescape_diff_path():
    assert Z.unescape_diff_path("/a/with\\0040space") == b"/a/with space"
    assert Z.unescape_diff_path("/nl\\0012x") == b"/nl\nx"
    assert Z.unescape_diff_path("/bad\\0377utf8") == b"/bad\xffutf8"
    assert Z.unescape_diff_path("/back\\0134slash") == b"/back\\slash"
    assert Z.unescape_diff_path("/plain\\x") == b"/plain\\x"  # not an escape: kept
    # Releases before OpenZFS 2.0 wrote three digits.
    assert Z.unescape_diff_path("/old\\040form\\377") == b"/old form\xff"


def test_parse_diff():
    out = ("M\t/\t/tank/.petri/sandboxes/sb-1/tree/\n"
           "M\tF\t/tank/.petri/sandboxes/sb-1/tree/linked\t(+1)\n"
           "R\tF\t/tank/.petri/sandboxes/sb-1/tree/old\t/tank/.petri/sandboxes/sb-1/tree/new\\0040name\n"
           "-\t@\t/tank/ws/gone-link\n"
           "+\t/\t/tank/.petri/sandboxes/sb-1/tree/newdir\n")
    roots = [b"/tank/.petri/sandboxes/sb-1/tree", b"/tank/ws"]
    assert Z.parse_diff(out, roots) == [
        Z.ZfsChange("M", "F", b"linked"),
        Z.ZfsChange("R", "F", b"old", b"new name"),
        Z.ZfsChange("-", "@", b"gone-link"),
        Z.ZfsChange("+", "/", b"newdir"),
    ]
    with pytest.raises(SnapshotError):
        Z.parse_diff("garbage\n", roots)


def test_ids_that_cannot_be_zfs_names_are_refused():
    for bad in ("s-1/../x", "s@1", "", " s"):
        with pytest.raises(SnapshotError):
            Z._check_id(bad)
    assert Z._check_id("sb-0a1b2c") == "sb-0a1b2c"


def test_protocol_and_probe_on_a_non_zfs_directory(tmp_path):
    assert isinstance(Z.ZfsBackend(), Backend)
    ok, why = Z.ZfsBackend.available(tmp_path)
    assert not ok
    assert why == "zfs command not found" if shutil.which("zfs") is None else why.startswith("not a zfs dataset")


# -- the real thing ----------------------------------------------------------------------------

@pytest.fixture
def zfs_workspace(tmp_path):
    """A dataset mounted as a workspace, on a throwaway pool backed by a sparse file."""
    if shutil.which("zfs") is None:
        pytest.skip("zfs command not found")
    if shutil.which("zpool") is None:
        pytest.skip("zpool command not found")
    if os.geteuid() != 0:
        pytest.skip("creating a test zfs pool needs root")
    pool = f"petri-test-{os.getpid()}-{os.urandom(3).hex()}"
    image = Path("/var/tmp") / f"{pool}.img"
    with open(image, "wb") as f:
        f.truncate(512 << 20)
    mnt = tmp_path / "pool"
    r = subprocess.run(["zpool", "create", "-m", str(mnt), pool, str(image)], capture_output=True, text=True)
    if r.returncode != 0:
        image.unlink()
        pytest.skip(f"not a zfs dataset: zpool create failed ({r.stderr.strip()})")
    try:
        ws = mnt / "ws"
        subprocess.run(["zfs", "create", "-o", f"mountpoint={ws}", f"{pool}/ws"], check=True)
        yield ws
    finally:
        subprocess.run(["zpool", "destroy", "-f", pool], capture_output=True)
        image.unlink(missing_ok=True)


def _skip_unless_available(path: Path) -> None:
    ok, why = Z.available(path)
    if not ok:
        pytest.skip(why)


def test_lifecycle(zfs_workspace):
    _skip_unless_available(zfs_workspace)
    ws = zfs_workspace
    (ws / "a.txt").write_text("alpha\n")
    os.link(ws / "a.txt", ws / "a-link")
    b, store = Z.ZfsBackend(), Store(ws)
    b.create_store(store)
    (store.root / "registry.db").write_text("rows")
    b.snapshot(store, "s-1", None)
    with b.snapshot_view(store, "s-1") as view:
        assert (view / "a.txt").read_text() == "alpha\n"
        assert os.listdir(view / ".petri") == []  # the store dataset is not in the snapshot
    (ws / "a.txt").write_text("live edit\n")
    t1, t2 = b.clone(store, "s-1", "sb-1"), b.clone(store, "s-1", "sb-2")
    assert (t1 / "a.txt").read_text() == "alpha\n"
    assert os.lstat(t1 / "a.txt").st_ino == os.lstat(t1 / "a-link").st_ino
    (t1 / "a.txt").write_text("sandbox\n")
    (t1 / "new").write_text("n")
    assert (t2 / "a.txt").read_text() == "alpha\n" and (ws / "a.txt").read_text() == "live edit\n"
    kinds = {(c.kind, c.path) for c in b.changes(store, "s-1", "sb-1")}
    assert ("M", b"a.txt") in kinds and ("+", b"new") in kinds
    with b.frozen_view(store, "sb-1") as frozen:
        (t1 / "late").write_text("l")
        assert (frozen / "a.txt").read_text() == "sandbox\n" and not (frozen / "late").exists()
    assert b.snapshot_bytes(store, "s-1") is not None
    assert b.ensure_clone(store, "sb-1") == t1
    assert b.leftovers(store, {"s-1"}, {"sb-1"}) == [
        Z.Leftover("tree", store.sandbox_dir("sb-2"))]
    b.remove_leftover(store, Z.Leftover("tree", store.sandbox_dir("sb-2")))
    b.destroy_clone(store, "sb-1")
    b.delete_snapshot(store, "s-1")
    b.delete_snapshot(store, "s-1")
    assert b.leftovers(store, set(), set()) == []
    b.destroy_store(store)
    assert not store.root.exists()


def test_conformance(zfs_workspace):
    _skip_unless_available(zfs_workspace)
    from snapshot import conformance as C

    C.make_sample_tree(zfs_workspace)
    case = C.Case(Z.ZfsBackend(), zfs_workspace)
    try:
        for check in C.CHECKS:
            check(case)
        C.check_ignored_and_special(case, keeps_hardlinks=True, keeps_sparse=True)
    finally:
        case.cleanup()
