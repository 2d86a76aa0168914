"""Replay a change set onto another clone of the same base: the tree ``dst`` (holding the
base) is made to hold what ``src`` holds at every changed path.

The race uses it to give a candidate's check a throwaway fork of the candidate's applied
state (``orchestrator/race.py`` says why it is not a snapshot of the sandbox). Unlike a
promotion this is no transaction and keeps no pre-images: ``dst`` is a scratch sandbox no
one else writes. It copies everything a sandbox may hold and a command may depend on:
regular files with their bytes, full mode, owner (as root), times and xattrs; symlinks;
fifos; directories with their modes and times.

Both trees are walked one component at a time from their roots' fds without following
symlinks (``SafeTree``): a symlink a candidate planted is copied as a symlink, never
followed in either tree.

Caveats: hard links between changed files become separate files; sockets and devices are
skipped (sandboxes cannot make devices); atimes are copied but reading ``src`` moves them
there (relatime).
"""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Sequence

from snapshot.tree import IS_ROOT, copy_file_at

from .changes import KIND_DIR, Change
from .errors import PathThroughSymlink
from .safefs import SafeTree

_TMP = b".petri-replay-"


def _depth(p: bytes) -> int:
    return p.count(b"/")


def _ancestors(p: bytes) -> list[bytes]:
    """Every directory above ``p``, the root (b"") included."""
    parts = p.split(b"/")
    return [b"/".join(parts[:i]) for i in range(len(parts))]


def _is_dir(t: SafeTree, rel: bytes) -> bool:
    try:
        node = t.node(rel)
    except (PathThroughSymlink, NotADirectoryError):
        return False  # beneath a symlink or a file (a deleted path's old parent)
    return node is not None and node.kind == "dir"


def _remove(dt: SafeTree, rel: bytes) -> None:
    """Remove whatever ``rel`` is in ``dst`` (a directory with all it holds)."""
    pfd, name = dt.parent(rel)
    try:
        try:
            st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(name, dir_fd=pfd)
            return
        for child in dt.walk(rel):  # children first, never through a symlink
            node = dt.node(child)
            if node is not None and node.kind == "dir":
                dt.rmdir(child)
            elif node is not None:
                dt.unlink(child)
        os.rmdir(name, dir_fd=pfd)
    finally:
        os.close(pfd)


def _put(st_: SafeTree, dt: SafeTree, rel: bytes) -> None:
    """Make ``rel`` in ``dst`` what it is in ``src``: written beside, then renamed over."""
    sfd, sname = st_.parent(rel)
    dfd, dname = dt.parent(rel)
    tmp = _TMP + os.urandom(6).hex().encode()
    try:
        sst = os.stat(sname, dir_fd=sfd, follow_symlinks=False)
        if stat.S_ISREG(sst.st_mode):
            copy_file_at(sfd, sname, dfd, tmp, reflink=False)
        elif stat.S_ISLNK(sst.st_mode):
            os.symlink(os.readlink(sname, dir_fd=sfd), tmp, dir_fd=dfd)
            if IS_ROOT:
                os.chown(tmp, sst.st_uid, sst.st_gid, dir_fd=dfd, follow_symlinks=False)
            os.utime(tmp, ns=(sst.st_atime_ns, sst.st_mtime_ns), dir_fd=dfd, follow_symlinks=False)
        elif stat.S_ISFIFO(sst.st_mode):
            os.mkfifo(tmp, 0o600, dir_fd=dfd)
            if IS_ROOT:
                os.chown(tmp, sst.st_uid, sst.st_gid, dir_fd=dfd, follow_symlinks=False)
            os.chmod(tmp, stat.S_IMODE(sst.st_mode), dir_fd=dfd)
        else:
            return  # sockets and devices: never made
        try:
            os.rename(tmp, dname, src_dir_fd=dfd, dst_dir_fd=dfd)
        except OSError as e:
            if e.errno not in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST):
                raise
            _remove(dt, rel)  # a directory is in the way (a type change): it goes first
            os.rename(tmp, dname, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dfd)
        except OSError:
            pass
        raise
    finally:
        os.close(sfd)
        os.close(dfd)


def _dir_meta(st_: SafeTree, dt: SafeTree, rel: bytes) -> None:
    """Owner, mode and times of directory ``rel`` (b"": the root) as ``src`` has them."""
    sfd = st_.open_dir(rel.split(b"/") if rel else [], full=rel)
    try:
        dfd = dt.open_dir(rel.split(b"/") if rel else [], full=rel)
    except BaseException:
        os.close(sfd)
        raise
    try:
        sst = os.fstat(sfd)
        if IS_ROOT:
            os.fchown(dfd, sst.st_uid, sst.st_gid)
        os.fchmod(dfd, stat.S_IMODE(sst.st_mode))
        os.utime(dfd, ns=(sst.st_atime_ns, sst.st_mtime_ns))
    finally:
        os.close(sfd)
        os.close(dfd)


def replay(changes: Sequence[Change], src: Path | bytes | str, dst: Path | bytes | str) -> None:
    """Make ``dst`` (a clone of the base ``changes`` was taken against) hold what ``src``
    holds at every path of ``changes`` (renames must be given as delete + add)."""
    gone = [c for c in changes if c.new is None or (c.old is not None and c.old.kind != c.new.kind)]
    made = sorted((c for c in changes if c.new is not None), key=lambda c: c.path)
    with SafeTree(src) as st_, SafeTree(dst) as dt:
        for c in sorted(gone, key=lambda c: (-_depth(c.path), c.path)):
            _remove(dt, c.path)
        for c in made:
            assert c.new is not None
            if c.new.kind == KIND_DIR:
                if dt.node(c.path) is None:
                    dt.mkdir(c.path, 0o700)  # its bits and times once its entries are in
            else:
                _put(st_, dt, c.path)
        # Every directory made or written in, deepest first: making an entry moves its
        # parent's times, and the check may look at them (make, build caches).
        dirs = {c.path for c in made if c.new is not None and c.new.kind == KIND_DIR}
        for c in changes:
            dirs.update(_ancestors(c.path))
        for rel in sorted(dirs, key=lambda p: (-_depth(p) if p else 1, p)):
            if not rel or (_is_dir(st_, rel) and _is_dir(dt, rel)):
                _dir_meta(st_, dt, rel)
