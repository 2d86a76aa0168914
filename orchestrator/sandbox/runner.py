"""Run one command isolated in a sandbox: bwrap + limits + output + timeouts (trio).

``run_isolated(spec)`` does, in order:

1. ``prepare`` (shared with ``pty_shell``): the sandbox plan (``isolation``), the run's
   cgroup with its limits (``cgroups``; rlimits with warnings where there is none), the
   plan's syscall filter (``seccomp``) on a pipe for bwrap (``--seccomp FD``);
2. start ``cgexec``'s wrapper -> bwrap -> ``/bin/sh -c 'exec "$@"'`` -> the command, in a
   session of its own so the user's Ctrl-C reaches petri, not bwrap (petri forwards it);
3. stream stdout/stderr to the saved files (always) and to our own stdout/stderr (``echo``),
   and feed ``stdin_data``;
4. wait for the command, or for the timeout/lifetime: then SIGTERM to every process in the
   cgroup but bwrap itself (bwrap's init in the pid namespace ignores it: only signals it
   handles reach a namespace's init), a grace period, then SIGKILL through the kill loop;
5. at the end, always: the kill loop over the cgroup (the pid namespace died with its init
   already; this catches anything that did not), read the cgroup's counters, remove it.

Exit code: the command's own; 124 killed by timeout/lifetime; 137 killed by the memory limit
(an OOM kill in the cgroup and a non-zero exit); 125 the sandbox never started (bwrap's
setup failed: the shim's marker never came, see ``isolation.EXEC_SHIM``); 126/127 from
the shim's ``exec``.

Signals (``forward_signals=True``, for ``petri run`` in the main thread): SIGINT, SIGTERM,
SIGHUP sent to petri go to every process of the run except bwrap; the command decides
(usually it exits, e.g. 130). A second one of the same kind, or one that arrives before the
command has started, kills the run: exit 128+signal. Without forwarding, trio's
KeyboardInterrupt or any cancellation kills the run and propagates.

Caveats:
- Echo writes to our stdout/stderr synchronously: a stalled reader of petri's output
  stalls this run's pumps (the saved files are written first, so nothing is lost).
- Without cgroups (mode "none") a timeout cannot give the command a grace period: bwrap is
  SIGKILLed and its pid namespace dies with it.
- A command that exits 137 by itself after an unrelated OOM kill in its cgroup is reported
  as killed by memory.
"""
from __future__ import annotations

import math
import os
import re
import signal
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass
from typing import BinaryIO, Callable

import trio

from orchestrator.errors import SandboxSetupFailed
from orchestrator.sandbox import cgroups, isolation
from orchestrator.sandbox.cgexec import ignored_signals
from orchestrator.sandbox.prepare import (EXIT_MEMORY, EXIT_PETRI, EXIT_TIMEOUT, WRAPPER_ENV, Prepared, RunSpec,
                                          prepare)
from orchestrator.sandbox.spawn import DEVNULL, PIPE, ChildProcess, open_process_here
from snapshot.osutil import write_all

__all__ = ["RunSpec", "RunResult", "RunEvent", "run_isolated", "detect_cgroup_mode", "sweep_cgroups",
           "EXIT_TIMEOUT", "EXIT_PETRI", "EXIT_MEMORY", "KILL_GRACE_S"]

detect_cgroup_mode = cgroups.detect_cgroup_mode
sweep_cgroups = cgroups.sweep_cgroups

KILL_GRACE_S = 2.0


@dataclass(frozen=True)
class RunResult:
    exit_code: int
    duration_s: float
    killed_by: str | None  # 'timeout' | 'ttl' | 'memory' | None
    limits_hit: list[str]
    peak_memory_bytes: int | None
    cgroup_mode: str = "none"
    warnings: tuple[str, ...] = ()
    setup_error: str | None = None  # bwrap's own words when exit_code is 125
    cpu_time_s: float | None = None  # CPU the run's cgroup used


