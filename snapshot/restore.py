"""Restoring a snapshot into the live tree in place (``petri rollback s-…``).

Plan, then execute: ``plan_restore`` compares the snapshot's tree with live (type, mode,
owner, symlink target, and content by xxh3-128 when sizes match) and returns a list of
operations; ``execute_restore`` applies them. ``.git/`` and the store are never touched.

Each file is replaced by writing a temporary sibling and renaming it over the old one, so a
reader never sees a half-written file; the rollback as a whole is not atomic (the safety
snapshot the orchestrator takes first is the undo).

Caveat: hard links are restored as links only among files restored in the same run.
"""
from __future__ import annotations

import os
import stat
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import xxhash

from .tree import apply_meta, copy_file, copy_xattrs, make_special, remove_tree, walk

NEVER_TOUCH = frozenset({b".git", b".petri"})


@dataclass(frozen=True)
class RestoreOp:
    verb: str  # "delete" | "mkdir" | "put" | "symlink" | "special" | "meta"
    path: bytes


def file_digest(path: bytes) -> bytes:
    h = xxhash.xxh3_128()
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.digest()


def _kind(mode: int) -> int:
    return stat.S_IFMT(mode)


def plan_restore(src: bytes, live: bytes, exclude_top: frozenset[bytes] = NEVER_TOUCH) -> list[RestoreOp]:
    want = dict(walk(src, exclude_top))
    have = dict(walk(live, exclude_top))
    ops: list[RestoreOp] = []
    deletes: list[bytes] = []
    deleted: set[bytes] = set()

    def under_deleted(rel: bytes) -> bool:
        while rel:
            if rel in deleted:
                return True
            rel = rel.rpartition(b"/")[0]
        return False

    same_size: list[bytes] = []
    for rel, st in have.items():  # walk order: parents before children
        w = want.get(rel)
        if (w is None or _kind(w.st_mode) != _kind(st.st_mode)) and not under_deleted(rel):
            deletes.append(rel)
            deleted.add(rel)

    ops.extend(RestoreOp("delete", d) for d in deletes)
    for rel, w in want.items():
        h = have.get(rel)
        gone = h is None or under_deleted(rel)
        mode = w.st_mode
        if stat.S_ISDIR(mode):
            if gone:
                ops.append(RestoreOp("mkdir", rel))
            elif stat.S_IMODE(mode) != stat.S_IMODE(h.st_mode) or (w.st_uid, w.st_gid) != (h.st_uid, h.st_gid):
                ops.append(RestoreOp("meta", rel))
        elif stat.S_ISLNK(mode):
            if gone or os.readlink(os.path.join(src, rel)) != os.readlink(os.path.join(live, rel)):
                if not gone:
                    ops.append(RestoreOp("delete", rel))
                ops.append(RestoreOp("symlink", rel))
        elif stat.S_ISREG(mode):
            if gone or w.st_size != h.st_size:
                ops.append(RestoreOp("put", rel))
            else:
                same_size.append(rel)
        elif gone:
            ops.append(RestoreOp("special", rel))
    with ThreadPoolExecutor(max_workers=8) as pool:
        digests = pool.map(lambda r: file_digest(os.path.join(src, r)) != file_digest(os.path.join(live, r)),
                           same_size)
        for rel, differs in zip(same_size, digests):
            w, h = want[rel], have[rel]
            if differs:
                ops.append(RestoreOp("put", rel))
            elif stat.S_IMODE(w.st_mode) != stat.S_IMODE(h.st_mode) or (w.st_uid, w.st_gid) != (h.st_uid, h.st_gid):
                ops.append(RestoreOp("meta", rel))
    return ops


def execute_restore(ops: list[RestoreOp], src: bytes, live: bytes) -> list[bytes]:
    """Apply a restore plan; return the paths it changed (sorted)."""
    changed: set[bytes] = set()
    dirs_touched: list[bytes] = []
    linked: dict[tuple[int, int], bytes] = {}
    for op in ops:
        s = os.path.join(src, op.path)
        d = os.path.join(live, op.path)
        changed.add(op.path)
        if op.verb == "delete":
            remove_tree(d)
        elif op.verb == "mkdir":
            os.mkdir(d, 0o700)
            copy_xattrs(s, d)
            dirs_touched.append(op.path)
        elif op.verb == "meta":
            st = os.lstat(s)
            apply_meta(d, st)
        elif op.verb == "symlink":
            tmp = d + b".petri-restore"
            os.symlink(os.readlink(s), tmp)
            apply_meta(tmp, os.lstat(s), is_link=True)
            os.rename(tmp, d)
        elif op.verb == "special":
            make_special(d, os.lstat(s))
        elif op.verb == "put":
            st = os.lstat(s)
            tmp = os.path.join(os.path.dirname(d), b".petri-restore." + os.path.basename(d)[:200])
            key = (st.st_dev, st.st_ino)
            if os.path.lexists(tmp):
                os.unlink(tmp)
            if st.st_nlink > 1 and key in linked:
                os.link(os.path.join(live, linked[key]), tmp)
            else:
                try:
                    copy_file(s, tmp, st, reflink=True)
                except OSError:
                    if os.path.lexists(tmp):
                        os.unlink(tmp)
                    copy_file(s, tmp, st, reflink=False)
                linked[key] = op.path
            os.rename(tmp, d)
    # Parents' times moved as children came and went: put back the snapshot's.
    parents = {p.rpartition(b"/")[0] for p in changed} | set(dirs_touched)
    for rel in sorted(parents, key=lambda p: -p.count(b"/")):
        s = os.path.join(src, rel) if rel else src
        d = os.path.join(live, rel) if rel else live
        try:
            st = os.lstat(s)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(st.st_mode) and os.path.isdir(d):
            apply_meta(d, st)
    return sorted(changed)
