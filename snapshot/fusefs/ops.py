"""The copy-on-write filesystem: read-only lower layers under one writable upper directory.

Layer format (shared with the overlay backend, so the merge engine reads either upper):
a layer is a plain directory tree; a deleted name is a character device 0:0 (a whiteout);
a directory whose lower contents are hidden carries ``user.overlay.opaque=y``.

``CowFS(lowers, upper, ...)`` takes ``lowers`` TOP-MOST FIRST (``lowers[0]`` shadows
``lowers[1]``), like overlayfs's ``lowerdir=`` option. ``upper=None`` serves a read-only view.

Model. The kernel's view is a tree of nodes, one per merged path (plus hard-link aliases
made through ``link``); a node's FUSE inode number never changes while the kernel knows it
and is never reused within a mount (so generation is always 0). Each node caches which
layer backs it (and for a directory, which layers merge into it); the cache is exact
because the upper is changed only by this process: copy-up and creation update it in
place, and renames bump a global epoch that makes every node re-resolve lazily.

Concurrency: handlers run as trio tasks and interleave only at ``await``. Every namespace
change is done without an await in the middle, after re-checking what it depends on; the
only awaits are file copy-ups (data copied in a thread into the work directory, then
renamed into the upper), serialised per node by a lock, so a big copy-up never blocks
other requests.

Caveats:
- Hard links present in a lower layer stay one file (one inode number) and, unlike kernel
  overlayfs, stay one file in the upper when either name is copied up. Links made through the
  mount are real links in the upper.
- Renaming a directory that has lower-layer content copies that content into the upper
  (files already in the upper are moved, not copied, so open descriptors stay valid) and
  blocks other requests while it runs; the moved directory becomes opaque.
- The disk budget counts apparent bytes of regular files in the upper (a sparse hole
  counts as written); a directory rename's copy is charged but never refused.
- Copy-ups are fsynced (in the copying thread) before they are renamed over the lower view,
  as kernel overlayfs does, so a machine crash never leaves an empty file hiding the base
  content; a directory rename's copy is flushed with one ``syncfs`` of the upper's
  filesystem. Cost measured on ext4 (virtio disk): see bench/RESULTS.md; ``fsync_copyup=
  False`` turns it off. Files the sandbox itself writes are not fsynced unless it asks.
- A new entry over a whiteout is made in the work dir and renamed over it in one step
  (a directory with ``RENAME_EXCHANGE``): a crash shows the deletion or the new entry.
  Made there, a new file does not inherit a set-group-id parent's group when not root.
- 0:0 character devices cannot be created by the sandbox (a 0:0 device is a whiteout in
  this format).
- A file counts as read once its metadata is looked up (``stat`` is enough). Readdirplus
  would hand the kernel cacheable attributes that no later ``stat`` asks us for, so a listed
  file not yet recorded is returned with zero timeouts: its first ``stat`` after a listing is
  one more lookup round trip (measured here: 10,000 files walked with ``os.walk`` + ``lstat``
  0.2-0.35 s before, 0.8-1.15 s the first time, unchanged after). Directories are not
  recorded, and a listing alone records nothing.
"""
from __future__ import annotations

import copy
import errno
import fcntl
import functools
import logging
import os
import stat
from typing import Any, Callable

import pyfuse3
import trio

from ..idmap import IdMap
from ..layers import upper_bytes
from ..osutil import RENAME_EXCHANGE, RENAME_NOREPLACE, rename_exchange, rmtree, syncfs
from ..tree import FICLONE, _copy_sparse, apply_meta, copy_xattrs, settable_xattr
from .journal import OPAQUE_XATTR, Journal, is_whiteout

log = logging.getLogger("petri.fusefs")

IS_ROOT = os.geteuid() == 0
HIDDEN_XATTR_PREFIXES = (b"user.overlay.", b"trusted.overlay.")
WHITEOUT_MODE = stat.S_IFCHR


def join(a: bytes, b: bytes) -> bytes:
    return a + b"/" + b if a else b


def _is_opaque(path: bytes) -> bool:
    try:
        return os.getxattr(path, OPAQUE_XATTR, follow_symlinks=False) == b"y"
    except OSError:
        return False


def _hidden_xattr(name: bytes) -> bool:
    return name.startswith(HIDDEN_XATTR_PREFIXES)


def copy_meta(src: bytes, dst: bytes, st: os.stat_result) -> None:
    """Owner, mode, user xattrs and times of ``st``/``src`` onto ``dst`` (never the overlay
    xattrs: a lower directory's opaque mark must not travel up and hide other layers)."""
    copy_xattrs(src, dst, lambda name: settable_xattr(name) and not _hidden_xattr(os.fsencode(name)))
    apply_meta(dst, st, is_link=stat.S_ISLNK(st.st_mode))


def copy_file_data(src: bytes, dst: bytes, size: int, fsync: bool = False) -> None:
    """Create ``dst`` (mode 0600) holding ``src``'s first ``size`` bytes: reflink if the
    filesystem can, else a sparse-aware copy; ``fsync``: on disk before this returns."""
    sfd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        dfd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            if size:
                try:
                    fcntl.ioctl(dfd, FICLONE, sfd)
                except OSError:
                    _copy_sparse(sfd, dfd, size, lambda n: None)
            if fsync and size:  # an empty copy (a truncating open) hides nothing worth keeping
                os.fsync(dfd)
        finally:
            os.close(dfd)
    finally:
        os.close(sfd)


class Node:
    __slots__ = ("ino", "links", "nlookup", "children", "is_dir", "layer", "dir_layers",
                 "epoch", "path", "lock", "copy_gen", "fds", "removed", "st", "attrs", "names", "names_key")

    def __init__(self, ino: int, parent: int, name: bytes, is_dir: bool) -> None:
        self.ino = ino
        self.links: list[tuple[int, bytes]] = [(parent, name)]
        self.nlookup = 0
        self.children: dict[bytes, int] | None = {} if is_dir else None
        self.is_dir = is_dir
        self.layer = -1
        self.dir_layers: tuple[int, ...] = ()
        self.epoch = -1
        self.path = b""
        self.lock: trio.Lock | None = None
        self.copy_gen = 0
        self.fds: set[int] = set()
        self.removed = False
        # Lower layers never change: a lower-backed node's lstat, reply attributes and
        # (for a directory with no upper part) listing are cached; see _lower_stat.
        self.st: os.stat_result | None = None
        self.attrs: pyfuse3.EntryAttributes | None = None
        self.names: list[bytes] | None = None
        self.names_key: tuple | None = None


