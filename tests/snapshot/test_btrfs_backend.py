"""The btrfs backend on a real btrfs (a loop image from tests/helpers/loopfs.py), as root and as a
normal user; ``convert_to_subvolume`` and ``check_btrfs`` too."""
from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

btrfsutil = pytest.importorskip("btrfsutil", reason="btrfsutil (python binding of libbtrfsutil) not installed")

from snapshot.backend import Backend  # noqa: E402
from snapshot.backends.btrfs import (  # noqa: E402
    BtrfsBackend, check_btrfs, convert_to_subvolume, is_subvolume)
from snapshot.errors import BackendUnavailable, SnapshotError, TreeChangedDuringCopy  # noqa: E402
from snapshot.store import Store  # noqa: E402
from tests.helpers.loopfs import User, run_as  # noqa: E402


REPO = Path(__file__).resolve().parents[2]
ODD = b"odd \n\xff name"


def populate(ws: Path) -> None:
    (ws / "a.txt").write_text("alpha\n")
    os.chmod(ws / "a.txt", 0o640)
    os.link(ws / "a.txt", ws / "a-link.txt")
    (ws / "bin").mkdir()
    (ws / "bin" / "run").write_text("#!/bin/sh\necho hi\n")
    os.chmod(ws / "bin" / "run", 0o755)
    os.symlink("a.txt", ws / "sym")
    (ws / "empty").mkdir()
    (ws / ".env").write_text("SECRET=1\n")
    with open(os.fsencode(ws) + b"/" + ODD, "wb") as f:
        f.write(b"odd bytes\x00\xff")
    os.setxattr(ws / "a.txt", "user.petri", b"kept")


def state(root: Path) -> dict[bytes, tuple]:
    """Everything a snapshot must reproduce, keyed by relative name, ``.petri`` left out;
    hard links show as the same group number."""
    out: dict[bytes, tuple] = {}
    groups: dict[int, int] = {}
    top = os.fsencode(root)
    for dirpath, dirnames, filenames in os.walk(top):
        if dirpath == top and b".petri" in dirnames:
            dirnames.remove(b".petri")
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            rel = os.path.relpath(p, top)
            if stat.S_ISLNK(st.st_mode):
                body = os.readlink(p)
            elif stat.S_ISREG(st.st_mode):
                body = open(p, "rb").read()
            else:
                body = None
            group = groups.setdefault(st.st_ino, len(groups)) if stat.S_ISREG(st.st_mode) and st.st_nlink > 1 else None
            xattr = os.getxattr(p, "user.petri", follow_symlinks=False) if stat.S_ISREG(st.st_mode) and \
                "user.petri" in os.listxattr(p, follow_symlinks=False) else None
            out[rel] = (st.st_mode, st.st_uid, st.st_gid, st.st_mtime_ns if not stat.S_ISDIR(st.st_mode) else None,
                        body, group, xattr)
    return out


def subvolumes_under(path: Path) -> list[Path]:
    found = []
    for dirpath, dirnames, _ in os.walk(path):
        for d in dirnames:
            p = Path(dirpath) / d
            if not p.is_symlink() and is_subvolume(p):
                found.append(p)
    return found


@pytest.fixture
def backend() -> BtrfsBackend:
    return BtrfsBackend()


@pytest.fixture
def store(btrfs_dir: Path, backend: BtrfsBackend) -> Store:
    ws = btrfs_dir / "ws"
    btrfsutil.create_subvolume(ws)
    populate(ws)
    s = Store(ws)
    backend.create_store(s)
    return s


def test_implements_the_protocol(backend):
    assert isinstance(backend, Backend)
    assert backend.instant is True and backend.name == "btrfs"


def test_store_is_a_nested_subvolume_that_snapshots_skip(store, backend):
    assert is_subvolume(store.root)
    (store.root / "registry.db").write_text("rows")
    backend.snapshot(store, "s-1", None)
    with backend.snapshot_view(store, "s-1") as tree:
        assert is_subvolume(tree)
        # btrfs leaves an empty directory where a nested subvolume was.
        assert os.listdir(tree / ".petri") == []
        assert state(tree) == state(store.workspace)


def test_create_store_needs_a_subvolume_workspace(btrfs_dir, backend):
    plain = btrfs_dir / "plain"
    plain.mkdir()
    with pytest.raises(BackendUnavailable) as e:
        backend.create_store(Store(plain))
    assert "--convert" in str(e.value) and e.value.exit_code == 4


