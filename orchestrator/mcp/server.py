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
its first tool call waits for the SDK as before.

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

import contextvars
import json
import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

import anyio

from ..output import json_line
from .handshake import NAME, TITLE
from .jobs import Jobs, RaceJob, RunJob, split_failure
from .tools import BY_NAME, INSTRUCTIONS, TOOLS, Tool

PROGRESS_S = 2.0           # heartbeat period (promised: at least every 5 s)
SHUTDOWN_WAIT_S = 30.0     # after a signal: how long the runs' clean-up may take before exiting anyway


@dataclass
class Call:
    """The tool call in progress (a context variable): what its heartbeat says."""

    tool: str
    t0: float = field(default_factory=time.monotonic)
    total: float | None = None
    describe: Callable[[], str] | None = None

    def message(self) -> str:
        if self.describe is not None:
            return self.describe()
        return f"{self.tool}: {time.monotonic() - self.t0:.0f}s"


CURRENT: contextvars.ContextVar[Call] = contextvars.ContextVar("petri_mcp_call")


class State:
    """The server: the workspace (``petri.aio``), the jobs, and what each call needs."""

    def __init__(self, ws: Any, *, allow_live: bool, debug: bool) -> None:
        self.ws = ws
        self.allow_live = allow_live
        self.debug = debug
        self.jobs = Jobs()
        self.tg: Any = None               # the jobs' task group (set while serving)
        self.calls: set[anyio.CancelScope] = set()
        self.active = 0                   # calls and jobs not yet finished
        self.exit_code = 0
        self.tools = {t.name: t for t in TOOLS if allow_live or not t.live_only}
        self._validators: dict[str, Any] = {}

    # -- arguments ---------------------------------------------------------------------------
    def validate(self, tool: Tool, args: dict[str, Any]) -> None:
        """Check the arguments against the tool's schema: a usage error (exit 2) naming the
        argument, as the CLI does for a bad flag."""
        import jsonschema

        from ..errors import UsageError

        v = self._validators.get(tool.name)
        if v is None:
            v = self._validators[tool.name] = jsonschema.Draft202012Validator(tool.input_schema)
        err = jsonschema.exceptions.best_match(v.iter_errors(args))
        if err is not None:
            where = "/".join(str(p) for p in err.absolute_path)
            raise UsageError(detail=f"{tool.name}: {where + ': ' if where else ''}{err.message}")

    async def sandbox_id(self, ident: str) -> str:
        return (await self.ws.sandbox(ident)).info.id

    # -- runs ----------------------------------------------------------------------------------
    def _runner(self, sandbox: str, command: Any, timeout: float | None, env: dict[str, str] | None,
                cwd: str | None) -> Any:
        async def go(job: RunJob) -> Any:
            return await self.ws.run(sandbox, command, timeout=timeout, env=env, cwd=cwd, on_start=job.on_start)
        return go

    def _job(self, sandbox: str) -> RunJob:
        from ..runs import log_paths

        engine = self.ws.sync.engine
        return RunJob(sandbox, lambda n: log_paths(engine, sandbox, n))

    async def run_now(self, sandbox: str, command: Any, timeout: float | None, env: dict[str, str] | None,
                      cwd: str | None = None) -> RunJob:
        """Run and wait, in this call (cancelling the call kills the run)."""
        job = self._job(await self.sandbox_id(sandbox))
        call = CURRENT.get()
        call.describe, call.total = job.progress_message, None
        await job.execute(self._runner(sandbox, command, timeout, env, cwd))
        if job.error is not None:
            raise job.error
        return job

    async def start_run(self, ident: str, command: Any, timeout: float | None, env: dict[str, str] | None,
                        cwd: str | None = None) -> RunJob:
        """Start a run as a job of the server; return once it has its number."""
        sb = await self.sandbox_id(ident)
        job = self._job(sb)
        self.spawn(job.execute, self._runner(sb, command, timeout, env, cwd), done=job)
        try:
            await job.started.wait()
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):  # the caller will never learn its number
                await job.kill()
            raise
        if job.run is None:
            raise job.error if job.error is not None else RuntimeError("the run did not start")
        self.jobs.add_run(job)
        return job

    async def poll_run(self, ident: str, run: int, cursor: int, wait_s: float, min_bytes: int = 1) -> dict[str, Any]:
        """The output after ``cursor``, once there are ``min_bytes`` of it, the run has ended
        or ``wait_s`` has passed, whichever comes first."""
        sb = await self.sandbox_id(ident)
        job = self.jobs.runs.get((sb, run))
        if job is None:
            return await self._run_from_registry(sb, run)
        CURRENT.get().describe = job.progress_message
        deadline = time.monotonic() + wait_s
        while not job.done.is_set() and job.next_cursor - cursor < max(1, min_bytes) \
                and time.monotonic() < deadline:
            await job.changed.wait(deadline - time.monotonic())
        events, nxt, dropped = job.events_from(cursor)
        doc: dict[str, Any] = {"schema": 1, "sandbox": sb, "run": run, "events": events, "next_cursor": nxt,
                               "dropped": dropped, "done": False, "exit_code": None, "killed_by": None,
                               "ended_by": None}
        if job.done.is_set() and nxt >= job.next_cursor:
            doc.update(await self._ended(job))
        return doc

    async def _ended(self, job: RunJob) -> dict[str, Any]:
        """What a finished job's poll adds: how it ended (the registry's record when the run
        was killed or petri failed, as then there is no result)."""
        if job.result is not None:
            d = job.result.to_json()
        else:
            d = next((r.to_json() for r in await self.ws.logs(job.sandbox) if r.run == job.run), {})
        out = {"done": True, "exit_code": d.get("exit_code"), "killed_by": d.get("killed_by"),
               "ended_by": d.get("ended_by"), "killed": job.killed,
               "duration_s": d.get("duration_s"), "stdout_path": d.get("stdout_path"),
               "stderr_path": d.get("stderr_path")}
        if job.error is not None:
            out["error"] = error_doc(job.error, self.debug)["error"]
        return out

    async def _run_from_registry(self, sb: str, run: int) -> dict[str, Any]:
        from ..errors import UsageError

        rec = next((r for r in await self.ws.logs(sb) if r.run == run), None)
        if rec is None:
            raise UsageError(detail=f"sandbox {sb} has no run {run}; sandbox_status lists its runs")
        d = rec.to_json()
        done = d.get("finished_at") is not None
        return {"schema": 1, "sandbox": sb, "run": run, "events": [], "next_cursor": 0, "dropped": 0, "done": done,
                "exit_code": d.get("exit_code") if done else None, "killed_by": d.get("killed_by"),
                "ended_by": d.get("ended_by"),
                "stdout_path": d.get("stdout_path"), "stderr_path": d.get("stderr_path"),
                "note": "not started by this server: its output is in stdout_path and stderr_path"}

    async def kill_run(self, ident: str, run: int) -> dict[str, Any]:
        from ..errors import OrchestratorError

        sb = await self.sandbox_id(ident)
        job = self.jobs.runs.get((sb, run))
        if job is None:
            doc = await self._run_from_registry(sb, run)
            if not doc["done"]:
                raise OrchestratorError(detail=f"run {run} of {sb} was not started by this server; "
                                               f"`petri rm {sb}` stops everything in that sandbox")
            return {"schema": 1, "sandbox": sb, "run": run, "killed": False}
        with anyio.CancelScope(shield=True):  # once asked, the kill completes
            killed = await job.kill()
        return {"schema": 1, "sandbox": sb, "run": run, "killed": killed}

    # -- races ---------------------------------------------------------------------------------
    async def start_race(self, args: dict[str, Any]) -> RaceJob:
        from ..api import Cmd, Patch
        from .tools import _duration, _limits

        cands: list[Any] = []
        for i, c in enumerate(args["candidates"], 1):
            if "cmd" in c:
                cands.append(Cmd(c["cmd"]))
            elif "patch_text" in c:
                cands.append(Patch(text=c["patch_text"], name=f"patch_text#{i}"))
            else:
                cands.append(Patch(os.path.join(self.ws.root, c["patch"]), name=c["patch"]))
        job = RaceJob(args["check"], [{"candidate": c.name, "kind": c.kind} for c in cands])
        limits = _limits(args)
        timeout = _duration(args, "timeout_s", None)

        async def go(job: RaceJob) -> Any:
            return await self.ws.race(args["check"], cands, source=args.get("from", "live"), jobs=args.get("jobs", 8),
                                      limits=limits, timeout=timeout, keep=bool(args.get("keep")),
                                      on_start=job.on_start, label=args.get("label"), metric=args.get("metric"),
                                      max_regression=args.get("max_regression"),
                                      profile=args.get("profile"))

        store = self.ws.sync.engine.store.root
        self.spawn(job.execute, store, go, done=job)
        await job.has_id.wait()
        if job.id is None:
            raise job.error if job.error is not None else RuntimeError("the race did not start")
        self.jobs.add_race(job)
        return job

    def find_race(self, ident: str) -> RaceJob:
        from ..errors import UsageError

        job = self.jobs.race(ident)
        if job is None:
            raise UsageError(detail=f"no race {ident!r} in this server: race_status follows the races its `race` "
                                    "tool started (the winner of an older one is in sandbox_list)")
        return job

    async def race_doc(self, job: RaceJob, wait_s: float) -> dict[str, Any]:
        CURRENT.get().describe = job.progress_message
        with anyio.move_on_after(wait_s):
            await job.done.wait()
        if job.error is not None:
            raise job.error
        return job.doc()

    # -- jobs ----------------------------------------------------------------------------------
    def spawn(self, fn: Callable[..., Any], *args: Any, done: Any) -> None:
        async def task() -> None:
            self.active += 1
            try:
                await fn(*args)
            finally:
                self.active -= 1
                self.jobs.finished(done)

        self.tg.start_soon(task)

    def note_client(self, ctx: Any) -> None:
        """Keep the client's name from ``initialize`` on the workspace (for the audit trail)."""
        if self.ws.client is None:
            params = getattr(ctx.session, "client_params", None)
            info = getattr(params, "client_info", None)
            if info is not None and info.name:
                self.ws.client = info.name


