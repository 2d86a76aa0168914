"""What the MCP server keeps between calls: runs started by ``sandbox_run_start`` and races
that outlive the ``race`` call that started them.

A job is a task in the server's one task group (so every job ends when the server does:
cancelled, which kills its run's processes through ``petri.aio``). A run job keeps its
output as a list of events (one per line, as the runner splits them) that
``sandbox_run_poll`` reads with a cursor; a race job follows the event stream
(``.petri/events.jsonl``) for its race id to say what is known before it ends.

Runs here, under trio, in the server's own thread: ``petri.aio`` then runs the command on
this loop, and its callbacks (``on_output``, ``on_start``) are called from it, so the job
state needs no lock.

Caveats: a job's events are bounded (``KEEP_BYTES``; older ones are dropped and counted,
the whole output stays in the run's log files); finished jobs are forgotten after
``KEEP_FINISHED`` newer ones finished; a server that exits forgets them all (the registry
and the logs still hold every run).
"""
from __future__ import annotations

import os
import time
from collections import deque
from typing import Any, Awaitable, Callable

import anyio

KEEP_BYTES = 4 << 20      # output kept per run job for polling
EVENT_BYTES = 16384       # one event's text at most (a line longer than that is cut)
POLL_BYTES = 65536        # text one poll returns at most (the rest on the next poll)
KEEP_FINISHED = 100


def split_failure(e: BaseException) -> tuple[BaseException | None, BaseException | None]:
    """``e`` split into the failure to report and what must keep propagating (a
    cancellation, an interrupt). A task group that is cancelled while a child fails raises
    both in one group: catching only ``Exception`` would let the failure escape with it."""
    if isinstance(e, BaseExceptionGroup):
        return e.split(Exception)
    if isinstance(e, Exception):
        return e, None
    return None, e


async def keep_outcome(job: Any, go: Callable[[Any], Awaitable[Any]]) -> None:
    """``job.result = await go(job)``, or its failure in ``job.error`` for the call that asks
    later; a cancellation propagates."""
    try:
        job.result = await go(job)
    except BaseException as e:  # noqa: BLE001 - split below
        job.error, rest = split_failure(e)
        if rest is e:
            raise  # a cancellation or an interrupt, as it came
        if rest is not None:
            raise rest from None  # the cancellation left of a group; its failure is in job.error


class Changed:
    """A level-triggered "something new" signal that many waiters can wait on."""

    def __init__(self) -> None:
        self._event = anyio.Event()

    def fire(self) -> None:
        self._event.set()
        self._event = anyio.Event()

    async def wait(self, timeout: float) -> None:
        with anyio.move_on_after(timeout):
            await self._event.wait()


class RunJob:
    """One run started by ``sandbox_run_start`` (or the run inside a ``sandbox_run`` call)."""

    def __init__(self, sandbox: str) -> None:
        self.sandbox = sandbox
        self.run: int | None = None
        self.started = anyio.Event()       # the run has its number (or it failed first)
        self.done = anyio.Event()
        self.result: Any = None            # petri.RunResult
        self.error: BaseException | None = None
        self.killed = False
        self.scope: anyio.CancelScope | None = None
        self.t0 = time.monotonic()
        self.lines = {"stdout": 0, "stderr": 0}
        self.last_line = ""
        self._events: deque[dict[str, Any]] = deque()
        self._first = 0                    # cursor of the oldest event kept
        self._kept = 0
        self.changed = Changed()

    # -- callbacks from petri.aio (on this loop) -------------------------------------------
    def on_start(self, n: int) -> None:
        self.run = n
        self.started.set()

    def on_output(self, stream: str, line: bytes) -> None:
        self.lines[stream] = self.lines.get(stream, 0) + 1
        cut = len(line) > EVENT_BYTES
        text = line[:EVENT_BYTES].decode("utf-8", "replace")
        ev: dict[str, Any] = {"cursor": self._first + len(self._events), "stream": stream, "text": text}
        if cut:
            ev["truncated_bytes"] = len(line) - EVENT_BYTES
        self._events.append(ev)
        self._kept += len(text)
        while self._kept > KEEP_BYTES and len(self._events) > 1:
            old = self._events.popleft()
            self._kept -= len(old["text"])
            self._first += 1
        if text.strip():
            self.last_line = text.strip()[:200]
        self.changed.fire()

    # -- reading ---------------------------------------------------------------------------
    @property
    def next_cursor(self) -> int:
        return self._first + len(self._events)

    def events_from(self, cursor: int) -> tuple[list[dict[str, Any]], int, int]:
        """Events at ``cursor`` and after (at most ``POLL_BYTES`` of text), the next cursor,
        and how many events before them were dropped (no longer kept)."""
        cursor = max(0, cursor)
        dropped = max(0, self._first - cursor)
        i = max(cursor, self._first) - self._first
        out, size = [], 0
        while i < len(self._events):
            ev = self._events[i]
            if out and size + len(ev["text"]) > POLL_BYTES:
                break
            out.append(ev)
            size += len(ev["text"])
            i += 1
        return out, self._first + i, dropped

    def progress_message(self) -> str:
        took = time.monotonic() - self.t0
        where = f"run {self.run}" if self.run is not None else "starting"
        tail = f"; last: {self.last_line}" if self.last_line else ""
        return (f"{self.sandbox} {where}: {took:.0f}s, {self.lines.get('stdout', 0)} stdout / "
                f"{self.lines.get('stderr', 0)} stderr lines{tail}")

    async def execute(self, go: Callable[["RunJob"], Awaitable[Any]]) -> None:
        """Run ``go(self)`` (which awaits the run) in this job's cancel scope, keeping its
        outcome; ``kill()`` cancels it (petri.aio kills the run's processes then)."""
        with anyio.CancelScope() as scope:
            self.scope = scope
            try:
                await keep_outcome(self, go)
            finally:
                self.started.set()
                self.done.set()
                self.changed.fire()

    async def kill(self) -> bool:
        """Stop the run; True when it was still running. Returns once its processes are gone."""
        if self.done.is_set():
            return False
        self.killed = True
        if self.scope is not None:
            self.scope.cancel()
        await self.done.wait()
        return True


