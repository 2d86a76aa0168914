"""The layer format shared by the overlay and fuse backends, and how delta layers are built.

A **layer** is a plain directory tree under ``.petri/layers/<n>`` (``n`` a short lowercase
hex name). It uses the overlayfs on-disk conventions in their ``userxattr`` flavour, so the
same layers can be stacked by kernel overlayfs (``-o userxattr``, root or inside a user
namespace) and by the fuse backend (which reads them itself):

- a **whiteout** (the name was deleted) is a character device 0:0 with that name;
- an **opaque** directory (hides everything below it in lower layers) carries the xattr
  ``user.overlay.opaque`` = ``b"y"``; layers built as root also carry
  ``trusted.overlay.opaque`` (the snapshot's ``layers.json`` then says
  ``"trusted_marks": true``), so a kernel overlay *without* ``userxattr`` reads them too:
  the overlay backend mounts sandboxes that way, because only there may it use
  ``redirect_dir=on`` (directory renames).

A sandbox's upper dir under such a mount is written by the kernel in the ``trusted``
flavour: opaque marks ``trusted.overlay.opaque``, and a directory renamed from a lower layer
carries ``trusted.overlay.redirect`` (where its lower content lives) with a whiteout at its
old name. :func:`layer_entries` reports such a directory as ``redirect_dir`` (its whole
subtree differs from the base's at that path); :func:`merged_walk` refuses it (only the
kernel resolves redirects), so an upper with renames is stacked only by kernel mounts
(the overlay backend's frozen views).

A **snapshot** is an ordered list of layer names, lowest first, in
``snapshots/<id>/layers.json`` (``{"version": 1, "layers": [...]}``; read it with
:func:`read_layer_list`, which also accepts a bare JSON list), plus the **stat cache** of the
live tree as of that snapshot in ``snapshots/<id>/statcache``: path -> :data:`Key` (a plain
tuple in ``StatKey`` field order: ino, size, mtime_ns, ctime_ns, mode; tuples because 60k
dataclass instances cost a third of a no-change snapshot) for every path the snapshot's
merged view holds (and only those), marshal'ed behind a version header.

The next snapshot walks live with ``lstat`` only, compares each path's ``StatKey`` with the
parent's cache (:func:`plan_delta`, pure logic) and copies only what moved into a new delta
layer (:func:`build_layer`): added or changed files; directories whose metadata changed (as
plain merged directories); a directory that is new, replaced by another type, or deleted and
recreated (another inode) becomes opaque and gets all its children; deleted names become
whiteouts; missing parents are created carrying live's modes and times. Layers are never
written once installed, so any number of snapshots and mounts may share them.

:func:`merged_walk` resolves a stack of layers in Python exactly as overlayfs does (used by
compaction, by tests as an oracle, and by the fuse backend); :func:`compact_layers` turns a
deep stack into one full layer by hard-linking the (immutable) files of the old layers, so
compaction copies no file data.

Nothing here mounts anything or needs root (creating a 0:0 whiteout needs root or, since
Linux 5.8, nothing at all).

Caveats:
- Exact per file, not across files: each copied file is stat'ed before and after its copy
  and copied again if it moved; a file that vanished during the snapshot is recorded as
  deleted.
- The stat cache trusts (inode, size, mtime_ns, ctime_ns, mode). A file changed within
  ``RACY_WINDOW_NS`` of the walk could keep all five, so such entries are stored "racy"
  and re-copied by the next snapshot (git's racily-clean rule); a snapshot right after a
  burst of edits therefore copies those files again.
- Hard links are kept only among files copied into the same layer; overlayfs breaks a
  link at copy-up anyway.
- Compacted layers share inodes (hard links) with the layers they were made from: their
  files show ``st_nlink`` > 1 in a view, and their ctime is the compaction's.
- ``user.overlay.*`` / ``trusted.overlay.*`` xattrs in the live tree are not carried (they
  would change what the layer means); sockets and device nodes are not carried either.
- The progress callback of :func:`build_layer` is called from its copying threads.
"""
from __future__ import annotations

import contextlib
import errno
import functools
import json
import marshal
import os
import stat
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Mapping, Sequence, Tuple

from .errors import DiskFull, SnapshotError, TreeChangedDuringCopy
from .osutil import atomic_write, fsync_dir, rename_noreplace, rmtree
from .tree import (COPY_RETRIES, StatKey, TreeCopier, apply_meta, copy_file, copy_file_at, copy_xattrs, join,
                   settable_xattr, walk)

