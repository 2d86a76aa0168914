"""Lifetimes and crashes: --ttl kills runs (of this petri and of another), expired trees go
(or stay with --keep-expired), and after `kill -9` of petri, `petri gc` leaves no process,
cgroup or half-raced sandbox. Real bwrap, real cgroups v1, real processes."""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.sandbox import cgroups
from tests.conftest import REPO, petri

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/bwrap").exists(),
                                reason="needs root (cgroups) and bwrap")


@pytest.fixture
def ws(tmp_path):
    w = tmp_path / "proj"
    w.mkdir()
    subprocess.run(["bash", str(REPO / "demo" / "sample_project.sh"), str(w)], check=True)
    assert petri("init", "--backend", "copy", cwd=w).rc == 0
    try:
        yield w
    finally:
        petri("deinit", "--force", cwd=w)


def spawn(ws: Path, *args: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen([sys.executable, "-m", "orchestrator.cli", *args], cwd=ws, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def procs_with(marker: str) -> list[int]:
    found = []
    for p in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (p / "cmdline").read_bytes()
            if marker.encode() in cmd and b"orchestrator.cli" not in cmd:  # not petri itself
                found.append(int(p.name))
        except OSError:
            pass
    return found


def wait_for(cond, timeout: float = 15.0, what: str = "condition") -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def cgroups_of(sb: str) -> list[str]:
    return [str(d) for _, d in cgroups.list_cgroups(f"petri/{sb}")]


def sb_doc(ws: Path, ident: str) -> dict:
    return petri("status", ident, "--json", cwd=ws).json["sandboxes"][0]


def test_ttl_kills_a_run_on_time_and_destroys_the_tree(ws):
    # 5 s: a `petri run` that needs longer than the lifetime only to start finds the sandbox
    # expired (exit 1, not 124): seen with 2 s at load 20
    sb = petri("fork", "--json", "--ttl", "5s", cwd=ws).json["sandboxes"][0]
    marker = f"ttl-{os.getpid()}-a"
    t0 = time.monotonic()
    # ignores SIGTERM, and a daemon that escaped with setsid: both must go
    r = petri("run", sb["id"], "--json", "--", "sh", "-c",
              f"trap '' TERM; setsid sh -c 'sleep 60; : {marker}' & sleep 60; : {marker}", cwd=ws)
    took = time.monotonic() - t0
    assert r.rc == 124 and r.json["killed_by"] == "ttl", r
    assert took < 11, took
    assert procs_with(marker) == []
    d = sb_doc(ws, sb["id"])
    assert d["state"] == "expired" and not Path(d["path"]).exists()
    assert cgroups_of(sb["id"]) == []
    # the record and the logs stay; nothing more runs
    assert petri("logs", sb["id"], cwd=ws).rc == 0
    assert petri("run", sb["id"], "--", "true", cwd=ws).rc == 1


def test_keep_expired_keeps_the_tree_until_rm_expired(ws):
    sb = petri("fork", "--json", "--ttl", "1s", "--keep-expired", cwd=ws).json["sandboxes"][0]
    time.sleep(1.2)
    d = sb_doc(ws, sb["id"])
    assert d["state"] == "expired" and Path(d["path"]).is_dir()
    assert petri("run", sb["id"], "--", "true", cwd=ws).rc == 1
    r = petri("rm", "--expired", "--json", cwd=ws)
    assert r.rc == 0 and sb["id"] in r.json["removed"]
    assert not Path(d["path"]).exists()


def test_expiry_seen_by_another_petri_kills_the_run(ws):
    """The run's own petri has no deadline (the lifetime was shortened after it started);
    any other petri command reaps the overdue sandbox and kills its processes."""
    sb = petri("fork", "--json", "--ttl", "1h", cwd=ws).json["sandboxes"][0]
    marker = f"ttl-{os.getpid()}-b"
    p = spawn(ws, "run", sb["id"], "--json", "--", "sh", "-c", f"sleep 60; : {marker}")
    try:
        wait_for(lambda: procs_with(marker), what="the run to start")
        db = sqlite3.connect(ws / ".petri" / "registry.db", timeout=30)
        with db:
            db.execute("UPDATE sandboxes SET expires_at = ? WHERE id = ?", (time.time() - 1, sb["id"]))
        db.close()
        t0 = time.monotonic()
        assert petri("ls", cwd=ws).rc == 0  # any command reaps
        out, err = p.communicate(timeout=20)
        assert time.monotonic() - t0 < 10
        doc = json.loads(out)
        assert p.returncode == 124 and doc["killed_by"] == "ttl", (out, err)
        assert procs_with(marker) == [] and cgroups_of(sb["id"]) == []
        assert sb_doc(ws, sb["id"])["state"] == "expired"
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_rm_of_a_running_sandbox_kills_its_run(ws):
    sb = petri("fork", "--json", cwd=ws).json["sandboxes"][0]
    marker = f"rm-{os.getpid()}"
    p = spawn(ws, "run", sb["id"], "--", "sh", "-c", f"sleep 60; : {marker}")
    try:
        wait_for(lambda: procs_with(marker), what="the run to start")
        assert sb_doc(ws, sb["id"])["state"] == "running"
        assert petri("rm", sb["id"], cwd=ws).rc == 0
        p.wait(timeout=20)
        assert procs_with(marker) == [] and cgroups_of(sb["id"]) == []
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_kill_9_of_petri_run_then_gc_leaves_nothing(ws):
    sb = petri("fork", "--json", cwd=ws).json["sandboxes"][0]
    marker = f"crash-{os.getpid()}"
    p = spawn(ws, "run", sb["id"], "--", "sh", "-c",
              f"trap '' TERM HUP; setsid sh -c 'trap \"\" TERM HUP; sleep 60; : {marker}' & sleep 60; : {marker}")
    wait_for(lambda: len(procs_with(marker)) >= 2, what="the run and its daemon")
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    r = petri("gc", "--json", cwd=ws)
    assert r.rc == 0, r
    wait_for(lambda: procs_with(marker) == [], timeout=5, what="no process left")
    assert cgroups_of(sb["id"]) == []
    d = sb_doc(ws, sb["id"])
    assert d["state"] == "exited" and d["runs"][-1]["exit_code"] == 125 and d["runs"][-1]["finished_at"]
    # the sandbox itself is fine: it runs again
    assert petri("run", sb["id"], "--", "true", cwd=ws).rc == 0


def test_kill_9_of_petri_race_then_gc_leaves_nothing(ws):
    marker = f"race-crash-{os.getpid()}"
    p = spawn(ws, "race", "--check", f"sleep 60; : {marker}", "--cmd", "true", "--cmd", "true", "--cmd", "true")
    wait_for(lambda: len(procs_with(marker)) >= 3, what="three checks running")
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    r = petri("gc", "--json", cwd=ws)
    assert r.rc == 0, r
    wait_for(lambda: procs_with(marker) == [], timeout=5, what="no process left")
    assert [str(d) for _, d in cgroups.list_cgroups("petri") if marker in str(d)] == []
    sbs = petri("ls", "--all", "--json", cwd=ws).json["sandboxes"]
    # three candidates and the throwaway fork each check ran in
    assert len(sbs) == 6 and all(s["state"] == "destroyed" for s in sbs), sbs
    assert all(cgroups_of(s["id"]) == [] for s in sbs)
    assert not any(Path(s["path"]).exists() for s in sbs)


def test_gc_leaves_a_live_run_of_another_petri_alone(ws):
    sb = petri("fork", "--json", cwd=ws).json["sandboxes"][0]
    marker = f"live-{os.getpid()}"
    p = spawn(ws, "run", sb["id"], "--", "sh", "-c", f"sleep 1.5; echo done; : {marker}")
    try:
        wait_for(lambda: procs_with(marker), what="the run to start")
        r = petri("gc", "--json", cwd=ws)
        assert r.rc == 0 and r.json["reaped"]["processes"] == 0, r
        out, _ = p.communicate(timeout=20)
        assert p.returncode == 0 and out == "done\n"
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def expire_now(ws: Path, ids: list[str]) -> None:
    """Their lifetimes end now (as a long --ttl would, later): no race with a slow fork."""
    db = sqlite3.connect(ws / ".petri" / "registry.db", timeout=30)
    with db:
        db.executemany("UPDATE sandboxes SET expires_at = ? WHERE id = ?", [(time.time() - 1, i) for i in ids])
    db.close()


def test_gc_reports_every_expired_sandbox_it_reaped_and_the_space(ws):
    """`gc` opens the engine, which expires overdue sandboxes before gc's own pass: the
    report must still name every one whose tree went (it said `removed: []` before)."""
    n = 300
    made = petri("fork", "-n", str(n), "--ttl", "1h", "--json", cwd=ws, timeout=300).json["sandboxes"]
    kept = petri("fork", "--ttl", "1h", "--keep-expired", "--json", cwd=ws).json["sandboxes"][0]
    live = petri("fork", "--json", cwd=ws).json["sandboxes"][0]
    for sb in made[:10]:  # 1000 bytes of its own in each of ten: what removing them gives back
        Path(sb["path"], "written.bin").write_bytes(b"x" * 1000)
    expire_now(ws, [s["id"] for s in made] + [kept["id"]])
    g = petri("gc", "--json", cwd=ws, timeout=300)
    assert g.rc == 0, g
    removed = [r for r in g.json["removed"] if r.startswith("sb-")]
    assert sorted(removed) == sorted(s["id"] for s in made) and len(removed) == n
    assert g.json["reaped"]["expired"] == n + 1  # the one with --keep-expired expired too...
    assert kept["id"] not in removed and Path(kept["path"]).is_dir()  # ...but its tree stays
    assert live["id"] not in removed and Path(live["path"]).is_dir()
    assert not any(Path(s["path"]).exists() for s in made)
    assert g.json["reclaimed_bytes"] == 10 * 1000
    states = {s["id"]: s["state"] for s in petri("ls", "--json", cwd=ws).json["sandboxes"]}
    assert all(states.get(s["id"], "expired") == "expired" for s in made)
    # reported once: the next gc has nothing more to say about them
    again = petri("gc", "--json", cwd=ws)
    assert [r for r in again.json["removed"] if r.startswith("sb-")] == [] and again.json["reaped"]["expired"] == 0


def test_gc_of_many_expired_fuse_sandboxes_leaves_no_mount_and_no_process(tmp_path):
    from snapshot.backends.fuse import FuseBackend
    from snapshot.fusefs import daemon as D
    from snapshot.fusefs import server as S
    from snapshot.osutil import mounts
    from tests.conftest import stop_fuse_under

    ok, why = FuseBackend.available(tmp_path)
    if not ok:
        pytest.skip(f"fuse: {why}")
    w = tmp_path / "proj"
    w.mkdir()
    subprocess.run(["bash", str(REPO / "demo" / "sample_project.sh"), str(w)], check=True)
    assert petri("init", "--backend", "fuse", cwd=w).rc == 0
    try:
        n = 100
        made = petri("fork", "-n", str(n), "--ttl", "1h", "--json", cwd=w, timeout=300).json["sandboxes"]
        store = w / ".petri"
        hosts = {int(p.read_text()) for p in store.glob("fuse/*/daemon.pid")}
        assert 0 < len(hosts) < n and len({Path(s["path"]).parent for s in made}) == len(hosts)  # shared
        expire_now(w, [s["id"] for s in made])
        g = petri("gc", "--json", cwd=w, timeout=300)
        assert g.rc == 0, g
        assert sorted(r for r in g.json["removed"] if r.startswith("sb-")) == sorted(s["id"] for s in made)
        assert g.json["reaped"]["expired"] == n
        assert g.json["reaped"]["processes"] == 1  # the fork server: no sandbox is left for it
        assert not [m for m in mounts() if m.mountpoint.startswith(bytes(store))]
        assert not any(Path(s["path"]).exists() for s in made)
        wait_for(lambda: not any(D._alive(p) for p in hosts), what="every host to end with its mounts")
        assert S.server_pid(store) is None
    finally:
        petri("deinit", "--force", cwd=w)
        stop_fuse_under(tmp_path, [w / ".petri"])
