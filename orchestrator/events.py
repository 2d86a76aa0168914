"""The event stream: one JSON document per line in ``<store>/events.jsonl``.

Front ends (the TUI, ``tail -f``, an agent) follow this file to see what every ``petri``
process on the workspace does: sandboxes created, destroyed and expired, runs started, how
far their output has got, and runs finished. Each event is one ``write(2)`` of
one complete line on a descriptor opened with ``O_APPEND``, so lines from concurrent petri
processes never interleave (the kernel appends each write whole at the current end of a
regular file) and a reader never sees half a line that will later be completed, except the
last one while it is being written.

Every event has ``schema`` (1), ``ts`` (RFC 3339 UTC), ``event`` (the kind), ``pid`` (of
the petri process that wrote it) and ``via`` (``cli`` | ``api`` | ``mcp`` | ``tui``: how the
operation that wrote it was invoked; the audit scope sets it, see ``set_via``), plus the
kind's own fields. The names are a closed set (``NAMES``); each has one emitter function
here (``sandbox_created``, ``run_finished``, ...), and ``emit`` refuses any other name:

- ``sandbox.created``: ``sandbox``, ``base``, ``path``, ``label``
- ``sandbox.destroyed`` / ``sandbox.expired``: ``sandbox`` (once per sandbox: ``rm``, a
  race's losers, ``gc``, ``deinit --force`` destroy; the end of its lifetime expires)
- ``run.started``: ``sandbox``, ``run``, ``argv``, ``stdout_path``, ``stderr_path``
- ``run.output``: ``sandbox``, ``run``, ``stdout_bytes``, ``stdout_lines``, ``stderr_bytes``,
  ``stderr_lines`` (so far), ``stream`` (the one that wrote last) and ``line`` (its last
  line, invalid UTF-8 as U+FFFD, cut to 200 characters; null when there is none). Coalesced:
  at most about ten a second per run (``runner.PROGRESS_S``), one more at its end; the
  output itself is in the run's log files, which followers read by offset
  (``orchestrator.runlog``)
- ``run.finished``: ``sandbox``, ``run`` and the run document (``exit_code``, ...)
- ``race.started``: ``race``, ``base``, ``check``, ``jobs``, ``candidates`` (each with its
  ``sandbox`` and ``check_sandbox``, so a follower can attribute the runs' output)
- ``race.candidate_finished``: ``race``, ``sandbox``, ``applied``, ``exit_code``,
  ``duration_s``, ``killed_by``, ``error`` and the lines it changed
- ``race.finished``: ``race``, ``winner``, ``duration_s`` and, when it ran to its end, the
  ranked ``candidates`` and ``conflicts`` of the race document; ``error`` when it was
  interrupted or failed (``orchestrator.api.RaceTracker`` folds these into races)
- ``promotion.done`` / ``promotion.undone``: ``promotion`` (its changes are now in place in
  the workspace whose stream it is / taken out again: a promotion or stage, a rollback, an
  undo after a failed check, a recovery that finished or undid one)
- ``promotion.watch_started``: ``promotion``, ``command``, ``every_s``, ``until``, ``watcher`` (its
  pid): ``promote --watch`` began watching it (``orchestrator.watch``)
- ``promotion.watch_finished``: ``promotion``, ``state`` (``passed``, ``rolled_back``,
  ``rollback_refused``, ``stopped``, ``interrupted``), ``checks``, and ``failed`` (the failing
  check) or ``reason``; a rollback it made also writes ``promotion.undone``
- ``snapshot.created``: ``snapshot``, ``kind`` (user, implicit, safety, sandbox), ``parent``
- ``net.denied``: ``sandbox``, ``host``, ``port``, ``method``, ``reason``: the egress proxy of a
  sandbox with ``--net allow:...`` refused a destination (``orchestrator.sandbox.egress``; the
  proxy is the writer, so ``pid`` is the proxy's and ``via`` that of the operation that made it)
- ``sandbox.rejected``: ``sandbox``, ``reason``, ``kept`` (``petri reject``; a
  ``sandbox.destroyed`` follows unless it was kept)

Rotation: the writer whose event takes the stream past ``ROTATE_BYTES`` renames it to
``events.jsonl.1`` (replacing the previous one) and a new stream starts; ``petri gc`` does
the same for a stream already past it. Both take an exclusive ``flock`` on the file and
rename only while the name still points at it, so two never rotate twice. A writer notices
the new file by its inode (checked at most once a second) and moves to it; ``follow`` does
the same after draining the old file, so a follower misses nothing written before the
switch. No reader loads the stream whole: ``read_all`` goes line by line, ``follow`` a
mebibyte at a time.

Caveats: a writer that has not yet noticed a rotation (up to a second) appends to
``events.jsonl.1``, and a follower that already moved on does not see those lines. Writing
an event never fails a command: an error writing the stream is ignored (the registry and
logs are the record; this is a feed); a name outside ``NAMES`` or a missing key is a
programming error and raises. ``via`` is ``api`` where no audited operation is open (a
read-only CLI command that expires a sandbox on its way says ``api``).
"""
from __future__ import annotations