if TYPE_CHECKING:
    from concurrent.futures import Future

# (ino, size, mtime_ns, ctime_ns, mode): StatKey's fields as a tuple; StatKey(*key) converts.
Key = Tuple[int, int, int, int, int]
_INO, _SIZE, _MTIME, _CTIME, _MODE = range(5)


def key_of(st: os.stat_result) -> Key:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode)


OPAQUE_XATTR = "user.overlay.opaque"
TRUSTED_OPAQUE_XATTR = "trusted.overlay.opaque"
OPAQUE_XATTRS = (OPAQUE_XATTR, TRUSTED_OPAQUE_XATTR)
# Set by a kernel overlay with redirect_dir=on on a directory renamed in a sandbox: where
# its lower content lives ("name" beside it, or "/abs/path" from the layer root).
REDIRECT_XATTR = "trusted.overlay.redirect"
_OVERLAY_XATTR_PREFIXES = ("user.overlay.", "trusted.overlay.")
LAYER_LIST_VERSION = 1
STAT_CACHE_MAGIC = b"petri-statcache\n"
STAT_CACHE_VERSION = 1
# Timestamps come from the kernel's coarse clock (one tick: 4 ms at HZ=250); 50 ms leaves
# room for a slow tick and a walk that stat'ed a file just before it was written again.
RACY_WINDOW_NS = 50_000_000
_RACY_SIZE = -1  # a size no file has: a racy cache entry never matches

# -- whiteouts and opaque directories ---------------------------------------------------------


def is_whiteout(st: os.stat_result) -> bool:
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def make_whiteout(path: bytes) -> None:
    os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(0, 0))


def overlay_marks(path: bytes) -> tuple[bool, bytes | None]:
    """(opaque, redirect) of a layer directory, in either xattr namespace (a kernel overlay
    mounted without ``userxattr`` writes ``trusted.overlay.*`` into a sandbox's upper). One
    listxattr: most directories carry no xattrs at all."""
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except OSError:
        return False, None
    if not names:
        return False, None
    opaque = False
    redirect = None
    for name in names:
        try:
            if name in OPAQUE_XATTRS:
                opaque = opaque or os.getxattr(path, name, follow_symlinks=False) == b"y"
            elif name == REDIRECT_XATTR:
                redirect = os.getxattr(path, name, follow_symlinks=False)
        except OSError:
            continue
    return opaque, redirect


def is_opaque(path: bytes) -> bool:
    return overlay_marks(path)[0]


def set_opaque(path: bytes, trusted: bool = False) -> None:
    """Mark a layer directory opaque: ``user.overlay.opaque`` (fuse, ``userxattr`` mounts)
    and, with ``trusted`` (root), also ``trusted.overlay.opaque`` (kernel overlay mounts
    without ``userxattr``, the only ones that allow ``redirect_dir=on``)."""
    os.setxattr(path, OPAQUE_XATTR, b"y", follow_symlinks=False)
    if trusted:
        os.setxattr(path, TRUSTED_OPAQUE_XATTR, b"y", follow_symlinks=False)


def add_trusted_marks(layer: bytes) -> None:
    """Give every opaque directory of an older layer the trusted mark too (idempotent; the
    layer's meaning to ``userxattr`` readers does not change). Needs root."""
    for rel, st in walk(layer):
        if stat.S_ISDIR(st.st_mode):
            p = os.path.join(layer, rel)
            try:
                marked = os.getxattr(p, OPAQUE_XATTR, follow_symlinks=False) == b"y"
            except OSError:
                continue
            if marked:
                os.setxattr(p, TRUSTED_OPAQUE_XATTR, b"y", follow_symlinks=False)


def copy_plain_xattrs(src: bytes, dst: bytes) -> None:
    """The xattrs of src onto dst, minus overlay's own (they would change the layer's meaning)."""
    copy_xattrs(src, dst, lambda name: settable_xattr(name) and not name.startswith(_OVERLAY_XATTR_PREFIXES))


def copy_all_xattrs(src: bytes, dst: bytes) -> None:
    """Every xattr, overlay's included (copying a layer or an upper dir as a layer)."""
    copy_xattrs(src, dst, lambda name: True)


# -- small on-disk records ----------------------------------------------------------------------


