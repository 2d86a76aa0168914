"""What a FUSE sandbox changed and what it read, appended as it happens.

Two append-only files and a counter in the journal directory (``<sandbox>/journal`` for the
fuse backend):

``changes``  records ``<kind byte><path>\\0``, written *before* the change reaches the upper
             directory, so the set of recorded paths is a superset of what changed. Kinds:
             ``W`` content written, ``C`` created, ``A`` metadata/xattrs, ``U`` removed,
             ``T`` the whole subtree under the path may have changed (directory renames).
``reads``    records ``<path>\\0`` for every path opened for reading, readlink'ed, or whose
             metadata was read (a lookup or getattr of a file or symlink: a run that only
             ``stat()``s a file still depends on it), once per daemon lifetime.
``disk_refusals`` how many writes the disk budget refused (a decimal count, rewritten in
             place), so ``limits_hit`` comes from the budget, not from a command's output.

Paths are bytes relative to the sandbox root (NUL is the only byte a name cannot hold, so
it is the separator; newlines and invalid UTF-8 survive).

Caveats: records are appended with ``write(2)`` on an ``O_APPEND`` descriptor without
fsync: they survive the daemon being killed (they sit in the page cache) but not a machine
crash; after one, fall back to ``walk_upper`` (which sees every change except that a file
was read). Paths recorded before a directory rename keep their old names; the ``T`` records
of the rename cover both sides.
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

CHANGES = "changes"
READS = "reads"
DISK_REFUSALS = "disk_refusals"
WHITEOUT_DEV = 0
OPAQUE_XATTR = "user.overlay.opaque"


class Journal:
    """The writer side, owned by one daemon."""

    def __init__(self, directory: str | os.PathLike | None) -> None:
        self._changes_fd = self._reads_fd = -1
        self._seen_changes: set[bytes] = set()
        self._seen_reads: set[bytes] = set()
        self._directory = os.fsencode(directory) if directory is not None else None
        self._refusals_fd = -1
        self._refusals = 0
        if directory is None:
            return
        os.makedirs(directory, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
        self._changes_fd = os.open(os.path.join(directory, CHANGES), flags, 0o600)
        self._reads_fd = os.open(os.path.join(directory, READS), flags, 0o600)

    def changed(self, kind: bytes, path: bytes) -> None:
        rec = kind + path + b"\0"
        # Creation/removal/tree records are always written (order matters to a reader
        # replaying them); repeated content/metadata writes to one path add nothing.
        if kind in (b"W", b"A"):
            if rec in self._seen_changes:
                return
            self._seen_changes.add(rec)
        if self._changes_fd >= 0:
            os.write(self._changes_fd, rec)

    @property
    def records_reads(self) -> bool:
        return self._reads_fd >= 0

    def was_read(self, path: bytes) -> bool:
        return path in self._seen_reads

    def read(self, path: bytes) -> None:
        if path in self._seen_reads:
            return
        self._seen_reads.add(path)
        if self._reads_fd >= 0:
            os.write(self._reads_fd, path + b"\0")

    def disk_refused(self) -> None:
        """The disk budget refused a write: count it where the orchestrator reads it after a
        run (``limits_hit``), so the limit is reported from the budget itself, never guessed
        from what the command printed."""
        if self._directory is None:
            return
        if self._refusals_fd < 0:
            # A restarted daemon carries on from the count its predecessor left.
            self._refusals = read_disk_refusals(self._directory)
            self._refusals_fd = os.open(os.path.join(self._directory, DISK_REFUSALS.encode()),
                                        os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self._refusals += 1
        # Fixed width, written in place: a reader never sees a shorter number's leftovers.
        os.pwrite(self._refusals_fd, b"%020d\n" % self._refusals, 0)

    def close(self) -> None:
        for fd in (self._changes_fd, self._reads_fd, self._refusals_fd):
            if fd >= 0:
                os.close(fd)
        self._changes_fd = self._reads_fd = self._refusals_fd = -1


@dataclass(frozen=True)
class Changes:
    paths: frozenset[bytes]   # every path that may differ from the base
    trees: frozenset[bytes]   # of those, the ones whose whole subtree may differ

    def covers(self, path: bytes) -> bool:
        if path in self.paths:
            return True
        return any(path.startswith(t + b"/") for t in self.trees)


def _records(path: Path) -> list[bytes]:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    recs = data.split(b"\0")
    return [r for r in recs[:-1] if r]  # a torn last record (no NUL yet) is dropped


def read_changes(directory: str | os.PathLike) -> Changes:
    paths: set[bytes] = set()
    trees: set[bytes] = set()
    for rec in _records(Path(directory) / CHANGES):
        kind, p = rec[:1], rec[1:]
        paths.add(p)
        if kind == b"T":
            trees.add(p)
    return Changes(frozenset(paths), frozenset(trees))


def read_reads(directory: str | os.PathLike) -> frozenset[bytes]:
    return frozenset(_records(Path(directory) / READS))


def read_disk_refusals(directory: str | os.PathLike | bytes) -> int:
    """How many writes the disk budget has refused so far (0 when none ever was)."""
    try:
        with open(os.path.join(os.fsencode(directory), DISK_REFUSALS.encode()), "rb") as f:
            return int(f.read(21) or b"0")
    except (FileNotFoundError, ValueError):
        return 0


def is_whiteout(st: os.stat_result) -> bool:
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(0, 0)


def walk_upper(upper: str | os.PathLike) -> Changes:
    """Changes read from the upper directory itself (no journal needed; misses nothing
    but cannot tell a copied-up-and-unchanged file from a changed one)."""
    root = os.fsencode(upper)
    paths: set[bytes] = set()
    trees: set[bytes] = set()
    stack = [b""]
    while stack:
        rel = stack.pop()
        with os.scandir(os.path.join(root, rel) if rel else root) as it:
            for e in it:
                child = rel + b"/" + e.name if rel else e.name
                st = e.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    try:
                        if os.getxattr(e.path, OPAQUE_XATTR, follow_symlinks=False) == b"y":
                            trees.add(child)
                    except OSError:
                        pass
                    stack.append(child)
                paths.add(child)
    return Changes(frozenset(paths), frozenset(trees))