import contextvars
import json
import os
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from .output import json_line

SCHEMA = 1
FILE_NAME = "events.jsonl"
ROTATED_NAME = "events.jsonl.1"
ROTATE_BYTES = 32 << 20
READ_BYTES = 1 << 20

# The closed set of event names, with the keys each must carry (docs/reference/events.md is generated from it).
KEYS: dict[str, tuple[str, ...]] = {
    "sandbox.created": ("sandbox",), "sandbox.destroyed": ("sandbox",), "sandbox.expired": ("sandbox",),
    "run.started": ("sandbox", "run"), "run.output": ("sandbox", "run"), "run.finished": ("sandbox", "run"),
    "race.started": ("race",), "race.candidate_finished": ("race",), "race.finished": ("race",),
    "promotion.done": ("promotion",), "promotion.undone": ("promotion",),
    "promotion.watch_started": ("promotion",), "promotion.watch_finished": ("promotion", "state"),
    "snapshot.created": ("snapshot",),
    "sandbox.rejected": ("sandbox",),
    "service.started": ("sandbox", "service"), "service.exited": ("sandbox", "service"),
    "net.denied": ("sandbox",),
}
NAMES = frozenset(KEYS)
VIAS = frozenset({"cli", "api", "mcp", "tui"})
COMMON = ("schema", "ts", "event", "pid", "via")

_via: contextvars.ContextVar[str] = contextvars.ContextVar("petri_event_via", default="api")


def set_via(via: str) -> contextvars.Token:
    """How the operation now starting was invoked (``audit.begin`` calls this; the caller
    resets the token when the operation ends)."""
    if via not in VIAS:
        raise ValueError(f"event via {via!r} is not one of {sorted(VIAS)}")
    return _via.set(via)


def reset_via(token: contextvars.Token) -> None:
    _via.reset(token)


def _ts() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class EventLog:
    """An append-only writer for one store's stream (keeps its descriptor open)."""

    RECHECK_S = 1.0  # how often a long-lived writer looks for a rotation

    def __init__(self, store_root: Path) -> None:
        self.path = Path(store_root) / FILE_NAME
        self._fd: int | None = None
        self._checked = 0.0
        # One writer per store and process, shared by runs in several threads (an asyncio
        # caller's trio loops, a race's checks): opening, rotating and closing are one at a time.
        self._lock = threading.Lock()

    def _open(self) -> int | None:
        if self._fd is not None and time.monotonic() - self._checked >= self.RECHECK_S:
            self._checked = time.monotonic()
            try:
                rotated = os.stat(self.path).st_ino != os.fstat(self._fd).st_ino
            except OSError:
                rotated = True  # renamed away and no new one yet: make it
            if rotated:
                self.close()
        if self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError:
                return None
            self._checked = time.monotonic()
        return self._fd

    def emit(self, event: str, **fields: Any) -> None:
        keys = KEYS.get(event)
        if keys is None:
            raise ValueError(f"{event!r} is not an event name (events.NAMES)")
        missing = [k for k in keys if fields.get(k) is None]
        if missing:
            raise ValueError(f"event {event} without {', '.join(missing)}")
        doc = {"schema": SCHEMA, "ts": _ts(), "event": event, "pid": os.getpid(), "via": _via.get(), **fields}
        line = json_line(doc).encode()  # argv and env may hold bytes that are not UTF-8
        with self._lock:
            fd = self._open()
            if fd is None:
                return
            try:
                os.write(fd, line)
                if os.fstat(fd).st_size >= ROTATE_BYTES:
                    _rotate(self.path, fd, ROTATE_BYTES)
                    self.close()  # the next event starts the new stream
            except OSError:
                pass

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


