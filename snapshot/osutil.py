"""Shared OS plumbing: the one libc handle, ``renameat2``, ``/proc/self/mountinfo``, the
filesystem type of a path, durable small files and ``rm -rf``.

Every layer above uses these (``merge/`` and ``orchestrator/`` import them from here; this
module imports nothing of petri's), so each piece of kernel knowledge is written once:

- ``libc``: ``CDLL(None)``, the C library already loaded into the process (``find_library``
  would run ``ldconfig -p``: 3 ms), with errno kept for ``ctypes.get_errno``.
- ``renameat2``: glibc's wrapper (2.28+), else the raw syscall (x86_64's number).
- ``mounts``: one parser of mountinfo, octal escapes undone (a mount point with a space,
  a tab, a newline or a backslash in its name is written ``\\ooo`` there).
- ``fs_type``: ``statfs(2)`` ``f_type``, named; no process spawned.
- ``fsync_dir``, ``syncfs``: durable names, and one flush for many new files.
- ``atomic_write``: temp file in the same directory, fsync, rename over, fsync the directory
  (borg's SaveFile, git's lockfile).
- ``rmtree``: never follows a symlink, copes with read-only directories and with entries
  that vanish meanwhile; a callback per removed entry lets the transaction code put a fault
  point there.

Caveats:
- ``renameat2`` without glibc's wrapper uses syscall 316, which is x86_64's number.
- ``statfs`` is read through a 512-byte buffer whose first word is ``f_type`` on every
  Linux ABI petri runs on; other fields are not read.
- ``rmtree`` gives up on a directory that keeps filling while it is being removed (after
  one more pass it raises ``ENOTEMPTY``).
"""
from __future__ import annotations

import ctypes
import errno
import os
import select
import signal
import stat
from typing import TYPE_CHECKING, Callable, NoReturn

if TYPE_CHECKING:  # annotations only: a typing.Union built at import costs start-up time
    from typing import Union

    PathLike = Union[str, bytes, os.PathLike[str], os.PathLike[bytes]]

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

AT_FDCWD = -100
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
_SYS_RENAMEAT2_X86_64 = 316


def raise_errno(*filenames: PathLike) -> NoReturn:
    """Raise the OSError for ``ctypes.get_errno()`` (after a libc call returned -1)."""
    e = ctypes.get_errno()
    names = [os.fsdecode(f) for f in filenames]
    if len(names) == 2:
        raise OSError(e, os.strerror(e), names[0], None, names[1])
    raise OSError(e, os.strerror(e), *names[:1])


# --------------------------------------------------------------------------- renameat2

_renameat2 = getattr(libc, "renameat2", None)  # glibc >= 2.28
if _renameat2 is not None:
    _renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]


def renameat2(src_dir: int, src: bytes, dst_dir: int, dst: bytes, flags: int = 0) -> None:
    """renameat2(2): ``RENAME_NOREPLACE`` (fail with EEXIST rather than replace),
    ``RENAME_EXCHANGE`` (swap two names atomically); dir fds or ``AT_FDCWD``."""
    if _renameat2 is None:
        r = libc.syscall(_SYS_RENAMEAT2_X86_64, src_dir, src, dst_dir, dst, flags)
    else:
        r = _renameat2(src_dir, src, dst_dir, dst, flags)
    if r != 0:
        raise_errno(src, dst)


def rename_exchange(a: bytes, b: bytes) -> None:
    renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE)


def rename_noreplace(src: bytes, dst: bytes) -> None:
    renameat2(AT_FDCWD, src, AT_FDCWD, dst, RENAME_NOREPLACE)


# --------------------------------------------------------------------------- mountinfo


class Mount:
    """One line of ``/proc/self/mountinfo`` (proc(5)), escapes undone.

    A plain class with slots, not a frozen dataclass: this module is on every command's
    start-up path, and defining such a dataclass costs 0.6 ms there."""

    __slots__ = ("mount_id", "parent_id", "major", "minor", "root", "mountpoint", "options", "fstype", "source",
                 "super_options")

    def __init__(self, mount_id: int, parent_id: int, major: int, minor: int, root: bytes, mountpoint: bytes,
                 options: frozenset[str], fstype: str, source: str, super_options: frozenset[str]) -> None:
        self.mount_id, self.parent_id, self.major, self.minor = mount_id, parent_id, major, minor
        self.root = root                    # the directory of the filesystem mounted here
        self.mountpoint = mountpoint
        self.options = options              # per mount: ro, nosuid, ...
        self.fstype = fstype                # "btrfs", "overlay", "fuse.petri", "cgroup2", ...
        self.source = source
        self.super_options = super_options  # per superblock: prjquota, user_subvol_rm_allowed, ...

    def __repr__(self) -> str:
        return f"Mount({os.fsdecode(self.mountpoint)!r}, {self.fstype!r}, {self.source!r})"

    @property
    def all_options(self) -> frozenset[str]:
        return self.options | self.super_options

    @property
    def connection(self) -> int:
        """The fusectl connection number: the superblock's kernel dev_t."""
        return (self.major << 20) | self.minor


