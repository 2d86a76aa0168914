"""The ``btrfs`` backend: subvolume snapshots, O(1) and atomic, through libbtrfsutil.

The workspace is a subvolume; the store ``.petri`` is a nested subvolume inside it, so a
snapshot of the workspace stops at the store (a snapshot never descends into nested
subvolumes). A snapshot is a read-only snapshot of the workspace at
``snapshots/<id>/tree``; a sandbox is a writable snapshot of a snapshot at
``sandboxes/<id>/tree``. Both are made in ``tmp/`` inside a plain staging directory and
renamed into place, so a name under ``snapshots/`` or ``sandboxes/`` is always whole;
the orchestrator's registry row is the commit point and ``gc`` removes the rest.

Rootless: creating subvolumes and snapshotting a subvolume one owns works for a normal
user; deleting a subvolume needs root or the ``user_subvol_rm_allowed`` mount option.
Without either, deletion falls back to: clear the read-only flag (the owner may), empty
the tree, ``rmdir`` it (the kernel deletes an empty subvolume on rmdir since 4.18).

Also here: ``convert_to_subvolume`` for ``petri init --convert`` and ``check_btrfs`` for
the backend chooser.

Change sets and staleness, read without making anything (no snapshot, no file): a sandbox,
live and every snapshot of them share inode items, so where subvolume and snapshot differ is
found by generation, O(changes), with the tree search (``btrfs_generations``) when it sees
everything the subvolume holds (root, nothing of it waiting for a commit or a write-back),
and otherwise by an ``lstat`` walk that compares each inode's key with the snapshot's
(``snapshot.candidates.inode_key_candidates``: O(files) stats, no reads), which sees writes
still in the page cache. Either only narrows a compare by content. Two read-only snapshots
of one subvolume are always compared by generation (``snapshots_differ``), so a listing
compares live with one base and answers the others from it; and since they keep its inode
numbers (``snapshot_origin``), a file two bases hold with one old stat key is read once. A fork from live clones
the newest implicit snapshot again when live is provably unchanged since it
(``live_unchanged_since``: its ``ctransid`` and no write waiting, else a short walk), so
forks stop committing the filesystem's transaction and piling up snapshots.

``--disk``: a qgroup limit on the sandbox's subvolume (exclusive bytes). Quotas are
switched on for the whole filesystem by the first ``--disk`` (they make every snapshot
there 2.5-4x slower, bench/RESULTS.md), they stay on, and the user is told so with the
way back; ``limits_hit`` says "disk" when the exclusive bytes ended within 1 MiB of the
cap (qgroups count no refusals).

Caveats:
- snapshots and clones hold an EMPTY ``.petri`` directory where the store subvolume is
  (btrfs leaves an empty directory for a nested subvolume). Consumers exclude ``.petri``
  at the top (manifests, diff, rollback); the runner mounts over it.
- other nested subvolumes inside the workspace show up empty in snapshots too: their
  contents are not snapshotted.
- rootless deletion without ``user_subvol_rm_allowed`` is O(files), not O(1) (it affects
  ``destroy_clone``, ``delete_snapshot`` and ``frozen_view``'s cleanup).
- ``snapshot_bytes`` reads qgroups and is None unless quotas are already enabled on the
  filesystem (this backend never enables them: they slow every snapshot).
- ``clone_usage`` without quotas counts file data written since the clone (the tree search
  ``btrfs subvolume find-new`` does):
  new data only (not old extents a partial overwrite still pins, not metadata), and only
  once written back (a write still in the page cache counts from then on, up to ~30 s
  later); rootless it is None (the tree search needs root). With quotas it is the qgroup's
  exclusive bytes plus its data reservation (``qgroup_usage``): right at once.
- ``convert_to_subvolume`` copies (reflinks) the tree: edits made while it runs abort it
  (nothing changes), but a process that has a file open, or its cwd, inside the old
  directory keeps the old (deleted) copy: shells inside must ``cd "$PWD"`` afterwards.
- The tree search needs CAP_SYS_ADMIN, and sees a writable subvolume whole only when the
  filesystem has no data waiting to be written back (its qgroup's, with quotas): most of
  the time change sets and staleness take the ``lstat`` walk, O(files) stats. A diff of a
  sandbox a command runs in reads a frozen view (a read-only snapshot, removed after).
- Reading live can update atimes (relatime), which moves its ``ctransid``: a fork right
  after such a read takes a new snapshot. (The walk compares keys for equality only, so no
  clock is trusted.)
- ``--disk`` needs root (qgroup commands), and its limit goes on after the clone: writes
  through the host path before ``after_fork`` (or the first run) are not capped.
"""
from __future__ import annotations

