"""Many sandboxes on one FUSE mount: each is a top-level directory of the mount, served by its
own :class:`.ops.CowFS` (its own layers, upper, journal, disk budget and inode space), and
every request is routed to the filesystem that owns its inode or file handle.

Numbering: the sandbox added n-th gets ``base = n << 32``; its inode and handle numbers are
``base + 1`` (its root), ``base + 2``, ... and the host's own root is inode 1. So the owner
of any number is ``number >> 32``, looked up in one dict, and a number is never given to
another sandbox within the mount's life: a removed sandbox's inodes answer ESTALE, never
another sandbox's files.

Isolation: one sandbox's requests never reach another's filesystem. The kernel only sends a
request for an inode it was given by a lookup under that directory; a rename or hard link
between two sandboxes (possible from the host, where both directories are visible) is
refused with EXDEV, and ``..`` of a sandbox's root is that root. Inside a command's
namespace only the sandbox's own directory is bound (a bind mount of a subdirectory: ``..``
at its root stays there, and ``open_by_handle_at`` refuses handles outside it).

The mount's root: listed (the sandbox names), looked up (a name not served is ENOENT, never
cached, so a sandbox added a moment later is found), and nothing else: no entry can be
made, removed or renamed there. Its owner and mode are the mount point's.

Caveats:
- ``statfs`` is per mount (pyfuse3 does not pass the inode it was asked on): ``df`` inside a
  sandbox shows the filesystem of the uppers, not the sandbox's disk budget (writes past the
  budget still get ENOSPC).
- Writeback caching and the number of worker tasks are the mount's, not a sandbox's.
"""
from __future__ import annotations

import errno
import logging
import os
import stat
from typing import Any, Awaitable

import pyfuse3
import trio

from .ops import CowFS

log = logging.getLogger("petri.fusefs")

SHIFT = 32
ROOT = pyfuse3.ROOT_INODE


def _err(code: int) -> pyfuse3.FUSEError:
    return pyfuse3.FUSEError(code)


Entry = Awaitable[pyfuse3.EntryAttributes]


async def _done(value: Any) -> Any:
    return value


