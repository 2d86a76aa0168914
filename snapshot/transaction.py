"""Journaled transactions on the live tree: the lock, one directory per transaction, atomic
small files, fault injection. A promotion (``merge/promote/``, layout in
``merge/journal.py``) and a rollback to a snapshot (``snapshot/restore.py``) are both built
on it; it lives here, at the bottom, so that both layers can use it.

One transaction's directory, ``journal_dir/<id>/`` (in the workspace's store)::

    staging/      new content, durable before the journal
    pre/          pre-images: what the transaction replaced or removed
    journal.json  the ops; written to a temp name, fsynced, renamed, directory fsynced:
                  the commit point
    done | undoing | undone   outcome marks, written the same way

``state``: no ``journal.json`` -> *uncommitted* (live was not touched: discard it);
``journal.json`` without a mark -> *interrupted*; then ``done``, ``undoing``, ``undone``.
What recovery does with an interrupted one is the transaction's own business.

When ``journal_dir`` is on another device than the workspace (the store as a nested btrfs
subvolume), ``scratch_dirs`` puts staging and pre-images in ``<workspace>/.petri-staging-<id>/``
instead, so that every rename into the workspace stays on one filesystem.

The lock is ``flock`` on ``journal_dir/lock`` (released by the kernel when the holder dies,
so a stale owner never blocks; the pid written in the file is only for the message).

Fault injection: ``PETRI_FAULT_KILL_AT=<step>:<k>[,<step>:<k>...]`` makes the process SIGKILL
itself at the k-th time (1-based, counted per process) it passes ``fault_point(step)``.
The steps, and where a promotion and a rollback to a snapshot meet them:

    stage        after each new entry is staged
    preimage     after each pre-image is linked or copied (promotion)
    journal      journal.json's temp file written and fsynced, not yet renamed (still uncommitted)
    commit       journal.json renamed into place and its directory fsynced
    apply        after each op is applied to the workspace
    fsync        after the workspace is made durable, before the done mark
    done         after the done mark is durable, before the cleanup
    park         pre-images parked in the journal, before the scratch goes (promotion)
    undo         after each step of an undo (promotion)
    undoing      after the undoing mark is durable (promotion)
    undone       after the undone mark is durable, before cleanup
    discard      after each entry removed while discarding scratch

And where a sandbox is destroyed (``orchestrator.engine``): ``destroy-marked`` (its row says
destroyed), ``destroy-stopped`` (its processes are gone), ``destroy-tree`` (its tree is gone,
the row not let go of yet).

Caveats: flock does not work across NFS clients; the workspace is assumed local.
"""
from __future__ import annotations

import base64
import fcntl
import json
import os
import signal
import socket
import time
from pathlib import Path
from typing import Any, Callable, overload

from . import osutil
from .errors import SnapshotError
from .osutil import fsync_dir

SCHEMA = 1
JOURNAL = "journal.json"
DONE = "done"
UNDOING = "undoing"
UNDONE = "undone"
STAGING = "staging"
PRE = "pre"
LOCK = "lock"
FAULT_ENV = "PETRI_FAULT_KILL_AT"
STAGING_PREFIX = ".petri-staging-"

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


@overload
def unb64(s: str) -> bytes: ...
@overload
def unb64(s: None) -> None: ...
@overload
def unb64(s: str | None) -> bytes | None: ...
def unb64(s: str | None) -> bytes | None:
    return None if s is None else base64.b64decode(s)


# --- durable small files -----------------------------------------------------------------

def atomic_write(directory: Path, name: str, data: bytes, *, step: str | None = None) -> None:
    """``osutil.atomic_write`` of ``directory/name`` (owner-only), with the fault point
    ``step`` between the temp file's fsync and its rename."""
    osutil.atomic_write(Path(directory) / name, data, mode=0o600,
                        before_rename=(lambda: fault_point(step)) if step else None)


# --- the lock ----------------------------------------------------------------------------

class TxnLock:
    """Exclusive flock on ``journal_dir/lock``; ``wait`` seconds to get it (0: fail now)."""

    def __init__(self, journal_dir: Path, *, wait: float = 10.0):
        self.path = Path(journal_dir) / LOCK
        self.wait = wait
        self.fd = -1

    def busy_error(self, owner: str) -> Exception:
        return SnapshotError(detail=f"another petri is changing the workspace ({owner}); "
                                    "wait for it to finish")

    def __enter__(self) -> "TxnLock":
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
                    raise self.busy_error(owner) from None
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


# --- one transaction's directory -------------------------------------------------------

def scratch_dirs(journal_dir: Path, live: Path, txn_id: str) -> tuple[Path, Path]:
    """(staging dir, pre-image dir): in the journal when it shares the workspace's device,
    else in the workspace itself (renames and links must not cross devices)."""
    pd = Path(journal_dir) / txn_id
    try:
        same = os.stat(journal_dir).st_dev == os.stat(live).st_dev
    except FileNotFoundError:
        same = True
    if same:
        return pd / STAGING, pd / PRE
    s = Path(live) / (STAGING_PREFIX + txn_id)
    return s / STAGING, s / PRE


class TxnDir:
    def __init__(self, journal_dir: Path, txn_id: str):
        if not txn_id or "/" in txn_id or txn_id.startswith("."):
            raise self.corrupt_error(txn_id, "bad id")
        self.id = txn_id
        self.path = Path(journal_dir) / txn_id
        self.staging = self.path / STAGING
        self.pre = self.path / PRE

    def corrupt_error(self, txn_id: str, why: str) -> Exception:
        return SnapshotError(detail=f"the journal of {txn_id} is unreadable ({why}); "
                                    "move it aside and run `petri gc`")

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
        # Compact: with ``indent`` json uses its pure-Python encoder, ~10x slower (0.5 s for
        # a 10,000-op promotion).
        data = json.dumps(record, sort_keys=True, separators=(",", ":")).encode()
        fsync_dir(self.staging)
        fsync_dir(self.pre)
        atomic_write(self.path, JOURNAL, data, step="journal")
        fault_point("commit")

    def read_journal(self) -> dict[str, Any]:
        try:
            record = json.loads((self.path / JOURNAL).read_bytes())
        except (OSError, ValueError) as e:
            raise self.corrupt_error(self.id, str(e)) from e
        if record.get("schema") != SCHEMA:
            raise self.corrupt_error(self.id, f"schema {record.get('schema')!r}")
        return record

    def mark(self, name: str) -> None:
        atomic_write(self.path, name, json.dumps(
            {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}).encode())
        fault_point(name)

    def open_dir(self, which: Path) -> int:
        return os.open(which, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW)

    def discard(self) -> None:
        """Remove an uncommitted (or settled) transaction's directory; idempotent."""
        rmtree_counting(self.path)

    def drop_staging(self) -> None:
        rmtree_counting(self.staging)

    def drop_preimages(self) -> None:
        rmtree_counting(self.pre)


def rmtree_counting(path: Path) -> None:
    """``osutil.rmtree`` passing the fault point ``discard`` per entry removed."""
    osutil.rmtree(path, each=lambda: fault_point("discard"))


def list_txns(journal_dir: Path, cls: type[TxnDir] = TxnDir) -> list[Any]:
    """Every transaction directory under ``journal_dir`` (not the lock, not dot-names)."""
    journal_dir = Path(journal_dir)
    if not journal_dir.is_dir():
        return []
    out = []
    for entry in sorted(os.listdir(journal_dir)):
        p = journal_dir / entry
        if entry == LOCK or entry.startswith(".") or not p.is_dir() or p.is_symlink():
            continue
        out.append(cls(journal_dir, entry))
    return out
