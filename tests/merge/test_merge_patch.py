"""Patches from change sets, with real git (and GNU patch) as the oracle.

Each case builds a base and a new tree, makes a patch, then:
- compares it byte for byte with `git diff --cached --binary -M` for the same two trees
  (text patches; for binaries git may pick a delta, so only the headers are compared);
- applies it with `git apply --index` to a copy of the base and compares the result to
  the new tree (contents, exec bit, symlink targets), then reverse-applies it;
- compares our numstat with git's;
- applies text-only patches with `patch -p1` and checks the regular files it can make.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from merge import diffalgo
from merge.changes import tree_changes
from merge.patch import blob_sha1, format_patch, format_stat, patch_stats, quote_path
from tests.helpers.trees import copytree, git, git_view

pytestmark = pytest.mark.unit  # no root, mount, FUSE, cgroup or sandbox: `pytest -m unit`



@pytest.fixture(scope="module")
def git_home(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    return home


# A tree spec: path -> bytes (file, 0644), ("x", bytes) (file, 0755), ("l", target), ("d",) empty dir
def build(root: Path, spec: dict) -> None:
    root.mkdir(parents=True, exist_ok=True)
    rb = os.fsencode(root)
    for path, v in spec.items():
        full = rb + b"/" + path
        os.makedirs(os.path.dirname(full), exist_ok=True)
        if isinstance(v, bytes):
            with open(full, "wb") as f:
                f.write(v)
            os.chmod(full, 0o644)
        elif v[0] == "x":
            with open(full, "wb") as f:
                f.write(v[1])
            os.chmod(full, 0o755)
        elif v[0] == "l":
            os.symlink(v[1], full)
        elif v[0] == "d":
            os.makedirs(full, exist_ok=True)


def git_oracle(home: Path, base: Path, new: Path, work: Path) -> tuple[bytes, bytes]:
    """git's own patch and numstat for base -> new (a repo holding base, index set to new)."""
    repo = work / "oracle"
    copytree(base, repo)
    git(home, repo, "init", "-q")
    git(home, repo, "add", "-A", "-f")
    git(home, repo, "commit", "-q", "-m", "base", "--allow-empty")
    for name in os.listdir(os.fsencode(repo)):
        if name != b".git":
            full = os.path.join(os.fsencode(repo), name)
            if os.path.isdir(full) and not os.path.islink(full):
                shutil.rmtree(full)
            else:
                os.unlink(full)
    for name in os.listdir(os.fsencode(new)):
        if name in (b".git", b".petri"):
            continue
        s = os.path.join(os.fsencode(new), name)
        d = os.path.join(os.fsencode(repo), name)
        if os.path.isdir(s) and not os.path.islink(s):
            shutil.copytree(s, d, symlinks=True)
        else:
            shutil.copy2(s, d, follow_symlinks=False)
    # Build the index from scratch: copy2 keeps mtimes, an unlinked file's inode is reused and git
    # compares whole seconds, so a same-size edit made in the same second as the base looked
    # "unchanged" to a refreshed index (CI caught that racily-clean case once).
    os.unlink(repo / ".git" / "index")
    git(home, repo, "add", "-A", "-f")
    patch = git(home, repo, "diff", "--cached", "--binary", "-M", "HEAD").stdout
    numstat = git(home, repo, "diff", "--cached", "-z", "--numstat", "-M", "HEAD").stdout
    return patch, numstat


def parse_numstat_z(out: bytes) -> dict[bytes, tuple[str, str]]:
    res = {}
    parts = out.split(b"\0")
    i = 0
    while i < len(parts) - 1:
        head = parts[i]
        added, removed, name = head.split(b"\t", 2)
        if name == b"":  # rename: old and new follow
            name = parts[i + 2]
            i += 3
        else:
            i += 1
        res[name] = (added.decode(), removed.decode())
    return res


