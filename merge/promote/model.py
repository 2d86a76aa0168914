"""What a promotion plan is made of, and how two states of a path compare.

``State`` is what a path holds (kind, permission bits, content id, link target); ``Op`` one
write of the plan with the state it expects before and leaves after; ``Conflict`` a path the
3-way merge could not settle on its own; ``Plan`` and ``PromotionResult`` the planner's and
the executor's answers, whose ``to_json`` is the merge layer's part of the JSON documents.
Planning, executing and undoing all compare states with ``same`` / ``matches`` so the three
agree on what "unchanged" means.

Caveats: modes are compared as ``& 0o777`` for files and directories and not at all for
symlinks; a fifo, socket or device compares equal to any other of its kind.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from ..errors import PromotionConflict
from ..journal import b64, unb64
from ..merge3 import ConflictHunk
from ..safefs import Node, safe_mode


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
    # Paths the sandbox changed that live already holds as the sandbox does (nothing to
    # write): tells "nothing to promote: no changes" from "live has them already".
    already_in_live: int = 0

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
        """The merge layer's part of the ``promote`` document (the CLI adds
        ``verified`` and ``rolled_back``)."""
        return {"promotion": self.promotion,
                "applied": [display(p) for p in self.applied],
                "applied_b64": [b64(p) for p in self.applied],
                "conflicts": [c.to_json() for c in self.conflicts],
                "skipped": [{"path": display(p), "path_b64": b64(p), "reason": r}
                            for p, r in self.skipped],
                "markers": self.markers}


def conflict_error(conflicts: Iterable[Conflict]) -> PromotionConflict:
    listed = list(conflicts)
    err = PromotionConflict(paths=", ".join(f"{display(c.path)} ({c.reason})" for c in listed))
    err.conflicts = listed
    return err


def state_of_node(n: Node | None) -> State | None:
    if n is None:
        return None
    return State(n.kind, n.mode, n.content_id, n.target)


def same(a: State | None, b: State | None) -> bool:
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


def matches(cur: Node | None, st: State | None) -> bool:
    return same(state_of_node(cur), st)


def depth(p: bytes) -> int:
    return p.count(b"/")


def ancestors(path: bytes) -> list[bytes]:
    parts = path.split(b"/")
    return [b"/".join(parts[:i]) for i in range(1, len(parts))]

