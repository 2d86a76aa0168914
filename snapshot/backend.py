"""The one protocol every clone backend implements, and the records it returns.

A backend turns the live workspace into immutable snapshots and snapshots into writable
sandbox trees. It knows trees and nothing of processes, the registry or time: the
orchestrator owns ids (it passes them in) and records what the backend returns.

The protocol is complete: everything above ``snapshot/`` reaches a backend through these
methods only, never by its name or a ``getattr``. What a backend may lack (a fast change
set, a record of live for staleness, a read set, a disk cap, a usage figure, processes to
reap) is a method with a default that says "cannot tell" or "nothing to do", which the
backend overrides where it can do better. ``snapshot.choose`` is the one place that picks
a backend by name.

Every backend must pass ``snapshot/conformance.py`` (the behavioural checker, in the
manner of trio's ``check_one_way_stream``, run by ``tests/snapshot/test_backend_conformance.py``);
``tests/snapshot/test_backend_protocol.py`` checks that each one implements every method here with
a compatible signature (and mypy checks it statically).

Caveats: a backend subclasses this protocol to inherit the defaults, so forgetting an
override is silent at run time: the defaults are all correct, only slower or less
informative (a full compare instead of a fast change set, no usage figure).
"""
from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping, Protocol, runtime_checkable

from .diskcap import DiskCap as DiskCap  # the contract disk_cap returns; defined beside the default cap
from .diskcap import filesystem_disk_cap
from .store import Store
from .errors import SnapshotError, Unsupported
from .osutil import rmtree

if TYPE_CHECKING:
    from .idmap import IdMap

# Called with the number of bytes copied so far and the total expected (0 when unknown).
Progress = Callable[[int, int], None]
# Says one line to the person at the terminal (``petri init --convert``'s progress notes).
Say = Callable[[str], None]
# A snapshot's record of live: relative path -> (ino, size, mtime_ns, ctime_ns, mode).
StatKeys = Mapping[bytes, tuple[Any, ...]]


@dataclass(frozen=True)
class SnapshotResult:
    bytes_copied: int


@dataclass(frozen=True)
class DiskUsage:
    """What a sandbox holds on disk beyond its base, and how that was counted."""

    bytes: int
    # "qgroup-exclusive" (btrfs with quotas), "changed-extents" (btrfs without: file data
    # written since the clone), "upper" (overlay, fuse: the upper dir's files), "unshared"
    # (reflink: changed files' extents not shared with the base), "changed-files" (copy:
    # files changed or added since the clone), "zfs-used" (the clone's ``used``).
    measure: str
    # When the figure was measured (epoch seconds) if it came from an earlier measurement
    # (see Backend.clone_usage's ``since``); None: measured just now.
    measured_at: float | None = None


@dataclass(frozen=True)
class Leftover:
    """Something of a backend's found on disk that no registry row accounts for."""

    kind: str  # "mount" | "tree" | "snapshot" | "layer"
    path: Path


@dataclass(frozen=True)
class Candidates:
    """Paths (and whole subtrees beneath them) outside which nothing changed, from a
    backend's own record; ``paths`` None means the backend cannot tell (compare
    everything). They only narrow a compare by content, never decide it."""

    paths: frozenset[bytes] | None
    source: str  # "manifest" (none), "btrfs-send", "upper", "fuse-journal", "zfs-diff", "+lineage"

    def covers(self, path: bytes) -> bool:
        if self.paths is None:
            return True
        if path in self.paths:
            return True
        parts = path.split(b"/")
        return any(b"/".join(parts[:i]) in self.paths for i in range(1, len(parts)))


FULL = Candidates(None, "manifest")

# A read-only point-in-time view of live and the snapshot, with where they may differ.
LiveCandidates = tuple[Path, Path, Candidates]  # (snapshot tree, live view, candidates)


