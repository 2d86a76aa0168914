"""What the API gives front ends (TUI, MCP) beyond the CLI's calls: races folded from the
event stream (``ws.races``, ``ws.race_status``, ``RaceTracker``) and rollback plans that
write nothing (``ws.rollback_plan``). Real workspaces (copy backend), real races."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

import petri
from orchestrator.api import RaceTracker
from tests.helpers.api_project import FIX, needs_sandbox, ws  # noqa: F401 - ws: the copy-backend workspace fixture
from tests.helpers.api_project import ALSO_NOTES


@needs_sandbox
def test_races_fold_the_stream_into_the_race_document(ws):  # noqa: F811 - the fixture imported from tests.helpers
    race = ws.race("python3 test_calc.py", [petri.Cmd("true"), petri.Patch(text=ALSO_NOTES, name="big"),
                                             petri.Patch(text=FIX, name="fix")], keep=True)
    got = ws.race_status(race.race[:6])  # a prefix, as for every other id
    assert got.race == race.race and got.get("state") == "done"
    assert got.winner == race.winner and got.base == race.base
    assert [(c.sandbox, c.rank) for c in got.candidates] == sorted(
        ((c.sandbox, c.rank) for c in race.candidates), key=lambda t: t[1])
    assert [c.candidate for c in got.candidates] == ["fix", "big", "true"]  # fewest lines wins among passers
    assert list(got.conflicts) == list(race.conflicts) and got.conflicts[0]["paths"] == ["pkg/calc.py"]
    # every candidate names its throwaway check sandbox, so a follower can attribute output
    assert all(c.get("check_sandbox", "").startswith("sb-") for c in got.to_json()["candidates"])
    assert [r.race for r in ws.races()] == [race.race]
    with pytest.raises(petri.NotFound):
        ws.race_status("r-nope")


def _ev(name, **kw):
    return {"event": name, "pid": os.getpid(), "ts": "2025-01-01T00:00:00Z", **kw}


def test_tracker_ranks_while_the_race_runs_and_keeps_the_last_line():
    t = RaceTracker(alive=lambda pid: True)
    cands = [{"candidate": f"c{i}", "kind": "cmd", "sandbox": f"sb-{i}", "check_sandbox": f"sb-k{i}"}
             for i in range(3)]
    assert t.feed(_ev("race.started", race="r-1", base="s-1", check="make", candidates=cands)) == "r-1"
    t.feed(_ev("run.started", sandbox="sb-1", run=1))
    t.feed(_ev("run.started", sandbox="sb-k2", run=1))
    t.feed(_ev("run.output", sandbox="sb-k2", run=1, stream="stderr", line="boom"))
    doc = t.doc("r-1")
    by = {c["candidate"]: c for c in doc["candidates"]}
    assert by["c1"]["state"] == "applying" and by["c2"]["state"] == "checking"
    assert by["c2"]["last_line"] == "boom" and by["c2"]["last_stream"] == "stderr"
    t.feed(_ev("race.candidate_finished", race="r-1", sandbox="sb-2", applied=True, exit_code=0,
               duration_s=1.0, lines_added=1, lines_removed=1, files_changed=1))
    t.feed(_ev("race.candidate_finished", race="r-1", sandbox="sb-0", applied=True, exit_code=1,
               duration_s=0.5, lines_added=0, lines_removed=0, files_changed=0))
    order = [c["candidate"] for c in t.doc("r-1")["candidates"]]
    assert order == ["c2", "c1", "c0"]  # passed, still running, failed
    assert t.rank_of("sb-2") == ("r-1", 1) and t.rank_of("sb-k2") == ("r-1", 1) and t.rank_of("sb-x") is None
    # the racing process died without race.finished: interrupted, not running forever
    dead = RaceTracker(alive=lambda pid: False)
    dead.feed(_ev("race.started", race="r-2", candidates=cands))
    assert dead.doc("r-2")["state"] == "interrupted"
    # an interrupted race says so, and its unfinished candidates stopped
    t.feed(_ev("race.finished", race="r-1", winner=None, error="interrupted"))
    doc = t.doc("r-1")
    assert doc["state"] == "interrupted" and {c["state"] for c in doc["candidates"]} == {"passed", "failed", "stopped"}


@needs_sandbox
def test_rollback_plan_says_what_an_undo_would_write_and_what_blocks_it(ws):  # noqa: F811 - the fixture imported from tests.helpers
    sb = ws.fork().keep()[0]
    Path(sb.path, "pkg", "calc.py").write_text("def add(a, b):\n    return a + b\n")
    Path(sb.path, "new.txt").write_text("new\n")
    p = sb.promote()
    before = {f: (ws.root / f).read_bytes() for f in ("pkg/calc.py", "new.txt", "notes.txt")}
    plan = ws.rollback_plan(p.promotion)
    assert plan.kind == "promotion" and plan.get("dry_run") is True
    assert sorted(plan.changed) == ["new.txt", "pkg/calc.py"] and plan.get("blocked") == []
    assert {f: (ws.root / f).read_bytes() for f in before} == before  # wrote nothing
    (ws.root / "new.txt").write_text("edited in live\n")
    assert ws.rollback_plan(p.promotion).get("blocked") == ["new.txt"]
    with pytest.raises(petri.Conflict):  # the plan said so; the undo agrees
        ws.rollback(p.promotion)
    snap = ws.snapshots()[0]
    splan = ws.rollback_plan(snap.id)
    assert splan.kind == "snapshot" and {"new.txt", "pkg/calc.py"} <= set(splan.changed)
    assert (ws.root / "new.txt").read_text() == "edited in live\n"


@needs_sandbox
def test_aio_front_end_calls(ws):  # noqa: F811 - the fixture imported from tests.helpers
    import anyio

    import petri.aio as pa

    sb = ws.fork().keep()[0]
    Path(sb.path, "notes.txt").write_text("changed\n")
    p = sb.promote()

    async def main() -> None:
        aws = await pa.open(ws.root)
        plan = await aws.rollback_plan(p.promotion)
        assert plan.changed == ["notes.txt"]
        assert await aws.races() == []

    anyio.run(main, backend="asyncio")