@dataclass(frozen=True)
class RunEvent:
    """``started`` (pid), ``output`` (stream, one line as bytes, newline kept), ``warning``
    (data), ``finished`` (result). Called synchronously from the run's task: keep it quick."""

    kind: str
    stream: str | None = None
    data: bytes = b""
    pid: int | None = None
    result: RunResult | None = None


class _LineSplitter:
    def __init__(self, stream: str, emit: Callable[[RunEvent], None] | None):
        self.stream, self.emit, self.buf = stream, emit, b""

    def feed(self, chunk: bytes) -> None:
        if self.emit is None:
            return
        self.buf += chunk
        *lines, self.buf = self.buf.split(b"\n")
        for line in lines:
            self.emit(RunEvent("output", self.stream, line + b"\n"))

    def close(self) -> None:
        if self.emit is not None and self.buf:
            self.emit(RunEvent("output", self.stream, self.buf))
            self.buf = b""


class _MarkerFilter:
    """Strips the shim's start marker from stderr; whatever came before it is bwrap's."""

    def __init__(self, marker: bytes):
        self.marker, self.buf, self.seen, self.before = marker, b"", False, b""

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
        keep = len(self.marker) - 1
        out, self.buf = self.buf[:-keep] if keep else self.buf, self.buf[-keep:] if keep else b""
        self.before += out
        return out

    def close(self) -> bytes:
        out, self.buf = self.buf, b""
        self.before += out
        return out


def _end_of(spec: RunSpec) -> tuple[float, str | None]:
    """Which end comes first (trio's clock), and what it is called: timeout or lifetime."""
    now_wall, now_trio = time.time(), trio.current_time()
    end_at, end_kind = math.inf, None
    if spec.timeout_s is not None:
        end_at, end_kind = now_trio + spec.timeout_s, "timeout"
    if spec.deadline is not None and now_trio + (spec.deadline - now_wall) < end_at:
        end_at, end_kind = now_trio + (spec.deadline - now_wall), "ttl"
    return end_at, end_kind


async def run_isolated(
    spec: RunSpec,
    *,
    on_event: Callable[[RunEvent], None] | None = None,
    kill_grace_s: float = KILL_GRACE_S,
    forward_signals: bool = False,
    support: cgroups.Support | None = None,
) -> RunResult:
    """Run ``spec.argv`` isolated; return when every process of the run is gone and the
    saved output files are complete. ``forward_signals`` (main thread only): SIGINT, SIGTERM
    and SIGHUP sent to petri are passed to the command instead of raising here; a second one
    of the same kind kills the run. Cancelling this task kills the run and re-raises."""
    t0 = time.monotonic()
    sup = support or cgroups.support()
    spec.stdout_path.parent.mkdir(parents=True, exist_ok=True)
    spec.stderr_path.parent.mkdir(parents=True, exist_ok=True)
    end_at, end_kind = _end_of(spec)
    if end_kind is not None and end_at <= trio.current_time():
        spec.stdout_path.write_bytes(b"")
        spec.stderr_path.write_bytes(b"")
        res = RunResult(EXIT_TIMEOUT, 0.0, end_kind, [], None, sup.mode)
        if on_event:
            on_event(RunEvent("finished", result=res))
        return res

    for attempt in range(1, SETUP_ATTEMPTS + 1):
        res = await _attempt(spec, sup, end_at, end_kind, kill_grace_s, forward_signals, t0,
                             on_event if attempt == 1 else _no_warnings(on_event))
        if attempt == SETUP_ATTEMPTS or not _mount_table_moved(res):
            break
    if on_event:
        on_event(RunEvent("finished", result=res))
    return res


# bwrap binds the host's / recursively and then remounts each mount it copied read-only.
# A mount that another process removes in between (another petri's per-run view of a
# sandbox tree ending: orchestrator.sandbox.run_view) makes that remount fail, and bwrap
# exits before the command starts ("Can't bind mount /oldroot/ on /newroot/: Unable to
# apply mount flags: remount ...": seen with three race checks starting at once, and
# reproduced with bwrap alone against a loop of mounts coming and going). Nothing of the
# command ran (the marker was not seen), so starting again is safe; the chance that it hits
# the same instant again is small, and a third failure is reported as it is.
SETUP_ATTEMPTS = 3
_MOVED = re.compile(r"Can't bind mount /oldroot/ on /newroot/: Unable to apply mount flags: remount")


