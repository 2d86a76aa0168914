"""The registry: one SQLite file (WAL) per workspace, the source of truth for ids and states.

Several ``petri`` processes (three agents forking at the same instant) share it: every write
is one ``BEGIN IMMEDIATE`` transaction and readers never block writers (WAL). The schema
version is ``PRAGMA user_version``; a newer one than this code knows is refused.

Rows are frozen dataclasses, not pydantic models: the registry is read on every command and
start-up time matters (pydantic lives at the JSON/MCP/config edges).

A full filesystem: even a read in WAL mode needs to grow ``registry.db-shm``, so a full disk
would lock the user out of the very commands that free space (``rm``, ``gc``). The store
keeps a small *reserve* file (``reserve``, 8 MiB, allocated while there is room); when the
filesystem is full (SQLITE_FULL, or an I/O error with no space left) the reserve is released
and the open or the write tried again, and a write that still cannot be done is one clear
error (``StoreFull``, exit 1). The reserve comes back once there is room again. It is also
released before the registry is opened when less than its size is free: the shm file is
written through a shared mapping, and on a full btrfs a write to a mapped page that needs
a new block kills the process with SIGBUS (seen: ``petri ls`` on a full btrfs, exit -7)
instead of returning an error. So on a full disk even a read-only command gives up the
reserve: it is what the reserve is for.

Caveats: space freed on btrfs by deleting a subvolume comes back only as the cleaner works;
the reserve is allocated with ``fallocate`` and skipped where that is not supported. Commits
are ``synchronous = NORMAL``: one survives a power loss once the WAL is synced, by SQLite's
checkpoint (automatic every ~1000 pages, and when the last connection closes) or by a later
``write(durable=True)``; the CLI's hot commands never close theirs and end with such a write
(``orchestrator.cli``).
"""
from __future__ import annotations

import json
import os
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

from .errors import AmbiguousId, RegistryTooNew, StoreFull, UnknownId
from .sandbox.procs import pid_alive  # noqa: F401 (its callers import it from here)
from .units import shown

SCHEMA_VERSION = 6
RESERVE_NAME = "reserve"
RESERVE_BYTES = 8 << 20
ROOM_FOR_RESERVE = 64 << 20  # (re)made only when this much is free besides it
_SQLITE_FULL, _SQLITE_IOERR = 13, 10

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS snapshots (
    id TEXT PRIMARY KEY, message TEXT NOT NULL DEFAULT '', implicit INTEGER NOT NULL,
    created_at REAL NOT NULL, backend TEXT NOT NULL, parent TEXT, bytes_copied INTEGER NOT NULL DEFAULT 0,
    kind TEXT NOT NULL DEFAULT 'user', sandbox TEXT, origin TEXT);
CREATE TABLE IF NOT EXISTS sandboxes (
    id TEXT PRIMARY KEY, label TEXT, backend TEXT NOT NULL, state TEXT NOT NULL, base TEXT NOT NULL,
    path TEXT NOT NULL, created_at REAL NOT NULL, expires_at REAL, limits TEXT NOT NULL,
    keep_expired INTEGER NOT NULL DEFAULT 0, last_exit_code INTEGER, peak_memory_bytes INTEGER,
    owner_pid INTEGER, meta TEXT NOT NULL DEFAULT '{}', system INTEGER NOT NULL DEFAULT 0, profile TEXT);
CREATE UNIQUE INDEX IF NOT EXISTS sandboxes_live_label ON sandboxes(label)
    WHERE label IS NOT NULL AND state NOT IN ('destroyed', 'failed', 'expired');
CREATE TABLE IF NOT EXISTS runs (
    sandbox TEXT NOT NULL, n INTEGER NOT NULL, argv TEXT NOT NULL, started_at REAL NOT NULL,
    finished_at REAL, exit_code INTEGER, duration_s REAL, killed_by TEXT, limits_hit TEXT NOT NULL DEFAULT '[]',
    stdout_path TEXT NOT NULL, stderr_path TEXT NOT NULL, peak_memory_bytes INTEGER, pid INTEGER,
    output TEXT, PRIMARY KEY (sandbox, n));
CREATE TABLE IF NOT EXISTS promotions (
    id TEXT PRIMARY KEY, sandbox TEXT NOT NULL, created_at REAL NOT NULL, state TEXT NOT NULL,
    doc TEXT NOT NULL DEFAULT '{}');
