"""Run one command isolated in a sandbox: bwrap + limits + output + timeouts.

One implementation, ``run_blocking(spec)``, a poll(2) loop in the calling thread; the async
``run_isolated(spec)`` (trio: races, MCP, ``petri.aio``) runs that same loop in a thread of
its own for the length of the run and stops it when the awaiting task is cancelled. The
loop does, in order:

1. ``prepare`` (shared with ``pty_shell``): the sandbox plan (``isolation``), the run's
   cgroup with its limits (``cgroups``; rlimits with warnings where there is none), the
   plan's syscall filter (``seccomp``) on a pipe for bwrap (``--seccomp FD``);
2. start ``cgexec``'s wrapper -> bwrap -> ``/bin/sh -c 'exec "$@"'`` -> the command, in a
   session of its own so the user's Ctrl-C reaches petri, not bwrap (petri forwards it),
   forked from this thread (``spawn``: the thread lives as long as the run);
3. copy stdout/stderr in large chunks (up to 1 MiB a read, the pipes grown to 1 MiB) through
   the stream's filters (``runlog.ChunkFilter``: the shim's start marker on stderr) to the
   saved files (``runlog.CappedLog``: head and tail past ``spec.log_cap``), to our own
   stdout/stderr (``echo``), and into the counts (bytes, lines, the last line) that a
   ``progress`` event reports at most every ``PROGRESS_S``; no Python work per line. Feed
   ``stdin_data``;
4. wait for the command (its pidfd), or for the timeout/lifetime: then SIGTERM to every
   process in the cgroup but bwrap itself (bwrap's init in the pid namespace ignores it:
   only signals it handles reach a namespace's init), a grace period, then SIGKILL through
   the kill loop;
5. at the end, always: the kill loop over the cgroup (the pid namespace died with its init
   already; this catches anything that did not, after giving the dying a few milliseconds,
   ``SETTLE_S``, to leave the cgroup by themselves), read its counters, remove it.

Exit code: the command's own; 124 killed by timeout/lifetime; 137 killed by the memory limit
(an OOM kill in the cgroup and a non-zero exit); 125 the sandbox never started (bwrap's
setup failed: the shim's marker never came, see ``isolation.EXEC_SHIM``); 126/127 from
the shim's ``exec``; a run stopped on request (``killed_by: "killed"``) 128 + the signal
that asked: ``EXIT_STOPPED`` (143) for a ``Canceller`` (SIGTERM, then SIGKILL after the
grace period, as at a timeout), 128 + the signal that interrupted petri otherwise.

Signals (``forward_signals=True``, ``run_blocking`` in the main thread: ``petri run``):
SIGINT, SIGTERM, SIGHUP sent to petri go to every process of the run except bwrap; the
command decides (usually it exits, e.g. 130). A second one of the same kind, or one that
arrives before the command has started, kills the run: exit 128+signal. Without
forwarding, a KeyboardInterrupt (or a cancellation of ``run_isolated``) kills the run and
propagates, once its processes are gone (``on_stopped`` is told how the run ended first).

Events (``on_event``, called in the caller's thread: for ``run_isolated``, in the trio
loop's): ``started``, ``warning``, ``progress`` (coalesced counts), ``output`` (each chunk,
only with ``output_events``: the API's ``on_output``), ``finished``.

Caveats:
- Echo writes to our stdout/stderr synchronously: a stalled reader of petri's output
  stalls this run's copying (the saved files are written first, so nothing is lost).
- Without cgroups (mode "none") a timeout cannot give the command a grace period: bwrap is
  SIGKILLed and its pid namespace dies with it.
- A command that exits 137 by itself after an unrelated OOM kill in its cgroup is reported
  as killed by memory.
- ``run_isolated`` costs a thread per run (not trio's pool: races run many at once).
"""
from __future__ import annotations

import errno
import math
import os
import re
import select
import signal
import random
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from orchestrator.errors import SandboxSetupFailed
from orchestrator.runlog import CappedLog, ChunkFilter
from orchestrator.sandbox import cgroups, isolation
from orchestrator.sandbox.cgexec import ignored_signals
from orchestrator.sandbox.prepare import (EXIT_MEMORY, EXIT_PETRI, EXIT_TIMEOUT, Prepared, RunSpec,
                                          prepare)