def write_layer_list(path: bytes | str | os.PathLike, layers: Sequence[str], *, trusted_marks: bool = False) -> None:
    """``trusted_marks``: every opaque directory in these layers also carries the trusted
    mark, so a kernel overlay without ``userxattr`` reads them right."""
    doc: dict = {"version": LAYER_LIST_VERSION, "layers": list(layers)}
    if trusted_marks:
        doc["trusted_marks"] = True
    atomic_write(path, json.dumps(doc).encode() + b"\n")


def _layer_list_doc(path: bytes | str | os.PathLike) -> dict:
    with open(path, "rb") as f:
        data = json.loads(f.read())
    if isinstance(data, list):
        return {"version": LAYER_LIST_VERSION, "layers": data}
    if data.get("version") != LAYER_LIST_VERSION:
        raise SnapshotError(detail=f"{os.fsdecode(path)}: unknown layer list version {data.get('version')!r}")
    return data


def read_layer_list(path: bytes | str | os.PathLike) -> list[str]:
    """Layer names, lowest first. Raises FileNotFoundError if the snapshot has none."""
    return [str(x) for x in _layer_list_doc(path)["layers"]]


def layer_list_trusted(path: bytes | str | os.PathLike) -> bool:
    """Do the snapshot's layers carry trusted opaque marks (see :func:`write_layer_list`)?"""
    try:
        return bool(_layer_list_doc(path).get("trusted_marks"))
    except (FileNotFoundError, ValueError, SnapshotError):
        return False


def dump_stat_cache(cache: Mapping[bytes, Key]) -> bytes:
    return STAT_CACHE_MAGIC + marshal.dumps((STAT_CACHE_VERSION, dict(cache)))


def load_stat_cache(path: bytes | str | os.PathLike) -> dict[bytes, Key]:
    with open(path, "rb") as f:
        data = f.read()
    if not data.startswith(STAT_CACHE_MAGIC):
        raise SnapshotError(detail=f"{os.fsdecode(path)}: not a petri stat cache")
    try:
        version, flat = marshal.loads(data[len(STAT_CACHE_MAGIC):])
    except (EOFError, ValueError, TypeError) as e:
        raise SnapshotError(detail=f"{os.fsdecode(path)}: damaged stat cache ({e})") from e
    if version != STAT_CACHE_VERSION:
        raise SnapshotError(detail=f"{os.fsdecode(path)}: unknown stat cache version {version}")
    if not isinstance(flat, dict):
        raise SnapshotError(detail=f"{os.fsdecode(path)}: damaged stat cache")
    return flat


def mark_racy(key: Key, walk_started_ns: int) -> Key:
    """Entries changed too close to the walk are stored so that they never match again."""
    if key[_CTIME] >= walk_started_ns - RACY_WINDOW_NS or key[_MTIME] >= walk_started_ns - RACY_WINDOW_NS:
        return (key[_INO], _RACY_SIZE, key[_MTIME], key[_CTIME], key[_MODE])
    return key


# -- scanning live --------------------------------------------------------------------------------


def carried(st: os.stat_result) -> bool:
    """The file types a layer carries (sockets and devices are not workspace content)."""
    m = st.st_mode
    return stat.S_ISDIR(m) or stat.S_ISREG(m) or stat.S_ISLNK(m) or stat.S_ISFIFO(m)


@dataclass
class Scan:
    """One lstat walk of a tree: the root's stat and every carried entry, parents first."""

    root: os.stat_result
    entries: dict[bytes, os.stat_result]
    started_ns: int

    def keys(self) -> Iterator[tuple[bytes, Key]]:
        for rel, st in self.entries.items():
            yield rel, (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode)

    def root_key(self) -> Key:
        return key_of(self.root)


def scan_tree(root: bytes, exclude_top: frozenset[bytes] = frozenset()) -> Scan:
    started = time.time_ns()
    root_st = os.lstat(root)
    entries = {rel: st for rel, st in walk(root, exclude_top) if carried(st)}
    return Scan(root_st, entries, started)


# -- planning (pure) ------------------------------------------------------------------------------

MKDIR = "mkdir"
COPY = "copy"
WHITEOUT = "whiteout"


@dataclass(frozen=True, slots=True)
class Op:
    kind: str  # MKDIR | COPY | WHITEOUT
    rel: bytes
    opaque: bool = False  # MKDIR: hide everything below in lower layers
    in_lower: bool = False  # COPY: the lower layers show something at rel (a vanished source becomes a whiteout)
    size: int = 0  # COPY of a regular file: bytes it will copy


