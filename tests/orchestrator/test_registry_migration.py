"""Schema 2 of the registry (lineage columns, the audit trail, timings): a registry made by
the code before it (schema 1, verbatim below) is upgraded in place on first open, its rows
kept, and then used by petri as any other; a newer one than this code knows is refused."""
from __future__ import annotations

import json
import sqlite3
import sys
import time

import pytest

from orchestrator.errors import RegistryTooNew
from orchestrator.registry import SCHEMA_VERSION, Registry
from tests.conftest import petri

# orchestrator/registry.py's _SCHEMA at schema 1 (main before this change), verbatim.
SCHEMA_1 = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS snapshots (
    id TEXT PRIMARY KEY, message TEXT NOT NULL DEFAULT '', implicit INTEGER NOT NULL,
    created_at REAL NOT NULL, backend TEXT NOT NULL, parent TEXT, bytes_copied INTEGER NOT NULL DEFAULT 0,
    kind TEXT NOT NULL DEFAULT 'user');
CREATE TABLE IF NOT EXISTS sandboxes (
    id TEXT PRIMARY KEY, label TEXT, backend TEXT NOT NULL, state TEXT NOT NULL, base TEXT NOT NULL,
    path TEXT NOT NULL, created_at REAL NOT NULL, expires_at REAL, limits TEXT NOT NULL,
    keep_expired INTEGER NOT NULL DEFAULT 0, last_exit_code INTEGER, peak_memory_bytes INTEGER,
    owner_pid INTEGER, meta TEXT NOT NULL DEFAULT '{}');
CREATE UNIQUE INDEX IF NOT EXISTS sandboxes_live_label ON sandboxes(label)
    WHERE label IS NOT NULL AND state NOT IN ('destroyed', 'failed', 'expired');
CREATE TABLE IF NOT EXISTS runs (
    sandbox TEXT NOT NULL, n INTEGER NOT NULL, argv TEXT NOT NULL, started_at REAL NOT NULL,
    finished_at REAL, exit_code INTEGER, duration_s REAL, killed_by TEXT, limits_hit TEXT NOT NULL DEFAULT '[]',
    stdout_path TEXT NOT NULL, stderr_path TEXT NOT NULL, peak_memory_bytes INTEGER, pid INTEGER,
    PRIMARY KEY (sandbox, n));
CREATE TABLE IF NOT EXISTS promotions (
    id TEXT PRIMARY KEY, sandbox TEXT NOT NULL, created_at REAL NOT NULL, state TEXT NOT NULL,
    doc TEXT NOT NULL DEFAULT '{}');
