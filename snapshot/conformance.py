"""Behavioural checks every backend must pass (the way trio ships ``check_one_way_stream``).

Each ``check_*`` takes a backend and a fresh workspace directory the backend can host, builds
what it needs, asserts, and cleans up its own snapshots and clones. They use the Backend
protocol only, so a new backend is conformant when ``check_all`` passes on a real
filesystem of its kind.
"""
from __future__ import annotations

import os
import random
import stat
from pathlib import Path
from typing import Callable

import xxhash

from .backend import Backend
from .osutil import mounts_under
from .store import STORE_NAME, Store
from .tree import walk

EXCLUDE = frozenset({STORE_NAME.encode()})
ODD_NAMES = [b"with space.txt", b"new\nline.txt", b"bad-\xff\xfe-utf8.txt", b"-leading-dash", b"tab\there"]


def manifest(root: Path | bytes, exclude: frozenset[bytes] = EXCLUDE) -> dict[bytes, tuple]:
    """Everything a restore or clone must reproduce: kind, permission bits, owner, size, content
    digest or link target."""
    out: dict[bytes, tuple] = {}
    rootb = os.fsencode(root)
    for rel, st in walk(rootb, exclude):
        p = os.path.join(rootb, rel)
        kind = stat.S_IFMT(st.st_mode)
        if stat.S_ISREG(st.st_mode):
            with open(p, "rb") as f:
                digest = xxhash.xxh3_128(f.read()).hexdigest()
            out[rel] = ("f", stat.S_IMODE(st.st_mode), st.st_uid, st.st_size, digest, _user_xattrs(p))
        elif stat.S_ISLNK(st.st_mode):
            out[rel] = ("l", os.readlink(p))
        elif stat.S_ISDIR(st.st_mode):
            out[rel] = ("d", stat.S_IMODE(st.st_mode), st.st_uid, _user_xattrs(p))
        else:
            out[rel] = ("o", kind)
    return out


def _user_xattrs(path: bytes) -> tuple[tuple[str, bytes], ...]:
    """The ``user.`` xattrs a copy must carry (``user.overlay.*`` belongs to overlayfs)."""
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except OSError:
        return ()
    return tuple(sorted((n, os.getxattr(path, n, follow_symlinks=False)) for n in names
                        if n.startswith("user.") and not n.startswith("user.overlay.")))


def diff_manifests(a: dict, b: dict) -> list[str]:
    problems = []
    for k in sorted(set(a) | set(b)):
        if a.get(k) != b.get(k):
            problems.append(f"{k!r}: {a.get(k)} != {b.get(k)}")
    return problems


def make_sample_tree(root: Path) -> None:
    """A small project with the things clones get wrong: ignored env dirs, modes, symlinks,
    empty dirs, hard links, a sparse file, odd names."""
    r = os.fsencode(root)

    def w(rel: bytes, data: bytes, mode: int = 0o644) -> None:
        p = os.path.join(r, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data)
        os.chmod(p, mode)

    w(b"README.md", b"# sample\n")
    w(b"src/app.py", b"def add(a, b):\n    return a + b\n")
    w(b"src/run.sh", b"#!/bin/sh\necho run\n", 0o755)
    w(b".gitignore", b".env\nnode_modules/\n.venv/\n__pycache__/\n")
    w(b".env", b"SECRET=1\n", 0o600)
    w(b"node_modules/left-pad/index.js", b"module.exports = 1;\n")
    w(b".venv/bin/activate", b"# venv\n")
    os.symlink(b"/usr/bin/python3", os.path.join(r, b".venv/bin/python"))
    os.symlink(b"app.py", os.path.join(r, b"src/link-to-app"))
    os.symlink(b"does/not/exist", os.path.join(r, b"dangling"))
    os.makedirs(os.path.join(r, b"empty/dir"))
    os.makedirs(os.path.join(r, b"readonly"))
    w(b"readonly/file", b"ro\n", 0o444)
    os.chmod(os.path.join(r, b"readonly"), 0o555)
    w(b"hard/a", b"linked\n")
    os.link(os.path.join(r, b"hard/a"), os.path.join(r, b"hard/b"))
    with open(os.path.join(r, b"sparse.img"), "wb") as f:
        f.truncate(64 << 20)
        f.seek(32 << 20)
        f.write(b"middle")
    os.setxattr(os.path.join(r, b"src/app.py"), "user.petri.note", b"kept")
    os.setxattr(os.path.join(r, b"src"), "user.petri.dir", b"kept too")
    # Big enough that copying backends hand it to their thread pool (TreeCopier.BIG_FILE).
    w(b"assets/blob.bin", random.Random(7).randbytes(3 << 20), 0o640)
    for name in ODD_NAMES:
        w(b"odd/" + name, name + b"\n")


