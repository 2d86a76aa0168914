"""``petri shell``: an interactive command inside a sandbox on a pseudo-terminal petri owns.

The sandbox never gets the user's terminal. petri opens a pty pair and hands the slave to
the sandbox as stdin/stdout/stderr; inside, ``setsid -c`` makes the command a session leader
with the slave as its controlling terminal. That happens inside the pid namespace on
purpose: a session made outside would have a foreground process group the shell cannot
see, and an interactive shell fails restoring it at exit. So job control
(Ctrl-Z, fg, Ctrl-C to the foreground job) works inside, and TIOCSTI from inside could only
type into the sandbox's own terminal (the syscall filter refuses it anyway, as in every run).
petri puts the user's terminal in raw mode and copies bytes both ways, passes window size
changes on (SIGWINCH -> TIOCSWINSZ) and keeps a transcript of the output in ``spec.stdout_path``
(capped at ``spec.log_cap`` as a run's log is: ``orchestrator.runlog``).

This is plain blocking code (select on two fds), not trio: it is one interactive session
that owns the terminal, and mixing it with an event loop buys nothing.

Caveats:
- Inside, ``tty`` prints "not a tty": the slave belongs to the host's devpts instance and
  the sandbox's /dev has a fresh one, so ttyname() cannot name it; isatty() and job
  control work.
- The timeout/lifetime is checked between reads (at least every 0.2 s) and kills at once,
  without a grace period: an interactive user is there to see it.
- When petri's own input ends (``</dev/null``, a pipe), it types the EOF key (^D) into the
  shell's terminal every 0.25 s until the shell exits: a program in the shell that reads
  the terminal raw (an editor) sees those bytes instead of an end of input.
"""
from __future__ import annotations

import errno
import fcntl
import os
import select
import signal
import termios
import time
import tty
from typing import TYPE_CHECKING

from orchestrator.runlog import CappedLog
from orchestrator.sandbox import cgroups
from snapshot.osutil import write_all
from orchestrator.sandbox.prepare import EXIT_TIMEOUT, Prepared, RunSpec, prepare
import orchestrator

if TYPE_CHECKING:
    import subprocess


def _copy_winsize(src_fd: int, dst_fd: int) -> None:
    try:
        ws = fcntl.ioctl(src_fd, termios.TIOCGWINSZ, b"\0" * 8)
        fcntl.ioctl(dst_fd, termios.TIOCSWINSZ, ws)
    except OSError:
        pass


def run_shell(spec: RunSpec, *, stdin_fd: int = 0, stdout_fd: int = 1, support: cgroups.Support | None = None) -> int:
    """Run ``spec.argv`` (e.g. ``["/bin/bash", "-i"]``) interactively; return its exit code
    (124 when the timeout or lifetime ended it). Every process is gone when this returns.

    A start that bwrap gives up before the command runs because the host's mounts moved
    under it (another sandbox's run view coming and going: ``runner.setup_moved``) is made
    again, as a run's is, up to ``runner.SETUP_ATTEMPTS`` times; what the user typed into the
    terminal of a start that failed is typed into the next one's first."""
    runner = orchestrator.sandbox.runner
    sup = support or cgroups.support()
    typed = bytearray()  # what the user typed into the starts that failed, for the next
    for attempt in range(1, runner.SETUP_ATTEMPTS + 1):
        marker = orchestrator.sandbox.isolation.new_marker()
        started = runner.MarkerFilter(marker, hold=True)
        # The session (and its terminal) is the one setsid -c makes inside: no bwrap --new-session.
        with prepare(spec, argv=["setsid", "-c", "-w", *spec.argv], marker=marker, new_session=False,
                     support=sup) as prep:
            rc = _interact(spec, prep, stdin_fd, stdout_fd, started, typed)
        if started.seen:
            return rc
        held = started.flush()  # bwrap's own words, and the terminal's echo of what was typed
        said = held.decode("utf-8", "replace")
        said = said[said.find("bwrap: "):] if "bwrap: " in said else said
        if attempt == runner.SETUP_ATTEMPTS or not runner.setup_moved(said):
            write_all(stdout_fd, held)  # what the terminal showed
            return rc
        runner.pause_before_start(attempt)
    raise AssertionError("unreachable")


