"""``petri gc``: one pass over everything a workspace can leak, composed of the core's and
the services' reapers.

In order: sandboxes whose lifetime is over (``Engine.reap_expired``); under the store
lock, the event stream's rotation, half-made sandboxes whose creator died, trees of gone
sandboxes, snapshot rows without a tree, what no row accounts for (the backend's
``leftovers``: leaked mounts and trees, but not the views of a petri still running), the
backend's own processes (the fuse fork server), per-run views of petris killed mid-run,
and implicit snapshots nobody uses; then runs and races whose petri died and leaked
cgroups (``runs.gc_processes``), and promotions (``promotions.gc_promotions``: what
recovery settled, old pre-images pruned).

The report, as ``docker container prune`` gives one: ``removed`` names every sandbox whose
tree this gc took away (expired ones, also those the command's own start expired just
before: ``Engine.open`` reaps first, so ``take_expired`` hands them over) and every snapshot
it deleted; ``reaped`` counts (``expired``: sandboxes expired, kept trees included);
``reclaimed_bytes``: what those sandboxes and snapshots held beyond their bases, as ``ls``
and ``snapshots`` count it, measured as each goes (where the backend can tell).

Caveats: a petri that is alive keeps what it owns (its tmp/ entries, its cgroups), so gc
never races a running command; an implicit snapshot is dropped only once a newer snapshot
exists (the newest is the next snapshot's delta parent). A sandbox another command expired
earlier is that command's doing, not this gc's: it is not reported again. A long-lived
engine (the API, MCP) reports at its next gc what it expired since its last one.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from snapshot.errors import PetriError

from .engine import in_use_tmp
from .events import rotate_if_big
from .promotions import gc_promotions
from .registry import LIVE_STATES, pid_alive
from .results import Cleanup
from .sandbox.run_view import reap_dead_views
from .service_records import sweep as sweep_services
from .runs import gc_processes
from .sandbox import environment

if TYPE_CHECKING:
    from .engine import Engine


def collect(engine: "Engine") -> Cleanup:
    """The ``gc`` record: ``removed`` (sandbox and snapshot ids), ``reaped``
    (counts), ``reclaimed_bytes``, ``pruned_promotions``."""

    reaped = {"mounts": 0, "processes": 0, "cgroups": 0, "trees": 0,
              "promotions_finished": 0, "promotions_undone": 0, "expired": 0, "events_rotated": 0}
    gone = _Gone()
    engine.reap_expired()
    expired = engine.take_expired()  # also those Engine.open expired before gc began
    reaped["expired"] = len(expired)
    for sb, held, went in expired:
        if went:
            gone.sandbox(sb, held)
    with engine.lock():
        # Under the store lock: two gc's at once must not rotate twice (the second would
        # put a fresh, small stream over the generation the first kept).
        reaped["events_rotated"] = int(rotate_if_big(engine.store.root))
        _trees(engine, reaped, gone)
        # Snapshot rows without a tree on disk are stale.
        for snap in engine.registry.snapshots():
            if not engine.store.snapshot_dir(snap.id).exists():
                engine.registry.delete_snapshot_row(snap.id)
                gone.snapshots.append(snap.id)
        _leftovers(engine, reaped)
        _unused_implicit_snapshots(engine, gone)
    gc_processes(engine, reaped)  # fills reaped["processes"] and ["cgroups"]
    pruned = gc_promotions(engine, reaped)  # fills reaped["promotions_*"]
    return Cleanup.of(removed=gone.sandboxes + gone.snapshots, reaped=reaped, reclaimed_bytes=gone.bytes,
                      pruned_promotions=pruned)


class _Gone:
    """What this gc removed, and the bytes it held."""

    def __init__(self) -> None:
        self.sandboxes: list[str] = []
        self.snapshots: list[str] = []
        self.bytes = 0

    def sandbox(self, sb: str, held: int | None) -> None:
        if sb not in self.sandboxes:
            self.sandboxes.append(sb)
        self.bytes += held or 0


def _trees(engine: "Engine", reaped: dict[str, int], gone: _Gone) -> None:
    """Half-made sandboxes whose creator died, and trees of sandboxes that are gone."""
    for row in engine.registry.sandboxes():
        if row.state == "creating" and not pid_alive(row.owner_pid):
            held = engine.held_bytes(row) if engine.store.sandbox_dir(row.id).exists() else None
            engine._destroy_tree(row)
            engine.registry.set_state(row.id, "failed")
            reaped["trees"] += 1
            gone.sandbox(row.id, held)
        elif row.state in ("destroyed", "failed") or (row.state == "expired" and not row.keep_expired):
            if engine.store.sandbox_dir(row.id).exists():
                held = engine.held_bytes(row)
                engine._destroy_tree(row)
                reaped["trees"] += 1
                gone.sandbox(row.id, held)


def _leftovers(engine: "Engine", reaped: dict[str, int]) -> None:
    """Things on disk that no row accounts for, the backend's processes, dead runs' views."""
    known_snaps = {s.id for s in engine.registry.snapshots()}
    known_sbs = {s.id for s in engine.registry.sandboxes()
                 if s.state in LIVE_STATES or (s.state == "expired" and s.keep_expired)}
    for left in engine.backend.leftovers(engine.store, known_snaps, known_sbs):
        if in_use_tmp(engine.store.tmp, left.path):
            continue  # a view or staging area of a petri that is still running
        engine._remove_leftover(left)
        reaped["mounts" if left.kind == "mount" else "trees"] += 1
    # e.g. the fuse fork server, when it serves no known sandbox
    reaped["processes"] += engine.backend.reap_processes(engine.store, known_sbs)
    reaped["mounts"] += reap_dead_views()  # per-run views of petris killed mid-run

    # Environments (holder, relays, /tmp) of sandboxes that are gone: a petri killed mid-rm.
    living = {s.id for s in engine.registry.sandboxes() if s.state in LIVE_STATES}  # expired: its lifetime is over

    killed = sweep_services(engine.store.root, living)
    k, mounts = environment.sweep(engine.store.root, living)
    killed += k
    reaped["processes"] += killed
    reaped["mounts"] += mounts


def _unused_implicit_snapshots(engine: "Engine", gone: _Gone) -> None:
    """Implicit snapshots nobody uses, once a newer snapshot exists (the newest of live is
    the next one's delta parent; a snapshot of a sandbox is nobody's)."""
    snaps = engine.registry.snapshots()
    for i, snap in enumerate(snaps):
        if snap.implicit and (i < len(snaps) - 1 or snap.kind == "sandbox") and \
                not engine.registry.snapshot_users(snap.id):
            try:
                held = engine.backend.snapshot_bytes(engine.store, snap.id)
            except (OSError, PetriError):
                held = None  # it goes all the same
            engine.registry.delete_snapshot_row(snap.id)
            engine.backend.delete_snapshot(engine.store, snap.id)
            gone.snapshots.append(snap.id)
            gone.bytes += held or 0
