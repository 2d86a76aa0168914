"""The overlay backend on real kernel overlayfs over the host filesystem (root only)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from snapshot import layers as L
from snapshot.backend import Backend
from snapshot.backends.overlay import (SANDBOX_MOUNT_OPTIONS, OverlayBackend, is_overlay_mounted, mount_overlay,
                                       overlay_mounts_under, umount)
from snapshot.errors import SnapshotError
from snapshot.osutil import mounts, rmtree
from snapshot.store import Store

from tests.helpers.layers import settle, sweep_overlay_mounts, tree_signature, w

pytestmark = [pytest.mark.root,
              pytest.mark.skipif(os.geteuid() != 0, reason="kernel overlay mounts need root")]


@pytest.fixture(autouse=True, scope="module")
def _no_mounts_left(tmp_path_factory):
    base = os.fsencode(tmp_path_factory.getbasetemp())
    yield
    sweep_overlay_mounts(base)
    assert not overlay_mounts_under(base)


class Env:
    def __init__(self, base: Path, **kw) -> None:
        self.ws = base / "ws"
        self.ws.mkdir()
        self.store = Store(self.ws)
        self.be = OverlayBackend(**kw)
        self.be.create_store(self.store)
        self.n = 0

    def snap(self, parent: str | None = None, settled: bool = True) -> tuple[str, dict]:
        """Take a snapshot; return its id and the signature live had just before."""
        if settled:
            settle()
        self.n += 1
        sid = f"s-{self.n}"
        sig = tree_signature(self.ws)
        self.last_result = self.be.snapshot(self.store, sid, parent)
        return sid, sig

    def view_sig(self, sid: str) -> dict:
        with self.be.snapshot_view(self.store, sid) as v:
            return tree_signature(v, frozenset())


@pytest.fixture
def env(tmp_path):
    e = Env(tmp_path)
    try:
        yield e
    finally:
        sweep_overlay_mounts(os.fsencode(tmp_path))
        rmtree(os.fsencode(tmp_path))


def populate(ws: Path) -> None:
    w(ws / "src/main.py", "print('hi')\n", 0o644)
    w(ws / "src/pkg/__init__.py", "")
    w(ws / "bin/run", "#!/bin/sh\necho run\n", 0o755)
    w(ws / ".env", "SECRET=1\n", 0o600)
    w(ws / "node_modules/x/index.js", "module.exports = 1\n")
    os.symlink("src/main.py", ws / "main")
    os.symlink("nowhere", ws / "dangling")
    (ws / "empty").mkdir()
    wsb = os.fsencode(ws)
    for name in (b"new\nline", b"inv\xffalid"):
        with open(os.path.join(wsb, name), "wb") as f:
            f.write(name)
    with open(ws / "sparse", "wb") as f:
        f.truncate(1 << 20)
        f.write(b"head")


def test_is_a_backend():
    assert isinstance(OverlayBackend(), Backend)
    assert OverlayBackend.name == "overlay" and OverlayBackend.instant is False


def test_available_here_and_not_on_overlay(env):
    ok, why = OverlayBackend.available(env.ws)
    assert ok, why
    populate(env.ws)
    env.snap()
    tree = env.be.clone(env.store, "s-1", "sb-a")
    ok, why = OverlayBackend.available(tree)
    assert not ok and "overlayfs" in why


def test_snapshot_chain_views_are_exact(env):
    populate(env.ws)
    assert env.be.estimate_bytes(env.store, None) > 0
    s1, sig1 = env.snap()
    first_bytes = env.last_result.bytes_copied
    settle()
    w(env.ws / "src/main.py", "print('changed')\n")
    os.chmod(env.ws / "bin/run", 0o700)
    shutil.rmtree(env.ws / "node_modules")
    (env.ws / "main").unlink()
    os.symlink("bin/run", env.ws / "main")
    w(env.ws / "added/deep/file", "new")
    settle()
    # the edited file, the new one, and the chmod'ed one (a mode change moves ctime)
    assert env.be.estimate_bytes(env.store, s1) == len("print('changed')\n") + len("new") + len("#!/bin/sh\necho run\n")
    s2, sig2 = env.snap(s1)
    assert 0 < env.last_result.bytes_copied < first_bytes
    settle()
    (env.ws / "src/pkg/__init__.py").unlink()
    (env.ws / "src/pkg").rmdir()
    w(env.ws / "src/pkg", "a file now")
    (env.ws / "empty").rmdir()
    w(env.ws / "empty/child", "a dir with a child now")
    s3, sig3 = env.snap(s2)
    assert len(env.be.layers_of(env.store, s3)) == 3
    assert env.view_sig(s1) == sig1
    assert env.view_sig(s2) == sig2
    assert env.view_sig(s3) == sig3
    assert sig1 != sig2 != sig3


def test_unchanged_live_shares_the_parent_stack(env):
    populate(env.ws)
    s1, _ = env.snap()
    s2, _ = env.snap(s1)
    assert env.last_result.bytes_copied == 0
    assert env.be.layers_of(env.store, s2) == env.be.layers_of(env.store, s1)


def test_clone_is_writable_point_in_time_and_isolated(env):
    populate(env.ws)
    s1, sig1 = env.snap()
    a = env.be.clone(env.store, s1, "sb-a")
    b = env.be.clone(env.store, s1, "sb-b")
    assert a == env.store.sandbox_tree("sb-a")
    assert is_overlay_mounted(os.fsencode(a)) and is_overlay_mounted(os.fsencode(b))
    assert tree_signature(a, frozenset()) == sig1  # the root's mode and times too
    # point in time: live moves on, the clone does not
    w(env.ws / "src/main.py", "live edit\n")
    assert (a / "src/main.py").read_text() == "print('hi')\n"
    # writable, and isolated from live and from each other
    w(a / "src/main.py", "sandbox a\n")
    (a / "bin/run").unlink()
    w(a / "newdir/f", "a only")
    assert (b / "src/main.py").read_text() == "print('hi')\n"
    assert (b / "bin/run").exists() and not (b / "newdir").exists()
    assert (env.ws / "src/main.py").read_text() == "live edit\n" and (env.ws / "bin/run").exists()
    assert env.view_sig(s1) == sig1  # the snapshot itself is untouched
    # what the sandbox changed is readable straight from its upper dir
    upper = os.fsencode(env.store.sandbox_dir("sb-a") / "upper")
    kinds = {rel: kind for rel, kind, _ in L.layer_entries(upper)}
    assert kinds[b"bin/run"] == "whiteout" and kinds[b"src/main.py"] == "file"


def test_ensure_clone_remounts_after_forced_umount(env):
    populate(env.ws)
    s1, _ = env.snap()
    tree = env.be.clone(env.store, s1, "sb-a")
    w(tree / "kept", "written before the 'reboot'")
    assert env.be.ensure_clone(env.store, "sb-a") == tree  # already mounted: no second mount
    assert sum(m.mountpoint == os.fsencode(tree) and m.fstype == "overlay" for m in mounts()) == 1
    umount(os.fsencode(tree))
    assert not is_overlay_mounted(os.fsencode(tree))
    assert env.be.ensure_clone(env.store, "sb-a") == tree
    assert is_overlay_mounted(os.fsencode(tree))
    assert (tree / "kept").read_text() == "written before the 'reboot'"
    assert (tree / "src/main.py").read_text() == "print('hi')\n"
    rec = json.loads((env.store.sandbox_dir("sb-a") / "mount.json").read_text())
    # remounted with the options its upper was made under (redirect_dir=on: see test_overlay_dir_rename)
    assert rec["layers"] == env.be.layers_of(env.store, s1) and rec["options"] == list(SANDBOX_MOUNT_OPTIONS)
    opts = next(ln for ln in open("/proc/self/mounts").read().splitlines() if f" {tree} " in ln)
    assert "redirect_dir=on" in opts and "userxattr" not in opts, opts


def test_destroy_leaves_no_mount_and_no_tree(env):
    populate(env.ws)
    s1, _ = env.snap()
    tree = env.be.clone(env.store, s1, "sb-a")
    w(tree / "x", "x")
    busy = subprocess.Popen(["sleep", "30"], cwd=tree)  # keeps the mount busy: lazy umount
    try:
        env.be.destroy_clone(env.store, "sb-a")
    finally:
        busy.kill()
        busy.wait()
    assert not overlay_mounts_under(os.fsencode(env.store.root))
    assert not env.store.sandbox_dir("sb-a").exists()
    env.be.destroy_clone(env.store, "sb-a")  # missing is fine


def test_frozen_view_is_point_in_time(env):
    populate(env.ws)
    s1, _ = env.snap()
    tree = env.be.clone(env.store, s1, "sb-a")
    w(tree / "src/main.py", "one\n")
    (tree / ".env").unlink()
    with env.be.frozen_view(env.store, "sb-a") as fv:
        frozen = tree_signature(fv, frozenset())
        assert frozen == tree_signature(tree, frozenset())
        w(tree / "src/main.py", "two\n")
        w(tree / "later", "later")
        assert (fv / "src/main.py").read_text() == "one\n"
        assert not (fv / "later").exists() and not (fv / ".env").exists()
        with pytest.raises(OSError):
            (fv / "ro").write_text("no")
        mp = os.fsencode(fv)
    assert not is_overlay_mounted(mp) and not os.path.exists(mp)
    assert not any(env.store.tmp.iterdir())


def test_single_layer_view_and_legacy_mount(tmp_path):
    e = Env(tmp_path, legacy_mount=True)
    try:
        populate(e.ws)
        s1, sig1 = e.snap()
        assert len(e.be.layers_of(e.store, s1)) == 1
        assert e.view_sig(s1) == sig1
        tree = e.be.clone(e.store, s1, "sb-a")
        assert tree_signature(tree, frozenset()) == sig1
        e.be.destroy_clone(e.store, "sb-a")
        assert not overlay_mounts_under(os.fsencode(tmp_path))
    finally:
        sweep_overlay_mounts(os.fsencode(tmp_path))
        rmtree(os.fsencode(tmp_path))


def test_delete_snapshot_refcounts_layers(env):
    populate(env.ws)
    s1, _ = env.snap()
    settle()
    w(env.ws / "f2", "two")
    s2, sig2 = env.snap(s1)
    settle()
    w(env.ws / "f3", "three" * 1000)
    s3, _ = env.snap(s2)
    l1, l2, l3 = env.be.layers_of(env.store, s3)
    assert env.be.snapshot_bytes(env.store, s3) > 0  # its top layer is its alone
    assert env.be.snapshot_bytes(env.store, s1) == 0  # shared with s2 and s3
    env.be.delete_snapshot(env.store, s3)
    assert not (env.store.layers / l3).exists() and (env.store.layers / l2).exists()
    env.be.delete_snapshot(env.store, s1)  # its layer is still s2's base
    assert (env.store.layers / l1).exists()
    assert env.view_sig(s2) == sig2
    env.be.delete_snapshot(env.store, s1)  # missing is fine
    env.be.delete_snapshot(env.store, s2)
    assert not any(env.store.layers.iterdir())


def test_leftovers_finds_leaks_and_removes_them(env):
    populate(env.ws)
    s1, _ = env.snap()
    env.be.clone(env.store, s1, "sb-a")
    assert env.be.leftovers(env.store, {s1}, {"sb-a"}) == []
    # a leaked view mount, a leaked layer, a stray sandbox dir
    leak = env.store.tmp / "leaked-view"
    (leak / "mnt").mkdir(parents=True)
    (leak / "e").mkdir()
    lowers = [os.fsencode(env.store.layers / env.be.layers_of(env.store, s1)[0]), os.fsencode(leak / "e")]
    mount_overlay(os.fsencode(leak / "mnt"), lowers, readonly=True)
    (env.store.layers / "ff").mkdir()
    (env.store.sandboxes / "sb-ghost").mkdir()
    found = env.be.leftovers(env.store, {s1}, {"sb-a"})
    kinds = {(lo.kind, lo.path.name) for lo in found}
    assert ("mount", "mnt") in kinds and ("layer", "ff") in kinds and ("tree", "sb-ghost") in kinds
    assert ("tree", "leaked-view") in kinds
    assert found[0].kind == "mount"  # mounts first, so the trees under them can go after
    for lo in found:
        env.be.remove_leftover(env.store, lo)
    assert env.be.leftovers(env.store, {s1}, {"sb-a"}) == []
    assert is_overlay_mounted(os.fsencode(env.store.sandbox_tree("sb-a")))
    # an unknown sandbox's mount is a leftover too
    found = env.be.leftovers(env.store, {s1}, set())
    assert ("mount", "tree") in {(lo.kind, lo.path.name) for lo in found}


def test_compaction_after_40_snapshots(tmp_path):
    e = Env(tmp_path)
    try:
        populate(e.ws)
        parent, sig = e.snap()
        depths = []
        for i in range(40):
            w(e.ws / f"gen/{i % 7}", f"generation {i}")
            if i % 5 == 0:
                w(e.ws / f"del{i}/f", "to be deleted")
            if i % 5 == 3:
                shutil.rmtree(e.ws / f"del{i - 3}")
            parent, sig = e.snap(parent, settled=False)
            depths.append(len(e.be.layers_of(e.store, parent)))
        assert max(depths) <= e.be.max_depth and min(depths) == 1  # compacted at least once
        assert e.view_sig(parent) == sig
        tree = e.be.clone(e.store, parent, "sb-a")
        assert tree_signature(tree, frozenset()) == sig
        w(tree / "gen/0", "sandbox write")
        assert (e.ws / "gen/0").read_text() != "sandbox write"
        e.be.destroy_clone(e.store, "sb-a")
    finally:
        sweep_overlay_mounts(os.fsencode(tmp_path))
        rmtree(os.fsencode(tmp_path))


def test_failed_snapshot_leaves_nothing(env):
    populate(env.ws)
    s1, _ = env.snap()
    before_layers = sorted(os.listdir(env.store.layers))
    with pytest.raises(SnapshotError):
        env.be.snapshot(env.store, "s-x", "s-missing-parent")
    w(env.ws / "more", "x")

    def boom(done, total):
        raise RuntimeError("interrupted")
    with pytest.raises(RuntimeError):
        env.be.snapshot(env.store, "s-y", s1, progress=boom)
    assert sorted(os.listdir(env.store.layers)) == before_layers
    assert not env.store.snapshot_dir("s-y").exists() and not env.store.snapshot_dir("s-x").exists()
    assert not any(env.store.tmp.iterdir())
