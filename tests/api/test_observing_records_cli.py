"""``log`` and ``stats``, as the API returns them, are the documents the CLI prints: the
record has nothing in ``extra`` (nor any entry of the log), and its ``to_json()`` is ``petri
log --json`` / ``petri stats --json`` of the same workspace, byte for byte (both read the same
rows; only ``--since``'s own time differs between two calls). A ``stats --check`` breach:
the record ``KpiBreach`` carries, with the error and the exit code, is the CLI's document.
Real workspace (copy backend); nothing is run in a sandbox."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import petri
from orchestrator import kpi
from orchestrator.errors import KpiBreach
from tests.conftest import api_workspace, petri as cli


@pytest.fixture
def ws(tmp_path: Path):
    root = tmp_path / "proj"
    root.mkdir()
    (root / "a.txt").write_text("a\n")
    with api_workspace(root, reason="set up") as w:
        yield w


def _cli(w, *argv: str, rc: int = 0) -> dict:
    got = cli(argv[0], "--json", *argv[1:], cwd=w.root)
    assert got.rc == rc, got
    return json.loads(got.out)


def _typed(rec) -> bool:
    return not rec.extra and all(not e.extra for e in getattr(rec, "entries", ()))


def test_log_records_are_the_cli_documents(ws):
    sb = ws.fork(label="api", reason="look around")[0]
    ws.write_file(sb, "b.txt", "b\n", reason="add b")
    assert cli("--reason=cleanup", "rm", "sb-nope", cwd=ws.root).rc == 2  # a failure has its result line
    assert cli("fork", "--json", cwd=ws.root).rc == 0
    for kw, argv in (({}, []), ({"limit": 2}, ["--limit", "2"]), ({"op": "fork"}, ["--op", "fork"]),
                     ({"since": "1h"}, ["--since", "1h"])):
        rec = ws.log(**kw)
        doc = _cli(ws, "log", *argv)
        assert isinstance(rec, petri.AuditLog) and _typed(rec), kw
        assert json.dumps({"schema": 1, **doc}) == json.dumps(rec.to_json()), kw
        back = petri.AuditLog.from_doc(doc)
        assert _typed(back) and back == rec
    entries = ws.log().entries
    assert [e.op for e in entries] == ["init", "fork", "write_file", "rm", "fork"]
    bad = entries[3]
    assert bad.via == "cli" and bad.reason == "cleanup" and bad.exit_code == 2 and "sb-nope" in bad.result
    assert all(isinstance(e.seq, int) and isinstance(e.duration_s, float) for e in entries)


def test_stats_records_are_the_cli_documents(ws):
    sb = ws.fork()[0]
    ws.remove(sb)
    rec = ws.stats()
    assert isinstance(rec, petri.Stats) and _typed(rec) and rec.ops["fork"]["n"] >= 1
    assert json.dumps({"schema": 1, **_cli(ws, "stats")}) == json.dumps(rec.to_json())
    assert list(rec.to_json()) == ["schema", "since", "ops", "rates", "notes", "counts", "breaches"]
    recent, doc = ws.stats(since="1h"), _cli(ws, "stats", "--since", "1h")
    assert _typed(recent) and recent.since is not None and doc["since"] is not None
    assert {**recent.to_json(), "since": "*"} == {"schema": 1, **doc, "since": "*"}

    kpi.record(ws.engine.registry, "fork", 5.0)  # a figure that breaks the threshold whatever this machine's speed
    (ws.root / ".petri" / "config.toml").write_text('[kpi]\nfork_max = "1s"\n')
    with pytest.raises(KpiBreach) as caught:
        ws.stats(check=True)
    err = caught.value
    assert _typed(err.result) and [b["kpi"] for b in err.result.breaches] == ["fork_max"]
    doc = _cli(ws, "stats", "--check", rc=1)
    assert json.dumps({"schema": 1, **doc}) \
        == json.dumps({**err.result.to_json(), "error": str(err), "exit_code": err.exit_code})
    assert ws.stats().breaches == err.result.breaches  # without check: the same record, returned
