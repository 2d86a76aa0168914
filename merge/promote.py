"""Promotion: a sandbox's changes applied to the live workspace, 3-way, as one transaction.

Plan, then execute. ``plan_promotion`` reads the three trees (base = the sandbox's base,
ours = live now, theirs = the sandbox) and writes nothing: for every path the sandbox changed
it compares what live holds. Live still equal to base -> take theirs. Live already equal to
theirs -> nothing. Both changed -> two regular files are merged line by line
(``merge3``, git's rules), permission bits 3-way; everything else (binary vs binary, delete
vs modify, modify vs delete, both changed a symlink, type changes) is a conflict that
``on_conflict`` settles: ``fail`` (nothing is written, ``PromotionConflict``, exit 3),
``markers`` (text conflicts are written with diff3 markers -- the caller exits 5; conflicts
that cannot carry markers keep the workspace's side), ``theirs`` / ``ours`` (per hunk for
text, like ``git merge -X``; whole path otherwise). Some conflicts no option can settle and
always stop the promotion: a path that goes through a symlink (or a non-directory) in the
workspace, and a workspace fifo/socket/device in the way. Fifos, sockets and devices in the
sandbox are never created (listed in ``Plan.skipped``). Modes carried are ``& 0o777``.
``.git/`` and ``.petri/`` are never touched.

``execute_promotion`` runs the plan as a transaction (see ``journal.py`` for the layout and
the fault-injection step names): take the workspace lock; settle any interrupted promotion
first; stage every new file (fsync) and hard-link a pre-image of every live file it will
replace or delete, checking that pre-image still is what the plan read; write and fsync the
journal; apply the ops in order (removals deepest first, then directory removals, new
directories, new content, permission changes), re-hashing each live file right before its
rename -- if it no longer is what the plan read (an editor saved it), every op already
applied is undone and that path is reported (``PromotionConflict``, exit 3); a path that must
be new is renamed with ``RENAME_NOREPLACE``; fsync the touched directories; mark done.

``recover`` settles interrupted promotions: uncommitted ones are discarded (the workspace was
never touched); committed ones are finished when every op is already applied (only the done
mark was missing) and undone otherwise. ``undo_promotion`` (``petri rollback p-...``) undoes a
finished one from its pre-images, refusing (``UndoConflict``, exit 3, naming the paths) when
the workspace changed any of them since.

Caveats:
- The re-check before each rename and the rename are two system calls; an editor writing in
  that instant (microseconds) can still lose to the promotion. Editors that write in place
  through a file descriptor opened *before* the promotion write into the pre-image inode.
- Recovery after a crash cannot tell "an editor created exactly the promoted content at
  this path" from "the promotion created it": it undoes it.
- Replacing a file gives it a new inode: the workspace file's own xattrs/ACLs are not
  carried over (none are taken from the sandbox: the allow-list is empty), and other hard
  links to the old inode keep the old content.
- When the journal directory is on another device than the workspace (the store as a
  nested btrfs subvolume), staging and pre-images go to ``<workspace>/.petri-staging-<id>/``
  so renames stay atomic; that directory exists only while a promotion (or its undo) runs:
  once done, the pre-images are copied (reflinked: FICLONE works across subvolumes of one
  btrfs) into the journal and the directory is removed (``park_preimages``); an undo copies
  them back first. Callers should hold their store lock so no snapshot sees the directory.
- A directory is created with at least ``u+rwx`` so its new entries can be written, then
  given its final bits; removing entries from a read-only workspace directory fails (a
  non-root promoter), which undoes the promotion.
"""
from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Literal

from .changes import Change, Entry, tree_changes
from .errors import (PathThroughSymlink, PromotionConflict, PromotionNotUndoable,
                     SandboxChangedDuringPromotion, UndoConflict, UnknownPromotion, UnsafePath)
from .journal import (PARKED, PRE, SCHEMA, PromotionDir, WorkspaceLock, _rmtree_counting,
                      atomic_write, b64, fault_point, fsync_dir, list_promotions, scratch_dirs,
                      unb64)
from .merge3 import ConflictHunk, merge3
from .safefs import Node, SafeTree, content_id_bytes, read_chunks, safe_mode, split_rel, \
    write_new_file

OnConflict = Literal["fail", "markers", "theirs", "ours"]
# What a check leaves for ``petri evolve`` to read (orchestrator.evolve): never a change.
METRICS_FILE = b".petri-metrics.json"
PROTECTED_TOP = (b".git", b".petri", METRICS_FILE)
STAGING_PREFIX = ".petri-staging-"
_FICLONE = 0x40049409


def display(path: bytes) -> str:
    """A path for people and JSON ``path``: UTF-8, other bytes as ``\\xNN``."""
    return path.decode("utf-8", "backslashreplace")


# --- plan data --------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class State:
    """What a path holds: kind, permission bits, content id (file bytes / link target)."""

    kind: str
    mode: int
    cid: str | None = None
    target: bytes | None = None

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "mode": self.mode, "cid": self.cid, "target": b64(self.target)}

    @classmethod
    def from_json(cls, d: dict[str, Any] | None) -> "State | None":
        if d is None:
            return None
        return cls(d["kind"], d["mode"], d.get("cid"), unb64(d.get("target")))


@dataclass(frozen=True, slots=True)
class Op:
    action: str  # 'put' | 'remove' | 'mkdir' | 'rmdir' | 'chmod'
    path: bytes
    old: State | None  # what live holds when planned (None: nothing)
    new: State | None  # what live holds after
    data: bytes | None = None  # merged content (put)
    source: bytes | None = None  # path in the sandbox to copy (put)
    why: str = "theirs"  # 'theirs' | 'merged' | 'markers' | 'ours' | 'parent'


