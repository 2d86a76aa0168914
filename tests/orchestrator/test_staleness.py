"""Staleness is content-based: an editor's tmp+rename save, a same-size edit with the mtime
put back, and a touch with no content change are told apart, on the stat-cache path (copy,
overlay, fuse) and both btrfs paths (generations, inode keys); overlapping and read_changed;
one walk per base within a listing, a fresh look outside one; nothing written."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from orchestrator import staleness as S
from orchestrator.engine import Engine
from snapshot.layers import layer_lookup
from tests.conftest import petri


def w(p: Path, data: str | bytes) -> None:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data.encode() if isinstance(data, str) else data)


def make_tree(ws: Path) -> None:
    for i in range(20):
        w(ws / "src" / f"f{i}.txt", f"line {i}\n")
    w(ws / "editor.txt", "before\n")
    w(ws / "samesize.txt", "AAAA\n")
    w(ws / "touched.txt", "same\n")
    w(ws / "deleted.txt", "bye\n")
    w(ws / ".gitignore", "*.log\n")
    os.symlink("src/f1.txt", ws / "link")


def fresh(e: Engine, sb) -> dict:
    """A new engine each time, as for a new `petri ls` (the caches of content ids and of the
    stat walk's verdicts are the process's, as in the TUI or the MCP server)."""
    e2 = Engine.open(e.root)
    try:
        return S.staleness(e2, e2.registry.sandbox(sb.id))
    finally:
        e2.close()


def age_files(ws: Path) -> None:
    """Make the base's files older than the racy windows (the snapshot was just taken)."""
    old = time.time() - 3600
    for dp, _dn, fn in os.walk(ws):
        if ".petri" in dp.split(os.sep):
            continue
        for n in fn:
            os.utime(os.path.join(dp, n), (old, old), follow_symlinks=False)