"""

SANDBOX_STATES = ("creating", "ready", "running", "exited", "expired", "destroyed", "failed")
LIVE_STATES = ("creating", "ready", "running", "exited")


def now() -> float:
    return time.time()


def rfc3339(ts: float | None) -> str | None:
    if ts is None:
        return None
    try:
        when = datetime.fromtimestamp(ts, tz=timezone.utc)
    except (OverflowError, OSError, ValueError):
        # A row written before lifetimes were bounded: show the end of time rather than
        # break `ls` for the whole workspace.
        when = datetime.max.replace(tzinfo=timezone.utc)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def new_id(prefix: str) -> str:
    return f"{prefix}-{os.urandom(4).hex()}"  # not secrets: its hmac import costs 5 ms a process


@dataclass(frozen=True)
class SnapshotRow:
    id: str
    message: str
    implicit: bool
    created_at: float
    backend: str
    parent: str | None  # a snapshot of live: the previous one; of a sandbox: the sandbox's base
    bytes_copied: int
    kind: str = "user"  # user | implicit | safety | stage | sandbox (a snapshot of a sandbox)
    sandbox: str | None = None  # kind "sandbox": the sandbox it is a snapshot of
    origin: str | None = None  # kind "sandbox": the snapshot of live its lineage started from


@dataclass(frozen=True)
class SandboxRow:
    id: str
    label: str | None
    backend: str
    state: str
    base: str
    path: str
    created_at: float
    expires_at: float | None
    limits: dict[str, Any] = field(default_factory=dict)
    keep_expired: bool = False
    last_exit_code: int | None = None
    peak_memory_bytes: int | None = None
    owner_pid: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    system: bool = False  # fork --system: a writable layer over the host's system paths
    profile: str | None = None  # the config's [profiles.NAME] it was forked with (its policy at promote)


def _row(cls, r: sqlite3.Row):
    d = dict(r)
    for k in ("limits", "meta"):
        if k in d and isinstance(d[k], str):
            d[k] = json.loads(d[k])
    for k in ("implicit", "keep_expired", "system"):
        if k in d:
            d[k] = bool(d[k])
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in names})


def _free_bytes(directory: Path) -> int:
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize


def _is_full(e: sqlite3.Error, directory: Path) -> bool:
    """Did ``e`` come from a full filesystem? (SQLite reports a failed -shm or -wal growth
    as a generic I/O error: then the free space decides.)"""
    code = getattr(e, "sqlite_errorcode", None)
    if code is not None and code & 0xFF == _SQLITE_FULL:
        return True
    if code is not None and code & 0xFF != _SQLITE_IOERR:
        return False
    try:
        return _free_bytes(directory) < RESERVE_BYTES // 8
    except OSError:
        return False


def release_reserve(store_root: Path) -> bool:
    """Free the store's reserve (True if there was one): room for the registry to work."""
    try:
        os.unlink(Path(store_root) / RESERVE_NAME)
    except FileNotFoundError:
        return False
    return True


def _room_before(store_root: Path) -> None:
    """Release the reserve when less than its size is free: before what cannot be retried
    (a write transaction once its statements ran; the shm's mapped writes at all)."""
    try:
        if _free_bytes(store_root) < RESERVE_BYTES:
            release_reserve(store_root)
    except OSError:
        pass


def keep_reserve(store_root: Path) -> None:
    """Allocate the reserve again if it is missing and the filesystem has plenty of room.
    One stat when it is there; best effort (never fails a command)."""
    path = Path(store_root) / RESERVE_NAME
    if path.exists():
        return
    tmp = path.with_name(RESERVE_NAME + ".tmp")
    try:
        if _free_bytes(path.parent) < ROOM_FOR_RESERVE + RESERVE_BYTES:
            return
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            os.posix_fallocate(fd, 0, RESERVE_BYTES)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass


class Registry:
    def __init__(self, path: Path, *, create: bool = False) -> None:
        self.path = path
        if not create and not path.exists():
            raise FileNotFoundError(path)
        # Even a read writes ``registry.db-shm`` through a shared mapping, and on a full
        # copy-on-write filesystem (btrfs) a write to a mapped page that needs a new block is
        # SIGBUS, not an error SQLite could report: make room before the first one.
        _room_before(path.parent)
        try:
            self._connect(create)
        except sqlite3.OperationalError as e:
            self._make_room(e, "opening the registry")
            self._connect(create)

    def _connect(self, create: bool) -> None:
        self.db = sqlite3.connect(self.path, timeout=60, isolation_level=None, check_same_thread=False)
        try:
            self.db.row_factory = sqlite3.Row
            self.db.execute("PRAGMA busy_timeout = 60000")
            if create:
                self.db.execute("PRAGMA journal_mode = WAL")
            self.db.execute("PRAGMA synchronous = NORMAL")
            version = self.db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise RegistryTooNew(path=str(self.path), found=version, known=SCHEMA_VERSION)
            if version < SCHEMA_VERSION:
                with self.write():
                    for stmt in _SCHEMA.split(";"):
                        if stmt.strip():
                            self.db.execute(stmt)
                    migrate(self.db)  # in the same transaction: all of it or none
                    self.db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        except BaseException:
            self.db.close()
            raise

    def _make_room(self, e: sqlite3.Error, doing: str) -> None:
        """Release the reserve for a retry when ``e`` says the disk is full; else raise."""
        if not _is_full(e, self.path.parent):
            raise e
        if not release_reserve(self.path.parent):
            raise StoreFull(store=str(self.path.parent), doing=doing) from None

    def close(self) -> None:
        self.db.close()

    @contextmanager
    def write(self, *, durable: bool = False) -> Iterator[sqlite3.Connection]:
        """One write transaction; taken immediately so concurrent writers queue, not deadlock.

        ``durable``: the commit syncs the WAL (``synchronous = FULL`` for it), so it and
        every commit before it survive a power loss. Other commits are synced when SQLite
        checkpoints (``NORMAL``), which a process that ends without closing its connection
        (the CLI's hot commands: ``orchestrator.cli``) never does at its end.

        On a nearly full filesystem the reserve is released first: a write transaction
        cannot be retried from here once its statements ran."""
        if not durable:
            with self._transaction() as db:
                yield db
            return
        self.db.execute("PRAGMA synchronous = FULL")
        try:
            with self._transaction() as db:
                yield db
        finally:
            try:
                self.db.execute("PRAGMA synchronous = NORMAL")
            except sqlite3.Error:
                pass  # closed meanwhile: nothing more to write through it

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        _room_before(self.path.parent)
        try:
            self.db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as e:
            self._make_room(e, "writing the registry")
            self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
            self.db.execute("COMMIT")
        except BaseException as e:
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
            if isinstance(e, sqlite3.OperationalError) and _is_full(e, self.path.parent):
                release_reserve(self.path.parent)  # the next try has room
                raise StoreFull(store=str(self.path.parent), doing="writing the registry") from None
            raise

    # -- meta --------------------------------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        r = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return r[0] if r else None

    def set_meta(self, key: str, value: str) -> None:
        with self.write() as db:
            db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, value))

    # -- snapshots ---------------------------------------------------------------------
    def add_snapshot(self, row: SnapshotRow) -> None:
        with self.write() as db:
            db.execute(
                "INSERT INTO snapshots(id, message, implicit, created_at, backend, parent, bytes_copied, kind,"
                " sandbox, origin) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (row.id, row.message, int(row.implicit), row.created_at, row.backend, row.parent,
                 row.bytes_copied, row.kind, row.sandbox, row.origin))

    def snapshots(self) -> list[SnapshotRow]:
        return [_row(SnapshotRow, r) for r in self.db.execute("SELECT * FROM snapshots ORDER BY created_at, rowid")]

    def snapshot(self, snap_id: str) -> SnapshotRow | None:
        r = self.db.execute("SELECT * FROM snapshots WHERE id = ?", (snap_id,)).fetchone()
        return _row(SnapshotRow, r) if r else None

    def latest_snapshot(self) -> SnapshotRow | None:
        """The newest snapshot of live (the parent the next one is a delta against; a
        snapshot of a sandbox is of another tree)."""
        r = self.db.execute("SELECT * FROM snapshots WHERE kind != 'sandbox'"
                            " ORDER BY created_at DESC, rowid DESC LIMIT 1").fetchone()
        return _row(SnapshotRow, r) if r else None

    def delete_snapshot_row(self, snap_id: str) -> None:
        with self.write() as db:
            db.execute("DELETE FROM snapshots WHERE id = ?", (snap_id,))

    def snapshot_users(self, snap_id: str) -> list[str]:
        """What still needs this snapshot: the sandboxes cloned from it, those cloned from a
        snapshot of a sandbox whose lineage starts at it (a living descendant needs its
        whole ancestry: diff, promote and staleness read its origin), and the stages of a
        graduated promotion it brackets while they are in place or waiting."""
        users: list[str] = []
        todo, seen = [snap_id], set()
        while todo:
            s = todo.pop()
            if s in seen:
                continue
            seen.add(s)
            users += [r[0] for r in self.db.execute(
                "SELECT id FROM sandboxes WHERE base = ? AND state NOT IN ('destroyed', 'failed')"
                " AND NOT (state = 'expired' AND keep_expired = 0)", (s,))]
            todo += [r[0] for r in self.db.execute(
                "SELECT id FROM snapshots WHERE kind = 'sandbox' AND parent = ?", (s,))]
        # A stage of a graduated promotion that is in place or waiting keeps its brackets.
        users += [r[0] for r in self.db.execute(
            "SELECT id FROM promotions WHERE state IN ('running', 'pending', 'done')"
            " AND (json_extract(doc, '$.snapshot_before') = ? OR json_extract(doc, '$.snapshot_after') = ?)",
            (snap_id, snap_id))]
        return users

    # -- sandboxes ---------------------------------------------------------------------
    def add_sandbox(self, row: SandboxRow) -> None:
        with self.write() as db:
            self._insert_sandbox(db, row)

    def _insert_sandbox(self, db: sqlite3.Connection, row: SandboxRow) -> None:
        db.execute(
            "INSERT INTO sandboxes(id, label, backend, state, base, path, created_at, expires_at, limits,"
            " keep_expired, owner_pid, meta, system, profile) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (row.id, row.label, row.backend, row.state, row.base, row.path, row.created_at, row.expires_at,
             json.dumps(row.limits), int(row.keep_expired), row.owner_pid, json.dumps(row.meta), int(row.system),
             row.profile))

    def add_sandboxes(self, rows: list[SandboxRow]) -> None:
        with self.write() as db:
            for row in rows:
                self._insert_sandbox(db, row)

    def sandboxes(self, *, include_gone: bool = True) -> list[SandboxRow]:
        q = "SELECT * FROM sandboxes"
        if not include_gone:
            q += " WHERE state NOT IN ('destroyed')"
        return [_row(SandboxRow, r) for r in self.db.execute(q + " ORDER BY created_at, rowid")]

    def sandbox(self, sb_id: str) -> SandboxRow | None:
        r = self.db.execute("SELECT * FROM sandboxes WHERE id = ?", (sb_id,)).fetchone()
        return _row(SandboxRow, r) if r else None

    def update_sandbox(self, sb_id: str, **values: Any) -> None:
        for k in ("limits", "meta"):
            if k in values:
                values[k] = json.dumps(values[k])
        cols = ", ".join(f"{k} = ?" for k in values)
        with self.write() as db:
            db.execute(f"UPDATE sandboxes SET {cols} WHERE id = ?", (*values.values(), sb_id))

    def set_state(self, sb_id: str, state: str, *, only_from: tuple[str, ...] | None = None) -> bool:
        """Move a sandbox to ``state``; with ``only_from``, only if it is in one of those (a
        compare-and-set, so two reapers cannot both expire one sandbox)."""
        assert state in SANDBOX_STATES
        with self.write() as db:
            if only_from:
                marks = ",".join("?" * len(only_from))
                cur = db.execute(f"UPDATE sandboxes SET state = ? WHERE id = ? AND state IN ({marks})",
                                 (state, sb_id, *only_from))
            else:
                cur = db.execute("UPDATE sandboxes SET state = ? WHERE id = ?", (state, sb_id))
            return cur.rowcount == 1

    def overdue(self, at: float) -> list[SandboxRow]:
        return [_row(SandboxRow, r) for r in self.db.execute(
            "SELECT * FROM sandboxes WHERE expires_at IS NOT NULL AND expires_at <= ?"
            " AND state IN ('creating', 'ready', 'running', 'exited')", (at,))]

    def unsettled(self, at: float) -> tuple[list[SandboxRow], list[SandboxRow]]:
        """What every command looks at when it starts, in one pass over the table: the
        sandboxes whose lifetime is over (``overdue``), and those a petri process is still
        making or destroying (``owner_pid`` set: ``begin_destroy``, a fork's ``creating``)."""
        overdue, owned = [], []
        for r in self.db.execute(
                "SELECT * FROM sandboxes WHERE owner_pid IS NOT NULL OR (expires_at IS NOT NULL AND expires_at <= ?"
                " AND state IN ('creating', 'ready', 'running', 'exited'))", (at,)):
            row = _row(SandboxRow, r)
            if row.owner_pid is not None:
                owned.append(row)
            if row.expires_at is not None and row.expires_at <= at and row.state in LIVE_STATES:
                overdue.append(row)
        return overdue, owned

    # A sandbox is destroyed (or expired) in this order: its row says so first, owned by the
    # destroying process (``owner_pid``), and the runs it is about to kill say why; then its
    # processes and tree go; then ``end_destroy`` lets go of it. A petri killed at any instant
    # leaves either a row that is still what it was, tree and all, or a destroyed one that
    # the next command finishes (``Engine.settle_owned``): never ``ready`` without a tree.
    def begin_destroy(self, sb_id: str, state: str, killed_by: str, pid: int, *,
                      only_from: tuple[str, ...] | None = None, **values: Any) -> bool:
        assert state in ("destroyed", "expired")
        cols = "".join(f", {k} = ?" for k in values)
        where, args = "", []
        if only_from:
            where = f" AND state IN ({','.join('?' * len(only_from))})"
            args = list(only_from)
        with self.write() as db:
            cur = db.execute(f"UPDATE sandboxes SET state = ?, owner_pid = ?{cols} WHERE id = ?{where}",
                             (state, pid, *values.values(), sb_id, *args))
            if cur.rowcount != 1:
                return False
            db.execute("UPDATE runs SET killed_by = ? WHERE sandbox = ? AND finished_at IS NULL"
                       " AND killed_by IS NULL", (killed_by, sb_id))
            return True

    def take_over(self, sb_id: str, dead_pid: int, pid: int) -> bool:
        """Claim a sandbox a dead petri was making or destroying (compare-and-set: two
        commands starting at once do not both finish it)."""
        with self.write() as db:
            return db.execute("UPDATE sandboxes SET owner_pid = ? WHERE id = ? AND owner_pid = ?",
                              (pid, sb_id, dead_pid)).rowcount == 1

    def end_destroy(self, sb_id: str, pid: int) -> bool:
        """The destroyed sandbox's processes and tree are gone: let go of it. False when it
        was not this process's to let go of (already let go)."""
        with self.write() as db:
            return db.execute("UPDATE sandboxes SET owner_pid = NULL WHERE id = ? AND owner_pid = ?",
                              (sb_id, pid)).rowcount == 1

    def label_taken(self, label: str) -> bool:
        return self.db.execute(
            "SELECT 1 FROM sandboxes WHERE label = ? AND state NOT IN ('destroyed', 'failed', 'expired')",
            (label,)).fetchone() is not None

    # -- runs --------------------------------------------------------------------------
    # A run's row is written before it starts (with the pid of the petri that owns it) and
    # finished exactly once; whoever finishes it also sets the sandbox's last_exit_code, in
    # the same transaction, so the two can never disagree.
    def start_run(self, sandbox: str, argv: list[str], log_paths: Callable[[int], tuple[Path, Path]],
                  pid: int) -> tuple[int, Path, Path]:
        """A new run row: (its number, stdout log, stderr log)."""
        with self.write() as db:
            n = db.execute("SELECT COALESCE(MAX(n), 0) + 1 FROM runs WHERE sandbox = ?", (sandbox,)).fetchone()[0]
            out, err = log_paths(n)
            # ensure_ascii: argv bytes that are not UTF-8 (lone surrogates) survive as \udcNN
            db.execute("INSERT INTO runs(sandbox, n, argv, started_at, stdout_path, stderr_path, pid)"
                       " VALUES (?, ?, ?, ?, ?, ?, ?)",
                       (sandbox, n, json.dumps(list(argv)), now(), str(out), str(err), pid))
            return n, out, err

    def finish_run(self, sandbox: str, n: int, **values: Any) -> None:
        for key in ("limits_hit", "output"):
            if key in values:
                values[key] = json.dumps(values[key])
        cols = ", ".join(f"{k} = ?" for k in values)
        with self.write() as db:
            db.execute(f"UPDATE runs SET finished_at = ?, {cols} WHERE sandbox = ? AND n = ?",
                       (now(), *values.values(), sandbox, n))
            if "exit_code" in values:
                db.execute("UPDATE sandboxes SET last_exit_code = ? WHERE id = ?", (values["exit_code"], sandbox))

    def mark_live_runs(self, sandbox: str, killed_by: str) -> None:
        """Say why the sandbox's running commands are about to be killed (``rm``, expiry),
        before the kill: the petri that owns each run reads it when the run ends."""
        with self.write() as db:
            db.execute("UPDATE runs SET killed_by = ? WHERE sandbox = ? AND finished_at IS NULL"
                       " AND killed_by IS NULL", (killed_by, sandbox))

    def run_killed_by(self, sandbox: str, n: int) -> str | None:
        r = self.db.execute("SELECT killed_by FROM runs WHERE sandbox = ? AND n = ?", (sandbox, n)).fetchone()
        return r[0] if r else None

    def live_runs(self, sandbox: str, *, but: int | None = None) -> list[int]:
        """Unfinished runs whose petri is still alive."""
        rows = self.db.execute("SELECT n, pid FROM runs WHERE sandbox = ? AND finished_at IS NULL",
                               (sandbox,)).fetchall()
        return [r[0] for r in rows if r[0] != but and pid_alive(r[1])]

    def settle_state(self, sandbox: str) -> None:
        """``running -> exited`` once no live run is left."""
        if not self.live_runs(sandbox):
            self.set_state(sandbox, "exited", only_from=("running",))

    def settle_orphaned_runs(self) -> list[tuple[str, int, int]]:
        """Finish the runs whose petri died (SIGKILL, OOM, a crash) without finishing them:
        exit 125 (petri failed), ``killed_by: "petri_died"``. Every command calls this, so
        ``ls`` never shows a dead run as running. Returns (sandbox, run, the dead pid) of each."""
        settled = []
        for r in self.db.execute("SELECT sandbox, n, pid FROM runs WHERE finished_at IS NULL").fetchall():
            if pid_alive(r["pid"]):
                continue
            with self.write() as db:
                cur = db.execute("UPDATE runs SET finished_at = ?, exit_code = 125, limits_hit = '[]',"
                                 " killed_by = COALESCE(killed_by, 'petri_died')"
                                 " WHERE sandbox = ? AND n = ? AND finished_at IS NULL", (now(), r["sandbox"], r["n"]))
                if cur.rowcount != 1:
                    continue  # another petri settled it first
                db.execute("UPDATE sandboxes SET last_exit_code = 125 WHERE id = ?", (r["sandbox"],))
            self.settle_state(r["sandbox"])
            settled.append((r["sandbox"], r["n"], r["pid"]))
        return settled

    def runs(self, sandbox: str) -> list[dict[str, Any]]:
        """Every run of the sandbox, each as the run document."""
        return [_run_doc(r) for r in self.db.execute("SELECT * FROM runs WHERE sandbox = ? ORDER BY n", (sandbox,))]

    def run(self, sandbox: str, n: int) -> dict[str, Any] | None:
        """Run ``n`` of the sandbox as the run document (``run``, RFC 3339 times)."""
        r = self.db.execute("SELECT * FROM runs WHERE sandbox = ? AND n = ?", (sandbox, n)).fetchone()
        return _run_doc(r) if r else None

    # -- promotions --------------------------------------------------------------------
    def add_promotion(self, promo_id: str, sandbox: str, state: str, doc: dict[str, Any]) -> None:
        """A new promotion row; a row of that id made beforehand (a stage of a graduated
        promotion, recorded before its promote) keeps its doc's fields under the new ones."""
        with self.write() as db:
            old = db.execute("SELECT doc FROM promotions WHERE id = ?", (promo_id,)).fetchone()
            if old is None:
                db.execute("INSERT INTO promotions(id, sandbox, created_at, state, doc) VALUES (?, ?, ?, ?, ?)",
                           (promo_id, sandbox, now(), state, json.dumps(doc)))
            else:
                db.execute("UPDATE promotions SET state = ?, doc = ? WHERE id = ?",
                           (state, json.dumps({**json.loads(old[0]), **doc}), promo_id))

    def update_promotion(self, promo_id: str, state: str, doc: dict[str, Any] | None = None) -> None:
        with self.write() as db:
            if doc is None:
                db.execute("UPDATE promotions SET state = ? WHERE id = ?", (state, promo_id))
            else:
                db.execute("UPDATE promotions SET state = ?, doc = ? WHERE id = ?", (state, json.dumps(doc), promo_id))

    def promotions(self) -> list[dict[str, Any]]:
        out = []
        for r in self.db.execute("SELECT * FROM promotions ORDER BY created_at"):
            d = dict(r)
            d["doc"] = json.loads(d["doc"])
            out.append(d)
        return out

    # -- watches (orchestrator.watch) ---------------------------------------------------
    def add_watch(self, promotion: str, command: str, every_s: float, started_at: float, until: float,
                  next_at: float, pid: int, via: str) -> None:
        with self.write() as db:
            db.execute("INSERT OR REPLACE INTO watches(promotion, command, every_s, started_at, until, state, checks,"
                       " next_at, pid, via) VALUES (?, ?, ?, ?, ?, 'watching', 0, ?, ?, ?)",
                       (promotion, command, every_s, started_at, until, next_at, pid, via))

    def update_watch(self, promotion: str, *, only_from: tuple[str, ...] = (), **values: Any) -> bool:
        """Set columns of a watch (``doc`` as a dict); with ``only_from``, only while its state
        is one of those (compare-and-set: a watch ended by one process is not ended twice)."""
        if "doc" in values:
            values["doc"] = json.dumps(values["doc"])
        cols = ", ".join(f"{k} = ?" for k in values)
        where, args = "", []
        if only_from:
            where = f" AND state IN ({','.join('?' * len(only_from))})"
            args = list(only_from)
        with self.write() as db:
            return db.execute(f"UPDATE watches SET {cols} WHERE promotion = ?{where}",
                              (*values.values(), promotion, *args)).rowcount == 1

    def watches(self, *, state: str | None = None) -> list[dict[str, Any]]:
        q, args = "SELECT * FROM watches", ()
        if state is not None:
            q, args = q + " WHERE state = ?", (state,)
        out = []
        for r in self.db.execute(q + " ORDER BY started_at", args):
            d = dict(r)
            d["doc"] = json.loads(d["doc"])
            out.append(d)
        return out

    def watch(self, promotion: str) -> dict[str, Any] | None:
        r = self.db.execute("SELECT * FROM watches WHERE promotion = ?", (promotion,)).fetchone()
        if r is None:
            return None
        d = dict(r)
        d["doc"] = json.loads(d["doc"])
        return d

    # -- ids ---------------------------------------------------------------------------
    def resolve(self, ident: str, kinds: tuple[str, ...] = ("snapshot", "sandbox", "promotion")) -> tuple[str, str]:
        """(kind, full id) for a unique prefix of an id, or a sandbox label."""

        what = " or ".join(kinds)
        listing = " or ".join(f"`petri {_LISTING[k]}`" for k in kinds)
        if not _plausible_ident(ident):
            # Not UTF-8 (SQLite cannot even bind it), a control character, or longer than
            # any id or label: nothing can match, and LIKE would choke on 100,000 characters.
            raise UnknownId(what=what, ident=shown(ident), listing=listing)
        tables = {"snapshot": "snapshots", "sandbox": "sandboxes", "promotion": "promotions"}
        matches: list[tuple[str, str]] = []
        for kind in kinds:
            if kind == "sandbox":
                r = self.db.execute("SELECT id FROM sandboxes WHERE label = ? ORDER BY"
                                    " state IN ('destroyed', 'failed', 'expired'), created_at DESC LIMIT 1",
                                    (ident,)).fetchone()
                if r:
                    return kind, r[0]
            pattern = ident.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            for r in self.db.execute(f"SELECT id FROM {tables[kind]} WHERE id LIKE ? ESCAPE '\\'", (pattern,)):
                matches.append((kind, r[0]))
        exact = [m for m in matches if m[1] == ident]
        if exact:
            return exact[0]
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise UnknownId(what=what, ident=shown(ident), listing=listing)
        raise AmbiguousId(what=what, ident=shown(ident), matches=", ".join(m[1] for m in matches[:5]))