@dataclass
class DeltaPlan:
    ops: list[Op] = field(default_factory=list)
    root_changed: bool = False

    @property
    def empty(self) -> bool:
        return not self.ops and not self.root_changed

    @property
    def bytes(self) -> int:
        return sum(op.size for op in self.ops)

    def by_kind(self, kind: str) -> list[bytes]:
        return [op.rel for op in self.ops if op.kind == kind]


def _dirname(rel: bytes) -> bytes:
    i = rel.rfind(b"/")
    return rel[:i] if i >= 0 else b""


def plan_delta(old: Mapping[bytes, Key], new: Iterable[tuple[bytes, Key]],
               old_root: Key | None = None, new_root: Key | None = None) -> DeltaPlan:
    """What a delta layer must hold to turn the view ``old`` describes into ``new``.

    ``old`` is the parent snapshot's stat cache (every path of its view) or ``{}`` for a
    first, full layer; ``new`` the live walk, parents before children. Ops are in an order
    an executor can apply front to back (parents made before children)."""
    plan = DeltaPlan(root_changed=old_root is None or old_root != new_root)
    ops = plan.ops
    made: set[bytes] = {b""}
    fresh: set[bytes] = set()  # dirs in this layer that nothing below shows through
    new_map: dict[bytes, Key] = {}

    def ensure_parents(rel: bytes) -> None:
        missing = []
        p = _dirname(rel)
        while p not in made:
            missing.append(p)
            p = _dirname(p)
        for p in reversed(missing):
            ops.append(Op(MKDIR, p))
            made.add(p)

    for rel, key in new:
        new_map[rel] = key
        mode = key[_MODE]
        is_dir = stat.S_ISDIR(mode)
        size = key[_SIZE] if stat.S_ISREG(mode) else 0
        if _dirname(rel) in fresh:
            if is_dir:
                ops.append(Op(MKDIR, rel))
                made.add(rel)
                fresh.add(rel)
            else:
                ops.append(Op(COPY, rel, size=size))
            continue
        before = old.get(rel)
        if is_dir:
            if before is None:
                # Nothing below shows at rel (the parent's view has no such path): no need for opaque.
                ensure_parents(rel)
                ops.append(Op(MKDIR, rel))
            elif not stat.S_ISDIR(before[_MODE]) or before[_INO] != key[_INO]:
                # Replaced or recreated: the old children must not show through.
                ensure_parents(rel)
                ops.append(Op(MKDIR, rel, opaque=True))
            elif before != key:
                ensure_parents(rel)
                ops.append(Op(MKDIR, rel))
                made.add(rel)
                continue
            else:
                continue
            made.add(rel)
            fresh.add(rel)
        elif before != key:
            ensure_parents(rel)
            ops.append(Op(COPY, rel, in_lower=before is not None, size=size))

    for rel in old:
        if rel in new_map or rel == b"":
            continue
        parent = _dirname(rel)
        # Only the topmost deleted name needs a whiteout; under a fresh dir or a
        # non-directory nothing of the old view shows anyway.
        if parent == b"" or (parent in new_map and stat.S_ISDIR(new_map[parent][_MODE]) and parent not in fresh):
            ensure_parents(rel)
            ops.append(Op(WHITEOUT, rel))
    return plan


# -- building a layer -----------------------------------------------------------------------------


@dataclass
class BuildResult:
    bytes_copied: int
    copied: dict[bytes, os.stat_result]  # rel -> the stat the layer's copy matches
    vanished: set[bytes]  # sources gone (or replaced) before they could be copied


def _is_same_file(path: bytes, st: os.stat_result) -> bool:
    try:
        now = os.lstat(path)
    except OSError:
        return False
    return stat.S_IFMT(now.st_mode) == stat.S_IFMT(st.st_mode) and now.st_ino == st.st_ino


def _copy_symlink(src: bytes, dst: bytes) -> os.stat_result:
    for _ in range(COPY_RETRIES):
        before = os.lstat(src)
        if not stat.S_ISLNK(before.st_mode):
            raise FileNotFoundError(errno.ENOENT, "replaced by another type", src)
        target = os.readlink(src)
        after = os.lstat(src)
        if StatKey.of(before) == StatKey.of(after):
            os.symlink(target, dst)
            apply_meta(dst, after, is_link=True)
            return after
    raise TreeChangedDuringCopy(path=os.fsdecode(src))


