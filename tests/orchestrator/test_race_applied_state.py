"""What a race leaves for promotion, why its checks failed, and Ctrl-C in the middle of one:
real `petri race` processes on the demo project (copy backend), real bwrap, real pytest and
unittest as checks, git as the oracle of what changed."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import petri, project_venv
from tests.helpers.signals import start_petri
from tests.helpers.race_project import FIXES, make_project, race_workspace

needs_sandbox = pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/bwrap").exists(),
                                   reason="needs root (cgroups) and bwrap")
GIT = ["git", "-c", "user.email=t@t", "-c", "user.name=t", "-c", "safe.directory=*"]
# The check leaves what real checks leave: bytecode, pytest's cache, a build output. It runs
# the project's own .venv (``project_venv``), as a developer's check would: this checkout's
# interpreter may sit under the host's /tmp, which no sandbox sees.
PY = ".venv/bin/python"
CHECK = (f"{PY} -m pytest -q -p no:cacheprovider tests >/dev/null 2>&1; "
         f"{PY} -m pytest -q tests && /usr/bin/python3 -m unittest -q tests.test_stats "
         "&& mkdir -p build && echo artifact > build/out.txt && echo junk > check-was-here.txt")


def git_status(tree: Path) -> set[str]:
    """Every path git sees as changed, new or ignored-but-present in ``tree``."""
    out = subprocess.run([*GIT, "status", "--porcelain=v1", "-z", "--untracked-files=all", "--ignored"],
                         cwd=tree, capture_output=True, text=True, check=True).stdout
    return {e for e in out.split("\0") if e and not e[3:].startswith(".petri/")}


@pytest.fixture(params=["copy", pytest.param("overlay", marks=pytest.mark.skipif(
    os.geteuid() != 0, reason="overlay needs root"))])
def ws(tmp_path, request):
    # The .gitignore of many real projects: no __pycache__/ and no .pytest_cache/ in it.
    w = make_project(tmp_path / "proj", git=True, gitignore=".env\n.venv/\nnode_modules/\n")
    assert project_venv(w) == PY
    r = petri("init", "--backend", request.param, cwd=w)
    assert r.rc == 0, r
    with race_workspace(w):
        yield w


def _oracle(ws: Path, tmp_path: Path, patch: Path) -> set[str]:
    """What applying the candidate alone changes: git apply in a clean clone."""
    clone = tmp_path / "oracle"
    subprocess.run([*GIT, "clone", "-q", str(ws), str(clone)], check=True)
    subprocess.run([*GIT, "apply", str(patch)], cwd=clone, check=True)
    return git_status(clone)


@needs_sandbox
def test_race_promotes_the_applied_state_not_what_the_check_left(ws, tmp_path):
    right = FIXES / "right.patch"
    assert _oracle(ws, tmp_path, right) == {" M stats/__init__.py"}
    want = git_status(ws) | {" M stats/__init__.py"}  # .env, .venv/, node_modules/ (ignored) stay
    r = petri("race", "--json", "--keep", "--check", CHECK, "--patch", str(right),
              "--patch", str(FIXES / "wrong.patch"), cwd=ws, timeout=300)
    assert r.rc == 0, r
    doc = r.json
    by = {c["candidate"]: c for c in doc["candidates"]}
    win = by[str(right)]
    assert doc["winner"] == win["sandbox"]
    # lines changed were counted right after applying
    assert (win["lines_added"], win["lines_removed"], win["files_changed"]) == (3, 1, 1)
    # a later diff and promote carry exactly the candidate's change
    d = petri("diff", "--json", win["sandbox"], cwd=ws).json
    assert [f["path"] for f in d["files"]] == ["stats/__init__.py"]
    dry = petri("promote", "--dry-run", "--json", win["sandbox"], cwd=ws).json
    assert dry["applied"] == ["stats/__init__.py"]
    tree = Path(doc["winner_path"])
    assert not (tree / "build").exists() and not (tree / ".pytest_cache").exists()
    assert not list(tree.rglob("__pycache__"))
    # the check really ran, and left its litter in its throwaway fork (destroyed now)
    check_log = petri("logs", win["check_sandbox"], "--json", cwd=ws).json["runs"][0]
    assert "passed" in check_log["stdout"] and check_log["exit_code"] == 0
    states = {s["id"]: s["state"] for s in petri("ls", "--all", "--json", cwd=ws).json["sandboxes"]}
    assert all(states[c["check_sandbox"]] == "destroyed" for c in doc["candidates"])
    # the losers (kept) hold their applied state too
    d = petri("diff", "--json", by[str(FIXES / "wrong.patch")]["sandbox"], cwd=ws).json
    assert [f["path"] for f in d["files"]] == ["stats/__init__.py"]
    p = petri("promote", "--json", win["sandbox"], cwd=ws)
    assert p.rc == 0 and p.json["applied"] == ["stats/__init__.py"], p
    assert git_status(ws) == want


@needs_sandbox
def test_race_promote_flag_carries_only_the_candidate(ws, tmp_path):
    right = FIXES / "right.patch"
    want = git_status(ws) | _oracle(ws, tmp_path, right)
    r = petri("race", "--json", "--promote", "--check", CHECK, "--patch", str(right), cwd=ws, timeout=300)
    assert r.rc == 0, r
    assert r.json["promotion"]["applied"] == ["stats/__init__.py"]
    assert git_status(ws) == want
    # the implicit base stays only because the winner still uses it
    snaps = petri("snapshots", "--json", cwd=ws).json["snapshots"]
    assert [s["id"] for s in snaps if s["implicit"]] == [r.json["base"]]


@needs_sandbox
def test_race_without_winner_leaves_no_sandbox_nor_implicit_snapshot(ws):
    before = [s["id"] for s in petri("snapshots", "--json", cwd=ws).json["snapshots"]]
    r = petri("race", "--json", "--check", "false", "--cmd", "true", "--cmd", "touch x", cwd=ws)
    assert r.rc == 1 and r.json["winner"] is None, r
    assert [s["id"] for s in petri("snapshots", "--json", cwd=ws).json["snapshots"]] == before
    assert all(s["state"] == "destroyed" for s in petri("ls", "--all", "--json", cwd=ws).json["sandboxes"])


# ---------------------------------------------------------------------------- why it failed


@needs_sandbox
def test_race_says_why_each_check_failed_and_where_its_log_is(ws):
    r = petri("race", "--json", "--check", "no-such-cmd --flag", "--cmd", "true",
              "--cmd", "no-such-fixer", cwd=ws)
    assert r.rc == 1, r
    by = {c["candidate"]: c for c in r.json["candidates"]}
    assert by["true"]["exit_code"] == 127 and by["true"]["error"] == "command not found: no-such-cmd"
    assert by["no-such-fixer"]["applied"] is False
    assert by["no-such-fixer"]["error"] == "command not found: no-such-fixer"
    for c in by.values():
        assert Path(c["stderr_path"]).is_file() and "not found" in Path(c["stderr_path"]).read_text()
    # a failing check that prints: its exception line, for people too, and where its log is
    r = petri("race", "--check", "echo first >&2; echo 'AssertionError: 2 != 2.5' >&2; exit 3",
              "--cmd", "true", cwd=ws)
    assert r.rc == 1, r
    line = next(ln for ln in r.out.splitlines() if ln.startswith("true: check failed"))
    assert "exit 3: AssertionError: 2 != 2.5" in line, line
    sb, n = _logs_named(line)
    assert petri("logs", sb, "--run", n, cwd=ws).err.splitlines()[-1] == "AssertionError: 2 != 2.5"
    r = petri("race", "--check", "no-such-cmd", "--cmd", "true", cwd=ws)
    assert "command not found: no-such-cmd" in r.out, r


def _logs_named(line: str) -> tuple[str, str]:
    """(sandbox, run) of the ``(`petri logs SB --run N`)`` a race's line ends with."""
    import re
    m = re.search(r"\(`petri logs (sb-[0-9a-f]+) --run (\d+)`\)$", line)
    assert m, line
    return m.group(1), m.group(2)


