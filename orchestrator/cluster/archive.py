"""A layer as a deterministic tar archive, and back: the unit a cluster race ships to nodes.

A layer (:mod:`snapshot.layers`: a directory tree in overlayfs conventions, or a snapshot's
whole view) is written as a POSIX pax tar whose bytes depend only on the tree: entries in
byte order of their paths, parents first, the root as ``.``; owner as numbers (no names, no
host lookups), mode, mtime to the nanosecond and every xattr in ``PETRI.*`` pax records
(the standard ``mtime`` record goes through a float and loses nanoseconds); a second name
of a file already in the archive as a hard link; whiteouts (0:0 character devices) as such.
Nothing of the machine or the moment goes in, so the same tree gives the same bytes, and
the archive is named by its SHA-256 (``digest``): a node that holds that name holds that
layer, whoever sent it.

:func:`write_archive` streams the archive in chunks to a callback (the driver puts each
chunk in Ray's object store, or only hashes them), never holding more than one chunk.
:func:`extract_archive` reads one back into a new directory, as safely as an untrusted
archive deserves: every name is checked (relative, no ``..``, no empty component), every
directory is opened with ``O_NOFOLLOW`` from its parent's descriptor (so no symlink in the
archive, or planted beside it, is ever followed), files are created with ``O_EXCL``, a hard
link may only name a regular file the archive made earlier, and the only device is the
whiteout. The digest of what was read is checked against the expected one before the
caller installs the layer.

Caveats:
- atime is not carried (extraction sets it to the mtime); sockets are not carried (layers
  never hold them); a directory's own hard-link count is whatever the tree gives.
- Owners are numbers: extracted as root they are kept; as anyone else every file belongs to
  the extracting user (the fuse backend serves them so).
- ``trusted.*`` and ``security.*`` xattrs that the extracting process may not set are
  skipped (a rootless node reads only ``user.overlay.*``); any other xattr that cannot be set
  fails the extraction.
- Hard links are kept only among names inside one archive (as in the layers themselves).
"""
from __future__ import annotations

import base64
import errno
import hashlib
import os
import stat
import tarfile
from dataclasses import dataclass
from typing import Callable, Iterator

from snapshot.layers import is_whiteout, make_whiteout

CHUNK = 32 << 20  # bytes per object: Ray's object store holds a few of these at once at most
FORMAT_KEY = "PETRI.layer-archive"
FORMAT_VERSION = "1"
_MTIME = "PETRI.mtime"
_XATTR = "PETRI.xattr."
_EXCLUDE_TOP = (b".petri",)  # the store is never content, whatever view it shows through
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class ArchiveError(Exception):
    """A layer archive that is damaged or unsafe; the message says what and where."""


@dataclass(frozen=True)
class Written:
    digest: str  # sha256 hex of the archive's bytes
    size: int
    entries: int


# ---------------------------------------------------------------------------- writing


def entries(root: bytes) -> Iterator[tuple[bytes, os.stat_result]]:
    """(rel, lstat) of every entry under ``root``, the root itself first as ``b"."``, then
    depth first with names in byte order: the archive's order."""
    yield b".", os.lstat(root)
    stack: list[tuple[bytes, list[bytes]]] = [(b"", _sorted_names(root, b""))]
    while stack:
        rel, names = stack[-1]
        if not names:
            stack.pop()
            continue
        name = names.pop()
        child = rel + b"/" + name if rel else name
        st = os.lstat(os.path.join(root, child))
        yield child, st
        if stat.S_ISDIR(st.st_mode):
            stack.append((child, _sorted_names(root, child)))


def _sorted_names(root: bytes, rel: bytes) -> list[bytes]:
    """The names in a directory, LAST first (popped from the end)."""
    names = sorted(os.listdir(os.path.join(root, rel) if rel else root), reverse=True)
    return [n for n in names if rel or n not in _EXCLUDE_TOP]


def _xattrs(path: bytes) -> dict[str, str]:
    try:
        names = sorted(os.listxattr(path, follow_symlinks=False))
    except OSError as e:
        if e.errno in (errno.ENOTSUP, errno.EPERM):
            return {}
        raise
    out = {}
    for name in names:
        try:
            value = os.getxattr(path, name, follow_symlinks=False)
        except OSError as e:
            if e.errno == errno.ENODATA:
                continue  # removed between the listing and the read
            raise
        out[_XATTR + name] = base64.b64encode(value).decode()
    return out


