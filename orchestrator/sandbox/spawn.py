"""Start a child process from the calling thread, with raw pipe ends and a pidfd to wait on.

Why the calling thread, and not a pool's: a child whose parent-death signal is armed (bwrap
``--die-with-parent`` sets PR_SET_PDEATHSIG) gets that signal when the *thread* that forked
it exits, not the process (prctl(2): "the parent" is the creating thread). trio's
``open_process`` forks from a worker thread that is retired after 10 s idle, which killed
every sandboxed command about 10 s in (DESIGN, "Long runs and the spawning thread").

The runner (``runner.run_blocking``) forks here and then waits for the child in the same
thread, in its own poll loop: the thread lives at least as long as the run, and it dies
with petri, which is exactly when the sandbox must die. An async caller runs that loop in a
thread of its own for the length of the run (``runner.run_isolated``). ``subprocess.Popen``
uses vfork(2) here (no ``preexec_fn``, no uid change in Python), so the fork costs about one
exec of the wrapper.

The pipe ends are plain fds (ours are close-on-exec); the pidfd (Linux >= 5.3) becomes
readable when the child exits, and the child is reaped with ``waitpid`` after that.

Caveat: the caller must keep the forking thread alive while a child lives; ``run_blocking``
does by never returning before its child is reaped.
"""
from __future__ import annotations

import os
import signal
import subprocess
from typing import Mapping, Sequence

PIPE = subprocess.PIPE
DEVNULL = subprocess.DEVNULL


class ChildProcess:
    """A started child: ``pid``, ``returncode`` (None while running), ``stdin``/``stdout``/
    ``stderr`` (our pipe ends as fds, or None), ``pidfd`` (None on an old kernel)."""

    def __init__(self, popen: subprocess.Popen, stdin: int | None, stdout: int | None, stderr: int | None) -> None:
        self._popen = popen
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr
        self.pidfd: int | None
        try:
            self.pidfd = os.pidfd_open(popen.pid)
        except (AttributeError, OSError):
            self.pidfd = None  # an old kernel: the runner polls instead

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def returncode(self) -> int | None:
        return self._popen.returncode

    def poll(self) -> int | None:
        return self._popen.poll()

    def wait(self) -> int:
        """Wait until the child exits (blocking); reap it; its return code."""
        return self._popen.wait()

    def send_signal(self, sig: int) -> None:
        if self._popen.returncode is None:
            try:
                os.kill(self._popen.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def close(self) -> None:
        """Close every fd of ours that is still open (pipe ends, pidfd)."""
        for name in ("stdin", "stdout", "stderr", "pidfd"):
            fd = getattr(self, name)
            if fd is not None:
                setattr(self, name, None)
                try:
                    os.close(fd)
                except OSError:
                    pass

    def close_fd(self, fd: int) -> None:
        """Close one of our fds (a pipe at EOF), once."""
        for name in ("stdin", "stdout", "stderr", "pidfd"):
            if getattr(self, name) == fd:
                setattr(self, name, None)
                os.close(fd)
                return

    def __del__(self) -> None:
        self.close()


def open_process_here(argv: Sequence[bytes | str], *, stdin: int | None = DEVNULL, stdout: int | None = PIPE,
                      stderr: int | None = PIPE, env: Mapping[str, str] | None = None,
                      start_new_session: bool = True, pass_fds: Sequence[int] = ()) -> ChildProcess:
    """Start ``argv`` now, forking from this thread; ``PIPE`` streams become our fds.
    ``pass_fds`` stay open in the child under the same numbers (e.g. bwrap's ``--seccomp``
    fd); the caller still owns and closes them."""
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
    return ChildProcess(popen, in_mine, out_mine, err_mine)
