"""The ``copy`` backend: plain copies, the last resort, and its reflink variant's base.

A snapshot is a full copy of the live tree at ``snapshots/<id>/tree``; later snapshots
hard-link every file that did not move since the previous snapshot to that snapshot's copy
(never to live: a hard link to live would let a live edit reach the snapshot). Whether a
file moved is decided by the stat cache of the previous snapshot: (inode, size, mtime_ns,
ctime_ns, mode) of the live file when it was copied. A sandbox is a full copy of the
snapshot.

The manifest (``snapshots/<id>/manifest``: marshal of ``(version, {rel: (ino, size,
mtime_ns, ctime_ns, mode)})`` for every non-directory) keeps git's racily-clean marks: an
entry whose mtime or ctime is not older than the snapshot's start (less
``RACY_WINDOW_NS``) could be rewritten within the same timestamp tick after it was copied
and keep all five fields, so it is stored with the impossible size -1 and never matches.
Every other entry can be trusted as "unchanged since this snapshot" by whoever reads the
manifest (the next snapshot; staleness, through ``live_record``). Version 1 manifests carry
no marks: their entries are still used by the next snapshot as before, and staleness
trusts them only for files whose ctime is over a minute older than the snapshot.

Caveats: the first snapshot and every clone copy all the data (O(bytes)); snapshots are
exact per file, not across files (each file is re-copied if it moved during its copy);
sockets and device nodes in the workspace are not carried; a file written just before
a snapshot is copied again by the next one (its racy mark). ``clone_usage`` is a stat walk
of the whole sandbox (O(files)) counting the files whose size or mtime moved since the
clone: an edit that keeps both is missed, the clone's own full copy of the base is not
counted, and a figure kept from an earlier walk misses edits made since through the host
path (the figure is kept by ``note_usage`` after a fork and after each run, never by a
listing; ``petri ls`` gives it, ``petri status`` always measures).
"""
from __future__ import annotations

import contextlib
import json
import marshal
import os
import stat
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Iterator

from ..backend import Backend, DiskUsage, Leftover, Progress, SnapshotResult, StatKeys, refuse_clone_options
from ..errors import DiskFull, SnapshotError
from ..store import STORE_NAME, Store
from ..osutil import rmtree
from ..tree import StatKey, TreeCopier, walk

if TYPE_CHECKING:
    from ..idmap import IdMap

EXCLUDE = frozenset({STORE_NAME.encode()})
CLONE_RECORD = "clone.json"  # beside a sandbox's tree: {"snapshot": the snapshot it was cloned from}
USAGE_CACHE = "usage.json"   # beside it: the last clone_usage figure and when it was measured
MANIFEST_VERSION = 2  # 2: racy entries marked (size -1); 1: no marks
_READABLE_VERSIONS = (1, 2)
# Timestamps come from the kernel's coarse clock (one tick: 4 ms at HZ=250); 50 ms leaves
# room for a slow tick (as snapshot.layers.RACY_WINDOW_NS).
RACY_WINDOW_NS = 50_000_000
RACY_SIZE = -1  # no file has it: a racy entry never matches a live stat
# A version 1 manifest keeps no racy marks: staleness trusts its entries only for files
# that moved this long before the snapshot.
MANIFEST_TRUST_NS = 60_000_000_000


def manifest_data(manifest: dict[bytes, StatKey], started_ns: int) -> dict[bytes, tuple[int, int, int, int, int]]:
    """The manifest as stored: plain tuples, racy entries marked (pure)."""
    recent = started_ns - RACY_WINDOW_NS
    data = {}
    for k, v in manifest.items():
        if v.mtime_ns >= recent or v.ctime_ns >= recent:
            data[k] = (v.ino, RACY_SIZE, v.mtime_ns, v.ctime_ns, v.mode)
        else:
            data[k] = (v.ino, v.size, v.mtime_ns, v.ctime_ns, v.mode)
    return data


