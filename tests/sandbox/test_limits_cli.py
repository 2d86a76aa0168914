"""`petri run` under its sandbox's limits, end to end through the real CLI, as whoever runs
the tests on whatever cgroups that gives: root on cgroup v1 here; root, and a normal user in
a delegated subtree, on the pure cgroup v2 machine tests/vm boots. The memory limit kills
with 137, the pids limit refuses forks, --cpus throttles (measured), the sandbox's lifetime
kills everything its run started, and after petri is killed `petri gc` leaves no cgroup and
no process behind. Real bwrap, real cgroups, the copy backend in pytest's tmp_path."""
from __future__ import annotations

import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.sandbox import cgroups
from tests.conftest import REPO, petri

SUP = cgroups.detect()
# How long one petri command takes here (~0.3 s on the host, seconds under the VM's
# emulation): the lifetime test scales its --ttl by it.
CLI_S = [1.0]
PY = "/usr/bin/python3"  # the venv's interpreter may live under a masked home
pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bwrap"),
    pytest.mark.skipif(SUP.mode == "none", reason=f"needs cgroups this user can write; here: {SUP.reason}"),
]


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    """One workspace for the module (each test forks its own sandbox): every petri command
    costs seconds under the VM's emulation."""
    w = tmp_path_factory.mktemp("limits") / "proj"
    w.mkdir()
    (w / "README").write_text("limits\n")
    t0 = time.monotonic()
    r = petri("init", "--backend", "copy", "--json", cwd=w)
    assert r.rc == 0, r
    CLI_S[0] = time.monotonic() - t0
    try:
        yield w
    finally:
        petri("gc", cwd=w)
        petri("deinit", "--force", cwd=w)


def fork(ws: Path, *args: str) -> str:
    r = petri("fork", "--json", *args, cwd=ws)
    assert r.rc == 0, r
    return r.json["sandboxes"][0]["id"]


def run_json(ws: Path, sb: str, script: str, timeout: float = 300) -> dict:
    r = petri("run", sb, "--json", "--", "sh", "-c", script, cwd=ws, timeout=timeout)
    assert r.out, r
    doc = r.json
    assert doc["exit_code"] == r.rc and doc["cgroup_mode"] == SUP.mode, (r, doc)
    return doc


def procs_with(marker: str) -> list[int]:
    found = []
    for p in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (p / "cmdline").read_bytes()
            if marker.encode() in cmd and b"orchestrator.cli" not in cmd:
                found.append(int(p.name))
        except OSError:
            pass
    return found


def cgroups_of(sb: str) -> list[str]:
    return [str(d) for _, d in cgroups.list_cgroups(f"petri/{sb}", SUP)]


def wait_for(cond, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def test_memory_limit_kills_with_137(ws):
    sb = fork(ws, "--mem", "64M")
    doc = run_json(ws, sb, f"{PY} -c 'x = []\nwhile len(x) < 300: x.append(bytearray(1 << 20))'")
    assert (doc["exit_code"], doc["killed_by"]) == (137, "memory"), doc
    assert "memory" in doc["limits_hit"]
    assert cgroups_of(sb) == []
    # root's workspace: the command ran as the sandbox account through an id-mapped view
    assert doc["run_as"]["id_mapped"] is (os.geteuid() == 0), doc["run_as"]


def test_pids_limit_refuses_forks(ws):
    sb = fork(ws, "--pids", "16")
    bomb = ("import os, time\n"
            "n = 0\n"
            "while n < 100:\n"
            "    try:\n"
            "        pid = os.fork()\n"
            "    except OSError:\n"
            "        break\n"
            "    if pid == 0:\n"
            "        time.sleep(60); os._exit(0)\n"
            "    n += 1\n"
            "print(n)\n")
    doc = run_json(ws, sb, f"{PY} -c '{bomb}'")
    assert doc["exit_code"] == 0 and "pids" in doc["limits_hit"], doc
    forked = int(Path(doc["stdout_path"]).read_text())
    assert 0 < forked < 16, forked
    assert cgroups_of(sb) == []


def test_cpus_throttles_to_the_quota(ws):
    sb = fork(ws, "--cpus", "0.2")
    doc = run_json(ws, sb, f"{PY} -c 'import time\ne = time.time() + 1.5\nwhile time.time() < e: pass'")
    assert doc["exit_code"] == 0 and "cpu" in doc["limits_hit"], doc
    # Busy all along, unthrottled it would use about as much CPU as its wall time; at 0.2
    # CPUs a fifth of it, plus at most one period's quota (20 ms).
    assert doc["cpu_time_s"] is not None and doc["cpu_time_s"] <= 0.2 * doc["duration_s"] * 1.2 + 0.05, doc


def test_lifetime_kills_everything_the_run_started(ws):
    ttl = max(2, math.ceil(4 * CLI_S[0]))
    sb = fork(ws, "--ttl", f"{ttl}s")
    mark = f"33.{secrets.randbelow(10**6):06d}"
    t0 = time.monotonic()
    doc = run_json(ws, sb, f"setsid sh -c 'trap \"\" TERM HUP; sleep {mark}' & sleep 300")
    assert (doc["exit_code"], doc["killed_by"]) == (124, "ttl"), doc
    assert time.monotonic() - t0 < ttl + 60
    assert procs_with(mark) == []
    assert cgroups_of(sb) == []
    st = petri("status", sb, "--json", cwd=ws).json["sandboxes"][0]
    assert st["state"] == "expired" and not Path(st["path"]).exists(), st


def test_gc_after_petri_was_killed_leaves_no_cgroup(ws):
    sb = fork(ws)
    mark = f"34.{secrets.randbelow(10**6):06d}"
    p = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "run", sb, "--", "sh", "-c",
                          f"setsid sh -c 'trap \"\" TERM HUP; sleep {mark}' & sleep 300"],
                         cwd=ws, env=dict(os.environ, PYTHONPATH=str(REPO)), stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: procs_with(mark) and cgroups_of(sb), timeout=120, what="the run and its daemon")
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        # (Another petri's gc on this machine may reap the leaked cgroup first: only the end
        # state is asserted.)
        r = petri("gc", "--json", cwd=ws)
        assert r.rc == 0, r
        wait_for(lambda: procs_with(mark) == [], timeout=10, what="no process left")
        assert cgroups_of(sb) == []
        assert [str(d) for _, d in cgroups.list_cgroups("petri", SUP) if sb in str(d)] == []
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