import contextlib
import errno
import os
import stat
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Callable, ClassVar, Iterator

import btrfsutil

from ..backend import (FULL, Backend, Candidates, DiskUsage, Leftover, LiveCandidates, Progress, Say,
                       SnapshotResult, refuse_clone_options)
from ..candidates import WalkBudget, inode_key_candidates, prune_dirs
from ..diskcap import DiskCap
from ..errors import (BackendUnavailable, DiskFull, DiskLimitUnavailable, PetriError, SnapshotError,
                      TreeChangedDuringCopy)
from ..osutil import BTRFS_SUPER_MAGIC, FS_NAMES, fs_magic, fsync_dir, mount_of, rename_exchange
from ..store import STORE_NAME, Store
from . import btrfs_generations as G

if TYPE_CHECKING:
    from ..idmap import IdMap
    from ..osutil import PathLike
# subprocess (qgroups) and ..tree (convert's copy) are imported where used: ~3 ms
# that every fork, ls and status of a btrfs workspace would pay for nothing.

SUBVOL_ROOT_INO = 256  # BTRFS_FIRST_FREE_OBJECTID: the root directory of every subvolume
_STORE = STORE_NAME.encode()
# How long a fork from live may spend proving live unchanged (an lstat walk, when writes wait
# in the page cache somewhere on the filesystem) before it takes a new snapshot instead.
LIVE_CHECK_BUDGET_S = 0.25
# _IOR(0x94, 31, struct btrfs_ioctl_fs_info_args) with sizeof == 1024


# -- probing ----------------------------------------------------------------------------

def fs_name(path: PathLike) -> str:
    t = fs_magic(path)
    return FS_NAMES.get(t, f"a filesystem of type {t:#x}")


def is_subvolume(path: PathLike) -> bool:
    try:
        return bool(btrfsutil.is_subvolume(path))
    except btrfsutil.BtrfsUtilError:
        return False


def check_btrfs(path: PathLike) -> tuple[bool, str]:
    """Can this user run the btrfs backend on the workspace at ``path``? (ok, why)."""
    p = os.fsdecode(path)
    try:
        st = os.stat(path)
        kind = fs_magic(path)
    except OSError as e:
        return False, f"cannot inspect {p}: {e.strerror}"
    if kind != BTRFS_SUPER_MAGIC:
        return False, f"{p} is on {FS_NAMES.get(kind, hex(kind))}, not btrfs"
    if not is_subvolume(path):
        return False, (f"{p} is a directory on btrfs but not a subvolume; "
                       "`petri init --convert` makes it one (same path, O(1) snapshots)")
    euid = os.geteuid()
    if euid != 0 and st.st_uid != euid:
        return False, (f"the subvolume {p} belongs to uid {st.st_uid}: only its owner or root "
                       "can snapshot it")
    if euid != 0 and "user_subvol_rm_allowed" not in _mount_options(p):
        return True, ("the workspace is a btrfs subvolume: snapshots and forks are O(1) "
                      "(removing one is O(files) without the user_subvol_rm_allowed mount option)")
    return True, "the workspace is a btrfs subvolume: snapshots and forks are O(1)"


def _mount_options(path: str) -> frozenset[str]:
    """Options of the mount holding ``path`` (per mount and per superblock)."""
    return mount_of(path).all_options


# -- removal ----------------------------------------------------------------------------

# -- quotas (the first --disk switches them on; usage reads them) ---------------------------

def _qgroups_dir(path: PathLike) -> Path:
    return Path("/sys/fs/btrfs") / G.fsid(Path(os.fsdecode(path))) / "qgroups"


def quotas_enabled(path: PathLike) -> bool:
    """Are quotas on for the btrfs filesystem holding ``path``? (sysfs lists qgroups only then)."""
    try:
        return _qgroups_dir(path).is_dir()
    except OSError:
        return False


def qgroup_usage(subvolume: PathLike) -> tuple[int, int] | None:
    """(exclusive bytes, exclusive limit or 0) of the subvolume's own qgroup, or None when
    quotas are off or their numbers are not consistent yet (a rescan is running).

    The exclusive count moves only when a transaction commits (up to 30 s after a write);
    until then what was written is the qgroup's data reservation (``rsv_data``, kept from
    the write until the commit accounts the extent), so the two are added: a figure that is
    right just after a write, and steady across the commit."""
    try:
        qgroups = _qgroups_dir(subvolume)
        if (qgroups / "inconsistent").read_text().strip() != "0":
            return None
        d = qgroups / f"0_{btrfsutil.subvolume_id(subvolume)}"
        exclusive = int((d / "exclusive").read_text())
        try:
            exclusive += int((d / "rsv_data").read_text())
        except FileNotFoundError:
            pass  # a kernel without per-qgroup reservations in sysfs: committed bytes only
        try:
            cap = int((d / "max_exclusive").read_text())
        except ValueError:  # "none"
            cap = 0
        return exclusive, cap
    except (OSError, ValueError, btrfsutil.BtrfsUtilError):
        return None