def test_create_store_refuses_a_plain_nonempty_store(btrfs_dir, backend):
    ws = btrfs_dir / "ws"
    btrfsutil.create_subvolume(ws)
    (ws / ".petri").mkdir()
    (ws / ".petri" / "x").write_text("x")
    with pytest.raises(SnapshotError, match="nested subvolume"):
        backend.create_store(Store(ws))
    # An empty plain one is replaced by a subvolume.
    os.unlink(ws / ".petri" / "x")
    backend.create_store(Store(ws))
    assert is_subvolume(ws / ".petri")


def test_snapshot_is_o1_and_read_only(store, backend):
    block = os.urandom(1 << 20)
    with open(store.workspace / "big", "wb") as f:
        for _ in range(200):
            f.write(block)
    btrfsutil.sync(store.workspace)
    t0 = time.monotonic()
    result = backend.snapshot(store, "s-big", None)
    elapsed = time.monotonic() - t0
    assert result.bytes_copied == 0
    tree = store.snapshot_dir("s-big") / "tree"
    btrfsutil.sync(tree)
    du = subprocess.run(["btrfs", "filesystem", "du", "-s", "--raw", str(tree)],
                        capture_output=True, text=True, check=True).stdout.splitlines()[-1].split()
    total, exclusive = int(du[0]), int(du[1])
    assert total >= 200 << 20, du
    assert exclusive < 1 << 20, f"the snapshot holds {exclusive} bytes of its own: data was copied"
    assert elapsed < 2.0, f"snapshot of a 200 MB tree took {elapsed:.2f}s"
    assert btrfsutil.get_subvolume_read_only(tree)
    for attempt in (lambda: (tree / "new").write_text("x"),
                    lambda: (tree / "a.txt").write_text("changed"),
                    lambda: os.unlink(tree / "a.txt")):
        with pytest.raises(OSError) as e:
            attempt()  # even root: a read-only subvolume refuses every write
        assert e.value.errno == errno.EROFS


def test_point_in_time_and_isolation(store, backend):
    backend.snapshot(store, "s-1", None)
    a = backend.clone(store, "s-1", "sb-a")
    b = backend.clone(store, "s-1", "sb-b")
    assert a == store.sandbox_tree("sb-a") and is_subvolume(a)
    assert not btrfsutil.get_subvolume_read_only(a)
    before = state(store.workspace)
    assert state(a) == before and state(b) == before
    # A live edit after the snapshot reaches neither the snapshot nor its clones.
    (store.workspace / "a.txt").write_text("live edit\n")
    (store.workspace / "live-new").write_text("x")
    assert (a / "a.txt").read_text() == "alpha\n"
    assert not (a / "live-new").exists()
    # A sandbox write reaches neither live, nor the snapshot, nor the other sandbox.
    (a / "bin" / "run").write_text("sandbox edit\n")
    (a / "sb-new").write_text("y")
    os.unlink(a / "sym")
    assert (store.workspace / "bin" / "run").read_text() == "#!/bin/sh\necho hi\n"
    assert (b / "bin" / "run").read_text() == "#!/bin/sh\necho hi\n"
    assert not (b / "sb-new").exists() and (b / "sym").is_symlink()
    with backend.snapshot_view(store, "s-1") as tree:
        assert state(tree) == before
    # The store is in no sandbox: only the empty placeholder.
    assert os.listdir(a / ".petri") == []


def test_hard_links_modes_odd_names_kept(store, backend):
    backend.snapshot(store, "s-1", None)
    tree = backend.clone(store, "s-1", "sb-1")
    assert os.lstat(tree / "a.txt").st_ino == os.lstat(tree / "a-link.txt").st_ino
    assert stat.S_IMODE(os.lstat(tree / "a.txt").st_mode) == 0o640
    assert stat.S_IMODE(os.lstat(tree / "bin" / "run").st_mode) == 0o755
    with open(os.fsencode(tree) + b"/" + ODD, "rb") as f:
        assert f.read() == b"odd bytes\x00\xff"
    assert os.getxattr(tree / "a.txt", "user.petri") == b"kept"


def test_fork_of_a_fork(store, backend):
    backend.snapshot(store, "s-1", None)
    a = backend.clone(store, "s-1", "sb-a")
    (a / "from-a").write_text("a")
    # Snapshot of a sandbox: the orchestrator takes it through frozen_view + a clone of
    # that; here the snapshot API only snapshots live, so use the frozen view directly.
    with backend.frozen_view(store, "sb-a") as view:
        assert btrfsutil.get_subvolume_read_only(view)
        (a / "after-freeze").write_text("late")
        assert (view / "from-a").read_text() == "a"
        assert not (view / "after-freeze").exists()
        frozen = view
    assert not frozen.exists()


def test_delete_and_leftovers_as_root(store, backend):
    backend.snapshot(store, "s-1", None)
    backend.snapshot(store, "s-2", None)
    backend.clone(store, "s-1", "sb-1")
    backend.clone(store, "s-2", "sb-2")
    # What a crash leaves: a read-only subvolume with no row, a stray sandbox, half-made tmp.
    (store.tmp / "s-9.half").mkdir()
    btrfsutil.create_snapshot(store.workspace, store.tmp / "s-9.half" / "tree", read_only=True)
    found = backend.leftovers(store, {"s-1"}, {"sb-1"})
    assert sorted((x.kind, x.path) for x in found) == sorted([
        ("snapshot", store.snapshot_dir("s-2")),
        ("tree", store.sandbox_dir("sb-2")),
        ("tree", store.tmp / "s-9.half"),
    ])
    for leftover in found:
        backend.remove_leftover(store, leftover)
    assert backend.leftovers(store, {"s-1"}, {"sb-1"}) == []
    backend.destroy_clone(store, "sb-1")
    backend.delete_snapshot(store, "s-1")
    backend.delete_snapshot(store, "s-1")  # missing is not an error
    backend.destroy_clone(store, "sb-1")
    assert subvolumes_under(store.root) == []
    assert os.listdir(store.snapshots) == [] and os.listdir(store.sandboxes) == []
    assert os.listdir(store.tmp) == []


def test_failed_clone_leaves_nothing(store, backend):
    with pytest.raises(SnapshotError):
        backend.clone(store, "s-missing", "sb-1")
    backend.snapshot(store, "s-1", None)
    backend.clone(store, "s-1", "sb-1")
    with pytest.raises(SnapshotError):
        backend.clone(store, "s-1", "sb-1")  # the name is taken
    assert os.listdir(store.tmp) == []
    assert backend.leftovers(store, {"s-1"}, {"sb-1"}) == []


def test_snapshot_bytes_from_qgroups_only_when_enabled(store, backend):
    mount = store.workspace.parent.parent
    (store.workspace / "held").write_bytes(os.urandom(1 << 20))
    backend.snapshot(store, "s-1", None)
    assert backend.snapshot_bytes(store, "s-1") is None  # quotas off, and left off
    assert not Path(f"/sys/fs/btrfs/{_fsid_of(mount)}/qgroups").exists()
    subprocess.run(["btrfs", "quota", "enable", str(mount)], check=True)
    try:
        subprocess.run(["btrfs", "quota", "rescan", "-w", str(mount)], check=True, capture_output=True)
        os.unlink(store.workspace / "held")
        btrfsutil.sync(store.workspace)
        held = backend.snapshot_bytes(store, "s-1")
        assert held is not None and held >= 1 << 20
    finally:
        subprocess.run(["btrfs", "quota", "disable", str(mount)], check=True)


def _fsid_of(path: Path) -> str:
    from snapshot.backends.btrfs_generations import fsid as _fsid

    return _fsid(path)


# -- check_btrfs ------------------------------------------------------------------------

def test_check_btrfs_says_why(btrfs_dir, tmp_path):
    ok, why = check_btrfs(tmp_path)
    assert not ok and "not btrfs" in why
    plain = btrfs_dir / "plain"
    plain.mkdir()
    ok, why = check_btrfs(plain)
    assert not ok and "init --convert" in why
    btrfsutil.create_subvolume(btrfs_dir / "sv")
    ok, why = check_btrfs(btrfs_dir / "sv")
    assert ok and "O(1)" in why


# -- as a normal user ---------------------------------------------------------------------