"""


def test_a_schema_1_workspace_is_upgraded_in_place_and_works(tmp_path):
    ws = tmp_path / "proj"
    ws.mkdir()
    (ws / "a.txt").write_text("a\n")
    r = petri("init", "--backend", "copy", "--json", cwd=ws)
    assert r.rc == 0, r
    first = r.json["snapshot"]
    r = petri("fork", "--label", "old", "--json", cwd=ws)
    sb = r.json["sandboxes"][0]["id"]
    db_path = ws / ".petri" / "registry.db"
    # Take it back to what schema 1 had: its tables and columns exactly, rows kept.
    db = sqlite3.connect(db_path, isolation_level=None)
    for table in ("snapshots", "sandboxes", "runs", "promotions", "meta"):
        db.execute(f"ALTER TABLE {table} RENAME TO old_{table}")
    db.execute("DROP INDEX IF EXISTS sandboxes_live_label")
    db.executescript(SCHEMA_1)
    for table in ("snapshots", "sandboxes", "runs", "promotions", "meta"):
        cols = [c[1] for c in db.execute(f"PRAGMA table_info({table})")]
        db.execute(f"INSERT INTO {table} ({','.join(cols)}) SELECT {','.join(cols)} FROM old_{table}")
        db.execute(f"DROP TABLE old_{table}")
    for t in ("audit", "timings"):
        db.execute(f"DROP TABLE {t}")
    db.execute("PRAGMA user_version = 1")
    assert {c[1] for c in db.execute("PRAGMA table_info(snapshots)")} == {
        "id", "message", "implicit", "created_at", "backend", "parent", "bytes_copied", "kind"}
    db.close()

    r = petri("ls", "--json", cwd=ws)  # the first open upgrades it
    assert r.rc == 0, r
    assert [s["id"] for s in r.json["sandboxes"]] == [sb] and r.json["sandboxes"][0]["generation"] == 0
    reg = Registry(db_path)
    try:
        assert reg.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 6
        assert {"sandbox", "origin"} <= {c[1] for c in reg.db.execute("PRAGMA table_info(snapshots)")}
        assert "output" in {c[1] for c in reg.db.execute("PRAGMA table_info(runs)")}  # schema 3
        assert "watches" in {r[0] for r in reg.db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}  # 4
        assert "system" in {c[1] for c in reg.db.execute("PRAGMA table_info(sandboxes)")}  # schema 5
        assert reg.sandbox(sb).system is False
        assert reg.snapshot(first) is not None and reg.snapshot(first).origin is None
        reg.db.execute("INSERT INTO audit(ts, op, argv, via) VALUES (1, 'x', '[]', 'api')")
        for stmt in ("UPDATE audit SET op = 'y'", "DELETE FROM audit"):
            with pytest.raises(sqlite3.IntegrityError):
                reg.db.execute(stmt)
    finally:
        reg.close()
    r = petri("fork", "--from", "old", "--json", cwd=ws)  # lineage works on the upgraded registry
    assert r.rc == 0 and r.json["sandboxes"][0]["parent"] == sb, r
    log = petri("log", "--json", cwd=ws).json["entries"]
    assert [e["op"] for e in log] == ["x", "fork"]  # what came before the trail existed is not invented
    petri("deinit", "--force", cwd=ws)


# The commit this change was made on: its own registry.py makes the schema 1 registry.
SCHEMA_1_COMMIT = "b92456c5e204890352f2befa67985b661cf11488"


def test_a_registry_made_by_the_schema_1_code_itself(tmp_path):
    import importlib.util
    import subprocess

    from tests.conftest import REPO

    got = subprocess.run(["git", "show", f"{SCHEMA_1_COMMIT}:orchestrator/registry.py"], cwd=REPO,
                         capture_output=True, text=True)
    if got.returncode != 0:
        pytest.skip(f"the schema 1 code is not in this checkout's history ({got.stderr.strip()})")
    src = tmp_path / "registry_v1.py"
    src.write_text(got.stdout.replace("from .errors import", "from orchestrator.errors import"))
    spec = importlib.util.spec_from_file_location("registry_v1", src)
    v1 = importlib.util.module_from_spec(spec)
    sys.modules["registry_v1"] = v1  # dataclasses look their module up
    try:
        spec.loader.exec_module(v1)  # type: ignore[union-attr]
    finally:
        del sys.modules["registry_v1"]
    path = tmp_path / "registry.db"
    old = v1.Registry(path, create=True)
    old.add_snapshot(v1.SnapshotRow("s-1", "first", False, 1.0, "copy", None, 0))
    old.add_sandbox(v1.SandboxRow("sb-1", "lbl", "copy", "ready", "s-1", "/x", 2.0, None, {}))
    old.add_promotion("p-1", "sb-1", "done", {"applied": ["a"]})
    assert old.db.execute("PRAGMA user_version").fetchone()[0] == 1
    old.close()
    reg = Registry(path)
    try:
        assert reg.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert reg.snapshot("s-1").message == "first" and reg.sandbox("sb-1").label == "lbl"
        assert reg.promotions()[0]["doc"] == {"applied": ["a"]}
        assert reg.snapshot_users("s-1") == ["sb-1"]
        assert reg.latest_snapshot().id == "s-1"
    finally:
        reg.close()


def test_a_fresh_registry_and_a_too_new_one(tmp_path):
    path = tmp_path / "registry.db"
    reg = Registry(path, create=True)
    reg.db.execute("INSERT INTO audit(ts, op, argv, via) VALUES (?, 'x', ?, 'api')", (time.time(), json.dumps([])))
    reg.close()
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(RegistryTooNew):
        Registry(path)
