"""What the MCP server keeps between calls: runs started by ``sandbox_run_start`` and races
that outlive the ``race`` call that started them.

A job is a task in the server's one task group (so every job ends when the server does:
cancelled, which kills its run's processes through ``petri.aio``). A run job holds no
output: it tails the run's log files by offset (the API's ``read_log_at``), looking at how
far each stream has got every ``SAMPLE_S`` while the run lives, and keeps only the order in
which the two streams grew (``_order``: a cursor range, a stream, a stream offset). The
cursor of ``sandbox_run_poll`` counts bytes of both streams in that order; a poll reads the
bytes after its cursor from the files. A race job follows the event stream
(``.petri/events.jsonl``) for its race id to say what is known before it ends.

Runs here, under trio, in the server's own thread: ``petri.aio`` then runs the command on
this loop, and its callbacks (``on_start``) are called from it, so the job state needs no
lock.

Caveats: the order of stdout against stderr is kept to within ``SAMPLE_S`` (within one
sample, stdout comes first); a job remembers the order of its last ``KEEP_ORDER`` stretches
(a cursor older than that is reported ``dropped``), and bytes the log cap dropped are
``dropped`` too; finished jobs are forgotten after ``KEEP_FINISHED`` newer ones finished; a
server that exits forgets them all (the registry and the logs still hold every run).
"""
from __future__ import annotations

import bisect
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Iterator

import anyio
from ..units import human_bytes

if TYPE_CHECKING:
    from orchestrator.api.records import Event

