"""The records of ``log``, ``stats`` and ``evolve`` as their services build them (``of``: the
keys given, in order, every one a typed field): nothing lands in ``extra``, a document read
back (``from_doc``) is the same document; and the services themselves (``audit.entries``,
``kpi.stats_record``) return them typed, the breach of a ``[kpi]`` threshold carrying the
record. A copy-backend workspace in a temporary directory: no root, mount or sandbox."""
from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator import audit, kpi
from orchestrator.errors import KpiBreach, UsageError
from orchestrator.results import AuditEntry, AuditLog, Evolution, Stats

pytestmark = pytest.mark.unit

# One document per record, every key its service writes, in the order it writes them.
ENTRY = {"ts": "2026-01-01T00:00:00.000Z", "op": "fork", "argv": ["petri", "fork", "--json"], "uid": 0, "via": "cli",
         "reason": "why", "exit_code": 0, "ids": ["s-1", "sb-1"], "result": "ok", "client": "claude", "sudo_uid": 1000,
         "duration_s": 0.2, "seq": 1}
STATS = {"since": None,
         "ops": {op: {"n": 0, "p50_s": None, "p95_s": None, "p99_s": None, "max_s": None} for op in kpi.OPS},
         "rates": {"race_success": {"rate": None, "count": 0, "of": 0}},
         "notes": dict(kpi.NOTES), "counts": {"net_denied": {"n": 1, "by_sandbox": {"sb-1": 1}}},
         "breaches": [{"kpi": "fork_p95", "value": 3.0, "limit": 2.0, "message": "fork p95 3.000s is over 2s (n=1)"}]}
FITNESS = {"passed": True, "score": 1.0, "lines": 2, "duration_s": 0.5}
EVOLUTION = {"seed": "sb-0", "best": "sb-2", "best_fitness": FITNESS, "survivors": ["sb-2"],
             "generations": [{"generation": 1, "parents": ["sb-0"], "races": ["r-1"],
                              "candidates": [{"sandbox": "sb-2", "generation": 1, "parent": "sb-0", "race": "r-1",
                                              "rank": 1, "candidate": "+1", "metrics": {"score": 1},
                                              "fitness": FITNESS}],
                              "survivors": ["sb-2"]}],
             "metrics_file": ".petri-metrics.json"}


@pytest.mark.parametrize("cls, doc", [(AuditEntry, ENTRY), (Stats, STATS), (Evolution, EVOLUTION)])
def test_built_records_are_typed_and_give_back_the_document(cls, doc):
    rec = cls.of(**doc)
    assert dict(rec.extra) == {}
    assert rec.to_json() == {"schema": 1, **doc} and list(rec.to_json()) == ["schema", *doc]
    back = cls.from_doc(rec.to_json())
    assert dict(back.extra) == {} and back.to_json() == rec.to_json() and back == rec
    for key, value in doc.items():
        assert rec.get(key) == value
    with pytest.raises(TypeError):
        cls.of(**doc, surprise=1)


def test_the_log_nests_its_entries():
    log = AuditLog.of(entries=(AuditEntry.of(**ENTRY),))
    assert log.to_json() == {"schema": 1, "entries": [ENTRY]}
    back = AuditLog.from_doc(log.to_json())
    assert back.entries[0].result == "ok" and not back.entries[0].extra and back.to_json() == log.to_json()


@pytest.fixture
def engine(tmp_path: Path):
    from orchestrator.services import Engine

    root = tmp_path / "proj"
    root.mkdir()
    (root / "a.txt").write_text("one\n")
    e, _ = Engine.init(root, "copy")
    try:
        yield e
    finally:
        try:
            e.deinit(force=True)
        finally:
            e.close()


def test_audit_entries_are_typed_rows(engine) -> None:
    e = engine
    with audit.operation("fork", ["fork", "n=1"], "api", reason="look around", client="claude", root=e.root):
        made = e.fork("live", 1)[0]
    with pytest.raises(UsageError):
        with audit.operation("rm", ["rm", "sb-nope"], "mcp", root=e.root):
            raise UsageError(detail="no sandbox sb-nope")
    rows = audit.entries(e.registry)
    assert all(isinstance(r, AuditEntry) and dict(r.extra) == {} for r in rows)
    assert [list(r.to_json()) for r in rows] == [["schema", *ENTRY]] * 2
    fork, rm = rows
    assert fork.op == "fork" and fork.argv == ["fork", "n=1"] and fork.reason == "look around"
    assert fork.client == "claude" and fork.result == "ok" and made.id in fork.ids and fork.seq < rm.seq
    assert rm.via == "mcp" and rm.exit_code == 2 and "sb-nope" in (rm.result or "")
    assert isinstance(rm.duration_s, float)
    assert [r.op for r in audit.entries(e.registry, op="rm")] == ["rm"]
    assert audit.entries(e.registry, limit=1) == [rm]


def test_stats_record_is_typed_and_a_breach_carries_it(engine) -> None:
    e = engine
    e.registry.db.execute("DELETE FROM timings")  # the test decides every figure
    kpi.record(e.registry, "fork", 3.0)
    kpi.record(e.registry, "race", 1.0, detail={"winner": True})
    rec = kpi.stats_record(e.registry, e.store.root, thresholds={"fork_p95": 2.0, "race_success": 0.5})
    assert isinstance(rec, Stats) and dict(rec.extra) == {}
    assert list(rec.to_json()) == ["schema", *STATS]
    assert rec.since is None and rec.ops["fork"]["max_s"] == 3.0 and rec.rates["race_success"]["rate"] == 1.0
    assert rec.notes == kpi.NOTES and rec.counts == {"net_denied": {"n": 0, "by_sandbox": {}}}
    assert [b["kpi"] for b in rec.breaches] == ["fork_p95"]
    with pytest.raises(KpiBreach) as caught:
        kpi.stats_record(e.registry, e.store.root, thresholds={"fork_p95": 2.0}, check=True)
    assert caught.value.result.breaches == rec.breaches and "fork p95 3.000s is over 2s" in str(caught.value)
    later = kpi.stats_record(e.registry, e.store.root, since=4102444800.0, check=True)  # 2100: nothing since
    assert later.since == "2100-01-01T00:00:00.000Z" and later.ops["fork"]["n"] == 0 and later.breaches == []
