"""`rollback p-…` that refuses (exit 3, naming the paths) changes nothing: the undo is
planned against the journal's post-image first, and refused before anything is written.

The case that used to slip through: every path the promotion touched still holds what the
promotion left, but the workspace put something new inside a directory the promotion
created, so that directory cannot be removed. The old code found out half-way through the
undo, after it had restored everything else and marked the promotion undone."""
from __future__ import annotations

import pytest

from merge.errors import UndoConflict
from merge.promote import promotion_state, undo_promotion
from tests.conftest import petri
from tests.helpers.promote_ws import promotions_of, fork
from tests.helpers.promote_ws import manifest as ws_manifest
from tests.helpers.promote_ws import w as ws_w
from tests.helpers.trees import manifest, w

pytestmark = pytest.mark.unit  # no root, mount, FUSE, cgroup or sandbox: `pytest -m unit`


def _promote_new_dir(t) -> None:
    w(t.theirs / "a.txt", b"promoted\n")
    w(t.theirs / "newdir" / "deeper" / "f", b"new\n")
    (t.theirs / "gone.txt").unlink()
    t.promote()


def test_refused_undo_changes_nothing(trees):
    t = trees
    _promote_new_dir(t)
    w(t.live / "newdir" / "deeper" / "mine.txt", b"the user's own file\n")
    after = manifest(t.live)
    with pytest.raises(UndoConflict) as ei:
        undo_promotion(t.live, t.journal, "p-1")
    assert ei.value.exit_code == 3
    assert "newdir/deeper" in str(ei.value) and "a.txt" not in str(ei.value)
    assert manifest(t.live) == after  # a.txt still promoted, gone.txt still gone
    assert promotion_state(t.journal, "p-1") == "done"  # can still be undone later
    # once the user moves the file away, the same undo goes through
    (t.live / "newdir" / "deeper" / "mine.txt").unlink()
    undo_promotion(t.live, t.journal, "p-1")
    assert promotion_state(t.journal, "p-1") == "undone"
    assert (t.live / "a.txt").read_bytes() != b"promoted\n" and (t.live / "gone.txt").exists()
    assert not (t.live / "newdir").exists()


def test_refusal_names_every_blocked_path(trees):
    t = trees
    _promote_new_dir(t)
    w(t.live / "a.txt", b"edited since\n")
    w(t.live / "newdir" / "extra", b"x\n")
    w(t.live / "gone.txt", b"came back\n")
    after = manifest(t.live)
    with pytest.raises(UndoConflict) as ei:
        undo_promotion(t.live, t.journal, "p-1")
    for p in ("a.txt", "newdir", "gone.txt"):
        assert p in str(ei.value), ei.value
    assert manifest(t.live) == after


def test_cli_refusal_leaves_workspace_and_registry_alone(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    ws_w(ws / "README.md", "# project\n")
    assert petri("init", "--backend", "copy", cwd=ws).rc == 0
    try:
        sb, tree = fork(ws)
        ws_w(tree / "README.md", "# promoted\n")
        ws_w(tree / "pkg" / "mod.py", "x = 1\n")
        r = petri("--json", "promote", sb, cwd=ws)
        assert r.rc == 0, r
        pid = r.json["promotion"]
        ws_w(ws / "pkg" / "local.py", "mine\n")
        before = ws_manifest(ws)
        r = petri("rollback", pid, cwd=ws)
        assert r.rc == 3 and "pkg" in r.err and len(r.err.strip().splitlines()) == 1, r
        assert ws_manifest(ws) == before
        assert [p["state"] for p in promotions_of(ws)] == ["done"]
        (ws / "pkg" / "local.py").unlink()
        r = petri("--json", "rollback", pid, cwd=ws)
        assert r.rc == 0, r
        assert (ws / "README.md").read_text() == "# project\n" and not (ws / "pkg").exists()
        assert [p["state"] for p in promotions_of(ws)] == ["undone"]
    finally:
        petri("deinit", "--force", cwd=ws)
