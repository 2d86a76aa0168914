"""merge3 against `git merge-file -p` (the oracle) on fixed and generated inputs."""
from __future__ import annotations

import os
import subprocess
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from merge.merge3 import is_binary, merge3, split_lines

pytestmark = pytest.mark.unit  # no root, mount, FUSE, cgroup or sandbox: `pytest -m unit`

LABELS = ["-L", "ours", "-L", "base", "-L", "theirs"]


def git_merge_file(base: bytes, ours: bytes, theirs: bytes, *, style: str = "merge",
                   favor: str | None = None) -> tuple[bytes, int]:
    with tempfile.TemporaryDirectory() as d:
        paths = []
        for name, data in (("o", ours), ("b", base), ("t", theirs)):
            p = os.path.join(d, name)
            with open(p, "wb") as f:
                f.write(data)
            paths.append(p)
        args = ["git", "-c", "core.autocrlf=false", "merge-file", "-p", *LABELS]
        if style == "diff3":
            args.append("--diff3")
        if favor:
            args.append(f"--{favor}")
        r = subprocess.run(args + paths, capture_output=True, cwd=d,
                           env={"PATH": os.environ["PATH"], "HOME": d, "GIT_CONFIG_NOSYSTEM": "1"})
        assert r.returncode >= 0, r.stderr
        return r.stdout, r.returncode


def check(base: bytes, ours: bytes, theirs: bytes, *, style: str = "merge",
          favor: str | None = None) -> None:
    want, rc = git_merge_file(base, ours, theirs, style=style, favor=favor)
    got = merge3(base, ours, theirs, style=style, favor=favor)  # type: ignore[arg-type]
    assert got.content == want
    if favor is None:
        assert len(got.conflicts) == rc


FIXED = [
    # (base, ours, theirs)
    (b"a\nb\nc\n", b"a\nB\nc\n", b"a\nb\nC\n"),            # adjacent lines: git calls it a conflict
    (b"a\nb\nc\nd\n", b"A\nb\nc\nd\n", b"a\nb\nc\nD\n"),   # apart: clean
    (b"a\nb\nc\n", b"a\nX\nc\n", b"a\nX\nc\n"),            # identical change: clean
    (b"a\nb\nc\n", b"a\nX\nc\n", b"a\nY\nc\n"),            # same line: conflict
    (b"a\nb\nc\n", b"a\nb\nc\nours\n", b"a\nb\nc\ntheirs\n"),  # both append
    (b"a\nb", b"a\nb\n", b"a\nb"),                          # newline at eof only on one side
    (b"a\nb", b"a\nx", b"a\ny"),                            # no newline at eof, conflict
    (b"a\r\nb\r\nc\r\n", b"a\r\nX\r\nc\r\n", b"a\r\nY\r\nc\r\n"),  # CRLF markers
    (b"", b"x\n", b"y\n"),                                  # add/add
    (b"", b"x\n", b"x\n"),
    (b"a\n", b"", b"a\nb\n"),                               # delete vs append
    (b"1\n2\n3\n4\n5\n6\n7\n8\n", b"1\nX\n3\n4\n5\n6\nY\n8\n", b"1\nZ\n3\n4\n5\n6\nY\n8\n"),
    (b"1\n2\n3\n4\n5\n", b"1\nA\nB\nC\n5\n", b"1\nA\nb\nC\n5\n"),  # zealous refinement
    (b"x\n{\n}\ny\n", b"X\n{\n}\nY\n", b"x2\n{\n}\ny2\n"),   # non-alnum gap is joined
    (b"a\na\na\n", b"a\na\na\na\n", b"a\na\n"),
]


@pytest.mark.parametrize("style", ["merge", "diff3"])
@pytest.mark.parametrize("case", FIXED, ids=range(len(FIXED)))
def test_fixed_cases_match_git(case, style):
    check(*case, style=style)


@pytest.mark.parametrize("favor", ["ours", "theirs", "union"])
@pytest.mark.parametrize("case", FIXED, ids=range(len(FIXED)))
def test_favor_matches_git(case, favor):
    check(*case, favor=favor)


def test_markers_and_hunks():
    r = merge3(b"a\nb\nc\n", b"a\nX\nc\n", b"a\nY\nc\n", style="diff3")
    assert not r.clean
    assert r.content == (b"a\n<<<<<<< ours\nX\n||||||| base\nb\n=======\nY\n>>>>>>> theirs\nc\n")
    (h,) = r.conflicts
    assert (h.base_start, h.base_lines, h.ours_lines, h.theirs_lines) == (1, (b"b\n",), (b"X\n",), (b"Y\n",))
    assert "base 2,1" in h.describe()


