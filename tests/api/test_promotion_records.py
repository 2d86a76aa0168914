"""The promotion family's services return typed records: ``promote`` (plain, ``verify``,
``dry_run``, a conflict settled with markers or ``theirs``), a staged promotion (``to``), the
``promotions`` list, ``rollback`` of a promotion and of a snapshot, ``try`` and ``rebase``.
Nothing is in ``extra``, and each record's ``to_json()`` is the document the CLI's ``--json``
prints for the same operation on a sandbox made the same way (keys, their order, and every
value that does not name this run). Real workspace (copy backend), real sandboxes."""
from __future__ import annotations

import json
from pathlib import Path

import petri
from tests.conftest import petri as petri_cli
from tests.helpers.api_project import needs_sandbox, ws  # noqa: F401 - ws: the fixture

# What names this run rather than the operation: ids, times, paths, snapshots.
_VOLATILE = {"promotion", "sandbox", "base", "duration_s", "created_at", "restored", "safety_snapshot", "from",
             "path", "parent", "pipeline", "snapshot_before", "snapshot_after", "stdout_path", "stderr_path",
             "fresh_sandbox", "id", "at", "label", "hunks", "stages_undone", "metric_base"}
FIXED = "def add(a, b):\n    return a + b\n"


def _shape(doc):
    """The document with every volatile value blanked, keys and order kept."""
    if isinstance(doc, dict):
        return {k: ("*" if k in _VOLATILE and v is not None else _shape(v)) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_shape(v) for v in doc]
    return doc


def _keys(doc):
    """Every key of the document, nested, in order."""
    if isinstance(doc, dict):
        return [(k, _keys(v)) for k, v in doc.items()]
    if isinstance(doc, list):
        return [_keys(v) for v in doc]
    return None


def same(rec, cli: dict) -> None:
    """``rec`` is typed (nothing in ``extra``) and its document is the CLI's."""
    assert dict(rec.extra) == {}, rec.extra
    api = rec.to_json()
    assert _keys(api) == _keys(cli), (list(api), list(cli))
    assert _shape(api) == _shape(cli)
    assert json.dumps(_shape(api)) == json.dumps(_shape(cli))  # byte for byte, the volatile values aside
    back = type(rec).from_doc(cli)  # the CLI's document read back: the same record's keys, nothing left over
    assert back.to_json() == cli and dict(back.extra) == {}


def fixed(w, text: str = FIXED):
    """A kept sandbox whose calc.py is fixed (made the same way for the API and the CLI)."""
    sb = w.fork().keep()[0]
    Path(sb.path, "pkg", "calc.py").write_text(text)
    return sb


def cli(w, command: str, *args: str, rc: int = 0) -> dict:
    got = petri_cli(command, "--json", *args, cwd=w.root)
    assert got.rc == rc, got
    return json.loads(got.out)


