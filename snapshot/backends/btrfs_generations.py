"""What moved in a btrfs subvolume since a generation, read with the tree-search ioctl (what
``btrfs subvolume find-new`` does), never with a snapshot; and whether that reading can be
trusted right now.

Every item btrfs writes carries the transaction that wrote it (an inode item's ``transid``, a
file extent's ``generation``), and the tree search skips every tree block older than the
generation asked for. So a subvolume that shares its tree with a snapshot (a sandbox cloned
from it, live it was taken of, a snapshot of either) names what moved since that snapshot in
O(changes): inodes whose item is newer than the snapshot's ``otransid``, resolved to their
names (``INODE_REF``/``INODE_EXTREF``, parents by ``INO_LOOKUP``), and for a directory that
moved, the names it gained or lost against the snapshot's listing.

When it can be trusted (``settled``), measured on 6.18: a buffered write to an existing file
changes nothing the search sees, nor the subvolume's ``ctransid``, until the page cache is
written back (up to ``dirty_expire_centisecs``, 30 s, later); a chmod or a written-back
extent moves the subvolume's in-memory ``ctransid`` at once, but the inode item reaches the
tree only when the transaction commits. So the search is exact for a read-only subvolume,
and for a writable one only when (a) its in-memory ``ctransid`` (``BTRFS_IOC_GET_SUBVOL_INFO``)
equals the one its committed root item holds (no delayed inode update pending) and (b) no data
waits to be written back: its qgroup's ``rsv_data`` is 0 where quotas are on, else the whole
filesystem's data space has nothing reserved (``bytes_may_use`` and ``bytes_reserved`` in
sysfs). Otherwise the caller walks the tree with ``lstat`` (``snapshot.candidates``), which
sees the inode in memory.

Caveats:
- The tree search and ``INO_LOOKUP`` need CAP_SYS_ADMIN: as a normal user nothing here but
  ``subvol_info`` and ``data_quiet`` works (callers walk).
- (b) is filesystem-wide without quotas: any dirty file anywhere on the filesystem (petri's
  own registry, whose WAL is written without fsync, included) sends the caller to the walk.
- "Settled" is read before the search, not atomically with it: a write racing the read may
  be missed, as with any read of a tree being written.
"""
from __future__ import annotations

import fcntl
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    from ..osutil import PathLike

# _IOR(0x94, 60, struct btrfs_ioctl_get_subvol_info_args): 504 bytes, any user (Linux 4.18+)
BTRFS_IOC_GET_SUBVOL_INFO = 0x81F8943C
# _IOWR(0x94, 17, struct btrfs_ioctl_search_args): a 104-byte key, then a 3992-byte buffer
BTRFS_IOC_TREE_SEARCH = 0xD0009411
# _IOWR(0x94, 18, struct btrfs_ioctl_ino_lookup_args): treeid, objectid, name[4080]
BTRFS_IOC_INO_LOOKUP = 0xD0009412
_SEARCH_KEY = struct.Struct("=7Q4I4Q")
_SEARCH_HEADER = struct.Struct("=3Q2I")  # transid, objectid, offset, type, len
_U64_MAX = (1 << 64) - 1
ROOT_TREE = 1
INODE_ITEM, INODE_REF, INODE_EXTREF, ROOT_ITEM, EXTENT_DATA = 1, 12, 13, 132, 108
FIRST_FREE_OBJECTID = 256
LAST_FREE_OBJECTID = _U64_MAX - 256  # above: orphans, the free-inode cache and other trees' ids
_INODE_GEN_TRANSID = struct.Struct("=QQ")  # btrfs_inode_item: generation, transid, ...
_INODE_MODE_AT = 52  # ... size, nbytes, block_group (u64), nlink, uid, gid (u32), then mode
_EXTENT_GEN = struct.Struct("=Q")  # btrfs_file_extent_item: generation first
_ROOT_CTRANSID_AT = 295  # btrfs_root_item (packed): inode item (160) ... received_uuid, ctransid


@dataclass(frozen=True)
class SubvolInfo:
    id: int
    generation: int  # the root's generation as last committed
    ctransid: int    # the transaction of its last change, uncommitted ones included
    otransid: int    # the transaction that made it (a snapshot: when it was taken)
    parent_uuid: bytes = bytes(16)  # a snapshot: the uuid of the subvolume it was taken of
    otime_ns: int = 0  # when it was made (wall clock)