# Schema 2 (lineage, the audit trail, timings). Statements run in order inside the upgrade's
# one transaction; each is idempotent, so a registry made by any earlier code (or a fresh
# one, whose CREATE TABLE above already has the columns) ends in the same shape.
_V2 = [
    ("snapshots", "sandbox", "ALTER TABLE snapshots ADD COLUMN sandbox TEXT"),
    ("snapshots", "origin", "ALTER TABLE snapshots ADD COLUMN origin TEXT"),
    (None, None, """CREATE TABLE IF NOT EXISTS audit (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, op TEXT NOT NULL, argv TEXT NOT NULL,
        uid INTEGER, sudo_uid INTEGER, via TEXT NOT NULL, client TEXT, reason TEXT, result TEXT,
        exit_code INTEGER, ids TEXT NOT NULL DEFAULT '[]', duration_s REAL, pid INTEGER)"""),
    # Append-only by construction: no row of the trail can be changed or removed through SQL.
    (None, None, """CREATE TRIGGER IF NOT EXISTS audit_append_only_update BEFORE UPDATE ON audit
        BEGIN SELECT RAISE(ABORT, 'the audit trail is append-only'); END"""),
    (None, None, """CREATE TRIGGER IF NOT EXISTS audit_append_only_delete BEFORE DELETE ON audit
        BEGIN SELECT RAISE(ABORT, 'the audit trail is append-only'); END"""),
    (None, None, """CREATE TABLE IF NOT EXISTS timings (
        ts REAL NOT NULL, op TEXT NOT NULL, duration_s REAL NOT NULL, ok INTEGER NOT NULL DEFAULT 1,
        subject TEXT, detail TEXT NOT NULL DEFAULT '{}')"""),
    (None, None, "CREATE INDEX IF NOT EXISTS timings_op_ts ON timings(op, ts)"),
]
# Schema 3: what a run's output came to (per stream: bytes, lines, bytes the log cap dropped).
_V3 = [
    ("runs", "output", "ALTER TABLE runs ADD COLUMN output TEXT"),
]
# Schema 4: the watch after a promotion (``promote --watch``, orchestrator.watch): one row per
# watched promotion, owned by its detached watcher process (``pid`` and its start time, so a
# reused pid is not taken for it).
_V4 = [
    (None, None, """CREATE TABLE IF NOT EXISTS watches (
        promotion TEXT PRIMARY KEY, command TEXT NOT NULL, every_s REAL NOT NULL, started_at REAL NOT NULL,
        until REAL NOT NULL, state TEXT NOT NULL, checks INTEGER NOT NULL DEFAULT 0, next_at REAL,
        pid INTEGER, pid_start TEXT, via TEXT NOT NULL DEFAULT 'cli', ended_at REAL,
        doc TEXT NOT NULL DEFAULT '{}')"""),
]
# Schema 5: a sandbox forked with --system (its layer lives in <store>/system/<sandbox>).
_V5 = [
    ("sandboxes", "system", "ALTER TABLE sandboxes ADD COLUMN system INTEGER NOT NULL DEFAULT 0"),
]
# Schema 6: the named profile a sandbox was forked with (orchestrator.config, [profiles.NAME]).
_V6 = [
    ("sandboxes", "profile", "ALTER TABLE sandboxes ADD COLUMN profile TEXT"),
]


