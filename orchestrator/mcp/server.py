"""``petri mcp``: the MCP server on stdio, on trio, over the public async API (``petri.aio``).

Shape: one trio loop in the main thread (so ``petri.aio`` runs commands on it directly and
cancelling a call reaches the run at once); the SDK's low-level ``Server`` serves stdio;
a task group owns the jobs that outlive a call (``sandbox_run_start``, ``race``). Every
call runs in a cancel scope of its own beside a heartbeat that sends progress every
``PROGRESS_S`` while it works (clients drop a call after 60 s of silence).

Ending: when the client closes stdin (or goes away), the SDK cancels the calls in flight,
then the jobs are cancelled; either way ``petri.aio`` kills the runs' processes and waits
for them, so nothing is left running. SIGTERM, SIGHUP and SIGINT do the same, then exit
without waiting for the client (the stdin reader is a thread blocked in read(2)).

Start-up: ``initialize`` is answered before the SDK (~0.4 s of imports) and trio are loaded
(``orchestrator.mcp.handshake``); the SDK then replays it and its answer, checked against the
one sent, is dropped. So a client has the server initialized in a tenth of that time, and
its first tool call waits for the SDK as before. The tool table (its pydantic models, and
the schemas made from them when tools are first listed) loads after that answer too
(``build_server``).

stdout carries MCP messages only: fd 1 points at stderr while the server runs
(``handshake.Wire``, as the SDK's own stdio transport does), so a stray print (ours or a
library's) cannot corrupt the stream; petri's warnings go to stderr.
Errors become tool errors (``isError``) whose text is the CLI's error line, and whose
structured content is the CLI's ``{"error", "exit_code"}`` document; a traceback goes to
stderr only with ``--debug``.

Caveats: a run or race started by another process cannot be followed or killed here
(``sandbox_run_poll`` reports what the registry says of it); the SDK's stdin reader stays
blocked after a signal, hence the hard exit once the runs are gone.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import TYPE_CHECKING, Any

import anyio

from ..output import json_line
from .handshake import NAME, TITLE
from .jobs import split_failure
from .instructions import INSTRUCTIONS
from .state import CURRENT, Call, State, error_doc
from ..cli.common import VERSION
from .handshake import DropEarlyAnswer, Replay, Wire, answer_early, difference
from ..errors import UsageError

if TYPE_CHECKING:  # the tool table (and pydantic with it) loads after the initialize answer (build_server)
    from .tools import Tool

__all__ = ["State", "build_server", "serve"]

PROGRESS_S = 2.0           # heartbeat period (promised: at least every 5 s)
SHUTDOWN_WAIT_S = 30.0     # after a signal: how long the runs' clean-up may take before exiting anyway

# ---------------------------------------------------------------------------- results


def _result(doc: dict[str, Any], *, is_error: bool = False) -> Any:
    import mcp_types as types

    text = json_line(doc).rstrip("\n")  # valid UTF-8 whatever the names held (\xNN escapes)
    if is_error:
        # the CLI's error line as the text; its JSON error document as structured content
        return types.CallToolResult(content=[types.TextContent(type="text", text=f"petri: {doc['error']}")],
                                    structured_content=json.loads(text), is_error=True)
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                structured_content=json.loads(text))


def _tool(t: Tool) -> Any:
    import mcp_types as types

    return types.Tool(name=t.name, description=t.description, input_schema=t.input_schema,
                      output_schema=t.output_schema,
                      annotations=types.ToolAnnotations(read_only_hint=t.read_only, destructive_hint=t.destructive,
                                                        idempotent_hint=t.idempotent, open_world_hint=t.open_world))


# ---------------------------------------------------------------------------- serving


async def _heartbeat(ctx: Any, call: Call) -> None:
    while True:
        await anyio.sleep(PROGRESS_S)
        try:
            await ctx.session.report_progress(round(time.monotonic() - call.t0, 1), call.total, call.message())
        except Exception:  # noqa: BLE001 - the client went away: nothing to tell it
            return


def build_server(st: State) -> Any:
    import mcp_types as types
    from mcp.server import Server

    from .tools import BY_NAME, TOOLS

    offered = {t.name: t for t in TOOLS if st.allow_live or not t.live_only}
    listed = [_tool(t) for t in offered.values()]

    async def list_tools(ctx: Any, params: Any) -> Any:
        st.note_client(ctx)
        return types.ListToolsResult(tools=listed)

    async def call_tool(ctx: Any, params: Any) -> Any:

        st.note_client(ctx)
        args = dict(params.arguments or {})
        call = Call(params.name)
        token = CURRENT.set(call)
        st.active += 1
        try:
            tool = offered.get(params.name)
            if tool is None:
                hidden = params.name in BY_NAME
                raise UsageError(detail=f"no tool {params.name!r}" + (
                    ": it changes the live workspace and exists only with `petri mcp --allow-live`" if hidden
                    else "; tools/list names them"))
            parsed = tool.parse(args)
            with anyio.CancelScope() as scope:
                st.calls.add(scope)
                try:
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(_heartbeat, ctx, call)
                        doc = await tool.handler(st, parsed)
                        tg.cancel_scope.cancel()
                finally:
                    st.calls.discard(scope)
            if scope.cancelled_caught:
                raise UsageError(detail="the server is shutting down; nothing more runs")
            return _result(doc)
        except BaseException as e:  # noqa: BLE001 - the edge: a tool error, never a traceback
            failure, rest = split_failure(e)
            # cancelled (the client, or shutdown): no answer is due
            if rest is e:
                raise
            if rest is not None:
                raise rest from None  # the cancellation left of a group (its failure goes unanswered too)
            return _result(error_doc(failure, st.debug), is_error=True)
        finally:
            st.active -= 1
            CURRENT.reset(token)

    server = Server(NAME, version=VERSION, title=TITLE,
                    instructions=INSTRUCTIONS, on_list_tools=list_tools, on_call_tool=call_tool)
    return server


async def _on_signals(st: State) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGHUP, signal.SIGINT) as signals:
        async for signum in signals:
            st.exit_code = 128 + signum
            for scope in list(st.calls):
                scope.cancel()
            if st.tg is not None:
                st.tg.cancel_scope.cancel()  # also ends serving: the jobs' group holds it
            with anyio.move_on_after(SHUTDOWN_WAIT_S):
                while st.active:
                    await anyio.sleep(0.02)
            sys.stderr.flush()
            os._exit(st.exit_code)


def _on_difference(sent: dict[str, Any], sdk: dict[str, Any]) -> None:
    """The SDK answers the replayed ``initialize`` otherwise than petri did (handshake)."""

    go_on, line = difference(sent, sdk)
    print(f"petri mcp: {line}", file=sys.stderr, flush=True)
    if not go_on:  # the client was told something the SDK does not hold: no session to serve
        os._exit(1)


async def _serve(st: State, wire: Any, early: Any) -> None:
    from mcp.server.stdio import stdio_server


    server = build_server(st)
    async with anyio.create_task_group() as outer:
        outer.start_soon(_on_signals, st)
        try:
            async with anyio.create_task_group() as jobs:
                st.tg = jobs
                async with stdio_server(stdin=Replay(early, wire),  # type: ignore[arg-type]  # an async line source
                                        stdout=DropEarlyAnswer(early, wire,  # type: ignore[arg-type]
                                                               on_difference=_on_difference)) as (read, write):
                    await server.run(read, write, server.create_initialization_options())
                jobs.cancel_scope.cancel()  # the client is gone: so are its runs and races
        finally:
            outer.cancel_scope.cancel()


def _disconnected(e: BaseException) -> bool:
    """Whether ``e`` is only the client going away (a closed pipe) while we wrote."""
    if isinstance(e, BaseExceptionGroup):
        return all(_disconnected(x) for x in e.exceptions)
    return isinstance(e, (BrokenPipeError, ConnectionResetError, anyio.BrokenResourceError,
                          anyio.ClosedResourceError))


def serve(ws: Any, *, allow_live: bool = False, debug: bool = False) -> int:
    """Serve MCP on stdio for the workspace ``ws`` (a ``petri.Workspace``) until the client
    leaves; the exit code."""

    wire = Wire()
    try:
        early = answer_early(wire, instructions=INSTRUCTIONS, version=VERSION)
        if not early.first:
            return 0  # the client left before saying anything
        import petri.aio as aio

        st = State(aio.Workspace(ws), allow_live=allow_live, debug=debug)
        try:
            anyio.run(_serve, st, wire, early, backend="trio")
        except BaseException as e:  # noqa: BLE001 - sorted below
            if not _disconnected(e):
                raise
        return st.exit_code
    finally:
        wire.restore()