from orchestrator.sandbox.spawn import DEVNULL, PIPE, ChildProcess, open_process_here
from snapshot.osutil import write_all
from orchestrator.sandbox.environment import thread_in_netns
from orchestrator import interrupts

__all__ = ["RunSpec", "RunResult", "RunEvent", "OutputProgress", "Canceller", "run_blocking", "run_isolated",
           "detect_cgroup_mode", "sweep_cgroups", "EXIT_TIMEOUT", "EXIT_PETRI", "EXIT_MEMORY", "EXIT_STOPPED",
           "KILL_GRACE_S"]

detect_cgroup_mode = cgroups.detect_cgroup_mode
sweep_cgroups = cgroups.sweep_cgroups

KILL_GRACE_S = 2.0
# A run stopped on request (a kill, a cancelled call or task, ``petri rm``): 128 + SIGTERM,
# the signal a stop sends first, whether the command ended on it or on the SIGKILL after the
# grace period (as ``timeout`` reports 124 either way). Not 137: that is the memory limit's.
EXIT_STOPPED = 128 + signal.SIGTERM
PROGRESS_S = 0.1  # at most ten progress events a second
READ_BYTES = 1 << 20
PIPE_BYTES = 1 << 20  # F_SETPIPE_SZ: fewer, larger reads (the kernel caps it at pipe-max-size)
LAST_LINE_CHARS = 200
_TAIL_KEEP = 4096  # bytes of each stream kept to find its last line
# Lines are counted as what is left of a chunk once every other byte is deleted: one C pass
# that writes only the newlines, a third faster than bytes.count (a plain byte loop in
# CPython 3.11) on long lines, as fast on short ones (bench_output's 50 MiB: ~23 vs ~34 ms).
_NOT_NEWLINE = bytes(c for c in range(256) if c != 0x0A)
_F_SETPIPE_SZ = 1031
SETTLE_S = 0.01  # how long a finished run's cgroup may take to empty by itself before the kill loop


@dataclass(frozen=True)
class RunResult:
    exit_code: int
    duration_s: float
    killed_by: str | None  # 'timeout' | 'ttl' | 'memory' | 'killed' (stopped on request) | None
    limits_hit: list[str]
    peak_memory_bytes: int | None
    cgroup_mode: str = "none"
    warnings: tuple[str, ...] = ()
    setup_error: str | None = None  # bwrap's own words when exit_code is 125
    cpu_time_s: float | None = None  # CPU the run's cgroup used
    output: dict[str, dict[str, int]] | None = None  # per stream: bytes, lines, dropped (the cap)


@dataclass(frozen=True)
class OutputProgress:
    """How far a run's output has got: bytes and lines per stream, and the newest line."""

    stdout_bytes: int = 0
    stdout_lines: int = 0
    stderr_bytes: int = 0
    stderr_lines: int = 0
    stream: str | None = None  # the stream that wrote last
    line: str | None = None  # its last line (cut to LAST_LINE_CHARS characters)


@dataclass(frozen=True)
class RunEvent:
    """``started`` (pid), ``output`` (stream, a chunk as bytes), ``progress`` (progress),
    ``warning`` (data), ``finished`` (result). Called synchronously: keep it quick."""

    kind: str
    stream: str | None = None
    data: bytes = b""
    pid: int | None = None
    result: RunResult | None = None
    progress: OutputProgress | None = None


class Canceller:
    """Stops a ``run_blocking`` from another thread, as a request to stop: SIGTERM to the
    run's processes, SIGKILL after the grace period; the run then returns, ended
    ``killed`` with exit ``EXIT_STOPPED``."""

    def __init__(self) -> None:
        self.cancelled = False
        self._fd: int | None = None
        # The run closes its wakeup pipe when it ends: a poke racing that must not write into
        # whatever file reuses the number next.
        self._lock = threading.Lock()

    def attach(self, fd: int | None) -> None:
        with self._lock:
            self._fd = fd
            if fd is not None and self.cancelled:
                self._poke()

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            self._poke()

    def _poke(self) -> None:
        if self._fd is not None:
            try:
                os.write(self._fd, b"\0")
            except OSError:
                pass  # full: it was poked already