SAMPLE_S = 0.05           # how often a live run job looks at how far its streams have got
KEEP_ORDER = 10000        # stretches of output whose order a run job remembers
POLL_BYTES = 65536        # output one poll returns at most (the rest on the next poll)
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
    """One run started by ``sandbox_run_start`` (or the run inside a ``sandbox_run`` call).
    ``paths(n)`` gives run ``n``'s (stdout, stderr) log files."""

    def __init__(self, sandbox: str, paths: Callable[[int], tuple[Path, Path]]) -> None:
        self.sandbox = sandbox
        self.paths_of = paths
        self.run: int | None = None
        self.paths: dict[str, Path] = {}
        self.started = anyio.Event()       # the run has its number (or it failed first)
        self.done = anyio.Event()
        self.result: Any = None            # petri.RunResult
        self.error: BaseException | None = None
        self.killed = False
        self.scope: anyio.CancelScope | None = None
        self.t0 = time.monotonic()
        self.sizes = {"stdout": 0, "stderr": 0}  # how far each stream has got
        # [cursor, stream, stream offset, length]: the streams' stretches in the order they grew
        self._order: list[list[Any]] = []
        self._first = 0                    # cursor of the oldest stretch remembered
        self.total = 0                     # the cursor after everything so far
        self.changed = Changed()

    # -- callbacks from petri.aio (on this loop) -------------------------------------------
    def on_start(self, n: int) -> None:
        self.run = n
        out, err = self.paths_of(n)
        self.paths = {"stdout": Path(out), "stderr": Path(err)}
        self.started.set()

    # -- following the log files ---------------------------------------------------------------
    def sample(self) -> None:
        """Note how far each stream has got since the last look."""
        from orchestrator.api import log_stream_size

        grew = False
        for stream, path in self.paths.items():
            size = log_stream_size(path)
            if size <= self.sizes[stream]:
                continue
            n = size - self.sizes[stream]
            last = self._order[-1] if self._order else None
            if last is not None and last[1] == stream and last[2] + last[3] == self.sizes[stream]:
                last[3] += n
            else:
                self._order.append([self.total, stream, self.sizes[stream], n])
            self.sizes[stream] = size
            self.total += n
            grew = True
        while len(self._order) > KEEP_ORDER:
            old = self._order.pop(0)
            self._first = old[0] + old[3]
        if grew:
            self.changed.fire()

    async def follow(self) -> None:
        """While the run lives: sample its streams every ``SAMPLE_S``."""
        await self.started.wait()
        while True:
            self.sample()
            await anyio.sleep(SAMPLE_S)

    # -- reading ---------------------------------------------------------------------------
    @property
    def next_cursor(self) -> int:
        return self.total

    def events_from(self, cursor: int, limit: int = POLL_BYTES) -> tuple[list[dict[str, Any]], int, int]:
        """Output after ``cursor`` (``limit`` bytes, less to end on a whole character, three
        more at most to hold one), one event per stretch of one stream, the next cursor, and
        how many bytes before and among them are gone (too old to be placed, or dropped by
        the log cap)."""
        from orchestrator.api import read_log_at

        cursor = max(0, min(cursor, self.total))
        dropped = 0
        if cursor < self._first:
            dropped, cursor = self._first - cursor, self._first
        out: list[dict[str, Any]] = []
        budget = limit
        i = max(0, bisect.bisect_right([o[0] for o in self._order], cursor) - 1)
        while i < len(self._order) and budget > 0:
            c0, stream, off0, length = self._order[i]
            if cursor >= c0 + length:
                i += 1
                continue
            # at least a whole character's worth, so the cut below always leaves one
            want = min(max(budget, 4), c0 + length - cursor)
            at, data = read_log_at(self.paths[stream], off0 + (cursor - c0), want)
            gone = at - (off0 + (cursor - c0))
            if gone:  # the log cap dropped these
                gone = min(gone, c0 + length - cursor)
                dropped += gone
                cursor += gone
                continue
            if not data:
                break  # not in the file yet (cannot be: the sample saw it): try again later
            data = data[:want]
            if len(data) == want and cursor + len(data) < c0 + length:
                data = _whole_utf8(data)
            out.append({"cursor": cursor, "stream": stream, "text": data.decode("utf-8", "replace")})
            cursor += len(data)
            budget -= len(data)
        return out, cursor, dropped

    def last_line(self) -> str:
        from orchestrator.api import read_log_at

        if not self._order:
            return ""
        _, stream, off, length = self._order[-1]
        end = off + length
        _, data = read_log_at(self.paths[stream], max(0, end - 512), 512)
        lines = [ln.strip() for ln in data.decode("utf-8", "replace").replace("\r", "\n").split("\n")]
        return next((ln for ln in reversed(lines) if ln), "")[:200]

    def progress_message(self) -> str:

        took = time.monotonic() - self.t0
        where = f"run {self.run}" if self.run is not None else "starting"
        last = self.last_line()
        tail = f"; last: {last}" if last else ""
        return (f"{self.sandbox} {where}: {took:.0f}s, {human_bytes(self.sizes['stdout'])} stdout / "
                f"{human_bytes(self.sizes['stderr'])} stderr{tail}")

    async def execute(self, go: Callable[["RunJob"], Awaitable[Any]]) -> None:
        """Run ``go(self)`` (which awaits the run) in this job's cancel scope, keeping its
        outcome, and follow its log files meanwhile; ``kill()`` cancels it (petri.aio kills
        the run's processes then)."""
        with anyio.CancelScope() as scope:
            self.scope = scope
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self.follow)
                    try:
                        await keep_outcome(self, go)
                    finally:
                        tg.cancel_scope.cancel()
            finally:
                if self.paths:
                    self.sample()  # the files are complete now
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


def _whole_utf8(data: bytes) -> bytes:
    """``data`` without a UTF-8 sequence cut at its end (the rest comes with the next read)."""
    for back in range(1, min(4, len(data)) + 1):
        b = data[-back]
        if b & 0xC0 == 0x80:
            continue  # a continuation byte: look further back for its lead
        if b & 0x80 and back < (2 if b & 0xE0 == 0xC0 else 3 if b & 0xF0 == 0xE0 else 4):
            return data[:-back] if back < len(data) else data
        return data
    return data


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
        # what is known before the end, one row per candidate (the race document's candidate fields)
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

    async def execute(self, follow_events: Callable[[Callable[[], bool]], Iterator["Event"]],
                      go: Callable[["RaceJob"], Awaitable[Any]]) -> None:
        """Run the race (``go(self)``), following the event stream for its progress
        (``follow_events(stop)``: the workspace's ``events``, followed from now until ``stop()``)."""
        stop = False
        # the follow fixes its starting point now, before the race can emit anything
        stream = follow_events(lambda: stop)

        def next_of_ours() -> dict[str, Any] | None:
            for record in stream:
                ev = record.to_json()
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
