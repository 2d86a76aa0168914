"""`petri shell` end to end on a real pseudo-terminal: the shell is interactive, sits at the
workspace's own path inside the sandbox, writes land in the sandbox only, and its exit code
comes through."""
from __future__ import annotations

import os
import pty
import select
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import petri


@pytest.fixture
def ws(tmp_path):
    w = tmp_path / "proj"
    w.mkdir()
    (w / "README.md").write_text("hello\n")
    assert petri("init", "--backend", "copy", cwd=w).rc == 0
    yield w
    petri("deinit", "--force", cwd=w)


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


def test_shell_is_interactive_same_path_and_isolated(ws):
    sb = petri("fork", "--label", "sh", "--json", cwd=ws).json["sandboxes"][0]
    script = (b"test -t 0 && echo TTY-OK; pwd; cat README.md; echo from-shell > new.txt; "
              b"echo $((6*7))-ANSWER\n")
    code, out = drive(["shell", "sh"], ws, script, until=b"42-ANSWER")
    assert code == 3, out[-800:]
    assert b"TTY-OK" in out and b"42-ANSWER" in out
    assert str(ws).encode() in out, "the shell starts at the workspace's own path"
    assert (Path(sb["path"]) / "new.txt").read_text() == "from-shell\n"
    assert not (ws / "new.txt").exists()


def test_shell_of_unknown_sandbox_is_one_line_exit_2(ws):
    r = petri("shell", "nope", cwd=ws)
    assert r.rc == 2 and len(r.err.strip().splitlines()) == 1
