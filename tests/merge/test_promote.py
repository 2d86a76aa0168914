"""Promotion on real trees: the 3-way cases, each on_conflict mode, modes, symlinks,
directories, undo; an editor's save during a promotion."""
from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from merge import journal
from merge.errors import PromotionConflict, UndoConflict
from merge.promote import (execute_promotion, plan_promotion, promotion_state, recover,
                           undo_promotion)
from tests.helpers.trees import TEXT, manifest, w

pytestmark = pytest.mark.unit  # no root, mount, FUSE, cgroup or sandbox: `pytest -m unit`


# --- helpers shared by the promotion test files --------------------------------------------



# --- live unchanged: take theirs ------------------------------------------------------------

def test_live_unchanged_takes_theirs(trees):
    t = trees
    w(t.theirs / "a.txt", TEXT.replace(b"line 5", b"line five"))
    (t.theirs / "gone.txt").unlink()
    w(t.theirs / "new" / "sub" / "n.txt", b"n\n")
    os.chmod(t.theirs / "b.txt", 0o600)
    shutil.rmtree(t.theirs / "olddir")
    os.unlink(t.theirs / "ln")
    os.symlink("d/x", t.theirs / "ln")
    os.symlink("/etc/passwd", t.theirs / "abs-link")
    w(t.theirs / "run.sh", b"#!/bin/sh\necho\n", 0o700)
    w(t.theirs / ".git" / "config", b"[core]\n\tfsmonitor = touch /tmp/pwned\n")
    before = manifest(t.live)
    res = t.promote()
    want = manifest(t.theirs)
    want[b".git/config"] = before[b".git/config"]  # .git is never promoted
    assert manifest(t.live) == want
    assert not res.conflicts and not res.markers
    assert b"olddir" in res.applied and b"new/sub/n.txt" in res.applied
    assert promotion_state(t.journal, "p-1") == "done"
    # undo gives back exactly the old tree
    undone = undo_promotion(t.live, t.journal, "p-1")
    assert b"a.txt" in undone
    assert manifest(t.live) == before
    assert promotion_state(t.journal, "p-1") == "undone"


def test_setuid_sticky_never_carried(trees):
    t = trees
    w(t.theirs / "suid", b"x", 0o4755)
    w(t.theirs / "sgid", b"x", 0o2750)
    os.makedirs(t.theirs / "sticky")
    os.chmod(t.theirs / "sticky", 0o1777)
    os.chmod(t.theirs / "a.txt", 0o4644)
    t.promote()
    assert stat.S_IMODE(os.lstat(t.live / "suid").st_mode) == 0o755
    assert stat.S_IMODE(os.lstat(t.live / "sgid").st_mode) == 0o750
    assert stat.S_IMODE(os.lstat(t.live / "sticky").st_mode) == 0o777
    assert stat.S_IMODE(os.lstat(t.live / "a.txt").st_mode) == 0o644


def test_readonly_new_dir_gets_its_bits_after_its_files(trees):
    t = trees
    w(t.theirs / "ro" / "f", b"f\n")
    os.chmod(t.theirs / "ro", 0o555)
    t.promote()
    assert (t.live / "ro" / "f").read_bytes() == b"f\n"
    assert stat.S_IMODE(os.lstat(t.live / "ro").st_mode) == 0o555
    os.chmod(t.theirs / "ro", 0o755)


# --- both changed ---------------------------------------------------------------------------

def test_both_changed_clean_merge(trees):
    t = trees
    w(t.live / "a.txt", TEXT.replace(b"line 1\n", b"line one\n"))
    w(t.theirs / "a.txt", TEXT.replace(b"line 9\n", b"line nine\n"))
    w(t.live / "b.txt", b"same\n")
    w(t.theirs / "b.txt", b"same\n")  # identical change: nothing to do
    res = t.promote()
    assert (t.live / "a.txt").read_bytes() == TEXT.replace(b"line 1\n", b"line one\n").replace(
        b"line 9\n", b"line nine\n")
    assert not res.conflicts and b"b.txt" not in res.applied


def _conflicting(t):
    w(t.live / "a.txt", TEXT.replace(b"line 5", b"live 5"))
    w(t.theirs / "a.txt", TEXT.replace(b"line 5", b"sandbox 5").replace(b"line 9", b"sandbox 9"))


