"""Line-level 3-way merge of bytes, following ``git merge-file`` (xdiff's xmerge.c).

``merge3(base, ours, theirs)`` returns the merged bytes and the conflicting hunks. The hunk
logic is a transcription of xdiff's: two 2-way diffs (base->ours, base->theirs), each
compacted the way ``xdl_change_compact`` slides change groups, walked side by side. A change
on one side only is taken; two changes that overlap *or touch* (one ends on the line where
the other starts, or both insert at the same point) are one conflict unless they are
byte-identical. With ``style="merge"`` (git's default) conflicts are then refined as
``XDL_MERGE_ZEALOUS_ALNUM`` does: the two sides of a conflict are diffed against each other
so only the lines that really differ stay in conflict, identical results stop being
conflicts, and conflicts separated by at most three lines (or only by lines without letters
or digits) are joined. With ``style="diff3"`` git lowers the level to ``EAGER`` (the base is
shown, so refining would lie about it), and so do we. Markers are git's: seven characters,
``<<<<<<< ours``, ``||||||| base`` (diff3 only), ``=======``, ``>>>>>>> theirs``; a side whose
last line lacks a newline gets one inside a conflict; CRLF markers when the surrounding lines
use CRLF (``is_cr_needed``).

``favor="ours"|"theirs"|"union"`` resolves each conflicting hunk like ``git merge-file
--ours/--theirs/--union`` (per hunk, not per file; changes of the other side elsewhere in the
file are kept).

Binary: NUL in the first 8000 bytes of any input (git's ``buffer_is_binary``). Binary inputs
are never merged line-wise: one side changed -> that side; both changed the same way ->
that; both changed differently -> one conflict, the result is ours (or the favoured side).

Caveats: the two 2-way diffs under the hunk logic are libgit2's xdiff (``merge.diffalgo``):
Myers and compaction without the indent heuristic, which is what ``git merge-file`` runs;
the tests compare with ``git merge-file`` byte for byte, also on inputs full of repeated
lines. Neither the zdiff3 style nor whitespace-ignoring flags are implemented. The 3-way
hunk logic itself is a transcription, not a library: pygit2's ``merge_file_from_index``
needs a repository and decodes its result as UTF-8, so it cannot merge arbitrary bytes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence
from .diffalgo import diff_lines

Style = Literal["merge", "diff3"]
Favor = Literal["ours", "theirs", "union"] | None

MARKER_SIZE = 7
BINARY_SNIFF = 8000

# merge region modes, as in xmerge.c
_CONFLICT, _OURS, _THEIRS, _UNION, _IDENTICAL = 0, 1, 2, 3, 4


def is_binary(data: bytes) -> bool:
    """git's heuristic: a NUL byte in the first 8000 bytes."""
    return b"\0" in data[:BINARY_SNIFF]


