"""Renaming a directory that came from a snapshot works in an overlay sandbox
(``redirect_dir=on``): ``git mv`` of a directory, then ``petri diff`` shows the renames and
``petri promote`` leaves live exactly as the same ``git mv`` leaves a plain copy. The
change-set fast path reads the redirect from the upper dir, frozen views and remounts keep
it, and layers made before trusted marks existed get them before a sandbox relies on them."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from orchestrator import changesets as CS
from orchestrator.engine import Engine
from snapshot import conformance as C
from snapshot import layers as L
from snapshot.backends import overlay as O
from tests.conftest import petri

pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(os.geteuid() != 0, reason="kernel overlay mounts need root")]
GIT = ["git", "-c", "user.email=t@example.com", "-c", "user.name=t", "-c", "init.defaultBranch=main"]


def overlay_ok(ws: Path) -> None:
    ok, why = O.OverlayBackend.available(ws)
    if not ok:
        pytest.skip(f"overlay: {why}")


def git_project(root: Path) -> Path:
    root.mkdir()
    (root / "src" / "sub").mkdir(parents=True)
    (root / "src" / "__init__.py").write_text("")
    (root / "src" / "app.py").write_text("def main():\n    return 1\n")
    (root / "src" / "sub" / "util.py").write_text("X = 2\n")
    (root / "src" / "tool.sh").write_text("#!/bin/sh\necho hi\n")
    os.chmod(root / "src" / "tool.sh", 0o755)
    (root / "README.md").write_text("# p\n")
    subprocess.run([*GIT, "init", "-q"], cwd=root, check=True)
    subprocess.run([*GIT, "add", "-A"], cwd=root, check=True)
    subprocess.run([*GIT, "commit", "-qm", "base"], cwd=root, check=True)
    return root


def test_git_mv_of_a_directory_diff_and_promote(tmp_path):
    ws = git_project(tmp_path / "ws")
    overlay_ok(ws)
    oracle = tmp_path / "oracle"
    shutil.copytree(ws, oracle, symlinks=True)
    subprocess.run([*GIT, "mv", "src", "pkg"], cwd=oracle, check=True)
    r = petri("init", "--backend", "overlay", "--json", cwd=ws)
    assert r.rc == 0, r
    try:
        sb = petri("fork", "--json", cwd=ws).json["sandboxes"][0]
        r = petri("run", sb["id"], "--", "git", "mv", "src", "pkg", cwd=ws)
        assert r.rc == 0, r  # was: fatal: renaming 'src' failed: Invalid cross-device link
        r = petri("diff", sb["id"], "--json", cwd=ws)
        assert r.rc == 0, r
        files = sorted((f["status"], f["old_path"], f["path"]) for f in r.json["files"])
        moved = ("__init__.py", "app.py", "sub/util.py", "tool.sh")
        assert files == [("renamed", f"src/{p}", f"pkg/{p}") for p in moved]
        r = petri("promote", sb["id"], "--json", cwd=ws)
        assert r.rc == 0, r
        skip = frozenset({b".git", b".petri"})
        assert C.diff_manifests(C.manifest(oracle, skip), C.manifest(ws, skip)) == []
    finally:
        petri("deinit", "--force", cwd=ws)


def test_renamed_directory_in_fast_path_frozen_view_and_remount(tmp_path):
    ws = git_project(tmp_path / "ws")
    overlay_ok(ws)
    e, _ = Engine.init(ws, "overlay")
    try:
        row = e.fork("live")[0]
        tree = Path(row.path)
        os.rename(tree / "src", tree / "pkg")
        os.rename(tree / "pkg" / "sub", tree / "pkg" / "inner")
        (tree / "pkg" / "new.py").write_text("new\n")
        upper = e.store.sandbox_dir(row.id) / "upper"
        kinds = {rel: kind for rel, kind, _ in L.layer_entries(os.fsencode(upper))}
        assert kinds[b"pkg"] == "redirect_dir" and kinds[b"src"] == "whiteout", kinds
        expect = sorted((c.status, c.old_path, c.path) for c in _changes(e, row, frozen=False, fast=False))
        assert ("renamed", b"src/sub/util.py", b"pkg/inner/util.py") in expect
        for frozen in (False, True):
            with CS.sandbox_views(e, row, frozen=frozen) as (base, view):
                assert CS.sandbox_candidates(e, row, base, view).source == "upper"
            assert sorted((c.status, c.old_path, c.path) for c in _changes(e, row, frozen=frozen)) == expect
        # A remount (after a reboot, say) uses the options the upper was made under.
        O.umount(os.fsencode(tree))
        assert (e.backend.ensure_clone(e.store, row.id) / "pkg" / "inner" / "util.py").read_text() == "X = 2\n"
        assert not (tree / "src").exists()
    finally:
        e.deinit(force=True)


def _changes(e: Engine, row, *, frozen: bool, fast: bool = True):
    with CS.sandbox_views(e, row, frozen=frozen) as (base, view):
        return CS.changes(e, row, base, view, fast=fast)


def test_layers_without_trusted_marks_get_them_before_a_sandbox_relies_on_them(tmp_path):
    """A store from before trusted marks: an opaque directory marked only user.overlay.*
    must still hide the layer below once the sandbox is mounted without userxattr."""
    ws = tmp_path / "ws"
    (ws / "d").mkdir(parents=True)
    (ws / "d" / "old.txt").write_text("old\n")
    overlay_ok(ws)
    e, _ = Engine.init(ws, "overlay")
    try:
        (ws / "d2").mkdir()  # made while d exists: another inode, so the next layer makes d opaque
        (ws / "d2" / "new.txt").write_text("new\n")
        shutil.rmtree(ws / "d")
        os.rename(ws / "d2", ws / "d")
        snap = e.take_snapshot("d replaced")
        listing = e.store.snapshot_dir(snap.id) / "layers.json"
        names = L.read_layer_list(listing)
        top = os.fsencode(e.store.layers / names[-1] / "d")
        assert L.is_opaque(top) and os.getxattr(top, L.TRUSTED_OPAQUE_XATTR) == b"y"
        # Make it look old: no trusted marks, no flag.
        os.removexattr(top, L.TRUSTED_OPAQUE_XATTR)
        L.write_layer_list(listing, names)
        row = e.fork(snap.id)[0]
        tree = Path(row.path)
        assert sorted(os.listdir(tree / "d")) == ["new.txt"]
        assert json.loads((e.store.sandbox_dir(row.id) / "mount.json").read_text())["options"] == \
            list(O.SANDBOX_MOUNT_OPTIONS)
        assert L.layer_list_trusted(listing)
        os.rename(tree / "d", tree / "e")
        assert sorted(os.listdir(tree / "e")) == ["new.txt"]
        # A sandbox whose record names the old options is remounted with them.
        old = e.fork(snap.id)[0]
        rec_path = e.store.sandbox_dir(old.id) / "mount.json"
        rec = json.loads(rec_path.read_text())
        rec["options"] = list(O.MOUNT_OPTIONS)
        O.umount(os.fsencode(old.path))
        shutil.rmtree(e.store.sandbox_dir(old.id) / "upper")
        shutil.rmtree(e.store.sandbox_dir(old.id) / "work")
        (e.store.sandbox_dir(old.id) / "upper").mkdir()
        (e.store.sandbox_dir(old.id) / "work").mkdir()
        rec_path.write_text(json.dumps(rec))
        e.backend.ensure_clone(e.store, old.id)
        opts = next(ln for ln in Path("/proc/self/mounts").read_text().splitlines() if f" {old.path} " in ln)
        assert "userxattr" in opts and "redirect_dir=nofollow" in opts, opts
        assert sorted(os.listdir(Path(old.path) / "d")) == ["new.txt"]
    finally:
        e.deinit(force=True)


def test_compaction_refuses_a_layer_with_a_redirect(tmp_path):
    lo, hi = tmp_path / "lo", tmp_path / "hi"
    (lo / "src").mkdir(parents=True)
    (lo / "src" / "a").write_text("a\n")
    (hi / "pkg").mkdir(parents=True)
    os.setxattr(hi / "pkg", L.REDIRECT_XATTR, b"src")
    L.make_whiteout(os.fsencode(hi / "src"))
    from snapshot.errors import SnapshotError
    with pytest.raises(SnapshotError, match="renamed directory"):
        list(L.merged_walk([os.fsencode(hi), os.fsencode(lo)]))
