"""Helpers the backends use to build ``backend.Candidates`` from their own records.

A candidate that is a directory on both sides with the same permission bits is dropped
(a copied-up parent, a directory whose times moved): its changed children are candidates
themselves, and keeping it would make the compare walk its whole subtree. Whole subtrees
(opaque dirs, fuse ``trees``, renamed or new directories, overlay redirects) are kept:
the backend passes them as ``keep``.

``inode_key_candidates`` finds candidates where a tree keeps the very inodes of its base
(btrfs): a walk comparing each entry's stat key on both sides, reading no content.

Caveats: pruning reads both trees (an ``lstat`` per candidate); a backend whose mount
records reads (fuse) prunes only when the caller hands it a tree to read. The inode-key
walk is O(entries) ``lstat`` calls on each side: cheap per file, but every file.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

if TYPE_CHECKING:
    from .osutil import PathLike


def clean(paths: Iterable[bytes]) -> set[bytes]:
    """Relative paths without leading ``/`` or ``./`` (the root itself dropped)."""
    out = set()
    for p in paths:
        p = p.strip(b"/")
        if p.startswith(b"./"):
            p = p[2:]
        if p and p != b".":
            out.add(p)
    return out


def _perm_dir(root: bytes, rel: bytes) -> int | None:
    try:
        st = os.lstat(os.path.join(root, rel))
    except (FileNotFoundError, NotADirectoryError):
        return None
    return stat.S_IMODE(st.st_mode) if stat.S_ISDIR(st.st_mode) else None


def prune_dirs(base: Path | None, tree: Path | None, paths: set[bytes], keep: Iterable[bytes] = ()) -> set[bytes]:
    """Drop candidates that are directories with the same bits on both sides (see the module
    doc); without both trees, ``paths`` as they are."""
    if base is None or tree is None:
        return set(paths)
    b, t = os.fsencode(base), os.fsencode(tree)
    kept = set(keep)
    out = set()
    for p in paths:
        if p not in kept:
            m = _perm_dir(t, p)
            if m is not None and m == _perm_dir(b, p):
                continue
        out.add(p)
    return out


def multi_linked(tree: Path, paths: Iterable[bytes]) -> bool:
    """Does any non-directory among ``paths`` in ``tree`` have more than one name?"""
    t = os.fsencode(tree)
    for p in paths:
        try:
            st = os.lstat(os.path.join(t, p))
        except (FileNotFoundError, NotADirectoryError):
            continue
        if not stat.S_ISDIR(st.st_mode) and st.st_nlink > 1:
            return True
    return False


def _key(st: os.stat_result) -> tuple[int, int, int, int, int]:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode)


def _compare_dir(b: bytes, rel: bytes, dfd: int, dev: int, skip_top: Callable[[bytes], bool],
                 seen: set[bytes] | None, stack: list[tuple[bytes, bool]], out: set[bytes], first: bool) -> bool:
    """One directory of ``inode_key_candidates``' walk (open at ``dfd``): its entries against
    the base's; True when ``first`` and a candidate was found."""
    isdir = stat.S_ISDIR
    prefix = rel + b"/" if rel else b""
    with os.scandir(dfd) as it:
        for e in it:
            name = os.fsencode(e.name)
            if not rel and skip_top(name):
                continue
            if seen is not None:
                seen.add(name)
            child = prefix + name
            try:
                st = e.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            try:
                bst = os.lstat(os.path.join(b, child))
            except (FileNotFoundError, NotADirectoryError):
                if st.st_dev == dev:
                    out.add(child)
                continue
            if isdir(st.st_mode):
                if st.st_dev != dev:
                    continue
                if not isdir(bst.st_mode) or bst.st_ino != st.st_ino:
                    out.add(child)  # new, moved or replaced: its whole subtree
                    continue
                if st.st_mode != bst.st_mode:
                    out.add(child)
                stack.append((child, _key(st) == _key(bst)))
            elif _key(st) != _key(bst):
                out.add(child)
            else:
                continue
            if first and out:
                return True
    return False


class WalkBudget(Exception):
    """``inode_key_candidates`` gave up: its time budget ran out before the walk ended."""


def inode_key_candidates(base: PathLike, tree: PathLike, skip_top: Callable[[bytes], bool] = lambda name: False,
                         *, first: bool = False, deadline: float | None = None) -> set[bytes]:
    """Where ``tree`` may differ from ``base`` when the two keep the same inodes (a btrfs
    snapshot and the subvolume it was taken of, or cloned into): a walk of ``tree`` that
    ``lstat``s each entry on both sides and reads no content. An entry whose key (inode,
    size, mtime_ns, ctime_ns, mode) is the same on both sides is unchanged, since every
    write, chmod, rename or link moves the ctime of the inode it touches; that holds for
    writes still in the page cache too (``stat`` reads the inode in memory). A directory
    whose key moved is listed on both sides (what the base had and the tree lost); one
    that is new, or another inode than the base's at its path (moved, replaced), is a
    candidate as a whole subtree and not entered. Top-level names ``skip_top`` accepts are
    left out, and so is whatever lies on another device (a mount or a nested subvolume:
    never in a snapshot). ``first``: stop at the first candidate. ``deadline``
    (``time.monotonic()``): raise ``WalkBudget`` once it has passed.

    O(entries) ``lstat`` calls, no reads (directories are listed with ``O_NOATIME``):
    candidates only narrow, content decides."""
    import time

    b, t = os.fsencode(base), os.fsencode(tree)
    out: set[bytes] = set()
    root_st = os.lstat(t)
    dev = root_st.st_dev
    stack: list[tuple[bytes, bool]] = [(b"", _key(root_st) == _key(os.lstat(b)))]
    while stack:
        if deadline is not None and time.monotonic() > deadline:
            raise WalkBudget()
        rel, same_dir = stack.pop()
        seen: set[bytes] | None = None if same_dir else set()
        prefix = rel + b"/" if rel else b""
        try:
            dfd = open_dir_noatime(os.path.join(t, rel) if rel else t)
        except (FileNotFoundError, NotADirectoryError):
            continue  # gone since its parent was listed: the parent's key moved, its listing says so
        try:
            if _compare_dir(b, rel, dfd, dev, skip_top, seen, stack, out, first):
                return out
        finally:
            os.close(dfd)
        if seen is not None:
            try:
                names = os.listdir(os.path.join(b, rel) if rel else b)
            except (FileNotFoundError, NotADirectoryError):
                names = []
            for name in names:
                if name not in seen and not (not rel and skip_top(name)):
                    out.add(prefix + name)
                    if first:
                        return out
    return out


def open_dir_noatime(path: bytes) -> int:
    """A directory fd whose listing leaves the atime alone (``O_NOATIME``: the owner or root
    may), so that reading a tree is not itself a change to it (on btrfs an atime update
    moves the subvolume's ``ctransid``); without that right, a plain open."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
    try:
        return os.open(path, flags | os.O_NOATIME)
    except PermissionError:
        return os.open(path, flags)
