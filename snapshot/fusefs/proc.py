"""Processes of the FUSE layer, shared by the daemon, the fork server and their client:
is a pid alive, which process is it (start time), kill and wait, the environment a daemon
or a server is started with, and the error a daemon that failed to mount raises.

It exists so that ``daemon`` (which asks the fork server's client to start a daemon) and
``client`` (which stops a server and raises the daemon's error) need not import each other.

Caveats: liveness and start time are read from ``/proc``; a zombie counts as gone.
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path
import snapshot


class DaemonFailed(RuntimeError):
    pass


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22):
    with the pid, it names one process for the life of the machine."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return None


def _kill(pid: int, sig: int = signal.SIGKILL) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.01)
    return not _alive(pid)


def child_env() -> dict[str, str]:
    """The environment for a daemon or fork server: this checkout importable."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def redirect_output(log: str | None) -> None:
    """stdin from /dev/null, stdout and stderr to ``log`` (or /dev/null)."""
    fd = os.open(os.devnull, os.O_RDWR)
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600) if log else fd
    os.dup2(fd, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    for f in {fd, out}:
        if f > 2:
            os.close(f)


def child_detach(log: str | None) -> bool:
    """Double-fork into a new session: True in the calling process, False in the detached
    grandchild (its output to ``log``, its cwd /), which is never the caller's zombie."""

    if snapshot.osutil.fork() > 0:
        return True
    os.setsid()
    if snapshot.osutil.fork() > 0:
        os._exit(0)
    redirect_output(log)
    os.chdir("/")
    return False


def set_process_name(name: bytes) -> None:
    """``comm`` (what ps and top show; 15 bytes) for a forked process, whose command line
    is its parent's."""
    import ctypes

    try:
        snapshot.osutil.libc.prctl(15, ctypes.c_char_p(name[:15]), 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass
