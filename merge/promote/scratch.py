"""A promotion's scratch space: staging and pre-images, their cleanup, and parking.

When the journal directory is on another device than the workspace (the store as a
nested btrfs subvolume), staging and pre-images go to ``<workspace>/.petri-staging-<id>/``
so renames stay atomic; that directory exists only while a promotion (or its undo) runs:
once done, the pre-images are copied (reflinked: FICLONE works across subvolumes of one
btrfs) into the journal and the directory is removed (``park_preimages``); an undo copies
them back first. Callers should hold their store lock so no snapshot sees the directory.

The copies are made durable together, with one ``syncfs`` of the destination's filesystem,
before the mark that makes them count (``parked``; for an undo, its ``undoing`` mark): an
fsync per copied file cost a flush each.

Caveats: parking copies every pre-image once more (a reflink where the filesystem can), so
a promotion that replaces large files on a filesystem without reflinks pays that copy.
"""
from __future__ import annotations

import fcntl
import os
import stat
from pathlib import Path

from snapshot.tree import FICLONE

from ..journal import (PARKED, PRE, PromotionDir, _rmtree_counting, atomic_write, fault_point, fsync_dir, scratch_dirs,
                       syncfs_fd)
from ..safefs import read_chunks


def cleanup(pd: PromotionDir, *, keep_pre: bool) -> None:
    pd.drop_staging()
    if not keep_pre:
        pd.drop_preimages()
    scratch = pd.staging.parent
    if scratch != pd.path and not keep_pre:
        _rmtree_counting(pd.path / PRE)  # parked pre-images of an undone promotion
        try:
            os.unlink(pd.path / PARKED)
        except FileNotFoundError:
            pass
        try:
            os.rmdir(scratch)
        except OSError:
            pass


def is_parked(pd: PromotionDir) -> bool:
    return (pd.path / PARKED).exists()


def _copy_entry(src_dir: int, dst_dir: int, name: str) -> None:
    """A reflink copy (FICLONE works across subvolumes of one btrfs), else a plain copy,
    keeping mode, owner and times: undo renames it back into place. Not yet durable: the
    caller syncs the filesystem once for all of them."""
    st = os.lstat(name, dir_fd=src_dir)
    if stat.S_ISLNK(st.st_mode):
        os.symlink(os.readlink(name, dir_fd=src_dir), name, dir_fd=dst_dir)
        if os.geteuid() == 0:
            os.chown(name, st.st_uid, st.st_gid, dir_fd=dst_dir, follow_symlinks=False)
        return
    src = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=src_dir)
    try:
        dst = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                      0o600, dir_fd=dst_dir)
        try:
            try:
                fcntl.ioctl(dst, FICLONE, src)
            except OSError:
                for chunk in read_chunks(src):
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(dst, view):]
            if os.geteuid() == 0:
                os.fchown(dst, st.st_uid, st.st_gid)
            os.fchmod(dst, stat.S_IMODE(st.st_mode))
            os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
            os.close(dst)
    finally:
        os.close(src)


def _copy_dir(src: Path, dst: Path) -> None:
    """Copy every entry of ``src`` into a fresh ``dst`` (a leftover half copy is redone),
    durable (contents and names) when it returns."""
    _rmtree_counting(dst)
    dst.mkdir(mode=0o700, parents=True)
    sfd = os.open(src, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW)
    dfd = os.open(dst, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        for name in sorted(os.listdir(sfd)):
            _copy_entry(sfd, dfd, name)
        syncfs_fd(dfd, dst)
    finally:
        os.close(sfd)
        os.close(dfd)


def park_preimages(pd: PromotionDir) -> None:
    """Move a finished promotion's pre-images out of the workspace, into its journal.

    Only when the journal is on another device (the store as a nested btrfs subvolume):
    then the scratch dir ``<workspace>/.petri-staging-<id>/`` holds them, and nothing of
    petri's may stay visible in the live tree. They are copied (reflinked where the
    filesystem can) to ``<journal>/<id>/pre``, the ``parked`` mark makes that copy the one
    that counts, and the scratch dir goes. Idempotent: recovery calls it again after a kill."""
    scratch = pd.staging.parent
    if scratch == pd.path:
        return
    if not is_parked(pd):
        if pd.pre.is_dir():
            _copy_dir(pd.pre, pd.path / PRE)
        else:
            (pd.path / PRE).mkdir(mode=0o700, exist_ok=True)
        fsync_dir(pd.path)
        atomic_write(pd.path, PARKED, b"")
        fault_point("park")
    _rmtree_counting(scratch)
    try:
        fsync_dir(scratch.parent)
    except OSError:
        pass


def unpark_preimages(pd: PromotionDir) -> None:
    """Copy parked pre-images back into the workspace's scratch dir (renames into the
    workspace must not cross devices) before an undo begins."""
    if pd.staging.parent == pd.path or not is_parked(pd):
        return
    _copy_dir(pd.path / PRE, pd.pre)
    fsync_dir(pd.pre.parent)


def open_pd(live: Path, journal_dir: Path, pid: str) -> PromotionDir:
    pd = PromotionDir(journal_dir, pid)
    pd.staging, pd.pre = scratch_dirs(journal_dir, live, pid)
    return pd



def open_or_make(d: Path) -> int:
    d.mkdir(parents=True, exist_ok=True)
    return os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

