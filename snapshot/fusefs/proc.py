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