class Case:
    """A backend, a workspace and a store, with cleanup of everything made through it."""

    def __init__(self, backend: Backend, workspace: Path) -> None:
        self.backend = backend
        self.workspace = workspace
        self.store = Store(workspace)
        self.snaps: list[str] = []
        self.sandbox_snaps: list[str] = []
        self.clones: list[str] = []
        self.ids: dict[Path, str] = {}  # tree -> sandbox id
        self._n = 0
        if not self.store.root.exists():
            backend.create_store(self.store)
            self.store.make_dirs()

    def snapshot(self) -> str:
        self._n += 1
        sid = f"s-test{self._n:04d}"
        self.backend.snapshot(self.store, sid, self.snaps[-1] if self.snaps else None)
        self.snaps.append(sid)
        return sid

    def clone(self, sid: str) -> Path:
        self._n += 1
        sb = f"sb-test{self._n:04d}"
        tree = self.backend.clone(self.store, sid, sb)
        self.clones.append(sb)
        self.ids[tree] = sb
        return tree

    def sandbox_of(self, tree: Path) -> str:
        """The id of the clone at ``tree`` (where a tree sits is the backend's to say)."""
        return self.ids[tree]

    def snapshot_sandbox(self, tree: Path, parent: str) -> str:
        """A snapshot of the sandbox at ``tree`` (one of this case's clones of ``parent``);
        kept apart from the snapshots of live (never the parent of the next one)."""
        self._n += 1
        sid = f"s-test{self._n:04d}"
        sb = self.sandbox_of(tree)
        self.backend.snapshot_sandbox(self.store, sb, sid, parent)
        self.sandbox_snaps.append(sid)
        return sid

    def cleanup(self) -> None:
        for sb in self.clones:
            self.backend.destroy_clone(self.store, sb)
        for sid in reversed(self.sandbox_snaps):
            self.backend.delete_snapshot(self.store, sid)
        for sid in reversed(self.snaps):
            self.backend.delete_snapshot(self.store, sid)
        self.clones.clear()
        self.snaps.clear()
        self.sandbox_snaps.clear()


def check_clone_is_exact(case: Case) -> None:
    before = manifest(case.workspace)
    tree = case.clone(case.snapshot())
    got = manifest(tree)
    problems = diff_manifests(before, got)
    assert not problems, "clone differs from live:\n" + "\n".join(problems[:20])


def check_point_in_time(case: Case) -> None:
    sid = case.snapshot()
    with open(case.workspace / "README.md", "ab") as f:
        f.write(b"edited after the snapshot\n")
    os.unlink(case.workspace / "src" / "app.py")
    tree = case.clone(sid)
    assert b"edited after" not in (tree / "README.md").read_bytes()
    assert (tree / "src" / "app.py").exists()


def check_isolation(case: Case) -> None:
    sid = case.snapshot()
    a, b = case.clone(sid), case.clone(sid)
    (a / "README.md").write_bytes(b"changed in a\n")
    (a / "new-in-a").write_bytes(b"a\n")
    os.unlink(a / "src" / "run.sh")
    assert (case.workspace / "README.md").read_bytes() == b"# sample\n"
    assert (b / "README.md").read_bytes() == b"# sample\n"
    assert not (case.workspace / "new-in-a").exists() and not (b / "new-in-a").exists()
    assert (case.workspace / "src" / "run.sh").exists() and (b / "src" / "run.sh").exists()
    with case.backend.snapshot_view(case.store, sid) as view:
        assert (view / "README.md").read_bytes() == b"# sample\n"


