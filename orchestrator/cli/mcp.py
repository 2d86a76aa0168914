"""``petri mcp``.

The MCP SDK costs about 0.7 s to import, so it is imported only when this command runs
(``orchestrator.mcp.server``); ``import petri`` and every other command never load it.
"""

from __future__ import annotations

from typing import Annotated

from .common import G, workspace_flag
from .declare import command_app, typer
from ..api import open as open_workspace, set_event_via
from ..mcp.server import serve

app = command_app()


@app.command()
def mcp(
    allow_live: Annotated[bool, typer.Option("--allow-live", help="Also offer promote and rollback, which change"
                                                                  " the live workspace.")] = False,
) -> int:
    """A Model Context Protocol server on stdio for agents (docs/guide/mcp.md says how to register it).

    Serves the workspace found from the current directory (or --workspace). Sandboxes,
    runs, files, diffs and races are tools; promote and rollback exist only with
    --allow-live. Runs it started stop when the client disconnects."""

    set_event_via("mcp")  # what the server's own events (an expiry it notices) say they came from
    ws = open_workspace(workspace_flag(), via="mcp")  # not a workspace: the CLI's one line, exit 4, before serving
    ws.engine  # noqa: B018 - open the registry now: a broken store fails here, not in the first call

    return serve(ws, allow_live=allow_live, debug=G.debug)