def check_roundtrip(home: Path, base: Path, new: Path, work: Path, *, compare_text: bool = True,
                    use_gnu_patch: bool = True) -> bytes:
    changes = tree_changes(base, new, include_ignored=True)
    patch = format_patch(changes, base, new)
    stats = patch_stats(changes, base, new)
    want = git_view(new)

    # git apply to a copy of the base
    applied = work / "applied"
    copytree(base, applied)
    git(home, applied, "init", "-q")
    git(home, applied, "add", "-A", "-f")
    r = git(home, applied, "apply", "--index", "--allow-empty", "-", input=patch, check=False)
    assert r.returncode == 0, (r.stderr.decode(errors="replace"), patch.decode(errors="replace"))
    assert git_view(applied) == want
    # and back again
    r = git(home, applied, "apply", "-R", "--index", "--allow-empty", "-", input=patch, check=False)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    assert git_view(applied) == git_view(base)

    git_patch, git_numstat = git_oracle(home, base, new, work)
    binary = b"GIT binary patch" in git_patch
    if compare_text and not binary:
        assert patch == git_patch, (patch.decode(errors="replace"), git_patch.decode(errors="replace"))
    ours = {}
    for s in stats:
        if s.binary:
            ours[s.path] = ("-", "-")
        else:
            ours[s.path] = (str(s.lines_added), str(s.lines_removed))
    theirs = parse_numstat_z(git_numstat)
    assert ours == theirs
    assert format_stat(stats).endswith("\n") or not stats

    # GNU patch refuses to create a/b in the same patch that deletes the file a (or the
    # reverse); git handles it, so only those cases skip the GNU patch check.
    file_dir_swap = any(c.status == "type_changed" and "dir" in (c.old.kind, c.new.kind) for c in changes)
    # GNU patch cannot create or delete an empty file from a git header alone.
    empty_add_del = any(s.status in ("added", "deleted", "type_changed") and not s.lines_added
                        and not s.lines_removed for s in stats)
    # GNU patch handles symlinks in git patches only partly (no renames of them).
    symlinks = any(e is not None and e.kind == "symlink" for c in changes for e in (c.old, c.new))
    # ...nor a rename header whose names hold a space (it splits `diff --git` on spaces).
    # (the same for a header-only entry, a mode change, say).
    spaced_rename = any(c.old_path is not None and (b" " in c.old_path or b" " in c.path) for c in changes) \
        or any(b" " in s.path and not s.lines_added and not s.lines_removed for s in stats)
    if use_gnu_patch and not binary and patch and not (file_dir_swap or empty_add_del or symlinks
                                                       or spaced_rename):
        plain = work / "plain"
        copytree(base, plain)
        r = subprocess.run(["patch", "-p1", "-s", "-f", "--no-backup-if-mismatch"], cwd=plain,
                           input=patch, capture_output=True)
        assert r.returncode == 0, (r.stdout, r.stderr, patch)
        got = git_view(plain)
        # GNU patch makes regular files right; symlinks and the exec bit it may not.
        for p, (mode, sha) in want.items():
            if mode != "120000" and p in got and got[p][0] != "120000":
                assert got[p][1] == sha, p
        for p, (mode, _) in git_view(base).items():
            if p not in want and mode != "120000":
                assert p not in got, p
    for d in ("applied", "oracle", "plain"):
        shutil.rmtree(work / d, ignore_errors=True)
    return patch


@pytest.fixture
def trees(tmp_path):
    base, new, work = tmp_path / "base", tmp_path / "new", tmp_path / "work"
    work.mkdir()
    os.umask(0o022)
    return base, new, work