FAILING_TEST = """\
from stats import mean


def test_mean_of_one():
    assert mean([4]) == 4


def test_widget_count():
    widgets = [1, 2]
    assert len(widgets) == 3
"""
THROWS = """\
function count() { throw new Error("widget count is wrong: 2, want 3"); }
count();
"""


@needs_sandbox
def test_a_failed_checks_reason_is_the_line_that_says_what_failed(ws):
    """Real pytest (the project's venv) and real node, failing in the sandbox: the race's one
    line is pytest's verdict (the failed test, its closing line) and node's exception, not
    "nothing on stderr" or node's version trailer; the log it names is the candidate's own
    (``petri logs <candidate>``), which also says which runs were the race's steps."""
    (ws / "tests" / "test_widgets.py").write_text(FAILING_TEST)
    r = petri("race", "--keep", "--check", f"{PY} -m pytest -q -p no:cacheprovider tests/test_widgets.py",
              "--cmd", "true", "--patch", str(FIXES / "right.patch"), cwd=ws, timeout=300)
    assert r.rc == 1, r
    rows = {ln.split()[1]: ln.split()[-1] for ln in r.out.splitlines() if ln[:1].isdigit()}
    for cand in ("true", str(FIXES / "right.patch")):
        line = next(ln for ln in r.out.splitlines() if ln.startswith(f"{cand}: check failed"))
        assert "exit 1: FAILED tests/test_widgets.py::test_widget_count - assert 2 == 3 (1 failed, 1 passed in " \
            in line, line
        sb, n = _logs_named(line)
        assert sb == rows[cand], (line, rows)  # the candidate named in the table, not its throwaway fork
        log = petri("logs", sb, "--run", n, cwd=ws)
        assert log.rc == 0 and "1 failed, 1 passed" in log.out, log
    # the candidate's runs: petri's apply and the check (in its fork), each said for what it is
    sb = rows[str(FIXES / "right.patch")]
    st = petri("status", sb, cwd=ws)
    runs = [ln for ln in st.out.splitlines() if ln.startswith("run ")]
    assert len(runs) == 2, st
    assert runs[0].startswith("run 1: [race r-") and "petri applied the candidate] git " in runs[0], runs
    assert "the check, run in its throwaway fork sb-" in runs[1] and runs[1].endswith("-> exit 1"), runs
    doc = petri("status", "--json", sb, cwd=ws).json["sandboxes"][0]
    assert [d.get("role") for d in doc["runs"]] == ["race-apply", "race-check"]
    assert doc["last_exit_code"] == 1  # the candidate's last step: its check failed
    assert petri("rm", "--all", cwd=ws).rc == 0

    if shutil.which("node") is None:
        pytest.skip("node is not installed")
    (ws / "count.js").write_text(THROWS)
    r = petri("race", "--json", "--check", "node count.js", "--cmd", "true", cwd=ws)
    assert r.rc == 1, r
    c = r.json["candidates"][0]
    assert c["error"] == "exit 1: Error: widget count is wrong: 2, want 3", c
    assert Path(c["stderr_path"]).parent.name == c["sandbox"] and c["logs_run"] == 2
    assert "Node.js v" in Path(c["stderr_path"]).read_text()  # the trailer is there, and not the reason