# _IOWR(0x94, 17, struct btrfs_ioctl_search_args): a 104-byte key, then a 3992-byte buffer
BTRFS_IOC_TREE_SEARCH = 0xD0009411
_SEARCH_KEY = struct.Struct("=7Q4I4Q")
_SEARCH_HEADER = struct.Struct("=3Q2I")  # transid, objectid, offset, type, len
_EXTENT_ITEM = struct.Struct("=QQBBHB")  # generation, ram_bytes, compression, encryption, other, type
_U64_MAX = (1 << 64) - 1
EXTENT_DATA_KEY = 108
_TYPE_MAX = 255
FILE_EXTENT_INLINE = 0


def changed_extent_bytes(subvolume: PathLike) -> int | None:
    """File data written into ``subvolume`` since it was made (a snapshot: since the clone):
    the lengths of its current file extents newer than its creation, found by a tree search
    that skips tree blocks older than that (O(changes); what ``btrfs subvolume find-new``
    lists). Needs root (the search ioctl); None when it cannot be run."""
    import fcntl

    try:
        since = btrfsutil.subvolume_info(subvolume).otransid + 1
        fd = os.open(subvolume, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except (OSError, btrfsutil.BtrfsUtilError):
        return None
    total = 0
    objectid, kind, offset = 0, EXTENT_DATA_KEY, 0
    try:
        while True:
            buf = bytearray(4096)
            # tree 0: the subvolume of fd; keys from (objectid, kind, offset) on. The range is
            # lexicographic, so items of other types come too: they are skipped below.
            _SEARCH_KEY.pack_into(buf, 0, 0, objectid, _U64_MAX, offset, _U64_MAX, since, _U64_MAX,
                                  kind, _TYPE_MAX, 4096, 0, 0, 0, 0, 0)
            try:
                fcntl.ioctl(fd, BTRFS_IOC_TREE_SEARCH, buf)
            except OSError:
                return None
            found = _SEARCH_KEY.unpack_from(buf, 0)[9]
            if not found:
                return total
            pos = _SEARCH_KEY.size
            for _ in range(found):
                _, objectid, offset, kind, length = _SEARCH_HEADER.unpack_from(buf, pos)
                pos += _SEARCH_HEADER.size
                if kind == EXTENT_DATA_KEY:
                    gen, ram_bytes, _, _, _, ext = _EXTENT_ITEM.unpack_from(buf, pos)
                    if gen >= since:
                        # inline: the data itself; regular/prealloc: num_bytes, the last u64
                        total += ram_bytes if ext == FILE_EXTENT_INLINE else \
                            struct.unpack_from("=Q", buf, pos + length - 8)[0]
                pos += length
            # The next search starts just past the last key returned.
            if offset < _U64_MAX:
                offset += 1
            elif kind < _TYPE_MAX:
                kind, offset = kind + 1, 0
            elif objectid < _U64_MAX:
                objectid, kind, offset = objectid + 1, 0, 0
            else:
                return total
    finally:
        os.close(fd)


def _try_delete_subvolume(path: bytes) -> bool:
    """Delete the subvolume at ``path`` in O(1) if we may; False if only emptying will do."""
    try:
        btrfsutil.delete_subvolume(path, recursive=True)
        return True
    except btrfsutil.BtrfsUtilError as e:
        if e.errno in (errno.EPERM, errno.EACCES):
            return False  # unprivileged without user_subvol_rm_allowed
        raise


def _make_writable(d: bytes, st: os.stat_result) -> None:
    if st.st_ino == SUBVOL_ROOT_INO and is_subvolume(d) and btrfsutil.get_subvolume_read_only(d):
        btrfsutil.set_subvolume_read_only(d, False)  # allowed to the subvolume's owner
    if st.st_mode & 0o700 != 0o700:
        try:
            os.chmod(d, stat.S_IMODE(st.st_mode) | 0o700)
        except PermissionError:
            pass  # not ours: the unlinks below say so precisely


def delete_tree(path: PathLike) -> None:
    """Remove a file, directory or subvolume with everything below it, subvolumes included.

    As root (or with ``user_subvol_rm_allowed``) each subvolume goes in O(1); otherwise
    read-only subvolumes are made writable, emptied and rmdir'ed. Missing is not an error."""
    top = os.fsencode(path)
    try:
        st = os.lstat(top)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(top)
        return
    if st.st_ino == SUBVOL_ROOT_INO and is_subvolume(top) and _try_delete_subvolume(top):
        return
    order: list[bytes] = []
    stack: list[tuple[bytes, os.stat_result]] = [(top, st)]
    while stack:
        d, dst = stack.pop()
        _make_writable(d, dst)
        order.append(d)
        with os.scandir(d) as it:
            for entry in it:
                p = os.path.join(d, entry.name)
                est = entry.stat(follow_symlinks=False)
                if not stat.S_ISDIR(est.st_mode):
                    os.unlink(p)
                elif est.st_ino == SUBVOL_ROOT_INO and is_subvolume(p) and _try_delete_subvolume(p):
                    continue
                else:
                    stack.append((p, est))
    for d in reversed(order):
        os.rmdir(d)  # an empty subvolume's root goes on rmdir too


# -- convert ----------------------------------------------------------------------------

def _copyable(st: os.stat_result) -> bool:
    # TreeCopier skips sockets and device nodes; leave them out of the comparison too.
    return not (stat.S_ISSOCK(st.st_mode) or stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode))


