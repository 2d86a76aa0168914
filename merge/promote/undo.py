"""Undoing a promotion's ops: plan the undo against what the workspace holds now, then run it.

Each op's undo first looks at what its path holds: the old state (nothing to do), the new
state (restore it from its pre-image), anything else (someone changed it since: leave it
and report it). Planning reads only, so a refused undo writes nothing, and re-planning
after a kill does only what is left: the undo is idempotent.

Caveats: a path changed between the plan and its own step (microseconds) is found at that
step and left alone; the rest is still undone.
"""
from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import PathThroughSymlink, UnsafePath
from ..journal import fault_point, syncfs_fd, unb64
from ..safefs import SafeTree
from .model import State, ancestors, matches, same, state_of_node


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


class LiveStates:
    """What live holds at each path, read (and hashed) once: an undo's refusal check and its
    plan look at the same paths back to back, under the workspace lock and writing nothing.
    Each step still reads its path again right before it writes (``_run_undo_step``)."""

    def __init__(self, lt: SafeTree):
        self.lt = lt
        self._got: dict[bytes, State | None | PathThroughSymlink | UnsafePath] = {}

    def state(self, path: bytes) -> State | None:
        if path in self._got:
            got = self._got[path]
        else:
            try:
                got = state_of_node(self.lt.node(path, with_content_id=True))
            except (PathThroughSymlink, UnsafePath) as e:
                got = e
            self._got[path] = got
        if isinstance(got, (PathThroughSymlink, UnsafePath)):
            raise got
        return got


class _UndoPlanner:
    """Walks the ops newest first against a simulated workspace: live as it is now, plus
    what the steps planned so far will have done (a path can be touched by two ops)."""

    def __init__(self, lt: SafeTree, has_pre: Callable[[bytes], bool], states: LiveStates):
        self.lt, self.has_pre, self.states = lt, has_pre, states
        self.sim: dict[bytes, State | None] = {}
        self.sim_children: dict[bytes, set[bytes]] = {}  # directory -> names of its paths in sim
        self.fresh: set[bytes] = set()  # paths whose live object a step replaces or removes
        self.steps: list[UndoStep] = []
        self.blocked: list[bytes] = []

    def cur(self, path: bytes) -> State | None:
        if path in self.sim:
            return self.sim[path]
        if any(a in self.fresh for a in ancestors(path)):
            return None  # below something the undo removed or made anew: nothing yet
        return self.states.state(path)

    def step(self, verb: str, path: bytes, expect: State | None, after: State | None,
             **kw: Any) -> None:
        self.steps.append(UndoStep(verb, path, expect, **kw))
        self.sim[path] = after
        parent, _, name = path.rpartition(b"/")
        self.sim_children.setdefault(parent, set()).add(name)
        if verb != "chmod":
            self.fresh.add(path)

    def empty_after_undo(self, path: bytes) -> bool:
        """Will directory ``path`` be empty once the steps planned so far have run?"""
        names: set[bytes] = set()
        if path not in self.fresh and not any(a in self.fresh for a in ancestors(path)):
            try:
                names = set(self.lt.listdir(path))
            except (OSError, PathThroughSymlink, UnsafePath):
                return False
        # An index, not a scan of sim: a scan per directory was quadratic in a promotion
        # that made thousands of directories.
        names |= self.sim_children.get(path, set())
        prefix = path + b"/"
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
        if action in ("put", "chmod") and same(cur, old):
            return
        if action == "put" and same(cur, new):
            if old is None:
                self.step("unlink", path, cur, None)
                return
            if pre is not None and self.has_pre(pre):
                self.step("restore", path, cur, old, pre=pre)
                return
        elif action == "remove":
            if same(cur, old):
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
        elif action == "chmod" and same(cur, new):
            assert old is not None
            self.step("chmod", path, cur, old, mode=old.mode)
            return
        self.blocked.append(path)


def plan_undo(lt: SafeTree, records: list[dict[str, Any]],
              has_pre: Callable[[bytes], bool], states: LiveStates | None = None) -> UndoPlan:
    """What undoing ``records`` (a journal's ops, oldest first) would do to the workspace now.
    ``has_pre(name)``: is that pre-image still there; ``states``: live as already read (by
    ``changed_since``). Writes nothing."""
    planner = _UndoPlanner(lt, has_pre, states or LiveStates(lt))
    for rec in reversed(records):
        planner.record(rec)
    return UndoPlan(tuple(planner.steps), tuple(dict.fromkeys(planner.blocked)))


def _run_undo_step(lt: SafeTree, pre_fd: int, s: UndoStep) -> bool:
    """Do one step if its path still holds what the plan saw; False if it moved since."""
    try:
        cur = lt.node(s.path, with_content_id=True)
        if not matches(cur, s.expect) and not (s.verb == "rmdir" and cur is not None
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


def undo_records(lt: SafeTree, pre_fd: int, records: list[dict[str, Any]],
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
    # One flush for every rename and removal above, before the caller's undone mark.
    syncfs_fd(lt.fd, lt.root)
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


def _gone_or_not_dir(final: dict[bytes, tuple[str, State | None]], path: bytes) -> bool:
    """Did the promotion leave ``path`` absent or as something other than a directory?"""
    what, st = final.get(path, ("dir", None))
    return what == "absent" or (st is not None and st.kind != "dir")


def changed_since(lt: SafeTree, records: list[dict[str, Any]],
                  states: LiveStates | None = None) -> list[bytes]:
    """Touched paths that no longer hold what the promotion left there."""
    out = []
    final = _final_states(records)
    states = states or LiveStates(lt)
    for path, (what, st) in sorted(final.items()):
        if what == "absent" and any(_gone_or_not_dir(final, a) for a in ancestors(path)):
            continue  # its directory is gone or became a file: checked at that path
        try:
            cur = states.state(path)
        except (PathThroughSymlink, UnsafePath):
            out.append(path)
            continue
        if what == "absent":
            ok = cur is None
        elif what == "dir":
            ok = cur is not None and cur.kind == "dir"
        else:
            ok = same(cur, st)
        if not ok:
            out.append(path)
    return out


def all_new(lt: SafeTree, records: list[dict[str, Any]]) -> bool:
    return not changed_since(lt, records)

