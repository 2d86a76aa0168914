"""petri: instant, isolated, same-path clones of a project: fork, run, race, diff, promote,
roll back. This module only re-exports the public API (the engine lives in
``orchestrator/``); its names are pinned by ``tests/api/test_exports.py``. ``petri.aio`` has the
same names with ``async``.

Importing petri imports no typer, textual, mcp or ray (tested).

Note: PyPI has an unrelated old package also named ``petri``; installing both would shadow
this module (the distribution here is ``petridish``).
"""
from orchestrator.api import Cmd, Patch, Sandbox, SandboxSet, Workspace, doctor, init, open
from orchestrator.limits import Limits
from orchestrator.results import (AuditEntry, AuditLog, Cleanup, Diff, DiffFile, Event, Evolution, FileContent,
                                  FileEntry, FileList, FileMoved, FileRemoved, FileWritten, Forked, GrepMatch,
                                  GrepResult, InitResult, Lineage, LineageNode, PathConflict, Pipeline, PromoteResult,
                                  Promotion, PromotionList, Race, RaceCandidate, Rebased, Record, Rejection, Review,
                                  Rollback, RunResult, SandboxInfo, SandboxList, Snapshot, SnapshotList, Stats,
                                  TryResult)
from snapshot.errors import Conflict, MarkersWritten, NotFound, PetriError, Unsupported, UsageError

from orchestrator._version import VERSION as __version__

__all__ = [
    "__version__",
    # opening a workspace; what works on this machine for a path
    "init", "open", "Workspace", "doctor",
    # handles
    "Sandbox", "SandboxSet", "Limits", "Patch", "Cmd",
    # records (each .to_json() is the CLI's --json document)
    "Record", "InitResult", "Snapshot", "SnapshotList", "SandboxInfo", "SandboxList", "Forked", "RunResult",
    "Race", "RaceCandidate", "Diff", "DiffFile", "PromoteResult", "Promotion", "PromotionList", "Rollback",
    "Cleanup", "Event", "FileContent", "FileWritten", "Lineage", "LineageNode", "AuditLog", "AuditEntry", "Stats",
    "Evolution", "Pipeline", "FileEntry", "FileList", "GrepMatch", "GrepResult", "FileRemoved", "FileMoved",
    "PathConflict", "TryResult", "Rebased", "Review", "Rejection",
    # errors (each carries .exit_code)
    "PetriError", "UsageError", "NotFound", "Conflict", "Unsupported", "MarkersWritten",
]
