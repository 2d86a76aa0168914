"""SIGINT, SIGTERM and SIGHUP sent to a real `petri` by another process (not typed at a
terminal: `kill`, `timeout`, a supervisor) are each a Ctrl-C: the command settles (rolls
back, or says exactly what stayed in place), removes what it made, writes its audit row and
exits 128 + the signal. SIGINT is sent to a petri started with SIGINT ignored, as a script's
background job is (POSIX shells do that), which petri used to keep ignoring.

For each signal: `petri promote --verify` (a verify that traps SIGINT and sleeps), `petri
race` under `timeout -s SIG 5`, `petri run` and `petri fork -n 20`: the exit code, the
line on stderr, what was settled, that nothing is left (sandboxes, mounts, cgroups,
processes), and the audit row."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import petri
from tests.helpers.signals import (audit_row, command_running, nothing_left, petri_env, run_started, signal_when,
                                   start_signalled, tree_bytes)

needs_sandbox = pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/bwrap").exists(),
                                   reason="needs root (cgroups) and bwrap")
SIGNALS = [pytest.param(signal.SIGINT, 130, "interrupted", id="SIGINT"),
           pytest.param(signal.SIGTERM, 143, "interrupted by SIGTERM", id="SIGTERM"),
           pytest.param(signal.SIGHUP, 129, "interrupted by SIGHUP", id="SIGHUP")]


def _workspace(tmp_path: Path, files: int):
    w = tmp_path / "ws"
    w.mkdir()
    (w / "keep.txt").write_text("base\n")
    for i in range(files):
        (w / "many" / str(i % 20)).mkdir(parents=True, exist_ok=True)
        (w / "many" / str(i % 20) / f"f{i}.txt").write_text(f"{i}\n")
    assert petri("init", "--backend", "copy", cwd=w).rc == 0
    try:
        yield w
    finally:
        petri("deinit", "--force", cwd=w)


@pytest.fixture
def ws(tmp_path):
    """A small copy-backend workspace: what a signal meets is a run, not a copy."""
    yield from _workspace(tmp_path, 40)


@pytest.fixture
def big_ws(tmp_path):
    """2,000 files: enough that a fork of 20 (copy backend) takes a while to signal it midway."""
    yield from _workspace(tmp_path, 2000)


# ---------------------------------------------------------------------------- promote --verify


@needs_sandbox
@pytest.mark.parametrize("sig,code,how", SIGNALS)
def test_a_signal_during_verify(ws, sig, code, how):
    sb = petri("fork", "--json", cwd=ws).json["sandboxes"][0]
    Path(sb["path"], "keep.txt").write_text("changed\n")
    after = {**tree_bytes(ws), "keep.txt": b"changed\n"}
    token = os.urandom(6).hex()
    verify = f"trap 'echo got-INT' INT; sleep 300; echo {token}"
    proc = start_signalled(["promote", "--json", "--verify", verify, sb["id"]], ws)
    # the verify's command itself runs (seen once under a full run's load: signalled at its
    # run.started event, the run was still being set up and ended "destroyed", exit 125)
    out, err = signal_when(proc, lambda: run_started(ws, token) and command_running(b"/bin/sh\0-c\0trap", token),
                           sig, "the --verify run")
    assert proc.returncode == code, (out, err)
    doc = json.loads(out)
    promo = doc["promotion"]
    line = (f"petri: {how} after the promotion was in place: {sb['id']} was promoted as {promo}"
            f" (--verify did not finish); undo with `petri rollback {promo}`")
    assert err.strip().splitlines()[-1] == line, err
    assert doc["exit_code"] == code and doc["applied"] == ["keep.txt"] and doc["verified"] is None
    assert tree_bytes(ws) == after, "what it says is in place is exactly what is in place"
    # the verify sandbox went with its processes; its run says it was stopped, not that petri failed
    rows = petri("ls", "--all", "--json", cwd=ws).json["sandboxes"]
    verify_sb = [s for s in rows if s["id"] != sb["id"]]
    assert [s["state"] for s in verify_sb] == ["destroyed"], rows
    run = petri("logs", verify_sb[0]["id"], "--json", cwd=ws).json["runs"][-1]
    assert (run["ended_by"], run["exit_code"]) == ("killed", code) and run["duration_s"] is not None, run
    nothing_left(ws, [sb["id"]], token)
    row = audit_row(ws, "promote")
    assert row["exit_code"] == code and row["result"] == line[len("petri: "):], row
    assert petri("rollback", promo, cwd=ws).rc == 0 and (ws / "keep.txt").read_text() == "base\n"


# ---------------------------------------------------------------------------- race


@needs_sandbox
@pytest.mark.parametrize("sig,code,how", SIGNALS)
def test_timeout_of_a_race(ws, sig, code, how):
    before = tree_bytes(ws)
    snaps = [s["id"] for s in petri("snapshots", "--json", cwd=ws).json["snapshots"]]
    token = os.urandom(6).hex()
    check = f"trap 'echo got-INT' INT; sleep 300; echo {token}"
    name = signal.Signals(sig).name
    proc = start_signalled(["race", "--check", check, "--cmd", "echo a > keep.txt", "--cmd", "echo b > keep.txt"], ws,
                  prefix=["timeout", "--preserve-status", "-s", name, "20"])  # the checks start before, also loaded
    out, err = proc.communicate(timeout=120)
    assert run_started(ws, token, 2), "the checks had started when the signal came"
    assert proc.returncode == code, (out, err)
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"petri: {how}: race r-") and last.endswith("stopped and its sandboxes were removed"), err
    assert "Traceback" not in err
    assert tree_bytes(ws) == before
    rows = petri("ls", "--all", "--json", cwd=ws).json["sandboxes"]
    assert len(rows) == 4 and {s["state"] for s in rows} == {"destroyed"}, rows
    # each check was stopped on request: recorded so, with its duration (not "petri failed")
    checks = [r for s in rows for r in petri("logs", s["id"], "--json", cwd=ws).json["runs"]
              if token in " ".join(r["argv"])]
    assert len(checks) == 2 and all((r["ended_by"], r["exit_code"]) == ("killed", 143) and r["duration_s"]
                                    for r in checks), checks
    nothing_left(ws, [], token)
    assert [s["id"] for s in petri("snapshots", "--json", cwd=ws).json["snapshots"]] == snaps
    row = audit_row(ws, "race")
    assert row["exit_code"] == code and row["result"] == last[len("petri: "):], row


# ---------------------------------------------------------------------------- run


@needs_sandbox
@pytest.mark.parametrize("sig,code,how", SIGNALS)
def test_a_signal_to_petri_run_goes_to_the_command(ws, sig, code, how):
    """`petri run` passes the signal on (the command decides, as with a Ctrl-C); a command
    that ends on it makes `petri run` exit 128 + it, with the run and the audit row saying so."""
    sb = petri("fork", "--json", cwd=ws).json["sandboxes"][0]["id"]
    token = os.urandom(6).hex()
    proc = start_signalled(["run", sb, "--", "sh", "-c", f"echo {token}; exec sleep 300"], ws)
    log = ws / ".petri" / "logs" / sb / "run-1.out"
    out, err = signal_when(proc, lambda: log.exists() and token in log.read_text(errors="replace"), sig,
                            "the command")
    assert proc.returncode == code, (out, err)
    assert out == f"{token}\n" and "Traceback" not in err, (out, err)
    run = petri("logs", sb, "--json", cwd=ws).json["runs"][-1]
    assert run["exit_code"] == code and run["ended_by"] == "exit", run
    nothing_left(ws, [sb], token)
    assert audit_row(ws, "run")["exit_code"] == code


@needs_sandbox
@pytest.mark.parametrize("sig,code,how", SIGNALS)
def test_a_signal_to_petri_shell(ws, sig, code, how):
    """`petri shell` (its terminal closed: SIGHUP; or SIGTERM, SIGINT from elsewhere) ends the
    shell; the run is recorded as stopped with 128 + the signal, not as petri failing."""
    sb = petri("fork", "--json", cwd=ws).json["sandboxes"][0]["id"]
    token = os.urandom(6).hex()
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "shell", sb], cwd=ws, env=petri_env(),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert proc.stdin is not None
    proc.stdin.write(f"echo {token}; exec sleep 300\n")
    proc.stdin.flush()
    log = ws / ".petri" / "logs" / sb / "run-1.out"
    out, err = signal_when(proc, lambda: log.exists() and log.read_text(errors="replace").count(token) >= 2,
                            sig, "the shell")
    assert proc.returncode == code, (out, err)
    assert err.strip().splitlines()[-1] == f"petri: {how}", err  # not a silent exit (typer's own 130)
    run = petri("logs", sb, "--json", cwd=ws).json["runs"][-1]
    assert (run["exit_code"], run["ended_by"]) == (code, "killed") and run["duration_s"], run
    nothing_left(ws, [sb], token)
    assert audit_row(ws, "shell")["exit_code"] == code


# ---------------------------------------------------------------------------- fork -n 20


@pytest.mark.parametrize("sig,code,how", SIGNALS)
def test_a_signal_during_fork_of_20(big_ws, sig, code, how):
    """Anywhere in a fork of 20 (here: once some of its trees exist), a signal undoes the whole
    fork: no sandbox, no tree, nothing `creating`; the line says so; the audit row too."""
    before = tree_bytes(big_ws)
    trees = big_ws / ".petri" / "sandboxes"

    def some_made() -> bool:
        return trees.is_dir() and len(os.listdir(trees)) >= 3
    proc = start_signalled(["fork", "-n", "20"], big_ws)
    out, err = signal_when(proc, some_made, sig, "the fork's first trees")
    assert proc.returncode == code, (out, err)
    line = f"petri: {how}: the fork was undone: no sandbox was made"
    assert err.strip() == line and out == "", (out, err)
    nothing_left(big_ws, [])
    rows = petri("ls", "--all", "--json", cwd=big_ws).json["sandboxes"]
    assert len(rows) == 20 and {s["state"] for s in rows} == {"failed"}, rows
    assert tree_bytes(big_ws) == before
    row = audit_row(big_ws, "fork")
    assert row["exit_code"] == code and row["result"] == line[len("petri: "):], row


def test_nohup_keeps_sighup_ignored(big_ws):
    """`nohup petri ...` asked for SIGHUP to be ignored: petri does not take that back (a
    SIGTERM still stops it)."""
    trees = big_ws / ".petri" / "sandboxes"
    proc = start_signalled(["fork", "-n", "20"], big_ws, prefix=["nohup"])
    out, err = signal_when(proc, lambda: trees.is_dir() and len(os.listdir(trees)) >= 3, signal.SIGHUP,
                            "the fork's first trees")
    assert proc.returncode == 0 and len(out.splitlines()) == 20, (out, err)
    rows = petri("ls", "--json", cwd=big_ws).json["sandboxes"]
    assert len(rows) == 20 and {s["state"] for s in rows} == {"ready"}


# ---------------------------------------------------------------------------- mcp


@needs_sandbox
@pytest.mark.parametrize("sig,code,how", SIGNALS)
def test_a_signal_to_the_mcp_server(ws, sig, code, how):
    """`petri mcp` ends its runs and exits 128 + the signal. A session is no operation of its
    own (no audit row: each tool that changes something is one, via mcp); the run it stopped
    is recorded as stopped on request."""
    from tests.helpers.mcp_client import Raw, alive_with

    sb = petri("fork", "--json", cwd=ws).json["sandboxes"][0]["id"]
    token = os.urandom(6).hex()
    raw = Raw(ws)
    try:
        raw.handshake()
        st = raw.call("sandbox_run_start", {"sandbox": sb, "command": f"sleep 300; : {token}"})["structuredContent"]
        deadline = time.monotonic() + 20
        while not alive_with(token) and time.monotonic() < deadline:
            time.sleep(0.05)
        raw.p.send_signal(sig)
        raw.p.wait(timeout=60)
        assert raw.p.returncode == code
    finally:
        if raw.p.poll() is None:
            raw.p.kill()
            raw.p.wait()
    nothing_left(ws, [sb], token)
    entries = petri("log", "--json", cwd=ws).json["entries"]
    assert not [e for e in entries if e["op"] == "mcp"], entries
    assert [e for e in entries if e["op"] == "run" and e["via"] == "mcp"], entries
    run = [r for r in petri("logs", sb, "--json", cwd=ws).json["runs"] if r["run"] == st["run"]][0]
    assert (run["exit_code"], run["ended_by"]) == (143, "killed"), run
