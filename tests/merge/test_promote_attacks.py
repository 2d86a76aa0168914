"""Hostile sandboxes and a hostile workspace: nothing outside the workspace changes, nothing
special is created, odd names survive byte for byte."""
from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import stat
from pathlib import Path

import pytest

from merge.errors import (PromotionConflict, SandboxChangedDuringPromotion, UndoConflict,
                          UnsafePath)
from merge.promote import execute_promotion, undo_promotion
from merge.safefs import SafeTree, split_rel
from tests.helpers.trees import Trees, manifest, mktree, w

pytestmark = pytest.mark.unit  # no root, mount, FUSE, cgroup or sandbox: `pytest -m unit`


@pytest.fixture
def outside(tmp_path):
    return mktree(tmp_path / "outside", {"x": b"outside x\n", "sub/y": b"outside y\n"})


@pytest.fixture
def trees(tmp_path):
    return Trees(tmp_path, {"d/x": b"x\n", "d/sub/y": b"y\n", "top.txt": b"top\n"})


@pytest.mark.parametrize("mode", ["fail", "markers", "theirs", "ours"])
def test_live_dir_swapped_for_symlink_to_outside(trees, outside, mode):
    t = trees
    shutil.rmtree(t.live / "d")
    os.symlink(outside, t.live / "d")
    w(t.theirs / "d" / "x", b"sandbox writes x\n")
    w(t.theirs / "d" / "new", b"sandbox adds\n")
    (t.theirs / "d" / "sub" / "y").unlink()
    w(t.theirs / "top.txt", b"fine\n")
    before_out, before_live = manifest(outside), manifest(t.live)
    plan = t.plan(on_conflict=mode)
    assert {c.path for c in plan.blocking} >= {b"d/x", b"d/new", b"d/sub/y"}
    assert all(c.fatal for c in plan.blocking)
    with pytest.raises(PromotionConflict) as ei:
        execute_promotion(plan, t.live, t.journal, "p-1")
    assert ei.value.exit_code == 3 and "symlink" in str(ei.value)
    assert manifest(outside) == before_out
    assert manifest(t.live) == before_live


def test_live_subdir_becomes_symlink_after_planning(trees, outside):
    """The swap happens between plan and execute: the re-check catches it."""
    t = trees
    w(t.theirs / "d" / "sub" / "y", b"sandbox\n")
    w(t.theirs / "d" / "sub" / "z", b"sandbox new\n")
    plan = t.plan()
    shutil.rmtree(t.live / "d" / "sub")
    os.symlink(outside / "sub", t.live / "d" / "sub")
    before_out = manifest(outside)
    with pytest.raises(PromotionConflict):
        execute_promotion(plan, t.live, t.journal, "p-1")
    assert manifest(outside) == before_out
    assert os.readlink(t.live / "d" / "sub") == str(outside / "sub")


def test_sandbox_dir_replaced_by_symlink_is_promoted_as_a_link_only(trees, outside):
    t = trees
    shutil.rmtree(t.theirs / "d")
    os.symlink(outside, t.theirs / "d")
    os.symlink("/etc/passwd", t.theirs / "abs")
    before_out = manifest(outside)
    t.promote()
    assert os.readlink(t.live / "d") == str(outside)
    assert os.readlink(t.live / "abs") == "/etc/passwd"
    assert manifest(outside) == before_out
    undo_promotion(t.live, t.journal, "p-1")
    assert (t.live / "d" / "x").read_bytes() == b"x\n"