@needs_sandbox
def test_a_candidate_that_changed_nothing_is_flagged(ws):
    r = petri("race", "--check", "true", "--cmd", "true", "--cmd", "echo x > made.txt", cwd=ws)
    assert r.rc == 0, r
    row = next(ln for ln in r.out.splitlines() if ln.split()[1:2] == ["true"])
    assert "passed (changed nothing)" in row and row.split()[0] == "1*", r.out
    assert "(true) changed nothing: the check passes on the base as it is; promoting it changes nothing" in r.out
    assert "check passed in" in r.err and "(it changed nothing)" in r.err
    r = petri("race", "--json", "--check", "true", "--cmd", "true", "--cmd", "echo x > made.txt", cwd=ws)
    by = {c["candidate"]: c for c in r.json["candidates"]}
    assert by["true"]["changed_nothing"] is True and by["echo x > made.txt"]["changed_nothing"] is False


# ---------------------------------------------------------------------------- Ctrl-C


def _wait_for(pred, what: str, limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _runs_started(ws: Path, cmd: str, n: int) -> bool:
    events = ws / ".petri" / "events.jsonl"
    if not events.exists():
        return False
    started = [json.loads(ln) for ln in events.read_text().splitlines() if '"run.started"' in ln]
    return sum(1 for e in started if e.get("argv", [""])[-1] == cmd) >= n


@needs_sandbox
@pytest.mark.parametrize("as_json", [True, False])
def test_ctrl_c_during_race_exits_130_and_cleans_up(ws, as_json):
    snaps_before = [s["id"] for s in petri("snapshots", "--json", cwd=ws).json["snapshots"]]
    token = os.urandom(6).hex()
    check = f"sleep 300 && echo {token}"
    args = ["race", *(["--json"] if as_json else []), "--check", check, "--cmd", "true",
            "--patch", str(FIXES / "right.patch"), "--cmd", "no-such-fixer"]
    proc = start_petri(args, ws)
    try:
        _wait_for(lambda: _runs_started(ws, check, 2), "both checks to start")
        time.sleep(0.5)  # into the checks themselves, past their start-up
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("petri: interrupted: race r-"), err
    if as_json:
        doc = json.loads(out)
        assert doc["error"].startswith("interrupted") and doc["exit_code"] == 130 and doc["winner"] is None
        by = {c["candidate"]: c for c in doc["candidates"]}
        assert by["no-such-fixer"]["error"] == "command not found: no-such-fixer"
        assert by["true"]["applied"] is True and by["true"]["exit_code"] is None
    # every sandbox of the race (throwaway forks included) is gone, with its processes
    rows = petri("ls", "--all", "--json", cwd=ws).json["sandboxes"]
    assert len(rows) == 6 and all(s["state"] == "destroyed" for s in rows), rows
    assert subprocess.run(["pgrep", "-f", token], capture_output=True).returncode == 1
    assert [s["id"] for s in petri("snapshots", "--json", cwd=ws).json["snapshots"]] == snaps_before


@needs_sandbox
def test_race_applied_state_on_btrfs(btrfs_dir, tmp_path):
    """The btrfs path: the check's fork gets the applied state through btrfs send's record."""
    import btrfsutil

    w = btrfs_dir / "proj"
    btrfsutil.create_subvolume(w)
    make_project(w, git=True, gitignore=".env\n.venv/\nnode_modules/\n")
    assert project_venv(w) == PY
    assert petri("init", "--backend", "btrfs", cwd=w).rc == 0
    with race_workspace(w):
        r = petri("race", "--json", "--check", CHECK, "--patch", str(FIXES / "right.patch"), cwd=w, timeout=300)
        assert r.rc == 0, r
        win = r.json["candidates"][0]
        assert win["exit_code"] == 0 and (win["lines_added"], win["lines_removed"]) == (3, 1)
        d = petri("diff", "--json", win["sandbox"], cwd=w).json
        assert [f["path"] for f in d["files"]] == ["stats/__init__.py"]
