"""Helpers the backends use to build ``backend.Candidates`` from their own records.

A candidate that is a directory on both sides with the same permission bits is dropped
(a copied-up parent, a directory whose times moved): its changed children are candidates
themselves, and keeping it would make the compare walk its whole subtree. Whole subtrees
(opaque dirs, fuse ``trees``, renamed or new directories, overlay redirects) are kept:
the backend passes them as ``keep``.

Caveats: pruning reads both trees (an ``lstat`` per candidate); a backend whose mount
records reads (fuse) prunes only when the caller hands it a tree to read.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Iterable


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