def _drop_overlay_xattrs(path: bytes) -> None:
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except OSError:
        return
    for name in names:
        if name.startswith(_OVERLAY_XATTR_PREFIXES):
            with contextlib.suppress(OSError):
                os.removexattr(path, name, follow_symlinks=False)


def _copy_regular(src: bytes, dst: bytes, st: os.stat_result, reflink: bool,
                  count: Callable[[int], None], strict: bool) -> os.stat_result:
    """Copy one file into a layer. ``strict`` (a live file): it must hold still, and its own
    overlay xattrs are dropped (they would mean something to the kernel here). Otherwise (a
    sandbox's upper dir, copied verbatim) a file written without pause is taken as one read
    pass saw it."""
    got = copy_file_at(None, src, None, dst, reflink=reflink, count=count, settle=not strict)
    if strict:
        _drop_overlay_xattrs(dst)
    return got


def build_layer(src_root: bytes, layer: bytes, plan: DeltaPlan, scan: Scan, *, reflink: bool,
                progress: Callable[[int, int], None] | None = None, workers: int = 4,
                trusted_marks: bool = False) -> BuildResult:
    """Apply ``plan`` into the new directory ``layer`` (must not exist), copying from src_root.
    ``trusted_marks``: opaque directories get the trusted mark too (see :func:`set_opaque`).

    On failure the caller removes ``layer``; the error is DiskFull or SnapshotError."""
    total = plan.bytes
    done = [0]
    lock = threading.Lock()

    def count(n: int) -> None:
        with lock:
            done[0] += n
            now = done[0]
        if progress is not None:
            progress(now, total)

    copied: dict[bytes, os.stat_result] = {}
    vanished: set[bytes] = set()
    dirs: list[bytes] = []
    linked: list[tuple[Op, bytes]] = []  # (op, rel of the first copy of its inode)
    first_of_inode: dict[tuple[int, int], bytes] = {}
    futures: list[tuple[Op, Future]] = []
    os.mkdir(layer, 0o700)

    def source_gone(op: Op) -> None:
        vanished.add(op.rel)
        if op.in_lower:
            make_whiteout(os.path.join(layer, op.rel))

    def settle(op: Op, copy: Callable[[], os.stat_result]) -> None:
        try:
            copied[op.rel] = copy()
        except OSError:
            if _is_same_file(os.path.join(src_root, op.rel), scan.entries[op.rel]):
                raise
            # Gone or replaced by another type between the walk and the copy.
            try:
                os.unlink(os.path.join(layer, op.rel))
            except FileNotFoundError:
                pass
            source_gone(op)

    from concurrent.futures import ThreadPoolExecutor  # imported here: clones never build layers

    try:
        with ThreadPoolExecutor(max_workers=max(workers, 1)) as pool:
            for op in plan.ops:
                dst = os.path.join(layer, op.rel)
                src = os.path.join(src_root, op.rel)
                if op.kind == WHITEOUT:
                    make_whiteout(dst)
                elif op.kind == MKDIR:
                    os.mkdir(dst, 0o700)
                    if op.opaque:
                        set_opaque(dst, trusted=trusted_marks)
                    copy_plain_xattrs(src, dst)
                    dirs.append(op.rel)
                else:
                    st = scan.entries[op.rel]
                    mode = st.st_mode
                    try:
                        if stat.S_ISREG(mode):
                            ident = (st.st_dev, st.st_ino)
                            if st.st_nlink > 1 and ident in first_of_inode:
                                linked.append((op, first_of_inode[ident]))
                                continue
                            if st.st_nlink > 1:
                                first_of_inode[ident] = op.rel
                            if workers and not reflink and st.st_size >= TreeCopier.BIG_FILE:
                                futures.append((op, pool.submit(_copy_regular, src, dst, st, reflink, count,
                                                                True)))
                            else:  # inline: see TreeCopier for why threads lose on small files
                                settle(op, functools.partial(_copy_regular, src, dst, st, reflink, count, True))
                        elif stat.S_ISLNK(mode):
                            copied[op.rel] = _copy_symlink(src, dst)
                        elif stat.S_ISFIFO(mode):
                            if not _is_same_file(src, st):
                                raise FileNotFoundError(errno.ENOENT, "replaced", src)
                            os.mkfifo(dst, 0o600)
                            apply_meta(dst, st)
                            copied[op.rel] = st
                    except (FileNotFoundError, NotADirectoryError):
                        source_gone(op)
            for op, fut in futures:
                settle(op, fut.result)
        for op, first in linked:
            if first in copied:
                os.link(os.path.join(layer, first), os.path.join(layer, op.rel))
                copied[op.rel] = copied[first]
            else:
                source_gone(op)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFull(doing="building a snapshot layer") from e
        raise SnapshotError(detail=f"{os.fsdecode(e.filename or b'')}: {e.strerror}") from e
    # Directory times last: making their children moved them.
    for rel in reversed(dirs):
        st = scan.entries.get(rel)
        if st is not None:
            apply_meta(os.path.join(layer, rel), st)
    apply_meta(layer, scan.root)
    unique = {(st.st_dev, st.st_ino): st.st_size for st in copied.values() if stat.S_ISREG(st.st_mode)}
    return BuildResult(sum(unique.values()), copied, vanished)


