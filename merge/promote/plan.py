"""Planning a promotion: what applying a sandbox to the live workspace would write.

``plan_promotion`` reads the three trees (base = the sandbox's base,
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


Caveats: the plan is only as fresh as the moment it was read; ``execute_promotion`` re-checks
every path against the state recorded here before it writes.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Literal

from ..changes import Change, Entry, tree_changes
from ..errors import PathThroughSymlink
from ..merge3 import ConflictHunk, merge3
from ..on_conflict import ON_CONFLICT, OnConflict
from ..safefs import SafeTree, content_id_bytes, safe_mode, split_rel
from .model import Conflict, Op, Plan, State, ancestors, depth, same, state_of_node, display

# What a check leaves for ``petri evolve`` to read (orchestrator.evolve): never a change.
METRICS_FILE = b".petri-metrics.json"
PROTECTED_TOP = (b".git", b".petri", METRICS_FILE)


def _state_of_entry(e: Entry | None, tree: SafeTree, path: bytes) -> State | None:
    if e is None:
        return None
    target = tree.readlink(path) if e.kind == "symlink" else None
    return State(e.kind, e.mode, e.content_id, target)



class _Planner:
    def __init__(self, bt: SafeTree, lt: SafeTree, tt: SafeTree, on_conflict: OnConflict,
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
        self.already_in_live = 0
        self.replaced: set[bytes] = set()  # live non-dirs removed to make way for a directory

    # live state, seeing through the plan's own type changes
    def live(self, path: bytes) -> State | None:
        if any(a in self.replaced for a in ancestors(path)):
            return None
        return state_of_node(self.lt.node(path, with_content_id=True))

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
        if same(L, T):
            self.already_in_live += 1
            return
        if same(L, B):
            self.transform(path, L, T, "theirs")
            return
        self.both_changed(path, B, L, T)

    def both_changed(self, path: bytes, B: State | None, L: State | None,
                     T: State | None) -> None:
        lk, tk, bk = (L.kind if L else None), (T.kind if T else None), (B.kind if B else None)
        if L is not None and T is not None and lk == tk == "file" and bk in (None, "file"):
            self.merge_files(path, B, L, T)
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
        favor: Literal["ours", "theirs"] | None = None
        if self.on_conflict == "ours" or self.on_conflict == "theirs":
            favor = self.on_conflict
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
        for a in ancestors(path):
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
        kept_dirs: set[bytes] = set()  # rmdirs dropped: no put may replace them (one filter below)
        for op in sorted(self.rmdirs, key=lambda o: -depth(o.path)):
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
                kept_dirs.add(op.path)
                continue
            keep_rmdirs[op.path] = op
        if kept_dirs:
            self.puts = [p for p in self.puts if p.path not in kept_dirs]
        ops: list[Op] = []
        ops += sorted(self.removes, key=lambda o: (-depth(o.path), o.path))
        ops += sorted(keep_rmdirs.values(), key=lambda o: (-depth(o.path), o.path))
        ops += sorted(self.mkdirs.values(), key=lambda o: (depth(o.path), o.path))
        ops += sorted(self.puts, key=lambda o: o.path)
        ops += sorted((o for o in self.chmods if o.new and o.new.kind != "dir"), key=lambda o: o.path)
        ops += sorted((o for o in self.chmods if o.new and o.new.kind == "dir"),
                      key=lambda o: (-depth(o.path), o.path))
        conflicts = tuple(sorted(self.conflicts, key=lambda c: c.path))
        return Plan(base, live, theirs, self.on_conflict, tuple(ops), conflicts,
                    tuple(self.skipped), self.already_in_live)


def plan_promotion(base: Path, live: Path, theirs: Path, *, on_conflict: OnConflict = "fail",
                   include_ignored: bool = False, paths: Iterable[bytes | str] = (),
                   labels: tuple[str, str, str] = ("ours", "base", "theirs")) -> Plan:
    """What promoting ``theirs`` (descended from ``base``) into ``live`` would do. Reads the
    three trees, writes nothing. Conflicts are in ``Plan.conflicts``; ``Plan.blocking``
    are the ones that stop ``execute_promotion``."""
    if on_conflict not in ON_CONFLICT:
        raise ValueError(f"on_conflict must be one of {', '.join(ON_CONFLICT)}: {on_conflict!r}")
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

