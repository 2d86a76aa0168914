"""The public surface of ``import petri`` is pinned here (trio's test_exports is the model):
adding or removing a name is a decision, made by editing this list."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

import petri
import petri.aio

pytestmark = pytest.mark.unit  # no root, mount, FUSE, cgroup or sandbox: `pytest -m unit`

PINNED = sorted([
    "__version__",
    "init", "open", "Workspace", "doctor",
    "Sandbox", "SandboxSet", "Limits", "Patch", "Cmd",
    "Record", "InitResult", "Snapshot", "SnapshotList", "SandboxInfo", "SandboxList", "Forked", "RunResult",
    "Race", "RaceCandidate", "Diff", "DiffFile", "PromoteResult", "Promotion", "PromotionList", "Rollback",
    "Cleanup", "Event", "FileContent", "FileWritten", "Lineage", "LineageNode", "AuditLog", "AuditEntry", "Stats",
    "Evolution", "Pipeline",
    # the file tools' records (list_files, grep, delete_file, move_file) and a Conflict's rows
    "FileEntry", "FileList", "GrepMatch", "GrepResult", "FileRemoved", "FileMoved", "PathConflict",
    # petri try, petri rebase, petri review / reject (issue 23)
    "TryResult", "Rebased", "Review", "Rejection",
    "PetriError", "UsageError", "NotFound", "Conflict", "Unsupported", "MarkersWritten",
])


def test_all_is_pinned_and_every_name_exists():
    assert sorted(petri.__all__) == PINNED
    assert len(set(petri.__all__)) == len(petri.__all__)
    for name in petri.__all__:
        assert hasattr(petri, name), name


def test_public_names_not_in_all_are_only_modules():
    extra = {n for n in dir(petri) if not n.startswith("_")} - set(petri.__all__)
    assert extra <= {"aio"}, extra  # petri.aio once imported; nothing else leaks


def test_aio_has_the_same_names_with_async_methods():
    import inspect

    for name in ("init", "open", "doctor", "Workspace", "Sandbox", "SandboxSet", "Limits", "Patch", "Cmd",
                 "PetriError", "UsageError", "NotFound", "Conflict", "Unsupported", "MarkersWritten"):
        assert name in petri.aio.__all__ and hasattr(petri.aio, name), name
    for cls_name in ("Workspace", "Sandbox"):
        sync_cls, async_cls = getattr(petri, cls_name), getattr(petri.aio, cls_name)
        for meth in ("run", "diff", "promote", "fork", "logs"):
            if hasattr(sync_cls, meth):
                assert inspect.iscoroutinefunction(getattr(async_cls, meth)), (cls_name, meth)
    assert inspect.iscoroutinefunction(petri.aio.init) and inspect.iscoroutinefunction(petri.aio.open)
    assert inspect.iscoroutinefunction(petri.aio.doctor)


def test_error_tree_and_exit_codes():
    assert petri.PetriError.exit_code == 1
    assert petri.UsageError.exit_code == 2 and issubclass(petri.UsageError, petri.PetriError)
    assert issubclass(petri.NotFound, petri.UsageError) and petri.NotFound.exit_code == 2
    assert petri.Conflict.exit_code == 3 and petri.Unsupported.exit_code == 4
    assert petri.MarkersWritten.exit_code == 5
    from merge.errors import PromotionConflict, UndoConflict
    from orchestrator.errors import LimitsUnavailable, NotInitialised, UnknownId
    assert issubclass(PromotionConflict, petri.Conflict) and issubclass(UndoConflict, petri.Conflict)
    assert issubclass(UnknownId, petri.NotFound)
    assert issubclass(NotInitialised, petri.Unsupported) and issubclass(LimitsUnavailable, petri.Unsupported)


def test_import_petri_imports_no_front_end_or_cluster_library():
    code = ("import sys, json; import petri, petri.aio; "
            "print(json.dumps(sorted(m for m in ('typer', 'click', 'textual', 'rich', 'mcp', 'ray', 'pydantic')"
            " if m in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == []


def test_one_version_everywhere():
    """The package metadata (what pip shows), ``petri.__version__`` and ``petri --version``
    are one value, written once in orchestrator/_version.py."""
    import importlib.metadata
    from pathlib import Path
    meta = importlib.metadata.version("petridish")
    out = subprocess.run([sys.executable, "-m", "orchestrator.cli", "--version"], capture_output=True,
                         text=True, check=True).stdout
    assert meta == petri.__version__ and out == f"petri {meta}\n", (meta, petri.__version__, out)
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert "\nversion =" not in pyproject.split("[tool.setuptools.dynamic]")[0]  # no second copy