def refuse_clone_options(name: str, disk_budget: int | None, idmap: IdMap | None) -> None:
    """For backends whose ``clone`` honours neither option: the engine never passes them
    (it asks ``enforces_disk_budget`` and ``mounts_map_owners`` first); a caller that
    does gets an error rather than a silently uncapped or unmapped sandbox."""
    if disk_budget is not None or idmap is not None:

        raise Unsupported(detail=f"the {name} backend's clones take no disk budget and map no owners")


@runtime_checkable
class Backend(Protocol):
    name: ClassVar[str]
    # True when snapshot() copies no file data (btrfs, zfs): init says so instead of a byte count.
    instant: ClassVar[bool]

    @staticmethod
    def available(workspace: Path, /) -> tuple[bool, str]:
        """Can this process host ``workspace`` with this backend? (ok, why) for the chooser."""
        return False, "this backend cannot say whether it works here"

    def create_store(self, store: Store) -> None:
        """Create ``store.root`` (btrfs: as a nested subvolume so snapshots skip it)."""

    def estimate_bytes(self, store: Store, parent: str | None) -> int:
        """Bytes the next snapshot will copy (0 for copy-on-write backends)."""

    def snapshot(self, store: Store, snap_id: str, parent: str | None,
                 progress: Progress | None = None) -> SnapshotResult:
        """Take an immutable point-in-time image of the live workspace as ``snap_id``.

        ``parent`` is the previous snapshot (for layered and hard-linking backends). On any
        failure nothing half-made is left behind."""

    def delete_snapshot(self, store: Store, snap_id: str) -> None:
        """Remove the snapshot; a missing one is not an error."""

    def snapshot_view(self, store: Store, snap_id: str) -> AbstractContextManager[Path]:
        """A read-only tree of the snapshot for the duration of the ``with``."""

    def snapshot_bytes(self, store: Store, snap_id: str) -> int | None:
        """Bytes this snapshot alone holds, or None where the backend cannot tell."""

    def clone(self, store: Store, snap_id: str, sb_id: str, *, disk_budget: int | None = None,
              idmap: IdMap | None = None) -> Path:
        """Make a writable sandbox tree from the snapshot; return its host path.
        ``disk_budget`` only where ``enforces_disk_budget()``, ``idmap`` only where
        ``mounts_map_owners()`` (``refuse_clone_options`` elsewhere)."""

    def ensure_clone(self, store: Store, sb_id: str) -> Path:
        """Make sure the sandbox tree is usable (e.g. remount after a reboot); return it."""

    def frozen_view(self, store: Store, sb_id: str) -> AbstractContextManager[Path]:
        """A point-in-time, read-only view of the sandbox tree (for diff while it runs)."""

    def destroy_clone(self, store: Store, sb_id: str) -> None:
        """Remove the sandbox tree (unmounting first); a missing one is not an error."""

    def leftovers(self, store: Store, snapshots: set[str], sandboxes: set[str]) -> list[Leftover]:
        """Mounts, trees and layers of this store that belong to no known snapshot/sandbox."""

    # -- capabilities a backend may lack: the defaults say "cannot tell" -------------------------
    # (Backends subclass this protocol to inherit them; callers never probe with getattr.)

    @staticmethod
    def convert(workspace: Path, progress: Progress | None = None, say: Say | None = None, /) -> bool:
        """``petri init --convert``: make ``workspace`` one this backend hosts in place (btrfs:
        a subvolume at the same path). True if it converted, False if it already was one."""

        raise Unsupported(detail="this backend cannot convert a workspace (--convert)")

    def remove_leftover(self, store: Store, leftover: Leftover) -> None:
        """Undo one of ``leftovers``' findings (unmounting what is mounted first)."""

        rmtree(leftover.path)

    def reap_processes(self, store: Store, sandboxes: set[str]) -> int:
        """For ``gc`` and ``deinit``: stop the store's helper processes that serve none of
        ``sandboxes`` (fuse: its fork server); how many were stopped."""
        return 0

    def destroy_store(self, store: Store) -> None:
        """Remove the whole store with whatever of this backend is in it (deinit, a failed
        init): the caller has already removed every row's tree and the registry."""

        rmtree(store.root)

    def clone_usage(self, store: Store, sb_id: str, since: float | None = None) -> DiskUsage | None:
        """Disk space the sandbox holds beyond its base, or None where the backend cannot
        tell. ``since`` (epoch seconds): a figure measured at or after then will do, so a
        backend whose measure is O(files) may answer from the last one ``note_usage`` kept
        (``petri ls``: the sandbox's last run ended then); None: measure now. It only reads:
        a listing never writes in the store."""
        return None

    def enforces_disk_budget(self) -> bool:
        """Does ``clone(..., disk_budget=N)`` cap the sandbox's writes itself (fuse)?"""
        return False

    def disk_cap(self, store: Store) -> DiskCap:
        """How ``--disk`` is enforced for sandboxes of this store, or ``DiskLimitUnavailable``
        (exit 4) naming what would work. The default: an XFS project quota where the store's
        filesystem is mounted with ``prjquota``, else that refusal."""
        return filesystem_disk_cap(self.name, store)

    def snapshot_sandbox(self, store: Store, sb_id: str, snap_id: str, parent: str) -> SnapshotResult:
        """Take an immutable point-in-time image of the sandbox's tree as ``snap_id`` (a fork
        of a fork clones it). ``parent`` is the snapshot the sandbox was cloned from (layered
        backends stack on it). As exact as ``snapshot`` of live: atomic where the backend's
        snapshots are, else per file. On any failure nothing half-made is left behind; the
        sandbox is never changed."""

        raise Unsupported(detail=f"the {self.name} backend cannot snapshot a sandbox (fork --from sb-…)")

    def mounts_map_owners(self) -> bool:
        """Does ``clone(..., idmap=M)`` mount the sandbox showing owners through ``M``
        itself (overlay over idmapped layers, the fuse daemon)? Where not, the tree is
        plain directories and a run maps owners with an idmapped mount of its own."""
        return False

    def map_owners(self, store: Store, sb_id: str, idmap: IdMap) -> None:
        """Make an existing sandbox's mount show owners through ``idmap`` (remounting one
        made without it); only for backends whose ``mounts_map_owners()`` is True."""

        raise Unsupported(detail=f"the {self.name} backend's sandboxes are plain trees: a run maps owners itself")

    def disk_refusals(self, store: Store, sb_id: str) -> int | None:
        """How many writes the backend's own disk budget has refused in this sandbox so far
        (it only grows), or None where the backend enforces no budget itself."""
        return None

    # -- what changed: records that make diff and staleness O(changes) ---------------------------

    def change_candidates(self, store: Store, sb_id: str, cloned_from: str, since: str,
                          base: Path | None = None, tree: Path | None = None) -> Candidates:
        """Where sandbox ``sb_id`` (cloned from snapshot ``cloned_from``) may differ from
        snapshot ``since`` (``cloned_from`` itself, or the snapshot of live a fork of a fork's
        lineage began at), from the backend's own record of what moved. ``base`` and ``tree``:
        the views of ``since`` and of the sandbox the caller reads, if it holds them; they let
        the backend drop directories whose bits did not change. Without them nothing is read
        through the sandbox's mount. Default: ``FULL`` (compare everything)."""
        return FULL

    def shares_inodes(self) -> bool:
        """Does a sandbox (or live) keep the very inodes of the snapshots it comes from (btrfs
        snapshots share inode items), so that an entry whose stat key (inode, size,
        mtime_ns, ctime_ns, mode) equals the same path's in such a snapshot holds what the
        snapshot holds? (Any write moves the ctime of the inode it writes.) Where True,
        staleness compares a sandbox with its base by stat first and reads content only
        where the keys differ."""
        return False

    def snapshot_origin(self, store: Store, snap_id: str) -> tuple[object, int] | None:
        """(what ``snap_id`` was taken of, when: ns of the wall clock) where snapshots of one
        origin keep its inodes (``shares_inodes``): two of them holding a file with the same
        stat key, its ctime older than both, hold the same content (staleness then reads it
        once for all bases). None: no such promise (default)."""
        return None

    def live_record(self, store: Store, snap_id: str, taken_at: float) -> tuple[StatKeys, dict[bytes, Any]] | None:
        """What live looked like when ``snap_id`` was taken (at ``taken_at``, epoch seconds):
        every path's stat key then, and a copy in which keys not trustworthy enough to say
        "unchanged since" are None. None where the backend keeps no such record."""
        return None

    def live_candidates(self, store: Store, snap_id: str, exclude_top: Callable[[bytes], bool]
                        ) -> AbstractContextManager[LiveCandidates | None]:
        """For the ``with`` block: a view of live (live itself where the backend reads it in
        place) with where it may differ from ``snap_id`` (top-level names ``exclude_top``
        accepts left out), or None where the backend cannot tell cheaply (the caller then
        walks live against ``live_record``). Reading, never writing: no snapshot, mount or
        file is made for it."""
        return contextlib.nullcontext(None)

    def snapshots_differ(self, store: Store, a_id: str, b_id: str, skip_top: Callable[[bytes], bool]
                         ) -> Candidates | None:
        """Where two snapshots may differ (top-level names ``skip_top`` accepts left out), in
        O(changes between them), reading no content; None where the backend cannot tell so
        cheaply (default). Staleness then answers a second base from the first one's verdicts
        (see ``orchestrator.staleness``) instead of looking at live again."""
        return None

    def live_unchanged_since(self, store: Store, snap_id: str) -> bool:
        """Is live provably what snapshot ``snap_id`` (a snapshot of live) holds, cheaply
        enough that a fork from live may clone that snapshot instead of taking a new one?
        False where the backend cannot tell (a new snapshot is then always taken)."""
        return False

    # -- reading without making anything ----------------------------------------------------------

    def read_view(self, store: Store, snap_id: str) -> AbstractContextManager[Path]:
        """``snapshot_view`` for this process's own reads (diff, staleness, ``read_file``):
        the path may be one only this process can open (``/proc/self/fd/N`` of a detached
        mount), and where the backend can, nothing is made in the store or the mount table
        for it. Never hand it to another process. Default: ``snapshot_view``."""
        return self.snapshot_view(store, snap_id)

    def quiet_view(self, store: Store, sb_id: str) -> AbstractContextManager[Path]:
        """The sandbox's tree for petri's own reads (diff, ``read_file``): where reading its
        mount would be recorded as the sandbox's own reads (fuse), a view of its layers that
        is not, made (where the backend can) without anything in the store or the mount
        table; like ``read_view``, possibly a path only this process can open. Default: the
        tree itself (``ensure_clone``)."""
        return contextlib.nullcontext(self.ensure_clone(store, sb_id))

    def note_usage(self, store: Store, sb_id: str) -> None:
        """A command that changes sandbox ``sb_id`` (a fork, a run) has just finished: a
        backend whose ``clone_usage`` is a walk of the tree may measure now and keep the
        figure, so that listings (which never write) need not walk. Default: nothing."""
        return None

    def snapshot_layers(self, store: Store, snap_id: str) -> list[bytes] | None:
        """The snapshot as a stack of layers, top first, to be read with overlay's lookup
        rules (``snapshot.layers.layer_lookup``) without mounting anything; None where the
        snapshot is no layer stack (read it through ``snapshot_view``)."""
        return None

    def quiet_layers(self, store: Store, sb_id: str) -> list[bytes] | None:
        """The sandbox's tree as layers, top first, where reading it through its mount would
        be noticed (the fuse daemon records every lookup as the sandbox's own read); None:
        read it through the mount."""
        return None

    def read_set(self, store: Store, sb_id: str) -> frozenset[bytes] | None:
        """Paths the sandbox's commands read, relative to its root, or None where the backend
        does not record reads."""
        return None

    def import_snapshot(self, store: Store, snap_id: str, layer_names: list[str]) -> None:
        """Make ``snap_id`` out of layers already installed under ``store.layers`` (lowest
        first), e.g. received from another machine; only layered backends can."""
        raise SnapshotError(detail=f"the {self.name} backend cannot import a snapshot made of layers")
