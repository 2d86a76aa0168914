"""Commands that run for a long time: nothing but their exit, their --timeout, the sandbox's
lifetime or petri's own death may end them.

The regression these guard: bwrap --die-with-parent arms PR_SET_PDEATHSIG against the
*thread* that forked it, and trio forks from worker threads it retires after 10 s idle, so
every sandboxed command was SIGKILLed about 10 s in (exit 137, killed_by null). Each test
here runs past that point, through every caller: the CLI, the engine API in one process that
stays up for minutes, a race's check, a promotion's --verify, an idle interactive shell.
And petri killed with SIGKILL still takes its runs with it. Real bwrap and cgroups.
"""
from __future__ import annotations

import os
import pty
import secrets
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, petri

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/bwrap").exists(),
                                reason="needs root (cgroups) and bwrap")


@pytest.fixture
def ws(tmp_path):
    w = tmp_path / "proj"
    w.mkdir()
    (w / "value.txt").write_text("old\n")
    assert petri("init", "--backend", "copy", cwd=w).rc == 0
    yield w
    petri("deinit", "--force", cwd=w)


def _procs_with(marker: str) -> list[int]:
    found = []
    for p in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (p / "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmd and b"orchestrator" not in cmd and b"python" not in cmd:
            found.append(int(p.name))
    return found


def _wait_for(cond, timeout: float, step: float = 0.1) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(step)
    return cond()


def test_cli_run_of_35_seconds_runs_to_the_end(ws):
    sb = petri("fork", "--json", cwd=ws).json["sandboxes"][0]["id"]
    r = petri("run", "--json", sb, "--", "sh", "-c", "for i in $(seq 35); do sleep 1; echo tick $i; done; echo done",
              cwd=ws, timeout=120)
    assert r.rc == 0, r
    doc = r.json
    assert doc["exit_code"] == 0 and doc["killed_by"] is None
    assert doc["duration_s"] >= 35
    out = Path(doc["stdout_path"]).read_text().splitlines()
    assert out[-1] == "done" and len(out) == 36


def test_cli_timeout_still_ends_a_long_run_at_its_time(ws):
    """The fix must not make runs immortal: --timeout 14s ends a 60 s command at ~14 s."""
    sb = petri("fork", "--json", cwd=ws).json["sandboxes"][0]["id"]
    r = petri("run", "--json", "--timeout", "14s", sb, "--", "sleep", "60", cwd=ws, timeout=120)
    assert r.rc == 124, r
    assert r.json["killed_by"] == "timeout" and 13.5 <= r.json["duration_s"] < 25


LONG_LIVED = textwrap.dedent("""
    import json, sys, threading, time
    from pathlib import Path
    import trio
    sys.path.insert(0, sys.argv[1])
    from orchestrator.engine import Engine
    from orchestrator.runs import run_in_sandbox, run_sync

    engine = Engine.open(Path(sys.argv[2]))
    sb = engine.fork("live", 1)[0].id
    results = []

    def say(what, doc):
        results.append({"what": what, "exit_code": doc["exit_code"], "killed_by": doc["killed_by"],
                        "duration_s": doc["duration_s"], "out": Path(doc["stdout_path"]).read_text()})
        print(json.dumps(results[-1]), flush=True)

    # 1. The main thread, 32 s.
    say("main-32s", run_sync(engine, sb, ["sh", "-c", "sleep 32; echo ok-1"], echo=False))
    time.sleep(12)  # trio's idle worker threads retire now
    # 2. Two runs at once inside one trio loop, in a thread of its own, 22 s each.
    box = []
    async def two():
        async with trio.open_nursery() as n:
            for i in (2, 3):
                async def one(i=i):
                    box.append(await run_in_sandbox(engine, sb, ["sh", "-c", f"sleep 22; echo ok-{i}"], echo=False))
                n.start_soon(one)
    t = threading.Thread(target=trio.run, args=(two,))
    t.start(); t.join()
    for d in sorted(box, key=lambda d: d["run"]):
        say("thread-22s", d)
    time.sleep(12)
    # 3. Again from the main thread, after another idle spell: 25 s.
    say("main-25s", run_sync(engine, sb, ["sh", "-c", "sleep 25; echo ok-4"], echo=False))
    # 4. A run that only petri's death can end: the test SIGKILLs this process.
    print(json.dumps({"what": "forever", "sandbox": sb}), flush=True)
    run_sync(engine, sb, ["sh", "-c", "sleep 1000; echo " + sys.argv[3]], echo=False)
""")


def test_one_long_lived_process_starts_runs_over_minutes_then_dies_with_them(ws, tmp_path):
    """An API user (the MCP server, the TUI) keeps one process up for hours and runs commands
    now and then, from the main thread and from threads, with idle spells between."""
    import json

    marker = f"petri-longlived-{secrets.token_hex(4)}"
    script = tmp_path / "longlived.py"
    script.write_text(LONG_LIVED)
    proc = subprocess.Popen([sys.executable, str(script), str(REPO), str(ws), marker], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    lines = []
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(json.loads(line))
            if lines[-1]["what"] == "forever":
                break
        assert lines and lines[-1]["what"] == "forever", (lines, proc.stderr.read() if proc.poll() is not None else "")
        runs = lines[:-1]
        assert [r["what"] for r in runs] == ["main-32s", "thread-22s", "thread-22s", "main-25s"]
        for r in runs:
            assert r["exit_code"] == 0 and r["killed_by"] is None, r
        # The two concurrent runs may take their run numbers in either order.
        assert [runs[0]["out"].strip(), runs[3]["out"].strip()] == ["ok-1", "ok-4"]
        assert sorted(r["out"].strip() for r in runs[1:3]) == ["ok-2", "ok-3"]
        assert all(r["duration_s"] >= 22 for r in runs[1:3])
        assert runs[0]["duration_s"] >= 32 and runs[3]["duration_s"] >= 25
        # The last run sleeps "forever"; let it get past the 10 s mark, then kill petri.
        assert _wait_for(lambda: _procs_with(marker), 15), "the last run never started"
        time.sleep(12)
        assert _procs_with(marker), "the run died by itself before petri did"
        proc.kill()
        proc.wait(10)
        assert _wait_for(lambda: not _procs_with(marker), 10), "petri was SIGKILLed but its run lives on"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in _procs_with(marker):
            os.kill(pid, signal.SIGKILL)
        petri("gc", cwd=ws)


def test_sigkill_of_petri_run_takes_the_command_with_it(ws):
    marker = f"petri-killed-{secrets.token_hex(4)}"
    sb = petri("fork", "--json", cwd=ws).json["sandboxes"][0]["id"]
    p = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "run", sb, "--", "sh", "-c",
                          f"sleep 1000; echo {marker}"], cwd=ws, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    try:
        assert _wait_for(lambda: _procs_with(marker), 15)
        time.sleep(11)  # past the old 10 s death
        assert _procs_with(marker)
        p.send_signal(signal.SIGKILL)
        p.wait(10)
        assert _wait_for(lambda: not _procs_with(marker), 10)
    finally:
        if p.poll() is None:
            p.kill()
        for pid in _procs_with(marker):
            os.kill(pid, signal.SIGKILL)
        petri("gc", cwd=ws)


def test_race_whose_check_takes_20_seconds(ws):
    r = petri("race", "--json", "--check", "sleep 20; grep -q fixed value.txt",
              "--cmd", "echo broken > value.txt", "--cmd", "echo fixed > value.txt", cwd=ws, timeout=180)
    assert r.rc == 0, r
    doc = r.json
    by_cmd = {c["candidate"]: c for c in doc["candidates"]}
    good, bad = by_cmd["echo fixed > value.txt"], by_cmd["echo broken > value.txt"]
    assert good["exit_code"] == 0 and good["killed_by"] is None and good["duration_s"] >= 20
    assert bad["exit_code"] == 1 and bad["duration_s"] >= 20
    assert doc["winner"] == good["sandbox"]


def test_promote_verify_of_20_seconds_keeps_a_good_promotion(ws):
    sb = petri("fork", "--json", cwd=ws).json["sandboxes"][0]
    Path(sb["path"], "value.txt").write_text("new\n")
    r = petri("promote", "--json", sb["id"], "--verify", "sleep 20; grep -q new value.txt", cwd=ws, timeout=180)
    assert r.rc == 0, r
    assert r.json["verified"] is True and r.json["rolled_back"] is False
    assert (ws / "value.txt").read_text() == "new\n"


def test_shell_left_idle_for_20_seconds_is_still_there(ws):
    petri("fork", "--label", "idle", cwd=ws)
    pid, fd = pty.fork()
    if pid == 0:
        os.chdir(ws)
        os.execv(sys.executable, [sys.executable, "-m", "orchestrator.cli", "shell", "idle"])
    out = b""
    status = None
    try:
        def read_for(seconds: float) -> None:
            nonlocal out
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                r, _, _ = select.select([fd], [], [], 0.2)
                if r:
                    try:
                        out += os.read(fd, 4096)
                    except OSError:
                        return

        read_for(3)
        os.write(fd, b"echo STARTED\n")
        read_for(21)  # idle, past the old 10 s death
        os.write(fd, b"echo $((6*7))-ALIVE\n")
        end = time.monotonic() + 15
        while b"42-ALIVE" not in out and time.monotonic() < end:
            read_for(0.5)
        assert b"42-ALIVE" in out, out[-500:]
        os.write(fd, b"exit 3\n")
        end = time.monotonic() + 15
        while time.monotonic() < end:
            read_for(0.2)
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status = st
                break
        assert status is not None and os.waitstatus_to_exitcode(status) == 3, out[-500:]
    finally:
        if status is None:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(fd)