class _ChunkSink:
    """A write-only file for tarfile: hashes everything and hands on CHUNK-sized pieces."""

    def __init__(self, emit: Callable[[bytes], None] | None, chunk: int) -> None:
        self.emit = emit
        self.chunk = chunk
        self.buf = bytearray()
        self.sha = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.size += len(data)
        if self.emit is not None:
            self.buf += data
            while len(self.buf) >= self.chunk:
                self.emit(bytes(self.buf[:self.chunk]))
                del self.buf[:self.chunk]
        return len(data)

    def finish(self) -> None:
        if self.emit is not None and self.buf:
            self.emit(bytes(self.buf))
            self.buf.clear()


def write_archive(root: bytes | str | os.PathLike, emit: Callable[[bytes], None] | None = None, *,
                  chunk: int = CHUNK) -> Written:
    """Archive the tree at ``root``; ``emit`` gets its bytes in order, ``chunk`` at a time
    (the last piece shorter); with ``emit`` None it is only hashed."""
    root_b = os.fsencode(root)
    sink = _ChunkSink(emit, chunk)
    first_of: dict[tuple[int, int], str] = {}
    n = 0
    with tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT, encoding="utf-8",
                      errors="surrogateescape", pax_headers={FORMAT_KEY: FORMAT_VERSION}) as tf:
        for rel, st in entries(root_b):
            n += 1
            path = os.path.join(root_b, rel) if rel != b"." else root_b
            ti = tarfile.TarInfo(os.fsdecode(rel))
            ti.mode = stat.S_IMODE(st.st_mode)
            ti.uid, ti.gid, ti.uname, ti.gname = st.st_uid, st.st_gid, "", ""
            ti.mtime = st.st_mtime_ns // 1_000_000_000
            pax = {_MTIME: f"{st.st_mtime_ns // 1_000_000_000}.{st.st_mtime_ns % 1_000_000_000:09d}"}
            m = st.st_mode
            if not stat.S_ISLNK(m):
                pax.update(_xattrs(path))
            ti.pax_headers = pax
            if stat.S_ISDIR(m):
                ti.type = tarfile.DIRTYPE
                tf.addfile(ti)
            elif stat.S_ISREG(m):
                ident = (st.st_dev, st.st_ino)
                if st.st_nlink > 1 and ident in first_of:
                    ti.type, ti.linkname = tarfile.LNKTYPE, first_of[ident]
                    tf.addfile(ti)
                    continue
                if st.st_nlink > 1:
                    first_of[ident] = ti.name
                ti.type, ti.size = tarfile.REGTYPE, st.st_size
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                with os.fdopen(fd, "rb") as f:
                    try:
                        tf.addfile(ti, f)
                    except OSError as e:  # tarfile's "unexpected end of data": the file shrank
                        raise ArchiveError(f"{os.fsdecode(path)} changed while it was archived ({e})") from e
            elif stat.S_ISLNK(m):
                ti.type, ti.linkname = tarfile.SYMTYPE, os.fsdecode(os.readlink(path))
                tf.addfile(ti)
            elif stat.S_ISFIFO(m):
                ti.type = tarfile.FIFOTYPE
                tf.addfile(ti)
            elif is_whiteout(st):
                ti.type, ti.devmajor, ti.devminor = tarfile.CHRTYPE, 0, 0
                tf.addfile(ti)
            # sockets and devices other than whiteouts are not layer content: left out
    sink.finish()
    return Written(sink.sha.hexdigest(), sink.size, n)


# ---------------------------------------------------------------------------- reading


class _HashingReader:
    """A read-only file over ``read_chunk()`` (b"" at the end) that hashes what passes."""

    def __init__(self, read_chunk: Callable[[], bytes]) -> None:
        self.read_chunk = read_chunk
        self.buf = memoryview(b"")
        self.sha = hashlib.sha256()
        self.size = 0
        self.eof = False

    def read(self, n: int = -1) -> bytes:
        out = bytearray()
        while (n < 0 or len(out) < n) and not self.eof:
            if not self.buf:
                data = self.read_chunk()
                if not data:
                    self.eof = True
                    break
                self.sha.update(data)
                self.size += len(data)
                self.buf = memoryview(data)
            take = len(self.buf) if n < 0 else min(n - len(out), len(self.buf))
            out += self.buf[:take]
            self.buf = self.buf[take:]
        return bytes(out)

    def drain(self) -> None:
        while self.read(1 << 20):
            pass