class MarkerFilter:
    """Strips the shim's start marker (``isolation.EXEC_SHIM``) from a stream; whatever came
    before it is bwrap's own words (``before``, once the marker has come or ``flush`` ran).
    A run's stderr passes on all but what could be the marker's beginning; with ``hold`` (a
    shell's terminal) nothing is passed on until the marker has come: the caller then shows
    what was held (``flush``) or starts again."""

    def __init__(self, marker: bytes, hold: bool = False):
        self.marker, self.hold, self.buf, self.seen, self.before = marker, hold, b"", False, b""

    def feed(self, chunk: bytes) -> bytes:
        if self.seen:
            return chunk
        self.buf += chunk
        i = self.buf.find(self.marker)
        if i >= 0:
            self.seen = True
            out = self.buf[:i] + self.buf[i + len(self.marker) :]
            self.before += self.buf[:i]
            self.buf = b""
            return out
        if self.hold:
            return b""
        keep = len(self.marker) - 1
        out, self.buf = self.buf[:-keep] if keep else self.buf, self.buf[-keep:] if keep else b""
        self.before += out
        return out

    def flush(self) -> bytes:
        out, self.buf = self.buf, b""
        self.before += out
        return out


class _Stream:
    """One output stream of the run: its filters, saved file, echo and counts."""

    def __init__(self, name: str, log: CappedLog, echo_fd: int | None, filters: list[ChunkFilter],
                 emit_chunks: Callable[[str, bytes], None] | None) -> None:
        self.name, self.log, self.echo_fd, self.filters = name, log, echo_fd, filters
        self.emit_chunks = emit_chunks
        self.bytes = 0
        self.lines = 0
        self.tail = b""

    def feed(self, chunk: bytes) -> bool:
        """Take a chunk read from the pipe; True when anything came out of the filters."""
        for f in self.filters:
            chunk = f.feed(chunk)
        return self._out(chunk)

    def finish(self) -> bool:
        data = b""
        for f in self.filters:
            data = f.feed(data) + f.flush() if data else f.flush()
        changed = self._out(data)
        if self.tail and not self.tail.endswith(b"\n"):
            self.lines += 1  # the last line, without its newline
            changed = True
        self.log.close()
        return changed

    def _out(self, data: bytes) -> bool:
        if not data:
            return False
        self.log.write(data)
        if self.echo_fd is not None:
            try:
                write_all(self.echo_fd, data)
            except OSError:
                self.echo_fd = None  # our own stdout went away; the saved file still has everything
        self.bytes += len(data)
        self.lines += len(data.translate(None, _NOT_NEWLINE))
        self.tail = data[-_TAIL_KEEP:] if len(data) >= _TAIL_KEEP else (self.tail + data)[-_TAIL_KEEP:]
        if self.emit_chunks is not None:
            self.emit_chunks(self.name, data)
        return True

    def last_line(self) -> str | None:
        text = self.tail.rstrip(b"\r\n")
        cut = max(text.rfind(b"\n"), text.rfind(b"\r"))
        line = text[cut + 1:].decode("utf-8", "replace").strip()
        return line[:LAST_LINE_CHARS] or None

    def summary(self) -> dict[str, int]:
        return {"bytes": self.bytes, "lines": self.lines, "dropped": self.log.dropped}


def _end_of(spec: RunSpec) -> tuple[float, str | None]:
    """Which end comes first (monotonic clock), and what it is called: timeout or lifetime."""
    now_wall, now_mono = time.time(), time.monotonic()
    end_at, end_kind = math.inf, None
    if spec.timeout_s is not None:
        end_at, end_kind = now_mono + spec.timeout_s, "timeout"
    if spec.deadline is not None and now_mono + (spec.deadline - now_wall) < end_at:
        end_at, end_kind = now_mono + (spec.deadline - now_wall), "ttl"
    return end_at, end_kind


