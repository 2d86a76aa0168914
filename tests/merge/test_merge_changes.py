"""Change sets between real trees, and .gitignore rules checked against git itself."""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
import xxhash
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from merge.changes import Entry, TreeReader, _Raw, normalize_path, scan_tree, tree_changes
from merge.errors import TreeChangedDuringScan, UnsafePath
from merge.ignore import IgnoreRules, parse_patterns

pytestmark = pytest.mark.unit  # no root, mount, FUSE, cgroup or sandbox: `pytest -m unit`

HARDEN = ["-c", "core.fsmonitor=", "-c", "core.hooksPath=/dev/null", "-c", "protocol.allow=never",
          "-c", "core.excludesFile=/dev/null", "-c", "init.defaultBranch=main"]


def git(home: Path, cwd: Path, *args: str) -> bytes:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
           "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "LC_ALL": "C"}
    return subprocess.run(["git", *HARDEN, *args], cwd=cwd, env=env, capture_output=True,
                          check=True).stdout


def write(root: Path, rel: bytes, data: bytes = b"x\n", mode: int = 0o644) -> None:
    full = os.fsencode(root) + b"/" + rel
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "wb") as f:
        f.write(data)
    os.chmod(full, mode)


def link(root: Path, rel: bytes, target: bytes) -> None:
    full = os.fsencode(root) + b"/" + rel
    os.makedirs(os.path.dirname(full), exist_ok=True)
    os.symlink(target, full)


def h(data: bytes) -> str:
    return xxhash.xxh3_128_hexdigest(data)


def summary(changes):
    return [(c.path, c.status) + ((c.old_path,) if c.old_path else ()) for c in changes]


def test_scan_tree_kinds_modes_ids(tmp_path):
    write(tmp_path, b"f", b"hello\n")
    write(tmp_path, b"x.sh", b"#!/bin/sh\n", 0o755)
    link(tmp_path, b"l", b"f")
    os.mkdir(tmp_path / "d")
    os.mkfifo(tmp_path / "fifo")
    write(tmp_path, b".git/config", b"[core]\n")
    write(tmp_path, b".petri/registry", b"db")
    write(tmp_path, b"sub/.git/keep", b"nested repos are ordinary content\n")
    write(tmp_path, b"bad\xffname\nwith newline", b"b")
    m = scan_tree(tmp_path)
    assert m[b"f"] == Entry("file", 0o644, h(b"hello\n"), 6)
    assert m[b"x.sh"] == Entry("file", 0o755, h(b"#!/bin/sh\n"), 10)
    assert m[b"l"] == Entry("symlink", 0o777, h(b"f"), 1)
    assert m[b"d"] == Entry("dir", 0o755, None, 0)
    assert m[b"fifo"].kind == "other" and m[b"fifo"].content_id is None
    assert m[b"bad\xffname\nwith newline"].content_id == h(b"b")
    assert b"sub/.git/keep" in m
    assert not any(p.startswith((b".git", b".petri")) for p in m)
    assert list(m) == sorted(m)


def test_scan_never_follows_symlinked_dirs(tmp_path):
    outside = tmp_path / "outside"
    write(outside, b"secret", b"s\n")
    tree = tmp_path / "tree"
    tree.mkdir()
    link(tree, b"escape", os.fsencode(outside))
    m = scan_tree(tree)
    assert list(m) == [b"escape"] and m[b"escape"].kind == "symlink"