@dataclass(frozen=True, slots=True)
class Conflict:
    path: bytes
    reason: str
    hunks: tuple[ConflictHunk, ...] = ()
    resolution: str = "failed"  # 'failed' | 'markers' | 'theirs' | 'ours' | 'kept'
    fatal: bool = False  # no --on-conflict choice can settle it

    def to_json(self) -> dict[str, Any]:
        return {"path": display(self.path), "path_b64": b64(self.path), "reason": self.reason,
                "resolution": self.resolution, "hunks": [h.describe() for h in self.hunks]}


@dataclass(frozen=True)
class Plan:
    base: Path
    live: Path
    theirs: Path
    on_conflict: str
    ops: tuple[Op, ...]
    conflicts: tuple[Conflict, ...]
    skipped: tuple[tuple[bytes, str], ...] = ()

    @property
    def blocking(self) -> tuple[Conflict, ...]:
        """Conflicts that stop the promotion under this plan's ``on_conflict``."""
        return tuple(c for c in self.conflicts if c.fatal or c.resolution == "failed")

    @property
    def writes_markers(self) -> bool:
        return any(c.resolution == "markers" for c in self.conflicts)

    def to_json(self) -> dict[str, Any]:
        return {
            "on_conflict": self.on_conflict,
            "ops": [{"action": o.action, "path": display(o.path), "path_b64": b64(o.path),
                     "why": o.why,
                     "old_mode": o.old.mode if o.old else None,
                     "new_mode": o.new.mode if o.new else None} for o in self.ops],
            "conflicts": [c.to_json() for c in self.conflicts],
            "skipped": [{"path": display(p), "path_b64": b64(p), "reason": r}
                        for p, r in self.skipped],
        }


@dataclass(frozen=True)
class PromotionResult:
    promotion: str
    applied: tuple[bytes, ...]
    conflicts: tuple[Conflict, ...]
    skipped: tuple[tuple[bytes, str], ...] = ()
    markers: bool = False  # conflict markers were written (caller exits 5)

    def to_json(self) -> dict[str, Any]:
        """The merge layer's part of SPEC's ``promote`` document (the CLI adds
        ``verified`` and ``rolled_back``)."""
        return {"promotion": self.promotion,
                "applied": [display(p) for p in self.applied],
                "applied_b64": [b64(p) for p in self.applied],
                "conflicts": [c.to_json() for c in self.conflicts],
                "skipped": [{"path": display(p), "path_b64": b64(p), "reason": r}
                            for p, r in self.skipped],
                "markers": self.markers}


def _conflict_error(conflicts: Iterable[Conflict]) -> PromotionConflict:
    conflicts = list(conflicts)
    err = PromotionConflict(paths=", ".join(f"{display(c.path)} ({c.reason})" for c in conflicts))
    err.conflicts = conflicts  # type: ignore[attr-defined]
    return err


# --- comparing states ---------------------------------------------------------------------

def _state_of_entry(e: Entry | None, tree: SafeTree, path: bytes) -> State | None:
    if e is None:
        return None
    target = tree.readlink(path) if e.kind == "symlink" else None
    return State(e.kind, e.mode, e.content_id, target)


def _state_of_node(n: Node | None) -> State | None:
    if n is None:
        return None
    return State(n.kind, n.mode, n.content_id, n.target)


def _same(a: State | None, b: State | None) -> bool:
    if a is None or b is None:
        return a is b
    if a.kind != b.kind:
        return False
    if a.kind == "file":
        return a.cid == b.cid and safe_mode(a.mode) == safe_mode(b.mode)
    if a.kind == "symlink":
        return a.cid == b.cid
    if a.kind == "dir":
        return safe_mode(a.mode) == safe_mode(b.mode)
    return True


def _matches(cur: Node | None, st: State | None) -> bool:
    return _same(_state_of_node(cur), st)


def _depth(p: bytes) -> int:
    return p.count(b"/")


def _ancestors(path: bytes) -> list[bytes]:
    parts = path.split(b"/")
    return [b"/".join(parts[:i]) for i in range(1, len(parts))]


# --- planning -----------------------------------------------------------------------------