def convert_to_subvolume(path: PathLike, progress: Progress | None = None) -> None:
    """Turn the plain directory ``path`` on btrfs into a subvolume at the same path.

    A new subvolume is made beside it, the tree is reflink-copied in (modes, owners,
    times, hard links, xattrs kept), the source is re-walked to prove nothing moved, and
    the two names are exchanged atomically; then the old directory is removed. On any
    failure before the exchange, the original is left exactly as it was and the new
    subvolume is deleted. A path that already is a subvolume is left alone."""
    src = os.path.abspath(os.fsencode(path))
    shown = os.fsdecode(src)
    st = os.lstat(src)
    if not stat.S_ISDIR(st.st_mode):
        raise SnapshotError(detail=f"{shown} is not a directory")
    if fs_magic(src) != BTRFS_SUPER_MAGIC:
        raise BackendUnavailable(backend="btrfs", why=f"{shown} is on {fs_name(src)}, not btrfs")
    if is_subvolume(src):
        return
    if os.path.ismount(src):
        raise SnapshotError(detail=f"{shown} is a mount point; convert the filesystem it mounts instead")

    from ..tree import StatKey, TreeCopier, copy_xattrs, walk

    total = 0
    for rel, est in walk(src):
        if est.st_dev != st.st_dev:
            raise SnapshotError(detail=(
                f"{shown} holds a nested subvolume or mount at {os.fsdecode(rel)}; "
                "convert cannot carry it: move it out first"))
        if stat.S_ISREG(est.st_mode):
            total += est.st_size

    parent, name = os.path.split(src)
    new = os.path.join(parent, b"." + name + b".petri-convert-" + os.urandom(4).hex().encode())
    try:
        btrfsutil.create_subvolume(new)
    except btrfsutil.BtrfsUtilError as e:
        raise SnapshotError(detail=f"cannot create a subvolume beside {shown}: {e.strerror}") from e
    exchanged = False
    try:
        if progress:
            progress(0, total)
        copier = TreeCopier(reflink=True)
        copier.copy(src, new)
        copy_xattrs(src, new)
        # Reflinked, so the bytes are shared: only now is "copied" true for all of them.
        if progress:
            progress(total, total)
        # An editor saving during the copy would be lost by the exchange: prove the tree
        # is still what was copied, else keep the original.
        for rel, est in walk(src):
            if not stat.S_ISDIR(est.st_mode) and _copyable(est) and copier.manifest.get(rel) != StatKey.of(est):
                raise TreeChangedDuringCopy(path=os.fsdecode(os.path.join(src, rel)))
        seen = {rel for rel, est in walk(src) if not stat.S_ISDIR(est.st_mode) and _copyable(est)}
        if seen != set(copier.manifest):
            gone = sorted(set(copier.manifest) - seen)
            raise TreeChangedDuringCopy(path=os.fsdecode(os.path.join(src, (gone or [b""])[0])))
        # Commit the new subvolume's contents before its name becomes the real one.
        btrfsutil.sync(new)
        rename_exchange(new, src)
        exchanged = True
        fsync_dir(parent)
    except BaseException as e:
        if not exchanged:
            delete_tree(new)
        if isinstance(e, btrfsutil.BtrfsUtilError):
            raise SnapshotError(detail=f"converting {shown}: {e.strerror}") from e
        if isinstance(e, OSError) and not isinstance(e, PetriError):
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise DiskFull(doing=f"converting {shown}") from e
            raise SnapshotError(detail=f"converting {shown}: {e.strerror}") from e
        raise
    try:
        delete_tree(new)  # now the old plain directory
    except OSError as e:
        raise SnapshotError(detail=(
            f"{shown} is now a subvolume, but its old copy at {os.fsdecode(new)} could not be "
            f"removed ({e.strerror}); remove it by hand")) from e