def migrate(db: sqlite3.Connection) -> None:
    """Upgrade the registry in place to ``SCHEMA_VERSION`` (the caller holds a write
    transaction and sets ``user_version`` after)."""
    for table, column, stmt in _V2 + _V3 + _V4 + _V5 + _V6:
        if column is not None:
            have = {r[1] for r in db.execute(f"PRAGMA table_info({table})")}
            if column in have:
                continue
        db.execute(stmt)


_LISTING = {"snapshot": "snapshots", "sandbox": "ls", "promotion": "promotions"}
MAX_IDENT = 256  # ids are short; labels at most units.MAX_LABEL


def _plausible_ident(ident: str) -> bool:
    if not ident or len(ident) > MAX_IDENT:
        return False
    try:
        ident.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return ident.isprintable()


# The documented ``killed_by`` is one of null, "timeout", "ttl", "memory". What else can end a run
# (``rm`` destroying its sandbox, its petri dying) is stored in the same column but shown in
# ``ended_by``, which names every end: "exit" (by itself), a killed_by value, "destroyed",
# "petri_died"; null while it runs.
DOC_KILLED_BY = frozenset({"timeout", "ttl", "memory"})


def _ended_by(r: sqlite3.Row) -> str | None:
    if r["finished_at"] is None:
        return None
    return r["killed_by"] or "exit"


def _run_doc(r: sqlite3.Row) -> dict[str, Any]:
    """One shape for a run everywhere (``run --json``, ``status``, ``logs``, events)."""
    killed_by = r["killed_by"] if r["killed_by"] in DOC_KILLED_BY else None
    return {"id": r["sandbox"], "run": r["n"], "argv": json.loads(r["argv"]), "exit_code": r["exit_code"],
            "duration_s": r["duration_s"], "killed_by": killed_by, "ended_by": _ended_by(r),
            "limits_hit": json.loads(r["limits_hit"] or "[]"), "stdout_path": r["stdout_path"],
            "stderr_path": r["stderr_path"], "peak_memory_bytes": r["peak_memory_bytes"],
            "started_at": rfc3339(r["started_at"]), "finished_at": rfc3339(r["finished_at"]),
            "pid": r["pid"], "output": json.loads(r["output"]) if r["output"] else None}
