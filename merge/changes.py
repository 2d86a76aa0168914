"""Change sets between two real directory trees (a base and a new tree).

A change set lists every path whose existence, kind, permission bits or content differs,
with content ids (xxh3-128 of a file's bytes or a symlink's target) on both sides, and
pairs deletions with additions as renames the way `git diff -M` does. Paths are ``bytes``,
relative, ``/``-separated; output is sorted by path so it is deterministic.

Directories: git cannot represent them, but promotion must create and remove them, so a
directory that exists on one side only is reported (kind ``dir``, status added/deleted)
as is a permission change on one that exists on both. Files beneath an added or deleted
directory are reported too. The patch writer skips ``dir`` entries. When ignored paths are
left out, so is a directory that holds entries but only ignored ones (a ``__pycache__``
under a ``*.pyc`` rule, a ``.pytest_cache`` with its own ``*`` ``.gitignore``): git shows
no such directory, and a promotion must not create or remove it empty. A directory that is
really empty is still reported.

Walking never follows symlinks: directories are opened relative to their parent's fd with
``O_NOFOLLOW`` and files are opened the same way for hashing, and each open is checked
against the scan's lstat (device and inode), so a tree that is edited during a scan makes
the scan fail (``TreeChangedDuringScan``) instead of reading something outside the tree.

Caveats: this is the generic manifest compare: it hashes every file that has the same
size on both sides (a stat shortcut is unsound across trees: reflinks, snapshots and
restored mtimes all keep stats equal while content differs, or the reverse); backends
with a cheaper source of truth (btrfs send streams, the overlay upper dir) should narrow
``paths`` first. Fifos, sockets and devices are reported as kind ``other`` and are never
promoted. Rename detection is git's (exact matches first, then span-hash similarity
>= 50% for regular files) and gives up on inexact matching past git's default rename
limit (1000 x 1000 candidates), like git.
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping, Protocol, Sequence

import xxhash

from snapshot.osutil import read_fd

from . import diffalgo
from .errors import TreeChangedDuringScan, UnsafePath
import merge

KIND_FILE = "file"
KIND_SYMLINK = "symlink"
KIND_DIR = "dir"
KIND_OTHER = "other"

RENAME_LIMIT = 1000
_CHUNK = 1 << 20


def content_id_fd(fd: int) -> str:
    """The content id (xxh3-128, hex) of what is left to read on ``fd``: the one definition
    change sets, promotion's re-checks and staleness all compare against."""
    h = xxhash.xxh3_128()
    while True:
        b = os.read(fd, _CHUNK)
        if not b:
            return h.hexdigest()
        h.update(b)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY


@dataclass(frozen=True)
class Entry:
    kind: str  # 'file' | 'symlink' | 'dir' | 'other' (fifo/socket/device: never promoted)
    mode: int  # st_mode & 0o7777
    content_id: str | None  # xxh3_128 hexdigest of file content or symlink target; None for dir/other
    size: int


@dataclass(frozen=True)
class Change:
    path: bytes
    status: str  # 'added' | 'modified' | 'deleted' | 'renamed' | 'type_changed'
    old: Entry | None
    new: Entry | None
    old_path: bytes | None = None  # for renames
    similarity: int | None = None  # percent, for renames


@dataclass(frozen=True, slots=True)
class _Raw:
    """One lstat as the walk saw it; content ids are computed later, only where needed."""

    kind: str
    mode: int
    size: int
    dev: int
    ino: int
    target: bytes | None  # symlink target


def kind_of(st_mode: int) -> str:
    """'file', 'symlink', 'dir' or 'other' (fifos, sockets, devices: never promoted)."""
    if stat.S_ISREG(st_mode):
        return KIND_FILE
    if stat.S_ISLNK(st_mode):
        return KIND_SYMLINK
    if stat.S_ISDIR(st_mode):
        return KIND_DIR
    return KIND_OTHER


def _join(a: bytes, b: bytes) -> bytes:
    return a + b"/" + b if a else b


def normalize_path(p: bytes | str | os.PathLike) -> bytes:
    """A user-given relative path as the change set spells it; refuses absolute and `..`."""
    b = os.fsencode(p)
    if b.startswith(b"/"):
        raise UnsafePath(path=os.fsdecode(b))
    parts = [c for c in b.split(b"/") if c and c != b"."]
    if any(c == b".." for c in parts):
        raise UnsafePath(path=os.fsdecode(b))
    return b"/".join(parts)