class Handle:
    __slots__ = ("node", "fd", "layer", "gen", "flags")

    def __init__(self, node: Node, fd: int, flags: int) -> None:
        self.node = node
        self.fd = fd
        self.layer = node.layer
        self.gen = node.copy_gen
        self.flags = flags


class DirHandle:
    __slots__ = ("node", "entries")

    def __init__(self, node: Node, entries: list[bytes]) -> None:
        self.node = node
        self.entries = entries


def _handler(fn: Callable) -> Callable:
    """pyfuse3 handlers may raise only FUSEError: translate, and log what is a bug."""

    @functools.wraps(fn)
    async def wrapper(*args: Any, **kw: Any) -> Any:
        try:
            return await fn(*args, **kw)
        except pyfuse3.FUSEError:
            raise
        except OSError as e:
            raise pyfuse3.FUSEError(e.errno or errno.EIO) from None
        except Exception:
            log.exception("%s failed", fn.__name__)
            raise pyfuse3.FUSEError(errno.EIO) from None

    return wrapper


def _err(code: int) -> pyfuse3.FUSEError:
    return pyfuse3.FUSEError(code)


class CowFS(pyfuse3.Operations):
    supports_dot_lookup = True
    enable_acl = False

    def __init__(self, lowers: list[str | bytes | os.PathLike], upper: str | bytes | os.PathLike | None,
                 workdir: str | bytes | os.PathLike | None = None, *, journal: Journal | None = None,
                 disk_budget: int | None = None, entry_timeout: float = 10.0,
                 attr_timeout: float = 10.0, negative_timeout: float = 10.0,
                 keep_cache: str = "lower", writeback: bool = False, fsync_copyup: bool = True,
                 idmap: IdMap | None = None, base: int = 0) -> None:
        super().__init__()
        # Owners as the kernel sees them <-> on disk (see snapshot.idmap): the kernel checks
        # permissions against what we report, and requests carry the caller's host ids.
        self.idmap = idmap
        self.fsync_copyup = fsync_copyup
        self.writable = upper is not None
        layers = [os.fsencode(os.path.abspath(p)) for p in lowers]
        if upper is not None:
            layers.insert(0, os.fsencode(os.path.abspath(upper)))
            if workdir is None:
                raise ValueError("a writable mount needs a workdir on the upper's filesystem")
            self.workdir = os.fsencode(os.path.abspath(workdir))
            os.makedirs(self.workdir, exist_ok=True)
        if not layers:
            raise ValueError("no layers")
        self.layers = layers
        self.U = 0 if self.writable else -1
        self.journal = journal or Journal(None)
        self.disk_budget = disk_budget
        self.entry_timeout = entry_timeout
        self.attr_timeout = attr_timeout
        self.negative_timeout = negative_timeout
        if keep_cache not in ("lower", "all", "none"):
            raise ValueError(f"keep_cache must be lower, all or none, not {keep_cache!r}")
        self.keep_cache = keep_cache
        # Writeback caching defers write errors to fsync/close: never with a disk budget.
        self.enable_writeback_cache = bool(writeback and disk_budget is None)
        self.epoch = 0
        # ``base`` (a multiple of 2**32) sets this filesystem's inode and file handle numbers
        # apart from those of other sandboxes served on the same mount (see fusefs.multi).
        self.base = base
        root_ino = base + pyfuse3.ROOT_INODE
        self.next_ino = root_ino + 1
        self.nodes: dict[int, Node] = {}
        # (layer, st_ino) -> node: the names of one hard-linked file share one node.
        self.aliases: dict[tuple[int, int], int] = {}
        self.alias_keys: dict[int, list[tuple[int, int]]] = {}
        self.fhs: dict[int, Handle | DirHandle] = {}
        self.next_fh = base + 1
        self._tmp_serial = 0
        root = Node(root_ino, root_ino, b"", True)
        root.nlookup = 1
        self.nodes[root.ino] = root
        self.root = root
        self.used = self._upper_usage() if self.writable else 0
        self._resolve(root)

    # -- layers ------------------------------------------------------------------------
    def _upper_usage(self) -> int:
        return upper_bytes(self.layers[0])

    def _root_layers(self) -> tuple[int, ...]:
        out = []
        for i, layer in enumerate(self.layers):
            out.append(i)
            if _is_opaque(layer):
                break
        return tuple(out)

    def _lookup_in(self, dir_layers: tuple[int, ...], path: bytes,
                   skip_upper: bool = False) -> tuple[int, os.stat_result, tuple[int, ...]] | None:
        """Where ``path`` (in a directory merged from ``dir_layers``) lives: (top layer, its
        lstat, merged layers if a directory), or None when absent or whited out."""
        for i, li in enumerate(dir_layers):
            if skip_upper and li == self.U:
                continue
            p = join(self.layers[li], path)
            try:
                st = os.lstat(p)
            except (FileNotFoundError, NotADirectoryError):
                continue
            if is_whiteout(st):
                return None
            if not stat.S_ISDIR(st.st_mode):
                return li, st, ()
            merged = [li]
            if not _is_opaque(p):
                for lj in dir_layers[i + 1:]:
                    q = join(self.layers[lj], path)
                    try:
                        st2 = os.lstat(q)
                    except (FileNotFoundError, NotADirectoryError):
                        continue
                    if not stat.S_ISDIR(st2.st_mode):
                        break  # a whiteout or a file in a higher layer hides what is below
                    merged.append(lj)
                    if _is_opaque(q):
                        break
            return li, st, tuple(merged)
        return None

    def _resolve(self, node: Node) -> None:
        if node.epoch == self.epoch:
            return
        if node.removed:
            raise _err(errno.ENOENT)
        if node is self.root:
            node.path = b""
            node.dir_layers = self._root_layers()
            node.layer = node.dir_layers[0]
            node.epoch = self.epoch
            return
        pino, name = node.links[0]
        parent = self.nodes[pino]
        self._resolve(parent)
        path = join(parent.path, name)
        r = self._lookup_in(parent.dir_layers, path)
        if r is None:
            raise _err(errno.ENOENT)
        node.path = path
        node.layer, node.st, node.dir_layers = r
        node.attrs = None
        if node.is_dir and not node.dir_layers:
            raise _err(errno.ENOENT)  # replaced by a non-directory behind our back
        node.epoch = self.epoch

    def _backing(self, node: Node) -> bytes:
        self._resolve(node)
        return join(self.layers[node.layer], node.path)

    def _upper(self, path: bytes) -> bytes:
        return join(self.layers[0], path)

    def _tmp(self, what: str) -> bytes:
        self._tmp_serial += 1
        return os.path.join(self.workdir, f"{what}.{os.getpid()}.{self._tmp_serial}".encode())

    def _listing(self, path: bytes, dir_layers: tuple[int, ...]) -> list[tuple[bytes, int]]:
        seen: set[bytes] = set()
        out: list[tuple[bytes, int]] = []
        for li in dir_layers:
            try:
                it = os.scandir(join(self.layers[li], path))
            except (FileNotFoundError, NotADirectoryError):
                continue
            with it:
                for e in it:
                    if e.name in seen:
                        continue
                    seen.add(e.name)
                    # d_type answers for the common kinds without a stat per entry.
                    if not (e.is_file(follow_symlinks=False) or e.is_dir(follow_symlinks=False)
                            or e.is_symlink()) and is_whiteout(e.stat(follow_symlinks=False)):
                        continue
                    out.append((e.name, li))
        return out

    # -- nodes -------------------------------------------------------------------------
    def _node(self, ino: int) -> Node:
        try:
            return self.nodes[ino]
        except KeyError:
            raise _err(errno.ESTALE) from None

    def _child(self, parent: Node, name: bytes) -> tuple[Node, os.stat_result] | None:
        """The node for ``name`` in ``parent`` (made if the kernel has not seen it yet) and
        its lstat, or None if absent. Does not count a lookup."""
        self._resolve(parent)
        path = join(parent.path, name)
        ino = parent.children.get(name)
        if ino is not None:
            node = self.nodes.get(ino)
            if node is not None and not node.removed:
                try:
                    self._resolve(node)
                    return node, self._lower_stat(node) or os.lstat(join(self.layers[node.layer], node.path))
                except (pyfuse3.FUSEError, FileNotFoundError):
                    pass
            parent.children.pop(name, None)
        r = self._lookup_in(parent.dir_layers, path)
        if r is None:
            return None
        layer, st, dir_layers = r
        key = (layer, st.st_ino)
        if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
            alias = self.nodes.get(self.aliases.get(key, 0))
            if alias is not None and not alias.removed:
                if alias.layer == self.U and layer != self.U:
                    # The other name of a base hard link was copied up: link this one to the
                    # copy so the two stay one file.
                    self._link_up(alias, parent, name)
                    st = os.lstat(self._upper(path))
                alias.links.append((parent.ino, name))
                parent.children[name] = alias.ino
                return alias, st
        node = self._new_node(parent, name, stat.S_ISDIR(st.st_mode))
        node.path, node.layer, node.dir_layers, node.epoch = path, layer, dir_layers, self.epoch
        node.st = st
        if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
            self._alias(key, node)
        return node, st

    def _alias(self, key: tuple[int, int], node: Node) -> None:
        self.aliases[key] = node.ino
        self.alias_keys.setdefault(node.ino, []).append(key)

    def _link_up(self, node: Node, parent: Node, name: bytes) -> None:
        self._resolve(node)
        parent_upper = self._ensure_upper_dir(parent)
        dst = self._upper(join(parent.path, name))
        self._place(lambda: os.link(self._upper(node.path), dst, follow_symlinks=False), parent_upper)

    def _new_node(self, parent: Node, name: bytes, is_dir: bool) -> Node:
        node = Node(self.next_ino, parent.ino, name, is_dir)
        self.next_ino += 1
        self.nodes[node.ino] = node
        parent.children[name] = node.ino
        return node

    def _unlink_node(self, node: Node, parent: Node, name: bytes) -> None:
        if (parent.ino, name) in node.links:
            if node.links[0] == (parent.ino, name):
                node.epoch = -1  # its path came from this name: resolve through the next one
            node.links.remove((parent.ino, name))
        if parent.children.get(name) == node.ino:
            del parent.children[name]
        if not node.links:
            node.removed = True
            node.links = [(parent.ino, name)]  # keep a parent for bookkeeping only
        self._maybe_drop(node)

    def _maybe_drop(self, node: Node) -> None:
        if node is self.root or node.nlookup > 0 or node.fds:
            return
        self.nodes.pop(node.ino, None)
        for pino, name in node.links:
            parent = self.nodes.get(pino)
            if parent is not None and parent.children is not None and parent.children.get(name) == node.ino:
                del parent.children[name]
        for k in self.alias_keys.pop(node.ino, ()):
            if self.aliases.get(k) == node.ino:
                del self.aliases[k]

    def _attrs(self, node: Node, st: os.stat_result) -> pyfuse3.EntryAttributes:
        cacheable = st is node.st and node.layer != self.U
        if cacheable and node.attrs is not None:
            return node.attrs
        e = pyfuse3.EntryAttributes()
        e.st_ino = node.ino
        e.generation = 0
        e.entry_timeout = self.entry_timeout
        e.attr_timeout = self.attr_timeout
        e.st_mode = st.st_mode
        # A merged directory's link count is not any one layer's: 1 tells find(1) "unknown".
        e.st_nlink = 1 if node.is_dir and len(node.dir_layers) > 1 else st.st_nlink
        if self.idmap is None:
            e.st_uid, e.st_gid = st.st_uid, st.st_gid
        else:
            e.st_uid, e.st_gid = self.idmap.shown_uid(st.st_uid), self.idmap.shown_gid(st.st_gid)
        e.st_rdev = st.st_rdev
        e.st_size = st.st_size
        e.st_blksize = st.st_blksize
        e.st_blocks = st.st_blocks
        e.st_atime_ns = st.st_atime_ns
        e.st_mtime_ns = st.st_mtime_ns
        e.st_ctime_ns = st.st_ctime_ns
        if cacheable:
            node.attrs = e
        return e

    def _stat(self, node: Node) -> os.stat_result:
        if node.removed:
            for fd in node.fds:
                return os.fstat(fd)
            raise _err(errno.ENOENT)
        return self._lower_stat(node) or os.lstat(self._backing(node))

    def _lower_stat(self, node: Node) -> os.stat_result | None:
        """The cached lstat of a node backed by a lower layer (None: ask the upper). Valid
        because lower layers are immutable and every move of a node to another backing
        file goes through _resolve or copy-up, which refresh or bypass it."""
        if node.epoch != self.epoch:
            self._resolve(node)
        if node.layer != self.U and node.st is not None:
            return node.st
        return None

    # -- budget ------------------------------------------------------------------------
    def _charge(self, nbytes: int) -> None:
        if nbytes > 0 and self.disk_budget is not None and self.used + nbytes > self.disk_budget:
            self.journal.disk_refused()
            raise _err(errno.ENOSPC)
        self.used += nbytes

    def _credit_unlinked(self, st: os.stat_result) -> None:
        if stat.S_ISREG(st.st_mode) and st.st_nlink <= 1:
            self.used = max(0, self.used - st.st_size)

    # -- copy-up -----------------------------------------------------------------------
    def _restore_times(self, path: bytes, st: os.stat_result | None) -> None:
        if st is not None:
            try:
                os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)
            except OSError:
                pass

    def _place(self, fn: Callable[[], None], parent_upper: bytes) -> None:
        """Run ``fn`` (which adds an entry to ``parent_upper``) as copy-up: keep the parent's
        times (copy-up is not a change to it) and get past a read-only parent when we are
        not root (the kernel already checked the caller may do what needs the copy-up)."""
        pst = os.lstat(parent_upper)
        try:
            fn()
        except PermissionError:
            if IS_ROOT:
                raise
            os.chmod(parent_upper, stat.S_IMODE(pst.st_mode) | 0o700)
            try:
                fn()
            finally:
                os.chmod(parent_upper, stat.S_IMODE(pst.st_mode))
        self._restore_times(parent_upper, pst)

    def _ensure_upper_dir(self, node: Node) -> bytes:
        if not self.writable:
            raise _err(errno.EROFS)
        self._resolve(node)
        upath = self._upper(node.path)
        if node.dir_layers[0] == self.U:
            return upath
        pino = node.links[0][0]
        parent_upper = self._ensure_upper_dir(self.nodes[pino])
        src = join(self.layers[node.dir_layers[0]], node.path)
        st = os.lstat(src)

        def make() -> None:
            os.mkdir(upath, 0o700)
            copy_meta(src, upath, st)

        self._place(make, parent_upper)
        node.dir_layers = (self.U,) + node.dir_layers
        node.layer = self.U
        return upath

    async def _copy_up(self, node: Node, *, data: bool = True) -> None:
        """Make a non-directory node live in the upper (``data=False``: an empty file, for a
        truncate to 0). Idempotent; serialised per node; the copy itself runs in a thread."""
        if not self.writable:
            raise _err(errno.EROFS)
        self._resolve(node)
        if node.layer == self.U:
            return
        if node.lock is None:
            node.lock = trio.Lock()
        async with node.lock:
            self._resolve(node)
            if node.layer == self.U:
                return
            src = join(self.layers[node.layer], node.path)
            st = os.lstat(src)
            tmp = self._tmp("copyup")
            size = st.st_size if (data and stat.S_ISREG(st.st_mode)) else 0
            self._charge(size)
            placed = False
            try:
                if stat.S_ISREG(st.st_mode):
                    await trio.to_thread.run_sync(copy_file_data, src, tmp, size, self.fsync_copyup)
                elif stat.S_ISLNK(st.st_mode):
                    os.symlink(os.readlink(src), tmp)
                elif stat.S_ISFIFO(st.st_mode):
                    os.mkfifo(tmp, 0o600)
                else:
                    os.mknod(tmp, st.st_mode, st.st_rdev)
                copy_meta(src, tmp, st)
                # Things may have moved while we copied: re-check before placing.
                self._resolve(node)
                if node.layer == self.U:
                    return
                parent_upper = self._ensure_upper_dir(self.nodes[node.links[0][0]])
                self._place(lambda: os.rename(tmp, self._upper(node.path)), parent_upper)
                placed = True
                node.layer = self.U
                node.copy_gen += 1
                if stat.S_ISREG(st.st_mode):
                    self._alias((self.U, os.lstat(self._upper(node.path)).st_ino), node)
                for pino, name in node.links[1:]:
                    # Other names of a base hard link: keep them one file in the upper too.
                    other = self.nodes.get(pino)
                    if other is not None and not other.removed:
                        self._link_up(node, other, name)
            finally:
                if not placed:
                    self.used -= size
                    try:
                        os.unlink(tmp)
                    except FileNotFoundError:
                        pass

    def _materialize(self, node: Node) -> bytes:
        """Make directory ``node`` wholly upper and opaque (for renames): upper entries are
        moved, lower ones copied. Synchronous: nothing else runs meanwhile."""
        self._resolve(node)
        upath = self._upper(node.path)
        if node.dir_layers == (self.U,):
            if not _is_opaque(upath):
                os.setxattr(upath, OPAQUE_XATTR, b"y", follow_symlinks=False)
            return upath
        parent_upper = self._ensure_upper_dir(self.nodes[node.links[0][0]])
        tmp = self._tmp("mat")
        top = join(self.layers[node.dir_layers[0]], node.path)
        st = os.lstat(top)
        os.mkdir(tmp, 0o700)
        try:
            self._build(node.path, node.dir_layers, tmp)
            copy_meta(top, tmp, st)
            os.setxattr(tmp, OPAQUE_XATTR, b"y", follow_symlinks=False)
            if self.fsync_copyup:
                syncfs(tmp)  # one flush for the whole copied tree before it takes the name
            if node.dir_layers[0] == self.U:
                rename_exchange(tmp, upath)  # tmp now holds the emptied old skeleton
                rmtree(tmp)
            else:
                self._place(lambda: os.rename(tmp, upath), parent_upper)
        except BaseException:
            rmtree(tmp)
            raise
        node.dir_layers = (self.U,)
        node.layer = self.U
        self.epoch += 1  # every descendant moved layer
        return upath

    def _build(self, path: bytes, dir_layers: tuple[int, ...], dst: bytes) -> None:
        for name, li in self._listing(path, dir_layers):
            child = join(path, name)
            src = join(self.layers[li], child)
            out = os.path.join(dst, name)
            st = os.lstat(src)
            if stat.S_ISDIR(st.st_mode):
                r = self._lookup_in(dir_layers, child)
                os.mkdir(out, 0o700)
                self._build(child, r[2] if r else (li,), out)
                copy_meta(src, out, st)
            elif li == self.U:
                os.rename(src, out)
            else:
                if stat.S_ISREG(st.st_mode):
                    self.used += st.st_size
                    copy_file_data(src, out, st.st_size)
                elif stat.S_ISLNK(st.st_mode):
                    os.symlink(os.readlink(src), out)
                elif stat.S_ISFIFO(st.st_mode):
                    os.mkfifo(out, 0o600)
                else:
                    os.mknod(out, st.st_mode, st.st_rdev)
                copy_meta(src, out, st)

    def _whiteout_at(self, upath: bytes) -> None:
        """Atomically replace whatever is at ``upath`` (or nothing) with a whiteout."""
        tmp = self._tmp("wh")
        os.mknod(tmp, WHITEOUT_MODE, os.makedev(0, 0))
        try:
            st = os.lstat(upath)
        except FileNotFoundError:
            st = None
        if st is not None and stat.S_ISDIR(st.st_mode):
            rename_exchange(tmp, upath)
            rmtree(tmp)
        else:
            os.rename(tmp, upath)

    # -- namespace helpers -------------------------------------------------------------
    def _prepare_new(self, parent: Node, name: bytes) -> tuple[bytes, bool]:
        """Check ``name`` is free in ``parent`` and make room in the upper; returns the upper
        path and whether a whiteout is there (``_make`` then replaces it atomically and a
        new directory must be opaque)."""
        if not self.writable:
            raise _err(errno.EROFS)
        self._resolve(parent)
        if parent.removed:
            raise _err(errno.ENOENT)
        if self._child(parent, name) is not None:
            raise _err(errno.EEXIST)
        self._ensure_upper_dir(parent)
        path = join(parent.path, name)
        upath = self._upper(path)
        had_whiteout = False
        try:
            st = os.lstat(upath)
        except FileNotFoundError:
            st = None
        if st is not None:
            if not is_whiteout(st):
                raise _err(errno.EEXIST)
            had_whiteout = True
        return upath, had_whiteout

    def _make(self, upath: bytes, had_whiteout: bool, make: Callable[[bytes], Any], is_dir: bool = False) -> Any:
        """``make(path)`` creates the new entry; over a whiteout it is made in the work dir
        and swapped in with one rename, so a crash shows either the deletion or the new
        entry, never the lower file again. Returns what ``make`` returns."""
        if not had_whiteout:
            return make(upath)
        tmp = self._tmp("new")
        out = make(tmp)
        try:
            if is_dir:
                rename_exchange(tmp, upath)  # rename(2) cannot put a dir over a non-dir
                os.unlink(tmp)  # now the whiteout
            else:
                os.rename(tmp, upath)
        except BaseException:
            if isinstance(out, int):
                os.close(out)
            rmtree(tmp) if is_dir else os.unlink(tmp)
            raise
        return out

    def _create_entry(self, parent: Node, name: bytes, ctx: Any, make: Callable[[bytes, bool], Any], *,
                      is_dir: bool = False) -> tuple[Node, pyfuse3.EntryAttributes, Any]:
        """What every creating handler does: make room, journal the name, ``make(path,
        had_whiteout)`` (atomically over a whiteout), give it the caller's owner, register
        the node. Returns (node, attributes, what ``make`` returned); a descriptor it
        returned is closed if a later step fails."""
        upath, had_whiteout = self._prepare_new(parent, name)
        self.journal.changed(b"C", join(parent.path, name))
        out = self._make(upath, had_whiteout, lambda p: make(p, had_whiteout), is_dir=is_dir)
        try:
            self._chown_new(upath, self._upper(parent.path), ctx)
            node, attrs = self._finish_new(parent, name, upath)
        except BaseException:
            if isinstance(out, int):
                os.close(out)
            raise
        return node, attrs, out

    def _chown_new(self, upath: bytes, parent_upper: bytes, ctx: pyfuse3.RequestContext) -> None:
        if IS_ROOT:
            uid, gid = ctx.uid, ctx.gid
            if self.idmap is not None:
                uid, gid = self.idmap.to_disk_uid(uid), self.idmap.to_disk_gid(gid)
            if os.lstat(parent_upper).st_mode & stat.S_ISGID:
                gid = -1
            os.chown(upath, uid, gid, follow_symlinks=False)

    def _finish_new(self, parent: Node, name: bytes, upath: bytes) -> tuple[Node, pyfuse3.EntryAttributes]:
        st = os.lstat(upath)
        old = parent.children.get(name)
        if old is not None and old in self.nodes:
            self._unlink_node(self.nodes[old], parent, name)
        node = self._new_node(parent, name, stat.S_ISDIR(st.st_mode))
        node.path = join(parent.path, name)
        node.layer = self.U
        node.dir_layers = (self.U,) if node.is_dir else ()
        node.epoch = self.epoch
        node.nlookup += 1
        return node, self._attrs(node, st)

    # -- handlers: lookup and attributes -----------------------------------------------
    @_handler
    async def lookup(self, parent_inode: int, name: bytes, ctx: Any) -> pyfuse3.EntryAttributes:
        parent = self._node(parent_inode)
        if name == b".":
            node, st = parent, self._stat(parent)
        elif name == b"..":
            self._resolve(parent)
            node = self.nodes[parent.links[0][0]]  # the root's parent is the root: nothing above it
            st = self._stat(node)
        else:
            found = self._child(parent, name)
            if found is None:
                e = pyfuse3.EntryAttributes()
                e.st_ino = 0
                e.entry_timeout = self.negative_timeout
                return e
            node, st = found
            self._metadata_read(node)
        node.nlookup += 1
        return self._attrs(node, st)

    async def forget(self, inode_list: list[tuple[int, int]]) -> None:
        for ino, n in inode_list:
            node = self.nodes.get(ino)
            if node is None:
                continue
            node.nlookup = max(0, node.nlookup - n)
            self._maybe_drop(node)

    @_handler
    async def getattr(self, inode: int, ctx: Any = None) -> pyfuse3.EntryAttributes:
        node = self._node(inode)
        attrs = self._attrs(node, self._stat(node))
        self._metadata_read(node)
        return attrs

    def _metadata_read(self, node: Node) -> None:
        """A run that stat()s a file depends on it as much as one that opens it: Python
        checks a module's source by its mtime and size, then reads only the .pyc. Directories
        are left out (live changes are files; a lookup of every parent would only add noise)."""
        if not node.is_dir and not node.removed and node.epoch == self.epoch:
            self.journal.read(node.path)

    @_handler
    async def setattr(self, inode: int, attr: pyfuse3.EntryAttributes, fields: pyfuse3.SetattrFields,
                      fh: int | None, ctx: Any) -> pyfuse3.EntryAttributes:
        node = self._node(inode)
        changing = (fields.update_size or fields.update_mode or fields.update_uid or fields.update_gid
                    or fields.update_atime or fields.update_mtime)
        if not changing:
            return self._attrs(node, self._stat(node))
        if not self.writable:
            raise _err(errno.EROFS)
        handle = self.fhs.get(fh) if fh is not None else None
        fd = handle.fd if isinstance(handle, Handle) and handle.layer == self.U and \
            handle.gen == node.copy_gen else None
        if fd is None:
            if node.removed:
                raise _err(errno.ENOENT)
            if node.is_dir:
                self._ensure_upper_dir(node)
            else:
                await self._copy_up(node, data=not (fields.update_size and attr.st_size == 0))
        if not node.removed:
            self._resolve(node)
        path = node.path
        upath = self._upper(path) if fd is None else None
        self.journal.changed(b"W" if fields.update_size else b"A", path)
        if fields.update_size:
            cur = os.fstat(fd).st_size if fd is not None else os.lstat(upath).st_size
            self._charge(attr.st_size - cur)
            try:
                if fd is not None:
                    os.ftruncate(fd, attr.st_size)
                else:
                    os.truncate(upath, attr.st_size)
            except OSError:
                self.used -= attr.st_size - cur
                raise
        target: Any = fd if fd is not None else upath
        st = os.fstat(fd) if fd is not None else os.lstat(upath)
        if fields.update_uid or fields.update_gid:
            uid = attr.st_uid if fields.update_uid else -1
            gid = attr.st_gid if fields.update_gid else -1
            if self.idmap is not None:
                uid = self.idmap.to_disk_uid(uid) if uid != -1 else -1
                gid = self.idmap.to_disk_gid(gid) if gid != -1 else -1
            if fd is not None:
                os.fchown(fd, uid, gid)
            else:
                os.chown(upath, uid, gid, follow_symlinks=False)
        if fields.update_mode and not stat.S_ISLNK(st.st_mode):
            os.chmod(target, stat.S_IMODE(attr.st_mode))
        if fields.update_atime or fields.update_mtime:
            st = os.fstat(fd) if fd is not None else os.lstat(upath)
            a = attr.st_atime_ns if fields.update_atime else st.st_atime_ns
            m = attr.st_mtime_ns if fields.update_mtime else st.st_mtime_ns
            if fd is not None:
                os.utime(fd, ns=(a, m))
            else:
                os.utime(upath, ns=(a, m), follow_symlinks=False)
        return self._attrs(node, self._stat(node))

    @_handler
    async def readlink(self, inode: int, ctx: Any) -> bytes:
        node = self._node(inode)
        target = os.readlink(self._backing(node))
        self.journal.read(node.path)
        return target

    @_handler
    async def statfs(self, ctx: Any) -> pyfuse3.StatvfsData:
        sv = os.statvfs(self.layers[0])
        out = pyfuse3.StatvfsData()
        out.f_bsize = sv.f_bsize
        out.f_frsize = sv.f_frsize
        out.f_blocks = sv.f_blocks
        out.f_bfree = sv.f_bfree
        out.f_bavail = sv.f_bavail
        if self.disk_budget is not None:
            frs = sv.f_frsize or 4096
            out.f_blocks = min(sv.f_blocks, self.disk_budget // frs)
            free = max(0, self.disk_budget - self.used) // frs
            out.f_bfree = min(sv.f_bfree, free)
            out.f_bavail = min(sv.f_bavail, free)
        out.f_files = sv.f_files
        out.f_ffree = sv.f_ffree
        out.f_favail = sv.f_favail
        out.f_namemax = sv.f_namemax
        return out

    # -- handlers: namespace -----------------------------------------------------------
    @_handler
    async def mknod(self, parent_inode: int, name: bytes, mode: int, rdev: int, ctx: Any) -> pyfuse3.EntryAttributes:
        parent = self._node(parent_inode)
        if stat.S_ISCHR(mode) and rdev == 0:
            raise _err(errno.EPERM)  # that is a whiteout in the layer format
        return self._create_entry(parent, name, ctx, lambda p, _: os.mknod(
            p, stat.S_IFMT(mode) | (stat.S_IMODE(mode) & ~ctx.umask), rdev))[1]

    @_handler
    async def mkdir(self, parent_inode: int, name: bytes, mode: int, ctx: Any) -> pyfuse3.EntryAttributes:
        parent = self._node(parent_inode)

        def make(p: bytes, had_whiteout: bool) -> None:
            os.mkdir(p, stat.S_IMODE(mode) & ~ctx.umask)
            if had_whiteout:
                os.setxattr(p, OPAQUE_XATTR, b"y", follow_symlinks=False)

        return self._create_entry(parent, name, ctx, make, is_dir=True)[1]

    @_handler
    async def symlink(self, parent_inode: int, name: bytes, target: bytes, ctx: Any) -> pyfuse3.EntryAttributes:
        parent = self._node(parent_inode)
        return self._create_entry(parent, name, ctx, lambda p, _: os.symlink(target, p))[1]

    @_handler
    async def create(self, parent_inode: int, name: bytes, mode: int, flags: int,
                     ctx: Any) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        parent = self._node(parent_inode)
        node, attrs, fd = self._create_entry(parent, name, ctx, lambda p, _: os.open(
            p, self._os_flags(flags) | os.O_CREAT | os.O_EXCL, stat.S_IMODE(mode) & ~ctx.umask))
        return self._open_handle(node, fd, flags), attrs

    @_handler
    async def link(self, inode: int, new_parent_inode: int, new_name: bytes, ctx: Any) -> pyfuse3.EntryAttributes:
        node = self._node(inode)
        parent = self._node(new_parent_inode)
        if node.is_dir:
            raise _err(errno.EPERM)
        await self._copy_up(node)
        upath, wh = self._prepare_new(parent, new_name)
        self._resolve(node)
        self.journal.changed(b"C", join(parent.path, new_name))
        self._make(upath, wh, lambda p: os.link(self._upper(node.path), p, follow_symlinks=False))
        st = os.lstat(upath)
        old = parent.children.get(new_name)
        if old is not None and old in self.nodes:
            self._unlink_node(self.nodes[old], parent, new_name)
        node.links.append((parent.ino, new_name))
        parent.children[new_name] = node.ino
        if stat.S_ISREG(st.st_mode):
            self._alias((self.U, st.st_ino), node)
        node.nlookup += 1
        return self._attrs(node, st)

    def _remove(self, parent: Node, name: bytes, want_dir: bool) -> None:
        if not self.writable:
            raise _err(errno.EROFS)
        found = self._child(parent, name)
        if found is None:
            raise _err(errno.ENOENT)
        node, st = found
        if want_dir and not node.is_dir:
            raise _err(errno.ENOTDIR)
        if not want_dir and node.is_dir:
            raise _err(errno.EISDIR)
        if want_dir and self._listing(node.path, node.dir_layers):
            raise _err(errno.ENOTEMPTY)
        path = join(parent.path, name)  # not node.path: a hard link's other name may be first
        upath = self._upper(path)
        lower_visible = self._lookup_in(parent.dir_layers, path, skip_upper=True) is not None
        self.journal.changed(b"U", path)
        if lower_visible:
            self._ensure_upper_dir(parent)
            self._whiteout_at(upath)
        elif node.layer == self.U:
            if want_dir:
                rmtree(upath)  # only whiteouts were left inside
            else:
                os.unlink(upath)
        if node.layer == self.U:
            self._credit_unlinked(st)
        self._unlink_node(node, parent, name)

    @_handler
    async def unlink(self, parent_inode: int, name: bytes, ctx: Any) -> None:
        self._remove(self._node(parent_inode), name, want_dir=False)

    @_handler
    async def rmdir(self, parent_inode: int, name: bytes, ctx: Any) -> None:
        self._remove(self._node(parent_inode), name, want_dir=True)

    @_handler
    async def rename(self, parent_inode_old: int, name_old: bytes, parent_inode_new: int,
                     name_new: bytes, flags: int, ctx: Any) -> None:
        if not self.writable:
            raise _err(errno.EROFS)
        pold = self._node(parent_inode_old)
        pnew = self._node(parent_inode_new)
        exchange = bool(flags & RENAME_EXCHANGE)
        for _ in range(100):
            src = self._child(pold, name_old)
            if src is None:
                raise _err(errno.ENOENT)
            dst = self._child(pnew, name_new)
            if dst is not None and flags & RENAME_NOREPLACE:
                raise _err(errno.EEXIST)
            if dst is None and exchange:
                raise _err(errno.ENOENT)
            # Copy-ups may await; after each, look again (the world may have moved).
            if not src[0].is_dir and src[0].layer != self.U:
                await self._copy_up(src[0])
                continue
            if exchange and not dst[0].is_dir and dst[0].layer != self.U:
                await self._copy_up(dst[0])
                continue
            break
        else:
            raise _err(errno.EAGAIN)
        snode, sst = src
        if dst is not None and dst[0] is snode:
            return  # two names of one file: POSIX says do nothing
        if dst is not None and not exchange:
            dnode = dst[0]
            if snode.is_dir and not dnode.is_dir:
                raise _err(errno.ENOTDIR)
            if not snode.is_dir and dnode.is_dir:
                raise _err(errno.EISDIR)
            if dnode.is_dir and self._listing(dnode.path, dnode.dir_layers):
                raise _err(errno.ENOTEMPTY)
        old_path = join(pold.path, name_old)
        new_path = join(pnew.path, name_new)
        kind = b"T" if snode.is_dir or (exchange and dst[0].is_dir) else b"U"
        self.journal.changed(kind, old_path)
        self.journal.changed(kind if kind == b"T" else b"C", new_path)
        if snode.is_dir:
            self._materialize(snode)
        if exchange and dst[0].is_dir:
            self._materialize(dst[0])
        self._resolve(pold)
        self._resolve(pnew)
        self._ensure_upper_dir(pold)
        self._ensure_upper_dir(pnew)
        old_path = join(pold.path, name_old)
        new_path = join(pnew.path, name_new)
        uold, unew = self._upper(old_path), self._upper(new_path)
        if exchange:
            rename_exchange(uold, unew)
            dnode = dst[0]
            self._relink(snode, pold, name_old, pnew, name_new)
            self._relink(dnode, pnew, name_new, pold, name_old)
            pnew.children[name_new] = snode.ino
            pold.children[name_old] = dnode.ino
            self.epoch += 1
            return
        lower_visible_old = self._lookup_in(pold.dir_layers, old_path, skip_upper=True) is not None
        try:
            ust = os.lstat(unew)
        except FileNotFoundError:
            ust = None
        swapped = False
        if ust is not None:
            if stat.S_ISDIR(ust.st_mode):
                rmtree(unew)  # an empty merged dir: nothing but whiteouts inside
            elif is_whiteout(ust) and snode.is_dir:
                # A dir cannot be renamed over a non-dir: swap, and the old name gets the
                # whiteout in the same step (crash-safe; no moment with neither).
                rename_exchange(uold, unew)
                swapped = True
            elif not is_whiteout(ust):
                self._credit_unlinked(ust)
        if not swapped:
            os.rename(uold, unew)
        if snode.is_dir:
            os.setxattr(unew, OPAQUE_XATTR, b"y", follow_symlinks=False)
        if swapped and not lower_visible_old:
            os.unlink(uold)
        elif lower_visible_old and not swapped:
            self._whiteout_at(uold)
        if dst is not None:
            self._unlink_node(dst[0], pnew, name_new)
        self._relink(snode, pold, name_old, pnew, name_new)
        self.epoch += 1

    def _relink(self, node: Node, pold: Node, name_old: bytes, pnew: Node, name_new: bytes) -> None:
        if (pold.ino, name_old) in node.links:
            node.links[node.links.index((pold.ino, name_old))] = (pnew.ino, name_new)
        else:
            node.links.insert(0, (pnew.ino, name_new))
        if pold.children.get(name_old) == node.ino:
            del pold.children[name_old]
        pnew.children[name_new] = node.ino

    # -- handlers: files ---------------------------------------------------------------
    def _os_flags(self, flags: int) -> int:
        flags &= ~(os.O_CREAT | os.O_EXCL | os.O_NOCTTY | getattr(os, "O_DIRECT", 0))
        if self.enable_writeback_cache:
            # The kernel reads pages of write-only files and does O_APPEND itself.
            if flags & os.O_ACCMODE == os.O_WRONLY:
                flags = (flags & ~os.O_ACCMODE) | os.O_RDWR
            flags &= ~os.O_APPEND
        return flags | os.O_CLOEXEC | os.O_NOFOLLOW

    def _open_handle(self, node: Node, fd: int, flags: int) -> pyfuse3.FileInfo:
        fh = self.next_fh
        self.next_fh += 1
        self.fhs[fh] = Handle(node, fd, flags)
        node.fds.add(fd)
        keep = self.keep_cache == "all" or (self.keep_cache == "lower" and node.layer != self.U)
        return pyfuse3.FileInfo(fh=fh, keep_cache=keep)

    @_handler
    async def open(self, inode: int, flags: int, ctx: Any) -> pyfuse3.FileInfo:
        node = self._node(inode)
        writing = (flags & os.O_ACCMODE) != os.O_RDONLY or flags & os.O_TRUNC
        if writing:
            if not self.writable:
                raise _err(errno.EROFS)
            await self._copy_up(node, data=not flags & os.O_TRUNC)
        self._resolve(node)
        if (flags & os.O_ACCMODE) != os.O_WRONLY:
            self.journal.read(node.path)
        path = join(self.layers[node.layer], node.path)
        if flags & os.O_TRUNC:
            self.journal.changed(b"W", node.path)
            self._credit_unlinked(os.lstat(path))
        fd = os.open(path, self._os_flags(flags))
        return self._open_handle(node, fd, flags)

    def _fd_for_read(self, h: Handle) -> int:
        node = h.node
        if h.gen != node.copy_gen and not node.removed:
            # Copied up since this read-only descriptor was opened: follow the new copy.
            fd = os.open(self._backing(node), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
            node.fds.discard(h.fd)
            os.close(h.fd)
            h.fd, h.gen, h.layer = fd, node.copy_gen, node.layer
            node.fds.add(fd)
        return h.fd

    @_handler
    async def read(self, fh: int, off: int, size: int) -> bytes:
        h = self.fhs[fh]
        return os.pread(self._fd_for_read(h), size, off)

    @_handler
    async def write(self, fh: int, off: int, buf: bytes) -> int:
        h = self.fhs[fh]
        node = h.node
        cur = os.fstat(h.fd).st_size
        end = (cur if h.flags & os.O_APPEND and not self.enable_writeback_cache else off) + len(buf)
        self._charge(end - cur if end > cur else 0)
        if not node.removed:
            self.journal.changed(b"W", node.path if node.epoch == self.epoch else self._path_of(node))
        try:
            n = os.pwrite(h.fd, buf, off)
        except OSError:
            self.used -= max(0, end - cur)
            raise
        return n

    def _path_of(self, node: Node) -> bytes:
        self._resolve(node)
        return node.path

    @_handler
    async def flush(self, fh: int) -> None:
        pass

    @_handler
    async def release(self, fh: int) -> None:
        h = self.fhs.pop(fh, None)
        if isinstance(h, Handle):
            h.node.fds.discard(h.fd)
            os.close(h.fd)
            if h.node.removed:
                self._maybe_drop(h.node)

    @_handler
    async def fsync(self, fh: int, datasync: bool) -> None:
        h = self.fhs[fh]
        if datasync:
            os.fdatasync(h.fd)
        else:
            os.fsync(h.fd)

    # -- handlers: directories ---------------------------------------------------------
    @_handler
    async def opendir(self, inode: int, ctx: Any) -> int:
        node = self._node(inode)
        self._resolve(node)
        key = (node.path, node.dir_layers)
        if node.names is not None and node.names_key == key:
            names = node.names
        else:
            names = [n for n, _ in self._listing(node.path, node.dir_layers)]
            if self.U not in node.dir_layers:  # only lower layers: it cannot change
                node.names, node.names_key = names, key
        fh = self.next_fh
        self.next_fh += 1
        self.fhs[fh] = DirHandle(node, names)
        return fh

    @_handler
    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        d = self.fhs[fh]
        assert isinstance(d, DirHandle)
        for i in range(start_id, len(d.entries)):
            name = d.entries[i]
            found = self._child(d.node, name)
            if found is None:
                continue  # removed since opendir
            node, st = found
            attrs = self._attrs(node, st)
            if not node.is_dir and self.journal.records_reads and not self.journal.was_read(node.path):
                # Readdirplus hands the kernel this entry's attributes: cached, a later stat()
                # would never reach us. Uncached, that stat() comes back as a lookup and is
                # recorded as a read (once: after that the entry is cached as usual).
                attrs = copy.copy(attrs)
                attrs.entry_timeout = attrs.attr_timeout = 0
            if not pyfuse3.readdir_reply(token, name, attrs, i + 1):
                self._maybe_drop(node)
                return
            node.nlookup += 1

    @_handler
    async def releasedir(self, fh: int) -> None:
        self.fhs.pop(fh, None)

    @_handler
    async def fsyncdir(self, fh: int, datasync: bool) -> None:
        d = self.fhs[fh]
        if self.writable:
            self._resolve(d.node)
            if d.node.dir_layers and d.node.dir_layers[0] == self.U:
                fd = os.open(self._upper(d.node.path), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)

    # -- handlers: xattrs --------------------------------------------------------------
    @_handler
    async def getxattr(self, inode: int, name: bytes, ctx: Any) -> bytes:
        if _hidden_xattr(name):
            raise _err(pyfuse3.ENOATTR)
        return os.getxattr(self._backing(self._node(inode)), name, follow_symlinks=False)

    @_handler
    async def listxattr(self, inode: int, ctx: Any) -> list[bytes]:
        names = os.listxattr(self._backing(self._node(inode)), follow_symlinks=False)
        return [n for n in map(os.fsencode, names) if not _hidden_xattr(n)]

    async def _upper_for_meta(self, node: Node) -> bytes:
        if not self.writable:
            raise _err(errno.EROFS)
        if node.is_dir:
            return self._ensure_upper_dir(node)
        await self._copy_up(node)
        self._resolve(node)
        return self._upper(node.path)

    @_handler
    async def setxattr(self, inode: int, name: bytes, value: bytes, ctx: Any) -> None:
        if _hidden_xattr(name):
            raise _err(errno.EPERM)
        node = self._node(inode)
        upath = await self._upper_for_meta(node)
        self.journal.changed(b"A", node.path)
        os.setxattr(upath, name, value, follow_symlinks=False)

    @_handler
    async def removexattr(self, inode: int, name: bytes, ctx: Any) -> None:
        if _hidden_xattr(name):
            raise _err(pyfuse3.ENOATTR)
        node = self._node(inode)
        os.getxattr(self._backing(node), name, follow_symlinks=False)  # ENODATA before copy-up
        upath = await self._upper_for_meta(node)
        self.journal.changed(b"A", node.path)
        os.removexattr(upath, name, follow_symlinks=False)

    # -- lifetime ----------------------------------------------------------------------
    def close(self) -> None:
        for h in list(self.fhs.values()):
            if isinstance(h, Handle):
                try:
                    os.close(h.fd)
                except OSError:
                    pass
        self.fhs.clear()
        self.journal.close()
