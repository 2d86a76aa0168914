"""The promotion journal: lock, on-disk layout, atomic writes, fault injection.

Layout, one directory per promotion under ``journal_dir`` (which lives in the workspace's
store, so on the workspace's filesystem and renames into the workspace are atomic)::

    journal_dir/lock                 flock(2) held by whoever promotes, undoes or recovers
    journal_dir/<id>/staging/s<n>    new content for op n (fsynced before the journal)
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
``undoing`` (a rollback of a finished promotion was
interrupted) -> the undo is completed. ``done`` / ``undone`` -> settled. Undo is idempotent: each op's undo first looks at what the
path holds (old state: nothing to do; new state: restore; anything else: someone edited it
since, leave it and report it), so a kill during recovery is repaired by recovering again.

The lock is ``flock`` on ``journal_dir/lock`` (released by the kernel when the holder dies,
so a stale owner never blocks; the pid written in the file is only for the message).

Fault injection: ``PETRI_FAULT_KILL_AT=<step>:<k>[,<step>:<k>...]`` makes the process SIGKILL
itself at the k-th time (1-based, counted per process) it passes ``fault_point(step)``.
Steps, in the order a promotion meets them:

    stage        after each new file is staged and fsynced
    preimage     after each pre-image is linked (or copied)
    journal      journal.json.tmp written and fsynced, not yet renamed (still uncommitted)
    commit       journal.json renamed into place and its directory fsynced
    apply        after each op is applied to the workspace
    fsync        after the touched directories are fsynced, before the done mark
    done         after the done mark is durable, before staging is cleaned up
    park         after pre-images kept in the workspace (journal on another device) are
                 copied into the journal and marked ``parked``, before the scratch goes
    undo         after each op is undone (conflict abort, recovery, rollback)
    undoing      after the undoing mark is durable (rollback of a finished promotion)
    undone       after the undone mark is durable, before cleanup
    discard      after each entry removed while discarding an uncommitted promotion

Caveats: flock does not work across NFS clients; the workspace is assumed local.
"""
from __future__ import annotations

import base64
import errno
import fcntl
import json
import os
import shutil
import signal
import socket
import time
from pathlib import Path
from typing import Any, Callable

from .errors import JournalCorrupt, PromotionLocked

SCHEMA = 1
JOURNAL = "journal.json"
DONE = "done"
UNDOING = "undoing"
UNDONE = "undone"
STAGING = "staging"
PRE = "pre"
LOCK = "lock"
PARKED = "parked"  # pre-images were moved from the workspace's scratch dir into the journal
FAULT_ENV = "PETRI_FAULT_KILL_AT"

STEPS = ("stage", "preimage", "journal", "commit", "apply", "fsync", "done", "park", "undoing",
         "undo", "undone", "discard")

_fault_plan: dict[str, int] | None = None
_fault_counts: dict[str, int] = {}
_step_hooks: dict[str, Callable[[int], None]] = {}
_hook_counts: dict[str, int] = {}


def on_step(step: str, hook: Callable[[int], None] | None) -> None:
    """Run ``hook(k)`` at every pass k (1-based) of ``step`` in this process; None removes it.
    For tests that act at a precise point (an editor saving mid-promotion)."""
    if hook is None:
        _step_hooks.pop(step, None)
    else:
        _step_hooks[step] = hook


def fault_point(step: str) -> None:
    """SIGKILL this process here if PETRI_FAULT_KILL_AT asks for this occurrence."""
    global _fault_plan
    if _step_hooks.get(step) is not None:
        _hook_counts[step] = _hook_counts.get(step, 0) + 1
        _step_hooks[step](_hook_counts[step])
    if _fault_plan is None:
        _fault_plan = {}
        for item in os.environ.get(FAULT_ENV, "").split(","):
            if ":" in item:
                name, _, k = item.partition(":")
                _fault_plan[name.strip()] = int(k)
    if not _fault_plan:
        return
    n = _fault_counts[step] = _fault_counts.get(step, 0) + 1
    if _fault_plan.get(step) == n:
        os.kill(os.getpid(), signal.SIGKILL)


def reset_faults() -> None:
    """Re-read the environment (tests that change it in-process)."""
    global _fault_plan
    _fault_plan = None
    _fault_counts.clear()
    _hook_counts.clear()


# --- encoding -------------------------------------------------------------------------

def b64(b: bytes | None) -> str | None:
    return None if b is None else base64.b64encode(b).decode("ascii")


def unb64(s: str | None) -> bytes | None:
    return None if s is None else base64.b64decode(s)


# --- durable small files -----------------------------------------------------------------

