"""Race candidates as callers name them: ``Patch`` (a patch file, or its text) and ``Cmd`` (a
shell command run in the candidate's sandbox before the check). Both make the one candidate
type, ``race_plan.Candidate``, which the race carries from the front ends down to the check.
The API re-exports them (``petri.Patch``, ``petri.Cmd``); ``orchestrator.evolve`` makes
``Cmd`` candidates of its own, so they live below the API.

The race's module is imported when the first candidate is made, not with the API: its
dataclasses cost every ``petri`` command about 4 ms to make.

Caveat: a ``Patch`` from a path is read when the race loads it (``Candidate.loaded``), not
when it is made.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any
from .errors import UsageError
import orchestrator

if TYPE_CHECKING:
    from .race_plan import Candidate


def _candidate(*args: Any, **kw: Any) -> "Candidate":

    return orchestrator.race_plan.Candidate(*args, **kw)


def Patch(path: str | os.PathLike[str] | None = None, *, text: str | bytes | None = None,  # noqa: N802 - a type's name
          name: str | None = None) -> Candidate:
    """A race candidate: a patch (git or ``patch -p1`` format), from a file or as ``text``;
    ``name`` is what the race calls it (default: the path as given, or ``patch-text``)."""
    if (path is None) == (text is None):
        raise UsageError(detail="petri.Patch takes a file path or text=, not both or neither")
    where = None if path is None else os.fspath(path)
    data = text.encode() if isinstance(text, str) else text
    shown = name or (where if where is not None else "patch-text")
    return _candidate("patch", shown, data, path=where if where != shown else None)


def Cmd(command: str) -> Candidate:  # noqa: N802 - a type's name
    """A race candidate: a shell command run in its sandbox before the check."""
    return _candidate("cmd", command)