def test_changes_all_statuses(tmp_path):
    base, new = tmp_path / "base", tmp_path / "new"
    for root in (base, new):
        root.mkdir()
    write(base, b"mod", b"a\n")
    write(new, b"mod", b"b\n")
    write(base, b"del", b"gone\n")
    write(new, b"add", b"fresh\n")
    write(base, b"exec", b"e\n")
    write(new, b"exec", b"e\n", 0o755)
    write(base, b"src/moved.txt", b"same content\n")
    write(new, b"dst/moved.txt", b"same content\n")
    write(base, b"f2l", b"t\n")
    link(new, b"f2l", b"t")
    link(base, b"l", b"one")
    link(new, b"l", b"two")
    write(base, b"f2d", b"file\n")
    write(new, b"f2d/inner", b"inner\n")
    os.makedirs(new / "emptydir")
    os.makedirs(base / "olddir")
    os.makedirs(base / "chmoddir")
    os.makedirs(new / "chmoddir")
    os.chmod(new / "chmoddir", 0o700)
    got = summary(tree_changes(base, new))
    assert got == [
        (b"add", "added"),
        (b"chmoddir", "modified"),
        (b"del", "deleted"),
        (b"dst", "added"),
        (b"dst/moved.txt", "renamed", b"src/moved.txt"),
        (b"emptydir", "added"),
        (b"exec", "modified"),
        (b"f2d", "type_changed"),
        (b"f2d/inner", "added"),
        (b"f2l", "type_changed"),
        (b"l", "modified"),
        (b"mod", "modified"),
        (b"olddir", "deleted"),
        (b"src", "deleted"),
    ]
    by = {c.path: c for c in tree_changes(base, new)}
    assert by[b"exec"].old.mode == 0o644 and by[b"exec"].new.mode == 0o755
    assert by[b"dst/moved.txt"].similarity == 100
    assert by[b"f2l"].old.kind == "file" and by[b"f2l"].new.kind == "symlink"
    assert by[b"f2l"].new.content_id == h(b"t")
    assert by[b"f2d"].new.kind == "dir"


def test_same_size_same_mtime_edit_is_seen(tmp_path):
    base, new = tmp_path / "base", tmp_path / "new"
    write(base, b"f", b"aaaa\n")
    write(new, b"f", b"bbbb\n")
    st = os.stat(base / "f")
    os.utime(new / "f", ns=(st.st_atime_ns, st.st_mtime_ns))
    assert summary(tree_changes(base, new)) == [(b"f", "modified")]
    # and a touch without content change is not a change
    write(new, b"f", b"aaaa\n")
    os.utime(new / "f", ns=(1, 1))
    assert tree_changes(base, new) == []


def test_base_manifest_saves_hashing_but_not_correctness(tmp_path):
    base, new = tmp_path / "base", tmp_path / "new"
    write(base, b"same", b"1111\n")
    write(new, b"same", b"1111\n")
    write(base, b"edit", b"aaaa\n")
    write(new, b"edit", b"bbbb\n")
    manifest = scan_tree(base)
    assert summary(tree_changes(base, new, base_manifest=manifest)) == [(b"edit", "modified")]
    # ids are trusted from the manifest (that is the point): a stale one shows as a change
    stale = dict(manifest)
    stale[b"same"] = Entry("file", 0o644, h(b"2222\n"), 5)
    assert summary(tree_changes(base, new, base_manifest=stale)) == [(b"edit", "modified"), (b"same", "modified")]


def test_hardlinked_trees_compare_by_content(tmp_path):
    base, new = tmp_path / "base", tmp_path / "new"
    write(base, b"f", b"shared\n")
    new.mkdir()
    os.link(base / "f", new / "f")
    assert tree_changes(base, new) == []