def subvol_info(path: PathLike) -> SubvolInfo:
    """The subvolume's root item as the kernel holds it in memory (``GET_SUBVOL_INFO``; any
    user who can open ``path``)."""
    buf = bytearray(504)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.ioctl(fd, BTRFS_IOC_GET_SUBVOL_INFO, buf)
    finally:
        os.close(fd)
    (treeid,) = struct.unpack_from("=Q", buf, 0)
    _parent, _dirid, generation, _flags = struct.unpack_from("=4Q", buf, 264)
    ctransid, otransid = struct.unpack_from("=2Q", buf, 344)
    parent_uuid = bytes(buf[312:328])
    osec, onsec = struct.unpack_from("=QI", buf, 392)  # otime: struct btrfs_ioctl_timespec (16 bytes)
    return SubvolInfo(treeid, generation, ctransid, otransid, parent_uuid, osec * 1_000_000_000 + onsec)


def _search(fd: int, tree: int, min_transid: int, min_obj: int = 0, max_obj: int = _U64_MAX,
            min_type: int = 0, max_type: int = 255) -> Iterator[tuple[int, int, int, int, bytes]]:
    """(block transid, objectid, type, offset, item bytes) of every item in ``tree`` (0: the
    subvolume of ``fd``) between the keys, skipping blocks older than ``min_transid``. The
    key range is lexicographic: items of other types between the bounds come too."""
    objectid, kind, offset = min_obj, min_type, 0
    while True:
        buf = bytearray(4096)
        _SEARCH_KEY.pack_into(buf, 0, tree, objectid, max_obj, offset, _U64_MAX, min_transid, _U64_MAX,
                              kind, max_type, 4096, 0, 0, 0, 0, 0)
        fcntl.ioctl(fd, BTRFS_IOC_TREE_SEARCH, buf)
        found = _SEARCH_KEY.unpack_from(buf, 0)[9]
        if not found:
            return
        pos = _SEARCH_KEY.size
        for _ in range(found):
            transid, objectid, offset, kind, length = _SEARCH_HEADER.unpack_from(buf, pos)
            pos += _SEARCH_HEADER.size
            yield transid, objectid, kind, offset, bytes(buf[pos:pos + length])
            pos += length
        # The next search starts just past the last key returned.
        if offset < _U64_MAX:
            offset += 1
        elif kind < 255:
            kind, offset = kind + 1, 0
        elif objectid < _U64_MAX:
            objectid, kind, offset = objectid + 1, 0, 0
        else:
            return


