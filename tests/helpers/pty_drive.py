"""Drive an interactive command on a real pseudo-terminal: keys in, screen text out."""
from __future__ import annotations

import os
import pty
import select
import sys
import time
from pathlib import Path


def drive(argv: list[str], cwd: Path, script: bytes, until: bytes, timeout: float = 30.0) -> tuple[int, bytes]:
    """Run petri on a pty, type ``script`` at the first prompt, wait for ``until`` in the
    output, then type ``exit 3`` (reading first: once the terminal's other side closes, the
    kernel may drop the shell's last output)."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: petri on our pty as its controlling terminal
        os.chdir(cwd)
        os.execv(sys.executable, [sys.executable, "-m", "orchestrator.cli", *argv])
    out = b""
    sent = exited = False
    started = time.monotonic()
    deadline = started + timeout
    status = None
    while time.monotonic() < deadline:
        r, _, _ = select.select([fd], [], [], 0.2)
        if r:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                chunk = b""
            out += chunk
        if not sent and (b"$ " in out or time.monotonic() - started > 3):  # a prompt, or 3 s
            os.write(fd, script)
            sent = True
        elif sent and until in out and not exited:
            os.write(fd, b"exit 3\n")
            exited = True
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status = st
            break
    if status is None:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        raise AssertionError(f"petri shell did not finish: {out[-500:]!r}")
    try:
        while True:
            r, _, _ = select.select([fd], [], [], 0.1)
            if not r:
                break
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            out += chunk
    except OSError:
        pass
    os.close(fd)
    return os.waitstatus_to_exitcode(status), out