def _interact(spec: RunSpec, prep: Prepared, stdin_fd: int, stdout_fd: int,
              started: orchestrator.sandbox.runner.MarkerFilter, typed: bytearray) -> int:
    """The session's exit code (bwrap's when the command never started: ``started.seen``
    is False then)."""
    import subprocess

    end = None
    now = time.time()
    if spec.timeout_s is not None:
        end = now + spec.timeout_s
    if spec.deadline is not None and (end is None or spec.deadline < end):
        end = spec.deadline
    master, slave = os.openpty()
    os.set_blocking(master, False)
    interactive = os.isatty(stdin_fd)
    saved = termios.tcgetattr(stdin_fd) if interactive else None
    if interactive:
        _copy_winsize(stdin_fd, slave)
        # The slave starts as a copy of the user's terminal settings (erase key, etc.).
        termios.tcsetattr(slave, termios.TCSANOW, saved)
    spec.stdout_path.parent.mkdir(parents=True, exist_ok=True)
    transcript = CappedLog(spec.stdout_path, spec.log_cap)  # capped like a run's log
    old_winch = None
    proc = None
    try:
        if interactive:
            old_winch = signal.signal(signal.SIGWINCH, lambda *_: _copy_winsize(stdin_fd, master))
            tty.setraw(stdin_fd)

        with orchestrator.sandbox.environment.thread_in_netns(prep.netns):
            proc = subprocess.Popen(
                prep.argv, stdin=slave, stdout=slave, stderr=slave, close_fds=True, env=prep.env,
                start_new_session=True,  # the wrapper and bwrap: no terminal at all
                pass_fds=prep.pass_fds,
            )
        prep.spawned()
        os.close(slave)
        slave = -1
        timed_out = _copy(master, stdin_fd, stdout_fd, transcript, proc, end, started, typed)
    finally:
        prep.spawned()
        if interactive and saved is not None:
            termios.tcsetattr(stdin_fd, termios.TCSADRAIN, saved)
        if old_winch is not None:
            signal.signal(signal.SIGWINCH, old_winch)
        if slave >= 0:
            os.close(slave)
        if proc is not None and proc.poll() is None:
            proc.kill()
        if prep.cgroup is not None:
            prep.cgroup.kill_all()
        if proc is not None:
            proc.wait()
        os.close(master)
        transcript.close()
    if timed_out and started.seen:
        return EXIT_TIMEOUT
    rc = proc.returncode
    return 128 - rc if rc < 0 else rc


def _copy(master: int, stdin_fd: int, stdout_fd: int, transcript: CappedLog, proc: "subprocess.Popen[bytes]",
          end: float | None, started: orchestrator.sandbox.runner.MarkerFilter, typed: bytearray) -> bool:
    """Copy bytes between our terminal and the shell's until it is done; True when the
    timeout or lifetime ended it. Until ``started`` has seen the shim's marker, what comes
    is held, not shown (the caller shows it or starts again), and what is typed is kept in
    ``typed`` (which starts with what was typed into the starts that failed)."""
    stdin_open = True
    eof_sent_at = None
    if typed:
        write_all(master, bytes(typed))
    while True:
        if end is not None and time.time() >= end:
            return True
        if not stdin_open and (eof_sent_at is None or time.monotonic() - eof_sent_at >= EOF_REPEAT_S):
            # End of our input must reach the shell, or `petri shell SB </dev/null` waits
            # forever: a pty cannot be half-closed, so type the terminal's EOF key, as a
            # person would, again until it exits (a command reading the terminal gets it
            # first; a shell that just started or ignores one EOF gets the next).
            write_all(master, _eof_char(master))
            eof_sent_at = time.monotonic()
        fds = [master] + ([stdin_fd] if stdin_open else [])
        try:
            ready, _, _ = select.select(fds, [], [], 0.2)
        except InterruptedError:
            continue
        if master in ready:
            try:
                data = os.read(master, 65536)
            except BlockingIOError:
                data = None
            except OSError as e:
                if e.errno != errno.EIO:  # EIO: every slave fd is closed
                    raise
                return False
            if data == b"":
                return False
            if data:
                data = started.feed(data)  # held until the shim's marker has come
            if data:
                transcript.write(data)
                write_all(stdout_fd, data)
        if stdin_fd in ready:
            data = os.read(stdin_fd, 65536)
            if not data:
                stdin_open = False
                continue
            if not started.seen:
                typed += data
            write_all(master, data)
        if proc.poll() is not None and master not in ready:
            return False


EOF_REPEAT_S = 0.25


def _eof_char(master: int) -> bytes:
    try:
        c = termios.tcgetattr(master)[6][termios.VEOF]
    except (OSError, termios.error):
        return b"\x04"
    return c if isinstance(c, bytes) and c not in (b"", b"\0") else b"\x04"


