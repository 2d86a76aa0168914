"""A sandbox's change set against its base, O(changes) where the backend can tell.

Every backend can be answered by the manifest compare (``merge.changes.tree_changes`` over
both whole trees). Where the backend keeps a cheaper record of what moved, that record
only narrows the compare to *candidate* paths; ``tree_changes(paths=candidates)`` then
decides, by content, exactly as the full compare would:

- btrfs: ``btrfs send --no-data -p <base snapshot> <read-only snapshot of the sandbox>``,
  parsed here from its binary stream (every path a command names that can change content,
  kind, mode or existence; times, owners and xattrs are left out: change sets ignore them);
- overlay: the sandbox's upper dir (``snapshot.layers.layer_entries``): files, whiteouts,
  opaque directories, renamed (redirected) directories;
- fuse: the daemon's own journal of changed paths and subtrees (``FuseBackend.changed_paths``);
- zfs: ``zfs diff``;
- copy and reflink: none (the full compare).

A candidate that is a directory on both sides with the same permission bits is dropped
(a copied-up parent, a directory whose times moved): its changed children are candidates
themselves, and keeping it would make the compare walk its whole subtree. Whole subtrees
(opaque dirs, fuse ``trees``, renamed or new directories, overlay redirects) stay prefixes.

The test ``tests/test_changesets.py`` checks on each backend that the fast path gives
exactly the change set of the full compare.

Caveats:
- btrfs send needs CAP_SYS_ADMIN; without it (rootless) the full compare is used.
- btrfs send names a hard-linked inode by one of its paths only; when a candidate has more
  than one link the full compare is used instead.
- A frozen overlay/fuse view is read with the candidates of the copy of the upper dir it
  was built from (``<view>/../upper``).
"""
from __future__ import annotations

import os
import stat
import struct
import subprocess
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator, Sequence

if TYPE_CHECKING:
    from merge.changes import Change

    from .engine import Engine
    from .registry import SandboxRow

STAGING_PREFIX = b".petri-staging-"

# btrfs send stream (fs/btrfs/send.h): commands that can change what a path holds.
_SEND_MAGIC = b"btrfs-stream\0"
_CMD_NAMES = {1: "subvol", 2: "snapshot", 3: "mkfile", 4: "mkdir", 5: "mknod", 6: "mkfifo", 7: "mksock",
              8: "symlink", 9: "rename", 10: "link", 11: "unlink", 12: "rmdir", 13: "set_xattr",
              14: "remove_xattr", 15: "write", 16: "clone", 17: "truncate", 18: "chmod", 19: "chown",
              20: "utimes", 21: "end", 22: "update_extent", 23: "fallocate", 24: "fileattr",
              25: "encoded_write", 26: "enable_verity"}
_CONTENT_CMDS = frozenset({3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 15, 16, 17, 18, 22, 23, 25})
_A_PATH, _A_PATH_TO, _A_DATA = 15, 16, 19


class SendStreamError(ValueError):
    pass


def parse_send_stream(data: bytes) -> set[bytes]:
    """The paths a ``btrfs send`` stream touches in ways a change set cares about."""
    if not data.startswith(_SEND_MAGIC) or len(data) < 17:
        raise SendStreamError("not a btrfs send stream")
    (version,) = struct.unpack_from("<I", data, 13)
    pos = 17
    out: set[bytes] = set()
    n = len(data)
    while pos < n:
        if pos + 10 > n:
            raise SendStreamError("truncated command header")
        length, cmd, _crc = struct.unpack_from("<IHI", data, pos)
        pos += 10
        end = pos + length
        if end > n:
            raise SendStreamError("truncated command")
        if cmd in _CONTENT_CMDS:
            p = pos
            while p + 4 <= end:
                typ, alen = struct.unpack_from("<HH", data, p)
                p += 4
                if typ == _A_DATA and version >= 2:
                    break  # v2: the data attribute has no length and runs to the end
                if typ in (_A_PATH, _A_PATH_TO):
                    out.add(data[p:p + alen])
                p += alen
        pos = end
    return out


def btrfs_send_paths(parent: Path, snap: Path) -> set[bytes]:
    """Candidate paths between two read-only subvolumes of one filesystem."""
    r = subprocess.run(["btrfs", "send", "-q", "--no-data", "-p", os.fspath(parent), os.fspath(snap),
                        "-f", "/dev/stdout"], capture_output=True)
    if r.returncode != 0:
        raise SendStreamError(r.stderr.decode(errors="replace").strip() or f"btrfs send exited {r.returncode}")
    return parse_send_stream(r.stdout)


