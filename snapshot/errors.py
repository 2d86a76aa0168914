"""Errors of the snapshot layer.

Each class's docstring is its message template (``str.format`` over the keyword arguments
given at raise time) and each carries the exit code the CLI turns it into (docs/reference/exit-codes.md).
The template is the docstring's first paragraph, its lines joined by one space, so that a
long message can wrap in the source and still be one line.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol


class ConflictRecord(Protocol):
    """One thing that stopped an operation, as ``Conflict.conflicts`` lists it (the merge
    layer's ``merge.promote.Conflict``; this layer cannot import it)."""

    def to_json(self) -> dict[str, Any]: ...


def _first_paragraph(doc: str) -> str:
    """The lines of ``doc`` up to its first blank line, as one line."""
    lines: list[str] = []
    for line in doc.strip().splitlines():
        if not line.strip():
            break
        lines.append(line.strip())
    return " ".join(lines)


class PetriError(Exception):
    """petri failed: {detail}"""

    exit_code: int = 1
    # The --json document a failure still has (a race's candidates so far, a refused
    # promotion's plan): set by the raiser where it knows one; the CLI and MCP print it.
    doc: dict[str, Any] | None = None

    def __init__(self, message: str | None = None, /, **fields: object) -> None:
        self.fields = fields
        if message is None:
            template = _first_paragraph(self.__class__.__doc__ or "{detail}")
            try:
                message = template.format(**fields)
            except (KeyError, IndexError):
                message = template
        super().__init__(message)

    @property
    def message(self) -> str:
        return str(self)


# -- the public categories (``import petri`` re-exports them): every error petri raises is
# one of these or a plain PetriError (exit 1), so a caller can catch by meaning.


class UsageError(PetriError):
    """{detail}"""

    exit_code = 2


class NotFound(UsageError):
    """{detail}"""


class Conflict(PetriError):
    """{detail}"""

    exit_code = 3
    conflicts: Sequence[ConflictRecord] = ()  # what stopped it; the raiser sets it where it knows


class Unsupported(PetriError):
    """{detail}"""

    exit_code = 4


class MarkersWritten(PetriError):
    """promotion {promotion} wrote conflict markers into {paths}; resolve them, or undo it with `petri rollback {promotion}`"""  # noqa: E501 (a message template is one line)

    exit_code = 5
    result: object = None  # the promotion's result (petri.PromoteResult), set by the API


class SnapshotError(PetriError):
    """snapshot failed: {detail}"""


class BackendUnavailable(Unsupported):
    """backend {backend} cannot work here: {why} (`petri doctor` says what works here)"""

    exit_code = 4


class DiskFull(PetriError):
    """no space left on the workspace's filesystem while {doing}; nothing was kept"""


class TreeChangedDuringCopy(PetriError):
    """{path} kept changing while it was being copied; try again when it is quiet"""


class OverlayMountFailed(SnapshotError):
    """cannot mount overlay at {target}: {why}"""


class DiskLimitUnavailable(Unsupported):
    """cannot enforce --disk on {where}: {why}; {alternatives}"""

    exit_code = 4