def test_conflict_fail_writes_nothing(trees):
    t = trees
    _conflicting(t)
    w(t.theirs / "other.txt", b"would be new\n")
    before = manifest(t.live)
    plan = t.plan()
    assert [c.path for c in plan.blocking] == [b"a.txt"]
    assert plan.blocking[0].hunks and plan.blocking[0].hunks[0].ours_lines == (b"live 5\n",)
    with pytest.raises(PromotionConflict) as ei:
        execute_promotion(plan, t.live, t.journal, "p-1")
    assert ei.value.exit_code == 3 and "a.txt" in str(ei.value)
    assert manifest(t.live) == before
    assert promotion_state(t.journal, "p-1") == "unknown"


def test_conflict_markers(trees):
    t = trees
    _conflicting(t)
    res = t.promote(on_conflict="markers")
    assert res.markers and [c.resolution for c in res.conflicts] == ["markers"]
    got = (t.live / "a.txt").read_bytes()
    assert b"<<<<<<< ours\nlive 5\n||||||| base\nline 5\n=======\nsandbox 5\n>>>>>>> theirs\n" in got
    assert b"sandbox 9\n" in got  # the clean hunk is merged


@pytest.mark.parametrize("side", ["ours", "theirs"])
def test_conflict_pick_side_per_hunk(trees, side):
    t = trees
    _conflicting(t)
    res = t.promote(on_conflict=side)
    got = (t.live / "a.txt").read_bytes()
    assert (b"live 5\n" in got) == (side == "ours")
    assert (b"sandbox 5\n" in got) == (side == "theirs")
    assert b"sandbox 9\n" in got  # the other side's clean change stays either way
    assert [c.resolution for c in res.conflicts] == [side]


@pytest.mark.parametrize("mode", ["fail", "markers", "theirs", "ours"])
def test_delete_vs_modify(trees, mode):
    t = trees
    w(t.live / "b.txt", b"live edit\n")
    (t.theirs / "b.txt").unlink()
    plan = t.plan(on_conflict=mode)
    assert [c.reason for c in plan.conflicts] == ["deleted in the sandbox, changed in the workspace"]
    if mode == "fail":
        with pytest.raises(PromotionConflict):
            execute_promotion(plan, t.live, t.journal, "p-1")
        assert (t.live / "b.txt").read_bytes() == b"live edit\n"
        return
    execute_promotion(plan, t.live, t.journal, "p-1")
    assert (t.live / "b.txt").exists() == (mode != "theirs")


@pytest.mark.parametrize("mode", ["fail", "theirs", "ours"])
def test_modify_vs_delete(trees, mode):
    t = trees
    (t.live / "d" / "x").unlink()
    w(t.theirs / "d" / "x", b"sandbox edit\n")
    plan = t.plan(on_conflict=mode)
    assert [c.reason for c in plan.conflicts] == ["changed in the sandbox, deleted in the workspace"]
    if mode == "fail":
        with pytest.raises(PromotionConflict):
            execute_promotion(plan, t.live, t.journal, "p-1")
        return
    execute_promotion(plan, t.live, t.journal, "p-1")
    assert (t.live / "d" / "x").exists() == (mode == "theirs")


def test_binary_both_changed(trees):
    t = trees
    w(t.base / "bin", b"\0base")
    w(t.live / "bin", b"\0live")
    w(t.theirs / "bin", b"\0sandbox")
    assert [c.reason for c in t.plan().conflicts] == ["binary file changed on both sides"]
    t.promote(on_conflict="markers")
    assert (t.live / "bin").read_bytes() == b"\0live"  # no markers in a binary: ours kept


def test_type_change_both_sides(trees):
    t = trees
    os.unlink(t.live / "b.txt")
    os.symlink("a.txt", t.live / "b.txt")
    (t.theirs / "b.txt").unlink()
    w(t.theirs / "b.txt" / "inner", b"now a dir\n")
    plan = t.plan()
    assert plan.conflicts[0].reason.startswith("type changed")
    t.promote(on_conflict="theirs")
    assert (t.live / "b.txt" / "inner").read_bytes() == b"now a dir\n"
    undo_promotion(t.live, t.journal, "p-1")
    assert os.readlink(t.live / "b.txt") == "a.txt"


