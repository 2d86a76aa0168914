"""Recovery: finishing or undoing what a killed petri left half-done (guarantee 2).

A promotion (``orchestrator.promotions``), a stage of one (``orchestrator.stages``) and a
rollback to a snapshot (``Engine.rollback_snapshot``) each run inside ``pending(engine,
id)``: a mark ``.petri/journal/.pending/<id>`` (holding the writer's pid) exists from just
before any view is mounted or the journal is touched until the transaction is settled.
``recover_interrupted`` (every command starts with it, through ``Engine.open``) is
therefore one directory listing when nothing is pending; when something is, it takes the
store lock and lets the journals (``merge.promote.recover``, ``snapshot.restore.recover``)
finish or undo it, then puts the registry rows right.

``set_promotion_state`` is the one place a promotion's changes are recorded as in place
(``done``) or taken out again (``undone``), so it is also the one caller of the
``promotion.done`` / ``promotion.undone`` emitters: a promotion (a stage's too), a
rollback, an undo after a failed ``--verify`` or stage check, and a recovery all go
through it. A pipeline's own bookkeeping of its stage rows (``orchestrator.stages``) does
not: a fresh stage puts nothing in place.

This module is part of the core, under the engine: it knows the engine's store, registry and lock
(``store_handle.StoreHandle``, not the engine class that calls it), and the
journals below it, and no service.

Caveats: a recovery that itself fails (a full disk) leaves the mark for the next command;
``promotion.done`` / ``promotion.undone`` go to the stream of the workspace the changes
went into (a stage promoted into another workspace: that one's, not the pipeline's).
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from snapshot.osutil import fsync_dir

from . import events
import snapshot

if TYPE_CHECKING:
    from .store_handle import StoreHandle

PENDING = ".pending"


def set_promotion_state(engine: "StoreHandle", promo_id: str, state: str, doc: dict[str, Any] | None = None) -> None:
    """Move a promotion row to ``state``; a move into ``done`` or ``undone`` is an event."""
    got = engine.registry.db.execute("SELECT state FROM promotions WHERE id = ?", (promo_id,)).fetchone()
    engine.registry.update_promotion(promo_id, state, doc)
    if got is not None and got[0] != state:
        if state == "done":
            events.promotion_done(engine.store.root, promo_id)
        elif state == "undone":
            events.promotion_undone(engine.store.root, promo_id)


def _pending_dir(engine: "StoreHandle") -> Path:
    return engine.store.journal / PENDING


def _mark_pending(engine: "StoreHandle", txn_id: str) -> Path:
    d = _pending_dir(engine)
    d.mkdir(parents=True, exist_ok=True)
    p = d / txn_id
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, f"{os.getpid()}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(d)
    return p


def _clear_pending(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


_ACTIVE: set[str] = set()  # marks this process set and is still working under


@contextlib.contextmanager
def pending(engine: "StoreHandle", txn_id: str, *,
            nothing_written: tuple[type[BaseException], ...] = ()) -> Iterator[str]:
    """Mark ``txn_id`` (a promotion or a rollback to a snapshot) pending for the ``with``
    block: set before any view is mounted or the journal is touched, so a petri killed
    anywhere inside leaves a mark the next command settles (journal, views, registry).
    Any other exception than ``nothing_written`` settles it at once (ENOSPC, a bug,
    Ctrl-C: a row that never reached its journal ends "failed", not "running"); if even
    that fails the mark stays for the next command."""
    mark = _mark_pending(engine, txn_id)
    _ACTIVE.add(txn_id)
    try:
        yield txn_id
    except nothing_written:
        _clear_pending(mark)
        raise
    except BaseException:
        _ACTIVE.discard(txn_id)
        try:
            _settle(engine, [txn_id])
        except Exception:
            pass  # the mark stays: the next command settles it
        else:
            _clear_pending(mark)
        raise
    else:
        _clear_pending(mark)
    finally:
        _ACTIVE.discard(txn_id)


def _record_recovery(engine: "StoreHandle", finished: list[str], undone: list[str]) -> None:
    for pid in finished:
        set_promotion_state(engine, pid, "done")
    for pid in undone:
        set_promotion_state(engine, pid, "undone")
    acc = engine.__dict__.setdefault("_promotions_recovered", ([], []))
    acc[0].extend(finished)
    acc[1].extend(undone)


def _settle(engine: "StoreHandle", names: list[str]) -> tuple[list[str], list[str]]:
    """Finish or undo the journals of ``names`` (caller holds the store lock), put their
    registry rows right, and unmount the views their dead petris left under tmp/."""
    from merge.promote import promotion_state, recover

    finished, undone = recover(engine.root, engine.store.journal)
    snapshot.restore.recover(engine.root, engine.store.journal)
    rows = {r["id"]: r for r in engine.registry.promotions()}
    for n in names:
        if n not in rows:
            continue  # a rollback to a snapshot, or a promotion killed before its row
        # A kill after the done mark settles nothing in ``recover``: the journal decides.
        state = promotion_state(engine.store.journal, n)
        if state == "done" and n not in finished:
            finished.append(n)
        elif state == "undone" and n not in undone:
            undone.append(n)
        elif state == "unknown" and rows[n]["state"] == "running" and n not in undone:
            engine.registry.update_promotion(n, "failed")  # never got to its journal
    _record_recovery(engine, [n for n in finished if n in rows], [n for n in undone if n in rows])
    engine.reap_dead_tmp()
    return finished, undone


def recover_interrupted(engine: "StoreHandle", *, locked: bool = False) -> tuple[list[str], list[str]]:
    """Finish or undo what a killed petri left half-done: (finished ids, undone ids).

    ``locked``: the caller already holds the store lock (a live promoter holds it for its
    whole run, so anything pending then is a dead one's, or this process's own)."""
    pend = _pending_dir(engine)
    try:
        if not os.listdir(pend):
            return [], []
    except FileNotFoundError:
        return [], []
    with contextlib.nullcontext() if locked else engine.lock():
        # the promoter may have finished while we waited; our own marks are in progress
        names = [n for n in os.listdir(pend) if n not in _ACTIVE]
        if not names:
            return [], []
        finished, undone = _settle(engine, names)
        for n in names:
            _clear_pending(pend / n)
    return finished, undone