def _clean(paths: Iterable[bytes]) -> set[bytes]:
    out = set()
    for p in paths:
        p = p.strip(b"/")
        if p.startswith(b"./"):
            p = p[2:]
        if p and p != b".":
            out.add(p)
    return out


@dataclass(frozen=True)
class Candidates:
    """Paths (and whole subtrees beneath them) outside which nothing changed; ``paths``
    None means the backend cannot tell (compare everything)."""

    paths: frozenset[bytes] | None
    source: str

    def covers(self, path: bytes) -> bool:
        if self.paths is None:
            return True
        if path in self.paths:
            return True
        parts = path.split(b"/")
        return any(b"/".join(parts[:i]) in self.paths for i in range(1, len(parts)))


FULL = Candidates(None, "manifest")


def _perm_dir(root: bytes, rel: bytes) -> int | None:
    try:
        st = os.lstat(os.path.join(root, rel))
    except (FileNotFoundError, NotADirectoryError):
        return None
    return stat.S_IMODE(st.st_mode) if stat.S_ISDIR(st.st_mode) else None


def _prune_dirs(base: Path, tree: Path, paths: set[bytes], keep: Iterable[bytes] = ()) -> set[bytes]:
    """Drop candidates that are directories with the same bits on both sides (see module doc)."""
    b, t = os.fsencode(base), os.fsencode(tree)
    keep = set(keep)
    out = set()
    for p in paths:
        if p not in keep:
            m = _perm_dir(t, p)
            if m is not None and m == _perm_dir(b, p):
                continue
        out.add(p)
    return out


def _multi_linked(tree: Path, paths: Iterable[bytes]) -> bool:
    t = os.fsencode(tree)
    for p in paths:
        try:
            st = os.lstat(os.path.join(t, p))
        except (FileNotFoundError, NotADirectoryError):
            continue
        if not stat.S_ISDIR(st.st_mode) and st.st_nlink > 1:
            return True
    return False


def _is_ro_subvolume(path: Path) -> bool:
    try:
        import btrfsutil
        return btrfsutil.is_subvolume(path) and btrfsutil.get_subvolume_read_only(path)
    except Exception:
        return False


@contextmanager
def readonly_btrfs(engine: "Engine", tree: Path, what: str) -> Iterator[Path]:
    """``tree`` itself when it is a read-only subvolume, else a read-only snapshot of it."""
    if _is_ro_subvolume(tree):
        yield tree
        return
    import btrfsutil
    from snapshot.backends.btrfs import delete_tree
    view = engine.store.tmp_path(what)
    view.parent.mkdir(parents=True, exist_ok=True)
    btrfsutil.create_snapshot(tree, view, read_only=True)
    try:
        yield view
    finally:
        delete_tree(view)


def btrfs_candidates(engine: "Engine", base: Path, tree: Path) -> Candidates:
    try:
        with readonly_btrfs(engine, tree, "changes-ro") as ro:
            raw = _clean(btrfs_send_paths(base, ro))
            if _multi_linked(ro, raw):
                return FULL
            return Candidates(frozenset(_prune_dirs(base, ro, raw)), "btrfs-send")
    except (SendStreamError, OSError) as e:  # rootless: send needs CAP_SYS_ADMIN
        _ = e
        return FULL


def upper_candidates(upper: Path, base: Path, tree: Path) -> Candidates:
    from snapshot.layers import layer_entries
    plain: set[bytes] = set()
    whole: set[bytes] = set()
    for rel, kind, _st in layer_entries(os.fsencode(upper)):
        if kind in ("opaque_dir", "redirect_dir", "whiteout"):
            whole.add(rel)
        else:
            plain.add(rel)
    return Candidates(frozenset(_prune_dirs(base, tree, plain) | whole), "upper")


def sandbox_candidates(engine: "Engine", row: "SandboxRow", base: Path, tree: Path) -> Candidates:
    """Where the sandbox may differ from its base (and, for a fork of a fork, from its
    origin: orchestrator.lineage), from the backend's own record."""
    from .lineage import widen_candidates
    return widen_candidates(engine, row, _own_candidates(engine, row, base, tree))