def _mount_table_moved(res: RunResult) -> bool:
    return res.exit_code == EXIT_PETRI and _MOVED.search(res.setup_error or "") is not None


def _no_warnings(on_event: Callable[[RunEvent], None] | None) -> Callable[[RunEvent], None] | None:
    """A retried start's events without the setup warnings the first one already gave."""
    if on_event is None:
        return None

    def forward(ev: RunEvent) -> None:
        if ev.kind != "warning":
            on_event(ev)
    return forward


async def _attempt(spec: RunSpec, sup: cgroups.Support, end_at: float, end_kind: str | None, kill_grace_s: float,
                   forward_signals: bool, t0: float, on_event: Callable[[RunEvent], None] | None) -> RunResult:
    """One start of the run, to its end (the output files begin empty)."""
    marker = isolation.new_marker()
    with ExitStack() as files:
        out_f = files.enter_context(open(spec.stdout_path, "wb"))
        err_f = files.enter_context(open(spec.stderr_path, "wb"))
        # Read per run: a handler may have been set to SIG_IGN since the last one.
        with prepare(spec, argv=spec.argv, marker=marker, new_session=True, support=sup,
                     reset_signals=bool(ignored_signals())) as prep:
            for w in prep.warnings:
                if on_event:
                    on_event(RunEvent("warning", data=w.encode()))
            run = _Run(spec, prep, marker, on_event)
            try:
                await run.supervise(out_f, err_f, end_at, end_kind, kill_grace_s, forward_signals)
            finally:
                with trio.CancelScope(shield=True):
                    await run.reap()
    return run.result(time.monotonic() - t0, sup.mode, prep.warnings)