def split_lines(data: bytes) -> list[bytes]:
    """Records as xdiff sees them: each keeps its b"\\n"; a last line without one is its own
    record (and so differs from the same text with a newline)."""
    parts = data.split(b"\n")
    lines = [p + b"\n" for p in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


@dataclass(frozen=True, slots=True)
class ConflictHunk:
    """One conflicting region; starts are 0-based line indexes into each input."""

    base_start: int
    base_lines: tuple[bytes, ...]
    ours_start: int
    ours_lines: tuple[bytes, ...]
    theirs_start: int
    theirs_lines: tuple[bytes, ...]

    def describe(self) -> str:
        """git-ish one-liner for reports: line ranges are 1-based."""
        def rng(start: int, n: int) -> str:
            return f"{start + 1},{n}"
        return (f"base {rng(self.base_start, len(self.base_lines))} "
                f"ours {rng(self.ours_start, len(self.ours_lines))} "
                f"theirs {rng(self.theirs_start, len(self.theirs_lines))}")


@dataclass(frozen=True, slots=True)
class MergeResult:
    content: bytes
    conflicts: tuple[ConflictHunk, ...]
    binary: bool = False

    @property
    def clean(self) -> bool:
        return not self.conflicts


# ---------------------------------------------------------------------------------------
# 2-way diff: the one place the algorithm is chosen

def _diff_script(a: Sequence[bytes], b: Sequence[bytes]) -> list[tuple[int, int, int, int]]:
    """Hunks (i1, chg1, i2, chg2) turning a into b, as ``git merge-file``'s xdiff makes them:
    Myers with compaction and no indent heuristic (``merge.diffalgo.diff_lines``, libgit2's
    xdiff)."""

    return diff_lines(list(a), list(b), indent_heuristic=False)


# ---------------------------------------------------------------------------------------
# the merge proper (xdl_do_merge)

class _M:
    __slots__ = ("mode", "i0", "chg0", "i1", "chg1", "i2", "chg2")

    def __init__(self, mode: int, i0: int, chg0: int, i1: int, chg1: int, i2: int, chg2: int):
        self.mode, self.i0, self.chg0 = mode, i0, chg0
        self.i1, self.chg1, self.i2, self.chg2 = i1, chg1, i2, chg2


def _append(ms: list[_M], mode: int, i0: int, chg0: int, i1: int, chg1: int, i2: int,
            chg2: int) -> None:
    m = ms[-1] if ms else None
    # touching regions (not just overlapping ones) fuse, as in xdl_append_merge
    if m is not None and (i1 <= m.i1 + m.chg1 or i2 <= m.i2 + m.chg2):
        if mode != m.mode:
            m.mode = _CONFLICT
        m.chg0 = i0 + chg0 - m.i0
        m.chg1 = i1 + chg1 - m.i1
        m.chg2 = i2 + chg2 - m.i2
    else:
        ms.append(_M(mode, i0, chg0, i1, chg1, i2, chg2))


def _has_alnum(lines: Sequence[bytes]) -> bool:
    return any(any(chr(c).isalnum() and c < 128 for c in ln) for ln in lines)


def _refine(ms: list[_M], ours: list[bytes], theirs: list[bytes]) -> list[_M]:
    out: list[_M] = []
    for m in ms:
        if m.mode != _CONFLICT or m.chg1 == 0 or m.chg2 == 0:
            out.append(m)
            continue
        a = ours[m.i1:m.i1 + m.chg1]
        b = theirs[m.i2:m.i2 + m.chg2]
        script = _diff_script(a, b)
        if not script:
            m.mode = _IDENTICAL
            out.append(m)
            continue
        # i0/chg0 of the split pieces are left as the whole region's, as in git (only the
        # diff3 style prints the base, and it never refines)
        for (s1, c1, s2, c2) in script:
            out.append(_M(_CONFLICT, m.i0, m.chg0, m.i1 + s1, c1, m.i2 + s2, c2))
    return out


def _simplify(ms: list[_M], ours: list[bytes], if_no_alnum: bool) -> list[_M]:
    if not ms:
        return ms
    out = [ms[0]]
    for nxt in ms[1:]:
        m = out[-1]
        begin = m.i1 + m.chg1
        end = nxt.i1
        if (m.mode != _CONFLICT or nxt.mode != _CONFLICT
                or (end - begin > 3 and (not if_no_alnum or _has_alnum(ours[begin:end])))):
            out.append(nxt)
        else:
            m.chg1 = nxt.i1 + nxt.chg1 - m.i1
            m.chg2 = nxt.i2 + nxt.chg2 - m.i2
    return out


def _regions(base: list[bytes], ours: list[bytes], theirs: list[bytes], *, zealous: bool,
             s1: list[tuple[int, int, int, int]], s2: list[tuple[int, int, int, int]]) -> list[_M]:
    ms: list[_M] = []
    a, b = 0, 0
    while a < len(s1) and b < len(s2):
        x1, x2 = s1[a], s2[b]
        (x1_i1, x1_c1, x1_i2, x1_c2), (x2_i1, x2_c1, x2_i2, x2_c2) = x1, x2
        if x1_i1 + x1_c1 < x2_i1:
            _append(ms, _OURS, x1_i1, x1_c1, x1_i2, x1_c2, x2_i2 - x2_i1 + x1_i1, x1_c1)
            a += 1
            continue
        if x2_i1 + x2_c1 < x1_i1:
            _append(ms, _THEIRS, x2_i1, x2_c1, x1_i2 - x1_i1 + x2_i1, x2_c1, x2_i2, x2_c2)
            b += 1
            continue
        if (x1_i1 != x2_i1 or x1_c1 != x2_c1 or x1_c2 != x2_c2
                or ours[x1_i2:x1_i2 + x1_c2] != theirs[x2_i2:x2_i2 + x2_c2]):
            off = x1_i1 - x2_i1
            ffo = off + x1_c1 - x2_c1
            i0, i1, i2 = x1_i1, x1_i2, x2_i2
            if off > 0:
                i0 -= off
                i1 -= off
            else:
                i2 += off
            chg0 = x1_i1 + x1_c1 - i0
            chg1 = x1_i2 + x1_c2 - i1
            chg2 = x2_i2 + x2_c2 - i2
            if ffo < 0:
                chg0 -= ffo
                chg1 -= ffo
            else:
                chg2 += ffo
            _append(ms, _CONFLICT, i0, chg0, i1, chg1, i2, chg2)
        e1 = x1_i1 + x1_c1
        e2 = x2_i1 + x2_c1
        if e1 >= e2:
            b += 1
        if e2 >= e1:
            a += 1
    for x1_i1, x1_c1, x1_i2, x1_c2 in s1[a:]:
        _append(ms, _OURS, x1_i1, x1_c1, x1_i2, x1_c2, x1_i1 + len(theirs) - len(base), x1_c1)
    for x2_i1, x2_c1, x2_i2, x2_c2 in s2[b:]:
        _append(ms, _THEIRS, x2_i1, x2_c1, x2_i1 + len(ours) - len(base), x2_c1, x2_i2, x2_c2)
    if zealous:
        ms = _refine(ms, ours, theirs)
        ms = _simplify(ms, ours, if_no_alnum=True)
    return ms


def _eol_crlf(recs: list[bytes], i: int) -> int:
    """1 CRLF, 0 LF, -1 cannot tell (``is_eol_crlf``)."""
    n = len(recs)
    if i < n - 1:
        return int(len(recs[i]) > 1 and recs[i][-2:] == b"\r\n")
    if not n:
        return -1
    if recs[i].endswith(b"\n"):
        return int(recs[i].endswith(b"\r\n"))
    if not i:
        return -1
    return int(recs[i - 1].endswith(b"\r\n"))


def _needs_cr(base: list[bytes], ours: list[bytes], theirs: list[bytes], m: _M) -> bool:
    r = _eol_crlf(ours, m.i1 - 1 if m.i1 else 0)
    if r:
        r = _eol_crlf(theirs, m.i2 - 1 if m.i2 else 0)
    if r:
        r = _eol_crlf(base, 0)
    return r > 0


def _copy(recs: list[bytes], i: int, n: int, needs_cr: bool, add_nl: bool) -> list[bytes]:
    if n < 1:
        return []
    out = recs[i:i + n]
    if add_nl and not out[-1].endswith(b"\n"):
        out = out[:-1] + [out[-1] + (b"\r\n" if needs_cr else b"\n")]
    return out


def merge3(base: bytes, ours: bytes, theirs: bytes, *, style: Style = "merge",
           labels: tuple[str | bytes, str | bytes, str | bytes] = ("ours", "base", "theirs"),
           favor: Favor = None) -> MergeResult:
    """Merge ``ours`` and ``theirs``, both descended from ``base``.

    ``labels`` are (ours, base, theirs) as written after the markers. The result carries
    markers for every conflict unless ``favor`` resolves them; ``conflicts`` lists the
    conflicting hunks either way (so a caller can report what ``favor`` decided)."""
    if ours == theirs:
        return MergeResult(ours, ())
    if ours == base:
        return MergeResult(theirs, ())
    if theirs == base:
        return MergeResult(ours, ())
    if is_binary(base) or is_binary(ours) or is_binary(theirs):
        b, o, t = split_lines(base), split_lines(ours), split_lines(theirs)
        hunk = ConflictHunk(0, tuple(b), 0, tuple(o), 0, tuple(t))
        return MergeResult(theirs if favor == "theirs" else ours, (hunk,), binary=True)

    lb, lo, lt = split_lines(base), split_lines(ours), split_lines(theirs)
    s1 = _diff_script(lb, lo)
    s2 = _diff_script(lb, lt)
    if not s1:  # differ only in ways the diff calls equal: cannot happen with exact compare
        return MergeResult(theirs, ())
    if not s2:
        return MergeResult(ours, ())
    ms = _regions(lb, lo, lt, zealous=(style == "merge"), s1=s1, s2=s2)

    def enc(x: str | bytes) -> bytes:
        return x.encode("utf-8", "surrogateescape") if isinstance(x, str) else x
    l_ours, l_base, l_theirs = (enc(x) for x in labels)

    out: list[bytes] = []
    hunks: list[ConflictHunk] = []
    fav = {"ours": _OURS, "theirs": _THEIRS, "union": _UNION, None: _CONFLICT}[favor]
    i = 0
    for m in ms:
        mode = m.mode
        if mode == _CONFLICT:
            hunks.append(ConflictHunk(m.i0, tuple(lb[m.i0:m.i0 + m.chg0]),
                                      m.i1, tuple(lo[m.i1:m.i1 + m.chg1]),
                                      m.i2, tuple(lt[m.i2:m.i2 + m.chg2])))
            mode = fav
        if mode == _CONFLICT:
            cr = _needs_cr(lb, lo, lt, m)
            eol = b"\r\n" if cr else b"\n"
            out += lo[i:m.i1]
            out.append(b"<" * MARKER_SIZE + (b" " + l_ours if l_ours else b"") + eol)
            out += _copy(lo, m.i1, m.chg1, cr, True)
            if style == "diff3":
                out.append(b"|" * MARKER_SIZE + (b" " + l_base if l_base else b"") + eol)
                out += _copy(lb, m.i0, m.chg0, cr, True)
            out.append(b"=" * MARKER_SIZE + eol)
            out += _copy(lt, m.i2, m.chg2, cr, True)
            out.append(b">" * MARKER_SIZE + (b" " + l_theirs if l_theirs else b"") + eol)
        elif mode in (_OURS, _THEIRS, _UNION):
            out += lo[i:m.i1]
            if mode & _OURS:
                cr = _needs_cr(lb, lo, lt, m)
                out += _copy(lo, m.i1, m.chg1, cr, bool(mode & _THEIRS))
            if mode & _THEIRS:
                out += _copy(lt, m.i2, m.chg2, False, False)
        else:
            continue  # identical on both sides: the lines are copied from ours below
        i = m.i1 + m.chg1
    out += lo[i:]
    return MergeResult(b"".join(out), tuple(hunks))
