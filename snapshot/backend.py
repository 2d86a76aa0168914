"""The one protocol every clone backend implements, and the records it returns.

A backend turns the live workspace into immutable snapshots and snapshots into writable
sandbox trees. It knows trees and nothing of processes, the registry or time: the
orchestrator owns ids (it passes them in) and records what the backend returns.

Every backend must pass ``tests/backend_conformance.py`` (the behavioural checker, in the
manner of trio's ``check_one_way_stream``).
"""
from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ClassVar, Protocol, runtime_checkable

from .store import Store

# Called with the number of bytes copied so far and the total expected (0 when unknown).
Progress = Callable[[int, int], None]


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


@runtime_checkable
class Backend(Protocol):
    name: ClassVar[str]
    # True when snapshot() copies no file data (btrfs, zfs): init says so instead of a byte count.
    instant: ClassVar[bool]

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

    def clone(self, store: Store, snap_id: str, sb_id: str) -> Path:
        """Make a writable sandbox tree from the snapshot; return its host path."""

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

    def clone_usage(self, store: Store, sb_id: str, since: float | None = None) -> DiskUsage | None:
        """Disk space the sandbox holds beyond its base, or None where the backend cannot
        tell. ``since`` (epoch seconds): a figure measured at or after then will do, so a
        backend whose measure is O(files) may answer from its last one (``petri ls``: the
        sandbox's last run ended then); None: measure now."""
        return None

    def enforces_disk_budget(self) -> bool:
        """Does ``clone(..., disk_budget=N)`` cap the sandbox's writes itself (fuse)?"""
        return False

    def disk_refusals(self, store: Store, sb_id: str) -> int | None:
        """How many writes the backend's own disk budget has refused in this sandbox so far
        (it only grows), or None where the backend enforces no budget itself."""
        return None

    def snapshot_layers(self, store: Store, snap_id: str) -> list[Path] | None:
        """The snapshot as a stack of immutable layers in the overlay format
        (:mod:`snapshot.layers`), LOWEST first, or None where the backend keeps no layers
        (a caller then reads ``snapshot_view`` as one full tree)."""
        return None

    def import_snapshot(self, store: Store, snap_id: str, layer_names: list[str]) -> None:
        """Make ``snap_id`` out of layers already installed under ``store.layers`` (lowest
        first), e.g. received from another machine; only layered backends can."""
        from .errors import SnapshotError
        raise SnapshotError(detail=f"the {self.name} backend cannot import a snapshot made of layers")
