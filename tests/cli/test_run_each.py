"""``petri run --each SB... [--jobs J] -- CMD``: one command over existing sandboxes, J at a
time, each run isolated and recorded as ``petri run`` records it; output tagged per line
with the sandbox (``parallel --tag``); exit 0, or 123 when any run failed (``xargs``);
Ctrl-C kills every run still going. Real workspace (copy backend), bwrap and cgroups."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from orchestrator.cli.run_each import split_argv
from orchestrator.errors import UsageError
from tests.conftest import REPO, petri

needs_sandbox = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("bwrap") is None,
                                   reason="needs root (cgroups) and bwrap")


@pytest.fixture
def ws(tmp_path):
    root = tmp_path / "proj"
    root.mkdir()
    (root / "a.txt").write_text("hello\n")
    assert petri("init", "--backend", "copy", "--json", cwd=root).rc == 0
    try:
        yield root
    finally:
        petri("gc", cwd=root)
        petri("deinit", "--force", cwd=root)


def _three(ws) -> list[str]:
    r = petri("fork", "-n", "3", "--json", cwd=ws)
    assert r.rc == 0, r
    ids = [s["id"] for s in r.json["sandboxes"]]
    assert len(ids) == 3
    return ids


@needs_sandbox
def test_three_sandboxes_two_at_a_time_tagged_and_a_failure_is_123(ws):
    a, b, c = _three(ws)
    assert petri("run", b, "--", "touch", "broken", cwd=ws).rc == 0
    script = ("cat a.txt; echo to-stderr >&2; sleep 1; "
              "test ! -e broken || { echo broken here; exit 4; }")
    r = petri("run", "--each", a, b, c, "--jobs", "2", "--", "sh", "-c", script, cwd=ws)
    assert r.rc == 123, r
    out_lines = r.out.splitlines()
    assert sorted(out_lines) == sorted([f"{a}\thello", f"{b}\thello", f"{b}\tbroken here", f"{c}\thello"])
    assert {f"{s}\tto-stderr" for s in (a, b, c)} <= set(r.err.splitlines())
    assert f"1 of 3 run(s) failed: {b} (exit 4)" in r.err
    # each is a recorded run of its own sandbox, with its own output
    for s, code in ((a, 0), (b, 4), (c, 0)):
        st = petri("status", s, "--json", cwd=ws).json["sandboxes"][0]
        assert st["last_exit_code"] == code, st
    # --jobs 2: the third run started only after one of the first two ended
    ev = [json.loads(ln) for ln in (ws / ".petri" / "events.jsonl").read_text().splitlines()]
    starts = sorted(e["ts"] for e in ev if e["event"] == "run.started" and "broken here" in " ".join(e["argv"]))
    ends = sorted(e["ts"] for e in ev if e["event"] == "run.finished" and e.get("sandbox") in (a, b, c)
                  and e["ts"] > starts[0])
    assert len(starts) == 3 and starts[2] >= ends[0]
    # all passing: 0; --json: one run document per sandbox, in the order given; a label
    lab = petri("fork", "--label", "named", "--json", cwd=ws).json["sandboxes"][0]["id"]
    r = petri("--json", "run", "--each", c, "named", a, "--", "cat", "a.txt", cwd=ws)
    assert r.rc == 0, r
    doc = r.json
    assert [d["id"] for d in doc["runs"]] == [c, lab, a] and doc["exit_code"] == 0 and doc["failed"] == 0
    assert all(d["exit_code"] == 0 for d in doc["runs"])
    # a prefix, and the command's own `--`
    r = petri("run", "--each", a[:7], "--", "sh", "-c", 'echo "$@"', "sh", "--", "x", cwd=ws)
    assert r.rc == 0 and r.out == f"{a}\t-- x\n", r


@needs_sandbox
def test_ctrl_c_stops_every_run(ws):
    ids = _three(ws)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("PETRI_WORKSPACE", None)
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "run", "--each", *ids, "--jobs", "3", "--",
                             "sh", "-c", "echo started-each; sleep 60"], cwd=ws, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        log = ws / ".petri" / "events.jsonl"
        while sum(1 for ln in log.read_text().splitlines()
                  if '"run.started"' in ln and "started-each" in ln) < 3:
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert time.monotonic() - t0 < 20  # not the 60 s the commands would sleep
    assert "interrupted: run --each stopped" in err
    for s in ids:
        st = petri("status", s, "--json", cwd=ws).json["sandboxes"][0]
        assert st["last_exit_code"] not in (None, 0), st


@pytest.mark.parametrize("args, says", [
    (("run", "--each", "--", "true"), "needs at least one sandbox"),
    (("run", "--each", "sb-x", "true"), "needs `--` before the command"),
    (("run", "--jobs", "2", "sb-x", "--", "true"), "--jobs goes with --each"),
    (("run", "--each", "no-such", "--", "true"), "no sandbox matches 'no-such'"),
    (("run", "--each", "sb-x", "--", ""), "no command after `--`"),
])
def test_bad_input_is_one_line_exit_2(ws, args, says):
    r = petri(*args, cwd=ws)
    assert r.rc == 2, r
    lines = [ln for ln in r.err.splitlines() if ln.strip()]
    assert len(lines) == 1 and says in lines[0], r


@needs_sandbox
def test_bad_jobs_is_exit_2_and_runs_nothing(ws):
    a = _three(ws)[0]
    for bad in ("0", "x"):
        r = petri("run", "--each", a, "--jobs", bad, "--", "touch", "ran", cwd=ws)
        assert r.rc == 2 and len(r.err.strip().splitlines()) == 1, r
    assert petri("status", a, "--json", cwd=ws).json["sandboxes"][0]["last_exit_code"] is None


def test_split_argv_pure():
    assert split_argv(["a", "b", "--", "ls", "-l"], ["run", "--each", "a", "b", "--", "ls", "-l"]) == \
        (["a", "b"], ["ls", "-l"], None)
    assert split_argv(["a", "--", "b", "--jobs", "3", "--", "x", "--", "y"],
                      ["run", "--each", "a", "b", "--jobs", "3", "--", "x", "--", "y"]) == \
        (["a", "b"], ["x", "--", "y"], 3)
    with pytest.raises(UsageError):
        split_argv(["a", "--", "--bogus", "--", "x"], ["run", "--each", "a", "--bogus", "--", "x"])
