"""The file tools of the API (``read_file`` ... ``move_file``, ``list_files``, ``grep``) on
real sandboxes: what they return, the words of their errors, and that a hostile sandbox
(symlinks to the host, ``..``, a symlink swapped in between a check and a use) never leads
them outside it. The MCP tools call these (tests/mcp/test_mcp.py runs them through a server)."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import petri
from merge.safefs import SafeTree
from orchestrator import files
from tests.conftest import api_workspace

SECRET = "host secret 42"


def make_project(root: Path) -> Path:
    ws = root / "proj"
    (ws / "pkg" / "sub").mkdir(parents=True)
    (ws / "pkg" / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (ws / "pkg" / "sub" / "deep.py").write_text("# deep\nADD = 'add'\n")
    (ws / "notes.txt").write_text("one\ntwo\nthree\n")
    (ws / "node_modules" / "x").mkdir(parents=True)
    (ws / "node_modules" / "x" / "index.js").write_text("function add() {}\n")
    (ws / ".gitignore").write_text("node_modules/\n")
    return ws


@pytest.fixture
def ws(tmp_path):
    with api_workspace(make_project(tmp_path)) as w:
        yield w


@pytest.fixture
def outside(tmp_path):
    d = tmp_path / "outside"
    d.mkdir()
    (d / "secret").write_text(SECRET + "\n")
    return d


def untouched(outside: Path) -> None:
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]
    assert (outside / "secret").read_text() == SECRET + "\n"


# ---------------------------------------------------------------------------- error words (issue 20, item 15)


def test_a_symlink_on_the_path_is_named_with_where_it_points_not_called_a_conflict(ws, outside):
    sb = ws.fork().keep()[0]
    tree = Path(sb.path)
    os.symlink(outside, tree / "link")
    os.symlink(outside / "secret", tree / "leaf")
    os.symlink("pkg/calc.py", tree / "inner")
    os.symlink("pkg", tree / "pkglink")
    with pytest.raises(petri.UsageError) as e:
        ws.read_file(sb, "link/secret")
    msg = str(e.value)
    assert "conflict" not in msg and e.value.exit_code == 2
    assert msg == (f"link/secret: link is a symlink to {outside} (outside the sandbox); the file tools never "
                   "follow a symlink")
    with pytest.raises(petri.UsageError, match=f"leaf is a symlink to {outside}/secret \\(outside the sandbox\\)"):
        ws.read_file(sb, "leaf")
    # a link that stays inside: the message gives the path to use instead
    with pytest.raises(petri.UsageError, match="inner is a symlink to pkg/calc.py; .*; give pkg/calc.py$"):
        ws.read_file(sb, "inner")
    with pytest.raises(petri.UsageError, match="pkglink is a symlink to pkg; .*; give pkg/calc.py$"):
        ws.edit_file(sb, "pkglink/calc.py", "a - b", "a + b")
    with pytest.raises(petri.UsageError, match="link is a symlink to .*outside the sandbox"):
        ws.write_file(sb, "link/planted", "x")
    # a file where a directory should be is said to be one
    with pytest.raises(petri.UsageError, match="notes.txt is a file, not a directory"):
        ws.read_file(sb, "notes.txt/x")
    with pytest.raises(petri.UsageError, match="pkg is a directory, not a regular file"):
        ws.read_file(sb, "pkg")
    untouched(outside)


def test_the_store_is_refused_with_the_reason_not_a_temp_file_name(ws):
    sb = ws.fork().keep()[0]
    for call in (lambda: ws.write_file(sb, ".petri/x", "x"), lambda: ws.read_file(sb, ".petri/config.toml"),
                 lambda: ws.delete_file(sb, ".petri", recursive=True), lambda: ws.list_files(sb, ".petri"),
                 lambda: ws.move_file(sb, "notes.txt", ".petri/notes.txt")):
        with pytest.raises(petri.UsageError) as e:
            call()
        assert "petri's store" in str(e.value) and "never promoted" in str(e.value), e.value
        assert ".petri-write" not in str(e.value)
    assert not (Path(sb.path) / ".petri").exists()
    assert ".petri" not in [x.path for x in ws.list_files(sb).entries]


def test_paths_outside_are_refused_saying_why_and_absolute_paths_under_the_workspace_work(ws):
    sb = ws.fork().keep()[0]
    with pytest.raises(petri.UsageError, match=r"refusing path \.\./x: `\.\.` is not allowed"):
        ws.read_file(sb, "../x")
    with pytest.raises(petri.UsageError, match="absolute and not under the workspace"):
        ws.read_file(sb, "/etc/passwd")
    assert ws.read_file(sb, str(ws.root / "notes.txt")).content == "one\ntwo\nthree\n"
    assert ws.read_file(sb, os.path.join(sb.path, "notes.txt")).content == "one\ntwo\nthree\n"
    with pytest.raises(petri.NotFound, match=f"no nope.txt in sandbox {sb.id}"):
        ws.read_file(sb, "nope.txt")


# ---------------------------------------------------------------------------- read a range of lines


def test_read_file_line_ranges(ws):
    sb = ws.fork().keep()[0]
    ws.write_file(sb, "lines.txt", "".join(f"line {i}\n" for i in range(1, 101)))
    r = ws.read_file(sb, "lines.txt", start_line=10, end_line=12)
    assert r.content == "line 10\nline 11\nline 12\n" and (r.start_line, r.end_line) == (10, 12) and r.truncated
    tail = ws.read_file(sb, "lines.txt", start_line=99)
    assert tail.content == "line 99\nline 100\n" and tail.end_line == 100 and not tail.truncated
    assert ws.read_file(sb, "lines.txt", start_line=200).content == ""
    # max_bytes keeps whole lines and says there was more
    cut = ws.read_file(sb, "lines.txt", start_line=1, max_bytes=22)
    assert cut.content == "line 1\nline 2\nline 3\n" and cut.truncated and cut.end_line == 3
    ws.write_file(sb, "long.txt", "é" * 50 + "\nnext\n")  # one line over the budget: cut at a character
    assert ws.read_file(sb, "long.txt", start_line=1, max_bytes=7).content == "ééé"
    with pytest.raises(petri.UsageError, match="bad end_line 3: at least 5"):
        ws.read_file(sb, "lines.txt", start_line=5, end_line=3)
    assert ws.read_file(sb, "notes.txt").start_line is None  # no range: the whole file as before


# ---------------------------------------------------------------------------- list


def test_list_files_one_level_globs_ignored_and_symlink_targets(ws, outside):
    sb = ws.fork().keep()[0]
    tree = Path(sb.path)
    os.symlink(outside, tree / "link")
    os.mkdir(tree / ".git")
    (tree / ".git" / "HEAD").write_text("ref: x\n")
    (tree / os.fsdecode(b"caf\xe9.txt")).write_bytes(b"x")
    top = ws.list_files(sb)
    by = {e.path: e for e in top.entries}
    assert [e.path for e in top.entries] == sorted(by)
    assert set(by) == {".gitignore", ".git", "caf\\xe9.txt", "link", "notes.txt", "pkg"}  # node_modules ignored
    assert top.ignored == 1 and not top.truncated
    assert by["link"].kind == "symlink" and by["link"].target == str(outside) and by["link"].size is None
    assert by["notes.txt"].kind == "file" and by["notes.txt"].size == 14 and by["pkg"].kind == "dir"
    assert by["caf\\xe9.txt"].extra["path_b64"] == "Y2Fm6S50eHQ="
    py = ws.list_files(sb, glob="*.py")  # a glob walks the tree; names match at any depth
    assert [e.path for e in py.entries] == ["pkg/calc.py", "pkg/sub/deep.py"]
    assert [e.path for e in ws.list_files(sb, "pkg", glob="sub/*.py").entries] == ["pkg/sub/deep.py"]
    everything = [e.path for e in ws.list_files(sb, recursive=True, include_ignored=True).entries]
    assert "node_modules/x/index.js" in everything and ".git" in everything
    assert ".git/HEAD" not in everything and not any(p.startswith("link/") for p in everything)
    few = ws.list_files(sb, recursive=True, max_entries=2)
    assert len(few.entries) == 2 and few.truncated
    with pytest.raises(petri.UsageError, match="link is a symlink to"):
        ws.list_files(sb, "link")
    with pytest.raises(petri.UsageError, match="notes.txt: it is a file, not a directory"):
        ws.list_files(sb, "notes.txt")
    untouched(outside)


# ---------------------------------------------------------------------------- grep


def test_grep_matches_lines_skips_binary_and_large_files_and_stops_at_max_matches(ws, outside):
    sb = ws.fork().keep()[0]
    tree = Path(sb.path)
    os.symlink(outside, tree / "link")
    os.symlink(outside / "secret", tree / "leaf")
    (tree / "blob.bin").write_bytes(b"add\0\x01\x02")
    (tree / "big.txt").write_bytes(b"add\n" * ((files.GREP_MAX_FILE // 4) + 1))
    g = ws.grep(sb, r"\badd\b")
    assert [(m.path, m.line, m.text) for m in g.matches] == [
        ("pkg/calc.py", 1, "def add(a, b):"), ("pkg/sub/deep.py", 2, "ADD = 'add'")]
    assert g.binary_skipped == 1 and g.large_skipped == 1 and g.ignored == 1 and g.stopped is None
    assert not g.truncated
    assert [(m.path, m.line) for m in ws.grep(sb, "DEEP", ignore_case=True, glob="*.py").matches] == [
        ("pkg/sub/deep.py", 1)]
    assert [m.line for m in ws.grep(sb, "^t", path="notes.txt").matches] == [2, 3]  # one file; ^ is a line's start
    assert ws.grep(sb, "function", include_ignored=True).matches[0].path == "node_modules/x/index.js"
    assert not ws.grep(sb, SECRET).matches  # symlinks are never followed
    capped = ws.grep(sb, "e", max_matches=3)
    assert len(capped.matches) == 3 and capped.stopped == "max_matches" and capped.truncated
    with pytest.raises(petri.UsageError, match=r"bad pattern '\(': .*Python's re"):
        ws.grep(sb, "(")


def test_grep_ends_a_pattern_that_backtracks_without_end_at_its_deadline(tmp_path):
    # 60: about 1.5e12 backtracking steps, hours for `re`, so only the deadline can end it;
    # the bound below is the process's start and kill on a loaded machine (5.4 s at load 20)
    (tmp_path / "a.txt").write_text("a" * 60 + "!\n" + "aa\n")
    where = files.Where("sb-test", (os.fsencode(tmp_path),))
    t0 = time.monotonic()
    with SafeTree(tmp_path) as tree:
        got = files.grep(tree, b"", where, r"^(a|aa)+$", glob=None, ignore_case=False, rules=None, max_matches=10,
                         timeout_s=0.5)
    assert got.stopped == "timeout" and got.truncated
    assert time.monotonic() - t0 < 20


def test_grep_line_numbers_against_a_plain_line_by_line_search(tmp_path):
    """The whole-text search finds exactly the lines a line-by-line ``re`` search finds."""
    import random
    import re

    rnd = random.Random(7)
    words = ["foo", "bar", "foobar", "", "x foo", "fo\to", "bar foo bar", "éfoo", "FOO"]
    for n in range(5):
        (tmp_path / f"f{n}.txt").write_text("\n".join(rnd.choice(words) for _ in range(300)))
    where = files.Where("sb-test", (os.fsencode(tmp_path),))
    for pattern in ("foo", "^foo", "foo$", r"o\s*b", "bar foo", r"(?<=x )foo", r"\Afoo", "o\n?b"):
        want = []
        for n in range(5):
            lines = (tmp_path / f"f{n}.txt").read_text().split("\n")
            want += [(f"f{n}.txt", i) for i, line in enumerate(lines, 1) if re.search(pattern, line)]
        with SafeTree(tmp_path) as tree:
            got = files.grep(tree, b"", where, pattern, glob=None, ignore_case=False, rules=None, max_matches=5000)
        assert [(m.path, m.line) for m in got.matches] == want, pattern


# ---------------------------------------------------------------------------- delete, move


def test_delete_and_move_act_on_the_entry_itself_never_through_a_symlink(ws, outside):
    sb = ws.fork().keep()[0]
    tree = Path(sb.path)
    os.symlink(outside, tree / "link")
    os.symlink(outside / "secret", tree / "leaf")
    with pytest.raises(petri.UsageError, match="link is a symlink to"):
        ws.delete_file(sb, "link/secret")
    with pytest.raises(petri.UsageError, match="link is a symlink to"):
        ws.move_file(sb, "link/secret", "stolen")
    with pytest.raises(petri.UsageError, match="link is a symlink to"):
        ws.move_file(sb, "notes.txt", "link/planted")
    with pytest.raises(petri.UsageError, match="`..` is not allowed"):
        ws.move_file(sb, "notes.txt", "../planted")
    assert ws.delete_file(sb, "leaf").to_json() == {"schema": 1, "path": "leaf", "kind": "symlink", "removed": 1}
    assert ws.delete_file(sb, "link").kind == "symlink"
    untouched(outside)
    with pytest.raises(petri.UsageError, match="pkg is a directory; removing it .* takes recursive=true"):
        ws.delete_file(sb, "pkg")
    moved = ws.move_file(sb, "notes.txt", "docs/notes.md")  # to's directories are made
    assert (moved.old_path, moved.path, moved.kind, moved.replaced) == ("notes.txt", "docs/notes.md", "file", False)
    assert (tree / "docs" / "notes.md").read_text() == "one\ntwo\nthree\n" and not (tree / "notes.txt").exists()
    with pytest.raises(petri.UsageError, match="docs/notes.md exists already; overwrite=true replaces it"):
        ws.move_file(sb, "pkg/calc.py", "docs/notes.md")
    assert ws.move_file(sb, "pkg/calc.py", "docs/notes.md", overwrite=True).replaced
    with pytest.raises(petri.UsageError, match="into itself"):
        ws.move_file(sb, "pkg", "pkg/sub/pkg")
    gone = ws.delete_file(sb, "pkg", recursive=True)
    assert (gone.kind, gone.removed) == ("dir", 3)  # pkg, pkg/sub, pkg/sub/deep.py
    with pytest.raises(petri.NotFound):
        ws.delete_file(sb, "pkg")
    changed = {(f.status, f.path) for f in ws.diff(sb, stat_only=True).files}
    assert {p for _, p in changed} == {"notes.txt", "docs/notes.md", "pkg/sub/deep.py"}, changed
    untouched(outside)


def test_a_directory_swapped_for_a_symlink_during_a_walk_is_not_followed(ws, outside, monkeypatch):
    sb = ws.fork().keep()[0]
    tree = Path(sb.path)
    real_stat = os.stat

    def swapping_stat(path, *a, **kw):
        st = real_stat(path, *a, **kw)
        if path == b"sub" and not (tree / "pkg" / "sub-away").exists():
            os.rename(tree / "pkg" / "sub", tree / "pkg" / "sub-away")  # after the check, before the open
            os.symlink(outside, tree / "pkg" / "sub")
        return st
    monkeypatch.setattr(files.os, "stat", swapping_stat)
    listed = [e.path for e in ws.list_files(sb, recursive=True).entries]
    assert (tree / "pkg" / "sub").is_symlink()  # the swap happened
    assert not any("secret" in p for p in listed)
    monkeypatch.setattr(files.os, "stat", real_stat)
    assert not ws.grep(sb, SECRET).matches
    untouched(outside)


def test_files_removed_by_a_recursive_delete_never_include_the_targets_of_symlinks(ws, outside):
    sb = ws.fork().keep()[0]
    tree = Path(sb.path)
    os.symlink(outside, tree / "pkg" / "sub" / "out")
    assert ws.delete_file(sb, "pkg", recursive=True).removed == 5
    untouched(outside)


# ---------------------------------------------------------------------------- fuse: not the sandbox's reads


def test_reads_of_the_file_tools_are_not_the_sandboxs_own_reads_on_fuse(tmp_path):
    from snapshot.backends.fuse import FuseBackend
    from tests.conftest import stop_fuse_under

    ok, why = FuseBackend.available(tmp_path)
    if not ok:
        pytest.skip(f"fuse: {why}")
    if os.geteuid() != 0:
        pytest.skip("needs root: without it the fuse backend has no quiet view (a documented caveat)")
    proj = make_project(tmp_path)
    try:
        with api_workspace(proj, backend="fuse") as w:
            sb = w.fork().keep()[0]
            e = w.engine
            w.list_files(sb, recursive=True)
            w.grep(sb, "add")
            w.read_file(sb, "notes.txt")
            assert not e.backend.read_set(e.store, sb.id)
            (Path(sb.path) / "pkg" / "calc.py").read_text()  # the control: a read through the mount counts
            assert b"pkg/calc.py" in e.backend.read_set(e.store, sb.id)
    finally:
        stop_fuse_under(tmp_path, [proj / ".petri"])


def test_a_walk_deeper_than_its_fd_budget_says_so(tmp_path):
    deep = tmp_path.joinpath(*["d"] * (files.MAX_DEPTH + 5))
    deep.mkdir(parents=True)
    (deep / "x.txt").write_text("needle\n")
    (tmp_path / "top.txt").write_text("needle\n")
    where = files.Where("sb-test", (os.fsencode(tmp_path),))
    with SafeTree(tmp_path) as tree:
        got = files.grep(tree, b"", where, "needle", glob=None, ignore_case=False, rules=None, max_matches=10)
        listed = files.list_entries(tree, b"", where, glob=None, recursive=True, rules=None, max_entries=10_000)
    assert [m.path for m in got.matches] == ["top.txt"] and got.stopped == "max_depth" and got.truncated
    assert listed.truncated and len(listed.entries) == files.MAX_DEPTH + 1  # d/... to the limit, and top.txt