class RaceJob:
    """One race started by the ``race`` tool, running in the server until it ends."""

    def __init__(self, check: str, candidates: list[dict[str, str]]) -> None:
        self.id: str | None = None
        self.check = check
        self.has_id = anyio.Event()
        self.done = anyio.Event()
        self.result: Any = None            # petri.Race
        self.error: BaseException | None = None
        self.base: str | None = None
        self.t0 = time.monotonic()
        # what is known before the end, one row per candidate (SPEC's race candidate fields)
        self.rows: list[dict[str, Any]] = [{"candidate": c["candidate"], "kind": c["kind"], "sandbox": None,
                                            "applied": None, "exit_code": None, "duration_s": None,
                                            "rank": None, "finished": False} for c in candidates]

    def on_start(self, race_id: str) -> None:
        self.id = race_id
        self.has_id.set()

    def on_event(self, ev: dict[str, Any]) -> None:
        """A ``race.*`` event of this race, from the event stream."""
        kind = ev.get("event")
        if kind == "race.started":
            self.base = ev.get("base")
            # strict=False: the event is input read back from the log; a short list must not kill the follower
            for row, c in zip(self.rows, ev.get("candidates") or [], strict=False):
                row["sandbox"] = c.get("sandbox")
        elif kind == "race.candidate_finished":
            for row in self.rows:
                if row["sandbox"] == ev.get("sandbox"):
                    row.update(applied=ev.get("applied"), exit_code=ev.get("exit_code"),
                               duration_s=ev.get("duration_s"), finished=True)

    def doc(self) -> dict[str, Any]:
        """The race document: the final one when done, else what is known (``done`` false)."""
        if self.result is not None:
            return {**self.result.to_json(), "done": True}
        finished = sum(1 for r in self.rows if r["finished"])
        return {"schema": 1, "race": self.id, "base": self.base, "check": self.check, "winner": None,
                "candidates": [dict(r) for r in self.rows], "done": False,
                "finished": finished, "running_s": round(time.monotonic() - self.t0, 3)}

    def progress_message(self) -> str:
        finished = sum(1 for r in self.rows if r["finished"])
        return f"race {self.id or '(starting)'}: {finished}/{len(self.rows)} candidates checked"

    async def execute(self, store: os.PathLike, go: Callable[["RaceJob"], Awaitable[Any]]) -> None:
        """Run the race (``go(self)``), following the event stream for its progress."""
        from orchestrator import events

        stop = False
        # follow() fixes its starting point now, before the race can emit anything
        stream = events.follow(store, from_start=False, poll_s=0.1, stop=lambda: stop)

        def next_of_ours() -> dict[str, Any] | None:
            for ev in stream:
                if self.id is not None and ev.get("race") == self.id and str(ev.get("event", "")).startswith("race."):
                    return ev
            return None

        async def follow() -> None:
            while True:
                ev = await anyio.to_thread.run_sync(next_of_ours, abandon_on_cancel=True)
                if ev is None:
                    return
                self.on_event(ev)

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(follow)
                try:
                    await keep_outcome(self, go)
                finally:
                    tg.cancel_scope.cancel()
        finally:
            stop = True
            self.has_id.set()
            self.done.set()


class Jobs:
    """The server's jobs, by (sandbox, run) and by race id."""

    def __init__(self) -> None:
        self.runs: dict[tuple[str, int], RunJob] = {}
        self.races: dict[str, RaceJob] = {}
        self._finished: deque[Any] = deque()

    def add_run(self, job: RunJob) -> None:
        assert job.run is not None
        self.runs[(job.sandbox, job.run)] = job

    def add_race(self, job: RaceJob) -> None:
        assert job.id is not None
        self.races[job.id] = job

    def finished(self, job: Any) -> None:
        """Forget the oldest finished jobs beyond ``KEEP_FINISHED``."""
        self._finished.append(job)
        while len(self._finished) > KEEP_FINISHED:
            old = self._finished.popleft()
            if isinstance(old, RunJob) and old.run is not None:
                self.runs.pop((old.sandbox, old.run), None)
            elif isinstance(old, RaceJob) and old.id is not None:
                self.races.pop(old.id, None)

    def race(self, ident: str) -> RaceJob | None:
        """A race job by id or unique prefix."""
        if ident in self.races:
            return self.races[ident]
        hits = [j for k, j in self.races.items() if k.startswith(ident)]
        return hits[0] if len(hits) == 1 else None