def _check_name(name: bytes) -> list[bytes]:
    if name == b".":
        return []
    parts = name.split(b"/")
    if name.startswith(b"/") or any(p in (b"", b".", b"..") for p in parts) or b"\0" in name:
        raise ArchiveError(f"unsafe name in archive: {name!r}")
    return parts


class _Dirs:
    """Descriptors of the directories on the path being extracted, opened without ever
    following a symlink; entries arrive parents first, so it is a stack."""

    def __init__(self, root_fd: int) -> None:
        self.stack: list[tuple[tuple[bytes, ...], int]] = [((), root_fd)]

    def fd_of(self, parts: tuple[bytes, ...]) -> int:
        while self.stack[-1][0] != parts[:len(self.stack[-1][0])] or len(self.stack[-1][0]) > len(parts):
            os.close(self.stack.pop()[1])
        while len(self.stack[-1][0]) < len(parts):
            have, fd = self.stack[-1]
            name = parts[len(have)]
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as e:
                raise ArchiveError(f"{b'/'.join(parts)!r}: parent is not a directory made by the archive ({e})") from e
            self.stack.append((have + (name,), child))
        return self.stack[-1][1]

    def close(self) -> None:
        while len(self.stack) > 1:
            os.close(self.stack.pop()[1])


def _meta(m: tarfile.TarInfo) -> tuple[int, dict[str, bytes]]:
    raw = m.pax_headers.get(_MTIME)
    if raw is not None:
        sec, _, frac = raw.partition(".")
        mtime_ns = int(sec) * 1_000_000_000 + int((frac + "000000000")[:9])
    else:
        mtime_ns = int(m.mtime) * 1_000_000_000
    xattrs = {k[len(_XATTR):]: base64.b64decode(v) for k, v in m.pax_headers.items() if k.startswith(_XATTR)}
    return mtime_ns, xattrs


def _set_xattrs(fd_or_path, xattrs: dict[str, bytes], dir_fd: int | None = None) -> None:
    for name, value in xattrs.items():
        try:
            if isinstance(fd_or_path, int):
                os.setxattr(fd_or_path, name, value)
            else:
                os.setxattr(f"/proc/self/fd/{dir_fd}/{os.fsdecode(fd_or_path)}", name, value, follow_symlinks=False)
        except OSError as e:
            if name.startswith(("trusted.", "security.")) and e.errno in (errno.EPERM, errno.ENOTSUP, errno.EACCES):
                continue
            raise


