"""petri's Python API: the one surface the CLI, the MCP server and the TUI stand on.

``import petri`` re-exports it (see ``petri/__init__.py``; ``petri.aio`` has the same names
with ``async``). The smallest complete use::

    ws = petri.init("/path/to/project")            # or petri.open(path)
    snap = ws.snapshot("before upgrade")
    with ws.fork(n=3, label="try", limits=petri.Limits(mem="1G", ttl="2h")) as sandboxes:
        r = sandboxes[0].run(["python3", "-m", "pytest", "-q"], timeout=600)
        r.exit_code, r.killed_by, r.stdout()       # a non-zero exit is a result, not an exception
        d = sandboxes[0].diff()                     # .files, .patch
        p = sandboxes[0].promote(verify="python3 -m pytest -q")   # petri.Conflict on exit-3 cases
        p.rollback()
    race = ws.race(check="python3 -m pytest -q", candidates=[petri.Patch("a.patch"), petri.Cmd("make fix")])

Every call returns a frozen record (``orchestrator.results``) whose ``to_json()`` is the
CLI's ``--json`` document; every failure is a ``petri.PetriError`` carrying the CLI's exit
code. A command's non-zero exit is a result, never an exception.

The package's files: ``workspace`` (the facade: ``init``, ``open``, ``doctor``,
``Workspace``), ``sandbox`` (the ``Sandbox`` handle and ``SandboxSet``), ``race_view`` (the
race documents the TUI and MCP read, folded from the event stream), ``helpers`` (arguments
in, adapters out). The race candidates ``Patch`` and ``Cmd`` live in
``orchestrator.candidates`` (evolve makes them too) and are re-exported here. Nothing below
this package imports it: it is the top of the engine and the bottom of the front ends.

Threads: a ``Workspace`` may be used from several threads at once (each thread gets its own
registry connection). A run started from a thread forks its sandbox from that thread,
which waits for it (see ``orchestrator/sandbox/spawn.py``), so a run is never cut short by
a thread ending. ``run`` needs no event loop (no trio); ``output`` reads a run's saved
output by offset, live or finished.

Caveats: ``Sandbox`` and the other records are pictures taken when made (``refresh()``
takes a new one); a sync call made from inside a running trio loop blocks that loop (use
``petri.aio`` there).
"""
from __future__ import annotations

from ..candidates import Cmd, Patch
from ..limits import Limits
from .sandbox import Sandbox, SandboxSet
from .workspace import Workspace, doctor, init, open

# Also importable from here as before the split (not petri's public surface): the helpers
# petri.aio shares (more below, imported on first use).
# (``X as X``: an explicit re-export for the type checker.)
from .helpers import _any_id as _any_id
from .helpers import _argv as _argv
from .helpers import _at_least as _at_least
from .helpers import _at_most as _at_most
from .helpers import _metric_gate as _metric_gate
from .helpers import _output_callback as _output_callback
from .helpers import _sandbox_id as _sandbox_id
from .helpers import _seconds as _seconds
from .helpers import _since as _since
from .helpers import _source_id as _source_id
from .helpers import _text_conflicts as _text_conflicts
from .workspace import CLI_SPELLING as CLI_SPELLING
from .workspace import VIAS as VIAS

__all__ = ["init", "open", "doctor", "Workspace", "Sandbox", "SandboxSet", "Patch", "Cmd", "Limits"]


# What the front ends catch or check beside the records (the errors a promotion raises beyond
# petri's categories, the parser of a promotion's watch: the CLI checks its flags first), the
# race view, and the diff and run documents that moved below the API.
# Imported on first use, not with the API: a command that does not use them pays nothing.
_LAZY = {"PromotionConflict": "merge.errors", "MarkersWritten": "snapshot.errors",
         "PolicyViolation": "orchestrator.policy", "parse_watch": "orchestrator.watch",
         # the race view (the TUI, MCP) and the documents that moved below the API
         "RaceTracker": "orchestrator.api.race_view", "diff_doc": "orchestrator.diffs",
         "diff_parts": "orchestrator.diffs", "file_doc": "orchestrator.diffs",
         "sandbox_runs": "orchestrator.run_history",
         # the race's own vocabulary the CLI speaks: its interrupt, its metric and candidate
         # order as the command line gives them, its table for people
         "RaceInterrupted": "orchestrator.race", "parse_metric": "orchestrator.race"}
_RENAMED = {"interleave_candidates": ("orchestrator.race", "interleave"),
            "render_race_table": ("orchestrator.race", "render_table")}


def __getattr__(name: str) -> object:
    where, attr = _RENAMED.get(name) or (_LAZY.get(name), name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(where), attr)
    globals()[name] = value
    return value
