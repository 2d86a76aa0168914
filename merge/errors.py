"""Errors of the merge layer (change sets, patches, promotion).

Each class's docstring is its message template (``str.format`` over the keyword arguments
given at raise time) and each carries the exit code the CLI turns it into (docs/reference/exit-codes.md).
"""
from __future__ import annotations

from snapshot.errors import Conflict, NotFound, PetriError, UsageError


class MergeError(PetriError):
    """merge failed: {detail}"""


class TreeChangedDuringScan(MergeError):
    """{path} changed while its change set was being computed; try again when it is quiet"""


class UnsafePath(MergeError, UsageError):
    """refusing path {path}: absolute, `..`, or reached through a symlink"""

    exit_code = 2


class BadIgnoreFile(MergeError):
    """cannot read ignore rules from {path}: {why}"""


# --- promotion (merge3, promote, journal, safefs) ---------------------------------------

class PromotionConflict(MergeError, Conflict):
    """promotion stopped on conflicts, nothing was written: {paths}"""

    exit_code = 3


class PathThroughSymlink(MergeError, Conflict):
    """{path}: {via} is a symlink (or not a directory) in the workspace; it is never followed, so this path is a conflict"""  # noqa: E501 (a message template is one line)

    exit_code = 3


class PromotionLocked(MergeError):
    """another promotion holds the workspace lock ({owner}); wait for it to finish"""


class UndoConflict(MergeError, Conflict):
    """cannot undo promotion {promotion}: the workspace changed these files since: {paths}"""

    exit_code = 3
    # Set (True) by merge.promote when the rest of the undo ran and only these paths were
    # left; declared only, like PromotionConflict.conflicts.
    undone: bool


class UnknownPromotion(MergeError, NotFound):
    """no promotion {promotion} in the journal"""

    exit_code = 2


class JournalCorrupt(MergeError):
    """the journal of promotion {promotion} is unreadable ({why}); move it aside and run `petri gc`"""


class PromotionNotUndoable(MergeError):
    """promotion {promotion} is {state}; only a finished promotion can be undone"""


class SandboxChangedDuringPromotion(MergeError):
    """the sandbox changed {path} after the promotion was planned; nothing was written; promote again"""