def _own_candidates(engine: "Engine", row: "SandboxRow", base: Path, tree: Path) -> Candidates:
    name = engine.backend_name
    store = engine.store
    try:
        if name == "btrfs":
            return btrfs_candidates(engine, base, tree)
        if name in ("overlay", "fuse"):
            frozen_upper = tree.parent / "upper"
            if tree.name == "view" and frozen_upper.is_dir() and store.tmp in tree.parents:
                return upper_candidates(frozen_upper, base, tree)
            if name == "fuse":
                ch = engine.backend.changed_paths(store, row.id)  # type: ignore[attr-defined]
                trees = set(_clean(ch.trees))
                return Candidates(frozenset(_prune_dirs(base, tree, _clean(ch.paths), trees) | trees),
                                  "fuse-journal")
            rec = engine.backend._record(store, row.id)  # type: ignore[attr-defined]
            return upper_candidates(store.sandbox_dir(row.id) / rec["upper"], base, tree)
        if name == "zfs":
            paths: set[bytes] = set()
            for c in engine.backend.changes(store, row.base, row.id):  # type: ignore[attr-defined]
                paths.add(c.path)
                if c.new_path is not None:
                    paths.add(c.new_path)
            return Candidates(frozenset(_prune_dirs(base, tree, _clean(paths))), "zfs-diff")
    except (OSError, KeyError, ValueError):
        return FULL
    return FULL


def narrow(cands: Candidates, user_paths: Sequence[bytes]) -> list[bytes] | None:
    """Candidates within the user's ``-- PATH...``: a list of prefixes (empty: nothing can
    differ), or None for "compare everything the user asked for"."""
    if cands.paths is None:
        return None if not user_paths else list(user_paths)
    if not user_paths:
        return sorted(cands.paths)
    out = set()
    for c in cands.paths:
        for u in user_paths:
            if c == u or c.startswith(u + b"/"):
                out.add(c)
            elif u.startswith(c + b"/"):
                out.add(u)
    return sorted(out)


def staging_names(*roots: Path) -> tuple[bytes, ...]:
    """Top-level ``.petri-staging-*`` names in any of ``roots`` (a promotion at work or
    killed): never part of a change set."""
    out = set()
    for r in roots:
        try:
            for name in os.listdir(os.fsencode(r)):
                if name.startswith(STAGING_PREFIX):
                    out.add(name)
        except OSError:
            pass
    return tuple(sorted(out))


def exclude_top(*roots: Path) -> tuple[bytes, ...]:
    from merge.promote import METRICS_FILE  # what a check leaves for evolve: never a change
    return (b".git", b".petri", METRICS_FILE, *staging_names(*roots))


def changes(engine: "Engine", row: "SandboxRow", base: Path, tree: Path, *, include_ignored: bool = False,
            paths: Sequence[bytes] = (), detect_renames: bool = True, fast: bool = True) -> "list[Change]":
    """The sandbox's change set (``merge.changes.Change`` list, sorted by path); ``fast``
    False forces the full compare (the tests' oracle)."""
    from merge.changes import normalize_path, tree_changes
    user = [normalize_path(p) for p in paths]
    if fast:
        narrowed = narrow(sandbox_candidates(engine, row, base, tree), user)
        if narrowed is not None and not narrowed:
            return []
    else:
        narrowed = user or None
    return tree_changes(base, tree, include_ignored=include_ignored, ignore_root=engine.root,
                        paths=narrowed or (), detect_renames=detect_renames,
                        exclude_top=exclude_top(engine.root, base, tree))


def is_running(engine: "Engine", row: "SandboxRow") -> bool:
    """A command runs in the sandbox now: state ``running`` or an unfinished run whose petri lives."""
    from .registry import pid_alive
    if row.state == "running":
        # A petri killed mid-run leaves the state behind: trust only a live owner.
        rows = engine.registry.db.execute(
            "SELECT pid FROM runs WHERE sandbox = ? AND finished_at IS NULL", (row.id,)).fetchall()
        return not rows or any(pid_alive(r[0]) for r in rows)
    rows = engine.registry.db.execute(
        "SELECT pid FROM runs WHERE sandbox = ? AND finished_at IS NULL", (row.id,)).fetchall()
    return any(pid_alive(r[0]) for r in rows)


@contextmanager
def sandbox_views(engine: "Engine", row: "SandboxRow", *, frozen: bool | None = None) -> Iterator[tuple[Path, Path]]:
    """(base view, sandbox tree) for the ``with`` block. The sandbox is read through a
    point-in-time view when a command runs in it (``frozen`` None: decide), and always on
    btrfs, where that view costs one snapshot and is what ``btrfs send`` needs anyway."""
    from .lineage import diff_base
    store = engine.store
    with ExitStack() as stack:
        base = stack.enter_context(engine.backend.snapshot_view(store, diff_base(engine, row)))
        tree = engine.sandbox_tree(row)
        if frozen is None:
            frozen = engine.backend_name == "btrfs" or is_running(engine, row)
        if frozen:
            tree = stack.enter_context(engine.backend.frozen_view(store, row.id))
        yield base, tree
