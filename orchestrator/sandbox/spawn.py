"""Start a child process from the calling thread, and wait for it under trio.

Why not ``trio.lowlevel.open_process``: it forks from one of trio's worker threads, and a
child whose parent-death signal is armed (bwrap ``--die-with-parent`` sets
PR_SET_PDEATHSIG) gets that signal when the *thread* that forked it exits, not the process
(prctl(2): "the parent" is the creating thread). trio retires a worker thread after 10 s
idle, so every sandboxed command was SIGKILLed about 10 s in (DESIGN, "Long runs and the
spawning thread").

Here the fork happens in the thread that runs the trio loop, which is the thread awaiting
the child: it lives at least as long as the run (``runner.run_isolated`` never returns
before its process is reaped), and it dies with petri, which is exactly when the sandbox
must die. ``subprocess.Popen`` uses vfork(2) here (no ``preexec_fn``, no uid change in
Python), so the loop is blocked for about the time of one exec of ``/bin/sh``.

Waiting is a pidfd (Linux >= 5.3) made readable by the kernel when the child exits, as trio
itself does on Linux; the child is reaped with ``waitpid`` after that.

Caveat: a caller that runs trio in a short-lived thread must not let that thread end while
a child is alive; ``run_isolated`` guarantees it by always waiting for its child.
"""
from __future__ import annotations

import os
import signal
import subprocess
from typing import Mapping, Sequence

import trio

PIPE = subprocess.PIPE
DEVNULL = subprocess.DEVNULL


class ChildProcess:
    """A started child: ``pid``, ``returncode`` (None while running), ``stdin`` (a trio
    SendStream or None), ``stdout``/``stderr`` (trio ReceiveStreams or None), ``wait()``."""

    def __init__(self, popen: subprocess.Popen, stdin: trio.lowlevel.FdStream | None,
                 stdout: trio.lowlevel.FdStream | None, stderr: trio.lowlevel.FdStream | None) -> None:
        self._popen = popen
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr
        self._pidfd: int | None = None
        try:
            self._pidfd = os.pidfd_open(popen.pid)
        except (AttributeError, OSError):
            self._pidfd = None  # an old kernel: fall back to polling in wait()

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def returncode(self) -> int | None:
        return self._popen.returncode

    def poll(self) -> int | None:
        return self._popen.poll()

    def send_signal(self, sig: int) -> None:
        if self._popen.returncode is None:
            try:
                os.kill(self._popen.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    async def wait(self) -> int:
        """Wait until the child exits (cancellable); reap it; its return code."""
        while self._popen.returncode is None:
            if self._pidfd is not None:
                await trio.lowlevel.wait_readable(self._pidfd)
                self._popen.wait()  # readable: it exited, so this does not block
            elif self._popen.poll() is None:
                await trio.sleep(0.05)
        self._close_pidfd()
        return self._popen.returncode

    def _close_pidfd(self) -> None:
        if self._pidfd is not None:
            trio.lowlevel.notify_closing(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None

    def __del__(self) -> None:
        if self._pidfd is not None:
            try:
                os.close(self._pidfd)
            except OSError:
                pass


def open_process_here(argv: Sequence[bytes | str], *, stdin: int | None = DEVNULL, stdout: int | None = PIPE,
                      stderr: int | None = PIPE, env: Mapping[str, str] | None = None,
                      start_new_session: bool = True, pass_fds: Sequence[int] = ()) -> ChildProcess:
    """Start ``argv`` now, forking from this thread; ``PIPE`` streams become trio streams.
    ``pass_fds`` stay open in the child under the same numbers (e.g. bwrap's ``--seccomp``
    fd); the caller still owns and closes them.
    Must be called from the thread that runs trio (it needs no await: nothing blocks)."""
    trio.lowlevel.current_trio_token()  # only from inside trio: the thread must be the loop's
    ours: list[int] = []  # our ends of the pipes, closed if the spawn fails
    theirs: list[int] = []  # the child's ends, always closed here once it has them

    def pipe(child_reads: bool) -> tuple[int, int]:
        r, w = os.pipe2(os.O_CLOEXEC)
        mine, child = (w, r) if child_reads else (r, w)
        ours.append(mine)
        theirs.append(child)
        return mine, child

    in_mine = out_mine = err_mine = None
    child_in, child_out, child_err = stdin, stdout, stderr
    try:
        if stdin == PIPE:
            in_mine, child_in = pipe(True)
        if stdout == PIPE:
            out_mine, child_out = pipe(False)
        if stderr == PIPE:
            err_mine, child_err = pipe(False)
        popen = subprocess.Popen(list(argv), stdin=child_in, stdout=child_out, stderr=child_err,
                                 close_fds=True, env=dict(env) if env is not None else None,
                                 start_new_session=start_new_session, pass_fds=tuple(pass_fds))
    except BaseException:
        for fd in ours:
            os.close(fd)
        raise
    finally:
        for fd in theirs:
            os.close(fd)
    return ChildProcess(
        popen,
        trio.lowlevel.FdStream(in_mine) if in_mine is not None else None,
        trio.lowlevel.FdStream(out_mine) if out_mine is not None else None,
        trio.lowlevel.FdStream(err_mine) if err_mine is not None else None,
    )