@needs_sandbox
def test_promote_and_rollback_records_are_the_cli_documents(ws):  # noqa: F811 - the fixture
    for kw, flags in (({"dry_run": True}, ["--dry-run"]), ({}, []),
                      ({"verify": "python3 test_calc.py"}, ["--verify", "python3 test_calc.py"])):
        a, b = fixed(ws), fixed(ws)
        rec = ws.promote(a, **kw)
        assert isinstance(rec, petri.PromoteResult) and not isinstance(rec, petri.Pipeline)
        assert rec.applied == ["pkg/calc.py"] and (rec.promotion is None) == bool(kw.get("dry_run"))
        assert rec.verified is (True if kw.get("verify") else None) and rec.plan["ops"]
        undo = ws.rollback(rec.promotion) if rec.promotion else None
        doc = cli(ws, "promote", b.id, *flags)
        same(rec, doc)
        if undo is not None:
            assert isinstance(undo, petri.Rollback) and undo.changed == ["pkg/calc.py"]
            same(undo, cli(ws, "rollback", doc["promotion"]))
        assert "a - b" in (ws.root / "pkg" / "calc.py").read_text()
    # a conflict settled: markers (exit 5, the result carried by the error) and theirs
    for mode, code in (("markers", 5), ("theirs", 0)):
        a, b = (fixed(ws, FIXED + "# sandbox\n") for _ in range(2))
        (ws.root / "pkg" / "calc.py").write_text("def add(a, b):\n    return a * b\n")
        try:
            rec = ws.promote(a, on_conflict=mode)
        except petri.MarkersWritten as err:
            rec = err.result
        assert rec.conflicts and rec.promotion and (rec.markers is (mode == "markers"))
        ws.rollback(rec.promotion)
        doc = cli(ws, "promote", b.id, "--on-conflict", mode, rc=code)
        same(rec, doc)
        cli(ws, "rollback", doc["promotion"])
        (ws.root / "pkg" / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    # the promotions list is the CLI's, exactly (the same state, read twice)
    listed = ws.promotion_list(include_conflicts=True)
    assert all(isinstance(p, petri.Promotion) and dict(p.extra) == {} for p in listed.promotions)
    assert listed.to_json() == cli(ws, "promotions", "--all")
    # a snapshot rollback (with its safety snapshot), the same change undone twice
    snap = ws.snapshot("before")
    (ws.root / "notes.txt").write_text("changed\n")
    rec = ws.rollback(snap.id)
    assert rec.kind == "snapshot" and rec.safety_snapshot and rec.changed == ["notes.txt"]
    snap = ws.snapshot("before")
    (ws.root / "notes.txt").write_text("changed\n")
    same(rec, cli(ws, "rollback", snap.id))


@needs_sandbox
def test_staged_promotion_record_is_the_cli_document(ws):  # noqa: F811 - the fixture
    (ws.root / ".petri" / "config.toml").write_text(
        '[[stages]]\nname = "fresh"\ntarget = "fresh"\nchecks = ["python3 test_calc.py"]\n\n'
        '[[stages]]\nname = "dev"\ntarget = "workspace"\nchecks = ["python3 test_calc.py"]\n')
    a, b = fixed(ws), fixed(ws)
    rec = ws.promote(a, to="dev")
    assert isinstance(rec, petri.Pipeline) and rec.state == "done" and rec.complete and len(rec.stages) == 2
    undo = ws.rollback(rec.pipeline)  # its first stage: the later one is undone first
    assert undo.pipeline == rec.pipeline and len(undo.stages) == 2 and dict(undo.extra) == {}
    doc = cli(ws, "promote", b.id, "--to", "dev")
    same(rec, doc)
    same(undo, cli(ws, "rollback", doc["pipeline"]))


@needs_sandbox
def test_try_and_rebase_records_are_the_cli_documents(ws):  # noqa: F811 - the fixture
    cmd = "sed -i 's/a - b/a + b/' pkg/calc.py"
    rec = ws.try_(["sh", "-c", cmd], check="python3 test_calc.py")  # no promote, no confirm: declined
    assert isinstance(rec, petri.TryResult) and rec.outcome == "declined" and rec.exit_code == 0
    same(rec, cli(ws, "try", "--check", "python3 test_calc.py", "--", "sh", "-c", cmd))
    rec = ws.try_(["sh", "-c", cmd], check="python3 test_calc.py", promote=True)
    assert rec.outcome == "promoted" and isinstance(rec.promotion, dict) and rec.promotion["promotion"]
    ws.rollback(rec.promotion["promotion"])
    doc = cli(ws, "try", "--yes", "--check", "python3 test_calc.py", "--", "sh", "-c", cmd)
    same(rec, doc)
    cli(ws, "rollback", doc["promotion"]["promotion"])
    a, b = fixed(ws), fixed(ws)
    (ws.root / "notes.txt").write_text("one\ntwo\nthree\nfour\n")  # live moved on since their base
    rec = ws.rebase(a)
    assert isinstance(rec, petri.Rebased) and rec.from_ == a.id and rec.applied == ["pkg/calc.py"]
    assert rec.to_json()["from"] == a.id and rec.get("from") == a.id
    same(rec, cli(ws, "rebase", b.id))
