"""The TUI's pure parts, without Textual: the compare logic (file union, split diff), the
cell formats, the actions' command lines, and the model's event folding."""
from __future__ import annotations

import pytest

import petri
from tui import actions as act
from tui import compare as cmp
from tui import format as fmt
from tui.model import Model

pytestmark = pytest.mark.unit  # no root, mount, FUSE, cgroup or sandbox: `pytest -m unit`


def _f(path, status="modified", a=1, r=1):
    return petri.DiffFile(path=path, status=status, lines_added=a, lines_removed=r)


def test_file_union_says_a_only_b_only_same_differ():
    pa = ("diff --git a/x b/x\nindex 1..2 100644\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n"
          "diff --git a/same b/same\nindex 1..2\n--- a/same\n+++ b/same\n@@ -1 +1 @@\n-s\n+S\n")
    pb = ("diff --git a/same b/same\nindex 1..2 100644\n--- a/same\n+++ b/same\n@@ -1 +1 @@\n-s\n+S\n"
          "diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+c\n"
          "diff --git a/y b/y\n--- a/y\n+++ b/y\n@@ -1 +1 @@\n-y\n+Y\n")
    a = [_f("x"), _f("same"), _f("a-only", "added", 3, 0)]
    b = [_f("same"), _f("x"), _f("y")]
    rows = {r.path: r.kind for r in cmp.file_union(a, b, pa, pb)}
    assert rows == {"a-only": "A only", "same": "same", "x": "differ", "y": "B only"}
    # from two bases the same patch is not the same change
    assert {r.path: r.kind for r in cmp.file_union(a, b, pa, pb, same_base=False)}["same"] == "differ"
    assert cmp.counts(cmp.file_union(a, b, pa, pb)) == {"A only": 1, "B only": 1, "same": 1, "differ": 1}


def test_split_rows_align_and_fold():
    left = [f"line {i}" for i in range(40)]
    right = list(left)
    right[20] = "line 20 changed"
    del right[30]
    right.insert(35, "new line")
    rows = cmp.split_rows(left, right, context=2)
    folds = [r.fold for r in rows if r.fold]
    assert folds and sum(folds) + sum(1 for r in rows if not r.fold and r.left and r.left.kind == "equal") == 38
    rep = [r for r in rows if r.left and r.left.kind == "replace"]
    assert [(r.left.lineno, r.right.lineno) for r in rep] == [(21, 21)]
    assert rep[0].right.spans == [(7, 15)] and rep[0].left.spans == []  # " changed" only
    dels = [r.left.lineno for r in rows if r.left and r.left.kind == "delete"]
    ins = [r.right.text for r in rows if r.right and r.right.kind == "insert"]
    assert dels == [31] and ins == ["new line"]
    # unrelated lines are marked whole, not letter by letter
    (row,) = [r for r in cmp.split_rows(["    return a - b"], ["    # something else"]) if r.left]
    assert row.left.spans == [(4, 16)]
    # identical texts are shown whole
    assert all(r.left.kind == "equal" for r in cmp.split_rows(["a", "b"], ["a", "b"]))


def test_text_lines_notes():
    assert cmp.text_lines(None) == ([], "absent")
    assert cmp.text_lines(petri.FileContent(path="b", size=3, encoding="base64", content="AAEC"))[0] is None


def test_formats():
    assert [fmt.size(n) for n in (None, 0, 512, 1536, 48 << 20, (19 << 29), 1 << 30)] == [
        "-", "0B", "512B", "1.5K", "48M", "9.5G", "1G"]
    assert str(fmt.against(950 << 20, 1 << 30)) == "950M/1G" and fmt.against(950 << 20, 1 << 30).style == "bold red"
    assert str(fmt.against(None, None)) == "-"
    assert str(fmt.stale({"live_changed": 3, "overlapping": ["a", "b"]})) == "3!2"
    assert "red" in str(fmt.stale({"live_changed": 3, "overlapping": ["a"]}).style)
    assert str(fmt.stale({"live_changed": 0, "overlapping": []})) == "0"
    now = fmt.ts("2025-01-01T12:00:00Z")
    assert fmt.age("2025-01-01T11:20:00Z", now) == "40m"
    assert str(fmt.time_left("2025-01-01T12:03:00Z", now)) == "3m"
    assert str(fmt.time_left(None, now)) == "∞"
    assert fmt.short_duration(2 * 86400 + 3 * 3600) == "2d03"
    assert fmt.one_line("a\tb\x1b[31m", 20) == "a·b·[31m"
    p = fmt.patch("diff --git a/f b/f\nGIT binary patch\nliteral 3\nabc\n\ndiff --git a/g b/g\n+x\n")
    assert "lines of binary patch" in p.plain and "abc" not in p.plain