def run_blocking(spec: RunSpec, *, on_event: Callable[[RunEvent], None] | None = None,
                 kill_grace_s: float = KILL_GRACE_S, forward_signals: bool = False,
                 support: cgroups.Support | None = None, output_events: bool = False,
                 cancel: Canceller | None = None,
                 on_stopped: Callable[[RunResult], None] | None = None) -> RunResult:
    """Run ``spec.argv`` isolated, in this thread; return when every process of the run is
    gone and the saved output files are complete. ``forward_signals`` (main thread only):
    SIGINT, SIGTERM and SIGHUP sent to petri are passed to the command; a second one of the
    same kind kills the run. ``cancel``: another thread may stop the run (it returns, ended
    ``killed``). ``on_stopped``: told how a run that an interrupt (KeyboardInterrupt) cut
    short ended, once its processes are gone and before the interrupt propagates."""
    t0 = time.monotonic()
    sup = support or cgroups.support()
    spec.stdout_path.parent.mkdir(parents=True, exist_ok=True)
    spec.stderr_path.parent.mkdir(parents=True, exist_ok=True)
    end_at, end_kind = _end_of(spec)
    if end_kind is not None and end_at <= time.monotonic():
        CappedLog(spec.stdout_path, spec.log_cap).close()
        CappedLog(spec.stderr_path, spec.log_cap).close()
        res = RunResult(EXIT_TIMEOUT, 0.0, end_kind, [], None, sup.mode,
                        output={k: {"bytes": 0, "lines": 0, "dropped": 0} for k in ("stdout", "stderr")})
        if on_event:
            on_event(RunEvent("finished", result=res))
        return res

    for attempt in range(1, SETUP_ATTEMPTS + 1):
        res = _attempt(spec, sup, end_at, end_kind, kill_grace_s, forward_signals, t0,
                       on_event if attempt == 1 else _no_warnings(on_event), output_events, cancel, on_stopped)
        if attempt == SETUP_ATTEMPTS or not _mount_table_moved(res) or (cancel is not None and cancel.cancelled):
            break
        pause_before_start(attempt)
    if on_event:
        on_event(RunEvent("finished", result=res))
    return res


async def run_isolated(spec: RunSpec, *, on_event: Callable[[RunEvent], None] | None = None,
                       kill_grace_s: float = KILL_GRACE_S, support: cgroups.Support | None = None,
                       output_events: bool = False,
                       on_stopped: Callable[[RunResult], None] | None = None) -> RunResult:
    """``run_blocking`` for trio: the run's loop in a thread of its own (not trio's pool,
    which a race would exhaust), its events delivered in this loop's thread. Cancelling
    this task stops the run (SIGTERM, SIGKILL after ``kill_grace_s``) and re-raises once its
    processes are gone, after telling ``on_stopped`` how it ended (in this thread)."""
    import trio

    cancel = Canceller()
    emit = None
    if on_event is not None:
        token = trio.lowlevel.current_trio_token()

        def emit(ev: RunEvent) -> None:
            try:
                trio.from_thread.run_sync(on_event, ev, trio_token=token)
            except trio.RunFinishedError:
                pass

    finished = threading.Event()
    ended: list[RunResult] = []

    def body() -> RunResult:
        try:
            res = run_blocking(spec, on_event=emit, kill_grace_s=kill_grace_s, support=support,
                               output_events=output_events, cancel=cancel)
            ended.append(res)
            return res
        finally:
            finished.set()

    limiter = trio.CapacityLimiter(math.inf)
    try:
        return await trio.to_thread.run_sync(body, abandon_on_cancel=True, limiter=limiter)
    except BaseException:
        cancel.cancel()
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(finished.wait, limiter=limiter)  # its processes are gone now
        if ended and on_stopped is not None:
            on_stopped(ended[0])
        raise