CASES = {
    "add_modify_delete": (
        {b"a.txt": b"one\ntwo\nthree\n", b"gone.txt": b"bye\n", b"d/e/f.txt": b"x\n" * 20},
        {b"a.txt": b"one\n2\nthree\nfour\n", b"new.txt": b"hello\n",
         b"d/e/f.txt": b"x\n" * 5 + b"y\n" + b"x\n" * 14},
    ),
    "exec_bit": (
        {b"run.sh": b"#!/bin/sh\necho\n", b"both.sh": b"a\n"},
        {b"run.sh": ("x", b"#!/bin/sh\necho\n"), b"both.sh": ("x", b"b\n")},
    ),
    "symlinks": (
        {b"l1": ("l", b"target1"), b"l2": ("l", b"gone"), b"t": b"t\n"},
        {b"l1": ("l", b"target2"), b"l3": ("l", b"../somewhere/else"), b"t": b"t\n"},
    ),
    "type_changes": (
        {b"f2l": b"content\n", b"l2f": ("l", b"x"), b"f2d": b"file\n"},
        {b"f2l": ("l", b"content"), b"l2f": b"now a file\n", b"f2d/inner": b"inner\n"},
    ),
    "renames": (
        {b"old/name.txt": b"".join(b"line %d\n" % i for i in range(30)),
         b"same.txt": b"identical\ncontent\n", b"keep": b"k\n"},
        {b"new/name.txt": b"".join(b"line %d\n" % i for i in range(30) if i != 7) + b"extra\n",
         b"moved/same.txt": b"identical\ncontent\n", b"keep": b"k\n"},
    ),
    "rename_exec": (
        {b"s.sh": b"#!/bin/sh\nexit 0\n"},
        {b"t.sh": ("x", b"#!/bin/sh\nexit 0\n")},
    ),
    "no_final_newline": (
        {b"a": b"one\ntwo", b"b": b"one\ntwo\n", b"c": b"x", b"d": b"same\nend"},
        {b"a": b"one\ntwo\n", b"b": b"one\ntwo", b"c": b"y", b"d": b"changed\nend"},
    ),
    "crlf": (
        {b"win.txt": b"a\r\nb\r\nc\r\n", b"mixed": b"a\r\nb\nc\r\n"},
        {b"win.txt": b"a\r\nB\r\nc\r\n", b"mixed": b"a\nb\r\nc\r\nd"},
    ),
    "empty_files": (
        {b"e1": b"", b"e2": b"", b"full": b"x\n", b"toempty": b"y\n"},
        {b"e1": b"now\n", b"e3": b"", b"full": b"x\n", b"toempty": b""},
    ),
    "hostile_names": (
        {b"with space.txt": b"a\n", b'quo"te': b"q\n", b"back\\slash": b"b\n", b"-leading": b"l\n"},
        {b"with space.txt": b"A\n", b'quo"te': b"Q\n", b"back\\slash": b"B\n", b"-leading": b"L\n",
         b"tab\there": b"t\n", b"new\nline": b"n\n", b"bad\xff\xfeutf8": b"u\n", b"\xc3\xa9t\xc3\xa9": b"e\n",
         b"dir with space/f": b"f\n"},
    ),
    "binary": (
        {b"img.bin": bytes(range(256)) * 4, b"gone.bin": b"\0\1\2", b"t2b": b"text\n"},
        {b"img.bin": bytes(range(256)) * 3 + b"\0tail", b"new.bin": b"\0" * 100 + os.urandom(300),
         b"t2b": b"now\0binary"},
    ),
    "funcname_context": (
        {b"prog.c": b"int main(void)\n{\n" + b"".join(b"    x%d();\n" % i for i in range(40)) + b"}\n"
                    b"static void other(void)\n{\n" + b"".join(b"    y%d();\n" % i for i in range(20)) + b"}\n"},
        {b"prog.c": b"int main(void)\n{\n" + b"".join(b"    x%d();\n" % i for i in range(40) if i not in (10, 30))
                    + b"}\nstatic void other(void)\n{\n" + b"".join(b"    y%d();\n" % i for i in range(20) if i != 15)
                    + b"    z();\n}\n"},
    ),
    # A function line of over 80 bytes with a space at byte 80 (git cuts, then trims; libgit2
    # trims, then cuts), and one ending in a form feed (git keeps \f, libgit2 drops it).
    "funcname_edges": (
        {b"doc.md": b"A paragraph that runs on past the eighty byte limit of the hunk header with" + b" " * 6
                    + b"a space there\n" + b"".join(b"  line %d\n" % i for i in range(12)),
         b"ff.c": b"int f(void)\f\n{\n" + b"".join(b"    f%d();\n" % i for i in range(12)) + b"}\n",
         # a first hunk with no function line above it, then one under "def g():\v"
         b"vt.py": b"  a\n  b\n  c\n  d\ndef g():\v \n" + b"".join(b"  l%d\n" % i for i in range(12))},
        {b"doc.md": b"A paragraph that runs on past the eighty byte limit of the hunk header with" + b" " * 6
                    + b"a space there\n" + b"".join(b"  line %d\n" % i for i in range(12) if i != 9),
         b"ff.c": b"int f(void)\f\n{\n" + b"".join(b"    f%d();\n" % i for i in range(12) if i != 9) + b"}\n",
         b"vt.py": b"  a\n  B\n  c\n  d\ndef g():\v \n" + b"".join(b"  l%d\n" % i for i in range(12) if i != 9)},
    ),
    # Text by git's rule (no NUL in the first 8000 bytes) however it looks: control bytes and
    # escape sequences, a NUL past byte 8000. Binary or not is decided here, never by libgit2.
    "text_by_gits_rule": (
        {b"ansi.log": b"".join(b"\x1b[3%dmline %d\x1b[0m\x01\x02\x7f\n" % (i % 8, i) for i in range(30)),
         b"late_nul.txt": b"pad\n" * 2500 + b"tail \0 nul\n" + b"end\n"},
        {b"ansi.log": b"".join(b"\x1b[3%dmline %d\x1b[0m\x01\x02\x7f\n" % (i % 8, i) for i in range(30) if i != 12),
         b"late_nul.txt": b"pad\n" * 2500 + b"tail \0 NUL\n" + b"end\n"},
    ),
    # A big binary with a small edit: libgit2 sends it as a delta, both ways, as git does.
    "binary_delta": (
        {b"blob.bin": bytes(range(256)) * 64, b"moved.bin": b"\0" + bytes(range(200)) * 20},
        {b"blob.bin": bytes(range(256)) * 30 + b"\0edit" + bytes(range(256)) * 34,
         b"moved/there.bin": b"\0" + bytes(range(200)) * 20 + b"\1"},
    ),
    "indent_heuristic": (
        {b"py.py": b"def a():\n    pass\n\n\ndef c():\n    pass\n"},
        {b"py.py": b"def a():\n    pass\n\n\ndef b():\n    pass\n\n\ndef c():\n    pass\n"},
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_case_roundtrip(git_home, trees, name):
    base, new, work = trees
    b, n = CASES[name]
    build(base, b)
    build(new, n)
    patch = check_roundtrip(git_home, base, new, work)
    assert patch  # every case changes something git can see


def test_binary_patch_has_full_index_and_both_literals(git_home, trees):
    base, new, work = trees
    build(base, {b"b.bin": b"\0old"})
    build(new, {b"b.bin": b"\0new data"})
    patch = format_patch(tree_changes(base, new), base, new)
    sha_a, sha_b = blob_sha1(b"\0old"), blob_sha1(b"\0new data")
    assert f"index {sha_a}..{sha_b} 100644\n".encode() in patch
    assert patch.count(b"\nliteral ") == 2
    check_roundtrip(git_home, base, new, work)


def test_big_binary_edit_is_sent_as_deltas(git_home, trees):
    base, new, work = trees
    old = bytes(range(256)) * 64
    build(base, {b"b.bin": old})
    build(new, {b"b.bin": old[:5000] + b"\0changed" + old[5000:]})
    patch = format_patch(tree_changes(base, new), base, new)
    assert patch.count(b"\ndelta ") == 2 and b"\nliteral " not in patch
    assert len(patch) < 400  # the literal would be ~16 KB before compression
    check_roundtrip(git_home, base, new, work)


def test_dirs_and_git_dir_never_in_patch(git_home, trees):
    base, new, work = trees
    build(base, {b"a": b"a\n", b".git/config": b"[core]\n", b".petri/x": b"s\n"})
    build(new, {b"a": b"a\n", b"emptydir": ("d",), b".git/config": b"[core]\n\tfsmonitor = evil\n",
                b".git/newobj": b"o\n", b".petri/y": b"s\n"})
    changes = tree_changes(base, new)
    assert [(c.path, c.status, c.new.kind) for c in changes] == [(b"emptydir", "added", "dir")]
    assert format_patch(changes, base, new) == b""
    assert patch_stats(changes, base, new) == []


def test_quote_path_matches_git():
    assert quote_path(b"plain/name.txt", b"a/") == b"a/plain/name.txt"
    assert quote_path(b"sp ace") == b"sp ace"
    assert quote_path(b"t\tn\nq\"b\\", b"b/") == b'"b/t\\tn\\nq\\"b\\\\"'
    assert quote_path(b"\xc3\xa9\x7f\x01") == b'"\\303\\251\\177\\001"'


STAT_CASES = {
    "mixed": ({b"a": b"1\n2\n3\n", b"dir/old": b"x\n" * 10, b"bin": b"\0", b"z": b"q\n" * 5},
              {b"a": b"1\n3\n4\n5\n", b"dir/new": b"x\n" * 10, b"bin": b"\0\0"}),
    "wide": ({b"big": b"".join(b"%d\n" % i for i in range(300)), b"small": b"s\n"},
             {b"big": b"".join(b"%d\n" % (i * 7) for i in range(120)), b"small": b"t\n",
              b"a/very/long/directory/name/that/goes/on/and/on/and/on/forever/file.txt": b"x\n"}),
    "text_only": ({b"x": b"1\n"}, {b"x": b"2\n", b"y": b"3\n" * 4}),
}


@pytest.mark.parametrize("name", sorted(STAT_CASES))
def test_stat_matches_git_stat(git_home, trees, name):
    base, new, work = trees
    build(base, STAT_CASES[name][0])
    build(new, STAT_CASES[name][1])
    changes = tree_changes(base, new)
    ours = format_stat(patch_stats(changes, base, new))
    repo = work / "oracle"
    git_oracle(git_home, base, new, work)
    theirs = git(git_home, repo, "diff", "--cached", "--stat=80", "-M", "HEAD").stdout.decode()
    assert ours == theirs


def test_similarity_matches_git_scores(git_home, trees):
    base, new, work = trees
    src = b"".join(b"row %d of the file\n" % i for i in range(50))
    dst = b"".join(b"row %d of the file\n" % i for i in range(50) if i % 3) + b"tail\n"
    build(base, {b"s": src})
    build(new, {b"d": dst})
    changes = tree_changes(base, new)
    git_patch, _ = git_oracle(git_home, base, new, work)
    line = [ln for ln in git_patch.splitlines() if ln.startswith(b"similarity index")]
    if line:
        assert changes[0].status == "renamed"
        assert b"similarity index %d%%" % changes[0].similarity == line[0]
    else:
        assert {c.status for c in changes} == {"added", "deleted"}


def test_many_inexact_renames_match_git(git_home, trees):
    """A 30 x 30 rename matrix (CRLF lines, lines past 64 bytes, repeated lines, files without
    a final newline, near and far copies): pairs and similarity scores as git's, byte for byte."""
    import random
    base, new, work = trees
    rng = random.Random(5)
    pool = [b"line %d of the shared corpus\n" % i for i in range(60)] + [b"\n", b"    }\n", b"{\r\n"] + \
        [b"long " * rng.randrange(14, 40) + b"%d\n" % i for i in range(20)] + [b"crlf %d\r\n" % i for i in range(10)]
    src_spec, dst_spec = {}, {}
    for i in range(30):
        lines = [rng.choice(pool) for _ in range(rng.randrange(5, 60))]
        data = b"".join(lines)
        if i % 7 == 3:
            data = data.rstrip(b"\n") + b" and no newline" + b"x" * rng.randrange(0, 130)
        src_spec[b"src/f%02d.txt" % i] = data
        keep = rng.choice([0.3, 0.5, 0.7, 0.9, 1.0])
        edited = [ln for ln in lines if rng.random() < keep] + [rng.choice(pool) for _ in range(rng.randrange(0, 8))]
        dst_spec[b"dst/g%02d.txt" % ((i * 7) % 30)] = b"".join(edited)
    build(base, src_spec)
    build(new, dst_spec)
    changes = tree_changes(base, new)
    assert sum(c.status == "renamed" for c in changes) >= 5  # the matrix did pair files
    check_roundtrip(git_home, base, new, work, use_gnu_patch=False)


# ---------------------------------------------------------------------------------------
# Random trees and random edits.

NAMES = [b"a", b"b.txt", b"c d", b"-x", b"q\"", b"\xff", b"n\nl", b"t\tb", b"dir/e", b"dir/f",
         b"dir/sub/g", b"other/h", b"deep/er/est/i"]
LINES = [b"alpha\n", b"beta\n", b"gamma\n", b"{\n", b"}\n", b"\n", b"    indented\n", b"def f():\n",
         b"x\r\n", b"same\n"]


@st.composite
def contents(draw):
    lines = draw(st.lists(st.sampled_from(LINES), max_size=40))
    data = b"".join(lines)
    if draw(st.booleans()) and data.endswith(b"\n"):
        data = data[:-1]
    return data


@st.composite
def tree_pair(draw):
    base: dict = {}
    for name in draw(st.lists(st.sampled_from(NAMES), max_size=8, unique=True)):
        kind = draw(st.sampled_from(["file", "file", "file", "exec", "link"]))
        if kind == "link":
            base[name] = ("l", draw(st.sampled_from([b"a", b"../x", b"dir/e", b"nowhere"])))
        elif kind == "exec":
            base[name] = ("x", draw(contents()))
        else:
            base[name] = draw(contents())
    # drop names that would collide with a directory of another name
    def consistent(spec):
        ok = {}
        for n in sorted(spec):
            if any(n.startswith(o + b"/") or o.startswith(n + b"/") for o in ok):
                continue
            ok[n] = spec[n]
        return ok
    base = consistent(base)
    new = dict(base)
    for name in list(base):
        op = draw(st.sampled_from(["keep", "keep", "edit", "delete", "rename", "chmod", "retype"]))
        v = base[name]
        if op == "edit":
            if isinstance(v, bytes):
                lines = diffalgo.split_lines(v)
                idx = draw(st.integers(0, len(lines)))
                lines[idx:idx + draw(st.integers(0, 3))] = draw(st.lists(st.sampled_from(LINES), max_size=3))
                new[name] = b"".join(lines)
            elif v[0] == "l":
                new[name] = ("l", v[1] + b"2")
        elif op == "delete":
            del new[name]
        elif op == "rename":
            target = draw(st.sampled_from(NAMES)) + b"_r"
            del new[name]
            if isinstance(v, bytes) and draw(st.booleans()):
                v = v + b"appended\n"
            new[target] = v
        elif op == "chmod" and isinstance(v, bytes):
            new[name] = ("x", v)
        elif op == "retype":
            new[name] = ("l", b"retyped") if not (isinstance(v, tuple) and v[0] == "l") else b"was link\n"
    for name in draw(st.lists(st.sampled_from(NAMES), max_size=3, unique=True)):
        if name not in new:
            new[name] = draw(contents())
    return base, consistent(new)


def _random_roundtrip(git_home, tmp_path_factory, pair):
    base_spec, new_spec = pair
    root = tmp_path_factory.mktemp("rand")
    try:
        os.umask(0o022)
        base, new, work = root / "base", root / "new", root / "work"
        work.mkdir()
        build(base, base_spec)
        build(new, new_spec)
        check_roundtrip(git_home, base, new, work)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pair=tree_pair())
def test_random_trees_roundtrip(git_home, tmp_path_factory, pair):
    _random_roundtrip(git_home, tmp_path_factory, pair)


@pytest.mark.slow
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pair=tree_pair())
def test_random_trees_roundtrip_many(git_home, tmp_path_factory, pair):
    _random_roundtrip(git_home, tmp_path_factory, pair)