class _Run:
    """One started run: its process, its cgroup, how it ended."""

    def __init__(self, spec: RunSpec, prep: Prepared, marker: bytes, on_event: Callable[[RunEvent], None] | None):
        self.spec, self.prep, self.cg, self.on_event = spec, prep, prep.cgroup, on_event
        self.marker_filter = _MarkerFilter(marker)
        self.proc: ChildProcess | None = None
        self.killed_by: str | None = None
        self.interrupted: int | None = None
        self.all_gone = True
        self.stats = cgroups.Stats()

    def spawn(self) -> ChildProcess:
        argv = self.prep.argv
        try:
            # Forked from this (the loop's) thread, never a worker thread: see spawn.py.
            proc = open_process_here(argv, stdin=_stdin_arg(self.spec.stdin_data), stdout=PIPE, stderr=PIPE,
                                     env=WRAPPER_ENV, pass_fds=self.prep.pass_fds)
        except OSError as e:
            raise SandboxSetupFailed(detail=f"cannot start {argv[0]!r}: {e.strerror}") from e
        finally:
            self.prep.spawned()
        self.proc = proc
        if self.on_event:
            self.on_event(RunEvent("started", pid=proc.pid))
        return proc

    async def supervise(self, out_f: BinaryIO, err_f: BinaryIO, end_at: float, end_kind: str | None,
                        kill_grace_s: float, forward_signals: bool) -> None:
        """Start the run, copy its output, end it at ``end_at``; return when bwrap is gone."""
        proc = self.spawn()
        async with trio.open_nursery() as nursery:
            assert proc.stdout is not None and proc.stderr is not None
            nursery.start_soon(self.pump, proc.stdout, out_f, 1, "stdout")
            nursery.start_soon(self.pump, proc.stderr, err_f, 2, "stderr")
            if self.spec.stdin_data is not None:
                assert proc.stdin is not None
                nursery.start_soon(_feed_stdin, proc.stdin, self.spec.stdin_data)
            fwd_scope = trio.CancelScope()
            if forward_signals and threading.current_thread() is threading.main_thread():

                async def _fwd(task_status=trio.TASK_STATUS_IGNORED):
                    with fwd_scope:
                        await self.forward(task_status=task_status)

                await nursery.start(_fwd)
            with trio.CancelScope(deadline=end_at) as scope:
                await proc.wait()
            if scope.cancelled_caught:
                self.killed_by = end_kind
                if self.cg is not None:
                    self.cg.signal_all(signal.SIGTERM, exclude=(proc.pid,))
                    with trio.move_on_after(kill_grace_s):
                        await proc.wait()
                await trio.to_thread.run_sync(self.kill_everything)
                await proc.wait()
            # The namespace is gone with bwrap; anything left in the cgroup goes now, so the
            # pipes reach EOF and the pumps finish.
            await self.kill_everything_async()
            fwd_scope.cancel()

    def nothing_to_kill(self) -> bool:
        # The usual end: bwrap exited and its pid namespace took everything with it. Reading
        # the cgroup's member lists is a few cheap cgroupfs reads, done in the loop; only
        # a real kill (which polls and sleeps) needs a thread.
        if self.proc is not None and self.proc.returncode is None:
            return False
        return self.cg is None or not self.cg.pids()

    async def kill_everything_async(self) -> None:
        if not self.nothing_to_kill():
            await trio.to_thread.run_sync(self.kill_everything)

    def kill_everything(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            try:
                os.kill(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.cg is not None:
            self.all_gone = self.cg.kill_all() and self.all_gone

    async def reap(self) -> None:
        """Always, at the end: nothing of the run is left, its counters are read."""
        await self.kill_everything_async()
        if self.proc is not None:
            await self.proc.wait()
        if self.cg is not None:
            self.stats = self.cg.stats()

    async def pump(self, stream: trio.abc.ReceiveStream, f: BinaryIO, echo_fd: int, name: str) -> None:
        lines = _LineSplitter(name, self.on_event)
        filt = self.marker_filter if name == "stderr" else None
        async with stream:
            while True:
                chunk = await stream.receive_some(65536)
                data = filt.feed(chunk) if filt else chunk
                if not chunk:
                    data = filt.close() if filt else b""
                if data:
                    f.write(data)
                    f.flush()
                    if self.spec.echo:
                        try:
                            write_all(echo_fd, data)
                        except OSError:
                            pass  # our own stdout went away; the saved file still has everything
                    lines.feed(data)
                if not chunk:
                    break
        lines.close()

    async def forward(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        counts: dict[int, int] = {}
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as sigs:
            task_status.started()
            async for sig in sigs:
                counts[sig] = counts.get(sig, 0) + 1
                # Before the command exists (the shim's marker not seen yet) there is no one
                # to pass it to: the user asked to stop, so stop. A second one means "now".
                if counts[sig] > 1 or self.cg is None or not self.marker_filter.seen:
                    self.interrupted = sig
                    await trio.to_thread.run_sync(self.kill_everything)
                else:
                    assert self.proc is not None
                    self.cg.signal_all(sig, exclude=(self.proc.pid,))

    def result(self, duration_s: float, mode: str, warnings: list[str]) -> RunResult:
        assert self.proc is not None and self.proc.returncode is not None
        rc = self.proc.returncode
        rc = 128 - rc if rc < 0 else rc  # bwrap itself killed by a signal
        setup_error = None
        killed_by = self.killed_by
        if killed_by is not None:
            code = EXIT_TIMEOUT
        elif self.interrupted is not None:
            code = 128 + self.interrupted  # the shell's convention for "ended by this signal"
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
                         cpu_time_s=self.stats.cpu_usage_s)


async def _feed_stdin(stream: trio.abc.SendStream, data: bytes) -> None:
    async with stream:
        try:
            await stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the command did not read it all; that is its business


def _stdin_arg(data: bytes | None) -> int:
    return PIPE if data is not None else DEVNULL


