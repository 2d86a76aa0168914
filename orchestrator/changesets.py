"""A sandbox's change set against its base, O(changes) where the backend can tell.

Every backend can be answered by the manifest compare (``merge.changes.tree_changes`` over
both whole trees). Where the backend keeps a cheaper record of what moved
(``Backend.change_candidates``: btrfs generations or inode keys, the overlay upper dir, the
fuse daemon's journal, ``zfs diff``; each backend's module says how it reads its own), that
record only narrows the compare to *candidate* paths; ``tree_changes(paths=candidates)``
then decides, by content, exactly as the full compare would. Copy and reflink keep none
(the full compare).

A fork of a fork is compared with its lineage's origin (``orchestrator.lineage.diff_base``);
the backend widens its record to cover what the ancestors changed too, or says it cannot.

The test ``tests/snapshot/test_changesets.py`` checks on each backend that the fast path gives
exactly the change set of the full compare.

Reading makes nothing: the base is read through ``Backend.read_view`` (overlay and fuse: a
detached mount, or the single layer itself; btrfs, copy: the snapshot's own tree) and the
sandbox through ``Backend.quiet_view`` (fuse: its layers, so petri's reads are not recorded
as the sandbox's), neither of which leaves anything in the store or the mount table.

Caveats:
- A backend's record over-approximates at most; one that could miss a change would make
  a diff miss it too (the conformance of each record is what the test above checks).
- The one exception: a sandbox a command runs in is read through a frozen view
  (``Backend.frozen_view``: a read-only snapshot on btrfs, a copy of the upper on overlay
  and fuse, made in the store's tmp/ and removed after), so that a diff is one point in
  time; it costs what the backend's view costs.
- Otherwise the sandbox is read as it is: an edit made through its path while a diff
  reads it may show half-way (a command petri runs is "running", so not this case).
"""
from __future__ import annotations

import os
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Sequence

from snapshot.backend import FULL, Candidates

from .lineage import diff_base
from .registry import pid_alive
from merge.changes import normalize_path, tree_changes
import merge

if TYPE_CHECKING:
    from merge.changes import Change

    from .engine import Engine
    from .registry import SandboxRow

__all__ = ["FULL", "Candidates", "changes", "exclude_top", "is_running", "narrow", "sandbox_candidates",
           "sandbox_views", "staging_names"]

STAGING_PREFIX = b".petri-staging-"


def sandbox_candidates(engine: "Engine", row: "SandboxRow", base: Path | None, tree: Path | None, *,
                       since: str | None = None) -> Candidates:
    """Where the sandbox may differ from the snapshot its changes are counted against (its
    lineage's origin, or ``since`` when the caller knows it), from the backend's own record;
    ``base`` and ``tree`` are the views the caller reads (None: nothing is read through the
    sandbox's mount)."""
    return engine.backend.change_candidates(engine.store, row.id, row.base,
                                            diff_base(engine, row) if since is None else since, base, tree)


def narrow(cands: Candidates, user_paths: Sequence[bytes]) -> list[bytes] | None:
    """Candidates within the user's ``-- PATH...``: a list of prefixes (empty: nothing can
    differ), or None for "compare everything the user asked for"."""
    if cands.paths is None:
        return None if not user_paths else list(user_paths)
    if not user_paths:
        return sorted(cands.paths)
    out = set()
    for c in cands.paths:
        for u in user_paths:
            if c == u or c.startswith(u + b"/"):
                out.add(c)
            elif u.startswith(c + b"/"):
                out.add(u)
    return sorted(out)


def staging_names(*roots: Path) -> tuple[bytes, ...]:
    """Top-level ``.petri-staging-*`` names in any of ``roots`` (a promotion at work or
    killed): never part of a change set."""
    out = set()
    for r in roots:
        try:
            for name in os.listdir(os.fsencode(r)):
                if name.startswith(STAGING_PREFIX):
                    out.add(name)
        except OSError:
            pass
    return tuple(sorted(out))


def exclude_top(*roots: Path) -> tuple[bytes, ...]:
    return (b".git", b".petri", merge.promote.METRICS_FILE, *staging_names(*roots))


def changes(engine: "Engine", row: "SandboxRow", base: Path, tree: Path, *, include_ignored: bool = False,
            paths: Sequence[bytes] = (), detect_renames: bool = True, fast: bool = True) -> "list[Change]":
    """The sandbox's change set (``merge.changes.Change`` list, sorted by path); ``fast``
    False forces the full compare (the tests' oracle)."""
    user = [normalize_path(p) for p in paths]
    if fast:
        narrowed = narrow(sandbox_candidates(engine, row, base, tree), user)
        if narrowed is not None and not narrowed:
            return []
    else:
        narrowed = user or None
    return tree_changes(base, tree, include_ignored=include_ignored, ignore_root=engine.root,
                        paths=narrowed or (), detect_renames=detect_renames,
                        exclude_top=exclude_top(engine.root, base, tree))


def is_running(engine: "Engine", row: "SandboxRow") -> bool:
    """A command runs in the sandbox now: state ``running`` or an unfinished run whose petri lives."""
    if row.state == "running":
        # A petri killed mid-run leaves the state behind: trust only a live owner.
        rows = engine.registry.db.execute(
            "SELECT pid FROM runs WHERE sandbox = ? AND finished_at IS NULL", (row.id,)).fetchall()
        return not rows or any(pid_alive(r[0]) for r in rows)
    rows = engine.registry.db.execute(
        "SELECT pid FROM runs WHERE sandbox = ? AND finished_at IS NULL", (row.id,)).fetchall()
    return any(pid_alive(r[0]) for r in rows)


@contextmanager
def sandbox_views(engine: "Engine", row: "SandboxRow", *, frozen: bool | None = None) -> Iterator[tuple[Path, Path]]:
    """(base view, sandbox tree) for the ``with`` block, for this process's own reads (the
    paths may be ``/proc/self/fd/N``). The sandbox is read through a point-in-time view
    when a command runs in it (``frozen`` None: decide), else as it is, quietly."""
    store = engine.store
    with ExitStack() as stack:
        engine.sandbox_tree(row)  # a sandbox that is gone says so here
        base = stack.enter_context(engine.backend.read_view(store, diff_base(engine, row)))
        if frozen is None:
            frozen = is_running(engine, row)
        if frozen:
            tree = stack.enter_context(engine.backend.frozen_view(store, row.id))
        else:
            tree = stack.enter_context(engine.backend.quiet_view(store, row.id))
        yield base, tree