# ---------------------------------------------------------------------------- results


def _leaf(e: BaseException) -> BaseException:
    """The one exception inside (nested) groups, else the group itself."""
    while isinstance(e, BaseExceptionGroup) and len(e.exceptions) == 1:
        e = e.exceptions[0]
    return e


def error_doc(e: BaseException, debug: bool) -> dict[str, Any]:
    """The CLI's ``--json`` error document for ``e`` (``error`` is its stderr line without
    the ``petri: `` prefix), with what the failure carries (a promotion's conflicts or
    result)."""
    from snapshot.errors import PetriError

    from ..units import shown

    e = _leaf(e)
    extra: dict[str, Any] = {}
    if isinstance(e, PetriError):
        msg, code = str(e), e.exit_code
        # a record set on some subclasses only (MarkersWritten: the promotion happened; KpiBreach)
        result = getattr(e, "result", None)
        if result is not None:
            extra = result.to_json()
        if isinstance(e.doc, dict):
            extra = dict(e.doc)
        conflicts = getattr(e, "conflicts", None)  # a Conflict's; its raiser may not have set it
        if conflicts:
            extra["conflicts"] = [c.to_json() if hasattr(c, "to_json") else c for c in conflicts]
    elif isinstance(e, OSError):
        where = f": {os.fsdecode(e.filename)}" if e.filename else ""
        msg, code = f"{e.strerror or e}{where}", 1
    else:
        msg, code = f"internal error: {type(e).__name__}: {e} (run `petri mcp --debug` for the traceback)", 1
    if debug:
        traceback.print_exception(e, file=sys.stderr)
    extra.pop("schema", None)
    return {"schema": 1, **extra, "error": shown(msg, limit=2000), "exit_code": code}


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
                      output_schema=t.result,
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

    from ..cli.common import VERSION

    listed = [_tool(t) for t in st.tools.values()]

    async def list_tools(ctx: Any, params: Any) -> Any:
        st.note_client(ctx)
        return types.ListToolsResult(tools=listed)

    async def call_tool(ctx: Any, params: Any) -> Any:
        from ..errors import UsageError

        st.note_client(ctx)
        args = dict(params.arguments or {})
        call = Call(params.name)
        token = CURRENT.set(call)
        st.active += 1
        try:
            tool = st.tools.get(params.name)
            if tool is None:
                hidden = params.name in BY_NAME
                raise UsageError(detail=f"no tool {params.name!r}" + (
                    ": it changes the live workspace and exists only with `petri mcp --allow-live`" if hidden
                    else "; tools/list names them"))
            st.validate(tool, args)
            with anyio.CancelScope() as scope:
                st.calls.add(scope)
                try:
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(_heartbeat, ctx, call)
                        doc = await tool.handler(st, args)
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
    from .handshake import difference

    go_on, line = difference(sent, sdk)
    print(f"petri mcp: {line}", file=sys.stderr, flush=True)
    if not go_on:  # the client was told something the SDK does not hold: no session to serve
        os._exit(1)


async def _serve(st: State, wire: Any, early: Any) -> None:
    from mcp.server.stdio import stdio_server

    from .handshake import DropEarlyAnswer, Replay

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
    from ..cli.common import VERSION
    from .handshake import Wire, answer_early

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
