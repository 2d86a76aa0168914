"""The MCP server's state between calls: the workspace (``petri.aio``), the jobs that outlive
a call (runs, races), the call in progress (what its heartbeat says), and the error document
of a failure. The tools' handlers (``tools``) take a ``State``; the SDK wiring (``server``)
makes one and dispatches to them; neither module is imported here.

Caveat: a run or race started by another process cannot be followed or killed here
(``sandbox_run_poll`` reports what the registry says of it).
"""
from __future__ import annotations

import contextvars
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator

import anyio

from .args import _limits, _seconds
from .jobs import Jobs, RaceJob, RunJob
from snapshot.errors import PetriError
from ..units import shown
from ..errors import OrchestratorError, UsageError

if TYPE_CHECKING:  # the argument models load pydantic: not on the way to the initialize answer
    from .params import Race


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

    async def sandbox_id(self, ident: str) -> str:
        return (await self.ws.sandbox(ident)).info.id

    # -- runs ----------------------------------------------------------------------------------
    def _runner(self, sandbox: str, command: Any, timeout: float | None, env: dict[str, str] | None,
                cwd: str | None) -> Any:
        async def go(job: RunJob) -> Any:
            return await self.ws.run(sandbox, command, timeout=timeout, env=env, cwd=cwd, on_start=job.on_start)
        return go

    def _job(self, sandbox: str) -> RunJob:
        ws = self.ws.sync
        return RunJob(sandbox, lambda n: ws.run_log_paths(sandbox, n))

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
    async def start_race(self, a: "Race") -> RaceJob:
        from ..api import Cmd, Patch

        cands: list[Any] = []
        for i, c in enumerate(a.candidates, 1):
            if c.cmd is not None:
                cands.append(Cmd(c.cmd))
            elif c.patch_text is not None:
                cands.append(Patch(text=c.patch_text, name=f"patch_text#{i}"))
            else:
                cands.append(Patch(os.path.join(self.ws.root, str(c.patch)), name=c.patch))
        job = RaceJob(a.check, [{"candidate": c.name, "kind": c.kind} for c in cands])
        limits = _limits(a)
        timeout = _seconds(a.timeout_s, "timeout_s")

        async def go(job: RaceJob) -> Any:
            return await self.ws.race(a.check, cands, source=a.from_, jobs=a.jobs, limits=limits, timeout=timeout,
                                      keep=a.keep, on_start=job.on_start, label=a.label, metric=a.metric,
                                      max_regression=a.max_regression, profile=a.profile)

        ws = self.ws.sync

        def follow_events(stop: Callable[[], bool]) -> Iterator[Any]:
            return ws.events(follow=True, from_start=False, poll_s=0.1, stop=stop)

        self.spawn(job.execute, follow_events, go, done=job)
        await job.has_id.wait()
        if job.id is None:
            raise job.error if job.error is not None else RuntimeError("the race did not start")
        self.jobs.add_race(job)
        return job

    def find_race(self, ident: str) -> RaceJob:

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