def test_type_change_one_side_dir_to_file_and_back(trees):
    t = trees
    shutil.rmtree(t.theirs / "d")
    w(t.theirs / "d", b"d is a file now\n")
    os.unlink(t.theirs / "gone.txt")
    w(t.theirs / "gone.txt" / "f", b"a dir now\n")
    before = manifest(t.live)
    t.promote()
    assert manifest(t.live) == {k: v for k, v in manifest(t.theirs).items() if not k.startswith(b".git")} | {
        k: v for k, v in before.items() if k.startswith(b".git")}
    undo_promotion(t.live, t.journal, "p-1")
    assert manifest(t.live) == before


def test_mode_conflict_and_mode_merge(trees):
    t = trees
    os.chmod(t.live / "run.sh", 0o700)
    os.chmod(t.theirs / "run.sh", 0o750)
    os.chmod(t.live / "a.txt", 0o600)  # live changes the mode, sandbox the content
    w(t.theirs / "a.txt", TEXT + b"more\n")
    plan = t.plan()
    assert [c.path for c in plan.conflicts] == [b"run.sh"]
    t.promote(on_conflict="theirs")
    assert stat.S_IMODE(os.lstat(t.live / "run.sh").st_mode) == 0o750
    assert stat.S_IMODE(os.lstat(t.live / "a.txt").st_mode) == 0o600
    assert (t.live / "a.txt").read_bytes() == TEXT + b"more\n"


def test_deleted_dir_with_new_live_entries_is_kept(trees):
    t = trees
    shutil.rmtree(t.theirs / "olddir")
    w(t.live / "olddir" / "mine", b"untracked\n")
    plan = t.plan()
    assert [c.path for c in plan.blocking] == [b"olddir"]
    t.promote(on_conflict="ours")
    assert (t.live / "olddir" / "mine").exists() and not (t.live / "olddir" / "z").exists()


def test_paths_narrow_and_dry_run_json(trees):
    t = trees
    w(t.theirs / "a.txt", b"changed\n")
    w(t.theirs / "d" / "x", b"changed\n")
    plan = t.plan(paths=[b"d"])
    assert [o.path for o in plan.ops] == [b"d/x"]
    js = plan.to_json()
    assert js["ops"][0]["path"] == "d/x" and js["ops"][0]["action"] == "put"


# --- undo refuses when live moved -----------------------------------------------------------

def test_undo_refuses_when_live_changed_since(trees):
    t = trees
    w(t.theirs / "a.txt", b"promoted\n")
    w(t.theirs / "brand-new", b"new\n")
    t.promote()
    w(t.live / "a.txt", b"edited after the promotion\n")
    after = manifest(t.live)
    with pytest.raises(UndoConflict) as ei:
        undo_promotion(t.live, t.journal, "p-1")
    assert ei.value.exit_code == 3 and "a.txt" in str(ei.value)
    assert "brand-new" not in str(ei.value)
    assert manifest(t.live) == after


# --- an editor saves while the promotion runs -----------------------------------------------

@pytest.mark.parametrize("how", ["rename", "inplace"])
def test_editor_save_during_promotion_undoes_everything(trees, how):
    t = trees
    for i in range(5):
        w(t.theirs / f"f{i}", b"new %d\n" % i)
    w(t.theirs / "a.txt", b"sandbox\n")
    w(t.theirs / "d" / "x", b"sandbox\n")
    before = manifest(t.live)
    plan = t.plan()
    order = [o.path for o in plan.ops]
    assert order.index(b"a.txt") < order.index(b"d/x")

    def editor(k: int) -> None:
        if k == 1:  # after the first op landed: save d/x the way editors do
            if how == "rename":
                w(t.live / "d" / ".x.swp", b"editor's save\n")
                os.rename(t.live / "d" / ".x.swp", t.live / "d" / "x")
            else:
                with open(t.live / "d" / "x", "r+b") as f:
                    f.write(b"EDITOR")
    journal.on_step("apply", editor)
    try:
        with pytest.raises(PromotionConflict) as ei:
            execute_promotion(plan, t.live, t.journal, "p-1")
    finally:
        journal.on_step("apply", None)
        journal.reset_faults()
    assert "d/x" in str(ei.value) and ei.value.exit_code == 3
    want = dict(before)
    want[b"d/x"] = manifest(t.live)[b"d/x"]
    assert manifest(t.live) == want  # everything undone, the editor's save kept
    assert b"new" not in (t.live / "d" / "x").read_bytes()
    assert promotion_state(t.journal, "p-1") == "undone"
    assert recover(t.live, t.journal) == ([], [])


