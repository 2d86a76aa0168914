"""What filesystem a path is on (statfs f_type), without spawning a process."""
from __future__ import annotations

import ctypes
import os

_MAGIC = {
    0x9123683E: "btrfs",
    0x58465342: "xfs",
    0xEF53: "ext4",
    0x794C7630: "overlayfs",
    0x65735546: "fuse",
    0x01021994: "tmpfs",
    0x2FC12FC1: "zfs",
    0x6969: "nfs",
}


class _Statfs(ctypes.Structure):
    _fields_ = [("f_type", ctypes.c_long), ("f_bsize", ctypes.c_long), ("f_blocks", ctypes.c_ulong),
                ("f_bfree", ctypes.c_ulong), ("f_bavail", ctypes.c_ulong), ("f_files", ctypes.c_ulong),
                ("f_ffree", ctypes.c_ulong), ("f_fsid", ctypes.c_int * 2), ("f_namelen", ctypes.c_long),
                ("f_frsize", ctypes.c_long), ("f_flags", ctypes.c_long), ("f_spare", ctypes.c_long * 4)]


# CDLL(None) is the C library already loaded: find_library would run `ldconfig -p` (3 ms).
_libc = ctypes.CDLL(None, use_errno=True)


def fs_type(path: str | bytes | os.PathLike) -> str:
    buf = _Statfs()
    if _libc.statfs(os.fsencode(path), ctypes.byref(buf)) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), os.fsdecode(path))
    return _MAGIC.get(buf.f_type & 0xFFFFFFFF, hex(buf.f_type & 0xFFFFFFFF))
