"""The workspace engine, the core: registry + store + backend + lock.

It owns the registry and the lifecycle of snapshots and sandboxes; the backends only build
trees. Everything here is synchronous and cheap to import (no trio, no pydantic): running
commands lives in ``orchestrator.runs`` on trio. The engine imports no service (runs,
race, promotions, staleness, lineage, stages, audit, kpi...): ``orchestrator.services``
composes them around its operations (``tests/repo/test_import_graph.py`` holds it to that).
Recovery at open is ``orchestrator.recovery``; killing a sandbox's processes is
``orchestrator.reaper``; ``petri gc`` is ``orchestrator.gc``.

Crash safety of the lifecycle: a sandbox row is written (state ``creating``, with the
creator's pid) before its tree is made, and a snapshot row after its tree is complete, so
``gc`` can always tell a half-made thing from a live one. A destroy (or an expiry) writes
the row's new state first, owned by the destroying pid, then kills the processes and
removes the tree, then lets go (``Registry.begin_destroy``). Every command's start
(``Engine.open``) finishes what a dead petri was making or destroying (``settle_owned``) and
removes the cgroups of runs whose petri died; a fork interrupted anywhere undoes itself.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Self

from snapshot.backend import Backend, Leftover, Progress
from snapshot.errors import PetriError
from snapshot.choose import choose, get_backend
from snapshot.choose import convert as convert_workspace
from snapshot.store import Store
from snapshot.osutil import rmtree

from . import events, promoted, recovery
from .limits import Limits
from .results import InitResult, SandboxInfo, Snapshot
from .errors import LimitsUnavailable, SandboxGone, SandboxesExist, SnapshotInUse, UnknownId, UsageError
from .registry import (LIVE_STATES, Registry, SandboxRow, SnapshotRow, keep_reserve, new_id, now,
                       pid_alive, rfc3339)
from .sandbox.run_view import reap_dead_views, remove_sandbox_views
from .service_records import stop_all as stop_services
from .units import check_label, human_bytes, validate_limits
from .workspace import (act_as_store_owner, add_git_exclude, check_can_init, find_workspace, remove_git_exclude,
                        store_lock)
from .results import Rollback
import orchestrator
import snapshot

if TYPE_CHECKING:
    from .results import Rollback

Say = Callable[[str], None]
NO_LIMITS = Limits()
_SANDBOX_ID = re.compile(r"sb-[0-9a-f]{8}")


def path_text(p: bytes) -> str:
    """A path for JSON and people: UTF-8, with invalid bytes written as \\xNN."""
    return p.decode("utf-8", "backslashreplace")


def path_fields(p: bytes) -> dict[str, str]:
    d = {"path": path_text(p)}
    try:
        p.decode("utf-8")
    except UnicodeDecodeError:
        import base64  # rare (a path that is not UTF-8): not an import of every command

        d["path_b64"] = base64.b64encode(p).decode()
    return d


class Engine:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.store = Store(root)
        self.registry = Registry(self.store.registry)
        self._backend: Backend | None = None
        # Sandboxes this engine expired and not yet reported by a gc (``take_expired``):
        # (id, bytes its tree held beyond its base or None, whether the tree went).
        self._expired: list[tuple[str, int | None, bool]] = []
        # The ids the latest ``fork`` call of this engine was making, set before any row is
        # written: after an interrupt, the registry says which of them were made.
        self.forking: list[str] = []

    # -- opening ------------------------------------------------------------------------
    @classmethod
    def open(cls, start: Path | None = None, override: str | None = None, *, reap: bool = True) -> Self:
        root = find_workspace(start, override)
        act_as_store_owner(root)  # root in a user's store becomes that user before touching it
        engine = cls(root)
        engine.store.close_to_others()  # stores made before it was 0700
        if reap:
            reap_dead_views()  # per-run mounts of a petri killed mid-run
            engine.recover_promotions()
            overdue, owned = engine.registry.unsettled(now())  # one pass over the table for both
            engine.settle_owned(owned)
            engine.reap_expired(overdue)
            orphans = engine.registry.settle_orphaned_runs()  # a run whose petri died is not "running"
            if orphans:
                # and its cgroup goes with it, not at the next gc
                orchestrator.sandbox.reaper.remove_run_cgroups(orphans)
            keep_reserve(engine.store.root)  # room for `rm` and `gc` on a full disk
        return engine

    def recover_promotions(self, *, locked: bool = False) -> tuple[list[str], list[str]]:
        """Finish or undo a promotion a killed petri left half-done (guarantee 2): every
        command starts with this; it is one directory listing when there is nothing to do."""
        return recovery.recover_interrupted(self, locked=locked)

    def close(self) -> None:
        self.registry.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def backend_name(self) -> str:
        return self.registry.get_meta("backend") or "copy"

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            self._backend = get_backend(self.backend_name)
        return self._backend

    def lock(self):
        return store_lock(self.store.root)

    # -- init / deinit ------------------------------------------------------------------
    @classmethod
    def init(cls, path: Path, backend: str = "auto", *, convert: bool = False,
             progress: Progress | None = None, say: Say = lambda s: None) -> tuple[Self, InitResult]:
        root = check_can_init(path)
        if convert:
            backend = convert_workspace(root, progress, say) or backend
        name, reason = choose(root, backend)
        chosen = get_backend(name)
        store = Store(root)
        try:
            chosen.create_store(store)
            store.make_dirs()
            reg = Registry(store.registry, create=True)
            reg.set_meta("backend", name)
            reg.set_meta("reason", reason)
            reg.set_meta("created_at", str(now()))
            st = os.stat(root)
            reg.set_meta("owner", f"{st.st_uid}:{st.st_gid}")
            reg.close()
            keep_reserve(store.root)
            add_git_exclude(root)
            engine = cls(root)
            if not chosen.instant:
                total = chosen.estimate_bytes(store, None)
                say(f"{name}: the first snapshot copies {total} bytes ({_human(total)}) of {root}")
            snap = engine.take_snapshot("initial snapshot", kind="user", progress=progress)
        except BaseException:
            _remove_store(store, chosen)
            raise
        return engine, InitResult.of(workspace=str(root), backend=name, reason=reason, snapshot=snap.id)

    def deinit(self, *, force: bool = False) -> dict[str, Any]:
        """Remove the store. Reaps first (processes, views and mounts, daemons), then trees
        and snapshots, then everything else in the store, and the registry last: a deinit
        that fails half-way leaves a registry the next ``deinit`` can start from again."""
        live = [s for s in self.registry.sandboxes() if s.state in LIVE_STATES or
                (s.state == "expired" and s.keep_expired)]
        if live and not force:
            raise SandboxesExist(count=len(live), ids=", ".join(s.id for s in live[:5]))
        removed = []
        with self.lock():
            for sb in live:
                self._stop_sandbox_processes(sb, "destroyed")
                events.sandbox_destroyed(self.store.root, sb.id)
            self.reap_dead_tmp()

            orchestrator.sandbox.environment.sweep(self.store.root, ())  # any a killed petri left behind
            for sb in self.registry.sandboxes():
                self._destroy_tree(sb)
                removed.append(sb.id)
            for snap in reversed(self.registry.snapshots()):
                self.backend.delete_snapshot(self.store, snap.id)
                removed.append(snap.id)
            # What no row accounts for: views of petris still running, leaked mounts.
            for left in self.backend.leftovers(self.store, set(), set()):
                self._remove_leftover(left)
            self.backend.reap_processes(self.store, set())
        self.close()
        _remove_store(self.store, self.backend)
        remove_git_exclude(self.root)
        return {"workspace": str(self.root), "removed": removed}

    # -- snapshots ----------------------------------------------------------------------
    def take_snapshot(self, message: str = "", *, kind: str = "user",
                      progress: Progress | None = None) -> SnapshotRow:
        with self.lock():
            return self._take_snapshot_locked(message, kind, progress)

    def _take_snapshot_locked(self, message: str, kind: str, progress: Progress | None) -> SnapshotRow:
        # A promoter killed while we waited for the lock may have left staging in live.
        self.recover_promotions(locked=True)
        parent = self.registry.latest_snapshot()
        snap_id = new_id("s")
        result = self.backend.snapshot(self.store, snap_id, parent.id if parent else None, progress)
        row = SnapshotRow(id=snap_id, message=message, implicit=(kind == "implicit"), created_at=now(),
                          backend=self.backend_name, parent=parent.id if parent else None,
                          bytes_copied=result.bytes_copied, kind=kind)
        return self.record_snapshot(row)

    def record_snapshot(self, row: SnapshotRow) -> SnapshotRow:
        """The registry row of a snapshot the backend just made (the commit point); if it
        cannot be written, the snapshot goes. Every snapshot passes here (user, implicit,
        safety, of a sandbox): the one emitter of ``snapshot.created``."""
        try:
            self.registry.add_snapshot(row)
        except BaseException:
            self.backend.delete_snapshot(self.store, row.id)
            raise
        events.snapshot_created(self.store.root, snapshot=row.id, kind=row.kind, parent=row.parent,
                                sandbox=row.sandbox)
        return row

    def snapshot_record(self, row: SnapshotRow, *, with_bytes: bool = True) -> Snapshot:
        """The snapshot's record (``snapshot``, a row of ``snapshots``); ``with_bytes`` False
        leaves ``bytes`` None (a snapshot just taken: its size is a walk)."""
        return Snapshot.of(id=row.id, message=row.message, implicit=row.implicit, kind=row.kind,
                           created_at=rfc3339(row.created_at), backend=row.backend, parent=row.parent,
                           bytes_copied=row.bytes_copied,
                           bytes=self.backend.snapshot_bytes(self.store, row.id) if with_bytes else None,
                           used_by=self.registry.snapshot_users(row.id), sandbox=row.sandbox, origin=row.origin)

    def resolve_snapshot(self, ident: str) -> SnapshotRow:
        _, sid = self.registry.resolve(ident, ("snapshot",))
        row = self.registry.snapshot(sid)
        assert row is not None
        return row

    # -- sandboxes ----------------------------------------------------------------------
    def resolve_sandbox(self, ident: str) -> SandboxRow:
        _, sid = self.registry.resolve(ident, ("sandbox",))
        row = self.registry.sandbox(sid)
        assert row is not None
        return row

    def sandbox_by_id(self, sb_id: str) -> SandboxRow:
        """The registry's row of the sandbox with exactly this id (no label or prefix, unlike
        ``resolve_sandbox``); ``UnknownId`` if there is none, destroyed ones included."""
        row = self.registry.sandbox(sb_id)
        if row is None:
            raise UnknownId(what="sandbox", ident=sb_id, listing="`petri ls`")
        return row

    def fork(self, source: str = "live", n: int = 1, *, label: str | None = None,
             limits: Limits = NO_LIMITS, keep_expired: bool = False,
             ids: "list[str] | None" = None, system: bool = False,
             profile: str | None = None) -> list[SandboxRow]:
        """``ids``: the new sandboxes' ids, made by the caller (a cluster race names a
        candidate's sandbox before any machine makes it, and keeps the name when the
        winner is rebuilt here); by default fresh ones. ``system``: each gets a writable
        layer over the host's system paths (``sandbox.system_layer``), refused (exit 4) where
        this petri cannot mount one."""
        if ids is not None and (len(ids) != n or len(set(ids)) != n or
                                not all(isinstance(i, str) and _SANDBOX_ID.fullmatch(i) for i in ids)):
            raise UsageError(detail=f"fork: ids must be {n} distinct sandbox ids (sb-<8 hex>), not {ids!r}")
        started = now()
        if n < 1:
            raise UsageError(detail=f"-n must be at least 1, not {n}")
        if n > 1000:
            raise UsageError(detail=f"-n {n} is more than 1000 sandboxes in one call")
        labels: list[str | None] = [None] * n
        if label is not None:
            labels = [label] if n == 1 else [f"{label}-{i + 1}" for i in range(n)]
            for lb in labels:
                check_label(lb)
                if self.registry.label_taken(lb):
                    raise UsageError(detail=f"label {lb!r} is already used by a live sandbox")
                if lb.startswith(("s-", "sb-", "p-")):
                    raise UsageError(detail=f"label {lb!r} looks like an id; pick another")
        if system:

            why = orchestrator.sandbox.system_layer.unavailable(self.store.root)
            if why:
                raise LimitsUnavailable(what="--system (a writable system layer)", why=why)
        lineage: dict[str, Any] = {}
        if source == "live":
            base = self.snapshot_for_fork()
        else:
            base, lineage = self.fork_source(source)
        created = now()
        expires = created + limits.ttl_s if limits.ttl_s else None
        rows = []
        for i in range(n):
            sb_id = ids[i] if ids is not None else new_id("sb")
            rows.append(SandboxRow(id=sb_id, label=labels[i], backend=self.backend_name, state="creating",
                                   base=base.id, path=str(self.store.sandbox_tree(sb_id)), created_at=created,
                                   expires_at=expires, limits=limits.as_dict(), keep_expired=keep_expired,
                                   owner_pid=os.getpid(), meta={**lineage, "fork_started_at": started},
                                   system=system, profile=profile))
        self.forking = [r.id for r in rows]
        try:
            self.registry.add_sandboxes(rows)
        except Exception as e:  # the unique label index lost a race with another petri
            if "UNIQUE" in str(e):
                raise UsageError(detail=f"label {label!r} was taken by a concurrent fork") from None
            raise

        options = self.clone_options(limits)

        trees: dict[str, str] = {}

        def make(row: SandboxRow) -> None:
            # The backend says where the tree is (fuse: a directory of its host's mount).
            trees[row.id] = str(self.backend.clone(self.store, base.id, row.id, **options))

        try:
            _clone_all(rows, make)
            with self.registry.write() as db:
                for row in rows:
                    db.execute("UPDATE sandboxes SET state = 'ready', owner_pid = NULL, path = ? WHERE id = ?",
                               (trees.get(row.id, row.path), row.id))
        except BaseException:
            # Nothing half-made stays: drop every sandbox of this call (a failure, or an
            # interrupt anywhere in here). What a second interrupt cuts short is still owned
            # by this process: the next command finishes it (settle_owned).
            for row in rows:
                try:
                    self.backend.destroy_clone(self.store, row.id)
                except Exception:
                    pass
                self.registry.update_sandbox(row.id, state="failed", owner_pid=None)
            raise
        made = [self.sandbox_by_id(r.id) for r in rows]
        for row in made:
            self.backend.note_usage(self.store, row.id)
            events.sandbox_created(self.store.root, sandbox=row.id, label=row.label, base=row.base, path=row.path)
        return made

    def snapshot_for_fork(self) -> SnapshotRow:
        """The snapshot a fork from live clones: the newest snapshot of live again when it is
        an implicit one and the backend proves live unchanged since (``live_unchanged_since``:
        btrfs, by generation), else a new implicit one. Each fork used to take its own, which
        on btrfs commits the filesystem's transaction and leaves a subvolume behind."""
        with self.lock():
            self.recover_promotions(locked=True)
            latest = self.registry.latest_snapshot()
            if latest is not None and latest.kind == "implicit" and \
                    self.backend.live_unchanged_since(self.store, latest.id):
                return latest
            return self._take_snapshot_locked("fork from live", "implicit", None)

    def fork_source(self, source: str) -> tuple[SnapshotRow, dict[str, Any]]:
        """The snapshot a fork from ``source`` (not ``live``) clones, and the lineage its
        children record. Here: a snapshot, no lineage; ``orchestrator.services`` adds forks of
        sandboxes (``orchestrator.lineage``)."""
        return self.resolve_snapshot(source), {}

    def sandbox_record(self, row: SandboxRow, *, staleness: dict[str, Any] | None = None,
                       fresh_usage: bool = True) -> SandboxInfo:
        """The sandbox's record (a row of ``ls``, ``status``). ``fresh_usage`` False (``petri ls``): a backend whose
        usage measure is a walk of the whole tree may give its figure from after the
        sandbox's last run instead of walking again."""
        usage = None
        if row.state in LIVE_STATES or (row.state == "expired" and row.keep_expired):
            try:
                usage = self.backend.clone_usage(self.store, row.id,
                                                 None if fresh_usage else self._last_activity(row))
            except (OSError, PetriError):
                usage = None  # a tree that cannot be read now: say nothing rather than fail `ls`
        left = None if row.expires_at is None else max(0.0, row.expires_at - now())
        return SandboxInfo.of(
            id=row.id, label=row.label, backend=row.backend, state=row.state, base=row.base, path=row.path,
            created_at=rfc3339(row.created_at), expires_at=rfc3339(row.expires_at), time_left_s=left,
            limits=row.limits, keep_expired=row.keep_expired, profile=row.profile,
            usage={"disk_bytes": usage.bytes if usage else None,
                   "disk_measure": usage.measure if usage else None,
                   "disk_measured_at": rfc3339(usage.measured_at) if usage and usage.measured_at else None,
                   "peak_memory_bytes": row.peak_memory_bytes},
            last_exit_code=row.last_exit_code, stale=staleness,
            promoted=promoted.summary(promoted.in_place(self.registry, row.id)),
            parent=(row.meta or {}).get("parent"), generation=int((row.meta or {}).get("generation", 0)),
            **({"system": self._system_doc(row)} if row.system else {}))

    def fork_record(self, row: SandboxRow) -> SandboxInfo:
        """A sandbox just forked, as ``fork`` lists it (no usage, state or staleness yet)."""
        return SandboxInfo.of(id=row.id, label=row.label, path=row.path, backend=row.backend, base=row.base,
                              expires_at=rfc3339(row.expires_at), limits=row.limits, profile=row.profile,
                              parent=(row.meta or {}).get("parent"),
                              generation=int((row.meta or {}).get("generation", 0)))

    def _system_doc(self, row: SandboxRow) -> dict[str, Any]:
        """A ``--system`` sandbox's layer: its size, and how many paths it changed."""

        return {"bytes": orchestrator.sandbox.system_layer.size(self.store.root, row.id),
                "changes": len(orchestrator.sandbox.system_layer.changes(self.store.root, row.id))}

    def _last_activity(self, row: SandboxRow) -> float | None:
        """When the sandbox last changed through petri: its last run's end (None while one
        is running: measure now), or its creation."""
        got = self.registry.db.execute(
            "SELECT COUNT(*) - COUNT(finished_at), MAX(finished_at) FROM runs WHERE sandbox = ?", (row.id,)).fetchone()
        if got[0]:
            return None
        return max(row.created_at, got[1] or 0.0)

    def sandbox_tree(self, row: SandboxRow) -> Path:
        if row.state not in LIVE_STATES and not (row.state == "expired" and row.keep_expired):
            raise SandboxGone(ident=row.id, state=row.state)
        return self.backend.ensure_clone(self.store, row.id)

    def _destroy_tree(self, row: SandboxRow) -> None:
        self.backend.destroy_clone(self.store, row.id)

    def remove(self, idents: Iterable[str] = (), *, all_sandboxes: bool = False,
               expired: bool = False) -> list[str]:
        targets: list[tuple[str, str]] = []
        for ident in idents:
            targets.append(self.registry.resolve(ident, ("sandbox", "snapshot")))
        if all_sandboxes:
            targets += [("sandbox", s.id) for s in self.registry.sandboxes()
                        if s.state in LIVE_STATES or s.state == "expired" and s.keep_expired]
        if expired:
            targets += [("sandbox", s.id) for s in self.registry.sandboxes()
                        if s.state == "expired" and s.keep_expired]
        removed: list[str] = []
        seen = set()
        for kind, ident in targets:
            if ident in seen:
                continue
            seen.add(ident)
            if kind == "sandbox":
                self.destroy_sandbox(ident)
                removed.append(ident)
        for kind, ident in targets:
            if kind == "snapshot":
                self.delete_snapshot(ident)
                removed.append(ident)
        return removed

    def destroy_sandbox(self, sb_id: str, *, state: str = "destroyed") -> None:
        """Mark it ``destroyed`` (or ``expired``), kill its processes, remove its tree: the
        one place a sandbox is destroyed, so ``sandbox.destroyed`` is written once. In that
        order, owned by this process until the end (``Registry.begin_destroy``): a petri
        killed at any instant leaves a row the next command finishes (``settle_owned``)."""
        if state not in ("destroyed", "expired"):
            raise ValueError(f"destroy_sandbox: state {state!r}")
        row = self.sandbox_by_id(sb_id)
        extra = {"keep_expired": False} if state == "expired" else {}
        self.registry.begin_destroy(sb_id, state, "ttl" if state == "expired" else "destroyed", os.getpid(),
                                    **extra)
        _fault("destroy-marked")
        self._finish_destroy(row, state, tree=True)

    def _finish_destroy(self, row: SandboxRow, state: str, *, tree: bool, mark: bool = False) -> None:
        """The rest of a destroy or an expiry whose row says so already: processes, the tree
        (``tree``), then let go of the row and say so (``sandbox.destroyed``/``expired``)."""
        self._stop_sandbox_processes(row, "ttl" if state == "expired" else "destroyed", mark=mark)
        _fault("destroy-stopped")
        if tree:
            self._destroy_tree(row)
        _fault("destroy-tree")
        if self.registry.end_destroy(row.id, os.getpid()):
            if state == "expired":
                events.sandbox_expired(self.store.root, row.id)
            else:
                events.sandbox_destroyed(self.store.root, row.id)

    def settle_owned(self, rows: list[SandboxRow]) -> list[str]:
        """Finish what petris that died left half-done (every command starts with this):
        a sandbox it was destroying or expiring (its row says so; its processes and tree may
        not be gone), or making (``creating``: its tree goes, it is ``failed``). Those of a
        petri still alive are its own business. Returns their ids."""
        done = []
        me = os.getpid()
        for row in rows:
            if row.owner_pid is None or row.owner_pid == me or pid_alive(row.owner_pid):
                continue
            if not self.registry.take_over(row.id, row.owner_pid, me):
                continue  # another command is finishing it
            if row.state == "creating":
                self._destroy_tree(row)
                self.registry.update_sandbox(row.id, state="failed", owner_pid=None)
            elif row.state in ("destroyed", "expired"):
                self._finish_destroy(row, row.state, tree=not (row.state == "expired" and row.keep_expired))
            else:
                self.registry.end_destroy(row.id, me)  # nothing half-done about it
            done.append(row.id)
        return done

    def _stop_sandbox_processes(self, row: SandboxRow, why: str, *, mark: bool = True) -> int:
        """Kill every process of the sandbox's runs (in any petri process), remove their
        cgroups and the per-run views of its tree; its live runs' records end ``killed_by:
        why`` (``mark``; ``begin_destroy`` marked them already). How many processes were
        killed."""


        if mark:
            self.registry.mark_live_runs(row.id, why)
        try:
            # Services first: a supervisor alive would restart what the cgroup sweep kills.
            return stop_services(self.store.root, row.id) + orchestrator.sandbox.reaper.kill_sandbox(row.id)
        finally:
            remove_sandbox_views(self.store.root, row.id)  # a view pins the tree (a btrfs subvolume)
            orchestrator.sandbox.environment.destroy(self.store.root, row.id)  # its network, /tmp and published ports
            from .run_env import remove

            remove(self.store.root, row.id)  # the store's copy of its secrets

    def check_limits(self, limits: Limits) -> dict[str, Any]:
        """Refuse limits that are malformed (exit 2). Whether this machine can enforce them
        (exit 4) is ``orchestrator.services``' (it knows the runner and the disk caps)."""
        validate_limits(limits)
        return {"warnings": [], "quotas_enabled": False}

    def clone_options(self, limits: Limits) -> dict[str, Any]:
        """Clone arguments: a backend that caps writes itself (fuse) gets the --disk budget; one
        whose own mount maps owners (overlay, fuse) gets a root-owned workspace's id map."""
        opts: dict[str, Any] = {}
        if limits.disk_bytes and self.backend.enforces_disk_budget():
            opts["disk_budget"] = limits.disk_bytes
        if self.backend.mounts_map_owners():
            idmap = orchestrator.run_as.owner_idmap(self)
            if idmap is not None:
                opts["idmap"] = idmap
        return opts

    def delete_snapshot(self, snap_id: str) -> None:
        with self.lock():
            users = self.registry.snapshot_users(snap_id)
            if users:
                raise SnapshotInUse(ident=snap_id, users=", ".join(users))
            self.registry.delete_snapshot_row(snap_id)
            self.backend.delete_snapshot(self.store, snap_id)

    # -- expiry and gc ------------------------------------------------------------------
    def reap_expired(self, overdue: list[SandboxRow] | None = None) -> list[str]:
        """Expire every sandbox whose lifetime has passed (any petri command calls this,
        ``Engine.open`` first of all: ``take_expired`` is how ``gc`` reports them).
        ``overdue``: those rows, read already (``Registry.unsettled``)."""
        reaped = []
        me = os.getpid()
        for row in self.registry.overdue(now()) if overdue is None else overdue:
            # the row says so first (see destroy_sandbox); another petri may have got there first
            if not self.registry.begin_destroy(row.id, "expired", "ttl", me, only_from=LIVE_STATES):
                continue
            self._stop_sandbox_processes(row, "ttl", mark=False)
            held, gone = None, False
            if not row.keep_expired:
                held = self.held_bytes(row)
                try:
                    self._destroy_tree(row)
                    gone = True
                except Exception:
                    pass  # gc retries leaked trees
            self.registry.end_destroy(row.id, me)
            events.sandbox_expired(self.store.root, row.id)
            reaped.append(row.id)
            self._expired.append((row.id, held, gone))
        return reaped

    def take_expired(self) -> list[tuple[str, int | None, bool]]:
        """The sandboxes this engine expired since the last call: (id, bytes its tree held
        beyond its base, or None where the backend cannot tell, whether the tree went)."""
        out, self._expired = self._expired, []
        return out

    def held_bytes(self, row: SandboxRow) -> int | None:
        """What the sandbox's tree holds beyond its base (what removing it gives back), as
        ``ls`` counts it but measured now: a figure kept at its last run misses what was
        written through the host path since. Where that is a walk of the tree (copy), it
        costs less than the removal that follows, which visits every file too. None where
        the backend cannot tell."""
        try:
            usage = self.backend.clone_usage(self.store, row.id)
        except (OSError, PetriError):
            return None  # a tree that cannot be read: it goes all the same
        return None if usage is None else usage.bytes

    # -- rollback -----------------------------------------------------------------------
    def rollback_snapshot(self, ident: str) -> "Rollback":
        """Restore live to a snapshot as one journaled transaction (``snapshot.restore``),
        after a safety snapshot of live as it is, so the rollback can itself be undone."""

        target = self.resolve_snapshot(ident)
        with self.lock():
            safety = self._take_snapshot_locked(f"safety before rollback to {target.id}", "safety", None)
            # pending before the view is mounted: a kill anywhere is settled by the next command
            with recovery.pending(self, new_id("r")) as txn_id:
                with self.backend.snapshot_view(self.store, target.id) as src:
                    ops = snapshot.restore.plan_restore(bytes(src), bytes(self.root))
                    changed, left = snapshot.restore.execute_restore(ops, src, self.root, self.store.journal, txn_id)
        import base64


        # left_alone only where something stood in the way (a directory swapped for a symlink meanwhile)
        return Rollback.of(restored=target.id, kind="snapshot", changed=[path_text(p) for p in changed],
                           changed_b64=[base64.b64encode(p).decode() for p in changed], safety_snapshot=safety.id,
                           **({"left_alone": [path_text(p) for p in left]} if left else {}))

    # -- leftovers ----------------------------------------------------------------------
    def _remove_leftover(self, left: Leftover) -> None:
        self.backend.remove_leftover(self.store, left)

    def reap_dead_tmp(self) -> int:
        """Unmount and remove what petris that died left under tmp/ (the views a killed
        promote, diff or rollback mounted, half-made trees); the caller holds the store
        lock. Entries of a petri still alive are left alone. Returns how many went."""
        try:
            entries = sorted(self.store.tmp.iterdir())
        except FileNotFoundError:
            return 0
        n = 0
        for path in entries:
            if _tmp_owner_alive(path.name):
                continue
            self._remove_leftover(Leftover("tree", path))
            n += 1
        return n


