"""Clone mounts of a tree, optionally id-mapped, always ``nosuid,nodev`` (Linux new mount API).

A root-owned workspace's commands run as uid 0 inside a user namespace that is an
unprivileged uid N on the host (``orchestrator.run_as``). For that uid 0 to own the tree's
root-owned files, the tree is seen through an *idmapped mount*: the kernel translates the
owners on disk to the owners the mount shows, per mount, without touching the disk.

``IdMap(uid, gid)`` is the one mapping petri uses: on-disk root <-> N swapped, every other
id itself. So the tree's root-owned files show as N (uid 0 inside the namespace, which maps
0 <-> N), what the command creates lands on disk owned by root, and a process that is root
on the host can still create files through such a mount (they land as N on disk: without
the swap, root would have no on-disk id there and the kernel would refuse with EOVERFLOW).

``clone_tree(src, dst, idmap)`` is ``open_tree(OPEN_TREE_CLONE | AT_RECURSIVE)`` (a
detached copy of the mount tree at ``src``), ``mount_setattr`` (IDMAP, NOSUID, NODEV) and
``move_mount`` onto ``dst``. The same without an ``idmap`` is a plain ``nosuid,nodev`` bind.

``as_fs_user(uid, gid, fn)`` runs ``fn`` in a thread whose filesystem ids are N with its
capabilities raised again (overlayfs mounted from there does its upper-dir work as N, which
the idmapped upper turns back into root on disk: see the overlay backend).

Caveats:
- The filesystem must support idmapped mounts (ext4, btrfs, xfs, tmpfs on 6.3+); overlayfs
  itself and FUSE servers without ``FUSE_ALLOW_IDMAP`` refuse: ``IdmapUnsupported``.
- Making the mapping's user namespace costs a fork (a child unshares, we write its maps
  and keep its namespace fd): 2-4 ms here, once per process and map (``cached_userns_fd``).
"""
from __future__ import annotations

import ctypes
import errno
import os
import select
import threading
from dataclasses import dataclass
from typing import Callable, TypeVar

from .errors import PetriError
from .osutil import fork, libc
from .osutil import fs_type

T = TypeVar("T")


SYS_open_tree, SYS_move_mount, SYS_mount_setattr = 428, 429, 442
SYS_setfsuid, SYS_setfsgid, SYS_capget, SYS_capset = 122, 123, 125, 126
OPEN_TREE_CLONE, OPEN_TREE_CLOEXEC = 1, 0o2000000
AT_FDCWD, AT_EMPTY_PATH, AT_RECURSIVE, AT_SYMLINK_NOFOLLOW = -100, 0x1000, 0x8000, 0x100
MOVE_MOUNT_F_EMPTY_PATH = 4
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV, MOUNT_ATTR_IDMAP = 0x1, 0x2, 0x4, 0x100000
CLONE_NEWUSER = 0x10000000
MNT_DETACH = 2
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
MAX_ID = 4294967294  # (uid_t)-1 is never an id
CHILD_WAIT_S = 10.0


class IdmapUnsupported(PetriError):
    """cannot map owners on {path}: {why}"""

    exit_code = 4


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def syscall(*args) -> int:
    """syscall(2) through ctypes; a negative return raises OSError with errno."""
    # syscall(2) is variadic and reads longs: widen ints so negative fds (AT_FDCWD) survive.
    r = libc.syscall(*(ctypes.c_long(a) if isinstance(a, int) else a for a in args))
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return r


@dataclass(frozen=True)
class IdMap:
    """On-disk root <-> host uid/gid ``uid``/``gid`` (an unprivileged account), others as they are."""

    uid: int
    gid: int

    def __post_init__(self) -> None:
        if not (0 < self.uid < MAX_ID and 0 < self.gid < MAX_ID):
            raise ValueError(f"an id map needs an unprivileged uid and gid, not {self.uid}:{self.gid}")

    @staticmethod
    def _lines(n: int) -> bytes:
        # "inside outside count": inside = the id on disk, outside = the id the mount shows.
        rows = [(0, n, 1), (n, 0, 1)]
        if n > 1:
            rows.append((1, 1, n - 1))
        rows.append((n + 1, n + 1, MAX_ID + 1 - (n + 1)))
        return b"".join(b"%d %d %d\n" % r for r in rows)

    def uid_map(self) -> bytes:
        return self._lines(self.uid)

    def gid_map(self) -> bytes:
        return self._lines(self.gid)

    def to_disk_uid(self, uid: int) -> int:
        """The id stored on disk for ``uid`` as the mount shows it (the swap is its own inverse)."""
        return 0 if uid == self.uid else self.uid if uid == 0 else uid

    def to_disk_gid(self, gid: int) -> int:
        return 0 if gid == self.gid else self.gid if gid == 0 else gid

    # The swap is an involution: showing a disk id is the same function.
    shown_uid = to_disk_uid
    shown_gid = to_disk_gid


_userns: dict[IdMap, int] = {}
_userns_lock = threading.Lock()


def cached_userns_fd(idmap: IdMap) -> int:
    """``userns_fd(idmap)``, made once per process and kept (a fork costs milliseconds; a
    race, the API or a fork of many overlay sandboxes maps many trees). Do not close it."""
    with _userns_lock:
        fd = _userns.get(idmap)
        if fd is None:
            fd = _userns[idmap] = userns_fd(idmap)
        return fd


