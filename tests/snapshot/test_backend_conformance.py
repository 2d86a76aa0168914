"""The behavioural checker (snapshot/conformance.py) against every backend, on the real
filesystem each one needs: btrfs and XFS on loop devices, kernel overlay on the host."""
from __future__ import annotations

import os
import shutil

import pytest

from snapshot import conformance as C
from snapshot.choose import backend_class

# (backend, where its workspace lives, keeps hard links, keeps sparse files)
BACKENDS = {
    "copy": ("host", True, True),
    "reflink": ("xfs", True, True),
    "btrfs": ("btrfs", True, True),
    "overlay": ("host", True, True),
    "fuse": ("host", True, True),
    "zfs": ("zfs", True, True),
}


@pytest.fixture(params=list(BACKENDS))
def case(request, tmp_path):
    name = request.param
    where = BACKENDS[name][0]
    try:
        cls = backend_class(name)
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"{name}: {e}")
    if where == "zfs":
        ok, why = cls.available(tmp_path)
        pytest.skip(f"zfs: {why}")
    if where == "btrfs":
        base = request.getfixturevalue("btrfs_dir")
        import btrfsutil
        ws = base / "ws"
        btrfsutil.create_subvolume(str(ws))
    elif where == "xfs":
        ws = request.getfixturevalue("xfs_dir") / "ws"
        ws.mkdir()
    else:
        ws = tmp_path / "ws"
        ws.mkdir()
    if name not in ("copy", "reflink"):
        ok, why = cls.available(ws)
        if not ok:
            pytest.skip(f"{name}: {why}")
    C.make_sample_tree(ws)
    c = C.Case(cls(), ws)
    c.name = name
    c.keeps = BACKENDS[name][1:]
    try:
        yield c
    finally:
        c.cleanup()
        c.backend.destroy_store(c.store)


def test_clone_is_exact(case):
    C.check_clone_is_exact(case)


def test_point_in_time(case):
    C.check_point_in_time(case)


def test_isolation(case):
    C.check_isolation(case)


def test_ignored_files_links_modes_sparse_odd_names(case):
    keeps_hardlinks, keeps_sparse = case.keeps
    C.check_ignored_and_special(case, keeps_hardlinks=keeps_hardlinks, keeps_sparse=keeps_sparse)


def test_snapshot_chain(case):
    C.check_snapshot_chain(case)


def test_read_views(case):
    C.check_read_views(case)


def test_destroy_leaves_nothing(case):
    C.check_destroy_leaves_nothing(case)


def test_fork_of_fork_three_generations(case):
    C.check_fork_of_fork(case)
    case.cleanup()
    assert case.backend.leftovers(case.store, set(), set()) == []


def test_usage(case):
    # btrfs without quotas needs root for its tree search; everything else can always tell
    C.check_usage(case, can_tell=case.name != "btrfs" or os.geteuid() == 0)


def test_restore_snapshot_exactly(case):
    """Snapshot, damage live in every way, restore: live equals the snapshot again."""
    from snapshot.restore import execute_restore, plan_restore
    ws = case.workspace
    before = C.manifest(ws, frozenset({b".petri", b".git"}))
    sid = case.snapshot()
    (ws / "README.md").write_bytes(b"damaged\n")
    os.chmod(ws / "src/run.sh", 0o644)
    os.unlink(ws / "src/link-to-app")
    os.symlink("elsewhere", ws / "src/link-to-app")
    shutil.rmtree(ws / "empty")
    (ws / "brand-new-dir").mkdir()
    (ws / "brand-new-dir/x").write_bytes(b"x")
    os.unlink(ws / "src/app.py")
    (ws / "src/app.py").mkdir()  # file replaced by a directory
    shutil.rmtree(ws / "node_modules")
    (ws / "node_modules").write_bytes(b"dir became a file")
    os.unlink(os.path.join(os.fsencode(ws), b"odd/new\nline.txt"))
    with case.backend.snapshot_view(case.store, sid) as view:
        ops = plan_restore(bytes(view), bytes(ws))
        changed, left = execute_restore(ops, bytes(view), bytes(ws), case.store.journal, "r-conformance")
    assert left == []
    after = C.manifest(ws, frozenset({b".petri", b".git"}))
    problems = C.diff_manifests(before, after)
    assert not problems, "\n".join(problems[:20])
    assert b"README.md" in changed and b"brand-new-dir" in changed
    with case.backend.snapshot_view(case.store, sid) as view:
        assert plan_restore(bytes(view), bytes(ws)) == [], "a second restore must find nothing to do"