# -- reading what moved ---------------------------------------------------------------

def _is_ro_subvolume(path: Path) -> bool:
    try:
        return is_subvolume(path) and btrfsutil.get_subvolume_read_only(path)
    except Exception:  # noqa: BLE001 - anything odd: make a read-only snapshot instead
        return False


# -- --disk: qgroup limits ----------------------------------------------------------------

class BtrfsQgroups(DiskCap):
    """An exclusive-bytes qgroup limit per sandbox subvolume (see the module doc)."""

    kind = "btrfs"
    needs_root = True

    def __init__(self, store: Store) -> None:
        self.store = store

    def enabled(self) -> bool:
        return quotas_enabled(self.store.root)

    def prepare(self) -> list[str]:
        where = str(self.store.workspace)
        if os.geteuid() != 0:
            raise DiskLimitUnavailable(where=where, why="btrfs qgroups need root",
                                       alternatives="run petri as root, or use a workspace with the fuse backend"
                                                    " (`petri init --backend fuse`), whose --disk works rootless")
        if self.enabled():
            return []
        # Quotas cost every snapshot on this filesystem (bench/RESULTS.md: forks 2.5-4x
        # slower): they are turned on only now that a --disk cap is asked for, they stay on,
        # and the user is told so, with the way back.
        import subprocess

        for argv in (["btrfs", "quota", "enable", str(self.store.root)],
                     ["btrfs", "quota", "rescan", "-w", str(self.store.root)]):
            cp = subprocess.run(argv, capture_output=True, text=True)
            if cp.returncode != 0 and "in progress" not in cp.stderr:
                raise DiskLimitUnavailable(where=where, why=f"`{' '.join(argv)}` failed: {cp.stderr.strip()}",
                                           alternatives="use the fuse backend (`petri init --backend fuse`)")
        mount = os.fsdecode(mount_of(self.store.root).mountpoint)
        return [f"--disk switched on btrfs quotas for the whole filesystem at {mount}: from now on every "
                f"snapshot and fork there is slower (2.5-4x measured); `btrfs quota disable {mount}` switches "
                f"them off again and lifts every --disk cap on that filesystem"]

    def apply(self, store: Store, sb_id: str, limit: int) -> None:
        import subprocess

        tree = store.sandbox_tree(sb_id)
        cp = subprocess.run(["btrfs", "qgroup", "limit", "-e", str(limit), str(tree)], capture_output=True, text=True)
        if cp.returncode != 0:
            raise DiskLimitUnavailable(where=str(tree), why=f"btrfs qgroup limit failed: {cp.stderr.strip()}",
                                       alternatives="check `btrfs quota` on this filesystem")

    def usage(self, store: Store, sb_id: str) -> tuple[int, int] | None:
        return qgroup_usage(store.sandbox_tree(sb_id))

    def hit(self, store: Store, sb_id: str, mark: object) -> bool:
        # qgroups count no refusals: the counters say the sandbox is at its cap.
        u = self.usage(store, sb_id)
        if u is None:
            return False
        used, cap = u
        return cap > 0 and used >= cap - (1 << 20)

    def lapsed(self) -> str | None:
        # Someone ran `btrfs quota disable`: the qgroups and their limits are gone. Turning
        # quotas back on behind their back would undo that choice.
        if self.enabled():
            return None
        return ("btrfs quotas were switched off on its filesystem (a new `petri fork --disk` switches them "
                "on again)")


# -- the backend ------------------------------------------------------------------------

def _translate(e: OSError, doing: str) -> PetriError:
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskFull(doing=doing)
    if getattr(e, "btrfsutilerror", None) in (btrfsutil.ERROR_NOT_SUBVOLUME, btrfsutil.ERROR_NOT_BTRFS):
        return BackendUnavailable(backend="btrfs", why=f"{doing}: {e.strerror}")
    return SnapshotError(detail=f"{doing}: {e.strerror or e}")


