"""Settling promotions after the fact: recovery of interrupted ones, undo of finished ones.

``recover`` settles interrupted promotions: uncommitted ones are discarded (the workspace was
never touched); committed ones are finished when every op is already applied (only the done
mark was missing) and undone otherwise. ``undo_promotion`` (``petri rollback p-...``) undoes a
finished one from its pre-images, refusing (``UndoConflict``, exit 3, naming the paths) when
the workspace changed any of them since.

Caveats:
- Recovery after a crash cannot tell "an editor created exactly the promoted content at
  this path" from "the promotion created it": it undoes it.
"""
from __future__ import annotations

import os
from pathlib import Path

from ..errors import PromotionNotUndoable, UndoConflict, UnknownPromotion
from ..journal import PRE, PromotionDir, WorkspaceLock, fault_point, list_promotions, syncfs_fd, unb64
from ..safefs import SafeTree
from .model import display
from .scratch import cleanup, is_parked, open_or_make, open_pd, unpark_preimages, park_preimages
from .undo import LiveStates, all_new, changed_since, plan_undo, undo_records


def recover_locked(live: Path, journal_dir: Path) -> tuple[list[str], list[str]]:
    finished: list[str] = []
    undone: list[str] = []
    for pd0 in list_promotions(journal_dir):
        pd = open_pd(live, journal_dir, pd0.id)
        state = pd.state
        if state == "uncommitted":
            cleanup(pd, keep_pre=False)  # scratch first: pd.path is how we find it again
            pd.discard()
            undone.append(pd.id)
            continue
        if state == "done":
            pd.drop_staging()  # a kill between the done mark and the cleanup
            park_preimages(pd)  # ... or before its pre-images left the workspace
            continue
        if state == "undone":
            cleanup(pd, keep_pre=False)
            continue
        record = pd.read_journal()
        with SafeTree(live) as lt:
            if state == "interrupted" and all_new(lt, record["ops"]):
                syncfs_fd(lt.fd, live)  # the renames a kill may have left unflushed, before done
                fault_point("fsync")
                pd.mark("done")
                pd.drop_staging()
                park_preimages(pd)
                finished.append(pd.id)
                continue
            pre_fd = open_or_make(pd.pre)
            try:
                undo_records(lt, pre_fd, record["ops"])
            finally:
                os.close(pre_fd)
        pd.mark("undone")
        cleanup(pd, keep_pre=False)
        undone.append(pd.id)
    return finished, undone



def recover(live: Path, journal_dir: Path) -> tuple[list[str], list[str]]:
    """Settle every interrupted promotion: (ids finished, ids undone or discarded).

    Safe to run any time and again after being killed itself."""
    live, journal_dir = Path(live), Path(journal_dir)
    if not journal_dir.is_dir():
        return [], []
    with WorkspaceLock(journal_dir):
        return recover_locked(live, journal_dir)


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
        recover_locked(live, journal_dir)
        pd = open_pd(live, journal_dir, promotion_id)
        if not pd.path.is_dir():
            raise UnknownPromotion(promotion=promotion_id)
        state = pd.state
        if state != "done":
            raise PromotionNotUndoable(promotion=promotion_id, state=state)
        record = pd.read_journal()
        ops = record["ops"]
        pre_dir = pd.path / PRE if is_parked(pd) else pd.pre
        with SafeTree(live) as lt:
            states = LiveStates(lt)  # each touched path read and hashed once for both checks
            plan = plan_undo(lt, ops, lambda name: os.path.lexists(pre_dir / os.fsdecode(name)), states)
            blocked = [*changed_since(lt, ops, states), *plan.blocked]
            if blocked:
                raise UndoConflict(promotion=promotion_id,
                                   paths=", ".join(display(p) for p in sorted(set(blocked))))
            unpark_preimages(pd)  # a kill here leaves it done: recovery re-parks
            pd.mark("undoing")  # from here on, recovery completes this undo
            pre_fd = open_or_make(pd.pre)
            try:
                left = undo_records(lt, pre_fd, ops, plan)
            finally:
                os.close(pre_fd)
        pd.mark("undone")
        cleanup(pd, keep_pre=False)
        if left:
            err = UndoConflict(promotion=promotion_id,
                               paths=", ".join(display(p) for p in sorted(set(left))))
            err.undone = True
            raise err
        return [unb64(r["path"]) for r in ops]
