"""The ``reflink`` backend: per-file copy-on-write clones (FICLONE) on XFS, or in a btrfs
directory that is not its own subvolume.

Same shape as ``copy`` (a tree per snapshot, hard links to the previous snapshot for files
that did not move), but file data is shared by reflink, so a snapshot or clone costs
O(files) metadata operations and no data copy. Files are cloned in the walking thread, a
directory at a time through directory fds: each FICLONE is short, and threads measured slower
(they mostly contend for the GIL; see ``TreeCopier``).

Caveats: O(files), not O(1): a 60k-file tree takes seconds, not milliseconds; exact per
file, not across files; hard links in the base are kept. ``clone_usage`` finds changed files
as the copy backend does (a stat walk) and counts only their extents FIEMAP says no other
file shares.
"""
from __future__ import annotations

import errno
import fcntl
import os
import struct
from pathlib import Path
from typing import ClassVar

from ..store import Store
from ..tree import FICLONE
from .copy import CopyBackend


def reflink_works(directory: Path) -> tuple[bool, str]:
    """Try a FICLONE between two scratch files in ``directory``: unnamed (O_TMPFILE, so the
    probe leaves no entry and no new mtime on the directory: `petri doctor` writes nothing),
    or named and removed again where the filesystem has no O_TMPFILE."""
    try:
        fa = os.open(directory, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
    except OSError as e:
        if e.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
            return False, f"cannot write in {directory}: {e.strerror}"
        return _reflink_works_named(directory)
    try:
        fb = os.open(directory, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
    except OSError as e:
        os.close(fa)
        return False, f"cannot write in {directory}: {e.strerror}"
    try:
        return _ficlone_probe(fa, fb)
    finally:
        os.close(fa)
        os.close(fb)


def _ficlone_probe(fa: int, fb: int) -> tuple[bool, str]:
    os.write(fa, b"petri")
    try:
        fcntl.ioctl(fb, FICLONE, fa)
        return True, "the filesystem supports reflinks (FICLONE)"
    except OSError as e:
        if e.errno in (errno.EOPNOTSUPP, errno.EINVAL, errno.EXDEV, errno.ENOTTY):
            return False, "the filesystem has no reflinks (FICLONE unsupported)"
        return False, f"FICLONE failed: {e.strerror}"


def _reflink_works_named(directory: Path) -> tuple[bool, str]:
    a = directory / f".petri-reflink-probe-{os.getpid()}-a"
    b = directory / f".petri-reflink-probe-{os.getpid()}-b"
    try:
        fa = os.open(a, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        fb = os.open(b, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            return _ficlone_probe(fa, fb)
        finally:
            os.close(fa)
            os.close(fb)
    except OSError as e:
        return False, f"cannot write in {directory}: {e.strerror}"
    finally:
        for p in (a, b):
            try:
                os.unlink(p)
            except OSError:
                pass


FS_IOC_FIEMAP = 0xC020660B  # _IOWR('f', 11, struct fiemap)
FIEMAP_EXTENT_LAST = 0x1
FIEMAP_EXTENT_SHARED = 0x2000
_FIEMAP_HEAD = struct.Struct("=QQIIII")      # fm_start, fm_length, fm_flags, mapped, count, reserved
_FIEMAP_EXTENT = struct.Struct("=QQQQQIIII")  # logical, physical, length, 2 reserved, flags, 3 reserved


def unshared_bytes(path: bytes, batch: int = 64) -> int | None:
    """Bytes of the file's extents that no other file shares (FIEMAP), or None when the
    filesystem cannot map them. Delayed-allocation extents count as unshared: they are new."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        total, start = 0, 0
        while True:
            buf = bytearray(_FIEMAP_HEAD.size + _FIEMAP_EXTENT.size * batch)
            _FIEMAP_HEAD.pack_into(buf, 0, start, 0xFFFFFFFFFFFFFFFF - start, 0, 0, batch, 0)
            try:
                fcntl.ioctl(fd, FS_IOC_FIEMAP, buf)
            except OSError:
                return None
            mapped = _FIEMAP_HEAD.unpack_from(buf, 0)[3]
            if not mapped:
                return total
            for i in range(mapped):
                logical, _, length, _, _, flags, *_ = _FIEMAP_EXTENT.unpack_from(
                    buf, _FIEMAP_HEAD.size + i * _FIEMAP_EXTENT.size)
                if not flags & FIEMAP_EXTENT_SHARED:
                    total += length
                if flags & FIEMAP_EXTENT_LAST:
                    return total
            start = logical + length
    finally:
        os.close(fd)


class ReflinkBackend(CopyBackend):
    name: ClassVar[str] = "reflink"
    reflink: ClassVar[bool] = True
    usage_measure: ClassVar[str] = "unshared"

    def _changed_file_bytes(self, path: bytes, st: os.stat_result) -> int:
        # A changed file may still share most of its extents with the base (an append).
        got = unshared_bytes(path)
        return st.st_size if got is None else got

    @staticmethod
    def available(workspace: Path) -> tuple[bool, str]:
        ok, why = reflink_works(workspace)
        return ok, why + ("" if ok else "; reflinks need XFS (reflink=1) or btrfs")

    def estimate_bytes(self, store: Store, parent: str | None) -> int:
        return 0  # reflinked: no data is copied