def test_binary_both_changed_is_a_conflict():
    r = merge3(b"\0a", b"\0b", b"\0c")
    assert r.binary and not r.clean and r.content == b"\0b"
    assert merge3(b"\0a", b"\0b", b"\0c", favor="theirs").content == b"\0c"
    assert merge3(b"\0a", b"\0a", b"\0c").clean
    assert merge3(b"\0a", b"\0c", b"\0c").content == b"\0c"
    assert is_binary(b"x" * 7999 + b"\0") and not is_binary(b"x" * 8000 + b"\0")


def test_split_lines_is_newline_only():
    assert split_lines(b"a\rb\x0cc\nd") == [b"a\rb\x0cc\n", b"d"]
    assert split_lines(b"") == [] and split_lines(b"\n\n") == [b"\n", b"\n"]


# --- generated: lines chosen so the common subsequence of any two inputs is unique, which is
# where any correct diff algorithm and xdiff must agree, so git's output is exact ------------

@st.composite
def unique_lcs_triples(draw):
    nb = draw(st.integers(0, 10))
    base = [b"b%d\n" % i for i in range(nb)]

    def side():
        out = []
        for gap in range(nb + 1):
            # candidate new lines for this gap, in one global order shared by both sides, some
            # without letters or digits (git joins conflicts separated only by those)
            pool = [b"n%d_%d\n" % (gap, k) if k % 3 else b"}" * (gap * 7 + k + 1) + b"\n"
                    for k in range(5)]
            picks = draw(st.lists(st.sampled_from(range(5)), max_size=2, unique=True))
            out += [pool[k] for k in sorted(picks)]
            if gap < nb and draw(st.booleans() | st.just(True)):
                out.append(base[gap])
        data = b"".join(out)
        if data and draw(st.integers(0, 4)) == 0:
            data = data[:-1]  # no newline at end of file
        return data

    b = b"".join(base)
    if b and draw(st.integers(0, 5)) == 0:
        b = b[:-1]
    return b, side(), side()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(unique_lcs_triples(), st.sampled_from(["merge", "diff3"]))
def test_generated_match_git(triple, style):
    check(*triple, style=style)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([b"a\n", b"b\n", b"\n", b"}\n"]), max_size=8),
       st.lists(st.sampled_from([b"a\n", b"c\n"]), max_size=4),
       st.lists(st.sampled_from([b"a\n", b"d\n"]), max_size=4))
def test_properties_on_repeated_lines(base_lines, add_ours, add_theirs):
    """Where lines repeat the diff may legitimately differ from xdiff's; what must hold:
    one-sided changes are taken whole, and a clean merge contains both sides' additions."""
    base = b"".join(base_lines)
    ours = b"".join(add_ours) + base
    theirs = base + b"".join(add_theirs)
    assert merge3(base, ours, base).content == ours
    assert merge3(base, base, theirs).content == theirs
    r = merge3(base, ours, theirs)
    if r.clean:
        assert r.content.count(b"c\n") >= ours.count(b"c\n")
        assert r.content.count(b"d\n") >= theirs.count(b"d\n")
    else:
        assert b"<<<<<<< ours\n" in r.content and b">>>>>>> theirs\n" in r.content


@st.composite
def repeated_line_triples(draw):
    alpha = st.sampled_from([b"a\n", b"b\n", b"c\n", b"\n", b"}\n", b"x\r\n", b"tail"])
    base = draw(st.lists(alpha, max_size=10))

    def mutate():
        lines = list(base)
        for _ in range(draw(st.integers(0, 3))):
            op = draw(st.integers(0, 2))
            if op == 0 and lines:
                del lines[draw(st.integers(0, len(lines) - 1))]
            elif op == 1:
                lines.insert(draw(st.integers(0, len(lines))), draw(alpha))
            elif lines:
                lines[draw(st.integers(0, len(lines) - 1))] = draw(alpha)
        return b"".join(lines)

    return b"".join(base), mutate(), mutate()


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(repeated_line_triples(), st.sampled_from(["merge", "diff3"]))
def test_repeated_lines_match_git(triple, style):
    """With xdiff's Myers (merge.diffalgo) underneath, even ambiguous inputs match git."""
    check(*triple, style=style)
