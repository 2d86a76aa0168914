"""Run one command isolated in a sandbox: bwrap + limits + output + timeouts (trio).

``run_isolated(spec)`` does, in order:

1. build the sandbox plan (``isolation``) and the run's cgroup with its limits
   (``cgroups``; rlimits with warnings where there is none); the plan's syscall filter
   (``seccomp``) goes to bwrap on a pipe (``--seccomp FD``);
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
import shutil
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import trio

from orchestrator.sandbox import cgroups, isolation, seccomp
from orchestrator.sandbox.cgexec import DropTo, ignored_signals, wrapper_argv
from orchestrator.limits import Limits
from orchestrator.errors import BwrapMissing, RunUserInvalid, SandboxSetupFailed
from orchestrator.sandbox.spawn import DEVNULL, PIPE, ChildProcess, open_process_here

__all__ = ["RunSpec", "RunResult", "RunEvent", "run_isolated", "detect_cgroup_mode", "sweep_cgroups"]

detect_cgroup_mode = cgroups.detect_cgroup_mode
sweep_cgroups = cgroups.sweep_cgroups

EXIT_TIMEOUT = 124
EXIT_PETRI = 125
EXIT_MEMORY = 137
KILL_GRACE_S = 2.0
WRAPPER_ENV = {"PATH": isolation.DEFAULT_PATH, "LANG": "C.UTF-8"}


@dataclass(frozen=True)
class RunSpec:
    workspace: Path  # live workspace, absolute: the tree is bound read-write here inside
    tree: Path  # the sandbox's tree on the host
    store: Path  # <workspace>/.petri: masked inside
    argv: list[str] | list[bytes]
    cwd: Path  # absolute, as seen inside (under workspace)
    env: dict[str, str]  # extra variables on top of PATH, HOME, LANG, TERM
    limits: Limits  # the cgroup takes mem, cpus, pids; the plan net; disk and ttl are the caller's
    timeout_s: float | None
    deadline: float | None  # absolute time.time() of the sandbox's lifetime end
    stdout_path: Path
    stderr_path: Path
    uid: int
    gid: int
    cgroup_name: str  # unique, e.g. petri/<sb-id>/run-3
    stdin_data: bytes | None = None
    echo: bool = True
    extra_masks: tuple[Path, ...] = ()
    seccomp: str = "default"  # the syscall filter's profile (orchestrator.seccomp)
    # The host uid/gid the command runs as when not ``uid``/``gid`` (uid 0 inside a user
    # namespace that is an unprivileged account outside: ``orchestrator.run_as``).
    host_ids: tuple[int, int] | None = None
    allow_sockets: tuple[Path, ...] = ()  # host sockets a --net run may reach (config)
    tmp_bytes: int = 1 << 30  # the size of the sandbox's /tmp (and /dev/shm) tmpfs


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


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return str(sig)


def resolve_identity(uid: int, gid: int) -> DropTo | None:
    """Whom the wrapper must become before bwrap: None when that is us already."""
    me = os.geteuid()
    if uid == me:
        return None
    if me != 0:
        raise RunUserInvalid(uid=uid, why=f"petri runs as uid {me}, not root, so it can only run commands as itself")
    return DropTo(uid, gid)


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
    warnings: list[str] = []
    spec.stdout_path.parent.mkdir(parents=True, exist_ok=True)
    spec.stderr_path.parent.mkdir(parents=True, exist_ok=True)

    # Which end comes first, and what it is called.
    now_wall, now_trio = time.time(), trio.current_time()
    end_at, end_kind = math.inf, None
    if spec.timeout_s is not None:
        end_at, end_kind = now_trio + spec.timeout_s, "timeout"
    if spec.deadline is not None and now_trio + (spec.deadline - now_wall) < end_at:
        end_at, end_kind = now_trio + (spec.deadline - now_wall), "ttl"
    if end_kind is not None and end_at <= now_trio:
        spec.stdout_path.write_bytes(b"")
        spec.stderr_path.write_bytes(b"")
        res = RunResult(EXIT_TIMEOUT, 0.0, end_kind, [], None, sup.mode)
        if on_event:
            on_event(RunEvent("finished", result=res))
        return res

    bwrap = shutil.which(isolation.BWRAP)
    if bwrap is None:
        raise BwrapMissing()
    drop_to = resolve_identity(*(spec.host_ids or (spec.uid, spec.gid)))
    marker = isolation.new_marker()
    plan = isolation.plan_for_run(
        workspace=spec.workspace,
        tree=spec.tree,
        store=spec.store,
        argv=spec.argv,
        cwd=spec.cwd,
        env=isolation.base_env(spec.uid, spec.env),
        uid=spec.uid,
        gid=spec.gid,
        net=spec.limits.net,
        tmp_bytes=spec.tmp_bytes,
        extra_masks=spec.extra_masks,
        allow_sockets=spec.allow_sockets,
        new_session=True,
        marker=marker,
        seccomp=spec.seccomp,
    )
    killed_by: str | None = None
    proc: ChildProcess | None = None
    marker_filter = _MarkerFilter(marker)
    stats = cgroups.Stats()
    out_f = open(spec.stdout_path, "wb")
    err_f = open(spec.stderr_path, "wb")
    rlimits = None
    try:
        cg = cgroups.open_cgroup(spec.cgroup_name, spec.limits, sup)
    except BaseException as e:
        out_f.close()
        err_f.close()
        if isinstance(e, cgroups.CgroupFailure):
            raise SandboxSetupFailed(detail=str(e)) from e
        raise
    if cg is None:
        rlimits, warnings = cgroups.rlimit_fallback(spec.limits)
        for w in warnings:
            if on_event:
                on_event(RunEvent("warning", data=w.encode()))
    all_gone = True

    def nothing_to_kill() -> bool:
        # The usual end: bwrap exited and its pid namespace took everything with it. Reading
        # the cgroup's member lists is a few cheap cgroupfs reads, done in the loop; only
        # a real kill (which polls and sleeps) needs a thread.
        if proc is not None and proc.returncode is None:
            return False
        return cg is None or not cg.pids()

    async def kill_everything_async() -> None:
        if not nothing_to_kill():
            await trio.to_thread.run_sync(kill_everything)

    def kill_everything() -> None:
        nonlocal all_gone
        if proc is not None and proc.returncode is None:
            try:
                os.kill(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if cg is not None:
            all_gone = cg.kill_all() and all_gone

    async def pump(stream: trio.abc.ReceiveStream, f, echo_fd: int, name: str) -> None:
        lines = _LineSplitter(name, on_event)
        filt = marker_filter if name == "stderr" else None
        async with stream:
            while True:
                chunk = await stream.receive_some(65536)
                data = filt.feed(chunk) if filt else chunk
                if not chunk:
                    data = filt.close() if filt else b""
                if data:
                    f.write(data)
                    f.flush()
                    if spec.echo:
                        _write_all(echo_fd, data)
                    lines.feed(data)
                if not chunk:
                    break
        lines.close()

    async def feed_stdin(stream: trio.abc.SendStream, data: bytes) -> None:
        async with stream:
            try:
                await stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass  # the command did not read it all; that is its business

    interrupted: int | None = None

    async def forward(task_status=trio.TASK_STATUS_IGNORED) -> None:
        nonlocal interrupted
        counts: dict[int, int] = {}
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as sigs:
            task_status.started()
            async for sig in sigs:
                counts[sig] = counts.get(sig, 0) + 1
                # Before the command exists (the shim's marker not seen yet) there is no one
                # to pass it to: the user asked to stop, so stop. A second one means "now".
                if counts[sig] > 1 or cg is None or not marker_filter.seen:
                    interrupted = sig
                    await trio.to_thread.run_sync(kill_everything)
                else:
                    assert proc is not None
                    cg.signal_all(sig, exclude=(proc.pid,))

    try:
        # From here on the cgroup exists: everything below is inside the cleanup's try.
        filter_fd = seccomp.filter_fd(plan.seccomp, net=plan.net)
        argv = wrapper_argv(
            isolation.bwrap_argv(plan, bwrap=bwrap, seccomp_fd=filter_fd),
            procs_files=cg.procs_files() if cg else (),
            rlimits=rlimits,
            drop_to=drop_to,
            # Read per run: a handler may have been set to SIG_IGN since the last one.
            reset_signals=bool(ignored_signals()),
        )
        try:
            # Forked from this (the loop's) thread, never a worker thread: see spawn.py.
            proc = open_process_here(
                argv,
                stdin=_stdin_arg(spec.stdin_data),
                stdout=PIPE,
                stderr=PIPE,
                env=WRAPPER_ENV,
                pass_fds=seccomp.pass_fds(filter_fd),
            )
        except OSError as e:
            raise SandboxSetupFailed(detail=f"cannot start {argv[0]!r}: {e.strerror}") from e
        finally:
            seccomp.close_fd(filter_fd)  # the child has its copy (bwrap reads it to EOF)
        if on_event:
            on_event(RunEvent("started", pid=proc.pid))
        async with trio.open_nursery() as nursery:
            assert proc.stdout is not None and proc.stderr is not None
            nursery.start_soon(pump, proc.stdout, out_f, 1, "stdout")
            nursery.start_soon(pump, proc.stderr, err_f, 2, "stderr")
            if spec.stdin_data is not None:
                assert proc.stdin is not None
                nursery.start_soon(feed_stdin, proc.stdin, spec.stdin_data)
            fwd_scope = trio.CancelScope()
            if forward_signals and threading.current_thread() is threading.main_thread():

                async def _fwd(task_status=trio.TASK_STATUS_IGNORED):
                    with fwd_scope:
                        await forward(task_status=task_status)

                await nursery.start(_fwd)
            with trio.CancelScope(deadline=end_at) as scope:
                await proc.wait()
            if scope.cancelled_caught:
                killed_by = end_kind
                if cg is not None:
                    cg.signal_all(signal.SIGTERM, exclude=(proc.pid,))
                    with trio.move_on_after(kill_grace_s):
                        await proc.wait()
                await trio.to_thread.run_sync(kill_everything)
                await proc.wait()
            # The namespace is gone with bwrap; anything left in the cgroup goes now, so the
            # pipes reach EOF and the pumps finish.
            await kill_everything_async()
            fwd_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await kill_everything_async()
            if proc is not None:
                await proc.wait()
            if cg is not None:
                stats = cg.stats()
                try:
                    cg.remove()
                except cgroups.CgroupFailure as e:
                    warnings.append(str(e))
            out_f.close()
            err_f.close()

    assert proc is not None and proc.returncode is not None
    rc = proc.returncode
    rc = 128 - rc if rc < 0 else rc  # bwrap itself killed by a signal
    setup_error = None
    if killed_by is not None:
        code = EXIT_TIMEOUT
    elif interrupted is not None:
        code = 128 + interrupted  # the shell's convention for "ended by this signal"
    elif not marker_filter.seen:
        code = EXIT_PETRI
        setup_error = marker_filter.before.decode("utf-8", "replace").strip() or f"bwrap exited {rc}"
    elif stats.oom_kills and rc != 0:
        code, killed_by = EXIT_MEMORY, "memory"
    else:
        code = rc
    if not all_gone:
        warnings.append(f"cgroup {spec.cgroup_name} still had processes after the kill loop")
    res = RunResult(
        exit_code=code,
        duration_s=time.monotonic() - t0,
        killed_by=killed_by,
        limits_hit=stats.limits_hit,
        peak_memory_bytes=stats.peak_memory_bytes,
        cgroup_mode=sup.mode,
        warnings=tuple(warnings),
        setup_error=setup_error,
        cpu_time_s=stats.cpu_usage_s,
    )
    if on_event:
        on_event(RunEvent("finished", result=res))
    return res


def _stdin_arg(data: bytes | None) -> int:
    return PIPE if data is not None else DEVNULL


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except BlockingIOError:
            time.sleep(0.001)
            continue
        except OSError:
            return  # our own stdout went away; the saved file still has everything
        view = view[n:]