def check_ignored_and_special(case: Case, *, keeps_hardlinks: bool, keeps_sparse: bool) -> None:
    tree = case.clone(case.snapshot())
    assert (tree / ".env").read_bytes() == b"SECRET=1\n"
    assert stat.S_IMODE(os.stat(tree / ".env").st_mode) == 0o600
    assert (tree / "node_modules/left-pad/index.js").exists()
    assert os.readlink(tree / ".venv/bin/python") == "/usr/bin/python3"
    assert os.readlink(tree / "dangling") == "does/not/exist"
    assert os.access(tree / "src/run.sh", os.X_OK)
    assert (tree / "empty/dir").is_dir() and not any((tree / "empty/dir").iterdir())
    st = os.stat(tree / "sparse.img")
    assert st.st_size == 64 << 20
    if keeps_sparse:
        assert st.st_blocks * 512 < 8 << 20, f"sparse file became {st.st_blocks * 512} bytes on disk"
    a, b = os.stat(tree / "hard/a"), os.stat(tree / "hard/b")
    if keeps_hardlinks:
        assert a.st_ino == b.st_ino, "hard link was broken"
    assert (tree / "hard/b").read_bytes() == b"linked\n"
    for name in ODD_NAMES:
        p = os.path.join(os.fsencode(tree), b"odd/" + name)
        with open(p, "rb") as f:
            assert f.read() == name + b"\n"


def check_snapshot_chain(case: Case) -> None:
    """Fork of a fork: snapshots stacked on snapshots each clone to their own moment."""
    s1 = case.snapshot()
    m1 = manifest(case.workspace)
    (case.workspace / "src" / "app.py").write_bytes(b"def add(a, b):\n    return b + a\n")
    os.unlink(case.workspace / "dangling")
    (case.workspace / "new").mkdir()
    (case.workspace / "new" / "f").write_bytes(b"f\n")
    s2 = case.snapshot()
    m2 = manifest(case.workspace)
    os.chmod(case.workspace / "README.md", 0o600)
    s3 = case.snapshot()
    m3 = manifest(case.workspace)
    for sid, m in ((s1, m1), (s2, m2), (s3, m3)):
        problems = diff_manifests(m, manifest(case.clone(sid)))
        assert not problems, f"clone of {sid} wrong:\n" + "\n".join(problems[:20])


def check_read_views(case: Case) -> None:
    """``read_view`` shows what ``snapshot_view`` shows, ``quiet_view`` what the sandbox's tree
    does (one snapshot of one layer, one of several; a sandbox with edits), and neither
    leaves anything in the store's tmp/."""
    s1 = case.snapshot()
    (case.workspace / "src" / "app.py").write_bytes(b"def add(a, b):\n    return b + a\n")
    os.unlink(case.workspace / "dangling")
    s2 = case.snapshot()
    tree = case.clone(s2)
    (tree / "README.md").write_bytes(b"in the sandbox\n")
    os.unlink(tree / "src" / "run.sh")
    (tree / "added").write_bytes(b"added\n")
    tmp = case.store.tmp
    before = sorted(os.listdir(tmp)) if tmp.is_dir() else []
    for sid in (s1, s2):
        with case.backend.snapshot_view(case.store, sid) as view:
            want = manifest(view)
        with case.backend.read_view(case.store, sid) as view:
            problems = diff_manifests(want, manifest(view))
            assert not problems, f"read_view of {sid} wrong:\n" + "\n".join(problems[:20])
    sb = case.sandbox_of(tree)
    with case.backend.quiet_view(case.store, sb) as view:
        problems = diff_manifests(manifest(tree), manifest(view))
        assert not problems, "quiet_view wrong:\n" + "\n".join(problems[:20])
    after = sorted(os.listdir(tmp)) if tmp.is_dir() else []
    if os.geteuid() == 0:  # as a normal user, overlay-based views fall back to mounts in tmp/
        assert after == before, (before, after)


def _mutate(tree: Path, tag: bytes) -> None:
    """Every kind of change a generation can make: edit, add, delete, mode, a symlink, a
    directory renamed (overlay writes a redirect for it), a directory replaced by a file."""
    with open(tree / "README.md", "ab") as f:
        f.write(b"gen " + tag + b"\n")
    (tree / f"new-{tag.decode()}").write_bytes(tag + b"\n")
    os.unlink(tree / "dangling")
    os.symlink(b"README.md", tree / "dangling")
    os.chmod(tree / "src" / "run.sh", 0o700)
    os.rename(tree / "src", tree / f"src-{tag.decode()}")
    os.rename(tree / f"src-{tag.decode()}", tree / "src")  # back: a redirect that ends where it began
    os.rename(tree / "node_modules", tree / f"modules-{tag.decode()}")
    os.mkdir(tree / "node_modules")
    (tree / "node_modules" / "fresh.js").write_bytes(b"fresh " + tag + b"\n")


