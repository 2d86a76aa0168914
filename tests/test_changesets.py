"""The O(changes) fast paths give exactly the change set of the full manifest compare, on
every backend that has one (btrfs send streams, the overlay upper dir, the fuse journal),
for a sandbox edited in every way a change set can tell."""
from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path

import pytest

from orchestrator import changesets as CS
from orchestrator.engine import Engine
from snapshot.backends.btrfs import SendStreamError, parse_send_stream


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


@pytest.mark.skipif(os.geteuid() != 0, reason="btrfs send and loop mounts need root")
def test_btrfs_send_stream_equals_full_compare(btrfs_dir):
    import btrfsutil
    ws = btrfs_dir / "ws"
    btrfsutil.create_subvolume(ws)
    e = _engine(ws, "btrfs")
    try:
        row = e.fork("live")[0]
        edit_sandbox(Path(row.path))
        check_fast_equals_slow(e, row, "btrfs-send")
        # A hard link with content changed through one name: send names one path only,
        # so the full compare is used (and gives both names).
        row2 = e.fork("live")[0]
        t = Path(row2.path)
        os.link(t / "same.txt", t / "same-link.txt")
        with CS.sandbox_views(e, row2) as (base, tree):
            assert CS.sandbox_candidates(e, row2, base, tree).source == "manifest"
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


def _stream(version: int, cmds: list[tuple[int, list[tuple[int, bytes]]]]) -> bytes:
    out = bytearray(b"btrfs-stream\0" + struct.pack("<I", version))
    for cmd, attrs in cmds:
        body = b"".join(struct.pack("<HH", t, len(v)) + v for t, v in attrs)
        out += struct.pack("<IHI", len(body), cmd, 0) + body
    return bytes(out)


def test_parse_send_stream_keeps_content_commands_only():
    data = _stream(1, [
        (2, [(15, b"snap")]),                 # snapshot: the subvolume's own name
        (9, [(15, b"a"), (16, b"z")]),        # rename
        (22, [(15, b"z/b/c"), (18, b"\0" * 8)]),  # update_extent
        (20, [(15, b"")]),                    # utimes of the root: times are not content
        (19, [(15, b"owner-only")]),          # chown
        (13, [(15, b"xattr-only")]),          # set_xattr
        (18, [(15, b"f")]),                   # chmod
        (3, [(15, b"o261-8-0")]),             # mkfile under a temporary name
        (11, [(15, b"weird\nname \xff")]),    # unlink
        (21, []),                             # end
    ])
    assert parse_send_stream(data) == {b"a", b"z", b"z/b/c", b"f", b"o261-8-0", b"weird\nname \xff"}
    # v2: a data attribute runs to the end of its command
    v2 = _stream(2, [(15, [(15, b"w"), (19, b"payload-without-length")])])
    assert parse_send_stream(v2) == {b"w"}
    with pytest.raises(SendStreamError):
        parse_send_stream(b"not a stream")
    with pytest.raises(SendStreamError):
        parse_send_stream(data[:-3])


def test_narrow_intersects_prefixes():
    c = CS.Candidates(frozenset({b"a/b", b"c"}), "t")
    assert CS.narrow(c, []) == [b"a/b", b"c"]
    assert CS.narrow(c, [b"a"]) == [b"a/b"]
    assert CS.narrow(c, [b"c/d"]) == [b"c/d"]
    assert CS.narrow(c, [b"x"]) == []
    assert CS.narrow(CS.FULL, []) is None and CS.narrow(CS.FULL, [b"x"]) == [b"x"]
    assert c.covers(b"a/b/c") and c.covers(b"c") and not c.covers(b"a") and not c.covers(b"a/bc")