class _Planner:
    def __init__(self, bt: SafeTree, lt: SafeTree, tt: SafeTree, on_conflict: str,
                 labels: tuple[str, str, str]):
        self.bt, self.lt, self.tt = bt, lt, tt
        self.on_conflict = on_conflict
        self.labels = labels
        self.removes: list[Op] = []
        self.rmdirs: list[Op] = []
        self.mkdirs: dict[bytes, Op] = {}
        self.puts: list[Op] = []
        self.chmods: list[Op] = []
        self.conflicts: list[Conflict] = []
        self.skipped: list[tuple[bytes, str]] = []
        self.replaced: set[bytes] = set()  # live non-dirs removed to make way for a directory

    # live state, seeing through the plan's own type changes
    def live(self, path: bytes) -> State | None:
        if any(a in self.replaced for a in _ancestors(path)):
            return None
        return _state_of_node(self.lt.node(path, with_content_id=True))

    def conflict(self, path: bytes, reason: str, *, hunks: tuple[ConflictHunk, ...] = (),
                 resolution: str | None = None, fatal: bool = False) -> None:
        if resolution is None:
            resolution = {"fail": "failed", "markers": "kept"}.get(self.on_conflict,
                                                                   self.on_conflict)
        self.conflicts.append(Conflict(path, reason, hunks, "failed" if fatal else resolution,
                                       fatal))

    def change(self, c: Change) -> None:
        path = c.path
        split_rel(path)
        if path.split(b"/", 1)[0] in PROTECTED_TOP:
            return
        try:
            B = _state_of_entry(c.old, self.bt, path)
            T = _state_of_entry(c.new, self.tt, path)
            L = self.live(path)
        except PathThroughSymlink as e:
            self.conflict(path, str(e), fatal=True)
            return
        if T is not None and T.kind == "other":
            self.skipped.append((path, "the sandbox holds a fifo, socket or device here; "
                                       "never created"))
            return
        if L is not None and L.kind == "other":
            self.conflict(path, "the workspace holds a fifo, socket or device here", fatal=True)
            return
        if _same(L, T):
            return
        if _same(L, B):
            self.transform(path, L, T, "theirs")
            return
        self.both_changed(path, B, L, T)

    def both_changed(self, path: bytes, B: State | None, L: State | None,
                     T: State | None) -> None:
        lk, tk, bk = (L.kind if L else None), (T.kind if T else None), (B.kind if B else None)
        if lk == tk == "file" and bk in (None, "file"):
            self.merge_files(path, B, L, T)  # type: ignore[arg-type]
            return
        if lk == tk == "dir":
            # both changed a directory's bits: keep the workspace's unless told otherwise
            if self.on_conflict == "theirs":
                self.transform(path, L, T, "theirs")
            return
        if tk is None and lk == bk == "dir":
            self.transform(path, L, T, "theirs")  # deleting a dir whose bits live changed
            return
        if lk is None and tk == bk == "dir":
            return  # live deleted a dir whose bits the sandbox changed: stays deleted
        if lk == tk == "symlink":
            reason = "both sides changed the symlink"
        elif T is None:
            reason = "deleted in the sandbox, changed in the workspace"
        elif L is None:
            reason = "changed in the sandbox, deleted in the workspace"
        else:
            reason = f"type changed: base {bk or 'absent'}, workspace {lk}, sandbox {tk}"
        self.conflict(path, reason)
        if self.on_conflict == "theirs":
            self.transform(path, L, T, "theirs")

    def merge_files(self, path: bytes, B: State | None, L: State, T: State) -> None:
        ldata = self.lt.read(path)
        tdata = self.tt.read(path)
        bdata = self.bt.read(path) if B is not None else b""
        bm = safe_mode(B.mode) if B is not None else None
        lm, tm = safe_mode(L.mode), safe_mode(T.mode)
        mode_conflict = False
        if lm == tm or bm == tm:
            mode = lm
        elif bm == lm:
            mode = tm
        else:
            mode_conflict = True
            mode = tm if self.on_conflict == "theirs" else lm
        favor = self.on_conflict if self.on_conflict in ("ours", "theirs") else None
        r = merge3(bdata, ldata, tdata, style="merge", favor=favor, labels=self.labels)
        content = r.content
        why = "merged"
        if r.conflicts:
            if r.binary:
                self.conflict(path, "binary file changed on both sides", hunks=())
                if self.on_conflict != "theirs":
                    content = ldata
                else:
                    content = tdata
            else:
                self.conflict(path, f"{len(r.conflicts)} conflicting hunk(s)", hunks=r.conflicts,
                              resolution={"fail": "failed"}.get(self.on_conflict,
                                                                self.on_conflict))
                if self.on_conflict == "markers":
                    content = merge3(bdata, ldata, tdata, style="diff3",
                                     labels=self.labels).content
                    why = "markers"
                elif self.on_conflict == "fail":
                    content = ldata
                else:
                    why = self.on_conflict
        if mode_conflict:
            self.conflict(path, f"permission bits changed on both sides "
                                f"(base {bm:o}, workspace {lm:o}, sandbox {tm:o})")
        if content == ldata and mode == lm:
            return
        if content == ldata:
            self.chmods.append(Op("chmod", path, L, State("file", mode, L.cid), why=why))
            return
        new = State("file", mode, content_id_bytes(content))
        if content == tdata:
            self.puts.append(Op("put", path, L, new, source=path, why=why))
        else:
            self.puts.append(Op("put", path, L, new, data=content, why=why))

    def ensure_parents(self, path: bytes) -> None:
        for a in _ancestors(path):
            if a in self.mkdirs:
                continue
            if a in self.replaced:
                raise AssertionError("a replaced path always has its mkdir planned")
            n = self.lt.node(a)
            if n is None:
                tn = self.tt.node(a)
                mode = tn.mode if tn is not None and tn.kind == "dir" else 0o755
                self.add_mkdir(a, mode, "parent")
            elif n.kind != "dir":
                raise PathThroughSymlink(path=display(path), via=display(a))

    def add_mkdir(self, path: bytes, mode: int, why: str) -> None:
        mode = safe_mode(mode)
        self.mkdirs[path] = Op("mkdir", path, None, State("dir", mode | 0o700), why=why)
        if mode | 0o700 != mode:
            self.chmods.append(Op("chmod", path, State("dir", mode | 0o700), State("dir", mode),
                                  why=why))

    def put_new(self, path: bytes, old: State | None, T: State, why: str) -> None:
        new = State(T.kind, safe_mode(T.mode) if T.kind == "file" else T.mode, T.cid, T.target)
        self.puts.append(Op("put", path, old, new, source=path, why=why))

    def transform(self, path: bytes, L: State | None, T: State | None, why: str) -> None:
        """Ops that turn what live holds at ``path`` into what the sandbox holds."""
        try:
            if T is None:
                if L is None:
                    return
                if L.kind == "dir":
                    self.rmdirs.append(Op("rmdir", path, L, None, why=why))
                else:
                    self.removes.append(Op("remove", path, L, None, why=why))
                return
            if L is None:
                self.ensure_parents(path)
                if T.kind == "dir":
                    self.add_mkdir(path, T.mode, why)
                else:
                    self.put_new(path, None, T, why)
                return
            if L.kind == T.kind:
                if T.kind == "dir" or (T.kind == "file" and L.cid == T.cid):
                    self.chmods.append(Op("chmod", path, L, State(T.kind, safe_mode(T.mode),
                                                                  L.cid), why=why))
                else:
                    self.put_new(path, L, T, why)
                return
            if L.kind == "dir":
                self.rmdirs.append(Op("rmdir", path, L, None, why=why))
                self.put_new(path, None, T, why)
                return
            self.removes.append(Op("remove", path, L, None, why=why))
            if T.kind == "dir":
                self.replaced.add(path)
                self.add_mkdir(path, T.mode, why)
            else:
                self.put_new(path, None, T, why)
        except PathThroughSymlink as e:
            self.conflict(path, str(e), fatal=True)

    def finish(self, base: Path, live: Path, theirs: Path) -> Plan:
        # a directory can only go if everything the workspace has in it goes too
        removed = {o.path for o in self.removes}
        keep_rmdirs: dict[bytes, Op] = {}
        for op in sorted(self.rmdirs, key=lambda o: -_depth(o.path)):
            try:
                children = self.lt.listdir(op.path)
            except (OSError, PathThroughSymlink):
                children = [b"?"]
            extra = [c for c in children
                     if (op.path + b"/" + c) not in removed and (op.path + b"/" + c) not in keep_rmdirs]
            if extra:
                self.conflict(op.path, "deleted in the sandbox, but the workspace has new "
                                       f"entries in it: {display(extra[0])}",
                              resolution="failed" if self.on_conflict == "fail" else "kept")
                self.puts = [p for p in self.puts if p.path != op.path]
                continue
            keep_rmdirs[op.path] = op
        ops: list[Op] = []
        ops += sorted(self.removes, key=lambda o: (-_depth(o.path), o.path))
        ops += sorted(keep_rmdirs.values(), key=lambda o: (-_depth(o.path), o.path))
        ops += sorted(self.mkdirs.values(), key=lambda o: (_depth(o.path), o.path))
        ops += sorted(self.puts, key=lambda o: o.path)
        ops += sorted((o for o in self.chmods if o.new and o.new.kind != "dir"), key=lambda o: o.path)
        ops += sorted((o for o in self.chmods if o.new and o.new.kind == "dir"),
                      key=lambda o: (-_depth(o.path), o.path))
        conflicts = tuple(sorted(self.conflicts, key=lambda c: c.path))
        return Plan(base, live, theirs, self.on_conflict, tuple(ops), conflicts,
                    tuple(self.skipped))


