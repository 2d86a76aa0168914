"""`petri race` on the demo's sample project with real tests: real bwrap, real cgroups, real
`git apply` inside the sandboxes. Plus the pure ranking rules."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.race import Candidate, Outcome, conflicts, interleave, rank
from tests.conftest import REPO, petri
from tests.helpers.race_project import FIXES, make_project, race_workspace

CHECK = "sleep 1; /usr/bin/python3 -m unittest -q tests.test_stats"
needs_sandbox = pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/bwrap").exists(),
                                   reason="needs root (cgroups) and bwrap")

NOT_APPLYING = b"""--- a/stats/__init__.py
+++ b/stats/__init__.py
@@ -5,4 +5,4 @@
 def median(values):
     ordered = sorted(values)
-    return ordered[len(ordered) // 2]
+    return ordered[0]
"""


# ---------------------------------------------------------------------------- pure


def _o(i, applied=True, code=0, lines=(1, 0), dur=1.0, paths=(b"a",)):
    o = Outcome(i, Candidate("cmd", f"c{i}"), f"sb-{i}", applied=applied, exit_code=code if applied else None,
                duration_s=dur if applied else None, lines_added=lines[0], lines_removed=lines[1],
                paths=frozenset(paths))
    return o


def test_rank_passed_then_fewest_lines_then_fastest_then_order():
    outs = [_o(0, code=1, lines=(1, 0)), _o(1, lines=(5, 5)), _o(2, lines=(2, 1), dur=2.0),
            _o(3, lines=(2, 1), dur=1.0), _o(4, applied=False), _o(5, lines=(2, 1), dur=1.0)]
    assert [o.index for o in rank(outs)] == [3, 5, 2, 1, 0, 4]
    assert [o.rank for o in sorted(outs, key=lambda o: o.index)] == [5, 4, 3, 1, 6, 2]


def test_not_applied_is_last_even_with_no_lines():
    outs = [_o(0, applied=False, lines=(0, 0)), _o(1, code=1, lines=(100, 100))]
    assert [o.index for o in rank(outs)] == [1, 0]


def test_conflicts_pairs_overlapping_paths_of_applied_candidates():
    outs = [_o(0, paths=(b"x", b"y")), _o(1, paths=(b"y",)), _o(2, paths=(b"z",)), _o(3, applied=False, paths=(b"x",))]
    cf = conflicts(outs)
    assert cf == [{"candidates": ["c0", "c1"], "sandboxes": ["sb-0", "sb-1"], "paths": ["y"]}]


def test_interleave_recovers_command_line_order():
    argv = ["race", "--check", "t", "--cmd", "a", "--patch", "p1", "--cmd=b", "--patch=p2", "--json"]
    got = interleave(argv, ["p1", "p2"], ["a", "b"])  # the one candidate type, straight from the command line
    assert [(c.kind, c.text) for c in got] == [("cmd", "a"), ("patch", "p1"), ("cmd", "b"), ("patch", "p2")]
    assert all(isinstance(c, Candidate) for c in got)
    # argv that does not match (an API caller): patches then commands
    assert interleave([], ["p"], ["c"]) == [Candidate("patch", "p"), Candidate("cmd", "c")]


def _ran(argv: list[str], cwd: Path) -> tuple[str, str]:
    cp = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120)
    assert cp.returncode != 0, cp
    return cp.stdout, cp.stderr


def test_telling_line_of_real_tools(tmp_path):
    """``telling_line`` on what real tools print when they fail (run here, on the host:
    the line it picks is pure text work; the race's own test runs them in sandboxes)."""
    from orchestrator.race import telling_line

    (tmp_path / "test_w.py").write_text("def test_ok():\n    pass\n\n\ndef test_count():\n    assert 2 == 3\n")
    out, err = _ran([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_w.py"], tmp_path)
    got = telling_line(out, err)
    assert got.startswith("FAILED test_w.py::test_count - assert 2 == 3 (1 failed, 1 passed in "), (got, out)
    out, err = _ran([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "test_w.py"], tmp_path)
    assert telling_line(out, err).startswith("FAILED test_w.py::test_count - assert 2 == 3 (1 failed, 1 passed")
    (tmp_path / "test_u.py").write_text("import unittest\n\n\nclass T(unittest.TestCase):\n"
                                        "    def test_x(self):\n        self.assertEqual(2, 3)\n")
    out, err = _ran([sys.executable, "-m", "unittest", "-q", "test_u"], tmp_path)
    assert telling_line(out, err) == "FAIL: test_x (test_u.T.test_x) (FAILED (failures=1))", err
    out, err = _ran([sys.executable, "-c", "import json; json.loads('{')"], tmp_path)
    assert telling_line(out, err).startswith("json.decoder.JSONDecodeError: Expecting property name"), err
    out, err = _ran(["sh", "-c", "echo building; echo 'cc: fatal error: no input files'; exit 2"], tmp_path)
    assert telling_line(out, err) == "cc: fatal error: no input files"
    if shutil.which("node") is None:
        pytest.skip("node is not installed")
    (tmp_path / "t.js").write_text('function f() { throw new TypeError("widgets must be a list"); }\nf();\n')
    out, err = _ran(["node", "t.js"], tmp_path)
    assert "Node.js v" in err and telling_line(out, err) == "TypeError: widgets must be a list", err
    (tmp_path / "m.js").write_text('require("./no-such-module");\n')
    out, err = _ran(["node", "m.js"], tmp_path)
    assert telling_line(out, err).startswith("Error: Cannot find module './no-such-module'"), err
    (tmp_path / "w.test.js").write_text('const test = require("node:test"); const assert = require("node:assert");\n'
                                        'test("counts widgets", () => { assert.strictEqual(2, 3); });\n'
                                        'test("fine", () => {});\n')
    out, err = _ran(["node", "--test", "w.test.js"], tmp_path)
    assert telling_line(out, err) == "failed: counts widgets (1 failed, 1 passed)", out[-500:]


def test_telling_line_limits():
    from orchestrator.race import MAX_REASON, telling_line

    assert telling_line("", "") is None
    assert len(telling_line("x" * 5000, "")) == MAX_REASON
    # a warning is not why it failed; the exception line before it is
    assert telling_line("", "ValueError: bad\nDeprecationWarning: old api\n") == "ValueError: bad"


# ---------------------------------------------------------------------------- real races


def init(w: Path) -> Path:
    r = petri("init", "--backend", "copy", cwd=w)
    assert r.rc == 0, r
    return w


@pytest.fixture
def ws(tmp_path):
    with race_workspace(init(make_project(tmp_path / "proj", git=True))) as w:
        yield w


@needs_sandbox
def test_race_right_fix_wins_checks_run_concurrently(ws, tmp_path):
    bad = tmp_path / "not-applying.patch"
    bad.write_bytes(NOT_APPLYING)
    before = (ws / "stats" / "__init__.py").read_bytes()
    r = petri("race", "--json", "--check", CHECK,
              "--patch", str(FIXES / "wrong.patch"),
              "--cmd", "printf 'def broken(:\\n' >> stats/__init__.py",
              "--patch", str(FIXES / "right.patch"),
              "--patch", str(bad), cwd=ws)
    assert r.rc == 0, r
    doc = r.json
    assert doc["schema"] == 1 and doc["base"].startswith("s-")
    by = {c["candidate"]: c for c in doc["candidates"]}
    right, wrong, syntax, nope = (by[str(FIXES / "right.patch")], by[str(FIXES / "wrong.patch")],
                                  by["printf 'def broken(:\\n' >> stats/__init__.py"], by[str(bad)])
    assert doc["winner"] == right["sandbox"] and right["rank"] == 1
    for c in doc["candidates"]:
        for k in ("candidate", "kind", "sandbox", "applied", "exit_code", "duration_s", "killed_by",
                  "files_changed", "lines_added", "lines_removed", "rank"):
            assert k in c, k
    assert (right["lines_added"], right["lines_removed"], right["files_changed"]) == (3, 1, 1)
    assert (wrong["lines_added"], wrong["lines_removed"]) == (1, 1) and wrong["exit_code"] == 1
    assert syntax["kind"] == "cmd" and syntax["applied"] and syntax["exit_code"] == 1 and syntax["lines_added"] == 1
    assert nope["applied"] is False and nope["rank"] == 4 and nope["exit_code"] is None
    assert [c["kind"] for c in doc["candidates"]] == ["patch", "cmd", "patch", "patch"]  # command-line order
    # the three checks ran at once: their runs' recorded lifetimes overlap (from the registry,
    # not from wall-clock sums, so a loaded machine cannot make this flaky)
    import sqlite3
    db = sqlite3.connect(ws / ".petri" / "registry.db")
    spans = [db.execute("SELECT started_at, finished_at FROM runs WHERE sandbox = ? AND n = ?",
                        (c["check_sandbox"], c["check_run"])).fetchone() for c in (right, wrong, syntax)]
    db.close()
    assert all(s and s[1] for s in spans), spans
    assert max(s[0] for s in spans) < min(s[1] for s in spans), spans
    # the changed paths overlap: every applied pair conflicts on stats/__init__.py
    assert len(doc["conflicts"]) == 3 and all(cf["paths"] == ["stats/__init__.py"] for cf in doc["conflicts"])
    # the winner is kept with the fix; the losers are gone; live is untouched
    ls = {s["id"]: s for s in petri("ls", "--all", "--json", cwd=ws).json["sandboxes"]}
    assert ls[right["sandbox"]]["state"] == "exited"
    assert all(ls[c["sandbox"]]["state"] == "destroyed" for c in (wrong, syntax, nope))
    fixed = (Path(ls[right["sandbox"]]["path"]) / "stats" / "__init__.py").read_text()
    assert "(s[n // 2 - 1] + s[n // 2]) / 2" in fixed
    assert (ws / "stats" / "__init__.py").read_bytes() == before
    # the apply is a run of the sandbox; the check, a run of its throwaway fork, recorded as
    # the candidate's too (one place for a candidate's output): each logged
    logs = petri("logs", right["sandbox"], "--json", cwd=ws).json["runs"]
    assert [d["argv"][-1] for d in logs] == ["-", CHECK]
    assert [d.get("role") for d in logs] == ["race-apply", "race-check"]
    check_logs = petri("logs", right["check_sandbox"], "--json", cwd=ws).json["runs"]
    assert [d["argv"][-1] for d in check_logs] == [CHECK] and right["check_run"] == 1
    assert "OK" in check_logs[0]["stderr"] and logs[1]["stderr"] == check_logs[0]["stderr"]
    assert right["logs_run"] == 2 and right["stderr_path"] == logs[1]["stderr_path"]
    assert ls[right["check_sandbox"]]["state"] == "destroyed"


@needs_sandbox
def test_race_human_table_and_no_winner_exit_1(ws):
    r = petri("race", "--check", "/usr/bin/python3 -m unittest -q tests.test_stats",
              "--patch", str(FIXES / "wrong.patch"), "--patch", str(FIXES / "does-not-parse.patch"), cwd=ws)
    assert r.rc == 1, r
    assert "RANK" in r.out and "no winner" in r.out and "no candidate passed" in r.err
    r = petri("race", "--json", "--check", "false", "--cmd", "true", cwd=ws)
    assert r.rc == 1 and r.json["winner"] is None, r
    assert all(s["state"] == "destroyed" for s in petri("ls", "--all", "--json", cwd=ws).json["sandboxes"])


@needs_sandbox
def test_race_keep_keeps_losers(ws):
    r = petri("race", "--json", "--keep", "--check", "test -f ok", "--cmd", "touch ok", "--cmd", "true", cwd=ws)
    assert r.rc == 0, r
    states = {s["id"]: s["state"] for s in petri("ls", "--json", cwd=ws).json["sandboxes"]}
    assert all(states.get(c["sandbox"]) == "exited" for c in r.json["candidates"])


@needs_sandbox
def test_patch_formats_and_non_git_workspace(tmp_path):
    # not a git repository: git apply patches the directory like patch -p1 (no fuzz)
    w = init(make_project(tmp_path / "plain"))
    try:
        r = petri("race", "--json", "--check", "/usr/bin/python3 -m unittest -q tests.test_stats",
                  "--patch", str(FIXES / "right.patch"), "--patch", str(FIXES / "wrong.patch"), cwd=w)
        assert r.rc == 0, r
        applied = {c["candidate"]: c["applied"] for c in r.json["candidates"]}
        assert all(applied.values()), applied  # right.patch is git format, wrong.patch is diff -u (-p1)
        assert r.json["winner_candidate"] == str(FIXES / "right.patch")
    finally:
        petri("deinit", "--force", cwd=w)


@needs_sandbox
def test_workspace_inside_a_larger_repository(tmp_path):
    outer = tmp_path / "outer"
    outer.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=outer, check=True)
    w = init(make_project(outer / "proj"))  # paths in the patch are relative to the workspace
    try:
        r = petri("race", "--json", "--check", "grep -q 'n % 2' stats/__init__.py",
                  "--patch", str(FIXES / "right.patch"), cwd=w)
        assert r.rc == 0 and r.json["candidates"][0]["applied"], r
    finally:
        petri("deinit", "--force", cwd=w)


@needs_sandbox
def test_hostile_patch_cannot_reach_outside(ws, tmp_path):
    evil = tmp_path / "evil.patch"
    target = ws.parent / "escaped.txt"
    evil.write_text("--- /dev/null\n+++ b/../escaped.txt\n@@ -0,0 +1 @@\n+pwned\n")
    abs_evil = tmp_path / "abs.patch"
    abs_evil.write_text(f"--- /dev/null\n+++ {tmp_path}/abs-escaped.txt\n@@ -0,0 +1 @@\n+pwned\n")
    r = petri("race", "--json", "--keep", "--check", "true", "--patch", str(evil), "--patch", str(abs_evil), cwd=ws)
    assert r.rc == 0, r
    by = {c["candidate"]: c for c in r.json["candidates"]}
    assert by[str(evil)]["applied"] is False and "invalid path" in by[str(evil)]["apply_error"]
    # git apply strips the leading component of an absolute name: it lands inside the sandbox
    assert by[str(abs_evil)]["applied"] is True
    tree = Path(petri("status", by[str(abs_evil)]["sandbox"], "--json", cwd=ws).json["sandboxes"][0]["path"])
    assert (tree / str(tmp_path).lstrip("/") / "abs-escaped.txt").read_text() == "pwned\n"
    assert not target.exists() and not (tmp_path / "abs-escaped.txt").exists()
    assert not (ws / str(tmp_path).lstrip("/")).exists()


def test_race_bad_input_is_usage_and_creates_nothing(ws, tmp_path):
    for args in (["--check", "true", "--patch", str(tmp_path / "missing.patch")],
                 ["--check", "", "--cmd", "true"], ["--check", "  ", "--cmd", "true"],
                 ["--check", "true"], ["--cmd", "true"], ["--check", "true", "--cmd", "true", "--jobs", "0"],
                 ["--check", "true", "--cmd", "true", "--from", "s-nope"],
                 ["--check", "true", "--cmd", "true", "--ttl", "soon"]):
        r = petri("race", *args, cwd=ws)
        assert r.rc == 2, (args, r)
        assert len(r.err.strip().splitlines()) == 1 and "Traceback" not in r.err, (args, r)
    assert petri("ls", "--all", "--json", cwd=ws).json["sandboxes"] == []


@needs_sandbox
def test_promote_flag(ws):
    r = petri("race", "--json", "--promote", "--check", "/usr/bin/python3 -m unittest -q tests.test_stats",
              "--patch", str(FIXES / "right.patch"), cwd=ws)
    try:
        import orchestrator.promotions  # noqa: F401
    except ImportError:
        assert r.rc == 1 and "promote is not available" in r.err, r
        assert r.json["winner"] is not None  # the winner is kept and named all the same
        return
    assert r.rc == 0, r
    assert "(s[n // 2 - 1] + s[n // 2]) / 2" in (ws / "stats" / "__init__.py").read_text()


@needs_sandbox
def test_two_races_at_once_on_one_workspace(ws):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    procs = [subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "race", "--json", "--check", CHECK,
                               "--patch", str(FIXES / "right.patch"), "--patch", str(FIXES / "wrong.patch"),
                               "--cmd", "true"], cwd=ws, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    docs = []
    for p in procs:
        o, e = p.communicate(timeout=120)
        assert p.returncode == 0, e
        import json
        docs.append(json.loads(o))
    winners = [d["winner"] for d in docs]
    assert len(set(winners)) == 2 and all(d["winner_candidate"] == str(FIXES / "right.patch") for d in docs)
    live = [s for s in petri("ls", "--json", cwd=ws).json["sandboxes"]]
    assert sorted(s["id"] for s in live) == sorted(winners)