class _Narrow:
    """Which paths `-- PATH...` keeps, and which directories the walk must enter for them."""

    def __init__(self, paths: Sequence[bytes]):
        self.all = not paths or any(p == b"" for p in paths)
        self.prefixes = sorted({p for p in paths if p})
        self.kept = frozenset(self.prefixes)
        self.ancestors: set[bytes] = set()
        for p in self.prefixes:
            parts = p.split(b"/")
            for i in range(1, len(parts)):
                self.ancestors.add(b"/".join(parts[:i]))

    def keeps(self, rel: bytes) -> bool:
        """rel or one of its ancestors was asked for: O(depth) set lookups, not O(paths)."""
        if self.all:
            return True
        while rel:
            if rel in self.kept:
                return True
            rel = rel.rpartition(b"/")[0]
        return False

    def enters(self, rel: bytes) -> bool:
        return self.all or rel in self.ancestors or self.keeps(rel)


IgnoreFn = Callable[[bytes, bool], bool]


class _Scandir(Protocol):
    """What ``os.scandir(fd)`` returns (its class is private to the stubs): entries, closed
    early when the walk stops."""

    def __next__(self) -> os.DirEntry[str]: ...
    def close(self) -> None: ...


def _walk(root: bytes, exclude_top: Iterable[bytes], ignored: IgnoreFn | None,
          narrow: _Narrow) -> dict[bytes, _Raw]:
    out: dict[bytes, _Raw] = {}
    excluded = frozenset(exclude_top)
    try:
        root_fd = os.open(root, _DIR_FLAGS)
    except FileNotFoundError:
        return out
    # An explicit stack of open directories keeps the number of fds at the tree's depth.
    # Each frame also counts [entries seen, entries left in]: a directory that had entries
    # and kept none (all ignored, like a __pycache__ under a '*.pyc' rule) is dropped when
    # its frame is popped, as git shows no such directory either.
    stack: list[tuple[bytes, int, _Scandir, list[int]]] = [(b"", root_fd, os.scandir(root_fd), [0, 0])]
    try:
        while stack:
            rel, fd, it, seen_kept = stack[-1]
            entry = next(it, None)
            if entry is None:
                it.close()
                os.close(fd)
                stack.pop()
                if seen_kept[0] and not seen_kept[1] and ignored is not None and rel in out:
                    del out[rel]
                elif stack:
                    stack[-1][3][1] += 1
                continue
            name = os.fsencode(entry.name)
            if not rel and name in excluded:
                continue
            path = _join(rel, name)
            if not narrow.enters(path):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # vanished since readdir: it is simply not in this tree
            seen_kept[0] += 1
            kind = kind_of(st.st_mode)
            if ignored is not None and ignored(path, kind == KIND_DIR):
                continue
            target = None
            size = st.st_size
            if kind == KIND_SYMLINK:
                try:
                    target = os.fsencode(os.readlink(entry.name, dir_fd=fd))
                except FileNotFoundError:
                    continue
                size = len(target)
            elif kind == KIND_DIR:
                size = 0
            if narrow.keeps(path):
                out[path] = _Raw(kind, st.st_mode & 0o7777, size, st.st_dev, st.st_ino, target)
            if kind == KIND_DIR:
                try:
                    child = os.open(entry.name, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    out.pop(path, None)
                    continue
                except OSError as e:
                    raise TreeChangedDuringScan(path=os.fsdecode(path)) from e
                cst = os.fstat(child)
                if (cst.st_dev, cst.st_ino) != (st.st_dev, st.st_ino):
                    os.close(child)
                    raise TreeChangedDuringScan(path=os.fsdecode(path))
                stack.append((path, child, os.scandir(child), [0, 0]))
            else:
                seen_kept[1] += 1
    finally:
        for _, fd, it, _counts in stack:
            it.close()
            os.close(fd)
    return out


class TreeReader:
    """Reads files of one tree by relative path without following any symlink on the way.

    Keeps the last directory fd open: callers go through paths in sorted order, so
    consecutive files mostly share a directory."""

    def __init__(self, root: Path | bytes | str):
        self.root = os.fsencode(root)
        self._dir: bytes | None = None
        self._dir_fd: int | None = None

    def close(self) -> None:
        if self._dir_fd is not None:
            os.close(self._dir_fd)
        self._dir = self._dir_fd = None

    def __enter__(self) -> "TreeReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _open_dir(self, d: bytes) -> int:
        if self._dir == d and self._dir_fd is not None:
            return self._dir_fd
        self.close()
        fd = os.open(self.root, _DIR_FLAGS)
        try:
            for comp in (d.split(b"/") if d else []):
                if comp in (b"", b".", b".."):
                    raise UnsafePath(path=os.fsdecode(d))
                nfd = os.open(comp, _DIR_FLAGS, dir_fd=fd)
                fd, old = nfd, fd  # swap, then close: an interrupt between never closes one twice
                os.close(old)
        except OSError as e:
            os.close(fd)
            raise TreeChangedDuringScan(path=os.fsdecode(d)) from e
        except BaseException:
            os.close(fd)
            raise
        self._dir, self._dir_fd = d, fd
        return fd

    def read(self, rel: bytes, kind: str = KIND_FILE, *, expect: tuple[int, int] | None = None) -> bytes:
        """A file's bytes, or a symlink's target; ``expect`` = (dev, ino) from the scan."""
        d, _, name = rel.rpartition(b"/")
        dfd = self._open_dir(d)
        try:
            if kind == KIND_SYMLINK:
                return os.fsencode(os.readlink(name, dir_fd=dfd))
            fd = os.open(name, _FILE_FLAGS, dir_fd=dfd)
        except OSError as e:
            raise TreeChangedDuringScan(path=os.fsdecode(rel)) from e
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or (expect is not None and expect != (st.st_dev, st.st_ino)):
                raise TreeChangedDuringScan(path=os.fsdecode(rel))
            return read_fd(fd)
        finally:
            os.close(fd)

    def hash(self, rel: bytes, raw: _Raw) -> str:
        if raw.kind == KIND_SYMLINK:
            assert raw.target is not None
            return xxhash.xxh3_128_hexdigest(raw.target)
        d, _, name = rel.rpartition(b"/")
        dfd = self._open_dir(d)
        try:
            fd = os.open(name, _FILE_FLAGS, dir_fd=dfd)
        except OSError as e:
            raise TreeChangedDuringScan(path=os.fsdecode(rel)) from e
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != (raw.dev, raw.ino) or not stat.S_ISREG(st.st_mode):
                raise TreeChangedDuringScan(path=os.fsdecode(rel))
            return content_id_fd(fd)
        finally:
            os.close(fd)


def _entry(raw: _Raw, content_id: str | None) -> Entry:
    return Entry(raw.kind, raw.mode, content_id, raw.size)


def _ignore_fn(ignore_root: Path | bytes | str | None, new: Path | bytes | str | None = None,
               base: Path | bytes | str | None = None, *, workspace: bool = False) -> IgnoreFn | None:
    """What to leave out: ``ignore_root``'s rules and, for ``workspace`` roots, git's
    core.excludesFile (read through ``git config``: only ever for the user's own workspace,
    never for a sandbox's tree) and the ``.gitignore`` files ``new`` adds (see IgnoreRules)."""
    if ignore_root is None:
        return None

    if not workspace:
        return merge.ignore.IgnoreRules(ignore_root).is_ignored
    same = new is None or os.path.realpath(os.fsencode(new)) == os.path.realpath(os.fsencode(ignore_root))
    return merge.ignore.IgnoreRules(ignore_root, sandbox=None if same else new, base=base,
                                    excludes_file=merge.ignore.core_excludes_file(ignore_root)).is_ignored


def scan_tree(root: Path, *, exclude_top: Iterable[bytes] = (b".git", b".petri"),
              ignore_root: Path | None = None, paths: Sequence[bytes] = ()) -> dict[bytes, Entry]:
    """The manifest of a tree: every path with its kind, mode, content id and size.

    Never follows symlinks; ``ignore_root`` (when given) leaves out what its .gitignore
    files ignore; ``paths`` narrows to those paths and everything beneath them."""
    raws = _walk(os.fsencode(root), exclude_top, _ignore_fn(ignore_root),
                 _Narrow([normalize_path(p) for p in paths]))
    out: dict[bytes, Entry] = {}
    with TreeReader(root) as reader:
        for path in sorted(raws):
            raw = raws[path]
            cid = reader.hash(path, raw) if raw.kind in (KIND_FILE, KIND_SYMLINK) else None
            out[path] = _entry(raw, cid)
    return out


def tree_changes(base: Path, new: Path, *, include_ignored: bool = False,
                 ignore_root: Path | None = None, paths: Sequence[bytes] = (),
                 detect_renames: bool = True,
                 exclude_top: Iterable[bytes] = (b".git", b".petri"),
                 base_manifest: Mapping[bytes, Entry] | None = None) -> list[Change]:
    """Every path that differs between ``base`` and ``new``, sorted by path.

    ``ignore_root`` is the workspace whose rules decide what is ignored: its .gitignore
    files, .git/info/exclude and git's core.excludesFile, and the .gitignore files ``new``
    has where the workspace has none (a tool's ``.pytest_cache/.gitignore``); without it,
    ``new``'s own .gitignore files and .git/info/exclude. Ignored paths are left out on both
    sides unless ``include_ignored``, and so is a directory whose every entry is ignored
    (it would otherwise be created, or removed, empty). ``base_manifest`` (a ``scan_tree`` of ``base`` kept from
    earlier) saves hashing the base again; pass it only for an immutable base (a
    read-only snapshot), since its content ids are trusted where kind and size agree."""
    ignored = None if include_ignored else (
        _ignore_fn(new) if ignore_root is None else _ignore_fn(ignore_root, new, base, workspace=True))
    narrow = _Narrow([normalize_path(p) for p in paths])
    exclude_top = tuple(exclude_top)
    a = _walk(os.fsencode(base), exclude_top, ignored, narrow)
    b = _walk(os.fsencode(new), exclude_top, ignored, narrow)
    ra, rb = TreeReader(base), TreeReader(new)
    known: dict[bytes, str | None] = {}
    if base_manifest:
        for path, raw in a.items():
            e = base_manifest.get(path)
            if e is not None and e.kind == raw.kind and e.size == raw.size and e.content_id:
                known[path] = e.content_id
    try:
        return _compare(a, b, ra, rb, detect_renames, known)
    finally:
        ra.close()
        rb.close()


def _compare(a: Mapping[bytes, _Raw], b: Mapping[bytes, _Raw], ra: TreeReader, rb: TreeReader,
             detect_renames: bool, known_a: dict[bytes, str | None] | None = None) -> list[Change]:
    changes: list[Change] = []
    # Sorted walk over each side keeps the readers' directory cache hot.
    ids_a: dict[bytes, str | None] = dict(known_a or {})
    ids_b: dict[bytes, str | None] = {}

    def cid(side: dict, reader: TreeReader, path: bytes, raw: _Raw) -> str | None:
        if raw.kind not in (KIND_FILE, KIND_SYMLINK):
            return None
        got = side.get(path)
        if got is None:
            got = side[path] = reader.hash(path, raw)
        return got

    both = sorted(a.keys() & b.keys())
    for path in both:
        x, y = a[path], b[path]
        if x.kind != y.kind:
            continue
        if x.kind == KIND_FILE and x.size == y.size:
            cid(ids_a, ra, path, x)
    for path in both:
        x, y = a[path], b[path]
        if x.kind == KIND_FILE and y.kind == KIND_FILE and x.size == y.size:
            cid(ids_b, rb, path, y)

    for path in both:
        x, y = a[path], b[path]
        if x.kind != y.kind:
            changes.append(Change(path, "type_changed", _entry(x, cid(ids_a, ra, path, x)),
                                  _entry(y, cid(ids_b, rb, path, y))))
            continue
        if x.kind == KIND_SYMLINK:
            differs = x.target != y.target
        elif x.kind == KIND_FILE:
            differs = x.mode != y.mode or x.size != y.size or \
                cid(ids_a, ra, path, x) != cid(ids_b, rb, path, y)
        else:
            differs = x.mode != y.mode
        if differs:
            changes.append(Change(path, "modified", _entry(x, cid(ids_a, ra, path, x)),
                                  _entry(y, cid(ids_b, rb, path, y))))
    deleted = [p for p in sorted(a.keys() - b.keys())]
    added = [p for p in sorted(b.keys() - a.keys())]
    dels = {p: _entry(a[p], cid(ids_a, ra, p, a[p])) for p in deleted}
    adds = {p: _entry(b[p], cid(ids_b, rb, p, b[p])) for p in added}
    renames: dict[bytes, tuple[bytes, int]] = {}
    if detect_renames:
        renames = find_renames(dels, adds, lambda p: ra.read(p, dels[p].kind),
                               lambda p: rb.read(p, adds[p].kind))
    used = {src for src, _ in renames.values()}
    for p in deleted:
        if p not in used:
            changes.append(Change(p, "deleted", dels[p], None))
    for p in added:
        if p in renames:
            src, score = renames[p]
            changes.append(Change(p, "renamed", dels[src], adds[p], old_path=src,
                                  similarity=diffalgo.similarity_percent(score)))
        else:
            changes.append(Change(p, "added", None, adds[p]))
    changes.sort(key=lambda c: c.path)
    return changes


def _basename_same(a: bytes, b: bytes) -> bool:
    return a.rpartition(b"/")[2] == b.rpartition(b"/")[2]


def find_renames(deleted: Mapping[bytes, Entry], added: Mapping[bytes, Entry],
                 read_old: Callable[[bytes], bytes], read_new: Callable[[bytes], bytes],
                 *, minimum_score: int = diffalgo.DEFAULT_RENAME_SCORE,
                 rename_limit: int = RENAME_LIMIT) -> dict[bytes, tuple[bytes, int]]:
    """git's rename pairing: {new path: (old path, score 0..60000)}.

    Exact content matches first (a source is used once; same basename preferred), then
    inexact matches between regular files scored by span-hash similarity, best first."""
    srcs = sorted(p for p, e in deleted.items() if e.kind in (KIND_FILE, KIND_SYMLINK))
    dsts = sorted(p for p, e in added.items() if e.kind in (KIND_FILE, KIND_SYMLINK))
    out: dict[bytes, tuple[bytes, int]] = {}
    if not srcs or not dsts:
        return out
    used: set[bytes] = set()
    by_id: dict[tuple[str | None, str], list[bytes]] = {}
    for s in srcs:
        e = deleted[s]
        by_id.setdefault((e.content_id, e.kind), []).append(s)
    for d in dsts:
        e = added[d]
        best, best_score = None, -1
        for s in by_id.get((e.content_id, e.kind), ()):
            if s in used:
                continue
            # git: a non-regular pair (symlinks) must have identical modes; ours always do.
            score = 1 + _basename_same(s, d)
            if score > best_score:
                best, best_score = s, score
                if score == 2:
                    break
        if best is not None:
            used.add(best)
            out[d] = (best, diffalgo.MAX_SCORE)
    if minimum_score >= diffalgo.MAX_SCORE:
        return out
    left = [d for d in dsts if d not in out and added[d].kind == KIND_FILE]
    cands = [s for s in srcs if deleted[s].kind == KIND_FILE]
    if not left or not cands:
        return out
    # git counts every source, used or not, against the limit.
    if not ((len(left) <= rename_limit or len(srcs) <= rename_limit)
            and len(left) * len(srcs) <= rename_limit * rename_limit):
        return out
    # Span counts, not blobs, are kept: a source's once for the whole matrix, a destination's
    # for its own row. Pairs scoring under the minimum never take one of a row's 4 slots
    # (git's NUM_CANDIDATE_PER_DST): they would sort after every pair that can be used.
    src_counts: dict[int, dict[int, int]] = {}
    scored: list[tuple[int, int, int, int]] = []
    max_score = diffalgo.MAX_SCORE
    for di, d in enumerate(left):
        dsize = added[d].size
        dst_counts = None
        best4: list[tuple[int, int, int, int]] = []
        for si, s in enumerate(cands):
            ssize = deleted[s].size
            mx, mn = (ssize, dsize) if ssize > dsize else (dsize, ssize)
            # git's size pre-check, done before reading either blob; an empty file scores 0.
            if mx * (max_score - minimum_score) < (mx - mn) * max_score or not dsize:
                score = 0
            else:
                if dst_counts is None:
                    dst_counts = diffalgo.span_counts(read_new(d))
                sc = src_counts.get(si)
                if sc is None:
                    sc = src_counts[si] = diffalgo.span_counts(read_old(s))
                score = diffalgo.copied_bytes(sc, dst_counts) * max_score // mx
            if score < minimum_score:
                continue
            best4.append((-score, -int(_basename_same(s, d)), di, si))
            best4.sort()
            del best4[4:]
        scored.extend(best4)
    scored.sort()
    for neg_score, _, di, si in scored:
        score = -neg_score
        if score < minimum_score:
            break
        d, s = left[di], cands[si]
        if d in out or s in used:
            continue
        used.add(s)
        out[d] = (s, score)
    return out