def plan_promotion(base: Path, live: Path, theirs: Path, *, on_conflict: OnConflict = "fail",
                   include_ignored: bool = False, paths: Iterable[bytes | str] = (),
                   labels: tuple[str, str, str] = ("ours", "base", "theirs")) -> Plan:
    """What promoting ``theirs`` (descended from ``base``) into ``live`` would do. Reads the
    three trees, writes nothing. Conflicts are in ``Plan.conflicts``; ``Plan.blocking``
    are the ones that stop ``execute_promotion``."""
    if on_conflict not in ("fail", "markers", "theirs", "ours"):
        raise ValueError(f"on_conflict must be fail, markers, theirs or ours: {on_conflict!r}")
    base, live, theirs = Path(base), Path(live), Path(theirs)
    changes = tree_changes(base, theirs, include_ignored=include_ignored, ignore_root=live,
                           paths=[os.fsencode(p) for p in paths], detect_renames=False)
    with SafeTree(base) as bt, SafeTree(live) as lt, SafeTree(theirs) as tt:
        planner = _Planner(bt, lt, tt, on_conflict, labels)
        for c in changes:
            if c.status == "renamed" and c.old_path is not None:
                # not asked for (detect_renames=False), but be correct if it comes anyway
                planner.change(Change(c.old_path, "deleted", c.old, None))
                planner.change(Change(c.path, "added", None, c.new))
            else:
                planner.change(c)
        return planner.finish(base, live, theirs)


# --- executing ----------------------------------------------------------------------------

class _LiveChanged(Exception):
    def __init__(self, path: bytes, why: str):
        super().__init__(path, why)
        self.path, self.why = path, why


def _owner_for(lt: SafeTree, old_node: Node | None) -> tuple[int, int] | None:
    if os.geteuid() != 0:
        return None
    if old_node is not None:
        return old_node.uid, old_node.gid
    st = os.fstat(lt.fd)
    return st.st_uid, st.st_gid


def _op_json(i: int, op: Op, staged: bool, pre: bool) -> dict[str, Any]:
    return {"i": i, "action": op.action, "path": b64(op.path),
            "old": op.old.to_json() if op.old else None,
            "new": op.new.to_json() if op.new else None,
            "stage": f"s{i}" if staged else None, "pre": f"p{i}" if pre else None}


