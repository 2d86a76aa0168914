"""``petri tui``.

The command only parses and delegates; Textual is imported inside it, so ``petri ls`` and
every other command never pay for it.
"""
from __future__ import annotations

from typing import Annotated, Optional

import typer

from .app import command_app
from .common import G, workspace_flag
import petri
from ..errors import UsageError
from tui.app import main
from tui.source import Source

app = command_app()


@app.command()
def tui(
    read_only: Annotated[bool, typer.Option("--read-only", help="Look only: no action that changes anything is"
                                                                " offered.")] = False,
    race: Annotated[Optional[str], typer.Option("--race", help="Open on this race (id or prefix).")] = None,
) -> None:
    """The terminal UI: sandboxes side by side, races ranked, two candidates compared.

    \b
    Keys: arrows or j/k move, enter opens, space marks, c compares the two marked,
    p promote, D destroy, u roll back, l logs, / filter, ? help (every key), q quit;
    ctrl+p finds every action by name. Every action that changes something asks first,
    showing the equivalent petri command."""


    if G.json:
        raise UsageError(detail="petri tui is interactive: --json does not apply")
    ws = petri.open(workspace_flag(), via="tui")
    if race is not None:
        ws.race_status(race)  # an unknown race (or "") is a usage error before the screen opens

    from ..api import set_event_via
    set_event_via("tui")  # what the TUI's own events (an expiry it notices) say they came from

    raise typer.Exit(main(Source(ws), read_only=read_only, race=race))
