"""The ``overlay`` backend: layered snapshots, clones as kernel overlayfs mounts (root).

Snapshots are stacks of layers (the format is in :mod:`snapshot.layers`): the first
snapshot copies the live tree into one full layer; each later one walks live with ``lstat``,
compares with the parent's stat cache and copies only what changed into a new delta layer
(whiteouts for deletions), so taking a snapshot costs a stat walk plus the changed bytes.
When a stack grows past ``max_depth`` (32) layers, the snapshot's view is compacted into one
fresh full layer made of hard links to the old layers' files (O(files), no data copied).

A clone is an overlay mount at ``sandboxes/<sb>/tree`` with ``upper/`` and ``work/`` beside
it and the snapshot's layers as lowerdirs (top first): O(1), a host-visible path. The live
tree is never a lowerdir (overlayfs calls a lowerdir changing under a mount undefined).

Mount options. Sandboxes: ``index=off,metacopy=off,redirect_dir=on`` in the ``trusted``
xattr namespace, so a sandbox can rename a directory that came from a snapshot (``git mv
src pkg``): the kernel writes the renamed directory into the upper with a
``trusted.overlay.redirect`` to its lower content and a whiteout at the old name, which
the change-set code reads as a whole changed subtree (see :mod:`snapshot.layers`);
``index`` and ``metacopy`` are off so the upper dir holds plain whole files that other
tools (diff, promote, frozen views) can read. The layers' opaque marks are
``user.overlay.*`` (the fuse backend reads the same layers) and, written as root, also
``trusted.overlay.*``; a snapshot whose layers predate that gets the trusted marks at its
first clone. Views (and sandboxes where trusted xattrs cannot be written):
``userxattr,index=off,metacopy=off,redirect_dir=nofollow`` (``userxattr`` forbids
``redirect_dir=on``, and on 6.18 refuses ``off``). A sandbox is always remounted with the
options its mount record names: its upper's xattrs are in that flavour. The options go
in through the new mount API (``fsopen``/``fsconfig`` with one ``lowerdir+`` per layer,
Linux 6.8+), so the one-page limit of a mount(2) option string never applies; on older
kernels (told apart up front: before 6.5 the kernel takes any key and fails only at create)
the fallback runs ``mount -t overlay`` with ``cwd`` at the store root and short
relative paths (``layers/1f:layers/1e``), which fits about 400 layers in a page. What was
mounted is recorded in ``sandboxes/<sb>/mount.json``, so :meth:`ensure_clone` can mount it
again after a reboot.

Owners (``clone(..., idmap=M)``, a root-owned workspace: see ``snapshot.idmap``): the
overlay itself cannot be id-mapped, its layers can. The sandbox is mounted over detached
idmapped copies of ``layers/`` and of the sandbox dir (named by ``/proc/self/fd`` paths),
from a thread whose fsuid is the mapped account with its capabilities raised again: the
kernel does the upper-dir work with the mounter's credentials, which the idmapped upper
turns back into root on disk. So the command (that account on the host) owns the tree,
what it writes is root's on disk, and the host path shows root's files as the account's.
The record keeps the map (``"idmap"``), so a remount after a reboot maps again. Every
overlay mount is ``nosuid,nodev``.

What a sandbox changed is its upper dir (``change_candidates``: files, whiteouts, opaque
directories, renamed directories, read by ``snapshot.layers.layer_entries``); for a fork of
a fork, the layers between its lineage's origin and its base are added. A snapshot keeps
its stat cache of live (``live_record``), and its layers can be read without mounting
anything (``snapshot_layers``): staleness uses both.

Measured here (ext4, 60,600 files, 2 cores under load): clone 1.2-1.9 ms; snapshot view
mount 1.2 ms; a snapshot with nothing changed 0.9-1.3 s (the lstat walk is half of it);
first snapshot 7-23 s (a full data copy; ext4 has no reflink); compaction of the stack 1.6 s
(hard links only).

Caveats:
- Needs root. Rootless overlay exists only inside a user namespace, whose mounts the host
  cannot see: rootless workspaces use the fuse backend on the same layers.
- The first snapshot copies the whole tree (``instant = False``); later ones cost a stat walk
  of the whole tree plus the changed bytes.
- Snapshots are exact per file, not across files (see :mod:`snapshot.layers`).
- Hard links in the base are broken when the sandbox writes one of the names (copy-up).
- A sandbox mounted before trusted marks existed (its mount record says ``userxattr``)
  keeps ``redirect_dir=nofollow``: there, renaming a directory that came from a snapshot
  fails with EXDEV. So does any sandbox where this process cannot write trusted xattrs.
- A renamed directory's upper carries ``trusted.overlay.origin`` and ``impure`` xattrs
  beside the redirect; they are the kernel's own and never leave the store (promotion
  copies only allow-listed xattrs, and the merged view hides them).
- ``frozen_view`` copies the sandbox's whole upper dir (O(upper), reflinked where the
  filesystem can); a file written without pause meanwhile is taken as one read pass saw it.
- A lowerdir-only overlay needs two layers, so a single-layer snapshot view stacks an empty
  directory under it.
- ``read_view`` and ``quiet_view`` (diff, staleness, ``read_file``: reads that must make
  nothing) give a single layer as it is and otherwise an overlay mounted on a detached
  tmpfs, read through ``/proc/self/fd/N/view``: only this process can use that path. As a
  normal user, or on a kernel that cannot mount on a detached tree (before 6.15) or has no
  ``lowerdir+``, they fall back to ``snapshot_view``'s mount in tmp/ (and fuse's
  ``quiet_view`` to the sandbox's own mount, whose daemon then records petri's reads). A
  fuse sandbox's upper is a lower layer there: an edit made through its path during the
  read may show half-way.
- After a lazy unmount (destroy or gc while processes were still inside) the detached mount
  lives on until they exit; ``ensure_clone`` cannot see it and would mount the same upper a
  second time, which overlayfs calls undefined: kill a sandbox's processes before remounting.
- With an id map, a file root creates through the host path is stored owned by the mapped
  account (root has no id of its own on that mount) and shows as ``nobody`` inside.
- Mounting over idmapped layers needs the new mount API with ``lowerdir+`` (Linux 6.8+)
  and layers given as detached mounts (6.18 here); there is no ``mount(8)`` fallback for it.
- ``leftovers`` and ``delete_snapshot`` count a layer as used by what ``snapshots/*`` and
  ``sandboxes/*/mount.json`` name: run them under the store lock, never while a snapshot is
  being taken.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import os
import stat
import subprocess
import threading
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterator, Sequence

from .. import idmap as I
from .. import layers as L
from ..backend import (FULL, Backend, Candidates, DiskUsage, Leftover, Progress, SnapshotResult, StatKeys,
                       refuse_clone_options)
from ..candidates import prune_dirs
from ..errors import OverlayMountFailed, SnapshotError
from ..idmap import IdMap
from ..idmap import syscall as _syscall
from ..osutil import atomic_write, fs_magic, fs_type, libc, mounts_under, rmtree, syncfs
from ..store import STORE_NAME, Store
from ..tree import FICLONE, TreeCopier, apply_meta, walk

EXCLUDE = frozenset({STORE_NAME.encode()})
# Views, and sandboxes over layers without trusted marks (made before them, or where this
# process cannot set trusted.* xattrs): the layers' own user.overlay.* flavour.
MOUNT_OPTIONS = ("userxattr", "index=off", "metacopy=off", "redirect_dir=nofollow")
# Sandboxes: trusted.overlay.* xattrs, because only without userxattr does the kernel allow
# redirect_dir=on, which lets a sandbox rename a directory that came from a snapshot
# (`git mv src pkg`) instead of failing with EXDEV.
SANDBOX_MOUNT_OPTIONS = ("index=off", "metacopy=off", "redirect_dir=on")
_KNOWN_OPTIONS = {MOUNT_OPTIONS, SANDBOX_MOUNT_OPTIONS}
MOUNT_SOURCE = "petri"
MOUNT_RECORD_VERSION = 1
DEFAULT_MAX_DEPTH = 32
# A sandbox's mount.json: version, snapshot, layers, upper, work, options, idmap (fuse: and
# backend, disk_budget).
MountRecord = dict[str, Any]
_ROOTLESS_WHY = ("needs root (rootless overlay exists only inside a user namespace, so it cannot "
                 "give a host-visible path: use fuse)")


# -- mounting (kernel) ------------------------------------------------------------------------

_SYS_move_mount, _SYS_fsopen, _SYS_fsconfig, _SYS_fsmount = 429, 430, 431, 432
_FSOPEN_CLOEXEC = 1
_FSCONFIG_SET_FLAG, _FSCONFIG_SET_STRING, _FSCONFIG_CMD_CREATE = 0, 1, 6
_FSMOUNT_CLOEXEC = 1
_MOUNT_ATTR_RDONLY, _MOUNT_ATTR_NOSUID, _MOUNT_ATTR_NODEV = 1, 2, 4
_MOVE_MOUNT_F_EMPTY_PATH = 4
_AT_FDCWD = -100
_MNT_DETACH = 2


def _fs_messages(fd: int) -> str:
    """What the filesystem said about a failed fsconfig (the new API's dmesg)."""
    out = []
    while True:
        try:
            msg = os.read(fd, 1024)
        except OSError:
            break
        if not msg:
            break
        out.append(msg.decode(errors="replace").strip())
    return "; ".join(out)


class _NoLowerdirPlus(Exception):
    pass


_parser: list[bool] = []


def _overlay_parses_its_options() -> bool:
    """Does overlayfs parse fsconfig keys itself (Linux 6.5+)? Before, the kernel's legacy
    adapter accepts any key and joins them into one option string that overlay reads only at
    FSCONFIG_CMD_CREATE: ``lowerdir+`` then fails there with a bare EINVAL and no message
    (seen on Debian 12's 6.1), so the fallback must be decided up front. Asked once per
    process, on a context of its own: a key nobody has is refused only by a real parser."""
    if not _parser:
        fd = _syscall(_SYS_fsopen, b"overlay", _FSOPEN_CLOEXEC)
        try:
            _syscall(_SYS_fsconfig, fd, _FSCONFIG_SET_STRING, b"petri-no-such-key", b"1", 0)
            _parser.append(False)
        except OSError:
            _parser.append(True)
        finally:
            os.close(fd)
    return _parser[0]


def _fsconfig_mount(target: bytes, lowers: Sequence[bytes], upper: bytes | None, work: bytes | None,
                    readonly: bool, options: Sequence[str]) -> None:
    mfd = _fsconfig_detached(lowers, upper, work, readonly, options)
    try:
        _syscall(_SYS_move_mount, mfd, b"", _AT_FDCWD, target, _MOVE_MOUNT_F_EMPTY_PATH)
    finally:
        os.close(mfd)


def _fsconfig_detached(lowers: Sequence[bytes], upper: bytes | None, work: bytes | None,
                       readonly: bool, options: Sequence[str]) -> int:
    """A new overlay mount that is attached nowhere (``fsmount`` without ``move_mount``): its
    fd, through which it is read; it goes when the fd is closed."""
    try:
        if not _overlay_parses_its_options():
            raise _NoLowerdirPlus()
        fd = _syscall(_SYS_fsopen, b"overlay", _FSOPEN_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ENOSYS:
            raise _NoLowerdirPlus() from e
        raise

    def cfg(cmd: int, key: bytes | None, value: bytes | None) -> None:
        try:
            _syscall(_SYS_fsconfig, fd, cmd, key, value, 0)
        except OSError as e:
            said = _fs_messages(fd)
            if key == b"lowerdir+" and e.errno == errno.EINVAL and "Unknown parameter" in said:
                raise _NoLowerdirPlus() from e
            raise OSError(e.errno, f"{e.strerror} ({said or 'no message'})") from None

    try:
        cfg(_FSCONFIG_SET_STRING, b"source", MOUNT_SOURCE.encode())
        for lower in lowers:
            cfg(_FSCONFIG_SET_STRING, b"lowerdir+", lower)
        if upper is not None:
            cfg(_FSCONFIG_SET_STRING, b"upperdir", upper)
            cfg(_FSCONFIG_SET_STRING, b"workdir", work)
        for opt in options:
            k, _, v = opt.partition("=")
            if v:
                cfg(_FSCONFIG_SET_STRING, k.encode(), v.encode())
            else:
                cfg(_FSCONFIG_SET_FLAG, k.encode(), None)
        cfg(_FSCONFIG_CMD_CREATE, None, None)
        # nosuid,nodev always: a sandbox can plant a setuid file or a device node in its tree.
        attrs = _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV | (_MOUNT_ATTR_RDONLY if readonly else 0)
        return _syscall(_SYS_fsmount, fd, _FSMOUNT_CLOEXEC, attrs)
    finally:
        os.close(fd)


_VIEW_DIR = "view"


def _detached_view(lowers: Sequence[bytes]) -> list[int]:
    """A read-only overlay of ``lowers`` that is attached nowhere the mount table shows: it is
    moved onto a directory of a detached tmpfs (Linux 6.15+ mounts on detached trees), so
    ``/proc/self/fd/<tmpfs fd>/view`` reaches it through a real directory as the last
    component (readers open roots with ``O_NOFOLLOW``, which a bare ``/proc/self/fd/N``
    magic link fails). The fds, container first; closing them unmounts both."""
    view = _fsconfig_detached(lowers, None, None, True, MOUNT_OPTIONS)
    fds = [view]
    try:
        cfd = _syscall(_SYS_fsopen, b"tmpfs", _FSOPEN_CLOEXEC)
        try:
            _syscall(_SYS_fsconfig, cfd, _FSCONFIG_SET_STRING, b"mode", b"0700", 0)
            _syscall(_SYS_fsconfig, cfd, _FSCONFIG_CMD_CREATE, None, None, 0)
            container = _syscall(_SYS_fsmount, cfd, _FSMOUNT_CLOEXEC, _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV)
        finally:
            os.close(cfd)
        fds.insert(0, container)
        os.mkdir(_VIEW_DIR, 0o700, dir_fd=container)
        _syscall(_SYS_move_mount, view, b"", container, _VIEW_DIR.encode(), _MOVE_MOUNT_F_EMPTY_PATH)
        return fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def _legacy_mount(target: bytes, lowers: Sequence[bytes], upper: bytes | None, work: bytes | None,
                  readonly: bool, cwd: bytes, options: Sequence[str]) -> None:
    """mount(8) with paths relative to ``cwd`` (run in a child, so this process's cwd never
    moves under its other threads): keeps the option string inside one page."""
    def rel(p: bytes) -> bytes:
        r = os.path.relpath(p, cwd)
        for bad in (b",", b":", b"\\"):
            if bad in r:
                raise OverlayMountFailed(target=os.fsdecode(target), why=f"path {os.fsdecode(r)!r} holds {bad!r}")
        return r

    opts = [b"lowerdir=" + b":".join(rel(p) for p in lowers)]
    if upper is not None:
        assert work is not None  # an upper dir always comes with its work dir
        opts += [b"upperdir=" + rel(upper), b"workdir=" + rel(work)]
    opts += [o.encode() for o in options] + [b"nosuid", b"nodev"]
    if readonly:
        opts.append(b"ro")
    data = b",".join(opts)
    if len(data) >= 4096:
        raise OverlayMountFailed(target=os.fsdecode(target), why="too many layers for one mount option page")
    r = subprocess.run([b"mount", b"-t", b"overlay", MOUNT_SOURCE.encode(), b"-o", data, target],
                       cwd=cwd, capture_output=True)
    if r.returncode != 0:
        raise OSError(errno.EINVAL, r.stderr.decode(errors="replace").strip())


def mount_overlay(target: bytes, lowers: Sequence[bytes], upper: bytes | None = None,
                  work: bytes | None = None, *, readonly: bool = False, cwd: bytes = b"/",
                  legacy: bool = False, options: Sequence[str] = MOUNT_OPTIONS) -> None:
    """Mount overlay at ``target`` with ``lowers`` TOP FIRST (at least two without an upper).

    ``legacy`` forces the mount(8) path (tests); it is also taken when the kernel has no
    ``lowerdir+``."""
    try:
        if not legacy:
            try:
                _fsconfig_mount(target, lowers, upper, work, readonly, options)
                return
            except _NoLowerdirPlus:
                pass
        _legacy_mount(target, lowers, upper, work, readonly, cwd, options)
    except OSError as e:
        raise OverlayMountFailed(target=os.fsdecode(target), why=e.strerror or str(e)) from e


def umount(target: bytes) -> None:
    """Unmount; lazily if busy (processes still inside). Not mounted is not an error."""
    if libc.umount2(target, 0) == 0:
        return
    e = ctypes.get_errno()
    if e in (errno.EINVAL, errno.ENOENT):
        return
    if e == errno.EBUSY and libc.umount2(target, _MNT_DETACH) == 0:
        return
    e = ctypes.get_errno() if e == errno.EBUSY else e
    raise SnapshotError(detail=f"cannot unmount {os.fsdecode(target)}: {os.strerror(e)}")


def overlay_mounts_under(root: bytes) -> list[bytes]:
    return [m.mountpoint for m in mounts_under(root, lambda t: t == "overlay")]


OVERLAYFS_SUPER_MAGIC = 0x794C7630


def is_overlay_mounted(path: bytes) -> bool:
    """Is an overlay mounted at ``path``? Its filesystem's magic and a device other than its
    parent's: O(1), where reading the mount table was O(mounts) for every sandbox of a
    listing (``ensure_clone``), so O(sandboxes^2) for ``petri ls``."""
    try:
        here = os.stat(path)
        parent = os.stat(os.path.join(path, b".."))
        return here.st_dev != parent.st_dev and fs_magic(path) == OVERLAYFS_SUPER_MAGIC
    except OSError:
        return False


# -- the backend --------------------------------------------------------------------------------


class OverlayBackend(Backend):
    name: ClassVar[str] = "overlay"
    instant: ClassVar[bool] = False

    def __init__(self, workers: int = 8, max_depth: int = DEFAULT_MAX_DEPTH, legacy_mount: bool = False) -> None:
        self.workers = workers
        self.max_depth = max_depth
        self.legacy_mount = legacy_mount
        self._reflink: dict[int, bool] = {}
        self._trusted: dict[int, bool] = {}
        self._marking = threading.Lock()

    # -- availability --------------------------------------------------------------------------
    @staticmethod
    def available(workspace: Path) -> tuple[bool, str]:
        """Can this process host ``workspace`` with overlay? (ok, why)"""
        if os.geteuid() != 0:
            return False, _ROOTLESS_WHY
        try:
            fstype = fs_type(workspace)
        except OSError as e:
            return False, f"cannot stat the workspace's filesystem: {e.strerror}"
        if fstype in ("overlayfs", "fuse", "nfs"):
            return False, f"the workspace is on {fstype}, which cannot hold an overlay upper dir"
        try:
            fd = _syscall(_SYS_fsopen, b"overlay", _FSOPEN_CLOEXEC)
            os.close(fd)
        except OSError as e:
            if e.errno == errno.ENODEV:
                return False, "the kernel has no overlayfs (modprobe overlay)"
            if e.errno != errno.ENOSYS:
                return False, f"cannot open overlayfs: {e.strerror}"
        ok, why = _probe_user_xattr(workspace)
        if not ok:
            return False, why
        return True, ("layered overlay snapshots (the first copies the tree, later ones only what "
                      "changed); clones are kernel overlay mounts, O(1)")

    def _reflink_ok(self, store: Store) -> bool:
        dev = os.stat(store.root).st_dev
        if dev not in self._reflink:
            self._reflink[dev] = _probe_reflink(store.tmp)
        return self._reflink[dev]

    def _trusted_ok(self, store: Store) -> bool:
        """Can this process write trusted.* xattrs in the store (root, outside a user
        namespace, on a filesystem that has them)?"""
        if os.geteuid() != 0:
            return False
        dev = os.stat(store.root).st_dev
        if dev not in self._trusted:
            self._trusted[dev] = _probe_trusted_xattr(store.tmp)
        return self._trusted[dev]

    def _trusted_marks(self, store: Store, snap_id: str) -> bool:
        """Do the snapshot's layers carry trusted opaque marks? Layers made before petri
        wrote them get them now (once per snapshot; adding an xattr changes nothing for
        the mounts already using them, which read only user.overlay.*)."""
        listing = self._snap_file(store, snap_id, "layers.json")
        if L.layer_list_trusted(listing):
            return True
        if not self._trusted_ok(store):
            return False
        with self._marking:  # the clones of one fork run in threads: mark once
            if L.layer_list_trusted(listing):
                return True
            names = self.layers_of(store, snap_id)
            try:
                for layer in self._layer_paths(store, names):
                    L.add_trusted_marks(layer)
            except OSError:
                return False
            L.write_layer_list(listing, names, trusted_marks=True)
        return True

    # -- store ------------------------------------------------------------------------------
    def create_store(self, store: Store) -> None:
        store.root.mkdir(exist_ok=True)
        store.make_dirs()

    def destroy_store(self, store: Store) -> None:
        """Unmount every overlay left in the store (deepest first), then remove it; never
        removes through a mount (that would write whiteouts, or worse, into a layer)."""
        root = bytes(store.root)
        for mp in sorted(overlay_mounts_under(root), key=len, reverse=True):
            umount(mp)
        _refuse_if_mounts_under(root)
        rmtree(root)

    def _snap_file(self, store: Store, snap_id: str, name: str) -> Path:
        return store.snapshot_dir(snap_id) / name

    def layers_of(self, store: Store, snap_id: str) -> list[str]:
        """The snapshot's layer names, lowest first."""
        try:
            return L.read_layer_list(self._snap_file(store, snap_id, "layers.json"))
        except FileNotFoundError:
            raise SnapshotError(detail=f"snapshot {snap_id} has no layer list on disk") from None

    def _layer_paths(self, store: Store, names: Sequence[str]) -> list[bytes]:
        """Absolute layer paths TOP FIRST, as lowerdir wants them; each must exist."""
        out = []
        for n in reversed(names):
            p = os.path.join(bytes(store.layers), n.encode())
            if not os.path.isdir(p):
                raise SnapshotError(detail=f"layer {n} is missing from {store.layers}")
            out.append(p)
        return out

    # -- snapshots --------------------------------------------------------------------------
    def _plan(self, store: Store, parent: str | None) -> tuple[L.Scan, L.DeltaPlan, dict[bytes, L.Key]]:
        old = L.load_stat_cache(self._snap_file(store, parent, "statcache")) if parent else {}
        scan = L.scan_tree(bytes(store.workspace), EXCLUDE)
        plan = L.plan_delta(old, scan.keys(), old.get(b""), scan.root_key())
        return scan, plan, old

    def estimate_bytes(self, store: Store, parent: str | None) -> int:
        return self._plan(store, parent)[1].bytes

    def snapshot(self, store: Store, snap_id: str, parent: str | None,
                 progress: Progress | None = None) -> SnapshotResult:
        snap_dir = store.snapshot_dir(snap_id)
        if (snap_dir / "layers.json").exists():
            raise SnapshotError(detail=f"snapshot {snap_id} already exists")
        parent_layers = self.layers_of(store, parent) if parent else []
        # Opaque marks in both namespaces when we can (see snapshot.layers); the parent's
        # layers get theirs first if they were made without.
        trusted = self._trusted_ok(store) and (parent is None or self._trusted_marks(store, parent))
        scan, plan, _ = self._plan(store, parent)
        installed: list[str] = []
        staging: list[Path] = []
        made_dir = False
        result: L.BuildResult | None = None
        try:
            if parent is not None and plan.empty:
                names = parent_layers  # nothing moved: share the parent's stack as is
            else:
                built = store.tmp_path("layer")
                staging.append(built)
                result = L.build_layer(bytes(store.workspace), bytes(built), plan, scan,
                                       reflink=self._reflink_ok(store), progress=progress,
                                       workers=self.workers, trusted_marks=trusted)
                installed.append(L.install_layer(bytes(store.layers), bytes(built)))
                names = parent_layers + installed
            if len(names) > self.max_depth:
                names = [self._compact(store, names, installed, staging)]
                trusted = True  # one full layer: nothing below it to hide
            if installed:
                syncfs(store.layers)
            if not snap_dir.exists():
                snap_dir.mkdir(parents=True)
                made_dir = True
            atomic_write(snap_dir / "statcache", L.dump_stat_cache(L.next_cache(scan, result)))
            L.write_layer_list(snap_dir / "layers.json", names, trusted_marks=trusted)  # the commit point
        except BaseException:
            if made_dir:
                rmtree(bytes(snap_dir))
            else:
                for f in ("statcache", "layers.json"):
                    with contextlib.suppress(FileNotFoundError):
                        (snap_dir / f).unlink()
            for p in staging:
                rmtree(bytes(p))
            for n in installed:
                rmtree(os.path.join(bytes(store.layers), n.encode()))
            raise
        return SnapshotResult(bytes_copied=result.bytes_copied if result else 0)

    def snapshot_sandbox(self, store: Store, sb_id: str, snap_id: str, parent: str) -> SnapshotResult:
        """A new layer made of the sandbox's upper dir, stacked on the layers the sandbox is
        mounted over: O(what the sandbox wrote). The copy is taken as the frozen view's is
        (per file); then made canonical: directories the kernel renamed (redirects) become
        opaque full copies read through a kernel view, opaque marks go into both xattr
        namespaces, and the kernel's other bookkeeping is dropped."""
        rec = self._record(store, sb_id)
        names = [str(n) for n in rec["layers"]]
        upper = store.sandbox_dir(sb_id) / rec["upper"]
        snap_dir = store.snapshot_dir(snap_id)
        if (snap_dir / "layers.json").exists():
            raise SnapshotError(detail=f"snapshot {snap_id} already exists")
        trusted = self._trusted_ok(store) and self._trusted_marks(store, parent)
        built = store.tmp_path("layer")
        staging: list[Path] = [built]
        installed: list[str] = []
        made_dir = False
        try:
            copied = L.copy_layer(bytes(upper), bytes(built), reflink=self._reflink_ok(store))
            redirects = L.redirected_dirs(bytes(built))
            if redirects:
                self._resolve_redirects(store, built, names, rec, redirects, trusted, staging)
            L.canonical_marks(bytes(built), trusted=trusted)
            installed.append(L.install_layer(bytes(store.layers), bytes(built)))
            new_names = names + installed
            if len(new_names) > self.max_depth:
                new_names = [self._compact(store, new_names, installed, staging)]
                trusted = True  # one full layer: nothing below it to hide
            syncfs(store.layers)
            snap_dir.mkdir(parents=True)
            made_dir = True
            L.write_layer_list(snap_dir / "layers.json", new_names, trusted_marks=trusted)  # the commit point
        except BaseException:
            if made_dir:
                rmtree(bytes(snap_dir))
            for p in staging:
                rmtree(bytes(p))
            for n in installed:
                rmtree(os.path.join(bytes(store.layers), n.encode()))
            raise
        for p in staging:  # the installed layer was renamed away; scratch views are left
            rmtree(bytes(p))
        return SnapshotResult(bytes_copied=copied)

    def _resolve_redirects(self, store: Store, built: Path, names: list[str], rec: MountRecord, redirects: list[bytes],
                           trusted: bool, staging: list[Path]) -> None:
        """Replace each renamed directory of the copied upper by a full copy of what it shows
        (only the kernel can follow a redirect): read through a read-only mount of the copy
        over the sandbox's layers, with the sandbox's own options."""

        work = store.tmp_path(f"redirects-{built.name}")
        staging.append(work)
        mnt = work / "view"
        mnt.mkdir(parents=True)
        copies: list[tuple[bytes, bytes]] = []
        self._mount(store, bytes(mnt), [bytes(built)] + self._layer_paths(store, names), readonly=True,
                    options=self._options(rec))
        try:
            for i, rel in enumerate(redirects):
                src = os.path.join(bytes(mnt), rel)
                dst = os.path.join(bytes(work), b"%d" % i)
                os.mkdir(dst, 0o700)
                TreeCopier(reflink=self._reflink_ok(store), workers=self.workers).copy(src, dst)
                L.copy_plain_xattrs(src, dst)
                apply_meta(dst, os.lstat(src))
                copies.append((rel, dst))
        finally:
            umount(bytes(mnt))
        for rel, dst in copies:  # the copy is no lowerdir any more: now it may change
            L.replace_with_opaque_copy(bytes(built), rel, dst, trusted=trusted)

    def import_snapshot(self, store: Store, snap_id: str, layer_names: list[str]) -> None:
        """A snapshot whose layers came from elsewhere (``orchestrator.cluster``): its stat
        cache is empty, as there is no live tree behind it here (a snapshot of this store's
        live tree taken after it would copy everything, which is right)."""
        snap_dir = store.snapshot_dir(snap_id)
        if (snap_dir / "layers.json").exists():
            raise SnapshotError(detail=f"snapshot {snap_id} already exists")
        for n in layer_names:
            if not L._is_layer_name(n) or not (store.layers / n).is_dir():
                raise SnapshotError(detail=f"layer {n!r} is not installed in {store.layers}")
        snap_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(snap_dir / "statcache", L.dump_stat_cache({}))
        L.write_layer_list(snap_dir / "layers.json", layer_names)  # the commit point

    def _compact(self, store: Store, names: list[str], installed: list[str], staging: list[Path]) -> str:
        built = store.tmp_path("compact")
        staging.append(built)
        L.compact_layers(self._layer_paths(store, names), bytes(built), reflink=self._reflink_ok(store))
        name = L.install_layer(bytes(store.layers), bytes(built))
        # The delta made a moment ago is now named by nobody: drop it.
        for n in list(installed):
            rmtree(os.path.join(bytes(store.layers), n.encode()))
            installed.remove(n)
        installed.append(name)
        return name

    def _used_layers(self, store: Store, skip_snapshot: str | None = None,
                     snapshots: set[str] | None = None, sandboxes: set[str] | None = None,
                     count_sandboxes: bool = True) -> set[str]:
        """Layer names some snapshot (all on disk, or only ``snapshots``) or sandbox lists."""
        used: set[str] = set()
        if store.snapshots.is_dir():
            for d in store.snapshots.iterdir():
                if d.name == skip_snapshot or (snapshots is not None and d.name not in snapshots):
                    continue
                with contextlib.suppress(FileNotFoundError, ValueError, SnapshotError):
                    used.update(L.read_layer_list(d / "layers.json"))
        if count_sandboxes and store.sandboxes.is_dir():
            for d in store.sandboxes.iterdir():
                if sandboxes is not None and d.name not in sandboxes:
                    continue
                with contextlib.suppress(FileNotFoundError, ValueError, KeyError):
                    used.update(json.loads((d / "mount.json").read_text())["layers"])
        return used

    def delete_snapshot(self, store: Store, snap_id: str) -> None:
        snap_dir = store.snapshot_dir(snap_id)
        try:
            mine = L.read_layer_list(snap_dir / "layers.json")
        except (FileNotFoundError, ValueError, SnapshotError):
            mine = []
        if snap_dir.exists():
            store.tmp.mkdir(parents=True, exist_ok=True)
            doomed = store.tmp_path(f"del-{snap_id}")
            os.rename(snap_dir, doomed)  # gone in one step; the rest is cleanup
            rmtree(bytes(doomed))
        used = self._used_layers(store)
        for n in mine:
            if n not in used:
                self._remove_layer(store, n)

    def _remove_layer(self, store: Store, name: str) -> None:
        path = store.layers / name
        if not path.exists():
            return
        doomed = store.tmp_path(f"del-layer-{name}")
        os.rename(path, doomed)
        rmtree(bytes(doomed))

    @contextlib.contextmanager
    def snapshot_view(self, store: Store, snap_id: str) -> Iterator[Path]:
        lowers = self._layer_paths(store, self.layers_of(store, snap_id))
        work = store.tmp_path(f"view-{snap_id}")
        mnt = work / "view"
        try:
            mnt.mkdir(parents=True)
            if len(lowers) == 1:
                # overlay wants two lowers without an upper: an empty one changes nothing.
                (work / "empty").mkdir()
                lowers.append(bytes(work / "empty"))
            self._mount(store, bytes(mnt), lowers, readonly=True)
            try:
                yield mnt
            finally:
                umount(bytes(mnt))
        finally:
            if not is_overlay_mounted(bytes(mnt)):
                rmtree(bytes(work))

    def read_view(self, store: Store, snap_id: str) -> contextlib.AbstractContextManager[Path]:
        """The snapshot without a mount in the store or the mount table: its layer itself when
        it is one (a first or compacted layer: no whiteouts, no opaque marks), else a detached
        read-only overlay read through its fd (root, Linux 6.8+); else ``snapshot_view``."""
        lowers = self._layer_paths(store, self.layers_of(store, snap_id))
        return self._layers_view(lowers, lambda: self.snapshot_view(store, snap_id))

    def quiet_view(self, store: Store, sb_id: str) -> contextlib.AbstractContextManager[Path]:
        """Where the sandbox's mount records reads (``quiet_layers``: fuse), a detached
        read-only overlay of its upper and layers; else the mount itself (kernel overlay
        records nothing)."""
        layers = self.quiet_layers(store, sb_id)
        if layers is None:
            return contextlib.nullcontext(self.ensure_clone(store, sb_id))
        return self._layers_view(layers, lambda: contextlib.nullcontext(self.ensure_clone(store, sb_id)))

    @contextlib.contextmanager
    def _layers_view(self, layers: list[bytes],
                     fallback: Callable[[], contextlib.AbstractContextManager[Path]]) -> Iterator[Path]:
        if len(layers) == 1:
            yield Path(os.fsdecode(layers[0]))
            return
        fds: list[int] = []
        if os.geteuid() == 0 and not self.legacy_mount:
            try:
                fds = _detached_view(layers)
            except (_NoLowerdirPlus, OSError):
                fds = []  # an older kernel, or layers the kernel refuses: the fallback's view
        if not fds:
            with fallback() as view:
                yield view
            return
        try:
            yield Path(f"/proc/self/fd/{fds[0]}/{_VIEW_DIR}")
        finally:
            for fd in fds:
                os.close(fd)

    def snapshot_bytes(self, store: Store, snap_id: str) -> int | None:
        mine = self.layers_of(store, snap_id)
        # Sandboxes stacked on this snapshot do not make its layers anyone else's.
        others = self._used_layers(store, skip_snapshot=snap_id, count_sandboxes=False)
        alone = [bytes(store.layers / n) for n in mine if n not in others]
        # Count an inode only when all its links are in these layers (compaction links files).
        seen: dict[tuple[int, int], list[Any]] = {}
        for layer in alone:
            for _, st in _walk_all(layer):
                if stat.S_ISREG(st.st_mode):
                    ent = seen.setdefault((st.st_dev, st.st_ino), [0, st])
                    ent[0] += 1
        return int(sum(st.st_blocks * 512 for n, st in seen.values() if n >= st.st_nlink))

    # -- sandboxes --------------------------------------------------------------------------
    def _mount(self, store: Store, target: bytes, lowers: Sequence[bytes], upper: bytes | None = None,
               work: bytes | None = None, readonly: bool = False,
               options: Sequence[str] = MOUNT_OPTIONS) -> None:
        mount_overlay(target, lowers, upper, work, readonly=readonly, cwd=bytes(store.root),
                      legacy=self.legacy_mount, options=options)

    @staticmethod
    def _options(rec: MountRecord) -> tuple[str, ...]:
        """The options a sandbox's upper was made under: it must always be mounted with them
        (its opaque marks and redirects are in that flavour's xattr namespace)."""
        opts = tuple(rec.get("options", MOUNT_OPTIONS))
        if opts not in _KNOWN_OPTIONS:
            raise SnapshotError(detail=f"unknown overlay mount options in the mount record: {','.join(opts)}")
        return opts

    def clone(self, store: Store, snap_id: str, sb_id: str, *, disk_budget: int | None = None,
              idmap: IdMap | None = None) -> Path:
        refuse_clone_options(self.name, disk_budget, None)
        names = self.layers_of(store, snap_id)
        lowers = self._layer_paths(store, names)
        sb = store.sandbox_dir(sb_id)
        tree = store.sandbox_tree(sb_id)
        if sb.exists():
            raise SnapshotError(detail=f"sandbox {sb_id} already exists at {sb}")
        try:
            sb.mkdir(parents=True)
            for d in ("upper", "work", "tree"):
                (sb / d).mkdir()
            # The merged root's owner, mode and times are the upper dir's: give it the snapshot's.
            apply_meta(bytes(sb / "upper"), os.lstat(lowers[0]))
            options = SANDBOX_MOUNT_OPTIONS if self._trusted_marks(store, snap_id) else MOUNT_OPTIONS
            record = {"version": MOUNT_RECORD_VERSION, "snapshot": snap_id, "layers": names,
                      "upper": "upper", "work": "work", "options": list(options), "idmap": _idmap_json(idmap)}
            atomic_write(sb / "mount.json", json.dumps(record).encode() + b"\n")
            self._mount_sandbox(store, sb_id, record)
        except BaseException:
            if is_overlay_mounted(bytes(tree)):
                umount(bytes(tree))
            rmtree(bytes(sb))
            raise
        return tree

    def _mount_sandbox(self, store: Store, sb_id: str, rec: MountRecord) -> None:
        """Mount the sandbox as its record says: over idmapped layers when it names an id map."""
        sb = store.sandbox_dir(sb_id)
        tree = bytes(store.sandbox_tree(sb_id))
        lowers = self._layer_paths(store, rec["layers"])
        idmap = _idmap_of(rec)
        if idmap is None:
            self._mount(store, tree, lowers, bytes(sb / rec["upper"]), bytes(sb / rec["work"]),
                        options=self._options(rec))
            return
        # overlayfs itself cannot be idmapped; its layers can. Detached idmapped copies of
        # layers/ and of the sandbox dir (upper and work must share one mount) are named by
        # /proc/self/fd paths, and the mount is made by a thread whose fsuid is the mapped
        # account: overlay does its upper-dir work (copy-up, whiteouts, work dir) with the
        # mounter's credentials, which the idmapped upper turns into root on disk.
        lfd = I.open_clone(store.layers, idmap)
        try:
            sfd = I.open_clone(sb, idmap)
            try:
                names = [os.path.basename(p) for p in lowers]
                mapped = [b"/proc/self/fd/%d/%s" % (lfd, n) for n in names]
                up = b"/proc/self/fd/%d/%s" % (sfd, rec["upper"].encode())
                wk = b"/proc/self/fd/%d/%s" % (sfd, rec["work"].encode())

                def mount() -> None:
                    try:
                        _fsconfig_mount(tree, mapped, up, wk, False, self._options(rec))
                    except _NoLowerdirPlus:
                        raise OverlayMountFailed(target=os.fsdecode(tree),
                                                 why="this kernel cannot mount overlay over idmapped layers "
                                                     "(needs the new mount API with lowerdir+, Linux 6.8+)") from None
                    except OSError as e:
                        raise OverlayMountFailed(target=os.fsdecode(tree), why=e.strerror or str(e)) from e

                I.as_fs_user(idmap.uid, idmap.gid, mount)
            finally:
                os.close(sfd)
        finally:
            os.close(lfd)

    def mounts_map_owners(self) -> bool:
        return True

    def map_owners(self, store: Store, sb_id: str, idmap: IdMap) -> None:
        rec = self._record(store, sb_id)
        if _idmap_of(rec) == idmap:
            return
        # A sandbox mounted without the map (made before petri mapped owners): it must come
        # off for good before it goes on again, or two overlays would share one upper.
        tree = bytes(store.sandbox_tree(sb_id))
        while is_overlay_mounted(tree):
            if libc.umount2(tree, 0) != 0:
                e = ctypes.get_errno()
                raise SnapshotError(detail=f"sandbox {sb_id} must be mounted again with mapped owners, but its tree "
                                           f"is in use ({os.strerror(e)}): close what uses "
                                           f"{os.fsdecode(tree)} (a shell, an editor) and retry")
        rec["idmap"] = _idmap_json(idmap)
        atomic_write(store.sandbox_dir(sb_id) / "mount.json", json.dumps(rec).encode() + b"\n")
        self._mount_sandbox(store, sb_id, rec)

    def _record(self, store: Store, sb_id: str) -> MountRecord:
        try:
            rec: MountRecord = json.loads((store.sandbox_dir(sb_id) / "mount.json").read_text())
        except FileNotFoundError:
            raise SnapshotError(detail=f"sandbox {sb_id} has no mount record on disk") from None
        if rec.get("version") != MOUNT_RECORD_VERSION:
            raise SnapshotError(detail=f"sandbox {sb_id}: unknown mount record version {rec.get('version')!r}")
        return rec

    def clone_usage(self, store: Store, sb_id: str, since: float | None = None) -> DiskUsage | None:
        """What the sandbox wrote: its upper dir's files (O(upper), not O(tree))."""
        upper = store.sandbox_dir(sb_id) / self._record(store, sb_id)["upper"]
        return DiskUsage(L.upper_bytes(bytes(upper)), "upper")

    # -- change sets and staleness ------------------------------------------------------------
    def change_candidates(self, store: Store, sb_id: str, cloned_from: str, since: str,
                          base: Path | None = None, tree: Path | None = None) -> Candidates:
        """The sandbox's upper dir (for a frozen view: the copy of it the view was built
        from, ``<view>/../upper``), widened by the layers between ``since`` and
        ``cloned_from`` for a fork of a fork."""
        try:
            frozen = self._frozen_upper(store, tree)
            own = upper_candidates(frozen, base, tree) if frozen is not None else \
                self._recorded_candidates(store, sb_id, base, tree)
        except (OSError, KeyError, ValueError):
            return FULL
        return self._widen(store, own, cloned_from, since)

    @staticmethod
    def _frozen_upper(store: Store, tree: Path | None) -> Path | None:
        """The copied upper beside a frozen view (``frozen_view``'s layout), if ``tree`` is one."""
        if tree is None or tree.name != "view" or store.tmp not in tree.parents:
            return None
        upper = tree.parent / "upper"
        return upper if upper.is_dir() else None

    def _recorded_candidates(self, store: Store, sb_id: str, base: Path | None, tree: Path | None) -> Candidates:
        rec = self._record(store, sb_id)
        # Without trees to read (staleness), copied-up directories are pruned against the
        # layers the sandbox is mounted on, read straight from them.
        lowers = self._layer_paths(store, rec["layers"]) if base is None or tree is None else None
        return upper_candidates(store.sandbox_dir(sb_id) / rec["upper"], base, tree, lowers)

    def _widen(self, store: Store, cands: Candidates, cloned_from: str, since: str) -> Candidates:
        """``cands`` plus what the layers between ``since`` and ``cloned_from`` hold (what the
        sandbox's ancestors changed), so the set covers every difference from ``since``."""
        if cands.paths is None or since == cloned_from:
            return cands
        mine = self.layers_of(store, cloned_from)
        theirs = self.layers_of(store, since)
        if mine[:len(theirs)] != theirs:
            return FULL  # compacted: no layer says what the ancestors changed
        extra: set[bytes] = set()
        for n in mine[len(theirs):]:
            layer = os.path.join(os.fsencode(store.layers), n.encode())
            extra.update(rel for rel, _kind, _st in L.layer_entries(layer))
        return Candidates(frozenset(cands.paths | extra), cands.source + "+lineage")

    def live_record(self, store: Store, snap_id: str, taken_at: float) -> tuple[StatKeys, dict[bytes, Any]] | None:
        """The snapshot's stat cache of live (racy entries carry an impossible size: they never match)."""
        keys = L.load_stat_cache(store.snapshot_dir(snap_id) / "statcache")
        return keys, dict(keys)

    def snapshot_layers(self, store: Store, snap_id: str) -> list[bytes] | None:
        return self._layer_paths(store, self.layers_of(store, snap_id))

    def ensure_clone(self, store: Store, sb_id: str) -> Path:
        tree = store.sandbox_tree(sb_id)
        if is_overlay_mounted(bytes(tree)):
            return tree
        rec = self._record(store, sb_id)
        tree.mkdir(exist_ok=True)
        self._mount_sandbox(store, sb_id, rec)
        return tree

    @contextlib.contextmanager
    def frozen_view(self, store: Store, sb_id: str) -> Iterator[Path]:
        rec = self._record(store, sb_id)
        lowers = self._layer_paths(store, rec["layers"])
        upper = store.sandbox_dir(sb_id) / rec["upper"]
        work = store.tmp_path(f"frozen-{sb_id}")
        mnt = work / "view"
        try:
            work.mkdir(parents=True)
            # O(upper): the sandbox keeps writing its upper; a copy of it is a stable top layer.
            L.copy_layer(bytes(upper), bytes(work / "upper"), reflink=self._reflink_ok(store))
            mnt.mkdir()
            # The copy keeps the upper's xattrs (redirects too): mount it the way the sandbox is.
            self._mount(store, bytes(mnt), [bytes(work / "upper")] + lowers, readonly=True,
                        options=self._options(rec))
            try:
                yield mnt
            finally:
                umount(bytes(mnt))
        finally:
            if not is_overlay_mounted(bytes(mnt)):
                rmtree(bytes(work))

    def destroy_clone(self, store: Store, sb_id: str) -> None:
        sb = store.sandbox_dir(sb_id)
        tree = bytes(store.sandbox_tree(sb_id))
        while is_overlay_mounted(tree):  # stacked mounts (a double ensure) come off one by one
            umount(tree)
        if not sb.exists():
            return
        _refuse_if_mounts_under(bytes(sb))
        doomed = store.tmp_path(f"del-{sb_id}")
        os.rename(sb, doomed)
        rmtree(bytes(doomed))

    # -- gc ---------------------------------------------------------------------------------
    def leftovers(self, store: Store, snapshots: set[str], sandboxes: set[str]) -> list[Leftover]:
        found: list[Leftover] = []
        root = bytes(store.root)
        known_trees = {os.path.realpath(bytes(store.sandbox_tree(s))) for s in sandboxes}
        for mp in overlay_mounts_under(root):
            if mp not in known_trees:
                found.append(Leftover("mount", Path(os.fsdecode(mp))))
        if store.sandboxes.is_dir():
            found.extend(Leftover("tree", p) for p in sorted(store.sandboxes.iterdir()) if p.name not in sandboxes)
        if store.snapshots.is_dir():
            found.extend(Leftover("snapshot", p) for p in sorted(store.snapshots.iterdir())
                         if p.name not in snapshots)
        used = self._used_layers(store, snapshots=snapshots, sandboxes=sandboxes)
        if store.layers.is_dir():
            found.extend(Leftover("layer", p) for p in sorted(store.layers.iterdir()) if p.name not in used)
        if store.tmp.is_dir():
            found.extend(Leftover("tree", p) for p in sorted(store.tmp.iterdir()))
        return found

    def remove_leftover(self, store: Store, leftover: Leftover) -> None:
        """Undo one leftover: unmount a mount (and what is stacked on it), remove anything else."""
        path = os.fsencode(leftover.path)
        if leftover.kind == "mount":
            while is_overlay_mounted(path):
                umount(path)
            return
        for mp in sorted(overlay_mounts_under(path), key=len, reverse=True):
            umount(mp)
        _refuse_if_mounts_under(path)
        rmtree(path)


# -- helpers ------------------------------------------------------------------------------------


def upper_candidates(upper: Path, base: Path | None, tree: Path | None,
                     lowers: list[bytes] | None = None) -> Candidates:
    """What an upper dir (or a layer) says may differ: its entries, whiteouts, opaque and
    renamed directories as whole subtrees; directories only copied up dropped where both
    trees are given (``snapshot.candidates.prune_dirs``), or else where ``lowers`` (the
    layers beneath the upper, top first) hold a directory with the same bits there."""
    plain: set[bytes] = set()
    whole: set[bytes] = set()
    for rel, kind, st in L.layer_entries(os.fsencode(upper)):
        if kind in ("opaque_dir", "redirect_dir", "whiteout"):
            whole.add(rel)
        elif lowers is not None and stat.S_ISDIR(st.st_mode) and _lower_dir_bits(lowers, rel) == \
                stat.S_IMODE(st.st_mode):
            continue  # copied up: its changed children are entries of their own
        else:
            plain.add(rel)
    return Candidates(frozenset(prune_dirs(base, tree, plain) | whole), "upper")


def _lower_dir_bits(lowers: list[bytes], rel: bytes) -> int | None:
    found = L.layer_lookup(lowers, rel)
    if found is None:
        return None
    st = os.lstat(found)
    return stat.S_IMODE(st.st_mode) if stat.S_ISDIR(st.st_mode) else None


def _idmap_json(idmap: IdMap | None) -> list[int] | None:
    return None if idmap is None else [idmap.uid, idmap.gid]


def _idmap_of(rec: MountRecord) -> IdMap | None:
    """The id map a mount record names (None: owners as on disk)."""
    m = rec.get("idmap")
    return None if not m else IdMap(int(m[0]), int(m[1]))


def _walk_all(root: bytes) -> Iterator[tuple[bytes, os.stat_result]]:
    return walk(root)


def _refuse_if_mounts_under(path: bytes) -> None:
    for m in mounts_under(path):
        raise SnapshotError(detail=f"{os.fsdecode(m.mountpoint)} ({m.fstype}) is still mounted under "
                                   f"{os.fsdecode(os.path.realpath(path))}; unmount it first")


def _probe_user_xattr(workspace: Path) -> tuple[bool, str]:
    """user.* xattrs (opaque directories) on the workspace's filesystem, leaving no file behind."""
    try:
        fd = os.open(workspace, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
    except OSError as e:
        if e.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
            return False, f"cannot write in the workspace: {e.strerror}"
        return True, "no O_TMPFILE to probe user xattrs with; assuming they work"
    try:
        os.setxattr(fd, "user.petri.probe", b"1")
    except OSError as e:
        return False, f"the workspace's filesystem lacks user xattrs ({e.strerror}), which opaque directories need"
    finally:
        os.close(fd)
    return True, ""


def _probe_trusted_xattr(tmp: Path) -> bool:
    """Can a trusted.* xattr be set in ``tmp`` (root in the initial user namespace, and a
    filesystem that keeps them)? Leaves no file behind."""
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(tmp, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
    except OSError:
        return False
    try:
        os.setxattr(fd, "trusted.petri.probe", b"1")
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _probe_reflink(tmp: Path) -> bool:
    tmp.mkdir(parents=True, exist_ok=True)
    a = tmp / f"reflink-probe.{os.getpid()}.{os.urandom(3).hex()}"
    b = a.with_suffix(".b")
    try:
        with open(a, "wb") as fa:
            fa.write(b"x")
        with open(a, "rb") as fa, open(b, "wb") as fb:
            fcntl.ioctl(fb.fileno(), FICLONE, fa.fileno())
        return True
    except OSError:
        return False
    finally:
        for p in (a, b):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