# bwrap binds the host's / recursively and then remounts each mount it copied read-only.
# A mount that another process removes in between (another petri's per-run view of a
# sandbox tree ending: orchestrator.sandbox.run_view) makes that remount fail, and bwrap
# exits before the command starts ("Can't bind mount /oldroot/ on /newroot/: Unable to
# apply mount flags: remount ...": seen with three race checks starting at once, and
# reproduced with bwrap alone against a loop of mounts coming and going). Nothing of the
# command ran (the marker was not seen), so starting again is safe; the chance that it hits
# the same instant again is small (each start waits a few random milliseconds more), and a
# fifth failure is reported as it is.
# The same holds for what the sandbox masks: a host socket (/proc/net/unix) or a credential
# path read when the run was prepared and gone from the host before bwrap bound over it
# makes bwrap try to create it on the read-only root ("Can't create file at PATH: Read-only
# file system", "Can't mkdir PATH"), or to remount a bind whose host path went away
# ("Can't remount readonly on /newroot/PATH: realpath(destination): No such file or
# directory": a home another process removed); a new start reads the host again. Only when
# PATH is really gone now: a path that is there failed for another reason, reported as it is.
SETUP_ATTEMPTS = 5
_MOVED = re.compile(r"Can't bind mount /oldroot/ on /newroot/: Unable to apply mount flags: remount")
_VANISHED = re.compile(r"Can't (?:create file at|mkdir parents for|mkdir) (/[^:\n]*): "
                       r"(?:Read-only file system|Permission denied)"
                       r"|Can't remount readonly on /newroot(/[^:\n]*): realpath\(destination\): No such file")


def _mount_table_moved(res: RunResult) -> bool:
    return res.exit_code == EXIT_PETRI and setup_moved(res.setup_error or "")


def pause_before_start(attempt: int) -> None:
    """Before start ``attempt + 1`` of one whose mount table moved: apart in time from whatever
    moved it (mounts churned by runs that started together tend to move together: a full test
    run met three starts in a row at load), a few random milliseconds more each time."""
    time.sleep(random.uniform(0.005, 0.02) * attempt)


def setup_moved(err: str) -> bool:
    """True when bwrap's own words ``err`` (what it said before the command started) say the
    host's mounts moved under the start: worth a new start (``SETUP_ATTEMPTS``)."""
    if _MOVED.search(err) is not None:
        return True
    gone = _VANISHED.search(err)
    if gone is not None:
        return not os.path.lexists(gone.group(1) or gone.group(2))
    # Any other mount step bwrap could not take ("bwrap: Can't bind mount / remount / mount
    # tmpfs ..."): the host's mount table or a path in it moved under a run starting beside
    # other runs (CI's parallel suite met a new variant every few runs). The command has not
    # started; a deterministic failure fails again and is reported as it is, four starts later.
    return err.startswith("bwrap: Can't ")


def _no_warnings(on_event: Callable[[RunEvent], None] | None) -> Callable[[RunEvent], None] | None:
    """A retried start's events without the setup warnings the first one already gave."""
    if on_event is None:
        return None

    def forward(ev: RunEvent) -> None:
        if ev.kind != "warning":
            on_event(ev)
    return forward


def _attempt(spec: RunSpec, sup: cgroups.Support, end_at: float, end_kind: str | None, kill_grace_s: float,
             forward_signals: bool, t0: float, on_event: Callable[[RunEvent], None] | None, output_events: bool,
             cancel: Canceller | None, on_stopped: Callable[[RunResult], None] | None) -> RunResult:
    """One start of the run, to its end (the output files begin empty)."""
    marker = isolation.new_marker()
    # Read per run: a handler may have been set to SIG_IGN since the last one.
    with prepare(spec, argv=spec.argv, marker=marker, new_session=True, support=sup,
                 reset_signals=bool(ignored_signals())) as prep:
        for w in prep.warnings:
            if on_event:
                on_event(RunEvent("warning", data=w.encode()))
        run = _Run(spec, prep, marker, on_event, output_events)
        try:
            run.supervise(end_at, end_kind, kill_grace_s, forward_signals, cancel)
        except KeyboardInterrupt:
            run.reap()
            if run.proc is not None and on_stopped is not None:
                run.stopped("killed", interrupts.exit_code())  # 128 + the signal that stopped petri
                on_stopped(run.result(time.monotonic() - t0, sup.mode, prep.warnings))
            raise
        finally:
            run.reap()
    return run.result(time.monotonic() - t0, sup.mode, prep.warnings)