def committed_ctransid(path: PathLike, subvol_id: int) -> int | None:
    """The ``ctransid`` of the subvolume's root item as the root tree holds it: the last
    committed one (root; None where the item is too old to have one, or cannot be read)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for _t, _o, kind, _off, data in _search(fd, ROOT_TREE, 0, subvol_id, subvol_id, ROOT_ITEM, ROOT_ITEM):
            if kind == ROOT_ITEM and len(data) >= _ROOT_CTRANSID_AT + 8:
                return int(struct.unpack_from("=Q", data, _ROOT_CTRANSID_AT)[0])
            return None
    except OSError:
        return None
    finally:
        os.close(fd)
    return None


BTRFS_IOC_FS_INFO = 0x8400941F


def fsid(path: Path) -> str:
    """The filesystem's UUID as sysfs names it (8-4-4-4-12 lowercase hex). Formatted here,
    not with ``uuid``: importing it cost ~1.7 ms of each ``petri ls``, and a call is ~20 us,
    so the repeated calls of one command are not worth a cache (a stale one after a remount
    would point at another filesystem's qgroups)."""
    buf = bytearray(1024)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.ioctl(fd, BTRFS_IOC_FS_INFO, buf)
    finally:
        os.close(fd)
    h = bytes(buf[16:32]).hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _fs_dir(path: PathLike) -> Path:
    return Path("/sys/fs/btrfs") / fsid(Path(os.fsdecode(path)))


def data_quiet(path: PathLike, subvol_id: int) -> bool:
    """Is no data waiting to be written back to the subvolume (its qgroup's reservation, where
    quotas are on), or else anywhere on the filesystem (sysfs: any user)?"""
    try:
        fs = _fs_dir(path)
        qgroup = fs / "qgroups" / f"0_{subvol_id}"
        if qgroup.is_dir():
            return int((qgroup / "rsv_data").read_text()) == 0
        data = fs / "allocation" / "data"
        return int((data / "bytes_may_use").read_text()) == 0 and int((data / "bytes_reserved").read_text()) == 0
    except (OSError, ValueError):
        return False


def settled(path: PathLike, read_only: bool) -> bool:
    """Does the tree search see everything the subvolume at ``path`` holds now? (see the
    module doc). A read-only subvolume always; a writable one when nothing of it is waiting
    for a commit or a write-back."""
    if read_only:
        return True
    try:
        info = subvol_info(path)
    except OSError:
        return False
    if not data_quiet(path, info.id):
        return False
    return committed_ctransid(path, info.id) == info.ctransid


def _names(fd: int, ino: int) -> list[tuple[int, bytes]]:
    """(parent inode, name) for every hard link of ``ino``."""
    out = []
    for _t, _o, kind, offset, data in _search(fd, 0, 0, ino, ino, INODE_REF, INODE_EXTREF):
        pos = 0
        if kind == INODE_REF:
            while pos + 10 <= len(data):
                (n,) = struct.unpack_from("=H", data, pos + 8)
                out.append((offset, data[pos + 10:pos + 10 + n]))
                pos += 10 + n
        elif kind == INODE_EXTREF:
            while pos + 18 <= len(data):
                parent, _index, n = struct.unpack_from("=QQH", data, pos)
                out.append((parent, data[pos + 18:pos + 18 + n]))
                pos += 18 + n
    return out


class _Paths:
    """Directory inode -> its path in the subvolume (``INO_LOOKUP``), remembered."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.known: dict[int, bytes | None] = {FIRST_FREE_OBJECTID: b""}

    def of_dir(self, ino: int) -> bytes | None:
        if ino not in self.known:
            buf = bytearray(4096)
            struct.pack_into("=QQ", buf, 0, 0, ino)
            try:
                fcntl.ioctl(self.fd, BTRFS_IOC_INO_LOOKUP, buf)
                self.known[ino] = bytes(buf[16:]).split(b"\0", 1)[0].rstrip(b"/")
            except OSError:
                self.known[ino] = None  # gone meanwhile: its parent's listing says so
        return self.known[ino]


def changed_paths(tree: PathLike, base: PathLike, since: int) -> tuple[set[bytes], set[bytes]]:
    """Where subvolume ``tree`` may differ from ``base`` (a snapshot it shares its tree with,
    taken or cloned at transaction ``since``): (paths, whole subtrees). Only true of what the
    tree search can see (``settled``); root. Raises OSError where the ioctls fail."""
    t, b = os.fsencode(tree), os.fsencode(base)
    fd = os.open(t, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        inodes: set[int] = set()
        dirs: set[int] = set()
        for _t, obj, kind, _off, data in _search(fd, 0, since + 1):
            if not FIRST_FREE_OBJECTID <= obj <= LAST_FREE_OBJECTID:
                continue
            if kind == INODE_ITEM:
                if _INODE_GEN_TRANSID.unpack_from(data, 0)[1] > since:
                    (mode,) = struct.unpack_from("=I", data, _INODE_MODE_AT)
                    (dirs if stat.S_ISDIR(mode) else inodes).add(obj)
            elif kind == EXTENT_DATA and _EXTENT_GEN.unpack_from(data, 0)[0] > since:
                inodes.add(obj)
        paths = _Paths(fd)
        out: set[bytes] = set()
        whole: set[bytes] = set()
        for ino in inodes - dirs:
            for parent, name in _names(fd, ino):
                d = paths.of_dir(parent)
                if d is not None:
                    out.add(d + b"/" + name if d else name)
        for ino in dirs:
            d = paths.of_dir(ino)
            if d is None:
                continue
            if d:
                out.add(d)
                try:
                    bst = os.lstat(os.path.join(b, d))
                except (FileNotFoundError, NotADirectoryError):
                    whole.add(d)  # new, or moved here: its whole subtree
                    continue
                if not stat.S_ISDIR(bst.st_mode) or bst.st_ino != ino:
                    whole.add(d)
                    continue
            out.update(_listing_changes(t, b, d))
        return out, whole
    finally:
        os.close(fd)


def _listing_changes(tree: bytes, base: bytes, d: bytes) -> set[bytes]:
    """Names of directory ``d`` that are on one side only, or another inode on each."""
    def listing(root: bytes) -> dict[bytes, int]:
        try:
            with os.scandir(os.path.join(root, d) if d else root) as it:
                return {e.name: e.inode() for e in it}
        except (FileNotFoundError, NotADirectoryError):
            return {}

    mine, theirs = listing(tree), listing(base)
    prefix = d + b"/" if d else b""
    return {prefix + n for n in mine.keys() | theirs.keys() if mine.get(n) != theirs.get(n)}
