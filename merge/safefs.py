"""Filesystem operations confined to one directory tree, never following a symlink.

Every relative path is checked (no absolute path, no ``..``, ``.`` or empty component, no
NUL) and then resolved one component at a time from the root's directory fd with
``O_DIRECTORY | O_NOFOLLOW``. A component that is a symlink (or not a directory) stops the
walk with ``PathThroughSymlink`` -- for promotion that is a conflict, never a way out of the
workspace. Final components are operated on with the ``*at`` calls relative to the parent's
fd, so a symlink as the *last* component is handled as a symlink (read, replaced, removed),
never followed.

What this module creates is a closed vocabulary: regular files (``O_CREAT | O_EXCL``),
directories and symlinks. Never device nodes, fifos or sockets. Permission bits are always
masked with ``0o777`` (no setuid, setgid or sticky). Extended attributes (and so ACLs, which
are ``system.posix_acl_*`` xattrs) are copied only when their name is in the allow-list given
by the caller; the default list is empty.

Renames use ``renameat2`` (``snapshot.osutil``) so that creating a path that must not exist can
say ``RENAME_NOREPLACE`` and lose no file an editor created a moment earlier.

Resolving a directory is one ``openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`` where the
kernel has it (Linux >= 5.6): the kernel refuses every symlink and every way out of the root
along the whole path in one call, the guarantee the walk gives component by component (a
10,000-file promotion resolves ~60,000 paths: this halves their cost). On any refusal the
per-component walk runs instead and says which component was in the way (or succeeds, if
the path changed in between); where ``openat2`` is missing the walk is all there is.

Caveats: a check of a path and the operation on it are separate system calls, so a
concurrent writer in the workspace can still slip between them; callers narrow that window
(promotion re-hashes right before each rename) but cannot close it.
"""
from __future__ import annotations

import ctypes
import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import xxhash

from snapshot.osutil import RENAME_NOREPLACE, libc, read_fd, renameat2

from .changes import content_id_fd, kind_of
from .errors import PathThroughSymlink, UnsafePath

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
PERM_MASK = 0o777
CHUNK = 1 << 20
XATTR_ALLOW_DEFAULT: frozenset[bytes] = frozenset()

_SYS_OPENAT2 = 437  # the same number on every architecture (added after the numbers were unified)
_RESOLVE_NO_MAGICLINKS, _RESOLVE_NO_SYMLINKS, _RESOLVE_BENEATH = 0x02, 0x04, 0x08


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_DIR_HOW = _OpenHow(DIR_FLAGS, 0, _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS)
_openat2_ok = True  # until the kernel (or a seccomp filter) says it has no openat2


def _open_dir_beneath(dir_fd: int, path: bytes) -> int | None:
    """fd of directory ``path`` below ``dir_fd`` through no symlink, in one openat2; None when
    the caller must walk instead (no openat2, or it refused: the walk says why)."""
    global _openat2_ok
    if not _openat2_ok:
        return None
    fd = libc.syscall(_SYS_OPENAT2, dir_fd, path, ctypes.byref(_DIR_HOW), ctypes.sizeof(_DIR_HOW))
    if fd >= 0:
        return int(fd)
    err = ctypes.get_errno()
    if err == errno.ENOENT:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), os.fsdecode(path))
    if err in (errno.ENOSYS, errno.EPERM):
        _openat2_ok = False  # an old kernel, or a filter that forbids it: walk from now on
    return None



def split_rel(path: bytes | str | os.PathLike) -> list[bytes]:
    """Components of a relative path, refusing anything that could leave the root."""
    b = os.fsencode(path)
    comps = b.split(b"/")
    if (not b or b.startswith(b"/") or b"\0" in b
            or any(c in (b"", b".", b"..") for c in comps)):
        raise UnsafePath(path=os.fsdecode(b))
    return comps


def safe_mode(mode: int) -> int:
    """Permission bits a promotion may carry: rwx for user, group, other; nothing else."""
    return mode & PERM_MASK


def content_id_bytes(data: bytes) -> str:
    return xxhash.xxh3_128_hexdigest(data)


@dataclass(frozen=True, slots=True)
class Node:
    """What is at a path now (lstat), plus the content id when asked for."""

    kind: str  # 'file' | 'symlink' | 'dir' | 'other'
    mode: int  # st_mode & 0o7777
    ino: int
    dev: int
    uid: int
    gid: int
    content_id: str | None = None
    target: bytes | None = None