_logs: dict[str, EventLog] = {}


def log_for(store_root: Path) -> EventLog:
    """The process-wide writer for a store (one descriptor per store)."""
    key = str(store_root)
    if key not in _logs:
        _logs[key] = EventLog(Path(store_root))
    return _logs[key]


def emit(store_root: Path, event: str, **fields: Any) -> None:
    """Append one event to ``<store_root>/events.jsonl`` (an error writing it is ignored; a
    name outside ``NAMES`` raises). Callers use the emitter functions below."""
    log_for(store_root).emit(event, **fields)


# One emitter per name: the only places a name is written (tests/orchestrator/test_events.py checks that
# no other module passes a literal name to ``emit``). ``to``: the store's root, or the
# ``EventLog`` a long-lived writer (a run, a race) keeps.
def _to(to: Any) -> EventLog:
    return to if isinstance(to, EventLog) else log_for(to)


def sandbox_created(to: Any, **fields: Any) -> None:
    _to(to).emit("sandbox.created", **fields)


def sandbox_destroyed(to: Any, sandbox: str) -> None:
    _to(to).emit("sandbox.destroyed", sandbox=sandbox)


def sandbox_expired(to: Any, sandbox: str) -> None:
    _to(to).emit("sandbox.expired", sandbox=sandbox)


def sandbox_rejected(to: Any, **fields: Any) -> None:
    _to(to).emit("sandbox.rejected", **fields)


def run_started(to: Any, **fields: Any) -> None:
    _to(to).emit("run.started", **fields)


def run_output(to: Any, *, sandbox: str, run: int, progress: Any) -> None:
    """How far a run's output has got (``runner.OutputProgress``): coalesced by the runner."""
    _to(to).emit("run.output", sandbox=sandbox, run=run, stream=progress.stream, line=progress.line,
                 stdout_bytes=progress.stdout_bytes, stdout_lines=progress.stdout_lines,
                 stderr_bytes=progress.stderr_bytes, stderr_lines=progress.stderr_lines)


def run_finished(to: Any, **fields: Any) -> None:
    _to(to).emit("run.finished", **fields)


def race_started(to: Any, **fields: Any) -> None:
    _to(to).emit("race.started", **fields)


def race_candidate_finished(to: Any, **fields: Any) -> None:
    _to(to).emit("race.candidate_finished", **fields)


def race_finished(to: Any, **fields: Any) -> None:
    _to(to).emit("race.finished", **fields)


def promotion_done(to: Any, promotion: str) -> None:
    _to(to).emit("promotion.done", promotion=promotion)


def promotion_undone(to: Any, promotion: str) -> None:
    _to(to).emit("promotion.undone", promotion=promotion)


def promotion_watch_started(to: Any, **fields: Any) -> None:
    _to(to).emit("promotion.watch_started", **fields)


def promotion_watch_finished(to: Any, **fields: Any) -> None:
    _to(to).emit("promotion.watch_finished", **fields)


def snapshot_created(to: Any, **fields: Any) -> None:
    _to(to).emit("snapshot.created", **fields)


def service_started(to: Any, **fields: Any) -> None:
    _to(to).emit("service.started", **fields)


def net_denied(to: Any, **fields: Any) -> None:
    _to(to).emit("net.denied", **fields)


def service_exited(to: Any, **fields: Any) -> None:
    _to(to).emit("service.exited", **fields)


