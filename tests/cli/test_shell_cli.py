"""`petri shell` end to end on a real pseudo-terminal: the shell is interactive, sits at the
workspace's own path inside the sandbox, writes land in the sandbox only, and its exit code
comes through."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import petri
from tests.helpers.pty_drive import drive


@pytest.fixture
def ws(tmp_path):
    w = tmp_path / "proj"
    w.mkdir()
    (w / "README.md").write_text("hello\n")
    assert petri("init", "--backend", "copy", cwd=w).rc == 0
    yield w
    petri("deinit", "--force", cwd=w)


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
