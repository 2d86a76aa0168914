"""The one race candidate type (``race_plan.Candidate``): what ``petri.Patch``/``petri.Cmd``,
the command line (``interleave``) and a cluster node's spec make, and its one serialisation
(``to_json``/``from_json``). Pure: no root, no sandbox."""
from __future__ import annotations

import json

import pytest

import petri
from orchestrator.errors import PatchUnreadable
from orchestrator.limits import Limits
from orchestrator.race_plan import Candidate, Outcome, RacePlan, interleave, load_candidates, outcome_of_spec

pytestmark = pytest.mark.unit

BINARY = bytes(range(256)) + b"\x00\xff\r\n"  # every byte value, NULs and a lone CR included


def _wire(c: Candidate) -> Candidate:
    """Through JSON text, as a node's spec or a race document would carry it."""
    return Candidate.from_json(json.loads(json.dumps(c.to_json(data=True))))


@pytest.mark.parametrize("cand", [
    petri.Patch(text="--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n", name="fix"),
    petri.Patch(text=BINARY, name="bin"),
    petri.Patch(text=b""),  # an empty patch is still a patch (git apply says no)
    petri.Cmd("sed -i 's/a/b/' x && echo 'ünïcode'"),
], ids=["patch-text", "patch-binary", "patch-empty", "cmd"])
def test_candidate_round_trips_through_json(cand):
    back = _wire(cand)
    assert back == cand and back.data == cand.data and type(back.data) is type(cand.data)
    assert back.kind == cand.kind and back.text == cand.text


def test_a_patch_file_is_read_once_loaded_and_its_bytes_cross_exactly(tmp_path):
    (tmp_path / "b.patch").write_bytes(BINARY)
    made = petri.Patch(tmp_path / "b.patch")
    assert made.data is None  # read when the race loads it, not when made
    loaded, = load_candidates([made])
    assert loaded.data == BINARY and loaded.text == str(tmp_path / "b.patch")
    assert _wire(loaded) == loaded


def test_a_named_patch_reads_its_path_not_its_name(tmp_path, monkeypatch):
    # MCP names a patch by the path the client gave (relative to the workspace) and reads the
    # file at the workspace's path: the name is never a path read from the server's cwd.
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "fix.patch").write_bytes(b"right")
    (tmp_path / "cwd").mkdir()
    (tmp_path / "cwd" / "fix.patch").write_bytes(b"wrong")
    monkeypatch.chdir(tmp_path / "cwd")
    loaded, = load_candidates([petri.Patch(tmp_path / "root" / "fix.patch", name="fix.patch")])
    assert loaded.data == b"right" and loaded.to_json() == {"candidate": "fix.patch", "kind": "patch"}


def test_the_document_row_is_the_candidate_and_kind_only():
    assert petri.Cmd("make").to_json() == {"candidate": "make", "kind": "cmd"}
    assert list(petri.Patch(text=b"x", name="p").to_json()) == ["candidate", "kind"]  # no bytes in the document
    assert petri.Cmd("make").to_json(data=True) == {"candidate": "make", "kind": "cmd", "data_b64": None}


def test_bad_candidates_are_refused_before_anything(tmp_path):
    with pytest.raises(PatchUnreadable):
        load_candidates([petri.Patch(tmp_path / "missing.patch")])
    with pytest.raises(PatchUnreadable):
        load_candidates([petri.Cmd("  ")])
    with pytest.raises(petri.UsageError, match="petri.Patch"):
        load_candidates([{"cmd": "true"}])  # a dict is not a candidate
    with pytest.raises(petri.UsageError):
        petri.Patch()


def test_command_line_order_gives_candidates():
    argv = ["race", "--cmd", "make a", "--patch=x.patch", "--check", "t", "--patch", "y.patch"]
    assert interleave(argv, ["x.patch", "y.patch"], ["make a"]) == [
        petri.Cmd("make a"), Candidate("patch", "x.patch"), Candidate("patch", "y.patch")]


def test_the_cluster_spec_carries_the_candidate_whole():
    plan = RacePlan("r-1", "true", limits=Limits(), seccomp="default")
    cand = petri.Patch(text=BINARY, name="bin")
    spec = json.loads(json.dumps(plan.candidate_spec(Outcome(3, cand, "sb-a", check_sandbox="sb-b"), {})))
    o = outcome_of_spec(spec)
    assert (o.index, o.candidate, o.candidate.data, o.sandbox, o.check_sandbox) == (3, cand, BINARY, "sb-a", "sb-b")


def test_a_race_folded_from_events_is_typed_too():
    from orchestrator.api.race_view import RaceTracker
    from orchestrator.results import Race

    t = RaceTracker(alive=lambda pid: True)
    ev = {"pid": 1, "ts": "2025-01-01T00:00:00Z"}
    rows = [{**petri.Cmd("true").to_json(), "sandbox": "sb-1", "check_sandbox": "sb-k1"},
            {**petri.Patch(text=b"x", name="p").to_json(), "sandbox": "sb-2", "check_sandbox": "sb-k2"}]
    t.feed({**ev, "event": "race.started", "race": "r-1", "base": "s-1", "check": "t", "candidates": rows, "jobs": 8})
    t.feed({**ev, "event": "run.output", "sandbox": "sb-k1", "run": 1, "stream": "stdout", "line": "hi"})
    t.feed({**ev, "event": "race.candidate_finished", "race": "r-1", "sandbox": "sb-2", "applied": False,
            "error": "did not apply"})
    rec = t.record("r-1")  # built typed by the tracker (``Race.of``), not read back from its document
    assert isinstance(rec, Race) and rec.to_json() == {"schema": 1, **t.doc("r-1")}
    assert list(rec.to_json()["candidates"][0]) == list(t.doc("r-1")["candidates"][0])
    assert dict(rec.extra) == {} and all(dict(c.extra) == {} for c in rec.candidates)
    assert Race.from_doc(t.doc("r-1")) == rec
    assert rec.state == "running" and [c.state for c in rec.candidates] == ["waiting", "not_applied"]
    assert [Candidate.from_json(c.to_json()) for c in rec.candidates] == [petri.Cmd("true"), Candidate("patch", "p")]
    # once the race is over: its final ranks, the rows' kept and passed, still every key typed
    t.feed({**ev, "event": "race.finished", "race": "r-1", "winner": "sb-1", "duration_s": 1.5, "conflicts": [],
            "candidates": [{"sandbox": "sb-1", "rank": 1, "applied": True, "exit_code": 0, "passed": True,
                            "kept": True}, {"sandbox": "sb-2", "rank": 2, "kept": False, "passed": False}]})
    done = t.record("r-1")
    assert done.to_json() == {"schema": 1, **t.doc("r-1")} and not done.extra
    assert done.state == "done" and done.winner == "sb-1" and [(c.rank, c.kept) for c in done.candidates] == \
        [(1, True), (2, False)] and not any(c.extra for c in done.candidates)