def _fault(step: str) -> None:
    """A fault point (``snapshot.transaction``: SIGKILL here when PETRI_FAULT_KILL_AT asks),
    imported only when a test asks for one."""
    if "PETRI_FAULT_KILL_AT" in os.environ:
        snapshot.transaction.fault_point(step)


def _clone_all(rows: list[SandboxRow], make: Callable[[SandboxRow], None]) -> None:
    """``make`` each row's clone, up to 8 at once; return once every clone that was started
    has ended, raising the first failure (or an interrupt: the clones not started yet are
    not started, those running are waited for, so nothing is made behind the caller's back)."""
    workers = min(len(rows), 8)
    if workers == 1:
        make(rows[0])
        return
    from concurrent.futures import ThreadPoolExecutor  # 4 ms to import: only when needed

    failures: list[BaseException] = []
    pool = ThreadPoolExecutor(max_workers=workers)
    try:
        for fut in [pool.submit(make, r) for r in rows]:
            try:
                fut.result()
            except Exception as e:
                failures.append(e)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    if failures:
        raise failures[0]


def in_use_tmp(tmp: Path, path: Path) -> bool:
    """Is ``path`` (or the tmp/ entry it lies in) named for a process that is still alive?"""
    try:
        first = path.relative_to(tmp).parts[0]
    except (ValueError, IndexError):
        return False
    return _tmp_owner_alive(first)


def _tmp_owner_alive(name: str) -> bool:
    parts = name.split(".")
    for p in parts[1:]:
        if p.isdigit():
            return pid_alive(int(p))
    return False


def _human(n: int) -> str:
    return human_bytes(n)


def _remove_store(store: Store, backend: Backend) -> None:
    """Remove the whole store, whatever state it is in (init failure, deinit): everything
    but the registry first, the registry last (a failure before that leaves a store that
    ``deinit`` can open and finish), then the store itself."""
    if not store.root.exists():
        return
    last = {store.registry.name, store.registry.name + "-wal", store.registry.name + "-shm"}
    for entry in sorted(store.root.iterdir()):
        if entry.name in last:
            continue
        if entry.is_dir() and not entry.is_symlink():
            backend.remove_leftover(store, Leftover("tree", entry))
        else:
            rmtree(bytes(entry))
    for name in sorted(last, key=len, reverse=True):  # the WAL and its index, then the database
        try:
            os.unlink(store.root / name)
        except FileNotFoundError:
            pass
    backend.destroy_store(store)