def _save_manifest(path: Path, manifest: dict[bytes, StatKey], started_ns: int) -> None:
    data = manifest_data(manifest, started_ns)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        marshal.dump((MANIFEST_VERSION, data), f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_manifest(path: Path) -> dict[bytes, StatKey]:
    try:
        with open(path, "rb") as f:
            version, data = marshal.load(f)
    except (FileNotFoundError, EOFError, ValueError, TypeError):
        return {}
    if version not in _READABLE_VERSIONS:
        return {}
    return {k: StatKey(*v) for k, v in data.items()}


@contextlib.contextmanager
def _staged(staging: Path, doing: str) -> Iterator[None]:
    """Build something in ``staging`` (tmp/): on any failure it goes, and a full disk is
    said as such."""
    try:
        yield
    except OSError as e:
        rmtree(staging)
        if e.errno in (28, 122):
            raise DiskFull(doing=doing) from e
        raise
    except BaseException:
        rmtree(staging)
        raise


class CopyBackend(Backend):
    name: ClassVar[str] = "copy"
    instant: ClassVar[bool] = False
    reflink: ClassVar[bool] = False
    usage_measure: ClassVar[str] = "changed-files"  # how clone_usage counts (DiskUsage.measure)

    def __init__(self, workers: int = 4) -> None:
        self.workers = workers

    @staticmethod
    def available(workspace: Path) -> tuple[bool, str]:
        return True, "plain copies work everywhere (O(bytes) per snapshot and clone)"

    # -- store -------------------------------------------------------------------------
    def create_store(self, store: Store) -> None:
        store.root.mkdir(exist_ok=True)
        store.make_dirs()

    def _tree(self, store: Store, snap_id: str) -> Path:
        return store.snapshot_dir(snap_id) / "tree"

    def _manifest(self, store: Store, snap_id: str) -> Path:
        return store.snapshot_dir(snap_id) / "manifest"

    # -- snapshots ---------------------------------------------------------------------
    def estimate_bytes(self, store: Store, parent: str | None) -> int:
        prev = load_manifest(self._manifest(store, parent)) if parent else {}
        total = 0
        for rel, st in walk(bytes(store.workspace), EXCLUDE):
            if stat.S_ISREG(st.st_mode) and prev.get(rel) != StatKey.of(st):
                total += st.st_size
        return total

    def snapshot(self, store: Store, snap_id: str, parent: str | None,
                 progress: Progress | None = None) -> SnapshotResult:
        prev = load_manifest(self._manifest(store, parent)) if parent else {}
        prev_tree = bytes(self._tree(store, parent)) if parent else b""
        total = self.estimate_bytes(store, parent) if progress else 0

        def link_from(rel: bytes, st: os.stat_result) -> bytes | None:
            if prev.get(rel) == StatKey.of(st):
                candidate = os.path.join(prev_tree, rel)
                try:
                    if os.lstat(candidate).st_size == st.st_size:
                        return candidate
                except FileNotFoundError:
                    return None
            return None

        staging = store.tmp_path(snap_id)
        copier = TreeCopier(reflink=self.reflink, workers=self.workers, progress=progress,
                            total=total, link_from=link_from if prev else None)
        try:
            (staging / "tree").mkdir(parents=True)
            # Before the walk's first stat: every key taken later is compared with it.
            started_ns = time.time_ns()
            copier.copy(bytes(store.workspace), bytes(staging / "tree"), EXCLUDE)
            _save_manifest(staging / "manifest", copier.manifest, started_ns)
            os.rename(staging, store.snapshot_dir(snap_id))
        except BaseException:
            rmtree(staging)
            raise
        copied = copier._done if progress else sum(
            k.size for r, k in copier.manifest.items() if prev.get(r) != k and stat.S_ISREG(k.mode))
        return SnapshotResult(bytes_copied=0 if self.reflink else copied)

    def snapshot_sandbox(self, store: Store, sb_id: str, snap_id: str, parent: str) -> SnapshotResult:
        """A copy of the sandbox's tree (reflinked where the filesystem can), with the
        manifest its own clones measure their usage against. Exact per file: a file that
        moves while it is copied is copied again."""
        src = self.ensure_clone(store, sb_id)
        staging = store.tmp_path(snap_id)
        copier = TreeCopier(reflink=self.reflink, workers=self.workers)
        with _staged(staging, f"taking snapshot {snap_id} of sandbox {sb_id}"):
            (staging / "tree").mkdir(parents=True)
            started_ns = time.time_ns()
            # The top-level .petri is excluded as in a snapshot of live: a sandbox may have made one.
            copier.copy(bytes(src), bytes(staging / "tree"), EXCLUDE)
            os.chmod(staging / "tree", os.lstat(src).st_mode & 0o7777)
            _save_manifest(staging / "manifest", copier.manifest, started_ns)
            os.rename(staging, store.snapshot_dir(snap_id))
        copied = sum(k.size for k in copier.manifest.values() if stat.S_ISREG(k.mode))
        return SnapshotResult(bytes_copied=0 if self.reflink else copied)

    def delete_snapshot(self, store: Store, snap_id: str) -> None:
        rmtree(bytes(store.snapshot_dir(snap_id)))

    @contextlib.contextmanager
    def snapshot_view(self, store: Store, snap_id: str) -> Iterator[Path]:
        tree = self._tree(store, snap_id)
        if not tree.is_dir():
            raise SnapshotError(detail=f"snapshot {snap_id} has no tree on disk")
        yield tree

    def snapshot_bytes(self, store: Store, snap_id: str) -> int | None:
        # Files hard-linked into other snapshots are shared; count only the ones held alone.
        total = 0
        for _, st in walk(bytes(self._tree(store, snap_id))):
            if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
                total += st.st_blocks * 512
        return total

    # -- sandboxes ---------------------------------------------------------------------
    def clone(self, store: Store, snap_id: str, sb_id: str, *, disk_budget: int | None = None,
              idmap: IdMap | None = None) -> Path:
        refuse_clone_options(self.name, disk_budget, idmap)
        src = self._tree(store, snap_id)
        staging = store.tmp_path(sb_id)
        with _staged(staging, f"cloning {snap_id}"):
            (staging / "tree").mkdir(parents=True)
            (staging / CLONE_RECORD).write_text(json.dumps({"snapshot": snap_id}) + "\n")
            TreeCopier(reflink=self.reflink, workers=self.workers).copy(bytes(src), bytes(staging / "tree"))
            os.chmod(staging / "tree", os.lstat(src).st_mode & 0o7777)
            os.rename(staging, store.sandbox_dir(sb_id))
        return store.sandbox_tree(sb_id)

    def ensure_clone(self, store: Store, sb_id: str) -> Path:
        tree = store.sandbox_tree(sb_id)
        if not tree.is_dir():
            raise SnapshotError(detail=f"sandbox {sb_id} has no tree on disk")
        return tree

    @contextlib.contextmanager
    def frozen_view(self, store: Store, sb_id: str) -> Iterator[Path]:
        # No cheap point-in-time image of a plain directory: take a reflink/copy of it.
        staging = store.tmp_path(f"{sb_id}.frozen")
        try:
            staging.mkdir(parents=True)
            TreeCopier(reflink=self.reflink, workers=self.workers).copy(
                bytes(store.sandbox_tree(sb_id)), bytes(staging))
            yield staging
        finally:
            rmtree(bytes(staging))

    def destroy_clone(self, store: Store, sb_id: str) -> None:
        rmtree(bytes(store.sandbox_dir(sb_id)))

    def clone_usage(self, store: Store, sb_id: str, since: float | None = None) -> DiskUsage | None:
        """Bytes of the files the sandbox changed or added since its clone: a stat walk of
        the sandbox against its base's manifest, O(files), so the last figure ``note_usage``
        kept (``usage.json`` beside the tree) is given when it was measured at or after
        ``since``. Only reads. None for a sandbox cloned before its base was recorded."""
        if since is not None:
            try:
                got = json.loads((store.sandbox_dir(sb_id) / USAGE_CACHE).read_text())
                if got["at"] >= since:
                    return DiskUsage(got["bytes"], got["measure"], got["at"])
            except (OSError, ValueError, KeyError, TypeError):
                pass
        return self._measure_usage(store, sb_id)

    def note_usage(self, store: Store, sb_id: str) -> None:
        """Measure now and keep the figure (a fork or a run just changed the sandbox), for the
        listings that only read."""
        cache = store.sandbox_dir(sb_id) / USAGE_CACHE
        started = time.time()  # before the walk: an edit during it is newer than the figure
        try:
            usage = self._measure_usage(store, sb_id)
        except OSError:
            return  # a tree that cannot be walked now: the next listing measures itself
        if usage is None:
            return
        tmp = cache.with_name(f".{USAGE_CACHE}.{os.getpid()}")
        with contextlib.suppress(OSError):  # a cache: no fsync, and losing it costs one walk
            tmp.write_text(json.dumps({"bytes": usage.bytes, "measure": usage.measure, "at": started}))
            os.replace(tmp, cache)

    def _measure_usage(self, store: Store, sb_id: str) -> DiskUsage | None:
        try:
            snap_id = json.loads((store.sandbox_dir(sb_id) / CLONE_RECORD).read_text())["snapshot"]
            with open(self._manifest(store, snap_id), "rb") as f:
                version, base = marshal.load(f)  # plain tuples: no StatKey per file
        except (OSError, ValueError, KeyError, EOFError, TypeError):
            return None
        if version not in _READABLE_VERSIONS:
            return None
        base_tree = bytes(self._tree(store, snap_id))
        tree = bytes(store.sandbox_tree(sb_id))
        total = 0
        for rel, st in walk(tree):
            if not stat.S_ISREG(st.st_mode):
                continue
            key = base.get(rel)
            if key is not None and key[1] == RACY_SIZE:
                try:  # a racy manifest entry: ask the snapshot's own copy
                    bst = os.lstat(os.path.join(base_tree, rel))
                    key = (bst.st_ino, bst.st_size, bst.st_mtime_ns)
                except OSError:
                    key = None
            if key is not None and key[1] == st.st_size and key[2] == st.st_mtime_ns:
                continue  # as cloned (copies keep the snapshot's size and mtime)
            total += self._changed_file_bytes(os.path.join(tree, rel), st)
        return DiskUsage(total, self.usage_measure)

    def _changed_file_bytes(self, path: bytes, st: os.stat_result) -> int:
        return st.st_size

    def live_record(self, store: Store, snap_id: str, taken_at: float) -> tuple[StatKeys, dict[bytes, Any]] | None:
        """The snapshot's manifest of live. Its marshal is read directly: building 60k
        ``StatKey`` objects costs more than staleness's whole walk."""
        with open(self._manifest(store, snap_id), "rb") as f:
            version, keys = marshal.loads(f.read())
        if version == MANIFEST_VERSION and keys:
            return keys, dict(keys)  # racy entries carry an impossible size: they never match
        if version != 1 or not keys:
            return None
        # Version 1 keeps no racy marks: trust only what moved well before the snapshot.
        limit = int(taken_at * 1e9) - MANIFEST_TRUST_NS
        trusted = {k: (v if v[3] < limit and v[2] < limit else None) for k, v in keys.items()}
        return keys, trusted

    def leftovers(self, store: Store, snapshots: set[str], sandboxes: set[str]) -> list[Leftover]:
        found: list[Leftover] = []
        for parent, known, kind in ((store.snapshots, snapshots, "snapshot"), (store.sandboxes, sandboxes, "tree")):
            if parent.is_dir():
                for p in parent.iterdir():
                    if p.name not in known:
                        found.append(Leftover(kind, p))
        if store.tmp.is_dir():
            found.extend(Leftover("tree", p) for p in store.tmp.iterdir())
        return found

    def remove_leftover(self, store: Store, leftover: Leftover) -> None:
        rmtree(bytes(leftover.path))
