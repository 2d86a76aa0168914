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
in, adapters out), ``records`` (the result records, for the front ends that name their
classes). The race candidates ``Patch`` and ``Cmd`` live in ``orchestrator.candidates``
(evolve makes them too) and are re-exported here. Every name is imported on first use (the
module ``__getattr__`` below). Nothing below this package imports it: it is the top of the
engine and the bottom of the front ends.

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

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the names below, for the type checker (``X as X``: an explicit re-export)
    from ..candidates import Cmd as Cmd
    from ..candidates import Patch as Patch
    from ..limits import Limits as Limits
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
    from .sandbox import Sandbox as Sandbox
    from .sandbox import SandboxSet as SandboxSet
    from .workspace import CLI_SPELLING as CLI_SPELLING
    from .workspace import VIAS as VIAS
    from .workspace import Workspace as Workspace
    from .workspace import doctor as doctor
    from .workspace import init as init
    from .workspace import open as open  # noqa: A004 - petri.open

__all__ = ["init", "open", "doctor", "Workspace", "Sandbox", "SandboxSet", "Patch", "Cmd", "Limits"]

# Every name is imported on first use (the package's one place of laziness): a front end
# that takes one small name from the door (the CLI's edge takes the audit scope before it
# knows whether the command is `--help`) pays for that name, not for the facade.
_LAZY = {
    # the facade and its handles; the race candidates (evolve makes them too) and the limits
    "init": "orchestrator.api.workspace", "open": "orchestrator.api.workspace",
    "doctor": "orchestrator.api.workspace", "Workspace": "orchestrator.api.workspace",
    "Sandbox": "orchestrator.api.sandbox", "SandboxSet": "orchestrator.api.sandbox",
    "Patch": "orchestrator.candidates", "Cmd": "orchestrator.candidates", "Limits": "orchestrator.limits",
    # not petri's public surface: the helpers petri.aio shares, the facade's spellings
    **{name: "orchestrator.api.helpers" for name in (
        "_any_id", "_argv", "_at_least", "_at_most", "_metric_gate",
        "_output_callback", "_sandbox_id", "_seconds", "_since", "_source_id", "_text_conflicts")},
    "CLI_SPELLING": "orchestrator.api.workspace", "VIAS": "orchestrator.api.workspace",
    # What the front ends catch or check beside the records (the errors a promotion raises
    # beyond petri's categories, the parser of a promotion's watch: the CLI checks its flags
    # first), the race view, and the diff and run documents that moved below the API.
    "PromotionConflict": "merge.errors", "MarkersWritten": "snapshot.errors",
    "PolicyViolation": "orchestrator.policy", "parse_watch": "orchestrator.watch",
    "RaceTracker": "orchestrator.api.race_view", "diff_doc": "orchestrator.diffs",
    "diff_parts": "orchestrator.diffs", "file_doc": "orchestrator.diffs",
    "sandbox_runs": "orchestrator.run_history",
    # the race's own vocabulary the CLI speaks: its interrupt, its metric and candidate order
    # as the command line gives them, its table for people
    "RaceInterrupted": "orchestrator.race", "parse_metric": "orchestrator.metric_spec",
}
# The front ends' edge: the audit scope of a command whose exit code is known only there
# (``begin_audit``/``finish_audit``), which commands open one, and what the process's events
# say they came through (``set_event_via``).
_LAZY |= {"MUTATING_COMMANDS": "orchestrator.audit",
          # what a run was for (a race's apply, its check), as the CLI's run lists title it
          "describe_role": "orchestrator.race_plan",
          # the states of a sandbox that is still there (made, running or exited)
          "LIVE_STATES": "orchestrator.registry",
          # which directory is a workspace: `petri doctor` asks before it opens one
          "find_workspace": "orchestrator.workspace", "is_workspace": "orchestrator.workspace",
          # --on-conflict's one list of choices (the CLI's option type, the MCP schema's enum)
          "OnConflictChoice": "merge.on_conflict"}
_RENAMED = {"begin_audit": ("orchestrator.audit", "begin"), "finish_audit": ("orchestrator.audit", "finish"),
            "set_event_via": ("orchestrator.events", "set_via"),
            # a run's log files read by offset as they grow (the MCP server's run jobs)
            "log_stream_size": ("orchestrator.runlog", "stream_size"),
            "read_log_at": ("orchestrator.runlog", "read_at"),
            # the documents for people: a lineage tree, a review in Markdown, a promotion mark
            "render_lineage": ("orchestrator.lineage", "render_tree"),
            "review_markdown": ("orchestrator.review", "markdown"),
            "describe_promoted": ("orchestrator.promoted", "describe"),
            "interleave_candidates": ("orchestrator.race", "interleave"),
            "render_race_table": ("orchestrator.race", "render_table")}


def __getattr__(name: str) -> object:
    where, attr = _RENAMED.get(name) or (_LAZY.get(name), name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(where), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY, *_RENAMED})