def scenario(e: Engine, ws: Path, sb_tree: Path, sb) -> None:
    st0 = fresh(e, sb)
    assert st0["live_changed"] == 0 and st0["overlapping"] == [], st0
    # a touch: stat moves, content does not
    os.utime(ws / "touched.txt")
    # a same-size edit with mtime (and atime) restored: only ctime betrays it
    before = os.stat(ws / "samesize.txt")
    with open(ws / "samesize.txt", "r+b") as f:
        f.write(b"BBBB")
    os.utime(ws / "samesize.txt", ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(ws / "samesize.txt").st_size == before.st_size
    # an editor's save: write a temp file, rename it over (a new inode)
    w(ws / ".editor.txt.swp", "after\n")
    os.rename(ws / ".editor.txt.swp", ws / "editor.txt")
    # an editor's save with identical content: new inode, same bytes
    w(ws / ".f2.tmp", "line 2\n")
    os.rename(ws / ".f2.tmp", ws / "src" / "f2.txt")
    (ws / "deleted.txt").unlink()
    w(ws / "added.txt", "new\n")
    w(ws / "noise.log", "ignored\n")
    # the sandbox changed editor.txt too, and src/f5.txt (which live did not)
    w(sb_tree / "editor.txt", "sandbox\n")
    w(sb_tree / "src" / "f5.txt", "sb\n")
    st = fresh(e, sb)
    changed = {"samesize.txt", "editor.txt", "deleted.txt", "added.txt"}
    assert st["live_changed"] == len(changed), st
    assert st["overlapping"] == ["editor.txt"], st
    assert st["results_may_not_hold"] is True
    # again (the cache answers now): the same verdicts
    assert fresh(e, sb) == st
    # undo the live changes by content: fresh again
    w(ws / "editor.txt", "before\n")
    w(ws / "samesize.txt", "AAAA\n")
    w(ws / "deleted.txt", "bye\n")
    (ws / "added.txt").unlink()
    st2 = fresh(e, sb)
    assert st2["live_changed"] == 0 and st2["overlapping"] == [], st2


@pytest.fixture
def copy_ws(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    make_tree(ws)
    age_files(ws)
    e, _ = Engine.init(ws, "copy")
    yield e, ws
    e.deinit(force=True)


def test_statcache_copy_backend(copy_ws):
    e, ws = copy_ws
    sb = e.fork("live")[0]
    scenario(e, ws, Path(sb.path), sb)
    assert fresh(e, sb)["method"] == "statcache"
    assert not (e.store.root / "statcache").exists()  # a look writes nothing in the store


def test_statcache_rehashes_only_what_moved(copy_ws, monkeypatch):
    e, ws = copy_ws
    sb = e.fork("live")[0]
    time.sleep(0.1)  # files set up just now are racily clean: the warm call would not cache them
    fresh(e, sb)  # warm
    hashed = []
    real = S.entry_of
    # count reads of live files only (the base side is read once per path and cached)
    monkeypatch.setattr(S, "entry_of", lambda p: (b"/.petri/" not in p and hashed.append(p)) or real(p))
    w(ws / "src" / "f7.txt", "changed\n")
    st = fresh(e, sb)
    assert st["live_changed"] == 1
    assert [os.path.basename(p) for p in hashed] == [b"f7.txt"], hashed
    hashed.clear()
    assert fresh(e, sb)["live_changed"] == 1
    # just written: racily clean, so rehashed once more, then cached
    time.sleep(0.1)
    fresh(e, sb)
    hashed.clear()
    fresh(e, sb)
    assert hashed == []


def test_ls_walks_live_once_per_base(copy_ws, monkeypatch):
    e, ws = copy_ws
    e.fork("live", 3)
    calls = []
    real = S.live_changes_statcache
    monkeypatch.setattr(S, "live_changes_statcache", lambda eng, b, **k: calls.append(b) or real(eng, b, **k))
    e2 = Engine.open(ws)
    try:
        with S.one_look(e2):
            docs = [S.staleness(e2, r) for r in e2.registry.sandboxes()]
        assert len(docs) == 3 and all(d["live_changed"] == 0 for d in docs)
        assert len(calls) == 1
        # A long-lived engine (the TUI's, the MCP server's) sees live move: each listing
        # looks afresh.
        w(ws / "editor.txt", "moved\n")
        with S.one_look(e2):
            assert [S.staleness(e2, r)["live_changed"] for r in e2.registry.sandboxes()] == [1, 1, 1]
        assert len(calls) == 2
    finally:
        e2.close()


def test_ls_and_status_show_staleness(copy_ws):
    e, ws = copy_ws
    sb = e.fork("live", label="one")[0]
    w(ws / "editor.txt", "live edit\n")
    w(Path(sb.path) / "editor.txt", "sb edit\n")
    r = petri("--json", "ls", cwd=ws)
    assert r.rc == 0, r
    stale = r.json["sandboxes"][0]["stale"]
    assert stale["live_changed"] == 1 and stale["overlapping"] == ["editor.txt"]
    r = petri("status", "one", cwd=ws)
    assert r.rc == 0 and "live changed 1 file since, 1 of them yours" in r.out and " s old; " in r.out, r
    assert "also changed here: editor.txt" in r.out


@pytest.mark.skipif(os.geteuid() != 0, reason="the tree search and loop mounts need root")
def test_btrfs_paths(btrfs_dir):
    import btrfsutil
    ws = btrfs_dir / "ws"
    btrfsutil.create_subvolume(ws)
    make_tree(ws)
    e, _ = Engine.init(ws, "btrfs")
    try:
        sb = e.fork("live")[0]
        subvolumes = sorted(btrfsutil.SubvolumeIterator(str(ws)))
        scenario(e, ws, Path(sb.path), sb)
        assert fresh(e, sb)["method"] == "inode-keys"  # the scenario's writes wait in the page cache
        # once committed and written back, the tree search answers, with the same verdicts
        w(ws / "editor.txt", "after\n")
        (ws / "deleted.txt").unlink()
        os.sync()
        st = fresh(e, sb)
        assert st["method"] == "btrfs-generation", st
        assert st["live_changed"] == 2 and st["overlapping"] == ["editor.txt"], st  # the sandbox kept its edit
        # no snapshot of live, no view, nothing in tmp/
        assert sorted(btrfsutil.SubvolumeIterator(str(ws))) == subvolumes
        assert not list(e.store.tmp.iterdir())
    finally:
        e.deinit(force=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="kernel overlay mounts need root")
def test_overlay_statcache_reads_base_from_layers(tmp_path):
    from snapshot.backends.overlay import OverlayBackend
    ws = tmp_path / "ws"
    ws.mkdir()
    if not OverlayBackend.available(ws)[0]:
        pytest.skip("overlay unavailable here")
    make_tree(ws)
    age_files(ws)
    e, _ = Engine.init(ws, "overlay")
    try:
        sb = e.fork("live")[0]
        scenario(e, ws, Path(sb.path), sb)
    finally:
        e.deinit(force=True)


def test_fuse_read_changed(tmp_path):
    from snapshot.backends.fuse import FuseBackend
    ws = tmp_path / "ws"
    ws.mkdir()
    if not FuseBackend.available(ws)[0]:
        pytest.skip("fuse unavailable here")
    make_tree(ws)
    age_files(ws)
    e, _ = Engine.init(ws, "fuse")
    try:
        sb = e.fork("live")[0]
        (Path(sb.path) / "src" / "f3.txt").read_bytes()  # the sandbox reads f3
        w(ws / "src" / "f3.txt", "live moved\n")
        w(ws / "src" / "f4.txt", "live moved\n")
        st = fresh(e, sb)
        assert st["live_changed"] == 2
        assert st["read_changed"] == ["src/f3.txt"] and st["overlapping"] == []
        assert st["results_may_not_hold"] is True
    finally:
        e.deinit(force=True)


def test_layer_lookup_matches_merged_walk(tmp_path):
    """The no-mount reader of a base resolves paths exactly as the layer oracle does."""
    from snapshot.layers import make_whiteout, merged_walk, set_opaque
    lo, hi = tmp_path / "lo", tmp_path / "hi"
    w(lo / "a" / "x", "lo-x")
    w(lo / "a" / "y", "lo-y")
    w(lo / "b" / "z", "lo-z")
    w(lo / "c", "lo-c")
    w(lo / "d" / "q", "lo-q")
    w(hi / "a" / "x", "hi-x")
    (hi / "b").mkdir(parents=True)
    set_opaque(os.fsencode(hi / "b"))
    w(hi / "b" / "new", "hi-new")
    try:
        make_whiteout(os.fsencode(hi / "c"))
    except PermissionError:
        pytest.skip("cannot make a whiteout here")
    w(hi / "d", "now a file")
    layers = [os.fsencode(hi), os.fsencode(lo)]
    want = {rel: path for rel, path, st in merged_walk(layers)}
    for rel in [b"a/x", b"a/y", b"b/z", b"b/new", b"c", b"d", b"d/q", b"nope", b"a", b"b"]:
        assert layer_lookup(layers, rel) == want.get(rel), rel


def test_copy_manifest_marks_racy_entries():
    from snapshot.backends.copy import RACY_SIZE, RACY_WINDOW_NS, manifest_data
    from snapshot.tree import StatKey
    t = 1_000_000_000_000
    got = manifest_data({b"old": StatKey(1, 5, t - 2 * RACY_WINDOW_NS, t - 2 * RACY_WINDOW_NS, 0o100644),
                         b"mtime": StatKey(2, 5, t, t - 2 * RACY_WINDOW_NS, 0o100644),
                         b"ctime": StatKey(3, 5, t - 2 * RACY_WINDOW_NS, t - RACY_WINDOW_NS // 2, 0o100644)}, t)
    assert got[b"old"][1] == 5
    assert got[b"mtime"][1] == RACY_SIZE and got[b"ctime"][1] == RACY_SIZE


def test_racy_clean_same_size_edit_is_caught(copy_ws):
    """A same-size edit landing in the snapshot's own timestamp tick, after the copier took
    its stat: the manifest's key equals live's, so only the racy mark saves the verdict."""
    from snapshot.backends.copy import _save_manifest
    from snapshot.tree import StatKey
    e, ws = copy_ws
    sb = e.fork("live")[0]
    started_ns = time.time_ns()
    with open(ws / "samesize.txt", "r+b") as f:
        f.write(b"BBBB")
    mpath = e.store.snapshot_dir(sb.base) / "manifest"
    from snapshot.backends.copy import load_manifest
    manifest = load_manifest(mpath)
    manifest[b"samesize.txt"] = StatKey.of(os.lstat(ws / "samesize.txt"))  # as the copier saw it
    _save_manifest(mpath, manifest, started_ns)
    st = fresh(e, sb)
    assert st["live_changed"] == 1, st
    # and the cache that look left behind does not forget it
    time.sleep(0.1)
    assert fresh(e, sb)["live_changed"] == 1


def test_first_look_trusts_the_copy_manifest(tmp_path, monkeypatch):
    """Files that settled before the snapshot are trusted from its manifest on the very
    first look: only what moved since is hashed (live and base side)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    make_tree(ws)
    age_files(ws)
    time.sleep(0.1)  # out of the snapshot's racy window (age_files moved every ctime)
    e, _ = Engine.init(ws, "copy")
    try:
        _first_look(e, ws, monkeypatch)
    finally:
        e.deinit(force=True)


def _first_look(e, ws, monkeypatch):
    sb = e.fork("live")[0]
    hashed = []
    real = S.entry_of
    monkeypatch.setattr(S, "entry_of", lambda p: hashed.append(p) or real(p))
    w(ws / "src" / "f7.txt", "changed\n")
    time.sleep(0.1)
    assert fresh(e, sb)["live_changed"] == 1
    live_side = [p for p in hashed if b"/.petri/" not in p]
    assert [os.path.basename(p) for p in live_side] == [b"f7.txt"], hashed


def test_nested_gitignore_and_info_exclude(copy_ws):
    e, ws = copy_ws
    sb = e.fork("live")[0]
    w(ws / "src" / "deep" / ".gitignore", "*.tmp\nbuild/\n")
    w(ws / "src" / "deep" / "x.tmp", "ignored\n")
    w(ws / "src" / "deep" / "build" / "out.o", "ignored\n")
    w(ws / "src" / "y.tmp", "not ignored here\n")
    w(ws / ".git" / "info" / "exclude", "*.bak\n")
    w(ws / "src" / "z.bak", "excluded\n")
    time.sleep(0.1)
    st = fresh(e, sb)
    # the new .gitignore itself and y.tmp count; the rest is ignored
    assert st["live_changed"] == 2, st
    (ws / ".git" / "info" / "exclude").unlink()
    assert fresh(e, sb)["live_changed"] == 3


def _listing(ws: Path) -> dict[str, dict]:
    """What `petri ls` computes: every sandbox's staleness within one look, by sandbox id."""
    e2 = Engine.open(ws)
    try:
        with S.one_look(e2):
            return {r.id: S.staleness(e2, r) for r in e2.registry.sandboxes()}
    finally:
        e2.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="the tree search and loop mounts need root")
def test_btrfs_promote_and_undo_reads_each_file_once(btrfs_dir, monkeypatch):
    """After a promotion and its undo, the paths it rewrote hold their old bytes in new
    inodes: candidates against every older base, compared by content. A base file several
    bases hold unchanged is read once for all of them, a live file once; the verdicts stay
    content-based (a same-size edit between two bases, mtime put back, is still told apart)."""
    import btrfsutil
    ws = btrfs_dir / "ws"
    btrfsutil.create_subvolume(ws)
    make_tree(ws)
    for i in range(30):
        w(ws / "lib" / f"m{i}.txt", f"module {i}\n" * (i + 1))
    w(ws / "x.txt", "AAAA\n")
    time.sleep(0.1)  # older than the snapshots by the racy margin
    e, _ = Engine.init(ws, "btrfs")
    try:
        sb0 = e.fork("live")[0]
        # between the bases: x.txt edited in place, same size, its mtime put back
        before = os.stat(ws / "x.txt")
        with open(ws / "x.txt", "r+b") as f:
            f.write(b"BBBB")
        os.utime(ws / "x.txt", ns=(before.st_atime_ns, before.st_mtime_ns))
        time.sleep(0.1)
        sb1 = e.fork("live")[0]
        w(ws / "moved.txt", "two\n")
        time.sleep(0.1)
        sb2 = e.fork("live")[0]
        assert len({sb0.base, sb1.base, sb2.base}) == 3
        prom = e.fork("live")[0]
        for i in range(30):
            w(Path(prom.path) / "lib" / f"m{i}.txt", f"changed {i}\n")
        r = petri("--json", "promote", prom.id, cwd=ws)
        assert r.rc == 0 and len(r.json["applied"]) == 30, r
        assert petri("--json", "rollback", r.json["promotion"], cwd=ws).rc == 0
        # x.txt back to what the first base holds, in a new inode (as the undo left lib/)
        w(ws / ".x.tmp", "AAAA\n")
        os.rename(ws / ".x.tmp", ws / "x.txt")
        time.sleep(0.1)

        reads: list[bytes] = []
        real = S.read_content_id
        monkeypatch.setattr(S, "read_content_id", lambda p, st: reads.append(p) or real(p, st))
        from snapshot.backends.btrfs import BtrfsBackend
        # each base compared on its own (as without the tree search: not root), then not
        for per_base in (True, False):
            with monkeypatch.context() as m:
                m.setattr(S, "_CIDS", {})
                m.setattr(S, "_ORIGIN_CIDS", {}, raising=False)
                if per_base:
                    m.setattr(BtrfsBackend, "snapshots_differ", lambda *a: None, raising=False)
                reads.clear()
                _check_reads(_listing(ws), reads, sb0, sb1, sb2)
    finally:
        e.deinit(force=True)


def _check_reads(docs: dict, reads: list[bytes], sb0, sb1, sb2) -> None:
    # sb0's base holds x.txt as AAAA (fresh), moved.txt is new since; sb1's holds BBBB
    assert docs[sb0.id]["live_changed"] == 1, docs[sb0.id]
    assert docs[sb1.id]["live_changed"] == 2, docs[sb1.id]
    assert docs[sb2.id]["live_changed"] == 1, docs[sb2.id]
    lib = [p for p in reads if b"/lib/" in p]
    on_base = [p for p in lib if b"/.petri/" in p]
    on_live = [p for p in lib if b"/.petri/" not in p]
    assert len(on_live) == 30 and len(set(on_live)) == 30, sorted(on_live)
    # one read of each base file, whichever base it was found in (before: one per base)
    assert len({os.path.basename(p) for p in on_base}) == 30
    assert len(on_base) == 30, len(on_base)
    # x.txt: the two bases hold two contents under one inode number, both read
    assert len([p for p in reads if p.endswith(b"/x.txt") and b"/.petri/" in p]) >= 2


@pytest.mark.skipif(os.geteuid() != 0, reason="the tree search and loop mounts need root")
def test_btrfs_one_look_walks_live_once_for_bases_of_live(btrfs_dir, monkeypatch):
    """Within one listing, live is walked against one base; every other base of live is
    answered from that base's verdicts and where the two snapshots differ (their tree
    search). The verdicts are those of a walk per base, through renamed, new and removed
    directories, a chmod, a retargeted symlink and edits between the bases and after them."""
    import btrfsutil
    from snapshot.backends.btrfs import BtrfsBackend
    ws = btrfs_dir / "ws"
    btrfsutil.create_subvolume(ws)
    make_tree(ws)
    w(ws / "pkg" / "a" / "one.txt", "one\n")
    w(ws / "pkg" / "b" / "two.txt", "two\n")
    e, _ = Engine.init(ws, "btrfs")
    try:
        sbs = [e.fork("live")[0]]
        os.rename(ws / "pkg" / "a", ws / "pkg" / "a2")
        (ws / "deleted.txt").unlink()
        w(ws / "newdir" / "n.txt", "n\n")
        os.chmod(ws / "src" / "f3.txt", 0o600)
        sbs.append(e.fork("live")[0])
        w(ws / "editor.txt", "edited\n")
        import shutil
        shutil.rmtree(ws / "newdir")
        os.unlink(ws / "link")
        os.symlink("src/f4.txt", ws / "link")
        w(ws / "pkg" / "b" / "three.txt", "three\n")
        sbs.append(e.fork("live")[0])
        assert len({sb.base for sb in sbs}) == 3
        # live moves on after the last base
        w(ws / "src" / "f9.txt", "nine\n")
        os.rename(ws / "pkg" / "b", ws / "pkg" / "b2")
        w(ws / "deleted.txt", "bye\n")
        w(Path(sbs[1].path) / "editor.txt", "sandbox\n")
        # the oracle: each sandbox on its own, one walk of live each
        single = {sb.id: fresh(e, sb) for sb in sbs}
        walks = []
        real = BtrfsBackend._candidates
        monkeypatch.setattr(BtrfsBackend, "_candidates", lambda self, *a: walks.append(a) or real(self, *a))
        docs = _listing(ws)
        assert len(walks) == 1, walks
        assert sorted("+" in d["method"] for d in docs.values()) == [False, True, True], docs
        for sb in sbs:
            one, look = dict(single[sb.id]), dict(docs[sb.id])
            assert one.pop("method") in ("inode-keys", "btrfs-generation")
            assert look.pop("method").split("+")[0] in ("inode-keys", "btrfs-generation")
            assert look == one, (sb.id, look, one)
        # deleted.txt is back as the first base holds it: fresh there
        assert [single[sb.id]["live_changed"] for sb in sbs] == [9, 8, 6], single
        assert single[sbs[1].id]["overlapping"] == ["editor.txt"]
    finally:
        e.deinit(force=True)