def test_special_files_never_created(trees):
    t = trees
    os.mkfifo(t.theirs / "fifo")
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(t.theirs / "sock"))
    finally:
        s.close()
    if os.geteuid() == 0:
        os.mknod(t.theirs / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    w(t.theirs / "suid", b"#!/bin/sh\n", 0o6755)
    plan = t.plan()
    skipped = {p for p, _ in plan.skipped}
    assert {b"fifo", b"sock"} <= skipped
    if os.geteuid() == 0:
        assert b"null" in skipped
    res = t.promote()
    assert res.skipped == plan.skipped
    for name in ("fifo", "sock", "null"):
        assert not os.path.lexists(t.live / name)
    assert stat.S_IMODE(os.lstat(t.live / "suid").st_mode) == 0o755
    assert all(v[0] != "other" for v in manifest(t.live).values())


def test_sandbox_swaps_a_file_for_a_symlink_after_planning(trees):
    t = trees
    w(t.theirs / "top.txt", b"sandbox\n")
    plan = t.plan()
    os.unlink(t.theirs / "top.txt")
    os.symlink("/etc/shadow", t.theirs / "top.txt")  # hoping the promotion copies its bytes
    before = manifest(t.live)
    with pytest.raises(SandboxChangedDuringPromotion):
        execute_promotion(plan, t.live, t.journal, "p-1")
    assert manifest(t.live) == before
    assert not any(p.name.startswith("p-") for p in t.journal.iterdir() if p.is_dir())


HOSTILE = [b"new\nline", b"bad-\xff\xfe-utf8", b"-rf", b"--help", b" spaced ", b"tab\there",
           b"quote\"s", b"back\\slash", b"d/\xc3\x28-invalid-in-dir"]


def test_hostile_names_byte_exact(trees):
    t = trees
    for i, name in enumerate(HOSTILE):
        p = os.path.join(os.fsencode(t.theirs), name)
        with open(p, "wb") as f:
            f.write(b"content %d\n" % i)
    os.symlink(b"\xff-target\n", os.path.join(os.fsencode(t.theirs), b"link-\xfe"))
    before = manifest(t.live)
    res = t.promote()
    assert set(HOSTILE) | {b"link-\xfe"} <= set(res.applied)
    got = manifest(t.live)
    for name in HOSTILE:
        assert got[name][2] == manifest(t.theirs)[name][2]
    assert got[b"link-\xfe"] == ("link", b"\xff-target\n")
    js = t.plan().to_json()  # nothing left to do, but the shape holds
    assert js["ops"] == []
    undo_promotion(t.live, t.journal, "p-1")
    assert manifest(t.live) == before


@pytest.mark.parametrize("bad", [b"../x", b"/etc/passwd", b"a/../../x", b"a//b", b"./a", b"",
                                 b"a/./b", b"a\0b"])
def test_unsafe_relative_paths_refused(trees, bad):
    with pytest.raises(UnsafePath):
        split_rel(bad)
    with SafeTree(trees.live) as lt:
        with pytest.raises(UnsafePath):
            lt.node(bad)
        with pytest.raises(UnsafePath):
            lt.unlink(bad)


def test_paths_argument_with_dotdot_refused(trees):
    with pytest.raises(UnsafePath):
        trees.plan(paths=[b"../outside"])


def test_tampered_journal_cannot_reach_outside(trees, outside):
    t = trees
    w(t.theirs / "top.txt", b"promoted\n")
    t.promote()
    jf = t.journal / "p-1" / "journal.json"
    rec = json.loads(jf.read_bytes())
    rec["ops"][0]["path"] = base64.b64encode(b"../outside/x").decode()
    jf.write_text(json.dumps(rec))
    before_out = manifest(outside)
    with pytest.raises(UndoConflict):
        undo_promotion(t.live, t.journal, "p-1")
    assert manifest(outside) == before_out


def test_git_and_store_never_promoted(trees):
    t = trees
    w(t.theirs / ".git" / "config", b"[core]\n\tfsmonitor = touch /tmp/petri-pwned\n")
    w(t.theirs / ".git" / "hooks" / "post-checkout", b"#!/bin/sh\ntouch /tmp/petri-pwned\n", 0o755)
    w(t.theirs / ".petri" / "registry.db", b"forged\n")
    plan = t.plan(include_ignored=True)
    assert not [o for o in plan.ops if o.path.split(b"/")[0] in (b".git", b".petri")]
    t.promote(include_ignored=True)
    assert not (t.live / ".git").exists()
    assert not (t.live / ".petri" / "registry.db").exists()
    assert not Path("/tmp/petri-pwned").exists()


@pytest.mark.parametrize("resolver", ["openat2", "walk"])
def test_resolution_refuses_symlinks_either_way(tmp_path, outside, monkeypatch, resolver):
    """SafeTree resolves a directory in one openat2 where the kernel has it, else component by
    component: both refuse a symlink (or a file) anywhere on the way, and name it."""
    from merge import safefs
    from merge.errors import PathThroughSymlink

    live = mktree(tmp_path / "live", {"d/sub/y": b"y\n", "f": b"file\n", "ln": ("link", str(outside)),
                                      "d/ln2": ("link", str(outside / "sub"))})
    used = []
    real = safefs._open_dir_beneath

    def counting(fd: int, path: bytes) -> int | None:
        got = real(fd, path)
        used.append(got is not None)
        return got

    monkeypatch.setattr(safefs, "_open_dir_beneath", counting)
    if resolver == "walk":
        monkeypatch.setattr(safefs, "_openat2_ok", False)
    with SafeTree(live) as lt:
        for path, via in ((b"ln/x", "ln"), (b"d/ln2/y", "d/ln2"), (b"f/x", "f"), (b"ln/sub/y", "ln")):
            with pytest.raises(PathThroughSymlink) as ei:
                lt.node(path)
            assert ei.value.fields["via"] == via, (path, str(ei.value))
        assert lt.node(b"d/missing/x") is None
        assert lt.node(b"d/sub/y").kind == "file"
        with pytest.raises(PathThroughSymlink):
            lt.open_dir([b"d", b"ln2"])
    if resolver == "openat2":
        if not safefs._openat2_ok:
            pytest.skip("this kernel has no openat2")
        assert any(used)  # the good paths went through openat2
    else:
        assert not any(used)