def as_user(user: User, code: str, *args: object) -> str:
    prelude = f"import sys, json, os\nsys.path.insert(0, {str(REPO)!r})\n"
    r = run_as(user, [sys.executable, "-c", prelude + textwrap.dedent(code), *map(str, args)], cwd="/")
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_unprivileged_lifecycle(btrfs_dir, unprivileged_user):
    u = unprivileged_user
    os.chown(btrfs_dir, u.uid, u.gid)
    out = as_user(u, """
        from pathlib import Path
        import btrfsutil
        from snapshot.store import Store
        from snapshot.backends.btrfs import BtrfsBackend, check_btrfs, is_subvolume
        top = Path(sys.argv[1])
        ws = top / "ws"
        btrfsutil.create_subvolume(ws)
        (ws / "f").write_text("base")
        os.link(ws / "f", ws / "f2")
        b, s = BtrfsBackend(), Store(ws)
        res = {"check": check_btrfs(ws)}
        b.create_store(s)
        b.snapshot(s, "s-1", None)
        t = b.clone(s, "s-1", "sb-1")
        (t / "f").write_text("sandbox")
        res["live"] = (ws / "f").read_text()
        res["link"] = os.lstat(t / "f").st_ino == os.lstat(t / "f2").st_ino
        with b.frozen_view(s, "sb-1") as v:
            res["frozen"] = (v / "f").read_text()
        # No tree search without root: the lstat walk, which makes nothing either.
        tmp_before = os.listdir(s.tmp)
        c = b.change_candidates(s, "sb-1", "s-1", "s-1")
        res["cands"] = [c.source, sorted(p.decode() for p in c.paths)]
        (ws / "g").write_text("live")
        with b.live_candidates(s, "s-1", lambda top: False) as got:
            res["live_cands"] = [got[2].source, sorted(p.decode() for p in got[2].paths)]
        res["made"] = sorted(set(os.listdir(s.tmp)) - set(tmp_before))
        b.destroy_clone(s, "sb-1")
        b.delete_snapshot(s, "s-1")
        res["left"] = os.listdir(s.tmp) + os.listdir(s.snapshots) + os.listdir(s.sandboxes)
        res["subvols"] = [str(p) for p in (t, s.snapshot_dir("s-1") / "tree") if os.path.lexists(p)]
        print(json.dumps(res))
    """, btrfs_dir)
    res = json.loads(out)
    assert res["check"][0] is True and "user_subvol_rm_allowed" in res["check"][1]
    assert res["live"] == "base" and res["link"] is True and res["frozen"] == "sandbox"
    assert res["cands"] == ["inode-keys", ["f", "f2"]]  # both names of the hard link
    assert res["live_cands"] == ["inode-keys", ["g"]] and res["made"] == []
    assert res["left"] == [] and res["subvols"] == []
    # Only the workspace and its store remain as subvolumes: every delete really deleted.
    assert sorted(subvolumes_under(btrfs_dir)) == [btrfs_dir / "ws", btrfs_dir / "ws" / ".petri"]


def test_check_btrfs_rejects_someone_elses_subvolume(btrfs_dir, unprivileged_user):
    btrfsutil.create_subvolume(btrfs_dir / "roots")
    out = as_user(unprivileged_user, """
        from snapshot.backends.btrfs import check_btrfs
        print(json.dumps(check_btrfs(sys.argv[1])))
    """, btrfs_dir / "roots")
    ok, why = json.loads(out)
    assert not ok and "only its owner or root" in why


# -- convert_to_subvolume -------------------------------------------------------------------

def test_convert_keeps_path_contents_modes_links(btrfs_dir):
    d = btrfs_dir / "proj"
    d.mkdir()
    populate(d)
    os.chown(d / "bin" / "run", 1234, 5678)
    os.chmod(d, 0o751)
    before = state(d)
    root_before = os.lstat(d)
    calls: list[tuple[int, int]] = []
    convert_to_subvolume(d, lambda done, total: calls.append((done, total)))
    assert is_subvolume(d)
    assert state(d) == before
    st = os.lstat(d)
    assert stat.S_IMODE(st.st_mode) == 0o751 and st.st_mtime_ns == root_before.st_mtime_ns
    assert calls and calls[-1][0] == calls[-1][1]
    assert sorted(os.listdir(btrfs_dir)) == ["proj"]  # no temp name left beside it
    convert_to_subvolume(d)  # already a subvolume: nothing to do
    assert state(d) == before