class SafeTree:
    """A directory tree addressed by checked relative byte paths. Close it (or use ``with``)."""

    def __init__(self, root: Path | bytes | str):
        self.root = os.fsencode(root)
        # the root itself may be reached through symlinks the user chose; nothing below it
        self.fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "SafeTree":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- resolution ---------------------------------------------------------------------

    def open_dir(self, comps: Iterable[bytes], *, create_mode: int | None = None,
                 full: bytes = b"") -> int:
        """fd of the directory at ``comps`` (a new fd the caller closes). With
        ``create_mode``, missing directories are created with those bits."""
        comps = list(comps)
        if comps and create_mode is None:
            got = _open_dir_beneath(self.fd, b"/".join(comps))
            if got is not None:
                return got
        fd = os.dup(self.fd)
        walked: list[bytes] = []
        try:
            for comp in comps:
                walked.append(comp)
                try:
                    nfd = os.open(comp, DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if create_mode is None:
                        raise
                    try:
                        os.mkdir(comp, safe_mode(create_mode), dir_fd=fd)
                    except FileExistsError:
                        pass  # raced with someone making it: open decides what it is
                    try:
                        nfd = os.open(comp, DIR_FLAGS, dir_fd=fd)
                    except OSError as e:
                        if e.errno in (errno.ELOOP, errno.ENOTDIR):
                            raise PathThroughSymlink(path=os.fsdecode(full or b"/".join(walked)),
                                                     via=os.fsdecode(b"/".join(walked))) from e
                        raise
                    os.chmod(nfd, safe_mode(create_mode))  # umask must not decide the bits
                except OSError as e:
                    if e.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise PathThroughSymlink(path=os.fsdecode(full or b"/".join(walked)),
                                                 via=os.fsdecode(b"/".join(walked))) from e
                    raise
                # Swap first, close after: an interrupt between the two then leaks an fd instead of
                # the handler below closing one that is already closed (or reused by then).
                fd, old = nfd, fd
                os.close(old)
            return fd
        except BaseException:
            os.close(fd)
            raise

    def parent(self, rel: bytes, *, create_mode: int | None = None) -> tuple[int, bytes]:
        """(fd of the parent directory, last component); the caller closes the fd."""
        comps = split_rel(rel)
        return self.open_dir(comps[:-1], create_mode=create_mode, full=rel), comps[-1]

    # -- reading ------------------------------------------------------------------------

    def node(self, rel: bytes, *, with_content_id: bool = False) -> Node | None:
        """What is at ``rel`` (None if nothing, or the parent does not exist)."""
        try:
            pfd, name = self.parent(rel)
        except FileNotFoundError:
            return None
        try:
            try:
                st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
            except FileNotFoundError:
                return None
            kind = kind_of(st.st_mode)
            cid = target = None
            if kind == "symlink":
                target = os.readlink(name, dir_fd=pfd)
                cid = content_id_bytes(target)
            elif kind == "file" and with_content_id:
                cid = self._hash_at(pfd, name, st)
            return Node(kind, st.st_mode & 0o7777, st.st_ino, st.st_dev, st.st_uid, st.st_gid,
                        cid, target)
        finally:
            os.close(pfd)

    def _open_regular_at(self, pfd: int, name: bytes, st: os.stat_result | None = None) -> int:
        fd = os.open(name, READ_FLAGS, dir_fd=pfd)
        fst = os.fstat(fd)
        if not stat.S_ISREG(fst.st_mode) or (
                st is not None and (fst.st_ino, fst.st_dev) != (st.st_ino, st.st_dev)):
            os.close(fd)
            raise FileNotFoundError(errno.ENOENT, "not the regular file that was there", name)
        return fd

    def _hash_at(self, pfd: int, name: bytes, st: os.stat_result | None = None) -> str:
        fd = self._open_regular_at(pfd, name, st)
        try:
            return content_id_fd(fd)
        finally:
            os.close(fd)

    def open_regular(self, rel: bytes) -> int:
        """A read fd on the regular file at ``rel`` (never a fifo, device or symlink)."""
        pfd, name = self.parent(rel)
        try:
            return self._open_regular_at(pfd, name)
        finally:
            os.close(pfd)

    def read(self, rel: bytes) -> bytes:
        fd = self.open_regular(rel)
        try:
            return read_fd(fd)
        finally:
            os.close(fd)

    def readlink(self, rel: bytes) -> bytes:
        pfd, name = self.parent(rel)
        try:
            return os.readlink(name, dir_fd=pfd)
        finally:
            os.close(pfd)

    def listdir(self, rel: bytes) -> list[bytes]:
        fd = self.open_dir(split_rel(rel), full=rel) if rel else os.dup(self.fd)
        try:
            return sorted(os.fsencode(n) for n in os.listdir(fd))
        finally:
            os.close(fd)

    def walk(self, rel: bytes) -> list[bytes]:
        """Every path below directory ``rel`` (not following symlinks), children first."""
        out: list[bytes] = []
        for name in self.listdir(rel):
            child = rel + b"/" + name if rel else name
            n = self.node(child)
            if n is not None and n.kind == "dir":
                out.extend(self.walk(child))
            out.append(child)
        return out

    # -- writing ------------------------------------------------------------------------

    def rename_in(self, src_dir: int, src_name: bytes, rel: bytes, *, noreplace: bool) -> None:
        """Move ``src_name`` (in ``src_dir``, same filesystem) to ``rel``."""
        pfd, name = self.parent(rel)
        try:
            renameat2(src_dir, src_name, pfd, name, RENAME_NOREPLACE if noreplace else 0)
        finally:
            os.close(pfd)

    def rename_out(self, rel: bytes, dst_dir: int, dst_name: bytes) -> None:
        pfd, name = self.parent(rel)
        try:
            renameat2(pfd, name, dst_dir, dst_name, RENAME_NOREPLACE)
        finally:
            os.close(pfd)

    def link_out(self, rel: bytes, dst_dir: int, dst_name: bytes) -> None:
        """Hard-link the entry at ``rel`` itself (a symlink stays a symlink) to dst."""
        pfd, name = self.parent(rel)
        try:
            os.link(name, dst_name, src_dir_fd=pfd, dst_dir_fd=dst_dir, follow_symlinks=False)
        finally:
            os.close(pfd)

    def unlink(self, rel: bytes) -> None:
        pfd, name = self.parent(rel)
        try:
            os.unlink(name, dir_fd=pfd)
        finally:
            os.close(pfd)

    def rmdir(self, rel: bytes) -> None:
        pfd, name = self.parent(rel)
        try:
            os.rmdir(name, dir_fd=pfd)
        finally:
            os.close(pfd)

    def mkdir(self, rel: bytes, mode: int) -> None:
        pfd, name = self.parent(rel)
        try:
            os.mkdir(name, safe_mode(mode), dir_fd=pfd)
            dfd = os.open(name, DIR_FLAGS, dir_fd=pfd)
            try:
                os.chmod(dfd, safe_mode(mode))
            finally:
                os.close(dfd)
        finally:
            os.close(pfd)

    def chmod(self, rel: bytes, mode: int) -> None:
        """Set permission bits of a file or directory at ``rel`` (never through a symlink)."""
        pfd, name = self.parent(rel)
        try:
            st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                fd = os.open(name, DIR_FLAGS, dir_fd=pfd)
            elif stat.S_ISREG(st.st_mode):
                fd = self._open_regular_at(pfd, name, st)
            else:
                return  # symlink modes mean nothing on Linux
            try:
                os.chmod(fd, safe_mode(mode))
            finally:
                os.close(fd)
        finally:
            os.close(pfd)

    def fsync_dir(self, rel: bytes) -> None:
        fd = self.open_dir(split_rel(rel), full=rel) if rel else os.dup(self.fd)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def copy_xattrs(src_fd: int, dst_fd: int, allow: frozenset[bytes]) -> None:
    """Copy only allow-listed extended attributes (none by default: ACLs included)."""
    if not allow:
        return
    for name in os.listxattr(src_fd):
        if os.fsencode(name) in allow:
            os.setxattr(dst_fd, name, os.getxattr(src_fd, name))


def write_new_file(dir_fd: int, name: bytes, chunks: Iterable[bytes], mode: int, *,
                   owner: tuple[int, int] | None = None, durable: bool = True) -> str:
    """Create a regular file (must not exist), write, set bits, fsync; return its content id.
    ``durable=False`` leaves out the fsync: for a caller that makes many files durable at once
    (one ``syncfs``) before anything relies on them."""
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600, dir_fd=dir_fd)
    try:
        h = xxhash.xxh3_128()
        for buf in chunks:
            h.update(buf)
            view = memoryview(buf)
            while view:
                n = os.write(fd, view)
                view = view[n:]
        if owner is not None:
            os.fchown(fd, *owner)
        # after chown: chown clears setuid bits anyway, but we never set them
        os.chmod(fd, safe_mode(mode))
        if durable:
            os.fsync(fd)
        return h.hexdigest()
    finally:
        os.close(fd)


def read_chunks(fd: int) -> Iterable[bytes]:
    while True:
        buf = os.read(fd, CHUNK)
        if not buf:
            return
        yield buf


def fsync_path_dir(path: bytes | str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
