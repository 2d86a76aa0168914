"""The `petri` command end to end (real processes, a real SQLite registry, the copy backend on
the host filesystem; other backends in test_cli_backends.py)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from snapshot import conformance as C
from tests.conftest import petri


@pytest.fixture
def ws(copy_ws):
    return copy_ws


def test_version():
    r = petri("--version")
    assert r.rc == 0 and r.out.startswith("petri ")


def test_init_json_shape_and_errors(tmp_path):
    w = tmp_path / "p"
    w.mkdir()
    (w / "f").write_text("x")
    r = petri("init", str(w), "--backend", "copy", "--json")
    assert r.rc == 0, r
    doc = r.json
    assert doc["schema"] == 1 and doc["backend"] == "copy" and doc["workspace"] == str(w)
    assert doc["reason"] and doc["snapshot"].startswith("s-")
    # again: one line, exit 1, and the registry is intact
    r = petri("init", str(w), "--backend", "copy")
    assert r.rc == 1 and "already a petri workspace" in r.err and len(r.err.strip().splitlines()) == 1
    # nested inside
    (w / "sub").mkdir()
    r = petri("init", str(w / "sub"))
    assert r.rc == 4 and "inside the petri workspace" in r.err
    # a symlink to a directory
    (tmp_path / "link").symlink_to(w)
    r = petri("init", str(tmp_path / "link"))
    assert r.rc == 4 and "symlink" in r.err
    # a workspace that would contain another
    r = petri("init", str(tmp_path), "--backend", "copy")
    assert r.rc == 4 and "cannot nest" in r.err


def test_not_a_workspace_is_exit_4(tmp_path):
    r = petri("ls", cwd=tmp_path)
    assert r.rc == 4 and "petri init" in r.err
    r = petri("ls", "--json", cwd=tmp_path)
    assert r.rc == 4 and r.json["exit_code"] == 4 and "error" in r.json


def test_backend_that_cannot_work_is_exit_4_and_names_an_alternative(tmp_path):
    w = tmp_path / "p"
    w.mkdir()
    r = petri("init", str(w), "--backend", "btrfs")
    assert r.rc == 4, r
    assert "--backend" in r.err and len(r.err.strip().splitlines()) == 1
    assert not (w / ".petri").exists(), "a refused init must leave nothing behind"


def test_usage_errors_are_one_line_exit_2(ws):
    for args in (["fork", "--ttl", "soon"], ["fork", "--mem", "lots"], ["fork", "--cpus", "-1"],
                 ["status", "sb-nope"], ["fork", "--bogus"], ["nosuchcommand"], ["fork", "-n", "0"],
                 ["rm"], ["rollback", "s-nope"]):
        r = petri(*args, cwd=ws)
        assert r.rc == 2, (args, r)
        assert len(r.err.strip().splitlines()) == 1 and "Traceback" not in r.err, (args, r.err)
        # Under --json the same error is also the one document on stdout.
        r = petri("--json", *args, cwd=ws)
        assert r.rc == 2 and r.json["exit_code"] == 2 and r.json["error"] in r.err, (args, r)


def test_json_without_a_command_is_an_error_document(tmp_path):
    r = petri("--json", cwd=tmp_path)
    assert r.rc == 2 and r.json == {"schema": 1, "error": r.json["error"], "exit_code": 2}, r
    r = petri(cwd=tmp_path)  # for people: the help page
    assert r.rc == 0 and "Commands" in r.out, r


def test_snapshot_fork_ls_status_shapes(ws):
    r = petri("snapshot", "-m", "before upgrade", "--json", cwd=ws)
    assert r.rc == 0, r
    s = r.json
    assert {"id", "backend", "created_at", "bytes_copied"} <= set(s) and s["created_at"].endswith("Z")
    snaps = petri("snapshots", "--json", cwd=ws).json["snapshots"]
    assert [x["id"] for x in snaps][-1] == s["id"]
    for x in snaps:
        assert {"id", "message", "implicit", "created_at", "bytes"} <= set(x)
    r = petri("fork", "--from", s["id"][:6], "-n", "3", "--label", "try", "--ttl", "1h", "--mem", "512M",
              "--cpus", "1.5", "--pids", "64", "--json", cwd=ws / "src")
    assert r.rc == 0, r
    sbs = r.json["sandboxes"]
    assert len(sbs) == 3 and len({x["id"] for x in sbs}) == 3
    for x in sbs:
        assert {"id", "path", "backend", "base", "expires_at", "limits"} <= set(x)
        assert x["base"] == s["id"] and Path(x["path"]).is_dir()
        assert x["limits"]["mem_bytes"] == 512 << 20 and x["limits"]["pids"] == 64 and x["limits"]["cpus"] == 1.5
        assert (Path(x["path"]) / "src/app.py").read_text().startswith("def add")
    ls = petri("ls", "--json", cwd=ws).json["sandboxes"]
    assert {x["label"] for x in ls} == {"try-1", "try-2", "try-3"}
    for x in ls:
        assert {"id", "label", "backend", "state", "base", "path", "created_at", "expires_at", "limits",
                "usage", "last_exit_code", "stale"} <= set(x)
        assert x["state"] == "ready"
        assert {"mem_bytes", "cpus", "pids", "disk_bytes", "net", "ttl_s"} <= set(x["limits"])
    st = petri("status", "try-2", "--json", cwd=ws)
    assert st.rc == 0 and st.json["sandboxes"][0]["label"] == "try-2"
    # a unique prefix works, an ambiguous one is a usage error
    st = petri("status", sbs[0]["id"][:8], "--json", cwd=ws)
    assert st.rc == 0 and st.json["sandboxes"][0]["id"] == sbs[0]["id"]
    amb = petri("status", "sb-", cwd=ws)
    assert amb.rc == 2 and "several" in amb.err
    human = petri("ls", cwd=ws)
    assert human.rc == 0 and "try-1" in human.out and "\033[" not in human.out  # no colours off a terminal


def test_fork_from_live_sees_live_now_and_later_edits_stay_out(ws):
    (ws / "README.md").write_text("edited before fork\n")
    sb = petri("fork", "--json", cwd=ws).json["sandboxes"][0]
    (ws / "README.md").write_text("edited after fork\n")
    assert (Path(sb["path"]) / "README.md").read_text() == "edited before fork\n"
    (Path(sb["path"]) / "README.md").write_text("sandbox edit\n")
    assert (ws / "README.md").read_text() == "edited after fork\n"


def test_concurrent_forks_from_several_processes(ws):
    cmd = [sys.executable, "-m", "orchestrator.cli", "fork", "--from", "live", "-n", "2", "--json"]
    procs = [subprocess.Popen(cmd, cwd=ws, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    import json
    ids = [sb["id"] for out, _ in outs for sb in json.loads(out)["sandboxes"]]
    assert len(ids) == 6 and len(set(ids)) == 6
    ls = petri("ls", "--json", cwd=ws).json["sandboxes"]
    assert sorted(x["id"] for x in ls) == sorted(ids)
    assert all(x["state"] == "ready" and Path(x["path"], "README.md").exists() for x in ls)


def test_rm_and_snapshots_in_use(ws):
    s = petri("snapshot", "--json", cwd=ws).json["id"]
    sb = petri("fork", "--from", s, "--json", cwd=ws).json["sandboxes"][0]
    r = petri("rm", s, cwd=ws)
    assert r.rc == 1 and sb["id"] in r.err
    r = petri("rm", sb["id"], "--json", cwd=ws)
    assert r.rc == 0 and r.json["removed"] == [sb["id"]]
    assert not Path(sb["path"]).exists()
    assert petri("status", sb["id"], "--json", cwd=ws).json["sandboxes"][0]["state"] == "destroyed"
    r = petri("rm", s, "--json", cwd=ws)
    assert r.rc == 0 and s in r.json["removed"]
    assert not (ws / ".petri/snapshots" / s).exists()


def test_rollback_snapshot_is_exact_and_undoable(ws):
    (ws / ".git").mkdir()
    (ws / ".git/HEAD").write_text("ref: refs/heads/main\n")
    before = C.manifest(ws, frozenset({b".petri", b".git"}))
    s = petri("snapshot", "-m", "good", "--json", cwd=ws).json["id"]
    (ws / "README.md").write_text("risky\n")
    (ws / "newdir/deep").mkdir(parents=True)
    (ws / "newdir/deep/f").write_text("f")
    os.unlink(ws / "src/link-to-app")
    os.chmod(ws / "src/run.sh", 0o600)
    import shutil
    shutil.rmtree(ws / "empty")
    (ws / ".git/HEAD").write_text("ref: refs/heads/risky\n")  # .git is never rewound
    risky = C.manifest(ws, frozenset({b".petri", b".git"}))
    r = petri("rollback", s, "--json", cwd=ws)
    assert r.rc == 0, r
    doc = r.json
    assert doc["kind"] == "snapshot" and doc["restored"] == s and doc["safety_snapshot"].startswith("s-")
    assert set(doc["changed"]) >= {"README.md", "newdir", "src/link-to-app", "src/run.sh", "empty"}
    assert not C.diff_manifests(before, C.manifest(ws, frozenset({b".petri", b".git"})))
    assert (ws / ".git/HEAD").read_text() == "ref: refs/heads/risky\n"
    # and the rollback itself can be undone
    r = petri("rollback", doc["safety_snapshot"], "--json", cwd=ws)
    assert r.rc == 0, r
    assert not C.diff_manifests(risky, C.manifest(ws, frozenset({b".petri", b".git"})))


def test_gc_prunes_implicit_snapshots_and_half_made_things(ws):
    a = petri("fork", "--json", cwd=ws).json["sandboxes"][0]
    petri("fork", "--json", cwd=ws)
    petri("rm", a["id"], cwd=ws)
    # a half-made tree and a stale "creating" row whose process died
    store = ws / ".petri"
    (store / "tmp" / "s-dead.999999.abcd").mkdir()
    (store / "sandboxes" / "sb-leaked00" / "tree").mkdir(parents=True)
    import sqlite3
    db = sqlite3.connect(store / "registry.db")
    db.execute("INSERT INTO sandboxes(id, label, backend, state, base, path, created_at, limits, owner_pid)"
               " VALUES ('sb-creating', NULL, 'copy', 'creating', ?, '/x', 0, '{}', 999999)", (a["base"],))
    db.commit()
    db.close()
    (store / "sandboxes" / "sb-creating" / "tree").mkdir(parents=True)
    r = petri("gc", "--json", cwd=ws)
    assert r.rc == 0, r
    doc = r.json
    assert a["base"] in doc["removed"], "the implicit snapshot only the removed sandbox used must go"
    assert {"mounts", "processes", "cgroups", "promotions_finished", "promotions_undone"} <= set(doc["reaped"])
    assert not (store / "tmp" / "s-dead.999999.abcd").exists()
    assert not (store / "sandboxes" / "sb-leaked00").exists()
    assert not (store / "sandboxes" / "sb-creating").exists()
    assert petri("status", "sb-creating", "--json", cwd=ws).json["sandboxes"][0]["state"] == "failed"
    # a second gc finds nothing
    again = petri("gc", "--json", cwd=ws).json
    assert again["removed"] == [] and sum(again["reaped"].values()) == 0


def test_ttl_expiry_keeps_record_and_destroys_tree(ws):
    gone = petri("fork", "--ttl", "1s", "--label", "short", "--json", cwd=ws).json["sandboxes"][0]
    kept = petri("fork", "--ttl", "1s", "--keep-expired", "--json", cwd=ws).json["sandboxes"][0]
    time.sleep(1.5)
    ls = {x["id"]: x for x in petri("ls", "--json", cwd=ws).json["sandboxes"]}
    assert ls[gone["id"]]["state"] == "expired" and ls[kept["id"]]["state"] == "expired"
    assert not Path(gone["path"]).exists()
    assert Path(kept["path"]).exists()
    r = petri("rm", "--expired", "--json", cwd=ws)
    assert r.rc == 0 and r.json["removed"] == [kept["id"]]
    assert not Path(kept["path"]).exists()
    # the label is free again once its sandbox expired
    assert petri("fork", "--label", "short", "--json", cwd=ws).rc == 0


def test_deinit_refuses_with_sandboxes_then_force(ws):
    sb = petri("fork", "--json", cwd=ws).json["sandboxes"][0]
    r = petri("deinit", cwd=ws)
    assert r.rc == 1 and sb["id"] in r.err
    r = petri("deinit", "--force", "--json", cwd=ws)
    assert r.rc == 0, r
    assert not (ws / ".petri").exists()
    assert (ws / "README.md").exists()


@pytest.fixture
def tiny_tmpfs(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "petri-test-tiny", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_disk_full_while_snapshotting_leaves_nothing_half_made(tiny_tmpfs):
    w = tiny_tmpfs / "p"
    w.mkdir()
    (w / "a.bin").write_bytes(os.urandom(900 << 10))
    r = petri("init", str(w), "--backend", "copy", "--json")
    assert r.rc == 0, r
    (w / "b.bin").write_bytes(os.urandom(1000 << 10))
    r = petri("snapshot", "--json", cwd=w)
    assert r.rc == 1, r
    assert "no space left" in r.err and len(r.err.strip().splitlines()) == 1
    assert r.json["exit_code"] == 1
    assert list((w / ".petri/tmp").iterdir()) == []
    assert len(petri("snapshots", "--json", cwd=w).json["snapshots"]) == 1
    snaps = [p.name for p in (w / ".petri/snapshots").iterdir()]
    assert len(snaps) == 1
