"""The promotion journal: its on-disk layout and states.

The lock, the directory, atomic writes and fault injection are the transaction plumbing in
``snapshot/transaction.py`` (shared with the rollback to a snapshot); this module names
what a promotion keeps there.

Layout, one directory per promotion under ``journal_dir`` (which lives in the workspace's
store, so on the workspace's filesystem and renames into the workspace are atomic)::

    journal_dir/lock                 flock(2) held by whoever promotes, undoes or recovers
    journal_dir/<id>/staging/s<n>    new content for op n (durable before the journal: one
                                     syncfs of the workspace's filesystem, see execute.py)
    journal_dir/<id>/pre/p<n>        pre-image of op n: a hard link to the replaced inode
                                     (a copy where hard links are refused)
    journal_dir/<id>/journal.json    every op with the old and new state of its path; written
                                     to a temp name, fsynced, renamed, directory fsynced
    journal_dir/<id>/done | undone   outcome marks, written the same way
    journal_dir/<id>/undoing         a rollback of a finished promotion has begun

States, as recovery reads them: no ``journal.json`` -> *uncommitted*: the workspace was not
touched, the directory is discarded. ``journal.json`` without a mark -> *interrupted*: ops
may be half applied; recovery finishes it only if every op is already in its new state (then
it marks it done), otherwise it undoes every op (the rule is "undo unless already complete").
``undoing`` (a rollback of a finished promotion was interrupted) -> the undo is completed.
``done`` / ``undone`` -> settled. Undo is idempotent: each op's undo first looks at what the
path holds (old state: nothing to do; new state: restore; anything else: someone edited it
since, leave it and report it), so a kill during recovery is repaired by recovering again.

The lock is ``flock`` on ``journal_dir/lock`` (released by the kernel when the holder dies,
so a stale owner never blocks; the pid written in the file is only for the message).

Fault injection and its step names: ``snapshot/transaction.py``.

Caveats: flock does not work across NFS clients; the workspace is assumed local.
"""
from __future__ import annotations

from pathlib import Path

from snapshot.transaction import (DONE, FAULT_ENV, JOURNAL, LOCK, PRE, SCHEMA, STAGING, STEPS,
                                  UNDOING, UNDONE, TxnDir, TxnLock, atomic_write, b64, fault_point,
                                  list_txns, on_step, reset_faults, scratch_dirs, unb64)
from snapshot.osutil import fsync_dir, syncfs_fd
from snapshot.transaction import rmtree_counting as _rmtree_counting

from .errors import JournalCorrupt, PromotionLocked

# What the promotion modules take from here: the transaction plumbing re-exported under the
# journal's name, so they need not know that it lives in snapshot/transaction.py.
__all__ = ["DONE", "FAULT_ENV", "JOURNAL", "LOCK", "PARKED", "PRE", "SCHEMA", "STAGING", "STEPS", "UNDOING",
           "UNDONE", "PromotionDir", "TxnDir", "TxnLock", "WorkspaceLock", "_rmtree_counting", "atomic_write",
           "b64", "fault_point", "fsync_dir", "list_promotions", "list_txns", "on_step", "reset_faults",
           "scratch_dirs", "syncfs_fd", "unb64"]

PARKED = "parked"  # pre-images were moved from the workspace's scratch dir into the journal


class WorkspaceLock(TxnLock):
    """The journal lock, held by whoever promotes, undoes, rolls back or recovers."""

    def busy_error(self, owner: str) -> Exception:
        return PromotionLocked(owner=owner)


class PromotionDir(TxnDir):
    def corrupt_error(self, txn_id: str, why: str) -> Exception:
        return JournalCorrupt(promotion=txn_id, why=why)


def list_promotions(journal_dir: Path) -> list[PromotionDir]:
    return list_txns(journal_dir, PromotionDir)