class _Run:
    """One started run: its process, its cgroup, its streams, how it ended."""

    def __init__(self, spec: RunSpec, prep: Prepared, marker: bytes, on_event: Callable[[RunEvent], None] | None,
                 output_events: bool):
        self.spec, self.prep, self.cg, self.on_event = spec, prep, prep.cgroup, on_event
        self.output_events = output_events and on_event is not None
        self.marker_filter = MarkerFilter(marker)
        self.proc: ChildProcess | None = None
        self.killed_by: str | None = None
        self.exit_code: int | None = None  # what a run petri ended reports (124, 128 + a signal)
        self.exited = False
        self.reaped = False
        self.grace_until: float | None = None
        self.kill_grace_s = KILL_GRACE_S
        self.all_gone = True
        self.stats = cgroups.Stats()
        self.streams: dict[int, _Stream] = {}
        self.by_name: dict[str, _Stream] = {}
        self.last_stream: str | None = None

    def spawn(self) -> ChildProcess:

        argv = self.prep.argv
        try:
            with thread_in_netns(self.prep.netns):
                proc = open_process_here(argv, stdin=PIPE if self.spec.stdin_data is not None else DEVNULL,
                                         stdout=PIPE, stderr=PIPE, env=self.prep.env, pass_fds=self.prep.pass_fds)
        except OSError as e:
            raise SandboxSetupFailed(detail=f"cannot start {argv[0]!r}: {e.strerror}") from e
        finally:
            self.prep.spawned()
        self.proc = proc
        if self.on_event:
            self.on_event(RunEvent("started", pid=proc.pid))
        return proc

    def _open_streams(self, proc: ChildProcess) -> None:
        spec = self.spec
        chunks = self._emit_chunk if self.output_events else None
        for name, fd, path, echo_fd, filters in (
                ("stdout", proc.stdout, spec.stdout_path, 1, []),
                ("stderr", proc.stderr, spec.stderr_path, 2, [self.marker_filter])):
            assert fd is not None
            try:
                import fcntl
                fcntl.fcntl(fd, _F_SETPIPE_SZ, PIPE_BYTES)
            except OSError:
                pass  # over pipe-max-size or the user's pipe budget: the default size works too
            extra = [make(name) for make in spec.output_filters]
            s = _Stream(name, CappedLog(path, spec.log_cap), echo_fd if spec.echo else None, filters + extra, chunks)
            self.streams[fd] = s
            self.by_name[name] = s

    def _emit_chunk(self, stream: str, data: bytes) -> None:
        assert self.on_event is not None
        self.on_event(RunEvent("output", stream, data))

    def progress(self) -> OutputProgress:
        out, err = self.by_name.get("stdout"), self.by_name.get("stderr")
        line = None
        stream = self.last_stream
        order = [self.by_name[stream]] if stream in self.by_name else []
        order += [s for s in (out, err) if s is not None and s.name != stream]
        for s in order:
            line = s.last_line()
            if line is not None:
                stream = s.name
                break
        return OutputProgress(stdout_bytes=out.bytes if out else 0, stdout_lines=out.lines if out else 0,
                              stderr_bytes=err.bytes if err else 0, stderr_lines=err.lines if err else 0,
                              stream=stream, line=line)

    def supervise(self, end_at: float, end_kind: str | None, kill_grace_s: float, forward_signals: bool,
                  cancel: Canceller | None) -> None:
        """Start the run, copy its output, end it at ``end_at``; return when bwrap is gone and
        both streams are at their end."""
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        old_handlers: dict[int, Any] = {}
        old_wakeup: int | None = None
        try:
            if forward_signals and threading.current_thread() is threading.main_thread():
                # The handlers do nothing; the signal's number arrives on the wakeup pipe.
                for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                    old_handlers[sig] = signal.signal(sig, _ignore_here)
                old_wakeup = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
            if cancel is not None:
                cancel.attach(wake_w)
            self.kill_grace_s = kill_grace_s
            proc = self.spawn()
            self._open_streams(proc)
            self._loop(proc, wake_r, end_at, end_kind, cancel)
        finally:
            if cancel is not None:
                cancel.attach(None)
            if old_wakeup is not None:
                signal.set_wakeup_fd(old_wakeup)
            for sig, h in old_handlers.items():
                signal.signal(sig, h)
            for s in self.streams.values():
                if s.log.fd is not None:
                    s.log.close()  # an interrupted run's files hold what it wrote
            os.close(wake_r)
            os.close(wake_w)

    def _loop(self, proc: ChildProcess, wake_r: int, end_at: float, end_kind: str | None,
              cancel: Canceller | None) -> None:
        poller = select.poll()
        IN = select.POLLIN | select.POLLHUP | select.POLLERR
        for fd in self.streams:
            poller.register(fd, IN)
        poller.register(wake_r, select.POLLIN)
        if proc.pidfd is not None:
            poller.register(proc.pidfd, select.POLLIN)
        stdin = memoryview(self.spec.stdin_data or b"")
        if proc.stdin is not None:
            os.set_blocking(proc.stdin, False)
            poller.register(proc.stdin, select.POLLOUT)
        open_streams = set(self.streams)
        dirty = False
        next_tick = time.monotonic() + PROGRESS_S
        counts: dict[int, int] = {}
        while open_streams or not self.exited:
            now = time.monotonic()
            wake_at = min(end_at, self.grace_until if self.grace_until is not None else math.inf,
                          next_tick if dirty else math.inf)
            if not self.exited and proc.pidfd is None:
                wake_at = min(wake_at, now + 0.05)  # an old kernel: no pidfd, poll the child
            timeout = None if wake_at == math.inf else max(0, math.ceil((wake_at - now) * 1000))
            for fd, _ in poller.poll(timeout):
                s = self.streams.get(fd)
                if s is not None:
                    chunk = os.read(fd, READ_BYTES)
                    if chunk:
                        if s.feed(chunk):
                            dirty = True
                            self.last_stream = s.name
                        continue
                    poller.unregister(fd)
                    open_streams.discard(fd)
                    proc.close_fd(fd)
                    dirty = s.finish() or dirty
                elif fd == wake_r:
                    self._woken(wake_r, counts, cancel)
                elif fd == proc.stdin:
                    stdin = self._feed_stdin(proc, poller, stdin)
                elif fd == proc.pidfd:
                    poller.unregister(fd)
                    proc.close_fd(fd)
            if not self.exited and proc.poll() is not None:
                self.exited = True
                # The namespace is gone with bwrap; anything left in the cgroup goes now, so
                # the pipes reach EOF.
                if not self.nothing_to_kill() and not self.settled():
                    self.kill_everything()
            now = time.monotonic()
            if not self.exited and now >= end_at:
                end_at = math.inf
                assert end_kind is not None
                self.stop(end_kind, EXIT_TIMEOUT)
            if not self.exited and self.grace_until is not None and now >= self.grace_until:
                self.grace_until = None
                self.kill_everything()
            if dirty and now >= next_tick:
                dirty = False
                next_tick = now + PROGRESS_S
                if self.on_event:
                    self.on_event(RunEvent("progress", progress=self.progress()))
        if dirty and self.on_event:
            self.on_event(RunEvent("progress", progress=self.progress()))

    def stop(self, why: str, code: int, *, grace: bool = True) -> None:
        """End the run on petri's side (``why``: timeout, ttl, killed; ``code``: what it then
        reports): SIGTERM to its processes but bwrap (whose init in the pid namespace ignores
        it), SIGKILL after the grace period; at once without ``grace`` or a cgroup. A run that
        already ended by itself keeps its own end."""
        if self.exited:
            return
        if self.killed_by is None:
            self.killed_by, self.exit_code = why, code
        if grace and self.cg is not None and self.proc is not None:
            if self.grace_until is None:
                self.cg.signal_all(signal.SIGTERM, exclude=(self.proc.pid,))
                self.grace_until = time.monotonic() + self.kill_grace_s
        else:
            self.grace_until = None
            self.kill_everything()

    def stopped(self, why: str, code: int) -> None:
        """A run an exception cut short (its processes are gone): how it ended."""
        if self.killed_by is None:
            self.killed_by, self.exit_code = why, code

    def _woken(self, wake_r: int, counts: dict[int, int], cancel: Canceller | None) -> None:
        try:
            got = os.read(wake_r, 64)
        except BlockingIOError:
            return
        for sig in got:
            if sig == 0:
                if cancel is not None and cancel.cancelled:
                    self.stop("killed", EXIT_STOPPED)  # a request to stop: TERM, then KILL
                continue
            if sig not in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                continue
            counts[sig] = counts.get(sig, 0) + 1
            # Before the command exists (the shim's marker not seen yet) there is no one
            # to pass it to: the user asked to stop, so stop. A second one means "now".
            if counts[sig] > 1 or self.cg is None or not self.marker_filter.seen:
                self.stop("killed", 128 + sig, grace=False)
            else:
                assert self.proc is not None
                self.cg.signal_all(sig, exclude=(self.proc.pid,))

    def _feed_stdin(self, proc: ChildProcess, poller: select.poll, data: memoryview) -> memoryview:
        assert proc.stdin is not None
        try:
            data = data[os.write(proc.stdin, data[:65536]):] if data else data
        except BlockingIOError:
            return data
        except OSError as e:
            if e.errno not in (errno.EPIPE, errno.EBADF):
                raise
            data = data[len(data):]  # the command did not read it all; that is its business
        if not data:
            poller.unregister(proc.stdin)
            proc.close_fd(proc.stdin)
        return data

    def nothing_to_kill(self) -> bool:
        # The usual end: bwrap exited and its pid namespace took everything with it. Reading
        # the cgroup's member lists is a few cheap cgroupfs reads.
        if self.proc is not None and self.proc.returncode is None:
            return False
        return self.cg is None or not self.cg.pids()

    def settled(self, wait_s: float = SETTLE_S) -> bool:
        """After bwrap exited: does the cgroup empty by itself within ``wait_s``? The pid
        namespace's processes are dead already but can stay listed for a few milliseconds;
        the kill loop (a freeze, a kill, a thaw, a sleep) costs more than waiting for them."""
        end = time.monotonic() + wait_s
        while time.monotonic() < end:
            time.sleep(0.0005)
            if self.nothing_to_kill():
                return True
        return False

    def kill_everything(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
        if self.cg is not None:
            self.all_gone = self.cg.kill_all() and self.all_gone

    def reap(self) -> None:
        """Always, at the end: nothing of the run is left, its counters are read."""
        if self.reaped:
            return
        self.reaped = True
        if not self.nothing_to_kill():
            self.kill_everything()
        if self.proc is not None:
            self.proc.wait()
            self.proc.close()
        if self.cg is not None:
            self.stats = self.cg.stats()

    def result(self, duration_s: float, mode: str, warnings: list[str]) -> RunResult:
        assert self.proc is not None and self.proc.returncode is not None
        rc = self.proc.returncode
        rc = 128 - rc if rc < 0 else rc  # bwrap itself killed by a signal
        setup_error = None
        killed_by = self.killed_by
        if killed_by is not None:
            assert self.exit_code is not None
            code = self.exit_code  # 124 (timeout, ttl), 128 + the signal that stopped it (killed)
        elif not self.marker_filter.seen:
            code = EXIT_PETRI
            setup_error = self.marker_filter.before.decode("utf-8", "replace").strip() or f"bwrap exited {rc}"
        elif self.stats.oom_kills and rc != 0:
            code, killed_by = EXIT_MEMORY, "memory"
        else:
            code = rc
        if not self.all_gone:
            warnings = [*warnings, f"cgroup {self.spec.cgroup_name} still had processes after the kill loop"]
        return RunResult(exit_code=code, duration_s=duration_s, killed_by=killed_by,
                         limits_hit=self.stats.limits_hit, peak_memory_bytes=self.stats.peak_memory_bytes,
                         cgroup_mode=mode, warnings=tuple(warnings), setup_error=setup_error,
                         cpu_time_s=self.stats.cpu_usage_s,
                         output={name: s.summary() for name, s in self.by_name.items()})


def _ignore_here(signum: int, frame: Any) -> None:
    """A forwarded signal's Python handler: the loop reads its number from the wakeup fd."""