class BtrfsBackend(Backend):
    name: ClassVar[str] = "btrfs"
    instant: ClassVar[bool] = True
    # The chooser's probe: (ok, why) for a workspace path.
    available = staticmethod(check_btrfs)

    @staticmethod
    def convert(workspace: Path, progress: Progress | None = None, say: Say | None = None) -> bool:
        """``petri init --convert``: the plain directory on btrfs becomes a subvolume at the
        same path (``convert_to_subvolume``); False if it already is one."""
        ok, _why = check_btrfs(workspace)
        if ok:
            if say:
                say(f"{workspace} is already a btrfs subvolume; nothing to convert")
            return False
        kind = fs_name(workspace)
        if kind != "btrfs":
            raise PetriError(f"--convert needs a directory on btrfs; {workspace} is on {kind}")
        if say:
            say(f"converting {workspace} into a btrfs subvolume: its contents are reflink-copied (no data"
                " is duplicated) into a new subvolume, which then takes its place at the same path")
        convert_to_subvolume(workspace, progress)
        return True

    def _tree(self, store: Store, snap_id: str) -> Path:
        return store.snapshot_dir(snap_id) / "tree"

    def _require_subvolume(self, store: Store) -> None:
        ok, why = check_btrfs(store.workspace)
        if not ok:
            raise BackendUnavailable(backend="btrfs", why=why)

    # -- store -------------------------------------------------------------------------
    def create_store(self, store: Store) -> None:
        self._require_subvolume(store)
        root = store.root
        if os.path.lexists(root) and not is_subvolume(root):
            try:
                os.rmdir(root)  # an empty leftover directory: replace it by a subvolume
            except OSError:
                raise SnapshotError(detail=(
                    f"{root} exists and is a plain directory; the btrfs store must be a "
                    "nested subvolume so snapshots skip it: remove it (or `petri deinit`) first")) from None
        if not os.path.lexists(root):
            try:
                btrfsutil.create_subvolume(root)
            except btrfsutil.BtrfsUtilError as e:
                raise _translate(e, f"creating the store subvolume {root}") from e
        store.make_dirs()

    def destroy_store(self, store: Store) -> None:
        """Remove the store subvolume with every snapshot and sandbox in it (deinit)."""
        delete_tree(store.root)

    def estimate_bytes(self, store: Store, parent: str | None) -> int:
        return 0

    # -- snapshots ---------------------------------------------------------------------
    def snapshot(self, store: Store, snap_id: str, parent: str | None,
                 progress: Progress | None = None) -> SnapshotResult:
        if not is_subvolume(store.root):
            # A plain .petri would be snapshotted along with the workspace: registry,
            # logs and every earlier snapshot's metadata.
            raise SnapshotError(detail=f"{store.root} is not a nested subvolume; run `petri init` again")
        self._readonly_snapshot(store, store.workspace, snap_id, f"taking snapshot {snap_id}")
        if progress:
            progress(0, 0)
        return SnapshotResult(bytes_copied=0)

    def snapshot_sandbox(self, store: Store, sb_id: str, snap_id: str, parent: str) -> SnapshotResult:
        """A read-only snapshot of the sandbox's subvolume: O(1) and atomic, even while a
        command writes in it."""
        tree = self.ensure_clone(store, sb_id)
        self._readonly_snapshot(store, tree, snap_id, f"taking snapshot {snap_id} of sandbox {sb_id}")
        return SnapshotResult(bytes_copied=0)

    def _readonly_snapshot(self, store: Store, src: Path, snap_id: str, doing: str) -> None:
        """A read-only snapshot of the subvolume ``src`` at ``snapshots/<snap_id>/tree``,
        made in tmp/ and renamed into place (a name there is always whole)."""
        staging = store.tmp_path(snap_id)
        try:
            staging.mkdir(parents=True)
            btrfsutil.create_snapshot(src, staging / "tree", read_only=True)
            os.rename(staging, store.snapshot_dir(snap_id))
        except BaseException as e:
            delete_tree(staging)
            if isinstance(e, OSError) and not isinstance(e, PetriError):
                raise _translate(e, doing) from e
            raise

    def delete_snapshot(self, store: Store, snap_id: str) -> None:
        delete_tree(store.snapshot_dir(snap_id))

    @contextlib.contextmanager
    def snapshot_view(self, store: Store, snap_id: str) -> Iterator[Path]:
        tree = self._tree(store, snap_id)
        if not is_subvolume(tree):
            raise SnapshotError(detail=f"snapshot {snap_id} has no subvolume on disk at {tree}")
        yield tree

    def snapshot_bytes(self, store: Store, snap_id: str) -> int | None:
        """Exclusive bytes from the snapshot's qgroup, when quotas are enabled already."""
        u = qgroup_usage(self._tree(store, snap_id))
        return None if u is None else u[0]

    # -- sandboxes ---------------------------------------------------------------------
    def clone(self, store: Store, snap_id: str, sb_id: str, *, disk_budget: int | None = None,
              idmap: IdMap | None = None) -> Path:
        refuse_clone_options(self.name, disk_budget, idmap)
        src = self._tree(store, snap_id)
        if not is_subvolume(src):
            raise SnapshotError(detail=f"snapshot {snap_id} has no subvolume on disk at {src}")
        staging = store.tmp_path(sb_id)
        try:
            staging.mkdir(parents=True)
            btrfsutil.create_snapshot(src, staging / "tree")
            os.rename(staging, store.sandbox_dir(sb_id))
        except BaseException as e:
            delete_tree(staging)
            if isinstance(e, OSError) and not isinstance(e, PetriError):
                raise _translate(e, f"cloning {snap_id} into {sb_id}") from e
            raise
        return store.sandbox_tree(sb_id)

    def ensure_clone(self, store: Store, sb_id: str) -> Path:
        tree = store.sandbox_tree(sb_id)
        if not is_subvolume(tree):
            raise SnapshotError(detail=f"sandbox {sb_id} has no subvolume on disk at {tree}")
        return tree

    @contextlib.contextmanager
    def frozen_view(self, store: Store, sb_id: str) -> Iterator[Path]:
        tree = self.ensure_clone(store, sb_id)
        view = store.tmp_path(f"{sb_id}.frozen")
        try:
            btrfsutil.create_snapshot(tree, view, read_only=True)
        except btrfsutil.BtrfsUtilError as e:
            raise _translate(e, f"freezing a view of {sb_id}") from e
        try:
            yield view
        finally:
            delete_tree(view)

    def destroy_clone(self, store: Store, sb_id: str) -> None:
        delete_tree(store.sandbox_dir(sb_id))

    def clone_usage(self, store: Store, sb_id: str, since: float | None = None) -> DiskUsage | None:
        """The sandbox subvolume's exclusive bytes when quotas are on (what a --disk cap
        counts); otherwise, as root, the file data written since the clone; else None."""
        tree = store.sandbox_tree(sb_id)
        u = qgroup_usage(tree)
        if u is not None:
            return DiskUsage(u[0], "qgroup-exclusive")
        if os.geteuid() != 0:
            return None
        written = changed_extent_bytes(tree)
        return None if written is None else DiskUsage(written, "changed-extents")

    def leftovers(self, store: Store, snapshots: set[str], sandboxes: set[str]) -> list[Leftover]:
        found: list[Leftover] = []
        for parent, known, kind in ((store.snapshots, snapshots, "snapshot"),
                                    (store.sandboxes, sandboxes, "tree")):
            if parent.is_dir():
                found.extend(Leftover(kind, p) for p in sorted(parent.iterdir()) if p.name not in known)
        if store.tmp.is_dir():
            found.extend(Leftover("tree", p) for p in sorted(store.tmp.iterdir()))
        return found

    def remove_leftover(self, store: Store, leftover: Leftover) -> None:
        delete_tree(leftover.path)

    # -- --disk, change sets, staleness ------------------------------------------------------
    def disk_cap(self, store: Store) -> DiskCap:
        return BtrfsQgroups(store)

    def shares_inodes(self) -> bool:
        return True  # a snapshot shares its inode items with what it was taken of or cloned into

    def snapshot_origin(self, store: Store, snap_id: str) -> tuple[object, int] | None:
        """The uuid of the subvolume the snapshot was taken of (live, or a sandbox) and its
        ``otime``: snapshots of one subvolume hold its inode numbers."""
        try:
            info = G.subvol_info(self._tree(store, snap_id))
        except OSError:
            return None
        if info.parent_uuid == bytes(16) or not info.otime_ns:
            return None
        return (info.parent_uuid, info.otime_ns)

    def _candidates(self, base: Path, tree: Path, skip_top: Callable[[bytes], bool]) -> Candidates:
        """Where subvolume ``tree`` may differ from snapshot ``base`` (one of its lineage):
        by generation where the tree search sees all of ``tree`` (root, nothing of it waiting
        for a commit or a write-back: ``btrfs_generations.settled``), else by the ``lstat``
        walk that reads the inodes in memory. Either only narrows; nothing is made."""
        if os.geteuid() == 0:
            try:
                if G.settled(tree, _is_ro_subvolume(tree)):
                    since = G.subvol_info(base).otransid
                    paths, whole = G.changed_paths(tree, base, since)
                    kept = {p for p in paths | whole if not skip_top(p.split(b"/", 1)[0])}
                    return Candidates(frozenset(prune_dirs(base, tree, kept, whole)), "btrfs-generation")
            except OSError:
                pass  # the walk below needs no ioctl
        return Candidates(frozenset(inode_key_candidates(base, tree, skip_top)), "inode-keys")

    def change_candidates(self, store: Store, sb_id: str, cloned_from: str, since: str,
                          base: Path | None = None, tree: Path | None = None) -> Candidates:
        """By generation or by inode keys (``_candidates``) between ``since`` and the sandbox
        (``tree`` when given: its frozen view while a command runs in it). Both compare with
        whichever snapshot they are given, so a fork of a fork needs nothing added for its
        lineage, and both name every link of a hard-linked file."""
        base_tree = base if base is not None else self._tree(store, since)
        try:
            return self._candidates(base_tree, tree if tree is not None else self.ensure_clone(store, sb_id),
                                    _store_or_staging)
        except OSError:
            return FULL

    @contextlib.contextmanager
    def live_candidates(self, store: Store, snap_id: str, exclude_top: Callable[[bytes], bool]
                        ) -> Iterator[LiveCandidates | None]:
        """Live itself (no snapshot of it) with ``_candidates`` against ``snap_id``."""
        base = self._tree(store, snap_id)
        try:
            cands = self._candidates(base, store.workspace, lambda n: exclude_top(n) or _store_or_staging(n))
        except OSError:
            yield None
            return
        yield base, store.workspace, cands

    def snapshots_differ(self, store: Store, a_id: str, b_id: str, skip_top: Callable[[bytes], bool]
                         ) -> Candidates | None:
        """Where two read-only snapshots of one subvolume may differ: by generation, the later
        one's tree search since the earlier was taken (read-only, so the search sees all of
        it; the store and a promotion's staging left out). None where the tree search is out
        of reach (not root) or they are snapshots of different subvolumes."""
        if os.geteuid() != 0:
            return None
        ta, tb = self._tree(store, a_id), self._tree(store, b_id)
        try:
            ia, ib = G.subvol_info(ta), G.subvol_info(tb)
            if ia.parent_uuid != ib.parent_uuid or ia.parent_uuid == bytes(16):
                return None
            (old, since), new = ((ta, ia.otransid), tb) if ia.otransid <= ib.otransid else ((tb, ib.otransid), ta)
            if not (_is_ro_subvolume(old) and _is_ro_subvolume(new)):
                return None
            paths, whole = G.changed_paths(new, old, since)
        except OSError:
            return None
        kept = {p for p in paths | whole if not _skipped(p.split(b"/", 1)[0], skip_top)}
        return Candidates(frozenset(prune_dirs(old, new, kept, whole)), "btrfs-generation")

    def live_unchanged_since(self, store: Store, snap_id: str, budget_s: float = LIVE_CHECK_BUDGET_S) -> bool:
        """By generation, O(1): live's ``ctransid`` (in memory) is still the snapshot's (no
        transaction touched it since) and no write waits in the page cache
        (``btrfs_generations.data_quiet``). Otherwise an ``lstat`` walk decides (it sees
        writes in the page cache; a moved ``ctransid`` may be only an atime update), stopping
        at the first difference, or at ``budget_s``: then a new snapshot is taken."""
        import time

        tree = self._tree(store, snap_id)
        try:
            live, snap = G.subvol_info(store.workspace), G.subvol_info(tree)
            if live.ctransid == snap.ctransid and G.data_quiet(store.workspace, live.id):
                return True
            return not inode_key_candidates(tree, store.workspace, _store_or_staging, first=True,
                                            deadline=time.monotonic() + budget_s)
        except (OSError, WalkBudget):
            return False


def _skipped(top: bytes, skip_top: Callable[[bytes], bool]) -> bool:
    return skip_top(top) or _store_or_staging(top)


def _store_or_staging(name: bytes) -> bool:
    """Top-level names no snapshot holds content of: the store (an empty directory there) and
    a promotion's staging."""
    return name == _STORE or name.startswith(b".petri-staging-")


__all__ = ["BtrfsBackend", "BtrfsQgroups", "changed_extent_bytes", "check_btrfs", "convert_to_subvolume",
           "delete_tree", "fs_name", "is_subvolume", "qgroup_usage", "quotas_enabled"]