def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(directory: Path, name: str, data: bytes, *, step: str | None = None) -> None:
    """borg's SaveFile / git's lockfile: temp in the same dir, fsync, rename, fsync dir."""
    tmp = directory / (name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    if step:
        fault_point(step)
    os.replace(tmp, directory / name)
    fsync_dir(directory)


# --- the lock ----------------------------------------------------------------------------

class WorkspaceLock:
    """Exclusive flock on ``journal_dir/lock``; ``wait`` seconds to get it (0: fail now)."""

    def __init__(self, journal_dir: Path, *, wait: float = 10.0):
        self.path = Path(journal_dir) / LOCK
        self.wait = wait
        self.fd = -1

    def __enter__(self) -> "WorkspaceLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        deadline = time.monotonic() + self.wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    owner = _read_owner(fd)
                    os.close(fd)
                    raise PromotionLocked(owner=owner) from None
                time.sleep(0.05)
        # the previous owner's record is stale by construction (its flock is gone)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since "
                      f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n".encode(), 0)
        self.fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing drops the flock
            self.fd = -1


def _read_owner(fd: int) -> str:
    try:
        text = os.pread(fd, 200, 0).decode(errors="replace").strip()
    except OSError:
        text = ""
    return text or "unknown owner"


# --- one promotion's directory -----------------------------------------------------------

class PromotionDir:
    def __init__(self, journal_dir: Path, promotion_id: str):
        if not promotion_id or "/" in promotion_id or promotion_id.startswith("."):
            raise JournalCorrupt(promotion=promotion_id, why="bad promotion id")
        self.id = promotion_id
        self.path = Path(journal_dir) / promotion_id
        self.staging = self.path / STAGING
        self.pre = self.path / PRE

    @property
    def committed(self) -> bool:
        return (self.path / JOURNAL).exists()

    @property
    def state(self) -> str:
        """'uncommitted' | 'interrupted' | 'done' | 'undoing' | 'undone'"""
        if (self.path / UNDONE).exists():
            return "undone"
        if (self.path / UNDOING).exists():
            return "undoing"
        if (self.path / DONE).exists():
            return "done"
        if self.committed:
            return "interrupted"
        return "uncommitted"

    def create(self) -> None:
        self.path.mkdir(mode=0o700)
        self.staging.mkdir(mode=0o700)
        self.pre.mkdir(mode=0o700)
        fsync_dir(self.path.parent)

    def write_journal(self, record: dict[str, Any]) -> None:
        data = json.dumps(record, sort_keys=True, indent=1).encode()
        fsync_dir(self.staging)
        fsync_dir(self.pre)
        atomic_write(self.path, JOURNAL, data, step="journal")
        fault_point("commit")

    def read_journal(self) -> dict[str, Any]:
        try:
            record = json.loads((self.path / JOURNAL).read_bytes())
        except (OSError, ValueError) as e:
            raise JournalCorrupt(promotion=self.id, why=str(e)) from e
        if record.get("schema") != SCHEMA:
            raise JournalCorrupt(promotion=self.id, why=f"schema {record.get('schema')!r}")
        return record

    def mark(self, name: str) -> None:
        atomic_write(self.path, name, json.dumps(
            {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}).encode())
        fault_point(name)

    def open_dir(self, which: Path) -> int:
        return os.open(which, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW)

    def discard(self) -> None:
        """Remove an uncommitted (or settled) promotion's scratch; idempotent."""
        _rmtree_counting(self.path)

    def drop_staging(self) -> None:
        _rmtree_counting(self.staging)

    def drop_preimages(self) -> None:
        _rmtree_counting(self.pre)


def _rmtree_counting(path: Path) -> None:
    """rmtree that never follows symlinks and passes a fault point per entry."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    import stat as _stat
    if not _stat.S_ISDIR(st.st_mode):
        os.unlink(path)
        fault_point("discard")
        return
    for entry in os.scandir(path):
        p = Path(entry.path)
        if entry.is_dir(follow_symlinks=False):
            _rmtree_counting(p)
        else:
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
            fault_point("discard")
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        if e.errno != errno.ENOTEMPTY:
            raise
        shutil.rmtree(path)


def list_promotions(journal_dir: Path) -> list[PromotionDir]:
    journal_dir = Path(journal_dir)
    if not journal_dir.is_dir():
        return []
    out = []
    for entry in sorted(os.listdir(journal_dir)):
        p = journal_dir / entry
        if entry == LOCK or entry.startswith(".") or not p.is_dir() or p.is_symlink():
            continue
        out.append(PromotionDir(journal_dir, entry))
    return out
