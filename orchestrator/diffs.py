"""A sandbox's change against its base as ``diff`` shows it: per-file stats and the patch
bytes read from a point-in-time view (``diff_parts``), and the ``diff`` record
(``diff_record``: files rows, patch text, ``patch_b64`` when the patch is not UTF-8; ``diff_doc``
its document). The API's ``diff``, review, stages and try read a diff through here.

Caveat: the patch is built whole in memory; ``diff_parts(..., with_patch=False)`` (``--stat``)
skips it.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Sequence

from .results import Diff, DiffFile, document
from merge.changes import normalize_path
from merge.patch import patch_and_stats
from .changesets import changes, sandbox_views
from .lineage import diff_base

if TYPE_CHECKING:
    from .engine import Engine
    from .registry import SandboxRow


def path_bytes(p: str | bytes) -> bytes:
    """A path a caller gave, as the normalized bytes a change set names."""

    return normalize_path(os.fsencode(p))


def b64(p: bytes) -> str:
    import base64  # not at import: every command would pay for what file reads use

    return base64.b64encode(p).decode()


def file_record(s: Any) -> DiffFile:
    """One file of a diff (a ``merge.patch.FileStat``) as the ``files`` row of ``diff``."""
    d: dict[str, Any] = {"path": s.path.decode("utf-8", "backslashreplace"), "status": s.status,
                         "old_path": None if s.old_path is None else s.old_path.decode("utf-8", "backslashreplace"),
                         "binary": s.binary, "lines_added": s.lines_added, "lines_removed": s.lines_removed,
                         "old_mode": s.old_mode, "new_mode": s.new_mode}
    for key, raw in (("path", s.path), ("old_path", s.old_path)):
        if raw is not None:
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                d[key + "_b64"] = b64(raw)
    return DiffFile.of(**d)


def file_doc(s: Any) -> dict[str, Any]:
    """``file_record``'s row as a document (a review's ``files``)."""
    return document(file_record(s))


def diff_parts(engine: "Engine", sandbox: str, paths: Sequence[str | bytes] = (), *, include_ignored: bool = False,
               with_patch: bool = True) -> tuple["SandboxRow", list[Any], bytes]:
    """The sandbox's row, its per-file stats (``merge.patch.FileStat``) and its patch bytes
    (empty unless ``with_patch``), read from a point-in-time view."""


    row = engine.resolve_sandbox(sandbox)
    wanted = [path_bytes(p) for p in paths]
    with sandbox_views(engine, row) as (base, tree):
        ch = changes(engine, row, base, tree, include_ignored=include_ignored, paths=wanted)
        patch, stats = patch_and_stats(ch, base, tree, with_patch=with_patch)
    return row, stats, patch


def diff_record(engine: "Engine", sandbox: str, paths: Sequence[str | bytes] = (), *, include_ignored: bool = False,
                with_patch: bool = True) -> Diff:
    """The ``diff`` record (with ``patch_b64`` when the patch holds bytes that are not
    UTF-8); ``with_patch`` False leaves the patch text out (``--stat``)."""

    row, stats, patch = diff_parts(engine, sandbox, paths, include_ignored=include_ignored, with_patch=with_patch)
    text = patch.decode("utf-8", "backslashreplace")
    exact = text.encode("utf-8", "surrogateescape") == patch
    return Diff.of(base=diff_base(engine, row), sandbox=row.id, files=tuple(file_record(s) for s in stats),
                   patch=text, **({} if exact else {"patch_b64": b64(patch)}))


def diff_doc(engine: "Engine", sandbox: str, paths: Sequence[str | bytes] = (), *, include_ignored: bool = False,
             with_patch: bool = True) -> dict[str, Any]:
    """``diff_record`` as its document (try reads the files and patch by key)."""
    return document(diff_record(engine, sandbox, paths, include_ignored=include_ignored, with_patch=with_patch))
