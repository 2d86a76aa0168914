"""``petri doctor [PATH]``: parse, call ``orchestrator.doctor``, render its report."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

from .declare import command_app, typer
from .common import G, out, workspace_flag
from ..api import doctor as api_doctor, find_workspace, is_workspace
from .. import units
from ..errors import UsageError

app = command_app()


@app.command()
def doctor(
    path: Annotated[Optional[str], typer.Argument(
        help="The directory to judge: a workspace, or one to `petri init` (default: the workspace here, as"
             " other commands find it, else .).", show_default=False)] = None,
) -> int:
    """What works on this machine for PATH and why not, with the fix for each missing piece.

    Checks bubblewrap and user namespaces, seccomp, id-mapped mounts, cgroups, the backend
    (the workspace's own, or the one `petri init` would pick), FUSE, the optional Python
    modules (btrfsutil, pyfuse3) and --disk caps. Writes nothing.

    \b
    Exit codes:
      0  everything petri needs for PATH works (what is only missed is still listed)
      1  something petri needs for PATH does not work (its fix is listed)
      2  PATH is not a directory"""
    if path is None:
        target = _here()
    else:
        shown = units.shown(path, limit=200)
        if not path.strip():  # a script's empty variable, not "the one here"
            raise UsageError(detail=f"bad PATH '{shown}': give a directory")
        target = Path(os.path.abspath(path))
        if not target.is_dir():
            raise UsageError(detail=f"bad PATH '{shown}': not a directory")
    report = api_doctor(target)
    o = out()
    if G.json:
        o.doc(report.to_json())
        return report.exit_code
    o.say(f"petri doctor: {report.path}")
    for c in report.checks:
        mark = o.paint("ok  ", "green") if c.ok else o.paint("FAIL", "red") if c.needed else o.paint("warn", "yellow")
        o.say(f"{mark} {c.name}: {c.detail}")
        if not c.ok and c.fix:
            o.say(f"     fix: {c.fix}")
        elif c.ok and c.fix:
            o.say(f"     tip: {c.fix}")
    needed = [c.name for c in report.checks if c.needed and not c.ok]
    if needed:
        o.say(f"petri cannot work here for this path until {', '.join(needed)} {'is' if len(needed) == 1 else 'are'}"
              " fixed")
    else:
        o.say(f"everything petri needs works here (backend {report.backend})")
    return report.exit_code


def _here() -> Path:
    """No PATH: the workspace other commands would use (``--workspace``, ``PETRI_WORKSPACE``,
    else the one holding the current directory), or the directory itself where there is none."""
    override = workspace_flag() or os.environ.get("PETRI_WORKSPACE") or None
    start = Path(os.path.abspath(override)) if override else Path(os.getcwd())
    if override and not start.is_dir():
        raise UsageError(detail=f"bad --workspace '{override}': not a directory")
    for candidate in (start, *start.parents):
        if is_workspace(candidate):
            return find_workspace(candidate)
    return start
