"""Tree signatures for the layer and overlay tests: what a view must reproduce exactly, and
overlay mounts swept after a test."""
from __future__ import annotations

import hashlib
import os
import stat
import time
from pathlib import Path

from snapshot import layers as L


def signature_of_entries(entries) -> dict[bytes, tuple]:
    """rel -> (type, permissions, owner, mtime, content digest / link target): what a view must
    reproduce exactly (inode numbers and link counts are not part of a tree's content)."""
    sig = {}
    for rel, path, st in entries:
        m = st.st_mode
        if stat.S_ISREG(m):
            with open(path, "rb") as f:
                what = hashlib.sha256(f.read()).hexdigest()
            kind = "f"
        elif stat.S_ISLNK(m):
            what, kind = os.readlink(path), "l"
        elif stat.S_ISDIR(m):
            what, kind = None, "d"
        elif stat.S_ISFIFO(m):
            what, kind = None, "p"
        else:
            what, kind = st.st_rdev, "other"
        mtime = st.st_mtime_ns
        sig[rel] = (kind, stat.S_IMODE(m), st.st_uid, st.st_gid, mtime, what)
    return sig


def tree_signature(root: bytes | Path, exclude_top=frozenset({b".petri"}), with_root: bool = True) -> dict:
    root = os.fsencode(root)
    from snapshot.tree import walk
    sig = signature_of_entries((rel, os.path.join(root, rel), st) for rel, st in walk(root, exclude_top))
    if with_root:
        st = os.lstat(root)
        sig[b""] = ("d", stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, st.st_mtime_ns, None)
    return sig


def settle() -> None:
    """Step past the racy window so unchanged files are trusted by the next snapshot."""
    time.sleep(L.RACY_WINDOW_NS / 1e9 + 0.01)


def sweep_overlay_mounts(root: bytes) -> None:
    from snapshot.backends.overlay import is_overlay_mounted, overlay_mounts_under, umount
    for mp in sorted(overlay_mounts_under(root), key=len, reverse=True):
        while is_overlay_mounted(mp):
            umount(mp)


def w(p: Path, data: bytes | str = b"x", mode: int | None = None) -> None:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data.encode() if isinstance(data, str) else data)
    if mode is not None:
        os.chmod(p, mode)