def userns_fd(idmap: IdMap) -> int:
    """An fd of a user namespace whose maps are ``idmap``'s (a child makes it, then exits)."""
    ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
    go_r, go_w = os.pipe2(os.O_CLOEXEC)
    pid = fork()
    if pid == 0:  # pragma: no cover - the child: no Python beyond these calls
        try:
            ok = libc.unshare(CLONE_NEWUSER) == 0
            os.write(ready_w, b"1" if ok else b"0")
            # Released by a byte, not by EOF: a child forked at the same time by another
            # thread holds copies of our pipe ends, so EOF might never come. The timeout
            # is for a parent that died before writing it.
            select.select([go_r], [], [], CHILD_WAIT_S)
        finally:
            os._exit(0)
    os.close(ready_w)
    os.close(go_r)
    try:
        if os.read(ready_r, 1) != b"1":
            raise OSError(errno.EPERM, "cannot make a user namespace for the id map")
        with open(f"/proc/{pid}/uid_map", "wb") as f:
            f.write(idmap.uid_map())
        with open(f"/proc/{pid}/gid_map", "wb") as f:
            f.write(idmap.gid_map())
        return os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        try:
            os.write(go_w, b"x")
        finally:
            os.close(ready_r)
            os.close(go_w)
            os.waitpid(pid, 0)


def open_clone(src: bytes | str | os.PathLike, idmap: IdMap | None = None, *, read_only: bool = False,
               recursive: bool = True) -> int:
    """A detached ``nosuid,nodev`` (and id-mapped, and read-only) copy of the mount tree at
    ``src`` (only the mount holding ``src`` when not ``recursive``: ``petri doctor`` asks
    about one filesystem, not about whatever is mounted below): an fd for ``move_mount``
    (``attach``) or for ``/proc/self/fd/N`` paths. Raises ``IdmapUnsupported`` when the
    filesystem refuses the mapping."""
    path = os.fsencode(src)
    rec = AT_RECURSIVE if recursive else 0
    fd = syscall(SYS_open_tree, AT_FDCWD, path, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | rec)
    try:
        attrs = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | (MOUNT_ATTR_RDONLY if read_only else 0)
        ns = 0
        if idmap is not None:
            ns = cached_userns_fd(idmap)
            attrs |= MOUNT_ATTR_IDMAP
        a = _MountAttr(attrs, 0, 0, ns)
        try:
            syscall(SYS_mount_setattr, fd, b"", AT_EMPTY_PATH | rec, ctypes.byref(a), ctypes.sizeof(a))
        except OSError as e:
            if idmap is not None and e.errno in (errno.EINVAL, errno.EPERM, errno.EOPNOTSUPP):
                try:
                    kind = fs_type(path)
                except OSError:
                    kind = "its filesystem"
                raise IdmapUnsupported(path=os.fsdecode(path),
                                       why=f"{kind} refuses idmapped mounts ({e.strerror})") from None
            raise
    except BaseException:
        os.close(fd)
        raise
    return fd


def attach(fd: int, dst: bytes | str | os.PathLike) -> None:
    """Put the detached mount ``fd`` (from ``open_clone``) at ``dst``."""
    syscall(SYS_move_mount, fd, b"", AT_FDCWD, os.fsencode(dst), MOVE_MOUNT_F_EMPTY_PATH)


def clone_tree(src: bytes | str | os.PathLike, dst: bytes | str | os.PathLike, idmap: IdMap | None = None, *,
               read_only: bool = False) -> None:
    """Mount a ``nosuid,nodev`` copy of the tree at ``src`` on ``dst``, id-mapped by ``idmap``."""
    fd = open_clone(src, idmap, read_only=read_only)
    try:
        attach(fd, dst)
    finally:
        os.close(fd)


def detach(path: bytes | str | os.PathLike) -> bool:
    """Lazily unmount ``path``; False when nothing was mounted there."""
    if libc.umount2(os.fsencode(path), MNT_DETACH) == 0:
        return True
    e = ctypes.get_errno()
    if e in (errno.EINVAL, errno.ENOENT):
        return False
    raise OSError(e, os.strerror(e), os.fsdecode(path))


def _raise_effective_caps() -> None:
    hdr = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    syscall(SYS_capget, ctypes.byref(hdr), data)
    for d in data:
        d.effective = d.permitted
    syscall(SYS_capset, ctypes.byref(hdr), data)


def as_fs_user(uid: int, gid: int, fn: Callable[[], T]) -> T:
    """``fn()`` in a fresh thread whose filesystem uid/gid are ``uid``/``gid`` and whose
    effective capabilities are its permitted ones again (setfsuid drops the file ones).
    Credentials are per thread on Linux, so nothing else of this process changes."""
    value: list[T] = []
    error: list[BaseException] = []

    def body() -> None:
        try:
            # setfsuid returns the previous id and never fails loudly: check by asking again.
            libc.syscall(ctypes.c_long(SYS_setfsgid), ctypes.c_long(gid))
            libc.syscall(ctypes.c_long(SYS_setfsuid), ctypes.c_long(uid))
            if libc.syscall(ctypes.c_long(SYS_setfsuid), ctypes.c_long(-1)) != uid:
                raise OSError(errno.EPERM, f"setfsuid({uid}) did not take")
            _raise_effective_caps()
            value.append(fn())
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            error.append(e)

    t = threading.Thread(target=body, name="petri-fs-user")
    t.start()
    t.join()
    if error:
        raise error[0]
    return value[0]