def test_editor_creates_a_file_the_promotion_adds(trees):
    t = trees
    w(t.theirs / "aaa-first", b"1\n")
    w(t.theirs / "zzz-new", b"sandbox\n")
    plan = t.plan()

    def editor(k: int) -> None:
        if k == 1:
            w(t.live / "zzz-new", b"editor\n")
    journal.on_step("apply", editor)
    try:
        with pytest.raises(PromotionConflict):
            execute_promotion(plan, t.live, t.journal, "p-1")
    finally:
        journal.on_step("apply", None)
        journal.reset_faults()
    assert (t.live / "zzz-new").read_bytes() == b"editor\n"
    assert not (t.live / "aaa-first").exists()


def test_live_changed_between_plan_and_execute(trees):
    t = trees
    w(t.theirs / "a.txt", b"sandbox\n")
    plan = t.plan()
    w(t.live / "a.txt", b"changed after planning\n")
    with pytest.raises(PromotionConflict):
        execute_promotion(plan, t.live, t.journal, "p-1")
    assert (t.live / "a.txt").read_bytes() == b"changed after planning\n"
    assert promotion_state(t.journal, "p-1") == "unknown"


def test_stacked_promotions_undo_in_order(trees, tmp_path):
    t = trees
    before = manifest(t.live)
    w(t.theirs / "a.txt", b"one\n")
    t.promote("p-1")
    base2 = tmp_path / "base2"
    shutil.copytree(t.live, base2, symlinks=True, ignore=shutil.ignore_patterns(".petri"))
    sb2 = tmp_path / "sb2"
    shutil.copytree(base2, sb2, symlinks=True)
    w(sb2 / "a.txt", b"two\n")
    execute_promotion(plan_promotion(base2, t.live, sb2), t.live, t.journal, "p-2")
    with pytest.raises(UndoConflict) as ei:
        undo_promotion(t.live, t.journal, "p-1")  # p-2 changed a.txt since
    assert "a.txt" in str(ei.value)
    assert undo_promotion(t.live, t.journal, "p-2") == [b"a.txt"]
    assert (t.live / "a.txt").read_bytes() == b"one\n"
    undo_promotion(t.live, t.journal, "p-1")
    assert manifest(t.live) == before


def test_journal_on_another_device_stages_inside_the_workspace(trees):
    """The store as a nested btrfs subvolume is another st_dev: staging must not cross it."""
    t = trees
    import tempfile
    if os.stat("/dev/shm").st_dev == os.stat(t.live).st_dev:
        pytest.skip("/dev/shm is on the same device as the test tree; need two devices")
    jdir = Path(tempfile.mkdtemp(dir="/dev/shm", prefix="petri-journal-"))
    try:
        w(t.theirs / "a.txt", b"promoted\n")
        w(t.theirs / "n" / "new.txt", b"new\n")
        before = manifest(t.live)
        seen = []
        journal.on_step("apply", lambda k: seen.append(
            sorted(p.name for p in t.live.iterdir() if p.name.startswith(".petri-staging-"))))
        try:
            execute_promotion(t.plan(), t.live, jdir, "p-x")
        finally:
            journal.on_step("apply", None)
        assert seen and seen[0] == [".petri-staging-p-x"]
        assert (t.live / "a.txt").read_bytes() == b"promoted\n"
        undo_promotion(t.live, jdir, "p-x")
        assert manifest(t.live) == before
        assert not any(p.name.startswith(".petri-staging-") for p in t.live.iterdir())
    finally:
        shutil.rmtree(jdir, ignore_errors=True)


def test_result_json_shape(trees):
    t = trees
    w(t.theirs / b"bad-\xff".decode("utf-8", "surrogateescape"), b"x\n")
    js = t.promote().to_json()
    assert js["promotion"] == "p-1" and js["applied"] == ["bad-\\xff"]
    assert js["applied_b64"] == ["YmFkLf8="] and js["conflicts"] == [] and js["markers"] is False