class MultiFS(pyfuse3.Operations):
    supports_dot_lookup = True
    enable_acl = False

    def __init__(self, root_stat: os.stat_result, statfs_path: str | bytes, writeback: bool = False) -> None:
        super().__init__()
        self.enable_writeback_cache = writeback
        self.root_stat = root_stat
        self.statfs_path = statfs_path
        self.by_name: dict[bytes, CowFS] = {}
        self.by_index: dict[int, CowFS] = {}
        self.names: dict[int, bytes] = {}
        self.next_index = 1

    # -- sandboxes -----------------------------------------------------------------------
    def new_base(self) -> int:
        """The numbers of the next sandbox: never those of one served before on this mount."""
        index = self.next_index
        self.next_index += 1
        return index << SHIFT

    def install(self, name: bytes, fs: CowFS) -> CowFS | None:
        """Serve ``fs`` (made with a ``new_base()``) as ``/<name>``; returns the filesystem it
        replaced (closed; the caller drops the kernel's entry for the name, ``forget_entry``)."""
        if not name or b"/" in name or name in (b".", b".."):
            raise ValueError(f"bad sandbox name {name!r}")
        old = self.remove(name)
        index = fs.base >> SHIFT
        self.by_name[name] = fs
        self.by_index[index] = fs
        self.names[index] = name
        return old

    def remove(self, name: bytes) -> CowFS | None:
        """Stop serving ``/<name>``: its inodes answer ESTALE from now on. The kernel's entry
        for the name is dropped (``forget_entry``) by the caller, outside any request."""
        fs = self.by_name.pop(name, None)
        if fs is None:
            return None
        index = fs.base >> SHIFT
        self.by_index.pop(index, None)
        self.names.pop(index, None)
        fs.close()
        return fs

    async def forget_entry(self, name: bytes) -> None:
        """Drop the kernel's cached entry for ``/<name>`` (in a thread: the call blocks while
        a request about it is being answered, and it must not block the event loop that
        answers it)."""
        def drop() -> None:
            try:
                pyfuse3.invalidate_entry(ROOT, name)
            except (OSError, FileNotFoundError):
                pass  # never looked up, or already gone
        await trio.to_thread.run_sync(drop)

    def __len__(self) -> int:
        return len(self.by_name)

    # -- routing -------------------------------------------------------------------------
    def _fs(self, number: int) -> CowFS:
        fs = self.by_index.get(number >> SHIFT)
        if fs is None:
            raise _err(errno.ESTALE)
        return fs

    def _child_fs(self, parent_inode: int) -> CowFS:
        """The filesystem that makes an entry in ``parent_inode``: none at the mount's root."""
        if parent_inode == ROOT:
            raise _err(errno.EPERM)
        return self._fs(parent_inode)

    def _root_attrs(self) -> pyfuse3.EntryAttributes:
        st = self.root_stat
        e = pyfuse3.EntryAttributes()
        e.st_ino = ROOT
        e.st_mode = stat.S_IFDIR | stat.S_IMODE(st.st_mode)
        e.st_nlink = 2
        e.st_uid, e.st_gid = st.st_uid, st.st_gid
        e.st_blksize = st.st_blksize
        e.st_atime_ns = st.st_atime_ns
        e.st_mtime_ns = st.st_mtime_ns
        e.st_ctime_ns = st.st_ctime_ns
        e.entry_timeout = e.attr_timeout = 1.0
        return e

    # -- lookup and attributes -----------------------------------------------------------
    # The hot handlers are plain functions handing back the sandbox's own coroutine: pyfuse3
    # awaits it directly, with no coroutine of ours in between (one less frame per request).
    def lookup(self, parent_inode: int, name: bytes, ctx: Any) -> Entry:
        if parent_inode != ROOT:
            return self._fs(parent_inode).lookup(parent_inode, name, ctx)
        return self._root_lookup(name, ctx)

    async def _root_lookup(self, name: bytes, ctx: Any) -> pyfuse3.EntryAttributes:
        if name in (b".", b".."):
            return self._root_attrs()
        fs = self.by_name.get(name)
        if fs is None:
            raise _err(errno.ENOENT)  # not a cached negative entry: it may be added any moment
        return await fs.lookup(fs.root.ino, b".", ctx)

    async def forget(self, inode_list: list[tuple[int, int]]) -> None:
        groups: dict[int, list[tuple[int, int]]] = {}
        for ino, n in inode_list:
            if ino != ROOT:
                groups.setdefault(ino >> SHIFT, []).append((ino, n))
        for index, items in groups.items():
            fs = self.by_index.get(index)
            if fs is not None:
                await fs.forget(items)

    def getattr(self, inode: int, ctx: Any = None) -> Entry:
        if inode == ROOT:
            return _done(self._root_attrs())
        return self._fs(inode).getattr(inode, ctx)

    def setattr(self, inode: int, attr: Any, fields: Any, fh: int | None, ctx: Any) -> Entry:
        return self._child_fs(inode).setattr(inode, attr, fields, fh, ctx)

    def readlink(self, inode: int, ctx: Any) -> Awaitable[bytes]:
        return self._child_fs(inode).readlink(inode, ctx)

    async def statfs(self, ctx: Any) -> pyfuse3.StatvfsData:
        try:
            sv = os.statvfs(self.statfs_path)
        except OSError as e:
            raise _err(e.errno or errno.EIO) from None
        out = pyfuse3.StatvfsData()
        for f in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree", "f_favail",
                  "f_namemax"):
            setattr(out, f, getattr(sv, f))
        return out

    # -- namespace -----------------------------------------------------------------------
    def mknod(self, parent_inode: int, name: bytes, mode: int, rdev: int, ctx: Any) -> Entry:
        return self._child_fs(parent_inode).mknod(parent_inode, name, mode, rdev, ctx)

    def mkdir(self, parent_inode: int, name: bytes, mode: int, ctx: Any) -> Entry:
        return self._child_fs(parent_inode).mkdir(parent_inode, name, mode, ctx)

    def symlink(self, parent_inode: int, name: bytes, target: bytes, ctx: Any) -> Entry:
        return self._child_fs(parent_inode).symlink(parent_inode, name, target, ctx)

    def create(self, parent_inode: int, name: bytes, mode: int, flags: int, ctx: Any) -> Awaitable[Any]:
        return self._child_fs(parent_inode).create(parent_inode, name, mode, flags, ctx)

    async def link(self, inode: int, new_parent_inode: int, new_name: bytes, ctx: Any) -> pyfuse3.EntryAttributes:
        fs = self._child_fs(new_parent_inode)
        if self._fs(inode) is not fs:
            raise _err(errno.EXDEV)
        return await fs.link(inode, new_parent_inode, new_name, ctx)

    def unlink(self, parent_inode: int, name: bytes, ctx: Any) -> Awaitable[None]:
        return self._child_fs(parent_inode).unlink(parent_inode, name, ctx)

    def rmdir(self, parent_inode: int, name: bytes, ctx: Any) -> Awaitable[None]:
        return self._child_fs(parent_inode).rmdir(parent_inode, name, ctx)

    async def rename(self, parent_inode_old: int, name_old: bytes, parent_inode_new: int, name_new: bytes,
                     flags: int, ctx: Any) -> None:
        fs = self._child_fs(parent_inode_old)
        if self._child_fs(parent_inode_new) is not fs:
            raise _err(errno.EXDEV)  # mv falls back to copy and delete, each in its own sandbox
        await fs.rename(parent_inode_old, name_old, parent_inode_new, name_new, flags, ctx)

    # -- files ---------------------------------------------------------------------------
    def open(self, inode: int, flags: int, ctx: Any) -> Awaitable[pyfuse3.FileInfo]:
        if inode == ROOT:
            raise _err(errno.EISDIR)
        return self._fs(inode).open(inode, flags, ctx)

    def read(self, fh: int, off: int, size: int) -> Awaitable[bytes]:
        return self._fs(fh).read(fh, off, size)

    def write(self, fh: int, off: int, buf: bytes) -> Awaitable[int]:
        return self._fs(fh).write(fh, off, buf)

    async def flush(self, fh: int) -> None:
        pass

    async def release(self, fh: int) -> None:
        fs = self.by_index.get(fh >> SHIFT)
        if fs is not None:  # a removed sandbox closed its descriptors already
            await fs.release(fh)

    def fsync(self, fh: int, datasync: bool) -> Awaitable[None]:
        return self._fs(fh).fsync(fh, datasync)

    # -- directories ---------------------------------------------------------------------
    def opendir(self, inode: int, ctx: Any) -> Awaitable[int]:
        if inode == ROOT:
            return _done(0)  # the root's listing is made at readdir: the names served then
        return self._fs(inode).opendir(inode, ctx)

    def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> Awaitable[None]:
        if fh != 0:
            return self._fs(fh).readdir(fh, start_id, token)
        return self._root_readdir(start_id, token)

    async def _root_readdir(self, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        names = sorted(self.by_name)
        for i in range(start_id, len(names)):
            fs = self.by_name.get(names[i])
            if fs is None:
                continue
            attrs = await fs.getattr(fs.root.ino, None)
            if not pyfuse3.readdir_reply(token, names[i], attrs, i + 1):
                return
            fs.root.nlookup += 1

    async def releasedir(self, fh: int) -> None:
        fs = self.by_index.get(fh >> SHIFT) if fh else None
        if fs is not None:
            await fs.releasedir(fh)

    async def fsyncdir(self, fh: int, datasync: bool) -> None:
        if fh != 0:
            await self._fs(fh).fsyncdir(fh, datasync)

    # -- xattrs --------------------------------------------------------------------------
    def getxattr(self, inode: int, name: bytes, ctx: Any) -> Awaitable[bytes]:
        if inode == ROOT:
            raise _err(pyfuse3.ENOATTR)
        return self._fs(inode).getxattr(inode, name, ctx)

    def listxattr(self, inode: int, ctx: Any) -> Awaitable[list[bytes]]:
        if inode == ROOT:
            return _done([])
        return self._fs(inode).listxattr(inode, ctx)

    def setxattr(self, inode: int, name: bytes, value: bytes, ctx: Any) -> Awaitable[None]:
        return self._child_fs(inode).setxattr(inode, name, value, ctx)

    def removexattr(self, inode: int, name: bytes, ctx: Any) -> Awaitable[None]:
        return self._child_fs(inode).removexattr(inode, name, ctx)

    # -- lifetime ------------------------------------------------------------------------
    def close(self) -> None:
        for name in list(self.by_name):
            self.remove(name)
