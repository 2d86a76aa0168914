"""``Workspace.race`` returns the typed race record, built from the race's outcomes: nothing
in ``extra``, and its ``to_json()`` is the document ``petri race --json`` prints for the same
race (keys, their order, and every value that does not name this run). Real workspace (copy
backend), real sandboxes."""
from __future__ import annotations

import json
from pathlib import Path

import petri
from tests.helpers.api_project import ALSO_NOTES, FIX, needs_sandbox, ws  # noqa: F401 - ws: the fixture

# What names this run rather than the race: ids, times, paths, the staleness probe.
_VOLATILE = {"race", "base", "sandbox", "check_sandbox", "winner", "winner_path", "duration_s", "stdout_path",
             "stderr_path", "stale", "promotion", "sandboxes"}


def _shape(doc):
    """The document with every volatile value blanked, keys and order kept."""
    if isinstance(doc, dict):
        return {k: ("*" if k in _VOLATILE and v is not None else _shape(v)) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_shape(v) for v in doc]
    return doc


@needs_sandbox
def test_race_record_is_typed_and_is_the_cli_document(ws, run_petri):  # noqa: F811 - the fixture
    root = Path(ws.root)
    (root.parent / "fix.patch").write_bytes(FIX)
    (root.parent / "also.patch").write_bytes(ALSO_NOTES)
    argv = ["--patch", str(root.parent / "fix.patch"), "--cmd", "echo broken > pkg/calc.py",
            "--patch", str(root.parent / "also.patch"), "--cmd", "true"]
    cands = [petri.Patch(root.parent / "fix.patch"), petri.Cmd("echo broken > pkg/calc.py"),
             petri.Patch(root.parent / "also.patch"), petri.Cmd("true")]
    for extra_args, kw in (([], {}), (["--keep", "--metric", "m.json:n", "--max-regression", "10%"],
                                      {"keep": True, "metric": "m.json:n", "max_regression": "10%"})):
        check = "python3 test_calc.py && echo '{\"n\": 1}' > m.json"
        rec = ws.race(check, cands, **kw)
        assert isinstance(rec, petri.Race) and dict(rec.extra) == {}
        assert all(isinstance(c, petri.RaceCandidate) and dict(c.extra) == {} for c in rec.candidates)
        assert rec.winner == next(c.sandbox for c in rec.candidates if c.candidate.endswith("fix.patch"))
        assert rec.conflicts and rec.duration_s is not None and rec.jobs == 8
        # with --metric: the base fails the check, so no base value and a warning saying so
        assert ("metric_spec" in rec.to_json()) == bool(kw) and bool(rec.warnings) == bool(kw)
        got = run_petri("race", "--check", check, *argv, *extra_args, "--json", cwd=root)
        assert got.rc == 0, got
        cli = json.loads(got.out)
        api = rec.to_json()
        assert list(api) == list(cli)  # the same keys in the same order (``schema`` first)
        assert [list(c) for c in api["candidates"]] == [list(c) for c in cli["candidates"]]
        assert _shape(api) == _shape(cli)
        # the record read back from the CLI's document is the same record
        assert petri.Race.from_doc(cli).to_json() == cli
        for sb in {c.sandbox for c in rec.candidates if c.kept} | {c["sandbox"] for c in cli["candidates"]
                                                                  if c["kept"]}:
            ws.sandbox(sb).destroy()