def test_renames_prefer_same_basename_and_need_half_similarity(tmp_path):
    base, new = tmp_path / "base", tmp_path / "new"
    write(base, b"a/x.txt", b"dup\n")
    write(base, b"b/y.txt", b"dup\n")
    write(new, b"c/y.txt", b"dup\n")
    body = b"".join(b"line %d\n" % i for i in range(20))
    write(base, b"big", body)
    write(new, b"big2", body[: len(body) // 3] + b"mostly new\n" * 30)
    got = summary(tree_changes(base, new))
    assert (b"c/y.txt", "renamed", b"b/y.txt") in got
    assert (b"a/x.txt", "deleted") in got
    assert (b"big2", "added") in got and (b"big", "deleted") in got
    assert summary(tree_changes(base, new, detect_renames=False)).count((b"c/y.txt", "added")) == 1


def test_paths_narrowing_and_refusals(tmp_path):
    base, new = tmp_path / "base", tmp_path / "new"
    write(base, b"keep/a", b"1\n")
    write(new, b"keep/a", b"2\n")
    write(new, b"keep/sub/b", b"new\n")
    write(base, b"other", b"1\n")
    write(new, b"other", b"2\n")
    write(new, b"keeper", b"not under keep/\n")
    assert summary(tree_changes(base, new, paths=[b"keep"])) == [
        (b"keep/a", "modified"), (b"keep/sub", "added"), (b"keep/sub/b", "added")]
    assert summary(tree_changes(base, new, paths=[b"keep/sub/b", b"other/"])) == [
        (b"keep/sub/b", "added"), (b"other", "modified")]
    assert summary(tree_changes(base, new, paths=[b"./keep//a"])) == [(b"keep/a", "modified")]
    for bad in (b"/etc", b"../x", b"keep/../../x"):
        with pytest.raises(UnsafePath):
            tree_changes(base, new, paths=[bad])
    assert normalize_path("a/./b/") == b"a/b"


def test_gitignore_excluded_unless_asked(tmp_path):
    base, new, live = tmp_path / "base", tmp_path / "new", tmp_path / "live"
    for root in (base, new, live):
        write(root, b".gitignore", b"__pycache__/\n*.pyc\n/build\n")
        write(root, b"src/mod.py", b"code\n")
    write(new, b"src/__pycache__/mod.cpython.pyc", b"\0bytecode")
    write(new, b"src/stray.pyc", b"\0")
    write(new, b"build/out", b"artifact\n")
    write(new, b"src/build/kept", b"not at top, so not ignored\n")
    assert summary(tree_changes(base, new, ignore_root=live)) == [
        (b"src/build", "added"), (b"src/build/kept", "added")]
    got = summary(tree_changes(base, new, ignore_root=live, include_ignored=True))
    assert (b"src/__pycache__/mod.cpython.pyc", "added") in got
    assert (b"build/out", "added") in got and (b"src/stray.pyc", "added") in got
    # the live workspace's rules decide, not the sandbox's
    write(new, b".gitignore", b"*\n")
    got = summary(tree_changes(base, new, ignore_root=live))
    assert (b".gitignore", "modified") in got and (b"src/build/kept", "added") in got


def test_git_info_exclude_and_symlinked_gitignore(tmp_path):
    tree = tmp_path / "t"
    write(tree, b".git/info/exclude", b"secret.*\n")
    write(tree, b"secret.txt")
    write(tree, b"plain.txt")
    write(tmp_path, b"evil-ignore", b"plain.txt\n")
    link(tree, b".gitignore", os.fsencode(tmp_path / "evil-ignore"))
    rules = IgnoreRules(tree)
    assert rules.is_ignored(b"secret.txt", False)
    assert not rules.is_ignored(b"plain.txt", False)  # a symlinked .gitignore is not read


def test_tree_reader_refuses_swapped_file(tmp_path):
    write(tmp_path, b"d/f", b"data\n")
    st = os.lstat(tmp_path / "d" / "f")
    with TreeReader(tmp_path) as r:
        assert r.read(b"d/f") == b"data\n"
        raw = _Raw("file", 0o644, st.st_size, st.st_dev, st.st_ino + 1, None)
        with pytest.raises(TreeChangedDuringScan):
            r.hash(b"d/f", raw)
    # a directory on the way that became a symlink is never followed
    outside = tmp_path / "outside"
    write(outside, b"f", b"secret\n")
    os.rename(tmp_path / "d", tmp_path / "d.old")
    os.symlink(outside, tmp_path / "d")
    with TreeReader(tmp_path) as r, pytest.raises(TreeChangedDuringScan):
        r.read(b"d/f")


# ---------------------------------------------------------------------------------------
# .gitignore semantics against `git ls-files --others --ignored --exclude-standard`.

IGNORE_CASES = [
    (b"*.log\n!keep.log\n", {}),
    (b"build/\n", {}),
    (b"/top.txt\n", {}),
    (b"a/**/z\n", {}),
    (b"**/deep\n", {}),
    (b"dir/**\n!dir/keep\n", {}),
    (b"[ab]*.txt\n", {}),
    (b"[!a]?.md\n", {}),
    (b"\\#hash\n\\!bang\n", {}),
    (b"space\\ \ntrail   \n", {}),
    (b"*\n!*/\n!*.c\n", {}),
    (b"", {b"sub/.gitignore": b"*.txt\n!keep.txt\n", b"sub/inner/.gitignore": b"!*.txt\n"}),
    (b"sub\n!sub/x.txt\n", {}),
    (b"doc/*.txt\n", {b"doc/.gitignore": b"!b.txt\n"}),
    (b"[[:digit:]]*\n[[:upper:]]*\n", {}),
    # git trims trailing spaces (not tabs) unless escaped, drops a CR before LF, reads '#'
    # inside a line literally, and skips a UTF-8 BOM at the start of the file
    (b"\xef\xbb\xbftab\t\nsp\\  \ncrlf.txt\r\na#b\n", {}),
    (b"onlydir/\n**/cache/\n", {}),  # directory-only: a file of that name stays
    # an excluded directory is not entered, so its own .gitignore cannot re-include
    (b"build/\n", {b"build/.gitignore": b"!out\n"}),
    (b"\xc3\xa9*\n\xff*\n", {}),  # names as bytes: UTF-8 and not
    # everything but directories and *.c, from a nested file
    (b"", {b"sub/.gitignore": b"*\n!*/\n!*.txt\n", b"sub/inner/.gitignore": b"q.txt\n"}),
]
PATHS = [b"a.txt", b"b.txt", b"c.txt", b"keep.log", b"x.log", b"build/out", b"src/build/o",
         b"top.txt", b"src/top.txt", b"a/z", b"a/b/c/z", b"x/deep", b"deep", b"dir/one", b"dir/keep",
         b"dir/sub/two", b"ab.md", b"bb.md", b"#hash", b"!bang", b"space ", b"trail", b"m.c",
         b"sub/a.txt", b"sub/keep.txt", b"sub/x.txt", b"sub/inner/q.txt", b"doc/a.txt", b"doc/b.txt",
         b"doc/sub/c.txt", b"1file", b"Upper", b"lower", b"tab\t", b"tab", b"sp ", b"sp", b"crlf.txt", b"a#b",
         b"onlydir", b"x/onlydir/f", b"src/cache/c.txt", b"cache/top.txt", b"\xc3\xa9t\xc3\xa9.txt", b"\xffraw",
         b"sub/inner/deeper/r.txt", b"sub/inner/r.bin"]


def _ours_ignored(root: Path, files: list[bytes]) -> set[bytes]:
    rules = IgnoreRules(root)
    return {f for f in files if rules.path_ignored(f, False)}


def _git_ignored(home: Path, root: Path) -> set[bytes]:
    out = git(home, root, "ls-files", "-z", "--others", "--ignored", "--exclude-standard")
    return {p for p in out.split(b"\0") if p}


@pytest.mark.parametrize("idx", range(len(IGNORE_CASES)))
def test_ignore_matches_git(tmp_path, idx):
    top, extra = IGNORE_CASES[idx]
    root = tmp_path / "repo"
    root.mkdir()
    git(tmp_path, root, "init", "-q")
    write(root, b".gitignore", top)
    for p, data in extra.items():
        write(root, p, data)
    for p in PATHS:
        write(root, p)
    files = [p for p in scan_tree(root) if (root / os.fsdecode(p)).is_file() and not p.endswith(b".gitignore")]
    assert _ours_ignored(root, files) == {p for p in _git_ignored(tmp_path, root) if not p.endswith(b".gitignore")}


PATTERN_PIECES = [b"*", b"?", b"a", b"b", b"/", b"**/", b"/**", b"[a-c]", b"[!b]", b".txt", b"d", b"\\*"]


@settings(max_examples=int(os.environ.get("PETRI_IGNORE_EXAMPLES", "40")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(st.tuples(st.booleans(), st.lists(st.sampled_from(PATTERN_PIECES), min_size=1, max_size=4),
                                st.booleans()), min_size=1, max_size=4))
# 'd**//': git strips one '/', and matching '**/' after the literal prefix 'd' starts afresh,
# so the directory d is ignored (and all in it).
@example(lines=[(False, [b"d", b"**/"], True)])
@example(lines=[(False, [b"a", b"**/", b"c.txt"], False)])  # 'a**/c.txt' matches a/b/c.txt
def test_random_ignore_patterns_match_git(tmp_path_factory, lines):
    root = tmp_path_factory.mktemp("ign")
    home = root / "home"
    home.mkdir()
    repo = root / "repo"
    repo.mkdir()
    git(home, repo, "init", "-q")
    text = b"".join((b"!" if neg else b"") + b"".join(parts) + (b"/" if d else b"") + b"\n"
                    for neg, parts, d in lines)
    write(repo, b".gitignore", text)
    files = [b"a", b"b.txt", b"ab.txt", b"d/a", b"d/b.txt", b"d/d/a.txt", b"c/d/x", b"*", b"a/b/c.txt"]
    ok = []
    for f in files:
        if any(o.startswith(f + b"/") or f.startswith(o + b"/") for o in ok):
            continue
        ok.append(f)
        write(repo, f)
    ours = _ours_ignored(repo, ok)
    theirs = {p for p in _git_ignored(home, repo) if p != b".gitignore"}
    assert ours - {b".gitignore"} == theirs, text


def test_parse_patterns_flags():
    pats = parse_patterns(b"# comment\n\n!neg\ndir/\n/anch\nmid/dle\n\\#lit\ntrail  \n")
    assert [(p.text, p.negated, p.dir_only, p.anchored) for p in pats] == [
        (b"neg", True, False, False), (b"dir", False, True, False), (b"anch", False, False, True),
        (b"mid/dle", False, False, True), (b"\\#lit", False, False, False), (b"trail", False, False, False)]


@pytest.mark.slow
def test_scan_speed_many_files(tmp_path):
    for d in range(100):
        for f in range(200):
            write(tmp_path, b"d%d/f%d" % (d, f), b"%d %d\n" % (d, f))
    t = time.monotonic()
    m = scan_tree(tmp_path)
    took = time.monotonic() - t
    assert len(m) == 20100
    assert took < 10, took


@pytest.mark.parametrize("index_version", ["2", "3", "4"])
def test_tracked_files_are_never_ignored(tmp_path, index_version):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(tmp_path, repo, "init", "-q")
    write(repo, b".gitignore", b"*.log\nvendor/\n")
    for p in (b"important.log", b"vendor/lib.c", b"vendor/deep/er/x.c", b"src/a.c"):
        write(repo, p)
    git(tmp_path, repo, "add", "-f", "important.log", "vendor/lib.c", "vendor/deep/er/x.c", "src/a.c")
    git(tmp_path, repo, "update-index", "--index-version", index_version)
    if index_version == "3":  # version 3 only differs with extended flags: set one
        write(repo, b"src/ita.c")
        git(tmp_path, repo, "add", "--intent-to-add", "src/ita.c")
    for p in (b"other.log", b"vendor/new.c", b"vendor/deep/new.c"):
        write(repo, p)
    assert (repo / ".git" / "index").read_bytes()[4:8] == int(index_version).to_bytes(4, "big")
    rules = IgnoreRules(repo)
    assert {b"important.log", b"vendor/lib.c", b"vendor/deep/er/x.c", b"src/a.c"} <= rules.tracked
    files = [p for p, e in scan_tree(repo).items() if e.kind == "file" and p != b".gitignore"]
    assert _ours_ignored(repo, files) == _git_ignored(tmp_path, repo) == {
        b"other.log", b"vendor/new.c", b"vendor/deep/new.c"}
    # and a change set made against this workspace's rules keeps the tracked ones
    base = tmp_path / "base"
    base.mkdir()
    got = {c.path for c in tree_changes(base, repo, ignore_root=repo)}
    assert {b"important.log", b"vendor/lib.c", b"vendor/deep/er/x.c"} <= got
    assert not got & {b"other.log", b"vendor/new.c", b"vendor/deep/new.c"}


def _span_counts_reference(data: bytes) -> dict[int, int]:
    """git's hash_chars (diffcore-delta.c) byte by byte, as it was first ported."""
    from merge.diffalgo import is_binary
    m32 = 0xFFFFFFFF
    text = not is_binary(data)
    counts: dict[int, int] = {}
    n = a1 = a2 = 0
    i = 0
    while i < len(data):
        c = data[i]
        i += 1
        if text and c == 13 and i < len(data) and data[i] == 10:
            continue
        old1 = a1
        a1 = ((a1 << 7) & m32) ^ (a2 >> 25)
        a2 = ((a2 << 7) & m32) ^ (old1 >> 25)
        a1 = (a1 + c) & m32
        n += 1
        if n < 64 and c != 10:
            continue
        h = ((a1 + a2 * 0x61) & m32) % 107927
        counts[h] = counts.get(h, 0) + n
        n = a1 = a2 = 0
    return counts


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from([b"a", b"\n", b"\r", b"\r\n", b"\0", b"\xff", b"x" * 63, b"y" * 64,
                                 b"z" * 65, b"word ", b"\n\n"]), max_size=60))
@example([b"x" * 63, b"\r\n"])  # a CR skipped right at the 64-byte boundary
@example([b"y" * 64, b"y" * 64])  # whole chunks only, no LF at all
def test_span_counts_match_the_byte_by_byte_port(parts):
    from merge.diffalgo import copied_bytes, span_counts
    data = b"".join(parts)
    want = _span_counts_reference(data)
    assert span_counts(data) == want
    assert span_counts(data) == want  # again, through the chunk memo
    other = _span_counts_reference(data[::-1])
    assert copied_bytes(span_counts(data), span_counts(data[::-1])) == \
        sum(min(v, other[h]) for h, v in want.items() if h in other)


@settings(max_examples=300, deadline=None)
@given(lines=st.lists(st.tuples(st.booleans(), st.lists(st.sampled_from(PATTERN_PIECES), min_size=1, max_size=4),
                                st.booleans()), min_size=1, max_size=12),
       rel=st.lists(st.sampled_from([b"a", b"b.txt", b"d", b"ab.txt", b"*", b"x"]), min_size=1, max_size=4),
       is_dir=st.booleans())
def test_rules_verdict_is_the_last_matching_pattern(lines, rel, is_dir):
    """Rules answers with one combined regex for the unanchored patterns; the answer is still
    git's: the last pattern of the file that matches decides, ! re-includes."""
    from merge.ignore import Rules
    text = b"".join((b"!" if neg else b"") + b"".join(parts) + (b"/" if d else b"") + b"\n"
                    for neg, parts, d in lines)
    pats = parse_patterns(text)
    path = b"/".join(rel)
    want = next((not p.negated for p in reversed(pats) if p.matches(path, is_dir)), None)
    assert Rules(pats).verdict(path, is_dir) == want, (text, path, is_dir)