def execute_promotion(plan: Plan, live: Path, journal_dir: Path,
                      promotion_id: str) -> PromotionResult:
    """Apply ``plan`` to ``live`` as one journaled transaction (see the module docstring).

    Raises ``PromotionConflict`` (exit 3, nothing written) for blocking conflicts and for
    a workspace path that changed since the plan (then everything is undone first)."""
    if plan.blocking:
        raise _conflict_error(plan.blocking)
    live, journal_dir = Path(live), Path(journal_dir)
    journal_dir.mkdir(parents=True, exist_ok=True)
    with WorkspaceLock(journal_dir):
        _recover_locked(live, journal_dir)
        pd = PromotionDir(journal_dir, promotion_id)
        staging, pre = scratch_dirs(journal_dir, live, promotion_id)
        pd.staging, pd.pre = staging, pre
        pd.path.mkdir(mode=0o700)
        staging.mkdir(mode=0o700, parents=True)
        pre.mkdir(mode=0o700)
        fsync_dir(journal_dir)
        fsync_dir(staging.parent)
        with SafeTree(live) as lt, SafeTree(plan.theirs) as tt:
            st_fd = os.open(staging, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            pre_fd = os.open(pre, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                records = _prepare(plan, lt, tt, st_fd, pre_fd, pd)
                pd.write_journal({"schema": SCHEMA, "promotion": promotion_id,
                                  "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                              time.gmtime()),
                                  "live": b64(os.fsencode(live)),
                                  "scratch": b64(os.fsencode(staging.parent)),
                                  "ops": records})
                applied = 0
                try:
                    for i, op in enumerate(plan.ops):
                        _apply(lt, st_fd, i, op)
                        applied = i + 1
                        fault_point("apply")
                except _LiveChanged as e:
                    left = _undo(lt, pre_fd, records[:applied])
                    pd.mark("undone")
                    _cleanup(pd, keep_pre=False)
                    c = Conflict(e.path, f"changed in the workspace during the promotion "
                                         f"({e.why}); the promotion was undone", fatal=True)
                    extra = [Conflict(p, "changed in the workspace during the undo; left as is",
                                      fatal=True) for p in left]
                    raise _conflict_error([c, *extra]) from None
                parents = {b"/".join(o.path.split(b"/")[:-1]) for o in plan.ops}
                for d in sorted(parents, key=_depth, reverse=True):
                    try:
                        lt.fsync_dir(d)
                    except (OSError, PathThroughSymlink, UnsafePath):
                        pass  # gone again (removed by a later op): its parent is synced
                fault_point("fsync")
                pd.mark("done")
                pd.drop_staging()
            finally:
                os.close(st_fd)
                os.close(pre_fd)
        park_preimages(pd)
    return PromotionResult(promotion_id, tuple(o.path for o in plan.ops), plan.conflicts,
                           plan.skipped, plan.writes_markers)


def _prepare(plan: Plan, lt: SafeTree, tt: SafeTree, st_fd: int, pre_fd: int,
             pd: PromotionDir) -> list[dict[str, Any]]:
    """Stage new content and link pre-images; on any surprise discard and raise."""
    records = []
    try:
        for i, op in enumerate(plan.ops):
            staged = has_pre = False
            old_node = None
            if op.old is not None and op.action in ("put", "remove"):
                try:
                    old_node = lt.node(op.path)
                    lt.link_out(op.path, pre_fd, f"p{i}".encode())
                except OSError as e:
                    if e.errno not in (errno.EPERM, errno.EXDEV, errno.EMLINK):
                        raise _LiveChanged(op.path, f"cannot keep its pre-image: {e}") from e
                    _copy_preimage(lt, op.path, pre_fd, f"p{i}".encode())
                except PathThroughSymlink as e:
                    raise _LiveChanged(op.path, str(e)) from e
                pre_tree = _PreTree(pre_fd)
                if not _matches(pre_tree.node(f"p{i}".encode()), op.old):
                    raise _LiveChanged(op.path, "it changed since the plan was made")
                has_pre = True
                fault_point("preimage")
            if op.action == "put":
                assert op.new is not None
                name = f"s{i}".encode()
                if op.new.kind == "symlink":
                    assert op.new.target is not None
                    if content_id_bytes(op.new.target) != op.new.cid:
                        raise SandboxChangedDuringPromotion(path=display(op.path))
                    os.symlink(op.new.target, name, dir_fd=st_fd)
                    own = _owner_for(lt, old_node)
                    if own:
                        os.chown(name, *own, dir_fd=st_fd, follow_symlinks=False)
                else:
                    own = _owner_for(lt, old_node)
                    if op.data is not None:
                        cid = write_new_file(st_fd, name, [op.data], op.new.mode, owner=own)
                    else:
                        assert op.source is not None
                        try:
                            src = tt.open_regular(op.source)
                        except (OSError, PathThroughSymlink) as e:
                            raise SandboxChangedDuringPromotion(path=display(op.path)) from e
                        try:
                            cid = write_new_file(st_fd, name, read_chunks(src), op.new.mode,
                                                 owner=own)
                        finally:
                            os.close(src)
                    if cid != op.new.cid:
                        raise SandboxChangedDuringPromotion(path=display(op.path))
                staged = True
                fault_point("stage")
            records.append(_op_json(i, op, staged, has_pre))
        os.fsync(st_fd)
        os.fsync(pre_fd)
    except _LiveChanged as e:
        _cleanup(pd, keep_pre=False)
        pd.discard()
        raise _conflict_error([Conflict(e.path, e.why, fatal=True)]) from None
    except BaseException:
        _cleanup(pd, keep_pre=False)
        pd.discard()
        raise
    return records


class _PreTree(SafeTree):
    """The pre-image directory seen through SafeTree's readers."""

    def __init__(self, fd: int):
        self.root = b"<pre>"
        self.fd = os.dup(fd)

    def node(self, rel: bytes, *, with_content_id: bool = True) -> Node | None:  # type: ignore[override]
        try:
            return super().node(rel, with_content_id=True)
        finally:
            self.close()


def _copy_preimage(lt: SafeTree, path: bytes, pre_fd: int, name: bytes) -> None:
    n = lt.node(path)
    if n is None:
        raise _LiveChanged(path, "it disappeared since the plan was made")
    if n.kind == "symlink":
        assert n.target is not None
        os.symlink(n.target, name, dir_fd=pre_fd)
        return
    src = lt.open_regular(path)
    try:
        write_new_file(pre_fd, name, read_chunks(src), n.mode)
    finally:
        os.close(src)


def _apply(lt: SafeTree, st_fd: int, i: int, op: Op) -> None:
    p = op.path
    try:
        if op.action == "put":
            if op.old is None:
                try:
                    lt.rename_in(st_fd, f"s{i}".encode(), p, noreplace=True)
                except FileExistsError:
                    raise _LiveChanged(p, "something was created there") from None
                except FileNotFoundError:
                    raise _LiveChanged(p, "its directory disappeared") from None
                return
            cur = lt.node(p, with_content_id=True)
            if not _matches(cur, op.old):
                raise _LiveChanged(p, "its content or mode changed")
            lt.rename_in(st_fd, f"s{i}".encode(), p, noreplace=False)
        elif op.action == "remove":
            cur = lt.node(p, with_content_id=True)
            if not _matches(cur, op.old):
                raise _LiveChanged(p, "its content or mode changed")
            lt.unlink(p)
        elif op.action == "mkdir":
            assert op.new is not None
            try:
                lt.mkdir(p, op.new.mode)
            except FileExistsError:
                raise _LiveChanged(p, "something was created there") from None
            if os.geteuid() == 0:
                st = os.fstat(lt.fd)
                pfd, name = lt.parent(p)
                try:
                    os.chown(name, st.st_uid, st.st_gid, dir_fd=pfd, follow_symlinks=False)
                finally:
                    os.close(pfd)
        elif op.action == "rmdir":
            cur = lt.node(p)
            if cur is None or cur.kind != "dir":
                raise _LiveChanged(p, "it is no longer a directory")
            try:
                lt.rmdir(p)
            except OSError as e:
                if e.errno in (errno.ENOTEMPTY, errno.EEXIST):
                    raise _LiveChanged(p, "new entries appeared in it") from None
                raise
        elif op.action == "chmod":
            assert op.new is not None
            cur = lt.node(p, with_content_id=(op.new.kind == "file"))
            if not _matches(cur, op.old):
                raise _LiveChanged(p, "its content or mode changed")
            lt.chmod(p, op.new.mode)
        else:
            raise AssertionError(op.action)
    except (PathThroughSymlink, UnsafePath) as e:
        raise _LiveChanged(p, str(e)) from None
    except PermissionError as e:
        raise _LiveChanged(p, f"permission denied: {e}") from None


@dataclass(frozen=True, slots=True)
class UndoStep:
    """One write of an undo. ``expect`` is what ``path`` must hold right before it (the
    journal's post-image, or what an earlier step of the same undo left there); it is
    re-checked just before the write, as ``_apply`` does."""

    verb: str  # 'unlink' | 'restore' | 'restore_new' | 'rmdir' | 'mkdir' | 'chmod'
    path: bytes
    expect: State | None
    pre: bytes | None = None  # restore / restore_new: the pre-image to rename back
    mode: int | None = None  # mkdir / chmod


@dataclass(frozen=True)
class UndoPlan:
    """What undoing a promotion's ops would write, and the paths it cannot undo (they hold
    neither the old nor the new state: someone changed them since, or put new entries into
    a directory the promotion created). Reads only."""

    steps: tuple[UndoStep, ...]
    blocked: tuple[bytes, ...]


class _UndoPlanner:
    """Walks the ops newest first against a simulated workspace: live as it is now, plus
    what the steps planned so far will have done (a path can be touched by two ops)."""

    def __init__(self, lt: SafeTree, has_pre: Callable[[bytes], bool]):
        self.lt, self.has_pre = lt, has_pre
        self.sim: dict[bytes, State | None] = {}
        self.fresh: set[bytes] = set()  # paths whose live object a step replaces or removes
        self.steps: list[UndoStep] = []
        self.blocked: list[bytes] = []

    def cur(self, path: bytes) -> State | None:
        if path in self.sim:
            return self.sim[path]
        if any(a in self.fresh for a in _ancestors(path)):
            return None  # below something the undo removed or made anew: nothing yet
        return _state_of_node(self.lt.node(path, with_content_id=True))

    def step(self, verb: str, path: bytes, expect: State | None, after: State | None,
             **kw: Any) -> None:
        self.steps.append(UndoStep(verb, path, expect, **kw))
        self.sim[path] = after
        if verb != "chmod":
            self.fresh.add(path)

    def empty_after_undo(self, path: bytes) -> bool:
        """Will directory ``path`` be empty once the steps planned so far have run?"""
        names: set[bytes] = set()
        if path not in self.fresh and not any(a in self.fresh for a in _ancestors(path)):
            try:
                names = set(self.lt.listdir(path))
            except (OSError, PathThroughSymlink, UnsafePath):
                return False
        prefix = path + b"/"
        names |= {p[len(prefix):] for p in self.sim if p.startswith(prefix) and b"/" not in p[len(prefix):]}
        return all(self.cur(prefix + n) is None for n in names)

    def record(self, rec: dict[str, Any]) -> None:
        path = unb64(rec["path"])
        assert path is not None
        old, new = State.from_json(rec["old"]), State.from_json(rec["new"])
        action = rec["action"]
        pre = rec["pre"].encode() if rec.get("pre") else None
        try:
            cur = self.cur(path)
        except (PathThroughSymlink, UnsafePath):
            self.blocked.append(path)
            return
        if action in ("put", "chmod") and _same(cur, old):
            return
        if action == "put" and _same(cur, new):
            if old is None:
                self.step("unlink", path, cur, None)
                return
            if pre is not None and self.has_pre(pre):
                self.step("restore", path, cur, old, pre=pre)
                return
        elif action == "remove":
            if _same(cur, old):
                return
            if cur is None and pre is not None and self.has_pre(pre):
                self.step("restore_new", path, None, old, pre=pre)
                return
        elif action == "mkdir":
            if cur is None:
                return
            if cur.kind == "dir" and self.empty_after_undo(path):
                self.step("rmdir", path, cur, None)
                return
        elif action == "rmdir":
            assert old is not None
            if cur is None:
                self.step("mkdir", path, None, State("dir", old.mode), mode=old.mode)
                return
            if cur.kind == "dir":
                return
        elif action == "chmod" and _same(cur, new):
            assert old is not None
            self.step("chmod", path, cur, old, mode=old.mode)
            return
        self.blocked.append(path)


def plan_undo(lt: SafeTree, records: list[dict[str, Any]],
              has_pre: Callable[[bytes], bool]) -> UndoPlan:
    """What undoing ``records`` (a journal's ops, oldest first) would do to the workspace now.
    ``has_pre(name)``: is that pre-image still there. Writes nothing."""
    planner = _UndoPlanner(lt, has_pre)
    for rec in reversed(records):
        planner.record(rec)
    return UndoPlan(tuple(planner.steps), tuple(dict.fromkeys(planner.blocked)))


def _run_undo_step(lt: SafeTree, pre_fd: int, s: UndoStep) -> bool:
    """Do one step if its path still holds what the plan saw; False if it moved since."""
    try:
        cur = lt.node(s.path, with_content_id=True)
        if not _matches(cur, s.expect) and not (s.verb == "rmdir" and cur is not None
                                                 and cur.kind == "dir"):
            return False
        if s.verb == "unlink":
            lt.unlink(s.path)
        elif s.verb in ("restore", "restore_new"):
            assert s.pre is not None
            lt.rename_in(pre_fd, s.pre, s.path, noreplace=(s.verb == "restore_new"))
        elif s.verb == "rmdir":
            lt.rmdir(s.path)
        elif s.verb == "mkdir":
            assert s.mode is not None
            lt.mkdir(s.path, s.mode)
        elif s.verb == "chmod":
            assert s.mode is not None
            lt.chmod(s.path, s.mode)
        else:
            raise AssertionError(s.verb)
    except (PathThroughSymlink, UnsafePath, FileExistsError, FileNotFoundError):
        return False
    except OSError as e:
        if e.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
            return False
        raise
    return True


def _undo(lt: SafeTree, pre_fd: int, records: list[dict[str, Any]],
          plan: UndoPlan | None = None) -> list[bytes]:
    """Undo ``records`` (newest first), idempotently: plan against what live holds now (so
    a second run after a kill does only what is left), then run the steps. Returns the
    paths left alone: blocked in the plan, or changed between the plan and their step."""
    if plan is None:
        plan = plan_undo(lt, records, lambda name: _pre_exists(pre_fd, name))
    left = list(plan.blocked)
    for s in plan.steps:
        if not _run_undo_step(lt, pre_fd, s):
            left.append(s.path)
        fault_point("undo")
    for d in sorted({b"/".join(unb64(r["path"]).split(b"/")[:-1]) for r in records},  # type: ignore[union-attr]
                    key=_depth, reverse=True):
        try:
            lt.fsync_dir(d)
        except (OSError, PathThroughSymlink, UnsafePath):
            pass
    return list(dict.fromkeys(left))


def _pre_exists(pre_fd: int, name: bytes) -> bool:
    try:
        os.stat(name, dir_fd=pre_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _final_states(records: list[dict[str, Any]]) -> dict[bytes, tuple[str, State | None]]:
    """What each touched path holds once every op ran: the last op on a path decides
    (a path can be removed and then made a directory)."""
    final: dict[bytes, tuple[str, State | None]] = {}
    for rec in records:
        path = unb64(rec["path"])
        assert path is not None
        action = rec["action"]
        if action in ("remove", "rmdir"):
            final[path] = ("absent", None)
        elif action == "mkdir":
            final[path] = ("dir", None)
        else:
            final[path] = ("state", State.from_json(rec["new"]))
    return final


def _changed_since(lt: SafeTree, records: list[dict[str, Any]]) -> list[bytes]:
    """Touched paths that no longer hold what the promotion left there."""
    out = []
    final = _final_states(records)
    for path, (what, st) in sorted(final.items()):
        if what == "absent" and any(
                final.get(a, ("dir", None))[0] == "absent"
                or (final.get(a, ("dir", None))[1] is not None
                    and final[a][1].kind != "dir")  # type: ignore[union-attr]
                for a in _ancestors(path)):
            continue  # its directory is gone or became a file: checked at that path
        try:
            cur = lt.node(path, with_content_id=True)
        except (PathThroughSymlink, UnsafePath):
            out.append(path)
            continue
        if what == "absent":
            ok = cur is None
        elif what == "dir":
            ok = cur is not None and cur.kind == "dir"
        else:
            ok = _matches(cur, st)
        if not ok:
            out.append(path)
    return out


def _all_new(lt: SafeTree, records: list[dict[str, Any]]) -> bool:
    return not _changed_since(lt, records)


def _cleanup(pd: PromotionDir, *, keep_pre: bool) -> None:
    pd.drop_staging()
    if not keep_pre:
        pd.drop_preimages()
    scratch = pd.staging.parent
    if scratch != pd.path and not keep_pre:
        _rmtree_counting(pd.path / PRE)  # parked pre-images of an undone promotion
        try:
            os.unlink(pd.path / PARKED)
        except FileNotFoundError:
            pass
        try:
            os.rmdir(scratch)
        except OSError:
            pass


def _is_parked(pd: PromotionDir) -> bool:
    return (pd.path / PARKED).exists()


def _copy_entry(src_dir: int, dst_dir: int, name: str) -> None:
    """A reflink copy (FICLONE works across subvolumes of one btrfs), else a plain copy,
    keeping mode, owner and times: undo renames it back into place."""
    st = os.lstat(name, dir_fd=src_dir)
    if stat.S_ISLNK(st.st_mode):
        os.symlink(os.readlink(name, dir_fd=src_dir), name, dir_fd=dst_dir)
        if os.geteuid() == 0:
            os.chown(name, st.st_uid, st.st_gid, dir_fd=dst_dir, follow_symlinks=False)
        return
    src = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=src_dir)
    try:
        dst = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                      0o600, dir_fd=dst_dir)
        try:
            try:
                fcntl.ioctl(dst, _FICLONE, src)
            except OSError:
                for chunk in read_chunks(src):
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(dst, view):]
            if os.geteuid() == 0:
                os.fchown(dst, st.st_uid, st.st_gid)
            os.fchmod(dst, stat.S_IMODE(st.st_mode))
            os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
            os.fsync(dst)
        finally:
            os.close(dst)
    finally:
        os.close(src)