def next_cache(scan: Scan, result: BuildResult | None) -> dict[bytes, Key]:
    """The stat cache of the snapshot just built: every path its view holds."""
    recent = scan.started_ns - RACY_WINDOW_NS
    cache: dict[bytes, Key] = {b"": mark_racy(key_of(scan.root), scan.started_ns)}
    copied = result.copied if result else {}
    gone = result.vanished if result else set()
    for rel, st in scan.entries.items():
        if copied or gone:
            if rel in gone:
                continue
            st = copied.get(rel, st)
        if st.st_ctime_ns >= recent or st.st_mtime_ns >= recent:
            cache[rel] = (st.st_ino, _RACY_SIZE, st.st_mtime_ns, st.st_ctime_ns, st.st_mode)
        else:
            cache[rel] = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode)
    return cache


# -- reading a stack of layers ------------------------------------------------------------------


def merged_walk(layers: Sequence[bytes]) -> Iterator[tuple[bytes, bytes, os.stat_result]]:
    """(rel, path of the entry in the layer that provides it, its lstat) for the merged view
    of ``layers`` (TOP FIRST), parents before children, as overlayfs resolves it: the topmost
    entry wins; directories merge down until an opaque one or a non-directory; whiteouts hide."""
    stack: list[tuple[bytes, list[bytes]]] = [(b"", list(layers))]
    while stack:
        rel, dirs = stack.pop()
        chosen: dict[bytes, tuple[bytes, os.stat_result]] = {}
        below: dict[bytes, list[bytes]] = {}  # dir name -> layer dirs merged into it
        closed: set[bytes] = set()  # names whose lookup stopped
        for layer_dir in dirs:
            d = os.path.join(layer_dir, rel) if rel else layer_dir
            try:
                it = os.scandir(d)
            except FileNotFoundError:
                continue
            with it:
                for e in it:
                    name = e.name
                    if name in closed:
                        continue
                    path = os.path.join(d, name)
                    st = e.stat(follow_symlinks=False)
                    if name not in chosen and name not in below:
                        if is_whiteout(st):
                            closed.add(name)
                        elif stat.S_ISDIR(st.st_mode):
                            chosen[name] = (path, st)
                            below[name] = [layer_dir]
                            if _merge_stops(path):
                                closed.add(name)
                        else:
                            chosen[name] = (path, st)
                            closed.add(name)
                    elif name in below:
                        if stat.S_ISDIR(st.st_mode) and not is_whiteout(st):
                            below[name].append(layer_dir)
                            if _merge_stops(path):
                                closed.add(name)
                        else:
                            closed.add(name)
        subdirs = []
        for name in sorted(chosen):
            path, st = chosen[name]
            child = join(rel, name)
            yield child, path, st
            if name in below:
                subdirs.append((child, below[name]))
        stack.extend(reversed(subdirs))


def _merge_stops(path: bytes) -> bool:
    """Is this layer directory opaque? A redirected one (a directory renamed in a kernel
    overlay sandbox) cannot be resolved here: refuse rather than show the wrong tree."""
    opaque, redirect = overlay_marks(path)
    if redirect is not None:
        raise SnapshotError(detail=f"{os.fsdecode(path)} is a renamed directory (overlay redirect "
                                   f"{os.fsdecode(redirect)!r}): only a kernel overlay mount can read that layer")
    return opaque


