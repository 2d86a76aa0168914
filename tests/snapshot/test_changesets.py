"""The fast paths give exactly the change set of the full manifest compare, on every backend
that has one (btrfs generations and inode keys, the overlay upper dir, the fuse journal),
for a sandbox edited in every way a change set can tell; on btrfs also with writes still in
the page cache or not yet committed, hard links, renames and a fork of a fork."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from orchestrator import changesets as CS
from orchestrator.engine import Engine


def w(p: Path, data: bytes | str, mode: int | None = None) -> None:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data.encode() if isinstance(data, str) else data)
    if mode is not None:
        os.chmod(p, mode)


def make_base(root: Path) -> None:
    for i in range(30):
        w(root / "src" / f"m{i}.py", f"def f{i}():\n    return {i}\n")
    w(root / "keep" / "deep" / "a.txt", "a\n")
    w(root / "gone" / "x.txt", "x\n")
    w(root / "gone" / "sub" / "y.txt", "y\n")
    w(root / "moveme" / "one.txt", "one\n")
    w(root / "same.txt", "same\n")
    w(root / "touched.txt", "touched\n")
    w(root / "tool.sh", "#!/bin/sh\n", 0o644)
    w(root / "becomes_dir", "file\n")
    (root / "becomes_file").mkdir()
    w(root / "becomes_file" / "inner.txt", "inner\n")
    (root / "modedir").mkdir()
    w(root / "modedir" / "k.txt", "k\n")
    w(root / "binary.bin", bytes(range(256)) * 4)
    os.symlink("same.txt", root / "link")
    w(root / ".gitignore", "*.pyc\nbuild/\n")
    w(root / b"name with\nnewline \xff".decode("utf-8", "surrogateescape"), "odd\n")
    (root / ".git").mkdir()
    w(root / ".git" / "HEAD", "ref: refs/heads/main\n")


def edit_sandbox(t: Path) -> None:
    w(t / "src" / "m3.py", "def f3():\n    return 333\n")
    (t / "src" / "m4.py").unlink()
    w(t / "src" / "new.py", "new\n")
    shutil.rmtree(t / "gone")
    shutil.move(t / "moveme", t / "moved")  # overlay: a dir rename is EXDEV (redirect_dir=nofollow)
    os.rename(t / "src" / "m5.py", t / "src" / "m5_renamed.py")
    os.utime(t / "touched.txt")
    w(t / "same.txt", "same\n")  # rewritten, equal bytes
    os.chmod(t / "tool.sh", 0o755)
    (t / "becomes_dir").unlink()
    w(t / "becomes_dir" / "now.txt", "now\n")
    shutil.rmtree(t / "becomes_file")
    w(t / "becomes_file", "now a file\n")
    os.chmod(t / "modedir", 0o700)
    w(t / "binary.bin", bytes(range(255, -1, -1)) * 4)
    os.unlink(t / "link")
    os.symlink("touched.txt", t / "link")
    (t / "empty_new_dir").mkdir()
    w(t / "build" / "out.o", "ignored\n")
    w(t / "src" / "m1.pyc", "ignored\n")
    w(t / ".git" / "HEAD", "ref: refs/heads/other\n")
    w(t / b"caf\xc3\xa9 \xfe.txt".decode("utf-8", "surrogateescape"), "bytes\n")


def sig(changes) -> list[tuple]:
    return [(c.path, c.status, c.old_path, c.old, c.new, c.similarity) for c in changes]


def check_fast_equals_slow(e: Engine, row, expect_source: str) -> None:
    with CS.sandbox_views(e, row) as (base, tree):
        cands = CS.sandbox_candidates(e, row, base, tree)
        assert cands.source == expect_source, cands
        for ign in (False, True):
            slow = CS.changes(e, row, base, tree, include_ignored=ign, fast=False)
            fast = CS.changes(e, row, base, tree, include_ignored=ign, fast=True)
            assert sig(fast) == sig(slow)
            assert slow, "the edits must show"
        for paths in ([b"src"], [b"gone/sub"], [b"keep"], [b"moved", b"tool.sh"]):
            slow = CS.changes(e, row, base, tree, paths=paths, fast=False)
            fast = CS.changes(e, row, base, tree, paths=paths, fast=True)
            assert sig(fast) == sig(slow), paths
        got = {c.path for c in CS.changes(e, row, base, tree)}
        assert b"src/m3.py" in got and b"touched.txt" not in got and b"same.txt" not in got
        assert b"build/out.o" not in got and not any(p.startswith(b".git") for p in got)
        assert b"modedir" in got and b"empty_new_dir" in got


def _engine(ws: Path, backend: str):
    make_base(ws)
    e, _ = Engine.init(ws, backend)
    return e


def _teardown(e: Engine) -> None:
    try:
        e.deinit(force=True)
    except Exception:
        pass


def test_copy_has_no_fast_path(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    e = _engine(ws, "copy")
    try:
        row = e.fork("live")[0]
        edit_sandbox(Path(row.path))
        check_fast_equals_slow(e, row, "manifest")
    finally:
        _teardown(e)


def _settle(tree: Path) -> None:
    """Commit everything and write every page back, so the tree search sees it all."""
    from snapshot.backends import btrfs_generations as G
    os.sync()
    assert G.settled(tree, False), "nothing else writes on the test's filesystem"


def _source(e: Engine, row) -> str:
    with CS.sandbox_views(e, row) as (base, tree):
        return CS.sandbox_candidates(e, row, base, tree).source


def check_same(e: Engine, row, expect_source: str) -> None:
    with CS.sandbox_views(e, row) as (base, tree):
        assert CS.sandbox_candidates(e, row, base, tree).source == expect_source
        for ign in (False, True):
            slow = CS.changes(e, row, base, tree, include_ignored=ign, fast=False)
            assert slow, "the edits must show"
            assert sig(CS.changes(e, row, base, tree, include_ignored=ign, fast=True)) == sig(slow)


def check_both_btrfs_paths(e: Engine, row, check=check_same) -> None:
    """Right after the edits (writes in the page cache, inodes not committed) the lstat walk
    answers; once all is committed and written back, the tree search; both as the full
    compare. The source is asked before anything reads the sandbox (a read can update an
    atime, which is a change the next commit carries)."""
    check(e, row, "inode-keys")
    _settle(Path(row.path))
    check(e, row, "btrfs-generation")


@pytest.mark.skipif(os.geteuid() != 0, reason="the tree search and loop mounts need root")
def test_btrfs_generations_and_inode_keys_equal_full_compare(btrfs_dir):
    import btrfsutil
    ws = btrfs_dir / "ws"
    btrfsutil.create_subvolume(ws)
    e = _engine(ws, "btrfs")
    try:
        row = e.fork("live")[0]
        t = Path(row.path)
        edit_sandbox(t)
        check_both_btrfs_paths(e, row, check_fast_equals_slow)
        # After the commit: a write in place (no new inode, nothing in the tree until it is
        # written back), a chmod (the inode item waits for the commit), a rename and a
        # delete: none is seen by the tree search yet, so the walk answers, exactly.
        with open(t / "src" / "m7.py", "r+b") as f:
            f.write(b"#")
        os.chmod(t / "src" / "m8.py", 0o600)
        os.rename(t / "src" / "m9.py", t / "src" / "m9_moved.py")
        (t / "src" / "m10.py").unlink()
        with CS.sandbox_views(e, row) as (base, tree):
            got = {p for c in CS.changes(e, row, base, tree) for p in (c.path, c.old_path)}
        assert {b"src/m7.py", b"src/m8.py", b"src/m9.py", b"src/m9_moved.py", b"src/m10.py"} <= got
        check_both_btrfs_paths(e, row)
        # A hard link, its content changed through one name: both names change.
        row2 = e.fork("live")[0]
        t2 = Path(row2.path)
        os.link(t2 / "same.txt", t2 / "same-link.txt")
        with open(t2 / "same-link.txt", "ab") as f:
            f.write(b"more\n")
        check_both_btrfs_paths(e, row2)
        with CS.sandbox_views(e, row2) as (base, tree):
            got = {c.path: c.status for c in CS.changes(e, row2, base, tree)}
        assert got.get(b"same.txt") == "modified" and b"same-link.txt" in got
        # A fork of a fork: compared with the lineage's origin, its parent's edits included.
        from orchestrator.services import Engine as Services
        with Services.open(ws) as se:
            child = se.fork(row.id)[0]
        tc = Path(child.path)
        w(tc / "src" / "m11.py", "child\n")
        (tc / "src" / "new.py").unlink()
        check_both_btrfs_paths(e, child)
        with CS.sandbox_views(e, child) as (base, tree):
            got = {c.path for c in CS.changes(e, child, base, tree)}
        assert {b"src/m11.py", b"src/m3.py", b"src/m7.py"} <= got and b"src/new.py" not in got
        # A frozen view (a command runs in the sandbox) is read-only: the tree search reads it.
        with CS.sandbox_views(e, row, frozen=True) as (base, tree):
            assert CS.sandbox_candidates(e, row, base, tree).source == "btrfs-generation"
            assert sig(CS.changes(e, row, base, tree)) == sig(CS.changes(e, row, base, tree, fast=False))
        assert not list(e.store.tmp.iterdir())
    finally:
        _teardown(e)


@pytest.mark.skipif(os.geteuid() != 0, reason="kernel overlay mounts need root")
def test_overlay_upper_equals_full_compare(tmp_path):
    from snapshot.backends.overlay import OverlayBackend
    ws = tmp_path / "ws"
    ws.mkdir()
    ok, why = OverlayBackend.available(ws)
    if not ok:
        pytest.skip(f"overlay: {why}")
    e = _engine(ws, "overlay")
    try:
        row = e.fork("live")[0]
        edit_sandbox(Path(row.path))
        check_fast_equals_slow(e, row, "upper")
        # the frozen view (a copy of the upper) is read with that copy's candidates
        with CS.sandbox_views(e, row, frozen=True) as (base, tree):
            assert CS.sandbox_candidates(e, row, base, tree).source == "upper"
            assert sig(CS.changes(e, row, base, tree)) == sig(CS.changes(e, row, base, tree, fast=False))
    finally:
        _teardown(e)


def test_fuse_journal_equals_full_compare(tmp_path):
    from snapshot.backends.fuse import FuseBackend
    ws = tmp_path / "ws"
    ws.mkdir()
    ok, why = FuseBackend.available(ws)
    if not ok:
        pytest.skip(f"fuse: {why}")
    e = _engine(ws, "fuse")
    try:
        row = e.fork("live")[0]
        edit_sandbox(Path(row.path))
        check_fast_equals_slow(e, row, "fuse-journal")
    finally:
        _teardown(e)


def test_narrow_intersects_prefixes():
    c = CS.Candidates(frozenset({b"a/b", b"c"}), "t")
    assert CS.narrow(c, []) == [b"a/b", b"c"]
    assert CS.narrow(c, [b"a"]) == [b"a/b"]
    assert CS.narrow(c, [b"c/d"]) == [b"c/d"]
    assert CS.narrow(c, [b"x"]) == []
    assert CS.narrow(CS.FULL, []) is None and CS.narrow(CS.FULL, [b"x"]) == [b"x"]
    assert c.covers(b"a/b/c") and c.covers(b"c") and not c.covers(b"a") and not c.covers(b"a/bc")