def _copy_dir(src: Path, dst: Path) -> None:
    """Copy every entry of ``src`` into a fresh ``dst`` (a leftover half copy is redone)."""
    _rmtree_counting(dst)
    dst.mkdir(mode=0o700, parents=True)
    sfd = os.open(src, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW)
    dfd = os.open(dst, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        for name in sorted(os.listdir(sfd)):
            _copy_entry(sfd, dfd, name)
        os.fsync(dfd)
    finally:
        os.close(sfd)
        os.close(dfd)


def park_preimages(pd: PromotionDir) -> None:
    """Move a finished promotion's pre-images out of the workspace, into its journal.

    Only when the journal is on another device (the store as a nested btrfs subvolume):
    then the scratch dir ``<workspace>/.petri-staging-<id>/`` holds them, and nothing of
    petri's may stay visible in the live tree. They are copied (reflinked where the
    filesystem can) to ``<journal>/<id>/pre``, the ``parked`` mark makes that copy the one
    that counts, and the scratch dir goes. Idempotent: recovery calls it again after a kill."""
    scratch = pd.staging.parent
    if scratch == pd.path:
        return
    if not _is_parked(pd):
        if pd.pre.is_dir():
            _copy_dir(pd.pre, pd.path / PRE)
        else:
            (pd.path / PRE).mkdir(mode=0o700, exist_ok=True)
        fsync_dir(pd.path)
        atomic_write(pd.path, PARKED, b"")
        fault_point("park")
    _rmtree_counting(scratch)
    try:
        fsync_dir(scratch.parent)
    except OSError:
        pass


def _unpark_preimages(pd: PromotionDir) -> None:
    """Copy parked pre-images back into the workspace's scratch dir (renames into the
    workspace must not cross devices) before an undo begins."""
    if pd.staging.parent == pd.path or not _is_parked(pd):
        return
    _copy_dir(pd.path / PRE, pd.pre)
    fsync_dir(pd.pre.parent)


def _open_pd(live: Path, journal_dir: Path, pid: str) -> PromotionDir:
    pd = PromotionDir(journal_dir, pid)
    pd.staging, pd.pre = scratch_dirs(journal_dir, live, pid)
    return pd


def _recover_locked(live: Path, journal_dir: Path) -> tuple[list[str], list[str]]:
    finished: list[str] = []
    undone: list[str] = []
    for pd0 in list_promotions(journal_dir):
        pd = _open_pd(live, journal_dir, pd0.id)
        state = pd.state
        if state == "uncommitted":
            _cleanup(pd, keep_pre=False)  # scratch first: pd.path is how we find it again
            pd.discard()
            undone.append(pd.id)
            continue
        if state == "done":
            pd.drop_staging()  # a kill between the done mark and the cleanup
            park_preimages(pd)  # ... or before its pre-images left the workspace
            continue
        if state == "undone":
            _cleanup(pd, keep_pre=False)
            continue
        record = pd.read_journal()
        with SafeTree(live) as lt:
            if state == "interrupted" and _all_new(lt, record["ops"]):
                fault_point("fsync")
                pd.mark("done")
                pd.drop_staging()
                park_preimages(pd)
                finished.append(pd.id)
                continue
            pre_fd = _open_or_make(pd.pre)
            try:
                _undo(lt, pre_fd, record["ops"])
            finally:
                os.close(pre_fd)
        pd.mark("undone")
        _cleanup(pd, keep_pre=False)
        undone.append(pd.id)
    return finished, undone


def _open_or_make(d: Path) -> int:
    d.mkdir(parents=True, exist_ok=True)
    return os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def recover(live: Path, journal_dir: Path) -> tuple[list[str], list[str]]:
    """Settle every interrupted promotion: (ids finished, ids undone or discarded).

    Safe to run any time and again after being killed itself."""
    live, journal_dir = Path(live), Path(journal_dir)
    if not journal_dir.is_dir():
        return [], []
    with WorkspaceLock(journal_dir):
        return _recover_locked(live, journal_dir)


def promotion_state(journal_dir: Path, promotion_id: str) -> str:
    """'uncommitted' | 'interrupted' | 'done' | 'undone' | 'unknown'."""
    pd = PromotionDir(Path(journal_dir), promotion_id)
    return pd.state if pd.path.is_dir() else "unknown"


def undo_promotion(live: Path, journal_dir: Path, promotion_id: str) -> list[bytes]:
    """Put back what a finished promotion replaced; return the paths restored.

    Plans the whole undo first (``plan_undo``, against the journal's post-image) and
    refuses with ``UndoConflict`` (exit 3) before writing anything when the workspace
    changed any of those paths since, put new entries into a directory the promotion
    created, or a pre-image is gone. Only a change made between that check and a path's
    own step (microseconds) is found later: that path is left alone, the rest is undone,
    and the ``UndoConflict`` raised then has ``undone = True``."""
    live, journal_dir = Path(live), Path(journal_dir)
    with WorkspaceLock(journal_dir):
        _recover_locked(live, journal_dir)
        pd = _open_pd(live, journal_dir, promotion_id)
        if not pd.path.is_dir():
            raise UnknownPromotion(promotion=promotion_id)
        state = pd.state
        if state != "done":
            raise PromotionNotUndoable(promotion=promotion_id, state=state)
        record = pd.read_journal()
        ops = record["ops"]
        pre_dir = pd.path / PRE if _is_parked(pd) else pd.pre
        with SafeTree(live) as lt:
            plan = plan_undo(lt, ops, lambda name: os.path.lexists(pre_dir / os.fsdecode(name)))
            blocked = [*_changed_since(lt, ops), *plan.blocked]
            if blocked:
                raise UndoConflict(promotion=promotion_id,
                                   paths=", ".join(display(p) for p in sorted(set(blocked))))
            _unpark_preimages(pd)  # a kill here leaves it done: recovery re-parks
            pd.mark("undoing")  # from here on, recovery completes this undo
            pre_fd = _open_or_make(pd.pre)
            try:
                left = _undo(lt, pre_fd, ops, plan)
            finally:
                os.close(pre_fd)
        pd.mark("undone")
        _cleanup(pd, keep_pre=False)
        if left:
            err = UndoConflict(promotion=promotion_id,
                               paths=", ".join(display(p) for p in sorted(set(left))))
            err.undone = True  # type: ignore[attr-defined]
            raise err
        return [unb64(r["path"]) for r in ops]  # type: ignore[misc]