@settings(max_examples=60, deadline=None)
@given(a=st.lists(st.sampled_from(LINES[:5]), max_size=60), b=st.lists(st.sampled_from(LINES[:5]), max_size=60))
def test_diff_lines_is_a_valid_edit_script(a, b):
    script = diffalgo.diff_lines(a, b)
    # applying the script to a gives b
    out, pos = [], 0
    for i1, n1, i2, n2 in script:
        out.extend(a[pos:i1])
        out.extend(b[i2:i2 + n2])
        pos = i1 + n1
    out.extend(a[pos:])
    assert out == b


def _git_numstat_and_hunks(home: Path, work: Path, a: bytes, b: bytes) -> tuple[tuple[int, int], bytes]:
    (work / "ha").write_bytes(a)
    (work / "hb").write_bytes(b)
    ns = git(home, work, "diff", "--no-index", "--numstat", "ha", "hb", check=False).stdout.split()
    out = git(home, work, "diff", "--no-index", "ha", "hb", check=False).stdout
    return (int(ns[0]), int(ns[1])), out[out.index(b"\n@@") + 1:]


def _hard_case(git_home, tmp_path, seed: int, symbols: int, n: int) -> None:
    import random

    from merge.patch import _body, _diff

    rnd = random.Random(seed)
    a = b"".join(b"%d\n" % rnd.randrange(symbols) for _ in range(n))
    b = b"".join(b"%d\n" % rnd.randrange(symbols) for _ in range(n + seed * 37))
    ra, rb = diffalgo.split_lines(a), diffalgo.split_lines(b)
    script = diffalgo.diff_lines(ra, rb)
    (added, removed), hunks = _git_numstat_and_hunks(git_home, tmp_path, a, b)
    assert (sum(s[3] for s in script), sum(s[1] for s in script)) == (added, removed)
    patch = _diff(a, b, False)
    assert patch.line_stats[1:] == (added, removed)
    assert _body(patch, a) == hunks


@pytest.mark.parametrize("seed,symbols", [(0, 10), (1, 3)])
def test_costly_diffs_match_git(git_home, tmp_path, seed, symbols):
    """Inputs costly enough to trigger xdiff's cut-off heuristics (non-minimal diffs): the
    counts and hunks must still be git's, or numstat and `lines_added` would disagree."""
    _hard_case(git_home, tmp_path, seed, symbols, 2500)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(12))
def test_costly_diffs_match_git_many(git_home, tmp_path, seed):
    _hard_case(git_home, tmp_path, seed, [2, 3, 10, 50, 100, 1000][seed % 6], 4000 + seed * 50)