def test_convert_refuses_a_nested_subvolume(btrfs_dir):
    d = btrfs_dir / "proj"
    d.mkdir()
    (d / "f").write_text("x")
    btrfsutil.create_subvolume(d / "inner")
    with pytest.raises(SnapshotError, match="nested subvolume"):
        convert_to_subvolume(d)
    assert not is_subvolume(d) and (d / "f").read_text() == "x"
    assert sorted(os.listdir(btrfs_dir)) == ["proj"]


def test_convert_failure_leaves_the_original_exactly(btrfs_dir, unprivileged_user):
    """A real failure mid-copy: the user cannot read a root-owned 0600 file in its tree."""
    u = unprivileged_user
    os.chown(btrfs_dir, u.uid, u.gid)
    d = btrfs_dir / "proj"
    d.mkdir()
    populate(d)
    for p in [d, *d.rglob("*")]:
        os.chown(p, u.uid, u.gid, follow_symlinks=False)
    (d / "zz-secret").write_text("root only")
    os.chmod(d / "zz-secret", 0o600)
    before, ino = state(d), os.lstat(d).st_ino
    out = as_user(u, """
        from snapshot.backends.btrfs import convert_to_subvolume
        from snapshot.errors import PetriError
        try:
            convert_to_subvolume(sys.argv[1])
        except PetriError as e:
            print(json.dumps([type(e).__name__, str(e)]))
    """, d)
    name, msg = json.loads(out)
    assert name == "SnapshotError" and "zz-secret" in msg and "Permission denied" in msg
    assert os.lstat(d).st_ino == ino and not is_subvolume(d)
    assert state(d) == before
    assert sorted(os.listdir(btrfs_dir)) == ["proj"]


def test_delete_tree_unprivileged_empties_read_only_subvolumes(btrfs_dir, unprivileged_user):
    u = unprivileged_user
    os.chown(btrfs_dir, u.uid, u.gid)
    out = as_user(u, """
        import btrfsutil
        from pathlib import Path
        from snapshot.backends.btrfs import delete_tree
        top = Path(sys.argv[1])
        btrfsutil.create_subvolume(top / "sv")
        (top / "sv" / "d").mkdir()
        (top / "sv" / "d" / "f").write_text("x")
        os.chmod(top / "sv" / "d", 0o500)
        btrfsutil.create_subvolume(top / "sv" / "nested")
        btrfsutil.create_snapshot(top / "sv", top / "holder-ro", read_only=True)
        try:
            btrfsutil.delete_subvolume(top / "holder-ro")
            print("privileged")
        except btrfsutil.BtrfsUtilError:
            pass
        delete_tree(top / "holder-ro")
        delete_tree(top / "sv")
        print(json.dumps(os.listdir(top)))
    """, btrfs_dir)
    assert json.loads(out) == []


# -- the shared conformance suite ---------------------------------------------------------

def _conformance_checks():
    from functools import partial

    from snapshot import conformance

    special = partial(conformance.check_ignored_and_special, keeps_hardlinks=True, keeps_sparse=True)
    special.__name__ = "check_ignored_and_special"
    return [*conformance.CHECKS, special]


@pytest.mark.parametrize("check", _conformance_checks(), ids=lambda c: c.__name__)
def test_conformance(btrfs_dir, check):
    from snapshot.conformance import Case, make_sample_tree

    ws = btrfs_dir / "ws"
    btrfsutil.create_subvolume(ws)
    make_sample_tree(ws)
    case = Case(BtrfsBackend(), ws)
    try:
        check(case)
    finally:
        case.cleanup()


# -- the loop fixture's own promise: a killed run's image is released ------------------------