def check_fork_of_fork(case: Case) -> None:
    """Three generations of forks of forks: each snapshot of a sandbox is that sandbox at
    that instant, a child sees everything its parent had, siblings never see each other,
    and a child outlives its parent and grandparent sandboxes."""
    s0 = case.snapshot()
    g1 = case.clone(s0)
    _mutate(g1, b"1")
    s1 = case.snapshot_sandbox(g1, s0)
    m1 = manifest(g1)
    (g1 / "README.md").write_bytes(b"written after the snapshot of gen 1\n")  # point in time
    (g1 / "late").write_bytes(b"late\n")
    g2, sibling = case.clone(s1), case.clone(s1)
    for t in (g2, sibling):
        problems = diff_manifests(m1, manifest(t))
        assert not problems, "generation 2 differs from its parent's snapshot:\n" + "\n".join(problems[:20])
    _mutate(g2, b"2")
    (g2 / "src" / "app.py").write_bytes(b"gen 2 only\n")
    assert (sibling / "src" / "app.py").read_bytes() == b"def add(a, b):\n    return a + b\n"
    assert not (sibling / "new-2").exists() and not (g1 / "new-2").exists()
    assert diff_manifests(m1, manifest(sibling)) == [], "a sibling saw generation 2's changes"
    s2 = case.snapshot_sandbox(g2, s1)
    m2 = manifest(g2)
    os.unlink(g2 / "new-1")  # after the snapshot: generation 3 still has it
    g3 = case.clone(s2)
    assert diff_manifests(m2, manifest(g3)) == [], "generation 3 differs from its parent's snapshot"
    assert (g3 / "new-1").read_bytes() == b"1\n" and (g3 / "new-2").read_bytes() == b"2\n"
    assert (g3 / "README.md").read_bytes().endswith(b"gen 1\ngen 2\n")
    _mutate(g3, b"3")
    s3 = case.snapshot_sandbox(g3, s2)
    m3 = manifest(g3)
    # The ancestors go; what was cloned or snapshotted from them stays whole.
    for tree in (g1, g2, sibling):
        sb = case.sandbox_of(tree)
        case.backend.destroy_clone(case.store, sb)
        case.clones.remove(sb)
    assert diff_manifests(m3, manifest(g3)) == []
    for sid, m in ((s1, m1), (s2, m2), (s3, m3)):
        with case.backend.snapshot_view(case.store, sid) as view:
            problems = diff_manifests(m, manifest(view))
            assert not problems, f"snapshot {sid} changed:\n" + "\n".join(problems[:20])
    assert diff_manifests(m3, manifest(case.clone(s3))) == []


def check_usage(case: Case, *, can_tell: bool) -> None:
    """``clone_usage``: nothing (or next to nothing) for a fresh clone; what a sandbox writes
    shows up. None only where the backend cannot tell (``can_tell`` False)."""
    tree = case.clone(case.snapshot())
    sb = case.clones[-1]
    before = case.backend.clone_usage(case.store, sb)
    if before is None:
        assert not can_tell, "no usage from a backend that can tell"
        return
    assert before.bytes < 64 << 10, before
    with open(tree / "grown.bin", "wb") as f:
        f.write(os.urandom(1 << 20))
        os.fsync(f.fileno())
    after = case.backend.clone_usage(case.store, sb)
    assert after is not None and after.measure == before.measure, (before, after)
    assert (1 << 20) <= after.bytes - before.bytes < (2 << 20), (before, after)


def check_destroy_leaves_nothing(case: Case) -> None:
    sid = case.snapshot()
    tree = case.clone(sid)
    sb = case.clones[-1]
    case.backend.destroy_clone(case.store, sb)
    case.clones.remove(sb)
    assert not tree.exists()
    assert not case.store.sandbox_dir(sb).exists()
    assert not mounted_under(case.store.root), f"mounts left: {mounted_under(case.store.root)}"
    case.backend.delete_snapshot(case.store, sid)
    case.snaps.remove(sid)
    assert not case.store.snapshot_dir(sid).exists()
    assert case.backend.leftovers(case.store, set(case.snaps), set(case.clones)) == []


def mounted_under(path: Path) -> list[str]:
    return [os.fsdecode(m.mountpoint) for m in mounts_under(path)]


CHECKS: list[Callable[..., None]] = [check_clone_is_exact, check_point_in_time, check_isolation,
                                     check_snapshot_chain, check_read_views, check_fork_of_fork,
                                     check_destroy_leaves_nothing]
