"""Race candidates as callers name them: ``Patch`` (a patch file, or its text) and ``Cmd``
(a shell command run in the candidate's sandbox before the check), and the two views of a
list of them that ``orchestrator.race.load_candidates`` takes (kind and name; patch bytes
given as text). The API re-exports ``Patch`` and ``Cmd`` (``petri.Patch``, ``petri.Cmd``);
``orchestrator.evolve`` makes ``Cmd`` candidates of its own, so they live below the API.

Caveat: a ``Patch`` from a path is read when the race loads it, not when it is made.
"""
from __future__ import annotations

import os
from typing import Any, Sequence


class Patch:
    """A race candidate: a patch (git or ``patch -p1`` format), from a file or as text."""

    kind = "patch"

    def __init__(self, path: str | os.PathLike[str] | None = None, *, text: str | bytes | None = None,
                 name: str | None = None) -> None:
        if (path is None) == (text is None):
            from .errors import UsageError
            raise UsageError(detail="petri.Patch takes a file path or text=, not both or neither")
        self.path = None if path is None else os.fspath(path)
        self.text = text.encode() if isinstance(text, str) else text
        self.name = name or (self.path if self.path is not None else "patch-text")

    def __repr__(self) -> str:
        return f"Patch({self.name!r})"


class Cmd:
    """A race candidate: a shell command run in its sandbox before the check."""

    kind = "cmd"

    def __init__(self, command: str) -> None:
        self.command = command
        self.name = command

    def __repr__(self) -> str:
        return f"Cmd({self.command!r})"


def candidate_pair(c: Any) -> tuple[str, str]:
    """``(kind, name)`` of a ``Patch``, a ``Cmd`` or MCP's one-key dict (``{"patch": FILE}``,
    ``{"cmd": COMMAND}``, ``{"patch_text": TEXT}``)."""
    if isinstance(c, Patch):
        return ("patch", c.name)
    if isinstance(c, Cmd):
        return ("cmd", c.command)
    if isinstance(c, dict) and len(c) == 1:
        (k, v), = c.items()
        if k in ("patch", "cmd"):
            return (k, v)
        if k == "patch_text":
            return ("patch", "patch-text")
    from .errors import UsageError
    raise UsageError(detail=f"a candidate is petri.Patch(...) or petri.Cmd(...), not {c!r}")


def candidate_texts(candidates: Sequence[Any]) -> list[bytes | None]:
    """Patch bytes given as text (``Patch(text=...)``, MCP's ``patch_text``), by position."""
    out: list[bytes | None] = []
    for c in candidates:
        if isinstance(c, Patch) and c.text is not None:
            out.append(c.text)
        elif isinstance(c, dict) and "patch_text" in c:
            t = c["patch_text"]
            out.append(t.encode() if isinstance(t, str) else t)
        else:
            out.append(None)
    return out