def extract_archive(read_chunk: Callable[[], bytes], dest: bytes | str | os.PathLike, *,
                    expect_digest: str | None = None) -> Written:
    """Extract the archive that ``read_chunk()`` yields (b"" at its end) into the existing,
    empty directory ``dest``. Raises ArchiveError if it is unsafe, damaged or not the
    archive ``expect_digest`` names (the caller then removes ``dest``)."""
    dest_b = os.fsencode(dest)
    root_fd = os.open(dest_b, _DIR_FLAGS)
    dirs = _Dirs(root_fd)
    reader = _HashingReader(read_chunk)
    as_root = os.geteuid() == 0
    made_files: set[bytes] = set()
    deferred: list[tuple[tuple[bytes, ...], int, int, int, int]] = []  # dirs: (parts, mode, uid, gid, mtime_ns)
    n = 0
    try:
        with tarfile.open(fileobj=reader, mode="r|", encoding="utf-8", errors="surrogateescape") as tf:
            if tf.pax_headers.get(FORMAT_KEY) not in (None, FORMAT_VERSION):
                raise ArchiveError(f"archive format {tf.pax_headers.get(FORMAT_KEY)!r} is not {FORMAT_VERSION}")
            for m in tf:
                n += 1
                rel = os.fsencode(m.name)
                parts = tuple(_check_name(rel))
                mtime_ns, xattrs = _meta(m)
                mode = m.mode & 0o7777
                if not parts:  # the root: its metadata goes on dest, last
                    if not m.isdir():
                        raise ArchiveError("the archive's root is not a directory")
                    _set_xattrs(root_fd, xattrs)
                    deferred.append(((), mode, m.uid, m.gid, mtime_ns))
                    continue
                pfd = dirs.fd_of(parts[:-1])
                name = parts[-1]
                if m.isdir():
                    os.mkdir(name, 0o700, dir_fd=pfd)
                    fd = os.open(name, _DIR_FLAGS, dir_fd=pfd)
                    try:
                        _set_xattrs(fd, xattrs)
                    finally:
                        os.close(fd)
                    deferred.append((parts, mode, m.uid, m.gid, mtime_ns))
                elif m.isreg():
                    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                                 dir_fd=pfd)
                    try:
                        src = tf.extractfile(m)
                        assert src is not None  # None only for a member that is not a regular file
                        left = m.size
                        while left:
                            data = src.read(min(left, 1 << 20))
                            if not data:
                                raise ArchiveError(f"{m.name}: archive ends inside the file")
                            view = memoryview(data)
                            while view:
                                view = view[os.write(fd, view):]
                            left -= len(data)
                        if as_root:
                            os.fchown(fd, m.uid, m.gid)
                        _set_xattrs(fd, xattrs)  # before the mode: user.* needs write permission
                        os.fchmod(fd, mode)
                        os.utime(fd, ns=(mtime_ns, mtime_ns))
                    finally:
                        os.close(fd)
                    made_files.add(rel)
                elif m.islnk():
                    target = os.fsencode(m.linkname)
                    if target not in made_files:
                        raise ArchiveError(f"{m.name}: hard link to {m.linkname!r}, which the archive did not make")
                    tparts = target.split(b"/")
                    src_fd = os.dup(dirs.fd_of(tuple(tparts[:-1])))  # fd_of below may close the original
                    try:
                        os.link(tparts[-1], name, src_dir_fd=src_fd, dst_dir_fd=dirs.fd_of(parts[:-1]),
                                follow_symlinks=False)
                    finally:
                        os.close(src_fd)
                elif m.issym():
                    os.symlink(os.fsencode(m.linkname), name, dir_fd=pfd)
                    if as_root:
                        os.chown(name, m.uid, m.gid, dir_fd=pfd, follow_symlinks=False)
                    os.utime(name, ns=(mtime_ns, mtime_ns), dir_fd=pfd, follow_symlinks=False)
                elif m.isfifo():
                    os.mkfifo(name, 0o600, dir_fd=pfd)
                    _finish_special(pfd, name, m, mode, xattrs, mtime_ns, as_root)
                elif m.ischr() and m.devmajor == 0 and m.devminor == 0:
                    make_whiteout(b"/proc/self/fd/%d/%s" % (pfd, name))
                    if as_root:
                        os.chown(name, m.uid, m.gid, dir_fd=pfd, follow_symlinks=False)
                    os.utime(name, ns=(mtime_ns, mtime_ns), dir_fd=pfd, follow_symlinks=False)
                else:
                    raise ArchiveError(f"{m.name}: an entry of a kind a layer never holds ({m.type!r})")
        reader.drain()  # the zero blocks past the end marker are part of the digest too
        # Directories last, deepest first: making their children moved their times.
        for parts, mode, uid, gid, mtime_ns in reversed(deferred):
            fd = root_fd if not parts else None
            if fd is None:
                pfd = dirs.fd_of(parts[:-1])
                fd = os.open(parts[-1], _DIR_FLAGS, dir_fd=pfd)
            try:
                if as_root:
                    os.fchown(fd, uid, gid)
                os.fchmod(fd, mode)
                os.utime(fd, ns=(mtime_ns, mtime_ns))
            finally:
                if fd != root_fd:
                    os.close(fd)
    except tarfile.TarError as e:
        raise ArchiveError(f"damaged archive: {e}") from e
    finally:
        dirs.close()
        os.close(root_fd)
    digest = reader.sha.hexdigest()
    if expect_digest is not None and digest != expect_digest:
        raise ArchiveError(f"the archive's digest is {digest}, not the {expect_digest} it was sent as")
    return Written(digest, reader.size, n)


def _finish_special(pfd: int, name: bytes, m: tarfile.TarInfo, mode: int, xattrs: dict[str, bytes],
                    mtime_ns: int, as_root: bool) -> None:
    if as_root:
        os.chown(name, m.uid, m.gid, dir_fd=pfd, follow_symlinks=False)
    _set_xattrs(name, xattrs, dir_fd=pfd)
    os.chmod(name, mode, dir_fd=pfd)
    os.utime(name, ns=(mtime_ns, mtime_ns), dir_fd=pfd, follow_symlinks=False)