def unescape(field: bytes) -> bytes:
    """Undo mountinfo's ``\\ooo`` escapes (space, tab, newline, backslash)."""
    if b"\\" not in field:
        return field
    out = bytearray()
    i = 0
    while i < len(field):
        code = field[i + 1:i + 4]
        if field[i] == 0x5C and len(code) == 3 and all(0x30 <= c <= 0x37 for c in code):
            out.append(int(code, 8) & 0xFF)
            i += 4
        else:
            out.append(field[i])
            i += 1
    return bytes(out)


def parse_mountinfo(text: bytes) -> list[Mount]:
    """Every well-formed line of a mountinfo text, in mount order (a later mount at the
    same point is on top). Malformed lines are skipped."""
    out = []
    for line in text.split(b"\n"):
        left, sep, right = line.partition(b" - ")
        if not sep:
            continue
        f, r = left.split(b" "), right.split(b" ")
        if len(f) < 6 or len(r) < 2:
            continue
        try:
            major, minor = (int(x) for x in f[2].split(b":"))
            mount_id, parent_id = int(f[0]), int(f[1])
        except ValueError:
            continue
        out.append(Mount(mount_id, parent_id, major, minor, unescape(f[3]), unescape(f[4]),
                         frozenset(f[5].decode("utf-8", "surrogateescape").split(",")),
                         r[0].decode("utf-8", "surrogateescape"),
                         unescape(r[1]).decode("utf-8", "surrogateescape"),
                         frozenset(r[2].decode("utf-8", "surrogateescape").split(",")) if len(r) > 2
                         else frozenset()))
    return out


def mounts() -> list[Mount]:
    """The mounts this process sees, in mount order."""
    with open("/proc/self/mountinfo", "rb") as f:
        return parse_mountinfo(f.read())


def mounts_under(path: PathLike, fstype: Callable[[str], bool] | None = None) -> list[Mount]:
    """Mounts at or below ``path`` (resolved), optionally only those whose fstype passes."""
    real = os.path.realpath(os.fsencode(path))
    prefix = real.rstrip(b"/") + b"/"
    return [m for m in mounts() if (m.mountpoint == real or m.mountpoint.startswith(prefix))
            and (fstype is None or fstype(m.fstype))]


def mount_of(path: PathLike) -> Mount:
    """The mount holding ``path`` (resolved): the longest mount point that is a prefix of it,
    the topmost of several at the same point."""
    real = os.path.realpath(os.fsencode(path))
    best: Mount | None = None
    for m in mounts():
        mp = m.mountpoint
        if (real == mp or real.startswith(mp.rstrip(b"/") + b"/")) and \
                (best is None or len(mp) >= len(best.mountpoint)):
            best = m
    if best is None:  # only without a root mount in view, which /proc itself rules out
        raise OSError(errno.ENOENT, "no mount holds this path", os.fsdecode(path))
    return best


# --------------------------------------------------------------------------- filesystem type

FS_NAMES = {
    0x9123683E: "btrfs", 0xEF53: "ext4", 0x58465342: "xfs", 0x01021994: "tmpfs",
    0x794C7630: "overlayfs", 0x2FC12FC1: "zfs", 0x65735546: "fuse", 0x6969: "nfs",
    0xFF534D42: "cifs", 0x5346544E: "ntfs", 0x4D44: "vfat",
}
BTRFS_SUPER_MAGIC = 0x9123683E


def fs_magic(path: PathLike) -> int:
    """statfs(2) ``f_type`` of the filesystem holding ``path``."""
    # f_type is the first field of struct statfs on every Linux ABI; the buffer is
    # oversized so no architecture's struct overruns it.
    buf = ctypes.create_string_buffer(512)
    if libc.statfs(os.fsencode(path), buf) != 0:
        raise_errno(path)
    return ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF


def fs_type(path: PathLike) -> str:
    """The name of the filesystem holding ``path`` ("btrfs", "xfs", ...; else its magic in hex)."""
    t = fs_magic(path)
    return FS_NAMES.get(t, hex(t))


# --------------------------------------------------------------------------- durable files


# Signals a person or a supervisor sends to end petri (Ctrl-C, kill, a closed terminal).
_ENDING_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP})


def fork() -> int:
    """``os.fork()`` with Ctrl-C and the other ending signals held back until the fork's
    at-fork hooks have run. ``os.fork`` runs Python callbacks (logging's lock release among
    them) in the parent; a KeyboardInterrupt raised inside one is printed as "Exception
    ignored" and lost, and the lock it was releasing stays held: petri then neither stops
    nor logs. Held back, the signal is delivered right after, where it raises as usual. The
    child starts with the caller's mask."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _ENDING_SIGNALS)
    try:
        pid = os.fork()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
    return pid


def fsync_dir(path: PathLike) -> None:
    """Make a directory's entries (a rename, a new name) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


libc.syncfs.argtypes = [ctypes.c_int]


def syncfs(path: PathLike) -> None:
    """syncfs(2) on the filesystem holding the directory ``path``: one flush for many new
    files (fsync per file would cost one flush each)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        syncfs_fd(fd, path)
    finally:
        os.close(fd)


def syncfs_fd(fd: int, name: PathLike = "<fd>") -> None:
    """syncfs(2) on the filesystem holding the open file ``fd`` (``name`` for the error).
    Since Linux 5.8 it reports a writeback error of any file of that filesystem."""
    if libc.syncfs(fd) != 0:
        raise_errno(name)


def atomic_write(path: PathLike, data: bytes, *, mode: int = 0o644,
                 before_rename: Callable[[], None] | None = None) -> None:
    """Replace ``path`` with ``data`` whole or not at all, durably: a temp file in the same
    directory (a fresh name, never following a symlink), fsync, rename over, fsync the
    directory. ``before_rename`` runs between the fsync and the rename (a fault point)."""
    p = os.fsencode(path)
    d = os.path.dirname(p) or b"."
    tmp = os.path.join(d, b"." + os.path.basename(p) + b".tmp." + os.urandom(4).hex().encode())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        write_all(fd, data)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    if before_rename is not None:
        try:
            before_rename()
        except BaseException:
            os.unlink(tmp)
            raise
    try:
        os.rename(tmp, p)
    except BaseException:
        os.unlink(tmp)
        raise
    fsync_dir(d)


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd``; on a non-blocking fd that is full, wait until it can
    take more (a terminal or pipe being read slowly)."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            select.select([], [fd], [], 1.0)


def read_fd(fd: int, chunk: int = 1 << 20) -> bytes:
    """Everything left to read on ``fd``."""
    chunks: list[bytes] = []
    while True:
        b = os.read(fd, chunk)
        if not b:
            return b"".join(chunks)
        chunks.append(b)


# --------------------------------------------------------------------------- rm -rf


def rmtree(path: PathLike, *, each: Callable[[], None] | None = None) -> None:
    """``rm -rf``: never follows a symlink, makes read-only directories writable on the way,
    and takes entries that vanish meanwhile as removed. ``each`` runs after every file,
    symlink or other non-directory removed. Missing is not an error."""
    _rmtree(os.fsencode(path), each, again=True)


def _rmtree(top: bytes, each: Callable[[], None] | None, again: bool) -> None:
    try:
        st = os.lstat(top)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        _unlink(top, each)
        return
    order = []
    stack = [top]
    while stack:
        d = stack.pop()
        order.append(d)
        try:
            os.chmod(d, 0o700)  # a read-only directory (a snapshot's copy) must still be emptied
        except OSError:
            pass
        try:
            it = os.scandir(d)
        except FileNotFoundError:
            continue
        with it:
            for e in it:
                p = os.path.join(d, e.name)
                if e.is_dir(follow_symlinks=False):
                    stack.append(p)
                else:
                    _unlink(p, each)
    for d in reversed(order):
        try:
            os.rmdir(d)
        except FileNotFoundError:
            pass
        except OSError as e:
            if e.errno != errno.ENOTEMPTY or not again:
                raise
            _rmtree(d, each, again=False)  # something was made in it meanwhile: one more pass


def _unlink(p: bytes, each: Callable[[], None] | None) -> None:
    try:
        os.unlink(p)
    except FileNotFoundError:
        return
    if each is not None:
        each()
