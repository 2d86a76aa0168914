"""``petri tui`` in a real terminal: tmux runs it at 80x24, keys go in with ``send-keys``,
the screen comes back with ``capture-pane``. A real workspace (copy backend), the CLI entry
point, Textual's real driver."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.api_project import make_project, needs_sandbox, ws  # noqa: F401 - ws: a copy-backend workspace

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None,
                                reason="tmux not installed (scripts/setup.sh installs it)")


class Tmux:
    def __init__(self, name: str, cwd: Path, argv: list[str]) -> None:
        self.name = name
        env = {"TERM": "xterm-256color", "PETRI_WORKSPACE": "", "COLUMNS": "", "LINES": ""}
        cmd = " ".join(f"{k}={v}" for k, v in env.items()) + " exec " + " ".join(argv)
        subprocess.run(["tmux", "new-session", "-d", "-s", name, "-x", "80", "-y", "24", "-c", str(cwd), cmd],
                       check=True)

    def keys(self, *keys: str) -> None:
        for k in keys:
            subprocess.run(["tmux", "send-keys", "-t", self.name, k], check=True)
            # A lone ESC followed at once by a key reads as alt+key (terminals send alt that
            # way): pause after it, as any person does.
            time.sleep(0.3 if k == "Escape" else 0.05)

    def screen(self) -> str:
        cp = subprocess.run(["tmux", "capture-pane", "-p", "-t", self.name], capture_output=True, text=True)
        return cp.stdout

    def wait_for(self, *texts: str, timeout: float = 30) -> str:
        """The screen once every one of ``texts`` is on it at the same time (a screen is
        painted in parts: one text alone may come before the rest)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.screen()
            if all(t in got for t in texts):
                return got
            time.sleep(0.1)
        raise AssertionError(f"{texts!r} never showed together; the screen:\n{self.screen()}")

    def pid(self) -> int:
        cp = subprocess.run(["tmux", "list-panes", "-t", self.name, "-F", "#{pane_pid}"], capture_output=True,
                            text=True, check=True)
        return int(cp.stdout.split()[0])

    def alive(self) -> bool:
        return subprocess.run(["tmux", "has-session", "-t", self.name], capture_output=True).returncode == 0

    def kill(self) -> None:
        subprocess.run(["tmux", "kill-session", "-t", self.name], capture_output=True)


@pytest.fixture
def tmux_tui(ws):  # noqa: F811
    sessions: list[Tmux] = []

    def start(*args: str) -> Tmux:
        t = Tmux(f"petri-tui-test-{os.getpid()}-{len(sessions)}", Path(ws.root),
                 [sys.executable, "-m", "orchestrator.cli", "tui", *args])
        sessions.append(t)
        return t

    try:
        yield start
    finally:
        for t in sessions:
            t.kill()


@needs_sandbox
def test_keys_in_a_real_terminal(ws, tmux_tui):  # noqa: F811
    sb = ws.fork(label="alpha").keep()[0]
    Path(sb.path, "notes.txt").write_text("one\nTWO, longer\nthree\n")  # another size: copy notices by stat
    other = ws.fork(label="beta").keep()[0]
    assert [f.path for f in ws.diff(sb).files] == ["notes.txt"]
    t = tmux_tui()
    headers = ("ID", "LABEL", "STATE", "AGE", "LEFT", "MEM", "DISK", "EXIT", "STALE", "RACE")
    screen = t.wait_for(sb.id, *headers)
    assert all(len(line) <= 80 for line in screen.splitlines())
    t.keys("2")  # the Diff tab of the first row
    t.wait_for("+TWO")
    t.keys("Space", "Space", "c")  # mark both, compare
    t.wait_for("B only")
    t.keys("Escape")
    t.wait_for("LABEL")
    t.keys("?")
    t.wait_for("command palette")
    t.keys("Escape")
    # another petri destroys a sandbox: its row goes
    ws.remove(other.id)
    deadline = time.monotonic() + 20
    while other.id in t.screen() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert other.id not in t.screen()
    t.keys("p")  # promote asks first, with the command
    t.wait_for(f"petri promote {sb.id}")
    t.wait_for("would apply 1 path(s)")
    t.keys("Escape")
    t.keys("q")
    deadline = time.monotonic() + 10
    while t.alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not t.alive(), "q quits"
    assert ws.promotions() == []  # cancelled: nothing promoted


def test_read_only_and_bad_race_id(ws, tmux_tui):  # noqa: F811
    from tests.conftest import petri as petri_cli

    bad = petri_cli("tui", "--race", "r-nope", cwd=ws.root)
    assert bad.rc == 2 and bad.err.count("\n") == 1 and "r-nope" in bad.err
    js = petri_cli("--json", "tui", cwd=ws.root)
    assert js.rc == 2 and js.json["exit_code"] == 2
    t = tmux_tui("--read-only")
    screen = t.wait_for("read-only")
    assert "Promote" not in screen and "Destroy" not in screen
    t.keys("p")
    time.sleep(0.5)
    assert "petri promote" not in t.screen()
    t.keys("q")


def _running(pid: int) -> bool:
    """The process is there and not a zombie (tmux reaps its panes' processes in its own time)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_idle_writes_nothing_and_q_ctrl_c_and_a_closed_terminal_end_it(ws, tmux_tui):  # noqa: F811
    """Left open, the TUI writes nothing to the workspace or its store (its refreshes, the
    staleness included); ``q``, Ctrl-C and closing the terminal (SIGHUP) each end the
    process, leaving nothing behind."""
    from tests.helpers.workspace_state import diff_state, state

    sbs = ws.fork(3, label="idle").keep()
    Path(sbs[0].path, "notes.txt").write_text("changed\n")
    root = Path(ws.root)
    before = state(root, "copy")
    for how in ("q", "C-c", "hup"):
        t = tmux_tui()
        t.wait_for(sbs[0].id, sbs[2].id, "STALE")
        pid = t.pid()
        time.sleep(6 if how == "q" else 1)  # past the first staleness refresh and the next
        if how == "hup":
            t.kill()  # tmux closes the pane: SIGHUP
        else:
            t.keys(how)
        deadline = time.monotonic() + 15
        while _running(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(pid), f"{how} left petri tui running"
        t.kill()
    after = state(root, "copy")
    assert not (diff := diff_state(before, after)), f"the TUI wrote:\n{diff}"


def test_a_terminal_closed_while_it_starts_leaves_no_process(ws, tmux_tui):  # noqa: F811
    """Closing the terminal at any moment of the start-up, before the app takes its signals
    or while it paints first, ends the process too (2 of 10 were left waiting for ever)."""
    ws.fork(5, label="x").keep()
    pids = []
    # a session that stays: killing the last one ends tmux's server, and a new-session racing
    # that exit fails ("server exited unexpectedly")
    holder = Tmux(f"petri-tui-test-{os.getpid()}-holder", Path(ws.root), ["sleep", "120"])
    try:
        for delay in (0.3, 0.6, 0.9, 1.2, 1.5, 2.0):
            t = tmux_tui()
            pids.append(t.pid())
            time.sleep(delay)
            t.kill()
    finally:
        holder.kill()
    deadline = time.monotonic() + 15
    while any(_running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if _running(p)], "a petri tui outlived its terminal"