def layer_entries(layer: bytes) -> Iterator[tuple[bytes, str, os.stat_result]]:
    """(rel, kind, lstat) of one layer or upper dir, kind one of "whiteout", "opaque_dir",
    "redirect_dir" (a directory renamed in a kernel overlay sandbox: its whole subtree
    differs from the base's at that path), "dir", "file" (anything else): what a sandbox
    changed, read straight from its upper."""
    for rel, st in walk(layer):
        if is_whiteout(st):
            yield rel, "whiteout", st
        elif stat.S_ISDIR(st.st_mode):
            opaque, redirect = overlay_marks(os.path.join(layer, rel))
            yield rel, "redirect_dir" if redirect is not None else "opaque_dir" if opaque else "dir", st
        else:
            yield rel, "file", st


def layer_lookup(layers: Sequence[bytes], rel: bytes) -> bytes | None:
    """Where ``rel`` of the merged view of ``layers`` (TOP FIRST) lives, as overlayfs
    resolves it (whiteouts hide, opaque dirs stop the merge, a non-dir ends a path), or None.
    Redirects are not followed: for layers petri builds and fuse uppers, which have none."""
    parts = rel.split(b"/")
    cands = list(layers)
    for i, _ in enumerate(parts):
        sub = b"/".join(parts[:i + 1])
        last = i == len(parts) - 1
        nxt: list[bytes] = []
        for layer in cands:
            p = os.path.join(layer, sub)
            try:
                st = os.lstat(p)
            except (FileNotFoundError, NotADirectoryError):
                continue
            if is_whiteout(st):
                break
            if last:
                return p
            if not stat.S_ISDIR(st.st_mode):
                break  # the first entry found is not a directory: nothing beneath
            nxt.append(layer)
            try:
                if os.getxattr(p, OPAQUE_XATTR, follow_symlinks=False) == b"y":
                    break
            except OSError:
                pass
        if not nxt:
            return None
        cands = nxt
    return None


def upper_bytes(layer: bytes) -> int:
    """Apparent bytes of the regular files in a layer or upper dir, every name counted (what
    the fuse disk budget charges; a sandbox's usage on overlay and fuse)."""
    total = 0
    stack = [layer]
    while stack:
        try:
            it = os.scandir(stack.pop())
        except (FileNotFoundError, NotADirectoryError):
            continue  # removed while we walked
        with it:
            for e in it:  # d_type decides: only regular files cost a stat
                if e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
                elif e.is_file(follow_symlinks=False):
                    try:
                        total += e.stat(follow_symlinks=False).st_size
                    except FileNotFoundError:
                        pass
    return total


# -- whole layers ---------------------------------------------------------------------------------


def compact_layers(layers: Sequence[bytes], dst: bytes, *, link: bool = True, reflink: bool = False) -> int:
    """Write the merged view of ``layers`` (TOP FIRST) as one full layer at ``dst`` (must not
    exist). Files are hard-linked from the source layers (they are immutable), or copied
    where linking fails. Returns the bytes copied."""
    copied = 0
    os.mkdir(dst, 0o700)
    dirs: list[tuple[bytes, os.stat_result]] = []
    try:
        for rel, src, st in merged_walk(layers):
            out = os.path.join(dst, rel)
            mode = st.st_mode
            if stat.S_ISDIR(mode):
                os.mkdir(out, 0o700)
                copy_plain_xattrs(src, out)
                dirs.append((out, st))
            elif stat.S_ISREG(mode):
                if link:
                    try:
                        os.link(src, out)
                        continue
                    except OSError as e:
                        if e.errno not in (errno.EMLINK, errno.EXDEV, errno.EPERM):
                            raise
                copy_file(src, out, st, reflink=reflink)
                copied += st.st_size
            elif stat.S_ISLNK(mode):
                os.symlink(os.readlink(src), out)
                apply_meta(out, st, is_link=True)
            elif stat.S_ISFIFO(mode):
                os.mkfifo(out, 0o600)
                apply_meta(out, st)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFull(doing="compacting snapshot layers") from e
        raise SnapshotError(detail=f"compacting layers: {os.fsdecode(e.filename or b'')}: {e.strerror}") from e
    for out, st in reversed(dirs):
        apply_meta(out, st)
    top_root = os.lstat(layers[0])
    apply_meta(dst, top_root)
    return copied


def copy_layer(src: bytes, dst: bytes, *, reflink: bool) -> int:
    """Copy a layer or a live upper dir verbatim (whiteouts, overlay xattrs and all) to the new
    directory ``dst``; a file written while it is copied is taken as one read pass saw it."""
    copied = 0
    os.mkdir(dst, 0o700)
    dirs: list[tuple[bytes, os.stat_result]] = []
    try:
        for rel, st in walk(src):
            s = os.path.join(src, rel)
            out = os.path.join(dst, rel)
            mode = st.st_mode
            try:
                if stat.S_ISDIR(mode):
                    os.mkdir(out, 0o700)
                    copy_all_xattrs(s, out)
                    dirs.append((out, st))
                elif stat.S_ISREG(mode):
                    got = _copy_regular(s, out, st, reflink, lambda n: None, False)
                    copied += got.st_size
                elif stat.S_ISLNK(mode):
                    _copy_symlink(s, out)
                elif is_whiteout(st):
                    make_whiteout(out)
                elif stat.S_ISFIFO(mode):
                    os.mkfifo(out, 0o600)
                    apply_meta(out, st)
            except (FileNotFoundError, NotADirectoryError):
                continue  # removed while we copied: per file, not global
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFull(doing="copying a sandbox's upper layer") from e
        raise SnapshotError(detail=f"copying {os.fsdecode(src)}: {e.strerror}") from e
    for out, st in reversed(dirs):
        apply_meta(out, st)
    apply_meta(dst, os.lstat(src))
    return copied


def redirected_dirs(layer: bytes) -> list[bytes]:
    """The top-most directories of a layer (a copied upper) that a kernel overlay marked
    renamed (``trusted.overlay.redirect``): their content lives elsewhere below."""
    out: list[bytes] = []
    for rel, st in walk(layer):
        if stat.S_ISDIR(st.st_mode) and not any(rel.startswith(r + b"/") for r in out):
            if overlay_marks(os.path.join(layer, rel))[1] is not None:
                out.append(rel)
    return out


def canonical_marks(layer: bytes, *, trusted: bool) -> None:
    """Make a copied upper a layer in this module's format: every opaque directory marked
    ``user.overlay.opaque`` (and, with ``trusted``, ``trusted.overlay.opaque`` too), and the
    kernel's other bookkeeping (origin, impure, nlink, redirects already resolved) dropped,
    so every reader (kernel with or without ``userxattr``, the fuse daemon, ``merged_walk``)
    sees the same tree."""
    for rel, st in walk(layer):
        if not stat.S_ISDIR(st.st_mode):
            continue
        p = os.path.join(layer, rel) if rel else layer
        opaque, _redirect = overlay_marks(p)
        try:
            names = os.listxattr(p, follow_symlinks=False)
        except OSError:
            names = []
        for name in names:
            if name.startswith(_OVERLAY_XATTR_PREFIXES) and name not in OPAQUE_XATTRS:
                with contextlib.suppress(OSError):
                    os.removexattr(p, name, follow_symlinks=False)
        if opaque:
            set_opaque(p, trusted=trusted)
        elif trusted is False and TRUSTED_OPAQUE_XATTR in names:
            with contextlib.suppress(OSError):
                os.removexattr(p, TRUSTED_OPAQUE_XATTR, follow_symlinks=False)


def replace_with_opaque_copy(layer: bytes, rel: bytes, copied: bytes, *, trusted: bool) -> None:
    """Put the full tree ``copied`` (made outside the layer) at ``rel`` of the layer, as an
    opaque directory: nothing below shows through, so it means what it meant as a redirect."""
    target = os.path.join(layer, rel)
    rmtree(target)
    os.rename(copied, target)
    set_opaque(target, trusted=trusted)


# -- installing layers --------------------------------------------------------------------------

def layer_names(layers_dir: bytes) -> list[str]:
    try:
        return [n for n in os.listdir(os.fsdecode(layers_dir)) if _is_layer_name(n)]
    except FileNotFoundError:
        return []


def _is_layer_name(n: str) -> bool:
    try:
        int(n, 16)
    except ValueError:
        return False
    return n == n.lower()


def install_layer(layers_dir: bytes, built: bytes) -> str:
    """Move a finished layer from tmp into ``layers_dir`` under the next free short name
    (atomic: a rename that never replaces). Returns the name."""
    taken = [int(n, 16) for n in layer_names(layers_dir)]
    n = max(taken) + 1 if taken else 1
    while True:
        name = format(n, "x")
        try:
            rename_noreplace(built, os.path.join(layers_dir, name.encode()))
        except OSError as e:
            if e.errno in (errno.EEXIST, errno.ENOTEMPTY):
                n += 1
                continue
            raise
        fsync_dir(layers_dir)
        return name