def test_action_command_lines():
    assert act.argv_of("promote", ("sb-1",), {"verify": "make test"}) == ["petri", "promote", "sb-1", "--verify",
                                                                           "make test"]
    assert act.argv_of("run", ("sb-1",), {"command": "make", "timeout": "5m"}) == [
        "petri", "run", "sb-1", "--timeout", "5m", "--", "sh", "-c", "make"]
    assert act.argv_of("destroy", ("a", "b"), {}) == ["petri", "rm", "a", "b"]
    assert act.argv_of("fork", (), {"from": "sb-1", "n": "3", "label": "x"}) == [
        "petri", "fork", "--from", "sb-1", "-n", "3", "--label", "x"]
    req = act.Request("race", "r", fields=[act.Field("check", "", "pytest"),
                                           act.Field("candidates", "", "patch: a.patch\n# no\nmake fix\ncmd: x y")])
    assert req.command() == "petri race --check pytest --patch a.patch --cmd 'make fix' --cmd 'x y' --keep"
    assert act.candidates_of(" \n# c\npatch:p\n") == [("patch", "p")]
    plan = petri.Rollback.from_doc({"restored": "p-1", "kind": "promotion", "changed": ["a"], "blocked": ["a"]})
    assert "REFUSES (exit 3)" in act.plan_text("rollback", plan)
    nothing = petri.PromoteResult.from_doc({"promotion": None, "applied": [], "conflicts": []})
    assert act.plan_text("promote", nothing).startswith("nothing to promote")


def test_model_folds_events_into_changes():
    m = Model()
    info = petri.SandboxInfo(id="sb-1", state="ready")
    m.put_sandboxes([info])
    ch = m.feed({"event": "run.started", "sandbox": "sb-1", "run": 1})
    assert ch.sandboxes == {"sb-1"} and m.sandboxes["sb-1"].state == "running" and m.running == {"sb-1": 1}
    # run.output says how far a run got (coalesced): the lines come from its log files, followed
    ch = m.feed({"event": "run.output", "sandbox": "sb-1", "run": 1, "stream": "stderr", "line": "boom",
                 "stdout_bytes": 0, "stdout_lines": 0, "stderr_bytes": 5, "stderr_lines": 1})
    assert not ch
    ch = m.put_output(("sb-1", 1), [("stderr", "boom")])
    assert ch.output == {("sb-1", 1): [("stderr", "boom")]} and not ch.sandboxes
    assert list(m.tails[("sb-1", 1)]) == [("stderr", "boom")]
    ch = m.feed({"event": "run.finished", "sandbox": "sb-1", "run": 1, "exit_code": 3})
    assert m.sandboxes["sb-1"].last_exit_code == 3 and "sb-1" in ch.fetch and m.running == {}
    ch = m.feed({"event": "sandbox.created", "sandbox": "sb-2"})
    assert ch.fetch == {"sb-2"} and "sb-2" not in m.sandboxes
    ch = m.feed({"event": "sandbox.destroyed", "sandbox": "sb-1"})
    assert ch.gone == {"sb-1"} and m.sandboxes == {}
    assert m.feed({"event": "promotion.done", "promotion": "p-1"}).promotions
    # a listing without staleness keeps the last known staleness
    m.put_sandboxes([petri.SandboxInfo(id="sb-3", stale={"live_changed": 1, "overlapping": []})])
    m.put_sandboxes([petri.SandboxInfo(id="sb-3", stale=None)])
    assert m.sandboxes["sb-3"].stale == {"live_changed": 1, "overlapping": []}


def test_a_rows_clock_cells_are_looked_at_when_they_are_due_to_change():
    """AGE and LEFT read whole minutes past the first one: the table's tick looks at a row
    again only when one of them will read differently (200 rows cost nothing between)."""
    from types import SimpleNamespace

    from tui.widgets.sandbox_table import _next_change

    now = 1735732800.0  # 12:00:00Z
    row = lambda created, expires=None: SimpleNamespace(created_at=created, expires_at=expires)  # noqa: E731
    assert _next_change(row("2025-01-01T11:59:30Z"), now) < 1  # 30s: every second
    assert 29 < _next_change(row("2025-01-01T11:58:30Z"), now) < 30  # 1m30s: at 2m
    assert 4 < _next_change(row("2025-01-01T11:00:00Z", "2025-01-01T12:02:05Z"), now) < 5  # 2m05s left: at 2m


def test_status_tab_lists_the_sandboxs_services_and_keeps_them_across_table_records():
    import dataclasses

    from rich.console import Console

    from tests.helpers.tui_fixtures import SANDBOXES
    from tui.widgets.detail_pane import status_table

    web = {"sandbox": "sb-0001c0de", "name": "web", "command": "python3 -m http.server 8765", "state": "running",
           "pid": 4242, "started_at": "2025-01-01T11:19:00Z", "exit_code": None, "restarts": 1, "ports": [8765]}
    db = {**web, "name": "db", "command": "sleep 1", "state": "exited", "pid": None, "exit_code": 3,
          "restarts": 0, "ports": []}
    info = dataclasses.replace(SANDBOXES[0], services=[web, db])
    now = fmt.ts("2025-01-01T11:20:00Z")

    def text(table) -> str:
        c = Console(width=160, record=True)
        c.print(table)
        return c.export_text()

    out = text(status_table(info, Model(), now))
    assert "service web" in out and "running  pid 4242  up 1m" in out and "restarts 1" in out and "ports 8765" in out
    assert "service db" in out and "exited  exit 3" in out and "pid" not in out.split("service db")[1].split("\n")[0]
    # The table's own records carry no services: the pane passes the last ones read in full.
    out = text(status_table(SANDBOXES[0], Model(), now, services=[web]))
    assert "service web" in out and "service db" not in out