def test_sweep_releases_only_a_killed_runs_loop_device(btrfs_mount):
    import signal

    from tests.helpers import loopfs

    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, time
            sys.path.insert(0, {str(REPO)!r})
            from tests.helpers import loopfs
            fs = loopfs.make_loopfs("btrfs")
            print(fs.device, fs.mount, fs.image, flush=True)
            time.sleep(120)
        """)], stdout=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline().split()
        assert len(line) == 3, "the child could not make a loop filesystem"
        device, mount, image = line
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    try:
        assert os.path.ismount(mount) and Path(image).exists()
        loopfs._detach_stale_images()
        assert not os.path.ismount(mount) and not Path(mount).exists()
        assert not Path(image).exists()
        listing = subprocess.run(["losetup", "--list", "--noheadings", "--output", "NAME,BACK-FILE"],
                                 capture_output=True, text=True).stdout
        assert image not in listing
        # This session's own filesystem is locked by its live owner: untouched.
        assert os.path.ismount(btrfs_mount)
    finally:
        loopfs.unmount_under(Path(mount))
        subprocess.run(["losetup", "-d", device], capture_output=True)
        Path(image).unlink(missing_ok=True)


def test_destroy_store_removes_every_subvolume(store, backend):
    backend.snapshot(store, "s-1", None)
    backend.clone(store, "s-1", "sb-1")
    backend.destroy_store(store)
    assert not store.root.exists()
    assert subvolumes_under(store.workspace) == []
    assert (store.workspace / "a.txt").read_text() == "alpha\n"


def test_convert_aborts_when_the_tree_moves_before_the_swap(btrfs_dir):
    """An editor saving after its file was copied must not be lost by the swap."""
    d = btrfs_dir / "proj"
    d.mkdir()
    populate(d)

    def edit_when_copied(done: int, total: int) -> None:
        if total and done == total:
            (d / "a.txt").write_text("saved meanwhile\n")

    with pytest.raises(TreeChangedDuringCopy, match="kept changing"):
        convert_to_subvolume(d, edit_when_copied)
    assert not is_subvolume(d)
    assert (d / "a.txt").read_text() == "saved meanwhile\n"
    assert sorted(os.listdir(btrfs_dir)) == ["proj"]


def test_convert_as_the_owner(btrfs_dir, unprivileged_user):
    u = unprivileged_user
    os.chown(btrfs_dir, u.uid, u.gid)
    d = btrfs_dir / "proj"
    d.mkdir()
    populate(d)
    for p in [d, *d.rglob("*")]:
        os.chown(p, u.uid, u.gid, follow_symlinks=False)
    before = state(d)
    as_user(u, """
        from snapshot.backends.btrfs import convert_to_subvolume
        convert_to_subvolume(sys.argv[1])
    """, d)
    assert is_subvolume(d) and state(d) == before
    assert os.lstat(d).st_uid == u.uid
    assert sorted(os.listdir(btrfs_dir)) == ["proj"]


def test_fork_from_live_clones_the_same_snapshot_while_live_is_unchanged(btrfs_dir):
    """One implicit snapshot for many forks of an unchanged live; a new one as soon as live
    moved, by a transaction or only in the page cache (a write in place, not yet written
    back, moves no generation: the check must still see it)."""
    from orchestrator.engine import Engine
    ws = btrfs_dir / "ws"
    btrfsutil.create_subvolume(ws)
    populate(ws)
    e, _ = Engine.init(ws, "btrfs")
    try:
        first = e.fork("live")[0]
        for _ in range(8):
            assert e.fork("live")[0].base == first.base
        os.sync()  # nothing waits anywhere: proved by generation alone, no walk
        assert e.backend.live_unchanged_since(e.store, first.base, budget_s=0)
        assert e.fork("live")[0].base == first.base
        assert [s.kind for s in e.registry.snapshots()] == ["user", "implicit"]
        from snapshot.backends.btrfs_generations import subvol_info
        before = subvol_info(ws).ctransid
        with open(ws / "a.txt", "r+b") as f:
            f.write(b"A")  # in place: same inode, and no transaction until it is written back
        assert subvol_info(ws).ctransid == before  # the generation cannot tell; the walk does
        row = e.fork("live")[0]
        assert row.base != first.base and (Path(row.path) / "a.txt").read_text() == "Alpha\n"
        # A new file moves the generation at once.
        (ws / "new.txt").write_text("n\n")
        row2 = e.fork("live")[0]
        assert row2.base != row.base and (Path(row2.path) / "new.txt").exists()
        # With writes waiting and no time to walk, a new snapshot rather than a guess.
        assert e.fork("live")[0].base == row2.base
        (ws / ".petri" / "scratch").write_bytes(b"x" * 65536)  # dirty data on the same filesystem
        assert not e.backend.live_unchanged_since(e.store, row2.base, budget_s=0)
        assert e.backend.live_unchanged_since(e.store, row2.base)
    finally:
        e.deinit(force=True)
