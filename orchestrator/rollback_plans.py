"""What a rollback would change now, read without writing: a snapshot's restore plan and a
promotion's undo plan (``rollback --dry-run``, the API's ``rollback_plan``, the TUI's and MCP's
confirmation before an undo).

Caveat: a plan is a picture; live may change between it and the rollback, which checks again.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING
from .errors import UsageError
import merge

if TYPE_CHECKING:
    from .engine import Engine


def snapshot_restore_paths(e: "Engine", snapshot: str) -> list[bytes]:
    """The paths a restore of ``snapshot`` would change in live now."""
    from snapshot.restore import changed_paths, plan_restore

    with e.backend.snapshot_view(e.store, snapshot) as src:
        return list(changed_paths(plan_restore(bytes(src), bytes(e.root))))


def undo_plan(e: "Engine", promo_id: str) -> tuple[list[bytes], list[bytes]]:
    """(paths an undo of the promotion would write, paths that block it), reading only:
    the planner ``merge.promote.undo_promotion`` itself runs, minus its lock and writes."""


    pd = merge.promote._open_pd(e.root, e.store.journal, promo_id)
    if not pd.path.is_dir() or pd.state != "done":
        state = pd.state if pd.path.is_dir() else "gone"
        raise UsageError(detail=f"promotion {promo_id} cannot be undone (it is {state})")
    ops = pd.read_journal()["ops"]
    pre_dir = pd.path / merge.journal.PRE if merge.promote._is_parked(pd) else pd.pre
    with merge.safefs.SafeTree(e.root) as lt:
        plan = merge.promote.plan_undo(lt, ops, lambda name: os.path.lexists(pre_dir / os.fsdecode(name)))
        blocked = [*merge.promote._changed_since(lt, ops), *plan.blocked]
    return sorted({s.path for s in plan.steps}), sorted(set(blocked))