def _rotate(path: Path, fd: int, limit: int) -> bool:
    """Rename the stream open at ``fd`` to ``events.jsonl.1`` if ``path`` still names it and
    it holds ``limit`` bytes or more (under an exclusive flock: one rotation per file)."""
    import fcntl

    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        st = os.stat(path)
        if st.st_ino != os.fstat(fd).st_ino or st.st_size < limit:
            return False  # someone rotated it already
        os.replace(path, path.with_name(ROTATED_NAME))
        return True
    except FileNotFoundError:
        return False
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def rotate_if_big(store_root: Path, limit: int | None = None) -> bool:
    """For ``gc``: a stream of ``limit`` (default ``ROTATE_BYTES``) bytes or more becomes
    ``events.jsonl.1``."""
    path = Path(store_root) / FILE_NAME
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        return _rotate(path, fd, ROTATE_BYTES if limit is None else limit)
    finally:
        os.close(fd)


def read_all(store_root: Path) -> Iterator[dict[str, Any]]:
    """Every event in the stream now (the rotated generation first), without waiting; read
    line by line, so memory does not grow with the stream."""
    for name in (ROTATED_NAME, FILE_NAME):
        try:
            f = open(Path(store_root) / name, "rb")
        except FileNotFoundError:
            continue
        with f:
            for ln in f:
                if ln.strip():
                    try:
                        yield json.loads(ln)
                    except ValueError:
                        continue  # the line being written right now


def count(store_root: Path, event: str, *, since: float | None = None) -> dict[str, Any]:
    """How many ``event`` the stream holds (since ``since``, a time.time()): ``{"n",
    "by_sandbox"}``. Lines that cannot be it are skipped unparsed (the stream may be long)."""
    needle = json.dumps(event).encode()
    by: dict[str, int] = {}
    n = 0
    for name in (ROTATED_NAME, FILE_NAME):
        try:
            f = open(Path(store_root) / name, "rb")
        except FileNotFoundError:
            continue
        with f:
            for ln in f:
                if needle not in ln:
                    continue
                try:
                    doc = json.loads(ln)
                except ValueError:
                    continue
                if doc.get("event") != event:
                    continue
                if since is not None:
                    try:
                        at = datetime.fromisoformat(doc["ts"].replace("Z", "+00:00")).timestamp()
                    except (KeyError, ValueError, AttributeError):
                        continue
                    if at < since:
                        continue
                n += 1
                sb = doc.get("sandbox")
                if sb:
                    by[sb] = by.get(sb, 0) + 1
    return {"n": n, "by_sandbox": by}


def follow(store_root: Path, *, from_start: bool = False, poll_s: float = 0.1,
           stop: Any = None) -> Iterator[dict[str, Any]]:
    """Yield events as they are appended (blocking; polls), across rotations. ``stop()``
    returning true ends it. Where reading starts is fixed by this call, not by the first
    ``next()``: the end of the stream as it is now (or its start, with ``from_start`` or when
    there is no stream yet)."""
    path = Path(store_root) / FILE_NAME
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        f = None
    if f is not None and not from_start:
        f.seek(0, os.SEEK_END)
    return _follow(path, f, poll_s, stop)


def _follow(path: Path, f: Any, poll_s: float, stop: Any) -> Iterator[dict[str, Any]]:
    buf = b""
    try:
        while stop is None or not stop():
            if f is None:
                try:
                    f = open(path, "rb")  # a new stream (first, or after a rotation): all of it
                except FileNotFoundError:
                    time.sleep(poll_s)
                    continue
            chunk = f.read(READ_BYTES)
            if chunk:
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for ln in lines:
                    if ln.strip():
                        try:
                            yield json.loads(ln)
                        except ValueError:
                            continue
                continue
            try:
                moved = os.stat(path).st_ino != os.fstat(f.fileno()).st_ino
            except FileNotFoundError:
                moved = False  # renamed, the new one not made yet: keep draining the old
            if moved:
                f.close()
                f, buf = None, b""
            else:
                time.sleep(poll_s)
    finally:
        if f is not None:
            f.close()
